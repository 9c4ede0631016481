//! The typing rule of each operation (docs/language.md): what it takes and the type it gives.

use std::collections::HashMap;

use super::{BodyKind, Checked, Checker, broadcast, literal_fits, shape_text, with_article};
use crate::ir::*;

impl Checker<'_> {
    /// Checks one operation and returns its result type (single-result ops).
    pub(super) fn op(&mut self, op: &mut Op, ann: Option<&Type>, span: Span) -> Checked<Type> {
        match op {
            Op::Load { src, index, mask, other } => self.load(src, index.as_deref_mut(), mask.as_deref(), *other, span),
            Op::Store { dst, index, value, mask } => {
                self.store(dst, index.as_deref_mut(), value, mask.as_deref(), span);
                None
            }
            Op::Sync(sync) => {
                self.sync(sync, span);
                None
            }
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axes = self.axis_names();
                if let (None, AxisRef::Name(n)) = (&self.k.grid, &*a) {
                    self.use_mesh_axis(n);
                    return Some(Type::scalar(DType::I32));
                }
                let ok = match a {
                    AxisRef::Name(n) => axes.contains(&n.as_str()),
                    AxisRef::Pos(p) => *p < axes.len(),
                };
                if !ok {
                    let expected = if axes.is_empty() {
                        "the kernel has no grid: declare one with `grid (...)`".to_string()
                    } else {
                        format!("expected a grid axis name ({}) or a position below {}", axes.join(", "), axes.len())
                    };
                    self.err(span, format!("`{a}` is not an axis of the grid"), expected);
                    return None;
                }
                Some(Type::scalar(DType::I32))
            }
            Op::Iota { dim } => {
                let t = ann?.clone();
                if !matches!(t.dtype, DType::I32 | DType::U32) || t.is_scalar() {
                    self.err(
                        span,
                        format!("`iota` cannot make `{t}`"),
                        "expected an `i32` or `u32` block type such as `i32[128]`",
                    );
                    return None;
                }
                if *dim >= t.shape.len() {
                    self.err(
                        span,
                        format!("`iota {dim}` counts along dimension {dim} of a rank-{} block", t.shape.len()),
                        format!("expected a dimension below {}", t.shape.len()),
                    );
                    return None;
                }
                Some(t)
            }
            Op::Full(l) => {
                let t = ann?.clone();
                if let Err(m) = literal_fits(*l, t.dtype) {
                    self.err(span, m, format!("expected {} literal", with_article(t.dtype)));
                    return None;
                }
                Some(t)
            }
            Op::Zeros => ann.cloned(),
            Op::Unary(u, a) => self.unary(*u, a, span),
            Op::Binary(b, x, y) => self.binary(*b, x, y, span),
            Op::Compare(c, x, y) => {
                let (d, shape) = self.pair(x, y, span, c.name())?;
                if d == DType::Bool && !matches!(c, CmpOp::Eq | CmpOp::Ne) {
                    self.err(
                        span,
                        format!("`{}` orders its operands, which are bool", c.name()),
                        "expected numbers; bool compares only with `eq` and `ne`",
                    );
                    return None;
                }
                Some(Type::array(DType::Bool, shape))
            }
            Op::Select(c, a, b) => {
                let ct = self.val(c, span, "the condition of `select`");
                let ab = self.pair(a, b, span, "select");
                let (ct, (d, shape)) = (ct?, ab?);
                if ct.dtype != DType::Bool {
                    self.err(
                        span,
                        format!("the condition `{c}` of `select` is {ct}"),
                        "expected a `bool` condition; make one with a comparison such as `lt`",
                    );
                    return None;
                }
                match broadcast(&ct.shape, &shape) {
                    Some(s) => Some(Type::array(d, s)),
                    None => {
                        self.err(
                            span,
                            format!("the condition {ct} of `select` does not broadcast with {}", Type::array(d, shape)),
                            "expected shapes that agree from the right (numpy broadcasting)",
                        );
                        None
                    }
                }
            }
            Op::Cast(a) => self.convert(a, ann, span, false),
            Op::Bitcast(a) => self.convert(a, ann, span, true),
            Op::Broadcast(a) => self.broadcast_to(a, ann, span),
            Op::Reshape(a) => self.reshape(a, ann, span),
            Op::Slice { arg, start, stride } => self.slice(arg, start, stride, ann, span),
            Op::Concatenate { args, axis } => self.concatenate(args, axis, span),
            Op::Tile { arg, reps } => self.tile(arg, reps, span),
            Op::Repeat { arg, times, axis } => self.repeat(arg, times, axis, span),
            Op::Transpose { arg, perm } => self.transpose(arg, perm, span),
            Op::Reduce { op, arg, axis, keepdims } => self.reduce(op, arg, axis, keepdims, span),
            Op::Dot { a, b, trans_a, trans_b } => self.dot(a, b, *trans_a, *trans_b, span),
            Op::When { cond, body } => {
                self.condition(cond, span, "when");
                self.scopes.push(HashMap::new());
                self.body(body, BodyKind::When);
                self.scopes.pop();
                None
            }
            Op::For(ForLoop { .. }) => {
                self.for_loop(op, span);
                None
            }
            // Checked by `stmt`, which knows how many results it has.
            Op::If(_) | Op::Yield(_) => None,
        }
    }

    /// The condition of a `when` or an `if`: a scalar `bool`.
    pub(super) fn condition(&mut self, cond: &Operand, span: Span, mnemonic: &str) {
        if let Some(t) = self.val(cond, span, &format!("the condition of `{mnemonic}`"))
            && (t.dtype != DType::Bool || !t.is_scalar())
        {
            self.err(
                span,
                format!("the condition `{cond}` of `{mnemonic}` is {t}"),
                "expected a scalar `bool`, such as `%first = eq %k, 0`",
            );
        }
    }

    fn unary(&mut self, u: UnaryOp, a: &Operand, span: Span) -> Checked<Type> {
        let t = self.val(a, span, &format!("the operand of `{}`", u.name()))?;
        let ok = match u {
            UnaryOp::Not => !t.dtype.is_float(),
            UnaryOp::Neg | UnaryOp::Abs => t.dtype.is_numeric(),
            _ => t.dtype.is_float(),
        };
        if !ok {
            let expected = match u {
                UnaryOp::Not => "expected `bool` or an integer",
                UnaryOp::Neg | UnaryOp::Abs => "expected a number",
                _ => "expected f32, f16 or bf16; convert with `cast %v : f32`",
            };
            self.err(span, format!("`{}` does not take {}", u.name(), t.dtype), expected);
            return None;
        }
        Some(t)
    }

    fn binary(&mut self, b: BinaryOp, x: &Operand, y: &Operand, span: Span) -> Checked<Type> {
        let (d, shape) = self.pair(x, y, span, b.name())?;
        let (ok, expected) = match b {
            BinaryOp::Pow | BinaryOp::Atan2 => (d.is_float(), "expected float operands"),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => (!d.is_float(), "expected `bool` or integer operands"),
            BinaryOp::Shl | BinaryOp::Shr => (d.is_int(), "expected integer operands"),
            _ => (d.is_numeric(), "expected numbers"),
        };
        if !ok {
            self.err(span, format!("`{}` does not take {d}", b.name()), expected);
            return None;
        }
        Some(Type::array(d, shape))
    }

    fn convert(&mut self, a: &Operand, ann: Option<&Type>, span: Span, bit: bool) -> Checked<Type> {
        let name = if bit { "bitcast" } else { "cast" };
        let t = self.val(a, span, &format!("the operand of `{name}`"))?;
        let ann = ann?;
        if !ann.is_scalar() && ann.shape != t.shape {
            self.err(
                span,
                format!("`{name}` changes the shape from {} to {}", shape_text(&t.shape), shape_text(&ann.shape)),
                format!("expected `: {}` (the element type alone is enough)", Type::array(ann.dtype, t.shape.clone())),
            );
            return None;
        }
        if bit && (t.dtype.bits() != ann.dtype.bits() || t.dtype == DType::Bool || ann.dtype == DType::Bool) {
            self.err(
                span,
                format!("cannot bitcast {} ({} bits) to {} ({} bits)", t.dtype, t.dtype.bits(), ann.dtype, ann.dtype.bits()),
                "expected element types of the same width, not bool; use `cast` to convert values",
            );
            return None;
        }
        Some(Type::array(ann.dtype, t.shape))
    }

    fn dot(&mut self, a: &Operand, b: &Operand, ta: bool, tb: bool, span: Span) -> Checked<Type> {
        let x = self.val(a, span, "the left operand of `dot`");
        let y = self.val(b, span, "the right operand of `dot`");
        let (x, y) = (x?, y?);
        let rank = x.shape.len();
        if rank < 2 || y.shape.len() != rank || x.shape[..rank - 2] != y.shape[..rank - 2] || x.dtype != y.dtype || x.dtype == DType::Bool {
            self.err(
                span,
                format!("`dot` takes two matrices, or two stacks of them with the same leading dimensions, of one numeric dtype, got {x} and {y}"),
                "expected operands such as f32[M, K] and f32[K, N], or f32[B, M, K] and f32[B, K, N]",
            );
            return None;
        }
        let batch = &x.shape[..rank - 2];
        let pairs: usize = batch.iter().product();
        if pairs > crate::ir::limits::MAX_DOT_BATCH {
            self.err(
                span,
                format!("`dot` of {x} and {y} multiplies {pairs} pairs of matrices"),
                format!("expected at most {} (the product of the leading dimensions); split the batch over a grid axis", crate::ir::limits::MAX_DOT_BATCH),
            );
            return None;
        }
        let (x2, y2) = (&x.shape[rank - 2..], &y.shape[rank - 2..]);
        let (m, k1) = if ta { (x2[1], x2[0]) } else { (x2[0], x2[1]) };
        let (k2, n) = if tb { (y2[1], y2[0]) } else { (y2[0], y2[1]) };
        if k1 != k2 {
            self.err(
                span,
                format!(
                    "`dot` contracts {k1} against {k2}: {x}{} times {y}{}",
                    if ta { " (transposed)" } else { "" },
                    if tb { " (transposed)" } else { "" }
                ),
                "expected the inner dimensions to agree: [M, K] times [K, N]",
            );
            return None;
        }
        let d = if x.dtype.is_float() { DType::F32 } else { x.dtype.widened() };
        Some(Type::array(d, batch.iter().copied().chain([m, n]).collect::<Vec<_>>()))
    }
}
