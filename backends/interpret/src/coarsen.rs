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
//! `a` nowhere else) and one size `b`, or is an input whose block does not move with `a` (shared
//! by the merged programs); no scratch; and the body is straight-line: whole loads and stores,
//! elementwise operations, constants, reductions with `keepdims` along another dimension, and
//! `dot`s, each value derived from a merged array of rank `r` with `b` in dimension `d`, or a
//! scalar. A shared value meets a merged one only as the right operand of a `dot` whose left
//! operand grows in its rows (`d` = 0 of a matrix), so every row of the product is its own
//! program's (`matmul_512` runs as 16 programs of `[256, 64]` blocks, the `b` blocks shared).
//! The rewritten kernel is verified again; if it does not verify, the kernel runs as written.

use std::collections::HashSet;

use tessel_plugin_api::ir::analysis::reads;
use tessel_plugin_api::ir::{AxisSize, Op, Operand, ParamKind, Stmt, Verified, verify_derived};

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
        let Some(dim) = first.index.iter().position(|e| e.is_axis(&axis.name)) else { continue };
        let size = first.shape[dim];
        // Each array is merged (its block grows along `dim`) or shared (an input whose block does
        // not move with the axis: the same block for every merged program).
        let mut shared = Vec::new();
        let fits = arrays.iter().all(|p| {
            p.block.as_ref().is_some_and(|b| {
                let merged = b.shape.len() == rank
                    && b.shape[dim] == size
                    && b.index.iter().enumerate().all(|(e, ix)| {
                        if e == dim { ix.is_axis(&axis.name) } else { !ix.uses(&axis.name) }
                    });
                let still = p.kind == ParamKind::In && b.index.iter().all(|ix| !ix.uses(&axis.name));
                if !merged && still {
                    shared.push(p.name.as_str());
                }
                merged || still
            })
        });
        let block: usize = first.shape.iter().product();
        if !fits || block == 0 {
            continue;
        }
        let Some(growing) = varying(v, &k.body, &shared, rank, dim, size) else { continue };
        // The programs along the other parallel axes spread over the cores too.
        let others: u64 = grid
            .iter()
            .enumerate()
            .filter(|(b, x)| *b != a && !x.seq)
            .map(|(_, x)| if let AxisSize::Fixed(m) = x.size { m } else { 1 })
            .product();
        let factor = factor(n, others, block, threads);
        if factor < 2 {
            continue;
        }
        let mut merged = k.clone();
        let g = merged.grid.as_mut().expect("has a grid");
        g[a].size = AxisSize::Fixed(n / factor);
        for p in merged.params.iter_mut().filter(|p| !shared.contains(&p.name.as_str())) {
            if let Some(b) = &mut p.block {
                b.shape[dim] *= factor as usize;
            }
        }
        grow_types(&mut merged.body, &growing, dim, factor as usize);
        let merged = verify_derived(&merged).ok()?;
        return Some((merged, Merged { axis: axis.name.clone(), factor, dim }));
    }
    None
}

/// The largest divisor `g` of `n` with blocks of `g × block` elements near [`TARGET`] and at
/// least four merged programs a thread, counting the `others` along the other parallel axes.
fn factor(n: u64, others: u64, block: usize, threads: usize) -> u64 {
    let want = (TARGET / block).max(1) as u64;
    let most = (n * others.max(1) / (4 * threads.max(1) as u64)).max(1);
    (1..=want.min(most)).rev().find(|g| n.is_multiple_of(*g)).unwrap_or(1)
}

/// Whole loads and stores, elementwise operations, constants, reductions that keep their
/// dimension and `dot`s of an untransposed left operand, with no nested bodies.
fn straight_line(body: &[Stmt]) -> bool {
    body.iter().all(|s| match &s.op {
        Op::Dot { trans_a, .. } => !trans_a,
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

/// The values that grow along `dim` when the programs merge, where the body allows the merge:
/// every value derived from a merged array has rank `rank` with `size` in dimension `dim` (no
/// `iota` counts along it, no reduction runs along it), or is a scalar; a value derived only
/// from `shared` arrays stays as it is and meets a growing one only as the right operand of a
/// `dot` whose left one grows in its rows (`dim` 0 of a matrix): the product's rows are the
/// left operand's, so each merged program's rows are its own. `None` where anything else mixes
/// them.
fn varying(v: &Verified, body: &[Stmt], shared: &[&str], rank: usize, dim: usize, size: usize) -> Option<HashSet<String>> {
    let fits = |name: &str| {
        let t = v.value_type(name);
        t.shape.is_empty() || (t.shape.len() == rank && t.shape[dim] == size)
    };
    let scalar = |name: &str| v.value_type(name).shape.is_empty();
    let (mut grows, mut still) = (HashSet::new(), HashSet::<String>::new());
    for s in body {
        let ins: Vec<&str> = reads(&s.op).into_iter().filter(|r| !scalar(r)).collect();
        let is_still = |r: &&str| still.contains(*r);
        let stays = match &s.op {
            Op::Load { src, .. } => shared.contains(&src.as_str()),
            // A product's rows are its left operand's: rows that grow times a shared right
            // operand grow; a growing right operand would lengthen the contraction.
            Op::Dot { a, b, .. } => {
                let named = |o: &Operand, set: &HashSet<String>| matches!(o, Operand::Value(n) if set.contains(n));
                match (named(a, &grows), named(b, &grows)) {
                    (true, false) if named(b, &still) && dim == 0 && rank == 2 => false,
                    (false, false) => ins.iter().all(is_still),
                    _ => return None,
                }
            }
            Op::Store { .. } if ins.iter().any(is_still) => return None,
            _ => !ins.is_empty() && ins.iter().all(is_still),
        };
        if stays {
            still.extend(s.results.iter().cloned());
            continue;
        }
        let along = match &s.op {
            Op::Iota { dim: d } => *d == dim,
            Op::Reduce { axis, .. } => *axis == dim,
            _ => false,
        };
        let mixed = !matches!(&s.op, Op::Dot { .. }) && ins.iter().any(is_still);
        if along || mixed || !s.results.iter().all(|r| fits(r)) {
            return None;
        }
        grows.extend(s.results.iter().filter(|r| !scalar(r)).cloned());
    }
    Some(grows)
}

/// The written and inferred result types of the merged body: dimension `dim` of each value in
/// `growing` grows `factor` times.
fn grow_types(body: &mut [Stmt], growing: &HashSet<String>, dim: usize, factor: usize) {
    for s in body {
        if let Some(t) = &mut s.ty
            && s.results.iter().any(|r| growing.contains(r))
        {
            t.shape[dim] *= factor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(text: &str) -> Verified {
        tessel_plugin_api::ir::verify(&tessel_plugin_api::ir::parse(text).expect("parses").kernels.remove(0)).expect("verifies")
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

    /// A blocked matmul merges along the rows of its left operand and output; the right operand's
    /// block, which does not move with them, is shared by the merged programs.
    #[test]
    fn a_matmul_merges_its_rows_and_shares_the_right_operand() {
        let text = "kernel mm\n  grid (i: 8, j: 8, k: 8 seq)\n  in  a: f32[512, 512] block [64, 64] at (i, k)\n  in  b: f32[512, 512] block [64, 64] at (k, j)\n  out c: f32[512, 512] block [64, 64] at (i, j)\n{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  %acc = load c\n  %sum = add %acc, %p\n  store c, %sum\n}\n";
        let (m, how) = coarsen(&verified(text), 2).expect("merges");
        assert_eq!((how.axis.as_str(), how.factor, how.dim), ("i", 4, 0));
        let blocks: Vec<Vec<usize>> = m.kernel().params.iter().map(|p| p.block.as_ref().unwrap().shape.clone()).collect();
        assert_eq!(blocks, [vec![256, 64], vec![64, 64], vec![256, 64]]);
        assert_eq!((m.value_type("b").shape.clone(), m.value_type("sum").shape.clone()), (vec![64, 64], vec![256, 64]));
        // What would mix the merged programs' rows is not merged: the shared operand on the left
        // of the product, or met elementwise.
        for bad in ["%p = dot %b, %a", "%p = add %a, %b"] {
            assert!(coarsen(&verified(&text.replace("%p = dot %a, %b", bad)), 2).is_none(), "{bad}");
        }
        // A transposed left operand: its rows are the contraction.
        assert!(coarsen(&verified(&text.replace("dot %a, %b", "dot %a, %b trans_a")), 2).is_none());
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
