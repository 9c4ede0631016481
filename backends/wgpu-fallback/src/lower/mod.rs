//! The wgpu lowering's decisions, made once per kernel before any WGSL is written: the
//! refusals, the strategy, how invocations own the elements of values (the layout), which outputs
//! stay in registers across `seq` steps, which loads are read straight from their buffers, which
//! values are computed where they are read, which `dot`s add into a resident output, which
//! arguments are bound as `vec4`s. The backend's `supports` makes the plan and its `compile`
//! hands it to `emit/`, which writes it. `values.rs` decides where values live and when they are
//! made; this file holds the plan, its layout and the refusals.

mod loops;
pub mod meetings;
pub mod print;
mod values;

pub(crate) use loops::room as loop_room;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessel_plugin_api::abi::{BackendError, ErrorKind};
use tessel_plugin_api::ir::analysis::{inside, resident};
use tessel_plugin_api::ir::*;
use tessel_plugin_api::launch::LaunchAxis;

use crate::error::Refusal;
use crate::limits::{
    MAX_BLOCK_ELEMENTS, MAX_GROUPS, MAX_PROGRAMS, MAX_STATEMENTS, MAX_STAGED_WORDS, MAX_STORAGE_BINDINGS, MAX_WORKGROUP, WORKSPACE_BUDGET,
};
use meetings::Meetings;
use values::{accumulating_dots, forwarded_loads, fused_reductions, inlined_values, row_forwarded};

/// How the lowering uses the adapter; the WGSL header names it. `TESSEL_WGPU_STRATEGY=cpu|gpu`
/// forces one (so the tests run both on one adapter), else the adapter's device type decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A CPU (software) adapter, where workgroup memory and barriers are pure cost: `dot`
    /// operands read straight from their buffers, reductions along rows by one invocation per
    /// row (the row layout).
    Cpu,
    /// A hardware adapter: `dot` operand tiles staged in `var<workgroup>` memory a few steps of
    /// the contraction at a time, more invocations per workgroup, no row layout.
    Gpu,
}

impl Strategy {
    /// Its name in `TESSEL_WGPU_STRATEGY` and in the WGSL header.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Cpu => "cpu",
            Strategy::Gpu => "gpu",
        }
    }

    /// The strategy `TESSEL_WGPU_STRATEGY` forces, if set: an unknown value is an error naming
    /// what would work.
    pub fn forced() -> Result<Option<Strategy>, BackendError> {
        match std::env::var("TESSEL_WGPU_STRATEGY") {
            Ok(v) if !v.is_empty() => Strategy::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// The strategy named `v`, or an error naming what would work.
    pub fn parse(v: &str) -> Result<Strategy, BackendError> {
        match v {
            "cpu" => Ok(Strategy::Cpu),
            "gpu" => Ok(Strategy::Gpu),
            _ => Err(BackendError::new(
                ErrorKind::InvalidInput,
                format!(
                    "TESSEL_WGPU_STRATEGY={v} is not a strategy of the wgpu backend\n  use cpu or gpu, or unset it to let the adapter decide"
                ),
            )),
        }
    }
}

/// What a plan is made for: the strategy, and the adapter's budget of loop iterations per
/// invocation where it has one (Mesa's llvmpipe: `loops.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub strategy: Strategy,
    pub loop_budget: Option<u64>,
}

impl From<Strategy> for Target {
    fn from(strategy: Strategy) -> Target {
        Target { strategy, loop_budget: None }
    }
}

/// One kernel's plan: what `emit/` writes, made in two phases, each an immutable value. The
/// first, [`Layout`], decides where each value lives and how it is read (the layout of elements
/// over invocations, residency, inlining, fusion); the [`survey`] of what the writer will do to
/// memory under that layout then decides the workgroup, the workspace and the dispatch, held
/// here beside it. The writer only reads the plan.
pub struct KernelPlan {
    /// The first phase: the layout of values. The plan reads as its fields (`Deref`).
    pub layout: Layout,
    /// Invocations per workgroup ([`workgroup_size`]).
    pub wg: u32,
    /// Block values read at elements other invocations own ([`Layout::crosses`], [`survey`]):
    /// each is published to the workgroup's region of the workspace after it is made.
    pub publish: ValueSet,
    /// The workspace of a workgroup, laid out here for the writer to read: each scratch buffer
    /// at a word offset (in declared order), then each published value (in the order they are
    /// made, by id), and the words in all.
    pub scratch_words: BTreeMap<String, u64>,
    pub published_words: ValueMap<u64>,
    pub workspace_words: u64,
    /// The dispatch (`x`, `y` workgroups), and whether each workgroup walks the programs with a
    /// stride (where one workgroup per program would not fit the workspace in a binding).
    pub groups: [u32; 2],
    pub strided: bool,
    /// Whether invocations share memory beyond their own elements (published values, scratch,
    /// outputs loaded back), so that loop iterations and programs need a barrier between them;
    /// and whether the kernel stores to an argument outside registers, so that iterations of a
    /// loop must not overtake each other.
    pub shares: bool,
    pub stores: bool,
    /// Inputs also bound as `array<vec4<T>>` for `vec4` reads where they are not bound so
    /// already, as many as WebGPU's default 8 storage bindings leave room for.
    pub views: BTreeSet<usize>,
    /// Where the adapter has a loop budget, the budget the module checks it kept to (`None`
    /// where the kernel's loops are known to stay inside it: [`Target::loop_budget`]).
    pub loop_budget: Option<u64>,
    /// The last phase, from everything above: where the invocations meet ([`meetings::place`]).
    pub meetings: Meetings,
}

impl std::ops::Deref for KernelPlan {
    type Target = Layout;
    fn deref(&self) -> &Layout {
        &self.layout
    }
}

/// The plan's first phase: where each value lives and how it is read.
pub struct Layout {
    /// The kernel, verified with its mesh.
    pub kernel: Verified,
    /// Its grid, every `dyn` size resolved.
    pub grid: Vec<LaunchAxis>,
    pub strategy: Strategy,
    /// Parallel programs, and `seq` steps per program.
    pub programs: u64,
    pub steps: u64,
    /// How many adjacent elements an invocation owns together outside the row layout
    /// ([`element_group`]): invocation `lid` owns elements `g (lid + wg j) ..`, slot `g j + t`
    /// holding element `g (lid + wg j) + t`.
    pub group: usize,
    /// The row layout's row length and workgroup size ([`row_layout`]; `cpu` strategy only).
    pub row_layout: Option<(usize, u32)>,
    /// Whether the kernel has a `dot`.
    pub dots: bool,
    /// Outputs kept in registers across the `seq` steps, by name, with their position
    /// ([`resident`]).
    pub resident: HashMap<String, usize>,
    /// `dot`s that add their tiles into a resident output ([`accumulating_dots`]).
    pub accumulating: ValueMap<(usize, ValueId, ValueId)>,
    /// Outputs and inputs bound as `array<vec4<T>>` ([`quad_args`]), kept
    /// where their invocations own elements in fours.
    pub quad_outputs: BTreeSet<usize>,
    pub quad_inputs: BTreeSet<usize>,
    /// Whole blocks of inputs that a `dot` reads from their buffers ([`forwarded_loads`]), and
    /// those only `dot`s read (their load writes nothing).
    pub forwarded: ValueMap<usize>,
    pub dot_only: ValueSet,
    /// Elementwise values computed where their one reader reads them ([`inlined_values`]).
    pub inlined: ValueSet,
    /// In the row layout: whole `in` blocks read where they are used, one `vec4` of the buffer
    /// per quad of a row, never copied into private arrays ([`row_forwarded`]), with the
    /// argument's position.
    pub row_forwarded: ValueMap<usize>,
    /// In the row layout: reductions along rows made in the loop that makes their operand
    /// ([`fused_reductions`]), by the reduction's result, with its operation and operand.
    pub fused: ValueMap<(ReduceOp, ValueId)>,
    /// The operands of fused reductions that nothing else reads: no private array holds them.
    pub fused_only: ValueSet,
}

/// The plan of `kernel` on `grid`, or the refusal.
pub fn plan(kernel: Verified, grid: Vec<LaunchAxis>, target: impl Into<Target>) -> Result<KernelPlan, BackendError> {
    plan_keeping(kernel, grid, target, &BTreeSet::new())
}

/// [`plan`] for a launch whose outputs `kept` start from their memory (an aliased input's
/// values): none of them is held in registers across the `seq` steps ([`resident`], whose
/// block starts as zeros), so each step reads and writes its block in memory, which the launch
/// does not clear.
pub fn plan_keeping(
    kernel: Verified,
    grid: Vec<LaunchAxis>,
    target: impl Into<Target>,
    kept: &BTreeSet<String>,
) -> Result<KernelPlan, BackendError> {
    let Target { strategy, loop_budget } = target.into();
    let kernel = legalize::legalize(kernel).unwrap_or_else(|d| panic!("kernel legalized does not verify: {d}"));
    let k = kernel.kernel();
    for p in &k.params {
        if p.ty.numel() > i32::MAX as usize {
            return Err(Refusal::ArrayTooLarge { name: p.name.clone(), ty: p.ty.to_string(), elements: p.ty.numel() }.into());
        }
    }
    let programs: u64 =
        grid.iter().filter(|a| !a.seq).map(|a| a.size).try_fold(1u64, |a, b| a.checked_mul(b)).unwrap_or(u64::MAX);
    let steps: u64 = grid.iter().filter(|a| a.seq).map(|a| a.size).try_fold(1u64, |a, b| a.checked_mul(b)).unwrap_or(u64::MAX);
    for (what, n) in [("parallel programs", programs), ("`seq` steps per program", steps)] {
        if n > MAX_PROGRAMS {
            return Err(Refusal::TooManyPrograms { kernel: k.name.clone(), count: n, what }.into());
        }
    }
    let mut statements = 0;
    analysis::visit(&k.body, &mut |_| statements += 1);
    if statements > MAX_STATEMENTS {
        return Err(Refusal::TooLong { kernel: k.name.clone(), statements }.into());
    }
    let layout = layout(kernel, grid, strategy, programs, steps, kept);
    let survey = survey(&layout)?;
    let wg = workgroup_size(&layout, survey.max_elements);
    let k = layout.kernel.kernel();
    let mut scratch_words = BTreeMap::new();
    let mut published_words = ValueMap::new();
    let mut words = 0u64;
    for p in k.params_of(ParamKind::Scratch) {
        scratch_words.insert(p.name.clone(), words);
        words += p.ty.numel() as u64;
    }
    for id in survey.publish.iter() {
        published_words.insert(id, words);
        words += layout.kernel.values().ty(id).numel() as u64;
    }
    if words * 4 > WORKSPACE_BUDGET {
        return Err(Refusal::Workspace { kernel: k.name.clone(), bytes: words * 4 }.into());
    }
    // One workgroup per program where the workspace of all of them fits a storage binding: a
    // 2-D dispatch past 65,535. Otherwise fewer workgroups that each walk the programs with a
    // stride.
    let (groups, strided) = if programs.saturating_mul(words * 4) <= WORKSPACE_BUDGET {
        let x = programs.min(MAX_GROUPS);
        ([x as u32, programs.div_ceil(x) as u32], false)
    } else {
        ([programs.min(MAX_GROUPS).min(WORKSPACE_BUDGET / (words * 4)) as u32, 1], true)
    };
    let loop_budget = match loop_budget {
        Some(budget) => {
            let walked = strided.then(|| programs.div_ceil(u64::from(groups[0])));
            let iterations = loops::per_invocation(&k.body, walked, steps);
            let room = loops::room(budget);
            if iterations > room {
                return Err(Refusal::LoopBudget { kernel: k.name.clone(), iterations, room }.into());
            }
            let slots = (survey.max_elements as u64).div_ceil(u64::from(wg));
            (iterations > 0 || !loops::straight(&k.body, slots, room)).then_some(budget)
        }
        None => None,
    };
    let shares = !survey.publish.is_empty() || k.params_of(ParamKind::Scratch).next().is_some() || survey.ref_loads;
    let mut views = survey.views;
    views.extend(dot_views(&layout, wg));
    let taken = k.params.iter().filter(|p| p.kind != ParamKind::Scratch).count() + usize::from(words > 0);
    let views = views.into_iter().take(MAX_STORAGE_BINDINGS.saturating_sub(taken)).collect();
    let mut plan = KernelPlan {
        wg,
        publish: survey.publish,
        scratch_words,
        published_words,
        workspace_words: words,
        groups,
        strided,
        shares,
        stores: survey.stores,
        views,
        loop_budget,
        layout,
        meetings: Meetings::default(),
    };
    plan.meetings = meetings::place(&plan);
    Ok(plan)
}

/// The plan's first phase: the layout of every value of `kernel` on `grid` under `strategy`,
/// none of the outputs `kept` resident.
fn layout(
    kernel: Verified,
    grid: Vec<LaunchAxis>,
    strategy: Strategy,
    programs: u64,
    steps: u64,
    kept: &BTreeSet<String>,
) -> Layout {
    let v = &kernel;
    let k = v.kernel();
    let row_layout = row_layout(v).filter(|_| strategy == Strategy::Cpu);
    let resident: HashMap<String, usize> = (k.params.iter().enumerate())
        .filter(|(_, p)| !kept.contains(&p.name) && resident(k, &grid, p))
        .map(|(pi, p)| (p.name.clone(), pi))
        .collect();
    let forwarded = forwarded_loads(v);
    let (quad_outputs, quad_inputs) = (quad_args(v, &grid, ParamKind::Out), quad_args(v, &grid, ParamKind::In));
    let mut columns = Vec::new();
    analysis::visit(&k.body, &mut |s| {
        if let Op::Dot { .. } = s.op {
            columns.push(v.value_type(&s.results[0]).shape[1]);
        }
    });
    let quad_loads = forwarded.values().any(|&pi| quad_able(&grid, &k.params[pi])) || !quad_outputs.is_empty();
    let group = if row_layout.is_some() { 1 } else { element_group(&columns, quad_loads) };
    let row_forwarded = row_forwarded(v, row_layout, &quad_inputs, &forwarded);
    let fused = fused_reductions(v, row_layout);
    let values = v.values();
    let fused_only = (fused.values())
        .map(|&(_, x)| x)
        .filter(|&x| {
            (analysis::readers(&k.body, values.name(x)).iter())
                .all(|r| r.results.first().is_some_and(|y| fused.contains_key(values.id(y))))
        })
        .collect();
    let dot_only = (forwarded.keys())
        .filter(|&x| analysis::readers(&k.body, values.name(x)).iter().all(|s| matches!(s.op, Op::Dot { .. })))
        .collect();
    let mut layout = Layout {
        strategy,
        programs,
        steps,
        group,
        row_layout,
        dots: !columns.is_empty(),
        accumulating: accumulating_dots(v, &resident),
        quad_outputs,
        quad_inputs,
        dot_only,
        row_forwarded,
        fused_only,
        fused,
        forwarded,
        inlined: inlined_values(v),
        resident,
        kernel,
        grid,
    };
    // An output is written as `vec4`s only where its invocations own elements in fours, and not
    // where it is resident (written back from registers, element by element); an input likewise.
    let keep = |layout: &Layout, pi: usize, out: bool| {
        let p = &layout.kernel.kernel().params[pi];
        layout.group_of(p.block_shape()).is_multiple_of(4) && !(out && layout.resident.contains_key(&p.name))
    };
    layout.quad_outputs = layout.quad_outputs.iter().copied().filter(|&pi| keep(&layout, pi, true)).collect();
    layout.quad_inputs = layout.quad_inputs.iter().copied().filter(|&pi| keep(&layout, pi, false)).collect();
    layout
}

impl Layout {
    /// Whether an operation whose result has shape `res` reads a value of `shape` at elements
    /// other invocations own, so that the value goes through the workspace: a block read by a
    /// scalar result or one of another shape, except where the invocation owns what it reads
    /// (the same elements; `reshape` (`linear`) of values owned in the same groups; in the row
    /// layout, an `[R, 1]` value broadcast over its rows).
    pub fn crosses(&self, shape: &[usize], res: &[usize], linear: bool) -> bool {
        // Runs of rows depend on the workgroup size, not known yet when the survey asks: a 2-D
        // value that may be owned in runs is taken as owned differently from any other shape.
        let may_run = |s: &[usize]| self.runs_possible() && s.len() == 2;
        let same_groups = self.group_of(shape) == self.group_of(res) && !may_run(shape) && !may_run(res);
        let own = !res.is_empty() && (shape == res || (linear && same_groups));
        let row = self
            .row_len()
            .is_some_and(|c| res.len() == 2 && shape.len() == 2 && shape[0] == res[0] && shape[1] == 1 && res[1] == c);
        !shape.is_empty() && !own && !row
    }

    /// Whether a reduction along `axis` of a value of `shape` is one the row layout makes inside
    /// each invocation (along the rows of a 2-D value whose rows have the layout's length).
    pub fn row_reduce(&self, shape: &[usize], axis: usize) -> bool {
        shape.len() == 2 && axis == 1 && self.row_len() == Some(shape[1])
    }

    /// Whether a load of `p` with `index` and `mask` into a value of shape `res` reads four
    /// adjacent elements at a time (a whole `in` block inside its array, in groups of 4), from the
    /// argument bound as `vec4`s or, where there is room for one ([`KernelPlan::views`]), from a view.
    pub fn vec4_load(&self, p: &Param, index: Option<&[Index]>, mask: Option<&str>, res: &[usize]) -> bool {
        p.kind == ParamKind::In
            && index.is_none()
            && mask.is_none()
            && self.group_of(res).is_multiple_of(4)
            && quad_able(&self.grid, p)
    }

    /// Whether the writer skips statement `s`: the load, add and store a `dot` that adds into
    /// its resident output does itself ([`accumulating_dots`]).
    pub fn folded(&self, s: &Stmt) -> bool {
        let result = match &s.op {
            Op::Store { value: Operand::Value(x), .. } => Some(x),
            _ => s.results.first(),
        };
        let result = result.map(|x| self.id(x));
        result.is_some_and(|x| self.accumulating.values().any(|&(_, acc, sum)| acc == x || sum == x))
    }

    /// The id of the value `%name`.
    pub fn id(&self, name: &str) -> ValueId {
        self.kernel.id(name)
    }

    /// The row layout's row length.
    pub fn row_len(&self) -> Option<usize> {
        self.row_layout.map(|r| r.0)
    }

    /// How many adjacent elements of a value of `shape` an invocation owns together: in the
    /// row layout, whole rows of values whose rows are that long and single elements of others
    /// (so that row `r` of every value lives with invocation `r % wg`); otherwise [`Layout::group`].
    /// A scalar is one element, owned alone: its loads and stores are one slot, not a group's.
    pub fn group_of(&self, shape: &[usize]) -> usize {
        match self.row_layout {
            _ if shape.is_empty() => 1,
            Some((c, _)) if shape.len() >= 2 && shape.last() == Some(&c) => c,
            Some(_) => 1,
            None => self.group,
        }
    }

    /// Whether any value may be owned in runs of rows ([`KernelPlan::row_runs`]): a kernel with `dot`s
    /// in groups, under the `cpu` strategy, outside the row layout.
    fn runs_possible(&self) -> bool {
        self.strategy == Strategy::Cpu && self.dots && self.row_layout.is_none() && self.group > 1
    }
}

impl KernelPlan {
    /// The word in the workgroup's workspace where published value `name` starts, if the plan
    /// publishes it.
    pub fn published_word(&self, name: &str) -> Option<u64> {
        self.kernel.values().get(name).and_then(|id| self.published_words.get(id)).copied()
    }

    /// [`KernelPlan::published_word`], 0 for a value the plan does not publish.
    pub fn published_at(&self, name: &str) -> u64 {
        self.published_word(name).unwrap_or(0)
    }

    /// The word where scratch buffer `name` starts.
    pub fn scratch_at(&self, name: &str) -> u64 {
        self.scratch_words.get(name).copied().unwrap_or(0)
    }

    /// In a kernel with `dot`s under the `cpu` strategy, outside the row layout: whether
    /// invocations own a run of adjacent rows of a 2-D value of `shape` (`[m, n]`, its `n / g`
    /// column groups dividing the workgroup, no slot past the end), as `(column groups, rows)`:
    /// invocation `lid` owns group `lid % column groups` of rows `rows * (lid / column groups)`
    /// and the `rows - 1` after, so that a register tile of `dot` reads `a` in adjacent rows.
    /// Other values, and every value on a hardware adapter (where rows apart spread a staged
    /// tile's reads over the banks of workgroup memory), keep groups `g` elements apart in `lid`
    /// and `wg g` apart in the slot ([`Layout::group`]).
    pub fn row_runs(&self, shape: &[usize]) -> Option<(usize, usize)> {
        let (g, wg) = (self.group, self.wg as usize);
        let &[m, n] = shape else { return None };
        let (groups, per) = (n / g.max(1), g * wg);
        let fits = self.runs_possible() && n.is_multiple_of(g) && groups > 0;
        (fits && wg.is_multiple_of(groups) && (m * n).is_multiple_of(per) && m * n > per).then(|| (groups, m * n / per))
    }
}

/// What the writer does to memory, found before it writes: the values other invocations read
/// (to publish), the most elements any of its loops walks (for the workgroup size), the inputs it
/// reads as `vec4`s outside `dot`s from a second binding, whether it stores to arguments or loads
/// outputs and scratch back. Also the refusal of a block too large to lower.
struct Survey {
    publish: ValueSet,
    max_elements: usize,
    views: BTreeSet<usize>,
    stores: bool,
    ref_loads: bool,
}

fn survey(plan: &Layout) -> Result<Survey, BackendError> {
    let v = &plan.kernel;
    let k = v.kernel();
    let mut s = Survey { publish: ValueSet::new(), max_elements: 1, views: BTreeSet::new(), stores: false, ref_loads: false };
    for p in k.params_of(ParamKind::Scratch) {
        s.max_elements = s.max_elements.max(p.ty.numel());
    }
    for &pi in plan.resident.values() {
        s.max_elements = s.max_elements.max(k.params[pi].block_shape().iter().product());
    }
    let mut refusal = None;
    analysis::visit(&k.body, &mut |st| {
        if plan.folded(st) || refusal.is_some() {
            return;
        }
        let iters = match &st.op {
            Op::For(ForLoop { iters, .. }) => iters.iter().map(|(n, _)| n).collect(),
            _ => Vec::new(),
        };
        for r in st.results.iter().chain(iters) {
            let ty = v.value_type(r);
            if ty.numel() > MAX_BLOCK_ELEMENTS {
                refusal = Some(
                    Refusal::BlockTooLarge { what: format!("block value %{r}"), elements: ty.numel(), ty: ty.to_string() }.into(),
                );
                return;
            }
            if !ty.is_scalar() && !plan.dot_only.contains(v.id(r)) && !plan.row_forwarded.contains_key(v.id(r)) {
                s.max_elements = s.max_elements.max(ty.numel());
            }
        }
        let res = st.results.first().map(|r| v.value_type(r).shape.clone()).unwrap_or_default();
        for u in analysis::uses(k, st, &res) {
            let shape = &v.value_type(u.name).shape;
            let crosses = match &u.how {
                analysis::How::Elementwise(at) => plan.crosses(shape, at, false),
                analysis::How::Linear => plan.crosses(shape, &res, true),
                // Read whole: through the workspace, except a row of the row layout reduced by
                // its own invocation (or as it is made), a `dot` operand read from its buffer, and
                // scalars (registers every invocation holds).
                analysis::How::Whole => match &st.op {
                    Op::Transpose { .. } | Op::Concatenate { .. } | Op::Slice { .. } => true,
                    Op::Reduce { axis, .. } => !plan.row_reduce(shape, *axis) && !plan.fused.contains_key(v.id(&st.results[0])),
                    Op::Dot { .. } => !plan.forwarded.contains_key(v.id(u.name)),
                    // An index vector (a gather or scatter): each element reads its entry.
                    Op::Load { .. } | Op::Store { .. } => true,
                    _ => false,
                },
            };
            if crosses && !shape.is_empty() {
                s.publish.insert(v.id(u.name));
            }
        }
        match &st.op {
            Op::Load { src, index, mask, .. } => {
                let x = v.id(&st.results[0]);
                if plan.dot_only.contains(x) || plan.row_forwarded.contains_key(x) || plan.resident.contains_key(src) {
                    return;
                }
                let (pi, p) = k.params.iter().enumerate().find(|(_, p)| &p.name == src).expect("verified argument");
                if plan.vec4_load(p, index.as_deref(), mask.as_deref(), &res) {
                    // Read four at a time: from the argument bound as `vec4`s, or from a view.
                    if !plan.quad_inputs.contains(&pi) {
                        s.views.insert(pi);
                    }
                    return;
                }
                s.ref_loads |= p.kind != ParamKind::In;
            }
            Op::Store { dst, index, .. } => {
                let sel = analysis::region_shape(k.param(dst).expect("verified argument"), index.as_deref());
                s.max_elements = s.max_elements.max(sel.iter().product());
                s.stores |= !plan.resident.contains_key(dst);
            }
            _ => {}
        }
    });
    match refusal {
        Some(e) => Err(e),
        None => Ok(s),
    }
}

/// Invocations per workgroup: the row layout's; with `dot`s in groups, enough for tiles of 128
/// elements (32 on hardware, fed from workgroup memory); otherwise one group (or element) per
/// invocation of the largest loop, at least 64 and at most [`MAX_WORKGROUP`].
fn workgroup_size(plan: &Layout, max_elements: usize) -> u32 {
    let pow2 = |n: usize| n.next_power_of_two() as u32;
    match plan.row_layout {
        Some((_, wg)) => wg,
        None if plan.group > 1 && plan.dots && plan.strategy == Strategy::Gpu => pow2(max_elements / 32).clamp(64, MAX_WORKGROUP),
        None if plan.group > 1 && plan.dots => pow2(max_elements / 128).clamp(32, MAX_WORKGROUP),
        None if plan.group > 1 => pow2(max_elements / plan.group).clamp(64, MAX_WORKGROUP),
        None => pow2(max_elements).clamp(64, MAX_WORKGROUP),
    }
}

/// Whether `dot` statement `s` is written as a register tile of the plan's groups: its result's
/// columns a multiple of the group, and the workgroup's groups a multiple of the columns. Returns
/// (m, n, k) too.
pub(crate) fn dot_tiling(plan: &KernelPlan, s: &Stmt) -> Option<(bool, usize, usize, usize)> {
    tiling(&plan.layout, plan.wg, s)
}

/// [`dot_tiling`] under `layout` with `wg` invocations a workgroup.
fn tiling(layout: &Layout, wg: u32, s: &Stmt) -> Option<(bool, usize, usize, usize)> {
    let Op::Dot { a: Operand::Value(a), b: Operand::Value(b), trans_a, trans_b } = &s.op else { return None };
    let (ash, bsh) = (&layout.kernel.value_type(a).shape, &layout.kernel.value_type(b).shape);
    let (m, kk) = if *trans_a { (ash[1], ash[0]) } else { (ash[0], ash[1]) };
    let n = if *trans_b { bsh[0] } else { bsh[1] };
    let (g, wg) = (layout.group, wg as usize);
    Some((g > 1 && n.is_multiple_of(g) && (g * wg).is_multiple_of(n), m, n, kk))
}

/// The contraction steps a staged `dot` brings into workgroup memory at a time: the most of 16, 8,
/// 4, 2, 1 that divides `k` and whose operand chunks fit [`MAX_STAGED_WORDS`].
pub(crate) fn staged_chunk(m: usize, n: usize, k: usize) -> Option<usize> {
    [16, 8, 4, 2, 1].into_iter().find(|&c| k.is_multiple_of(c) && (m + n) * c <= MAX_STAGED_WORDS)
}

/// The inputs register-tiled `dot`s read as `vec4`s (not staged, neither operand transposed, the
/// contraction a multiple of 4): each operand a forwarded, [`quad_able`] input; `b` only where `a`
/// is one.
fn dot_views(plan: &Layout, wg: u32) -> BTreeSet<usize> {
    let k = plan.kernel.kernel();
    let mut out = BTreeSet::new();
    analysis::visit(&k.body, &mut |s| {
        let Op::Dot { a: Operand::Value(a), b: Operand::Value(b), trans_a, trans_b } = &s.op else { return };
        let Some((tiled, m, n, kk)) = tiling(plan, wg, s) else { return };
        let staged = plan.strategy == Strategy::Gpu && staged_chunk(m, n, kk).is_some();
        if !tiled || staged || *trans_a || *trans_b || !kk.is_multiple_of(4) {
            return;
        }
        let view = |x: &str| plan.forwarded.get(plan.id(x)).copied().filter(|&pi| quad_able(&plan.grid, &k.params[pi]));
        if let (Some(pa), Some(pb)) = (view(a), view(b)) {
            out.extend([pa, pb]);
        }
    });
    out
}

/// Whether every element of output `p` is stored before anything could read it
/// ([`analysis::fully_written`]).
pub fn fully_written(kernel: &Verified, grid: &[LaunchAxis], p: &Param) -> bool {
    analysis::fully_written(kernel.kernel(), grid, p)
}

/// Whether `p`'s blocks can be read or written as `vec4`s of adjacent elements at every grid
/// point: rows of a multiple of 4 elements in the array and in the block, blocks inside the array,
/// elements that are not `bool` words.
pub(crate) fn quad_able(grid: &[LaunchAxis], p: &Param) -> bool {
    let (dims, block) = (&p.ty.shape, p.block_shape());
    p.ty.dtype != DType::Bool
        && dims.last().is_some_and(|n| n.is_multiple_of(4))
        && block.last().is_some_and(|n| n.is_multiple_of(4))
        && (0..dims.len()).all(|d| inside(grid, p, d))
}

/// The arguments of `kind` (`in` or `out`) read or written as `vec4`s only, bound as
/// `array<vec4<T>>`: [`quad_able`], and every access whole (no index, no mask): for an output,
/// stores only (never loaded); for an input, loads that no `dot` reads (a `dot` reads its operands
/// element by element).
fn quad_args(v: &Verified, grid: &[LaunchAxis], kind: ParamKind) -> BTreeSet<usize> {
    let k = v.kernel();
    let whole = |s: &Stmt| match (&s.op, kind) {
        (Op::Store { index: None, mask: None, .. }, ParamKind::Out) => true,
        (Op::Load { index: None, mask: None, .. }, ParamKind::In) => {
            !analysis::readers(&k.body, &s.results[0]).iter().any(|r| matches!(r.op, Op::Dot { .. }))
        }
        _ => false,
    };
    (k.params.iter().enumerate())
        .filter(|(_, p)| p.kind == kind && quad_able(grid, p))
        .filter(|(_, p)| {
            let acc = analysis::accesses(&k.body, &p.name);
            !acc.is_empty() && acc.iter().all(|s| whole(s))
        })
        .map(|(pi, _)| pi)
        .collect()
}

/// How many adjacent elements an invocation owns together ([`Writer::group`]). With a `dot`, 8
/// where every `dot`'s result has a multiple of 8 columns, else 4 (its register tiles). Without
/// one, 4 where some input block is loaded whole or some output written only whole as `vec4`s
/// (`quad_loads`: [`quad_able`], [`quad_args`]), else 1. `dot_columns`: each `dot` result's.
fn element_group(dot_columns: &[usize], quad_loads: bool) -> usize {
    match dot_columns {
        [] if quad_loads => 4,
        [] => 1,
        c if c.iter().all(|n| n.is_multiple_of(8)) => 8,
        _ => 4,
    }
}

/// The most private slots a value may take per invocation in the row layout.
pub(crate) const MAX_ROW_SLOTS: usize = 1024;

/// The row layout ([`Writer::row_len`]): where the kernel has no `dot` and reduces a 2-D value
/// along its last axis, each invocation owns whole rows of the values whose rows are that long,
/// and the matching elements of `[R, 1]` and `[R]` values, so that the reduction and the
/// broadcast of its result over the rows stay in the invocation: no workspace, no barrier.
/// Returns the row length and the workgroup size (one invocation per row of the tallest such
/// value, at most [`MAX_WORKGROUP`]) where that gives at least 8 invocations and no value takes
/// more than [`MAX_ROW_SLOTS`] slots.
fn row_layout(v: &Verified) -> Option<(usize, u32)> {
    let body = &v.kernel().body;
    let mut dot = false;
    let mut len = None;
    analysis::visit(body, &mut |s| match &s.op {
        Op::Dot { .. } => dot = true,
        Op::Reduce { arg: Operand::Value(x), axis: 1, .. } if len.is_none() && v.value_type(x).shape.len() == 2 => {
            len = Some(v.value_type(x).shape[1])
        }
        _ => {}
    });
    let c = len.filter(|_| !dot)?;
    let mut shapes: Vec<&[usize]> = Vec::new();
    analysis::visit(body, &mut |s| shapes.extend(s.results.iter().map(|r| v.value_type(r).shape.as_slice())));
    let rows =
        shapes.iter().filter(|sh| sh.len() >= 2 && sh.last() == Some(&c)).map(|sh| sh.iter().product::<usize>() / c).max()?;
    let wg = (rows.next_power_of_two() as u32).min(MAX_WORKGROUP);
    let fits = shapes.iter().all(|sh| {
        let g = if sh.len() >= 2 && sh.last() == Some(&c) { c } else { 1 };
        g * sh.iter().product::<usize>().div_ceil(g * wg as usize) <= MAX_ROW_SLOTS
    });
    (wg >= 8 && fits).then_some((c, wg))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn planned(text: &str, strategy: Strategy) -> KernelPlan {
        let v = verify(&parse(text).expect("parses").kernels.remove(0)).expect("verifies");
        let grid = tessel_plugin_api::launch::resolve_grid(&v, &Default::default()).expect("a fixed grid");
        plan(v, grid, strategy).expect("plans")
    }

    /// Invocations own runs of adjacent rows only where the column groups divide the workgroup
    /// and the groups fill every slot, only in `dot` kernels, and only on a CPU adapter; the
    /// element of every slot is then still a different element (the mapping is a bijection).
    #[test]
    fn dot_values_are_owned_in_runs_of_rows_only_where_they_fill_them_on_a_cpu_adapter() {
        let matmul = |m: usize, n: usize| {
            format!(
                "kernel k\n  grid (i: 2)\n  in  a: f32[{}, 64] block [{m}, 64] at (i, 0)\n  in  b: f32[64, {n}] block [64, {n}] at (0, 0)\n  out c: f32[{}, {n}] block [{m}, {n}] at (i, 0)\n{{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  store c, %p\n}}\n",
                2 * m,
                2 * m
            )
        };
        let p = planned(&matmul(64, 64), Strategy::Cpu);
        assert_eq!((p.group, p.wg), (8, 32));
        // 8 column groups of 8; 32 invocations take 4 rows a pass, 16 passes: runs of 16 rows.
        assert_eq!(p.row_runs(&[64, 64]), Some((8, 16)));
        let (groups, rows) = p.row_runs(&[64, 64]).unwrap();
        let mut seen = BTreeSet::new();
        for lid in 0..p.wg as usize {
            for j in 0..rows {
                for t in 0..p.group {
                    let e = 64 * (rows * (lid / groups) + j) + p.group * (lid % groups) + t;
                    assert!(e < 64 * 64 && seen.insert(e), "element {e} owned twice or past the end");
                }
            }
        }
        assert_eq!(seen.len(), 64 * 64);
        // Shapes whose groups do not fill every invocation's slots, or whose column groups do not
        // divide the workgroup, keep groups apart; so do 1-D
        // values, kernels without `dot`, and every value on a hardware adapter.
        assert_eq!(p.row_runs(&[60, 64]), Some((8, 15)));
        assert_eq!(p.row_runs(&[62, 64]), None, "the last pass has half its rows");
        assert_eq!(p.row_runs(&[64, 24]), None, "3 column groups do not divide 32 invocations");
        assert_eq!(p.row_runs(&[4096]), None);
        assert_eq!(planned(&matmul(64, 64), Strategy::Gpu).row_runs(&[64, 64]), None);
        let add = "kernel k\n  grid (i: 2)\n  in  x: f32[128, 64] block [64, 64] at (i, 0)\n  out o: f32[128, 64] block [64, 64] at (i, 0)\n{\n  %x = load x\n  %y = add %x, 1.0\n  store o, %y\n}\n";
        assert_eq!(planned(add, Strategy::Cpu).row_runs(&[64, 64]), None);
    }

    #[test]
    fn strategies_parse_by_name_and_a_bad_name_says_what_would_work() {
        assert_eq!(Strategy::parse("cpu").unwrap(), Strategy::Cpu);
        assert_eq!(Strategy::parse("gpu").unwrap(), Strategy::Gpu);
        let e = Strategy::parse("fast").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(
            e.message.contains("TESSEL_WGPU_STRATEGY=fast is not a strategy") && e.message.contains("use cpu or gpu"),
            "{}",
            e.message
        );
    }
}
