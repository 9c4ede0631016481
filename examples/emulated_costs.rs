//! What the Mosaic GPU PTX of every example (and of tests/in/attention_f16.tk) executes on the PTX emulator, per CTA: instructions,
//! global and shared memory accesses, barriers, tensor-core `mma.sync`s and `wgmma`s, bytes of
//! tensor copies (TMA). A kernel on the Hopper path is also shown on the general path (`general`),
//! as it ran before that path. A cost model for comparing lowerings on a machine without a GPU,
//! not a timing.
//!
//!     cargo run -p tessel-suite --example emulated_costs

#[path = "../tests/common/mod.rs"]
mod common;

use tessel::{LaunchArgs, Runtime};

fn main() {
    let rt = Runtime::new(&[]).expect("runtime");
    let mut files: Vec<_> = std::fs::read_dir(common::root().join("examples"))
        .expect("examples/")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    // The Hopper attention path's kernel beside the examples (the f32 flash-attention example
    // takes the general path).
    files.push(common::root().join("tests/in/attention_f16.tk"));
    println!(
        "{:<24} {:>5} {:>14} {:>10} {:>10} {:>9} {:>6} {:>6} {:>10}",
        "kernel", "CTAs", "instr/thread", "global", "shared", "barriers", "mma", "wgmma", "TMA bytes"
    );
    for path in files {
        let kernels = tessel::load_file(&path).expect("kernel file");
        let k = &kernels[0];
        // A kernel without a grid takes the mesh its comment names.
        let text = std::fs::read_to_string(&path).expect("read");
        let mesh =
            text.lines().find_map(|l| l.strip_prefix("# mosaic-gpu mesh: ")).map(|m| rt.mesh("mosaic-gpu", m).expect("mesh"));
        let call = [tessel::Call { kernel: std::sync::Arc::new(k.clone()), mesh: mesh.map(std::sync::Arc::new) }];
        let Ok(mut lowered) =
            rt.plan(tessel::Choice::Named("mosaic-gpu"), &tessel::Launch::kernels(call.clone())).and_then(|p| p.lower())
        else {
            continue;
        };
        let (_, ptx) = lowered.remove(0);
        let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 1), grid: Default::default() };
        row(k.name(), &ptx, k, &args);
        if ptx.contains("// hopper:") {
            // The same kernel as the general path lowers it (mma.sync, values in the workspace).
            let general = tessel_mosaic_gpu::lower::plan_general(k, None).expect("the general path plans it");
            row(&format!("{} (general)", k.name()), &tessel_mosaic_gpu::emit::emit(&general), k, &args);
        }
    }
}

fn row(name: &str, ptx: &str, k: &tessel_plugin_api::ir::Verified, args: &LaunchArgs) {
    let (_, c) = common::emulate_counted(ptx, k, args, false).expect("emulates");
    let shape = common::launch_shape(ptx);
    let (ctas, threads) = (u64::from(shape.ctas), u64::from(shape.threads));
    println!(
        "{:<24} {:>5} {:>14} {:>10} {:>10} {:>9} {:>6} {:>6} {:>10}",
        name,
        ctas,
        c.instructions / (ctas * threads),
        c.global / ctas,
        c.shared / ctas,
        c.barriers / ctas,
        c.mma / ctas,
        c.wgmma / ctas,
        c.tensor_bytes / ctas
    );
}
