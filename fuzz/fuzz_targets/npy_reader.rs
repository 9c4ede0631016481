//! Any bytes as a `.npy` file: an array or an error, never a panic or an abort.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = tessel::npy::read_bytes(data) {
        assert_eq!(a.len(), a.shape.iter().product::<usize>());
    }
});
