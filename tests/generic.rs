//! The generic examples (language §9) at several shapes, ragged ones included, bound from their
//! inputs and from `--param` values, on every executor: the interpreter, wgpu and Mosaic GPU's PTX
//! on the emulator (both thread orders). Expected values are computed here, in f64, from the
//! inputs alone. And `tessel tune`: it records only a candidate that agrees, and `run` uses it.

mod common;

use std::collections::BTreeMap;

use common::*;
use tessel::{HostArray, KernelFile, LaunchArgs, Runtime};
use tessel_plugin_api::ir::DType;

fn example(name: &str) -> KernelFile {
    tessel::read_kernels(&root().join("examples").join(format!("{name}.tk"))).unwrap_or_else(|e| panic!("{e}"))
}

/// Every executor here: the interpreter, wgpu where there is an adapter, and the emulator.
fn executors(test: &str) -> Vec<&'static str> {
    let mut out = vec!["interpret", "mosaic-emu"];
    if wgpu_adapter(test).is_some() {
        out.push("wgpu");
    }
    out
}

/// Specializes `name` for `inputs` with `params` and runs it on `exec`; returns output `out`.
fn run(
    rt: &Runtime,
    exec: &str,
    file: &KernelFile,
    params: &[(&str, i64)],
    inputs: &[(&str, HostArray)],
    out: &str,
) -> HostArray {
    let given: BTreeMap<String, i64> = params.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let inputs: BTreeMap<String, HostArray> = inputs.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
    let kernel = &file.kernels()[0];
    let (v, _) = file.specialize_for(kernel, &given, &BTreeMap::new(), &inputs).unwrap_or_else(|e| panic!("{e}"));
    let call = [tessel::Call::new(v.clone())];
    let args = LaunchArgs { inputs, grid: Default::default() };
    let outputs = match exec {
        "mosaic-emu" => {
            let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).unwrap_or_else(|e| panic!("{e}")).remove(0);
            // The emulator runs threads one after another: both orders, a missing barrier differs.
            let fwd = emulate(&ptx, &v, &args, false).unwrap_or_else(|e| panic!("{e}"));
            let rev = emulate(&ptx, &v, &args, true).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fwd, rev, "{}: the thread order changes the result", v.name());
            fwd
        }
        backend => launched(&rt, backend, &call, &args).unwrap_or_else(|e| panic!("{exec}: {e}")),
    };
    outputs.into_iter().find(|(n, _)| n == out).map(|(_, a)| a).expect("the output")
}

fn matrix(seed: u64, rows: usize, cols: usize) -> (HostArray, Vec<f64>) {
    let data = floats(&mut rng(seed), rows * cols);
    let f64s = data.iter().map(|&v| f64::from(v)).collect();
    (f32_array(&[rows, cols], data), f64s)
}

#[test]
fn softmax_at_every_row_count() {
    let rt = Runtime::new(&[]).expect("runtime");
    let file = example("softmax");
    // (N, D, BM): whole blocks, a ragged last block, one row, a block taller than the array.
    let shapes: &[(usize, usize, Option<i64>)] = &[(1024, 256, None), (1000, 96, Some(32)), (1, 7, None), (5, 33, Some(8))];
    for exec in executors("softmax_at_every_row_count") {
        for &(n, d, bm) in shapes {
            let (x, xs) = matrix(n as u64, n, d);
            let want: Vec<f64> = xs
                .chunks(d)
                .flat_map(|row| {
                    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    row.iter().map(move |v| (v - m).exp() / s).collect::<Vec<_>>()
                })
                .collect();
            let params: Vec<(&str, i64)> = bm.map(|b| ("BM", b)).into_iter().collect();
            let got = run(&rt, exec, &file, &params, &[("x", x)], "o");
            assert_eq!(got.shape, [n, d]);
            assert_close(&format!("softmax {n}x{d} BM={bm:?} on {exec}"), &got, &want, DType::F32);
        }
    }
}

#[test]
fn matmul_at_every_shape() {
    let rt = Runtime::new(&[]).expect("runtime");
    let file = example("matmul");
    // (M, N, K, tile values): square, ragged in every dimension, a single row, a deep K.
    type Case = (usize, usize, usize, &'static [(&'static str, i64)]);
    let shapes: &[Case] = &[
        (128, 128, 128, &[]),
        (100, 70, 30, &[("BM", 32), ("BN", 32), ("BK", 16)]),
        (1, 65, 33, &[("BN", 32), ("BK", 16)]),
        (32, 32, 200, &[("BM", 32), ("BN", 32), ("BK", 64)]),
    ];
    for exec in executors("matmul_at_every_shape") {
        for &(m, n, k, params) in shapes {
            let (a, av) = matrix(1 + m as u64, m, k);
            let (b, bv) = matrix(2 + n as u64, k, n);
            let want: Vec<f64> = (0..m * n).map(|ij| (0..k).map(|p| av[(ij / n) * k + p] * bv[p * n + ij % n]).sum()).collect();
            let got = run(&rt, exec, &file, params, &[("a", a), ("b", b)], "c");
            assert_eq!(got.shape, [m, n]);
            assert_close(&format!("matmul {m}x{n}x{k} {params:?} on {exec}"), &got, &want, DType::F32);
        }
    }
}

#[test]
fn elementwise_examples_at_every_length() {
    let rt = Runtime::new(&[]).expect("runtime");
    let (add, ragged) = (example("add"), example("ragged"));
    for exec in executors("elementwise_examples_at_every_length") {
        for (n, b) in [(1024, None), (1000, Some(256)), (1, None), (4097, Some(512))] {
            let params: Vec<(&str, i64)> = b.map(|b| ("B", b)).into_iter().collect();
            let xs = floats(&mut rng(n as u64), n);
            let ys = floats(&mut rng(n as u64 + 1), n);
            let want: Vec<f64> = xs.iter().zip(&ys).map(|(x, y)| f64::from(*x) + f64::from(*y)).collect();
            let inputs = [("x", f32_array(&[n], xs.clone())), ("y", f32_array(&[n], ys))];
            assert_close(&format!("add {n} {b:?} on {exec}"), &run(&rt, exec, &add, &params, &inputs, "o"), &want, DType::F32);
            let want: Vec<f64> = xs.iter().map(|x| f64::from(*x).abs().sqrt() + 1.0).collect();
            let got = run(&rt, exec, &ragged, &params, &[("x", f32_array(&[n], xs))], "o");
            assert_close(&format!("ragged {n} {b:?} on {exec}"), &got, &want, DType::F32);
        }
    }
}

#[test]
fn run_binds_shapes_from_npy_inputs_and_params_from_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (x, _) = matrix(9, 300, 40);
    let arg = input_arg(dir.path(), "x", &x);
    let out = dir.path().join("out");
    let file = root().join("examples/softmax.tk").display().to_string();
    let r = tessel(&[
        "run",
        &file,
        "--backend",
        "interpret",
        "--input",
        &arg,
        "--param",
        "BM=8",
        "--explain",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("params of `softmax`: N = 300 (input `x`, dimension 0), D = 40 (input `x`, dimension 1), BM = 8 (given)"),
        "{}",
        r.stdout
    );
    let got = read_output(&out, "o");
    assert_eq!(got.shape, [300, 40]);
    let row_sums: Vec<f64> = got.to_f64().chunks(40).map(|r| r.iter().sum()).collect();
    assert!(row_sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "every row of a softmax sums to 1");
    // Without inputs, random ones of the shapes the values give.
    let r = tessel(&[
        "run",
        &file,
        "--backend",
        "interpret",
        "--param",
        "N=10",
        "--param",
        "D=3",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("o: f32[10, 3]"), "{}", r.stdout);
    // What does not bind is a user error naming the parameter.
    let r = tessel(&["run", &file, "--param", "BM=abc"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("bad `--param BM=abc`: `abc` is not an integer"), "{}", r.stderr);
    let r = tessel(&["lower", &file, "--param", "BX=3"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("kernel `softmax` has no parameter `BX`\n  its parameters are: N, D, BM"), "{}", r.stderr);
}

#[test]
fn tune_records_an_agreeing_candidate_that_run_then_uses() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let file = root().join("examples/softmax.tk").display().to_string();
    let envs = [("TESSEL_CACHE_DIR", cache.to_str().unwrap())];
    let r = tessel_env(&["tune", &file, "--backend", "interpret", "--param", "N=64", "--runs", "2"], &envs);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for bm in [8, 16, 32, 64] {
        assert!(r.stdout.contains(&format!("  BM = {bm}: ")), "a line per candidate:\n{}", r.stdout);
    }
    let chosen =
        r.stdout.lines().find_map(|l| l.strip_prefix("chosen: BM = ")).expect("a choice").split(' ').next().unwrap().to_string();
    let record = r.stdout.lines().find_map(|l| l.strip_prefix("record: ")).expect("a record").to_string();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(json["chosen"]["BM"].to_string(), chosen);
    assert_eq!(json["shapes"]["N"], 64);
    assert_eq!(json["trials"].as_array().unwrap().len(), 4);
    // `run` takes BM from the record, says so and where it is; a value given wins.
    let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=64", "--explain"], &envs);
    assert!(r.stdout.contains(&format!("BM = {chosen} (tuned)")), "{}", r.stdout);
    assert!(r.stdout.contains(&format!("tuning record for `softmax` on interpret: {record}")), "{}", r.stdout);
    let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=64", "--param", "BM=8", "--explain"], &envs);
    assert!(r.stdout.contains("BM = 8 (given)"), "{}", r.stdout);
    // Other shapes have no record.
    let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=65", "--explain"], &envs);
    assert!(r.stdout.contains("BM = 16 (default)"), "{}", r.stdout);
    // A corrupt record is ignored with a warning, and the next tune writes it again.
    std::fs::write(&record, "{ not json").unwrap();
    let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=64", "--explain"], &envs);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains(&format!("warning: tuning record {record} ignored")), "{}", r.stderr);
    assert!(r.stdout.contains("BM = 16 (default)"), "{}", r.stdout);
    let r = tessel_env(&["tune", &file, "--backend", "interpret", "--param", "N=64", "--runs", "1"], &envs);
    assert!(r.stdout.contains("(it replaces a record that did not read back)"), "{}", r.stdout);
    assert!(serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&record).unwrap()).is_ok());
    // Nothing to tune, or no backend named: user errors.
    let r = tessel_env(&["tune", &file, "--backend", "interpret", "--param", "BM=8"], &envs);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("kernel `softmax` has no parameter with candidates left to tune"), "{}", r.stderr);
    let r = tessel_env(&["tune", &file], &envs);
    assert!(r.stderr.contains("tessel tune needs --backend NAME"), "{}", r.stderr);
}

/// A tuning record that chooses a value outside the kernel's candidates (`BM: 0`, `-5`, `12`: a
/// record edited by hand or gone stale) is ignored with a warning naming its file, in `--explain`
/// too, and the launch takes the default; it used to break every later run with an error about a
/// `BM` the user never gave, or use the value silently.
#[test]
fn a_tuning_record_outside_the_candidates_is_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let file = root().join("examples/softmax.tk").display().to_string();
    let envs = [("TESSEL_CACHE_DIR", cache.to_str().unwrap())];
    let r = tessel_env(&["tune", &file, "--backend", "interpret", "--param", "N=64", "--runs", "1"], &envs);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let record = r.stdout.lines().find_map(|l| l.strip_prefix("record: ")).expect("a record").to_string();
    let good: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    for (bm, why) in [
        (0, "it chooses BM = 0, which is not one of its candidates (8, 16, 32, 64)"),
        (-5, "it chooses BM = -5, which is not one of its candidates"),
        (12, "it chooses BM = 12, which is not one of its candidates"),
    ] {
        let mut edited = good.clone();
        edited["chosen"]["BM"] = bm.into();
        std::fs::write(&record, edited.to_string()).unwrap();
        let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=64", "--explain"], &envs);
        assert_eq!(r.code, 0, "BM = {bm}: {}", r.stderr);
        let warning = format!("tuning record {record} ignored ({why}");
        assert!(r.stderr.contains(&format!("warning: {warning}")), "{}", r.stderr);
        assert!(r.stdout.contains(&warning), "--explain says so: {}", r.stdout);
        assert!(r.stdout.contains("BM = 16 (default)"), "{}", r.stdout);
    }
    // A parameter the kernel lacks, or one without candidates (a shape), is not taken either.
    let mut edited = good.clone();
    edited["chosen"]["N"] = 128.into();
    std::fs::write(&record, edited.to_string()).unwrap();
    let r = tessel_env(&["run", &file, "--backend", "interpret", "--param", "N=64"], &envs);
    assert!(r.code == 0 && r.stderr.contains("(it chooses `N`, which has no candidates to tune)"), "{}", r.stderr);
    // A candidate the kernel itself declares but that does not verify (B = 0 divides by zero):
    // `tune` skips it, and a record edited to choose it is ignored, not an error about `B`.
    let kernel = dir.path().join("zero.tk");
    std::fs::write(
        &kernel,
        std::fs::read_to_string(root().join("examples/add.tk"))
            .unwrap()
            .replace("B = 128 in (64, 128, 256, 512, 1024)", "B = 128 in (0, 128)"),
    )
    .unwrap();
    let kernel = kernel.to_str().unwrap();
    let r = tessel_env(&["tune", kernel, "--backend", "interpret", "--runs", "1"], &envs);
    assert!(r.code == 0 && r.stdout.contains("  B = 0: not run: "), "{}\n{}", r.stdout, r.stderr);
    let record = r.stdout.lines().find_map(|l| l.strip_prefix("record: ")).expect("a record").to_string();
    let mut edited: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    edited["chosen"]["B"] = 0.into();
    std::fs::write(&record, edited.to_string()).unwrap();
    let r = tessel_env(&["run", kernel, "--backend", "interpret", "--explain"], &envs);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains(&format!("warning: tuning record {record} ignored (")), "{}", r.stderr);
    assert!(r.stderr.contains("divides by `B`, which is 0"), "the reason: {}", r.stderr);
    assert!(r.stdout.contains("B = 128 (default)"), "{}", r.stdout);
}

#[test]
fn tune_never_chooses_a_candidate_that_disagrees() {
    // The fixture backend runs nothing: its outputs stay zeros, wrong for every candidate.
    cargo_build(&["-p", "tessel-fixture-panics"]);
    let plugin =
        target_dir().join(format!("{}tessel_fixture_panics{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let file = root().join("examples/add.tk").display().to_string();
    let args = ["--plugin", plugin.to_str().unwrap(), "tune", &file, "--backend", "panicky", "--runs", "1"];
    let r = tessel_env(&args, &[("TESSEL_CACHE_DIR", cache.to_str().unwrap())]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    for b in [64, 128, 256, 512, 1024] {
        let line = format!("  B = {b}: DISAGREES with the interpreter, a bug of panicky; not chosen (check o: max abs error");
        assert!(r.stdout.contains(&line), "{}", r.stdout);
    }
    assert!(r.stderr.contains("no candidate of `add` ran and agreed with the interpreter on panicky"), "{}", r.stderr);
    assert!(!cache.join("tune").exists(), "no record is written");
}

#[test]
fn a_generic_kernel_built_in_rust_binds_and_launches_like_one_from_text() {
    use tessel_plugin_api::ir::builder::{Dim, GenericBuilder, KernelBuilder};
    use tessel_plugin_api::ir::{Affine, Type};
    let scale = GenericBuilder::new("scale")
        .param("N")
        .param_default("B", 128, &[64, 128, 256])
        .input("x", DType::F32, &[Dim::Param("N")])
        .build(|v| {
            let (n, b) = (v["N"] as usize, v["B"] as usize);
            let at_i = [Affine::axis("i")];
            KernelBuilder::new("scale")
                .axis("i", n.div_ceil(b) as u64)
                .input_block("x", Type::array(DType::F32, [n]), &[b], &at_i)
                .output_block("o", Type::array(DType::F32, [n]), &[b], &at_i)
                .body(|k| {
                    let x = k.load("x");
                    let y = k.mul(&x, 2.0);
                    k.store("o", &y);
                })
        });
    assert!(scale.template_text().starts_with("# built in Rust\nkernel scale[N, B = 128 in (64, 128, 256)]\n"));
    let rt = Runtime::new(&[]).expect("runtime");
    let xs = floats(&mut rng(5), 1000);
    let shapes = BTreeMap::from([("x".to_string(), vec![1000])]);
    let given = BTreeMap::from([("B".to_string(), 256)]);
    let s = rt.specialize(&scale, "scale", &given, &shapes, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.binding.values, BTreeMap::from([("N".to_string(), 1000), ("B".to_string(), 256)]));
    let args =
        LaunchArgs { inputs: BTreeMap::from([("x".to_string(), f32_array(&[1000], xs.clone()))]), grid: Default::default() };
    for exec in executors("a_generic_kernel_built_in_rust_binds_and_launches_like_one_from_text") {
        if exec == "mosaic-emu" {
            continue;
        }
        let out = rt
            .plan(
                tessel::Choice::Named(exec),
                &tessel::Launch::new([tessel::Call::new(s.kernel.clone())], [], args.grid.clone()),
            )
            .and_then(|p| p.launch(&args))
            .expect("runs");
        let want: Vec<f64> = xs.iter().map(|x| 2.0 * f64::from(*x)).collect();
        assert_close(&format!("scale on {exec}"), &out[0].1, &want, DType::F32);
    }
    // The binding errors are those of a kernel from text.
    let err = rt.specialize(&scale, "scale", &BTreeMap::new(), &BTreeMap::new(), None).unwrap_err().to_string();
    assert_eq!(err, "kernel `scale` needs a value for parameter `N`\n  give an input `x` (dimension 0) or `--param N=V`");
}
