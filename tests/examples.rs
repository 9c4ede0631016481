//! Every example of `examples/` run through `tessel run --backend interpret` with inputs written
//! here, against results computed here with plain loops in f64 (never with the interpreter).

mod common;

use common::*;
use tessel_plugin_api::ir::DType;

/// Runs `examples/NAME.tk` with the given inputs; returns the output folder.
fn run_example(name: &str, inputs: &[(&str, tessel::HostArray)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = root().join("examples").join(format!("{name}.tk"));
    let mut args: Vec<String> = vec!["run".into(), file.display().to_string(), "--backend".into(), "interpret".into()];
    for (n, a) in inputs {
        args.push("--input".into());
        args.push(input_arg(dir.path(), n, a));
    }
    args.push("--out-dir".into());
    args.push(dir.path().display().to_string());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = tessel(&argv);
    assert_eq!(r.code, 0, "tessel run {name} failed:\n{}{}", r.stdout, r.stderr);
    dir
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn add() {
    let mut g = rng(1);
    let (x, y) = (floats(&mut g, 1024), floats(&mut g, 1024));
    let want: Vec<f64> = x.iter().zip(&y).map(|(&a, &b)| f64::from(a) + f64::from(b)).collect();
    let d = run_example("add", &[("x", f32_array(&[1024], x)), ("y", f32_array(&[1024], y))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn fused() {
    let mut g = rng(2);
    let (x, y) = (floats(&mut g, 4096), floats(&mut g, 4096));
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| {
            let (a, b) = (f64::from(a), f64::from(b));
            (a * b + (-a).exp()).max(0.0)
        })
        .collect();
    let d = run_example("fused", &[("x", f32_array(&[4096], x)), ("y", f32_array(&[4096], y))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn transpose_bias() {
    let mut g = rng(3);
    let (x, bias) = (floats(&mut g, 256 * 128), floats(&mut g, 256));
    let mut want = vec![0.0; 128 * 256];
    for r in 0..256 {
        for c in 0..128 {
            want[c * 256 + r] = f64::from(x[r * 128 + c]) + f64::from(bias[r]);
        }
    }
    let d = run_example("transpose_bias", &[("x", f32_array(&[256, 128], x)), ("bias", f32_array(&[256], bias))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn row_reduce() {
    let mut g = rng(4);
    let x = floats(&mut g, 64 * 1024);
    let rows: Vec<&[f32]> = x.chunks(1024).collect();
    let sums: Vec<f64> = rows.iter().map(|r| r.iter().map(|&v| f64::from(v)).sum()).collect();
    let maxs: Vec<f64> = rows.iter().map(|r| r.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max)).collect();
    let d = run_example("row_reduce", &[("x", f32_array(&[64, 1024], x))]);
    assert_close("s", &read_output(d.path(), "s"), &sums, DType::F32);
    assert_close("m", &read_output(d.path(), "m"), &maxs, DType::F32);
}

#[test]
fn matmul() {
    let mut g = rng(5);
    let n = 256;
    let (a, b) = (floats(&mut g, n * n), floats(&mut g, n * n));
    let mut want = vec![0.0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            want[i * n + j] = (0..n).map(|k| f64::from(a[i * n + k]) * f64::from(b[k * n + j])).sum();
        }
    }
    let d = run_example("matmul", &[("a", f32_array(&[n, n], a)), ("b", f32_array(&[n, n], b))]);
    assert_close("c", &read_output(d.path(), "c"), &want, DType::F32);
}

#[test]
fn matmul_bf16() {
    let mut g = rng(10);
    let n = 256;
    let bf16s = |g: &mut _| floats(g, n * n).into_iter().map(half::bf16::from_f32).collect::<Vec<_>>();
    let (a, b) = (bf16s(&mut g), bf16s(&mut g));
    let mut want = vec![0.0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            want[i * n + j] = (0..n).map(|k| a[i * n + k].to_f64() * b[k * n + j].to_f64()).sum();
        }
    }
    let array = |v| tessel::HostArray { shape: vec![n, n], data: tessel_plugin_api::array::ArrayData::BF16(v) };
    let d = run_example("matmul_bf16", &[("a", array(a)), ("b", array(b))]);
    assert_close("c", &read_output(d.path(), "c"), &want, DType::F32);
}

fn softmax_rows(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

#[test]
fn softmax() {
    let mut g = rng(6);
    let x = floats(&mut g, 1024 * 256);
    let want = softmax_rows(&f64s(&x), 256);
    let d = run_example("softmax", &[("x", f32_array(&[1024, 256], x))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn masked() {
    let mut g = rng(7);
    let x = floats(&mut g, 1000);
    let want: Vec<f64> = x.iter().map(|&v| 2.0 * f64::from(v) + 1.0).collect();
    let d = run_example("masked", &[("x", f32_array(&[1000], x))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn ragged() {
    let mut g = rng(8);
    let x = floats(&mut g, 1000);
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v).abs().sqrt() + 1.0).collect();
    let d = run_example("ragged", &[("x", f32_array(&[1000], x))]);
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn flash_attention() {
    let mut g = rng(9);
    let (n, dh) = (256, 64);
    let (q, k, v) = (floats(&mut g, n * dh), floats(&mut g, n * dh), floats(&mut g, n * dh));
    let mut scores = vec![0.0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            scores[i * n + j] = (0..dh).map(|c| f64::from(q[i * dh + c]) * f64::from(k[j * dh + c])).sum::<f64>() / 8.0;
        }
    }
    let p = softmax_rows(&scores, n);
    let mut want = vec![0.0f64; n * dh];
    for i in 0..n {
        for c in 0..dh {
            want[i * dh + c] = (0..n).map(|j| p[i * n + j] * f64::from(v[j * dh + c])).sum();
        }
    }
    let d = run_example(
        "flash_attention",
        &[("q", f32_array(&[n, dh], q)), ("k", f32_array(&[n, dh], k)), ("v", f32_array(&[n, dh], v))],
    );
    assert_close("o", &read_output(d.path(), "o"), &want, DType::F32);
}

#[test]
fn every_example_is_tested_here() {
    let tested = [
        "add",
        "fused",
        "transpose_bias",
        "row_reduce",
        "matmul",
        "matmul_bf16",
        "softmax",
        "masked",
        "ragged",
        "flash_attention",
    ];
    let mut found: Vec<String> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(String::from))
        .filter(|n| !n.starts_with('.'))
        .collect();
    found.retain(|n| root().join("examples").join(format!("{n}.tk")).exists());
    found.sort();
    let mut want: Vec<String> = tested.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(found, want, "add an independent check here for every new example");
}
