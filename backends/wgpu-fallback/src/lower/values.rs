//! Where the plan's values live and when they are made: the whole input blocks a `dot` reads
//! from their buffers (forwarded), those the row layout reads where they are used, a `vec4` at a
//! time (row-forwarded), the elementwise values computed where their one reader reads them
//! (inlined), the reductions made in the loop that makes their operand (fused), and the `dot`s
//! that add into a resident output (accumulating). Each is a pure function of the verified kernel.

use std::collections::{BTreeSet, HashMap};

use tessel_plugin_api::ir::*;

/// The values that are whole blocks of `in` arrays (`load x`, no index, mask or `other`), with
/// the argument's position: a `dot` reads them straight from the argument's buffer.
pub(super) fn forwarded_loads(v: &Verified) -> ValueMap<usize> {
    let k = v.kernel();
    let mut out = ValueMap::new();
    analysis::visit(&k.body, &mut |s| {
        if let Op::Load { src, index: None, mask: None, other: None } = &s.op
            && let Some(pi) = k.params.iter().position(|p| &p.name == src && p.kind == ParamKind::In && !p.ty.is_scalar())
        {
            out.insert(v.id(&s.results[0]), pi);
        }
    });
    out
}

/// Whether `op` makes each element of its result from the same element of its operands (or from
/// none): the operations the writer computes element by element in one loop.
fn elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Cast(_)
            | Op::Bitcast(_)
            | Op::Full(_)
            | Op::Zeros
            | Op::Iota { .. }
    )
}

/// In the row layout (rows of `c`, a multiple of 4): the whole `in` blocks (`forwarded`) bound as
/// `vec4`s (`quad_inputs`) whose rows are that long and whose every reader reads them at their own
/// elements (elementwise operations of the same shape, whole stores) or along their rows
/// (`reduce` on axis 1): each reader reads the buffer itself, a `vec4` per quad, so the block is
/// never copied into private arrays.
pub(super) fn row_forwarded(
    v: &Verified,
    row_layout: Option<(usize, u32)>,
    quad_inputs: &BTreeSet<usize>,
    forwarded: &ValueMap<usize>,
) -> ValueMap<usize> {
    let Some((c, _)) = row_layout.filter(|r| r.0.is_multiple_of(4)) else { return ValueMap::new() };
    let k = v.kernel();
    let reads_own = |x: &str, shape: &[usize]| {
        analysis::readers(&k.body, x).iter().all(|r| match &r.op {
            Op::Reduce { axis: 1, .. } => true,
            Op::Store { index: None, mask: None, value: Operand::Value(val), dst } => {
                val == x && k.param(dst).is_some_and(|p| p.block_shape() == shape)
            }
            op => elementwise(op) && r.results.first().is_some_and(|y| v.value_type(y).shape == shape),
        })
    };
    (forwarded.iter())
        .filter(|&(x, pi)| {
            let shape = &v.values().ty(x).shape;
            quad_inputs.contains(pi) && shape.len() == 2 && shape[1] == c && reads_own(v.values().name(x), shape)
        })
        .map(|(x, &pi)| (x, pi))
        .collect()
}

/// In the row layout: reductions along the rows (`reduce` on axis 1 of a 2-D value whose rows
/// have the layout's length) of a value made by an elementwise operation of the same body and kept
/// in private arrays (not [`inlined_values`]: a reduction is not an elementwise reader). The loop
/// that makes the operand also accumulates the reduction, element by element in ascending order
/// along each row, as the reduction's own loop would: the operand is not read a second time.
pub(super) fn fused_reductions(v: &Verified, row_layout: Option<(usize, u32)>) -> ValueMap<(ReduceOp, ValueId)> {
    fn walk(v: &Verified, body: &[Stmt], c: usize, out: &mut ValueMap<(ReduceOp, ValueId)>) {
        for s in body {
            for b in s.op.bodies() {
                walk(v, b, c, out);
            }
            let Op::Reduce { op, arg: Operand::Value(x), axis: 1, .. } = &s.op else { continue };
            let ty = v.value_type(x);
            let made_here = body.iter().any(|t| t.results.first() == Some(x) && elementwise(&t.op));
            if made_here && ty.shape.len() == 2 && ty.shape[1] == c && ty.dtype != DType::Bool {
                out.insert(v.id(&s.results[0]), (*op, v.id(x)));
            }
        }
    }
    let mut out = ValueMap::new();
    if let Some((c, _)) = row_layout {
        walk(v, &v.kernel().body, c, &mut out);
    }
    out
}

/// Elementwise block values that need no private array: made by an elementwise operation and
/// read once, at its own elements, by an elementwise operation or a whole `store` of the same body
/// (so they are computed inside their reader's loop, element by element). A chain of them is cut
/// every [`INLINE_DEPTH`] links (that value is kept in its array): the writer reads an inlined
/// value by writing its operands first, so an uncut chain of 100,000 `add`s would nest as deep.
pub(super) fn inlined_values(v: &Verified) -> ValueSet {
    fn walk(v: &Verified, body: &[Stmt], readers: &analysis::Readers<'_>, depth: &mut ValueMap<usize>, out: &mut ValueSet) {
        for s in body {
            for b in s.op.bodies() {
                walk(v, b, readers, depth, out);
            }
            let Some(x) = s.results.first().filter(|x| elementwise(&s.op) && !v.value_type(x).is_scalar()) else { continue };
            let [r] = readers.of_value(x)[..] else { continue };
            let in_body = body.as_ptr_range().contains(&(r as *const Stmt));
            let once = analysis::reads(&r.op).iter().filter(|n| **n == x.as_str()).count() == 1;
            let shape = &v.value_type(x).shape;
            let fits = match &r.op {
                Op::Store { index: None, mask, value: Operand::Value(val), dst } => {
                    val == x
                        && mask.as_deref() != Some(x.as_str())
                        && v.kernel().param(dst).is_some_and(|p| p.block_shape() == shape.as_slice())
                }
                op => elementwise(op) && r.results.first().is_some_and(|y| &v.value_type(y).shape == shape),
            };
            // Links of inlined values behind this one, itself included.
            let links = 1 + (analysis::reads(&s.op).iter())
                .filter_map(|n| depth.get(v.id(n)).copied())
                .max()
                .unwrap_or(0);
            if in_body && once && fits && links <= INLINE_DEPTH {
                out.insert(v.id(x));
                depth.insert(v.id(x), links);
            }
        }
    }
    let mut out = ValueSet::new();
    let body = &v.kernel().body;
    walk(v, body, &analysis::Readers::of(body), &mut ValueMap::new(), &mut out);
    out
}

/// The most inlined values read through one another (see [`inlined_values`]).
pub(super) const INLINE_DEPTH: usize = 64;

/// `dot`s whose result is added into a [`resident`](analysis::resident) output and stored back
/// ([`analysis::accumulations`]): the dot adds its tile into the resident block itself. By the
/// `dot`'s result: the output's position and the load's and the add's results.
pub(super) fn accumulating_dots(v: &Verified, resident: &HashMap<String, usize>) -> ValueMap<(usize, ValueId, ValueId)> {
    fn walk(
        v: &Verified,
        body: &[Stmt],
        readers: &analysis::Readers<'_>,
        resident: &HashMap<String, usize>,
        out: &mut ValueMap<(usize, ValueId, ValueId)>,
    ) {
        for s in body {
            for b in s.op.bodies() {
                walk(v, b, readers, resident, out);
            }
        }
        for a in analysis::accumulations(body, |x| readers.of_value(x).len() == 1) {
            let Op::Load { src, .. } = &body[a.load].op else { continue };
            if let Some(&pi) = resident.get(src) {
                let id = |i: usize| v.id(&body[i].results[0]);
                out.insert(id(a.dot), (pi, id(a.load), id(a.add)));
            }
        }
    }
    let mut out = ValueMap::new();
    walk(v, &v.kernel().body, &analysis::Readers::of(&v.kernel().body), resident, &mut out);
    out
}
