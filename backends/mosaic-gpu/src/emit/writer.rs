//! The `Writer`: the state of one kernel's emission and the primitives every other file writes
//! with. Virtual registers (`%r` 32-bit, `%rd` 64-bit, `%h` 16-bit, `%p` predicates) and labels
//! are numbered within the statement that makes them ([`Namer`]: `%r_m_3` is the fourth 32-bit
//! register of the statement defining `%m`), so a change to one statement renames nothing in
//! another; `header.rs` declares each statement's. The warpgroup's
//! element loops (`each`, `count`) and its barriers live here too: a barrier is written only
//! where the plan places one ([`crate::lower::meetings`]).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::limits::THREADS;
use crate::lower::KernelPlan;
use crate::lower::meetings::At;
use tessel_plugin_api::ir::ValueMap;

/// One kernel's emission: the plan, the text so far and the registers that name things in it.
pub(super) struct Writer<'p> {
    pub(super) plan: &'p KernelPlan,
    pub(super) out: String,
    /// Register and label names, by statement.
    pub(super) names: Namer,
    /// The thread's index in its warpgroup (0..128).
    pub(super) tid: String,
    /// The thread's warpgroup: the thread axis coordinate and its named barrier.
    pub(super) warpgroup: String,
    /// The CTA's workspace region (its values, and its scratch where that is not in shared
    /// memory alone).
    pub(super) workspace: String,
    /// The CTA's scratch: in the workspace, or the dynamic shared memory
    /// ([`crate::lower::KernelPlan::scratch_shared`]).
    pub(super) scratch: String,
    /// This warpgroup's values.
    pub(super) values: String,
    /// Pointer register of each `in`/`out` argument.
    pub(super) args: Vec<(String, String)>,
    /// Coordinate register of each grid axis.
    pub(super) coords: Vec<String>,
    /// Element origin registers of each argument's block.
    pub(super) origins: Vec<(String, Vec<String>)>,
    /// The next statement's number, and the number of the one being written (as
    /// [`crate::lower::meetings`] numbers them).
    pub(super) next_stmt: usize,
    pub(super) stmt: usize,
    /// Values that live in registers: element `t + 128 j` of such a value is register `j` of
    /// thread `t` (see [`crate::lower::in_registers`]).
    pub(super) in_registers: ValueMap<Vec<String>>,
    /// Whether the next element loop touches a value in registers, so must be unrolled.
    pub(super) unroll: bool,
    /// Inside an unrolled element loop: the element register and its `j`.
    pub(super) element: Option<(String, usize)>,
    /// The kernel's barrier arrays, once made (`barriers.rs`).
    pub(super) mbarriers: Vec<Mbarriers>,
}

/// One barrier array of the concurrent model (`barriers.rs`): its first mbarrier's address
/// register and the register of the thread's parity bits.
pub(super) struct Mbarriers {
    pub(super) name: String,
    pub(super) first: String,
    pub(super) parity: String,
}

/// What a name counts: a register class, or labels.
#[derive(Clone, Copy)]
pub(super) enum Class {
    Pred,
    B16,
    B32,
    B64,
    Label,
}

impl Class {
    /// The register class's PTX type and name prefix (`None` for labels).
    pub(super) fn register(self) -> Option<(&'static str, &'static str)> {
        match self {
            Class::Pred => Some((".pred", "%p")),
            Class::B16 => Some((".b16", "%h")),
            Class::B32 => Some((".b32", "%r")),
            Class::B64 => Some((".b64", "%rd")),
            Class::Label => None,
        }
    }

    pub(super) const ALL: [Class; 5] = [Class::Pred, Class::B16, Class::B32, Class::B64, Class::Label];
}

/// Names numbered within a scope: the kernel's own code (`k`), or a statement (named by its
/// first result, which the verifier makes unique; a statement without results by its place
/// among its parent's: `k_s2`). Registers are `%r_SCOPE_N` and declared per scope.
#[derive(Default)]
pub(super) struct Namer {
    /// The current scope; empty for the kernel's own code.
    scope: String,
    /// Per scope, in first use: the count of each [`Class`].
    counts: Vec<(String, [u32; 5])>,
    at: HashMap<String, usize>,
    /// The current scope's place in `counts`, once looked up (a kernel names tens of thousands
    /// of registers, and a scope changes only at a statement with a body).
    current: Option<usize>,
    /// Result-less statements met so far, by parent scope.
    anonymous: HashMap<String, u32>,
}

impl Namer {
    fn scope(&self) -> &str {
        if self.scope.is_empty() { "k" } else { &self.scope }
    }

    /// The current scope's place in `counts`.
    fn slot(&mut self) -> usize {
        if let Some(i) = self.current {
            return i;
        }
        let scope = self.scope().to_string();
        let i = match self.at.get(&scope) {
            Some(&i) => i,
            None => {
                self.counts.push((scope.clone(), [0; 5]));
                self.at.insert(scope, self.counts.len() - 1);
                self.counts.len() - 1
            }
        };
        self.current = Some(i);
        i
    }

    /// The scope and the next number of `class` in it.
    fn count(&mut self, class: Class) -> (&str, u32) {
        let i = self.slot();
        let (scope, counts) = &mut self.counts[i];
        counts[class as usize] += 1;
        (scope, counts[class as usize] - 1)
    }

    /// A fresh register of `class`.
    fn next(&mut self, class: Class) -> String {
        let (_, prefix) = class.register().expect("a register class");
        let (scope, n) = self.count(class);
        format!("{prefix}_{scope}_{n}")
    }

    /// Enters the scope of statement `s`; returns the scope to go back to ([`Namer::leave`]).
    pub(super) fn enter(&mut self, s: &tessel_plugin_api::ir::Stmt) -> String {
        let parent = self.scope().to_string();
        let scope = match s.results.first() {
            Some(r) => r.clone(),
            None => {
                let k = self.anonymous.entry(parent.clone()).or_insert(0);
                *k += 1;
                format!("{parent}_s{}", *k - 1)
            }
        };
        self.current = None;
        std::mem::replace(&mut self.scope, scope)
    }

    pub(super) fn leave(&mut self, back: String) {
        self.current = None;
        self.scope = back;
    }

    /// The declarations of every register used: `.reg .b32 %r_m_<4>;`, by scope in first use.
    pub(super) fn declarations(&self) -> String {
        let mut out = String::new();
        for (scope, counts) in &self.counts {
            for class in Class::ALL {
                if let (Some((ty, prefix)), n @ 1..) = (class.register(), counts[class as usize]) {
                    let _ = writeln!(out, "\t.reg {ty} {prefix}_{scope}_<{n}>;");
                }
            }
        }
        out
    }
}

impl<'p> Writer<'p> {
    pub(super) fn new(plan: &'p KernelPlan) -> Writer<'p> {
        Writer {
            plan,
            out: String::new(),
            names: Namer::default(),
            tid: String::new(),
            warpgroup: String::new(),
            workspace: String::new(),
            scratch: String::new(),
            values: String::new(),
            args: Vec::new(),
            coords: Vec::new(),
            origins: Vec::new(),
            next_stmt: 0,
            stmt: 0,
            in_registers: ValueMap::new(),
            unroll: false,
            element: None,
            mbarriers: Vec::new(),
        }
    }

    pub(super) fn r(&mut self) -> String {
        self.names.next(Class::B32)
    }

    pub(super) fn rd(&mut self) -> String {
        self.names.next(Class::B64)
    }

    pub(super) fn h(&mut self) -> String {
        self.names.next(Class::B16)
    }

    pub(super) fn p(&mut self) -> String {
        self.names.next(Class::Pred)
    }

    pub(super) fn label(&mut self, what: &str) -> String {
        let (scope, n) = self.names.count(Class::Label);
        format!("$L_{scope}_{what}_{n}")
    }

    pub(super) fn ins(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.out, "\t{};", s.as_ref());
    }

    /// [`Writer::ins`] of formatted text, written straight into the output (no `String` an
    /// instruction: a kernel has tens of thousands).
    pub(super) fn insf(&mut self, a: std::fmt::Arguments<'_>) {
        let _ = writeln!(self.out, "\t{a};");
    }

    pub(super) fn place_label(&mut self, l: &str) {
        let _ = writeln!(self.out, "{l}:");
    }

    pub(super) fn comment(&mut self, s: &str) {
        let _ = writeln!(self.out, "\t// {s}");
    }

    /// A 32-bit register holding `imm`.
    pub(super) fn imm(&mut self, imm: u32) -> String {
        let r = self.r();
        self.insf(format_args!("mov.b32 {r}, {imm}"));
        r
    }

    /// A loop of the warpgroup's threads over `n` elements: thread `t` takes elements `t`,
    /// `t + 128`, ... `f` writes one element `e`. Barriers come from [`Writer::sync`].
    pub(super) fn each(&mut self, n: usize, f: impl Fn(&mut Self, &str)) {
        let tid = self.tid.clone();
        if !std::mem::take(&mut self.unroll) {
            return self.count(&tid, n, THREADS, false, ("each", "done"), f);
        }
        // Unrolled, so that element `t + 128 j` is register `j` of a value in registers.
        for j in 0..n.div_ceil(THREADS as usize) {
            let e = self.r();
            self.insf(format_args!("add.u32 {e}, {tid}, {}", j * THREADS as usize));
            let skip = ((j + 1) * THREADS as usize > n).then(|| self.label("past"));
            if let Some(skip) = &skip {
                let past = self.p();
                self.insf(format_args!("setp.ge.u32 {past}, {e}, {n}"));
                self.insf(format_args!("@{past} bra {skip}"));
            }
            self.element = Some((e.clone(), j));
            f(self, &e);
            self.element = None;
            if let Some(skip) = skip {
                self.place_label(&skip);
            }
        }
    }

    /// A counted loop: `i` from `from` while below `below`, by `by` (an immediate or a
    /// register); `uniform` when the threads of a warp all take the same branches (`bra.uni`).
    /// `labels` are the loop's label stems.
    pub(super) fn count(
        &mut self,
        from: &str,
        below: usize,
        by: impl std::fmt::Display,
        uniform: bool,
        labels: (&str, &str),
        body: impl FnOnce(&mut Self, &str),
    ) {
        let i = self.r();
        self.insf(format_args!("mov.u32 {i}, {from}"));
        let (top, end) = (self.label(labels.0), self.label(labels.1));
        self.place_label(&top);
        let done = self.p();
        let bra = if uniform { "bra.uni" } else { "bra" };
        self.insf(format_args!("setp.ge.u32 {done}, {i}, {below}"));
        self.insf(format_args!("@{done} {bra} {end}"));
        body(self, &i);
        self.insf(format_args!("add.u32 {i}, {i}, {by}"));
        self.insf(format_args!("{bra} {top}"));
        self.place_label(&end);
    }

    /// The warpgroup's barrier at `at` of statement `#stmt`, where the plan places one
    /// ([`crate::lower::meetings`]).
    pub(super) fn meet(&mut self, stmt: usize, at: At) {
        if self.plan.meetings.at(stmt, at) {
            self.barrier();
        }
    }

    /// The barrier of the operation being written, which is itself a meeting (`arrive`, a copy
    /// by TMA, `wait_copies`): where the plan places it.
    pub(super) fn meet_in_op(&mut self) {
        self.meet(self.stmt, At::Op);
    }

    /// The warpgroup's barrier: its threads wait for each other.
    pub(super) fn barrier(&mut self) {
        if self.plan.warpgroups == 1 {
            self.ins("bar.sync 0");
        } else {
            // Each warpgroup synchronises its own 128 threads (named barrier = warpgroup).
            let wg = self.warpgroup.clone();
            self.insf(format_args!("bar.sync {wg}, {THREADS}"));
        }
    }
}
