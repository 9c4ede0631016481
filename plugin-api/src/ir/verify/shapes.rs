//! The typing rule of each operation that changes a value's shape (docs/language.md): what it
//! takes and the type it gives. `ops.rs` dispatches here.

use super::{Checked, Checker, broadcast, shape_text, with_article};
use crate::ir::limits::{MAX_ARRAY_ELEMENTS, elements_within_limit};
use crate::ir::*;

impl Checker<'_> {
    /// The type of `op`'s result of `shape` (`None` where a dimension overflowed), or an error
    /// where it has more elements than any array may.
    fn grown(&mut self, span: Span, op: &str, t: &Type, shape: Option<Vec<usize>>) -> Checked<Type> {
        match shape.filter(|s| elements_within_limit(s).is_some()) {
            Some(s) => Some(Type::array(t.dtype, s)),
            None => {
                self.err(
                    span,
                    format!("`{op}` of {t} makes more elements than an array may have"),
                    format!("expected at most {MAX_ARRAY_ELEMENTS} (2^48) elements"),
                );
                None
            }
        }
    }

    /// `broadcast`: `a` stretched to the annotated type (numpy broadcasting).
    pub(super) fn broadcast_to(&mut self, a: &Operand, ann: Option<&Type>, span: Span) -> Checked<Type> {
        let (t, target) = (self.val(a, span, "the operand of `broadcast`")?, ann?.clone());
        if t.dtype != target.dtype || broadcast(&t.shape, &target.shape).as_deref() != Some(&target.shape[..]) {
            self.err(
                span,
                format!("cannot broadcast {t} to {target}"),
                format!(
                    "expected {} type whose shape {} stretches to (numpy broadcasting)",
                    with_article(t.dtype),
                    shape_text(&t.shape)
                ),
            );
            return None;
        }
        Some(target)
    }

    /// `reshape`: `a`'s elements as the annotated type.
    pub(super) fn reshape(&mut self, a: &Operand, ann: Option<&Type>, span: Span) -> Checked<Type> {
        let (t, target) = (self.val(a, span, "the operand of `reshape`")?, ann?.clone());
        if t.dtype != target.dtype || t.numel() != target.numel() {
            self.err(
                span,
                format!("cannot reshape {t} ({} elements) to {target} ({} elements)", t.numel(), target.numel()),
                format!("expected {} type with {} elements", with_article(t.dtype), t.numel()),
            );
            return None;
        }
        Some(target)
    }

    /// `slice`: the elements of `arg` from `start`, every `stride`, as the annotated type.
    pub(super) fn slice(
        &mut self,
        arg: &Operand,
        start: &[usize],
        stride: &[usize],
        ann: Option<&Type>,
        span: Span,
    ) -> Checked<Type> {
        let (t, target) = (self.val(arg, span, "the operand of `slice`")?, ann?.clone());
        if stride.len() != start.len() || stride.contains(&0) {
            self.err(
                span,
                "`slice`'s stride has a step of 0 or not one per dimension",
                "expected a positive step per dimension, as in `stride (1, 2)`",
            );
            return None;
        }
        // The last element taken along each dimension: start + (n - 1) * stride.
        let last = |s: usize, n: usize, k: usize| n.checked_sub(1).and_then(|m| m.checked_mul(k)).and_then(|m| m.checked_add(s));
        let inside = start.len() == t.shape.len()
            && target.shape.len() == t.shape.len()
            && (0..start.len()).all(|d| last(start[d], target.shape[d], stride[d]).is_some_and(|e| e < t.shape[d]));
        if t.dtype != target.dtype || !inside {
            let list = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            let steps = if stride.iter().all(|&k| k == 1) { String::new() } else { format!(" every ({})", list(stride)) };
            self.err(
                span,
                format!("`slice` of {t} from ({}){steps} as {target}", list(start)),
                format!(
                    "expected {} type of the same rank whose elements from the start{} lie inside {t}",
                    with_article(t.dtype),
                    if steps.is_empty() { "" } else { ", the last at start + (n - 1) * stride," }
                ),
            );
            return None;
        }
        Some(target)
    }

    /// `concatenate`: `args` joined along `axis`.
    pub(super) fn concatenate(&mut self, args: &[Operand], axis: &usize, span: Span) -> Checked<Type> {
        let mut types = Vec::new();
        for a in args {
            types.push(self.val(a, span, "an operand of `concatenate`")?);
        }
        let first = types[0].clone();
        let fits = |t: &Type| {
            t.dtype == first.dtype
                && t.shape.len() == first.shape.len()
                && t.shape.iter().zip(&first.shape).enumerate().all(|(d, (x, y))| d == *axis || x == y)
        };
        if *axis >= first.shape.len() {
            self.err(
                span,
                format!("`concatenate` of {first} along axis {axis}"),
                format!("expected an axis below {}", first.shape.len()),
            );
            return None;
        }
        if let Some(t) = types.iter().find(|t| !fits(t)) {
            self.err(
                span,
                format!("`concatenate` of {first} and {t} along axis {axis}"),
                format!("expected values of one element type whose shapes differ only along axis {axis}"),
            );
            return None;
        }
        let mut shape = first.shape.clone();
        shape[*axis] = types.iter().map(|t| t.shape[*axis]).sum();
        Some(Type::array(first.dtype, shape))
    }

    /// `tile`: `arg` copied `reps` times along each dimension.
    pub(super) fn tile(&mut self, arg: &Operand, reps: &[usize], span: Span) -> Checked<Type> {
        let t = self.val(arg, span, "the operand of `tile`")?;
        if reps.len() != t.shape.len() || reps.is_empty() || reps.contains(&0) {
            self.err(
                span,
                format!("`tile` of {t} with reps ({})", reps.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
                match t.shape.len() {
                    0 => "expected a value with dimensions to copy (a tile of a scalar is the scalar)".to_string(),
                    n => format!("expected one count of copies, at least 1, for each of its {n} dimensions"),
                },
            );
            return None;
        }
        let shape = t.shape.iter().zip(reps.iter()).map(|(d, r)| d.checked_mul(*r)).collect();
        self.grown(span, "tile", &t, shape)
    }

    /// `repeat`: each element of `arg` `times` times along `axis`.
    pub(super) fn repeat(&mut self, arg: &Operand, times: &usize, axis: &usize, span: Span) -> Checked<Type> {
        let t = self.val(arg, span, "the operand of `repeat`")?;
        if *axis >= t.shape.len() || *times == 0 {
            self.err(
                span,
                format!("`repeat` of {t} {times} times along axis {axis}"),
                format!("expected at least 1 copy along an axis below {}", t.shape.len()),
            );
            return None;
        }
        let mut shape = t.shape.clone();
        let along = shape[*axis].checked_mul(*times);
        let shape = along.map(|n| {
            shape[*axis] = n;
            shape
        });
        self.grown(span, "repeat", &t, shape)
    }

    /// `transpose`: `arg`'s dimensions in the order `perm`.
    pub(super) fn transpose(&mut self, arg: &Operand, perm: &[usize], span: Span) -> Checked<Type> {
        let t = self.val(arg, span, "the operand of `transpose`")?;
        let mut sorted = perm.to_vec();
        sorted.sort_unstable();
        if sorted != (0..t.shape.len()).collect::<Vec<_>>() {
            self.err(
                span,
                format!(
                    "`perm ({})` is not a permutation of the {} dimensions of {t}",
                    perm.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    t.shape.len()
                ),
                format!("expected each of 0..{} exactly once", t.shape.len()),
            );
            return None;
        }
        Some(Type::array(t.dtype, perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>()))
    }

    /// A reduction of `arg` along `axis`, kept as a dimension of 1 with `keepdims`.
    pub(super) fn reduce(&mut self, op: &ReduceOp, arg: &Operand, axis: &usize, keepdims: &bool, span: Span) -> Checked<Type> {
        let t = self.val(arg, span, "the operand of a reduction")?;
        if !t.dtype.is_numeric() || t.is_scalar() || *axis >= t.shape.len() {
            let expected = if t.is_scalar() || !t.dtype.is_numeric() {
                "expected a numeric block value".to_string()
            } else {
                format!("expected an axis below {}", t.shape.len())
            };
            self.err(span, format!("cannot `{}` {t} along axis {axis}", op.name()), expected);
            return None;
        }
        let mut shape = t.shape.clone();
        if *keepdims {
            shape[*axis] = 1;
        } else {
            shape.remove(*axis);
        }
        Some(Type::array(t.dtype, shape))
    }
}
