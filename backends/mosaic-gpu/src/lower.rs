//! Verified IR to a PTX plan: what the kernel needs (supported ops and dtypes, the CTA grid) and
//! where every value lives. Pure: no device.
//!
//! The model: one program is one CTA of 128 × `num_threads` threads; the points of the mesh's
//! thread axis are its warpgroups of 128 (at most 8, each taking several points past that), each
//! with its own copy of the values and its own named barrier, all sharing the CTA's scratch. The
//! other parallel grid axes (cluster axes included) are folded into `ctaid.x`; the `seq` axes are
//! a loop inside the CTA. Each operation is a loop of a warpgroup's threads over the elements of
//! its result, thread `t` owning elements `t`, `t + 128`, ... A value that every thread only
//! writes and reads at its own elements lives in registers ([`in_registers`]; the loops touching
//! it are unrolled); every other block value lives in the CTA's workspace, 4 bytes an element,
//! after the scratch (its elements at their width): in shared memory when the CTA's values and
//! scratch fit the 227 KiB a Hopper CTA may have ([`MAX_SHARED_BYTES`]), else in the CTA's region
//! of a global buffer, the scratch staying in shared memory alone where it fits
//! ([`KernelPlan::scratch_shared`]). A barrier stands only where an operation meets another thread's
//! elements: the plan's second phase, [`meetings`]. Reductions give each output element to one
//! thread, which accumulates in the interpreter's order; float `dot` runs on the tensor cores
//! (`mma.sync`, see emit/dot.rs), integer `dot` like a reduction. Loads and stores check the array bounds and masks lane by lane
//! (docs/language.md §5).

pub mod meetings;

use std::collections::{HashMap, HashSet};

use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::ir::*;

use crate::async_mma::{self, AsyncMma};
use crate::attention::{self, Attention};
use crate::error::Refusal;
use crate::limits::{
    MAX_ARRAY_ELEMENTS, MAX_ARRIVALS, MAX_BARRIERS_PER_ARRAY, MAX_BLOCK_ELEMENTS, MAX_CTAS, MAX_REGISTERS_PER_VALUE,
    MAX_SHARED_BYTES, MAX_WARPGROUPS, THREADS, element_bytes,
};
use crate::tma;
use crate::wgmma::{self, Gemm, Schedule, TensorMapSpec};
use meetings::Meetings;

/// Where a value or a scratch buffer lives in a CTA's workspace region.
#[derive(Clone, Debug)]
pub struct Slot {
    /// Byte offset in the region.
    pub offset: u64,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

/// Everything emission and the runtime need to know about one kernel.
#[derive(Clone, Debug)]
pub struct KernelPlan {
    /// The verified kernel (its grid includes the mesh's axes).
    pub kernel: Verified,
    /// The PTX entry name.
    pub entry: String,
    /// Workspace slot of every value not in registers, by id.
    pub values: ValueMap<Slot>,
    /// The second slot of each `for`'s carried values, which `yield` writes through (so that
    /// yielding carried values in another order cannot clobber them), by the carried value's id.
    pub yielded: ValueMap<Slot>,
    /// Workspace slot of every scratch buffer, by name.
    pub scratch: HashMap<String, Slot>,
    /// Bytes of one CTA's workspace region: the scratch, shared by the CTA's warpgroups, then
    /// one copy of the values per warpgroup.
    pub workspace_per_cta: u64,
    /// Bytes of the scratch at the start of the region.
    pub scratch_bytes: u64,
    /// Bytes of one warpgroup's values.
    pub value_bytes: u64,
    /// Number of CTAs (the product of the parallel axes but the thread axis).
    pub ctas: u64,
    /// Warpgroups of 128 threads per CTA: the size of the mesh's thread axis (at most
    /// [`MAX_WARPGROUPS`]), else 1.
    pub warpgroups: u32,
    /// Points of the mesh's thread axis (1 without one): warpgroup `w` runs points `w`,
    /// `w + warpgroups`, ... in turn.
    pub thread_points: u32,
    /// The grid axis that is the mesh's thread axis: each warpgroup runs one of its points.
    pub thread_axis: Option<usize>,
    /// Values kept in registers instead of the workspace ([`in_registers`]).
    pub in_registers: ValueSet,
    /// Whether the workspace is the CTA's dynamic shared memory (else a global buffer of
    /// `ctas * workspace_per_cta` bytes, the entry's first parameter).
    pub shared: bool,
    /// The Hopper path (`crate::wgmma`), when the kernel takes it: then the workspace is its
    /// shared-memory stages and the entry takes a tensor map per operand after the arrays.
    pub gemm: Option<Gemm>,
    /// The Hopper path for attention (`crate::attention`), when the kernel takes it: the
    /// workspace is its query, probabilities and stages, and the entry takes tensor maps too.
    pub attention: Option<Attention>,
    /// Bytes of the kernel's barriers (docs/language.md §10): an mbarrier of 8 bytes each, in
    /// the order the kernel declares them, in shared memory after the workspace (or alone there
    /// when the workspace is global).
    pub barrier_bytes: u64,
    /// The general path's tensor maps: those of the concurrent model's copies by TMA
    /// (`crate::tma`), in the order the entry takes them.
    pub maps: Vec<TensorMapSpec>,
    /// The concurrent model's products on `wgmma` (`crate::async_mma`): their operand buffers'
    /// swizzled layouts and their accumulators in registers (which take no scratch slot).
    pub mma: AsyncMma,
    /// The second phase: where the warpgroup's threads meet ([`meetings::place`], from
    /// everything above; none on the Hopper path, whose writers meet as their schedule does).
    pub meetings: Meetings,
}

impl KernelPlan {
    /// The workspace slot of the value `name`, or of the slot a carried value's `yield` goes
    /// through (`NAME.next`, a name no value can have); `None` for a value in registers.
    pub fn value_slot(&self, name: &str) -> Option<&Slot> {
        let values = self.kernel.values();
        match (values.get(name), name.strip_suffix(".next").and_then(|n| values.get(n))) {
            (Some(id), _) => self.values.get(id),
            (None, Some(id)) => self.yielded.get(id),
            (None, None) => None,
        }
    }

    /// The registers a thread has at entry (`.maxnreg`), where the kernel moves registers between
    /// its warpgroups with `setmaxnreg`: a warp-specialized Hopper path, or a concurrent kernel's
    /// `max_registers` (the SM's 64K over the CTA's threads).
    pub fn entry_registers(&self) -> Option<u32> {
        if let Some((_, entry, _)) = self.specialized() {
            return Some(entry);
        }
        let mut hinted = false;
        analysis::visit(&self.kernel.kernel().body, &mut |s| hinted |= matches!(s.op, Op::Sync(SyncOp::MaxRegisters { .. })));
        hinted.then(|| wgmma::entry_registers(self.warpgroups))
    }

    /// CUDA threads per CTA.
    pub fn threads(&self) -> u32 {
        THREADS * self.warpgroups
    }

    /// On a warp-specialized Hopper kernel: the producer warpgroup, the registers a thread has at
    /// entry (`.maxnreg`) and those a consumer raises its budget to.
    pub fn specialized(&self) -> Option<(u32, u32, u32)> {
        let consumers = match (&self.gemm, &self.attention) {
            (Some(g), _) if g.schedule.specialized() => g.warpgroups(),
            (_, Some(a)) if a.schedule.specialized() => a.warpgroups(),
            _ => return None,
        };
        Some((consumers, wgmma::entry_registers(consumers + 1), wgmma::consumer_registers(consumers)))
    }

    /// The CTAs to launch on a device of `sms` multiprocessors: one per output block, or for a
    /// persistent grid ([`Schedule::Persistent`]) at most one per SM, each looping over blocks.
    pub fn launch_ctas(&self, sms: u64) -> u64 {
        match &self.gemm {
            Some(g) if g.schedule == Schedule::Persistent => self.ctas.min(sms.max(1)),
            _ => self.ctas,
        }
    }

    /// Bytes of dynamic shared memory per CTA at launch.
    pub fn shared_bytes(&self) -> u64 {
        self.barrier_offset() + self.barrier_bytes
    }

    /// Where the mbarriers start in the CTA's dynamic shared memory: after the workspace, when
    /// the workspace is there, or after the scratch, when that is there alone.
    pub fn barrier_offset(&self) -> u64 {
        match (self.shared, self.scratch_shared()) {
            (true, _) => self.workspace_per_cta,
            (false, true) => self.scratch_bytes,
            (false, false) => 0,
        }
    }

    /// Whether the scratch is in the CTA's dynamic shared memory: with the whole workspace, or
    /// alone (at its start, the values in the global workspace) when the values outgrow shared
    /// memory and the scratch does not. The general path's only.
    pub fn scratch_shared(&self) -> bool {
        let general = self.gemm.is_none() && self.attention.is_none();
        self.shared || (general && self.scratch_bytes > 0 && self.scratch_bytes + self.barrier_bytes <= MAX_SHARED_BYTES)
    }

    /// The tensor maps the entry takes after the arrays, in order (the Hopper paths').
    pub fn tensor_maps(&self) -> &[TensorMapSpec] {
        match (&self.gemm, &self.attention) {
            (Some(g), _) => &g.maps,
            (_, Some(a)) => &a.maps,
            _ => &self.maps,
        }
    }

    /// The copy `op` by TMA, laid out as its scratch is, where the plan makes it by TMA.
    pub fn tma_copy<'s>(&'s self, op: &'s SyncOp) -> Option<tma::TmaCopy<'s>> {
        tma::copy(self.kernel.kernel(), op).map(|c| self.mma.lay_out(c))
    }

    /// Bytes of the global workspace buffer (0 when the workspace is in shared memory).
    pub fn global_workspace_bytes(&self) -> u64 {
        if self.shared { 0 } else { self.ctas * self.workspace_per_cta }
    }
}

/// The dtypes this backend lowers: all of them.
pub const DTYPES: [DType; 10] = DType::ALL;

/// A value's size must be one the backend lowers.
fn check_value(name: &str, ty: &Type) -> Result<(), BackendError> {
    if ty.numel() > MAX_BLOCK_ELEMENTS {
        return Err(Refusal::BlockTooLarge { value: name.to_string(), elements: ty.numel(), ty: ty.to_string() }.into());
    }
    Ok(())
}

struct Planner {
    values: ValueMap<Slot>,
    yielded: ValueMap<Slot>,
    next: u64,
    /// Values that take no slot.
    in_registers: ValueSet,
}

impl Planner {
    /// A slot of `bytes` an element, at a 16-byte boundary.
    fn place_of(&mut self, ty: &Type, bytes: usize) -> Slot {
        let slot = Slot { offset: self.next, shape: ty.shape.clone(), dtype: ty.dtype };
        self.next += (ty.numel().max(1) as u64 * bytes as u64).div_ceil(16) * 16;
        slot
    }

    /// A value's slot: 4 bytes an element.
    fn place(&mut self, name: &str, ty: &Type) -> Result<Slot, BackendError> {
        check_value(name, ty)?;
        Ok(self.place_of(ty, 4))
    }

    fn body(&mut self, v: &Verified, body: &[Stmt]) -> Result<(), BackendError> {
        for s in body {
            match &s.op {
                Op::When { body, .. } => self.body(v, body)?,
                Op::If(IfElse { then, els, .. }) => {
                    self.body(v, then)?;
                    self.body(v, els)?;
                }
                Op::For(ForLoop { var, body, iters, .. }) => {
                    let slot = self.place(var, &Type::scalar(DType::I32))?;
                    self.values.insert(v.id(var), slot);
                    for (n, _) in iters {
                        let slot = self.place(n, v.value_type(n))?;
                        self.values.insert(v.id(n), slot);
                        // A second slot per carried value: `yield` goes through it.
                        let tmp = self.place(&format!("{n}.next"), v.value_type(n))?;
                        self.yielded.insert(v.id(n), tmp);
                    }
                    self.body(v, body)?;
                }
                _ => {}
            }
            for r in &s.results {
                let id = v.id(r);
                if self.in_registers.contains(id) {
                    check_value(r, v.value_type(r))?;
                    continue;
                }
                let slot = self.place(r, v.value_type(r))?;
                self.values.insert(id, slot);
            }
        }
        Ok(())
    }
}

/// Plans one verified kernel, or refuses it (dtypes, ops, sizes). `thread_axis` names the mesh's
/// thread axis, whose points run as the warpgroups of one CTA and share its scratch. A kernel of
/// the form `crate::wgmma` describes takes the Hopper path, its CTAs divided by `schedule`; every
/// other the general one.
pub fn plan(kernel: &Verified, thread_axis: Option<&str>, schedule: Schedule) -> Result<KernelPlan, BackendError> {
    let kernel = &*legalize::for_backend(kernel);
    // Element indices are 32-bit (`mul.wide.u32` to byte offsets), signed where they meet `ds`.
    for p in &kernel.kernel().params {
        if p.ty.numel() > MAX_ARRAY_ELEMENTS {
            return Err(Refusal::ArrayTooLarge { name: p.name.clone(), ty: p.ty.to_string(), elements: p.ty.numel() }.into());
        }
    }
    if kernel.kernel().is_concurrent() {
        return plan_general(kernel, thread_axis);
    }
    match hopper(kernel, thread_axis, schedule) {
        Some(p) => Ok(p),
        None => plan_general(kernel, thread_axis),
    }
}

/// What of the concurrent model (docs/language.md §10) this backend cannot lower in `k`, named
/// as the refusal names it. Its threads wait for each other, so each needs a warpgroup of its
/// own: threads with barriers on several `thread` axes, or more of them than a CTA has
/// warpgroups (a warpgroup running two points in turn could wait on the second forever), are
/// refused. A barrier's phase parity is a bit of one register per array, so an array holds at
/// most 32; `mbarrier.init` counts at most 2^20 - 1 arrivals.
pub fn unlowered_concurrency(k: &Kernel) -> Option<String> {
    if k.barriers.is_empty() {
        return None;
    }
    let sizes = thread_axis_sizes(k);
    if sizes.len() > 1 {
        return Some(format!(
            "barriers between the threads of {} `thread` axes (a program's warpgroups are one axis)",
            sizes.len()
        ));
    }
    let points = sizes.first().copied().unwrap_or(1);
    if points > u64::from(MAX_WARPGROUPS) {
        return Some(format!(
            "barriers between {points} threads of one program (at most {MAX_WARPGROUPS} warpgroups of a CTA run at once)"
        ));
    }
    if let Some(b) = k.barriers.iter().find(|b| b.count > MAX_BARRIERS_PER_ARRAY) {
        return Some(format!("barrier {}[{}] (at most {MAX_BARRIERS_PER_ARRAY} in one array)", b.name, b.count));
    }
    (k.barriers.iter().find(|b| b.arrivals > MAX_ARRIVALS))
        .map(|b| format!("barrier {} of {} arrivals (an mbarrier counts at most {MAX_ARRIVALS})", b.name, b.arrivals))
}

/// The sizes of kernel `k`'s own `thread` axes of more than one point (a program's threads).
fn thread_axis_sizes(k: &Kernel) -> Vec<u64> {
    (k.grid.iter().flatten())
        .filter(|a| a.thread)
        .map(|a| match a.size {
            AxisSize::Fixed(n) => n,
            AxisSize::Dyn => 1,
        })
        .filter(|&n| n > 1)
        .collect()
}

/// The Hopper path's plan, where the kernel takes it: a matmul (`crate::wgmma`) or an attention
/// forward (`crate::attention`).
fn hopper(kernel: &Verified, thread_axis: Option<&str>, schedule: Schedule) -> Option<KernelPlan> {
    let k = kernel.kernel();
    let (gemm, attention) = match wgmma::recognize(kernel, thread_axis, schedule) {
        Some(g) => (Some(g), None),
        None => (None, Some(attention::recognize(kernel, thread_axis, schedule)?)),
    };
    // Both take fixed grids only.
    let ctas = kernel.grid().iter().filter(|a| !a.seq).map(wgmma::fixed).fold(1u64, u64::saturating_mul);
    if ctas > MAX_CTAS {
        return None;
    }
    let (bytes, warpgroups) = match (&gemm, &attention) {
        (Some(g), _) => (g.shared_bytes(), g.cta_warpgroups()),
        (_, Some(a)) => (a.shared_bytes(), a.cta_warpgroups()),
        _ => unreachable!("one of the two"),
    };
    Some(KernelPlan {
        kernel: kernel.clone(),
        entry: format!("tessel_{}", k.name),
        values: ValueMap::new(),
        yielded: ValueMap::new(),
        scratch: HashMap::new(),
        workspace_per_cta: bytes,
        scratch_bytes: 0,
        value_bytes: 0,
        ctas,
        warpgroups,
        thread_points: 1,
        thread_axis: None,
        in_registers: ValueSet::new(),
        shared: true,
        gemm,
        attention,
        barrier_bytes: 0,
        maps: Vec::new(),
        mma: AsyncMma::default(),
        meetings: Meetings::default(),
    })
}

/// The general path's plan (every kernel the backend lowers), even where the Hopper path would
/// take the kernel: how a kernel did before that path, for comparisons.
///
/// A kernel of the concurrent model runs its threads as the CTA's warpgroups, at once, meeting
/// at its barriers (mbarriers), with each copy and product made by the thread that issues it
/// ([`synchronous::per_thread`]).
pub fn plan_general(kernel: &Verified, thread_axis: Option<&str>) -> Result<KernelPlan, BackendError> {
    if let Some(op) = unlowered_concurrency(kernel.kernel()) {
        return Err(Refusal::Unimplemented { op }.into());
    }
    // The scratch first (the kernel's params, which making copies synchronous and legalizing
    // leave as they are): as arrays hold their elements (2 bytes an f16), as loads and stores
    // read it, each buffer of a kernel with barriers aligned for the tensor copies that may land
    // in it (`place_scratch`).
    let source = kernel.kernel();
    let barrier_bytes = 8 * source.barriers.iter().map(|b| b.count as u64).sum::<u64>();
    let fits = |scratch_bytes: u64| scratch_bytes + barrier_bytes <= MAX_SHARED_BYTES;
    // Its products on `wgmma` where their buffers allow (`crate::async_mma`): operand buffers
    // swizzled, accumulators in registers (no scratch), where the scratch then fits shared memory
    // with the barriers; else the scratch as the kernel declares it.
    let tma_able = |op: &SyncOp| tma::copy(source, op).is_some();
    let taken = (!source.barriers.is_empty()).then(|| async_mma::analyse(kernel, &tma_able));
    let laid_out = (taken.filter(|t| !t.accumulators.is_empty()))
        .map(|t| (place_scratch(source, &t), t))
        .filter(|((_, bytes), _)| fits(*bytes));
    let ((scratch, scratch_bytes), mma) =
        laid_out.unwrap_or_else(|| (place_scratch(source, &AsyncMma::default()), AsyncMma::default()));
    // The concurrent model's copies into scratch go by TMA where the scratch is in shared memory
    // (it fits there with the barriers) and the copy is one TMA makes (`crate::tma`).
    let scratch_fits = fits(scratch_bytes);
    let by_tma = |op: &SyncOp| scratch_fits && tma_able(op);
    let mut planner =
        Planner { values: ValueMap::new(), yielded: ValueMap::new(), next: scratch_bytes, in_registers: ValueSet::new() };
    // Copies out by TMA complete in bulk groups: then `commit_copies`, `wait_copies` and `fence`
    // (which orders stores to scratch before such copies read it) stay too.
    let mut stores_by_tma = false;
    analysis::visit(&source.body, &mut |s| {
        stores_by_tma |= matches!(&s.op, Op::Sync(op) if by_tma(op) && tma::copy(source, op).is_some_and(|c| c.store));
    });
    let groups = |op: &SyncOp| stores_by_tma && matches!(op, SyncOp::CommitCopies | SyncOp::WaitCopies { .. } | SyncOp::Fence);
    // A warpgroup's `max_registers` is `setmaxnreg` where the warpgroups run at once and start
    // with fewer registers than a thread may have (three or more: 168 each of the SM's 64K).
    let points = thread_axis_sizes(source).first().map_or(1, |&n| n.min(u64::from(MAX_WARPGROUPS)) as u32);
    let redistributes = !source.barriers.is_empty() && wgmma::entry_registers(points) < wgmma::MAX_REGISTERS;
    let hints = |op: &SyncOp| redistributes && matches!(op, SyncOp::MaxRegisters { .. });
    let keep = |op: &SyncOp| by_tma(op) || mma.takes(op) || groups(op) || hints(op);
    let staged = synchronous::per_thread(kernel, &keep);
    let kernel = &*legalize::for_backend(&staged);
    let k = kernel.kernel();
    let mut maps: Vec<TensorMapSpec> = Vec::new();
    analysis::visit(&k.body, &mut |s| {
        if let Op::Sync(op) = &s.op
            && let Some(c) = tma::copy(k, op).map(|c| mma.lay_out(c))
            && !maps.iter().any(|m| c.reads_through(m))
        {
            maps.push(c.map(maps.len()));
        }
    });
    planner.in_registers = in_registers(kernel);
    // A value an accumulator in registers is loaded into or stored from is read and written in
    // the `wgmma` layout, across the warpgroup's threads: it keeps its slot.
    for v in mma.moved_values(k) {
        planner.in_registers.remove(kernel.id(&v));
    }
    planner.body(kernel, &k.body)?;
    let value_bytes = planner.next - scratch_bytes;
    // The mesh's thread axis, else the kernel's own (`grid (wg: 3 thread)`, the one of several
    // points). Threads that meet at barriers are the kernel's own only: a mesh's thread axis on a
    // kernel without one is separate programs, each with its own barriers (separate CTAs here).
    let own = (kernel.grid().iter().filter(|a| a.thread))
        .max_by_key(|a| matches!(a.size, AxisSize::Fixed(n) if n > 1))
        .map(|a| a.name.as_str());
    let thread_axis = if k.barriers.is_empty() { thread_axis.or(own) } else { own };
    let thread_axis = thread_axis.and_then(|t| kernel.grid().iter().position(|a| a.name == t));
    let mut ctas: u64 = 1;
    let mut warpgroups: u32 = 1;
    let mut thread_points: u32 = 1;
    for (i, a) in kernel.grid().iter().enumerate().filter(|(_, a)| !a.seq) {
        let AxisSize::Fixed(n) = a.size else {
            return Err(Refusal::DynamicGrid.into());
        };
        if Some(i) == thread_axis {
            thread_points = n as u32;
            warpgroups = thread_points.min(MAX_WARPGROUPS);
        } else {
            ctas = ctas.saturating_mul(n);
        }
    }
    if ctas > MAX_CTAS {
        return Err(Refusal::TooManyCtas { ctas }.into());
    }
    let workspace_per_cta = (scratch_bytes + u64::from(warpgroups) * value_bytes).max(16);
    if workspace_per_cta >= u64::from(u32::MAX) {
        return Err(Refusal::Workspace { kernel: k.name.clone(), bytes: workspace_per_cta }.into());
    }
    let mut plan = KernelPlan {
        kernel: kernel.clone(),
        entry: format!("tessel_{}", k.name),
        values: planner.values,
        yielded: planner.yielded,
        scratch,
        workspace_per_cta,
        scratch_bytes,
        value_bytes,
        ctas,
        warpgroups,
        thread_points,
        thread_axis,
        in_registers: planner.in_registers,
        shared: workspace_per_cta + barrier_bytes <= MAX_SHARED_BYTES,
        gemm: None,
        attention: None,
        barrier_bytes,
        maps,
        mma,
        meetings: Meetings::default(),
    };
    plan.meetings = meetings::place(&plan);
    Ok(plan)
}

/// The slots of kernel `k`'s scratch buffers from offset 0, and the bytes they take: each as
/// arrays hold their elements, buffers of a kernel with barriers aligned for the tensor copies
/// that may land in them (1024 bytes for a swizzled one), accumulators `mma` keeps in
/// registers without one.
fn place_scratch(k: &Kernel, mma: &AsyncMma) -> (HashMap<String, Slot>, u64) {
    let mut planner = Planner { values: ValueMap::new(), yielded: ValueMap::new(), next: 0, in_registers: ValueSet::new() };
    let mut scratch = HashMap::new();
    for p in k.params_of(ParamKind::Scratch).filter(|p| mma.accumulator(&p.name).is_none()) {
        let align = match (mma.span(&p.name), k.barriers.is_empty()) {
            (0, true) => 1,
            (0, false) => tma::ALIGN,
            _ => async_mma::SWIZZLED_ALIGN,
        };
        planner.next = planner.next.next_multiple_of(align);
        // Scratch is not a value: shared memory (or the workspace) bounds it, not the elements a
        // statement's loop covers.
        scratch.insert(p.name.clone(), planner.place_of(&p.ty, element_bytes(p.ty.dtype)));
    }
    (scratch, planner.next)
}

/// One access of a value's slot, a scratch buffer or an array by an operation.
pub struct Use {
    pub name: String,
    /// Each thread touches only the elements it owns.
    pub own: bool,
}

impl Use {
    pub fn own(name: &str) -> Use {
        Use { name: name.to_string(), own: true }
    }

    pub fn across(name: &str) -> Use {
        Use { name: name.to_string(), own: false }
    }
}

/// The values to keep in registers: every value that each thread only ever writes and reads at its own
/// elements (elementwise chains, loads, stores, reductions' and integer dots' results): no
/// other thread needs it, so it takes no shared memory and no barrier. Values read across
/// threads (broadcasts, reductions, `dot` operands, scalars, `when`/`for` conditions and
/// bounds), tensor-core results and loop-carried slots stay in the workspace.
pub fn in_registers(k: &Verified) -> ValueSet {
    let (mut candidates, mut across) = (Vec::new(), HashSet::new());
    analysis::visit(&k.kernel().body, &mut |s| {
        let out_shape = s.ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let (reads, writes) = uses(k, s, &out_shape);
        across.extend(reads.iter().filter(|u| !u.own).map(|u| u.name.clone()));
        let own_write = writes.iter().all(|u| u.own);
        let n = out_shape.iter().product::<usize>();
        let body = s.op.has_body();
        if !body && own_write && n > 1 && n <= MAX_REGISTERS_PER_VALUE * THREADS as usize {
            candidates.extend(s.results.iter().cloned());
        }
    });
    candidates.into_iter().filter(|v| !across.contains(v)).map(|v| k.id(&v)).collect()
}

/// The shape of a load's or store's region of `name`: the block, sliced and indexed.
pub fn region_shape(k: &Verified, name: &str, index: Option<&[Index]>) -> Vec<usize> {
    analysis::region_shape(k.kernel().param(name).expect("verified argument"), index)
}

/// What a statement reads and writes, and whether each thread touches only its own elements
/// (an operand read at the result's own index, or through `reshape`'s same flat index; every
/// thread owns the same elements of values of one shape). Of a `when` or `for`, only what every
/// thread reads to decide ([`analysis::uses`]). A load reads its argument's block and a store
/// writes it across the threads.
pub fn uses(k: &Verified, s: &Stmt, out_shape: &[usize]) -> (Vec<Use>, Vec<Use>) {
    let mut reads: Vec<Use> = (analysis::uses(k.kernel(), s, out_shape).into_iter())
        .map(|u| {
            let own = match &u.how {
                analysis::How::Elementwise(at) => k.value_type(u.name).shape == *at,
                analysis::How::Linear => true,
                analysis::How::Whole => false,
            };
            Use { name: u.name.to_string(), own }
        })
        .collect();
    let dst = s.results.first().map(|d| Use::own(d)).into_iter().collect::<Vec<_>>();
    match &s.op {
        Op::Load { src, .. } => {
            reads.push(Use::across(src));
            (reads, dst)
        }
        Op::Store { dst: d, .. } => (reads, vec![Use::across(d)]),
        Op::Dot { a: Operand::Value(a), .. } => {
            // On the tensor cores a warp's lanes write the tile's elements in the mma layout.
            let float = k.value_type(a).dtype.is_float();
            (reads, s.results.iter().map(|d| if float { Use::across(d) } else { Use::own(d) }).collect())
        }
        Op::When { .. } | Op::For(ForLoop { .. }) | Op::If(_) | Op::Yield(_) => (reads, vec![]),
        _ => (reads, dst),
    }
}
