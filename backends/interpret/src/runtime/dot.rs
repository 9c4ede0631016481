//! A program's `dot`: operands that `lower.rs` folded from whole-block loads of `f32` inputs
//! ([`DotArg::Block`]) are read in place where the block lies inside its array, else loaded.

use tessel_plugin_api::array::DataRef;
use tessel_plugin_api::ir::{DType, Literal};

use super::ProgramState;
use super::memory::Storage;
use crate::eval::{self, Val};
use crate::program::{DotArg, MemRef};

impl ProgramState<'_, '_> {
    /// A `dot`, its [`DotArg::Block`] operands read in place where their blocks lie inside.
    pub(super) fn dot(&self, a: &DotArg, b: &DotArg, trans_a: bool, trans_b: bool) -> Val {
        let (DotArg::Value(x), DotArg::Value(y)) = (a, b) else {
            // A block that reaches past its array is loaded, as the statement would be.
            let (va, vb) = (self.block_view(a), self.block_view(b));
            let load = |d: &DotArg, view: &Option<eval::Matrix<'_>>| match d {
                DotArg::Block(mem) if view.is_none() => Some(self.load(*mem, None, None, Literal::Int(0), DType::F32)),
                _ => None,
            };
            let (la, lb) = (load(a, &va), load(b, &vb));
            let (x, y) = (self.dot_matrix(a, va, &la), self.dot_matrix(b, vb, &lb));
            return eval::dot_f32(x.expect("an f32 operand"), y.expect("an f32 operand"), trans_a, trans_b);
        };
        eval::dot(self.get(x), self.get(y), trans_a, trans_b)
    }

    /// A `dot` operand as a matrix: loaded where its block reaches past its array, a value, or
    /// the block in place (`view`).
    fn dot_matrix<'s>(
        &'s self,
        d: &'s DotArg,
        view: Option<eval::Matrix<'s>>,
        loaded: &'s Option<Val>,
    ) -> Option<eval::Matrix<'s>> {
        match (d, loaded) {
            (_, Some(v)) => eval::Matrix::of(v),
            (DotArg::Value(s), None) => eval::Matrix::of(self.get(s)),
            (DotArg::Block(_), None) => view,
        }
    }

    /// A [`DotArg::Block`] operand as a matrix in its array, where the block lies inside.
    fn block_view(&self, d: &DotArg) -> Option<eval::Matrix<'_>> {
        match d {
            DotArg::Block(mem) => self.matrix(*mem),
            DotArg::Value(_) => None,
        }
    }

    /// The block of the `f32` input `mem` at this grid point as a matrix in the array, where it
    /// lies inside.
    fn matrix(&self, mem: MemRef) -> Option<eval::Matrix<'_>> {
        let arr = self.array(mem);
        let (Storage::Input(DataRef::F32(v)), true) = (&arr.storage, self.inside(mem)) else { return None };
        let block = self.m.kernel.kernel().params[mem.0].block_shape();
        let o = &self.origins[mem.0];
        let start = o[0] as usize * arr.shape[1] + o[1] as usize;
        Some(eval::Matrix { data: &v[start..], rows: block[0], cols: block[1], stride: arr.shape[1] })
    }
}
