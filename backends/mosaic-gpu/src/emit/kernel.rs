//! The general path (every kernel that does not take the Hopper path): the kernel's frame — its
//! workspace (zeroed scratch in shared memory, or its region of the global buffer), argument
//! pointers, the `seq` loop and the thread-axis points — and its statements, one after another,
//! each a loop of the warpgroup's threads over the elements of its result. Loads and stores are
//! `memory.rs`, element operations `ops.rs`, `reduce` and `dot` their own files.

use tessel_plugin_api::ir::*;

use super::header::SHARED;
use super::memory::Access;
use super::writer::Writer;
use crate::limits::THREADS;
use crate::lower::meetings::{At, accesses, yields};

impl Writer<'_> {
    /// The general path's kernel (`emit` gives a Hopper plan to `write_gemm` instead).
    pub(super) fn write_kernel(&mut self) {
        let plan = self.plan;
        let k = plan.kernel.kernel();
        let entry = plan.entry.clone();
        // Warpgroup w = tid.x / 128 runs point w of the thread axis; lanes are tid.x % 128.
        let (tid_x, cta) = self.write_ids();
        self.workspace = self.rd();
        let ws = self.workspace.clone();
        if plan.shared {
            self.comment("the CTA's workspace: its dynamic shared memory");
            self.insf(format_args!("mov.u64 {ws}, {SHARED}"));
        } else {
            self.comment("the CTA's workspace region: workspace + ctaid.x * bytes per CTA");
            let base = self.rd();
            self.insf(format_args!("ld.param.u64 {base}, [{entry}_workspace]"));
            self.insf(format_args!("cvta.to.global.u64 {base}, {base}"));
            let off = self.rd();
            self.insf(format_args!("mul.wide.u32 {off}, {cta}, {}", plan.workspace_per_cta));
            self.insf(format_args!("add.u64 {ws}, {base}, {off}"));
        }
        self.scratch = ws.clone();
        if plan.scratch_shared() {
            if !plan.shared {
                // The values outgrow shared memory, the scratch does not: it is there alone.
                self.comment("the scratch: the CTA's dynamic shared memory (the values are global)");
                let base = self.rd();
                self.insf(format_args!("mov.u64 {base}, {SHARED}"));
                self.scratch = base;
            }
            if plan.scratch_bytes > 0 {
                // Scratch starts zeroed (docs/language.md §8); shared memory does not. Every
                // thread of the CTA clears words, then the whole CTA waits.
                self.comment("zero the scratch");
                let (zero, words, base) = (self.imm(0), (plan.scratch_bytes / 4) as usize, self.scratch.clone());
                self.count(&tid_x, words, plan.threads(), false, ("zero", "zeroed"), |w, i| {
                    let addr = w.rd();
                    w.insf(format_args!("mul.wide.u32 {addr}, {i}, 4"));
                    w.insf(format_args!("add.u64 {addr}, {base}, {addr}"));
                    w.insf(format_args!("st.shared.b32 [{addr}], {zero}"));
                });
                self.ins("bar.sync 0");
            }
        }
        if plan.barrier_bytes > 0 {
            self.init_mbarriers(&tid_x);
        }
        self.zero_accumulators();
        let voff = self.rd();
        self.ins(format!("mul.wide.u32 {voff}, {}, {}", self.warpgroup, plan.value_bytes));
        self.values = self.rd();
        self.ins(format!("add.u64 {}, {}, {voff}", self.values, self.workspace));
        for p in k.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
            let r = self.rd();
            self.insf(format_args!("ld.param.u64 {r}, [{entry}_{}]", p.name));
            self.insf(format_args!("cvta.to.global.u64 {r}, {r}"));
            self.args.push((p.name.clone(), r));
        }
        // Program coordinates of the parallel axes: row-major in ctaid.x, the last axis fastest.
        let grid = plan.kernel.grid().to_vec();
        self.coords = grid.iter().map(|_| String::new()).collect();
        let size = |a: &GridAxis| match a.size {
            AxisSize::Fixed(n) => n,
            AxisSize::Dyn => unreachable!("plan refuses dyn axes"),
        };
        let par: Vec<usize> = (0..grid.len()).filter(|&a| !grid[a].seq && Some(a) != plan.thread_axis).collect();
        let seq: Vec<usize> = (0..grid.len()).filter(|&a| grid[a].seq).collect();
        self.decode(&cta, &par);
        let steps: u64 = seq.iter().map(|&a| size(&grid[a])).product();
        // The `seq` steps of one program (met at their ends where the plan says: another step, or
        // a later thread-axis point, runs them again).
        let seq_loop = |w: &mut Writer<'_>| {
            let step = w.r();
            w.insf(format_args!("mov.u32 {step}, 0"));
            let top = w.label("seq");
            w.place_label(&top);
            w.decode(&step, &seq);
            w.write_origins();
            // In name order, so that the PTX is the same from run to run.
            let values = w.plan.kernel.values();
            let mut ids: Vec<ValueId> = w.plan.in_registers.iter().collect();
            ids.sort_by_key(|&id| values.name(id));
            for id in ids {
                let n: usize = w.plan.kernel.values().ty(id).numel();
                let regs = (0..n.div_ceil(THREADS as usize)).map(|_| w.r()).collect();
                w.in_registers.insert(id, regs);
            }
            w.write_body(&k.body);
            // The next step (or the next thread-axis point) writes every slot again.
            if w.plan.meetings.after_step() {
                w.barrier();
            }
            w.insf(format_args!("add.u32 {step}, {step}, 1"));
            let more = w.p();
            w.insf(format_args!("setp.lt.u32 {more}, {step}, {steps}"));
            w.insf(format_args!("@{more} bra.uni {top}"));
        };
        match plan.thread_axis {
            // More points of the thread axis than warpgroups: each warpgroup walks its points.
            Some(t) if plan.thread_points > plan.warpgroups => {
                self.comment(&format!("{} thread-axis points on {} warpgroups", plan.thread_points, plan.warpgroups));
                let wg = self.warpgroup.clone();
                self.count(&wg, plan.thread_points as usize, plan.warpgroups, true, ("point", "points"), |w, point| {
                    w.coords[t] = point.to_string();
                    seq_loop(w);
                });
            }
            Some(t) => {
                self.coords[t] = self.warpgroup.clone();
                seq_loop(self);
            }
            None => seq_loop(self),
        }
        self.write_final_wait_copies();
    }

    fn write_body(&mut self, body: &[Stmt]) {
        for s in body {
            let head = tessel_plugin_api::ir::print::print_stmt_head(s);
            self.comment(&head);
            let back = self.names.enter(s);
            let n = self.next_stmt;
            self.next_stmt += 1;
            self.stmt = n;
            self.write_stmt(n, s);
            self.names.leave(back);
        }
    }

    /// Statement `#n` (numbered as [`crate::lower::meetings`] numbers them), after the meetings the
    /// plan places before it.
    fn write_stmt(&mut self, n: usize, s: &Stmt) {
        let dst = s.results.first().cloned().unwrap_or_default();
        let ty = s.ty.clone();
        let out_shape = ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let n_out = out_shape.iter().product::<usize>();
        let (reads, writes) = accesses(self.plan, s);
        let accumulator = match &s.op {
            Op::Load { src: a, .. } | Op::Store { dst: a, .. } => self.plan.mma.accumulator(a).map(|_| a.clone()),
            _ => None,
        };
        // A product on `wgmma` reads its operand buffers through the asynchronous proxy: after
        // what the threads wrote there, fenced.
        if self.plan.meetings.at(n, At::Fence) {
            self.ins("fence.proxy.async.shared::cta");
            self.barrier();
        }
        self.meet(n, At::Before);
        self.unroll = reads.iter().chain(&writes).any(|u| self.in_regs(&u.name));
        match &s.op {
            Op::Load { src, .. } if accumulator.is_some() => self.write_accumulator_load(src, &dst),
            Op::Store { dst: acc, value, .. } if accumulator.is_some() => self.write_accumulator_store(acc, value),
            Op::Load { src, index, mask, other } => {
                self.write_access(src, index.as_deref(), mask.as_deref(), Access::Load { dst: &dst, other: *other })
            }
            Op::Store { dst: d, index, value, mask } => {
                self.write_access(d, index.as_deref(), mask.as_deref(), Access::Store { value })
            }
            Op::ProgramId(_)
            | Op::NumPrograms(_)
            | Op::Iota { .. }
            | Op::Full(_)
            | Op::Zeros
            | Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Cast(_)
            | Op::Bitcast(_)
            | Op::Broadcast(_)
            | Op::Reshape(_)
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Concatenate { .. } => self.write_elementwise(s, &dst, &out_shape),
            Op::Reduce { op, arg, axis, .. } => self.write_reduce(*op, arg, *axis, &dst, n_out),
            Op::Dot { a, b, trans_a, trans_b } => self.write_dot(a, b, *trans_a, *trans_b, &dst, &out_shape),
            Op::When { cond, body } => {
                let c = self.scalar(cond);
                let (p, end) = (self.p(), self.label("when"));
                self.insf(format_args!("setp.eq.u32 {p}, {c}, 0"));
                self.insf(format_args!("@{p} bra.uni {end}"));
                self.write_body(body);
                self.place_label(&end);
            }
            Op::For(f) => self.write_for(n, f, &s.results),
            Op::If(i) => self.write_if(n, i, &s.results),
            Op::Yield(_) => {}
            Op::Sync(SyncOp::Arrive(b)) => self.write_arrive(b),
            Op::Sync(SyncOp::Wait(b)) => self.write_wait(b),
            Op::Sync(op @ SyncOp::Copy { arrive, .. }) => {
                let c = self.plan.tma_copy(op).expect("the plan keeps copies TMA makes");
                match arrive {
                    Some(b) => self.write_tma_copy(&c, b),
                    None => self.write_tma_store(&c),
                }
            }
            Op::Sync(SyncOp::CommitCopies) => self.write_commit_copies(),
            Op::Sync(SyncOp::WaitCopies { pending, reads }) => self.write_wait_copies(*pending, *reads),
            Op::Sync(SyncOp::Fence) => self.ins("fence.proxy.async.shared::cta"),
            Op::Sync(SyncOp::MaxRegisters { count, increase }) => {
                let how = if *increase { "inc" } else { "dec" };
                self.insf(format_args!("setmaxnreg.{how}.sync.aligned.u32 {count}"));
            }
            Op::Sync(op @ SyncOp::Mma { .. }) => self.write_async_mma(op),
            Op::Sync(SyncOp::MmaWait { pending }) => self.write_mma_wait(*pending),
            Op::Tile { .. } | Op::Repeat { .. } => unreachable!("legalize rewrites tile and repeat before planning"),
        }
    }

    /// `if`: a uniform branch to one body or the other (the condition is a scalar, the same in
    /// every thread), each ending by copying what it yields into the results' slots.
    fn write_if(&mut self, n: usize, i: &IfElse, results: &[String]) {
        let c = self.scalar(&i.cond);
        let (p, els, end) = (self.p(), self.label("else"), self.label("endif"));
        self.insf(format_args!("setp.eq.u32 {p}, {c}, 0"));
        self.insf(format_args!("@{p} bra.uni {els}"));
        self.write_branch(n, &i.then, results, At::Yield);
        self.insf(format_args!("bra.uni {end}"));
        self.place_label(&els);
        self.write_branch(n, &i.els, results, At::ElseYield);
        self.place_label(&end);
    }

    fn write_branch(&mut self, n: usize, body: &[Stmt], results: &[String], at: fn(usize) -> At) {
        self.write_body(body);
        for (i, (v, r)) in yields(body).unwrap_or_default().iter().zip(results).enumerate() {
            self.copy_value(n, at(i), v, r);
        }
    }

    fn copy_value(&mut self, stmt: usize, at: At, from: &str, to: &str) {
        self.meet(stmt, at);
        self.unroll = [from, to].iter().any(|n| self.in_regs(n));
        let n: usize = self.shape_of(from).iter().product();
        let (from, to) = (from.to_string(), to.to_string());
        self.each(n, |w, e| {
            let v = w.load_slot(&from, e);
            w.store_slot(&to, e, &v);
        });
    }

    fn write_for(&mut self, n: usize, f: &ForLoop, results: &[String]) {
        let ForLoop { var, lo, hi, step, iters, cond, body } = f;
        let step = step.as_ref();
        for (i, (name, init)) in iters.iter().enumerate() {
            match init {
                Operand::Value(v) => self.copy_value(n, At::Init(i), v, name),
                Operand::Lit(_) => unreachable!("verifier: iter initial values are values"),
            }
        }
        let (lo, hi) = (self.scalar(lo), self.scalar(hi));
        let step = match step {
            Some(s) => self.scalar(s),
            None => self.imm(1),
        };
        let i = self.r();
        self.insf(format_args!("mov.b32 {i}, {lo}"));
        let (top, end) = (self.label("for"), self.label("endfor"));
        let never = self.p();
        self.insf(format_args!("setp.le.s32 {never}, {step}, 0"));
        self.insf(format_args!("@{never} bra.uni {end}"));
        self.place_label(&top);
        let done = self.p();
        self.insf(format_args!("setp.ge.s32 {done}, {i}, {hi}"));
        self.insf(format_args!("@{done} bra.uni {end}"));
        if let Some(c) = cond {
            // `while %c`: the carried bool (the same in every thread, which the thread that
            // wrote it makes visible first), checked before every trip.
            self.meet(n, At::Cond);
            let go = self.scalar(&Operand::Value(c.clone()));
            let stop = self.p();
            self.insf(format_args!("setp.eq.u32 {stop}, {go}, 0"));
            self.insf(format_args!("@{stop} bra.uni {end}"));
        }
        let var = var.to_string();
        let iv = i.clone();
        self.meet(n, At::Var);
        self.each(1, |w, e| w.store_slot(&var, e, &iv));
        self.write_body(body);
        if let Some(yielded) = yields(body) {
            for (k, (v, (name, _))) in yielded.iter().zip(iters).enumerate() {
                self.copy_value(n, At::Yield(k), v, &format!("{name}.next"));
            }
            for (k, (name, _)) in iters.iter().enumerate() {
                self.copy_value(n, At::Next(k), &format!("{name}.next"), name);
            }
        }
        self.meet(n, At::BackEdge);
        self.insf(format_args!("add.s32 {i}, {i}, {step}"));
        self.insf(format_args!("bra.uni {top}"));
        self.place_label(&end);
        for (k, ((name, _), r)) in iters.iter().zip(results).enumerate() {
            self.copy_value(n, At::Result(k), name, r);
        }
    }
}
