//! A kernel batched over a new grid axis: what `jax.vmap` of a kernel launch becomes in one
//! launch. Every `in` and `out` array gains a leading dimension of the batch's size; each program
//! of the new (last, parallel) axis sees its own element of it as the original kernel saw the
//! whole array: an array with a block through a block of one in that dimension that every `load`
//! and `store` indexes at 0, a whole-array reference (no block) by indexing that dimension at the
//! program's id on the new axis.
//! Scratch arrays, the body's maths and the other axes are unchanged, so each batch element gets
//! exactly the original kernel's results.

use std::collections::HashSet;

use super::size::SizeExpr;
use super::{Affine, AxisRef, BlockIndex, AxisSize, BlockSpec, ForLoop, GridAxis, Index, Kernel, Literal, Op, Operand, ParamKind, Stmt};

/// `kernel` over `size` batch elements, or why it cannot be (a `dyn` grid axis). A kernel whose
/// programs come from a mesh at launch is the caller's to keep unbatched: the mesh's axes would
/// not include the new one.
pub fn batched(kernel: &Kernel, size: u64) -> Result<Kernel, String> {
    let mut k = kernel.clone();
    let mut axes = k.grid.clone().unwrap_or_default();
    if axes.iter().any(|a| a.size == AxisSize::Dyn) {
        return Err(format!("kernel `{}` has a `dyn` grid axis", k.name));
    }
    let mut name = "batch".to_string();
    while axes.iter().any(|a| a.name == name) {
        name.push('_');
    }
    // Last: `program_id` and `num_programs` by position keep their meaning.
    axes.push(GridAxis { name: name.clone(), size: AxisSize::Fixed(size), seq: false, thread: false, from: None, span: k.span });
    k.grid = Some(axes);
    // The program's id on the new axis, for whole-array references: a name no value has.
    let mut taken = HashSet::new();
    results(&k.body, &mut taken);
    let mut id = "batch_id".to_string();
    while taken.contains(&id) {
        id.push('_');
    }
    let mut arrays = Vec::new();
    for p in k.params.iter_mut().filter(|p| p.kind != ParamKind::Scratch) {
        let at = match p.block.take() {
            Some(block) => {
                p.block = Some(BlockSpec {
                    shape: std::iter::once(1).chain(block.shape).collect(),
                    index: std::iter::once(Affine::axis(&name).into()).chain(block.index.into_iter().map(|ix| batch_reads(ix, &name))).collect(),
                });
                Operand::Lit(Literal::Int(0))
            }
            // Still a whole-array reference, which each program indexes itself.
            None => Operand::Value(id.clone()),
        };
        arrays.push((p.name.clone(), p.ty.shape.len(), at));
        p.ty.shape.insert(0, size as usize);
    }
    if arrays.iter().any(|(_, _, at)| matches!(at, Operand::Value(_))) {
        let program_id = Stmt { results: vec![id], op: Op::ProgramId(AxisRef::Name(name)), ty: None, span: k.span };
        k.body.insert(0, program_id);
    }
    index_batch(&mut k.body, &arrays);
    Ok(k)
}

/// A block index whose reads of inputs (each now with a leading batch dimension) read the
/// batch's own element.
fn batch_reads(ix: BlockIndex, axis: &str) -> BlockIndex {
    match ix {
        BlockIndex::Computed(e) => BlockIndex::Computed(e.rewrite(&|e| match e {
            SizeExpr::Read(n, ix) => SizeExpr::Read(n, std::iter::once(SizeExpr::Name(axis.to_string())).chain(ix).collect()),
            e => e,
        })),
        a => a,
    }
}

/// Every value name `body` defines, nested bodies' too.
fn results(body: &[Stmt], into: &mut HashSet<String>) {
    for s in body {
        into.extend(s.results.iter().cloned());
        if let Op::For(ForLoop { iters, var, .. }) = &s.op {
            into.extend(iters.iter().map(|(n, _)| n.clone()));
            into.insert(var.clone());
        }
        for body in s.op.bodies() {
            results(body, into);
        }
    }
}

/// Every `load` and `store` of the batched `arrays` (name, original rank, index of the new
/// leading dimension) indexes that dimension.
fn index_batch(body: &mut [Stmt], arrays: &[(String, usize, Operand)]) {
    for s in body {
        match &mut s.op {
            Op::Load { src: name, index, .. } | Op::Store { dst: name, index, .. } => {
                if let Some((_, r, at)) = arrays.iter().find(|(n, _, _)| n == name) {
                    let rest = index.take().unwrap_or_else(|| vec![Index::Full; *r]);
                    *index = Some(std::iter::once(Index::At(at.clone())).chain(rest).collect());
                }
            }
            op => op.bodies_mut().for_each(|b| index_batch(b, arrays)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{parse, print::print_kernel, verify};

    fn one(text: &str) -> Kernel {
        parse::parse(text).expect("parses").kernels.remove(0)
    }

    #[test]
    fn a_blocked_kernel_gains_a_last_parallel_axis_and_a_leading_dimension() {
        let k = one(
            "kernel add\n  grid (i: 8, k: 2 seq)\n  in  x: f32[1024] block [128] at (i)\n  out o: f32[1024] block [128] at (i)\n  scratch s: f32[128]\n{\n  %a = load x\n  %b = load s\n  %c = add %a, %b\n  store o[ds(0, 128)], %c\n}\n",
        );
        let b = batched(&k, 3).expect("batches");
        let text = print_kernel(&b);
        assert!(text.contains("grid (i: 8, k: 2 seq, batch: 3)"), "{text}");
        assert!(text.contains("in  x: f32[3, 1024] block [1, 128] at (batch, i)"), "{text}");
        assert!(text.contains("out o: f32[3, 1024] block [1, 128] at (batch, i)"), "{text}");
        assert!(text.contains("scratch s: f32[128]"), "{text}");
        assert!(text.contains("load x[0, :]") && text.contains("load s\n"), "{text}");
        assert!(text.contains("store o[0, ds(0, 128)]"), "{text}");
        verify::verify(&b).expect("verifies");
    }

    #[test]
    fn whole_arrays_nested_bodies_and_a_taken_name() {
        let k = one(
            "kernel f\n  grid (batch: 2 seq)\n  in  x: f32[4, 8]\n  out o: f32[4, 8]\n{\n  %i = program_id 0\n  %c = eq %i, 0\n  when %c {\n    %a = load x\n    store o, %a\n  }\n}\n",
        );
        verify::verify(&k).expect("the original verifies");
        let b = batched(&k, 5).expect("batches");
        let text = print_kernel(&b);
        assert!(text.contains("grid (batch: 2 seq, batch_: 5)"), "{text}");
        // Whole-array references stay so, indexed at the program's id on the new axis.
        assert!(text.contains("in  x: f32[5, 4, 8]\n"), "{text}");
        assert!(text.contains("%batch_id = program_id batch_"), "{text}");
        assert!(text.contains("    %a = load x[%batch_id, :, :]") && text.contains("    store o[%batch_id, :, :], %a"), "{text}");
        verify::verify(&b).expect("verifies");
    }

    #[test]
    fn whole_arrays_written_by_every_program_stay_whole_array_references() {
        // Each program writes its own slice of a whole-array output: a block would make the
        // output one that every program of `i` writes, which the verifier refuses.
        let k = one(
            "kernel masked\n  grid (i: 8)\n  in  x: f32[1000]\n  out o: f32[1000]\n{\n  %i = program_id i\n  %start = mul %i, 128\n  %lane = iota 0 : i32[128]\n  %pos = add %lane, %start\n  %ok = lt %pos, 1000\n  %v = load x[ds(%start, 128)] mask %ok other 0.0\n  store o[ds(%start, 128)], %v mask %ok\n}\n",
        );
        let b = batched(&k, 3).expect("batches");
        let text = print_kernel(&b);
        assert!(text.contains("out o: f32[3, 1000]\n"), "{text}");
        assert!(text.contains("store o[%batch_id, ds(%start, 128)], %v mask %ok"), "{text}");
        verify::verify(&b).expect("verifies");
    }

    #[test]
    fn a_dyn_axis_is_not_batched() {
        let k = one("kernel f\n  grid (n: dyn)\n  in  x: f32[8]\n  out o: f32[8]\n{\n  %a = load x\n  store o, %a\n}\n");
        assert!(batched(&k, 2).unwrap_err().contains("`dyn` grid axis"));
    }
}
