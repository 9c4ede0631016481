//! One plan per launch: a cold launch parses its kernel text once in the host (a generic kernel
//! twice: its template, then its text with the values bound) and once in each backend asked,
//! verifies once in each, and each backend asked plans it once (the chosen one is not asked
//! again to launch). Counted by `tessel_plugin_api::ir::counters`, which the
//! built-in backends share with the host. One test function: the counters are process-wide.

mod common;

use abi_stable::std_types::{ROption, RSlice, RStr};
use common::{root, tessel};
use tessel_plugin_api::abi::{DeviceArg, ErrorKind, IR_FORMAT_VERSION, KernelCall, LaunchRequest};
use tessel_plugin_api::ir::counters::{Counts, counts};

/// The counts of `tessel ARGS` (in-process, a fresh runtime as the command line has) and how
/// many backends it asked, from `--explain`'s lines under `auto` (one when a backend is named).
fn counted(args: &[&str]) -> (Counts, u64) {
    let before = counts();
    let r = tessel(args);
    let after = counts();
    assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
    let auto_lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("auto: ")).collect();
    let asked = if auto_lines.is_empty() {
        1
    } else {
        auto_lines.iter().filter(|l| l.contains(": chosen (") || l.contains(": skipped, refuses the launch")).count() as u64
    };
    (after - before, asked)
}

#[test]
fn a_cold_launch_parses_once_per_side_verifies_once_per_backend_and_plans_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    // `add` and `matmul` are generic (parameters in brackets); `fused` is not.
    let add = root().join("examples/add.tk").display().to_string();
    let matmul = root().join("examples/matmul.tk").display().to_string();
    let fused = root().join("examples/fused.tk").display().to_string();
    for (what, generic, args) in [
        ("run under auto", false, vec!["run", &fused, "--backend", "auto", "--explain", "--out-dir", &out]),
        ("run on a backend named", false, vec!["run", &fused, "--backend", "interpret", "--out-dir", &out]),
        ("lower on a backend named", false, vec!["lower", &fused, "--backend", "wgpu"]),
        ("run of a generic kernel under auto", true, vec!["run", &matmul, "--backend", "auto", "--explain", "--out-dir", &out]),
        ("run of a generic kernel named", true, vec!["run", &add, "--backend", "interpret", "--out-dir", &out]),
        ("lower of a generic kernel with a mesh", true, vec!["lower", &add, "--backend", "interpret", "--mesh", "grid(i: 8)"]),
    ] {
        let (c, asked) = counted(&args);
        assert!(asked >= 1, "{what}");
        let host = if generic { 2 } else { 1 };
        assert_eq!(c.parses, host + asked, "{what}: parses ({host} in the host, once in each of {asked} backend(s) asked)");
        assert_eq!(c.verifies, 1 + asked, "{what}: verifies (once in the host, once in each backend asked)");
        assert_eq!(c.plans, asked, "{what}: plans (once per backend asked, none again to launch)");
    }
    // A launch that every backend refuses (`add` is generic): each asked once, nothing launched.
    let before = counts();
    let r = tessel(&["run", &add, "--backend", "auto", "--mesh", "device(x: 2)", "--out-dir", &out]);
    let c = counts() - before;
    assert_eq!(r.code, 1, "{}", r.stderr);
    let asked = r.stderr.matches(": skipped, refuses the launch").count() as u64;
    assert!(asked >= 1, "{}", r.stderr);
    assert_eq!((c.parses, c.plans), (2 + asked, asked), "{}", r.stderr);
    // A backend that refuses the mesh before verifying does not verify.
    assert!((1..=1 + asked).contains(&c.verifies), "{c:?}: {}", r.stderr);
    // The CUDA FFI handler's path (`python/src/ffi/cuda.rs`): the call prepared when XLA lowers
    // it (planned on mosaic-gpu, which needs no device), then each launch offered to the backend
    // on XLA's stream from the plan kept (`resume`, `launch_external`). A kernel with a `bool`
    // output, which mosaic-gpu never launches on another runtime's memory: the backend compiles
    // it (from the plan kept) and refuses it before touching the addresses (`Unsupported`: the
    // handler then stages it through host memory), on any machine. The host's own call adds that
    // the backend must be available (here it is refused as unavailable without a Hopper).
    let before = counts();
    let file = tessel::load_source(
        "flags",
        "kernel flags\n  grid (i: 2)\n  in x: i32[256] block [128] at (i)\n  out o: bool[256] block [128] at (i)\n{\n  %x = load x\n  %z = lt %x, 7\n  store o, %z\n}\n",
    )
    .expect("verifies");
    let rt = tessel::Runtime::for_backend(&[], Some("mosaic-gpu")).expect("the built-ins");
    let calls = [tessel::Call::new(file[0].clone())];
    let launch = tessel::Launch::kernels(calls.clone());
    let plan = rt.plan(tessel::Choice::Named("mosaic-gpu"), &launch).expect("planned without a device").into_plan();
    let prepared = counts() - before;
    assert_eq!((prepared.parses, prepared.verifies, prepared.plans), (2, 2, 1), "prepared: {prepared:?}");
    let args = [DeviceArg::new("x", 0, false), DeviceArg::new("o", 0, false)];
    let one = [KernelCall { kernel: RStr::from_str("flags"), mesh: ROption::RNone }];
    let req = LaunchRequest {
        ir_format: IR_FORMAT_VERSION,
        source: RStr::from_str(file[0].text()),
        calls: RSlice::from_slice(&one),
        external_meshes: RSlice::from_slice(&[]),
        grid: RSlice::from_slice(&[]),
    };
    let backend = &rt.registry().get("mosaic-gpu").expect("built in").backend;
    // SAFETY: never enqueued: the backend refuses the bool kernel before the addresses are used.
    #[allow(unsafe_code, reason = "the handler's call, refused before any address is read")]
    let err = unsafe { backend.launch_external(&req, 0, RSlice::from_slice(&args)) }.into_result().expect_err("refused");
    assert_eq!(err.kind, ErrorKind::Unsupported, "{}", err.message);
    assert!(err.message.contains("kernel `flags` has a bool array (`o`)"), "{}", err.message);
    let planned = rt.resume(plan).expect("resumed");
    // SAFETY: never enqueued: refused before the addresses are used (above).
    #[allow(unsafe_code, reason = "the handler's call, refused before any address is read")]
    let r = unsafe { planned.launch_external(0, &args) };
    assert!(
        matches!(r, Err(tessel::Error::Backend { kind: ErrorKind::Unsupported | ErrorKind::Unavailable, .. })),
        "the bool kernel was launched on address 0: {r:?}"
    );
    let launched = counts() - before;
    assert_eq!(launched, prepared, "the launches parse, verify and plan nothing again");
}
