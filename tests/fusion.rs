//! The interpreter fuses runs of elementwise statements (docs/language.md §8): each example and
//! test kernel, fused and statement by statement, gives the same bits on several seeds — and
//! the fused program does fuse them (the examples would otherwise prove nothing).

mod common;

use common::kernel_files;
use tessel::LaunchArgs;

#[test]
fn fused_programs_give_the_bits_of_their_statements() {
    // On two threads, as CI has: how many programs merge depends on the threads there are.
    rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool").install(fused_programs_on_this_pool);
}

fn fused_programs_on_this_pool() {
    let (mut compared, mut fused, mut merged) = (0, 0, 0);
    for path in &kernel_files() {
        let Ok(kernels) = tessel::load_file(path) else { continue };
        for k in &kernels {
            if k.grid().iter().any(|g| g.size == tessel_plugin_api::ir::AxisSize::Dyn) || !k.mesh_axes().is_empty() {
                continue; // a dyn grid needs sizes, mesh axes a mesh; their runs are in other kernels too
            }
            let (with, without) = (tessel_interpret::compile(k), tessel_interpret::compile_unfused(k));
            fused += usize::from(with.fused_runs() > 0);
            merged += usize::from(with.merged_programs() > 1);
            for seed in 1..=3 {
                let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), seed), grid: Default::default() };
                let (a, b) = (with.run(&args).expect("runs"), without.run(&args).expect("runs"));
                for ((name, x), (_, y)) in a.iter().zip(&b) {
                    assert_eq!(x.to_bits(), y.to_bits(), "{} kernel {} output {name} (seed {seed})", path.display(), k.name());
                }
                compared += 1;
            }
        }
    }
    assert!(
        compared >= 60 && fused >= 15 && merged >= 2,
        "{compared} launches compared, {fused} kernels with fused runs, {merged} with programs merged"
    );
}

#[test]
fn merged_programs_write_what_their_programs_would_and_nothing_else() {
    // 4096 programs of 64 elements over an array of 262,180: the grid leaves the last 36
    // elements unwritten (zeros); compiled for two threads, the programs merge several at a time.
    let src = "kernel k\n  grid (i: 4096)\n  in  x: f32[262180] block [64] at (i)\n  in  y: f32[262180] block [64] at (i)\n  out o: f32[262180] block [64] at (i)\n{\n  %a = load x\n  %b = load y\n  %c = mul %a, %b\n  %d = add %c, 1.5\n  store o, %d\n}\n";
    let k = &tessel::load_source("merged.tk", src).unwrap_or_else(|e| panic!("{e}"))[0];
    let c = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool").install(|| tessel_interpret::compile(k));
    assert!(c.merged_programs() > 1, "merged");
    let n = 262_180;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25).collect();
    let y: Vec<f32> = (0..n).map(|i| 3.0 - (i % 777) as f32 / 64.0).collect();
    let args = LaunchArgs {
        inputs: [("x".to_string(), common::f32_array(&[n], x.clone())), ("y".to_string(), common::f32_array(&[n], y.clone()))]
            .into(),
        grid: Default::default(),
    };
    let got: Vec<f64> = c.run(&args).expect("runs").remove(0).1.to_f64();
    for i in 0..n {
        let want = if i < 4096 * 64 { f64::from(x[i] * y[i] + 1.5) } else { 0.0 };
        assert_eq!(got[i], want, "element {i}");
    }
}

#[test]
fn a_matmul_merged_along_its_rows_gives_the_unmerged_bits() {
    // 64 programs of 16×16 blocks, `k` in 4 steps; compiled for two threads the programs merge
    // along `i` and share `b`'s block. The bits are those of the program as written, statement
    // by statement, and the products those of an f64 reference within f32 rounding.
    let src = "kernel mm\n  grid (i: 16, j: 4, k: 4 seq)\n  in  a: f32[256, 64] block [16, 16] at (i, k)\n  in  b: f32[64, 64] block [16, 16] at (k, j)\n  out c: f32[256, 64] block [16, 16] at (i, j)\n{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  %acc = load c\n  %sum = add %acc, %p\n  store c, %sum\n}\n";
    let k = &tessel::load_source("mm.tk", src).unwrap_or_else(|e| panic!("{e}"))[0];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
    let merged = pool.install(|| tessel_interpret::compile(k));
    assert!(merged.merged_programs() > 1, "merged");
    let a: Vec<f32> = (0..256 * 64).map(|n| ((n * 37) % 101) as f32 / 16.0 - 3.0).collect();
    let b: Vec<f32> = (0..64 * 64).map(|n| ((n * 53) % 89) as f32 / 32.0 - 1.25).collect();
    let args = LaunchArgs {
        inputs: [
            ("a".to_string(), common::f32_array(&[256, 64], a.clone())),
            ("b".to_string(), common::f32_array(&[64, 64], b.clone())),
        ]
        .into(),
        grid: Default::default(),
    };
    let got = pool.install(|| merged.run(&args)).expect("runs").remove(0).1;
    let want = pool.install(|| tessel_interpret::compile_unfused(k).run(&args)).expect("runs").remove(0).1;
    assert_eq!(got.to_bits(), want.to_bits());
    for (n, g) in got.to_f64().into_iter().enumerate() {
        let (r, c) = (n / 64, n % 64);
        let exact: f64 = (0..64).map(|q| f64::from(a[r * 64 + q]) * f64::from(b[q * 64 + c])).sum();
        assert!((g - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "c[{r}, {c}] = {g}, want {exact}");
    }
}

#[test]
fn a_row_softmax_is_one_fused_run() {
    // `x - max(x)` and `e / sum(e)` read their row's reduction within the chunk that made it
    // (keepdims), so load, max, sub, exp, sum, div and store make one run, not three.
    for path in ["benches/kernels/softmax_4096.tk", "examples/softmax.tk"] {
        let k = &tessel::load_file(&common::root().join(path)).expect("loads")[0];
        assert_eq!(tessel_interpret::compile(k).fused_runs(), 1, "{path}");
    }
}

/// The outputs of `src` (one kernel over `x: f32[4096]`) on the interpreter, fused and not,
/// for `x[n] = n / 8`.
fn both_ways(src: &str) -> [Vec<(String, Vec<f32>)>; 2] {
    let k = &tessel::load_source("order.tk", src).unwrap_or_else(|e| panic!("{e}"))[0];
    let x: Vec<f32> = (0..4096).map(|n| n as f32 / 8.0).collect();
    let args = LaunchArgs { inputs: [("x".to_string(), common::f32_array(&[4096], x))].into(), grid: Default::default() };
    let run = |c: tessel_interpret::Compiled| -> Vec<(String, Vec<f32>)> {
        c.run(&args).expect("runs").into_iter().map(|(n, a)| (n, a.to_f64().into_iter().map(|v| v as f32).collect())).collect()
    };
    assert!(tessel_interpret::compile(k).fused_runs() == 1, "one run");
    [run(tessel_interpret::compile(k)), run(tessel_interpret::compile_unfused(k))]
}

#[test]
fn a_result_written_straight_into_its_store_keeps_the_statements_order() {
    // `%c` goes straight into `o` only where nothing between it and its store touches `o`:
    // here a store of `%a` comes between, and the last store wins (o = x + 1, not x).
    let head = "kernel order\n  grid (i: 4)\n  in  x: f32[4096] block [1024] at (i)\n  out o: f32[4096] block [1024] at (i)\n  out z: f32[4096] block [1024] at (i)\n{\n  %a = load x\n  %c = add %a, 1.0\n";
    let want_c: Vec<f32> = (0..4096).map(|n| n as f32 / 8.0 + 1.0).collect();
    for [fused, unfused] in [
        both_ways(&format!("{head}  store o, %a\n  store o, %c\n  store z, %a\n}}\n")),
        both_ways(&format!("{head}  %d = mul %a, 2.0\n  store o, %c\n  store z, %d\n}}\n")),
    ] {
        assert_eq!(fused, unfused);
        assert_eq!(fused[0].1, want_c, "o = x + 1");
    }
    // A load of `o` between them reads it as it was (zeros), not the chunk written early.
    let [fused, unfused] = both_ways(&format!("{head}  %p = load o\n  store o, %c\n  store z, %p\n}}\n"));
    assert_eq!(fused, unfused);
    assert_eq!(fused[0].1, want_c);
    assert!(fused[1].1.iter().all(|&v| v == 0.0), "z = o before the store: zeros");
}
