//! A planned kernel (`lower/`) written as WGSL. Pure: no device.
//!
//! The model. One program is one workgroup of `WG` invocations; a fixed number of workgroups
//! (at most 65,535, the smallest dispatch limit every adapter has) walk the parallel programs
//! with a stride, so any grid fits one 1-D dispatch. Inside a program the `seq` axes are a loop.
//!
//! Values. A scalar is a WGSL `let`/`var` that every invocation holds, with the same value in
//! each (so conditions and loop bounds are uniform and barriers may sit under them). A block value
//! is spread over the invocations as the plan's layout says (`Layout::group_of`: groups of `g`
//! adjacent elements, whole rows in the row layout), each keeping its elements in a private array
//! (of `vec4`s for rows of a multiple of 4). Elementwise operations on equal shapes read only their own
//! elements, need no memory and no barrier. An operation that reads other invocations' elements
//! (broadcasting, `transpose`, reductions, `dot`) reads them from the workgroup's region of a
//! storage workspace, where the value was *published* after it was made, behind a barrier.
//! Which values are published is found by emitting twice: the first pass records every
//! non-local read, the second writes the publications.
//!
//! Scalars that come from memory (a scalar `load`, a reduction to a scalar) are computed by
//! invocation 0 and shared with `workgroupUniformLoad`, so that they are uniform.
//!
//! Memory. Every array element takes 4 bytes on the device: `f16`/`bf16` are held as the `f32`
//! of their value (rounded after every operation, docs/language.md §8) and `bool` as `u32`.
//! Loads and stores check the array bounds and masks lane by lane (§5); scratch lives in the
//! workspace, zeroed once per program.
//!
//! The files. This one holds the entry point ([`lower`]), what it returns ([`Lowered`]) and the
//! writer's state (`Writer`); the writer's methods are spread over the others by what they
//! write, each an `impl Writer` block:
//! - `program.rs`: the loop over programs and `seq` steps, grid coordinates, block origins,
//!   resident outputs, statements by op, `when` and `for`;
//! - `layout.rs`: which invocation owns which element of a value, its private array, and the
//!   loops over its elements;
//! - `operands.rs`: how an operation reads each operand (`Read`);
//! - `share.rs`: values other invocations read: publication to the workspace, the barriers the
//!   plan places (`lower/meetings.rs`), uniform scalars;
//! - `ops.rs`: elementwise operations; `reduce.rs`: reductions; `dot.rs`: `dot`;
//! - `memory.rs`: loads and stores (bounds, masks, `vec4` accesses, blocks read where used);
//! - `helpers.rs` (and the WGSL files in `helpers/`): the helper functions a module calls;
//! - `header.rs`: the module around the body: its header comments, bindings, workgroup
//!   variables, helpers and entry point.
//!
//! The pure spellings of dtypes and literals are the crate's `conv.rs`; the limits its
//! `limits.rs`. The writer reads the plan (`lower/`); nothing there reads the writer.

mod dot;
mod elements;
mod header;
mod helpers;
mod layout;
mod memory;
mod operands;
mod ops;
mod program;
mod reduce;
mod share;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use tessel_plugin_api::ir::*;
use tessel_plugin_api::launch::LaunchAxis;

// The limits, public at the paths where they were first (`tessel_wgpu::emit::MAX_BLOCK_ELEMENTS`).
pub use crate::limits::{DTYPES, MAX_BLOCK_ELEMENTS, MAX_GROUPS, MAX_PROGRAMS, MAX_WORKGROUP, WORKSPACE_BUDGET};
use crate::lower::{KernelPlan, fully_written};

/// One kernel lowered to WGSL, with what the runtime needs to dispatch it.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The kernel name.
    pub name: String,
    /// The module.
    pub wgsl: String,
    /// blake3 of the module: the pipeline cache key.
    pub hash: [u8; 32],
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// Workgroups dispatched (`x`, `y`).
    pub groups: [u32; 2],
    /// Parallel programs.
    pub programs: u64,
    /// `u32` words of workspace per workgroup (0: no workspace binding).
    pub workspace_words: u64,
    /// The `in`/`out` arguments in binding order (binding `i` is `bindings[i]`); the workspace,
    /// if any, is the binding after them.
    pub bindings: Vec<(String, ParamKind)>,
    /// `in` arguments bound a second time, as `array<vec4<T>>`, after the workspace binding (or
    /// after `bindings` without one), in this order.
    pub views: Vec<String>,
    /// The outputs to zero before the dispatch: all but those the kernel provably overwrites
    /// whole before reading (see [`fully_written`]).
    pub zeroed: Vec<String>,
    /// The outputs held in the invocations' registers from the first `seq` step and written back
    /// whole after the last (the plan's resident blocks), which start as zeros there.
    pub resident: Vec<String>,
    /// Where the module checks the driver's loop budget ([`KernelPlan::loop_budget`]): the loop
    /// iterations that budget leaves the kernel. It binds a status word last, which a launch
    /// clears and reads back (nonzero: the loops were cut short).
    pub loop_check: Option<u64>,
}

/// Writes one planned kernel (`lower/`): its WGSL and its dispatch. Every decision is the
/// plan's, so this cannot fail.
pub fn lower(plan: &KernelPlan) -> Lowered {
    let k = plan.kernel.kernel();
    let mut w = Writer::new(plan);
    w.write_main();
    let zeroed: Vec<String> =
        k.params_of(ParamKind::Out).filter(|p| !fully_written(&plan.kernel, &plan.grid, p)).map(|p| p.name.clone()).collect();
    let views = w.views.iter().map(|&pi| k.params[pi].name.clone()).collect();
    let wgsl = w.finish(&zeroed);
    Lowered {
        name: k.name.clone(),
        hash: *blake3::hash(wgsl.as_bytes()).as_bytes(),
        wgsl,
        workgroup_size: plan.wg,
        groups: plan.groups,
        programs: plan.programs,
        workspace_words: plan.workspace_words,
        bindings: k.params.iter().filter(|p| p.kind != ParamKind::Scratch).map(|p| (p.name.clone(), p.kind)).collect(),
        views,
        zeroed,
        resident: k.params_of(ParamKind::Out).filter(|p| plan.resident.contains_key(&p.name)).map(|p| p.name.clone()).collect(),
        loop_check: plan.loop_budget.map(crate::lower::loop_room),
    }
}

/// How an operation reads one operand.
#[derive(Clone, Debug)]
enum Read {
    Lit(Literal),
    /// A scalar register.
    Scalar(String),
    /// The invocation's own element `k` of a private array.
    Own(String),
    /// In the row layout, element `k / len` of an `[R, 1]` value broadcast over rows of `len`.
    RowOwn(String, usize),
    /// A value computed where it is read ([`Writer::inlined`]), by name.
    Deferred(String),
    /// A block read from its buffer where it is used ([`KernelPlan::row_forwarded`]), by name.
    Row(String),
    /// From the workspace: the value's name, its shape, and whether the read follows the
    /// result's linear index (`reshape`) instead of numpy broadcasting.
    Shared {
        name: String,
        shape: Vec<usize>,
        linear: bool,
    },
}

/// An elementwise value computed where it is read: its operands' reads, their types, and the
/// element expression of the operands' expressions.
#[derive(Clone)]
struct Deferred<'k> {
    reads: Vec<Read>,
    tys: Vec<DType>,
    #[allow(clippy::type_complexity)]
    f: std::rc::Rc<dyn Fn(&mut Writer<'k>, &[String]) -> String>,
}

/// The writer's state: the text written so far, and what the module around it must declare.
struct Writer<'k> {
    v: &'k Verified,
    grid: &'k [LaunchAxis],
    plan: &'k KernelPlan,
    out: String,
    indent: usize,
    /// WGSL identifier of every IR value.
    idents: HashMap<String, String>,
    /// Temporaries are named by the statement being written (`t_NAME_K` for the `K`th of the
    /// one defining `%NAME`, `ts_store_o_K` for one defining nothing, `tK` outside any), so that
    /// a change to one statement renames no other statement's temporaries.
    tmp: u32,
    scope: String,
    /// How many statements defining nothing have taken each scope, to keep scopes apart.
    scopes_taken: HashMap<String, u32>,
    helpers: BTreeSet<&'static str>,
    /// The accurate maths functions the module calls, by name (`libm.rs`).
    libm: BTreeMap<&'static str, String>,
    uses_broadcast: bool,
    /// The next statement's number, and the number of the one being written (as
    /// [`crate::lower::meetings`] numbers them: where the plan's barriers stand).
    next_stmt: usize,
    stmt: usize,
    /// Words of the `var<workgroup>` arrays the staged `dot`s use (`tk_sa`, `tk_sb`): the most
    /// any one needs.
    staged: (usize, usize),
    /// The views ([`KernelPlan::views`]) the module reads (`a{i}v`, bound after the workspace).
    views: BTreeSet<usize>,
    /// Inside a loop over a quad value ([`Writer::quad_value`]): which of the four elements of
    /// quad `j` slot `k` is.
    quad_lane: Option<usize>,
    /// The values computed where they are read ([`KernelPlan::inlined`]) written so far.
    deferred: HashMap<String, Deferred<'k>>,
    /// The row-forwarded blocks the next [`Writer::each_sink`] reads, a `vec4` per quad read
    /// once at the quad's start; and those whose quad `j` is in `{id}_q` where the writer is.
    hoist: Vec<String>,
    hoisted: HashSet<String>,
}

impl<'k> Writer<'k> {
    fn new(plan: &'k KernelPlan) -> Writer<'k> {
        Writer {
            v: &plan.kernel,
            grid: &plan.grid,
            plan,
            out: String::new(),
            indent: 1,
            idents: HashMap::new(),
            tmp: 0,
            scope: String::new(),
            scopes_taken: HashMap::new(),
            helpers: BTreeSet::new(),
            libm: BTreeMap::new(),
            uses_broadcast: false,
            next_stmt: 0,
            stmt: 0,
            staged: (0, 0),
            views: BTreeSet::new(),
            quad_lane: None,
            deferred: HashMap::new(),
            hoist: Vec::new(),
            hoisted: HashSet::new(),
        }
    }

    fn line(&mut self, s: impl AsRef<str>) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(s.as_ref());
        self.out.push('\n');
    }

    fn open(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        self.line(if s.is_empty() { "{".to_string() } else { format!("{s} {{") });
        self.indent += 1;
    }

    fn close(&mut self) {
        self.indent -= 1;
        self.line("}");
    }

    fn t(&mut self) -> String {
        self.tmp += 1;
        if self.scope.is_empty() { format!("t{}", self.tmp) } else { format!("{}_{}", self.scope, self.tmp) }
    }

    /// Runs `f` with the temporaries named after statement `s` (see `Writer::tmp`); the outer
    /// statement's naming comes back after.
    fn scoped<T>(&mut self, s: &Stmt, f: impl FnOnce(&mut Self) -> T) -> T {
        let scope = match s.results.first() {
            // `v_NAME` gives `t_NAME`, a builder's `vnK` gives `tnK`: never a value's name.
            Some(r) => format!("t{}", &self.ident(r)[1..]),
            // `ts_store_o`, then `ts2_store_o`, ...: the count before the (underscore-free)
            // mnemonic, so that no argument's name can make another statement's scope.
            None => {
                let what = match &s.op {
                    Op::Store { dst, .. } => format!("{}_{dst}", s.op.mnemonic()),
                    op => op.mnemonic().to_string(),
                };
                let n = self.scopes_taken.entry(what.clone()).or_default();
                *n += 1;
                if *n == 1 { format!("ts_{what}") } else { format!("ts{n}_{what}") }
            }
        };
        let outer = (std::mem::replace(&mut self.scope, scope), std::mem::take(&mut self.tmp));
        let r = f(self);
        (self.scope, self.tmp) = outer;
        r
    }

    /// The WGSL name of IR value `name`: `v_` and the `.tk` name, so that editing one statement
    /// does not rename the others (a name only the builder could make gets a numbered one).
    fn ident(&mut self, name: &str) -> String {
        if let Some(id) = self.idents.get(name) {
            return id.clone();
        }
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let id = if plain { format!("v_{name}") } else { format!("vn{}", self.idents.len()) };
        self.idents.insert(name.to_string(), id.clone());
        id
    }

    fn ty(&self, name: &str) -> &'k Type {
        self.v.value_type(name)
    }
}
