//! Reductions: along the rows an invocation owns (the row layout), made in the loop that makes
//! their operand (fused), or read from the workspace; float `max`/`min` propagate NaN.

use tessel_plugin_api::ir::*;

use super::Writer;
use crate::conv::{float_lit, from_word, literal, reg_ty};

impl<'k> Writer<'k> {
    /// The reductions along rows made with `dst` ([`Layout::fused`](crate::lower::Layout::fused)): their
    /// private arrays declared and set to the reduction's identity.
    pub(super) fn open_fused(&mut self, dst: &str) -> Vec<(String, ReduceOp, usize)> {
        let (values, src) = (self.v.values(), self.plan.id(dst));
        let mut fused: Vec<(&str, ReduceOp)> =
            self.plan.fused.iter().filter(|(_, (_, x))| *x == src).map(|(r, &(op, _))| (values.name(r), op)).collect();
        fused.sort_by_key(|f| f.0);
        let d = self.ty(dst).dtype;
        (fused.into_iter())
            .map(|(r, op)| {
                let id = self.declare_block(r);
                let slots = self.slots(&self.ty(r).shape);
                let init = reduce_init(op, d);
                self.line(format!("for (var r = 0u; r < {slots}u; r++) {{ {id}[r] = {init}; }}"));
                (id, op, slots)
            })
            .collect()
    }

    /// `op` of the accumulator `acc` and `x`, of `dtype`: `max`/`min` of floats propagate NaN.
    pub(super) fn reduce_combine(&mut self, op: ReduceOp, dtype: DType, acc: &str, x: &str) -> String {
        match (op, dtype.is_float()) {
            (ReduceOp::Sum, _) => format!("{acc} + {x}"),
            (ReduceOp::Prod, _) => format!("{acc} * {x}"),
            (ReduceOp::Max, true) => {
                self.helper("tk_max");
                format!("tk_max({acc}, {x})")
            }
            (ReduceOp::Min, true) => {
                self.helper("tk_min");
                format!("tk_min({acc}, {x})")
            }
            (ReduceOp::Max, false) => format!("max({acc}, {x})"),
            (ReduceOp::Min, false) => format!("min({acc}, {x})"),
        }
    }

    pub(super) fn write_reduce(&mut self, dst: &str, op: ReduceOp, src: &str, axis: usize) {
        let sty = self.ty(src);
        let (d, shape) = (sty.dtype, sty.shape.clone());
        let inner: usize = shape[axis + 1..].iter().product();
        let n = shape[axis];
        let float = d.is_float();
        let acc_ty = reg_ty(d);
        let init = reduce_init(op, d);
        let combine = move |w: &mut Self, acc: &str, x: &str| w.reduce_combine(op, d, acc, x);
        if self.plan.row_reduce(&shape, axis) {
            // In the row layout: each invocation reduces its own rows. Where the order cannot
            // change the result (`max`/`min`, integers) and the row is a multiple of 4 long, in
            // four interleaved partial results (independent chains the driver can overlap),
            // combined pairwise; float sums and products add in ascending order, as the
            // interpreter does.
            let (sid, id) = (self.ident(src), self.declare_block(dst));
            let rshape = self.ty(dst).shape.clone();
            let exact = matches!(op, ReduceOp::Max | ReduceOp::Min) || !float;
            let lanes = if exact && n.is_multiple_of(4) && n >= 8 { 4 } else { 1 };
            // Rows held as `vec4`s are read a quad at a time.
            let quads = self.quad_value(&shape);
            // A float `max`/`min` over quads: the builtin on each element, and whether any
            // quad held a NaN, one test of the whole quad; NaN at the end where one did (what
            // `tk_max` at every step gives, for a fraction of its work).
            let nan_flag = quads && float && matches!(op, ReduceOp::Max | ReduceOp::Min);
            let combine = move |w: &mut Self, acc: &str, x: &str| {
                if nan_flag {
                    format!("{}({acc}, {x})", if op == ReduceOp::Max { "max" } else { "min" })
                } else {
                    w.reduce_combine(op, d, acc, x)
                }
            };
            self.each(&rshape, |w| {
                let acc = w.t();
                for l in 0..lanes {
                    w.line(format!("var {acc}_{l}: {acc_ty} = {init};"));
                }
                if nan_flag {
                    w.helper("tk_isnan4");
                    w.line(format!("var {acc}_nan = false;"));
                }
                if quads {
                    w.open(format!("for (var r = 0u; r < {}u; r++)", n / 4));
                    let q = match w.plan.row_forwarded.get(w.plan.id(src)) {
                        Some(&pi) => w.row_quad(pi, &format!("(k * {}u + r)", n / 4)),
                        None => format!("{sid}[k * {}u + r]", n / 4),
                    };
                    w.line(format!("let q = {q};"));
                    if nan_flag {
                        w.line(format!("{acc}_nan = {acc}_nan | tk_isnan4(q);"));
                    }
                    for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                        let l = t % lanes;
                        let x = combine(w, &format!("{acc}_{l}"), &format!("q.{c}"));
                        w.line(format!("{acc}_{l} = {x};"));
                    }
                } else {
                    w.open(format!("for (var r = 0u; r < {n}u; r += {lanes}u)"));
                    for l in 0..lanes {
                        let c = combine(w, &format!("{acc}_{l}"), &format!("{sid}[k * {n}u + r + {l}u]"));
                        w.line(format!("{acc}_{l} = {c};"));
                    }
                }
                w.close();
                let all = if lanes == 4 {
                    let (lo, hi) = (
                        combine(w, &format!("{acc}_0"), &format!("{acc}_1")),
                        combine(w, &format!("{acc}_2"), &format!("{acc}_3")),
                    );
                    combine(w, &lo, &hi)
                } else {
                    format!("{acc}_0")
                };
                let all = if nan_flag {
                    w.helper("tk_f32_bits");
                    format!("select({all}, tk_f32_bits(0x7fc00000u), {acc}_nan)")
                } else {
                    all
                };
                w.line(format!("let {acc} = {all};"));
                let v = w.narrow(d, &acc);
                w.line(format!("{id}[k] = {v};"));
            });
            self.defined(dst);
            return;
        }
        self.gather(dst, &[src], move |w, offs| {
            let acc = w.t();
            w.line(format!("var {acc}: {acc_ty} = {init};"));
            w.line(format!("let {acc}_base = (e / {inner}u) * {}u + e % {inner}u;", n * inner));
            // Past 8 steps the bound is opaque to the driver (`tk_zero` is 0): llvmpipe unrolled
            // these loops whole, and a kernel of 50 such reductions of 32 steps (6,976 lines)
            // did not compile in 5 minutes; kept as loops, it compiles in seconds (issue 38).
            let bound = if n > 8 {
                w.helper("tk_f32_bits");
                format!("{n}u + tk_zero")
            } else {
                format!("{n}u")
            };
            w.open(format!("for (var r = 0u; r < {bound}; r++)"));
            let x = from_word(d, &format!("tk_ws[wsb + {}u + {acc}_base + r * {inner}u]", offs[0]));
            let c = combine(w, &acc, &x);
            w.line(format!("{acc} = {c};"));
            w.close();
            w.narrow(d, &acc)
        });
    }
}

/// The identity of reduction `op` over `d`: the accumulator's first value.
fn reduce_init(op: ReduceOp, d: DType) -> String {
    match (op, d) {
        (ReduceOp::Sum, _) => literal(Literal::Int(0), d),
        (ReduceOp::Prod, _) => literal(Literal::Int(1), d),
        (ReduceOp::Max, d) if d.is_int() => literal(Literal::Int(d.int_range().expect("an integer").0), d),
        (ReduceOp::Min, d) if d.is_int() => literal(Literal::Int(d.int_range().expect("an integer").1), d),
        (ReduceOp::Max, _) => float_lit(f32::NEG_INFINITY),
        (ReduceOp::Min, _) => float_lit(f32::INFINITY),
    }
}
