//! The threads of one program as one thread with their schedule compiled in, for a backend that
//! runs a program as one thread and gives its invocations no forward-progress guarantee (wgpu,
//! a plugin): docs/language.md, "Threads, barriers and asynchronous operations", per backend.
//!
//! A kernel of the concurrent model means what every schedule of its threads gives, and the
//! reference interpreter checks that no two schedules differ; so a backend may run any schedule
//! that keeps the barriers' rules. [`scheduled`] writes one into the kernel, the interpreter's
//! own: the threads take turns, each running until it waits for a phase that has not completed.
//!
//! Each thread's body is cut at its **points**: its start, every `wait` (the thread stops
//! there until the phase it waits for completes), the head of every loop holding a `wait`, and
//! the join after every `when`/`if` holding one. The code from a point to the next is one
//! **segment**, which gives the next point as a value; each thread's **program counter** says
//! which point it is at (a value carried while the thread runs, scratch `i32[T]` between its
//! turns). The rewritten body is
//!
//! ```text
//! %moved... = for %round = ... while %moved_and_some_thread_alive {
//!   for %t = 0 to T iter (%moved) {           // each thread in turn,
//!     %pc0 = load pc[%t]
//!     for %step = ... iter (%pc = %pc0, ...) while %ran_and_alive {  // until it blocks or ends
//!       %p0, %r0 = if (eq %pc, 0) { <segment 0> yield next, ran } else { yield %pc, false }
//!       ...
//!       %pS, %rS = if (eq %pc, S) { <segment S> yield next, ran } else { yield %pS-1, %rS-1 }
//!     }
//!     store pc[%t], ...
//!   }
//! }
//! ```
//!
//! - `program_id` of the thread axis is `%t`; the axis keeps its name with one point.
//! - A value one segment defines and another reads lives in a scratch slot with a leading
//!   dimension of the thread count (each thread its own), stored where it is defined and loaded
//!   at the start of each segment that reads it; a loop's variable and carried values, and its
//!   results (which share the carried values' slots), and an `if`'s results, live so too.
//! - A barrier is three counters in scratch: phases completed and arrivals made in the current
//!   one (each barrier's), and each thread's waits on it so far (the `n`-th wait returns once
//!   `n` phases completed). `arrive` counts an arrival, completing the phase at the `K`-th;
//!   a `copy_async ... arrive` copies (where it is issued) and counts its arrival.
//! - Every segment is written once: a loop's body ends by going back to its head, a `when`'s
//!   and an `if`'s bodies by going to their join, so no code is duplicated.
//!
//! The result still has `copy_async` and `mma_async` (and no-op fences and waits for them):
//! `synchronous` makes those synchronous next. A kernel that deadlocks (which the interpreter
//! reports) stops the rounds where no thread moves, its outputs as they stand.

use std::collections::{HashMap, HashSet};
use std::fmt;

use super::legalize::Names;
use super::*;

/// Program counter of a thread that has ended.
const DONE: i64 = -1;

/// More trips than any loop of the schedule makes: it ends on its `while` flag.
const UNBOUNDED: i64 = i32::MAX as i64;

/// A kernel of several threads per program that is not scheduled, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unscheduled {
    /// Threads per program (the product of its `thread` axes).
    pub threads: u64,
    /// Why.
    pub why: Why,
}

/// Why a kernel of several threads per program is not scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// More than one `thread` axis of several points.
    SeveralAxes,
    /// A `seq` axis: each thread runs the steps in order, and one thread's step could wait for
    /// another thread's later step, which a schedule joined at each step would never run.
    Seq(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::SeveralAxes => f.write_str("over several thread axes"),
            Why::Seq(axis) => write!(f, "each through the steps of `seq` axis `{axis}` at its own pace"),
        }
    }
}

/// `v` with its threads made one, their schedule compiled in (the module documentation); `None`
/// where the kernel has no `thread` axis of more than one point.
pub fn scheduled(v: &Verified) -> Result<Option<Kernel>, Unscheduled> {
    let k = v.kernel();
    let axes: Vec<(usize, &GridAxis)> =
        k.grid.iter().flatten().enumerate().filter(|(_, a)| a.thread && a.size != AxisSize::Fixed(1)).collect();
    let size = |a: &GridAxis| match a.size {
        AxisSize::Fixed(n) => n,
        AxisSize::Dyn => unreachable!("the verifier takes a fixed count of threads"),
    };
    let (pos, axis) = match axes.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(Unscheduled { threads: axes.iter().map(|(_, a)| size(a)).product(), why: Why::SeveralAxes }),
    };
    let threads = size(axis);
    if let Some(s) = k.grid.iter().flatten().find(|a| a.seq) {
        return Err(Unscheduled { threads, why: Why::Seq(s.name.clone()) });
    }
    let mut names = Names::new(v);
    let t = names.fresh("thread");
    let mut s = Scheduler {
        axis: (pos, axis.name.clone()),
        threads,
        pc: String::new(),
        t,
        counters: HashMap::new(),
        states: Vec::new(),
        slots: HashMap::new(),
        aliases: HashMap::new(),
        scratch: Vec::new(),
        names,
    };
    s.pc = s.scratch("sched_pc", Type::array(DType::I32, [threads as usize]));
    for b in &k.barriers {
        let c = Counters {
            phase: s.scratch(&format!("{}_phase", b.name), Type::array(DType::I32, [b.count])),
            arrived: s.scratch(&format!("{}_arrived", b.name), Type::array(DType::I32, [b.count])),
            seen: s.scratch(&format!("{}_seen", b.name), Type::array(DType::I32, [threads as usize, b.count])),
            arrivals: b.arrivals,
        };
        s.counters.insert(b.name.clone(), c);
    }
    let body = s.inline(&k.body);
    s.state(|s, _| {
        let (code, next) = s.run(&body, 0, &End::Top);
        Segment { code, next, ran: None }
    });
    let body = s.finish();
    let mut kernel = k.clone();
    kernel.barriers.clear();
    if let Some(grid) = kernel.grid.as_mut() {
        grid[pos].size = AxisSize::Fixed(1);
    }
    for (name, ty) in std::mem::take(&mut s.scratch) {
        kernel.params.push(Param { kind: ParamKind::Scratch, name, ty, block: None, span: k.span });
    }
    kernel.body = body;
    Ok(Some(kernel))
}

/// The code from one point to the next: the value of the next point, and whether it ran (a
/// value; `None`: it always does).
struct Segment {
    code: Vec<Stmt>,
    next: String,
    ran: Option<String>,
}

/// A barrier's counters: scratch names and its arrivals per phase.
struct Counters {
    phase: String,
    arrived: String,
    seen: String,
    arrivals: usize,
}

/// Where the end of a body goes.
enum End {
    /// The thread's end.
    Top,
    /// The join after a `when` or an `if` (state), storing an `if`'s results.
    Join(i64, Vec<String>),
    /// Back to a loop's head (state), storing the carried values and the next `%i`.
    Loop { head: i64, var: String, step: Operand, iters: Vec<String> },
}

struct Scheduler<'v> {
    names: Names<'v>,
    /// The thread axis: its position and name.
    axis: (usize, String),
    threads: u64,
    /// The thread loop's variable.
    t: String,
    /// Scratch `i32[T]`: each thread's point between its turns.
    pc: String,
    counters: HashMap<String, Counters>,
    /// Each state's segment (`None` while it is being written).
    states: Vec<Option<Segment>>,
    /// A value's slot.
    slots: HashMap<String, String>,
    /// A loop result and the carried value whose slot it shares.
    aliases: HashMap<String, String>,
    /// Scratch the schedule adds.
    scratch: Vec<(String, Type)>,
}

impl Scheduler<'_> {
    fn stmt(&self, results: &[&str], op: Op, ty: Option<Type>) -> Stmt {
        Stmt { results: results.iter().map(|r| r.to_string()).collect(), op, ty, span: Span::NONE }
    }

    fn load(&self, result: &str, src: &str, index: Vec<Index>) -> Stmt {
        self.stmt(&[result], Op::Load { src: src.to_string(), index: Some(index), mask: None, other: None }, None)
    }

    fn store(&self, dst: &str, index: Vec<Index>, value: Operand) -> Stmt {
        self.stmt(&[], Op::Store { dst: dst.to_string(), index: Some(index), value, mask: None }, None)
    }

    /// `%name = OP a, b`.
    fn binary(&mut self, base: &str, op: BinaryOp, a: Operand, b: Operand, out: &mut Vec<Stmt>) -> Operand {
        let r = self.names.fresh(base);
        out.push(self.stmt(&[&r], Op::Binary(op, a, b), None));
        Operand::value(&r)
    }

    fn compare(&mut self, base: &str, op: CmpOp, a: Operand, b: Operand, out: &mut Vec<Stmt>) -> Operand {
        let r = self.names.fresh(base);
        out.push(self.stmt(&[&r], Op::Compare(op, a, b), None));
        Operand::value(&r)
    }

    fn thread(&self) -> Index {
        Index::At(Operand::value(&self.t))
    }

    fn lit(v: i64) -> Operand {
        Operand::Lit(Literal::Int(v))
    }

    /// `%c = full v : i32` (a `yield` takes values, not literals).
    fn constant(&mut self, v: i64, out: &mut Vec<Stmt>) -> String {
        let c = self.names.fresh(if v == DONE { "ended" } else { "point" });
        out.push(self.stmt(&[&c], Op::Full(Literal::Int(v)), Some(Type::scalar(DType::I32))));
        c
    }

    /// `%b = full true|false : bool`.
    fn flag(&mut self, v: bool, out: &mut Vec<Stmt>) -> String {
        let b = self.names.fresh(if v { "yes" } else { "no" });
        out.push(self.stmt(&[&b], Op::Full(Literal::Bool(v)), Some(Type::scalar(DType::Bool))));
        b
    }

    /// `%r... = if %cond { then; yield then_values } else { els; yield else_values }`.
    fn choose(&mut self, base: &str, cond: Operand, (mut then, a): (Vec<Stmt>, Vec<String>), (mut els, b): (Vec<Stmt>, Vec<String>)) -> (Stmt, Vec<String>) {
        let results: Vec<String> = a.iter().map(|_| self.names.fresh(base)).collect();
        then.push(self.stmt(&[], Op::Yield(a.iter().map(|v| Operand::value(v)).collect()), None));
        els.push(self.stmt(&[], Op::Yield(b.iter().map(|v| Operand::value(v)).collect()), None));
        let refs: Vec<&str> = results.iter().map(String::as_str).collect();
        (self.stmt(&refs, Op::If(IfElse { cond, then, els }), None), results)
    }

    /// A new state whose segment `f` writes (given the state's number).
    fn state(&mut self, f: impl FnOnce(&mut Self, i64) -> Segment) -> i64 {
        let n = self.states.len();
        self.states.push(None);
        let seg = f(self, n as i64);
        self.states[n] = Some(seg);
        n as i64
    }

    /// The scratch slot of `value` (created at first use).
    fn slot(&mut self, value: &str) -> String {
        let value = self.aliases.get(value).cloned().unwrap_or_else(|| value.to_string());
        if let Some(s) = self.slots.get(&value) {
            return s.clone();
        }
        let ty = self.names.v.value_type(&value).clone();
        let mut shape = vec![self.threads as usize];
        shape.extend(&ty.shape);
        let name = self.scratch(&format!("live_{value}"), Type::array(ty.dtype, shape));
        self.slots.insert(value, name.clone());
        name
    }

    /// A new scratch array, named after `base` apart from every argument and value.
    fn scratch(&mut self, base: &str, ty: Type) -> String {
        let mut name = self.names.fresh(base);
        while self.names.v.kernel().param(&name).is_some() {
            name = self.names.fresh(&name);
        }
        self.scratch.push((name.clone(), ty));
        name
    }

    /// The index of a value's whole slot for thread `%t`.
    fn slot_index(&self, rank: usize) -> Vec<Index> {
        std::iter::once(self.thread()).chain(std::iter::repeat_n(Index::Full, rank)).collect()
    }

    /// `store slot(value)[%t, ...], operand` (a literal made a value first).
    fn keep(&mut self, value: &str, operand: &Operand, out: &mut Vec<Stmt>) {
        let slot = self.slot(value);
        let ty = self.names.v.value_type(self.aliases.get(value).map_or(value, |s| s.as_str())).clone();
        let operand = match operand {
            Operand::Lit(l) => {
                let r = self.names.fresh("lit");
                out.push(self.stmt(&[&r], Op::Full(*l), Some(ty.clone())));
                Operand::value(&r)
            }
            v => v.clone(),
        };
        out.push(self.store(&slot, self.slot_index(ty.shape.len()), operand));
    }

    /// The body with the thread axis's `program_id` and `num_programs` made `%t` and the
    /// thread count, and each arrival counted (`arrive`, a `copy_async`'s `arrive`).
    fn inline(&mut self, body: &[Stmt]) -> Vec<Stmt> {
        let mut out = Vec::with_capacity(body.len());
        for s in body {
            let mut s = s.clone();
            for b in s.op.bodies_mut() {
                *b = self.inline(b);
            }
            let thread_axis = |a: &AxisRef| match a {
                AxisRef::Name(n) => *n == self.axis.1,
                AxisRef::Pos(p) => *p == self.axis.0,
            };
            match &mut s.op {
                Op::ProgramId(a) if thread_axis(a) => {
                    s.op = Op::Binary(BinaryOp::Add, Operand::value(&self.t), Self::lit(0));
                    s.ty = None;
                    out.push(s);
                }
                Op::NumPrograms(a) if thread_axis(a) => {
                    s.op = Op::Full(Literal::Int(self.threads as i64));
                    s.ty = Some(Type::scalar(DType::I32));
                    out.push(s);
                }
                Op::Sync(SyncOp::Arrive(b)) => {
                    let b = b.clone();
                    self.arrive(&b, &mut out);
                }
                Op::Sync(SyncOp::Copy { arrive, .. }) if arrive.is_some() => {
                    let b = arrive.take().expect("matched");
                    out.push(s);
                    self.arrive(&b, &mut out);
                }
                _ => out.push(s),
            }
        }
        out
    }

    /// One arrival on `b`: the phase completes at the barrier's `K`-th.
    fn arrive(&mut self, b: &BarrierAt, out: &mut Vec<Stmt>) {
        let c = &self.counters[&b.name];
        let (arrived, phase, arrivals) = (c.arrived.clone(), c.phase.clone(), c.arrivals as i64);
        let at = || vec![Index::At(b.index.clone())];
        let a = self.names.fresh("arrived");
        out.push(self.load(&a, &arrived, at()));
        let a1 = self.binary("arrived_next", BinaryOp::Add, Operand::value(&a), Self::lit(1), out);
        let full = self.compare("phase_done", CmpOp::Eq, a1.clone(), Self::lit(arrivals), out);
        let a2 = self.names.fresh("arrived_kept");
        out.push(self.stmt(&[&a2], Op::Select(full.clone(), Self::lit(0), a1), None));
        out.push(self.store(&arrived, at(), Operand::value(&a2)));
        let p = self.names.fresh("phase");
        out.push(self.load(&p, &phase, at()));
        let p1 = self.binary("phase_next", BinaryOp::Add, Operand::value(&p), Self::lit(1), out);
        let p2 = self.names.fresh("phase_kept");
        out.push(self.stmt(&[&p2], Op::Select(full, p1, Operand::value(&p)), None));
        out.push(self.store(&phase, at(), Operand::value(&p2)));
    }

    /// The code from `body[from]` on to the next point, and the value it gives that point.
    fn run(&mut self, body: &[Stmt], from: usize, end: &End) -> (Vec<Stmt>, String) {
        let mut out = Vec::new();
        for (n, s) in body.iter().enumerate().skip(from) {
            if !matches!(s.op, Op::Sync(SyncOp::Wait(_))) && !has_wait(s) {
                match &s.op {
                    Op::Yield(values) => {
                        let next = self.ended(end, values, &mut out);
                        return (out, next);
                    }
                    _ => out.push(s.clone()),
                }
                continue;
            }
            let next = match &s.op {
                Op::Sync(SyncOp::Wait(b)) => {
                    let state = self.state(|me, state| me.wait(b, state, body, n, end));
                    self.constant(state, &mut out)
                }
                Op::When { cond, body: inner } => {
                    let join = self.state(|me, _| {
                        let (code, next) = me.run(body, n + 1, end);
                        Segment { code, next, ran: None }
                    });
                    let (taken, a) = self.run(inner, 0, &End::Join(join, Vec::new()));
                    let mut skipped = Vec::new();
                    let b = self.constant(join, &mut skipped);
                    let (stmt, next) = self.choose("point", cond.clone(), (taken, vec![a]), (skipped, vec![b]));
                    out.push(stmt);
                    next[0].clone()
                }
                Op::If(IfElse { cond, then, els }) => {
                    let join = self.state(|me, _| {
                        let (code, next) = me.run(body, n + 1, end);
                        Segment { code, next, ran: None }
                    });
                    let (then, a) = self.run(then, 0, &End::Join(join, s.results.clone()));
                    let (els, b) = self.run(els, 0, &End::Join(join, s.results.clone()));
                    let (stmt, next) = self.choose("point", cond.clone(), (then, vec![a]), (els, vec![b]));
                    out.push(stmt);
                    next[0].clone()
                }
                Op::For(l) => {
                    for (r, (carried, _)) in s.results.iter().zip(&l.iters) {
                        self.aliases.insert(r.clone(), carried.clone());
                    }
                    self.keep(&l.var, &l.lo, &mut out);
                    for (carried, init) in &l.iters {
                        self.keep(carried, init, &mut out);
                    }
                    let head = self.state(|me, head| me.head(l, head, body, n, end));
                    self.constant(head, &mut out)
                }
                _ => unreachable!("only waits and bodies hold waits"),
            };
            return (out, next);
        }
        let next = self.ended(end, &[], &mut out);
        (out, next)
    }

    /// The end of a body: its `yield`ed values kept; the thread's next point.
    fn ended(&mut self, end: &End, values: &[Operand], out: &mut Vec<Stmt>) -> String {
        match end {
            End::Top => self.constant(DONE, out),
            End::Join(join, results) => {
                for (r, v) in results.iter().zip(values) {
                    self.keep(r, v, out);
                }
                self.constant(*join, out)
            }
            End::Loop { head, var, step, iters } => {
                for (c, v) in iters.iter().zip(values) {
                    self.keep(c, v, out);
                }
                let next = self.binary("next", BinaryOp::Add, Operand::value(var), step.clone(), out);
                self.keep(var, &next, out);
                self.constant(*head, out)
            }
        }
    }

    /// The segment at `wait B[k]` (`body[at]`, state `state`): once the phase has completed,
    /// the code after it; until then, the thread stays and has not run.
    fn wait(&mut self, b: &BarrierAt, state: i64, body: &[Stmt], at: usize, end: &End) -> Segment {
        let c = &self.counters[&b.name];
        let (phase, seen) = (c.phase.clone(), c.seen.clone());
        let mut code = Vec::new();
        let n = self.names.fresh("seen");
        code.push(self.load(&n, &seen, vec![self.thread(), Index::At(b.index.clone())]));
        let p = self.names.fresh("completed");
        code.push(self.load(&p, &phase, vec![Index::At(b.index.clone())]));
        let ok = self.compare("phase_reached", CmpOp::Lt, Operand::value(&n), Operand::value(&p), &mut code);
        let mut passed = Vec::new();
        let n1 = self.binary("seen_next", BinaryOp::Add, Operand::value(&n), Self::lit(1), &mut passed);
        passed.push(self.store(&seen, vec![self.thread(), Index::At(b.index.clone())], n1));
        let (after, next) = self.run(body, at + 1, end);
        passed.extend(after);
        let went = self.flag(true, &mut passed);
        let mut stays = Vec::new();
        let here = self.constant(state, &mut stays);
        let idle = self.flag(false, &mut stays);
        let (stmt, r) = self.choose("waited", ok, (passed, vec![next, went]), (stays, vec![here, idle]));
        code.push(stmt);
        Segment { code, next: r[0].clone(), ran: Some(r[1].clone()) }
    }

    /// The segment at the head of loop `l` (`body[at]`, state `head`): a trip's code while
    /// `%i < hi` (and its `while` flag), else the code after the loop.
    fn head(&mut self, l: &ForLoop, head: i64, body: &[Stmt], at: usize, end: &End) -> Segment {
        let mut code = Vec::new();
        let mut go = self.compare("trip", CmpOp::Lt, Operand::value(&l.var), l.hi.clone(), &mut code);
        if let Some(step @ Operand::Value(_)) = &l.step {
            // A step that is not positive runs the body zero times (docs/language.md §8).
            let forward = self.compare("trip_step", CmpOp::Gt, step.clone(), Self::lit(0), &mut code);
            go = self.binary("trip_forward", BinaryOp::And, go, forward, &mut code);
        }
        if let Some(flag) = &l.cond {
            go = self.binary("trip_while", BinaryOp::And, go, Operand::value(flag), &mut code);
        }
        let back = End::Loop {
            head,
            var: l.var.clone(),
            step: l.step.clone().unwrap_or(Self::lit(1)),
            iters: l.iters.iter().map(|(c, _)| c.clone()).collect(),
        };
        let (trip, a) = self.run(&l.body, 0, &back);
        let (after, b) = self.run(body, at + 1, end);
        let (stmt, next) = self.choose("point", go, (trip, vec![a]), (after, vec![b]));
        code.push(stmt);
        Segment { code, next: next[0].clone(), ran: None }
    }

    /// The scheduler around the segments, each segment's values from other segments loaded at
    /// its start and stored where they are defined.
    fn finish(&mut self) -> Vec<Stmt> {
        let segments: Vec<Segment> = self.states.iter_mut().map(|s| s.take().expect("every state written")).collect();
        // What each segment reads from elsewhere lives in a slot.
        let imports: Vec<Vec<String>> = segments.iter().map(|seg| self.imported(&seg.code)).collect();
        for v in imports.iter().flatten() {
            self.slot(v);
        }
        // One step of thread `%t`: the segment at its point, which gives the next point and
        // whether it ran (a `wait` whose phase has not completed does not).
        let (pc, go, any) = (self.names.fresh("pc"), self.names.fresh("step_go"), self.names.fresh("ran_before"));
        let mut step = Vec::new();
        let (mut next, mut ran) = (pc.clone(), self.flag(false, &mut step));
        for (n, (seg, imports)) in segments.into_iter().zip(imports).enumerate() {
            let Segment { mut code, next: seg_next, ran: seg_ran } = seg;
            self.stored(&mut code);
            let mut renames = HashMap::new();
            let mut then = Vec::new();
            for v in imports {
                let slot = self.slot(&v);
                let local = self.names.fresh(&format!("{v}_{n}"));
                let rank = self.names.v.value_type(self.aliases.get(&v).map_or(&v, |s| s)).shape.len();
                then.push(self.load(&local, &slot, self.slot_index(rank)));
                renames.insert(v, local);
            }
            rename(&mut code, &renames);
            then.extend(code);
            let seg_ran = seg_ran.unwrap_or_else(|| self.flag(true, &mut then));
            let here = self.compare("at", CmpOp::Eq, Operand::value(&pc), Self::lit(n as i64), &mut step);
            let (stmt, r) = self.choose("after", here, (then, vec![seg_next, seg_ran]), (Vec::new(), vec![next, ran]));
            step.push(stmt);
            (next, ran) = (r[0].clone(), r[1].clone());
        }
        // The thread runs on while its segment ran and it has not ended.
        let alive = self.compare("running", CmpOp::Ne, Operand::value(&next), Self::lit(DONE), &mut step);
        let again = self.binary("again", BinaryOp::And, Operand::value(&ran), alive, &mut step);
        let moved = self.binary("ran_since", BinaryOp::Or, Operand::value(&any), Operand::value(&ran), &mut step);
        step.push(self.stmt(&[], Op::Yield(vec![Operand::value(&next), again, moved]), None));
        // Each thread in turn, from its point to where it blocks or ends.
        let (moved_before, first) = (self.names.fresh("moved_before"), self.names.fresh("first_pc"));
        let mut turn = vec![self.load(&first, &self.pc.clone(), vec![self.thread()])];
        let (start, none) = (self.flag(true, &mut turn), self.flag(false, &mut turn));
        let (last, ran_turn) = (self.names.fresh("last_pc"), self.names.fresh("ran_turn"));
        let steps = ForLoop {
            var: self.names.fresh("step"),
            lo: Self::lit(0),
            hi: Self::lit(UNBOUNDED),
            step: None,
            iters: vec![(pc, Operand::value(&first)), (go.clone(), Operand::value(&start)), (any, Operand::value(&none))],
            cond: Some(go),
            body: step,
        };
        let stopped = self.names.fresh("stopped");
        turn.push(self.stmt(&[&last, &stopped, &ran_turn], Op::For(steps), None));
        turn.push(self.store(&self.pc.clone(), vec![self.thread()], Operand::value(&last)));
        let moved = self.binary("moved_since", BinaryOp::Or, Operand::value(&moved_before), Operand::value(&ran_turn), &mut turn);
        turn.push(self.stmt(&[], Op::Yield(vec![moved]), None));
        // Rounds go on while some thread moved and some has not ended.
        let mut round = Vec::new();
        let nobody = self.flag(false, &mut round);
        let threads = ForLoop {
            var: self.t.clone(),
            lo: Self::lit(0),
            hi: Self::lit(self.threads as i64),
            step: None,
            iters: vec![(moved_before, Operand::value(&nobody))],
            cond: None,
            body: turn,
        };
        let moved = self.names.fresh("moved");
        round.push(self.stmt(&[&moved], Op::For(threads), None));
        let pcs = self.names.fresh("pcs");
        round.push(self.stmt(&[&pcs], Op::Load { src: self.pc.clone(), index: None, mask: None, other: None }, None));
        let alive = self.compare("alive", CmpOp::Ne, Operand::value(&pcs), Self::lit(DONE), &mut round);
        let count = self.names.fresh("alive_count");
        let t = Type::array(DType::I32, [self.threads as usize]);
        round.push(self.stmt(&[&count], Op::Cast(alive), Some(t)));
        let most = self.names.fresh("alive_any");
        let reduce = Op::Reduce { op: ReduceOp::Max, arg: Operand::value(&count), axis: 0, keepdims: false };
        round.push(self.stmt(&[&most], reduce, None));
        let some = self.compare("some_alive", CmpOp::Ne, Operand::value(&most), Self::lit(0), &mut round);
        let go = self.binary("go_on", BinaryOp::And, Operand::value(&moved), some, &mut round);
        round.push(self.stmt(&[], Op::Yield(vec![go]), None));
        self.unbounded_loop("round", round)
    }

    /// `for %i = 0 to UNBOUNDED iter (%go = true) while %go { body }`, `body` yielding the next
    /// `%go`.
    fn unbounded_loop(&mut self, base: &str, body: Vec<Stmt>) -> Vec<Stmt> {
        let start = self.names.fresh(&format!("{base}_start"));
        let first = self.stmt(&[&start], Op::Full(Literal::Bool(true)), Some(Type::scalar(DType::Bool)));
        let var = self.names.fresh(base);
        let go = self.names.fresh(&format!("{base}_go"));
        let result = self.names.fresh(&format!("{base}_went"));
        let l = ForLoop {
            var,
            lo: Self::lit(0),
            hi: Self::lit(UNBOUNDED),
            step: None,
            iters: vec![(go.clone(), Operand::value(&start))],
            cond: Some(go),
            body,
        };
        vec![first, self.stmt(&[&result], Op::For(l), None)]
    }

    /// The values `seg` reads but does not define (the thread variable aside), in order of
    /// first read.
    fn imported(&self, seg: &[Stmt]) -> Vec<String> {
        let mut defined: HashSet<&str> = HashSet::from([self.t.as_str()]);
        analysis::visit(seg, &mut |s| {
            defined.extend(s.results.iter().map(String::as_str));
            if let Op::For(l) = &s.op {
                defined.insert(&l.var);
                defined.extend(l.iters.iter().map(|(c, _)| c.as_str()));
            }
        });
        let mut out: Vec<String> = Vec::new();
        analysis::visit(seg, &mut |s| {
            for r in analysis::reads(&s.op) {
                if !defined.contains(r) && !out.iter().any(|o| o == r) {
                    out.push(r.to_string());
                }
            }
        });
        out
    }

    /// Each definition of a value that has a slot followed by its store to the slot.
    fn stored(&mut self, seg: &mut Vec<Stmt>) {
        let mut out = Vec::with_capacity(seg.len());
        for mut s in std::mem::take(seg) {
            for b in s.op.bodies_mut() {
                self.stored(b);
            }
            let defined: Vec<String> = s.results.iter().filter(|r| self.slots.contains_key(*r)).cloned().collect();
            out.push(s);
            for r in defined {
                self.keep(&r, &Operand::value(&r), &mut out);
            }
        }
        *seg = out;
    }
}

/// Whether a statement holds a `wait` in its bodies.
fn has_wait(s: &Stmt) -> bool {
    let mut found = false;
    for b in s.op.bodies() {
        analysis::visit(b, &mut |s| found |= matches!(s.op, Op::Sync(SyncOp::Wait(_))));
    }
    found
}

/// Every read of a value in `renames` made a read of its new name.
fn rename(body: &mut [Stmt], renames: &HashMap<String, String>) {
    let swap = |name: &mut String| {
        if let Some(n) = renames.get(name.as_str()) {
            *name = n.clone();
        }
    };
    for s in body {
        for b in s.op.bodies_mut() {
            rename(b, renames);
        }
        for o in operands_mut(&mut s.op) {
            if let Operand::Value(name) = o {
                swap(name);
            }
        }
        if let Op::Load { mask: Some(m), .. } | Op::Store { mask: Some(m), .. } = &mut s.op {
            swap(m);
        }
    }
}

/// The operands a statement reads itself, as [`analysis::reads`] lists them, to change.
fn operands_mut(op: &mut Op) -> Vec<&mut Operand> {
    fn starts(ix: &mut Option<Vec<Index>>) -> impl Iterator<Item = &mut Operand> {
        ix.iter_mut().flatten().filter_map(|i| match i {
            Index::Full => None,
            Index::Slice { start, .. } => Some(start),
            Index::At(at) | Index::Gather { index: at, .. } => Some(at),
        })
    }
    match op {
        Op::Load { index, .. } => starts(index).collect(),
        Op::Store { index, value, .. } => starts(index).chain([value]).collect(),
        Op::ProgramId(_) | Op::NumPrograms(_) | Op::Iota { .. } | Op::Full(_) | Op::Zeros => Vec::new(),
        Op::Unary(_, a)
        | Op::Cast(a)
        | Op::Bitcast(a)
        | Op::Broadcast(a)
        | Op::Reshape(a)
        | Op::Transpose { arg: a, .. }
        | Op::Tile { arg: a, .. }
        | Op::Repeat { arg: a, .. }
        | Op::Slice { arg: a, .. }
        | Op::Reduce { arg: a, .. } => vec![a],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) | Op::Dot { a, b, .. } => vec![a, b],
        Op::Select(c, a, b) => vec![c, a, b],
        Op::Concatenate { args, .. } => args.iter_mut().collect(),
        Op::When { cond, .. } | Op::If(IfElse { cond, .. }) => vec![cond],
        Op::For(ForLoop { lo, hi, step, iters, .. }) => {
            [lo, hi].into_iter().chain(step.as_mut()).chain(iters.iter_mut().map(|(_, v)| v)).collect()
        }
        Op::Yield(vs) => vs.iter_mut().collect(),
        Op::Sync(s) => s.operands_mut(),
    }
}
