//! The plan's last phase: where the workgroup's invocations meet. [`place`] walks the kernel's
//! statements in the order the writer writes them, with what happened since the last
//! `storageBarrier` (a value published to the workspace, an `out` or scratch array stored to or
//! loaded from), and keeps a barrier wherever a statement would read across invocations what
//! one of them published, store where another may have stored or loaded, or load an `out` or
//! scratch array another may have stored; and the barrier each scalar shared with
//! `workgroupUniformLoad` needs (a `storageBarrier` where one is due anyway, else a
//! `workgroupBarrier`). The writer (`emit/`) reads [`Meetings`] and places no barrier of its own
//! but those inside a `dot` staged in workgroup memory (between its chunks).
//!
//! Statements are numbered depth first, a statement before the bodies it holds, a body's closing
//! `yield` included (`#0` is the kernel's first), as `analysis::visit` walks them.

use std::collections::BTreeMap;

use tessel_plugin_api::ir::analysis::region_shape;
use tessel_plugin_api::ir::*;

use super::KernelPlan;

/// Where in statement `#n` a barrier stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Site {
    /// Before reading the index vector of dimension `d` of a gather or scatter.
    Index(usize),
    /// Before loading an `out` or scratch array.
    RefLoad,
    /// Before storing to an array.
    Store,
    /// Before the statement reads its operands.
    Reads,
    /// Before invocation 0 computes a scalar the others load (`workgroupUniformLoad`).
    Broadcast,
    /// At the top of every iteration of a `for`.
    LoopTop,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Site::Index(d) => write!(f, "before the index vector of dimension {d}"),
            Site::RefLoad => write!(f, "before the load"),
            Site::Store => write!(f, "before the store"),
            Site::Reads => write!(f, "before the reads"),
            Site::Broadcast => write!(f, "before the scalar's broadcast"),
            Site::LoopTop => write!(f, "at each iteration's top"),
        }
    }
}

impl std::fmt::Display for Barrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Barrier::Storage => "storageBarrier",
            Barrier::Workgroup => "workgroupBarrier",
        })
    }
}

/// A barrier's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// `storageBarrier()`: the workspace and the arrays.
    Storage,
    /// `workgroupBarrier()`: the variable a scalar is shared through.
    Workgroup,
}

/// Where the invocations meet: at the top of each program a workgroup walks (strided), at the
/// top of each `seq` step, and inside statements.
#[derive(Clone, Debug, Default)]
pub struct Meetings {
    program_top: bool,
    step_top: bool,
    at: BTreeMap<(usize, Site), Barrier>,
}

impl Meetings {
    /// The barrier at `site` of statement `#stmt`, if any.
    pub fn at(&self, stmt: usize, site: Site) -> Option<Barrier> {
        self.at.get(&(stmt, site)).copied()
    }

    /// Whether each program a workgroup walks starts with a barrier (the previous program's
    /// workspace is done with).
    pub fn program_top(&self) -> bool {
        self.program_top
    }

    /// Whether each `seq` step starts with a barrier (the previous step's reads and stores are
    /// done).
    pub fn step_top(&self) -> bool {
        self.step_top
    }

    /// Every barrier inside a statement, in statement order.
    pub fn points(&self) -> impl Iterator<Item = (usize, Site, Barrier)> + '_ {
        self.at.iter().map(|(&(n, site), &b)| (n, site, b))
    }
}

/// What happened since the last `storageBarrier`: a value published, an array stored to or
/// loaded from (an `out` or scratch one).
#[derive(Clone, Copy, Default)]
struct Pending {
    publish: bool,
    store: bool,
    ref_load: bool,
}

impl Pending {
    fn union(self, o: Pending) -> Pending {
        Pending { publish: self.publish | o.publish, store: self.store | o.store, ref_load: self.ref_load | o.ref_load }
    }
}

/// The meetings of `plan`, from everything else it decided.
pub fn place(plan: &KernelPlan) -> Meetings {
    let k = plan.kernel.kernel();
    let program_top = plan.strided && plan.shares;
    let step_top = plan.steps > 1 && (plan.shares || plan.stores);
    // Scratch starts zeroed by the program's invocations.
    let store = k.params_of(ParamKind::Scratch).next().is_some() && !step_top;
    let mut walk = Walk { plan, pending: Pending { store, ..Pending::default() }, next: 0, at: BTreeMap::new() };
    walk.body(&k.body);
    Meetings { program_top, step_top, at: walk.at }
}

struct Walk<'p> {
    plan: &'p KernelPlan,
    pending: Pending,
    next: usize,
    at: BTreeMap<(usize, Site), Barrier>,
}

impl Walk<'_> {
    fn body(&mut self, body: &[Stmt]) {
        for s in body {
            let n = self.next;
            self.next += 1;
            self.stmt(n, s);
        }
    }

    fn barrier(&mut self, n: usize, site: Site) {
        self.at.insert((n, site), Barrier::Storage);
        self.pending = Pending::default();
    }

    /// Before reading values other invocations published, when one was published since.
    fn reads(&mut self, n: usize, site: Site, shared: bool) {
        if shared && self.pending.publish {
            self.barrier(n, site);
        }
    }

    /// A block value made: published if another invocation reads it.
    fn defined(&mut self, name: &str) {
        let ty = self.plan.kernel.value_type(name);
        if !ty.is_scalar() && self.plan.publish.contains(self.plan.id(name)) {
            self.pending.publish = true;
        }
    }

    /// A scalar invocation 0 computes and shares.
    fn broadcast(&mut self, n: usize) {
        if self.pending.publish || self.pending.store {
            self.barrier(n, Site::Broadcast);
        } else {
            self.at.insert((n, Site::Broadcast), Barrier::Workgroup);
        }
    }

    /// A value made from published values: a scalar shared, else a block.
    fn gathered(&mut self, n: usize, dst: &str) {
        self.reads(n, Site::Reads, true);
        if self.plan.kernel.value_type(dst).is_scalar() {
            self.broadcast(n);
        } else {
            self.defined(dst);
        }
    }

    /// Whether operand `o`, read for a result of shape `res`, is read from the workspace.
    fn shared(&self, o: &Operand, res: &[usize], linear: bool) -> bool {
        match o {
            Operand::Lit(_) => false,
            Operand::Value(v) => {
                let shape = &self.plan.kernel.value_type(v).shape;
                !shape.is_empty() && self.plan.crosses(shape, res, linear)
            }
        }
    }

    /// The index vectors of a gather or scatter, each read from the workspace.
    fn index_vectors(&mut self, n: usize, index: Option<&[Index]>) {
        for (d, i) in index.unwrap_or_default().iter().enumerate() {
            if let Index::Gather { index: Operand::Value(_), .. } = i {
                self.reads(n, Site::Index(d), true);
            }
        }
    }

    fn stmt(&mut self, n: usize, s: &Stmt) {
        let plan = self.plan;
        if plan.folded(s) {
            return;
        }
        let dst = s.results.first().map(String::as_str).unwrap_or_default();
        let res = s.ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let k = plan.kernel.kernel();
        match &s.op {
            Op::Load { src, index, mask, .. } => {
                let x = plan.id(dst);
                if plan.dot_only.contains(x) || plan.row_forwarded.contains_key(x) {
                    return;
                }
                if plan.resident.contains_key(src) {
                    return self.defined(dst);
                }
                self.index_vectors(n, index.as_deref());
                let by_ref = k.param(src).expect("verified argument").kind != ParamKind::In;
                if by_ref && self.pending.store {
                    self.barrier(n, Site::RefLoad);
                }
                let shared = mask.as_ref().is_some_and(|m| self.shared(&Operand::Value(m.clone()), &res, false));
                self.reads(n, Site::Reads, shared);
                self.pending.ref_load |= by_ref;
                if res.is_empty() { self.broadcast(n) } else { self.defined(dst) }
            }
            Op::Store { dst: d, index, value, mask } => {
                self.index_vectors(n, index.as_deref());
                let sel = region_shape(k.param(d).expect("verified argument"), index.as_deref());
                let value = self.shared(value, &sel, false);
                if plan.resident.contains_key(d) {
                    return self.reads(n, Site::Reads, value);
                }
                if self.pending.store || self.pending.ref_load {
                    self.barrier(n, Site::Store);
                }
                let mask = mask.as_ref().is_some_and(|m| self.shared(&Operand::Value(m.clone()), &sel, false));
                self.reads(n, Site::Reads, value || mask);
                self.pending.store = true;
            }
            Op::ProgramId(_) | Op::NumPrograms(_) | Op::Yield(_) => {}
            Op::Sync(_) => unreachable!("checked() makes the concurrent model synchronous (ir::synchronous)"),
            Op::Tile { .. } | Op::Repeat { .. } => unreachable!("legalize rewrites tile and repeat before planning"),
            Op::Transpose { .. } | Op::Slice { .. } | Op::Concatenate { .. } => self.gathered(n, dst),
            Op::Reduce { arg, axis, .. } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: reduce of a value") };
                let shape = &plan.kernel.value_type(src).shape;
                if plan.fused.contains_key(plan.id(dst)) || plan.row_reduce(shape, *axis) {
                    self.defined(dst);
                } else {
                    self.gathered(n, dst);
                }
            }
            Op::Dot { a, b, .. } => {
                let published = [a, b].iter().any(|o| matches!(o, Operand::Value(v) if !plan.forwarded.contains_key(plan.id(v))));
                self.reads(n, Site::Reads, published);
                self.defined(dst);
            }
            Op::When { body, .. } => {
                let before = self.pending;
                self.body(body);
                self.pending = self.pending.union(before);
            }
            Op::If(i) => {
                let before = self.pending;
                self.body(&i.then);
                let after_then = std::mem::replace(&mut self.pending, before);
                self.body(&i.els);
                self.pending = self.pending.union(after_then);
                for r in &s.results {
                    self.defined(r);
                }
            }
            Op::For(f) => {
                let before = self.pending;
                if plan.shares || plan.stores {
                    self.barrier(n, Site::LoopTop);
                }
                for (name, _) in &f.iters {
                    self.defined(name);
                }
                self.body(&f.body);
                self.pending = self.pending.union(before);
                for r in &s.results {
                    self.defined(r);
                }
            }
            // Made element by element (the writer's `write_elementwise`).
            Op::Iota { .. }
            | Op::Full(_)
            | Op::Zeros
            | Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Cast(_)
            | Op::Bitcast(_)
            | Op::Broadcast(_)
            | Op::Reshape(_) => {
                let linear = matches!(s.op, Op::Reshape(_));
                let shared = operands(&s.op).iter().any(|o| self.shared(o, &res, linear));
                if res.is_empty() {
                    if shared {
                        self.reads(n, Site::Reads, true);
                        self.broadcast(n);
                    }
                    return;
                }
                let x = plan.id(dst);
                if plan.inlined.contains(x) && !plan.publish.contains(x) && !shared {
                    // Computed where it is read.
                    return;
                }
                self.reads(n, Site::Reads, shared);
                self.defined(dst);
            }
        }
    }
}

/// The operands of an elementwise or creating operation, in the writer's order.
fn operands(op: &Op) -> Vec<&Operand> {
    match op {
        Op::Unary(_, a) | Op::Cast(a) | Op::Bitcast(a) | Op::Broadcast(a) | Op::Reshape(a) => vec![a],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) => vec![a, b],
        Op::Select(c, a, b) => vec![c, a, b],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Strategy;
    use super::super::tests::planned;
    use super::*;

    /// Where the barriers of a small kernel go, worked out by hand: a transpose reads the
    /// published `%x` (#1), a load of the `out` array stored to (#3), a store after that load
    /// (#5); nothing before the first store, which follows only reads of its own elements.
    #[test]
    fn barriers_stand_where_a_publication_store_or_load_meets_another_invocations_access() {
        let text = "kernel k\n  in  x: f32[8, 8]\n  out o: f32[8, 8]\n{\n  %x = load x\n  %t = transpose %x perm (1, 0)\n  store o, %t\n  %y = load o\n  %z = add %y, 1.0\n  store o, %z\n}\n";
        let p = planned(text, Strategy::Cpu);
        let points: Vec<(usize, Site, Barrier)> = p.meetings.points().collect();
        assert_eq!(
            points,
            [(1, Site::Reads, Barrier::Storage), (3, Site::RefLoad, Barrier::Storage), (5, Site::Store, Barrier::Storage)]
        );
        assert!(!p.meetings.program_top() && !p.meetings.step_top());
    }
}
