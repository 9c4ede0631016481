//! `tessel_call`: tessel as an XLA FFI handler, so that a kernel runs inside a program JAX
//! compiles (`jax.jit`, `grad`, `vmap`, `scan`, `shard_map`). docs/jax.md is the user's side.
//!
//! XLA calls the handler with a call frame (`xla/ffi/api/c_api.h` in jaxlib's
//! `jax.ffi.include_dir()`): the operands' and results' buffers in XLA's memory, and the custom
//! call's attributes: `text` (the specialized kernel, `.tk`), `backend` (a backend's name, or
//! `auto`), `mesh` (its mesh text, or empty) and `externals` (external meshes, one a line). The
//! handler prepares each distinct launch once (parse, verify, choose the backend, make the meshes)
//! into a bounded cache shared by every thread, then launches it in place: the interpreter reads
//! XLA's input buffers and writes its output buffers where they are; a device backend uploads
//! from and downloads into them. Operands with more leading dimensions than the kernel declares
//! are a batch (`vmap`): one launch of the kernel batched over a new grid axis
//! (`ir::batch::batched`), or, where it cannot be (a kernel on a mesh, a backend that refuses),
//! one launch per element on that element's slice of each buffer.
//!
//! It never touches Python, never unwinds into XLA (every panic is caught), and turns every
//! failure into an XLA FFI error carrying tessel's message, which JAX raises as
//! `JaxRuntimeError`.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessel::{BytesMut, BytesRef, Call, Choice, Error, InPlace, Launch, Plan, Runtime};
use tessel_plugin_api::abi::MeshBox;
use tessel_plugin_api::kept::Kept;
use tessel_plugin_api::ir::{ParamKind, Type, Verified, batch};

pub mod c_api;
mod cuda;
mod sigint;

use c_api::*;

/// A launch prepared once: the kernel verified, its backend chosen, its meshes made.
pub struct Prepared {
    pub kernel: Arc<Verified>,
    /// The backend's acceptance of the launch, asked once: the backend that runs it (never
    /// `auto`) and why ([`Plan::decisions`]), and the launch (the kernel, its meshes).
    pub plan: Plan,
    /// `in` and `out` arguments in declared order: the custom call's operands and results.
    pub inputs: Vec<(String, Type)>,
    pub outputs: Vec<(String, Type)>,
    /// The kernel batched over a grid axis, by batch size (`None`: it cannot be, or the
    /// backend refuses it).
    batches: Kept<usize, Option<Batched>>,
    /// Whether the backend refused to launch on XLA's CUDA buffers (`cuda.rs`), so that the
    /// calls are staged through host memory without asking again.
    staged: std::sync::atomic::AtomicBool,
}

/// The backend's acceptance of a kernel batched over a grid axis (its plan holds the kernel).
type Batched = Plan;

/// The most batch sizes kept per launch.
const BATCHES_KEPT: usize = 8;

impl Prepared {
    /// The kernel batched over `count` elements in one launch ([`batch::batched`]), asked of
    /// the backend once per size; `None` where it has a mesh (whose axes the batch axis would not
    /// be among), cannot be batched, or the backend refuses the batched launch.
    fn batched(&self, rt: &Runtime, count: usize) -> Option<Batched> {
        let launch = self.plan.launch();
        if launch.calls().iter().any(|c| c.mesh.is_some()) || !launch.externals().is_empty() {
            return None;
        }
        // Planned outside the lock: another thread batching another size does not wait on it
        // (two threads with the same new size both plan it, and one result is kept).
        self.batches.get_or_insert_with(count, || {
            batch::batched(self.kernel.kernel(), count as u64)
                .ok()
                .and_then(|k| tessel_plugin_api::ir::verify(&k).ok())
                .and_then(|v| rt.plan(Choice::Named(self.plan.backend()), &Launch::one(v)).ok().map(|p| p.into_plan()))
        })
    }
}

/// `m` locked; a lock a panicking thread held is taken as it is: each of the handler's tables is
/// whole between its statements (an entry is inserted or not), so a panic leaves none half-made.
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forgets every prepared launch: their plans and meshes belong to the runtime they were made
/// with (`tessel.load_plugin` makes a new one).
pub fn forget() {
    CACHE.clear();
}

/// The most prepared launches kept; the cache starts afresh when full.
const KEPT: usize = 256;

/// Prepared launches by [`key`], shared by every thread.
static CACHE: Kept<[u8; 32], Arc<Prepared>> = Kept::new(KEPT);
static CALLS: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
/// Calls running now, and the most that ever ran at once (XLA calls the handler from a thread
/// per device under `shard_map`).
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
static MOST_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// Launches by backend name (the tests check that a kernel ran where it was sent).
static LAUNCHES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// The handler's counters.
pub struct Stats {
    pub calls: u64,
    pub hits: u64,
    pub misses: u64,
    pub failures: u64,
    pub most_in_flight: u64,
    /// CUDA calls that ran through host memory (`cuda.rs`).
    pub staged: u64,
    pub launches: Vec<(String, u64)>,
}

/// Handler calls, cache hits and misses, failures, the most calls at once, launches by backend.
pub fn stats() -> Stats {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Stats {
        calls: load(&CALLS),
        hits: load(&HITS),
        misses: load(&MISSES),
        failures: load(&FAILURES),
        most_in_flight: load(&MOST_IN_FLIGHT),
        staged: load(&cuda::STAGED),
        launches: locked(&LAUNCHES).clone(),
    }
}

/// Counts a call in flight while it lives.
struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        let now = IN_FLIGHT.fetch_add(1, Ordering::Relaxed) + 1;
        MOST_IN_FLIGHT.fetch_max(now, Ordering::Relaxed);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

fn key(rt: &Runtime, text: &[u8], backend: &[u8], mesh: &[u8], externals: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    // The runtime too: a launch prepared by one runtime's backend never runs on another's (a
    // plugin on the path named like a built-in replaces it only in the runtime that loads every
    // plugin). Runtimes are dropped only by `load_plugin`, which empties this cache ([`forget`]).
    h.update(&(std::ptr::from_ref(rt) as usize as u64).to_le_bytes());
    for part in [text, backend, mesh, externals] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    *h.finalize().as_bytes()
}

/// The launch of kernel `text` on `backend` with `mesh` and `externals` (one mesh a line), from
/// the cache or prepared now (and kept).
pub fn prepared(rt: &Runtime, text: &str, backend: &str, mesh: &str, externals: &str) -> Result<Arc<Prepared>, Error> {
    let k = key(rt, text.as_bytes(), backend.as_bytes(), mesh.as_bytes(), externals.as_bytes());
    if let Some(p) = CACHE.get(&k) {
        HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(p);
    }
    MISSES.fetch_add(1, Ordering::Relaxed);
    let p = Arc::new(prepare(rt, text, backend, mesh, externals)?);
    if backend == p.plan.backend() {
        CACHE.insert(k, Arc::clone(&p));
    } else {
        // `auto` resolved: the handler's calls name the backend chosen, and find it too.
        let chosen = key(rt, text.as_bytes(), p.plan.backend().as_bytes(), mesh.as_bytes(), externals.as_bytes());
        CACHE.insert_all([(k, Arc::clone(&p)), (chosen, Arc::clone(&p))]);
    }
    Ok(p)
}

fn prepare(rt: &Runtime, text: &str, backend: &str, mesh: &str, externals: &str) -> Result<Prepared, Error> {
    let file = tessel::parse_kernels("<tessel_call>", text)?;
    let [generic] = file.kernels() else {
        return Err(Error::Kernel(format!("tessel_call takes one kernel; its text defines {}", file.kernels().len())));
    };
    let none = std::collections::BTreeMap::new();
    let binding = generic.bind(&none, &none, &Default::default())?;
    let kernel = file.specialize(generic, &binding)?;
    // XLA makes the call's results before the handler runs: outputs that cannot fit are refused
    // here, when the call is lowered, before any backend is asked.
    tessel::memory::outputs_fit(&[&kernel])?;
    let maker = if backend == "auto" { "" } else { backend };
    let mesh = (!mesh.is_empty()).then(|| rt.mesh(maker, mesh)).transpose()?;
    let externals: Vec<MeshBox> =
        externals.lines().filter(|l| !l.trim().is_empty()).map(|m| rt.mesh(maker, m)).collect::<Result<_, _>>()?;
    let grid = Default::default();
    let kernel = Arc::new(kernel);
    let plan = {
        let call = Call { kernel: Arc::clone(&kernel), mesh: mesh.map(Arc::new) };
        let launch = Launch::new([call], externals.into_iter().map(Arc::new), grid);
        let planned = rt.plan(Choice::of(backend), &launch)?;
        // The call is prepared when XLA lowers it: the backend's compile overlaps with XLA's.
        planned.warm_up();
        planned.into_plan()
    };
    let args = |kind| kernel.kernel().params_of(kind).map(|p| (p.name.clone(), p.ty.clone())).collect();
    let (inputs, outputs) = (args(ParamKind::In), args(ParamKind::Out));
    Ok(Prepared { kernel, plan, inputs, outputs, batches: Kept::new(BATCHES_KEPT), staged: Default::default() })
}

/// A failure and the XLA error code it becomes.
struct Failure {
    code: i32,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        use tessel_plugin_api::abi::ErrorKind;
        // The status XLA reports names the kind of failure: what tessel will not run, what it
        // cannot run here, memory, a fault of tessel or the device, or a bad call.
        let code = match &e {
            Error::Backend { kind: ErrorKind::Unsupported, .. } | Error::NoBackend { .. } => UNIMPLEMENTED,
            Error::Backend { kind: ErrorKind::Unavailable, .. } => UNAVAILABLE,
            Error::Backend { kind: ErrorKind::Device | ErrorKind::Panic | ErrorKind::Internal, .. } => INTERNAL,
            Error::Memory { .. } => RESOURCE_EXHAUSTED,
            _ => INVALID_ARGUMENT,
        };
        Failure { code, message: format!("tessel_call: {e}") }
    }
}

fn invalid(message: String) -> Failure {
    Failure { code: INVALID_ARGUMENT, message: format!("tessel_call: {message}") }
}

/// Which memory XLA hands the handler: host memory (the CPU platform) or a CUDA device's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Platform {
    Host,
    Cuda,
}

/// The handler XLA calls on the CPU platform. Every call returns: a panic becomes an error,
/// never an unwind.
///
/// # Safety
/// `frame` is a call frame XLA made for a custom call of this handler.
pub unsafe extern "C" fn tessel_call(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's call frame, as the caller promises.
    unsafe { entry(frame, Platform::Host) }
}

/// The handler XLA calls on the CUDA platform: its buffers are device memory, and its stream is
/// XLA's (`cuda.rs`).
///
/// # Safety
/// As [`tessel_call`].
pub unsafe extern "C" fn tessel_call_cuda(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's call frame, as the caller promises.
    unsafe { entry(frame, Platform::Cuda) }
}

/// The handler on `platform`, its failures (panics too) as XLA FFI errors.
///
/// # Safety
/// `frame` is a call frame XLA made for a custom call of this handler.
unsafe fn entry(frame: *mut CallFrame, platform: Platform) -> *mut FfiError {
    // SAFETY: XLA's call frame, as the caller promises.
    let result = catch_unwind(AssertUnwindSafe(|| unsafe { handle(frame, platform) }));
    let failure = match result {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(f)) => f,
        Err(p) => {
            let what = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Failure { code: INTERNAL, message: format!("tessel_call: tessel panicked: {}", what.unwrap_or_default()) }
        }
    };
    FAILURES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: XLA's call frame holds its API table.
    unsafe { error(frame, failure) }
}

pub unsafe extern "C" fn empty_call(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: as tessel_call's.
    let _ = unsafe { metadata(frame) };
    std::ptr::null_mut()
}

/// The API version and traits, where XLA asks for them (at registration); true if it did.
unsafe fn metadata(frame: *mut CallFrame) -> bool {
    // SAFETY: XLA's frame, whose extension list (if any) starts at `extension_start`.
    unsafe {
        let ext = (*frame).extension_start;
        if ext.is_null() || (*ext).ty != EXTENSION_METADATA {
            return false;
        }
        let m = (*(ext as *mut MetadataExtension)).metadata;
        (*m).api_version = ApiVersion {
            struct_size: std::mem::size_of::<ApiVersion>(),
            extension_start: std::ptr::null_mut(),
            major_version: API_MAJOR,
            minor_version: API_MINOR,
        };
        (*m).traits = 0;
        true
    }
}

unsafe fn error(frame: *mut CallFrame, f: Failure) -> *mut FfiError {
    let message = CString::new(f.message.replace('\0', " ")).unwrap_or_default();
    let mut args = ErrorCreateArgs {
        struct_size: std::mem::size_of::<ErrorCreateArgs>(),
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: f.code,
    };
    // SAFETY: XLA's API table; Error_Create copies the message.
    unsafe {
        match (*(*frame).api).error_create {
            Some(create) => create(&mut args),
            None => std::ptr::null_mut(),
        }
    }
}

/// The attribute `name` as a string, or "" where the call has none.
unsafe fn string_attr<'a>(frame: &'a CallFrame, name: &str) -> Result<&'a str, Failure> {
    let a = &frame.attrs;
    for i in 0..a.size.max(0) as usize {
        // SAFETY: `size` entries in each of XLA's arrays.
        let (ty, n, v) = unsafe { (*a.types.add(i), &**a.names.add(i), *a.attrs.add(i)) };
        // SAFETY: a byte span XLA owns for the call.
        let n = unsafe { std::slice::from_raw_parts(n.ptr as *const u8, n.len) };
        if n != name.as_bytes() {
            continue;
        }
        if ty != ATTR_STRING {
            return Err(invalid(format!("attribute `{name}` is not a string")));
        }
        // SAFETY: a string attribute is a byte span.
        let s = unsafe { &*(v as *const ByteSpan) };
        // SAFETY: XLA's span: `len` bytes at `ptr`, alive for the call.
        let bytes = if s.len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) } };
        return std::str::from_utf8(bytes).map_err(|_| invalid(format!("attribute `{name}` is not UTF-8")));
    }
    Ok("")
}

/// One of XLA's buffers: its dtype, dimensions and bytes.
struct Raw {
    dtype: i32,
    dims: Vec<usize>,
    data: *mut u8,
}

unsafe fn buffers(b: &Buffers, what: &str) -> Result<Vec<Raw>, Failure> {
    (0..b.size.max(0) as usize)
        .map(|i| {
            // SAFETY: `size` entries; each a buffer, checked by its type.
            unsafe {
                if *b.types.add(i) != BUFFER {
                    return Err(invalid(format!("{what} {i} is not a buffer")));
                }
                let buf = &**b.buffers.add(i);
                let dims = if buf.rank == 0 { &[][..] } else { std::slice::from_raw_parts(buf.dims, buf.rank as usize) };
                Ok(Raw { dtype: buf.dtype, dims: dims.iter().map(|&d| d.max(0) as usize).collect(), data: buf.data as *mut u8 })
            }
        })
        .collect()
}

/// How many launches `raws` hold for arguments of `decl` types: the product of the leading
/// dimensions each has beyond its declared rank, the same for all.
fn batch(
    what: &str,
    raws: &[Raw],
    decl: &[(String, Type)],
    kernel: &str,
    batch: &mut Option<(Vec<usize>, String)>,
) -> Result<(), Failure> {
    for (raw, (name, ty)) in raws.iter().zip(decl) {
        let dtype = c_api::dtype(raw.dtype);
        // A 0-d array is a kernel's array of one element (`tessel.pallas` declares a 0-d output
        // so): the same bytes.
        let dims = if raw.dims.is_empty() && ty.shape == [1] { vec![1] } else { raw.dims.clone() };
        let lead = dims.len().checked_sub(ty.shape.len());
        let ok = dtype == Some(ty.dtype) && lead.is_some_and(|l| dims[l..] == ty.shape[..]);
        if !ok {
            let got = dtype.map_or_else(|| format!("XLA dtype {}", raw.dtype), |d| d.name().to_string());
            let dims: Vec<String> = raw.dims.iter().map(usize::to_string).collect();
            return Err(invalid(format!(
                "{what} `{name}` of kernel `{kernel}` is {got}[{}], but the kernel declares {ty}\n  trace the call again (tessel.jax.call specializes the kernel for its arrays)",
                dims.join(", ")
            )));
        }
        let lead = dims[..lead.unwrap_or(0)].to_vec();
        match batch {
            None => *batch = Some((lead, name.clone())),
            Some((b, first)) if *b != lead => {
                return Err(invalid(format!(
                    "`{name}` of kernel `{kernel}` is batched as {lead:?} but `{first}` as {b:?}\n  give every array the same leading (batch) dimensions"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn bytes_of(ty: &Type) -> usize {
    ty.dtype.bits().div_ceil(8) as usize * ty.numel()
}

unsafe fn handle(frame: *mut CallFrame, platform: Platform) -> Result<(), Failure> {
    // A frame too old (small) to hold every field the handler reads (up to `attrs`; `future`
    // is newer than some jaxlibs, and unread) would be read past its end: refuse it before
    // reading anything after its size. SAFETY: every XLA call frame starts with its size.
    let size = unsafe { (*frame).struct_size };
    let read = std::mem::offset_of!(CallFrame, future);
    if size < read {
        return Err(invalid(format!(
            "XLA's FFI call frame is {size} bytes, older than the {read} this handler reads\n  use a jax and jaxlib of version 0.8 or newer"
        )));
    }
    // SAFETY: XLA's frame.
    if unsafe { metadata(frame) } {
        return Ok(());
    }
    // SAFETY: XLA's frame, at least as large as the struct read (checked above).
    let frame = unsafe { &*frame };
    if frame.stage != STAGE_EXECUTE {
        return Ok(());
    }
    CALLS.fetch_add(1, Ordering::Relaxed);
    let _in_flight = InFlight::enter();
    // SAFETY: the frame's attributes, as XLA lays them out for this call.
    let (text, backend, mesh, externals, keep) = unsafe {
        (
            string_attr(frame, "text")?,
            string_attr(frame, "backend")?,
            string_attr(frame, "mesh")?,
            string_attr(frame, "externals")?,
            string_attr(frame, "keep")?,
        )
    };
    if text.is_empty() {
        return Err(invalid("the custom call has no `text` attribute (the kernel)\n  call kernels through tessel.jax.call or tessel.pallas.install".into()));
    }
    let backend = if backend.is_empty() { "auto" } else { backend };
    let rt = crate::runtime(backend)?;
    let p = prepared(&rt, text, backend, mesh, externals)?;
    let name = p.kernel.name();
    let kept = kept_outputs(keep, &p)?;
    // SAFETY: the frame's operand and result lists, as XLA lays them out for this call.
    let (mut ins, outs) = unsafe { (buffers(&frame.args, "operand")?, buffers(&frame.rets, "result")?) };
    if ins.len() != p.inputs.len() + kept.len() || outs.len() != p.outputs.len() {
        return Err(invalid(format!(
            "kernel `{name}` takes {} inputs{} and {} outputs; the custom call has {} operands and {} results",
            p.inputs.len(),
            if kept.is_empty() { String::new() } else { format!(" and {} aliased operands", kept.len()) },
            p.outputs.len(),
            ins.len(),
            outs.len()
        )));
    }
    // The aliased operands are the kept outputs' own buffers (XLA's `operand_output_aliases`):
    // never read as inputs, so that no slice of them is made beside the output's.
    ins.truncate(p.inputs.len());
    let mut lead = None;
    batch("input", &ins, &p.inputs, name, &mut lead)?;
    batch("output", &outs, &p.outputs, name, &mut lead)?;
    let count: usize = lead.map_or(1, |(b, _)| b.iter().product());
    // A batch (`vmap`) is one launch of the kernel batched over a new grid axis where it can be,
    // else one launch per element on that element's slice of each buffer.
    let batched = if count > 1 { p.batched(&rt, count) } else { None };
    let (plan, launches, per): (&Plan, usize, usize) = match &batched {
        Some(b) => (b, 1, count),
        None => (&p.plan, count, 1),
    };
    let planned = rt.resume(plan.clone())?;
    let batch = Batch { per, launches };
    match platform {
        Platform::Host => {
            // Under a token Ctrl-C cancels (`sigint`): the launch stops, XLA raises its error.
            let token = tessel_plugin_api::cancel::Token::new();
            let _watched = sigint::watch(&token);
            token.scope(|| {
                for n in 0..launches {
                    // SAFETY: XLA's host buffers, as `launch_host` needs them.
                    unsafe { launch_host(&planned, &p, &batch, &ins, &outs, &kept, n)? };
                }
                Ok::<(), Failure>(())
            })?;
        }
        // SAFETY: XLA's device buffers and its call frame (for the stream).
        Platform::Cuda => unsafe { cuda::launch(frame, &planned, &p, &batch, &ins, &outs, &kept)? },
    }
    count_launches(p.plan.backend(), launches as u64);
    Ok(())
}

/// How a call's batch (`vmap`) runs: `launches` launches, each on `per` elements (the kernel
/// batched over a grid axis: one launch).
struct Batch {
    per: usize,
    launches: usize,
}

impl Batch {
    /// An argument of type `ty` as one launch sees it: with a leading batch axis where the
    /// launch runs several elements.
    fn ty(&self, ty: &Type) -> Type {
        let batch = std::iter::repeat_n(self.per, (self.per > 1) as usize);
        Type { dtype: ty.dtype, shape: batch.chain(ty.shape.iter().copied()).collect() }
    }

    /// Bytes of one launch's part of an argument of type `ty`.
    fn bytes(&self, ty: &Type) -> usize {
        bytes_of(ty) * self.per
    }
}

/// Launch `n` of a call on the host: element `n`'s slice of each of XLA's buffers, in place.
///
/// # Safety
/// `ins` and `outs` are XLA's host buffers for the call, checked against `p`'s arguments.
unsafe fn launch_host(
    planned: &tessel::Planned<'_>,
    p: &Prepared,
    batch: &Batch,
    ins: &[Raw],
    outs: &[Raw],
    kept: &BTreeSet<String>,
    n: usize,
) -> Result<(), Failure> {
    let mut args = InPlace::default();
    for (raw, (arg, ty)) in ins.iter().zip(&p.inputs) {
        let len = batch.bytes(ty);
        // SAFETY: XLA's buffer holds the call's elements of the declared type, alive for the
        // call, which are `batch.launches` runs of `len` bytes; XLA does not write an operand
        // during the call.
        let bytes = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(raw.data.add(n * len), len) } };
        args.inputs.insert(arg.clone(), BytesRef { ty: batch.ty(ty), bytes });
    }
    for (raw, (arg, ty)) in outs.iter().zip(&p.outputs) {
        let len = batch.bytes(ty);
        let bytes = if len == 0 {
            &mut [][..]
        } else {
            // SAFETY: a result buffer of the call, as above, that nothing else reads or writes
            // during the call: an operand XLA aliases to it (a kept output's) is not read.
            unsafe { std::slice::from_raw_parts_mut(raw.data.add(n * len), len) }
        };
        args.outputs.insert(arg.clone(), BytesMut { ty: batch.ty(ty), bytes, keep: kept.contains(arg) });
    }
    planned.launch_in_place(&mut args)?;
    Ok(())
}

/// The outputs named by the call's `keep` attribute (comma-separated): those XLA aliases to the
/// operands after the kernel's inputs, whose buffers hold their starting contents (Pallas's
/// `input_output_aliases`, language §3's outputs that do not start as zeros).
fn kept_outputs(keep: &str, p: &Prepared) -> Result<BTreeSet<String>, Failure> {
    let kept: BTreeSet<String> = keep.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect();
    if let Some(k) = kept.iter().find(|k| !p.outputs.iter().any(|(n, _)| n == *k)) {
        return Err(invalid(format!(
            "the custom call keeps the contents of `{k}`, which is not an output of kernel `{}`\n  its outputs are: {}",
            p.kernel.name(),
            p.outputs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(kept)
}

/// Counts `n` launches on `backend`.
fn count_launches(backend: &str, n: u64) {
    let mut l = locked(&LAUNCHES);
    match l.iter_mut().find(|(b, _)| b == backend) {
        Some((_, c)) => *c += n,
        None => l.push((backend.to_string(), n)),
    }
}

/// The handler's address, for a capsule.
pub fn handler() -> *mut c_void {
    tessel_call as *mut c_void
}

/// The CUDA handler's address.
pub fn cuda_handler() -> *mut c_void {
    tessel_call_cuda as *mut c_void
}

/// The empty handler's address.
pub fn empty_handler() -> *mut c_void {
    empty_call as *mut c_void
}
