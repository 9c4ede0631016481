//! The plan's second phase on the general path: where a warpgroup's threads meet (`bar.sync`).
//! [`place`] walks the kernel's statements in the order the writer writes them, with what the
//! warpgroup's threads touched since their last meeting ([`Hazards`]), and keeps every point
//! where an access meets another thread's, together with the points where an operation is itself
//! a meeting (an `arrive`, a copy by TMA, `wait_copies`, a loop's back edge, a product on
//! `wgmma` reading what threads wrote). The writer reads [`Meetings`] and places nothing itself;
//! the plan prints them (`tessel lower --plan`).
//!
//! Statements are numbered in the writer's order: depth first, a statement before the bodies it
//! holds (`#0` is the kernel's first).

use std::collections::{BTreeSet, HashSet};

use tessel_plugin_api::ir::*;

use super::{KernelPlan, Use, uses};

/// Where, around statement `#stmt`, the threads meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum At {
    /// Before a product on `wgmma` whose operand buffers threads wrote: fenced, then met.
    Fence,
    /// Before the statement's own accesses.
    Before,
    /// Inside the operation, which is a meeting: `arrive`, a copy by TMA, `wait_copies`.
    Op,
    /// Copying carried value `i`'s initial value in.
    Init(usize),
    /// Reading a `while` loop's condition at the top of an iteration.
    Cond,
    /// Writing the loop variable.
    Var,
    /// Copying yielded value `i` out of a `for` body or an `if`'s `then` branch.
    Yield(usize),
    /// Copying yielded value `i` out of an `if`'s `else` branch.
    ElseYield(usize),
    /// Copying carried value `i` from its yield slot back.
    Next(usize),
    /// The end of a loop iteration: the next one writes every slot again.
    BackEdge,
    /// Copying carried value `i` into the loop's result.
    Result(usize),
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Fence => write!(f, "fenced, before"),
            At::Before => write!(f, "before"),
            At::Op => write!(f, "in the operation"),
            At::Init(i) => write!(f, "initial value {i}"),
            At::Cond => write!(f, "condition"),
            At::Var => write!(f, "loop variable"),
            At::Yield(i) => write!(f, "yield {i}"),
            At::ElseYield(i) => write!(f, "else yield {i}"),
            At::Next(i) => write!(f, "next {i}"),
            At::BackEdge => write!(f, "back edge"),
            At::Result(i) => write!(f, "result {i}"),
        }
    }
}

/// Where the warpgroup's threads meet: the points [`place`] keeps, and whether each `seq` step
/// (or thread-axis point) ends with a meeting.
#[derive(Clone, Debug, Default)]
pub struct Meetings {
    at: BTreeSet<(usize, At)>,
    after_step: bool,
}

impl Meetings {
    /// Whether the threads meet at `at` of statement `#stmt`.
    pub fn at(&self, stmt: usize, at: At) -> bool {
        self.at.contains(&(stmt, at))
    }

    /// Whether a `seq` step ends with a meeting (another step, or another point of the thread
    /// axis, writes every slot again).
    pub fn after_step(&self) -> bool {
        self.after_step
    }

    /// Every meeting, in statement order.
    pub fn points(&self) -> impl Iterator<Item = (usize, At)> + '_ {
        self.at.iter().copied()
    }
}

/// The meetings of `plan` (a general-path plan; a Hopper one has none).
pub fn place(plan: &KernelPlan) -> Meetings {
    let k = plan.kernel.kernel();
    let steps: u64 = (plan.kernel.grid().iter())
        .filter(|a| a.seq)
        .map(|a| match a.size {
            AxisSize::Fixed(n) => n,
            AxisSize::Dyn => 1,
        })
        .product();
    let refill = plan.thread_axis.is_some() && plan.thread_points > plan.warpgroups;
    let mut walk = Walk { plan, hazards: Hazards::default(), next: 0, at: BTreeSet::new() };
    walk.body(&k.body);
    Meetings { at: walk.at, after_step: steps > 1 || refill }
}

/// What statement `s` reads and writes, as the warpgroup's threads touch them: [`uses`], with an
/// accumulator in registers moved through a value in the `wgmma` layout (across the threads),
/// and a product on `wgmma` reading its operand buffers across the warpgroup.
pub fn accesses(plan: &KernelPlan, s: &Stmt) -> (Vec<Use>, Vec<Use>) {
    let out_shape = s.ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
    let (mut reads, mut writes) = uses(&plan.kernel, s, &out_shape);
    if let Op::Load { src: a, .. } | Op::Store { dst: a, .. } = &s.op
        && plan.mma.accumulator(a).is_some()
    {
        for u in reads.iter_mut().chain(writes.iter_mut()) {
            u.own = false;
        }
    }
    if let Op::Sync(SyncOp::Mma { a, b, .. }) = &s.op {
        match a {
            MmaLhs::Ref(a) => reads.push(Use::across(&a.name)),
            MmaLhs::Value(Operand::Value(v)) => reads.push(Use::across(v)),
            MmaLhs::Value(Operand::Lit(_)) => {}
        }
        reads.push(Use::across(&b.name));
    }
    (reads, writes)
}

/// The slots and arrays a warpgroup's threads wrote and read since their last meeting, by
/// whether each thread touched only its own elements (element `e` is thread `e % 128`'s in every
/// loop over a value) or other threads' too. A meeting is needed only where an access meets one
/// of another thread's: reading what another thread wrote, or writing what another thread read
/// or wrote. Elementwise chains, loads and stores of whole blocks need none between them.
#[derive(Clone, Default)]
struct Hazards {
    written_own: HashSet<String>,
    written_across: HashSet<String>,
    read_own: HashSet<String>,
    read_across: HashSet<String>,
}

impl Hazards {
    /// Whether an access would meet another thread's since the last meeting.
    fn conflicts(&self, u: &Use, write: bool) -> bool {
        let n = &u.name;
        let written = self.written_across.contains(n) || (!u.own && self.written_own.contains(n));
        let read = write && (self.read_across.contains(n) || (!u.own && self.read_own.contains(n)));
        written || read
    }

    fn record(&mut self, u: &Use, write: bool) {
        let set = match (write, u.own) {
            (true, true) => &mut self.written_own,
            (true, false) => &mut self.written_across,
            (false, true) => &mut self.read_own,
            (false, false) => &mut self.read_across,
        };
        set.insert(u.name.clone());
    }

    /// What either of two paths may have left.
    fn union(&mut self, other: Hazards) {
        self.written_own.extend(other.written_own);
        self.written_across.extend(other.written_across);
        self.read_own.extend(other.read_own);
        self.read_across.extend(other.read_across);
    }
}

/// The walk of [`place`]: the hazards where the writer will be, the next statement's number and
/// the meetings kept so far.
struct Walk<'p> {
    plan: &'p KernelPlan,
    hazards: Hazards,
    next: usize,
    at: BTreeSet<(usize, At)>,
}

impl Walk<'_> {
    fn body(&mut self, body: &[Stmt]) {
        for s in body {
            let n = self.next;
            self.next += 1;
            self.stmt(n, s);
        }
    }

    fn meet(&mut self, stmt: usize, at: At) {
        self.at.insert((stmt, at));
        self.hazards = Hazards::default();
    }

    /// A meeting before accesses that meet another thread's since the last one; then the
    /// accesses are recorded.
    fn sync(&mut self, stmt: usize, at: At, reads: &[Use], writes: &[Use]) {
        let h = &self.hazards;
        if reads.iter().any(|u| h.conflicts(u, false)) || writes.iter().any(|u| h.conflicts(u, true)) {
            self.meet(stmt, at);
        }
        for u in reads {
            self.hazards.record(u, false);
        }
        for u in writes {
            self.hazards.record(u, true);
        }
    }

    fn copy(&mut self, stmt: usize, at: At, from: &str, to: &str) {
        self.sync(stmt, at, &[Use::own(from)], &[Use::own(to)]);
    }

    fn stmt(&mut self, n: usize, s: &Stmt) {
        let (reads, writes) = accesses(self.plan, s);
        if let Op::Sync(op @ SyncOp::Mma { .. }) = &s.op
            && self.plan.mma.reads_thread_writes(op)
        {
            self.meet(n, At::Fence);
        }
        self.sync(n, At::Before, &reads, &writes);
        match &s.op {
            Op::When { body, .. } => {
                // After the body: what it left, or (skipped) what was before it.
                let before = self.hazards.clone();
                self.body(body);
                self.hazards.union(before);
            }
            Op::If(i) => {
                let before = self.hazards.clone();
                self.branch(n, &i.then, &s.results, At::Yield);
                let after_then = std::mem::replace(&mut self.hazards, before);
                self.branch(n, &i.els, &s.results, At::ElseYield);
                self.hazards.union(after_then);
            }
            Op::For(f) => self.for_loop(n, f, &s.results),
            Op::Sync(SyncOp::Arrive(_) | SyncOp::Copy { .. } | SyncOp::WaitCopies { .. }) => self.meet(n, At::Op),
            _ => {}
        }
    }

    fn branch(&mut self, n: usize, body: &[Stmt], results: &[String], at: fn(usize) -> At) {
        self.body(body);
        for (i, (v, r)) in yields(body).unwrap_or_default().iter().zip(results).enumerate() {
            self.copy(n, at(i), v, r);
        }
    }

    fn for_loop(&mut self, n: usize, f: &ForLoop, results: &[String]) {
        for (i, (name, init)) in f.iters.iter().enumerate() {
            let Operand::Value(v) = init else { unreachable!("verifier: iter initial values are values") };
            self.copy(n, At::Init(i), v, name);
        }
        // Every iteration ends with a meeting, so the loop's top and its exit see only what came
        // before the loop.
        let before = self.hazards.clone();
        if let Some(c) = &f.cond {
            self.sync(n, At::Cond, &[Use::across(c)], &[]);
        }
        self.sync(n, At::Var, &[], &[Use::own(&f.var)]);
        self.body(&f.body);
        if let Some(yielded) = yields(&f.body) {
            for (i, (v, (name, _))) in yielded.iter().zip(&f.iters).enumerate() {
                self.copy(n, At::Yield(i), v, &format!("{name}.next"));
            }
            for (i, (name, _)) in f.iters.iter().enumerate() {
                self.copy(n, At::Next(i), &format!("{name}.next"), name);
            }
        }
        self.meet(n, At::BackEdge);
        self.hazards = before;
        for (i, ((name, _), r)) in f.iters.iter().zip(results).enumerate() {
            self.copy(n, At::Result(i), name, r);
        }
    }
}

/// The values a body's closing `yield` gives, in order; `None` without one.
pub fn yields(body: &[Stmt]) -> Option<Vec<&str>> {
    let Some(Stmt { op: Op::Yield(vals), .. }) = body.last() else { return None };
    fn value(v: &Operand) -> &str {
        match v {
            Operand::Value(v) => v,
            Operand::Lit(_) => unreachable!("verifier: yields are values"),
        }
    }
    Some(vals.iter().map(value).collect())
}

#[cfg(test)]
mod tests {
    use super::super::plan_general;
    use super::*;

    /// A reduction reads its operand across the warpgroup (#2, after the elementwise `%y` was
    /// written at each thread's own elements); the broadcast of its scalar reads what one thread
    /// wrote (#3); the store after it touches only each thread's own elements of `%b` (none);
    /// and a `seq` step ends with a meeting, the next step writing every slot again.
    #[test]
    fn threads_meet_where_an_access_meets_another_threads_and_at_each_steps_end() {
        let text = "kernel k\n  grid (i: 2 seq)\n  in  x: f32[256]\n  out o: f32[256]\n{\n  %x = load x\n  %y = mul %x, 2.0\n  %s = sum %y axis 0\n  %b = broadcast %s : f32[256]\n  store o, %b\n}\n";
        let v = verify(&parse(text).expect("parses").kernels.remove(0)).expect("verifies");
        let p = plan_general(&v, None).expect("plans");
        let points: Vec<(usize, At)> = p.meetings.points().collect();
        assert_eq!(points, [(2, At::Before), (3, At::Before)]);
        assert!(p.meetings.after_step());
    }
}
