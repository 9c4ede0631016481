//! The interpreter fuses runs of elementwise statements (docs/language.md §8): each example and
//! test kernel, fused and statement by statement, gives the same bits on several seeds — and
//! the fused program does fuse them (the examples would otherwise prove nothing).

mod common;

use common::kernel_files;
use tessel::LaunchArgs;

#[test]
fn fused_programs_give_the_bits_of_their_statements() {
    let (mut compared, mut fused) = (0, 0);
    for path in &kernel_files() {
        let Ok(kernels) = tessel::load_file(path) else { continue };
        for k in &kernels {
            if k.grid().iter().any(|g| g.size == tessel_plugin_api::ir::AxisSize::Dyn) || !k.mesh_axes().is_empty() {
                continue; // a dyn grid needs sizes, mesh axes a mesh; their runs are in other kernels too
            }
            let (with, without) = (tessel_interpret::compile(k), tessel_interpret::compile_unfused(k));
            fused += usize::from(with.fused_runs() > 0);
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
    assert!(compared >= 60 && fused >= 15, "{compared} launches compared, {fused} kernels with fused runs");
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
