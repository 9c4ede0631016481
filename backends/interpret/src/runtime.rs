//! Runs a lowered program over its grid: parallel programs on rayon's thread pool, the points of
//! `seq` axes in order inside each program, scratch per program (zeros at its start), outputs
//! starting as zeros.

use std::sync::atomic::{AtomicU32, Ordering};

use rayon::prelude::*;
use smallvec::SmallVec;
use tessel_plugin_api::array::{DataRef, HostArray, write_le_bits};
use tessel_plugin_api::ir::{DType, Literal, ParamKind, Verified, analysis};
use tessel_plugin_api::launch::LaunchAxis;

use crate::eval::{self, Data, Slice, Val, View, expand};
use crate::fuse::{self, Fused};
use crate::lower::{DotArg, Instr, Ix, MemRef, Program, Src};

/// Element storage of one array. Inputs are borrowed, typed and read-only; outputs and scratch
/// are bit patterns in relaxed atomics, because programs run concurrently and may (by the
/// author's choice) overlap; where they provably do not ([`Machine::own`]), a program reads and
/// writes its cells as plain memory ([`Cells::Own`]).
enum Storage<'i> {
    Input(DataRef<'i>),
    Shared(Vec<AtomicU32>),
    /// The caller's output memory itself (4-byte elements, aligned): written once, in place.
    Lent(&'i [AtomicU32]),
}

impl Storage<'_> {
    fn zeros(n: usize) -> Storage<'static> {
        Storage::Shared((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    /// The cells of an output or scratch array.
    fn cells(&self) -> Option<&[AtomicU32]> {
        match self {
            Storage::Input(_) => None,
            Storage::Shared(c) => Some(c),
            Storage::Lent(c) => Some(c),
        }
    }
}

/// Whether `bytes` can be an output's cells: whole, aligned 32-bit words on a little-endian
/// machine.
fn cells_fit(bytes: &[u8]) -> bool {
    cfg!(target_endian = "little") && bytes.len().is_multiple_of(4) && bytes.as_ptr().align_offset(align_of::<AtomicU32>()) == 0
}

/// `bytes` (which [`cells_fit`]) as cells that programs write concurrently; zeroed first unless
/// they are zeros already (`zero`), since outputs start as zeros.
#[allow(unsafe_code)]
fn as_cells(bytes: &mut [u8], zero: bool) -> &[AtomicU32] {
    assert!(cells_fit(bytes), "output memory is aligned 32-bit words");
    if zero {
        bytes.fill(0);
    }
    // SAFETY: `AtomicU32` has the size and bit validity of `u32`, and every bit pattern is a
    // `u32`; the pointer is aligned for it (checked above) and spans `len / 4` whole words of
    // `bytes`; the exclusive borrow of `bytes` lasts as long as the cells, so nothing else reads
    // or writes that memory meanwhile.
    unsafe { std::slice::from_raw_parts(bytes.as_mut_ptr().cast::<AtomicU32>(), bytes.len() / 4) }
}

/// One argument's memory and how programs see it.
struct Array<'i> {
    storage: Storage<'i>,
    shape: Vec<usize>,
    dtype: DType,
}

/// One dimension of a block's index map, ready to evaluate: `constant + sum(c * point[axis])`
/// block indices (an axis the grid lacks counts as 0), times `size` elements.
struct Origin {
    constant: i64,
    terms: Vec<(i64, Option<usize>)>,
    size: i64,
}

/// A kernel bound to its launch: memory for every argument, the grid.
pub(crate) struct Machine<'a> {
    kernel: &'a Verified,
    program: &'a Program,
    grid: &'a [LaunchAxis],
    /// One entry per `Kernel::params`; `None` for scratch (allocated per program).
    arrays: Vec<Option<Array<'a>>>,
    /// Per parameter, whether it is an output each program holds across its `seq` steps
    /// ([`analysis::resident`]): read once before its first step, written back after its last.
    resident: Vec<bool>,
    /// Per parameter with a block, per dimension, its index map with axes by position in the
    /// grid and the block's size: where [`ProgramState::enter`] puts the block's origin.
    origins: Vec<Option<Vec<Origin>>>,
    /// Per parameter, whether each program's elements of it are its own ([`analysis::own_blocks`];
    /// scratch always is): read and written as plain memory, not one atomic at a time.
    own: Vec<bool>,
}

impl<'a> Machine<'a> {
    /// A machine that writes the outputs named in `lent` straight into that memory (and the
    /// others into its own).
    fn new(
        kernel: &'a Verified,
        program: &'a Program,
        grid: &'a [LaunchAxis],
        inputs: &std::collections::BTreeMap<String, DataRef<'a>>,
        mut lent: std::collections::BTreeMap<&str, &'a [AtomicU32]>,
    ) -> Machine<'a> {
        let arrays = kernel
            .kernel()
            .params
            .iter()
            .map(|p| match p.kind {
                ParamKind::In => {
                    Some(Array { storage: Storage::Input(inputs[&p.name]), shape: p.ty.shape.clone(), dtype: p.ty.dtype })
                }
                ParamKind::Out => Some(Array {
                    storage: lent.remove(p.name.as_str()).map_or_else(|| Storage::zeros(p.ty.numel()), Storage::Lent),
                    shape: p.ty.shape.clone(),
                    dtype: p.ty.dtype,
                }),
                ParamKind::Scratch => None,
            })
            .collect();
        let params = &kernel.kernel().params;
        let resident = params.iter().map(|p| analysis::resident(kernel.kernel(), grid, p)).collect();
        let own = params.iter().map(|p| p.kind == ParamKind::Scratch || analysis::own_blocks(kernel.kernel(), grid, p)).collect();
        let dims = kernel.grid();
        let origins = (params.iter())
            .map(|p| {
                let b = p.block.as_ref()?;
                Some(
                    (b.index.iter().zip(&b.shape))
                        .map(|(e, &size)| Origin {
                            constant: e.constant,
                            terms: e.terms.iter().map(|(c, name)| (*c, dims.iter().position(|g| &g.name == name))).collect(),
                            size: size as i64,
                        })
                        .collect(),
                )
            })
            .collect();
        Machine { kernel, program, grid, arrays, resident, origins, own }
    }

    /// Runs every program and returns the outputs in declaration order.
    pub fn run(self) -> Vec<(String, HostArray)> {
        self.run_programs();
        self.outputs().map(|(name, a, bits)| (name, HostArray::from_bits(a.dtype, &a.shape, bits.collect()))).collect()
    }

    /// Runs every program with the outputs named in `zeroed` (memory of zeros, as
    /// [`HostArray::zeros`] makes it, that [`cells_fit`]) written there in place; returns the
    /// other outputs in declaration order.
    pub fn run_lent(
        kernel: &'a Verified,
        program: &'a Program,
        grid: &'a [LaunchAxis],
        inputs: &std::collections::BTreeMap<String, DataRef<'a>>,
        zeroed: std::collections::BTreeMap<&'a str, &'a mut [u8]>,
    ) -> Vec<(String, HostArray)> {
        let lent = zeroed.into_iter().map(|(n, b)| (n, as_cells(b, false))).collect();
        Machine::new(kernel, program, grid, inputs, lent).run()
    }

    /// Runs every program with each output's elements written as little-endian bytes into
    /// `outputs` (by name, of the outputs' types): in place where the bytes are aligned 32-bit
    /// words of a 4-byte dtype, else copied there once at the end.
    pub fn run_into(
        kernel: &'a Verified,
        program: &'a Program,
        grid: &'a [LaunchAxis],
        inputs: &std::collections::BTreeMap<String, DataRef<'a>>,
        outputs: &'a mut std::collections::BTreeMap<String, &mut [u8]>,
    ) {
        let mut lent = std::collections::BTreeMap::new();
        let mut copied = Vec::new();
        for (name, bytes) in outputs.iter_mut() {
            let Some(p) = kernel.kernel().param(name) else { continue };
            if p.ty.dtype.bits() == 32 && cells_fit(bytes) {
                // Outputs start as zeros, unless nothing could see them before they are stored.
                let zero = !analysis::overwritten(kernel.kernel(), grid, p);
                lent.insert(name.as_str(), as_cells(bytes, zero));
            } else {
                copied.push((name.as_str(), &mut **bytes));
            }
        }
        let m = Machine::new(kernel, program, grid, inputs, lent);
        m.run_programs();
        for (name, a, bits) in m.outputs() {
            if let Some((_, out)) = copied.iter_mut().find(|(n, _)| *n == name) {
                write_le_bits(a.dtype, bits, out);
            }
        }
    }

    fn run_programs(&self) {
        let par: Vec<usize> = (0..self.grid.len()).filter(|&a| !self.grid[a].seq).collect();
        let seq: Vec<usize> = (0..self.grid.len()).filter(|&a| self.grid[a].seq).collect();
        let programs: u64 = par.iter().map(|&a| self.grid[a].size).product();
        let steps: u64 = seq.iter().map(|&a| self.grid[a].size).product();
        // One program's state serves every program a thread runs in turn, its scratch zeroed
        // again for each (`ProgramState::start`).
        let init = || (ProgramState::new(self), vec![0i64; self.grid.len()]);
        (0..programs).into_par_iter().for_each_init(init, |(prog, point), pid| {
            decode(pid, &par, self.grid, point);
            prog.start();
            for step in 0..steps {
                decode(step, &seq, self.grid, point);
                prog.enter(point);
                if step == 0 {
                    prog.hold();
                }
                prog.exec(&self.program.body);
            }
            prog.release();
        });
    }

    /// Each output held in the machine's own memory: its name, its memory and its elements' bit
    /// patterns (outputs written in place are not listed).
    fn outputs(mut self) -> impl Iterator<Item = (String, Array<'a>, impl Iterator<Item = u32>)> {
        let params = &self.kernel.kernel().params;
        params.iter().zip(std::mem::take(&mut self.arrays)).filter(|(p, _)| p.kind == ParamKind::Out).filter_map(|(p, a)| {
            let mut a = a.expect("outputs have memory");
            let Storage::Shared(cells) = std::mem::replace(&mut a.storage, Storage::Shared(Vec::new())) else {
                return None;
            };
            Some((p.name.clone(), a, cells.into_iter().map(AtomicU32::into_inner)))
        })
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
    scratch: Vec<Option<Array<'static>>>,
    slots: Vec<Option<Val>>,
    /// Element origin of each argument's block at the current grid point.
    origins: Vec<Vec<i64>>,
    /// The blocks of resident outputs ([`Machine::resident`]) while the program holds them: what
    /// their loads read and their stores write, in the program's own memory.
    held: Vec<Option<Val>>,
    /// Whether no program has run on this state yet (its scratch is still zeros).
    fresh: bool,
    point: Vec<i64>,
}

impl<'m, 'a> ProgramState<'m, 'a> {
    fn new(m: &'m Machine<'a>) -> ProgramState<'m, 'a> {
        let params = &m.kernel.kernel().params;
        let scratch = params
            .iter()
            .map(|p| {
                (p.kind == ParamKind::Scratch).then(|| Array {
                    storage: Storage::zeros(p.ty.numel()),
                    shape: p.ty.shape.clone(),
                    dtype: p.ty.dtype,
                })
            })
            .collect();
        ProgramState {
            m,
            scratch,
            slots: vec![None; m.program.slots],
            origins: vec![Vec::new(); params.len()],
            held: vec![None; params.len()],
            fresh: true,
            point: Vec::new(),
        }
    }

    /// Begins a program: its scratch starts as zeros (a fresh state's already is).
    fn start(&mut self) {
        if std::mem::replace(&mut self.fresh, false) {
            return;
        }
        for a in self.scratch.iter().flatten() {
            plain(a.storage.cells().expect("scratch cells")).fill(0);
        }
    }

    /// Moves to grid point `point`: the origin of every argument's block there.
    fn enter(&mut self, point: &[i64]) {
        self.point.clear();
        self.point.extend_from_slice(point);
        for (n, p) in self.m.kernel.kernel().params.iter().enumerate() {
            let origin = &mut self.origins[n];
            origin.clear();
            match &self.m.origins[n] {
                None => origin.resize(p.ty.shape.len(), 0),
                Some(dims) => origin.extend(dims.iter().map(|d| {
                    let at = (d.terms.iter())
                        .fold(d.constant, |acc, &(c, axis)| acc.wrapping_add(c.wrapping_mul(axis.map_or(0, |a| point[a]))));
                    at.wrapping_mul(d.size)
                })),
            }
        }
    }

    /// Takes each resident output's block (the same at every step of the program) into the
    /// program's own memory.
    fn hold(&mut self) {
        for (n, p) in self.m.kernel.kernel().params.iter().enumerate() {
            if self.m.resident[n] {
                let block = p.block_shape().to_vec();
                let bits = self.read_cells(MemRef(n), &self.origins[n], &block, 0);
                self.held[n] = Some(Val::from_bits(p.ty.dtype, block, bits));
            }
        }
    }

    /// Writes each held block back into its output.
    fn release(&mut self) {
        for n in 0..self.held.len() {
            if let Some(v) = self.held[n].take() {
                let block = v.shape.clone();
                self.write_region(MemRef(n), &self.origins[n], &block, |cells, first| store_elements(v.view(), first, cells));
            }
        }
    }

    fn array(&self, mem: MemRef) -> &Array<'_> {
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
            Instr::Load { dst, mem, index, mask, other, dtype } => {
                (*dst, self.load(*mem, index.as_deref(), *mask, *other, *dtype))
            }
            Instr::Store { mem, index, value, mask } => {
                self.store(*mem, index.as_deref(), value, *mask);
                return;
            }
            Instr::ProgramId { dst, axis } => (*dst, Val::i32_scalar(self.point[*axis])),
            Instr::NumPrograms { dst, axis } => (*dst, Val::i32_scalar(self.m.grid[*axis].size as i64)),
            Instr::Const { dst, val } => (*dst, val.clone()),
            Instr::Unary { dst, op, a } => (*dst, eval::unary(*op, self.get(a).view())),
            Instr::Binary { dst, op, a, b } => (*dst, eval::binary(*op, self.get(a).view(), self.get(b).view())),
            Instr::Compare { dst, op, a, b } => (*dst, eval::compare(*op, self.get(a).view(), self.get(b).view())),
            Instr::Select { dst, c, a, b } => (*dst, eval::select(self.get(c).view(), self.get(a).view(), self.get(b).view())),
            Instr::Cast { dst, a, to } => (*dst, eval::cast(self.get(a).view(), *to)),
            Instr::Bitcast { dst, a, to } => (*dst, eval::bitcast(self.get(a), *to)),
            Instr::Broadcast { dst, a, shape } => (*dst, eval::broadcast_to(self.get(a), shape)),
            Instr::Reshape { dst, a, shape } => (*dst, eval::reshape(self.get(a), shape)),
            Instr::Transpose { dst, a, perm } => (*dst, eval::transpose(self.get(a), perm)),
            Instr::Reduce { dst, op, a, axis, keepdims } => (*dst, eval::reduce(*op, self.get(a).view(), *axis, *keepdims)),
            Instr::Dot { dst, a, b, trans_a, trans_b } => (*dst, self.dot(a, b, *trans_a, *trans_b)),
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
            Instr::Fused(f) => {
                self.run_fused(f);
                return;
            }
        };
        self.slots[dst] = Some(val);
    }

    fn run_for(
        &mut self,
        var: usize,
        (lo, hi, step): (&Src, &Src, &Src),
        iters: &[(usize, Src)],
        results: &[usize],
        body: &[Instr],
        yields: &[Src],
    ) {
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
        if let Some(v) = &self.held[mem.0] {
            return v.clone(); // resident: loaded whole, inside its array
        }
        let (starts, lens, shape) = self.region(mem, index);
        let other = Val::scalar_literal(dtype, other);
        let mut data = self.read_region(mem, &starts, &lens, &shape, &other, dtype);
        if let Some(lanes) = self.mask_lanes(mask, &shape) {
            apply_mask(&mut data, &lanes, &other.data);
        }
        Val { dtype, shape, data }
    }

    /// The elements of a region of `mem` in row-major order, `other` (a scalar) outside the array.
    fn read_region(&self, mem: MemRef, starts: &[i64], lens: &[usize], shape: &[usize], other: &Val, dtype: DType) -> Data {
        let arr = self.array(mem);
        let o = &other.data;
        let g = |other, copy| gather(&arr.shape, starts, lens, other, copy);
        match (&arr.storage, o) {
            (Storage::Input(DataRef::F32(v)), Data::F(o)) => {
                Data::F(g(o[0], &mut |f, n, out: &mut Vec<f32>| out.extend_from_slice(&v[f..f + n])))
            }
            (Storage::Input(DataRef::F16(v)), Data::F(o)) => {
                Data::F(g(o[0], &mut |f, n, out: &mut Vec<f32>| out.extend(v[f..f + n].iter().map(|x| x.to_f32()))))
            }
            (Storage::Input(DataRef::BF16(v)), Data::F(o)) => {
                Data::F(g(o[0], &mut |f, n, out: &mut Vec<f32>| out.extend(v[f..f + n].iter().map(|x| x.to_f32()))))
            }
            (Storage::Input(DataRef::I32(v)), Data::I(o)) => {
                Data::I(gather(&arr.shape, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n])))
            }
            (Storage::Input(DataRef::U32(v)), Data::U(o)) => {
                Data::U(gather(&arr.shape, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n])))
            }
            (Storage::Input(DataRef::Bool(v)), Data::B(o)) => {
                Data::B(gather(&arr.shape, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n])))
            }
            (Storage::Shared(_) | Storage::Lent(_), _) => {
                Val::from_bits(dtype, shape.to_vec(), self.read_cells(mem, starts, lens, other.to_bits()[0])).data
            }
            _ => unreachable!("launch::bind: inputs have their declared dtype"),
        }
    }

    /// The bit patterns of a region of output or scratch `mem`, `other` outside the array.
    fn read_cells(&self, mem: MemRef, starts: &[i64], lens: &[usize], other: u32) -> Vec<u32> {
        let arr = self.array(mem);
        let cells = arr.storage.cells().expect("an output or scratch");
        let own = self.m.own[mem.0];
        gather(&arr.shape, starts, lens, other, &mut |f, n, out| Cells::of(&cells[f..f + n], own).read_into(out))
    }

    fn store(&mut self, mem: MemRef, index: Option<&[Ix]>, value: &Src, mask: Option<usize>) {
        let (starts, lens, shape) = self.region(mem, index);
        let v = self.get(value);
        if self.held[mem.0].is_some() {
            let v = if v.shape == shape { v.clone() } else { eval::broadcast_to(v, &shape) };
            self.held[mem.0] = Some(v); // resident: stored whole
            return;
        }
        let lanes = self.mask_lanes(mask, &shape);
        if v.shape == shape && lanes.is_none() {
            return self.write_region(mem, &starts, &lens, |cells, first| store_elements(v.view(), first, cells));
        }
        let bits = v.to_bits();
        let bits = expand(&bits, &v.shape, &shape);
        self.write_region(mem, &starts, &lens, |mut cells, first| {
            let bits = &bits[first..first + cells.len()];
            match &lanes {
                None => cells.put(bits),
                Some(l) => (0..bits.len()).filter(|&i| l[first + i]).for_each(|i| cells.set(i, bits[i])),
            }
        });
    }

    /// Writes the part of a region of `mem` inside the array: `write(cells, first)` for each
    /// innermost row's inside part, `first` being the row-major lane of the region its first
    /// cell is.
    fn write_region(&self, mem: MemRef, starts: &[i64], lens: &[usize], mut write: impl FnMut(Cells<'_>, usize)) {
        let arr = self.array(mem);
        let cells = arr.storage.cells().expect("verifier: no store to an input");
        let own = self.m.own[mem.0];
        let mut lane = 0;
        for_each_row(&arr.shape, starts, lens, |len, span| {
            if let Some(r) = span {
                write(Cells::of(&cells[r.flat..r.flat + r.count], own), lane + r.before);
            }
            lane += len;
        });
    }

    /// A `dot`, its [`DotArg::Block`] operands read in place where their blocks lie inside.
    fn dot(&self, a: &DotArg, b: &DotArg, trans_a: bool, trans_b: bool) -> Val {
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

    /// The cells of the region `starts`, `lens` of `mem` as plain memory the program writes
    /// directly, where that region is one stretch inside the array, of the program's own
    /// elements ([`Machine::own`]), and not a held block.
    fn own_stretch(&self, mem: MemRef, starts: &[i64], lens: &[usize]) -> Option<&mut [u32]> {
        if self.held[mem.0].is_some() || !self.m.own[mem.0] {
            return None;
        }
        let arr = self.array(mem);
        let flat = contiguous(&arr.shape, starts, lens)?;
        Some(plain(&arr.storage.cells()?[flat..flat + lens.iter().product::<usize>()]))
    }

    /// Whether the whole block of `mem` lies inside its array at this grid point.
    fn inside(&self, mem: MemRef) -> bool {
        let arr = self.array(mem);
        let block = self.m.kernel.kernel().params[mem.0].block_shape();
        self.origins[mem.0].iter().zip(block).zip(&arr.shape).all(|((&o, &b), &n)| o >= 0 && o as usize + b <= n)
    }

    /// A fused run (`fuse.rs`), a chunk at a time; statement by statement where a block it loads
    /// or stores reaches past its array.
    fn run_fused(&mut self, f: &Fused) {
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
                let arg = |a: &fuse::Arg| match a {
                    fuse::Arg::Op(j) => regs[*j].as_ref().expect("operands come first").view(),
                    fuse::Arg::Outer(j) => outer[*j].view(),
                };
                let region = |mem: MemRef| -> SmallVec<[i64; 4]> {
                    self.origins[mem.0].iter().zip(&chunk.start).map(|(&o, &s)| o + s).collect()
                };
                let val = match op {
                    fuse::Op::Load { mem, .. } if let Some(held) = &self.held[mem.0] => outer_part(held, &f.shape, chunk, &block),
                    fuse::Op::Load { mem, dtype } => {
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
                    fuse::Op::Unary { op, a } => Part::Owned(eval::unary(*op, arg(a))),
                    fuse::Op::Binary { op, a, b } => {
                        // Straight into the output, where this chunk of it is the program's own.
                        if let Some(s) = f.into[i]
                            && let fuse::Op::Store { mem, .. } = f.ops[s]
                            && let Some(out) = self.own_stretch(mem, &region(mem), &chunk.lens)
                            && eval::binary_into(*op, arg(a), arg(b), out)
                        {
                            stored[s] = true;
                            continue;
                        }
                        Part::Owned(eval::binary(*op, arg(a), arg(b)))
                    }
                    fuse::Op::Compare { op, a, b } => Part::Owned(eval::compare(*op, arg(a), arg(b))),
                    fuse::Op::Select { c, a, b } => Part::Owned(eval::select(arg(c), arg(a), arg(b))),
                    fuse::Op::Cast { a, to } => Part::Owned(eval::cast(arg(a), *to)),
                    // Along the chunk's rows ([rows, cols]); kept as `[rows, 1]` with `keepdims`, for
                    // the operations of the run that broadcast it along the rows.
                    fuse::Op::Reduce { op, a, keepdims } => Part::Owned(eval::reduce(*op, arg(a), 1, *keepdims)),
                    fuse::Op::Store { .. } if stored[i] => continue,
                    fuse::Op::Store { mem, value } => {
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
                fuse::Op::Reduce { keepdims: true, .. } => [&f.shape[..rank - 1], &[1]].concat(),
                fuse::Op::Reduce { keepdims: false, .. } => f.shape[..rank - 1].to_vec(),
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
fn outer_part<'x>(v: &'x Val, shape: &[usize], chunk: &fuse::Chunk, block: &[usize; 2]) -> Part<'x> {
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

/// The flat index of the first element of the box `starts`, `lens` in a row-major array of
/// `shape`, where the box is one stretch of the array's elements and lies inside it: every
/// dimension after the first one longer than 1 is whole.
fn contiguous(shape: &[usize], starts: &[i64], lens: &[usize]) -> Option<usize> {
    let first = lens.iter().position(|&n| n > 1).unwrap_or(lens.len());
    let whole = (first + 1..shape.len()).all(|d| starts[d] == 0 && lens[d] == shape[d]);
    let inside = starts.iter().zip(lens).zip(shape).all(|((&s, &n), &dim)| s >= 0 && s as usize + n <= dim);
    // Row-major, in Horner form: ((s0 * n1 + s1) * n2 + s2) ...
    (whole && inside).then(|| starts.iter().zip(shape).fold(0, |flat, (&s, &n)| flat * n + s as usize))
}
/// Writes chunk `v` (of `chunk.lens`, row-major) into its place in `block`, a value of the
/// run's shape.
fn put_chunk(block: &mut Val, chunk: &fuse::Chunk, v: View<'_>) {
    let mut lane = 0;
    let shape = block.shape.clone();
    for_each_row(&shape, &chunk.start, &chunk.lens, |len, span| {
        let r = span.expect("a chunk lies inside its run's shape");
        block.data.copy_from(r.flat, v.data, lane, r.count);
        lane += len;
    });
}

/// Stores the bit patterns of `v`'s elements from `first` on into `cells`.
fn store_elements(v: View<'_>, first: usize, cells: Cells<'_>) {
    let range = first..first + cells.len();
    match cells {
        Cells::Own(out) => v.write_bits(range, out),
        Cells::Shared(cells) => {
            let mut cells = cells.iter();
            v.for_each_bits(range, |b| cells.next().expect("one cell per element").store(b, Ordering::Relaxed));
        }
    }
}

/// A stretch of an output's or scratch's cells, as one program reads or writes it.
enum Cells<'c> {
    /// Cells that no other program reads or writes while this one runs: plain memory.
    Own(&'c mut [u32]),
    /// Cells that other programs may write too: one relaxed atomic access each.
    Shared(&'c [AtomicU32]),
}

/// Cells of the program's own ([`Machine::own`]) as plain memory. Callers pass only cells
/// that no other thread reads or writes while this program runs, and use the slice before
/// making another of the same cells.
#[allow(unsafe_code)]
#[allow(clippy::mut_from_ref, reason = "exclusive by `Machine::own`, not by the borrow: see the SAFETY note")]
fn plain(cells: &[AtomicU32]) -> &mut [u32] {
    // SAFETY: `AtomicU32` has the size, alignment and bit validity of `u32` and keeps its value
    // in an `UnsafeCell`, so the memory behind a shared slice of them may be written through a
    // pointer derived from it. The caller's cells are the program's own: no other thread reads or
    // writes them while it runs (`analysis::own_blocks`: its accesses stay in blocks no other
    // program touches; or the program's own scratch), and within the program the slice made here
    // is the only access to them while it lives (each is used and dropped before the next is
    // made), so it aliases nothing.
    unsafe { std::slice::from_raw_parts_mut(cells.as_ptr().cast::<u32>().cast_mut(), cells.len()) }
}

impl<'c> Cells<'c> {
    /// `cells`, as plain memory where they are the program's `own` ([`Machine::own`]).
    fn of(cells: &'c [AtomicU32], own: bool) -> Cells<'c> {
        if own { Cells::Own(plain(cells)) } else { Cells::Shared(cells) }
    }

    fn len(&self) -> usize {
        match self {
            Cells::Own(c) => c.len(),
            Cells::Shared(c) => c.len(),
        }
    }

    fn set(&mut self, i: usize, bits: u32) {
        match self {
            Cells::Own(c) => c[i] = bits,
            Cells::Shared(c) => c[i].store(bits, Ordering::Relaxed),
        }
    }

    /// Stores `bits`, one per cell.
    fn put(&mut self, bits: &[u32]) {
        match self {
            Cells::Own(c) => c.copy_from_slice(bits),
            Cells::Shared(c) => c.iter().zip(bits).for_each(|(c, &b)| c.store(b, Ordering::Relaxed)),
        }
    }

    /// Appends the cells' bit patterns to `out`.
    fn read_into(&self, out: &mut Vec<u32>) {
        match self {
            Cells::Own(c) => out.extend_from_slice(c),
            Cells::Shared(c) => out.extend(c.iter().map(|c| c.load(Ordering::Relaxed))),
        }
    }
}

/// Sets the lanes where `lanes` is false to `other` (a one-element value of the same kind).
fn apply_mask(data: &mut Data, lanes: &[bool], other: &Data) {
    fn fill<T: Copy>(v: &mut [T], lanes: &[bool], o: T) {
        v.iter_mut().zip(lanes).filter(|(_, on)| !**on).for_each(|(x, _)| *x = o);
    }
    match (data, other) {
        (Data::F(v), Data::F(o)) => fill(v, lanes, o[0]),
        (Data::I(v), Data::I(o)) => fill(v, lanes, o[0]),
        (Data::U(v), Data::U(o)) => fill(v, lanes, o[0]),
        (Data::B(v), Data::B(o)) => fill(v, lanes, o[0]),
        _ => unreachable!("other has the loaded dtype"),
    }
}

/// The part of one innermost row of a region that lies inside the array.
struct RowSpan {
    /// Lanes before the first inside lane.
    before: usize,
    /// Flat array index of the first inside lane.
    flat: usize,
    /// Inside lanes.
    count: usize,
}

/// Gathers a region in row-major order: `copy(flat, n, out)` appends `n` elements from flat
/// index `flat`; lanes outside the array get `other`.
fn gather<T: Copy>(
    shape: &[usize],
    starts: &[i64],
    lens: &[usize],
    other: T,
    copy: &mut dyn FnMut(usize, usize, &mut Vec<T>),
) -> Vec<T> {
    let mut out = Vec::with_capacity(lens.iter().product::<usize>().max(1));
    for_each_row(shape, starts, lens, |len, span| {
        let start = out.len();
        if let Some(r) = span {
            out.resize(start + r.before, other);
            copy(r.flat, r.count, &mut out);
        }
        out.resize(start + len, other);
    });
    out
}

/// Visits the innermost rows of a region in row-major order: `f(row length, inside part)`.
/// A scalar (rank 0) array is one row of one lane.
fn for_each_row(shape: &[usize], starts: &[i64], lens: &[usize], mut f: impl FnMut(usize, Option<RowSpan>)) {
    let rank = shape.len();
    if rank == 0 {
        f(1, Some(RowSpan { before: 0, flat: 0, count: 1 }));
        return;
    }
    let st = eval::strides(shape);
    let n: usize = lens.iter().product();
    let last = rank - 1;
    let row = lens[last];
    if n == 0 {
        return;
    }
    // The inside part of the innermost dimension is the same for every row.
    let lo = starts[last].clamp(0, shape[last] as i64);
    let hi = (starts[last] + row as i64).clamp(0, shape[last] as i64);
    let (before, count) = ((lo - starts[last]) as usize, (hi - lo).max(0) as usize);
    let mut idx = vec![0usize; last];
    for _ in 0..n / row {
        let mut base = Some(0usize);
        for d in 0..last {
            let g = starts[d] + idx[d] as i64;
            base = match base {
                Some(b) if g >= 0 && (g as usize) < shape[d] => Some(b + g as usize * st[d]),
                _ => None,
            };
        }
        let span = base.filter(|_| count > 0).map(|b| RowSpan { before, flat: b + lo as usize, count });
        f(row, span);
        for d in (0..last).rev() {
            idx[d] += 1;
            if idx[d] < lens[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
