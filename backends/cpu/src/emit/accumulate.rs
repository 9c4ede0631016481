//! `c += a b` as one product added into `c`'s memory: the four statements a matmul's step is
//! written in (`%acc = load c`, `%p = dot %a, %b`, `%s = add %acc, %p`, `store c, %s`, the load
//! before or after the product) become one call that reads `c`, adds the product and writes it
//! back — no copy of the block in, no product in the arena, no pass to add them. The sum is the
//! product's terms and `c` added in another order than the statements say, which the language
//! allows a product (docs/language.md §8: its order of sums is open).
//!
//! Taken where nothing else between the first of the four and the store touches `c`, `c` is a
//! 2-D `f32` output block or scratch read and written whole, and the three values have no other
//! reader. An output block is used in place where it lies inside its array, through a copy where
//! it crosses an edge (zeros read outside, only the inside written back), as the load and store
//! would.

use std::collections::HashSet;

use tessel_plugin_api::ir::{BinaryOp, DType, Op, Operand, ParamKind, Stmt, analysis};

use super::Writer;
use super::group::whole;
use super::shape::Product;

/// One `c += a b` found in a body.
pub(super) struct Accumulation<'v> {
    /// The `dot`, emitted where it stands.
    pub(super) dot: &'v Stmt,
    /// The load of `c`, the `add` and the store, not emitted.
    pub(super) absorbed: [&'v Stmt; 3],
    /// The reference `c`.
    c: &'v str,
}

impl<'v> Writer<'v, '_> {
    /// Every `c += a b` of `stmts` (the body itself, not nested ones: those are found when their
    /// body is written).
    pub(super) fn accumulations(&self, stmts: &'v [Stmt]) -> Vec<Accumulation<'v>> {
        let def = |name: &str| stmts.iter().position(|t| t.results.iter().any(|r| r == name));
        let once = |name: &str| self.uses.get(&self.id(name)) == Some(&1);
        let mut found = Vec::new();
        for (si, s) in stmts.iter().enumerate() {
            let Op::Store { dst, index, value: Operand::Value(sum), mask: None } = &s.op else { continue };
            let Some(ai) = def(sum) else { continue };
            let Op::Binary(BinaryOp::Add, Operand::Value(x), Operand::Value(y)) = &stmts[ai].op else { continue };
            let (Some(xi), Some(yi)) = (def(x), def(y)) else { continue };
            let (li, di) = if matches!(stmts[xi].op, Op::Dot { .. }) { (yi, xi) } else { (xi, yi) };
            let (Op::Dot { .. }, Op::Load { src, index: read, mask: None, .. }) = (&stmts[di].op, &stmts[li].op) else {
                continue;
            };
            if src != dst || !whole(index) || !whole(read) || ![sum, x, y].into_iter().all(|v| once(v)) {
                continue;
            }
            let (_, p) = self.param(dst);
            let ty = |i: usize| self.ty(self.id(&stmts[i].results[0]));
            let fits = p.ty.dtype == DType::F32
                && p.ty.shape.len() == 2
                && p.block_shape() == ty(li).shape.as_slice()
                && ty(di) == ty(li)
                && ty(ai) == ty(li)
                && p.kind != ParamKind::In;
            let first = li.min(di);
            let apart =
                (first..=si).all(|k| k == li || k == si || analysis::accesses(std::slice::from_ref(&stmts[k]), dst).is_empty());
            if fits && apart {
                found.push(Accumulation { dot: &stmts[di], absorbed: [&stmts[li], &stmts[ai], &stmts[si]], c: dst });
            }
        }
        found
    }

    /// The product of `acc` added into its `c`.
    pub(super) fn accumulate(&mut self, acc: &Accumulation<'v>) {
        let Op::Dot { a, b, trans_a, trans_b } = &acc.dot.op else { unreachable!("accumulations: a dot") };
        let id = self.id(&acc.dot.results[0]);
        let (n, p) = self.param(acc.c);
        let (bm, bn) = (p.block_shape()[0], p.block_shape()[1]);
        if p.kind == ParamKind::Scratch {
            let (c, ld) = (format!("a{n}"), bn.to_string());
            return self.dot(&Product { c: &c, ldc: &ld, accumulate: true }, id, a, b, *trans_a, *trans_b);
        }
        let (rows, cols) = (p.ty.shape[0], p.ty.shape[1]);
        let (o0, o1) = if p.block.is_some() { (format!("o{n}_0"), format!("o{n}_1")) } else { ("0".into(), "0".into()) };
        let (copy, c, ld, fast) = (self.fresh("cb"), self.fresh("c"), self.fresh("ldc"), self.fresh("inside"));
        self.alloc(&copy, "float", bm * bn);
        self.line(format!("const int {fast} = {o0} >= 0 && {o0} + {bm} <= {rows} && {o1} >= 0 && {o1} + {bn} <= {cols};"));
        self.line(format!("float *const {c} = {fast} ? a{n} + {o0} * {cols} + {o1} : {copy};"));
        self.line(format!("const int64_t {ld} = {fast} ? {cols} : {bn};"));
        let each = format!("for (int64_t i = 0; i < {bm}; i++) for (int64_t j = 0; j < {bn}; j++) {{");
        let inside = format!("const int in = (uint64_t)({o0} + i) < {rows}u && (uint64_t)({o1} + j) < {cols}u;");
        let at = format!("({o0} + i) * {cols} + {o1} + j");
        // Read at element 0 where outside, then select: no read inside a selection (group.rs).
        self.line(format!(
            "if (!{fast}) {each} {inside} const float l = a{n}[in ? {at} : 0]; {copy}[i * {bn} + j] = in ? l : 0.0f; }}"
        ));
        self.dot(&Product { c: &c, ldc: &ld, accumulate: true }, id, a, b, *trans_a, *trans_b);
        self.line(format!("if (!{fast}) {each} {inside} if (in) a{n}[{at}] = {copy}[i * {bn} + j]; }}"));
    }

    /// The statements of `found` that are not emitted, by address.
    pub(super) fn absorbed(found: &[Accumulation<'v>]) -> HashSet<usize> {
        found.iter().flat_map(|f| f.absorbed).map(|s| s as *const Stmt as usize).collect()
    }
}
