//! The wgpu runtime: one instance, adapter and device per process, made on first use.
//!
//! The adapter is picked by `TESSEL_WGPU_ADAPTER` (a part of its name), else by power
//! preference (`WGPU_POWER_PREF`, default high performance); `WGPU_BACKEND` limits the APIs
//! tried. Finding the adapter opens no device, so `availability()` stays cheap; the device is
//! opened at the first allocation or launch, with the adapter's own limits. Every wgpu call that
//! can fail runs inside error scopes (validation, out of memory); errors outside any scope and
//! device loss are recorded and reported by the next call, never wgpu's default panic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

use half::{bf16, f16};
use tessel_plugin_api::abi::{BackendError, ErrorKind};
use tessel_plugin_api::array::{ArrayData, HostArray};
use tessel_plugin_api::backend::Memory;
use tessel_plugin_api::ir::{DType, ParamKind, Type};

use crate::emit::Lowered;
use crate::error::{LOOP_BUDGET_HINT, Refusal};

/// How often a wait under a cancellation token looks at it.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The adapter this process uses.
pub struct Adapter {
    adapter: wgpu::Adapter,
    /// Name, type and API, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (software, Vulkan)`.
    pub description: String,
    /// Whether it is a CPU (software) adapter.
    pub software: bool,
    /// Loop iterations one invocation may run before the driver stops every loop
    /// (`lower/loops.rs`): Mesa's llvmpipe only.
    pub loop_budget: Option<u64>,
}

/// llvmpipe's budget of loop iterations per invocation (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`).
pub const LLVMPIPE_LOOP_BUDGET: u64 = 65_535;

/// A device buffer: every element takes a 32-bit word (see `emit/mod.rs`).
pub struct DeviceBuffer {
    /// The array type it holds.
    pub ty: Type,
    buffer: wgpu::Buffer,
}

/// The opened device.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    /// Errors raised outside an error scope, and the reason the device was lost.
    stray: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// Pipelines by module hash, the oldest dropped past [`PIPELINES_KEPT`] (a process that
    /// launches thousands of different kernels must not keep every one's machine code).
    pipelines: Mutex<indexmap::IndexMap<[u8; 32], Arc<Pipeline>>>,
    /// The bind groups of the latest launches, by module and buffers (a launch repeated on the
    /// same arrays reuses its own); a few only, since each holds its buffers alive.
    bind_groups: Mutex<std::collections::VecDeque<(BindKey, wgpu::BindGroup)>>,
    workspace: Mutex<Option<wgpu::Buffer>>,
    description: String,
    /// Where the adapter has `TIMESTAMP_QUERY`: what a timed launch writes its two timestamps
    /// into, one timed launch at a time.
    timestamps: Option<Mutex<Timestamps>>,
    /// Status words of the loop check (`lower/loops.rs`), one per launch in flight, kept for the
    /// next (a launch repeated on one thread binds the same word, so its bind group is reused).
    loop_checks: Mutex<Vec<LoopCheck>>,
    /// Waits given up on (Ctrl-C) with work still on the device, counted, and how many of them
    /// a finished wait has covered since: while some are not, the next submit would block inside
    /// the driver until that work ends (lavapipe's does, not following any token), so it waits
    /// first, under its own launch's token ([`Gpu::settle`]). A wait covers the abandons counted
    /// before it began (it waits for everything submitted by then), never one counted during it.
    abandoned: std::sync::atomic::AtomicU64,
    settled: std::sync::atomic::AtomicU64,
}

/// A status word the modules of one launch set when the driver cut their loops short, and the
/// buffer it is read back through.
struct LoopCheck {
    word: wgpu::Buffer,
    staging: wgpu::Buffer,
}

/// A query set of two timestamps (the start of a launch's first dispatch, the end of its last),
/// the buffer they resolve into and the one they are read back from, and nanoseconds per tick.
struct Timestamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
    period: f32,
}

type BindKey = ([u8; 32], Vec<wgpu::Buffer>);

/// Bind groups kept for reuse.
const BIND_GROUPS_KEPT: usize = 16;
/// Pipelines kept for reuse.
const PIPELINES_KEPT: usize = 256;

struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

fn err(kind: ErrorKind, msg: impl Into<String>) -> BackendError {
    BackendError::new(kind, msg)
}

fn device_type(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::Cpu => "software",
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Other => "other",
    }
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({}, {:?})", info.name, device_type(info.device_type), info.backend)
}

fn pick_adapter() -> Result<Adapter, String> {
    let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    let backends = desc.backends;
    let instance = wgpu::Instance::new(desc);
    let adapter = match std::env::var("TESSEL_WGPU_ADAPTER") {
        Ok(want) if !want.is_empty() => {
            let all = pollster::block_on(instance.enumerate_adapters(backends));
            let names: Vec<String> = all.iter().map(|a| describe(&a.get_info())).collect();
            all.into_iter().find(|a| a.get_info().name.to_lowercase().contains(&want.to_lowercase())).ok_or_else(|| {
                format!(
                    "no adapter matches TESSEL_WGPU_ADAPTER={want}; the adapters here are: {}",
                    if names.is_empty() { "none".to_string() } else { names.join("; ") }
                )
            })?
        }
        _ => {
            let power = wgpu::PowerPreference::from_env().unwrap_or(wgpu::PowerPreference::HighPerformance);
            let options = wgpu::RequestAdapterOptions {
                power_preference: power,
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            };
            pollster::block_on(instance.request_adapter(&options)).map_err(|e| {
                format!("no wgpu adapter ({e}); on Debian `apt-get install libvulkan1 mesa-vulkan-drivers` gives a software one")
            })?
        }
    };
    let info = adapter.get_info();
    let llvmpipe = info.driver == "llvmpipe" || info.name.starts_with("llvmpipe");
    Ok(Adapter {
        description: describe(&info),
        software: info.device_type == wgpu::DeviceType::Cpu,
        loop_budget: llvmpipe.then_some(LLVMPIPE_LOOP_BUDGET),
        adapter,
    })
}

impl Adapter {
    /// The features that keep IEEE semantics: passthrough SPIR-V on Vulkan, where the backend
    /// declares `SignedZeroInfNanPreserve` itself (`spirv.rs`). `TESSEL_WGPU_SPIRV=off` keeps
    /// wgpu's own WGSL path.
    fn ieee_features(&self) -> wgpu::Features {
        let vulkan = self.adapter.get_info().backend == wgpu::Backend::Vulkan;
        let off = std::env::var("TESSEL_WGPU_SPIRV").is_ok_and(|v| v == "off");
        if vulkan && !off && self.adapter.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
            wgpu::Features::PASSTHROUGH_SHADERS
        } else {
            wgpu::Features::empty()
        }
    }
}

/// The adapter, found once per process (no device is opened).
pub fn adapter() -> Result<&'static Adapter, String> {
    static ADAPTER: OnceLock<Result<Adapter, String>> = OnceLock::new();
    ADAPTER
        .get_or_init(|| {
            std::panic::catch_unwind(pick_adapter)
                .unwrap_or_else(|_| Err("wgpu panicked while looking for an adapter".to_string()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The device, opened once per process.
pub fn gpu() -> Result<&'static Gpu, BackendError> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        let a = adapter()?;
        let limits = a.adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("tessel"),
            required_features: a.ieee_features() | (a.adapter.features() & wgpu::Features::TIMESTAMP_QUERY),
            required_limits: limits.clone(),
            memory_hints: wgpu::MemoryHints::Performance,
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(a.adapter.request_device(&desc))
            .map_err(|e| format!("the adapter {} would not open a device: {e}", a.description))?;
        let stray = Arc::new(Mutex::new(Vec::new()));
        let lost = Arc::new(Mutex::new(None));
        let s = Arc::clone(&stray);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = s.lock() {
                v.push(chain(&e));
            }
        }));
        let l = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut v) = l.lock() {
                *v = Some(format!("{reason:?}: {msg}"));
            }
        });
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY).then(|| {
            let buffer = |label, usage| {
                device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: 16, usage, mapped_at_creation: false })
            };
            Mutex::new(Timestamps {
                set: device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("tessel timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2,
                }),
                resolved: buffer("tessel timestamps", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
                staging: buffer("tessel timestamps read", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
                period: queue.get_timestamp_period(),
            })
        });
        Ok(Gpu {
            timestamps,
            device,
            queue,
            limits,
            stray,
            lost,
            pipelines: Mutex::new(indexmap::IndexMap::new()),
            bind_groups: Mutex::new(std::collections::VecDeque::new()),
            workspace: Mutex::new(None),
            loop_checks: Mutex::new(Vec::new()),
            abandoned: std::sync::atomic::AtomicU64::new(0),
            settled: std::sync::atomic::AtomicU64::new(0),
            description: a.description.clone(),
        })
    })
    .as_ref()
    .map_err(|e| {
        err(
            ErrorKind::Unavailable,
            format!(
                "the wgpu backend is unavailable: {e}\n  run on interpret instead (--backend auto picks the first available)"
            ),
        )
    })
}

/// An error with every cause after it (wgpu's own text says only "Validation Error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string().trim().to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(t.trim()) {
            text = format!("{text}: {}", t.trim());
        }
        cause = c.source();
    }
    text
}

fn poisoned() -> BackendError {
    err(ErrorKind::Internal, "a wgpu runtime lock is poisoned")
}

impl Gpu {
    /// Runs `f` inside validation and out-of-memory error scopes; the first error becomes a
    /// [`BackendError`] that says what was being done.
    fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, BackendError> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(err(ErrorKind::Device, format!("the device ran out of memory while {what}: {}", chain(&e))));
        }
        if let Some(e) = v {
            return Err(err(ErrorKind::Device, format!("wgpu refused {what}: {}", chain(&e))));
        }
        self.check_alive()?;
        Ok(r)
    }

    fn check_alive(&self) -> Result<(), BackendError> {
        if let Some(why) = self.lost.lock().map_err(|_| poisoned())?.clone() {
            return Err(err(ErrorKind::Device, format!("the wgpu device {} was lost ({why})", self.description)));
        }
        let stray: Vec<String> = std::mem::take(&mut *self.stray.lock().map_err(|_| poisoned())?);
        if !stray.is_empty() {
            return Err(err(ErrorKind::Device, format!("wgpu reported: {}", stray.join("; "))));
        }
        Ok(())
    }

    /// `need` against the adapter's limit `name`; `what` (described only on failure) needs it.
    fn limit(&self, what: impl FnOnce() -> String, need: u64, name: &'static str, limit: u64) -> Result<(), BackendError> {
        if need > limit {
            return Err(
                Refusal::AdapterLimit { what: what(), need, limit_name: name, limit, adapter: self.description.clone() }.into()
            );
        }
        Ok(())
    }

    /// The words of a `MAP_READ` buffer once the work submitted before is done.
    fn read_back(&self, staging: &wgpu::Buffer, what: &str) -> Result<Vec<u32>, BackendError> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| err(ErrorKind::Device, format!("{what} never completed")))?
            .map_err(|e| err(ErrorKind::Device, format!("{what} failed: {e}")))?;
        let words: Vec<u32> = {
            let view = staging.get_mapped_range(..).map_err(|e| err(ErrorKind::Device, format!("{what} failed: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..])
        };
        staging.unmap();
        Ok(words)
    }

    /// Before a submit: where an earlier wait was given up on, waits for that work first (under
    /// this launch's token, so that Ctrl-C stops this wait too).
    fn settle(&self) -> Result<(), BackendError> {
        if self.abandoned.load(std::sync::atomic::Ordering::Acquire) > self.settled.load(std::sync::atomic::Ordering::Acquire) {
            self.wait()?;
        }
        Ok(())
    }

    /// Waits for the work submitted so far. Under a cancellation token
    /// ([`tessel_plugin_api::cancel`]: the Python module's, on Ctrl-C) it wakes every
    /// [`CANCEL_POLL`] and, once the token is cancelled, stops waiting and fails: the device
    /// finishes the work on its own (wgpu keeps the buffers it uses alive), and the next launch
    /// queues behind it.
    fn wait(&self) -> Result<(), BackendError> {
        use std::sync::atomic::Ordering::AcqRel;
        let token = tessel_plugin_api::cancel::current();
        let timeout = token.as_ref().map(|_| CANCEL_POLL);
        let before = self.abandoned.load(std::sync::atomic::Ordering::Acquire);
        loop {
            match self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout }) {
                Ok(_) => {
                    self.settled.fetch_max(before, AcqRel);
                    break;
                }
                Err(wgpu::PollError::Timeout) if token.as_ref().is_some_and(|t| t.is_cancelled()) => {
                    self.abandoned.fetch_add(1, AcqRel);
                    return Err(tessel_plugin_api::cancel::cancelled());
                }
                Err(wgpu::PollError::Timeout) => {}
                Err(e) => return Err(err(ErrorKind::Device, format!("waiting for the device failed: {e}"))),
            }
        }
        self.check_alive()
    }

    /// The module of `l`: on Vulkan, SPIR-V that keeps infinities, NaN and signed zeros
    /// (`spirv.rs`); elsewhere the WGSL.
    fn shader_module(&self, l: &Lowered) -> wgpu::ShaderModule {
        let wgsl = || {
            self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&l.name),
                source: wgpu::ShaderSource::Wgsl(l.wgsl.as_str().into()),
            })
        };
        if !self.device.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
            return wgsl();
        }
        // naga failing here fails on the WGSL path too, where wgpu reports it in the scope.
        let Ok(words) = crate::spirv::ieee_spirv(&l.wgsl) else { return wgsl() };
        let entry = wgpu::PassthroughShaderEntryPoint { name: "main".into(), workgroup_size: (1, 1, 1) };
        let desc = wgpu::ShaderModuleDescriptorPassthrough {
            label: Some(&l.name),
            entry_points: std::borrow::Cow::Owned(vec![entry]),
            spirv: Some(std::borrow::Cow::Owned(words)),
            ..Default::default()
        };
        // SAFETY: the SPIR-V is naga's own output for a module naga validated, with only the
        // float-controls capability, extension and execution mode added (`spirv.rs`), and the
        // pipeline layout below is explicit, so wgpu needs no reflection of it.
        #[allow(unsafe_code, reason = "wgpu takes SPIR-V it does not validate only through an unsafe call")]
        unsafe {
            self.device.create_shader_module_passthrough(desc)
        }
    }

    fn pipeline(&self, l: &Lowered) -> Result<Arc<Pipeline>, BackendError> {
        let key = l.hash;
        if let Some(p) = self.pipelines.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(Arc::clone(p));
        }
        let p = self.scoped(&format!("the WGSL of kernel `{}`", l.name), || {
            let module = self.shader_module(l);
            // An explicit layout: wgpu's derived one leaves out arguments the kernel never reads.
            let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            };
            let mut entries: Vec<wgpu::BindGroupLayoutEntry> =
                l.bindings.iter().enumerate().map(|(i, (_, kind))| storage(i as u32, *kind == ParamKind::In)).collect();
            if l.workspace_words > 0 {
                entries.push(storage(l.bindings.len() as u32, false));
            }
            for _ in &l.views {
                entries.push(storage(entries.len() as u32, true));
            }
            if l.loop_check.is_some() {
                entries.push(storage(entries.len() as u32, false));
            }
            let layout = self
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(&l.name), entries: &entries });
            let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&l.name),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&l.name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            Pipeline { pipeline, layout }
        })?;
        let p = Arc::new(p);
        let mut kept = self.pipelines.lock().map_err(|_| poisoned())?;
        if kept.len() >= PIPELINES_KEPT {
            kept.shift_remove_index(0);
        }
        kept.insert(key, Arc::clone(&p));
        Ok(p)
    }

    /// Checks a lowered kernel against the adapter's limits, naming the one it exceeds.
    fn check_limits(&self, l: &Lowered, buffers: &BTreeMap<String, DeviceBuffer>) -> Result<(), BackendError> {
        let lim = &self.limits;
        let what = |s: &'static str| move || format!("kernel `{}`: {s}", l.name);
        self.limit(
            what("a workgroup of its invocations"),
            u64::from(l.workgroup_size),
            "maxComputeInvocationsPerWorkgroup",
            u64::from(lim.max_compute_invocations_per_workgroup.min(lim.max_compute_workgroup_size_x)),
        )?;
        let most = u64::from(l.groups[0].max(l.groups[1]));
        self.limit(
            what("its dispatch"),
            most,
            "maxComputeWorkgroupsPerDimension",
            u64::from(lim.max_compute_workgroups_per_dimension),
        )?;
        let storage = (l.bindings.len() + l.views.len()) as u64 + u64::from(l.workspace_words > 0);
        self.limit(
            what("storage buffers"),
            storage,
            "maxStorageBuffersPerShaderStage",
            u64::from(lim.max_storage_buffers_per_shader_stage),
        )?;
        let ws = l.workspace_words * 4 * u64::from(l.groups[0]) * u64::from(l.groups[1]);
        self.limit(what("its workspace (bytes)"), ws, "maxStorageBufferBindingSize", lim.max_storage_buffer_binding_size)?;
        for (name, _) in &l.bindings {
            if let Some(b) = buffers.get(name) {
                self.limit(
                    || format!("kernel `{}`: argument `{name}` (bytes)", l.name),
                    b.buffer.size(),
                    "maxStorageBufferBindingSize",
                    lim.max_storage_buffer_binding_size,
                )?;
            }
        }
        Ok(())
    }

    fn workspace(&self, bytes: u64) -> Result<wgpu::Buffer, BackendError> {
        let mut ws = self.workspace.lock().map_err(|_| poisoned())?;
        if let Some(b) = ws.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(b.clone());
        }
        let b = self.scoped(&format!("a workspace of {bytes} bytes"), || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessel workspace"),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        })?;
        *ws = Some(b.clone());
        Ok(b)
    }

    /// The bind group of `l` over `bound` (binding `i` = `bound[i]`), reused when a launch of the
    /// same module on the same buffers made one.
    fn bind_group(&self, l: &Lowered, p: &Pipeline, bound: Vec<wgpu::Buffer>) -> Result<wgpu::BindGroup, BackendError> {
        let key = (l.hash, bound);
        let mut cache = self.bind_groups.lock().map_err(|_| poisoned())?;
        if let Some((_, g)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(g.clone());
        }
        let entries: Vec<wgpu::BindGroupEntry<'_>> = key
            .1
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        let group =
            self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &p.layout, entries: &entries });
        if cache.len() >= BIND_GROUPS_KEPT {
            cache.pop_front();
        }
        cache.push_back((key, group.clone()));
        Ok(group)
    }

    /// A status word for one launch's loop check, from the pool or new.
    fn loop_check(&self) -> Result<LoopCheck, BackendError> {
        if let Some(c) = self.loop_checks.lock().map_err(|_| poisoned())?.pop() {
            return Ok(c);
        }
        self.scoped("the loop check's status word", || {
            let buffer = |label, usage| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: 4,
                    usage,
                    mapped_at_creation: false,
                })
            };
            LoopCheck {
                word: buffer(
                    "tessel loop check",
                    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                ),
                staging: buffer("tessel loop check read", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            }
        })
    }

    /// The loop check's verdict on the launch of `kernels` (its work already submitted): an error
    /// where any module found its loops cut short, whose outputs the host then never reads.
    fn loop_verdict(&self, check: LoopCheck, kernels: &[Lowered]) -> Result<(), BackendError> {
        let word = self.read_back(&check.staging, "reading the loop check")?;
        self.loop_checks.lock().map_err(|_| poisoned())?.push(check);
        if word.first().is_none_or(|&w| w == 0) {
            return Ok(());
        }
        let checked: Vec<&Lowered> = kernels.iter().filter(|l| l.loop_check.is_some()).collect();
        let names: Vec<String> = checked.iter().map(|l| format!("`{}`", l.name)).collect();
        let room = checked.iter().filter_map(|l| l.loop_check).min().unwrap_or_default();
        Err(err(
            ErrorKind::Device,
            format!(
                "kernel {} made more loop iterations in one invocation than the {room} this adapter's driver (Mesa's llvmpipe: {}) runs before it silently stops every loop; its outputs would be wrong and are discarded\n  {LOOP_BUDGET_HINT}",
                names.join(", "),
                self.description
            ),
        ))
    }

    /// Runs lowered kernels in order in one submission: outputs are zeroed where the kernel does
    /// not overwrite them whole (but those `kept` keep their contents, and none of them is a
    /// register block: `Wgpu::dispatch`), then dispatched. Where `timed` and the device has timestamp
    /// queries, returns the nanoseconds from the start of the first dispatch to the end of the
    /// last on the device's clock.
    pub fn launch(
        &self,
        kernels: &[Lowered],
        buffers: &BTreeMap<String, DeviceBuffer>,
        kept: &BTreeSet<String>,
        timed: bool,
    ) -> Result<Option<u64>, BackendError> {
        let mut prepared = Vec::new();
        let mut check: Option<LoopCheck> = None;
        for l in kernels {
            if let Some(name) = l.resident.iter().find(|n| kept.contains(*n)) {
                // `Wgpu::dispatch` lowers such a launch again without the register block.
                return Err(err(
                    ErrorKind::Internal,
                    format!("kernel `{}`: kept output `{name}` was lowered as a register block starting as zeros", l.name),
                ));
            }
            self.check_limits(l, buffers)?;
            let p = self.pipeline(l)?;
            let ws_bytes = l.workspace_words * 4 * u64::from(l.groups[0]) * u64::from(l.groups[1]);
            let mut bound = Vec::with_capacity(l.bindings.len() + 1);
            for (name, _) in &l.bindings {
                let b = buffers.get(name).ok_or_else(|| {
                    err(ErrorKind::InvalidInput, format!("kernel `{}`: argument `{name}` has no buffer in this launch", l.name))
                })?;
                bound.push(b.buffer.clone());
            }
            if ws_bytes > 0 {
                bound.push(self.workspace(ws_bytes)?);
            }
            for name in &l.views {
                bound.push(buffers[name].buffer.clone());
            }
            if l.loop_check.is_some() {
                let c = match &check {
                    Some(c) => c,
                    None => check.insert(self.loop_check()?),
                };
                bound.push(c.word.clone());
            }
            prepared.push((l, p, bound));
        }
        let stamps = match &self.timestamps {
            Some(t) if timed => Some(t.lock().map_err(|_| poisoned())?),
            _ => None,
        };
        let last = prepared.len().saturating_sub(1);
        self.settle()?;
        self.scoped("the launch", || -> Result<(), BackendError> {
            let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            if let Some(c) = &check {
                enc.clear_buffer(&c.word, 0, None);
            }
            for (i, (l, p, bound)) in prepared.into_iter().enumerate() {
                let group = self.bind_group(l, &p, bound)?;
                for name in l.zeroed.iter().filter(|n| !kept.contains(*n)) {
                    enc.clear_buffer(&buffers[name].buffer, 0, None);
                }
                let timestamp_writes = stamps.as_ref().map(|t| wgpu::ComputePassTimestampWrites {
                    query_set: &t.set,
                    beginning_of_pass_write_index: (i == 0).then_some(0),
                    end_of_pass_write_index: (i == last).then_some(1),
                });
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(&l.name), timestamp_writes });
                pass.set_pipeline(&p.pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(l.groups[0], l.groups[1], 1);
            }
            if let Some(t) = &stamps {
                enc.resolve_query_set(&t.set, 0..2, &t.resolved, 0);
                enc.copy_buffer_to_buffer(&t.resolved, 0, &t.staging, 0, 16);
            }
            if let Some(c) = &check {
                enc.copy_buffer_to_buffer(&c.word, 0, &c.staging, 0, 4);
            }
            self.queue.submit([enc.finish()]);
            Ok(())
        })??;
        let ns = match stamps {
            Some(t) => {
                let w = self.read_back(&t.staging, "reading the launch's timestamps")?;
                let (start, end) = (u64::from(w[0]) | u64::from(w[1]) << 32, u64::from(w[2]) | u64::from(w[3]) << 32);
                Some((end.saturating_sub(start) as f64 * f64::from(t.period)).round() as u64)
            }
            None if check.is_none() => {
                self.wait()?;
                None
            }
            None => None,
        };
        match check {
            Some(c) => self.loop_verdict(c, kernels).map(|()| ns),
            None => Ok(ns),
        }
    }
}

impl Memory for Gpu {
    type Buffer = DeviceBuffer;

    /// A zeroed buffer for an array of `ty`.
    fn alloc(&self, ty: &Type) -> Result<DeviceBuffer, BackendError> {
        let bytes = (ty.numel().max(1) as u64) * 4;
        let what = || format!("an array of {ty} ({bytes} bytes on the device)");
        self.limit(what, bytes, "maxBufferSize", self.limits.max_buffer_size)?;
        self.limit(what, bytes, "maxStorageBufferBindingSize", self.limits.max_storage_buffer_binding_size)?;
        let buffer = self.scoped(&format!("a buffer of {bytes} bytes"), || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        Ok(DeviceBuffer { ty: ty.clone(), buffer })
    }

    fn type_of(&self, b: &DeviceBuffer) -> Type {
        b.ty.clone()
    }

    /// Copies host data in (the array's type is the buffer's).
    fn upload(&self, b: &mut DeviceBuffer, data: HostArray) -> Result<(), BackendError> {
        let words: Vec<u32> = match &data.data {
            ArrayData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            ArrayData::F16(v) => v.iter().map(|x| x.to_f32().to_bits()).collect(),
            ArrayData::BF16(v) => v.iter().map(|x| x.to_f32().to_bits()).collect(),
            ArrayData::I32(v) => v.iter().map(|&x| x as u32).collect(),
            ArrayData::U32(v) => v.clone(),
            ArrayData::Bool(v) => v.iter().map(|&x| u32::from(x)).collect(),
            // Narrow integers are held widened, sign-extended where signed, as registers hold them.
            ArrayData::I8(v) => v.iter().map(|&x| i32::from(x) as u32).collect(),
            ArrayData::U8(v) => v.iter().map(|&x| u32::from(x)).collect(),
            ArrayData::I16(v) => v.iter().map(|&x| i32::from(x) as u32).collect(),
            ArrayData::U16(v) => v.iter().map(|&x| u32::from(x)).collect(),
        };
        self.scoped("an upload", || self.queue.write_buffer(&b.buffer, 0, bytemuck::cast_slice(&words)))
    }

    /// Copies a buffer out.
    fn download<'b>(&self, b: &'b DeviceBuffer) -> Result<std::borrow::Cow<'b, HostArray>, BackendError> {
        let bytes = b.buffer.size();
        self.settle()?;
        let staging = self.scoped("a download", || {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessel download"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            enc.copy_buffer_to_buffer(&b.buffer, 0, &staging, 0, bytes);
            self.queue.submit([enc.finish()]);
            staging
        })?;
        let words = self.read_back(&staging, "the download")?;
        let n = b.ty.numel();
        let words = &words[..n];
        let data = match b.ty.dtype {
            DType::F32 => ArrayData::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
            DType::F16 => ArrayData::F16(words.iter().map(|&w| f16::from_f32(f32::from_bits(w))).collect()),
            DType::BF16 => ArrayData::BF16(words.iter().map(|&w| bf16::from_f32(f32::from_bits(w))).collect()),
            DType::I32 => ArrayData::I32(words.iter().map(|&w| w as i32).collect()),
            DType::U32 => ArrayData::U32(words.to_vec()),
            DType::Bool => ArrayData::Bool(words.iter().map(|&w| w != 0).collect()),
            d => HostArray::from_bits(d, &b.ty.shape, words.to_vec()).data, // narrow integers
        };
        Ok(std::borrow::Cow::Owned(HostArray { shape: b.ty.shape.clone(), data }))
    }
}
