//! The state a launch runs on: each thread's registers, program counter and what it waits for,
//! the state one CTA's threads share (memories, parameters, mbarriers and tensor copies in
//! flight), and the [`Counts`] of what ran.

use crate::hopper::{Async, Pending, TensorMap};
use crate::memory::Memory;

/// Why a thread is not running.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Wait {
    /// Runs.
    No,
    /// At barrier `id`, which opens for `count` threads.
    Bar { id: u64, count: u64 },
    /// At the `mma.sync` at this pc, for the warp.
    Mma(usize),
    /// At the `wgmma.mma_async` at this pc, for the warpgroup.
    Wgmma(usize),
    /// At the `wgmma.wait_group` at this pc, for the warpgroup.
    WgmmaGroup(usize),
    /// At the `shfl.sync` at this pc, for the warp.
    Shfl(usize),
    /// At the `setmaxnreg` at this pc, for the warpgroup (and, for `inc`, the registers).
    SetMaxNReg(usize),
    /// At an `mbarrier.try_wait.parity` on the barrier at this address for the phase of this parity.
    Mbar { addr: u64, parity: u32 },
    /// Ended.
    Done,
}

pub(crate) struct Thread {
    pub(crate) regs: Vec<u64>,
    pub(crate) pc: usize,
    pub(crate) wait: Wait,
    /// `wgmma` results not yet retired.
    pub(crate) pending: Pending,
    /// Its warpgroup has met at the `wgmma.wait_group` at `pc`: the thread runs it.
    pub(crate) met: bool,
}

/// What a launch executed, summed over its threads (predicated-off instructions not counted):
/// a cost model of the PTX, not a timing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Instructions executed, `mma.sync` and `bar.sync` included.
    pub instructions: u64,
    /// `ld.global` and `st.global`.
    pub global: u64,
    /// `ld.shared` and `st.shared`.
    pub shared: u64,
    /// Barriers opened (one per barrier, however many threads wait at it).
    pub barriers: u64,
    /// Warp-wide `mma.sync`s.
    pub mma: u64,
    /// Warpgroup-wide `wgmma.mma_async`s.
    pub wgmma: u64,
    /// Bytes brought into shared memory by tensor copies (`cp.async.bulk.tensor`).
    pub tensor_bytes: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, c: Counts) {
        self.instructions += c.instructions;
        self.global += c.global;
        self.shared += c.shared;
        self.barriers += c.barriers;
        self.mma += c.mma;
        self.wgmma += c.wgmma;
        self.tensor_bytes += c.tensor_bytes;
    }
}

/// The state one CTA's threads share.
pub(crate) struct Cta<'m> {
    pub(crate) mem: &'m mut Memory,
    pub(crate) shared: Memory,
    pub(crate) params: &'m [u64],
    pub(crate) tensor_maps: &'m [TensorMap],
    pub(crate) id: u32,
    /// The launch's CTAs.
    pub(crate) grid: u32,
    pub(crate) counts: Counts,
    /// Its mbarriers and tensor copies in flight.
    pub(crate) asynchronous: Async,
    /// Its register file as `setmaxnreg` divides it: each warpgroup's count a thread, and the
    /// registers no warpgroup holds (PTX ISA: "a pool of available registers is maintained
    /// per-CTA"). `None` without `.maxnreg`: the count at entry is unknown.
    pub(crate) registers: Option<Registers>,
}

/// A CTA's registers under `setmaxnreg`.
pub(crate) struct Registers {
    pub(crate) per_thread: Vec<u32>,
    pub(crate) pool: u32,
}

impl Registers {
    /// Warpgroup `g` asks for `n` registers a thread: `Ok(true)` once done, `Ok(false)` while an
    /// `inc` waits for the pool, an error for a `dec` that is none or an `inc` past the pool's
    /// whole size.
    pub(crate) fn set(&mut self, g: usize, n: u32, inc: bool) -> Result<bool, String> {
        let cur = self.per_thread[g];
        let threads = 128;
        match inc {
            false if n <= cur => {
                self.pool += (cur - n) * threads;
                self.per_thread[g] = n;
                Ok(true)
            }
            true if n >= cur => {
                let need = (n - cur) * threads;
                if need > self.pool {
                    return Ok(false);
                }
                self.pool -= need;
                self.per_thread[g] = n;
                Ok(true)
            }
            _ => Err(format!(
                "setmaxnreg.{} {n} by warpgroup {g}, which has {cur} registers a thread",
                if inc { "inc" } else { "dec" }
            )),
        }
    }
}

/// A tensor-map parameter's address as the emulator hands it out: a tag and the parameter's index.
pub(crate) const TENSOR_MAP_TAG: u64 = 0x7E45_0000_0000_0000;

impl Cta<'_> {
    /// The memory an `ld`/`st` of state space `.shared` or `.global` (by its opcode) reaches.
    pub(crate) fn space(&mut self, op: &str) -> &mut Memory {
        if op.contains(".shared.") { &mut self.shared } else { self.mem }
    }

    /// Lands the tensor copies in flight on the mbarrier at `addr` (a thread waits on it), then
    /// whether the phase of `parity` has completed.
    pub(crate) fn phase_done(&mut self, addr: u64, parity: u32) -> Result<bool, String> {
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.asynchronous.copies).into_iter().partition(|c| c.bar == addr);
        self.asynchronous.copies = rest;
        let bar = self
            .asynchronous
            .barriers
            .get_mut(&addr)
            .ok_or(format!("wait on shared address {addr:#x}, which holds no mbarrier"))?;
        for copy in mine {
            for (at, v) in &copy.writes {
                self.shared.store_n(*at, 1, u32::from(*v))?;
            }
            bar.tx -= copy.writes.len() as i64;
            bar.settle();
        }
        Ok(bar.phase % 2 != parity % 2)
    }
}
