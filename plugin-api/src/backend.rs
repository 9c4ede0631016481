//! Writing a backend: implement [`BackendImpl`] with plain Rust types and call [`export`]. The
//! exported object runs every method under `catch_unwind` (a panic becomes an
//! [`ErrorKind::Panic`] error and the panic message is kept out of the terminal), decodes launch
//! requests, and keeps the table of device buffers. See `docs/writing-a-backend.md`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{ROption, RResult, RSlice, RSliceMut, RStr, RString, RVec};

use crate::abi::*;
use crate::array::{DataRef, HostArray};
use crate::ir::{self, AxisSize, DType, GridAxis, Kernel, Span, Type, Verified};
use crate::mesh::{AxisRole, MeshAxis, MeshSpec};
use crate::refusal::MeshRefusal;

/// One (kernel, mesh) pair of a decoded launch.
pub struct Call<'a> {
    /// The kernel as parsed from the request (not yet verified: its grid may come from the mesh).
    pub kernel: Arc<Kernel>,
    /// Its mesh, if the launch gave one.
    pub mesh: Option<&'a MeshBox>,
}

/// A launch request decoded into Rust types.
pub struct Launch<'a> {
    /// The (kernel, mesh) pairs in order.
    pub calls: Vec<Call<'a>>,
    /// External meshes.
    pub external_meshes: Vec<&'a MeshBox>,
    /// Sizes of `dyn` grid axes.
    pub grid: BTreeMap<String, u64>,
    /// What identifies this launch for any backend ([`request_key`]): the kernel text, each
    /// call's kernel and mesh (its text and portable view), the external meshes, the grid sizes.
    /// A backend whose answers depend on nothing else may remember them by it.
    pub key: [u8; 32],
}

/// An available backend: the class of device it runs on (which ranks it under `auto`) and what
/// that device is, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// The class `auto` ranks by.
    pub class: DeviceClass,
    /// What it runs on (`NVIDIA H200 (sm_90)`, `llvmpipe (software, Vulkan)`).
    pub on: String,
}

/// A backend in plain Rust. [`export`] turns it into the ABI-stable object the host loads.
pub trait BackendImpl: Send + Sync + 'static {
    /// A device buffer.
    type Buffer: Send + 'static;
    /// Registry name.
    fn name(&self) -> &str;
    /// Backend version.
    fn version(&self) -> &str;
    /// What it runs on, in words.
    fn platform(&self) -> String;
    /// `Ok` with the class of device it runs on and what that is, or `Err(why it cannot run
    /// here)`. Must not touch a device it has not been asked to use, and must be cheap.
    fn availability(&self) -> Result<Available, String>;
    /// What it takes, readable without a device.
    fn capabilities(&self) -> Capabilities;
    /// Builds this backend's own mesh from a portable spec.
    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError>;
    /// What `supports` decided and `compile` consumes (verified kernels, their grids, the
    /// lowering's plan), so that a launch is checked and planned once.
    type Plan: Send + 'static;
    /// The plan, or the refusal: cheap, no lowering, no device. Runs once before every launch,
    /// even when the compiled launch is cached (it is where a backend checks that a mesh is its
    /// own).
    fn supports(&self, launch: &Launch<'_>) -> Result<Self::Plan, BackendError>;
    /// A launch lowered for this backend: what [`BackendImpl::compile`] makes and
    /// [`BackendImpl::run`] runs. [`export`] caches it, keyed by the launch.
    type Compiled: Send + Sync + 'static;
    /// Lowers a launch from the plan `supports` made for it. No device.
    fn compile(&self, launch: &Launch<'_>, plan: Self::Plan) -> Result<Self::Compiled, BackendError>;
    /// Named stages of lowered text (`ptx`, `wgsl`, ...).
    fn stages(&self, compiled: &Self::Compiled) -> Vec<(String, String)>;
    /// A zeroed buffer of `ty`.
    fn alloc(&self, ty: &Type) -> Result<Self::Buffer, BackendError>;
    /// Copies host data in (same type as allocated).
    fn upload(&self, buffer: &mut Self::Buffer, data: HostArray) -> Result<(), BackendError>;
    /// Copies a buffer out (a host-memory backend lends it instead).
    fn download<'b>(&self, buffer: &'b Self::Buffer) -> Result<std::borrow::Cow<'b, HostArray>, BackendError>;
    /// Runs a compiled launch; `buffers` holds the bound arguments by name.
    fn run(
        &self,
        compiled: &Self::Compiled,
        launch: &Launch<'_>,
        buffers: &mut BTreeMap<String, Self::Buffer>,
    ) -> Result<(), BackendError>;
    /// [`BackendImpl::run`], timed on the device where the backend can: the nanoseconds its
    /// dispatches took on the device's own clock, else `None` (the default: the host times it).
    fn run_timed(
        &self,
        compiled: &Self::Compiled,
        launch: &Launch<'_>,
        buffers: &mut BTreeMap<String, Self::Buffer>,
    ) -> Result<Option<u64>, BackendError> {
        self.run(compiled, launch, buffers).map(|()| None)
    }
    /// Runs a compiled launch on memory the caller owns, for a backend that computes in host
    /// memory: `inputs` borrowed by argument name, every element of each output written as
    /// little-endian bytes into `outputs` (the caller's arrays of the outputs' types). `None`, the
    /// default, where the backend does not (the host then uses buffers).
    fn run_host(
        &self,
        compiled: &Self::Compiled,
        launch: &Launch<'_>,
        inputs: &BTreeMap<String, DataRef<'_>>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
    ) -> Option<Result<(), BackendError>> {
        let _ = (compiled, launch, inputs, outputs);
        None
    }
}

/// Wraps a backend into the object a plugin's root module returns and a built-in submits.
pub fn export<B: BackendImpl>(backend: B) -> BackendBox {
    install_quiet_panic_hook();
    let exported = Exported {
        backend,
        buffers: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        compiled: Mutex::new(HashMap::new()),
        lowered: Mutex::new(HashMap::new()),
        planned: Mutex::new(HashMap::new()),
        decoded: Mutex::new(HashMap::new()),
        hits: AtomicU64::new(0),
        misses: AtomicU64::new(0),
        plans: AtomicU64::new(0),
        compile_ns: AtomicU64::new(0),
    };
    Backend_TO::from_value(exported, TD_Opaque)
}

/// Runs `f` as an exported function body: a panic becomes an [`ErrorKind::Panic`] error.
pub fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, BackendError>) -> RResult<T, BackendError> {
    install_quiet_panic_hook();
    GUARDED.with(|g| g.set(g.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    match result {
        Ok(r) => r.into(),
        Err(payload) => {
            let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| panic_text(&*payload));
            RResult::RErr(BackendError::new(
                ErrorKind::Panic,
                format!(
                    "the backend panicked in `{what}`: {msg}\n  this is a bug in the backend; the host caught it and goes on"
                ),
            ))
        }
    }
}

thread_local! {
    static GUARDED: Cell<u32> = const { Cell::new(0) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_string())
}

/// Inside [`guard`], panics are recorded instead of printed; elsewhere the previous hook runs.
fn install_quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) > 0 {
                let where_ = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                let text = format!("{}{where_}", panic_text(info.payload()));
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }));
    });
}

struct Exported<B: BackendImpl> {
    backend: B,
    buffers: Mutex<HashMap<u64, B::Buffer>>,
    next: AtomicU64,
    /// Compiled launches by [`cache_key`].
    compiled: Mutex<HashMap<[u8; 32], Arc<B::Compiled>>>,
    /// The lowered text of each compiled launch, by the same key: made once, since every run
    /// through the host lowers first (the interpreter's text is its whole program, printed).
    lowered: Mutex<HashMap<[u8; 32], RVec<Stage>>>,
    /// The plans `supports` made for the host, by [`request_key`], until the launch or lowering
    /// that follows takes them (so that neither plans again).
    planned: Mutex<HashMap<[u8; 32], B::Plan>>,
    /// The parsed kernels of recent requests, by [`request_key`]: a launch repeated is not
    /// parsed again.
    decoded: Mutex<HashMap<[u8; 32], ParsedKernels>>,
    hits: AtomicU64,
    misses: AtomicU64,
    /// Calls of `BackendImpl::supports`.
    plans: AtomicU64,
    /// Time in `BackendImpl::compile` (and `supports` when no plan was kept), in nanoseconds.
    compile_ns: AtomicU64,
}

/// What identifies a launch request whatever the backend: the plugin-api and kernel text format
/// versions, the kernel text, each call's kernel and mesh (its text and portable view), the
/// external meshes, and the dynamic grid sizes.
pub fn request_key(req: &LaunchRequest<'_>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(PLUGIN_API_VERSION.as_bytes());
    field(&req.ir_format.to_le_bytes());
    field(req.source.as_str().as_bytes());
    let mesh_text = |m: &MeshBox| format!("{} {}", m.display(), mesh_spec(m));
    for c in req.calls.iter() {
        field(c.kernel.as_str().as_bytes());
        field(c.mesh.into_option().map(mesh_text).unwrap_or_default().as_bytes());
    }
    for m in req.external_meshes.iter() {
        field(mesh_text(m).as_bytes());
    }
    for g in req.grid.iter() {
        field(g.axis.as_str().as_bytes());
        field(&g.size.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// What identifies a compiled launch: the backend, its version, and the [`request_key`].
pub fn cache_key(backend: &str, version: &str, req: &LaunchRequest<'_>) -> [u8; 32] {
    keyed(backend, version, &request_key(req))
}

fn keyed(backend: &str, version: &str, request: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for bytes in [backend.as_bytes(), version.as_bytes()] {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    h.update(request);
    *h.finalize().as_bytes()
}

fn invalid(msg: impl Into<String>) -> BackendError {
    BackendError::new(ErrorKind::InvalidInput, msg)
}

/// Decodes a request: format version, kernel text, kernels by name.
pub fn decode<'a>(req: &LaunchRequest<'a>) -> Result<Launch<'a>, BackendError> {
    decode_keyed(req, request_key(req), None)
}

/// [`decode`] with the request's key known, and the kernels when an earlier decoding of the same
/// request made them.
fn decode_keyed<'a>(req: &LaunchRequest<'a>, key: [u8; 32], known: Option<&[Arc<Kernel>]>) -> Result<Launch<'a>, BackendError> {
    if req.ir_format != IR_FORMAT_VERSION {
        return Err(invalid(format!(
            "the host sent kernel text format {}, this backend reads format {IR_FORMAT_VERSION}\n  rebuild the plugin against the host's tessel-plugin-api",
            req.ir_format
        )));
    }
    let calls = match known {
        Some(kernels) => {
            req.calls.iter().zip(kernels).map(|(c, k)| Call { kernel: Arc::clone(k), mesh: c.mesh.into_option() }).collect()
        }
        None => {
            let module = ir::parse(req.source.as_str()).map_err(|d| invalid(format!("the kernel text does not parse:\n{d}")))?;
            req.calls
                .iter()
                .map(|c| {
                    let kernel = module.kernels.iter().find(|k| k.name == c.kernel.as_str()).cloned().ok_or_else(|| {
                        invalid(format!("the request names kernel `{}`, which its source does not define", c.kernel))
                    })?;
                    Ok(Call { kernel: Arc::new(kernel), mesh: c.mesh.into_option() })
                })
                .collect::<Result<Vec<_>, BackendError>>()?
        }
    };
    let grid = req.grid.iter().map(|g| (g.axis.to_string(), g.size)).collect();
    Ok(Launch { calls, external_meshes: req.external_meshes.iter().copied().collect(), grid, key })
}

/// The portable view of a mesh object as a [`MeshSpec`].
pub fn mesh_spec(mesh: &MeshBox) -> MeshSpec {
    let v = mesh.view();
    MeshSpec {
        kind: v.kind.to_string(),
        axes: v
            .axes
            .iter()
            .map(|a| MeshAxis {
                name: a.name.to_string(),
                size: a.size,
                role: match a.role {
                    RAxisRole::Grid => AxisRole::Grid,
                    RAxisRole::Cluster => AxisRole::Cluster,
                    RAxisRole::Thread => AxisRole::Thread,
                },
            })
            .collect(),
    }
}

/// A mesh that is its portable spec and nothing more: what the host makes from `grid(...)` and
/// `device(...)` text, and what backends that read portable views make for themselves.
#[derive(Clone, Debug)]
pub struct SpecMesh(pub MeshSpec);

impl Mesh for SpecMesh {
    fn view(&self) -> RMeshView {
        mesh_view(&self.0)
    }

    fn display(&self) -> RString {
        self.0.to_string().into()
    }
}

/// The portable view of a [`MeshSpec`], for `Mesh::view`.
pub fn mesh_view(spec: &MeshSpec) -> RMeshView {
    RMeshView {
        kind: spec.kind.as_str().into(),
        axes: spec
            .axes
            .iter()
            .map(|a| RMeshAxis {
                name: a.name.as_str().into(),
                size: a.size,
                role: match a.role {
                    AxisRole::Grid => RAxisRole::Grid,
                    AxisRole::Cluster => RAxisRole::Cluster,
                    AxisRole::Thread => RAxisRole::Thread,
                },
            })
            .collect(),
    }
}

/// Gives a kernel the grid of its mesh (docs/language.md §4): a kernel without `grid` takes the
/// mesh's axes as parallel grid axes; a kernel with one must match the mesh axis for axis, else
/// `AXIS mixes mesh and grid axes`. Then verifies it.
pub fn verify_with_mesh(kernel: &Kernel, mesh: Option<&MeshSpec>) -> Result<Verified, BackendError> {
    let mut kernel = kernel.clone();
    if let Some(m) = mesh {
        match &kernel.grid {
            None => {
                // Every axis the kernel uses must be one of the mesh's.
                if let Ok(v) = ir::verify(&kernel)
                    && let Some(missing) = v.mesh_axes().iter().find(|a| !m.axes.iter().any(|x| &x.name == *a))
                {
                    return Err(MeshRefusal::MissingAxis {
                        kernel: kernel.name.clone(),
                        axis: missing.to_string(),
                        mesh: m.to_string(),
                        uses: v.mesh_axes().iter().map(|a| a.to_string()).collect(),
                    }
                    .into());
                }
                let axes = m.axes.iter().map(|a| GridAxis {
                    name: a.name.clone(),
                    size: AxisSize::Fixed(a.size),
                    seq: false,
                    span: Span::NONE,
                });
                kernel.grid = Some(axes.collect());
            }
            Some(grid) => {
                for a in grid {
                    let matches =
                        m.axes.iter().any(|x| x.name == a.name && (a.size == AxisSize::Fixed(x.size) || a.size == AxisSize::Dyn));
                    if !matches {
                        return Err(MeshRefusal::MixesMeshAndGrid {
                            kernel: kernel.name.clone(),
                            axis: a.name.clone(),
                            size: a.size.to_string(),
                            mesh: m.to_string(),
                        }
                        .into());
                    }
                }
            }
        }
    }
    let v = ir::verify(&kernel).map_err(|d| invalid(format!("kernel `{}` does not verify:\n{d}", kernel.name)))?;
    if !v.mesh_axes().is_empty() {
        // No mesh gave the axes the kernel uses.
        let e = crate::launch::resolve_grid(&v, &BTreeMap::new()).expect_err("a kernel with mesh axes needs a mesh");
        return Err(invalid(e.to_string()));
    }
    Ok(v)
}

/// The kernels of one request, parsed.
type ParsedKernels = Arc<Vec<Arc<Kernel>>>;

/// Requests whose parsed kernels are kept.
const DECODED_KEPT: usize = 256;
/// Plans kept for the launch that follows their `supports`.
const PLANS_KEPT: usize = 64;
/// Compiled launches kept (each cache starts afresh when full, as every cache here does).
const COMPILED_KEPT: usize = 256;

impl<B: BackendImpl> Exported<B> {
    /// [`decode`], reusing the kernels parsed for the same request before.
    fn decode<'a>(&self, req: &LaunchRequest<'a>) -> Result<Launch<'a>, BackendError> {
        let key = request_key(req);
        let known = self.decoded.lock().ok().and_then(|m| m.get(&key).cloned());
        let launch = decode_keyed(req, key, known.as_deref().map(Vec::as_slice))?;
        if known.is_none()
            && let Ok(mut m) = self.decoded.lock()
        {
            if m.len() >= DECODED_KEPT {
                m.clear();
            }
            m.insert(key, Arc::new(launch.calls.iter().map(|c| Arc::clone(&c.kernel)).collect()));
        }
        Ok(launch)
    }

    /// `BackendImpl::supports`, counted.
    fn plan(&self, launch: &Launch<'_>) -> Result<B::Plan, BackendError> {
        self.plans.fetch_add(1, Ordering::Relaxed);
        ir::counters::planned();
        self.backend.supports(launch)
    }

    /// The key of `launch` in the compile cache (and the lowered-text cache beside it).
    fn cache_key(&self, launch: &Launch<'_>) -> [u8; 32] {
        keyed(self.backend.name(), self.backend.version(), &launch.key)
    }

    /// The compiled launch from the cache; else compiled from the plan the host's `supports`
    /// call made for it, or from `supports` now. (A launch in the cache was planned and
    /// accepted before: its key holds everything a plan depends on.)
    fn compiled(&self, launch: &Launch<'_>) -> Result<Arc<B::Compiled>, BackendError> {
        let poisoned = || BackendError::new(ErrorKind::Internal, "the compile cache is poisoned");
        let earlier = self.planned.lock().map_err(|_| poisoned())?.remove(&launch.key);
        let key = self.cache_key(launch);
        if let Some(c) = self.compiled.lock().map_err(|_| poisoned())?.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(c));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let start = std::time::Instant::now();
        let plan = match earlier {
            Some(p) => p,
            None => self.plan(launch)?,
        };
        let c = Arc::new(self.backend.compile(launch, plan)?);
        self.compile_ns.fetch_add(start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
        let mut compiled = self.compiled.lock().map_err(|_| poisoned())?;
        if compiled.len() >= COMPILED_KEPT {
            compiled.clear();
        }
        compiled.insert(key, Arc::clone(&c));
        Ok(c)
    }

    fn take_buffers(&self, args: RSlice<'_, BufferArg<'_>>) -> Result<BTreeMap<String, (u64, B::Buffer)>, BackendError> {
        let mut table =
            self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
        let mut out = BTreeMap::new();
        for a in args.iter() {
            match table.remove(&a.buffer) {
                Some(b) => {
                    out.insert(a.name.to_string(), (a.buffer, b));
                }
                None => {
                    for (_, (id, b)) in out {
                        table.insert(id, b);
                    }
                    return Err(invalid(format!("argument `{}` is bound to buffer {}, which does not exist", a.name, a.buffer)));
                }
            }
        }
        Ok(out)
    }

    fn put_back(&self, ids: BTreeMap<String, u64>, mut buffers: BTreeMap<String, B::Buffer>) {
        if let Ok(mut table) = self.buffers.lock() {
            for (name, id) in ids {
                if let Some(b) = buffers.remove(&name) {
                    table.insert(id, b);
                }
            }
        }
    }

    /// A launch on the bound buffers, [`BackendImpl::run_timed`] where `timed`.
    fn launch_with(
        &self,
        req: &LaunchRequest<'_>,
        args: RSlice<'_, BufferArg<'_>>,
        timed: bool,
    ) -> Result<Option<u64>, BackendError> {
        let launch = self.decode(req)?;
        let compiled = self.compiled(&launch)?;
        let taken = self.take_buffers(args)?;
        let ids: BTreeMap<String, u64> = taken.iter().map(|(n, (id, _))| (n.clone(), *id)).collect();
        let mut buffers: BTreeMap<String, B::Buffer> = taken.into_iter().map(|(n, (_, b))| (n, b)).collect();
        let result = catch_unwind(AssertUnwindSafe(|| {
            if timed {
                self.backend.run_timed(&compiled, &launch, &mut buffers)
            } else {
                self.backend.run(&compiled, &launch, &mut buffers).map(|()| None)
            }
        }));
        self.put_back(ids, buffers);
        match result {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl<B: BackendImpl> Backend for Exported<B> {
    fn name(&self) -> RString {
        self.backend.name().into()
    }

    fn version(&self) -> RString {
        self.backend.version().into()
    }

    fn platform(&self) -> RString {
        match guard("platform", || Ok(self.backend.platform())) {
            RResult::ROk(p) => p.into(),
            RResult::RErr(e) => e.message,
        }
    }

    fn availability(&self) -> Availability {
        match guard("availability", || Ok(self.backend.availability())) {
            RResult::ROk(Ok(Available { class, on })) => Availability { available: true, reason: on.into(), class },
            RResult::ROk(Err(why)) => Availability { available: false, reason: why.into(), class: DeviceClass::Software },
            RResult::RErr(e) => Availability { available: false, reason: e.message, class: DeviceClass::Software },
        }
    }

    fn capabilities(&self) -> Capabilities {
        match guard("capabilities", || Ok(self.backend.capabilities())) {
            RResult::ROk(c) => c,
            RResult::RErr(_) => Capabilities::none(),
        }
    }

    fn make_mesh(&self, spec: RStr<'_>) -> RResult<MeshBox, BackendError> {
        guard("make_mesh", || {
            let spec = MeshSpec::parse(spec.as_str()).map_err(|e| invalid(e.to_string()))?;
            self.backend.make_mesh(&spec)
        })
    }

    fn supports(&self, req: &LaunchRequest<'_>) -> RResult<(), BackendError> {
        guard("supports", || {
            let launch = self.decode(req)?;
            let plan = self.plan(&launch)?;
            let mut planned =
                self.planned.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the plan table is poisoned"))?;
            // Plans no launch took (the host asked and went elsewhere) do not pile up.
            if planned.len() >= PLANS_KEPT {
                planned.clear();
            }
            planned.insert(launch.key, plan);
            Ok(())
        })
    }

    fn lower(&self, req: &LaunchRequest<'_>) -> RResult<RVec<Stage>, BackendError> {
        guard("lower", || {
            let launch = self.decode(req)?;
            let compiled = self.compiled(&launch)?;
            let key = self.cache_key(&launch);
            let poisoned = || BackendError::new(ErrorKind::Internal, "the lowered-text cache is poisoned");
            if let Some(stages) = self.lowered.lock().map_err(|_| poisoned())?.get(&key) {
                return Ok(stages.clone());
            }
            let stages: RVec<Stage> = (self.backend.stages(&compiled).into_iter())
                .map(|(name, text)| Stage { name: name.into(), text: text.into() })
                .collect();
            let mut lowered = self.lowered.lock().map_err(|_| poisoned())?;
            if lowered.len() >= COMPILED_KEPT {
                lowered.clear();
            }
            lowered.insert(key, stages.clone());
            Ok(stages)
        })
    }

    fn alloc(&self, dtype: RStr<'_>, shape: RSlice<'_, u64>) -> RResult<u64, BackendError> {
        guard("alloc", || {
            let dtype = DType::from_name(dtype.as_str()).ok_or_else(|| invalid(format!("unknown dtype `{dtype}`")))?;
            let ty = Type::array(dtype, shape.iter().map(|&d| d as usize).collect::<Vec<_>>());
            let buffer = self.backend.alloc(&ty)?;
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            self.buffers
                .lock()
                .map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?
                .insert(id, buffer);
            Ok(id)
        })
    }

    fn upload(&self, buffer: u64, data: RArrayRef<'_>) -> RResult<(), BackendError> {
        guard("upload", || {
            let array = HostArray::from_rarray_ref(&data).map_err(invalid)?;
            let mut table =
                self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
            let b = table.get_mut(&buffer).ok_or_else(|| invalid(format!("buffer {buffer} does not exist")))?;
            self.backend.upload(b, array)
        })
    }

    fn download(&self, buffer: u64) -> RResult<RArray, BackendError> {
        guard("download", || {
            let table =
                self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
            let b = table.get(&buffer).ok_or_else(|| invalid(format!("buffer {buffer} does not exist")))?;
            Ok(self.backend.download(b)?.to_rarray())
        })
    }

    fn free(&self, buffer: u64) -> RResult<(), BackendError> {
        guard("free", || {
            let mut table =
                self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
            table.remove(&buffer).map(drop).ok_or_else(|| invalid(format!("buffer {buffer} does not exist")))
        })
    }

    fn cache_stats(&self) -> CacheStats {
        let entries = self.compiled.lock().map_or(0, |c| c.len() as u64);
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries,
            plans: self.plans.load(Ordering::Relaxed),
            compile_ns: self.compile_ns.load(Ordering::Relaxed),
        }
    }

    fn launch(&self, req: &LaunchRequest<'_>, args: RSlice<'_, BufferArg<'_>>) -> RResult<(), BackendError> {
        guard("launch", || self.launch_with(req, args, false).map(|_| ()))
    }

    fn launch_timed(&self, req: &LaunchRequest<'_>, args: RSlice<'_, BufferArg<'_>>) -> RResult<ROption<u64>, BackendError> {
        guard("launch", || self.launch_with(req, args, true).map(ROption::from))
    }

    fn launch_host(
        &self,
        req: &LaunchRequest<'_>,
        inputs: RSlice<'_, HostInput<'_>>,
        mut outputs: RSliceMut<'_, HostOutput<'_>>,
    ) -> RResult<bool, BackendError> {
        guard("launch", || {
            let launch = self.decode(req)?;
            check_host_arrays(&launch, &inputs, &outputs)?;
            // Bytes that cannot be read in place (unaligned) are copied once here.
            let mut copies: BTreeMap<String, HostArray> = BTreeMap::new();
            let mut views: BTreeMap<String, DataRef<'_>> = BTreeMap::new();
            for i in inputs.iter() {
                let dtype = DType::from_name(i.array.dtype.as_str())
                    .ok_or_else(|| invalid(format!("unknown dtype `{}`", i.array.dtype)))?;
                match DataRef::from_le_bytes(dtype, i.array.bytes.as_slice()) {
                    Some(v) => {
                        views.insert(i.name.to_string(), v);
                    }
                    None => {
                        copies.insert(i.name.to_string(), HostArray::from_rarray_ref(&i.array).map_err(invalid)?);
                    }
                }
            }
            views.extend(copies.iter().map(|(n, a)| (n.clone(), a.data.as_data_ref())));
            let compiled = self.compiled(&launch)?;
            let mut outs: BTreeMap<String, &mut [u8]> =
                outputs.as_mut_slice().iter_mut().map(|o| (o.name.to_string(), o.array.bytes.as_mut_slice())).collect();
            match self.backend.run_host(&compiled, &launch, &views, &mut outs) {
                Some(r) => r.map(|()| true),
                None => Ok(false),
            }
        })
    }

    fn download_into(&self, buffer: u64, mut out: RArrayMut<'_>) -> RResult<(), BackendError> {
        guard("download", || {
            let table =
                self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
            let b = table.get(&buffer).ok_or_else(|| invalid(format!("buffer {buffer} does not exist")))?;
            let array = self.backend.download(b)?;
            let bytes = array.le_bytes();
            let dest = out.bytes.as_mut_slice();
            if dest.len() != bytes.len() || array.dtype().name() != out.dtype.as_str() {
                return Err(invalid(format!("cannot download {} into {} bytes of {}", array.ty(), dest.len(), out.dtype)));
            }
            dest.copy_from_slice(&bytes);
            Ok(())
        })
    }
}

/// Every argument of every kernel of `launch` has an array of its declared type among `inputs`
/// (`in`) or `outputs` (`out`), and each output's bytes are as many as its elements take.
fn check_host_arrays(launch: &Launch<'_>, inputs: &[HostInput<'_>], outputs: &[HostOutput<'_>]) -> Result<(), BackendError> {
    let ty_of = |dtype: RStr<'_>, shape: RSlice<'_, u64>| {
        DType::from_name(dtype.as_str()).map(|d| Type::array(d, shape.iter().map(|&n| n as usize).collect::<Vec<_>>()))
    };
    for call in &launch.calls {
        for p in &call.kernel.params {
            let found = match p.kind {
                ir::ParamKind::In => {
                    inputs.iter().find(|i| i.name.as_str() == p.name).map(|i| (ty_of(i.array.dtype, i.array.shape), None))
                }
                ir::ParamKind::Out => outputs
                    .iter()
                    .find(|o| o.name.as_str() == p.name)
                    .map(|o| (ty_of(o.array.dtype, o.array.shape), Some(o.array.bytes.len()))),
                ir::ParamKind::Scratch => continue,
            };
            let Some((ty, bytes)) = found else {
                return Err(invalid(format!("argument `{}` has no array", p.name)));
            };
            if ty.as_ref() != Some(&p.ty) || bytes.is_some_and(|b| b != p.ty.numel() * (p.ty.dtype.bits() / 8) as usize) {
                return Err(invalid(format!("the array of `{}` is not of its type {}", p.name, p.ty)));
            }
        }
    }
    Ok(())
}

/// The refusal of an upload whose array is not of the buffer's type (for [`BackendImpl::upload`]).
pub fn check_upload(buffer: &Type, data: &HostArray) -> Result<(), BackendError> {
    if data.ty() != *buffer {
        return Err(invalid(format!("cannot upload {} into a buffer of {buffer}", data.ty())));
    }
    Ok(())
}

/// Makes a mesh object from a value owned by the caller's library (`TD_CanDowncast`), so that
/// only that library can downcast it back.
pub fn make_mesh_object<M: Mesh + 'static>(mesh: M) -> MeshBox {
    Mesh_TO::from_value(mesh, abi_stable::sabi_trait::TD_CanDowncast)
}

/// Wraps the result of a root-module constructor, catching a panic.
pub fn new_backend_guarded(make: impl FnOnce() -> BackendBox) -> RResult<BackendBox, BackendError> {
    guard("new_backend", || Ok(make()))
}

/// Exports a backend as a plugin: defines the root module of a `cdylib`. Put it behind a cargo
/// feature (`plugin`), so that two backends linked into one host do not both define the root
/// module symbol:
///
/// ```ignore
/// #[cfg(feature = "plugin")]
/// tessel_plugin_api::export_plugin!(MyBackend::new());
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($make:expr) => {
        #[allow(unsafe_code, reason = "the loader static #[export_root_module] generates")]
        #[::abi_stable::export_root_module]
        pub fn tessel_plugin_root() -> $crate::abi::TesselPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            extern "C" fn new_backend() -> ::abi_stable::std_types::RResult<$crate::abi::BackendBox, $crate::abi::BackendError> {
                $crate::backend::new_backend_guarded(|| $crate::backend::export($make))
            }
            $crate::abi::TesselPlugin {
                plugin_api_version: ::abi_stable::std_types::RStr::from_str($crate::abi::PLUGIN_API_VERSION),
                ir_format: $crate::abi::IR_FORMAT_VERSION,
                new_backend,
            }
            .leak_into_prefix()
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use abi_stable::std_types::{RNone, RSlice};

    use super::*;
    use crate::abi::{IR_FORMAT_VERSION, KernelCall};

    /// A backend that counts its plans and compilations and runs nothing.
    #[derive(Default)]
    struct Counting {
        plans: Arc<AtomicUsize>,
        compiles: Arc<AtomicUsize>,
    }

    impl BackendImpl for Counting {
        type Buffer = ();
        type Plan = usize;
        type Compiled = usize;
        fn name(&self) -> &str {
            "counting"
        }
        fn version(&self) -> &str {
            "0"
        }
        fn platform(&self) -> String {
            "nowhere".into()
        }
        fn availability(&self) -> Result<Available, String> {
            Ok(Available { class: DeviceClass::Cpu, on: "here".into() })
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::none()
        }
        fn make_mesh(&self, _: &MeshSpec) -> Result<MeshBox, BackendError> {
            Err(invalid("no meshes"))
        }
        fn supports(&self, _: &Launch<'_>) -> Result<usize, BackendError> {
            Ok(self.plans.fetch_add(1, Ordering::SeqCst))
        }
        fn compile(&self, _: &Launch<'_>, plan: usize) -> Result<usize, BackendError> {
            self.compiles.fetch_add(1, Ordering::SeqCst);
            Ok(plan)
        }
        fn stages(&self, c: &usize) -> Vec<(String, String)> {
            vec![("plan".into(), c.to_string())]
        }
        fn alloc(&self, _: &Type) -> Result<(), BackendError> {
            Ok(())
        }
        fn upload(&self, _: &mut (), _: HostArray) -> Result<(), BackendError> {
            Ok(())
        }
        fn download<'b>(&self, _: &'b ()) -> Result<std::borrow::Cow<'b, HostArray>, BackendError> {
            Err(invalid("nothing to download"))
        }
        fn run(&self, _: &usize, _: &Launch<'_>, _: &mut BTreeMap<String, ()>) -> Result<(), BackendError> {
            Ok(())
        }
    }

    /// Where input `x` was read and what it held.
    type Seen = Arc<Mutex<Option<(usize, Vec<f32>)>>>;

    /// A host-memory backend whose `run_host` records where input `x` was and writes `o = x`.
    #[derive(Default)]
    struct InPlace {
        seen: Seen,
    }

    impl BackendImpl for InPlace {
        type Buffer = ();
        type Plan = ();
        type Compiled = ();
        fn name(&self) -> &str {
            "in-place"
        }
        fn version(&self) -> &str {
            "0"
        }
        fn platform(&self) -> String {
            "the host".into()
        }
        fn availability(&self) -> Result<Available, String> {
            Ok(Available { class: DeviceClass::Cpu, on: "here".into() })
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::none()
        }
        fn make_mesh(&self, _: &MeshSpec) -> Result<MeshBox, BackendError> {
            Err(invalid("no meshes"))
        }
        fn supports(&self, _: &Launch<'_>) -> Result<(), BackendError> {
            Ok(())
        }
        fn compile(&self, _: &Launch<'_>, (): ()) -> Result<(), BackendError> {
            Ok(())
        }
        fn stages(&self, (): &()) -> Vec<(String, String)> {
            Vec::new()
        }
        fn alloc(&self, _: &Type) -> Result<(), BackendError> {
            Ok(())
        }
        fn upload(&self, _: &mut (), _: HostArray) -> Result<(), BackendError> {
            Ok(())
        }
        fn download<'b>(&self, _: &'b ()) -> Result<std::borrow::Cow<'b, HostArray>, BackendError> {
            Err(invalid("nothing to download"))
        }
        fn run(&self, _: &(), _: &Launch<'_>, _: &mut BTreeMap<String, ()>) -> Result<(), BackendError> {
            Err(invalid("runs in place only"))
        }
        fn run_host(
            &self,
            (): &(),
            _: &Launch<'_>,
            inputs: &BTreeMap<String, DataRef<'_>>,
            outputs: &mut BTreeMap<String, &mut [u8]>,
        ) -> Option<Result<(), BackendError>> {
            let DataRef::F32(x) = inputs["x"] else { return Some(Err(invalid("x is f32"))) };
            *self.seen.lock().unwrap() = Some((x.as_ptr() as usize, x.to_vec()));
            crate::array::write_le_bits(DType::F32, x.iter().map(|v| v.to_bits()), outputs.get_mut("o").unwrap());
            Some(Ok(()))
        }
    }

    #[test]
    fn launch_host_reads_aligned_inputs_in_place_and_copies_unaligned_ones_once() {
        let b = InPlace::default();
        let seen = Arc::clone(&b.seen);
        let exported = export(b);
        let source = "kernel k\n  in x: f32[4]\n  out o: f32[4]\n{\n  %x = load x\n  store o, %x\n}\n";
        let calls = [KernelCall { kernel: "k".into(), mesh: RNone }];
        let req = LaunchRequest {
            ir_format: IR_FORMAT_VERSION,
            source: source.into(),
            calls: RSlice::from_slice(&calls),
            external_meshes: RSlice::from_slice(&[]),
            grid: RSlice::from_slice(&[]),
        };
        let values = [1.5f32, -2.0, 3.25, 0.0];
        // Words, so that the bytes are aligned for f32; then the same bytes one past a boundary.
        let words: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        let aligned: &[u8] = bytemuck::cast_slice(&words);
        let mut shifted = [0u8; 17];
        shifted[1..].copy_from_slice(aligned);
        let shape = [4u64];
        for (bytes, in_place) in [(aligned, true), (&shifted[1..], false)] {
            let inputs = [HostInput {
                name: "x".into(),
                array: RArrayRef { dtype: "f32".into(), shape: RSlice::from_slice(&shape), bytes: RSlice::from_slice(bytes) },
            }];
            let mut out = [0u8; 16];
            let mut outputs = [HostOutput {
                name: "o".into(),
                array: RArrayMut {
                    dtype: "f32".into(),
                    shape: RSlice::from_slice(&shape),
                    bytes: RSliceMut::from_mut_slice(&mut out),
                },
            }];
            let ran = exported.launch_host(&req, RSlice::from_slice(&inputs), RSliceMut::from_mut_slice(&mut outputs)).unwrap();
            assert!(ran);
            let (ptr, got) = seen.lock().unwrap().take().unwrap();
            assert_eq!(ptr == bytes.as_ptr() as usize, in_place, "read in place exactly when aligned");
            assert_eq!(got, values);
            assert_eq!(out, aligned, "the output written into the caller's memory");
        }
        // An output of the wrong size is refused before anything runs.
        let inputs = [HostInput {
            name: "x".into(),
            array: RArrayRef { dtype: "f32".into(), shape: RSlice::from_slice(&shape), bytes: RSlice::from_slice(aligned) },
        }];
        let mut short = [0u8; 8];
        let mut outputs = [HostOutput {
            name: "o".into(),
            array: RArrayMut {
                dtype: "f32".into(),
                shape: RSlice::from_slice(&shape),
                bytes: RSliceMut::from_mut_slice(&mut short),
            },
        }];
        let err = exported.launch_host(&req, RSlice::from_slice(&inputs), RSliceMut::from_mut_slice(&mut outputs)).unwrap_err();
        assert!(err.message.contains("the array of `o` is not of its type f32[4]"), "{}", err.message);
        assert!(seen.lock().unwrap().is_none());
    }

    #[test]
    fn a_launch_after_supports_plans_once_and_a_cached_one_neither_plans_nor_compiles() {
        let b = Counting::default();
        let (plans, compiles) = (Arc::clone(&b.plans), Arc::clone(&b.compiles));
        let exported = export(b);
        let source = "kernel k\n  in x: f32[4]\n  out o: f32[4]\n{\n  %x = load x\n  store o, %x\n}\n";
        let calls = [KernelCall { kernel: "k".into(), mesh: RNone }];
        let req = LaunchRequest {
            ir_format: IR_FORMAT_VERSION,
            source: source.into(),
            calls: RSlice::from_slice(&calls),
            external_meshes: RSlice::from_slice(&[]),
            grid: RSlice::from_slice(&[]),
        };
        // The host asks, then launches: one plan, one compilation.
        exported.supports(&req).into_result().unwrap();
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        // Again: asked again (every launch is), compiled launch from the cache.
        exported.supports(&req).into_result().unwrap();
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (2, 1));
        // A launch nobody asked about first, found in the cache, plans nothing.
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (2, 1));
        // Lowering after asking: the asking plans, the lowering does not.
        exported.supports(&req).into_result().unwrap();
        let stages = exported.lower(&req).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), stages.len()), (3, 1));
        // A backend without a device clock runs a timed launch and says it has no time.
        let timed = exported.launch_timed(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert!(timed.is_none());
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (3, 1));
        // A launch not in the cache, nobody asked about first, plans once to compile.
        let other = "kernel k\n  in x: f32[4]\n  out o: f32[4]\n{\n  %x = load x\n  %y = neg %x\n  store o, %y\n}\n";
        let req = LaunchRequest { source: other.into(), ..req };
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (4, 2));
    }
}
