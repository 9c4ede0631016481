//! The concurrent model's statements (docs/language.md, "Threads, barriers and asynchronous
//! operations"): barriers named and indexed, the regions of asynchronous copies and products,
//! and the header's `thread` axes and `barrier` lines.

use super::{Checker, shape_text};
use crate::ir::*;

impl Checker<'_> {
    /// `thread` axes and `barrier` lines of the header.
    pub(super) fn concurrency_header(&mut self) {
        let k = self.k;
        let mut names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
        for b in &k.barriers {
            if names.contains(&b.name.as_str()) {
                self.err(
                    b.span,
                    format!("barrier `{}` has the name of another argument or barrier", b.name),
                    "expected a name of its own",
                );
            }
            names.push(&b.name);
            if b.count == 0 || b.arrivals == 0 {
                self.err(
                    b.span,
                    format!("barrier `{}` has {} barriers of {} arrivals", b.name, b.count, b.arrivals),
                    "expected at least one barrier and one arrival, as in `barrier full[2] arrivals 1`",
                );
            }
        }
        for a in k.grid.iter().flatten().filter(|a| a.thread) {
            if a.size == AxisSize::Dyn {
                self.err(
                    a.span,
                    format!("thread axis `{}` has a `dyn` size", a.name),
                    "expected a fixed count of threads, as in `wg: 3 thread`",
                );
            }
            for p in k.params.iter().filter(|p| p.block.as_ref().is_some_and(|b| b.index.iter().any(|e| e.uses(&a.name)))) {
                self.err(
                    p.span,
                    format!("`at (...)` of `{}` uses thread axis `{}`", p.name, a.name),
                    "expected blocks chosen by the program's grid axes; a thread picks its part of a block with `program_id` and `ds(...)`",
                );
            }
        }
    }

    /// One statement of the concurrent model.
    pub(super) fn sync(&mut self, sync: &mut SyncOp, span: Span) {
        match sync {
            SyncOp::Arrive(b) | SyncOp::Wait(b) => self.barrier_at(b, span),
            SyncOp::Copy { dst, src, arrive } => {
                if let Some(b) = arrive {
                    self.barrier_at(b, span);
                }
                let (Some(d), Some(s)) = (self.region(dst, true, span), self.region(src, false, span)) else { return };
                if d != s {
                    self.err(
                        span,
                        format!("`copy_async` copies {} of `{}` into {} of `{}`", s, src.name, d, dst.name),
                        "expected regions of one dtype and shape",
                    );
                }
            }
            SyncOp::Mma { acc, a, b, trans_a, trans_b } => {
                let x = match a {
                    MmaLhs::Ref(r) => self.region(r, false, span),
                    MmaLhs::Value(v) => self.val(v, span, "the left operand of `mma_async`"),
                };
                let (Some(c), Some(x), Some(y)) = (self.region(acc, true, span), x, self.region(b, false, span)) else {
                    return;
                };
                let float = x.dtype.is_float();
                let want = if float { DType::F32 } else { DType::I32 };
                let dims = |t: &Type, trans: bool| {
                    (t.shape.len() == 2).then(|| if trans { (t.shape[1], t.shape[0]) } else { (t.shape[0], t.shape[1]) })
                };
                let ok = match (dims(&x, *trans_a), dims(&y, *trans_b)) {
                    (Some((m, k)), Some((k2, n))) => k == k2 && c.shape == [m, n] && x.dtype == y.dtype && c.dtype == want,
                    _ => false,
                };
                if !ok {
                    self.err(
                        span,
                        format!("`mma_async` of {x} and {y} into {c}"),
                        format!(
                            "expected operands [M, K] and [K, N] of one dtype ([K, M] with trans_a, [N, K] with trans_b) and a {} accumulator [M, N]",
                            if float { "f32" } else { "i32" }
                        ),
                    );
                }
            }
            SyncOp::MaxRegisters { count, .. } => {
                if !(24..=256).contains(count) || !count.is_multiple_of(8) {
                    self.err(
                        span,
                        format!("`max_registers {count}`"),
                        "expected a multiple of 8 from 24 to 256 registers".to_string(),
                    );
                }
            }
            SyncOp::CommitCopies | SyncOp::WaitCopies { .. } | SyncOp::Fence | SyncOp::MmaWait { .. } => {}
        }
    }

    fn barrier_at(&mut self, b: &BarrierAt, span: Span) {
        if let (Some(d), Operand::Lit(Literal::Int(k))) = (self.k.barrier(&b.name), &b.index)
            && d.count > 0
            && !(0..d.count as i64).contains(k)
        {
            self.err(
                span,
                format!("barrier {k} of `{}`, which has {} barriers", b.name, d.count),
                format!("expected an index from 0 to {}", d.count - 1),
            );
        }
        if self.k.barrier(&b.name).is_none() {
            let names: Vec<&str> = self.k.barriers.iter().map(|b| b.name.as_str()).collect();
            let expected = if names.is_empty() {
                "the kernel declares no barrier: add a header line such as `barrier full[2] arrivals 1`".to_string()
            } else {
                format!("expected a barrier of this kernel: {}", names.join(", "))
            };
            self.err(span, format!("unknown barrier `{}`", b.name), expected);
        }
        self.scalar_int(&b.index, span, "the barrier index", true);
    }

    /// The type of the region a copy or product reads or (`written`) writes.
    fn region(&mut self, r: &mut RefAt, written: bool, span: Span) -> Option<Type> {
        let p = self.ref_param(&r.name, span)?.clone();
        if written && p.kind == ParamKind::In {
            self.err(span, format!("cannot write input `{}`", r.name), "expected an `out` or `scratch` argument");
            return None;
        }
        if p.ty.is_scalar() {
            self.err(span, format!("`{}` is a scalar argument", r.name), "expected an array argument or scratch");
            return None;
        }
        let shape = self.indexed_shape(&p, r.index.as_deref_mut(), span)?;
        if (r.index.iter().flatten()).any(|ix| matches!(ix, Index::Gather { .. })) {
            self.err(
                span,
                format!("the region of `{}` {} is a gather", r.name, shape_text(&shape)),
                "expected `:`, `ds(...)` and single indices in an asynchronous copy or product",
            );
            return None;
        }
        Some(Type::array(p.ty.dtype, shape))
    }
}
