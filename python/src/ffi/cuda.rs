//! `tessel_call` on the CUDA platform: XLA hands the handler device buffers and its stream.
//!
//! A launch is first offered to its backend on XLA's stream with the buffers' device addresses
//! (`Planned::launch_external`, the counted path every launch takes: the plan and the compiled
//! kernel come from the backend's caches): mosaic-gpu enqueues it there, nothing copied and
//! nothing waited for, so the kernel takes its place in XLA's order like any of XLA's own. A
//! backend that does not launch so (`backend="interpret"` or `"wgpu"`, or `auto` where mosaic-gpu
//! refused the kernel; mosaic-gpu itself for a kernel with `bool` arrays, 1 byte an element in
//! XLA's buffers and 4 in the PTX) answers `Unsupported`, remembered for the prepared launch, and
//! the call runs through host memory instead: its operands are copied out, it runs in place on
//! the copies, and its results are copied back, each copy in the stream's order. That is correct
//! but waits for the stream; `tessel.jax.stats()["staged"]` counts such calls.

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use tessel_mosaic_gpu::external;
use tessel_plugin_api::abi::{DeviceArg, ErrorKind};

use super::c_api::*;
use super::{Batch, Failure, INTERNAL, Prepared, Raw, launch_host};

/// Calls that ran through host memory.
pub static STAGED: AtomicU64 = AtomicU64::new(0);

/// A failure of the CUDA copies as tessel reports it.
fn copy_error(e: tessel_plugin_api::abi::BackendError) -> Failure {
    Failure::from(tessel::Error::Backend {
        backend: tessel_mosaic_gpu::NAME.to_string(),
        kind: e.kind,
        message: e.message.into_string(),
    })
}

/// XLA's stream for this call (a `CUstream`).
///
/// # Safety
/// `frame` is XLA's call frame, whose API table and execution context are live.
unsafe fn stream(frame: &CallFrame) -> Result<*mut c_void, Failure> {
    let failure = |why: &str| Failure { code: INTERNAL, message: format!("tessel_call: XLA gave no CUDA stream: {why}") };
    // SAFETY: XLA's API table, which holds `XLA_FFI_Stream_Get` since API version 0.1.
    let get = unsafe { (*frame.api).stream_get }.ok_or_else(|| failure("its API has no XLA_FFI_Stream_Get"))?;
    let mut args = StreamGetArgs {
        struct_size: std::mem::size_of::<StreamGetArgs>(),
        extension_start: std::ptr::null_mut(),
        ctx: frame.ctx,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: the arguments XLA_FFI_Stream_Get takes, with the call's context.
    let err = unsafe { get(&mut args) };
    if !err.is_null() {
        return Err(failure("XLA_FFI_Stream_Get failed"));
    }
    Ok(args.stream)
}

/// The call's launches on XLA's device buffers `ins` and `outs`, in XLA's stream.
///
/// # Safety
/// `frame` is XLA's call frame for this call on the CUDA platform; `ins` and `outs` are its
/// device buffers, checked against `p`'s arguments.
pub(super) unsafe fn launch(
    frame: &CallFrame,
    planned: &tessel::Planned<'_>,
    p: &Prepared,
    batch: &Batch,
    ins: &[Raw],
    outs: &[Raw],
    kept: &BTreeSet<String>,
) -> Result<(), Failure> {
    // SAFETY: as the caller promises.
    let stream = unsafe { stream(frame)? };
    let args = || ins.iter().zip(&p.inputs).chain(outs.iter().zip(&p.outputs));
    // Whether this call stages: the prepared launch's memory of a refusal, or this call's own.
    let mut staged = p.staged.load(Ordering::Relaxed);
    if !staged {
        for n in 0..batch.launches {
            let at: Vec<DeviceArg<'_>> = args()
                .map(|(raw, (arg, ty))| DeviceArg::new(arg, raw.data as u64 + (n * batch.bytes(ty)) as u64, kept.contains(arg)))
                .collect();
            // SAFETY: XLA's stream and its device buffers on the stream's device, each holding its
            // argument's declared type (checked by the caller); XLA writes none of them until
            // the stream reaches the kernel's end.
            match unsafe { planned.launch_external(stream as u64, &at) } {
                Ok(()) => {}
                // Refused before anything was enqueued: staged, now and from now on.
                Err(tessel::Error::Backend { kind: ErrorKind::Unsupported, .. }) if n == 0 => {
                    p.staged.store(true, Ordering::Relaxed);
                    staged = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !staged {
            return Ok(());
        }
    }
    STAGED.fetch_add(1, Ordering::Relaxed);
    for n in 0..batch.launches {
        // Element `n`'s part of every buffer, in host memory.
        // Inputs are read, and the outputs kept (aliased to an input: they start from its values).
        let copy = |raws: &[Raw], decl: &[(String, tessel_plugin_api::ir::Type)], read: &dyn Fn(&str) -> bool| {
            raws.iter()
                .zip(decl)
                .map(|(raw, (name, ty))| {
                    let mut host = vec![0u8; batch.bytes(ty)];
                    if read(name) {
                        let at = raw.data as u64 + (n * host.len()) as u64;
                        // SAFETY: XLA's device buffer holds this element's bytes.
                        unsafe { external::copy_to_host(stream, at, &mut host).map_err(copy_error)? };
                    }
                    Ok::<_, Failure>(host)
                })
                .collect::<Result<Vec<Vec<u8>>, _>>()
        };
        let host_ins = copy(ins, &p.inputs, &|_| true)?;
        let mut host_outs = copy(outs, &p.outputs, &|name| kept.contains(name))?;
        let raw = |host: &[u8], like: &Raw| Raw { dtype: like.dtype, dims: like.dims.clone(), data: host.as_ptr() as *mut u8 };
        let r_ins: Vec<Raw> = host_ins.iter().zip(ins).map(|(h, r)| raw(h, r)).collect();
        let r_outs: Vec<Raw> = host_outs.iter_mut().zip(outs).map(|(h, r)| raw(h, r)).collect();
        // SAFETY: host copies of element `n`'s part of each buffer (so launch 0 of them), the
        // results' copies written only through `r_outs`.
        unsafe { launch_host(planned, p, batch, &r_ins, &r_outs, kept, 0)? };
        for ((host, raw), (_, ty)) in host_outs.iter().zip(outs).zip(&p.outputs) {
            let at = raw.data as u64 + (n * batch.bytes(ty)) as u64;
            // SAFETY: XLA's result buffer holds this element's bytes.
            unsafe { external::copy_to_device(stream, at, host).map_err(copy_error)? };
        }
    }
    Ok(())
}
