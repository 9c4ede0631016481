//! The device, through cudarc's driver API (loaded at run time). Nothing here runs unless the
//! CUDA driver library exists: cudarc panics when it is missing, so the check comes first and
//! every first contact with the driver runs under `catch_unwind`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use tessel_plugin_api::abi::{BackendError, ErrorKind};
use tessel_plugin_api::array::HostArray;
use tessel_plugin_api::backend::Memory;
use tessel_plugin_api::cancel;
use tessel_plugin_api::ir::{ParamKind, Type};
use tessel_plugin_api::kept::Kept;

use crate::emit;
use crate::error::Refusal;
use crate::limits::DEFAULT_SHARED_BYTES;
use crate::lower::KernelPlan;
use crate::wgmma::Schedule;

/// Loaded functions kept.
const FUNCTIONS_KEPT: usize = 256;

/// A device buffer: 2 bytes an element for 16-bit floats, else 4 (`bool` as 0 or 1).
pub struct DeviceBuffer {
    /// Its type.
    pub ty: Type,
    data: CudaSlice<u8>,
}

/// Bytes of one element of `ty` in a device buffer (as the PTX addresses arrays).
pub(crate) fn element_bytes(ty: &Type) -> usize {
    emit::element_bytes(ty.dtype)
}

/// A `CUtensorMap` passed by value as a kernel parameter (`.param .align 64 .b8 NAME[128]`).
#[repr(transparent)]
struct TensorMapArg(sys::CUtensorMap);

// SAFETY: a `CUtensorMap` is 128 plain bytes the driver reads as the parameter's value.
#[allow(unsafe_code, reason = "a kernel parameter type")]
unsafe impl DeviceRepr for TensorMapArg {}

/// One GPU: its (primary) context and the functions loaded into it so far, by PTX text.
pub struct Device {
    ctx: Arc<CudaContext>,
    /// Loaded functions, by their PTX (at most [`FUNCTIONS_KEPT`]; modules stay loaded by their
    /// functions still in use).
    functions: Kept<String, CudaFunction>,
    /// "NVIDIA H200, compute capability 9.0".
    pub description: String,
    /// The most dynamic shared memory a CTA may opt into, in bytes.
    max_shared: u64,
    /// Its multiprocessors: a persistent grid's CTAs.
    sms: u64,
}

/// The device tessel launches on by itself (the first), with a stream of its own.
pub struct Gpu {
    device: Arc<Device>,
    stream: Arc<CudaStream>,
    /// "NVIDIA H200, compute capability 9.0".
    pub description: String,
}

pub(crate) fn device_error(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::new(ErrorKind::Device, format!("CUDA {what} failed: {e}"))
}

/// Whether the platform loader can open the CUDA driver library.
fn driver_library_present() -> bool {
    ["libcuda.so.1", "libcuda.so", "nvcuda.dll"].iter().any(|name| {
        // SAFETY: loading the CUDA driver library runs its initialisers, which is what any CUDA
        // program does; the handle is dropped at once (cudarc loads it again for its own use).
        #[allow(unsafe_code, reason = "probing for a shared library")]
        unsafe {
            libloading::Library::new(*name).is_ok()
        }
    })
}

/// Device `ordinal`'s primary context (the one CUDA's runtime API, and so XLA, uses), checked
/// to be a Hopper.
fn open(ordinal: usize) -> Result<Device, String> {
    if !driver_library_present() {
        return Err("no CUDA driver library (libcuda.so.1) on this machine".into());
    }
    let ctx = match catch_unwind(AssertUnwindSafe(|| CudaContext::new(ordinal))) {
        Ok(Ok(ctx)) => ctx,
        Ok(Err(e)) => return Err(format!("no device: {e}")),
        Err(_) => return Err("the CUDA driver failed to start".into()),
    };
    let attr = |a| ctx.attribute(a).map_err(|e| format!("cannot query the device: {e}"));
    let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let name = ctx.name().unwrap_or_else(|_| "an NVIDIA GPU".into());
    if major < 9 {
        return Err(format!("{name} has compute capability {major}.{minor}, which is below 9.0 (sm_90a PTX needs Hopper)"));
    }
    let max_shared = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(Device {
        max_shared: u64::try_from(max_shared).unwrap_or(0),
        sms: u64::try_from(sms).unwrap_or(1),
        ctx,
        functions: Kept::new(FUNCTIONS_KEPT),
        description: format!("{name}, compute capability {major}.{minor}"),
    })
}

/// Device `ordinal`, opened once per process (or the reason it cannot be, kept too).
pub fn device(ordinal: usize) -> Result<Arc<Device>, String> {
    static DEVICES: Mutex<Vec<(usize, Result<Arc<Device>, String>)>> = Mutex::new(Vec::new());
    let mut opened = DEVICES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, d)) = opened.iter().find(|(o, _)| *o == ordinal) {
        return d.clone();
    }
    let d = open(ordinal).map(Arc::new);
    opened.push((ordinal, d.clone()));
    d
}

/// The GPU, opened once per process.
pub fn gpu() -> Result<&'static Gpu, String> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        let device = device(0)?;
        Ok(Gpu { stream: device.ctx.default_stream(), description: device.description.clone(), device })
    })
    .as_ref()
    .map_err(Clone::clone)
}

pub(crate) fn unavailable(why: String) -> BackendError {
    BackendError::new(
        ErrorKind::Unavailable,
        format!("the Mosaic GPU backend is unavailable: {why}\n  run on wgpu or interpret instead (--backend auto picks one)"),
    )
}

impl Memory for Gpu {
    type Buffer = DeviceBuffer;

    /// A zeroed buffer.
    fn alloc(&self, ty: &Type) -> Result<DeviceBuffer, BackendError> {
        let bytes = ty.numel().max(1) * element_bytes(ty);
        let data = self.stream.alloc_zeros::<u8>(bytes).map_err(|e| device_error("alloc", e))?;
        Ok(DeviceBuffer { ty: ty.clone(), data })
    }

    fn type_of(&self, b: &DeviceBuffer) -> Type {
        b.ty.clone()
    }

    /// Host to device.
    fn upload(&self, b: &mut DeviceBuffer, a: HostArray) -> Result<(), BackendError> {
        let width = element_bytes(&b.ty);
        let bytes: Vec<u8> = a.to_bits().iter().flat_map(|&x| x.to_le_bytes().into_iter().take(width)).collect();
        self.stream.memcpy_htod(&bytes, &mut b.data).map_err(|e| device_error("upload", e))
    }

    /// Device to host.
    fn download<'b>(&self, b: &'b DeviceBuffer) -> Result<Cow<'b, HostArray>, BackendError> {
        let bytes = self.stream.clone_dtoh(&b.data).map_err(|e| device_error("download", e))?;
        let width = element_bytes(&b.ty);
        let mut bits: Vec<u32> =
            bytes.chunks_exact(width).map(|c| c.iter().rev().fold(0, |acc, &x| (acc << 8) | u32::from(x))).collect();
        bits.truncate(b.ty.numel());
        Ok(Cow::Owned(HostArray::from_bits(b.ty.dtype, &b.ty.shape, bits)))
    }
}

impl Gpu {
    /// Runs one planned kernel on bound buffers and waits for it.
    pub fn launch(&self, plan: &KernelPlan, ptx: &str, buffers: &HashMap<String, DeviceBuffer>) -> Result<(), BackendError> {
        let k = plan.kernel.kernel();
        let mut args = BTreeMap::new();
        // The buffers' pointers, each with the guard that orders its later use after this launch.
        let mut guards = Vec::new();
        for p in k.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
            let buf = buffers.get(&p.name).ok_or_else(|| {
                BackendError::new(ErrorKind::InvalidInput, format!("argument `{}` is not bound to a buffer", p.name))
            })?;
            if buf.ty != p.ty {
                return Err(BackendError::new(
                    ErrorKind::InvalidInput,
                    format!("argument `{}` is {}, but its buffer holds {}", p.name, p.ty, buf.ty),
                ));
            }
            let (ptr, guard) = buf.data.device_ptr(&self.stream);
            args.insert(p.name.clone(), ptr);
            guards.push(guard);
        }
        // SAFETY: each pointer is a live buffer of this device holding its argument's type
        // (checked above), kept alive past the launch, which is waited for below.
        #[allow(unsafe_code, reason = "launching on our own buffers")]
        unsafe {
            self.device.enqueue(&self.stream, plan, ptx, &args)?;
        }
        drop(guards);
        self.wait()
    }

    /// Waits for the work enqueued so far. Under a cancellation token
    /// ([`tessel_plugin_api::cancel`]: the Python module's, on Ctrl-C) it asks an event recorded
    /// after the work ([`cancel::wait_until`]) and, once the token is cancelled, stops waiting and
    /// fails: the device finishes the kernel on its own, and everything after it on the stream
    /// (freeing the buffers, the next launch) is ordered behind it.
    fn wait(&self) -> Result<(), BackendError> {
        let Some(token) = cancel::current() else {
            return self.stream.synchronize().map_err(|e| device_error("kernel run", e));
        };
        let done = self.stream.record_event(None).map_err(|e| device_error("recording the kernel's end", e))?;
        match cancel::wait_until(Some(&token), || done.try_is_complete()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(cancel::cancelled()),
            Err(e) => Err(device_error("kernel run", e)),
        }
    }
}

impl Device {
    /// A stream another runtime owns (XLA's), belonging to this device's primary context.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of this device's primary context, alive while the result is.
    #[allow(unsafe_code, reason = "wrapping a foreign stream")]
    pub unsafe fn borrow_stream(&self, stream: sys::CUstream) -> Arc<CudaStream> {
        // SAFETY: as the caller promises; dropping the wrapper leaves the stream alone.
        unsafe { self.ctx.wrap_borrowed_stream(stream) }
    }

    fn function(&self, plan: &KernelPlan, ptx: &str) -> Result<CudaFunction, BackendError> {
        if let Some(f) = self.functions.get(ptx) {
            return Ok(f);
        }
        let f = self.load(plan, ptx)?;
        self.functions.insert(ptx.to_string(), f.clone());
        Ok(f)
    }

    /// The function of `ptx`, loaded and checked.
    fn load(&self, plan: &KernelPlan, ptx: &str) -> Result<CudaFunction, BackendError> {
        let module =
            self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| device_error("module load (PTX JIT)", e))?;
        let f = module.load_function(&plan.entry).map_err(|e| device_error("function lookup", e))?;
        if plan.shared_bytes() > self.max_shared {
            return Err(Refusal::SharedMemory {
                kernel: plan.kernel.name().to_string(),
                bytes: plan.shared_bytes(),
                device: self.description.clone(),
                limit: self.max_shared,
            }
            .into());
        }
        // A warp-specialized kernel moves registers between its warpgroups (`setmaxnreg`) out
        // of the pool its CTA starts with: the driver's compiler must have kept the `.maxnreg`
        // count at entry, or a consumer's `setmaxnreg.inc` could wait forever.
        if let Some(entry) = plan.entry_registers() {
            let regs = f.num_regs().map_err(|e| device_error("reading the register count", e))?;
            if u32::try_from(regs).ok() != Some(entry) {
                return Err(BackendError::new(
                    ErrorKind::Device,
                    format!(
                        "the driver compiled kernel `{}` (warp-specialized) at {regs} registers a thread, not the {entry} its warpgroups divide with setmaxnreg\n  run it on the {} schedule (TESSEL_MOSAIC_SCHEDULE={}, or unset)",
                        plan.kernel.name(),
                        Schedule::default().name(),
                        Schedule::default().name()
                    ),
                ));
            }
        }
        if plan.shared_bytes() > DEFAULT_SHARED_BYTES {
            let bytes = i32::try_from(plan.shared_bytes()).unwrap_or(i32::MAX);
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
                .map_err(|e| device_error("opting into shared memory", e))?;
        }
        Ok(f)
    }

    /// Enqueues one planned kernel on `stream`, its `in` and `out` arguments at the device
    /// addresses `args` gives by name; waits for nothing.
    ///
    /// # Safety
    /// `stream` belongs to this device's context; each address is device memory of this device
    /// holding its argument's type as the PTX addresses it (2 bytes an element for 16-bit
    /// floats, else 4), alive and not written by anyone else until the work on `stream` is done.
    #[allow(unsafe_code, reason = "launching a kernel")]
    pub unsafe fn enqueue(
        &self,
        stream: &Arc<CudaStream>,
        plan: &KernelPlan,
        ptx: &str,
        args: &BTreeMap<String, u64>,
    ) -> Result<(), BackendError> {
        let f = self.function(plan, ptx)?;
        // Freed when dropped, after the launch, in the stream's order.
        let workspace = match plan.global_workspace_bytes() {
            0 => None,
            n => Some(stream.alloc_zeros::<u8>(n as usize).map_err(|e| device_error("workspace alloc", e))?),
        };
        let k = plan.kernel.kernel();
        let ptrs = k
            .params
            .iter()
            .filter(|p| p.kind != ParamKind::Scratch)
            .map(|p| {
                args.get(&p.name).copied().ok_or_else(|| {
                    BackendError::new(ErrorKind::InvalidInput, format!("argument `{}` is not bound to a buffer", p.name))
                })
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let maps = tensor_maps(plan, args)?;
        let mut b = stream.launch_builder(&f);
        if let Some(w) = &workspace {
            b.arg(w);
        }
        for p in &ptrs {
            b.arg(p);
        }
        for m in &maps {
            b.arg(m);
        }
        let cfg = LaunchConfig {
            grid_dim: (plan.launch_ctas(self.sms) as u32, 1, 1),
            block_dim: (plan.threads(), 1, 1),
            shared_mem_bytes: plan.shared_bytes() as u32,
        };
        // SAFETY: the arguments are the workspace (when global) and one device address per
        // `in`/`out` argument, in the order and of the types of the entry's parameters
        // (emit.rs), valid as the caller promises; the dynamic shared memory is the plan's;
        // every access the kernel makes is bounds-checked against the declared array shapes.
        unsafe { b.launch(cfg) }.map_err(|e| device_error("launch", e))?;
        Ok(())
    }
}

/// The tensor maps of the plan's operands (the Hopper paths', `crate::wgmma`, and the concurrent
/// model's copies, `crate::tma`): of the array's rank (1 to 5), its dtype, the plan's boxes and swizzle, zeros
/// outside the array; `args` gives each array's address.
fn tensor_maps(plan: &KernelPlan, args: &BTreeMap<String, u64>) -> Result<Vec<TensorMapArg>, BackendError> {
    use sys::{
        CUtensorMapDataType as T, CUtensorMapFloatOOBfill as Fill, CUtensorMapInterleave as Interleave,
        CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Swizzle,
    };
    use tessel_plugin_api::ir::DType;
    plan.tensor_maps()
        .iter()
        .map(|m| {
            let missing = || BackendError::new(ErrorKind::Internal, format!("the tensor map's array `{}` is not bound", m.array));
            let ty = &plan.kernel.kernel().params.iter().find(|p| p.name == m.array).ok_or_else(missing)?.ty;
            let ptr = *args.get(&m.array).ok_or_else(missing)?;
            // The contiguous dimension first; bytes from one element to the next along the others.
            let dims: Vec<u64> = ty.shape.iter().rev().map(|&n| n as u64).collect();
            let elem = crate::limits::element_bytes(ty.dtype) as u64;
            let strides: Vec<u64> = (1..dims.len()).map(|d| dims[..d].iter().product::<u64>() * elem).collect();
            if dims.len() != m.boxes.len() || !(1..=5).contains(&dims.len()) {
                return Err(BackendError::new(
                    ErrorKind::Internal,
                    format!("the tensor map of `{}` has boxes of another rank", m.array),
                ));
            }
            let dtype = match ty.dtype {
                DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                DType::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
                DType::U32 | DType::Bool => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
                DType::I16 | DType::U16 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                DType::I8 | DType::U8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            };
            let swizzle = match m.swizzle {
                0 => Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
                32 => Swizzle::CU_TENSOR_MAP_SWIZZLE_32B,
                64 => Swizzle::CU_TENSOR_MAP_SWIZZLE_64B,
                _ => Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            };
            let element_strides = vec![1u32; dims.len()];
            let mut map = sys::CUtensorMap { opaque: [0; 16] };
            // SAFETY: every pointer is to a live array of the rank the call is given (checked
            // above), or of rank - 1 for the strides; the global address is the array's.
            #[allow(unsafe_code, reason = "encoding a tensor map")]
            let r = unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    dtype,
                    dims.len() as u32,
                    ptr as *mut std::ffi::c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    m.boxes.as_ptr(),
                    element_strides.as_ptr(),
                    Interleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    swizzle,
                    L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    Fill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            };
            r.result().map_err(|e| device_error(&format!("encoding the tensor map of `{}`", m.array), e))?;
            Ok(TensorMapArg(map))
        })
        .collect()
}

/// The GPU or the reason there is none, as a launch error.
pub fn require() -> Result<&'static Gpu, BackendError> {
    gpu().map_err(unavailable)
}
