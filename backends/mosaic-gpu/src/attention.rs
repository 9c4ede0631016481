//! The Hopper path for attention (emit/attention.rs writes it): which kernels take it and how.
//!
//! A kernel takes it when it is a flash-attention forward written the way Pallas's attention
//! kernels are: a program owns `BQ` query rows (`load q` of a `[BQ, D]` block of `f16`/`bf16`),
//! and one `for` loop walks the keys `BKV` rows at a time (`load k[ds(s, BKV), :]`,
//! `load v[ds(t, BKV), :]` of whole 2-D arrays), computing `%s = dot %q, %kb trans_b` and
//! `dot %p, %vb` of the same `f16`/`bf16` (the probabilities cast back) with any row-wise work
//! between them: elementwise ops, `max`/`min`/`sum` along the rows, `iota` and `program_id` for
//! masks, an `if` on a scalar (causal block skipping) yielding the carried values. Values are
//! scalars, rows (`[BQ]`, `[BQ, 1]`) or row blocks (`[BQ, N]`); after the loop the output block
//! `[BQ, DV]` is stored from registers. Anything else takes the general path (`lower.rs`).
//!
//! On this path a CTA of one to four warpgroups runs one program, each warpgroup 64 query rows.
//! Thread 0 copies the query block into shared memory once and the key and value blocks of
//! each trip into one of `stages` stages (TMA, 128-byte swizzle, an mbarrier per stage), `stages`
//! trips ahead. Each trip: `wgmma` m64nBKVk16 makes the scores `Q Kᵀ` in `f32` registers (the
//! accumulator layout, [`crate::wgmma`]), the row-wise work runs on those registers (row
//! reductions across the four lanes that share a row by `shfl.sync.bfly`), the probabilities go
//! to shared memory in `f16`/`bf16` (the swizzled layout a `wgmma` operand is read from), and
//! `wgmma` m64nDVk16 adds `P V` into the output's registers (`add %o, %pv` folded into the
//! instruction's accumulation). A trip's copies land while earlier trips compute.

use tessel_plugin_api::ir::*;

use crate::limits::{MAX_SHARED_BYTES, THREADS};
use crate::wgmma::{ROW, Schedule, TensorMapSpec, WG_ROWS, fixed};

/// The most stages (trips whose key and value blocks are in flight).
pub const MAX_STAGES: u64 = 3;

/// An attention kernel on the Hopper path.
#[derive(Clone, Debug)]
pub struct Attention {
    /// The query, key and value arrays (`in`), and the output stored from registers.
    pub q: String,
    pub k: String,
    pub v: String,
    pub out: String,
    /// `f16` or `bf16`.
    pub dtype: DType,
    /// Query rows of a program, the head dimension (`q`'s and `k`'s columns), key rows of a trip
    /// and the value's columns.
    pub bq: usize,
    pub d: usize,
    pub bkv: usize,
    pub dv: usize,
    /// Trips whose blocks are in flight.
    pub stages: u64,
    /// Tensor maps of `q`, `k` and `v`.
    pub maps: [TensorMapSpec; 3],
    /// The values: `q`'s load, the scores, the product `P V` and, where its one reader is
    /// `add %o, %pv`, that add's result (the product accumulates into `%o`'s registers).
    pub q_value: String,
    pub scores: String,
    pub product: String,
    pub folded: Option<String>,
    /// Where each trip's key and value rows start: the `ds` start of each load.
    pub k_start: Operand,
    pub v_start: Operand,
    /// How the CTA divides its work: [`Schedule::Cooperative`], or warp-specialized (a producer
    /// warpgroup copies every trip's blocks, stages handed back on `empty` mbarriers) for
    /// [`Schedule::Specialized`] and [`Schedule::Persistent`] alike (a program's trips already
    /// run in one CTA: the grid stays one CTA a program).
    pub schedule: Schedule,
}

impl Attention {
    /// Warpgroups that compute: one per 64 query rows.
    pub fn warpgroups(&self) -> u32 {
        (self.bq / WG_ROWS) as u32
    }

    /// Warpgroups per CTA: those that compute, and the producer where the schedule has one.
    pub fn cta_warpgroups(&self) -> u32 {
        self.warpgroups() + u32::from(self.schedule.specialized())
    }

    pub fn q_bytes(&self) -> u64 {
        (self.bq * self.d * 2) as u64
    }

    pub fn p_bytes(&self) -> u64 {
        (self.bq * self.bkv * 2) as u64
    }

    pub fn k_bytes(&self) -> u64 {
        (self.bkv * self.d * 2) as u64
    }

    /// One stage: a key block, then a value block.
    pub fn stage_bytes(&self) -> u64 {
        self.k_bytes() + (self.bkv * self.dv * 2) as u64
    }

    /// Where the stages start: after the query block and the probabilities.
    pub fn stages_at(&self) -> u64 {
        self.q_bytes() + self.p_bytes()
    }

    /// Dynamic shared memory: the query block, the probabilities, the stages (all 1024-byte
    /// multiples, as the swizzle needs), then an mbarrier for the query and one per stage (its
    /// blocks landed), and with a producer one more per stage (its consumers are done with it).
    pub fn shared_bytes(&self) -> u64 {
        let per_stage = if self.schedule.specialized() { 2 } else { 1 };
        self.stages_at() + self.stages * self.stage_bytes() + 8 * (1 + per_stage * self.stages)
    }
}

/// How the path holds a value: one register, a register per row half, or a register per
/// accumulator element of a `[BQ, N]` block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Class {
    Scalar,
    Row,
    Block(usize),
}

/// The class of a value of type `ty` in a program of `bq` rows, or `None` where the path does
/// not hold such values: one element, `[BQ]` or `[BQ, 1]`, `[BQ, N]` with `N` a multiple of 8 up
/// to 256.
pub fn class(ty: &Type, bq: usize) -> Option<Class> {
    let ok = matches!(ty.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::U32 | DType::Bool);
    match ty.shape.as_slice() {
        _ if !ok => None,
        s if s.iter().all(|&d| d == 1) => Some(Class::Scalar),
        [r] | [r, 1] if *r == bq => Some(Class::Row),
        [r, n] if *r == bq && n % 8 == 0 && *n <= 256 => Some(Class::Block(*n)),
        _ => None,
    }
}

/// Whether a value of type `from` broadcasts to `to` element by element on this path: a scalar
/// to anything, a row `[BQ, 1]` to a block, anything to its own shape. (`[BQ]` against
/// `[BQ, N]` broadcasts along the columns, which this path does not hold.)
pub fn broadcasts(from: &Type, to: &Type, bq: usize) -> bool {
    match (class(from, bq), class(to, bq)) {
        (Some(Class::Scalar), Some(_)) => true,
        (Some(Class::Row), Some(Class::Block(_))) => from.shape.len() == 2,
        (Some(a), Some(b)) => a == b && (from.shape == to.shape || a == Class::Row),
        _ => false,
    }
}

/// The one statement of `body` (nested bodies included) that defines `value`.
fn def<'b>(body: &'b [Stmt], value: &str) -> Option<&'b Stmt> {
    let mut found = None;
    analysis::visit(body, &mut |s: &'b Stmt| {
        if s.results.iter().any(|r| r == value) {
            found = Some(s);
        }
    });
    found
}

/// `load P[ds(start, n), :]` of a whole 2-D array: `P`, `start` and `n`.
fn row_slice(s: &Stmt) -> Option<(&str, &Operand, usize)> {
    match &s.op {
        Op::Load { src, index: Some(ix), mask: None, other } if other.is_none_or(|o| o.as_f64() == 0.0) => match ix.as_slice() {
            [Index::Slice { start, size, stride: 1 }, Index::Full] => Some((src, start, *size)),
            _ => None,
        },
        _ => None,
    }
}

/// Whether every statement of `body` is one the path writes (besides the loads and dots it takes
/// itself, in `special`), its values in classes the path holds.
fn supported(v: &Verified, body: &[Stmt], bq: usize, special: &[&Stmt], out: &str) -> bool {
    let ty = |o: &Operand| match o {
        Operand::Value(x) => Some(v.value_type(x).clone()),
        Operand::Lit(_) => None,
    };
    body.iter().all(|s| {
        if special.iter().any(|t| std::ptr::eq(*t, s)) {
            return true;
        }
        let results_ok = s.results.iter().all(|r| class(v.value_type(r), bq).is_some());
        let to = s.results.first().map(|r| v.value_type(r).clone());
        let fits = |o: &Operand| match (ty(o), &to) {
            (None, _) => true,
            (Some(f), Some(t)) => broadcasts(&f, t, bq),
            (Some(_), None) => false,
        };
        results_ok
            && match &s.op {
                Op::ProgramId(_) | Op::NumPrograms(_) | Op::Full(_) | Op::Zeros => true,
                Op::Iota { dim } => to.as_ref().is_some_and(|t| *dim < t.shape.len() && t.shape.len() <= 2),
                Op::Unary(_, x) | Op::Cast(x) | Op::Broadcast(x) => fits(x),
                Op::Binary(_, x, y) | Op::Compare(_, x, y) => fits(x) && fits(y),
                Op::Select(c, x, y) => fits(c) && fits(x) && fits(y),
                // Between `[BQ]` and `[BQ, 1]`, or between scalars: the same registers.
                Op::Reshape(x) => ty(x).zip(to.clone()).is_some_and(|(f, t)| {
                    class(&f, bq) == class(&t, bq)
                        && (f.shape == t.shape || matches!(class(&t, bq), Some(Class::Row | Class::Scalar)))
                }),
                Op::Reduce { op: _, arg, axis, keepdims: _ } => {
                    ty(arg).is_some_and(|a| matches!(class(&a, bq), Some(Class::Block(_))) && *axis == 1)
                        && to.as_ref().is_some_and(|t| class(t, bq) == Some(Class::Row))
                }
                // An `if` yields values (one without results would only guard stores and
                // statements whose values it drops).
                Op::If(ie) => {
                    !s.results.is_empty()
                        && ty(&ie.cond).is_none_or(|c| class(&c, bq) == Some(Class::Scalar))
                        && supported(v, &ie.then, bq, special, out)
                        && supported(v, &ie.els, bq, special, out)
                }
                Op::Yield(_) => true,
                Op::Store { dst, index: None, value: Operand::Value(x), mask: None } => {
                    dst == out && v.kernel().param(dst).is_some_and(|p| p.block_shape() == v.value_type(x).shape.as_slice())
                }
                _ => false,
            }
    })
}

/// The Hopper attention plan of `v`, when it has the form this path takes (the module's text).
pub fn recognize(v: &Verified, thread_axis: Option<&str>, schedule: Schedule) -> Option<Attention> {
    let k = v.kernel();
    let grid = v.grid();
    if thread_axis.is_some() || grid.iter().any(|a| a.size == AxisSize::Dyn || (a.seq && fixed(a) > 1)) {
        return None;
    }
    let body = &k.body;
    let [lp] = body.iter().filter(|s| matches!(s.op, Op::For(_))).collect::<Vec<_>>()[..] else { return None };
    let Op::For(f) = &lp.op else { return None };
    if f.cond.is_some() {
        return None;
    }
    let mut dots = Vec::new();
    analysis::visit(&f.body, &mut |s: &Stmt| {
        if matches!(s.op, Op::Dot { .. }) {
            dots.push(s);
        }
    });
    let [sd, pd] = dots[..] else { return None };
    let Op::Dot { a: Operand::Value(qv), b: Operand::Value(kv), trans_a: false, trans_b: true } = &sd.op else { return None };
    let Op::Dot { a: Operand::Value(pv), b: Operand::Value(vv), trans_a: false, trans_b: false } = &pd.op else { return None };
    // `q`: a whole load at the top, read by the scores' dot alone.
    let ql = body.iter().find(|s| s.results.first() == Some(qv))?;
    let Op::Load { src: q, index: None, mask: None, other } = &ql.op else { return None };
    if other.is_some_and(|o| o.as_f64() != 0.0) || analysis::readers(body, qv).len() != 1 {
        return None;
    }
    let (kl, vl) = (def(&f.body, kv)?, def(&f.body, vv)?);
    let ((kn, k_start, bkv), (vn, v_start, bkv2)) = (row_slice(kl)?, row_slice(vl)?);
    // Keys and values from two arrays: a tensor map each.
    if bkv != bkv2 || kn == vn || analysis::readers(body, kv).len() != 1 || analysis::readers(body, vv).len() != 1 {
        return None;
    }
    let (pq, pk, pvp) = (k.param(q)?, k.param(kn)?, k.param(vn)?);
    let dtype = pq.ty.dtype;
    let inputs = [pq, pk, pvp];
    if inputs.iter().any(|p| p.kind != ParamKind::In || p.ty.dtype != dtype || p.ty.shape.len() != 2)
        || dtype.bits() != 16
        || !dtype.is_float()
    {
        return None;
    }
    if pk.block.is_some() || pvp.block.is_some() {
        return None;
    }
    let (bq, d) = match pq.block_shape() {
        [bq, d] if *d == pq.ty.shape[1] => (*bq, *d),
        _ => return None,
    };
    let dv = pvp.ty.shape[1];
    if pk.ty.shape[1] != d || v.value_type(pv).dtype != dtype || v.value_type(pv).shape != [bq, bkv] {
        return None;
    }
    let fits = bq % WG_ROWS == 0
        && (1..=4).contains(&(bq / WG_ROWS))
        && [d, bkv, dv].iter().all(|&n| n % ROW == 0 && n <= 256)
        && bkv + dv <= 256;
    if !fits {
        return None;
    }
    // The blocks follow the grid alone (the query's copy is made before anything is computed).
    let affine = |p: &Param| p.block.as_ref().is_none_or(|b| b.index.iter().all(|e| e.affine().is_some()));
    // The one output, stored whole from registers once the loop is done.
    let outs: Vec<&Param> = k.params.iter().filter(|p| p.kind == ParamKind::Out).collect();
    let [po] = outs[..] else { return None };
    if k.params.iter().any(|p| p.kind == ParamKind::Scratch)
        || !affine(pq)
        || !affine(po)
        || po.ty.shape.len() != 2
        || po.block_shape() != [bq, dv]
        || !po.ty.dtype.is_float()
    {
        return None;
    }
    // The product's one reader, where it is `add %o, %pv` of a block of its shape, takes it as
    // its accumulation.
    let product = pd.results[0].clone();
    let folded = match analysis::readers(&f.body, &product).as_slice() {
        [s] => match &s.op {
            Op::Binary(BinaryOp::Add, Operand::Value(x), Operand::Value(y)) if (x == &product) != (y == &product) => {
                let other = if x == &product { y } else { x };
                (v.value_type(other).shape == [bq, dv]).then(|| s.results[0].clone())
            }
            _ => None,
        },
        _ => None,
    };
    // Every other statement is one the path writes, and the starts depend on the trip alone.
    let special = [ql, lp, kl, vl, sd, pd];
    let scalar = |o: &Operand| match o {
        Operand::Value(x) => class(v.value_type(x), bq) == Some(Class::Scalar),
        Operand::Lit(_) => true,
    };
    let carried_ok = lp.results.iter().all(|r| class(v.value_type(r), bq).is_some())
        && f.iters.iter().all(|(r, _)| class(v.value_type(r), bq).is_some())
        && [&f.lo, &f.hi].into_iter().chain(f.step.as_ref()).all(scalar);
    if !carried_ok {
        return None;
    }
    if !supported(v, body, bq, &special, &po.name) || !supported(v, &f.body, bq, &special, &po.name) {
        return None;
    }
    // The output's one store comes after the loop, at the top.
    let mut inner_store = false;
    analysis::visit(&f.body, &mut |s: &Stmt| inner_store |= matches!(s.op, Op::Store { .. }));
    let at = |s: &Stmt| body.iter().position(|t| std::ptr::eq(t, s));
    let stores: Vec<usize> = body.iter().enumerate().filter(|(_, s)| matches!(s.op, Op::Store { .. })).map(|(i, _)| i).collect();
    if inner_store || stores.len() != 1 || stores[0] < at(lp)? {
        return None;
    }
    let carried: Vec<&str> = f.iters.iter().map(|(n, _)| n.as_str()).collect();
    if !trip_only(&f.body, &f.var, &carried, k_start) || !trip_only(&f.body, &f.var, &carried, v_start) {
        return None;
    }
    let mut a = Attention {
        q: q.clone(),
        k: kn.to_string(),
        v: vn.to_string(),
        out: po.name.clone(),
        dtype,
        bq,
        d,
        bkv,
        dv,
        stages: MAX_STAGES,
        maps: [
            TensorMapSpec::swizzled(q, [ROW as u32, bq as u32]),
            TensorMapSpec::swizzled(kn, [ROW as u32, bkv as u32]),
            TensorMapSpec::swizzled(vn, [ROW as u32, bkv as u32]),
        ],
        q_value: qv.clone(),
        scores: sd.results[0].clone(),
        product,
        folded,
        k_start: k_start.clone(),
        v_start: v_start.clone(),
        schedule,
    };
    while a.shared_bytes() > MAX_SHARED_BYTES && a.stages > 1 {
        a.stages -= 1;
    }
    (a.shared_bytes() <= MAX_SHARED_BYTES && a.cta_warpgroups() * THREADS <= 1024).then_some(a)
}

/// Whether `start` is a literal, the loop variable, a value from before the loop, or a scalar
/// integer `add`/`sub`/`mul` of those, computed in the loop's own body (not under an `if`): then
/// the start of any trip can be computed before the trip, for its copies.
fn trip_only(body: &[Stmt], var: &str, carried: &[&str], start: &Operand) -> bool {
    match start {
        Operand::Lit(_) => true,
        Operand::Value(x) if x == var => true,
        // A carried value changes from trip to trip: a later trip's is not known yet.
        Operand::Value(x) if carried.contains(&x.as_str()) => false,
        Operand::Value(x) => match body.iter().find(|s| s.results.first() == Some(x)) {
            None => def(body, x).is_none(),
            Some(s) => match &s.op {
                Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul, a, b) => {
                    trip_only(body, var, carried, a) && trip_only(body, var, carried, b)
                }
                _ => false,
            },
        },
    }
}
