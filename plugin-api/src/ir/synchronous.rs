//! The concurrent model's statements as synchronous ones, for a backend that runs a program as
//! one thread (wgpu, a plugin): where each program has one thread, a kernel without a data race
//! (which the reference interpreter checks, docs/language.md "Threads, barriers and asynchronous
//! operations") gives the same results when every asynchronous operation completes where it is
//! issued, so
//!
//! - `copy_async DST, SRC ...` becomes `%v = load SRC` and `store DST, %v`;
//! - `mma_async ACC, A, B` becomes loads of the three, a `dot` (of `i32` casts for narrower
//!   integers), an `add` into the accumulator and its `store`;
//! - `arrive`, `wait`, `fence`, `commit_copies`, `wait_copies` and `mma_wait` are dropped, and
//!   so are the kernel's barriers.
//!
//! A kernel with a `thread` axis of more than one point is first made one thread with its
//! schedule compiled in ([`schedule::scheduled`]); [`synchronous`] says where it cannot be.
//!
//! A backend whose threads of a program do run at once and wait for each other (Mosaic GPU's
//! warpgroups) keeps the threads and barriers and makes only each thread's copies and products
//! synchronous ([`per_thread`]): a copy that lands as an arrival becomes its load, its store and
//! the thread's own `arrive`, so the arrival still comes once the data is in place.

use std::borrow::Cow;

use super::legalize::Names;
use super::schedule::{self, Unscheduled};
use super::*;

/// `v` with its threads scheduled as one and its asynchronous statements made synchronous; `v`
/// itself where it has neither.
pub fn synchronous(v: &Verified) -> Result<Cow<'_, Verified>, Unscheduled> {
    if let Some(kernel) = schedule::scheduled(v)? {
        let one = verify::verify_derived(&kernel)
            .unwrap_or_else(|d| panic!("kernel `{}` scheduled as one thread does not verify:\n{d}", v.name()));
        return Ok(Cow::Owned(lifted(&one)));
    }
    if !v.kernel().is_concurrent() {
        return Ok(Cow::Borrowed(v));
    }
    Ok(Cow::Owned(lifted(v)))
}

/// `v` with each thread's asynchronous copies and products made synchronous, its threads and
/// barriers kept: for a backend whose threads of a program run at once and wait for each other
/// at barriers (Mosaic GPU's warpgroups), but which copies and multiplies with the issuing
/// thread itself. A copy that lands as an arrival becomes its load, its store and an `arrive`
/// on that barrier (the thread's own arrival, made once the data is in place); `arrive` and
/// `wait` stay; `fence`, `commit_copies`, `wait_copies` and `mma_wait` are dropped, since what
/// they wait for is done where it is issued. A statement that `keep` takes stays as it is (the
/// backend makes it asynchronous itself, waits and all: Mosaic GPU's copies by TMA, products on
/// `wgmma`, and their waits). A kernel without asynchronous statements is `v`.
pub fn per_thread<'v>(v: &'v Verified, keep: &dyn Fn(&SyncOp) -> bool) -> Cow<'v, Verified> {
    let asynchronous = |s: &Stmt| matches!(&s.op, Op::Sync(op) if !matches!(op, SyncOp::Arrive(_) | SyncOp::Wait(_)));
    let mut any = false;
    analysis::visit(&v.kernel().body, &mut |s| any |= asynchronous(s));
    if !any {
        return Cow::Borrowed(v);
    }
    Cow::Owned(rewritten(v, true, keep))
}

/// `v`'s asynchronous statements made synchronous and its barriers dropped.
fn lifted(v: &Verified) -> Verified {
    rewritten(v, false, &|_| false)
}

/// `v`'s copies (but those `keep` takes) and products made synchronous; its barriers,
/// `arrive`s and `wait`s kept or dropped as `barriers` says.
fn rewritten(v: &Verified, barriers: bool, keep: &dyn Fn(&SyncOp) -> bool) -> Verified {
    let mut kernel = v.kernel().clone();
    if !barriers {
        kernel.barriers.clear();
    }
    let mut names = Names::new(v);
    kernel.body = rewrite(std::mem::take(&mut kernel.body), &mut names, barriers, keep);
    verify::verify_derived(&kernel).unwrap_or_else(|d| panic!("kernel `{}` made synchronous does not verify:\n{d}", v.name()))
}

fn rewrite(body: Vec<Stmt>, names: &mut Names<'_>, barriers: bool, keep: &dyn Fn(&SyncOp) -> bool) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for mut s in body {
        for b in s.op.bodies_mut() {
            *b = rewrite(std::mem::take(b), names, barriers, keep);
        }
        match &s.op {
            Op::Sync(op) if barriers && !matches!(op, SyncOp::Arrive(_) | SyncOp::Wait(_)) && keep(op) => out.push(s),
            Op::Sync(SyncOp::Copy { dst, src, arrive }) => {
                let v = names.fresh("copied");
                out.push(load(&v, src, s.span));
                out.push(store(dst, &v, s.span));
                if let (true, Some(b)) = (barriers, arrive) {
                    out.push(Stmt { results: Vec::new(), op: Op::Sync(SyncOp::Arrive(b.clone())), ty: None, span: s.span });
                }
            }
            Op::Sync(SyncOp::Mma { acc, a, b, trans_a, trans_b }) => {
                out.extend(product(acc, a, b, (*trans_a, *trans_b), s.span, names))
            }
            Op::Sync(SyncOp::Arrive(_) | SyncOp::Wait(_)) if barriers => out.push(s),
            Op::Sync(_) => {}
            _ => out.push(s),
        }
    }
    out
}

fn load(name: &str, r: &RefAt, span: Span) -> Stmt {
    let op = Op::Load { src: r.name.clone(), index: r.index.clone(), mask: None, other: None };
    Stmt { results: vec![name.to_string()], op, ty: None, span }
}

fn store(r: &RefAt, value: &str, span: Span) -> Stmt {
    let op = Op::Store { dst: r.name.clone(), index: r.index.clone(), value: Operand::value(value), mask: None };
    Stmt { results: Vec::new(), op, ty: None, span }
}

/// `ACC += A @ B`, one statement after another.
fn product(acc: &RefAt, a: &MmaLhs, b: &RefAt, (trans_a, trans_b): (bool, bool), span: Span, names: &mut Names<'_>) -> Vec<Stmt> {
    let stmt = |name: &str, op: Op, ty: Option<Type>| Stmt { results: vec![name.to_string()], op, ty, span };
    let k = names.v.kernel();
    let dtype = k.param(&b.name).expect("verified operand").ty.dtype;
    let acc_dtype = k.param(&acc.name).expect("verified accumulator").ty.dtype;
    let mut out = Vec::new();
    // Each operand as a value (a region loaded), widened to the accumulator's integers.
    let mut operand = |a: &MmaLhs, which: &str, out: &mut Vec<Stmt>| {
        let (v, shape) = match a {
            MmaLhs::Ref(r) => {
                let v = names.fresh(which);
                out.push(load(&v, r, span));
                (Operand::value(&v), analysis::region_shape(k.param(&r.name).expect("verified operand"), r.index.as_deref()))
            }
            MmaLhs::Value(v) => {
                let Operand::Value(n) = v else { unreachable!("the verifier takes a value") };
                (v.clone(), names.v.value_type(n).shape.clone())
            }
        };
        if dtype.is_float() || dtype == acc_dtype {
            return v;
        }
        let wide = names.fresh(&format!("{which}_wide"));
        out.push(stmt(&wide, Op::Cast(v), Some(Type::array(acc_dtype, shape))));
        Operand::value(&wide)
    };
    let x = operand(a, "mma_a", &mut out);
    let y = operand(&MmaLhs::Ref(b.clone()), "mma_b", &mut out);
    let (c, d, e) = (names.fresh("mma_acc"), names.fresh("mma_product"), names.fresh("mma_sum"));
    out.push(load(&c, acc, span));
    out.push(stmt(&d, Op::Dot { a: x, b: y, trans_a, trans_b }, None));
    out.push(stmt(&e, Op::Binary(BinaryOp::Add, Operand::value(&c), Operand::value(&d)), None));
    out.push(store(acc, &e, span));
    out
}
