//! A kernel batched over a new grid axis: what `jax.vmap` of a kernel launch becomes in one
//! launch. Every `in` and `out` array gains a leading dimension of the batch's size; each program
//! of the new (last, parallel) axis sees its own element of it as the original kernel saw the
//! whole array, through a block of one in that dimension that every `load` and `store` indexes at 0.
//! Scratch arrays, the body's maths and the other axes are unchanged, so each batch element gets
//! exactly the original kernel's results.

use super::{Affine, AxisSize, BlockSpec, GridAxis, Index, Kernel, Literal, Op, Operand, ParamKind, Stmt};

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
    axes.push(GridAxis { name: name.clone(), size: AxisSize::Fixed(size), seq: false, span: k.span });
    k.grid = Some(axes);
    let mut arrays = Vec::new();
    for p in k.params.iter_mut().filter(|p| p.kind != ParamKind::Scratch) {
        let block = p
            .block
            .take()
            .unwrap_or_else(|| BlockSpec { shape: p.ty.shape.clone(), index: vec![Affine::constant(0); p.ty.shape.len()] });
        p.block = Some(BlockSpec {
            shape: std::iter::once(1).chain(block.shape).collect(),
            index: std::iter::once(Affine::axis(&name)).chain(block.index).collect(),
        });
        p.ty.shape.insert(0, size as usize);
        arrays.push((p.name.clone(), p.ty.shape.len() - 1));
    }
    index_at_zero(&mut k.body, &arrays);
    Ok(k)
}

/// Every `load` and `store` of the batched `arrays` (name, original rank) indexes the new
/// leading dimension at 0.
fn index_at_zero(body: &mut [Stmt], arrays: &[(String, usize)]) {
    let rank = |name: &str| arrays.iter().find(|(n, _)| n == name).map(|(_, r)| *r);
    let zero = || Index::At(Operand::Lit(Literal::Int(0)));
    for s in body {
        match &mut s.op {
            Op::Load { src: name, index, .. } | Op::Store { dst: name, index, .. } => {
                if let Some(r) = rank(name) {
                    let rest = index.take().unwrap_or_else(|| vec![Index::Full; r]);
                    *index = Some(std::iter::once(zero()).chain(rest).collect());
                }
            }
            Op::When { body, .. } | Op::For { body, .. } => index_at_zero(body, arrays),
            _ => {}
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
        assert!(text.contains("in  x: f32[5, 4, 8] block [1, 4, 8] at (batch_, 0, 0)"), "{text}");
        assert!(text.contains("    %a = load x[0, :, :]") && text.contains("    store o[0, :, :], %a"), "{text}");
        verify::verify(&b).expect("verifies");
    }

    #[test]
    fn a_dyn_axis_is_not_batched() {
        let k = one("kernel f\n  grid (n: dyn)\n  in  x: f32[8]\n  out o: f32[8]\n{\n  %a = load x\n  store o, %a\n}\n");
        assert!(batched(&k, 2).unwrap_err().contains("`dyn` grid axis"));
    }
}
