//! Runs a lowered program over its grid: parallel programs on rayon's thread pool, the points of
//! `seq` axes in order inside each program, scratch per program (zeros at its start), outputs
//! starting as zeros.
//!
//! The files. This one binds a launch's memory ([`Machine`]) and runs one program's statements
//! one by one ([`ProgramState`]); the next four add methods to those two (`impl` blocks):
//! - `grid.rs`: the walk over the grid, a program per parallel point and its `seq` steps in
//!   order; a program's state from point to point (block origins, resident outputs);
//! - `access.rs`: loads and stores: regions, masks, held blocks, the edges of arrays;
//! - `dot.rs`: `dot`, reading `f32` input blocks in place;
//! - `fused.rs`: fused runs (`fuse.rs`), a chunk at a time;
//! - `memory.rs`: the arrays' storage, the cells that programs write, the rows of a region.
//!
//! `memory.rs` imports none of the others; the rest import it and this file, not each other.

mod access;
mod concurrent;
mod dot;
mod fused;
mod grid;
mod memory;
mod threads;

use std::sync::atomic::AtomicU32;

use tessel_plugin_api::array::{DataRef, HostArray, read_le_bits, write_le_bits};
use tessel_plugin_api::cancel::{self, Token};
use tessel_plugin_api::ir::size::SizeExpr;
use tessel_plugin_api::ir::{BlockIndex, ParamKind, Verified, analysis, index};
use tessel_plugin_api::launch::{LaunchAxis, LaunchError};

use crate::eval::{self, Val};
use crate::program::{Instr, MemRef, Program, Src};
use memory::{Array, Storage, as_cells, cells_fit};

/// One dimension of a block's index map, ready to evaluate: `constant + sum(c * point[axis])`
/// block indices (an axis the grid lacks counts as 0), times `size` elements.
enum Origin {
    /// `(constant + sum of c * axis) * size`; an axis the launch lacks reads 0.
    Affine { constant: i64, terms: Vec<(i64, Option<usize>)>, size: i64 },
    /// A computed block index, brought into `0 ..= blocks - 1` (`IndexEval::clamp`), times `size`.
    Computed { expr: SizeExpr, blocks: i64, size: i64 },
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
    /// The launch's cancellation token (the calling thread's, [`cancel::current`]): once it is
    /// cancelled no program starts, no `for` iteration runs, and the launch fails.
    cancel: Option<Token>,
}

impl<'a> Machine<'a> {
    /// A machine that writes the outputs named in `lent` straight into that memory (and the
    /// others into its own, which starts as the cells `initial` gives, or zeros).
    fn new(
        kernel: &'a Verified,
        program: &'a Program,
        grid: &'a [LaunchAxis],
        inputs: &std::collections::BTreeMap<String, DataRef<'a>>,
        mut lent: std::collections::BTreeMap<&str, &'a [AtomicU32]>,
        mut initial: std::collections::BTreeMap<&str, Vec<AtomicU32>>,
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
                    storage: match (lent.remove(p.name.as_str()), initial.remove(p.name.as_str())) {
                        (Some(cells), _) => Storage::Lent(cells),
                        (None, Some(cells)) => Storage::Shared(cells),
                        (None, None) => Storage::zeros(p.ty.numel()),
                    },
                    shape: p.ty.shape.clone(),
                    dtype: p.ty.dtype,
                }),
                ParamKind::Scratch => None,
            })
            .collect();
        let params = &kernel.kernel().params;
        let resident: Vec<bool> = params.iter().map(|p| analysis::resident(kernel.kernel(), grid, p)).collect();
        // A program of the concurrent model shares its scratch among its threads and holds no
        // output block of its own: every access goes to memory (and is checked), one atomic at
        // a time.
        let concurrent = program.concurrent;
        let resident = if concurrent { vec![false; params.len()] } else { resident };
        let own = (params.iter())
            .map(|p| !concurrent && (p.kind == ParamKind::Scratch || analysis::own_blocks(kernel.kernel(), grid, p)))
            .collect();
        let dims = kernel.grid();
        let origins = (params.iter())
            .map(|p| {
                let b = p.block.as_ref()?;
                Some(
                    (b.index.iter().zip(&b.shape).enumerate())
                        .map(|(d, (e, &size))| match e {
                            BlockIndex::Affine(e) => Origin::Affine {
                                constant: e.constant,
                                terms: e.terms.iter().map(|(c, name)| (*c, dims.iter().position(|g| &g.name == name))).collect(),
                                size: size as i64,
                            },
                            BlockIndex::Computed(e) => {
                                Origin::Computed { expr: e.clone(), blocks: index::blocks(p, d), size: size as i64 }
                            }
                        })
                        .collect(),
                )
            })
            .collect();
        Machine { kernel, program, grid, arrays, resident, origins, own, cancel: cancel::current() }
    }

    /// Whether the launch was cancelled.
    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(Token::is_cancelled)
    }

    /// [`Machine::run_programs`], failing where the launch was cancelled before every program ran.
    fn run_all(&self) -> Result<(), LaunchError> {
        if self.program.concurrent {
            let run = self.run_concurrent();
            // A cancelled launch stops its threads where they are: whatever they then report is
            // not the kernel's doing.
            if !self.cancelled() {
                run?;
            }
        } else {
            self.run_programs();
        }
        if self.cancelled() {
            return Err(LaunchError::Cancelled { kernel: self.kernel.name().to_string() });
        }
        Ok(())
    }

    /// Runs every program and returns the outputs in declaration order.
    pub fn run(self) -> Result<Vec<(String, HostArray)>, LaunchError> {
        self.run_all()?;
        Ok(self.outputs().map(|(name, a, bits)| (name, HostArray::from_bits(a.dtype, &a.shape, bits.collect()))).collect())
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
    ) -> Result<Vec<(String, HostArray)>, LaunchError> {
        let lent = zeroed.into_iter().map(|(n, b)| (n, as_cells(b, false))).collect();
        Machine::new(kernel, program, grid, inputs, lent, Default::default()).run()
    }

    /// Runs every program with each output's elements written as little-endian bytes into
    /// `outputs` (by name, of the outputs' types): in place where the bytes are aligned 32-bit
    /// words of a 4-byte dtype, else copied there once at the end. The outputs named in `kept`
    /// start from what their bytes hold (an aliased input's values), the others from zeros.
    pub fn run_into(
        kernel: &'a Verified,
        program: &'a Program,
        grid: &'a [LaunchAxis],
        inputs: &std::collections::BTreeMap<String, DataRef<'a>>,
        outputs: &'a mut std::collections::BTreeMap<String, &mut [u8]>,
        kept: &std::collections::BTreeSet<String>,
    ) -> Result<(), LaunchError> {
        let mut lent = std::collections::BTreeMap::new();
        let mut initial = std::collections::BTreeMap::new();
        let mut copied = Vec::new();
        for (name, bytes) in outputs.iter_mut() {
            let Some(p) = kernel.kernel().param(name) else { continue };
            let keep = kept.contains(name);
            if p.ty.dtype.bits() == 32 && cells_fit(bytes) {
                // Outputs start as zeros, unless nothing could see them before they are stored.
                let zero = !keep && !analysis::overwritten(kernel.kernel(), grid, p);
                lent.insert(name.as_str(), as_cells(bytes, zero));
            } else {
                if keep {
                    initial.insert(name.as_str(), read_le_bits(p.ty.dtype, bytes).map(AtomicU32::new).collect());
                }
                copied.push((name.as_str(), &mut **bytes));
            }
        }
        let m = Machine::new(kernel, program, grid, inputs, lent, initial);
        m.run_all()?;
        for (name, a, bits) in m.outputs() {
            if let Some((_, out)) = copied.iter_mut().find(|(n, _)| *n == name) {
                write_le_bits(a.dtype, bits, out);
            }
        }
        Ok(())
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

/// The state of one program: its scratch and its values.
struct ProgramState<'m, 'a> {
    m: &'m Machine<'a>,
    scratch: Vec<Option<Array<'m>>>,
    slots: Vec<Option<Val>>,
    /// Element origin of each argument's block at the current grid point.
    origins: Vec<Vec<i64>>,
    /// The blocks of resident outputs ([`Machine::resident`]) while the program holds them: what
    /// their loads read and their stores write, in the program's own memory.
    held: Vec<Option<Val>>,
    /// Whether no program has run on this state yet (its scratch is still zeros).
    fresh: bool,
    point: Vec<i64>,
    /// In a program of the concurrent model: the program's threads and barriers, and which
    /// thread this state runs (`concurrent.rs`).
    threads: Option<(&'m threads::Shared<'m>, usize)>,
}

impl<'m, 'a> ProgramState<'m, 'a> {
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
            Instr::Slice { dst, a, start, stride, shape } => (*dst, eval::slice(self.get(a), start, stride, shape)),
            Instr::Concatenate { dst, args, axis } => {
                let vals: Vec<&eval::Val> = args.iter().map(|a| self.get(a)).collect();
                (*dst, eval::concatenate(&vals, *axis))
            }
            Instr::Reduce { dst, op, a, axis, keepdims } => (*dst, eval::reduce(*op, self.get(a).view(), *axis, *keepdims)),
            Instr::Dot { dst, a, b, trans_a, trans_b } => (*dst, self.dot(a, b, *trans_a, *trans_b)),
            Instr::When { cond, body } => {
                if self.get(cond).as_bool() {
                    self.exec(body);
                }
                return;
            }
            Instr::For { var, lo, hi, step, iters, cond, results, body, yields } => {
                self.run_for(*var, (lo, hi, step), iters, *cond, results, body, yields);
                return;
            }
            Instr::If { cond, then, els, results } => {
                let taken = if self.get(cond).as_bool() { then } else { els };
                self.exec(&taken.body);
                let vals: Vec<Val> = taken.yields.iter().map(|y| self.get(y).clone()).collect();
                for (r, v) in results.iter().zip(vals) {
                    self.slots[*r] = Some(v);
                }
                return;
            }
            Instr::Fused(f) => {
                self.run_fused(f);
                return;
            }
            Instr::Checked { stmt, instr } => {
                self.check_access(*stmt, instr);
                self.step(instr);
                return;
            }
            Instr::Sync { stmt, op } => {
                self.sync(*stmt, op);
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
        cond: Option<usize>,
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
        // A cancelled launch runs no more iterations (its outputs are thrown away).
        let going = |s: &Self| cond.is_none_or(|c| s.slots[c].as_ref().expect("a carried value").as_bool());
        while step > 0 && i < hi && going(self) && !self.m.cancelled() {
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
}
