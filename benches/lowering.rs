//! How long the Mosaic GPU backend takes to plan and write a kernel's PTX (issue 37 asks for
//! under 5 ms a kernel): the Hopper-path matmuls at 4096³, plain and with the bias + gelu
//! epilogue, flash attention in bf16 on the Hopper attention path, and the f32 flash-attention
//! example on the general path; then the gelu matmul on the warp-specialized and persistent
//! schedules and attention on the warp-specialized one. Pure: no device, no driver (the backend's compiler: plan, PTX and
//! stages, on its default schedule and then on the others). For scale, NVIDIA's `ptxas`
//! takes 0.7 to 1.1 s to assemble the gelu matmul's PTX on the same machine.

use std::hint::black_box;

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tessel_mosaic_gpu::{MosaicGpu, Schedule};
use tessel_plugin_api::backend::{Call, Compiler, Request};

fn lowering(c: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut g = c.benchmark_group("mosaic_lowering");
    let files = [
        "benches/kernels/matmul_bf16_4096.tk",
        "benches/kernels/matmul_bf16_gelu_4096.tk",
        "benches/kernels/attention_bf16_16384.tk",
        "examples/flash_attention.tk",
    ];
    let launch_of = |k: &tessel_plugin_api::ir::Verified| {
        Request::new(vec![Call { kernel: Arc::new(k.kernel().clone()), mesh: None }], Vec::new(), Default::default())
    };
    for f in files {
        let k = tessel::load_file(&root.join(f)).expect("the kernel verifies").remove(0);
        let name = std::path::Path::new(f).file_stem().and_then(|s| s.to_str()).unwrap_or(f).to_string();
        let (compiler, launch) = (MosaicGpu::new(), launch_of(&k));
        g.bench_function(name, |b| b.iter(|| black_box(compiler.lower(&launch).expect("lowers")[0].1.len())));
    }
    let scheduled = [
        ("matmul_bf16_gelu_4096", Schedule::Specialized),
        ("matmul_bf16_gelu_4096", Schedule::Persistent),
        ("attention_bf16_16384", Schedule::Specialized),
    ];
    for (name, schedule) in scheduled {
        let k = tessel::load_file(&root.join(format!("benches/kernels/{name}.tk"))).expect("the kernel verifies").remove(0);
        let compiler = MosaicGpu::with_schedule(schedule);
        let launch = launch_of(&k);
        g.bench_function(format!("{name}_{}", schedule.name()), |b| {
            b.iter(|| black_box(compiler.lower(&launch).expect("lowers")[0].1.len()))
        });
    }
    g.finish();
}

criterion_group!(benches, lowering);
criterion_main!(benches);
