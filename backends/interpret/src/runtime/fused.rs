//! A fused run (`fuse.rs`), a chunk at a time: each operation of a chunk is the whole-block
//! operation of `eval/` on the chunk, its operands borrowed in place where they can be (an
//! input's memory, a value made before the run, a held block), a binary's result written
//! straight into the output its store writes; an accumulation into a held block is one add.

use smallvec::SmallVec;
use tessel_plugin_api::array::DataRef;
use tessel_plugin_api::ir::{DType, Literal};

use super::memory::{Storage, contiguous, for_each_row, store_elements};
use super::{Machine, ProgramState};
use crate::eval::{self, Data, Slice, Val, View};
use crate::fuse;
use crate::program::{Chunk, Fused, FusedArg, FusedOp, MemRef, Src};

impl ProgramState<'_, '_> {
    /// [`Fused::accumulate`]: `%p` added into the held block of `c` in place, the operands in
    /// the add's order (the same bits as the run); whether `c` is held and `%p` of its shape.
    fn accumulate(&mut self, f: &Fused, (mem, p, acc_first): (MemRef, usize, bool)) -> bool {
        let p = match &f.outer[p] {
            Src::Slot(n) => self.slots[*n].as_ref().expect("verifier: values are defined before use"),
            Src::Const(v) => v,
        };
        let Some(held) = self.held[mem.0].as_mut() else { return false };
        let (Data::F(h), Data::F(q), DType::F32, DType::F32) = (&mut held.data, &p.data, held.dtype, p.dtype) else {
            return false;
        };
        if held.shape != p.shape {
            return false;
        }
        #[allow(clippy::assign_op_pattern, reason = "`p + acc` in that order, as the add has them (NaN payloads)")]
        match acc_first {
            true => h.iter_mut().zip(q).for_each(|(h, &q)| *h += q),
            false => h.iter_mut().zip(q).for_each(|(h, &q)| *h = q + *h),
        }
        true
    }

    /// A fused run (`fuse.rs`), a chunk at a time; statement by statement where a block it loads
    /// or stores reaches past its array.
    pub(super) fn run_fused(&mut self, f: &Fused) {
        if !f.mems.iter().all(|&m| self.inside(m)) {
            return self.exec(&f.original);
        }
        if let Some(acc) = f.accumulate
            && self.accumulate(f, acc)
        {
            return;
        }
        let rank = f.shape.len();
        let machine = self.m;
        let mut whole: SmallVec<[Option<(DType, Data)>; 8]> = smallvec::smallvec![None; f.ops.len()];
        // A chunk's stores into held blocks, made once its operands are no longer borrowed.
        let mut held_stores: Vec<(usize, Val)> = Vec::new();
        // Per operation, whether it is a store whose value was written in its place already.
        let mut stored: SmallVec<[bool; 16]> = smallvec::smallvec![false; f.ops.len()];
        for chunk in &f.chunks {
            stored.fill(false);
            let rows = if rank >= 2 { chunk.lens[rank - 2] } else { 1 };
            let block = [rows, chunk.lens[rank - 1]];
            let outer: SmallVec<[Part<'_>; 4]> =
                f.outer.iter().map(|s| outer_part(self.get(s), &f.shape, chunk, &block)).collect();
            let mut regs: SmallVec<[Option<Part<'_>>; 8]> = (0..f.ops.len()).map(|_| None).collect();
            for (i, op) in f.ops.iter().enumerate() {
                let arg = |a: &FusedArg| match a {
                    FusedArg::Op(j) => regs[*j].as_ref().expect("operands come first").view(),
                    FusedArg::Outer(j) => outer[*j].view(),
                };
                let region = |mem: MemRef| -> SmallVec<[i64; 4]> {
                    self.origins[mem.0].iter().zip(&chunk.start).map(|(&o, &s)| o + s).collect()
                };
                let val = match op {
                    FusedOp::Load { mem, .. } if let Some(held) = &self.held[mem.0] => outer_part(held, &f.shape, chunk, &block),
                    FusedOp::Load { mem, dtype } => {
                        let starts = region(*mem);
                        match machine.input_part(*mem, &starts, &chunk.lens) {
                            Some((dtype, data)) => Part::Borrowed { dtype, shape: block, data },
                            None => {
                                // What a loaded element reads outside its array (never, here:
                                // the blocks lie inside).
                                let zero = Val::scalar_literal(*dtype, Literal::Int(0));
                                let data = self.read_region(*mem, &starts, &chunk.lens, &block, &zero, *dtype);
                                Part::Owned(Val { dtype: *dtype, shape: block.to_vec(), data })
                            }
                        }
                    }
                    FusedOp::Unary { op, a } => Part::Owned(eval::unary(*op, arg(a))),
                    FusedOp::Binary { op, a, b } => {
                        // Straight into the output, where this chunk of it is the program's own.
                        if let Some(s) = f.into[i]
                            && let FusedOp::Store { mem, .. } = f.ops[s]
                            && let Some(out) = self.own_stretch(mem, &region(mem), &chunk.lens)
                            && eval::binary_into(*op, arg(a), arg(b), out)
                        {
                            stored[s] = true;
                            continue;
                        }
                        Part::Owned(eval::binary(*op, arg(a), arg(b)))
                    }
                    FusedOp::Compare { op, a, b } => Part::Owned(eval::compare(*op, arg(a), arg(b))),
                    FusedOp::Select { c, a, b } => Part::Owned(eval::select(arg(c), arg(a), arg(b))),
                    FusedOp::Cast { a, to } => Part::Owned(eval::cast(arg(a), *to)),
                    // Along the chunk's rows ([rows, cols]); kept as `[rows, 1]` with `keepdims`, for
                    // the operations of the run that broadcast it along the rows.
                    FusedOp::Reduce { op, a, keepdims } => Part::Owned(eval::reduce(*op, arg(a), 1, *keepdims)),
                    FusedOp::Store { .. } if stored[i] => continue,
                    FusedOp::Store { mem, value } => {
                        // A scalar stored is stretched over the chunk.
                        let v = arg(value);
                        let stretched;
                        let v = if v.shape == block {
                            v
                        } else {
                            stretched = eval::broadcast_to(&v.to_val(), &block);
                            stretched.view()
                        };
                        if self.held[mem.0].is_some() {
                            held_stores.push((mem.0, v.to_val()));
                        } else {
                            self.write_region(*mem, &region(*mem), &chunk.lens, |cells, first| store_elements(v, first, cells));
                        }
                        continue;
                    }
                };
                if f.keep[i].is_some() {
                    let v = val.view();
                    match &mut whole[i] {
                        Some((_, w)) => w.extend_from(v.data),
                        w @ None => *w = Some((v.dtype, v.to_val().data)),
                    }
                }
                regs[i] = Some(val);
            }
            drop((regs, outer));
            for (n, v) in held_stores.drain(..) {
                put_chunk(self.held[n].as_mut().expect("held"), chunk, v.view());
            }
        }
        for ((op, keep), w) in f.ops.iter().zip(&f.keep).zip(whole) {
            let (Some(slot), Some((dtype, data))) = (keep, w) else { continue };
            let shape = match op {
                FusedOp::Reduce { keepdims: true, .. } => [&f.shape[..rank - 1], &[1]].concat(),
                FusedOp::Reduce { keepdims: false, .. } => f.shape[..rank - 1].to_vec(),
                _ => f.shape.clone(),
            };
            self.slots[*slot] = Some(Val { dtype, shape, data });
        }
    }
}

impl<'a> Machine<'a> {
    /// A fused load's chunk of input `mem` (the region `starts`, `lens`), in place: where the
    /// input's elements are held as the value holds them (not `f16`/`bf16`, which widen) and the
    /// chunk is one stretch of the array.
    fn input_part(&self, mem: MemRef, starts: &[i64], lens: &[usize]) -> Option<(DType, Slice<'a>)> {
        let arr = self.arrays[mem.0].as_ref()?;
        let Storage::Input(data) = arr.storage else { return None };
        let flat = contiguous(&arr.shape, starts, lens)?;
        let n: usize = lens.iter().product();
        Some(match data {
            DataRef::F32(v) => (DType::F32, Slice::F(&v[flat..flat + n])),
            DataRef::I32(v) => (DType::I32, Slice::I(&v[flat..flat + n])),
            DataRef::U32(v) => (DType::U32, Slice::U(&v[flat..flat + n])),
            DataRef::Bool(v) => (DType::Bool, Slice::B(&v[flat..flat + n])),
            _ => return None,
        })
    }
}

/// A value of a fused run's chunk: made by the chunk's operation, or borrowed where it already
/// is (an input's memory, a value made before the run, a held block).
enum Part<'x> {
    Owned(Val),
    Borrowed {
        dtype: DType,
        shape: [usize; 2],
        data: Slice<'x>,
    },
    /// A value of one element, read as a scalar.
    Scalar(View<'x>),
}

impl Part<'_> {
    fn view(&self) -> View<'_> {
        match self {
            Part::Owned(v) => v.view(),
            Part::Borrowed { dtype, shape, data } => View { dtype: *dtype, shape, data: *data },
            Part::Scalar(v) => View { shape: &[], ..*v },
        }
    }
}

/// The part of `v` (broadcast to the run's `shape`) that `chunk` covers, as a `block`: `v`
/// in place where it has the run's shape and the chunk is one stretch of it, itself (a scalar)
/// where it is one element broadcast, else a copy.
fn outer_part<'x>(v: &'x Val, shape: &[usize], chunk: &Chunk, block: &[usize; 2]) -> Part<'x> {
    if v.shape == shape
        && let Some(flat) = contiguous(shape, &chunk.start, &chunk.lens)
    {
        let n = block[0] * block[1];
        let data = match &v.data {
            Data::F(x) => Slice::F(&x[flat..flat + n]),
            Data::I(x) => Slice::I(&x[flat..flat + n]),
            Data::U(x) => Slice::U(&x[flat..flat + n]),
            Data::B(x) => Slice::B(&x[flat..flat + n]),
        };
        return Part::Borrowed { dtype: v.dtype, shape: *block, data };
    }
    if v.data.len() == 1 {
        return Part::Scalar(v.view());
    }
    Part::Owned(fuse::broadcast_chunk(v, shape, chunk, block))
}

/// Writes chunk `v` (of `chunk.lens`, row-major) into its place in `block`, a value of the
/// run's shape.
fn put_chunk(block: &mut Val, chunk: &Chunk, v: View<'_>) {
    let mut lane = 0;
    let shape = block.shape.clone();
    for_each_row(&shape, &chunk.start, &chunk.lens, |len, span| {
        let r = span.expect("a chunk lies inside its run's shape");
        block.data.copy_from(r.flat, v.data, lane, r.count);
        lane += len;
    });
}
