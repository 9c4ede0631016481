//! Long kernels without nesting (docs/reliability.md): a chain `%v1 = add %v0, 1.0; ...` passes
//! every nesting limit, so nothing bounds it but the 16 MiB cap on kernel text. The interpreter
//! compiles and runs it in time linear in its length; wgpu runs it up to its stated statement
//! limit and refuses it past that, by name. Each runs on the test's own thread (2 MiB of stack,
//! less than the CLI's main thread has), where a recursion per statement would overflow.

mod common;

use common::*;
use tessel_plugin_api::ir::DType;

/// A load, `n` `add`s of 1.0 and a store, on 4 programs of 16 elements.
fn chain(n: usize) -> String {
    let mut text = String::from("kernel chain\n  grid (i: 4)\n  in x: f32[64] block [16] at (i)\n  out o: f32[64] block [16] at (i)\n{\n  %v0 = load x\n");
    for k in 1..=n {
        text.push_str(&format!("  %v{k} = add %v{}, 1.0\n", k - 1));
    }
    text.push_str(&format!("  store o, %v{n}\n}}\n"));
    text
}

/// Runs `chain(n)` on `backend` and compares it with the same additions made here, in order.
fn run_chain(n: usize, backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chain.tk");
    std::fs::write(&path, chain(n)).unwrap();
    let x = floats(&mut rng(n as u64), 64);
    let input = input_arg(dir.path(), "x", &f32_array(&[64], x.clone()));
    let out = dir.path().join("out");
    let (path, out) = (path.display().to_string(), out.display().to_string());
    let r = tessel(&["run", &path, "--backend", backend, "--input", &input, "--out-dir", &out]);
    assert_eq!(r.code, 0, "{backend}: {}{}", r.stdout, r.stderr);
    let want: Vec<f64> = x.iter().map(|&v| (0..n).fold(v, |acc, _| acc + 1.0f32) as f64).collect();
    assert_close(&format!("chain of {n} on {backend}"), &read_output(dir.path().join("out").as_path(), "o"), &want, DType::F32);
}

#[test]
fn a_chain_of_100000_statements_runs_on_interpret() {
    run_chain(100_000, "interpret");
}

#[test]
fn a_chain_of_6000_statements_runs_on_wgpu() {
    // Past where the writer's recursion per inlined value overflowed the CLI's stack (about
    // 4,000 in a debug build); the compile takes seconds on lavapipe.
    if wgpu_adapter("a_chain_of_6000_statements_runs_on_wgpu").is_some() {
        run_chain(6_000, "wgpu");
    }
}

#[test]
fn a_chain_of_100000_statements_is_lowered_by_every_backend_or_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chain.tk");
    std::fs::write(&path, chain(100_000)).unwrap();
    let path = path.display().to_string();
    for backend in ["interpret", "mosaic-gpu"] {
        let r = tessel(&["lower", &path, "--backend", backend]);
        assert_eq!(r.code, 0, "{backend}: {}", r.stderr);
        assert!(r.stdout.len() > 100_000, "{backend}: the lowered text holds every statement");
    }
    let r = tessel(&["lower", &path, "--backend", "wgpu"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("kernel `chain` has 100002 statements, more than the 16384 the wgpu backend compiles"),
        "{}",
        r.stderr
    );
}
