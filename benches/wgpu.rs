//! The wgpu backend against hand-written wgpu on the same adapter, in the same run:
//! - `launch_tiny`: a launch of a 64-element kernel on device-resident arrays through tessel
//!   (`Runtime::launch_resident`: the plugin boundary, the compile cache, the refusal checks,
//!   zeroing the output) vs the same WGSL dispatched with raw wgpu and a prepared bind group;
//! - `add_16m`: o = x + y over 16M f32 vs a one-element-per-invocation WGSL add;
//! - `matmul_1024`: 1024³ f32 vs a 16×16-tiled WGSL matmul in workgroup memory.
//!
//! Run with `scripts/bench` or `cargo bench -p tessel-suite --bench wgpu`.

use std::collections::BTreeMap;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessel::{DeviceArray, KernelLaunch, Runtime};
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

const ADD_WGSL: &str = "
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = g.y * n.x * 256u + g.x;
    if (i < arrayLength(&o)) { o[i] = x[i] + y[i]; }
}";

const MATMUL_WGSL: &str = "
const N: u32 = 1024u;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
var<workgroup> ta: array<array<f32, 16>, 16>;
var<workgroup> tb: array<array<f32, 16>, 16>;
@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let row = w.y * 16u + l.y;
    let col = w.x * 16u + l.x;
    var acc = 0.0f;
    for (var t = 0u; t < N / 16u; t++) {
        ta[l.y][l.x] = a[row * N + t * 16u + l.x];
        tb[l.y][l.x] = b[(t * 16u + l.y) * N + col];
        workgroupBarrier();
        for (var k = 0u; k < 16u; k++) { acc = acc + ta[l.y][k] * tb[k][l.x]; }
        workgroupBarrier();
    }
    c[row * N + col] = acc;
}";

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
    rt.launch_resident("wgpu", &[KernelLaunch { kernel: k, mesh: None }], &[], &BTreeMap::new(), &bound).expect("launch");
}

fn output(rt: &Runtime, arrays: &[(String, DeviceArray)], name: &str) -> Vec<f32> {
    let a = &arrays.iter().find(|(n, _)| n == name).expect("output").1;
    match rt.download(a).expect("download").data {
        ArrayData::F32(v) => v,
        _ => unreachable!("f32 outputs"),
    }
}

/// Medians (µs) of `n` timed calls of `a` and of `b`, alternating.
fn paired(n: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = std::time::Instant::now();
        a();
        ta.push(t.elapsed().as_secs_f64() * 1e6);
        let t = std::time::Instant::now();
        b();
        tb.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut ta), median(&mut tb))
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
    let call = [KernelLaunch { kernel: &k, mesh: None }];
    let wgsl = rt.lower("wgpu", &call, &[], &BTreeMap::new()).expect("lower").remove(0).1;
    let (x, o) = (raw.buffer(&host["x"]), raw.buffer(&[0.0; 64]));
    let tiny = raw.prepare(&wgsl, &[&x, &o]);
    launch(&rt, &k, &arrays);
    raw.dispatch(&tiny, (1, 1));
    assert_close("tiny", &output(&rt, &arrays, "o"), &raw.read(&o));
    // The launch cost of a software adapter drifts by tens of percent over seconds (its worker
    // threads share two cores with everything else), so the ratio is also taken from launches
    // that alternate, one of each at a time.
    let (t, r) = paired(2000, || launch(&rt, &k, &arrays), || raw.dispatch(&tiny, (1, 1)));
    eprintln!("launch_tiny alternating, median of 2000 each: tessel {t:.1} µs, raw wgpu {r:.1} µs, ratio {:.3}", t / r);
    let mut g = c.benchmark_group("launch_tiny");
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_same_wgsl", |b| b.iter(|| raw.dispatch(&tiny, (1, 1))));
    g.finish();

    let k = load("add_16m");
    let (arrays, host) = resident(&rt, &k);
    let n = 1usize << 24;
    let (x, y, o) = (raw.buffer(&host["x"]), raw.buffer(&host["y"]), raw.buffer(&vec![0.0; n]));
    let add = raw.prepare(ADD_WGSL, &[&x, &y, &o]);
    launch(&rt, &k, &arrays);
    raw.dispatch(&add, (256, 256));
    assert_close("add_16m", &output(&rt, &arrays, "o"), &raw.read(&o));
    let mut g = c.benchmark_group("add_16m");
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.sample_size(10);
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_handwritten", |b| b.iter(|| raw.dispatch(&add, (256, 256))));
    g.finish();

    let k = load("matmul_1024");
    let (arrays, host) = resident(&rt, &k);
    let n = 1024usize;
    let (a, b, cc) = (raw.buffer(&host["a"]), raw.buffer(&host["b"]), raw.buffer(&vec![0.0; n * n]));
    let mm = raw.prepare(MATMUL_WGSL, &[&a, &b, &cc]);
    launch(&rt, &k, &arrays);
    raw.dispatch(&mm, (64, 64));
    assert_close("matmul_1024", &output(&rt, &arrays, "c"), &raw.read(&cc));
    let mut g = c.benchmark_group("matmul_1024");
    g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
    g.sample_size(10);
    g.bench_function("tessel", |b| b.iter(|| launch(&rt, &k, &arrays)));
    g.bench_function("raw_wgpu_tiled_16x16", |b| b.iter(|| raw.dispatch(&mm, (64, 64))));
    g.finish();
}

criterion_group!(benches, wgpu_benches);
criterion_main!(benches);
