//! The statements that make a value element by element from values the invocation owns (the
//! creation and elementwise operations, broadcasts and reshapes), and those that gather it from
//! elements other invocations own, published to the workspace (transposes, slices,
//! concatenations).

use tessel_plugin_api::ir::*;

use super::Writer;
use super::layout::strides;
use super::ops::compare;
use crate::conv::{from_word, literal, reg_ty};

impl<'k> Writer<'k> {
    /// `dst = op`, an elementwise or creating operation.
    pub(super) fn write_elementwise(&mut self, op: &Op, dst: &str) {
        match op {
            Op::Iota { dim } => {
                let ty = self.ty(dst);
                let (st, size) = (strides(&ty.shape)[*dim], ty.shape[*dim]);
                let cast = reg_ty(ty.dtype);
                self.elementwise(dst, &[], false, move |_, _| format!("{cast}((e / {st}u) % {size}u)"));
            }
            Op::Full(l) => {
                let d = self.ty(dst).dtype;
                let v = literal(*l, d);
                self.elementwise(dst, &[], false, move |_, _| v.clone());
            }
            Op::Zeros => {
                let d = self.ty(dst).dtype;
                let v = literal(Literal::Int(0), d);
                self.elementwise(dst, &[], false, move |_, _| v.clone());
            }
            Op::Unary(op, a) => {
                let (d, op) = (self.dtype_of(&[a]), *op);
                self.elementwise(dst, &[a], false, move |w, x| w.unary(op, d, &x[0]));
            }
            Op::Binary(op, a, b) => {
                let (d, op) = (self.dtype_of(&[a, b]), *op);
                self.elementwise(dst, &[a, b], false, move |w, x| w.binary(op, d, &x[0], &x[1]));
            }
            Op::Compare(op, a, b) => {
                let (d, op) = (self.dtype_of(&[a, b]), *op);
                self.elementwise(dst, &[a, b], false, move |_, x| compare(op, d, &x[0], &x[1]));
            }
            Op::Select(c, a, b) => {
                self.elementwise(dst, &[c, a, b], false, |_, x| format!("select({}, {}, {})", x[2], x[1], x[0]))
            }
            Op::Cast(a) => {
                let (from, to) = (self.dtype_of(&[a]), self.ty(dst).dtype);
                self.elementwise(dst, &[a], false, move |w, x| w.cast(from, to, &x[0]));
            }
            Op::Bitcast(a) => {
                let (from, to) = (self.dtype_of(&[a]), self.ty(dst).dtype);
                self.elementwise(dst, &[a], false, move |w, x| w.bitcast(from, to, &x[0]));
            }
            Op::Broadcast(a) => self.elementwise(dst, &[a], false, |_, x| x[0].clone()),
            Op::Reshape(a) => self.elementwise(dst, &[a], true, |_, x| x[0].clone()),
            _ => unreachable!("write_stmt sends the elementwise operations here"),
        }
    }

    /// `dst = op`, a transpose, slice or concatenation of published values.
    pub(super) fn write_gathered(&mut self, op: &Op, dst: &str) {
        match op {
            Op::Transpose { arg, perm } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: transpose of a value") };
                let in_st = strides(&self.ty(src).shape);
                let out_shape = self.ty(dst).shape.clone();
                let out_st = strides(&out_shape);
                let idx = perm
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| format!("((e / {}u) % {}u) * {}u", out_st[d], out_shape[d], in_st[p]))
                    .collect::<Vec<_>>()
                    .join(" + ");
                self.gather(dst, &[src], move |w, offs| {
                    let d = w.ty(src).dtype;
                    from_word(d, &format!("tk_ws[wsb + {}u + {idx}]", offs[0]))
                });
            }
            Op::Slice { arg, start, stride } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: slice of a value") };
                let in_st = strides(&self.ty(src).shape);
                let out_shape = self.ty(dst).shape.clone();
                let out_st = strides(&out_shape);
                let idx = (0..out_shape.len())
                    .map(|d| {
                        let step = if stride[d] == 1 { String::new() } else { format!(" * {}u", stride[d]) };
                        format!("((e / {}u) % {}u{step} + {}u) * {}u", out_st[d], out_shape[d], start[d], in_st[d])
                    })
                    .collect::<Vec<_>>()
                    .join(" + ");
                let idx = if idx.is_empty() { "0u".to_string() } else { idx };
                self.gather(dst, &[src], move |w, offs| {
                    let d = w.ty(src).dtype;
                    from_word(d, &format!("tk_ws[wsb + {}u + {idx}]", offs[0]))
                });
            }
            Op::Concatenate { args, axis } => {
                let srcs: Vec<&str> = args
                    .iter()
                    .map(|a| match a {
                        Operand::Value(v) => v.as_str(),
                        Operand::Lit(_) => unreachable!("verifier: concatenate of values"),
                    })
                    .collect();
                let out = self.ty(dst);
                let inner: u64 = out.shape[axis + 1..].iter().map(|&n| n as u64).product();
                let total = out.shape[*axis] as u64;
                let sizes: Vec<u64> = srcs.iter().map(|s| self.ty(s).shape[*axis] as u64).collect();
                let d = out.dtype;
                self.gather(dst, &srcs, move |_, offs| {
                    // The element's index along the axis (c), and the parts of its index before
                    // (o) and after (i) that axis; each operand read at its own part of c (clamped
                    // into it), the last one whose part c reaches chosen.
                    let c = format!("((e / {inner}u) % {total}u)");
                    let (o, i) = (format!("(e / {}u)", inner * total), format!("(e % {inner}u)"));
                    let mut start = 0;
                    let mut expr = String::new();
                    for (&n, off) in sizes.iter().zip(offs) {
                        let local = format!("(min(max({c}, {start}u), {}u) - {start}u)", start + n - 1);
                        let read =
                            from_word(d, &format!("tk_ws[wsb + {off}u + {o} * {}u + {local} * {inner}u + {i}]", n * inner));
                        expr = if expr.is_empty() { read } else { format!("select({expr}, {read}, {c} >= {start}u)") };
                        start += n;
                    }
                    expr
                });
            }
            _ => unreachable!("write_stmt sends transposes, slices and concatenations here"),
        }
    }
}
