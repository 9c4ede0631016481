//! The statements the general path computes element by element, each element of the result in
//! its own registers: the program's index, `iota` and constants, the element operations
//! (`ops.rs` writes each one) and conversions, and the rearrangements (`broadcast`, `reshape`,
//! `transpose`, `slice`, `concatenate`), which read another element of their operand.
//! `kernel.rs::write_stmt` sends them here after the statement's barriers.

use tessel_plugin_api::ir::*;

use super::conv::{lit_bits, strides};
use super::writer::Writer;

impl Writer<'_> {
    /// `s` (one of the operations above) into the slots of `dst`, of shape `out_shape`.
    pub(super) fn write_elementwise(&mut self, s: &Stmt, dst: &str, out_shape: &[usize]) {
        let ty = s.ty.clone();
        let n = out_shape.iter().product::<usize>();
        match &s.op {
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let grid = self.plan.kernel.grid().to_vec();
                let axis = match a {
                    AxisRef::Pos(p) => *p,
                    AxisRef::Name(nm) => grid.iter().position(|g| &g.name == nm).expect("verified axis"),
                };
                let is_id = matches!(s.op, Op::ProgramId(_));
                self.each(1, |w, e| {
                    let v = if is_id {
                        w.coords[axis].clone()
                    } else {
                        let AxisSize::Fixed(n) = grid[axis].size else { unreachable!("plan refuses dyn axes") };
                        w.imm(n as u32)
                    };
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Iota { dim } => {
                let st = strides(&out_shape)[*dim];
                let size = out_shape[*dim];
                self.each(n, |w, e| {
                    let v = w.r();
                    w.insf(format_args!("div.u32 {v}, {e}, {st}"));
                    w.insf(format_args!("rem.u32 {v}, {v}, {size}"));
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Full(l) => {
                let bits = lit_bits(*l, ty.as_ref().expect("typed").dtype);
                self.each(n, |w, e| {
                    let v = w.imm(bits);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Zeros => self.each(n, |w, e| {
                let v = w.imm(0);
                w.store_slot(&dst, e, &v);
            }),
            Op::Unary(op, a) => {
                let d = self.dtype_of(&[a]);
                self.each(n, |w, e| {
                    let x = w.operand(a, d, e, &out_shape);
                    let v = w.unary(*op, d, &x);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Binary(op, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let v = w.binary(*op, d, &x, &y);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Compare(op, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let v = w.compare(*op, d, &x, &y);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Select(c, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let cv = w.operand(c, DType::Bool, e, &out_shape);
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let (p, v) = (w.p(), w.r());
                    w.insf(format_args!("setp.ne.u32 {p}, {cv}, 0"));
                    w.insf(format_args!("selp.b32 {v}, {x}, {y}, {p}"));
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Cast(a) => {
                let from = self.dtype_of(&[a]);
                let to = ty.as_ref().expect("typed").dtype;
                self.each(n, |w, e| {
                    let x = w.operand(a, from, e, &out_shape);
                    let v = w.cast(from, to, &x);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Bitcast(a) => {
                let from = self.dtype_of(&[a]);
                let to = ty.as_ref().expect("typed").dtype;
                self.each(n, |w, e| {
                    let x = w.operand(a, from, e, &out_shape);
                    let v = if from.bits() < 32 && from != to { w.bitcast_narrow(from, to, &x) } else { x };
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Broadcast(a) => self.each(n, |w, e| {
                let x = w.operand(a, DType::U32, e, &out_shape);
                w.store_slot(&dst, e, &x);
            }),
            Op::Reshape(a) => {
                let Operand::Value(src) = a else { unreachable!("verifier: reshape of a value") };
                self.each(n, |w, e| {
                    let x = w.load_slot(src, e);
                    w.store_slot(&dst, e, &x);
                });
            }
            Op::Transpose { arg, perm } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: transpose of a value") };
                let in_st = strides(&self.shape_of(src));
                let terms: Vec<(usize, usize)> = perm.iter().map(|&p| (in_st[p], 0)).collect();
                self.remap(&dst, src, n, &out_shape, &terms);
            }
            Op::Slice { arg, start, stride } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: slice of a value") };
                let in_st = strides(&self.shape_of(src));
                // (i k + s) t = i (k t) + s t: a step of k t from an offset of s t elements.
                let terms: Vec<(usize, usize)> = (0..start.len()).map(|d| (stride[d] * in_st[d], start[d] * in_st[d])).collect();
                self.remap(&dst, src, n, &out_shape, &terms);
            }
            Op::Concatenate { args, axis } => {
                let srcs: Vec<String> = args
                    .iter()
                    .map(|a| match a {
                        Operand::Value(v) => v.clone(),
                        Operand::Lit(_) => unreachable!("verifier: concatenate of values"),
                    })
                    .collect();
                let inner: usize = out_shape[axis + 1..].iter().product();
                let total = out_shape[*axis];
                let sizes: Vec<usize> = srcs.iter().map(|s| self.shape_of(s)[*axis]).collect();
                self.each(n, |w, e| {
                    // The element's index along the axis (c), and the parts of its index before
                    // (o) and after (i) it; each operand read at its part of c (clamped into it),
                    // the last one whose part c reaches chosen.
                    let (c, o, i) = (w.r(), w.r(), w.r());
                    w.insf(format_args!("div.u32 {c}, {e}, {inner}"));
                    w.insf(format_args!("rem.u32 {c}, {c}, {total}"));
                    w.insf(format_args!("div.u32 {o}, {e}, {}", inner * total));
                    w.insf(format_args!("rem.u32 {i}, {e}, {inner}"));
                    let mut start = 0;
                    let mut chosen: Option<String> = None;
                    for (src, &len) in srcs.iter().zip(&sizes) {
                        let (local, at) = (w.r(), w.r());
                        w.insf(format_args!("max.u32 {local}, {c}, {start}"));
                        w.insf(format_args!("min.u32 {local}, {local}, {}", start + len - 1));
                        w.insf(format_args!("sub.u32 {local}, {local}, {start}"));
                        w.insf(format_args!("mul.lo.u32 {at}, {o}, {}", len * inner));
                        w.insf(format_args!("mad.lo.u32 {at}, {local}, {inner}, {at}"));
                        w.insf(format_args!("add.u32 {at}, {at}, {i}"));
                        let x = w.load_slot(src, &at);
                        chosen = Some(match chosen {
                            None => x,
                            Some(prev) => {
                                let (p, v) = (w.p(), w.r());
                                w.insf(format_args!("setp.ge.u32 {p}, {c}, {start}"));
                                w.insf(format_args!("selp.b32 {v}, {x}, {prev}, {p}"));
                                v
                            }
                        });
                        start += len;
                    }
                    w.store_slot(&dst, e, &chosen.expect("verifier: concatenate of at least one value"));
                });
            }
            _ => unreachable!("write_stmt sends only the operations above here"),
        }
    }

    /// Element `e` of `dst` (of `out_shape`, `n` elements) read from `src` at the sum over its
    /// dimensions `d` of `i_d * step_d + offset_d`, `i_d` its coordinate along `d` and
    /// `terms[d]` = `(step_d, offset_d)` in elements of `src`: a transpose (the strides permuted)
    /// or a slice (its start and steps scaled by the strides).
    fn remap(&mut self, dst: &str, src: &str, n: usize, out_shape: &[usize], terms: &[(usize, usize)]) {
        let out_st = strides(out_shape);
        self.each(n, |w, e| {
            let acc = w.imm(terms.iter().map(|t| t.1 as u32).sum::<u32>());
            for (d, &(stride, _)) in terms.iter().enumerate() {
                let t = w.r();
                w.insf(format_args!("div.u32 {t}, {e}, {}", out_st[d]));
                w.insf(format_args!("rem.u32 {t}, {t}, {}", out_shape[d]));
                w.insf(format_args!("mad.lo.u32 {acc}, {t}, {stride}, {acc}"));
            }
            let x = w.load_slot(src, &acc);
            w.store_slot(dst, e, &x);
        });
    }
}
