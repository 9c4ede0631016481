//! Launches on memory and a stream that another runtime owns: XLA's, when a kernel runs inside
//! `jax.jit` on a GPU (the Python module's CUDA FFI handler calls `Planned::launch_external`, and
//! the backend's `run_external` enqueues each kernel here). The arrays are device addresses, the
//! work is enqueued on the caller's stream, and nothing is copied or waited for: the order of
//! the caller's stream is the only order. The copies a caller makes to stage arrays through host
//! memory instead (a launch on another backend) are here too.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use tessel_plugin_api::abi::{BackendError, ErrorKind};
use tessel_plugin_api::ir::{DType, ParamKind, Verified, analysis};
use tessel_plugin_api::launch::resolve_grid;

use crate::emit;
use crate::lower::KernelPlan;
use crate::runtime::{self, Device, device_error, unavailable};

/// A kernel planned and lowered to PTX, ready to enqueue on any stream of a Hopper device: what
/// the backend's compiled launch holds for each of its kernels.
pub struct Compiled {
    pub(crate) plan: KernelPlan,
    pub(crate) ptx: String,
    /// Outputs some element of which the kernel may leave unwritten, with their bytes: zeroed
    /// before each launch on another runtime's memory, since outputs start as zeros (language
    /// §3) and XLA's do not.
    zeroed: Vec<(String, usize)>,
}

/// The driver library and a Hopper at ordinal 0, before any driver call: cudarc panics without
/// the library.
fn driver() -> Result<(), BackendError> {
    runtime::gpu().map(|_| ()).map_err(unavailable)
}

/// The device whose context `stream` belongs to (a null stream: the thread's current context).
fn device_of(stream: sys::CUstream) -> Result<Arc<Device>, BackendError> {
    driver()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-parameters of the driver; `stream` is the caller's live stream.
    #[allow(unsafe_code, reason = "asking the driver which device a stream is on")]
    unsafe {
        let r = if stream.is_null() { sys::cuCtxGetCurrent(&mut ctx) } else { sys::cuStreamGetCtx(stream, &mut ctx) };
        r.result().map_err(|e| device_error("finding the stream's context", e))?;
        let r = sys::cuCtxPushCurrent_v2(ctx);
        r.result().map_err(|e| device_error("entering the stream's context", e))?;
        let r = sys::cuCtxGetDevice(&mut dev);
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        let _ = sys::cuCtxPopCurrent_v2(&mut popped);
        r.result().map_err(|e| device_error("finding the stream's device", e))?;
    }
    runtime::device(usize::try_from(dev).unwrap_or(0)).map_err(unavailable)
}

impl Compiled {
    /// `plan` lowered to PTX. No device.
    pub(crate) fn new(plan: KernelPlan) -> Result<Compiled, BackendError> {
        let ptx = emit::emit(&plan);
        let grid = resolve_grid(&plan.kernel, &BTreeMap::new())
            .map_err(|e| BackendError::new(ErrorKind::InvalidInput, e.to_string()))?;
        let k = plan.kernel.kernel();
        let zeroed = k
            .params_of(ParamKind::Out)
            .filter(|p| !analysis::fully_written(k, &grid, p))
            .map(|p| (p.name.clone(), p.ty.numel() * runtime::element_bytes(&p.ty)))
            .collect();
        Ok(Compiled { plan, ptx, zeroed })
    }

    /// The kernel as planned (its grid includes its mesh's axes).
    pub fn kernel(&self) -> &Verified {
        &self.plan.kernel
    }

    /// The PTX.
    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// The outputs zeroed before each launch, with their bytes: those the kernel may leave partly
    /// unwritten (outputs start as zeros, language §3, and XLA's buffers do not), except the
    /// `kept` ones, which start from what their memory holds (an aliased input's values).
    pub(crate) fn to_zero<'a>(&'a self, kept: &'a BTreeSet<String>) -> impl Iterator<Item = (&'a str, usize)> + 'a {
        self.zeroed.iter().filter(|(n, _)| !kept.contains(n)).map(|(n, b)| (n.as_str(), *b))
    }

    /// Why the kernel cannot run on another runtime's memory, if it cannot: a `bool` array
    /// (`Unsupported`: the PTX holds 4 bytes a `bool`, XLA 1; the caller stages it through host
    /// memory).
    pub(crate) fn external_refusal(&self) -> Option<BackendError> {
        let k = self.plan.kernel.kernel();
        let p = k.params.iter().find(|p| p.kind != ParamKind::Scratch && p.ty.dtype == DType::Bool)?;
        Some(BackendError::new(
            ErrorKind::Unsupported,
            format!(
                "kernel `{}` has a bool array (`{}`): the PTX holds 4 bytes an element, another runtime's memory 1",
                k.name, p.name
            ),
        ))
    }

    /// Enqueues the kernel on `stream`, its `in` and `out` arguments at the device addresses
    /// `args` gives by name, the outputs in `kept` left as they are. Returns once it is enqueued.
    /// A kernel with `bool` arrays is refused (`Unsupported`: the caller stages it through host
    /// memory): the PTX holds 4 bytes a `bool`, XLA 1.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of a device's primary context (XLA's streams are); each
    /// address is memory of that device holding its argument's declared type, 2 bytes an element
    /// for 16-bit floats and 4 for 32-bit types, not written by anyone else until the work
    /// enqueued on `stream` is done.
    #[allow(unsafe_code, reason = "launching on a foreign stream")]
    pub(crate) unsafe fn enqueue(
        &self,
        stream: *mut c_void,
        args: &BTreeMap<String, u64>,
        kept: &BTreeSet<String>,
    ) -> Result<(), BackendError> {
        if let Some(refused) = self.external_refusal() {
            return Err(refused);
        }
        let stream = stream as sys::CUstream;
        let device = device_of(stream)?;
        for (name, bytes) in self.to_zero(kept) {
            let Some(&at) = args.get(name) else { continue };
            // SAFETY: the output's memory, `bytes` long, as the caller promises.
            unsafe { sys::cuMemsetD8Async(at, 0, bytes, stream) }.result().map_err(|e| device_error("zeroing an output", e))?;
        }
        // SAFETY: as the caller promises.
        unsafe {
            let s = device.borrow_stream(stream);
            device.enqueue(&s, &self.plan, &self.ptx, args)
        }
    }
}

/// Copies `bytes.len()` bytes from device address `from` into `bytes` in `stream`'s order, and
/// waits for them.
///
/// # Safety
/// As [`Compiled::enqueue`]: `from` holds that many bytes, on the device of `stream`.
#[allow(unsafe_code, reason = "copying from a foreign buffer")]
pub unsafe fn copy_to_host(stream: *mut c_void, from: u64, bytes: &mut [u8]) -> Result<(), BackendError> {
    let stream = stream as sys::CUstream;
    driver()?;
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: as the caller promises; the copy is waited for before `bytes` is given back.
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(bytes.as_mut_ptr().cast(), from, bytes.len(), stream)
            .result()
            .map_err(|e| device_error("copy to the host", e))?;
        sys::cuStreamSynchronize(stream).result().map_err(|e| device_error("waiting for a copy", e))
    }
}

/// Copies `bytes` to device address `to` in `stream`'s order, and waits for them.
///
/// # Safety
/// As [`copy_to_host`], for `to`.
#[allow(unsafe_code, reason = "copying into a foreign buffer")]
pub unsafe fn copy_to_device(stream: *mut c_void, to: u64, bytes: &[u8]) -> Result<(), BackendError> {
    let stream = stream as sys::CUstream;
    driver()?;
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: as the caller promises; the copy is waited for before `bytes` may be dropped.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(to, bytes.as_ptr().cast(), bytes.len(), stream)
            .result()
            .map_err(|e| device_error("copy to the device", e))?;
        sys::cuStreamSynchronize(stream).result().map_err(|e| device_error("waiting for a copy", e))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use tessel_plugin_api::backend::{Call, Compiler, Request};
    use tessel_plugin_api::ir;

    /// `o` is stored in its first half only (a masked store); `p` whole.
    const PARTLY: &str = "kernel partly
  grid (i: 2)
  in  x: f32[256] block [128] at (i)
  out o: f32[256] block [128] at (i)
  out p: f32[256] block [128] at (i)
{
  %x = load x
  %n = iota 0 : i32[128]
  %m = lt %n, 64
  store o, %x mask %m
  store p, %x
}
";

    #[test]
    fn outputs_left_partly_unwritten_are_zeroed_unless_kept() {
        let kernel = ir::parse(PARTLY).expect("parses").kernels.remove(0);
        let launch = Request::new(vec![Call { kernel: Arc::new(kernel), mesh: None }], Vec::new(), Default::default());
        let compiler = crate::MosaicGpu::new();
        let c = compiler.compile(&launch, compiler.plan(&launch).expect("plans")).expect("lowers").remove(0);
        let zeroed = |kept: &[&str]| {
            let kept: BTreeSet<String> = kept.iter().map(|s| s.to_string()).collect();
            c.to_zero(&kept).map(|(n, b)| (n.to_string(), b)).collect::<Vec<_>>()
        };
        // Outputs start as zeros: `o`'s unstored half must be zeroed in XLA's buffer; `p` is
        // stored whole.
        assert_eq!(zeroed(&[]), [("o".to_string(), 256 * 4)]);
        // Kept (aliased to an input), `o` starts from what its buffer holds: nothing zeroes it.
        assert_eq!(zeroed(&["o"]), []);
    }
}
