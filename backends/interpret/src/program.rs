//! The interpreter's program form: what `lower.rs` makes and `runtime/` runs. Instructions
//! ([`Instr`]) over numbered slots and argument numbers, and the fused runs of elementwise
//! statements ([`Fused`], grouped by `fuse.rs`), which keep their statements as instructions too;
//! so both live in this one file. Types only: of the crate's files it imports only `eval/`, for
//! the constant values that operands carry.

use tessel_plugin_api::ir::{BinaryOp, CmpOp, DType, Literal, ReduceOp, UnaryOp};

use crate::eval::Val;

/// Where an operand comes from.
#[derive(Clone, Debug)]
pub(crate) enum Src {
    Slot(usize),
    Const(Val),
}

/// An operand of `dot`.
#[derive(Clone, Debug)]
pub(crate) enum DotArg {
    Value(Src),
    /// The whole block of an `f32` input matrix whose load only this `dot` read: read in place
    /// through the array's row stride where the block lies inside it, else loaded.
    Block(MemRef),
}

/// A memory reference: an argument (by position in `Kernel::params`) or a scratch buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemRef(pub usize);

#[derive(Clone, Debug)]
pub(crate) enum Ix {
    Full,
    /// `ds(start, size, stride)`.
    Slice(Src, usize, usize),
    At(Src),
    /// The elements at an index vector (a gather or scatter).
    Gather(Src),
}

impl Ix {
    /// The value the index reads, if any.
    pub fn src(&self) -> Option<&Src> {
        match self {
            Ix::Full => None,
            Ix::Slice(s, ..) | Ix::At(s) | Ix::Gather(s) => Some(s),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Instr {
    Load {
        dst: usize,
        mem: MemRef,
        index: Option<Vec<Ix>>,
        mask: Option<usize>,
        other: Literal,
        dtype: DType,
    },
    Store {
        mem: MemRef,
        index: Option<Vec<Ix>>,
        value: Src,
        mask: Option<usize>,
    },
    ProgramId {
        dst: usize,
        axis: usize,
    },
    NumPrograms {
        dst: usize,
        axis: usize,
    },
    Const {
        dst: usize,
        val: Val,
    },
    Unary {
        dst: usize,
        op: UnaryOp,
        a: Src,
    },
    Binary {
        dst: usize,
        op: BinaryOp,
        a: Src,
        b: Src,
    },
    Compare {
        dst: usize,
        op: CmpOp,
        a: Src,
        b: Src,
    },
    Select {
        dst: usize,
        c: Src,
        a: Src,
        b: Src,
    },
    Cast {
        dst: usize,
        a: Src,
        to: DType,
    },
    Bitcast {
        dst: usize,
        a: Src,
        to: DType,
    },
    Broadcast {
        dst: usize,
        a: Src,
        shape: Vec<usize>,
    },
    Reshape {
        dst: usize,
        a: Src,
        shape: Vec<usize>,
    },
    Transpose {
        dst: usize,
        a: Src,
        perm: Vec<usize>,
    },
    Concatenate {
        dst: usize,
        args: Vec<Src>,
        axis: usize,
    },
    Slice {
        dst: usize,
        a: Src,
        start: Vec<usize>,
        stride: Vec<usize>,
        shape: Vec<usize>,
    },
    Reduce {
        dst: usize,
        op: ReduceOp,
        a: Src,
        axis: usize,
        keepdims: bool,
    },
    Dot {
        dst: usize,
        a: DotArg,
        b: DotArg,
        trans_a: bool,
        trans_b: bool,
    },
    When {
        cond: Src,
        body: Vec<Instr>,
    },
    For {
        var: usize,
        lo: Src,
        hi: Src,
        step: Src,
        iters: Vec<(usize, Src)>,
        /// The slot of the carried `bool` of `while %c`, checked before every trip.
        cond: Option<usize>,
        results: Vec<usize>,
        body: Vec<Instr>,
        yields: Vec<Src>,
    },
    /// `if`: one branch runs, then its yields are copied into `results`.
    If {
        cond: Src,
        then: Branch,
        els: Branch,
        results: Vec<usize>,
    },
    /// Elementwise statements over one shape, run a chunk at a time (`fuse.rs`).
    Fused(Box<Fused>),
    /// A `load` or `store` of a kernel of the concurrent model: `instr`, its elements checked
    /// for races first (`runtime/threads.rs`); `stmt` numbers it in [`Program::stmts`].
    Checked {
        stmt: usize,
        instr: Box<Instr>,
    },
    /// A statement of the concurrent model.
    Sync {
        stmt: usize,
        op: SyncInstr,
    },
}

/// A region an asynchronous statement reads or writes.
#[derive(Clone, Debug)]
pub(crate) struct Region {
    pub mem: MemRef,
    pub index: Option<Vec<Ix>>,
    pub dtype: DType,
}

/// One barrier of a barrier array: the array's first barrier among all the kernel's (in
/// declaration order), its count, and the index into it.
#[derive(Clone, Debug)]
pub(crate) struct BarrierRef {
    pub first: usize,
    pub count: usize,
    pub index: Src,
}

/// The concurrent model's statements (`SyncOp`).
#[derive(Clone, Debug)]
pub(crate) enum SyncInstr {
    Arrive {
        barrier: BarrierRef,
    },
    Wait {
        barrier: BarrierRef,
    },
    Copy {
        dst: Region,
        src: Region,
        arrive: Option<BarrierRef>,
    },
    CommitCopies,
    WaitCopies {
        pending: usize,
        reads: bool,
    },
    Fence,
    /// `a` a region, or (`Err`) a value in registers.
    Mma {
        acc: Region,
        a: Result<Region, Src>,
        b: Region,
        trans_a: bool,
        trans_b: bool,
    },
    MmaWait {
        pending: usize,
    },
    /// A statement that changes no result (`max_registers`).
    Hint,
}

/// A branch of an `if`: its body, and what it yields.
#[derive(Clone, Debug)]
pub(crate) struct Branch {
    pub body: Vec<Instr>,
    pub yields: Vec<Src>,
}

impl Instr {
    /// The nested bodies: a `when`'s or a `for`'s, an `if`'s two.
    pub fn bodies(&self) -> Vec<&[Instr]> {
        match self {
            Instr::When { body, .. } | Instr::For { body, .. } => vec![body],
            Instr::If { then, els, .. } => vec![&then.body, &els.body],
            Instr::Checked { instr, .. } => instr.bodies(),
            _ => Vec::new(),
        }
    }

    /// The instruction with each nested body passed through `f`.
    pub fn map_bodies(self, mut f: impl FnMut(Vec<Instr>) -> Vec<Instr>) -> Instr {
        match self {
            Instr::When { cond, body } => Instr::When { cond, body: f(body) },
            Instr::For { var, lo, hi, step, iters, cond, results, body, yields } => {
                Instr::For { var, lo, hi, step, iters, cond, results, body: f(body), yields }
            }
            Instr::If { cond, then, els, results } => Instr::If {
                cond,
                then: Branch { body: f(then.body), yields: then.yields },
                els: Branch { body: f(els.body), yields: els.yields },
                results,
            },
            other => other,
        }
    }
}

/// A kernel ready to run.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub body: Vec<Instr>,
    pub slots: usize,
    /// For a kernel of the concurrent model, each checked statement as errors name it: its
    /// canonical text and its line in the kernel's canonical text (`tessel check`).
    pub stmts: Vec<String>,
    /// Whether the kernel is of the concurrent model (`Kernel::is_concurrent`), decided once
    /// when it is lowered: its programs run through `runtime/concurrent.rs`.
    pub concurrent: bool,
}

impl Program {
    /// The fused runs of the program, nested bodies included.
    pub fn fused_runs(&self) -> usize {
        fn count(body: &[Instr]) -> usize {
            body.iter()
                .map(|i| match i {
                    Instr::Fused(_) => 1,
                    i => i.bodies().into_iter().map(count).sum(),
                })
                .sum()
        }
        count(&self.body)
    }
}

/// An operand inside a run.
#[derive(Clone, Debug)]
pub(crate) enum FusedArg {
    /// The value an earlier operation of the run makes.
    Op(usize),
    /// A value made before the run (a slot or a constant), broadcast to the run's shape:
    /// `Fused::outer[n]`.
    Outer(usize),
}

/// One statement of a run, over the run's shape.
#[derive(Clone, Debug)]
pub(crate) enum FusedOp {
    Load {
        mem: MemRef,
        dtype: DType,
    },
    Unary {
        op: UnaryOp,
        a: FusedArg,
    },
    Binary {
        op: BinaryOp,
        a: FusedArg,
        b: FusedArg,
    },
    Compare {
        op: CmpOp,
        a: FusedArg,
        b: FusedArg,
    },
    Select {
        c: FusedArg,
        a: FusedArg,
        b: FusedArg,
    },
    Cast {
        a: FusedArg,
        to: DType,
    },
    /// Along the last axis: one element per row.
    Reduce {
        op: ReduceOp,
        a: FusedArg,
        keepdims: bool,
    },
    Store {
        mem: MemRef,
        value: FusedArg,
    },
}

/// A fused run.
#[derive(Clone, Debug)]
pub(crate) struct Fused {
    /// The shape every operation computes over (rank 1 or more).
    pub shape: Vec<usize>,
    pub ops: Vec<FusedOp>,
    /// Per operation, the slot its whole value is kept in for the statements after the run
    /// (`None`: only the run reads it, so it is never made whole).
    pub keep: Vec<Option<usize>>,
    /// Values made before the run that its operations read.
    pub outer: Vec<Src>,
    /// The chunks of the run's shape, in order (`fuse::chunks`): whole rows each where a reduction
    /// is in the run.
    pub chunks: Vec<Chunk>,
    /// The arguments the run loads or stores whole blocks of.
    pub mems: Vec<MemRef>,
    /// Where the run is `%acc = load c; %s = add %acc, %p; store c, %s` over `f32` (an
    /// accumulator; `%p` made before the run, often a `dot`): `c`, which of `outer` is `%p`,
    /// and whether `%acc` is the add's first operand. A program that holds `c` adds `%p` into
    /// its block in place.
    pub accumulate: Option<(MemRef, usize, bool)>,
    /// Per operation, the store that is its only reader, where the operation (a `binary`) may
    /// write its chunk straight into that store's destination: nothing between them loads or
    /// stores that argument.
    pub into: Vec<Option<usize>>,
    /// The same statements one by one, for the grid points where a block reaches past its array.
    pub original: Vec<Instr>,
}

/// A box of a run's shape: where it starts and how long it is along each dimension. It covers
/// one index of every dimension but the last two, rows of the second-to-last and a stretch of
/// the last, so its elements in row-major order are a `[rows, cols]` block.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    /// Signed, as the regions of loads and stores are.
    pub start: Vec<i64>,
    pub lens: Vec<usize>,
}
