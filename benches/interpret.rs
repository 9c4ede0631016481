//! The reference interpreter on the three kernels of issue 2, each beside a baseline measured in
//! the same run: the same computation as a plain Rust loop (single-threaded, no blocks).
//! Run with `scripts/bench` or `cargo bench --bench interpret`.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessel::LaunchArgs;
use tessel_plugin_api::ir::Verified;

fn load(name: &str) -> Verified {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/kernels").join(format!("{name}.tk"));
    tessel::load_file(&path).expect("bench kernel verifies").remove(0)
}

fn args(kernel: &Verified) -> LaunchArgs {
    LaunchArgs { inputs: tessel::inputs::random_inputs(kernel.kernel(), 1), grid: Default::default() }
}

fn f32s(args: &LaunchArgs, name: &str) -> Vec<f32> {
    match &args.inputs[name].data {
        tessel_plugin_api::array::ArrayData::F32(v) => v.clone(),
        _ => unreachable!("f32 bench inputs"),
    }
}

fn matmul(c: &mut Criterion) {
    let k = load("matmul_512");
    let a = args(&k);
    let compiled = tessel_interpret::compile(&k);
    let (x, y) = (f32s(&a, "a"), f32s(&a, "b"));
    let mut g = c.benchmark_group("matmul_512");
    g.throughput(Throughput::Elements(2 * 512 * 512 * 512));
    g.sample_size(20);
    g.bench_function("interpret", |b| b.iter(|| compiled.run(black_box(&a)).expect("runs")));
    g.bench_function("baseline_rust_loop", |b| {
        b.iter(|| {
            let n = 512;
            let mut out = vec![0.0f32; n * n];
            for i in 0..n {
                for p in 0..n {
                    let s = x[i * n + p];
                    for j in 0..n {
                        out[i * n + j] += s * y[p * n + j];
                    }
                }
            }
            black_box(out)
        })
    });
    g.finish();
}

fn softmax(c: &mut Criterion) {
    let k = load("softmax_4096");
    let a = args(&k);
    let compiled = tessel_interpret::compile(&k);
    let x = f32s(&a, "x");
    let mut g = c.benchmark_group("softmax_4096x256");
    g.throughput(Throughput::Elements(4096 * 256));
    g.sample_size(20);
    g.bench_function("interpret", |b| b.iter(|| compiled.run(black_box(&a)).expect("runs")));
    g.bench_function("baseline_rust_loop", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(x.len());
            for row in x.chunks(256) {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = row.iter().map(|&v| (f64::from(v - m)).exp() as f32).collect();
                let s: f32 = e.iter().sum();
                out.extend(e.iter().map(|v| v / s));
            }
            black_box(out)
        })
    });
    g.finish();
}

fn add(c: &mut Criterion) {
    let k = load("add_4m");
    let a = args(&k);
    let compiled = tessel_interpret::compile(&k);
    let (x, y) = (f32s(&a, "x"), f32s(&a, "y"));
    let mut g = c.benchmark_group("add_4m");
    g.throughput(Throughput::Elements(4 << 20));
    g.sample_size(20);
    g.bench_function("interpret", |b| b.iter(|| compiled.run(black_box(&a)).expect("runs")));
    g.bench_function("baseline_rust_loop", |b| b.iter(|| black_box(x.iter().zip(&y).map(|(p, q)| p + q).collect::<Vec<f32>>())));
    g.finish();
}

fn front_end(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_verify_lower");
    for name in ["matmul", "softmax", "flash_attention"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.tk"));
        let text = std::fs::read_to_string(&path).expect("example");
        g.bench_function(name, |b| {
            b.iter(|| {
                let k = tessel::load_source("bench.tk", black_box(&text)).expect("verifies");
                black_box(tessel_interpret::compile(&k[0]))
            })
        });
    }
    g.finish();
}

/// A generic kernel's way to a backend (language §9): specializing (parse with the values bound,
/// verify), then planning and writing WGSL or PTX, beside the baseline of parsing and verifying
/// the same kernel written with numbers (what a kernel without parameters costs).
fn generic(c: &mut Criterion) {
    use std::collections::BTreeMap;
    use tessel_plugin_api::ir::generic::Source;
    let mut g = c.benchmark_group("generic");
    for (name, values) in [("softmax", &[("N", 1000), ("D", 256)][..]), ("matmul", &[("M", 1000), ("N", 512), ("K", 300)][..])] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.tk"));
        let text = std::fs::read_to_string(&path).expect("example");
        let src = Source::parse(&text).expect("parses");
        let k = &src.kernels()[0];
        let given: BTreeMap<String, i64> = values.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let values = k.bind(&given, &BTreeMap::new(), &BTreeMap::new()).expect("binds").values;
        let specialized = src.specialize(k, &values).expect("specializes");
        let concrete = specialized.text().to_string();
        g.bench_function(format!("{name}/parse_generic"), |b| {
            b.iter(|| black_box(Source::parse(black_box(&text)).expect("parses")))
        });
        g.bench_function(format!("{name}/specialize_verify"), |b| {
            b.iter(|| black_box(src.specialize(k, black_box(&values)).expect("ok")))
        });
        g.bench_function(format!("{name}/baseline_concrete_parse_verify"), |b| {
            b.iter(|| black_box(tessel::load_source("bench.tk", black_box(&concrete)).expect("verifies")))
        });
        g.bench_function(format!("{name}/specialize_verify_wgsl"), |b| {
            b.iter(|| {
                let v = src.specialize(k, black_box(&values)).expect("ok");
                let grid = tessel_plugin_api::launch::resolve_grid(&v, &BTreeMap::new()).expect("grid");
                let plan = tessel_wgpu::lower::plan(v, grid, tessel_wgpu::lower::Strategy::Cpu).expect("plans");
                black_box(tessel_wgpu::emit::lower(&plan))
            })
        });
        g.bench_function(format!("{name}/specialize_verify_ptx"), |b| {
            b.iter(|| {
                let v = src.specialize(k, black_box(&values)).expect("ok");
                let plan = tessel_mosaic_gpu::lower::plan(&v, None, Default::default()).expect("plans");
                black_box(tessel_mosaic_gpu::emit::emit(&plan))
            })
        });
    }
    g.finish();
}

/// What a computed block index costs the interpreter (issue 36: no more than a table lookup per
/// program): 16,384 programs of 64 elements each, their blocks picked by `at (i)` (affine, the
/// baseline) and by `at (tbl[i])` from a table that is the identity (the same blocks, read per
/// program), in the same run.
fn block_table(c: &mut Criterion) {
    let text = |at: &str| {
        format!(
            "kernel bt\n  grid (i: 16384)\n  in  tbl: i32[16384]\n  in  x: f32[1048576] block [64] at ({at})\n  out o: f32[1048576] block [64] at (i)\n{{\n  %x = load x\n  %y = add %x, 1.0\n  store o, %y\n}}\n"
        )
    };
    let mut g = c.benchmark_group("block_table_16384x64");
    g.throughput(Throughput::Elements(1 << 20));
    g.sample_size(20);
    for (name, at) in [("affine_at_i", "i"), ("computed_at_tbl_i", "tbl[i]")] {
        let k = tessel::load_source("bt.tk", &text(at)).expect("verifies").remove(0);
        let mut a = args(&k);
        let identity: Vec<i32> = (0..16384).collect();
        a.inputs.insert("tbl".into(), tessel::HostArray { shape: vec![16384], data: tessel_plugin_api::array::ArrayData::I32(identity) });
        let compiled = tessel_interpret::compile(&k);
        g.bench_function(name, |b| b.iter(|| compiled.run(black_box(&a)).expect("runs")));
    }
    g.finish();
}

/// A gather (issue 36's index vectors): an embedding lookup of 4,096 rows of 256 `f32` from a
/// table of 8,192 by a vector of token ids, 64 rows a program, beside the best plain Rust can do
/// (each row copied with `copy_from_slice`, one thread) and the same kernel reading its rows as a
/// contiguous block (ids in order, `at (i, 0)`), in the same run.
fn gather(c: &mut Criterion) {
    let head = "kernel lookup\n  grid (i: 64)\n  in  ids: i32[4096] block [64] at (i)\n  in  e: f32[8192, 256]\n  out o: f32[4096, 256] block [64, 256] at (i, 0)\n{\n";
    let gathered = format!("{head}  %t = load ids\n  %r = load e[%t, :]\n  store o, %r\n}}\n");
    let k = tessel::load_source("lookup.tk", &gathered).expect("verifies").remove(0);
    let mut a = args(&k);
    let ids: Vec<i32> = (0..4096).map(|t| (t * 2_654_435_761u64 as i64 % 8192) as i32).collect();
    a.inputs.insert("ids".into(), tessel::HostArray { shape: vec![4096], data: tessel_plugin_api::array::ArrayData::I32(ids.clone()) });
    let e = f32s(&a, "e");
    let compiled = tessel_interpret::compile(&k);
    let mut g = c.benchmark_group("gather_4096x256");
    g.throughput(Throughput::Bytes(4096 * 256 * 4));
    g.sample_size(20);
    g.bench_function("interpret_gather", |b| b.iter(|| compiled.run(black_box(&a)).expect("runs")));
    g.bench_function("baseline_rust_row_copies", |b| {
        b.iter(|| {
            let mut out = vec![0.0f32; 4096 * 256];
            for (row, &t) in out.chunks_exact_mut(256).zip(&ids) {
                row.copy_from_slice(&e[t as usize * 256..(t as usize + 1) * 256]);
            }
            black_box(out)
        })
    });
    let block = "kernel rows\n  grid (i: 64)\n  in  e: f32[8192, 256] block [64, 256] at (i, 0)\n  out o: f32[4096, 256] block [64, 256] at (i, 0)\n{\n  %r = load e\n  store o, %r\n}\n";
    let kb = tessel::load_source("rows.tk", block).expect("verifies").remove(0);
    let ab = LaunchArgs { inputs: [("e".to_string(), a.inputs["e"].clone())].into(), grid: Default::default() };
    let cb = tessel_interpret::compile(&kb);
    g.bench_function("interpret_contiguous_block", |b| b.iter(|| cb.run(black_box(&ab)).expect("runs")));
    g.finish();
}

criterion_group!(benches, matmul, softmax, add, front_end, generic, block_table, gather);
criterion_main!(benches);
