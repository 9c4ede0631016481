//! The wgpu backend against hand-written wgpu on the same adapter, in the same run:
//! - `launch_tiny`: a launch of a 64-element kernel on device-resident arrays through tessel
//!   (`Planned::launch_resident`: the plugin boundary, the compile cache, the refusal checks,
//!   zeroing the output) vs the same WGSL dispatched with raw wgpu and a prepared bind group;
//! - `add_16m`: o = x + y over 16M f32 vs a WGSL add of one `vec4` per invocation;
//! - `matmul_1024`: 1024³ f32 vs the best register-tiled `vec4` WGSL matmul written by hand for
//!   this adapter, and the naive one for scale;
//! - `softmax_16384`: row softmax over 16384 x 512 vs a WGSL softmax of one row per invocation,
//!   with WGSL's builtin `exp` and with the 1-ulp `exp` tessel writes (the same accuracy).
//!
//! Each group also prints its ratios from launches that alternate with their baselines, which a
//! drifting software adapter cannot skew (criterion runs one function's samples after another's).
//!
//! Run with `scripts/bench` or `cargo bench -p tessel-suite --bench wgpu`.

use std::collections::BTreeMap;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessel::{DeviceArray, Runtime};
use tessel_plugin_api::array::ArrayData;
use tessel_plugin_api::ir::Verified;

fn load(name: &str) -> Verified {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/kernels").join(format!("{name}.tk"));
    tessel::load_file(&path).expect("bench kernel verifies").remove(0)
}

/// Hand-written wgpu on its own device of the same adapter.
struct Raw {
    device: wgpu::Device,
    queue: wgpu::Queue,
}

impl Raw {
    fn new() -> Raw {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let options =
            wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
        let adapter = pollster::block_on(instance.request_adapter(&options)).expect("adapter");
        let desc = wgpu::DeviceDescriptor { required_limits: adapter.limits(), ..Default::default() };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).expect("device");
        Raw { device, queue }
    }

    fn buffer(&self, data: &[f32]) -> wgpu::Buffer {
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (data.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&b, 0, bytemuck::cast_slice(data));
        b
    }

    fn read(&self, b: &wgpu::Buffer) -> Vec<f32> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: b.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(b, 0, &staging, 0, b.size());
        self.queue.submit([enc.finish()]);
        staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
        self.device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        bytemuck::pod_collect_to_vec(&staging.get_mapped_range(..).expect("mapped")[..])
    }

    /// A pipeline and its bind group over `buffers` (binding i = buffers[i]).
    fn prepare(&self, wgsl: &str, buffers: &[&wgpu::Buffer]) -> (wgpu::ComputePipeline, wgpu::BindGroup) {
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(wgsl.into()) });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        (pipeline, group)
    }

    fn dispatch(&self, p: &(wgpu::ComputePipeline, wgpu::BindGroup), groups: (u32, u32)) {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&p.0);
            pass.set_bind_group(0, &p.1, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, 1);
        }
        self.queue.submit([enc.finish()]);
        self.device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    }
}

/// The best add written by hand: one `vec4` of each array per invocation.
const ADD_VEC4_WGSL: &str = "
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> y: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> o: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = g.y * n.x * 256u + g.x;
    if (i < arrayLength(&o)) { o[i] = x[i] + y[i]; }
}";

/// The textbook matmul, for scale: one output per invocation, one scalar read of each operand
/// per multiply-add.
const MATMUL_NAIVE_WGSL: &str = "
const N: u32 = 1024u;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = 0.0f;
    for (var k = 0u; k < N; k++) { acc = acc + a[g.y * N + k] * b[k * N + g.x]; }
    c[g.y * N + g.x] = acc;
}";

/// Rows of the register tile of [`matmul_wgsl`].
const TILE_ROWS: usize = 16;

/// The best 1024³ matmul written by hand for a CPU adapter: each invocation keeps a tile of
/// `TILE_ROWS` rows x 8 columns in `vec4` registers, reads a row of `a` four steps of the
/// contraction at a time and `b` as `vec4`s, straight from the buffers (no workgroup memory:
/// on a CPU adapter barriers and staging are pure cost); the k loop is unrolled by four.
fn matmul_wgsl() -> String {
    let mut s = String::from(
        "const N4: u32 = 256u;
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c4 = g.x * 2u;
",
    );
    s += &format!("    let r0 = g.y * {TILE_ROWS}u;\n");
    for i in 0..TILE_ROWS {
        s += &format!("    var acc{i}_0 = vec4<f32>();\n    var acc{i}_1 = vec4<f32>();\n");
    }
    s += "    for (var k = 0u; k < 1024u; k += 4u) {\n";
    for t in 0..4 {
        for q in 0..2 {
            s += &format!("        let b{t}_{q} = b[(k + {t}u) * N4 + c4 + {q}u];\n");
        }
    }
    for i in 0..TILE_ROWS {
        s += &format!("        let a{i} = a[(r0 + {i}u) * N4 + k / 4u];\n");
        for (t, comp) in ["x", "y", "z", "w"].iter().enumerate() {
            for q in 0..2 {
                s += &format!("        acc{i}_{q} = acc{i}_{q} + a{i}.{comp} * b{t}_{q};\n");
            }
        }
    }
    s += "    }\n";
    for i in 0..TILE_ROWS {
        for q in 0..2 {
            s += &format!("    c[(r0 + {i}u) * N4 + c4 + {q}u] = acc{i}_{q};\n");
        }
    }
    s + "}\n"
}

/// Row softmax over 16384 x 512 written by hand: one row per invocation, `vec4` reads; the
/// maximum, then the exponentials stored and summed, then scaled in place.
const SOFTMAX_WGSL: &str = "
const C4: u32 = 128u;
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> o: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let base = g.x * C4;
    var m = vec4<f32>(-3.4028235e38);
    for (var j = 0u; j < C4; j++) { m = max(m, x[base + j]); }
    let mm = max(max(m.x, m.y), max(m.z, m.w));
    var s = vec4<f32>();
    for (var j = 0u; j < C4; j++) {
        let e = exp(x[base + j] - mm);
        o[base + j] = e;
        s = s + e;
    }
    let t = (s.x + s.y) + (s.z + s.w);
    for (var j = 0u; j < C4; j++) { o[base + j] = o[base + j] / t; }
}";

/// [`SOFTMAX_WGSL`] with the `exp` tessel writes (1 ulp, `tessel_wgpu::exp_wgsl`) in place of
/// WGSL's builtin, which the language's accuracy contract does not allow (lavapipe's `exp(88.7)`
/// is 27 ulp off): the hand-written kernel held to tessel's accuracy.
fn softmax_accurate_wgsl() -> String {
    let exp4 = "fn tk_exp4(q: vec4<f32>) -> vec4<f32> { return vec4<f32>(tk_exp(q.x), tk_exp(q.y), tk_exp(q.z), tk_exp(q.w)); }";
    let body = SOFTMAX_WGSL.replace("let e = exp(", "let e = tk_exp4(");
    assert_ne!(body, SOFTMAX_WGSL, "the hand-written softmax calls exp");
    format!("{}\n{exp4}\n{body}", tessel_wgpu::exp_wgsl())
}

/// A kernel's seeded inputs on the wgpu backend and its zeroed outputs, bound by name.
type Bound = Vec<(String, DeviceArray)>;

fn resident(rt: &Runtime, k: &Verified) -> (Bound, BTreeMap<String, Vec<f32>>) {
    let inputs = tessel::inputs::random_inputs(k.kernel(), 1);
    let mut arrays = Vec::new();
    let mut host = BTreeMap::new();
    for p in &k.kernel().params {
        let a = match inputs.get(&p.name) {
            Some(h) => {
                if let ArrayData::F32(v) = &h.data {
                    host.insert(p.name.clone(), v.clone());
                }
                rt.upload("wgpu", h).expect("upload")
            }
            None => rt.alloc("wgpu", &p.ty).expect("alloc"),
        };
        arrays.push((p.name.clone(), a));
    }
    (arrays, host)
}

fn launch(rt: &Runtime, k: &Verified, arrays: &[(String, DeviceArray)]) {
    let bound: Vec<(&str, &DeviceArray)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    rt.plan(
        tessel::Choice::Named("wgpu"),
        &tessel::Launch::one(k.clone()),
    )
    .and_then(|p| p.launch_resident(&bound, false))
    .map(drop)
    .expect("launch");
}

fn output(rt: &Runtime, arrays: &[(String, DeviceArray)], name: &str) -> Vec<f32> {
    let a = &arrays.iter().find(|(n, _)| n == name).expect("output").1;
    match rt.download(a).expect("download").data {
        ArrayData::F32(v) => v,
        _ => unreachable!("f32 outputs"),
    }
}

/// Medians (µs) of `n` timed calls of each of `fs`, called in turn (one of each at a time), so
/// that a software adapter's drift over seconds (its worker threads share the cores with
/// everything else) reaches every function alike.
fn alternating(n: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut times = vec![Vec::with_capacity(n); fs.len()];
    for _ in 0..n {
        for (f, t) in fs.iter_mut().zip(&mut times) {
            let start = std::time::Instant::now();
            f();
            t.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    times
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect()
}

/// Prints the alternating medians of `fs` — tessel first, then the baselines named in `names` —
/// and each baseline's time over tessel's (above 1: tessel faster): the ratios `scripts/bench`
/// reports.
fn report_alternating(group: &str, n: usize, names: &[&str], fs: &mut [&mut dyn FnMut()]) {
    assert_eq!(names.len() + 1, fs.len(), "one name per baseline");
    let medians = alternating(n, fs);
    let rest: Vec<String> =
        names.iter().zip(&medians[1..]).map(|(name, m)| format!("{name} {m:.1} µs (ratio {:.3})", m / medians[0])).collect();
    eprintln!("{group} alternating, median of {n} each: tessel {:.1} µs; {}", medians[0], rest.join("; "));
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0.0f32, f32::max);
    assert!(worst < 1e-3, "{what}: tessel and the hand-written kernel disagree by {worst}");
}

fn wgpu_benches(c: &mut Criterion) {
    let rt = Runtime::new(&[]).expect("runtime");
    let available = rt.backend("wgpu").expect("wgpu built in").backend.availability();
    if !available.available {
        eprintln!("SKIP wgpu benches: {}", available.reason);
        return;
    }
    eprintln!("wgpu benches on {}", available.reason);
    let raw = Raw::new();

    // A tiny launch: the same WGSL, through tessel and raw.
    let k = load("tiny");
    let (arrays, host) = resident(&rt, &k);
    let call = [tessel::Call::new(k.clone())];
    let wgsl = rt
        .plan(tessel::Choice::Named("wgpu"), &tessel::Launch::kernels(call.clone()))
        .and_then(|p| p.lower())
        .expect("lower")
        .remove(0)
        .1;
    let (x, o) = (raw.buffer(&host["x"]), raw.buffer(&[0.0; 64]));
    let tiny = raw.prepare(&wgsl, &[&x, &o]);
    launch(&rt, &k, &arrays);
    raw.dispatch(&tiny, (1, 1));
    assert_close("tiny", &output(&rt, &arrays, "o"), &raw.read(&o));
    // A software adapter's speed drifts by tens of percent over seconds, so every group's ratios
    // are also taken from launches that alternate, one of each at a time (`report_alternating`).
    report_alternating(
        "launch_tiny",
        2000,
        &["raw_wgpu_same_wgsl"],
        &mut [&mut || launch(&rt, &k, &arrays), &mut || raw.dispatch(&tiny, (1, 1))],
    );
    let mut g = c.benchmark_group("launch_tiny");
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_same_wgsl", |b| b.iter(|| raw.dispatch(&tiny, (1, 1))));
    g.finish();

    let k = load("add_16m");
    let (arrays, host) = resident(&rt, &k);
    let n = 1usize << 24;
    let (x, y, o) = (raw.buffer(&host["x"]), raw.buffer(&host["y"]), raw.buffer(&vec![0.0; n]));
    let add = raw.prepare(ADD_VEC4_WGSL, &[&x, &y, &o]);
    launch(&rt, &k, &arrays);
    raw.dispatch(&add, (128, 128));
    assert_close("add_16m", &output(&rt, &arrays, "o"), &raw.read(&o));
    report_alternating(
        "add_16m",
        21,
        &["raw_wgpu_vec4"],
        &mut [&mut || launch(&rt, &k, &arrays), &mut || raw.dispatch(&add, (128, 128))],
    );
    let mut g = c.benchmark_group("add_16m");
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.sample_size(10);
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_vec4", |b| b.iter(|| raw.dispatch(&add, (128, 128))));
    g.finish();

    let k = load("matmul_1024");
    let (arrays, host) = resident(&rt, &k);
    let n = 1024usize;
    let (a, b, cc) = (raw.buffer(&host["a"]), raw.buffer(&host["b"]), raw.buffer(&vec![0.0; n * n]));
    let (tiled, naive) = (raw.prepare(&matmul_wgsl(), &[&a, &b, &cc]), raw.prepare(MATMUL_NAIVE_WGSL, &[&a, &b, &cc]));
    let tiled_groups = ((n / 64) as u32, (n / (8 * TILE_ROWS)) as u32);
    launch(&rt, &k, &arrays);
    let want = output(&rt, &arrays, "c");
    raw.dispatch(&tiled, tiled_groups);
    assert_close("matmul_1024 register-tiled", &want, &raw.read(&cc));
    raw.dispatch(&naive, (64, 64));
    assert_close("matmul_1024 naive", &want, &raw.read(&cc));
    report_alternating(
        "matmul_1024",
        11,
        &["raw_wgpu_register_tiled_vec4"],
        &mut [&mut || launch(&rt, &k, &arrays), &mut || raw.dispatch(&tiled, tiled_groups)],
    );
    let mut g = c.benchmark_group("matmul_1024");
    g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
    g.sample_size(10);
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_register_tiled_vec4", |b| b.iter(|| raw.dispatch(&tiled, tiled_groups)));
    g.bench_function("raw_wgpu_naive", |b| b.iter(|| raw.dispatch(&naive, (64, 64))));
    g.finish();

    let k = load("softmax_16384");
    let (arrays, host) = resident(&rt, &k);
    let (rows, cols) = (16384usize, 512usize);
    let (x, o) = (raw.buffer(&host["x"]), raw.buffer(&vec![0.0; rows * cols]));
    let softmax = raw.prepare(SOFTMAX_WGSL, &[&x, &o]);
    let accurate = raw.prepare(&softmax_accurate_wgsl(), &[&x, &o]);
    launch(&rt, &k, &arrays);
    let want = output(&rt, &arrays, "o");
    raw.dispatch(&softmax, ((rows / 64) as u32, 1));
    assert_close("softmax_16384", &want, &raw.read(&o));
    raw.dispatch(&accurate, ((rows / 64) as u32, 1));
    assert_close("softmax_16384 accurate exp", &want, &raw.read(&o));
    report_alternating(
        "softmax_16384",
        21,
        &["raw_wgpu_row_per_invocation", "raw_wgpu_row_per_invocation_accurate_exp"],
        &mut [&mut || launch(&rt, &k, &arrays), &mut || raw.dispatch(&softmax, ((rows / 64) as u32, 1)), &mut || {
            raw.dispatch(&accurate, ((rows / 64) as u32, 1))
        }],
    );
    let mut g = c.benchmark_group("softmax_16384");
    g.throughput(Throughput::Bytes(2 * 4 * (rows * cols) as u64));
    g.sample_size(10);
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_row_per_invocation", |b| b.iter(|| raw.dispatch(&softmax, ((rows / 64) as u32, 1))));
    g.bench_function("raw_wgpu_row_per_invocation_accurate_exp", |b| b.iter(|| raw.dispatch(&accurate, ((rows / 64) as u32, 1))));
    g.finish();
}

criterion_group!(benches, wgpu_benches);
criterion_main!(benches);
