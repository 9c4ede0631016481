//! Runs of elementwise statements over one shape, fused: the runtime evaluates them a chunk of
//! rows at a time (about [`CHUNK`] elements, in cache), so a chain like `sub`, `exp`, `div`
//! makes no temporary block per operation, a whole-block load is read from the argument where
//! its consumers need it, a whole-block store writes the chunk straight into the output, and a
//! reduction along the last axis folds each row as the chunk that makes it goes by; what reads
//! that reduction back along its rows (`keepdims`) runs in the same chunk, so a row softmax is
//! one run.
//!
//! Every operation of a chunk is the interpreter's own whole-block operation (`eval/`) on a
//! chunk-sized block, and a row's reduction folds that row in ascending order, so a fused run
//! computes the same bits as its statements one by one. Where a block it loads or stores reaches
//! past its array at some grid point, the runtime runs the statements one by one there instead
//! (`Fused::original`), which handles the edge.
//!
//! A run's types (`Fused`, `FusedOp`, `FusedArg`, `Chunk`) are in `program.rs`, beside the
//! instructions a run is one of and keeps; this file groups statements into runs.

use std::collections::HashMap;

use tessel_plugin_api::ir::{BinaryOp, DType, Verified};

use crate::eval::{Data, Val, strides};
use crate::program::{Chunk, DotArg, Fused, FusedArg, FusedOp, Instr, Ix, MemRef, Src};

/// Elements a chunk holds, about: a few such blocks of `f32` (32 KiB each) stay in a core's L2
/// cache, and the per-chunk bookkeeping is noise beside the work.
pub(crate) const CHUNK: usize = 8192;

/// What the grouping needs to know about the kernel.
pub(crate) struct Facts<'a> {
    pub v: &'a Verified,
    /// The shape of each slot an operation defines.
    pub shapes: &'a HashMap<usize, Vec<usize>>,
    /// How many times each slot is read anywhere in the program.
    pub uses: &'a HashMap<usize, usize>,
}

impl Facts<'_> {
    fn block(&self, mem: MemRef) -> &[usize] {
        self.v.kernel().params[mem.0].block_shape()
    }
}

/// A run being gathered.
struct Run {
    shape: Vec<usize>,
    ops: Vec<FusedOp>,
    dsts: Vec<Option<usize>>,
    outer: Vec<Src>,
    /// Slot → the operation of this run that defines it.
    defined: HashMap<usize, usize>,
    /// Reads, by operations of the run, of values the run defines.
    reads: HashMap<usize, usize>,
    /// The slots whose reads the statement being added counted (undone where it does not fit).
    counted: Vec<usize>,
    whole_rows: bool,
    mems: Vec<MemRef>,
    original: Vec<Instr>,
}

impl Run {
    fn new(shape: Vec<usize>) -> Run {
        Run {
            shape,
            ops: Vec::new(),
            dsts: Vec::new(),
            outer: Vec::new(),
            defined: HashMap::new(),
            reads: HashMap::new(),
            counted: Vec::new(),
            whole_rows: false,
            mems: Vec::new(),
            original: Vec::new(),
        }
    }

    /// The operand `s` as the run reads it; `None` where it is a reduction of this run without
    /// `keepdims`. A run with a reduction takes whole rows a chunk, so a chunk's reduction is
    /// complete for the chunk's rows, and with `keepdims` (shape `[..., 1]`) every element that
    /// broadcasting pairs with it lies in the same row: `x - max(x)` reads it within the chunk.
    /// Without `keepdims` broadcasting would pair it with other rows.
    fn arg(&mut self, s: &Src) -> Option<FusedArg> {
        if let Src::Slot(n) = s
            && let Some(&op) = self.defined.get(n)
        {
            if matches!(self.ops[op], FusedOp::Reduce { keepdims: false, .. }) {
                return None;
            }
            *self.reads.entry(*n).or_default() += 1;
            self.counted.push(*n);
            return Some(FusedArg::Op(op));
        }
        self.outer.push(s.clone());
        Some(FusedArg::Outer(self.outer.len() - 1))
    }

    /// Adds `instr` if it computes over the run's shape from what the run can read.
    fn add(&mut self, instr: &Instr, f: &Facts<'_>) -> bool {
        let same = |dst: &usize| f.shapes.get(dst) == Some(&self.shape);
        // Reads are counted in a journal, so that a statement that does not fit leaves no trace
        // (a copy of the counts per statement made a run of n statements cost n²).
        let outer_before = self.outer.len();
        self.counted.clear();
        let op = match instr {
            Instr::Load { dst, mem, index: None, mask: None, dtype, .. } if f.block(*mem) == self.shape.as_slice() => {
                self.mems.push(*mem);
                Some((FusedOp::Load { mem: *mem, dtype: *dtype }, Some(*dst)))
            }
            Instr::Unary { dst, op, a } if same(dst) => self.arg(a).map(|a| (FusedOp::Unary { op: *op, a }, Some(*dst))),
            Instr::Binary { dst, op, a, b } if same(dst) => {
                self.arg(a).zip(self.arg(b)).map(|(a, b)| (FusedOp::Binary { op: *op, a, b }, Some(*dst)))
            }
            Instr::Compare { dst, op, a, b } if same(dst) => {
                self.arg(a).zip(self.arg(b)).map(|(a, b)| (FusedOp::Compare { op: *op, a, b }, Some(*dst)))
            }
            Instr::Select { dst, c, a, b } if same(dst) => match (self.arg(c), self.arg(a), self.arg(b)) {
                (Some(c), Some(a), Some(b)) => Some((FusedOp::Select { c, a, b }, Some(*dst))),
                _ => None,
            },
            Instr::Cast { dst, a, to } if same(dst) => self.arg(a).map(|a| (FusedOp::Cast { a, to: *to }, Some(*dst))),
            Instr::Reduce { dst, op, a: a @ Src::Slot(n), axis, keepdims }
                if *axis + 1 == self.shape.len() && (self.defined.contains_key(n) || f.shapes.get(n) == Some(&self.shape)) =>
            {
                self.arg(a).map(|a| {
                    self.whole_rows = true;
                    (FusedOp::Reduce { op: *op, a, keepdims: *keepdims }, Some(*dst))
                })
            }
            Instr::Store { mem, index: None, mask: None, value } if f.block(*mem) == self.shape.as_slice() => {
                self.arg(value).map(|value| {
                    self.mems.push(*mem);
                    (FusedOp::Store { mem: *mem, value }, None)
                })
            }
            _ => None,
        };
        let Some((op, dst)) = op else {
            self.outer.truncate(outer_before);
            for n in self.counted.drain(..) {
                *self.reads.get_mut(&n).expect("counted above") -= 1;
            }
            return false;
        };
        if let Some(d) = dst {
            self.defined.insert(d, self.ops.len());
        }
        self.ops.push(op);
        self.dsts.push(dst);
        self.original.push(instr.clone());
        true
    }

    /// The run as one instruction, or its statements as they were where fusing gains nothing.
    fn finish(self, f: &Facts<'_>, out: &mut Vec<Instr>) {
        if self.ops.len() < 2 {
            out.extend(self.original);
            return;
        }
        let keep: Vec<Option<usize>> = self
            .dsts
            .iter()
            .map(|dst| {
                let d = (*dst)?;
                let inside = self.reads.get(&d).copied().unwrap_or(0);
                (f.uses.get(&d).copied().unwrap_or(0) > inside).then_some(d)
            })
            .collect();
        let into = into_stores(&self.ops, &keep);
        let accumulate = match self.ops.as_slice() {
            [
                FusedOp::Load { mem, dtype: DType::F32 },
                FusedOp::Binary { op: BinaryOp::Add, a, b },
                FusedOp::Store { mem: to, value: FusedArg::Op(1) },
            ] if mem.0 == to.0 && keep.iter().all(Option::is_none) => match (a, b) {
                (FusedArg::Op(0), FusedArg::Outer(p)) => Some((*mem, *p, true)),
                (FusedArg::Outer(p), FusedArg::Op(0)) => Some((*mem, *p, false)),
                _ => None,
            },
            _ => None,
        };
        out.push(Instr::Fused(Box::new(Fused {
            accumulate,
            chunks: chunks(&self.shape, self.whole_rows),
            shape: self.shape,
            into,
            ops: self.ops,
            keep,
            outer: self.outer,
            mems: self.mems,
            original: self.original,
        })));
    }
}

/// [`Fused::into`]: each `binary` whose one reader in the run is a store (of the run's shape)
/// and whose value the statements after the run do not read, where no operation between the
/// two loads or stores the stored argument (it would see the chunk early, or be overwritten by it).
fn into_stores(ops: &[FusedOp], keep: &[Option<usize>]) -> Vec<Option<usize>> {
    // One pass each (a run of 100,000 operations is compiled in time linear in its length):
    // who reads each operation, and where each argument is loaded or stored, in order.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    let mut touched: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        for a in operands(op) {
            if let FusedArg::Op(k) = a {
                readers[*k].push(i);
            }
        }
        if let FusedOp::Load { mem, .. } | FusedOp::Store { mem, .. } = op {
            touched.entry(mem.0).or_default().push(i);
        }
    }
    (0..ops.len())
        .map(|j| {
            if !matches!(ops[j], FusedOp::Binary { .. }) || keep[j].is_some() {
                return None;
            }
            let [s] = readers[j][..] else { return None };
            let FusedOp::Store { mem, value: FusedArg::Op(_) } = ops[s] else { return None };
            // A load or store of the same argument strictly between `j` and `s`.
            let at = &touched[&mem.0];
            let touches = at.get(at.partition_point(|&i| i <= j)).is_some_and(|&i| i < s);
            (!touches).then_some(s)
        })
        .collect()
}

/// The operands of a run's operation.
fn operands(op: &FusedOp) -> Vec<&FusedArg> {
    match op {
        FusedOp::Load { .. } => vec![],
        FusedOp::Unary { a, .. } | FusedOp::Cast { a, .. } | FusedOp::Reduce { a, .. } => vec![a],
        FusedOp::Binary { a, b, .. } | FusedOp::Compare { a, b, .. } => vec![a, b],
        FusedOp::Select { c, a, b } => vec![c, a, b],
        FusedOp::Store { value, .. } => vec![value],
    }
}

/// The shape a run starting at `instr` would compute over, where one can.
fn start_shape(instr: &Instr, f: &Facts<'_>) -> Option<Vec<usize>> {
    let shape = match instr {
        Instr::Load { mem, index: None, mask: None, .. } | Instr::Store { mem, index: None, mask: None, .. } => {
            f.block(*mem).to_vec()
        }
        Instr::Unary { dst, .. }
        | Instr::Binary { dst, .. }
        | Instr::Compare { dst, .. }
        | Instr::Select { dst, .. }
        | Instr::Cast { dst, .. } => f.shapes.get(dst)?.clone(),
        Instr::Reduce { a: Src::Slot(n), .. } => f.shapes.get(n)?.clone(),
        _ => return None,
    };
    (!shape.is_empty()).then_some(shape)
}

/// `body` with its runs of elementwise statements fused, inside nested bodies too.
pub(crate) fn fuse(body: Vec<Instr>, f: &Facts<'_>) -> Vec<Instr> {
    let mut out = Vec::new();
    let mut run: Option<Run> = None;
    for instr in body {
        let instr = instr.map_bodies(|b| fuse(b, f));
        if let Some(r) = run.as_mut() {
            if r.add(&instr, f) {
                continue;
            }
            run.take().expect("a run").finish(f, &mut out);
        }
        let mut started = start_shape(&instr, f).map(Run::new);
        match started.as_mut().is_some_and(|r| r.add(&instr, f)) {
            true => run = started,
            false => out.push(instr),
        }
    }
    if let Some(r) = run {
        r.finish(f, &mut out);
    }
    out
}

/// Counts every read of every slot in `body`, nested bodies included.
pub(crate) fn count_uses(body: &[Instr], uses: &mut HashMap<usize, usize>) {
    for instr in body {
        let mut read: Vec<&Src> = Vec::new();
        let mut masks: Vec<usize> = Vec::new();
        match instr {
            Instr::Load { index, mask, .. } => {
                read.extend(index.iter().flatten().filter_map(Ix::src));
                masks.extend(mask);
            }
            Instr::Store { index, value, mask, .. } => {
                read.extend(index.iter().flatten().filter_map(Ix::src));
                read.push(value);
                masks.extend(mask);
            }
            Instr::ProgramId { .. } | Instr::NumPrograms { .. } | Instr::Const { .. } => {}
            Instr::Unary { a, .. }
            | Instr::Cast { a, .. }
            | Instr::Bitcast { a, .. }
            | Instr::Broadcast { a, .. }
            | Instr::Reshape { a, .. }
            | Instr::Transpose { a, .. }
            | Instr::Slice { a, .. }
            | Instr::Reduce { a, .. } => read.push(a),
            Instr::Binary { a, b, .. } | Instr::Compare { a, b, .. } => read.extend([a, b]),
            Instr::Concatenate { args, .. } => read.extend(args),
            Instr::Dot { a, b, .. } => {
                read.extend([a, b].into_iter().filter_map(|d| if let DotArg::Value(s) = d { Some(s) } else { None }))
            }
            Instr::Select { c, a, b, .. } => read.extend([c, a, b]),
            Instr::When { cond, body } => {
                read.push(cond);
                count_uses(body, uses);
            }
            Instr::For { lo, hi, step, iters, body, yields, .. } => {
                read.extend([lo, hi, step]);
                read.extend(iters.iter().map(|(_, s)| s));
                read.extend(yields);
                count_uses(body, uses);
            }
            Instr::If { cond, then, els, .. } => {
                read.push(cond);
                for b in [then, els] {
                    read.extend(&b.yields);
                    count_uses(&b.body, uses);
                }
            }
            Instr::Fused(_) => unreachable!("uses are counted before fusing"),
            Instr::Checked { .. } | Instr::Sync { .. } => unreachable!("kernels of the concurrent model are not fused"),
        }
        let slots = read.into_iter().filter_map(|s| if let Src::Slot(n) = s { Some(*n) } else { None });
        for n in slots.chain(masks) {
            *uses.entry(n).or_default() += 1;
        }
    }
}

/// The chunks of `shape` in row-major order: whole rows, as many as make about [`CHUNK`]
/// elements, or (without `whole_rows`) stretches of [`CHUNK`] along a longer row.
pub(crate) fn chunks(shape: &[usize], whole_rows: bool) -> Vec<Chunk> {
    let rank = shape.len();
    let len = shape[rank - 1];
    let cols = if whole_rows { len } else { len.min(CHUNK) };
    let rows_dim = if rank >= 2 { shape[rank - 2] } else { 1 };
    let rows_per = if cols == len { (CHUNK / len).clamp(1, rows_dim) } else { 1 };
    let lead = &shape[..rank.saturating_sub(2)];
    let mut out = Vec::new();
    for o in 0..lead.iter().product::<usize>() {
        let mut idx = vec![0; lead.len()];
        let mut rest = o;
        for d in (0..lead.len()).rev() {
            idx[d] = (rest % lead[d]) as i64;
            rest /= lead[d];
        }
        for r0 in (0..rows_dim).step_by(rows_per) {
            for c0 in (0..len).step_by(cols) {
                let (mut start, mut lens) = (idx.clone(), vec![1; lead.len()]);
                if rank >= 2 {
                    start.push(r0 as i64);
                    lens.push(rows_per.min(rows_dim - r0));
                }
                start.push(c0 as i64);
                lens.push(cols.min(len - c0));
                out.push(Chunk { start, lens });
            }
        }
    }
    out
}

/// The part of `v` (broadcast to `shape`, numpy's rules) that `chunk` covers, as a `block`.
pub(crate) fn broadcast_chunk(v: &Val, shape: &[usize], chunk: &Chunk, block: &[usize; 2]) -> Val {
    fn take<T: Copy>(data: &[T], strides: &[usize], chunk: &Chunk) -> Vec<T> {
        let n: usize = chunk.lens.iter().product();
        if data.len() == 1 {
            return vec![data[0]; n];
        }
        let last = chunk.lens.len() - 1;
        let cols = chunk.lens[last];
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; last];
        for _ in 0..n / cols {
            let flat: usize = (0..last).map(|d| (chunk.start[d] as usize + idx[d]) * strides[d]).sum::<usize>()
                + chunk.start[last] as usize * strides[last];
            if strides[last] == 0 {
                out.extend(std::iter::repeat_n(data[flat], cols));
            } else {
                out.extend_from_slice(&data[flat..flat + cols]);
            }
            for d in (0..last).rev() {
                idx[d] += 1;
                if idx[d] < chunk.lens[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
    // The stride in `v` of each dimension of `shape` (0 where `v` stretches).
    let lead = shape.len() - v.shape.len();
    let own = strides(&v.shape);
    let st: Vec<usize> = (0..shape.len()).map(|d| if d < lead || v.shape[d - lead] == 1 { 0 } else { own[d - lead] }).collect();
    let data = match &v.data {
        Data::F(x) => Data::F(take(x, &st, chunk)),
        Data::I(x) => Data::I(take(x, &st, chunk)),
        Data::U(x) => Data::U(take(x, &st, chunk)),
        Data::B(x) => Data::B(take(x, &st, chunk)),
    };
    Val { dtype: v.dtype, shape: block.to_vec(), data }
}
