//! Every user error of `tessel check` and `tessel run`: exit code 1 (2 for a malformed command
//! line), a message naming the thing and what would work, and no output left behind.

mod common;

use common::*;
use tessel_plugin_api::array::ArrayData;

fn example(name: &str) -> String {
    root().join("examples").join(format!("{name}.tk")).display().to_string()
}

/// Asserts a user error: exit 1, every `needle` in stderr, nothing on stdout, no panic text.
fn assert_user_error(r: &Outcome, needles: &[&str]) {
    assert_eq!(r.code, 1, "exit code\nstdout: {}\nstderr: {}", r.stdout, r.stderr);
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks {n:?}:\n{}", r.stderr);
    }
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

#[test]
fn check_prints_canonical_text_and_exits_0() {
    let r = tessel(&["check", &example("fused")]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("kernel fused\n  grid (i: 16)\n"), "{}", r.stdout);
    assert!(r.stdout.contains("  %xy = mul %x, %y : f32[256]\n"), "{}", r.stdout);
}

#[test]
fn check_of_a_generic_kernel_keeps_its_parameters_and_says_what_it_verified() {
    let r = tessel(&["check", &example("add")]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with("kernel add[N = 1024, B = 128 in (64, 128, 256, 512, 1024)]\n  grid (i: cdiv(N, B))\n"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("  in  x: f32[N] block [B] at (i)\n"), "{}", r.stdout);
    assert!(r.stdout.ends_with("}\n# verified with N = 1024, B = 128\n"), "{}", r.stdout);
    // Checking the printed text gives it back.
    let dir = tempfile::tempdir().unwrap();
    let again = dir.path().join("again.tk");
    std::fs::write(&again, &r.stdout).unwrap();
    assert_eq!(tessel(&["check", again.to_str().unwrap()]).stdout, r.stdout);
    // Without a value for a parameter, names and syntax only.
    let generic = dir.path().join("nodefault.tk");
    std::fs::write(&generic, r.stdout.replace("N = 1024, B", "N, B")).unwrap();
    let r = tessel(&["check", generic.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.ends_with("# names and syntax checked; not verified: no value for N (give --param N=V)\n"), "{}", r.stdout);
    let r = tessel(&["check", generic.to_str().unwrap(), "--param", "N=4000"]);
    assert!(r.stdout.ends_with("# verified with N = 4000, B = 128\n"), "{}", r.stdout);
    let r = tessel(&["check", generic.to_str().unwrap(), "--param", "N=4000", "--param", "B=0"]);
    assert_user_error(
        &r,
        &["nodefault.tk:2:12: error: `cdiv(N, B)`: divides by `B`, which is 0 (kernel `add` with N = 4000, B = 0)"],
    );
}

#[test]
fn check_reports_every_error_with_line_and_column() {
    let file = root().join("tests/in/errors/unknown_op.tk").display().to_string();
    let r = tessel(&["check", &file]);
    assert_user_error(
        &r,
        &[
            "unknown_op.tk:7:8: error: unknown operation `frobnicate`",
            "unknown_op.tk:8:15: error: unexpected `2.0`",
            "2 errors in",
        ],
    );
}

#[test]
fn missing_file() {
    let r = tessel(&["check", "no/such/kernel.tk"]);
    assert_user_error(&r, &["cannot read `no/such/kernel.tk`", "No such file"]);
    let r = tessel(&["run", "no/such/kernel.tk"]);
    assert_user_error(&r, &["cannot read `no/such/kernel.tk`"]);
}

#[test]
fn file_that_is_not_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("binary.tk");
    std::fs::write(&path, [0xff, 0xfe, 0x00, 0x01]).unwrap();
    let r = tessel(&["check", path.to_str().unwrap()]);
    assert_user_error(&r, &["cannot read", "binary.tk", "valid UTF-8"]);
}

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.tk");
    std::fs::write(&path, "# nothing here\n").unwrap();
    let r = tessel(&["check", path.to_str().unwrap()]);
    assert_user_error(&r, &["the file defines no kernel", "kernel NAME"]);
}

#[test]
fn unknown_kernel() {
    let r = tessel(&["run", &example("add"), "--kernel", "sub"]);
    assert_user_error(&r, &["has no kernel `sub`", "its kernels are: add"]);
}

#[test]
fn unknown_backend() {
    let r = tessel(&["run", &example("add"), "--backend", "tpu"]);
    assert_user_error(&r, &["unknown backend `tpu`\n", "backends here: interpret, mosaic-gpu"]);
    // A name that begins a backend's, or is a typo away, is answered with it; a backend that
    // cannot run here says so in the list.
    let r = tessel(&["run", &example("add"), "--backend", "mosaic"]);
    assert_user_error(&r, &["unknown backend `mosaic`; did you mean `mosaic-gpu`?"]);
    let r = tessel(&["run", &example("add"), "--backend", "interpert"]);
    assert_user_error(&r, &["unknown backend `interpert`; did you mean `interpret`?"]);
    let listed = r.stderr.lines().find(|l| l.contains("backends here:")).expect("the list");
    let report: serde_json::Value = serde_json::from_str(&tessel(&["backends", "--json"]).stdout).unwrap();
    let mosaic = report["backends"].as_array().unwrap().iter().find(|b| b["name"] == "mosaic-gpu").unwrap().clone();
    assert_eq!(listed.contains("mosaic-gpu (unavailable here)"), mosaic["available"] != true, "{listed}");
}

/// A launch whose arrays cannot fit in memory is refused before anything is allocated, saying
/// how much it needs and how much there is (it used to grow until the OOM killer ended it).
#[test]
fn a_launch_larger_than_memory_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.tk");
    // Eight inputs and eight outputs of 4e9 f32 (the interpreter's largest arrays): 238 GB.
    let (ins, outs): (Vec<String>, Vec<String>) = (0..8)
        .map(|n| {
            (
                format!("  in  x{n}: f32[4000000000] block [1024] at (i)\n"),
                format!("  out o{n}: f32[4000000000] block [1024] at (i)\n"),
            )
        })
        .unzip();
    let body: String = (0..8).map(|n| format!("  %a{n} = load x{n}\n  store o{n}, %a{n}\n")).collect();
    std::fs::write(&file, format!("kernel big\n  grid (i: 3906250)\n{}{}{{\n{body}}}\n", ins.concat(), outs.concat())).unwrap();
    let out = dir.path().join("out");
    let r = tessel(&["run", file.to_str().unwrap(), "--backend", "interpret", "--out-dir", out.to_str().unwrap()]);
    assert_user_error(
        &r,
        &[
            "the launch of `big` with random inputs needs 238.4 GB of memory (inputs 119.2 GB, outputs 119.2 GB), more than the ",
            " available\n  use smaller arrays",
        ],
    );
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn several_kernels_in_one_launch_run_in_order() {
    let file = root().join("tests/in/two_kernels.tk").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let input = input_arg(dir.path(), "x", &f32_array(&[16], x.clone()));
    let out = dir.path().display().to_string();
    let r = tessel(&[
        "run",
        &file,
        "--kernel",
        "scale",
        "--kernel",
        "shift",
        "--input",
        &input,
        "--out-dir",
        &out,
        "--backend",
        "interpret",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("ran `scale`, `shift` on interpret"), "{}", r.stdout);
    // Both write `o`; `shift` runs second, so its result stands.
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v) + 1.0).collect();
    assert_close("o", &read_output(dir.path(), "o"), &want, tessel_plugin_api::ir::DType::F32);
    let r = tessel(&["run", &file, "--kernel", "scale", "--kernel", "nope"]);
    assert_user_error(&r, &["has no kernel `nope`", "its kernels are: scale, shift"]);
}

#[test]
fn missing_input_when_others_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let x = input_arg(dir.path(), "x", &f32_array(&[1024], vec![0.0; 1024]));
    let r = tessel(&["run", &example("add"), "--input", &x, "--out-dir", dir.path().to_str().unwrap()]);
    assert_user_error(&r, &["kernel `add` needs input `y`: f32[1024]", "--input y=FILE.npy"]);
    assert!(!dir.path().join("o.npy").exists(), "no output after an error");
}

#[test]
fn input_of_the_wrong_shape_or_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let x = input_arg(dir.path(), "x", &f32_array(&[1000], vec![0.0; 1000]));
    let y = input_arg(dir.path(), "y", &f32_array(&[1024], vec![0.0; 1024]));
    let r = tessel(&["run", &example("add"), "--input", &x, "--input", &y]);
    assert_user_error(
        &r,
        &[
            "inputs of kernel `add` disagree on parameter `N`: `x` says N = 1000 (its dimension 0), `y` says N = 1024 (its dimension 0)",
        ],
    );
    let x = input_arg(dir.path(), "x", &f32_array(&[4, 256], vec![0.0; 1024]));
    let r = tessel(&["run", &example("add"), "--input", &x, "--input", &y]);
    assert_user_error(&r, &["input `x` of kernel `add` is f32[4, 256], but the kernel declares f32[1024]"]);
    let ints = tessel::HostArray { shape: vec![1024], data: ArrayData::I32(vec![0; 1024]) };
    let x = input_arg(dir.path(), "x", &ints);
    let r = tessel(&["run", &example("add"), "--input", &x, "--input", &y]);
    assert_user_error(&r, &["input `x` of kernel `add` is i32[1024], but the kernel declares f32[1024]"]);
}

#[test]
fn input_for_a_name_the_kernel_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let z = input_arg(dir.path(), "z", &f32_array(&[4], vec![0.0; 4]));
    let r = tessel(&["run", &example("add"), "--input", &z]);
    assert_user_error(&r, &["kernel `add` has no input `z`", "its inputs are: x: f32[1024], y: f32[1024]"]);
}

#[test]
fn npy_that_is_not_npy_or_of_an_unsupported_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.npy");
    std::fs::write(&bad, b"this is not numpy").unwrap();
    let arg = format!("x={}", bad.display());
    let r = tessel(&["run", &example("ragged"), "--input", &arg]);
    assert_user_error(&r, &["input `x` from", "bad.npy", "it is not a .npy file: it does not start with numpy's magic"]);
    // A float64 array, written by hand: header then 8-byte elements.
    let f64_path = dir.path().join("f64.npy");
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 64 - (10 + header.len() + 1) % 64;
    let hlen = (header.len() + pad + 1) as u16;
    bytes.extend(hlen.to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes.push(b'\n');
    bytes.extend(1.0f64.to_le_bytes());
    bytes.extend(2.0f64.to_le_bytes());
    std::fs::write(&f64_path, bytes).unwrap();
    let arg = format!("x={}", f64_path.display());
    let r = tessel(&["run", &example("ragged"), "--input", &arg]);
    assert_user_error(&r, &["its dtype is `<f8`", "astype(np.float32)"]);
}

#[test]
fn missing_npy_file() {
    let r = tessel(&["run", &example("ragged"), "--input", "x=nowhere.npy"]);
    assert_user_error(&r, &["input `x` from `nowhere.npy`", "No such file"]);
}

#[test]
fn malformed_flags_name_the_flag() {
    let r = tessel(&["run", &example("ragged"), "--input", "x.npy"]);
    assert_user_error(&r, &["bad `--input x.npy`", "NAME=FILE.npy"]);
    let r = tessel(&["run", &example("ragged"), "--grid", "i=lots"]);
    assert_user_error(&r, &["bad `--grid i=lots`", "`lots` is not a non-negative integer"]);
}

const DYN: &str = "tests/in/dyn_grid.tk";

#[test]
fn dyn_grid_errors() {
    let file = root().join(DYN).display().to_string();
    let r = tessel(&["run", &file]);
    assert_user_error(&r, &["grid axis `i` of kernel `scale_rows` is `dyn` and needs a size at launch", "--grid i=N"]);
    let r = tessel(&["run", &file, "--grid", "i=0"]);
    assert_user_error(&r, &["grid axis `i` of kernel `scale_rows` cannot have size 0", "from 1 to 2147483647"]);
    let r = tessel(&["run", &file, "--grid", "i=99999999999"]);
    assert_user_error(&r, &["cannot have size 99999999999"]);
    let r = tessel(&["run", &file, "--grid", "j=2"]);
    assert_user_error(&r, &["has no `dyn` grid axis `j`", "its `dyn` axes are: i"]);
    let dir = tempfile::tempdir().unwrap();
    let r = tessel(&["run", &file, "--grid", "i=4", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn unwritable_out_dir() {
    let dir = tempfile::tempdir().unwrap();
    let file_in_the_way = dir.path().join("taken");
    std::fs::write(&file_in_the_way, "").unwrap();
    let r = tessel(&["run", &example("add"), "--out-dir", file_in_the_way.to_str().unwrap()]);
    assert_user_error(&r, &["cannot write", "taken", "--out-dir"]);
}

#[test]
fn bad_command_line_exits_2() {
    let r = tessel(&["run"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("Usage"), "{}", r.stderr);
    let r = tessel(&["frobnicate"]);
    assert_eq!(r.code, 2);
    let r = tessel(&["--help"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("check") && r.stdout.contains("run"));
}

#[test]
fn run_writes_every_output_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let r = tessel(&["run", &example("row_reduce"), "--seed", "3", "--out-dir", dir.path().to_str().unwrap(), "--check"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("s: f32[64] ->") && r.stdout.contains("m: f32[64] ->"), "{}", r.stdout);
    assert!(r.stdout.contains("check s: max abs error 0e0 against interpret"), "{}", r.stdout);
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["m.npy", "s.npy"], "only the outputs, no temporary files");
}

#[test]
fn seeded_random_inputs_are_reproducible() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (d, seed) in [(&a, "7"), (&b, "7")] {
        assert_eq!(tessel(&["run", &example("fused"), "--seed", seed, "--out-dir", d.path().to_str().unwrap()]).code, 0);
    }
    assert_eq!(read_output(a.path(), "o"), read_output(b.path(), "o"));
    let c = tempfile::tempdir().unwrap();
    assert_eq!(tessel(&["run", &example("fused"), "--seed", "8", "--out-dir", c.path().to_str().unwrap()]).code, 0);
    assert_ne!(read_output(a.path(), "o"), read_output(c.path(), "o"));
}

#[test]
fn auto_explains_every_skip_and_the_choice() {
    let dir = tempfile::tempdir().unwrap();
    let r = tessel(&["run", &example("matmul"), "--backend", "auto", "--explain", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("auto: ")).collect();
    assert_eq!(lines.iter().filter(|l| l.contains(": chosen")).count(), 1, "{}", r.stdout);
    assert!(lines[0].starts_with("auto: mosaic-gpu: "), "mosaic-gpu is tried first: {}", r.stdout);
    let chosen = lines.last().unwrap();
    let backend = chosen.trim_start_matches("auto: ").split(':').next().unwrap();
    assert!(r.stdout.contains(&format!("ran `matmul` on {backend}")), "{}", r.stdout);
    assert!(lines[0].contains("skipped, "), "the reason mosaic-gpu was skipped: {}", r.stdout);
    // Where a hardware wgpu adapter exists, wgpu runs it; a software one (always in CI: lavapipe)
    // is passed over for the interpreter, saying why and how to take it anyway.
    match wgpu_adapter("auto chooses by expected speed") {
        Some(adapter) if adapter.contains("software") => {
            assert_eq!(backend, "interpret", "{}", r.stdout);
            let skip = lines.iter().find(|l| l.starts_with("auto: wgpu: ")).expect("wgpu is named");
            assert!(
                skip.starts_with(&format!("auto: wgpu: skipped, software device ({adapter}): the CPU is faster here")),
                "{skip}"
            );
            assert!(skip.ends_with("--backend wgpu to use it"), "{skip}");
        }
        Some(_) => {
            assert_eq!(backend, "wgpu", "{}", r.stdout);
            assert!(lines.iter().any(|l| l.starts_with("auto: wgpu: chosen (")), "the adapter is named: {}", r.stdout);
        }
        None => {}
    }
    // A refusal is a reason to skip too: a dyn grid goes past mosaic-gpu whatever the machine.
    let r = tessel(&[
        "lower",
        &root().join("tests/in/dyn_grid.tk").display().to_string(),
        "--backend",
        "auto",
        "--explain",
        "--grid",
        "i=4",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.lines().next().unwrap().starts_with("auto: mosaic-gpu: skipped"), "{}", r.stdout);
}

#[test]
fn conformance_passes_on_interpret_and_skips_only_with_reasons_on_mosaic() {
    let r = tessel(&["conformance", "--backend", "interpret"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(" 0 skipped, 0 failed"), "{}", r.stdout);
    assert!(
        r.stdout.lines().any(|l| l.starts_with("run") && l.contains("flash_attention") && l.contains(" ok ")),
        "{}",
        r.stdout
    );
    let r = tessel(&["conformance", "--backend", "mosaic-gpu"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for l in r.stdout.lines().filter(|l| l.starts_with("lower ")) {
        assert!(l.contains(" ok ") || l.contains("refused: dynamic grid bounds not supported in the Mosaic GPU backend"), "{l}");
    }
    assert!(
        r.stdout.contains("refuse  device(x: 2, y: 4) as a kernel mesh")
            && r.stdout.contains("Mesh device(x: 2, y: 4) is not supported")
    );
    if wgpu_adapter("conformance on wgpu").is_some() {
        let r = tessel(&["conformance", "--backend", "wgpu"]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains(" 0 failed"), "{}", r.stdout);
        // Skipped only where a software driver's loop budget refuses the long loops.
        for l in r.stdout.lines().filter(|l| l.contains(" skip ")) {
            assert!(l.contains("long_loops") && l.contains("silently stops every loop"), "{l}");
        }
    }
    let r = tessel(&["conformance", "--backend", "nope"]);
    assert_user_error(&r, &["unknown backend `nope`"]);
}

#[test]
fn mesh_for_builds_each_backend_its_own_mesh_from_one_spec() {
    let rt = tessel::Runtime::new(&[]).unwrap();
    assert_eq!(
        rt.mesh_for("mosaic-gpu", "grid(i: 4, j: 2)").unwrap().display().as_str(),
        "Mesh(grid=(4, 2), grid_names=('i', 'j'), cluster=(), cluster_names=(), num_threads=None, thread_name=None)"
    );
    assert_eq!(rt.mesh_for("interpret", "grid(i: 4, j: 2)").unwrap().display().as_str(), "grid(i: 4, j: 2)");
    // The concrete mesh of the wrong kind still gets the backend's own refusal.
    let r = tessel(&["lower", &example("add"), "--backend", "mosaic-gpu", "--mesh", "grid(i: 8)"]);
    assert_user_error(&r, &["Mesh grid(i: 8) is not supported by the Mosaic GPU backend"]);
}

#[test]
fn bench_reports_compile_and_run_time_and_throughput() {
    let r = tessel(&["bench", &example("matmul"), "--runs", "3"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("bench `matmul` on interpret (3 runs after a warm-up)"), "{}", r.stdout);
    assert!(r.stdout.contains("compile (lower, cold): ") && r.stdout.contains("GB/s"), "{}", r.stdout);
    // The launch alone too, its arrays uploaded once.
    assert!(r.stdout.contains("launch (median, arrays on the device, submit and wait): "), "{}", r.stdout);
    assert!(r.stdout.contains("kernel on the device's clock: not measured (interpret has no GPU timestamps)"), "{}", r.stdout);
    assert!(r.stdout.contains(" with transfers, ") && r.stdout.contains(" on the device"), "{}", r.stdout);
    // 256^3 multiply-adds: 2 * 256^3 = 0.034 GFLOP.
    assert!(r.stdout.contains("dot: 0.034 GFLOP"), "{}", r.stdout);
    let r = tessel(&["bench", &example("add"), "--runs", "2"]);
    assert!(!r.stdout.contains("GFLOP"), "no dot, no GFLOP/s: {}", r.stdout);
}

#[test]
fn bench_json_is_one_object_with_the_design_fields() {
    let r = tessel(&["bench", &example("matmul"), "--runs", "2", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!(v["backend"], "interpret");
    assert_eq!(v["kernel"], "matmul");
    assert_eq!(v["runs"], 2);
    // 256^3 multiply-adds, and a, b, c of 256x256 f32 read or written once.
    assert_eq!(v["flops"], 2 * 256 * 256 * 256);
    assert_eq!(v["bytes"], 3 * 256 * 256 * 4);
    let (kernel, run) = (v["kernel_ms"].as_f64().unwrap(), v["run_ms"].as_f64().unwrap());
    assert!(kernel > 0.0 && run > 0.0 && v["compile_ms"].as_f64().unwrap() >= 0.0, "{v}");
    // The rates are the counts over the kernel's own time.
    let gflops = v["gflops"].as_f64().unwrap();
    assert!((gflops - 2.0 * 256f64.powi(3) / kernel / 1e6).abs() <= 1e-6 * gflops, "{v}");
    assert_eq!(v["kernel_timing"], "submit-and-wait");
    assert_eq!(v["launch_ms"], v["kernel_ms"], "the interpreter has no device clock: {v}");
    let r = tessel(&["bench", &example("add"), "--runs", "2", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(v["gflops"].is_null() && v["gbs"].as_f64().unwrap() > 0.0, "no dot, no GFLOP/s: {v}");
}

#[test]
fn a_reported_launch_says_where_it_ran_why_and_whether_it_compiled() {
    use tessel::{LaunchArgs, Runtime};
    let rt = Runtime::new(&[]).unwrap();
    let k = tessel::load_file(&root().join("examples/add.tk")).unwrap().remove(0);
    let call = [tessel::Call::new(k.clone())];
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 3), grid: Default::default() };
    let first =
        rt.plan(tessel::Choice::of("auto"), &tessel::Launch::new(call.clone(), [], args.grid.clone())).and_then(|p| p.run(&args)).unwrap();
    assert!(first.decisions[0].starts_with("mosaic-gpu: "), "{:?}", first.decisions);
    assert!(first.decisions.last().unwrap().starts_with(&format!("{}: chosen", first.backend)), "{:?}", first.decisions);
    assert!(!first.cache_hit);
    let second = rt
        .plan(tessel::Choice::of(&first.backend), &tessel::Launch::new(call.clone(), [], args.grid.clone()))
        .and_then(|p| p.run(&args))
        .unwrap();
    assert!(second.cache_hit, "the second launch of the same kernel is not lowered again");
    assert_eq!(second.outputs, first.outputs);
    let want = launched(&rt, "interpret", &call, &args).unwrap();
    assert!(tessel_plugin_api::array::agreement(&first.outputs[0].1, &want[0].1).within);
}

#[test]
fn run_without_a_backend_chooses_one_and_checks_it_against_the_interpreter() {
    let dir = tempfile::tempdir().unwrap();
    let r = tessel(&["run", &example("softmax"), "--check", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("check o: max abs error") && r.stdout.contains(": ok"), "{}", r.stdout);
    // The default is `auto`: mosaic-gpu on a Hopper GPU, else wgpu on a hardware adapter, else
    // the interpreter (ahead of a software adapter), which then says that it checks itself.
    let on = |b: &str| r.stdout.starts_with(&format!("ran `softmax` on {b} "));
    match wgpu_adapter("run's default backend") {
        Some(adapter) if !adapter.contains("software") => {
            assert!(on("wgpu") || on("mosaic-gpu"), "{}", r.stdout);
            assert!(!r.stdout.contains("compares the interpreter with itself"), "{}", r.stdout);
        }
        _ if on("mosaic-gpu") => {}
        _ => assert!(on("interpret") && r.stdout.contains("compares the interpreter with itself"), "{}", r.stdout),
    }
    // `lower` keeps a fixed default, needing no device.
    let r = tessel(&["lower", &example("add")]);
    assert!(r.code == 0 && r.stdout.contains("(interpret)"), "{}", r.stdout);
}

/// `lower --plan` prints the backend's plan, every decision by name, without a device: the
/// Hopper path's blocks and stages for mosaic-gpu, what the wgpu backend holds in registers and
/// reads from buffers, the interpreter's verified kernel.
#[test]
fn lower_plan_prints_each_backends_decisions() {
    let r = tessel(&["lower", &example("matmul_bf16"), "--backend", "mosaic-gpu", "--plan"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with("// ---- plan (mosaic-gpu) ----\nkernel matmul_bf16\n  grid: (i: 2, j: 2, k: 4 seq)\n"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("  hopper matmul: a x b into c (out c f32), bf16, blocks 128 x 128 x 64,"), "{}", r.stdout);
    assert!(!r.stdout.contains(".target sm_90a"), "the plan, not the PTX: {}", r.stdout);
    let r = tessel_env(&["lower", &example("matmul"), "--backend", "wgpu", "--plan"], &[("TESSEL_WGPU_STRATEGY", "gpu")]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("  strategy: gpu\n"), "{}", r.stdout);
    assert!(r.stdout.contains("  outputs resident in registers: c\n"), "{}", r.stdout);
    assert!(r.stdout.contains("  whole input blocks, read from the buffer: %a -> a, %b -> b\n"), "{}", r.stdout);
    let r = tessel(&["lower", &example("add"), "--plan"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("// ---- plan (interpret) ----\nkernel add\n"), "{}", r.stdout);
}

/// Every file of `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// Outputs are written all or none: a second output that cannot be placed (a folder of its
/// name) leaves the first output of an earlier run as it was, makes no new one, and leaves no
/// temporary file (it used to write `s.npy` and then fail on `m.npy`).
#[test]
fn outputs_are_written_all_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    std::fs::create_dir(dir.path().join("m.npy")).unwrap();
    let run = || tessel(&["run", &example("row_reduce"), "--backend", "interpret", "--out-dir", out]);
    let r = run();
    assert_user_error(&r, &["cannot write", "m.npy", "a folder of that name is in the way", "nothing was written"]);
    assert_eq!(listing(dir.path()), ["m.npy"], "no new s.npy, no temporary");
    std::fs::write(dir.path().join("s.npy"), "the previous run's s").unwrap();
    assert_user_error(&run(), &["m.npy"]);
    assert_eq!(std::fs::read_to_string(dir.path().join("s.npy")).unwrap(), "the previous run's s");
    assert_eq!(listing(dir.path()), ["m.npy", "s.npy"]);
    // Once the way is clear, both are written and replace the old ones.
    std::fs::remove_dir(dir.path().join("m.npy")).unwrap();
    assert_eq!(run().code, 0);
    assert_eq!(listing(dir.path()), ["m.npy", "s.npy"]);
    assert_eq!(read_output(dir.path(), "s").shape, [64]);
}

/// Kernel files are read up to 16 MiB: past it, or from a file that never ends, the error names
/// the file, its size and the limit (`tessel check /dev/zero` used to grow without bound).
/// `.npy` inputs are bounded by their header, checked against the file's length.
#[test]
fn files_read_whole_are_bounded() {
    let r = tessel(&["check", "/dev/zero"]);
    assert_user_error(
        &r,
        &["cannot read `/dev/zero` as a kernel file: it goes on past the 16 MiB tessel reads", "at most 16 MiB"],
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.tk");
    std::fs::write(&big, "#".repeat((16 << 20) + 1)).unwrap();
    let r = tessel(&["run", big.to_str().unwrap()]);
    assert_user_error(&r, &["big.tk` as a kernel file: it is 16.0 MiB (16777217 bytes), more than the 16 MiB tessel reads"]);
    let r = tessel(&["run", &example("add"), "--input", "x=/dev/zero"]);
    assert_user_error(&r, &["input `x` from `/dev/zero`: it is not a .npy file"]);
}

/// A name given twice to `--param`, `--input` or `--grid` is an error naming the flag and the
/// name (the last one used to win silently).
#[test]
fn a_name_given_twice_is_refused() {
    let r = tessel(&["run", &example("add"), "--param", "B=64", "--param", "B=128"]);
    assert_user_error(&r, &["bad `--param B=128`: `B` is given twice (`--param B=64` before)", "each name once"]);
    let dir = tempfile::tempdir().unwrap();
    let x = input_arg(dir.path(), "x", &f32_array(&[1024], vec![0.0; 1024]));
    let r = tessel(&["run", &example("add"), "--input", &x, "--input", "x=other.npy"]);
    assert_user_error(&r, &["bad `--input x=other.npy`: `x` is given twice (`--input x=", "in_x.npy` before)"]);
    let file = root().join(DYN).display().to_string();
    let r = tessel(&["run", &file, "--grid", "i=4", "--grid", "i=8"]);
    assert_user_error(&r, &["bad `--grid i=8`: `i` is given twice (`--grid i=4` before)"]);
}

/// An object array (`np.save` of dtype=object) says it holds Python objects, and what to save.
#[test]
fn an_npy_of_python_objects_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.npy");
    let header = "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 64 - (10 + header.len() + 1) % 64;
    bytes.extend(((header.len() + pad + 1) as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes.push(b'\n');
    bytes.extend(b"\x80\x04\x95pickled objects");
    std::fs::write(&path, bytes).unwrap();
    let r = tessel(&["run", &example("add"), "--input", &format!("x={}", path.display())]);
    assert_user_error(
        &r,
        &["objects.npy`: it holds Python objects (dtype `|O`), not numbers", "np.asarray(x, dtype=np.float32)"],
    );
}
