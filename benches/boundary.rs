//! The cost of a call across the plugin boundary: the same method called directly on the Rust
//! type and through the ABI-stable object (vtable + FFI-safe types), built-in and, when
//! `target/release/libtessel_interpret.so` exists (`cargo build --release -p tessel-interpret
//! --features plugin`), through the plugin library; and a whole launch of `benches/kernels/tiny.tk`
//! on the interpreter through `Planned::run` (host arrays in and out), the Rust side of the Python
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
    let call = [tessel::Call::new(k.clone())];
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 1), grid: Default::default() };
    let mut g = c.benchmark_group("launch_tiny_host");
    g.bench_function("runtime_run_interpret", |b| b.iter(|| black_box(plan_and_run(&rt, &call, &args))));
    g.finish();

    // 16M f32 + 16M f32: host arrays copied in and out (Planned::run) against the same launch on
    // memory the caller owns (Planned::run_in_place, the Python module's path).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/kernels/add_16m.tk");
    let k = tessel::load_file(&path).expect("add_16m.tk verifies").remove(0);
    let call = [tessel::Call::new(k.clone())];
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), 1), grid: Default::default() };
    let bytes: Vec<(String, tessel_plugin_api::ir::Type, Vec<u8>)> =
        args.inputs.iter().map(|(n, a)| (n.clone(), a.ty(), a.le_bytes().into_owned())).collect();
    let out_ty = k.kernel().param("o").expect("output o").ty.clone();
    let mut out = vec![0u8; out_ty.numel() * 4];
    let mut g = c.benchmark_group("launch_add16m_host");
    g.sample_size(10);
    g.bench_function("runtime_run_interpret", |b| b.iter(|| black_box(plan_and_run(&rt, &call, &args))));
    g.bench_function("runtime_run_in_place_interpret", |b| {
        b.iter(|| {
            let mut place = tessel::InPlace::default();
            for (n, ty, data) in &bytes {
                place.inputs.insert(n.clone(), tessel::BytesRef { ty: ty.clone(), bytes: data });
            }
            place.outputs.insert("o".into(), tessel::BytesMut { ty: out_ty.clone(), bytes: &mut out, keep: false });
            black_box(
                rt.plan(tessel::Choice::of("interpret"), &tessel::Launch::new(call.clone(), [], place.grid.clone()))
                    .and_then(|p| p.run_in_place(&mut place))
                    .expect("runs"),
            )
        })
    });
    g.finish();
}

/// A launch as a caller that launches once makes it: planned on the interpreter, then run (host
/// arrays in and out).
fn plan_and_run(rt: &tessel::Runtime, call: &[tessel::Call], args: &tessel::LaunchArgs) -> tessel::Report {
    let launch = tessel::Launch::new(call.to_vec(), [], args.grid.clone());
    rt.plan(tessel::Choice::Named("interpret"), &launch).and_then(|p| p.run(args)).expect("runs")
}

criterion_group!(benches, boundary);
criterion_main!(benches);
