//! Runs a lowered program over its grid: parallel programs on rayon's thread pool, the points of
//! `seq` axes in order inside each program, scratch per program, outputs starting as zeros.

use std::sync::atomic::{AtomicU32, Ordering};

use rayon::prelude::*;
use tessel_plugin_api::array::HostArray;
use tessel_plugin_api::ir::{DType, Literal, ParamKind, Verified};
use tessel_plugin_api::launch::LaunchAxis;

use crate::eval::{self, Val, expand};
use crate::lower::{Instr, Ix, MemRef, Program, Src};

/// Element storage of one array, as bit patterns. Inputs are read-only; outputs and scratch are
/// relaxed atomics, because programs run concurrently and may (by the author's choice) overlap.
enum Storage {
    ReadOnly(Vec<u32>),
    Shared(Vec<AtomicU32>),
}

impl Storage {
    fn zeros(n: usize) -> Storage {
        Storage::Shared((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    fn get(&self, i: usize) -> u32 {
        match self {
            Storage::ReadOnly(v) => v[i],
            Storage::Shared(v) => v[i].load(Ordering::Relaxed),
        }
    }

    fn set(&self, i: usize, bits: u32) {
        match self {
            Storage::Shared(v) => v[i].store(bits, Ordering::Relaxed),
            Storage::ReadOnly(_) => unreachable!("verifier: no store to an input"),
        }
    }

    fn into_bits(self) -> Vec<u32> {
        match self {
            Storage::ReadOnly(v) => v,
            Storage::Shared(v) => v.into_iter().map(AtomicU32::into_inner).collect(),
        }
    }
}

/// One argument's memory and how programs see it.
struct Array {
    storage: Storage,
    shape: Vec<usize>,
    dtype: DType,
}

/// A kernel bound to its launch: memory for every argument, the grid.
pub(crate) struct Machine<'a> {
    kernel: &'a Verified,
    program: &'a Program,
    grid: &'a [LaunchAxis],
    /// One entry per `Kernel::params`; `None` for scratch (allocated per program).
    arrays: Vec<Option<Array>>,
}

impl<'a> Machine<'a> {
    pub fn new(kernel: &'a Verified, program: &'a Program, grid: &'a [LaunchAxis], inputs: &std::collections::BTreeMap<String, HostArray>) -> Machine<'a> {
        let arrays = kernel
            .kernel()
            .params
            .iter()
            .map(|p| match p.kind {
                ParamKind::In => {
                    let bits = inputs[&p.name].to_bits();
                    Some(Array { storage: Storage::ReadOnly(bits), shape: p.ty.shape.clone(), dtype: p.ty.dtype })
                }
                ParamKind::Out => Some(Array { storage: Storage::zeros(p.ty.numel()), shape: p.ty.shape.clone(), dtype: p.ty.dtype }),
                ParamKind::Scratch => None,
            })
            .collect();
        Machine { kernel, program, grid, arrays }
    }

    /// Runs every program and returns the outputs in declaration order.
    pub fn run(mut self) -> Vec<(String, HostArray)> {
        let par: Vec<usize> = (0..self.grid.len()).filter(|&a| !self.grid[a].seq).collect();
        let seq: Vec<usize> = (0..self.grid.len()).filter(|&a| self.grid[a].seq).collect();
        let programs: u64 = par.iter().map(|&a| self.grid[a].size).product();
        let steps: u64 = seq.iter().map(|&a| self.grid[a].size).product();
        let this = &self;
        (0..programs).into_par_iter().for_each(|pid| {
            let mut point = vec![0i64; this.grid.len()];
            decode(pid, &par, this.grid, &mut point);
            let mut prog = ProgramState::new(this);
            for step in 0..steps {
                decode(step, &seq, this.grid, &mut point);
                prog.run_point(&point);
            }
        });
        let params = &self.kernel.kernel().params;
        params
            .iter()
            .zip(std::mem::take(&mut self.arrays))
            .filter(|(p, _)| p.kind == ParamKind::Out)
            .map(|(p, a)| {
                let a = a.expect("outputs have memory");
                (p.name.clone(), HostArray::from_bits(a.dtype, &a.shape, a.storage.into_bits()))
            })
            .collect()
    }
}

/// Row-major decoding of `n` over `axes` (the last listed fastest) into `point`.
fn decode(mut n: u64, axes: &[usize], grid: &[LaunchAxis], point: &mut [i64]) {
    for &a in axes.iter().rev() {
        let size = grid[a].size;
        point[a] = (n % size) as i64;
        n /= size;
    }
}

/// The state of one program: its scratch and its values.
struct ProgramState<'m, 'a> {
    m: &'m Machine<'a>,
    scratch: Vec<Option<Array>>,
    slots: Vec<Option<Val>>,
    /// Element origin of each argument's block at the current grid point.
    origins: Vec<Vec<i64>>,
    point: Vec<i64>,
}

impl<'m, 'a> ProgramState<'m, 'a> {
    fn new(m: &'m Machine<'a>) -> ProgramState<'m, 'a> {
        let params = &m.kernel.kernel().params;
        let scratch = params
            .iter()
            .map(|p| (p.kind == ParamKind::Scratch).then(|| Array { storage: Storage::zeros(p.ty.numel()), shape: p.ty.shape.clone(), dtype: p.ty.dtype }))
            .collect();
        ProgramState { m, scratch, slots: vec![None; m.program.slots], origins: vec![Vec::new(); params.len()], point: Vec::new() }
    }

    fn run_point(&mut self, point: &[i64]) {
        self.point = point.to_vec();
        let grid = self.m.kernel.grid();
        for (n, p) in self.m.kernel.kernel().params.iter().enumerate() {
            self.origins[n] = match &p.block {
                None => vec![0; p.ty.shape.len()],
                Some(b) => b
                    .index
                    .iter()
                    .zip(&b.shape)
                    .map(|(e, &bs)| {
                        let at = e.eval(|name| grid.iter().position(|g| g.name == name).map_or(0, |a| point[a]));
                        at.wrapping_mul(bs as i64)
                    })
                    .collect(),
            };
        }
        let body = &self.m.program.body;
        self.exec(body);
    }

    fn array(&self, mem: MemRef) -> &Array {
        self.m.arrays[mem.0].as_ref().or(self.scratch[mem.0].as_ref()).expect("every argument has memory")
    }

    fn get<'s>(&'s self, s: &'s Src) -> &'s Val {
        match s {
            Src::Const(v) => v,
            Src::Slot(n) => self.slots[*n].as_ref().expect("verifier: values are defined before use"),
        }
    }

    fn exec(&mut self, body: &[Instr]) {
        for instr in body {
            self.step(instr);
        }
    }

    fn step(&mut self, instr: &Instr) {
        let (dst, val) = match instr {
            Instr::Load { dst, mem, index, mask, other, dtype } => (*dst, self.load(*mem, index.as_deref(), *mask, *other, *dtype)),
            Instr::Store { mem, index, value, mask } => {
                self.store(*mem, index.as_deref(), value, *mask);
                return;
            }
            Instr::ProgramId { dst, axis } => (*dst, Val::i32_scalar(self.point[*axis])),
            Instr::NumPrograms { dst, axis } => (*dst, Val::i32_scalar(self.m.grid[*axis].size as i64)),
            Instr::Const { dst, val } => (*dst, val.clone()),
            Instr::Unary { dst, op, a } => (*dst, eval::unary(*op, self.get(a))),
            Instr::Binary { dst, op, a, b } => (*dst, eval::binary(*op, self.get(a), self.get(b))),
            Instr::Compare { dst, op, a, b } => (*dst, eval::compare(*op, self.get(a), self.get(b))),
            Instr::Select { dst, c, a, b } => (*dst, eval::select(self.get(c), self.get(a), self.get(b))),
            Instr::Cast { dst, a, to } => (*dst, eval::cast(self.get(a), *to)),
            Instr::Bitcast { dst, a, to } => (*dst, eval::bitcast(self.get(a), *to)),
            Instr::Broadcast { dst, a, shape } => (*dst, eval::broadcast_to(self.get(a), shape)),
            Instr::Reshape { dst, a, shape } => (*dst, eval::reshape(self.get(a), shape)),
            Instr::Transpose { dst, a, perm } => (*dst, eval::transpose(self.get(a), perm)),
            Instr::Reduce { dst, op, a, axis, keepdims } => (*dst, eval::reduce(*op, self.get(a), *axis, *keepdims)),
            Instr::Dot { dst, a, b, trans_a, trans_b } => (*dst, eval::dot(self.get(a), self.get(b), *trans_a, *trans_b)),
            Instr::When { cond, body } => {
                if self.get(cond).as_bool() {
                    self.exec(body);
                }
                return;
            }
            Instr::For { var, lo, hi, step, iters, results, body, yields } => {
                self.run_for(*var, (lo, hi, step), iters, results, body, yields);
                return;
            }
        };
        self.slots[dst] = Some(val);
    }

    fn run_for(&mut self, var: usize, (lo, hi, step): (&Src, &Src, &Src), iters: &[(usize, Src)], results: &[usize], body: &[Instr], yields: &[Src]) {
        let (lo, hi, step) = (self.get(lo).as_i64(), self.get(hi).as_i64(), self.get(step).as_i64());
        for (slot, init) in iters {
            let v = self.get(init).clone();
            self.slots[*slot] = Some(v);
        }
        let mut i = lo;
        // A step that is not positive runs the body zero times (documented in docs/language.md).
        while step > 0 && i < hi {
            self.slots[var] = Some(Val::i32_scalar(i));
            self.exec(body);
            let next: Vec<Val> = yields.iter().map(|y| self.get(y).clone()).collect();
            for ((slot, _), v) in iters.iter().zip(next) {
                self.slots[*slot] = Some(v);
            }
            i += step;
        }
        for ((slot, _), r) in iters.iter().zip(results) {
            self.slots[*r] = self.slots[*slot].clone();
        }
    }

    /// The region an index list selects: per dimension a start relative to the block origin, a
    /// length, and whether the dimension is kept in the value's shape.
    fn region(&self, mem: MemRef, index: Option<&[Ix]>) -> (Vec<i64>, Vec<usize>, Vec<usize>) {
        let p = &self.m.kernel.kernel().params[mem.0];
        let block = p.block_shape();
        let origin = &self.origins[mem.0];
        let Some(index) = index else {
            return (origin.clone(), block.to_vec(), block.to_vec());
        };
        let (mut starts, mut lens, mut shape) = (Vec::new(), Vec::new(), Vec::new());
        for (d, ix) in index.iter().enumerate() {
            let (s, n, keep) = match ix {
                Ix::Full => (0, block[d], true),
                Ix::Slice(s, n) => (self.get(s).as_i64(), *n, true),
                Ix::At(s) => (self.get(s).as_i64(), 1, false),
            };
            starts.push(origin[d].wrapping_add(s));
            lens.push(n);
            if keep {
                shape.push(n);
            }
        }
        (starts, lens, shape)
    }

    fn mask_lanes(&self, mask: Option<usize>, shape: &[usize]) -> Option<Vec<bool>> {
        let m = self.slots[mask?].as_ref().expect("verifier: mask defined");
        let eval::Data::B(v) = &m.data else { unreachable!("verifier: bool mask") };
        Some(expand(v, &m.shape, shape).into_owned())
    }

    fn load(&self, mem: MemRef, index: Option<&[Ix]>, mask: Option<usize>, other: Literal, dtype: DType) -> Val {
        let arr = self.array(mem);
        if arr.shape.is_empty() {
            return Val::from_bits(dtype, Vec::new(), vec![arr.storage.get(0)]);
        }
        let (starts, lens, shape) = self.region(mem, index);
        let lanes = self.mask_lanes(mask, &shape);
        let other_bits = Val::scalar_literal(dtype, other).to_bits()[0];
        let mut bits = Vec::with_capacity(lens.iter().product());
        for_each_lane(&arr.shape, &starts, &lens, |lane, flat| {
            let on = lanes.as_ref().is_none_or(|l| l[lane]);
            bits.push(match flat {
                Some(f) if on => arr.storage.get(f),
                _ => other_bits,
            });
        });
        Val::from_bits(dtype, shape, bits)
    }

    fn store(&self, mem: MemRef, index: Option<&[Ix]>, value: &Src, mask: Option<usize>) {
        let arr = self.array(mem);
        let (starts, lens, shape) = self.region(mem, index);
        let v = self.get(value);
        let bits = v.to_bits();
        let bits = expand(&bits, &v.shape, &shape);
        let lanes = self.mask_lanes(mask, &shape);
        for_each_lane(&arr.shape, &starts, &lens, |lane, flat| {
            if let Some(f) = flat
                && lanes.as_ref().is_none_or(|l| l[lane])
            {
                arr.storage.set(f, bits[lane]);
            }
        });
    }
}

/// Visits the lanes of a region of an array in row-major order: `f(lane, Some(flat index))` for
/// lanes inside the array, `f(lane, None)` for lanes outside it.
fn for_each_lane(shape: &[usize], starts: &[i64], lens: &[usize], mut f: impl FnMut(usize, Option<usize>)) {
    let rank = shape.len();
    let st = eval::strides(shape);
    let n: usize = lens.iter().product();
    if n == 0 {
        return;
    }
    let last = rank - 1;
    let rows = n / lens[last];
    let mut idx = vec![0usize; rank];
    let mut lane = 0;
    for _ in 0..rows {
        // Flat offset of the row start over the outer dimensions, or None if any is outside.
        let mut base = Some(0usize);
        for d in 0..last {
            let g = starts[d] + idx[d] as i64;
            base = match base {
                Some(b) if g >= 0 && (g as usize) < shape[d] => Some(b + g as usize * st[d]),
                _ => None,
            };
        }
        for t in 0..lens[last] {
            let g = starts[last] + t as i64;
            let inside = g >= 0 && (g as usize) < shape[last];
            f(lane, base.filter(|_| inside).map(|b| b + g as usize));
            lane += 1;
        }
        for d in (0..last).rev() {
            idx[d] += 1;
            if idx[d] < lens[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
