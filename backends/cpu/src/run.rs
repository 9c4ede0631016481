//! Running a compiled kernel: its arguments' memory bound, its programs spread over rayon's
//! workers, each worker with an arena of its own for the programs it runs.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::ir::Verified;
use tessel_plugin_api::launch::LaunchAxis;

use crate::cc::{GemmFn, KernelFn, Library};

/// `tk_ctx` of `prelude.h`.
#[repr(C)]
pub struct Ctx {
    args: *const *mut c_void,
    grid: *const i64,
    sgemm: extern "C" fn(i64, i64, i64, *mut f32, i64, i64, *const f32, i64, i64, *const f32, i64, i64, i32, i32),
    parallel_dot: i32,
    parallel: extern "C" fn(Part, *mut c_void, i64),
    gemm: Option<GemmFn>,
}

/// A part of a job the C splits over the pool (`gemm.h`'s rows of a product): `part(data, i)`.
type Part = extern "C" fn(*mut c_void, i64);

/// A kernel compiled: its function, the arena a program needs, and the library holding it.
pub struct Kernel {
    /// The kernel as lowered (legalized).
    pub verified: Verified,
    func: KernelFn,
    arena: usize,
    _lib: Arc<Library>,
    /// The product library's function where the kernel's C calls it.
    gemm: Option<Gemm>,
}

/// The product library's `tk_gemm`, and the library holding it.
pub(crate) type Gemm = (GemmFn, Arc<Library>);

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("name", &self.verified.name()).field("arena", &self.arena).finish()
    }
}

impl Kernel {
    pub(crate) fn new(
        verified: Verified,
        lib: Arc<Library>,
        name: &str,
        arena: usize,
        gemm: Option<Gemm>,
    ) -> Result<Kernel, BackendError> {
        Ok(Kernel { verified, func: lib.kernel(name)?, arena, _lib: lib, gemm })
    }

    /// Runs every program of `grid` on `args` (one pointer per argument in declaration order,
    /// null for scratch; the caller keeps the memory alive and of the declared types and sizes).
    pub fn run(&self, grid: &[LaunchAxis], args: &[*mut c_void]) -> Result<(), BackendError> {
        let sizes: Vec<i64> = grid.iter().map(|a| a.size as i64).collect();
        let programs: u64 = grid.iter().filter(|a| !a.seq).map(|a| a.size).product();
        if programs == 0 || grid.iter().any(|a| a.size == 0) {
            return Ok(());
        }
        let threads = rayon::current_num_threads() as u64;
        let parallel_dot = i32::from(programs < threads);
        let gemm = self.gemm.as_ref().map(|g| g.0);
        let ctx = Ctx { args: args.as_ptr(), grid: sizes.as_ptr(), sgemm, parallel_dot, parallel, gemm };
        let shared = Shared(&ctx);
        let cancelled = AtomicBool::new(false);
        let token = tessel_plugin_api::cancel::current();
        // Programs in runs: about four per worker, and runs of at most 4,096 programs so that a
        // cancellation is seen within one run.
        let runs = (4 * threads).max(programs.div_ceil(4096)).min(programs);
        let per = programs.div_ceil(runs);
        let run = |r: usize| {
            if cancelled.load(Ordering::Relaxed) {
                return;
            }
            if token.as_ref().is_some_and(|t| t.is_cancelled()) {
                cancelled.store(true, Ordering::Relaxed);
                return;
            }
            let (begin, end) = (r as u64 * per, ((r as u64 + 1) * per).min(programs));
            let ctx = shared.get();
            // The worker's arena, taken out for the call: a product spread over the pool may
            // make this worker run another run meanwhile, which then takes an arena of its own.
            let mut a = ARENA.with(|a| std::mem::take(&mut *a.borrow_mut()));
            // SAFETY: `func` is the kernel's C function, called with its context (every pointer in
            // it alive for this call: `args`, `sizes`, `ctx` outlive the loop), a range of the
            // grid's programs, and an arena of at least the size the C was laid out for, 64-byte
            // aligned, used by this call alone.
            #[allow(unsafe_code)]
            unsafe {
                (self.func)(ctx.cast(), begin as i64, end as i64, a.at_least(self.arena).ptr())
            };
            ARENA.with(|slot| *slot.borrow_mut() = a);
        };
        if runs == 1 {
            run(0);
        } else {
            (0..runs as usize).into_par_iter().for_each(run);
        }
        if cancelled.load(Ordering::Relaxed) {
            return Err(tessel_plugin_api::cancel::cancelled());
        }
        Ok(())
    }
}

/// The context, shared by the workers (it only holds pointers to memory they read, and to
/// outputs whose elements the programs write, each element by the program that owns it).
struct Shared<'a>(&'a Ctx);
// SAFETY: see `Shared`: the workers read the context; what its pointers reach is either read only
// or written by programs at disjoint places (overlapping writes are the author's, as in Pallas).
#[allow(unsafe_code)]
unsafe impl Sync for Shared<'_> {}
impl Shared<'_> {
    fn get(&self) -> *const Ctx {
        self.0
    }
}

/// A worker's memory for block values and scratch, kept by the thread from launch to launch
/// (grown, never shrunk: the largest arena a kernel run on it needed).
#[derive(Default)]
struct Arena(Vec<u8>);

thread_local! {
    static ARENA: std::cell::RefCell<Arena> = const { std::cell::RefCell::new(Arena(Vec::new())) };
}

impl Arena {
    /// This arena, holding at least `bytes` from a 64-byte aligned start.
    fn at_least(&mut self, bytes: usize) -> &mut Arena {
        if self.0.len() < bytes + 64 {
            self.0 = vec![0u8; bytes + 64];
        }
        self
    }

    /// The 64-byte aligned start: the C writes block values and scratch there before it reads
    /// them (scratch is zeroed by the kernel), so what the last kernel left does not matter.
    fn ptr(&mut self) -> *mut u8 {
        let p = self.0.as_mut_ptr();
        p.wrapping_add(p.align_offset(64))
    }
}

/// `part(data, i)` for every `i` in `0..parts`, spread over the pool; returns when all are done.
extern "C" fn parallel(part: Part, data: *mut c_void, parts: i64) {
    struct Data(*mut c_void);
    // SAFETY: the C's job (`gemm.h`'s `tk_gemm_job`) is read by every part and each part writes
    // rows of the product no other part writes; the C waits here until all are done.
    #[allow(unsafe_code)]
    unsafe impl Sync for Data {}
    let data = Data(data);
    let data = &data;
    // A panic must not cross into C; the parts are C functions that do not unwind.
    let run = || (0..parts).into_par_iter().for_each(|i| part(data.0, i));
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        std::process::abort();
    }
}

/// `dst = a b` (`dst += a b` with `accumulate`) through the `gemm` crate, for the C's float products.
#[allow(clippy::too_many_arguments)]
extern "C" fn sgemm(
    m: i64,
    n: i64,
    k: i64,
    dst: *mut f32,
    drs: i64,
    dcs: i64,
    a: *const f32,
    ars: i64,
    acs: i64,
    b: *const f32,
    brs: i64,
    bcs: i64,
    parallel: i32,
    accumulate: i32,
) {
    let par = if parallel != 0 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    let (m, n, k) = (m as usize, n as usize, k as usize);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if accumulate != 0 {
            return;
        }
        for i in 0..m {
            for j in 0..n {
                // SAFETY: (i, j) lies inside the m x n destination at its strides.
                #[allow(unsafe_code)]
                unsafe {
                    *dst.offset(i as isize * drs as isize + j as isize * dcs as isize) = 0.0;
                }
            }
        }
        return;
    }
    let run = || {
        // SAFETY: the C passes operands of m x k and k x n elements and a destination of m x n
        // at these strides, inside its arena or (accumulated) in an output or scratch block
        // (`emit/shape.rs`, `emit/accumulate.rs`); the destination is read only when accumulated.
        #[allow(unsafe_code)]
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst,
                dcs as isize,
                drs as isize,
                accumulate != 0,
                a,
                acs as isize,
                ars as isize,
                b,
                bcs as isize,
                brs as isize,
                if accumulate != 0 { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                par,
            );
        }
    };
    // A panic must not cross into C: it would unwind through frames that cannot take it.
    if std::panic::catch_unwind(run).is_err() {
        std::process::abort();
    }
}
