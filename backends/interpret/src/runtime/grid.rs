//! The walk over the grid: each parallel point a program on rayon's pool, its `seq` points in
//! order; and one program's state from point to point: scratch zeroed per program, the origin
//! of every block, resident outputs held from the first step and written back after the last.

use rayon::prelude::*;
use tessel_plugin_api::ir::ParamKind;
use tessel_plugin_api::launch::LaunchAxis;

use super::memory::{Array, Storage, plain, store_elements};
use super::{Machine, Origin, ProgramState};
use tessel_plugin_api::array::DataRef;
use tessel_plugin_api::ir::index::{self, IndexEval};
use tessel_plugin_api::ir::size::SizeExpr;
use crate::eval::Val;
use crate::program::MemRef;

impl Machine<'_> {
    /// Runs every program: the parallel points of the grid on rayon's pool, each program's `seq`
    /// points in order. Once the launch is cancelled no program or step starts.
    pub(super) fn run_programs(&self) {
        let par: Vec<usize> = (0..self.grid.len()).filter(|&a| !self.grid[a].seq).collect();
        let seq: Vec<usize> = (0..self.grid.len()).filter(|&a| self.grid[a].seq).collect();
        let programs: u64 = par.iter().map(|&a| self.grid[a].size).product();
        let steps: u64 = seq.iter().map(|&a| self.grid[a].size).product();
        // One program's state serves every program a thread runs in turn, its scratch zeroed
        // again for each (`ProgramState::start`).
        let init = || (ProgramState::new(self), vec![0i64; self.grid.len()]);
        (0..programs).into_par_iter().for_each_init(init, |(prog, point), pid| {
            if self.cancelled() {
                return;
            }
            decode(pid, &par, self.grid, point);
            prog.start();
            for step in 0..steps {
                if step > 0 && self.cancelled() {
                    break;
                }
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
}

impl Machine<'_> {
    /// A computed block index at grid point `point`: axes by name, inputs read as 32-bit
    /// integers, 0 outside their arrays.
    fn index_value(&self, expr: &SizeExpr, point: &[i64]) -> i32 {
        let dims = self.kernel.grid();
        let params = &self.kernel.kernel().params;
        let axis = |name: &str| dims.iter().position(|g| g.name == name).map_or(0, |a| point[a] as i32);
        let read = |name: &str, at: &[i32]| {
            let n = params.iter().position(|p| p.name == name).expect("verified read");
            let Some(Array { storage: Storage::Input(data), shape, .. }) = &self.arrays[n] else { return 0 };
            match (index::flat_index(shape, at), data) {
                (Some(f), DataRef::I32(v)) => v[f],
                (Some(f), DataRef::U32(v)) => v[f] as i32,
                _ => 0,
            }
        };
        IndexEval::eval(expr, &axis, &read)
    }
}

/// Row-major decoding of `n` over `axes` (the last listed fastest) into `point`.
pub(super) fn decode(mut n: u64, axes: &[usize], grid: &[LaunchAxis], point: &mut [i64]) {
    for &a in axes.iter().rev() {
        let size = grid[a].size;
        point[a] = (n % size) as i64;
        n /= size;
    }
}

impl<'m, 'a> ProgramState<'m, 'a> {
    fn new(m: &'m Machine<'a>) -> ProgramState<'m, 'a> {
        ProgramState::with_scratch(m, |_, p| Storage::zeros(p.ty.numel()), None)
    }

    /// A state whose scratch arrays have the storage `storage` gives each (zeros of its own,
    /// or the cells a program's threads share), run as thread `threads` of a program of the
    /// concurrent model where given.
    pub(super) fn with_scratch(
        m: &'m Machine<'a>,
        mut storage: impl FnMut(usize, &tessel_plugin_api::ir::Param) -> Storage<'m>,
        threads: Option<(&'m super::threads::Shared<'m>, usize)>,
    ) -> ProgramState<'m, 'a> {
        let params = &m.kernel.kernel().params;
        let scratch = (params.iter().enumerate())
            .map(|(n, p)| (p.kind == ParamKind::Scratch).then(|| Array { storage: storage(n, p), shape: p.ty.shape.clone(), dtype: p.ty.dtype }))
            .collect();
        ProgramState {
            m,
            scratch,
            slots: vec![None; m.program.slots],
            origins: vec![Vec::new(); params.len()],
            held: vec![None; params.len()],
            fresh: threads.is_none(),
            point: Vec::new(),
            threads,
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
    pub(super) fn enter(&mut self, point: &[i64]) {
        self.point.clear();
        self.point.extend_from_slice(point);
        for (n, p) in self.m.kernel.kernel().params.iter().enumerate() {
            let origin = &mut self.origins[n];
            origin.clear();
            match &self.m.origins[n] {
                None => origin.resize(p.ty.shape.len(), 0),
                Some(dims) => origin.extend(dims.iter().map(|d| match d {
                    Origin::Affine { constant, terms, size } => {
                        let at = (terms.iter())
                            .fold(*constant, |acc, &(c, axis)| acc.wrapping_add(c.wrapping_mul(axis.map_or(0, |a| point[a]))));
                        at.wrapping_mul(*size)
                    }
                    Origin::Computed { expr, blocks, size } => IndexEval::clamp(self.m.index_value(expr, point), *blocks) * size,
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
}
