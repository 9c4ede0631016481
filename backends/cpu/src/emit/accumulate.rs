//! `c += a b` as one product added into `c`'s memory: the four statements a matmul's step is
//! written in (`%acc = load c`, `%p = dot %a, %b`, `%s = add %acc, %p`, `store c, %s`, the load
//! before or after the product) become one call that reads `c`, adds the product and writes it
//! back — no copy of the block in, no product in the arena, no pass to add them. The sum is the
//! product's terms and `c` added in another order than the statements say, which the language
//! allows a product (docs/language.md §8: its order of sums is open).
//!
//! Found by `analysis::accumulations` (the four in one body, the three values read once, nothing
//! else between touching `c`, the pattern wgpu's resident outputs take too), and taken where `c`
//! is a 2-D `f32` output block or scratch read and written whole, unmasked. An output block is used in place where it lies inside its array, through a copy where
//! it crosses an edge (zeros read outside, only the inside written back), as the load and store
//! would.

use std::collections::HashSet;

use tessel_plugin_api::ir::{DType, Op, ParamKind, Stmt, analysis};

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
        let once = |name: &str| self.uses.get(&self.id(name)) == Some(&1);
        let mut found = Vec::new();
        for a in analysis::accumulations(stmts, once) {
            let (Op::Store { dst, index, mask: None, .. }, Op::Load { index: read, mask: None, .. }) =
                (&stmts[a.store].op, &stmts[a.load].op)
            else {
                continue;
            };
            let (_, p) = self.param(dst);
            let ty = |i: usize| self.ty(self.id(&stmts[i].results[0]));
            let fits = whole(index)
                && whole(read)
                && p.ty.dtype == DType::F32
                && p.ty.shape.len() == 2
                && p.block_shape() == ty(a.load).shape.as_slice()
                && ty(a.dot) == ty(a.load)
                && ty(a.add) == ty(a.load)
                && p.kind != ParamKind::In;
            if fits {
                let absorbed = [&stmts[a.load], &stmts[a.add], &stmts[a.store]];
                found.push(Accumulation { dot: &stmts[a.dot], absorbed, c: dst });
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
