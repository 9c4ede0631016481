//! Any text: parsing, verifying and printing never panic, and the canonical text of every kernel
//! that verifies parses and verifies again to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessel_plugin_api::ir::{parse, print_kernel, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(module) = parse(text) else { return };
    for kernel in &module.kernels {
        let Ok(verified) = verify(kernel) else { continue };
        let once = print_kernel(verified.kernel());
        let again = parse(&once).expect("canonical text parses");
        let reverified = verify(&again.kernels[0]).expect("canonical text verifies");
        assert_eq!(print_kernel(reverified.kernel()), once, "print(parse(print(k))) == print(k)");
    }
});
