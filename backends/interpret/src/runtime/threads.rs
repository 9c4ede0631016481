//! Programs of the concurrent model (docs/language.md, "Threads, barriers and asynchronous
//! operations"): a program's threads, their barriers, and the checks that make a run of one
//! schedule stand for every schedule.
//!
//! **Schedule.** Each thread of a program is an OS thread, but only the one holding the
//! program's baton runs: it runs until it waits for a barrier phase that has not completed, or
//! ends; then the baton goes to the next thread in order (wrapping) that can run. So a launch
//! follows one schedule whatever the machine, and where no thread can run while some have not
//! ended, the barriers they wait on can never complete: a deadlock, reported naming each wait.
//! Asynchronous copies and products do their reads and writes where they are issued.
//!
//! **Checks.** Every access of an output or scratch element, by a thread's `load` or `store` or
//! by an asynchronous copy or product, is checked against the accesses of that element before it:
//! two accesses conflict where one writes, and must be ordered by happens-before, else the run
//! stops with a data race naming both statements. Happens-before is tracked with vector clocks
//! over the threads; each asynchronous operation is an agent of its own, ordered after what its
//! thread did before issuing it, and before what a thread does once it has seen it complete (a
//! `wait` on the barrier phase it arrived on, `wait_copies`, `mma_wait`); a thread's products on
//! one accumulator run in order. So a race is found whatever the schedule that would show it.
//! Operations complete in order along **channels** (a thread's products; its copies without a
//! barrier, their reads and their writes; its copies arriving on one barrier), so what a thread
//! has seen complete is one counter per channel, joined as its clock is.
//! Also checked: an asynchronous read of scratch that a thread stored without a `fence` after
//! it, and a barrier that completes a phase twice ahead of a thread that waits on it (its next
//! `wait` would take the later phase for the one it waits for, as a hardware barrier's phase
//! parity does).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Unwinds a thread out of its statements once its program has failed.
pub(super) struct Abort;

/// A thread's or an operation's knowledge: the threads' clocks it has seen, how far along each
/// channel it has seen operations complete, and the threads' clocks that a `fence` it has seen
/// covered (a store before such a fence is seen by asynchronous copies and products after it).
#[derive(Clone, Debug, Default)]
struct Clock {
    vc: Vec<u32>,
    seen: Vec<u32>,
    fenced: Vec<u32>,
}

impl Clock {
    fn join(&mut self, other: &Clock) {
        for (a, b) in self.vc.iter_mut().zip(&other.vc) {
            *a = (*a).max(*b);
        }
        for (a, b) in self.fenced.iter_mut().zip(&other.fenced) {
            *a = (*a).max(*b);
        }
        for (a, b) in self.seen.iter_mut().zip(&other.seen) {
            *a = (*a).max(*b);
        }
    }
}

/// Where an asynchronous operation completes, in order with the others of its channel.
#[derive(Clone, Copy)]
enum Channel {
    /// A thread's products.
    Mma,
    /// The reads of a thread's copies without a barrier.
    BulkRead,
    /// The writes of a thread's copies without a barrier.
    BulkWrite,
    /// A thread's copies arriving on barrier `b`.
    Barrier(usize),
}

/// The number of channel `which` of thread `t`, of a program with `barriers` barriers.
fn channel(t: usize, barriers: usize, which: Channel) -> usize {
    t * (3 + barriers)
        + match which {
            Channel::Mma => 0,
            Channel::BulkRead => 1,
            Channel::BulkWrite => 2,
            Channel::Barrier(b) => 3 + b,
        }
}

/// Who made an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    /// Thread `t` at its own clock `epoch`.
    Thread { t: usize, epoch: u32 },
    /// Asynchronous operation number `n`.
    Op(usize),
}

#[derive(Clone, Copy, Debug)]
struct Access {
    who: Who,
    stmt: usize,
}

/// The accesses of one element that later ones are checked against.
#[derive(Default)]
struct Cell {
    write: Option<Access>,
    reads: Vec<Access>,
    /// The thread that last stored it and its clock then (a store, not an asynchronous write).
    stored: Option<(usize, u32)>,
}

/// What part of an asynchronous statement an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A copy's reads of its source.
    CopyRead,
    /// A copy's writes of its destination.
    CopyWrite,
    /// An `mma_async`.
    Mma,
}

struct Op {
    issuer: usize,
    clock: Clock,
    kind: Kind,
    stmt: usize,
    /// The barrier a copy arrives on.
    barrier: Option<usize>,
    /// Where it completes: seen by whoever has seen `seq` along `channel`.
    channel: usize,
    seq: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ready,
    /// Waiting for phase `phase` of barrier `barrier`, at statement `stmt`.
    Blocked {
        barrier: usize,
        phase: u64,
        stmt: usize,
    },
    Done,
}

struct Thread {
    clock: Clock,
    status: Status,
    /// Waits made on each barrier.
    waits: HashMap<usize, u64>,
    /// Groups of copies without a barrier committed, and the read parts of those not yet seen
    /// read (committed or open), for the end's check.
    committed: u32,
    unread: Vec<usize>,
    /// Products issued.
    mmas: u32,
    /// Copies issued on each barrier.
    arrived: Vec<u32>,
}

struct Barrier {
    arrivals: usize,
    count: usize,
    pending: Clock,
    /// The knowledge released into each completed phase.
    completed: Vec<Clock>,
}

struct State {
    running: usize,
    threads: Vec<Thread>,
    barriers: Vec<Barrier>,
    ops: Vec<Op>,
    /// Per argument (by position), per flat element, made on the first access.
    cells: Vec<Vec<Cell>>,
    failure: Option<String>,
}

/// One program's threads and barriers, shared by the threads' states.
pub(super) struct Shared<'p> {
    state: Mutex<State>,
    turn: Condvar,
    /// How each checked statement is named (`Program::stmts`).
    stmts: &'p [String],
    /// Each thread's name in messages: `thread wg=1`, with the program's point where the grid
    /// has other axes.
    names: Vec<String>,
    /// Each argument's name, shape and whether it is scratch (whose stores an asynchronous
    /// operation sees only through a `fence`).
    args: Vec<(String, Vec<usize>, bool)>,
    /// Each barrier's name in messages: `full[1]`.
    barrier_names: Vec<String>,
}

/// An access to check: which argument, which elements, read or written.
pub(super) struct Touch<'e> {
    pub(super) mem: usize,
    pub(super) elements: &'e [usize],
    pub(super) write: bool,
}

impl<'p> Shared<'p> {
    /// A program of `names.len()` threads with barriers of `(count, arrivals)` per declaration.
    pub(super) fn new(
        names: Vec<String>,
        barriers: &[(String, usize, usize)],
        args: Vec<(String, Vec<usize>, bool)>,
        stmts: &'p [String],
    ) -> Shared<'p> {
        let n = names.len();
        let nb: usize = barriers.iter().map(|(_, count, _)| count).sum();
        let channels = n * (3 + nb);
        let clock = |t: Option<usize>| Clock {
            vc: (0..n).map(|u| u32::from(Some(u) == t)).collect(),
            seen: vec![0; channels],
            fenced: vec![0; n],
        };
        let threads = (0..n)
            .map(|t| Thread {
                clock: clock(Some(t)),
                status: Status::Ready,
                waits: HashMap::new(),
                committed: 0,
                unread: Vec::new(),
                mmas: 0,
                arrived: vec![0; nb],
            })
            .collect();
        let mut list = Vec::new();
        let mut barrier_names = Vec::new();
        for (name, count, arrivals) in barriers {
            for k in 0..*count {
                list.push(Barrier { arrivals: *arrivals, count: 0, pending: clock(None), completed: Vec::new() });
                barrier_names.push(format!("{name}[{k}]"));
            }
        }
        let cells = args.iter().map(|_| Vec::new()).collect();
        Shared {
            state: Mutex::new(State { running: 0, threads, barriers: list, ops: Vec::new(), cells, failure: None }),
            turn: Condvar::new(),
            stmts,
            names,
            args,
            barrier_names,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The program's failure, once it has one.
    pub(super) fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    /// Blocks thread `t` until it holds the baton; unwinds ([`Abort`]) once the program failed.
    pub(super) fn begin(&self, t: usize) {
        let st = self.lock();
        drop(self.until_turn(st, t));
    }

    fn until_turn<'g>(&'g self, mut st: MutexGuard<'g, State>, t: usize) -> MutexGuard<'g, State> {
        while st.running != t && st.failure.is_none() {
            st = self.turn.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if st.failure.is_some() {
            drop(st);
            std::panic::resume_unwind(Box::new(Abort));
        }
        st
    }

    /// Thread `t` has run its last statement: a copy without a barrier must have read its
    /// source by then (the scratch it reads is gone with the program; its writes may land later).
    pub(super) fn finish(&self, t: usize) {
        let mut st = self.lock();
        let th = &st.threads[t];
        let unread = th.unread.iter().copied().find(|&o| th.clock.seen[st.ops[o].channel] < st.ops[o].seq);
        if let Some(o) = unread {
            let m = format!(
                "ends with the asynchronous copy at {} ({}) still reading its source: the scratch it reads is gone with the program\n  wait for it before the end: `commit_copies`, then `wait_copies 0 reads` (Pallas's `plgpu.wait_smem_to_gmem(0, wait_read_only=True)`)",
                self.stmts[st.ops[o].stmt],
                self.names[t]
            );
            self.fail(&mut st, m);
        }
    }

    /// Thread `t` has ended (or unwound): the baton passes on.
    pub(super) fn end(&self, t: usize) {
        let mut st = self.lock();
        st.threads[t].status = Status::Done;
        if st.running == t {
            self.pass(&mut st, t);
        }
    }

    /// Stops the program with `message`, from outside its statements (a thread panicked).
    pub(super) fn stop(&self, message: String) {
        let mut st = self.lock();
        st.failure.get_or_insert(message);
        self.turn.notify_all();
    }

    /// Stops the program with `message` (a thread's statement failed in another way).
    fn fail(&self, st: &mut State, message: String) -> ! {
        if st.failure.is_none() {
            st.failure = Some(message);
        }
        self.turn.notify_all();
        std::panic::resume_unwind(Box::new(Abort));
    }

    /// Gives the baton to the next thread after `t` that can run; where none can and some have
    /// not ended, the program is deadlocked.
    fn pass(&self, st: &mut State, t: usize) {
        if st.failure.is_some() {
            // Every thread unwinds as it takes its turn.
            self.turn.notify_all();
            return;
        }
        let n = st.threads.len();
        let can_run = |st: &State, u: usize| match st.threads[u].status {
            Status::Ready => true,
            Status::Blocked { barrier, phase, .. } => st.barriers[barrier].completed.len() as u64 >= phase,
            Status::Done => false,
        };
        match (1..=n).map(|k| (t + k) % n).find(|&u| can_run(st, u)) {
            Some(u) => st.running = u,
            None if st.threads.iter().all(|th| th.status == Status::Done) => {}
            None => {
                let waits: Vec<String> = (0..n)
                    .filter_map(|u| match st.threads[u].status {
                        Status::Blocked { barrier, phase, stmt } => Some(format!(
                            "{} waits at {} for phase {phase} of {}, which has completed {} ({} of {} arrivals made in the next)",
                            self.names[u],
                            self.stmts[stmt],
                            self.barrier_names[barrier],
                            st.barriers[barrier].completed.len(),
                            st.barriers[barrier].count,
                            st.barriers[barrier].arrivals
                        )),
                        _ => None,
                    })
                    .collect();
                st.failure = Some(format!(
                    "deadlocks: no thread can run, and the barriers they wait on can never complete: {}\n  make every phase a thread waits for complete: as many `arrive`s (and copies that `arrive`) as the barrier's `arrivals`, before the waits that need them",
                    waits.join("; ")
                ));
            }
        }
        self.turn.notify_all();
    }

    /// `arrive B[k]` by thread `t`.
    pub(super) fn arrive(&self, t: usize, barrier: usize, stmt: usize) {
        let mut st = self.lock();
        let clock = st.threads[t].clock.clone();
        st.threads[t].clock.vc[t] += 1;
        self.arrival(&mut st, barrier, &clock, stmt);
    }

    /// One arrival on `barrier` carrying `clock`; completes a phase at the last of its arrivals.
    fn arrival(&self, st: &mut State, barrier: usize, clock: &Clock, stmt: usize) {
        let b = &mut st.barriers[barrier];
        b.pending.join(clock);
        b.count += 1;
        if b.count < b.arrivals {
            return;
        }
        b.count = 0;
        let empty = Clock { vc: vec![0; clock.vc.len()], seen: vec![0; clock.seen.len()], fenced: vec![0; clock.fenced.len()] };
        let released = std::mem::replace(&mut b.pending, empty);
        b.completed.push(released);
        let phase = b.completed.len() as u64;
        // A thread still waiting for an earlier phase would find this one: on a GPU it waits
        // for a phase's parity, which is this phase's too.
        let behind = st.threads.iter().position(|th| matches!(th.status, Status::Blocked { barrier: b, phase: p, .. } if b == barrier && p < phase));
        if let Some(u) = behind {
            let m = self.missed(barrier, phase, u, st.threads[u].waits[&barrier], stmt);
            self.fail(st, m);
        }
    }

    /// The message of a barrier completing `phase` while thread `u` has yet to see its `waits`-th.
    fn missed(&self, barrier: usize, phase: u64, u: usize, waits: u64, stmt: usize) -> String {
        format!(
            "lets {} complete phase {phase} at {} while {} waits for phase {waits}: a GPU's barrier wait tells phases apart by their parity, so it would take the later phase for the one it waits for\n  let each thread see every phase before the barrier completes the next: a barrier per stage of a pipeline, released by the threads that wait on it",
            self.barrier_names[barrier],
            self.stmts[stmt],
            self.names[u],
        )
    }

    /// `wait B[k]` by thread `t`: its next phase of the barrier, blocking until it completes.
    pub(super) fn wait(&self, t: usize, barrier: usize, stmt: usize) {
        let mut st = self.lock();
        let phase = {
            let w = st.threads[t].waits.entry(barrier).or_insert(0);
            *w += 1;
            *w
        };
        let completed = st.barriers[barrier].completed.len() as u64;
        if completed > phase {
            let m = self.missed(barrier, completed, t, phase, stmt);
            self.fail(&mut st, m);
        }
        if completed < phase {
            st.threads[t].status = Status::Blocked { barrier, phase, stmt };
            self.pass(&mut st, t);
            st = self.until_turn(st, t);
            st.threads[t].status = Status::Ready;
        }
        let released = st.barriers[barrier].completed[phase as usize - 1].clone();
        st.threads[t].clock.join(&released);
    }

    /// An index `k` outside a barrier array of `count` at statement `stmt`: the program stops.
    pub(super) fn out_of_range(&self, stmt: usize, k: i64, count: usize) -> ! {
        let mut st = self.lock();
        let m = format!(
            "indexes barrier {k} of an array of {count} at {}\n  index the barriers of an array from 0 to {}",
            self.stmts[stmt],
            count.saturating_sub(1)
        );
        self.fail(&mut st, m)
    }

    /// `fence` by thread `t`: every store that happens before it is seen by the asynchronous
    /// operations that happen after it.
    pub(super) fn fence(&self, t: usize) {
        let mut st = self.lock();
        let clock = &mut st.threads[t].clock;
        clock.fenced = clock.vc.clone();
        clock.vc[t] += 1;
    }

    /// A `load` or `store` by thread `t`.
    pub(super) fn access(&self, t: usize, touch: Touch<'_>, stmt: usize) {
        let mut st = self.lock();
        let who = Who::Thread { t, epoch: st.threads[t].clock.vc[t] };
        self.check(&mut st, Access { who, stmt }, &touch);
    }

    /// An asynchronous copy issued by thread `t`: its reads and writes, checked, and its arrival
    /// on `arrive` or its place in the thread's open group.
    pub(super) fn copy(&self, t: usize, src: Touch<'_>, dst: Touch<'_>, arrive: Option<usize>, stmt: usize) {
        let mut st = self.lock();
        let nb = st.barriers.len();
        let clock = st.threads[t].clock.clone();
        st.threads[t].clock.vc[t] += 1;
        let read = st.ops.len();
        let th = &mut st.threads[t];
        let (channels, seq) = match arrive {
            Some(b) => {
                th.arrived[b] += 1;
                let c = channel(t, nb, Channel::Barrier(b));
                ([c, c], th.arrived[b])
            }
            None => {
                th.unread.push(read);
                ([channel(t, nb, Channel::BulkRead), channel(t, nb, Channel::BulkWrite)], th.committed + 1)
            }
        };
        for (kind, channel) in [(Kind::CopyRead, channels[0]), (Kind::CopyWrite, channels[1])] {
            st.ops.push(Op { issuer: t, clock: clock.clone(), kind, stmt, barrier: arrive, channel, seq });
        }
        self.unfenced(&mut st, t, read, &src, stmt);
        self.unfenced(&mut st, t, read + 1, &dst, stmt);
        self.check(&mut st, Access { who: Who::Op(read), stmt }, &src);
        self.check(&mut st, Access { who: Who::Op(read + 1), stmt }, &dst);
        if let Some(b) = arrive {
            let mut landed = clock;
            landed.seen[channels[0]] = landed.seen[channels[0]].max(seq);
            self.arrival(&mut st, b, &landed, stmt);
        }
    }

    /// `commit_copies` by thread `t`: its copies since the last commit are one group (an empty
    /// one where there are none, as PTX's `cp.async.bulk.commit_group` makes).
    pub(super) fn commit(&self, t: usize) {
        self.lock().threads[t].committed += 1;
    }

    /// `wait_copies N (reads)` by thread `t`.
    pub(super) fn wait_copies(&self, t: usize, pending: usize, reads: bool) {
        let mut st = self.lock();
        let nb = st.barriers.len();
        let State { threads, ops, .. } = &mut *st;
        let th = &mut threads[t];
        let done = th.committed.saturating_sub(u32::try_from(pending).unwrap_or(u32::MAX));
        let (r, w) = (channel(t, nb, Channel::BulkRead), channel(t, nb, Channel::BulkWrite));
        th.clock.seen[r] = th.clock.seen[r].max(done);
        if !reads {
            th.clock.seen[w] = th.clock.seen[w].max(done);
        }
        let seen = th.clock.seen[r];
        th.unread.retain(|&o| ops[o].seq > seen);
    }

    /// An `mma_async` by thread `t`: reads of `a` and `b`, a read and write of `acc`.
    pub(super) fn mma(&self, t: usize, operands: &[Touch<'_>], acc: Touch<'_>, stmt: usize) {
        let mut st = self.lock();
        let nb = st.barriers.len();
        let clock = st.threads[t].clock.clone();
        st.threads[t].clock.vc[t] += 1;
        st.threads[t].mmas += 1;
        let (op, seq) = (st.ops.len(), st.threads[t].mmas);
        st.ops.push(Op { issuer: t, clock, kind: Kind::Mma, stmt, barrier: None, channel: channel(t, nb, Channel::Mma), seq });
        for x in operands {
            self.unfenced(&mut st, t, op, x, stmt);
            self.check(&mut st, Access { who: Who::Op(op), stmt }, x);
        }
        let read = Touch { write: false, ..acc };
        self.check(&mut st, Access { who: Who::Op(op), stmt }, &read);
        self.check(&mut st, Access { who: Who::Op(op), stmt }, &acc);
    }

    /// `mma_wait N` by thread `t`.
    pub(super) fn mma_wait(&self, t: usize, pending: usize) {
        let mut st = self.lock();
        let c = channel(t, st.barriers.len(), Channel::Mma);
        let th = &mut st.threads[t];
        let done = th.mmas.saturating_sub(u32::try_from(pending).unwrap_or(u32::MAX));
        th.clock.seen[c] = th.clock.seen[c].max(done);
    }

    /// Whether access `a` happens before `who`'s.
    fn ordered(st: &State, a: &Access, who: Who) -> bool {
        match (a.who, who) {
            (Who::Thread { t, epoch }, Who::Thread { t: u, .. }) => t == u || st.threads[u].clock.vc[t] >= epoch,
            (Who::Thread { t, epoch }, Who::Op(x)) => st.ops[x].clock.vc[t] >= epoch,
            (Who::Op(o), Who::Thread { t: u, .. }) => st.threads[u].clock.seen[st.ops[o].channel] >= st.ops[o].seq,
            (Who::Op(o), Who::Op(x)) => {
                let (a, b) = (&st.ops[o], &st.ops[x]);
                // One copy's read and write parts; a thread's products, which run in order.
                let same_copy = a.stmt == b.stmt && a.issuer == b.issuer && a.kind != Kind::Mma && b.kind != Kind::Mma && a.kind != b.kind && o.abs_diff(x) == 1 && {
                    let first = if o < x { a } else { b };
                    first.kind == Kind::CopyRead
                };
                o == x
                    || same_copy
                    || b.clock.seen[a.channel] >= a.seq
                    || (a.kind == Kind::Mma && b.kind == Kind::Mma && a.issuer == b.issuer && o < x)
            }
        }
    }

    /// Checks `access` of `touch`'s elements against those before it, then records it.
    fn check(&self, st: &mut State, access: Access, touch: &Touch<'_>) {
        if st.cells[touch.mem].is_empty() {
            let n = self.args[touch.mem].1.iter().product::<usize>().max(1);
            st.cells[touch.mem] = (0..n).map(|_| Cell::default()).collect();
        }
        let stored = match access.who {
            Who::Thread { t, epoch } => Some((t, epoch)),
            Who::Op(_) => None,
        };
        for &e in touch.elements {
            let cell = &st.cells[touch.mem][e];
            let writes = cell.write.iter().map(|a| (*a, true));
            let reads = cell.reads.iter().filter(|_| touch.write).map(|a| (*a, false));
            if let Some((other, wrote)) = writes.chain(reads).find(|(a, _)| !Self::ordered(st, a, access.who)) {
                let m = self.race(st, (&other, wrote), &access, touch, e);
                self.fail(st, m);
            }
            let cell = &mut st.cells[touch.mem][e];
            if touch.write {
                cell.write = Some(access);
                cell.reads.clear();
                cell.stored = stored;
            } else {
                cell.reads.retain(|r| !same_agent(r.who, access.who));
                cell.reads.push(access);
            }
        }
    }

    /// An asynchronous read or write, by operation `op` of thread `t`, of elements a thread
    /// stored with no `fence` between the store and the operation's issue.
    fn unfenced(&self, st: &mut State, t: usize, op: usize, touch: &Touch<'_>, stmt: usize) {
        if !self.args[touch.mem].2 {
            return;
        }
        for &e in touch.elements {
            let Some((u, epoch)) = st.cells[touch.mem].get(e).and_then(|c| c.stored) else { continue };
            if st.ops[op].clock.fenced[u] < epoch {
                let name = &self.args[touch.mem].0;
                let m = format!(
                    "{} `{name}` {} asynchronously at {} ({}) after {} stored it with no `fence` between: {}\n  write `fence` (Pallas's `plgpu.commit_smem()`) after the stores and before the asynchronous copy or product",
                    if touch.write { "writes" } else { "reads" },
                    self.element(touch.mem, e),
                    self.stmts[stmt],
                    self.names[t],
                    self.names[u],
                    if touch.write { "the asynchronous write may land before the store" } else { "the asynchronous read may not see the store" },
                );
                self.fail(st, m);
            }
        }
    }

    /// The message of a race between `earlier` (and whether it wrote) and `later` on element `e`.
    fn race(&self, st: &State, (earlier, wrote): (&Access, bool), later: &Access, touch: &Touch<'_>, e: usize) -> String {
        let name = &self.args[touch.mem].0;
        let describe = |a: &Access| match a.who {
            Who::Thread { t, .. } => format!("{} at {}", self.names[t], self.stmts[a.stmt]),
            Who::Op(o) => {
                let op = &st.ops[o];
                let what = match op.kind {
                    Kind::CopyRead | Kind::CopyWrite => "the asynchronous copy",
                    Kind::Mma => "the asynchronous mma",
                };
                format!("{what} issued by {} at {}", self.names[op.issuer], self.stmts[a.stmt])
            }
        };
        let hint = match (earlier.who, later.who) {
            (Who::Op(o), _) => match (st.ops[o].kind, st.ops[o].barrier) {
                (Kind::CopyWrite | Kind::CopyRead, Some(b)) => {
                    format!(
                        "wait for the copy to land (`wait {}` on its phase) before touching its regions",
                        self.barrier_names[b]
                    )
                }
                (Kind::CopyWrite, None) => {
                    "wait for the copy (`commit_copies`, then `wait_copies 0`) before touching its destination".to_string()
                }
                (Kind::CopyRead, None) => {
                    "wait until the copy has read its source (`wait_copies N reads`) before writing it".to_string()
                }
                (Kind::Mma, _) => {
                    "wait for the mma (`mma_wait N`) before touching its accumulator or overwriting its operands".to_string()
                }
            },
            (_, Who::Op(_)) => {
                "order the access before the asynchronous operation: `arrive` after it, `wait` on that phase before issuing"
                    .to_string()
            }
            _ => "order the two accesses through a barrier: `arrive` after the first, `wait` on that phase before the second"
                .to_string(),
        };
        format!(
            "has a data race on `{name}` {}: {} {} it, unordered with {}, which {} it\n  {hint}",
            self.element(touch.mem, e),
            describe(later),
            if touch.write { "writes" } else { "reads" },
            describe(earlier),
            if wrote { "wrote" } else { "read" },
        )
    }

    /// An element of argument `mem` by its index: `[3, 4]`.
    fn element(&self, mem: usize, flat: usize) -> String {
        let shape = &self.args[mem].1;
        let mut idx = vec![0; shape.len()];
        let mut rest = flat;
        for d in (0..shape.len()).rev() {
            idx[d] = rest % shape[d].max(1);
            rest /= shape[d].max(1);
        }
        format!("[{}]", idx.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
    }
}

/// Whether two accesses are by the same thread or operation (a later read replaces the earlier).
fn same_agent(a: Who, b: Who) -> bool {
    match (a, b) {
        (Who::Thread { t, .. }, Who::Thread { t: u, .. }) => t == u,
        (Who::Op(o), Who::Op(x)) => o == x,
        _ => false,
    }
}
