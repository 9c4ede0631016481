//! The Hopper path for `dot` of 16-bit float blocks: which kernels take it and how (emit/wgmma.rs
//! writes it).
//!
//! A kernel takes it when its body is a matrix product accumulated over the `seq` steps, the way
//! Pallas's Mosaic GPU matmuls are written: `load a; load b; dot` of `f16`/`bf16` blocks into an
//! `f32` output block that is the same at every step (`load c; add; store c`, optionally zeroed
//! by `when program_id(k) == 0`), or, without `seq` steps, `store c, dot`; or the same into `f32`
//! scratch that a `when` at the last step stores, cast or not, to an output (Pallas's `acc_ref`
//! matmul), with any elementwise epilogue between that load and the store: `f32` ops of the
//! accumulator, literals and whole loads of other inputs whose blocks broadcast against the
//! output block (a bias row, a scale column, a residual block), then the output's cast
//! ([`Epilogue`]). Nothing else may be in the body; any other kernel takes the general path
//! (`lower.rs`), which runs every kernel.
//!
//! On this path a CTA of one to four warpgroups owns a `BM x BN` output block, each warpgroup 64
//! rows of it in `f32` registers (the `wgmma` accumulator layout), across the `seq` steps. One
//! thread brings the operand blocks of each step into shared memory with tensor copies (TMA,
//! 128-byte swizzle, boxes of 64 elements along the contiguous dimension) tracked by an mbarrier
//! per stage; `stages` steps are in flight, so the copies for the next steps overlap this step's
//! `wgmma.mma_async` (m64nBNk16, both operands from shared memory through descriptors). After the
//! last step the epilogue runs on the accumulator's registers, one element at a time, and the
//! result goes to the output from registers, bounds-checked like any store.
//! Copies past the array edges read zeros (the tensor map's fill), as `load` does.
//!
//! That is the [`Schedule::Cooperative`] CTA, the default. `TESSEL_MOSAIC_SCHEDULE` picks
//! another: [`Schedule::Specialized`] gives the copies a producer warpgroup of their own and hands
//! stages to the multiplying (consumer) warpgroups over a second mbarrier per stage, with no CTA
//! barrier in the loop; [`Schedule::Persistent`] also makes the grid persistent, at most one CTA
//! per SM, each looping over output blocks while its producer runs on into the next block's
//! steps, so that those copies overlap this block's epilogue.

use tessel_plugin_api::ir::*;

use crate::limits::{MAX_SHARED_BYTES, THREADS};

/// Elements of a 16-bit float in one 128-byte swizzle row: the box width along the contiguous
/// dimension, and the granule of `BK` (and of `BN` when `b` is `[K, N]`).
pub const ROW: usize = 64;
/// The swizzle span of every tensor map and descriptor, in bytes.
pub const SWIZZLE: u32 = 128;
/// The most steps in flight.
pub const MAX_STAGES: u64 = 4;
/// The most `f32` accumulator elements of one CTA: 128 registers a thread over two warpgroups
/// (the 128x256 tile of Hopper GEMMs) or 64 over four.
pub const MAX_ACCUMULATOR: usize = 128 * 256;
/// Rows of the output one warpgroup's `wgmma` covers.
pub const WG_ROWS: usize = 64;

/// The most registers a thread is given: `setmaxnreg`'s multiples of 8 below `ptxas`'s 255.
pub const MAX_REGISTERS: u32 = 240;

/// Registers a thread of the producer warpgroup keeps (`setmaxnreg.dec`): it only counts steps
/// and issues copies.
pub const PRODUCER_REGISTERS: u32 = 40;

/// Registers a thread has at the entry of a warp-specialized kernel of `warpgroups` (the
/// producer included): the SM's 64K over the CTA's threads, in the multiples of 8 `setmaxnreg`
/// takes, at most 240. The header's `.maxnreg`, so that `ptxas` knows it and keeps the
/// `setmaxnreg`s.
pub fn entry_registers(warpgroups: u32) -> u32 {
    (65_536 / (THREADS * warpgroups) / 8 * 8).min(MAX_REGISTERS)
}

/// Registers a thread of the `consumers` warpgroups raises its budget to (`setmaxnreg.inc`): the
/// CTA's registers at entry less the producer's, shared by the consumers, in multiples of 8, at
/// most 240 and at least what it has (one consumer has 240 from the start: no `inc`).
pub fn consumer_registers(consumers: u32) -> u32 {
    let entry = entry_registers(consumers + 1);
    let pool = entry * THREADS * (consumers + 1) - PRODUCER_REGISTERS * THREADS;
    (pool / (THREADS * consumers) / 8 * 8).clamp(entry, MAX_REGISTERS)
}

/// How a CTA on this path divides its work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Every warpgroup multiplies; thread 0 also issues the copies, and the CTA meets at a
    /// barrier every step before a stage is refilled. The default: the schedule measured on an
    /// H200 (docs/gpu.md).
    #[default]
    Cooperative,
    /// Warp-specialized: a producer warpgroup, its registers lowered (`setmaxnreg.dec`), issues
    /// the copies; the consumer warpgroups, their registers raised, multiply. A stage passes
    /// from producer to consumers on its `full` mbarrier (the copies' bytes landed) and back on
    /// its `empty` one (every consumer thread has retired the `wgmma`s that read it).
    Specialized,
    /// [`Schedule::Specialized`] on a persistent grid: at most one CTA per SM (the runtime
    /// launches `min(blocks, SMs)`), each taking output blocks `%ctaid.x`, `+ %nctaid.x`, ...;
    /// the stages run on from one block to the next.
    Persistent,
}

impl Schedule {
    /// Every schedule, the default first.
    pub const ALL: [Schedule; 3] = [Schedule::Cooperative, Schedule::Specialized, Schedule::Persistent];

    /// Its name in `TESSEL_MOSAIC_SCHEDULE`, the backend's options and the PTX header.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Cooperative => "cooperative",
            Schedule::Specialized => "specialized",
            Schedule::Persistent => "persistent",
        }
    }

    /// The schedule named `v`, or what would work.
    pub fn parse(v: &str) -> Result<Schedule, String> {
        Schedule::ALL.into_iter().find(|s| s.name() == v).ok_or_else(|| {
            let names: Vec<&str> = Schedule::ALL.iter().map(|s| s.name()).collect();
            format!(
                "TESSEL_MOSAIC_SCHEDULE={v} is not a schedule of the Mosaic GPU backend\n  use {}, or unset it for {}",
                names.join(", "),
                Schedule::default().name()
            )
        })
    }

    /// The schedule `TESSEL_MOSAIC_SCHEDULE` asks for, else the default.
    pub fn from_env() -> Result<Schedule, String> {
        match std::env::var("TESSEL_MOSAIC_SCHEDULE") {
            Ok(v) if !v.is_empty() => Schedule::parse(&v),
            _ => Ok(Schedule::default()),
        }
    }

    /// Whether a producer warpgroup issues the copies.
    pub fn specialized(self) -> bool {
        self != Schedule::Cooperative
    }
}

/// A tensor map the runtime encodes for one operand: a 2-D array (of its dtype), boxes of
/// `boxes[0]` contiguous elements by `boxes[1]` rows, zero fill, swizzled or not.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMapSpec {
    /// The operand (an `in` argument).
    pub array: String,
    /// Box size per dimension of the array, the contiguous one first (2 for the Hopper paths'
    /// operands; 1 to 5).
    pub boxes: Vec<u32>,
    /// The entry parameter that holds it, after the entry's name: `ARRAY_map` (the Hopper
    /// paths'), `ARRAY_mapN` (the Nth map of the array, the concurrent model's copies).
    pub param: String,
    /// Bytes of the swizzle pattern: [`SWIZZLE`] (the Hopper paths' stages), or 0 (none: the box
    /// lands row-major, as scratch is laid out).
    pub swizzle: u32,
}

impl TensorMapSpec {
    /// The Hopper paths' map of `array`: 128-byte swizzle, one map an operand.
    pub fn swizzled(array: &str, boxes: [u32; 2]) -> TensorMapSpec {
        TensorMapSpec { array: array.to_string(), boxes: boxes.to_vec(), param: format!("{array}_map"), swizzle: SWIZZLE }
    }
}

/// How the accumulator starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// At zero: the kernel zeroes the output block at the first step, or stores the product.
    Zero,
    /// From the output block: the kernel adds into what the output holds.
    Output,
}

/// A kernel on the Hopper path.
#[derive(Clone, Debug)]
pub struct Gemm {
    /// The operands, and what the kernel accumulates into: an `f32` output, or `f32` scratch
    /// whose block a `when` at the last step writes to `out`.
    pub a: String,
    pub b: String,
    pub c: String,
    /// What the epilogue writes: `c` itself, or the output the last step's `when` stores the
    /// scratch accumulator to, cast to its dtype (`f32`, `f16` or `bf16`).
    pub out: String,
    pub out_dtype: DType,
    /// `f16` or `bf16`.
    pub dtype: DType,
    /// Block sizes: the output is `bm x bn`, the contraction `bk` a step.
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    /// `a` is given as `[M, K]`: K-major in shared memory; else as `[K, M]` (`trans_a`, the
    /// `xᵀ dy` of a weight gradient), M-major, which `wgmma` reads transposed.
    pub a_k_major: bool,
    /// `b` is given as `[N, K]` (`trans_b`): K-major in shared memory; else `[K, N]`, N-major.
    pub b_k_major: bool,
    /// The `seq` steps each CTA runs (1 without `seq` axes).
    pub steps: u64,
    /// Steps in flight (shared-memory stages).
    pub stages: u64,
    pub init: Init,
    /// Tensor maps: `a`'s, then `b`'s.
    pub maps: [TensorMapSpec; 2],
    pub schedule: Schedule,
    /// What the last step does to the accumulator before the store (nothing, where the kernel
    /// accumulates into its output).
    pub epilogue: Option<Epilogue>,
}

/// The elementwise work a scratch-accumulator kernel's last step does between `load acc` and
/// `store out` (a bias, an activation, a scaling): done on each thread's accumulator registers,
/// one element at a time, in `f32`; the output's cast is the store's.
#[derive(Clone, Debug)]
pub struct Epilogue {
    /// The value the accumulator is loaded as.
    pub acc: String,
    /// The statements, in order: `f32` ops and whole loads of other inputs' blocks, which
    /// broadcast against the output block (numpy's rules).
    pub stmts: Vec<Stmt>,
    /// The value stored (before the output's cast).
    pub stored: String,
}

/// The shape of one step's `wgmma`s: `a` (`bm x bk`) times `b` (`bk x bn`) of 16-bit floats,
/// each operand K-major (contiguous along the contraction) or not, in 128-byte-swizzled boxes
/// of 64 elements along its contiguous dimension.
#[derive(Clone, Copy, Debug)]
pub struct Mma {
    pub dtype: DType,
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub a_k_major: bool,
    pub b_k_major: bool,
}

impl Gemm {
    /// The shape of a step's `wgmma`s.
    pub fn mma(&self) -> Mma {
        Mma { dtype: self.dtype, bm: self.bm, bn: self.bn, bk: self.bk, a_k_major: self.a_k_major, b_k_major: self.b_k_major }
    }

    /// Warpgroups that multiply: one per 64 rows.
    pub fn warpgroups(&self) -> u32 {
        (self.bm / WG_ROWS) as u32
    }

    /// Warpgroups per CTA: those that multiply, and the producer where the schedule has one
    /// (the last warpgroup, so that the others keep their rows).
    pub fn cta_warpgroups(&self) -> u32 {
        self.warpgroups() + u32::from(self.schedule.specialized())
    }

    /// The mbarriers: one per stage (its copies landed), and with a producer one more per
    /// stage (its consumers are done with it).
    pub fn barriers(&self) -> u64 {
        self.stages * if self.schedule.specialized() { 2 } else { 1 }
    }

    /// Bytes of one stage: the `a` block then the `b` block, 2 bytes an element.
    pub fn stage_bytes(&self) -> u64 {
        ((self.bm * self.bk + self.bk * self.bn) * 2) as u64
    }

    /// Bytes of the `a` block in a stage.
    pub fn a_bytes(&self) -> u64 {
        (self.bm * self.bk * 2) as u64
    }

    /// Dynamic shared memory per CTA: the stages (each 1024-byte aligned, as the 128-byte swizzle
    /// needs), then the 8-byte mbarriers.
    pub fn shared_bytes(&self) -> u64 {
        self.stages * self.stage_bytes() + 8 * self.barriers()
    }

    /// Tensor copies of each operand per step.
    pub fn boxes(&self) -> (usize, usize) {
        (if self.a_k_major { self.bk / ROW } else { self.bm / ROW }, if self.b_k_major { self.bk / ROW } else { self.bn / ROW })
    }
}

/// The one statement of `body` that defines `value`.
fn def<'b>(body: &'b [Stmt], value: &str) -> Option<&'b Stmt> {
    body.iter().find(|s| s.results.iter().any(|r| r == value))
}

/// `load P` of a whole block, no mask, zeros outside the array.
fn whole_load(s: &Stmt) -> Option<&str> {
    match &s.op {
        Op::Load { src, index: None, mask: None, other } if other.is_none_or(|o| o.as_f64() == 0.0) => Some(src),
        _ => None,
    }
}

/// The value a whole, unmasked `store P, %v` writes.
fn whole_store<'b>(s: &'b Stmt, p: &str) -> Option<&'b str> {
    match &s.op {
        Op::Store { dst, index: None, value: Operand::Value(v), mask: None } if dst == p => Some(v),
        _ => None,
    }
}

/// The `when program_id(seq) == step { ... }` of `body` (the only `seq` axis of more than one
/// point): its statements
/// (the `when`, the comparison, the `program_id`) and its body.
fn seq_when<'b>(v: &Verified, body: &'b [Stmt], step: u64) -> Option<([&'b Stmt; 3], &'b [Stmt])> {
    body.iter().find_map(|w| {
        let Op::When { cond: Operand::Value(f), body: inner } = &w.op else { return None };
        let cmp = def(body, f)?;
        let Op::Compare(CmpOp::Eq, x, y) = &cmp.op else { return None };
        let pid = match (x, y) {
            (Operand::Value(p), Operand::Lit(l)) | (Operand::Lit(l), Operand::Value(p)) if l.as_i64() as u64 == step => p,
            _ => return None,
        };
        let id = def(body, pid)?;
        let Op::ProgramId(axis) = &id.op else { return None };
        let grid = v.grid();
        let axis = match axis {
            AxisRef::Name(n) => grid.iter().position(|a| &a.name == n)?,
            AxisRef::Pos(p) => *p,
        };
        // The only `seq` axis of more than one point (Pallas's translation makes an axis no output
        // uses `seq`, of one point where the output block covers its dimension).
        let only = grid.iter().enumerate().all(|(i, a)| i == axis || !a.seq || fixed(a) == 1);
        (grid[axis].seq && only).then_some(([w, cmp, id], inner.as_slice()))
    })
}

/// `when program_id(seq) == 0 { %z = zeros; store c, %z }` (or `full 0.0`): the statements it
/// takes (the `when`, the comparison and the `program_id`).
fn zero_init<'b>(v: &Verified, body: &'b [Stmt], c: &str) -> Option<[&'b Stmt; 3]> {
    let (taken, inner) = seq_when(v, body, 0)?;
    let [z, st] = inner else { return None };
    let zeros = match &z.op {
        Op::Zeros => true,
        // `full 0.0`: positive zero only, the accumulator's first value (-0 + -0 stays -0).
        Op::Full(l) => l.as_f64() == 0.0 && l.as_f64().is_sign_positive(),
        _ => false,
    };
    (zeros && whole_store(st, c) == Some(z.results[0].as_str())).then_some(taken)
}

/// `when program_id(seq) == last { %v = load acc; EPILOGUE; [%w = cast %u;] store out, %w }`:
/// the statements it takes, the output it writes and the epilogue ([`epilogue`]).
fn last_store<'b>(v: &Verified, body: &'b [Stmt], acc: &str, last: u64) -> Option<([&'b Stmt; 3], &'b str, Epilogue)> {
    let (taken, inner) = seq_when(v, body, last)?;
    let (load, rest) = inner.split_first()?;
    let (store, middle) = rest.split_last()?;
    if whole_load(load) != Some(acc) {
        return None;
    }
    let Op::Store { dst, .. } = &store.op else { return None };
    let written = whole_store(store, dst)?;
    // A last cast to the output's dtype is the store's (rounded once, from the f32 registers).
    let (middle, stored) = match middle.split_last() {
        Some((cast, before)) if cast.results[0] == written => match &cast.op {
            Op::Cast(Operand::Value(x)) => (before, x.as_str()),
            _ => return None,
        },
        _ => (middle, written),
    };
    let e = epilogue(v, &load.results[0], middle, stored)?;
    Some((taken, dst.as_str(), e))
}

/// The elementwise statements between the accumulator's load and its store, as an [`Epilogue`]:
/// each an `f32` op (`unary`, `binary`, `select`, a `compare` for it, `cast` or `broadcast` to
/// `f32`) of the accumulator, earlier results, literals and whole loads of other inputs whose
/// blocks broadcast against the output block (a bias row `[1, BN]` or `[BN]`, a column
/// `[BM, 1]`, a block `[BM, BN]`). Anything else keeps the kernel off this path.
fn epilogue(v: &Verified, acc: &str, stmts: &[Stmt], stored: &str) -> Option<Epilogue> {
    let k = v.kernel();
    let mut known = vec![acc.to_string()];
    let operand = |known: &[String], o: &Operand| match o {
        Operand::Value(x) => known.contains(x),
        Operand::Lit(_) => true,
    };
    for s in stmts {
        let ty = s.ty.as_ref()?;
        let [r] = s.results.as_slice() else { return None };
        let ok = match &s.op {
            Op::Load { .. } => {
                let p = k.param(whole_load(s)?)?;
                p.kind == ParamKind::In && p.ty.dtype.is_float() && p.block_shape().len() <= 2
            }
            Op::Unary(op, x) => ty.dtype == DType::F32 && op.float_only() && operand(&known, x),
            Op::Binary(_, x, y) => ty.dtype == DType::F32 && operand(&known, x) && operand(&known, y),
            Op::Compare(_, x, y) => ty.dtype == DType::Bool && operand(&known, x) && operand(&known, y),
            Op::Select(c, x, y) => ty.dtype == DType::F32 && [c, x, y].iter().all(|o| operand(&known, o)),
            Op::Cast(x) | Op::Broadcast(x) => ty.dtype == DType::F32 && operand(&known, x),
            _ => false,
        };
        if !ok || ty.shape.len() > 2 {
            return None;
        }
        known.push(r.clone());
    }
    known.iter().any(|x| x == stored).then(|| Epilogue {
        acc: acc.to_string(),
        stmts: stmts.to_vec(),
        stored: stored.to_string(),
    })
}

/// A grid axis's size (0 for a `dyn` one, which this path does not take).
pub(crate) fn fixed(a: &GridAxis) -> u64 {
    match a.size {
        AxisSize::Fixed(n) => n,
        AxisSize::Dyn => 0,
    }
}

/// The Hopper plan of `v`, when it has the form this path takes (see the module's text).
pub fn recognize(v: &Verified, thread_axis: Option<&str>, schedule: Schedule) -> Option<Gemm> {
    let k = v.kernel();
    if thread_axis.is_some() || v.grid().iter().any(|a| a.size == AxisSize::Dyn) {
        return None;
    }
    let body = &k.body;
    let dot = body.iter().find(|s| matches!(s.op, Op::Dot { .. }))?;
    let Op::Dot { a: Operand::Value(av), b: Operand::Value(bv), trans_a, trans_b } = &dot.op else { return None };
    let p = dot.results[0].as_str();
    let (la, lb) = (def(body, av)?, def(body, bv)?);
    let (a, b) = (whole_load(la)?, whole_load(lb)?);
    let (pa, pb) = (k.param(a)?, k.param(b)?);
    let dtype = pa.ty.dtype;
    if pa.kind != ParamKind::In || pb.kind != ParamKind::In || dtype.bits() != 16 || pb.ty.dtype != dtype {
        return None;
    }
    let single = |x: &str| match analysis::readers(body, x).as_slice() {
        [s] => Some(*s),
        _ => None,
    };
    if !std::ptr::eq(single(av)?, dot) || !std::ptr::eq(single(bv)?, dot) {
        return None;
    }
    // The product's one reader: a store of it, or the add of `load c; add; store c`.
    let reader = single(p)?;
    let grid = v.grid();
    let steps: u64 = grid.iter().filter(|g| g.seq).map(fixed).product();
    let (c, mut taken, accumulates) = if let Op::Store { dst, .. } = &reader.op {
        (whole_store(reader, dst).filter(|x| *x == p).map(|_| dst.as_str())?, vec![la, lb, dot, reader], false)
    } else {
        let Op::Binary(BinaryOp::Add, Operand::Value(x), Operand::Value(y)) = &reader.op else { return None };
        let acc = if x == p { y } else { x };
        let load = def(body, acc)?;
        let c = whole_load(load)?;
        let store = single(&reader.results[0])?;
        if x == y || whole_store(store, c) != Some(reader.results[0].as_str()) || !std::ptr::eq(single(acc)?, reader) {
            return None;
        }
        (c, vec![la, lb, dot, load, reader, store], true)
    };
    let pc = k.param(c)?;
    let scratch = pc.kind == ParamKind::Scratch;
    if !matches!(pc.kind, ParamKind::Out | ParamKind::Scratch) || pc.ty.dtype != DType::F32 || (steps > 1 && !accumulates) {
        return None;
    }
    let at = |s: &Stmt| body.iter().position(|t| std::ptr::eq(t, s));
    // Scratch (zeroed at the start, docs/language.md) accumulates for a `when` at the last step,
    // after the accumulation, that stores it to an output.
    let (out, epilogue) = if scratch {
        let (last, out, e) = last_store(v, body, c, steps.checked_sub(1)?).filter(|_| accumulates && steps > 1)?;
        if at(last[0])? < at(taken[5])? {
            return None;
        }
        taken.extend(last);
        (out, Some(e))
    } else {
        (c, None)
    };
    let init = match zero_init(v, body, c) {
        Some(z) if accumulates && at(z[0])? < at(taken[3])? => {
            taken.extend(z);
            Init::Zero
        }
        Some(_) => return None,
        None if accumulates && !scratch => Init::Output,
        None => Init::Zero,
    };
    // Nothing else in the body (the two `when`s may share their `program_id`).
    taken.sort_by_key(|s| *s as *const Stmt as usize);
    taken.dedup_by(|x, y| std::ptr::eq(*x, *y));
    if body.len() != taken.len() || taken.iter().any(|s| at(s).is_none()) {
        return None;
    }
    let po = k.param(out)?;
    if po.kind != ParamKind::Out || po.ty.shape.len() != 2 || !po.ty.dtype.is_float() {
        return None;
    }
    // Tensor copies run stages ahead of the step they serve: their blocks follow the grid alone.
    if k.params.iter().filter_map(|p| p.block.as_ref()).any(|b| b.index.iter().any(|e| e.affine().is_none())) {
        return None;
    }
    // Shapes: 2-D arrays, blocks the instruction and the swizzle tile.
    let (ba, bb, bc) = (pa.block_shape(), pb.block_shape(), pc.block_shape());
    if pa.ty.shape.len() != 2 || pb.ty.shape.len() != 2 || po.block_shape() != bc {
        return None;
    }
    let (bm, bk) = if *trans_a { (ba[1], ba[0]) } else { (ba[0], ba[1]) };
    let (bkb, bn) = if *trans_b { (bb[1], bb[0]) } else { (bb[0], bb[1]) };
    let b_granule = if *trans_b { 8 } else { ROW };
    let shapes_fit = bkb == bk
        && bc == [bm, bn]
        && bm % WG_ROWS == 0
        && (1..=4).contains(&(bm / WG_ROWS))
        && bn % b_granule == 0
        && (8..=256).contains(&bn)
        && bk % ROW == 0
        && bk <= 256
        && bm * bn <= MAX_ACCUMULATOR;
    // Every epilogue value broadcasts against the output block, and the stored one is it.
    if let Some(e) = &epilogue {
        let fits = |shape: &[usize]| shape.len() <= 2 && shape.iter().rev().zip([bn, bm]).all(|(&d, b)| d == 1 || d == b);
        let shape_of = |x: &str| e.stmts.iter().find(|s| s.results[0] == x).and_then(|s| s.ty.as_ref()).map(|t| t.shape.clone());
        if !e.stmts.iter().all(|s| s.ty.as_ref().is_some_and(|t| fits(&t.shape)))
            || (e.stored != e.acc && shape_of(&e.stored) != Some(vec![bm, bn]))
        {
            return None;
        }
    }
    // A tensor map's rows must be 16-byte multiples apart.
    let strides_fit = pa.ty.shape[1] % 8 == 0 && pb.ty.shape[1] % 8 == 0;
    if !shapes_fit || !strides_fit {
        return None;
    }
    // The output block: the same at every step, and no two programs share one.
    let cb = po.block.as_ref();
    let seq_free = cb.is_none_or(|b| {
        b.index
            .iter()
            .all(|e| e.affine().is_some_and(|e| e.terms.iter().all(|(_, n)| grid.iter().any(|g| &g.name == n && !g.seq))))
    });
    let told_apart = grid.iter().filter(|g| !g.seq && fixed(g) > 1).all(|g| {
        cb.is_some_and(|b| {
            b.index.iter().any(|e| matches!(e.affine().map(|e| e.terms.as_slice()), Some([(c, n)]) if *c != 0 && n == &g.name))
        })
    });
    if !seq_free || !told_apart {
        return None;
    }
    let mut g = Gemm {
        a: a.to_string(),
        b: b.to_string(),
        c: c.to_string(),
        out: out.to_string(),
        out_dtype: po.ty.dtype,
        dtype,
        bm,
        bn,
        bk,
        a_k_major: !*trans_a,
        b_k_major: *trans_b,
        steps,
        // A persistent CTA's stages run on into its next block's steps.
        stages: if schedule == Schedule::Persistent { MAX_STAGES } else { steps.min(MAX_STAGES) },
        init,
        maps: [
            TensorMapSpec::swizzled(a, [ROW as u32, if *trans_a { bk } else { bm } as u32]),
            TensorMapSpec::swizzled(b, [ROW as u32, if *trans_b { bn } else { bk } as u32]),
        ],
        epilogue,
        schedule,
    };
    while g.shared_bytes() > MAX_SHARED_BYTES && g.stages > 1 {
        g.stages -= 1;
    }
    let threads = g.cta_warpgroups() * THREADS;
    (g.shared_bytes() <= MAX_SHARED_BYTES && (g.stages >= 2 || steps == 1) && threads <= 1024).then_some(g)
}
