//! The cost of a call across the plugin boundary: the same method called directly on the Rust
//! type and through the ABI-stable object (vtable + FFI-safe types), built-in and, when
//! `target/release/libtessel_interpret.so` exists (`cargo build --release -p tessel-interpret
//! --features plugin`), through the plugin library; and a whole launch of `benches/kernels/tiny.tk`
//! on the interpreter through `Runtime::run` (host arrays in and out), the Rust side of the Python
//! module's call overhead (`benches/python_call.py` times the same launch from Python).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tessel_interpret::Interpreter;
use tessel_plugin_api::backend::{BackendImpl, export};

fn boundary(c: &mut Criterion) {
    let direct = Interpreter::new();
    let object = export(Interpreter::new());
    let mut g = c.benchmark_group("call");
    g.bench_function("direct_version", |b| b.iter(|| black_box(black_box(&direct).version().len())));
    g.bench_function("boundary_version", |b| b.iter(|| black_box(black_box(&object).version().len())));
    g.bench_function("direct_availability", |b| b.iter(|| black_box(black_box(&direct).availability().is_ok())));
    g.bench_function("boundary_availability", |b| b.iter(|| black_box(black_box(&object).availability().available)));
    let so = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libtessel_interpret.so");
    if so.exists() {
        let mut reg = tessel::registry::Registry::builtins();
        let plugin = &reg.load(&so).expect("the release plugin loads").backend;
        g.bench_function("plugin_version", |b| b.iter(|| black_box(black_box(plugin).version().len())));
        g.bench_function("plugin_availability", |b| b.iter(|| black_box(black_box(plugin).availability().available)));
    } else {
        eprintln!("SKIP plugin_*: {} not built", so.display());
    }
    g.finish();

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/kernels/tiny.tk");
    let k = tessel::load_file(&path).expect("tiny.tk verifies").remove(0);
    let rt = tessel::Runtime::new(&[]).expect("runtime");
    let call = [tessel::KernelLaunch { kernel: &k, mesh: None }];
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 1), grid: Default::default() };
    let mut g = c.benchmark_group("launch_tiny_host");
    g.bench_function("runtime_run_interpret", |b| b.iter(|| black_box(rt.run("interpret", &call, &[], &args).expect("runs"))));
    g.finish();
}

criterion_group!(benches, boundary);
criterion_main!(benches);
