//! Programs merged along a grid axis: a kernel whose programs along a parallel axis `a` each
//! work on their own block of every array, side by side in one dimension `d` and element by
//! element, runs as fewer programs on blocks `g` times longer in `d` — `grid (i: 4096)` over
//! `block [1024]` runs as `grid (i: 256)` over `block [16384]`. Each merged program computes
//! exactly the elements its `g` programs would have, with the same operations in the same order
//! per element, so no result changes; what goes is the per-program and per-chunk bookkeeping,
//! which for small blocks costs as much as the work (docs/language.md §8).
//!
//! A kernel is merged only where that is provably so: `a` is a parallel axis of a fixed size
//! that `g` divides, no statement names it (`program_id`, `num_programs`); every array argument
//! has a block of one rank `r` whose dimension `d` has index exactly `a` (nothing else in it, and
//! `a` nowhere else) and one size `b`; no scratch; and the body is straight-line: whole loads and
//! stores, elementwise operations, constants, and reductions with `keepdims` along another
//! dimension, each value of rank `r` with `b` in dimension `d`, or a scalar. The rewritten kernel
//! is verified again; if it does not verify, the kernel runs as written.

use tessel_plugin_api::ir::analysis::reads;
use tessel_plugin_api::ir::{Affine, AxisSize, Op, ParamKind, Stmt, Verified, verify};

/// Elements a merged program's blocks aim at: enough that the bookkeeping is noise, few enough
/// that the programs still spread over the cores.
const TARGET: usize = 1 << 14;

/// What was merged, for `tessel lower`'s header: the axis, how many programs became one, and
/// the dimension whose blocks grew.
#[derive(Clone, Debug)]
pub(crate) struct Merged {
    pub axis: String,
    pub factor: u64,
    pub dim: usize,
}

/// `v` with its programs merged along one axis, where that provably changes no result, and
/// what was merged; `None` where the kernel runs as written.
pub(crate) fn coarsen(v: &Verified, threads: usize) -> Option<(Verified, Merged)> {
    let k = v.kernel();
    let grid = k.grid.as_ref()?;
    if k.params.iter().any(|p| p.kind == ParamKind::Scratch) || !straight_line(&k.body) {
        return None;
    }
    let arrays: Vec<_> = k.params.iter().filter(|p| !p.ty.shape.is_empty()).collect();
    let first = arrays.first()?.block.as_ref()?;
    let rank = first.shape.len();
    for (a, axis) in grid.iter().enumerate() {
        let AxisSize::Fixed(n) = axis.size else { continue };
        if axis.seq || n < 2 || names_axis(&k.body, &axis.name, a) {
            continue;
        }
        let Some(dim) = first.index.iter().position(|e| *e == Affine::axis(&axis.name)) else { continue };
        let size = first.shape[dim];
        let fits = arrays.iter().all(|p| {
            p.block.as_ref().is_some_and(|b| {
                b.shape.len() == rank
                    && b.shape[dim] == size
                    && b.index.iter().enumerate().all(|(e, ix)| {
                        if e == dim { *ix == Affine::axis(&axis.name) } else { ix.terms.iter().all(|(_, t)| *t != axis.name) }
                    })
            })
        });
        let block: usize = first.shape.iter().product();
        if !fits || block == 0 || !values_fit(v, &k.body, rank, dim, size) {
            continue;
        }
        let factor = factor(n, block, threads);
        if factor < 2 {
            continue;
        }
        let mut merged = k.clone();
        let g = merged.grid.as_mut().expect("has a grid");
        g[a].size = AxisSize::Fixed(n / factor);
        for p in &mut merged.params {
            if let Some(b) = &mut p.block {
                b.shape[dim] *= factor as usize;
            }
        }
        grow_types(&mut merged.body, rank, dim, size, factor as usize);
        let merged = verify(&merged).ok()?;
        return Some((merged, Merged { axis: axis.name.clone(), factor, dim }));
    }
    None
}

/// The largest divisor `g` of `n` with blocks of `g × block` elements near [`TARGET`] and at
/// least four merged programs a thread.
fn factor(n: u64, block: usize, threads: usize) -> u64 {
    let want = (TARGET / block).max(1) as u64;
    let most = (n / (4 * threads.max(1) as u64)).max(1);
    (1..=want.min(most)).rev().find(|g| n.is_multiple_of(*g)).unwrap_or(1)
}

/// Whole loads and stores, elementwise operations, constants and reductions that keep their
/// dimension, with no nested bodies.
fn straight_line(body: &[Stmt]) -> bool {
    body.iter().all(|s| match &s.op {
        Op::Load { index, mask, .. } => index.is_none() && mask.is_none(),
        Op::Store { index, mask, .. } => index.is_none() && mask.is_none(),
        Op::Unary(..) | Op::Binary(..) | Op::Compare(..) | Op::Select(..) | Op::Cast(_) | Op::Bitcast(_) => true,
        Op::Full(_) | Op::Zeros | Op::Iota { .. } => true,
        Op::Reduce { keepdims, .. } => *keepdims,
        _ => false,
    })
}

/// Whether any statement reads the grid axis `name` (position `pos`).
fn names_axis(body: &[Stmt], name: &str, pos: usize) -> bool {
    use tessel_plugin_api::ir::AxisRef;
    let is = |r: &AxisRef| match r {
        AxisRef::Name(n) => n == name,
        AxisRef::Pos(p) => *p == pos,
    };
    body.iter().any(|s| matches!(&s.op, Op::ProgramId(r) | Op::NumPrograms(r) if is(r)))
}

/// Every value has rank `rank` with `size` in dimension `dim`, or is a scalar; no `iota` counts
/// along `dim`, no reduction runs along it; every operand value is one of those.
fn values_fit(v: &Verified, body: &[Stmt], rank: usize, dim: usize, size: usize) -> bool {
    let fits = |name: &str| {
        let t = v.value_type(name);
        t.shape.is_empty() || (t.shape.len() == rank && t.shape[dim] == size)
    };
    body.iter().all(|s| {
        let along = match &s.op {
            Op::Iota { dim: d } => *d == dim,
            Op::Reduce { axis, .. } => *axis == dim,
            _ => false,
        };
        !along && s.results.iter().all(|r| fits(r)) && reads(&s.op).into_iter().all(fits)
    })
}

/// The written and inferred result types of the merged body: dimension `dim` of each value of
/// rank `rank` grows from `size` to `size × factor`.
fn grow_types(body: &mut [Stmt], rank: usize, dim: usize, size: usize, factor: usize) {
    for s in body {
        if let Some(t) = &mut s.ty
            && t.shape.len() == rank
            && t.shape[dim] == size
        {
            t.shape[dim] *= factor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(text: &str) -> Verified {
        verify(&tessel_plugin_api::ir::parse(text).expect("parses").kernels.remove(0)).expect("verifies")
    }

    #[test]
    fn an_elementwise_kernel_of_small_blocks_runs_as_fewer_programs() {
        let v = verified(
            "kernel k\n  grid (i: 4096)\n  in  x: f32[4194304] block [1024] at (i)\n  out o: f32[4194304] block [1024] at (i)\n{\n  %x = load x\n  %y = mul %x, 2.0 : f32[1024]\n  store o, %y\n}\n",
        );
        let (m, how) = coarsen(&v, 2).expect("merges");
        assert_eq!((how.axis.as_str(), how.factor, how.dim), ("i", 16, 0));
        assert_eq!(m.grid()[0].size, AxisSize::Fixed(256));
        assert_eq!(m.kernel().params[0].block.as_ref().unwrap().shape, vec![16384]);
        assert_eq!(m.value_type("y").shape, vec![16384]);
    }

    #[test]
    fn rows_merge_where_reductions_run_along_them_not_across() {
        let text = "kernel k\n  grid (i: 256)\n  in  x: f32[4096, 256] block [16, 256] at (i, 0)\n  out o: f32[4096, 256] block [16, 256] at (i, 0)\n{\n  %x = load x\n  %m = max %x axis 1 keepdims\n  %y = sub %x, %m\n  store o, %y\n}\n";
        let (m, how) = coarsen(&verified(text), 2).expect("merges");
        assert_eq!((how.factor, how.dim), (4, 0));
        assert_eq!(m.value_type("m").shape, vec![64, 1]);
        // Along the rows' own dimension a reduction would mix programs: not merged.
        let across = text.replace("axis 1", "axis 0");
        assert!(coarsen(&verified(&across), 2).is_none());
    }

    #[test]
    fn kernels_that_could_tell_are_not_merged() {
        let base = "kernel k\n  grid (i: 4096)\n  in  x: f32[4194304] block [1024] at (i)\n  out o: f32[4194304] block [1024] at (i)\n{\n  %x = load x\nBODY  store o, %x\n}\n";
        let cases = [
            // The program id is read.
            base.replace("BODY", "  %p = program_id i : i32\n"),
            // An iota counts along the merged dimension.
            base.replace("BODY", "  %t = iota 0 : i32[1024]\n"),
            // A store of part of the block.
            base.replace("BODY", "").replace("store o, %x", "store o[ds(0, 8)], 1.0"),
            // A `seq` axis.
            base.replace("BODY", "").replace("(i: 4096)", "(i: 4096 seq)"),
            // An index map that is not the axis alone.
            base.replace("BODY", "").replace("at (i)\n  out", "at (i + 1)\n  out"),
        ];
        for text in cases {
            let v = verified(&text);
            assert!(coarsen(&v, 2).is_none(), "merged:\n{text}");
        }
    }
}
