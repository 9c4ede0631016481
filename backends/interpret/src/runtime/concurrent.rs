//! Running a kernel of the concurrent model (docs/language.md, "Threads, barriers and
//! asynchronous operations"): each program's threads, their shared scratch, and what a thread's
//! statements tell the program's checks (`threads.rs`): the elements each `load` and `store`
//! touches, and the concurrent model's own statements.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;

use rayon::prelude::*;
use tessel_plugin_api::ir::{BinaryOp, Literal, ParamKind};
use tessel_plugin_api::launch::LaunchError;

use super::grid::decode;
use super::memory::Storage;
use super::threads::{Abort, Shared, Touch};
use super::{Machine, ProgramState};
use crate::eval::{self, Val};
use crate::program::{BarrierRef, Instr, Region, SyncInstr};

/// Each thread's stack: as deep as a program's nesting may go (the verifier's limits).
const THREAD_STACK: usize = 64 << 20;

impl Machine<'_> {
    /// Runs every program of a kernel of the concurrent model: the programs (the points of the
    /// parallel axes that are not `thread` axes) on rayon's pool, each program's threads as
    /// `threads.rs` schedules them, every thread running the `seq` steps in order. Stops at the
    /// first program that fails, with its failure.
    pub(super) fn run_concurrent(&self) -> Result<(), LaunchError> {
        let dims = self.kernel.grid();
        let thread = |a: usize| dims.get(a).is_some_and(|g| g.thread);
        let axes = |f: &dyn Fn(usize) -> bool| (0..self.grid.len()).filter(|&a| f(a)).collect::<Vec<usize>>();
        let threads = axes(&|a| thread(a));
        let par = axes(&|a| !self.grid[a].seq && !thread(a));
        let seq = axes(&|a| self.grid[a].seq);
        let count = |axes: &[usize]| axes.iter().map(|&a| self.grid[a].size).product::<u64>();
        let failure: Mutex<Option<String>> = Mutex::new(None);
        (0..count(&par)).into_par_iter().for_each(|pid| {
            if self.cancelled() || failure.lock().map_or(true, |f| f.is_some()) {
                return;
            }
            let mut point = vec![0i64; self.grid.len()];
            decode(pid, &par, self.grid, &mut point);
            if let Some(f) = self.run_program(&point, &threads, &seq, count(&threads)) {
                failure.lock().expect("no thread panics holding it").get_or_insert(f);
            }
        });
        match failure.into_inner().expect("no thread panics holding it") {
            Some(message) => Err(LaunchError::Concurrency { kernel: self.kernel.name().to_string(), message }),
            None => Ok(()),
        }
    }

    /// One program: its threads, on OS threads of their own, sharing its scratch. Its failure,
    /// if it has one.
    fn run_program(&self, point: &[i64], thread_axes: &[usize], seq: &[usize], threads: u64) -> Option<String> {
        let params = &self.kernel.kernel().params;
        let scratch: Vec<Option<Vec<AtomicU32>>> = params
            .iter()
            .map(|p| (p.kind == ParamKind::Scratch).then(|| (0..p.ty.numel()).map(|_| AtomicU32::new(0)).collect()))
            .collect();
        let name_of = |axes: &[usize], at: &[i64]| -> String {
            axes.iter().map(|&a| format!("{}={}", self.grid[a].name, at[a])).collect::<Vec<_>>().join(", ")
        };
        let others: Vec<usize> = (0..self.grid.len()).filter(|a| !thread_axes.contains(a) && !self.grid[*a].seq).collect();
        let program = if others.is_empty() { String::new() } else { format!(" of program ({})", name_of(&others, point)) };
        let points: Vec<Vec<i64>> = (0..threads)
            .map(|t| {
                let mut p = point.to_vec();
                decode(t, thread_axes, self.grid, &mut p);
                p
            })
            .collect();
        let names = points
            .iter()
            .map(|p| {
                if thread_axes.is_empty() {
                    format!("the thread{program}")
                } else {
                    format!("thread {}{program}", name_of(thread_axes, p))
                }
            })
            .collect();
        let barriers: Vec<(String, usize, usize)> =
            self.kernel.kernel().barriers.iter().map(|b| (b.name.clone(), b.count, b.arrivals)).collect();
        let args = params.iter().map(|p| (p.name.clone(), p.ty.shape.clone(), p.kind == ParamKind::Scratch)).collect();
        let shared = Shared::new(names, &barriers, args, &self.program.stmts);
        let panicked: Mutex<Option<Box<dyn std::any::Any + Send>>> = Mutex::new(None);
        std::thread::scope(|s| {
            for (t, start) in points.iter().enumerate() {
                let (shared, scratch, panicked) = (&shared, &scratch, &panicked);
                std::thread::Builder::new()
                    .stack_size(THREAD_STACK)
                    .spawn_scoped(s, move || {
                        let run = catch_unwind(AssertUnwindSafe(|| {
                            let mut prog = ProgramState::for_thread(self, scratch, shared, t);
                            shared.begin(t);
                            let mut at = start.clone();
                            for step in 0..seq.iter().map(|&a| self.grid[a].size).product::<u64>() {
                                if step > 0 && self.cancelled() {
                                    break;
                                }
                                decode(step, seq, self.grid, &mut at);
                                prog.enter(&at);
                                prog.exec(&self.program.body);
                            }
                            shared.finish(t);
                        }));
                        if let Err(p) = run
                            && !p.is::<Abort>()
                        {
                            // A bug, not the kernel's: stop the others, then raise it again.
                            shared.stop("stopped: another of its threads panicked".to_string());
                            panicked.lock().expect("no thread panics holding it").get_or_insert(p);
                        }
                        shared.end(t);
                    })
                    .unwrap_or_else(|e| {
                        // The others must not wait for it: stop the program, then say why.
                        shared.stop(format!("could not start a thread of the program: {e}"));
                        panic!("the OS did not start a thread of a program: {e}")
                    });
            }
        });
        if let Some(p) = panicked.into_inner().expect("no thread panics holding it") {
            resume_unwind(p);
        }
        shared.failure()
    }
}

impl<'m, 'a> ProgramState<'m, 'a> {
    /// The state of thread `t` of a program whose scratch is `scratch` (per argument).
    fn for_thread(
        m: &'m Machine<'a>,
        scratch: &'m [Option<Vec<AtomicU32>>],
        shared: &'m Shared<'m>,
        t: usize,
    ) -> ProgramState<'m, 'a> {
        let cells = |n: usize, _: &_| Storage::Lent(scratch[n].as_deref().expect("scratch has cells"));
        ProgramState::with_scratch(m, cells, Some((shared, t)))
    }

    /// The program's threads and this state's thread.
    fn thread(&self) -> (&'m Shared<'m>, usize) {
        self.threads.expect("a kernel of the concurrent model runs through run_concurrent")
    }

    /// Tells the checks which elements a `load` or `store` of output or scratch touches.
    pub(super) fn check_access(&self, stmt: usize, instr: &Instr) {
        let (mem, index, mask, write) = match instr {
            Instr::Load { mem, index, mask, .. } => (*mem, index, *mask, false),
            Instr::Store { mem, index, mask, .. } => (*mem, index, *mask, true),
            _ => unreachable!("only loads and stores are checked"),
        };
        if self.m.kernel.kernel().params[mem.0].kind == ParamKind::In {
            return;
        }
        let (shared, t) = self.thread();
        let elements = self.touched(mem, index.as_deref(), mask);
        shared.access(t, Touch { mem: mem.0, elements: &elements, write }, stmt);
    }

    /// The elements of `r` an asynchronous statement touches (none of an input: nothing writes
    /// one).
    fn region_touch(&self, r: &Region) -> Vec<usize> {
        if self.m.kernel.kernel().params[r.mem.0].kind == ParamKind::In {
            return Vec::new();
        }
        self.touched(r.mem, r.index.as_deref(), None)
    }

    fn read(&self, r: &Region) -> Val {
        self.load(r.mem, r.index.as_deref(), None, Literal::Int(0), r.dtype)
    }

    fn write(&self, r: &Region, v: &Val) {
        self.store_part(r.mem, r.index.as_deref(), v, None, None, None);
    }

    /// The barrier `b` names, among all the program's; an index outside its array stops the
    /// program.
    fn barrier(&self, b: &BarrierRef, stmt: usize) -> usize {
        let k = self.get(&b.index).as_i64();
        match usize::try_from(k) {
            Ok(k) if k < b.count => b.first + k,
            _ => self.thread().0.out_of_range(stmt, k, b.count),
        }
    }

    /// A statement of the concurrent model.
    pub(super) fn sync(&mut self, stmt: usize, op: &SyncInstr) {
        let (shared, t) = self.thread();
        match op {
            SyncInstr::Arrive { barrier } => shared.arrive(t, self.barrier(barrier, stmt), stmt),
            SyncInstr::Wait { barrier } => shared.wait(t, self.barrier(barrier, stmt), stmt),
            SyncInstr::Fence => shared.fence(t),
            SyncInstr::CommitCopies => shared.commit(t),
            SyncInstr::WaitCopies { pending, reads } => shared.wait_copies(t, *pending, *reads),
            SyncInstr::MmaWait { pending } => shared.mma_wait(t, *pending),
            SyncInstr::Hint => {}
            SyncInstr::Copy { dst, src, arrive } => {
                let (from, to) = (self.region_touch(src), self.region_touch(dst));
                let arrive = arrive.as_ref().map(|b| self.barrier(b, stmt));
                let v = self.read(src);
                shared.copy(
                    t,
                    Touch { mem: src.mem.0, elements: &from, write: false },
                    Touch { mem: dst.mem.0, elements: &to, write: true },
                    arrive,
                    stmt,
                );
                self.write(dst, &v);
            }
            SyncInstr::Mma { acc, a, b, trans_a, trans_b } => {
                let (tb, tc) = (self.region_touch(b), self.region_touch(acc));
                let ta = a.as_ref().map(|a| (a.mem.0, self.region_touch(a)));
                let mut operands = vec![Touch { mem: b.mem.0, elements: &tb, write: false }];
                if let Ok((mem, elements)) = &ta {
                    operands.insert(0, Touch { mem: *mem, elements, write: false });
                }
                shared.mma(t, &operands, Touch { mem: acc.mem.0, elements: &tc, write: true }, stmt);
                let widen = |v: Val| if v.dtype.is_float() || v.dtype == acc.dtype { v } else { eval::cast(v.view(), acc.dtype) };
                let lhs = match a {
                    Ok(a) => self.read(a),
                    // A value: read where the product is issued, as registers are.
                    Err(v) => self.get(v).clone(),
                };
                let (x, y) = (widen(lhs), widen(self.read(b)));
                let product = eval::dot(&x, &y, *trans_a, *trans_b);
                let sum = eval::binary(BinaryOp::Add, self.read(acc).view(), product.view());
                self.write(acc, &sum);
            }
        }
    }
}
