//! The concurrent model's part of the IR (docs/language.md, "Threads, barriers and asynchronous
//! operations"): barrier declarations, and the statements that arrive at and wait on barriers,
//! start asynchronous copies and products, and wait for them.

use super::{Index, Operand, Span};

/// `barrier NAME[COUNT] arrivals K`: `COUNT` barriers, each completing a phase once `K` arrivals
/// (an `arrive`, or an asynchronous copy that lands) have been made in it.
#[derive(Clone, Debug, PartialEq)]
pub struct BarrierDecl {
    /// Its name, used by `arrive`, `wait` and `copy_async ... arrive`.
    pub name: String,
    /// How many barriers the array holds.
    pub count: usize,
    /// Arrivals that complete one phase of each.
    pub arrivals: usize,
    /// Where it is written.
    pub span: Span,
}

/// One barrier of a barrier array: `full[%k]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BarrierAt {
    /// The barrier array.
    pub name: String,
    /// Which of its barriers (an `i32` scalar or a literal).
    pub index: Operand,
}

/// A region of an argument or scratch, as `load` and `store` select it: `x[ds(%s, 64), :]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RefAt {
    /// The argument or scratch.
    pub name: String,
    /// `None` = the whole block.
    pub index: Option<Vec<Index>>,
}

/// The statements of the concurrent model. Each runs in the thread that reaches it; what it
/// starts asynchronously completes where the documented wait says.
#[derive(Clone, Debug, PartialEq)]
pub enum SyncOp {
    /// `arrive B[k]`: one arrival on the barrier.
    Arrive(BarrierAt),
    /// `wait B[k]`: the thread's n-th wait on a barrier returns once it has completed n phases.
    Wait(BarrierAt),
    /// `copy_async DST[...], SRC[...] (arrive B[k])?`: copies the region of `src` into that of
    /// `dst` (same shape and dtype) asynchronously. With `arrive`, its landing is one arrival
    /// on that barrier; without, it joins the thread's open group of copies (`commit_copies`).
    Copy {
        /// Where it writes.
        dst: RefAt,
        /// What it reads.
        src: RefAt,
        /// The barrier its landing arrives on.
        arrive: Option<BarrierAt>,
    },
    /// `commit_copies`: closes the thread's open group of copies without a barrier.
    CommitCopies,
    /// `wait_copies N (reads)?`: waits until at most `N` of the thread's committed groups are
    /// pending; with `reads`, only until they have read their sources.
    WaitCopies {
        /// Groups that may stay pending.
        pending: usize,
        /// Only their reads need to have finished.
        reads: bool,
    },
    /// `fence`: orders the thread's earlier stores to scratch before its later asynchronous
    /// copies read them (Pallas's `commit_smem`).
    Fence,
    /// `mma_async ACC[...], A[...], B[...] (trans_a)? (trans_b)?`: `ACC += A @ B` asynchronously
    /// (`f32` accumulation of float operands), one group; successive ones of a thread on one
    /// accumulator run in order. `A` may be a value (`%a`: the operand in registers).
    Mma {
        /// The `f32` (or `i32`) accumulator, read and written.
        acc: RefAt,
        /// Left operand `[M, K]` (`[K, M]` with `trans_a`): a region, or a value.
        a: MmaLhs,
        /// Right operand `[K, N]` (`[N, K]` with `trans_b`).
        b: RefAt,
        /// `a` is given as `[K, M]`.
        trans_a: bool,
        /// `b` is given as `[N, K]`.
        trans_b: bool,
    },
    /// `mma_wait N`: waits until at most `N` of the thread's `mma_async` groups are pending.
    MmaWait {
        /// Groups that may stay pending.
        pending: usize,
    },
    /// `max_registers N increase|decrease`: a hint that the thread (a warpgroup) needs at most
    /// (`decrease`) or at least (`increase`) `N` registers a CUDA thread from here on (Pallas's
    /// `set_max_registers`); it changes no result.
    MaxRegisters {
        /// Registers a CUDA thread: a multiple of 8 from 24 to 256.
        count: usize,
        /// Raise the thread's registers to `count` (else lower them).
        increase: bool,
    },
}

/// The left operand of `mma_async`: a region of scratch, or a value (registers).
#[derive(Clone, Debug, PartialEq)]
pub enum MmaLhs {
    /// Read from memory, asynchronously.
    Ref(RefAt),
    /// A value, read where the product is issued.
    Value(Operand),
}

impl SyncOp {
    /// The mnemonic that starts the statement in text.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            SyncOp::Arrive(_) => "arrive",
            SyncOp::Wait(_) => "wait",
            SyncOp::Copy { .. } => "copy_async",
            SyncOp::CommitCopies => "commit_copies",
            SyncOp::WaitCopies { .. } => "wait_copies",
            SyncOp::Fence => "fence",
            SyncOp::Mma { .. } => "mma_async",
            SyncOp::MmaWait { .. } => "mma_wait",
            SyncOp::MaxRegisters { .. } => "max_registers",
        }
    }

    /// The regions the statement reads and writes, as (region, written) pairs.
    pub fn regions(&self) -> Vec<(&RefAt, bool)> {
        match self {
            SyncOp::Copy { dst, src, .. } => vec![(src, false), (dst, true)],
            SyncOp::Mma { acc, a: MmaLhs::Ref(a), b, .. } => vec![(a, false), (b, false), (acc, true)],
            SyncOp::Mma { acc, b, .. } => vec![(b, false), (acc, true)],
            _ => Vec::new(),
        }
    }

    /// The barrier the statement names, if any.
    pub fn barrier(&self) -> Option<&BarrierAt> {
        match self {
            SyncOp::Arrive(b) | SyncOp::Wait(b) => Some(b),
            SyncOp::Copy { arrive, .. } => arrive.as_ref(),
            _ => None,
        }
    }

    /// [`SyncOp::operands`], to change.
    pub fn operands_mut(&mut self) -> Vec<&mut Operand> {
        let (barrier, lhs, regions): (Option<&mut BarrierAt>, Option<&mut Operand>, Vec<&mut RefAt>) = match self {
            SyncOp::Arrive(b) | SyncOp::Wait(b) => (Some(b), None, Vec::new()),
            SyncOp::Copy { dst, src, arrive } => (arrive.as_mut(), None, vec![src, dst]),
            SyncOp::Mma { acc, a: MmaLhs::Ref(a), b, .. } => (None, None, vec![a, b, acc]),
            SyncOp::Mma { acc, a: MmaLhs::Value(v), b, .. } => (None, Some(v), vec![b, acc]),
            _ => (None, None, Vec::new()),
        };
        let mut out: Vec<&mut Operand> = barrier.map(|b| &mut b.index).into_iter().chain(lhs).collect();
        for r in regions {
            for ix in r.index.iter_mut().flatten() {
                match ix {
                    Index::Full => {}
                    Index::Slice { start, .. } => out.push(start),
                    Index::At(at) | Index::Gather { index: at, .. } => out.push(at),
                }
            }
        }
        out
    }

    /// The values the statement reads: barrier indices and the starts of its regions' indices.
    pub fn operands(&self) -> Vec<&Operand> {
        let mut out: Vec<&Operand> = self.barrier().map(|b| &b.index).into_iter().collect();
        if let SyncOp::Mma { a: MmaLhs::Value(v), .. } = self {
            out.push(v);
        }
        for (r, _) in self.regions() {
            for ix in r.index.iter().flatten() {
                match ix {
                    Index::Full => {}
                    Index::Slice { start, .. } => out.push(start),
                    Index::At(at) | Index::Gather { index: at, .. } => out.push(at),
                }
            }
        }
        out
    }
}
