//! What the Mosaic GPU PTX of every example executes on the PTX emulator, per CTA: instructions,
//! global and shared memory accesses, barriers, tensor-core `mma.sync`s. A cost model for
//! comparing lowerings on a machine without a GPU, not a timing.
//!
//!     cargo run -p tessel-suite --example emulated_costs

#[path = "../tests/common/mod.rs"]
mod common;

use tessel::{KernelLaunch, LaunchArgs, Runtime};

fn main() {
    let rt = Runtime::new(&[]).expect("runtime");
    let mut files: Vec<_> = std::fs::read_dir(common::root().join("examples"))
        .expect("examples/")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    println!(
        "{:<16} {:>5} {:>14} {:>10} {:>10} {:>9} {:>6}",
        "kernel", "CTAs", "instr/thread", "global", "shared", "barriers", "mma"
    );
    for path in files {
        let kernels = tessel::load_file(&path).expect("kernel file");
        let k = &kernels[0];
        // A kernel without a grid takes the mesh its comment names.
        let text = std::fs::read_to_string(&path).expect("read");
        let mesh =
            text.lines().find_map(|l| l.strip_prefix("# mosaic-gpu mesh: ")).map(|m| rt.mesh("mosaic-gpu", m).expect("mesh"));
        let call = [KernelLaunch { kernel: k, mesh: mesh.as_ref() }];
        let Ok(mut lowered) = rt.lower("mosaic-gpu", &call, &[], &Default::default()) else { continue };
        let (_, ptx) = lowered.remove(0);
        let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 1), grid: Default::default() };
        let (_, c) = common::emulate_counted(&ptx, k, &args, false).expect("emulates");
        let shape = common::launch_shape(&ptx);
        let (ctas, threads) = (u64::from(shape.ctas), u64::from(shape.threads));
        println!(
            "{:<16} {:>5} {:>14} {:>10} {:>10} {:>9} {:>6}",
            k.name(),
            ctas,
            c.instructions / (ctas * threads),
            c.global / ctas,
            c.shared / ctas,
            c.barriers / ctas,
            c.mma / ctas
        );
    }
}
