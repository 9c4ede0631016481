//! The ABI adapter [`export`](super::export) makes of a [`BackendImpl`]: `Exported<B>` runs every
//! method under [`guard`], decodes requests, keeps the table of device buffers, and keeps four
//! bounded caches (parsed kernels, plans, compiled launches, lowered text), each emptied when it
//! holds its bound ([`DECODED_KEPT`], [`PLANS_KEPT`], [`COMPILED_KEPT`]): a cache that starts
//! afresh costs a few plans and compilations again, never a wrong answer.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::{ROption, RResult, RSlice, RSliceMut, RStr, RString, RVec};

use super::guard::guard;
use super::keys::{decode_keyed, keyed, request_key, with_kept};
use super::{Artifact, Available, BackendImpl, Buffer, Compiler, Memory, Request, check_upload, invalid};
use crate::abi::*;
use crate::array::{DataRef, HostArray};
use crate::ir::{self, DType, Kernel, Type};
use crate::kept::Kept;
use crate::mesh::MeshSpec;

pub(super) struct Exported<B: BackendImpl> {
    backend: B,
    buffers: Mutex<HashMap<u64, Buffer<B>>>,
    next: AtomicU64,
    /// Compiled launches by [`cache_key`](super::cache_key).
    compiled: Kept<[u8; 32], Arc<Artifact<B>>>,
    /// The lowered text of each compiled launch, by the same key: made once, since every run
    /// through the host lowers first (the interpreter's text is its whole program, printed).
    lowered: Kept<[u8; 32], RVec<Stage>>,
    /// Plans, by the same key: the host asks before every launch, and neither the asking nor
    /// the launch or lowering that follows plans again.
    planned: Kept<[u8; 32], Arc<Plan<B>>>,
    /// The parsed kernels of recent requests, by [`request_key`]: a launch repeated is not
    /// parsed again.
    decoded: Kept<[u8; 32], ParsedKernels>,
    hits: AtomicU64,
    misses: AtomicU64,
    /// Calls of `Compiler::plan`.
    plans: AtomicU64,
    /// Time in `Compiler::compile` (and `Compiler::plan` when no plan was kept), in nanoseconds.
    compile_ns: AtomicU64,
}

/// A backend's plan.
type Plan<B> = <<B as BackendImpl>::Compiler as Compiler>::Plan;

/// The kernels of one request, parsed.
type ParsedKernels = Arc<Vec<Arc<Kernel>>>;

/// Requests whose parsed kernels are kept.
const DECODED_KEPT: usize = 256;
/// Plans kept.
const PLANS_KEPT: usize = 256;
/// Compiled launches kept (each cache starts afresh when full, as every cache here does).
const COMPILED_KEPT: usize = 256;

impl<B: BackendImpl> Exported<B> {
    /// A backend with no buffers and empty caches.
    pub(super) fn new(backend: B) -> Exported<B> {
        Exported {
            backend,
            buffers: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            compiled: Kept::new(COMPILED_KEPT),
            lowered: Kept::new(COMPILED_KEPT),
            planned: Kept::new(PLANS_KEPT),
            decoded: Kept::new(DECODED_KEPT),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            plans: AtomicU64::new(0),
            compile_ns: AtomicU64::new(0),
        }
    }

    /// [`decode`](super::decode), reusing the kernels parsed for the same request before.
    fn decode<'a>(&self, req: &LaunchRequest<'a>) -> Result<Request<'a>, BackendError> {
        let key = request_key(req);
        let known = self.decoded.get(&key);
        let launch = decode_keyed(req, key, known.as_deref().map(Vec::as_slice))?;
        if known.is_none() {
            self.decoded.insert(key, Arc::new(launch.calls.iter().map(|c| Arc::clone(&c.kernel)).collect()));
        }
        Ok(launch)
    }

    /// The plan of `launch` from the cache, else `Compiler::plan`, counted and kept.
    fn plan(&self, launch: &Request<'_>, compiler: &B::Compiler, key: &[u8; 32]) -> Result<Arc<Plan<B>>, BackendError> {
        self.planned.get_or_try_insert(*key, || {
            self.plans.fetch_add(1, Ordering::Relaxed);
            ir::counters::planned();
            Ok(Arc::new(compiler.plan(launch)?))
        })
    }

    /// The plan of the request (from the cache, else made and kept) and the compiler it is for:
    /// what `supports`, `warm_up` and `lower_plan` share.
    fn kept_plan(&self, req: &LaunchRequest<'_>) -> Result<(Arc<Plan<B>>, B::Compiler), BackendError> {
        let launch = self.decode(req)?;
        let compiler = self.backend.compiler()?;
        let plan = self.plan(&launch, &compiler, &self.cache_key(&launch, &compiler))?;
        Ok((plan, compiler))
    }

    /// The key of `launch` in the plan and compile caches (and the lowered-text cache beside
    /// them): the backend, its version, its compiler's options and the launch.
    fn cache_key(&self, launch: &Request<'_>, compiler: &B::Compiler) -> [u8; 32] {
        keyed(self.backend.name(), self.backend.version(), &compiler.options().to_string(), &launch.key)
    }

    /// The compiled launch from the cache (by its key and its kept outputs, [`with_kept`]); else
    /// compiled from its plan (kept, or made now), and its key.
    fn compiled(&self, launch: &Request<'_>) -> Result<(Arc<Artifact<B>>, [u8; 32], B::Compiler), BackendError> {
        let compiler = self.backend.compiler()?;
        let key = self.cache_key(launch, &compiler);
        let artifact_key = with_kept(key, &launch.kept);
        if let Some(c) = self.compiled.get(&artifact_key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok((c, key, compiler));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let start = std::time::Instant::now();
        let plan = Arc::unwrap_or_clone(self.plan(launch, &compiler, &key)?);
        let c = Arc::new(compiler.compile(launch, plan)?);
        self.compile_ns.fetch_add(start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
        self.compiled.insert(artifact_key, Arc::clone(&c));
        Ok((c, key, compiler))
    }

    fn take_buffers(&self, args: RSlice<'_, BufferArg<'_>>) -> Result<BTreeMap<String, (u64, Buffer<B>)>, BackendError> {
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

    fn put_back(&self, ids: BTreeMap<String, u64>, mut buffers: BTreeMap<String, Buffer<B>>) {
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
        let mut launch = self.decode(req)?;
        launch.kept = args.iter().filter(|a| a.keep).map(|a| a.name.to_string()).collect();
        let (compiled, ..) = self.compiled(&launch)?;
        let taken = self.take_buffers(args)?;
        let ids: BTreeMap<String, u64> = taken.iter().map(|(n, (id, _))| (n.clone(), *id)).collect();
        let mut buffers: BTreeMap<String, Buffer<B>> = taken.into_iter().map(|(n, (_, b))| (n, b)).collect();
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

    fn options(&self) -> RString {
        match guard("options", || Ok(self.backend.compiler()?.options().to_string())) {
            RResult::ROk(o) => o.into(),
            RResult::RErr(e) => format!("(options failed: {})", e.message).into(),
        }
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
        guard("supports", || self.kept_plan(req).map(drop))
    }

    fn lower(&self, req: &LaunchRequest<'_>) -> RResult<RVec<Stage>, BackendError> {
        guard("lower", || {
            let launch = self.decode(req)?;
            let (compiled, key, compiler) = self.compiled(&launch)?;
            self.lowered.get_or_try_insert(key, || {
                Ok((compiler.stages(&compiled).into_iter())
                    .map(|(name, text)| Stage { name: name.into(), text: text.into() })
                    .collect())
            })
        })
    }

    fn alloc(&self, dtype: RStr<'_>, shape: RSlice<'_, u64>) -> RResult<u64, BackendError> {
        guard("alloc", || {
            let dtype = DType::from_name(dtype.as_str()).ok_or_else(|| invalid(format!("unknown dtype `{dtype}`")))?;
            let ty = Type::array(dtype, shape.iter().map(|&d| d as usize).collect::<Vec<_>>());
            let buffer = self.backend.memory()?.alloc(&ty)?;
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
            let memory = self.backend.memory()?;
            check_upload(&memory.type_of(b), &array)?;
            memory.upload(b, array)
        })
    }

    fn download(&self, buffer: u64) -> RResult<RArray, BackendError> {
        guard("download", || {
            let table =
                self.buffers.lock().map_err(|_| BackendError::new(ErrorKind::Internal, "the buffer table is poisoned"))?;
            let b = table.get(&buffer).ok_or_else(|| invalid(format!("buffer {buffer} does not exist")))?;
            Ok(self.backend.memory()?.download(b)?.to_rarray())
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
        let entries = self.compiled.len() as u64;
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

    fn warm_up(&self, req: &LaunchRequest<'_>) {
        // The plan `supports` made and kept (a launch planned is not planned again); a launch
        // refused here is refused again, with its reason, when it runs.
        let _ = guard("warm up", || {
            let (plan, _) = self.kept_plan(req)?;
            self.backend.warm_up(&plan);
            Ok(())
        });
    }

    fn lower_plan(&self, req: &LaunchRequest<'_>) -> RResult<RString, BackendError> {
        guard("lower", || {
            let (plan, compiler) = self.kept_plan(req)?;
            Ok(compiler.plan_text(&plan).into())
        })
    }

    #[allow(unsafe_code, reason = "the contract of Backend::launch_external")]
    unsafe fn launch_external(
        &self,
        req: &LaunchRequest<'_>,
        stream: u64,
        args: RSlice<'_, DeviceArg<'_>>,
    ) -> RResult<(), BackendError> {
        guard("launch", || {
            let mut launch = self.decode(req)?;
            launch.kept = args.iter().filter(|a| a.keep).map(|a| a.name.to_string()).collect();
            let (compiled, ..) = self.compiled(&launch)?;
            let at: BTreeMap<String, u64> = args.iter().map(|a| (a.name.to_string(), a.address)).collect();
            // SAFETY: the caller's promise (`Backend::launch_external`): a live stream, and
            // memory of its device holding each argument.
            let ran = unsafe { self.backend.run_external(&compiled, &launch, stream, &at) };
            ran.unwrap_or_else(|| Err(BackendError::no_external_launch(self.backend.name())))
        })
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
            let mut launch = self.decode(req)?;
            launch.kept = outputs.iter().filter(|o| o.keep).map(|o| o.name.to_string()).collect();
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
            let (compiled, ..) = self.compiled(&launch)?;
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
            let array = self.backend.memory()?.download(b)?;
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
fn check_host_arrays(launch: &Request<'_>, inputs: &[HostInput<'_>], outputs: &[HostOutput<'_>]) -> Result<(), BackendError> {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use abi_stable::std_types::{RNone, RSlice};

    use super::*;
    use crate::abi::{IR_FORMAT_VERSION, KernelCall};
    use crate::backend::{HostMemory, export};

    /// A backend that counts its plans and compilations and runs nothing; launched on another
    /// runtime's memory, it records the stream, the addresses and the outputs kept.
    #[derive(Default)]
    struct Counting {
        plans: Arc<AtomicUsize>,
        compiles: Arc<AtomicUsize>,
        external: Arc<Mutex<Vec<(u64, BTreeMap<String, u64>, Vec<String>)>>>,
    }

    impl Compiler for Counting {
        type Plan = usize;
        type Artifact = usize;
        fn plan(&self, _: &Request<'_>) -> Result<usize, BackendError> {
            Ok(self.plans.fetch_add(1, Ordering::SeqCst))
        }
        fn compile(&self, _: &Request<'_>, plan: usize) -> Result<usize, BackendError> {
            self.compiles.fetch_add(1, Ordering::SeqCst);
            Ok(plan)
        }
        fn plan_text(&self, plan: &usize) -> String {
            format!("plan {plan}\n")
        }
        fn stages(&self, c: &usize) -> Vec<(String, String)> {
            vec![("plan".into(), c.to_string())]
        }
    }

    impl BackendImpl for Counting {
        type Memory = HostMemory;
        type Compiler = Counting;
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
        fn compiler(&self) -> Result<Counting, BackendError> {
            Ok(Counting { plans: Arc::clone(&self.plans), compiles: Arc::clone(&self.compiles), external: Default::default() })
        }
        fn memory(&self) -> Result<&HostMemory, BackendError> {
            Ok(&HostMemory)
        }
        fn run(&self, _: &usize, _: &Request<'_>, _: &mut BTreeMap<String, HostArray>) -> Result<(), BackendError> {
            Ok(())
        }
        #[allow(unsafe_code, reason = "the trait's signature; nothing is read at the addresses")]
        unsafe fn run_external(
            &self,
            _: &usize,
            launch: &Request<'_>,
            stream: u64,
            args: &BTreeMap<String, u64>,
        ) -> Option<Result<(), BackendError>> {
            self.external.lock().unwrap().push((stream, args.clone(), launch.kept.iter().cloned().collect()));
            Some(Ok(()))
        }
    }

    /// Kernel `k`: `o = x` on four `f32`s.
    const COPY: &str = "kernel k\n  in x: f32[4]\n  out o: f32[4]\n{\n  %x = load x\n  store o, %x\n}\n";

    /// The request of `calls` of the kernels of `source`, without meshes or grid sizes.
    fn request<'a>(source: &'a str, calls: &'a [KernelCall<'a>]) -> LaunchRequest<'a> {
        LaunchRequest {
            ir_format: IR_FORMAT_VERSION,
            source: source.into(),
            calls: RSlice::from_slice(calls),
            external_meshes: RSlice::from_slice(&[]),
            grid: RSlice::from_slice(&[]),
        }
    }

    /// Where input `x` was read and what it held.
    type Seen = Arc<Mutex<Option<(usize, Vec<f32>)>>>;

    /// A compiler that plans and makes nothing.
    struct Nothing;

    impl Compiler for Nothing {
        type Plan = ();
        type Artifact = ();
        fn plan(&self, _: &Request<'_>) -> Result<(), BackendError> {
            Ok(())
        }
        fn compile(&self, _: &Request<'_>, (): ()) -> Result<(), BackendError> {
            Ok(())
        }
        fn plan_text(&self, (): &()) -> String {
            String::new()
        }
        fn stages(&self, (): &()) -> Vec<(String, String)> {
            Vec::new()
        }
    }

    /// A host-memory backend whose `run_host` records where input `x` was and writes `o = x`.
    #[derive(Default)]
    struct InPlace {
        seen: Seen,
    }

    impl BackendImpl for InPlace {
        type Memory = HostMemory;
        type Compiler = Nothing;
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
        fn compiler(&self) -> Result<Nothing, BackendError> {
            Ok(Nothing)
        }
        fn memory(&self) -> Result<&HostMemory, BackendError> {
            Ok(&HostMemory)
        }
        fn run(&self, _: &(), _: &Request<'_>, _: &mut BTreeMap<String, HostArray>) -> Result<(), BackendError> {
            Err(invalid("runs in place only"))
        }
        fn run_host(
            &self,
            (): &(),
            _: &Request<'_>,
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
        let calls = [KernelCall { kernel: "k".into(), mesh: RNone }];
        let req = request(COPY, &calls);
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
                keep: false,
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
            keep: false,
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
        let calls = [KernelCall { kernel: "k".into(), mesh: RNone }];
        let req = request(COPY, &calls);
        // The host asks, then launches: one plan, one compilation.
        exported.supports(&req).into_result().unwrap();
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        // Again: asked again (every launch is), plan and compiled launch from the caches.
        exported.supports(&req).into_result().unwrap();
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        // A launch nobody asked about first, found in the cache, plans nothing.
        exported.launch(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        // Lowering after asking plans nothing more; nor does printing the plan, which is the
        // one `supports` made.
        exported.supports(&req).into_result().unwrap();
        let stages = exported.lower(&req).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), stages.len()), (1, 1));
        assert_eq!(exported.lower_plan(&req).into_result().unwrap().as_str(), "plan 0\n");
        assert_eq!(plans.load(Ordering::SeqCst), 1);
        // A backend without a device clock runs a timed launch and says it has no time.
        let timed = exported.launch_timed(&req, RSlice::from_slice(&[])).into_result().unwrap();
        assert!(timed.is_none());
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        // A launch not in the cache, nobody asked about first, plans once to compile.
        let other = "kernel k\n  in x: f32[4]\n  out o: f32[4]\n{\n  %x = load x\n  %y = neg %x\n  store o, %y\n}\n";
        let other = LaunchRequest { source: other.into(), ..req };
        exported.launch(&other, RSlice::from_slice(&[])).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (2, 2));
        // Asked about, then launched with the other: each plan is kept for its own launch.
        exported.supports(&req).into_result().unwrap();
        exported.supports(&other).into_result().unwrap();
        exported.lower(&req).into_result().unwrap();
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (2, 2));
    }

    #[test]
    fn a_launch_on_another_runtimes_memory_is_planned_and_compiled_once_or_refused_as_unsupported() {
        let b = Counting::default();
        let (plans, compiles, external) = (Arc::clone(&b.plans), Arc::clone(&b.compiles), Arc::clone(&b.external));
        let exported = export(b);
        let calls = [KernelCall { kernel: "k".into(), mesh: RNone }];
        let req = request(COPY, &calls);
        let args = [DeviceArg::new("x", 0x1000, false), DeviceArg::new("o", 0x2000, true)];
        exported.supports(&req).into_result().unwrap();
        for _ in 0..2 {
            // SAFETY: the test backend records the addresses and reads none.
            #[allow(unsafe_code, reason = "addresses the test backend never reads")]
            unsafe { exported.launch_external(&req, 77, RSlice::from_slice(&args)) }.into_result().unwrap();
        }
        // Planned by `supports` alone, compiled once (kept outputs in the key), run twice with
        // the caller's stream, addresses and kept outputs.
        assert_eq!((plans.load(Ordering::SeqCst), compiles.load(Ordering::SeqCst)), (1, 1));
        let at: BTreeMap<String, u64> = [("o".to_string(), 0x2000), ("x".to_string(), 0x1000)].into();
        let seen = external.lock().unwrap().clone();
        assert_eq!(seen, vec![(77, at.clone(), vec!["o".to_string()]), (77, at, vec!["o".to_string()])]);
        // A backend that does not launch so says it, as `Unsupported`, naming itself.
        let in_place = export(InPlace::default());
        // SAFETY: refused before any address is read.
        #[allow(unsafe_code, reason = "addresses the backend refuses before reading")]
        let err = unsafe { in_place.launch_external(&req, 77, RSlice::from_slice(&args)) }.into_result().unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unsupported);
        assert_eq!(err.message.as_str(), "the in-place backend does not launch on another runtime's device memory");
    }
}
