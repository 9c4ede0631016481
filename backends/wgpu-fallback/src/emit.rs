//! A planned kernel (`lower.rs`) written as WGSL. Pure: no device.
//!
//! The model. One program is one workgroup of `WG` invocations; a fixed number of workgroups
//! (at most 65,535, the smallest dispatch limit every adapter has) walk the parallel programs
//! with a stride, so any grid fits one 1-D dispatch. Inside a program the `seq` axes are a loop.
//!
//! Values. A scalar is a WGSL `let`/`var` that every invocation holds, with the same value in
//! each (so conditions and loop bounds are uniform and barriers may sit under them). A block value
//! is spread over the invocations as the plan's layout says (`Plan::group_of`: groups of `g`
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use tessel_plugin_api::ir::*;
use tessel_plugin_api::launch::LaunchAxis;
use tessel_plugin_api::libm;

use crate::lower::{Plan, Strategy, fully_written, inside, origin_range, quad_able};

/// The largest block value lowered, in elements.
pub const MAX_BLOCK_ELEMENTS: usize = 1 << 16;
/// The most parallel programs (or `seq` steps) one launch runs: the counters are `u32`.
pub const MAX_PROGRAMS: u64 = 1 << 31;
/// Workgroups dispatched at most: WebGPU's default `maxComputeWorkgroupsPerDimension`.
pub const MAX_GROUPS: u64 = 65_535;
/// WebGPU's default `maxStorageBufferBindingSize`: the workspace is sized to fit it.
pub const WORKSPACE_BUDGET: u64 = 128 << 20;
/// Element loops of at most this many slots per invocation are unrolled.
const UNROLL: usize = 8;
/// The most storage bindings a module uses: WebGPU's default `maxStorageBuffersPerShaderStage`
/// (`vec4` views of inputs are added only while they fit; arguments and the workspace always).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 8;
/// The most words a staged `dot` keeps in workgroup memory (both operand chunks): half of
/// WebGPU's default `maxComputeWorkgroupStorageSize` of 16 KiB.
pub(crate) const MAX_STAGED_WORDS: usize = 2048;
/// The most invocations per workgroup used: WebGPU's default `maxComputeInvocationsPerWorkgroup`.
pub const MAX_WORKGROUP: u32 = 256;

/// The dtypes this backend lowers (16-bit floats emulated with `f32` and rounding).
pub const DTYPES: [DType; 6] = [DType::F32, DType::I32, DType::U32, DType::Bool, DType::F16, DType::BF16];

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
}

/// Writes the WGSL expression of element (row, col) of an operand block.
type Reader = Box<dyn Fn(&str, &str) -> String>;

/// Writes one planned kernel (`lower.rs`): its WGSL and its dispatch. Every decision is the
/// plan's, so this cannot fail.
pub fn lower(plan: &Plan) -> Lowered {
    let k = plan.kernel.kernel();
    let mut w = Writer::new(plan);
    w.write_main();
    debug_assert_eq!(w.next_word, plan.workspace_words, "the writer publishes what the plan found");
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
    }
}

/// The WGSL type of a register holding an element of `d`.
fn reg_ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => "bool",
    }
}

/// The WGSL element type of an argument buffer of `d`.
fn buf_ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 => "i32",
        DType::U32 | DType::Bool => "u32",
    }
}

/// A literal as a WGSL expression of the register type of `d`.
fn literal(l: Literal, d: DType) -> String {
    match d {
        DType::Bool => (l.as_f64() != 0.0).to_string(),
        DType::I32 => {
            let v = l.as_i64() as i32;
            if v == i32::MIN { "i32(-2147483648)".into() } else { format!("{v}i") }
        }
        DType::U32 => format!("{}u", l.as_i64() as u32),
        DType::F32 | DType::F16 | DType::BF16 => {
            let v = l.as_f64() as f32;
            let v = match d {
                DType::F16 => half::f16::from_f32(v).to_f32(),
                DType::BF16 => half::bf16::from_f32(v).to_f32(),
                _ => v,
            };
            opaque_f32(v)
        }
    }
}

/// An `f32` as WGSL. Infinities and NaN go through a helper, since naga refuses non-finite
/// constants; so do zeros, since a driver that may assume no infinity, NaN or signed zero
/// (Vulkan without `SignedZeroInfNanPreserve`, which Mesa's lavapipe does not honour) folds
/// `x * 0.0` and `x / 0.0` to 0 and `x + 0.0` to `x` when it sees the constant. The helper's
/// bits pass through `tk_zero`, a zero the compiler cannot see (`finish`).
pub(crate) fn float_lit(v: f32) -> String {
    if v.is_finite() && v != 0.0 { format!("{v:?}f") } else { format!("tk_f32_bits({}u)", v.to_bits()) }
}

/// A kernel's float literal: always through `tk_f32_bits`, its value in a comment. lavapipe folds
/// with any zero it can compute, not only a written one: `floor(0.5) * x` to 0, `x / (1.5 - 1.5)`
/// to 0 (`tests/in/regressions/computed_zero.tk`), so no float the kernel computes may start from
/// a constant the driver sees. (The libm functions' constants only meet run-time values.)
fn opaque_f32(v: f32) -> String {
    format!("tk_f32_bits({}u /* {v:?} */)", v.to_bits())
}

/// Register value to a `u32` storage word.
fn to_word(d: DType, x: &str) -> String {
    match d {
        DType::U32 => x.to_string(),
        DType::Bool => format!("select(0u, 1u, {x})"),
        _ => format!("bitcast<u32>({x})"),
    }
}

/// A `u32` storage word to a register value.
fn from_word(d: DType, w: &str) -> String {
    match d {
        DType::U32 => w.to_string(),
        DType::Bool => format!("({w} != 0u)"),
        DType::I32 => format!("bitcast<i32>({w})"),
        _ => format!("bitcast<f32>({w})"),
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
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
    /// A block read from its buffer where it is used ([`Plan::row_forwarded`]), by name.
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

/// One dimension of the region a load or store selects.
#[derive(Clone, Debug)]
struct Dim {
    /// First array index, an `i32` expression.
    start: String,
    len: usize,
    /// Whether the dimension stays in the result (not a single-element index).
    keep: bool,
    /// Range of `start` over the whole grid, where known.
    range: Option<(i64, i64)>,
}

/// Helper functions a module may need, emitted once each.
const HELPERS: &[(&str, &str)] = &[
    ("tk_f32_bits", "fn tk_f32_bits(b: u32) -> f32 { return bitcast<f32>(b | tk_zero); }"),
    ("tk_isnan", "fn tk_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }"),
    (
        "tk_isnan4",
        "fn tk_isnan4(q: vec4<f32>) -> bool { return any((bitcast<vec4<u32>>(q) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u)); }",
    ),
    (
        "tk_max",
        "fn tk_max(a: f32, b: f32) -> f32 { return select(max(a, b), tk_f32_bits(0x7fc00000u), tk_isnan(a) | tk_isnan(b)); }",
    ),
    (
        "tk_min",
        "fn tk_min(a: f32, b: f32) -> f32 { return select(min(a, b), tk_f32_bits(0x7fc00000u), tk_isnan(a) | tk_isnan(b)); }",
    ),
    (
        "tk_round_f16",
        "// The nearest f16 (ties to even) of x, as an f32.
fn tk_round_f16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let s = b & 0x80000000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return x; }
    if (a >= 0x477ff000u) { return bitcast<f32>(s | 0x7f800000u); }
    if (a < 0x38800000u) {
        let q = round(abs(x) * 16777216.0f) / 16777216.0f;
        return bitcast<f32>(s | bitcast<u32>(q));
    }
    return bitcast<f32>(s | ((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u));
}",
    ),
    (
        "tk_round_bf16",
        "// The nearest bf16 (ties to even) of x, as an f32.
fn tk_round_bf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return x; }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}",
    ),
    ("tk_div_i32", "fn tk_div_i32(a: i32, b: i32) -> i32 { if (b == 0i) { return 0i; } return a / b; }"),
    ("tk_rem_i32", "fn tk_rem_i32(a: i32, b: i32) -> i32 { if (b == 0i || b == -1i) { return 0i; } return a - (a / b) * b; }"),
    ("tk_div_u32", "fn tk_div_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0u; } return a / b; }"),
    ("tk_rem_u32", "fn tk_rem_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0u; } return a % b; }"),
    (
        "tk_f2i",
        "// Truncates toward zero, saturating; NaN gives 0.
fn tk_f2i(x: f32) -> i32 {
    if (tk_isnan(x)) { return 0i; }
    if (x >= 2147483648.0f) { return 2147483647i; }
    if (x <= -2147483648.0f) { return i32(-2147483648); }
    return i32(x);
}",
    ),
    (
        "tk_f2u",
        "// Truncates toward zero, saturating; NaN gives 0.
fn tk_f2u(x: f32) -> u32 {
    if (tk_isnan(x) || x <= 0.0f) { return 0u; }
    if (x >= 4294967296.0f) { return 4294967295u; }
    return u32(x);
}",
    ),
    ("tk_f16_bits", "fn tk_f16_bits(x: f32) -> u32 { return pack2x16float(vec2<f32>(x, 0.0f)) & 0xffffu; }"),
    ("tk_mulhi", crate::libm::MULHI),
];

/// Which helpers each helper calls.
fn helper_deps(name: &str) -> &'static [&'static str] {
    match name {
        "tk_isnan" => &[],
        "tk_max" | "tk_min" => &["tk_isnan", "tk_f32_bits"],
        "tk_f2i" | "tk_f2u" => &["tk_isnan"],
        _ => &[],
    }
}

struct Writer<'k> {
    v: &'k Verified,
    grid: &'k [LaunchAxis],
    plan: &'k Plan,
    out: String,
    indent: usize,
    /// WGSL identifier of every IR value.
    idents: HashMap<String, String>,
    tmp: u32,
    /// Word offset of each published value and scratch buffer in a workgroup's region.
    offsets: HashMap<String, u64>,
    next_word: u64,
    helpers: BTreeSet<&'static str>,
    /// The accurate maths functions the module calls, by name (`libm.rs`).
    libm: BTreeMap<&'static str, String>,
    uses_broadcast: bool,
    /// Since the last barrier: a value was published, an `out`/scratch ref was stored to,
    /// or loaded from.
    pending_publish: bool,
    pending_store: bool,
    pending_ref_load: bool,
    /// Words of the `var<workgroup>` arrays the staged `dot`s use (`tk_sa`, `tk_sb`): the most
    /// any one needs.
    staged: (usize, usize),
    /// The views ([`Plan::views`]) the module reads (`a{i}v`, bound after the workspace).
    views: BTreeSet<usize>,
    /// Inside a loop over a quad value ([`Writer::quad_value`]): which of the four elements of
    /// quad `j` slot `k` is.
    quad_lane: Option<usize>,
    /// The values computed where they are read ([`Plan::inlined`]) written so far.
    deferred: HashMap<String, Deferred<'k>>,
    /// The row-forwarded blocks the next [`Writer::each_sink`] reads, a `vec4` per quad read
    /// once at the quad's start; and those whose quad `j` is in `{id}_q` where the writer is.
    hoist: Vec<String>,
    hoisted: HashSet<String>,
}

impl<'k> Writer<'k> {
    fn new(plan: &'k Plan) -> Writer<'k> {
        Writer {
            v: &plan.kernel,
            grid: &plan.grid,
            plan,
            out: String::new(),
            indent: 1,
            idents: HashMap::new(),
            tmp: 0,
            offsets: HashMap::new(),
            next_word: 0,
            helpers: BTreeSet::new(),
            libm: BTreeMap::new(),
            uses_broadcast: false,
            pending_publish: false,
            pending_store: false,
            pending_ref_load: false,
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

    fn helper(&mut self, name: &'static str) {
        for d in helper_deps(name) {
            self.helpers.insert(d);
        }
        self.helpers.insert(name);
    }

    /// A call of an accurate maths function (`tessel_plugin_api::libm`), written once per module.
    fn call(&mut self, f: fn() -> &'static libm::Func, args: &[&str]) -> String {
        let func = f();
        let name = func.name;
        self.libm.entry(name).or_insert_with(|| crate::libm::function(func));
        format!("{name}({})", args.join(", "))
    }

    fn t(&mut self) -> String {
        self.tmp += 1;
        format!("t{}", self.tmp)
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

    /// [`Plan::group_of`].
    fn group_of(&self, shape: &[usize]) -> usize {
        self.plan.group_of(shape)
    }

    /// Private slots per invocation of a value of `shape`.
    fn slots(&self, shape: &[usize]) -> usize {
        let (g, n) = (self.group_of(shape), shape.iter().product::<usize>());
        g * n.div_ceil(g * self.plan.wg as usize)
    }

    /// The header's account of the values owned in runs of rows ([`Plan::row_runs`]), if any.
    fn runs(&self) -> String {
        let mut shapes = BTreeSet::new();
        tessel_plugin_api::ir::analysis::visit(&self.v.kernel().body, &mut |s| {
            for r in &s.results {
                let shape = &self.v.value_type(r).shape;
                if let Some((_, rows)) = self.plan.row_runs(shape) {
                    shapes.insert((shape.clone(), rows));
                }
            }
        });
        let runs: Vec<String> = shapes.iter().map(|(s, rows)| format!("{s:?} in runs of {rows} rows")).collect();
        if runs.is_empty() { String::new() } else { format!("; {}", runs.join(", ")) }
    }

    /// The element of slot `k` (a constant) of a value of `shape`, as a WGSL expression of `lid`.
    fn element(&self, shape: &[usize], k: usize) -> String {
        let wg = self.plan.wg as usize;
        let g = self.group_of(shape);
        if self.plan.row_runs(shape).is_some() {
            return self.run_element(shape, &format!("{}u", k / g), &format!("{}u", k % g));
        }
        if g > 1 { format!("{g}u * lid + {}u", g * wg * (k / g) + k % g) } else { format!("lid + {}u", k * wg) }
    }

    /// Where invocations own runs of rows of `shape` ([`Plan::row_runs`]): the element of the
    /// invocation's group `j` (its `j`-th row), column `t` of the group (WGSL expressions).
    fn run_element(&self, shape: &[usize], j: &str, t: &str) -> String {
        let (groups, rows) = self.plan.row_runs(shape).expect("values owned in runs of rows");
        let (g, n) = (self.group_of(shape), shape[1]);
        format!("{n}u * ({rows}u * (lid / {groups}u) + {j}) + {g}u * (lid % {groups}u) + {t}")
    }

    /// The element of the slot in the WGSL variable `k`, of a value of `shape`.
    fn element_of_var(&self, shape: &[usize]) -> String {
        let g = self.group_of(shape);
        if self.plan.row_runs(shape).is_some() {
            return self.run_element(shape, &format!("k / {g}u"), &format!("k % {g}u"));
        }
        if g > 1 {
            format!("{g}u * (lid + {}u * (k / {g}u)) + k % {g}u", self.plan.wg)
        } else {
            format!("lid + k * {}u", self.plan.wg)
        }
    }

    /// Whether some invocation's last slots of a value of `shape` lie past its elements.
    fn ragged(&self, shape: &[usize]) -> bool {
        let per = self.group_of(shape) * self.plan.wg as usize;
        !shape.iter().product::<usize>().is_multiple_of(per)
    }

    fn alloc_words(&mut self, name: &str, n: usize) -> u64 {
        if let Some(&o) = self.offsets.get(name) {
            return o;
        }
        let o = self.next_word;
        self.next_word += n as u64;
        self.offsets.insert(name.to_string(), o);
        o
    }

    // ---- barriers ----

    fn storage_barrier(&mut self) {
        self.line("storageBarrier();");
        self.pending_publish = false;
        self.pending_store = false;
        self.pending_ref_load = false;
    }

    /// At the top of a loop iteration: the previous iteration's reads and stores are done.
    fn loop_barrier(&mut self) {
        if self.plan.shares || self.plan.stores {
            self.storage_barrier();
        }
    }

    fn flags(&self) -> (bool, bool, bool) {
        (self.pending_publish, self.pending_store, self.pending_ref_load)
    }

    fn merge_flags(&mut self, f: (bool, bool, bool)) {
        self.pending_publish |= f.0;
        self.pending_store |= f.1;
        self.pending_ref_load |= f.2;
    }

    /// Before reading published values: a barrier if one was published since the last.
    fn sync_reads(&mut self, reads: &[&Read]) {
        if self.pending_publish && reads.iter().any(|r| matches!(r, Read::Shared { .. })) {
            self.storage_barrier();
        }
    }

    // ---- operands ----

    /// How an operand is read for a result of shape `res`; `linear` for `reshape`.
    fn classify(&mut self, o: &Operand, res: &[usize], linear: bool) -> Read {
        match o {
            Operand::Lit(l) => Read::Lit(*l),
            Operand::Value(name) => {
                let shape = self.ty(name).shape.clone();
                let id = self.ident(name);
                if shape.is_empty() {
                    Read::Scalar(id)
                } else if self.plan.crosses(&shape, res, linear) {
                    assert!(self.plan.publish.contains(name), "the plan publishes %{name}, which another invocation reads");
                    Read::Shared { name: name.clone(), shape, linear }
                } else if self.plan.row_forwarded.contains_key(name) && shape == res {
                    Read::Row(name.clone())
                } else if self.deferred.contains_key(name) && shape == res {
                    Read::Deferred(name.clone())
                } else if shape == res || linear {
                    Read::Own(id)
                } else {
                    Read::RowOwn(id, self.plan.row_len().expect("the row layout's broadcast"))
                }
            }
        }
    }

    /// In the row layout, which of the invocation's rows slot `k` of a value of shape `res`
    /// (rows of `len`) lies in: `0u` where each invocation owns at most one row, so that the
    /// driver sees a constant index and keeps the row's `[R, 1]` values in registers.
    fn row_of_slot(&self, res: &[usize], len: usize) -> String {
        let rows = res.iter().product::<usize>() / len.max(1);
        if rows <= self.plan.wg as usize { "0u".to_string() } else { format!("k / {len}u") }
    }

    /// The expression reading `r` (as `dtype` for literals) for result element `e` of `res`.
    fn read(&mut self, r: &Read, dtype: DType, res: &[usize]) -> String {
        match r {
            Read::Lit(l) => literal(*l, dtype),
            Read::Scalar(id) => id.clone(),
            Read::Own(id) => self.at(id, res),
            Read::RowOwn(id, c) => {
                let row = self.row_of_slot(res, *c);
                format!("{id}[{row}]")
            }
            Read::Row(name) => match self.quad_lane {
                Some(t) if self.hoisted.contains(name) => format!("{}_q.{}", self.ident(name), ["x", "y", "z", "w"][t]),
                // Slot `k` on its own: its element of the `vec4` of its quad.
                _ => format!("{}[k % 4u]", self.row_quad(self.plan.row_forwarded[name], "(k / 4u)")),
            },
            Read::Deferred(name) => {
                let d = self.deferred[name].clone();
                let xs: Vec<String> = d.reads.iter().zip(&d.tys).map(|(r, &t)| self.read(r, t, res)).collect();
                let v = (d.f)(self, &xs);
                let x = self.t();
                self.line(format!("let {x} = {v};"));
                x
            }
            Read::Shared { name, shape, linear } => {
                let idx = if *linear { "e".to_string() } else { broadcast_index(res, shape) };
                let off = self.offsets.get(name).copied().unwrap_or(0);
                let d = self.ty(name).dtype;
                from_word(d, &format!("tk_ws[wsb + {off}u + {idx}]"))
            }
        }
    }

    fn dtype_of(&self, ops: &[&Operand]) -> DType {
        ops.iter()
            .find_map(|o| match o {
                Operand::Value(v) => Some(self.ty(v).dtype),
                Operand::Lit(_) => None,
            })
            .unwrap_or(DType::I32)
    }

    // ---- structure ----

    fn write_main(&mut self) {
        let k = self.v.kernel();
        let par: Vec<usize> = (0..self.grid.len()).filter(|&a| !self.grid[a].seq).collect();
        let seq: Vec<usize> = (0..self.grid.len()).filter(|&a| self.grid[a].seq).collect();
        if self.plan.strided {
            self.open("for (var prog = gid; prog < PROGRAMS; prog += GROUPS)");
            if self.plan.shares {
                // The workspace and scratch of the previous program are done with.
                self.storage_barrier();
            }
        } else if u64::from(self.plan.groups[0]) * u64::from(self.plan.groups[1]) == self.plan.programs {
            self.open("");
            self.line("let prog = gid;");
        } else {
            self.line("let prog = gid;");
            self.open("if (prog < PROGRAMS)");
        }
        self.decode("prog", &par);
        let scratch: Vec<Param> = k.params_of(ParamKind::Scratch).cloned().collect();
        for p in &scratch {
            let n = p.ty.numel();
            let off = self.alloc_words(&p.name, n);
            self.line(format!("// scratch {}: {}", p.name, p.ty));
            self.each(&[n], |w| w.line(format!("tk_ws[wsb + {off}u + e] = 0u;")));
            self.pending_store = true;
        }
        let looped = self.plan.steps > 1;
        let mut resident: Vec<(String, usize)> = self.plan.resident.iter().map(|(n, &pi)| (n.clone(), pi)).collect();
        resident.sort_by_key(|r| r.1);
        for (name, pi) in &resident {
            let ty = &k.params[*pi].ty;
            let slots = self.slots(k.params[*pi].block_shape());
            self.line(format!("// the block of {name} ({ty}), in registers across the seq steps, written back at the last"));
            self.line(format!("var r{pi}: array<{}, {slots}>;", reg_ty(ty.dtype)));
        }
        if looped {
            self.open(format!("for (var step = 0u; step < {}u; step++)", self.plan.steps));
            self.loop_barrier();
        }
        if !looped && !seq.is_empty() {
            self.line("let step = 0u;");
        }
        self.decode("step", &seq);
        self.write_origins();
        let body = k.body.clone();
        self.write_body(&body);
        for (name, pi) in resident {
            self.line(format!("// write back the block of {name}"));
            self.open(format!("if (step == {}u)", self.plan.steps - 1));
            let p = k.params[pi].clone();
            let region = self.region(pi, &p, None);
            self.store_cells(pi, &p, &region, p.block_shape(), None, |_| format!("r{pi}[k]"));
            self.close();
        }
        if looped {
            self.close();
        }
        self.close();
    }

    /// Row-major decoding of `counter` into the coordinates of `axes` (the last fastest).
    fn decode(&mut self, counter: &str, axes: &[usize]) {
        let mut stride: u64 = 1;
        for &a in axes.iter().rev() {
            let size = self.grid[a].size;
            self.line(format!("let c{a} = i32(({counter} / {stride}u) % {size}u);"));
            stride *= size;
        }
    }

    /// Element origin of every argument's block at this grid point: `E_d * B_d`.
    fn write_origins(&mut self) {
        let k = self.v.kernel();
        for (pi, p) in k.params.iter().enumerate() {
            if let Some(b) = &p.block {
                for (d, (e, &bs)) in b.index.iter().zip(&b.shape).enumerate() {
                    let mut expr = format!("{}i", e.constant as i32);
                    for (c, name) in &e.terms {
                        let a = self.grid.iter().position(|g| &g.name == name).expect("verified axis");
                        expr = format!("{expr} + {}i * c{a}", *c as i32);
                    }
                    self.line(format!("let o{pi}_{d} = ({expr}) * {bs}i;"));
                }
            }
        }
        let forwarded: BTreeSet<usize> = self.plan.row_forwarded.values().copied().collect();
        for pi in forwarded.union(&self.plan.quad_outputs).copied().collect::<Vec<_>>() {
            if let Some(start) = self.row_start(pi) {
                let p = &k.params[pi];
                let origin = |d: usize| self.origin(pi, d);
                let first = format!("u32({} + i32(lid)) * {}u + u32({})", origin(0), p.ty.shape[1], origin(1));
                self.line(format!("let {start} = ({first}) / 4u;"));
            }
        }
    }

    /// The element origin of argument `pi`'s block along dimension `d` (`0i` for a whole array).
    fn origin(&self, pi: usize, d: usize) -> String {
        if self.v.kernel().params[pi].block.is_some() { format!("o{pi}_{d}") } else { "0i".to_string() }
    }

    /// In the row layout, where each invocation owns at most one row of the `vec4`-bound block of
    /// argument `pi` (it has no more rows than the workgroup has invocations): the name of the
    /// `vec4` where the invocation's row starts, so that quad `j` of the row is `{start} + j`
    /// (array rows and block columns are multiples of 4, [`crate::lower::quad_able`]).
    fn row_start(&self, pi: usize) -> Option<String> {
        let p = &self.v.kernel().params[pi];
        let c = self.plan.row_len().filter(|c| c.is_multiple_of(4))?;
        let bound = self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi);
        let block = p.block_shape();
        (bound && p.ty.shape.len() == 2 && block[1] == c && block[0] <= self.plan.wg as usize).then(|| format!("rq{pi}"))
    }

    /// Whether values of `shape` are held four elements to a `vec4` (`array<vec4<T>, slots / 4>`,
    /// slot `k` at `[k / 4][k % 4]`): in the row layout, values owned by whole rows of a multiple
    /// of 4, so that loads, stores and reductions move four elements at a time.
    fn quad_value(&self, shape: &[usize]) -> bool {
        self.plan.row_len().is_some_and(|c| c.is_multiple_of(4) && self.group_of(shape) == c)
    }

    /// Slot `k` of the private array `id` of a value of `shape`.
    fn at(&self, id: &str, shape: &[usize]) -> String {
        match (self.quad_value(shape), self.quad_lane) {
            (true, Some(t)) => format!("{id}[j].{}", ["x", "y", "z", "w"][t]),
            (true, None) => format!("{id}[k / 4u][k % 4u]"),
            (false, _) => format!("{id}[k]"),
        }
    }

    /// The WGSL type of the private array of a value of `shape` and `dtype`.
    fn array_ty(&self, shape: &[usize], dtype: DType) -> String {
        let slots = self.slots(shape);
        if self.quad_value(shape) {
            format!("array<vec4<{}>, {}>", reg_ty(dtype), slots / 4)
        } else {
            format!("array<{}, {slots}>", reg_ty(dtype))
        }
    }

    /// A loop of the invocations over `n` elements: `k` is the private slot, `e` the element.
    /// Up to [`UNROLL`] slots are written out one by one, so that the private arrays are indexed
    /// by constants and the driver can keep them in registers.
    fn each(&mut self, shape: &[usize], body: impl FnMut(&mut Self)) {
        self.each_sink(shape, None, body);
    }

    /// [`Writer::each`] writing the private array `id` (of `dtype`): `value` gives each slot's
    /// expression. A quad value's four elements are gathered in a local `vec4` and written with
    /// one store.
    fn each_into(&mut self, shape: &[usize], id: &str, dtype: DType, mut value: impl FnMut(&mut Self) -> String) {
        let quad = self.quad_value(shape);
        let local = format!("{id}_q");
        self.each_sink(shape, quad.then(|| (local.clone(), format!("vec4<{}>", reg_ty(dtype)), id.to_string())), |w| {
            let v = value(w);
            let cell = if quad { format!("{local}[{}]", w.quad_lane.unwrap_or(0)) } else { w.at(id, shape) };
            w.line(format!("{cell} = {v};"));
        });
    }

    /// [`Writer::each`], for a quad value with a local `vec4` (name, type) declared before each
    /// quad's four elements and stored to `array[j]` after them.
    fn each_sink(&mut self, shape: &[usize], sink: Option<(String, String, String)>, mut body: impl FnMut(&mut Self)) {
        let hoist = std::mem::take(&mut self.hoist);
        let n: usize = shape.iter().product();
        let slots = self.slots(shape);
        let guard = self.ragged(shape);
        if self.quad_value(shape) {
            // Quad by quad (`j`), its four slots written out, each element addressed statically.
            let quads = slots / 4;
            let unrolled = slots <= UNROLL;
            for q in 0..if unrolled { quads } else { 1 } {
                if unrolled {
                    self.line("{");
                    self.indent += 1;
                    self.line(format!("let j = {q}u;"));
                } else {
                    self.open(format!("for (var j = 0u; j < {quads}u; j++)"));
                }
                if let Some((local, ty, _)) = &sink {
                    self.line(format!("var {local}: {ty};"));
                }
                self.hoist_rows(&hoist);
                for t in 0..4 {
                    self.line("{");
                    self.indent += 1;
                    self.line(format!("let k = 4u * j + {t}u;"));
                    let e = self.element_of_var(shape);
                    self.line(format!("let e = {e};"));
                    if guard {
                        self.open(format!("if (e < {n}u)"));
                    }
                    let outer = self.quad_lane.replace(t);
                    body(self);
                    self.quad_lane = outer;
                    if guard {
                        self.close();
                    }
                    self.close();
                }
                if let Some((local, _, array)) = &sink {
                    self.line(format!("{array}[j] = {local};"));
                }
                self.close();
            }
            self.hoisted.clear();
            return;
        }
        let mut one = |w: &mut Self, slot: Option<usize>| {
            match slot {
                Some(k) => {
                    w.line("{");
                    w.indent += 1;
                    w.line(format!("let k = {k}u;"));
                    let e = w.element(shape, k);
                    w.line(format!("let e = {e};"));
                }
                None => {
                    w.open(format!("for (var k = 0u; k < {slots}u; k++)"));
                    let e = w.element_of_var(shape);
                    w.line(format!("let e = {e};"));
                }
            }
            if guard {
                w.open(format!("if (e < {n}u)"));
            }
            body(w);
            if guard {
                w.close();
            }
            w.close();
        };
        if slots <= UNROLL {
            for k in 0..slots {
                one(self, Some(k));
            }
        } else {
            one(self, None);
        }
    }

    /// A loop of the invocations over the `n` elements (a multiple of 4) four at a time, for
    /// groups of a multiple of 4 ([`Writer::group`]): `e` is the first element of the four, `j`
    /// the invocation's quad, and `slot(t)` the slot of element `e + t`.
    fn each_quad(&mut self, shape: &[usize], mut body: impl FnMut(&mut Self, &dyn Fn(usize) -> String)) {
        let n: usize = shape.iter().product();
        let quads = self.slots(shape) / 4;
        let guard = self.ragged(shape);
        let (g, wg) = (self.group_of(shape), self.plan.wg as usize);
        let unrolled = quads <= UNROLL / 4;
        for q in 0..if unrolled { quads } else { 1 } {
            let slot: Box<dyn Fn(usize) -> String> = if unrolled {
                self.line("{");
                self.indent += 1;
                if self.quad_value(shape) {
                    self.line(format!("let j = {q}u;"));
                }
                let e = self.element(shape, 4 * q);
                self.line(format!("let e = {e};"));
                Box::new(move |t| format!("{}u", 4 * q + t))
            } else {
                self.open(format!("for (var j = 0u; j < {quads}u; j++)"));
                let e = match self.plan.row_runs(shape) {
                    Some(_) => self.run_element(shape, &format!("4u * j / {g}u"), &format!("(4u * j) % {g}u")),
                    None => format!("{g}u * (lid + {wg}u * (4u * j / {g}u)) + (4u * j) % {g}u"),
                };
                self.line(format!("let e = {e};"));
                Box::new(|t| format!("4u * j + {t}u"))
            };
            if guard {
                self.open(format!("if (e < {n}u)"));
            }
            body(self, &slot);
            if guard {
                self.close();
            }
            self.close();
        }
    }

    /// The `vec4` of argument `pi`'s buffer that holds quad `j` (an expression) of its
    /// row-forwarded block: row `lid + wg (4j / c)` of the block, from column `(4j) % c`.
    fn row_quad(&self, pi: usize, j: &str) -> String {
        if let Some(start) = self.row_start(pi) {
            return format!("a{pi}[{start} + {j}]");
        }
        let p = &self.v.kernel().params[pi];
        let c = self.plan.row_len().expect("row layout");
        let origin = |d: usize| self.origin(pi, d);
        let (row, col) = (format!("lid + {}u * (4u * {j} / {c}u)", self.plan.wg), format!("(4u * {j}) % {c}u"));
        format!("a{pi}[(u32({} + i32({row})) * {}u + u32({}) + {col}) / 4u]", origin(0), p.ty.shape[1], origin(1))
    }

    /// Reads quad `j` of each row-forwarded block in `names` into `{id}_q`, for the four
    /// elements that follow.
    fn hoist_rows(&mut self, names: &[String]) {
        for name in names {
            let q = self.row_quad(self.plan.row_forwarded[name], "j");
            let id = self.ident(name);
            self.line(format!("let {id}_q = {q};"));
            self.hoisted.insert(name.clone());
        }
    }

    /// The row-forwarded blocks that `reads` read, through values computed where they are read.
    fn rows_read(&self, reads: &[Read]) -> Vec<String> {
        let mut out = BTreeSet::new();
        let mut todo: Vec<&Read> = reads.iter().collect();
        while let Some(r) = todo.pop() {
            match r {
                Read::Row(name) => {
                    out.insert(name.clone());
                }
                Read::Deferred(name) => todo.extend(self.deferred[name].reads.iter()),
                _ => {}
            }
        }
        out.into_iter().collect()
    }

    /// Declares the private array of block value `name`.
    fn declare_block(&mut self, name: &str) -> String {
        let ty = self.ty(name);
        let id = self.ident(name);
        let arr = self.array_ty(&ty.shape, ty.dtype);
        self.line(format!("var {id}: {arr};"));
        id
    }

    /// After a block value is made: publish it if another invocation reads it.
    fn defined(&mut self, name: &str) {
        let ty = self.ty(name);
        if ty.is_scalar() || !self.plan.publish.contains(name) {
            return;
        }
        let n = ty.numel();
        let off = self.alloc_words(name, n);
        let id = self.ident(name);
        let word = to_word(ty.dtype, &self.at(&id, &ty.shape));
        self.each(&ty.shape, |w| w.line(format!("tk_ws[wsb + {off}u + e] = {word};")));
        self.pending_publish = true;
    }

    /// A scalar computed by invocation 0 and shared with the workgroup, so that it is uniform.
    fn broadcast_scalar(&mut self, dst: &str, d: DType, compute: impl FnOnce(&mut Self) -> String) {
        self.uses_broadcast = true;
        if self.pending_publish || self.pending_store {
            self.storage_barrier();
        } else {
            self.line("workgroupBarrier();");
        }
        self.open("if (lid == 0u)");
        self.line("let k = 0u;");
        self.line("let e = 0u;");
        let v = compute(self);
        self.line(format!("tk_bc = {};", to_word(d, &v)));
        self.close();
        let id = self.ident(dst);
        self.line(format!("let {id}: {} = {};", reg_ty(d), from_word(d, "workgroupUniformLoad(&tk_bc)")));
    }

    // ---- body ----

    fn write_body(&mut self, body: &[Stmt]) {
        for s in body {
            let head = tessel_plugin_api::ir::print::print_stmt_head(s);
            self.line(format!("// {head}"));
            self.write_stmt(s);
        }
    }

    /// An elementwise result: scalar registers when every operand is one, else a block.
    fn elementwise(&mut self, dst: &str, ops: &[&Operand], linear: bool, f: impl Fn(&mut Self, &[String]) -> String + 'static) {
        let ty = self.ty(dst);
        let res = ty.shape.clone();
        let reads: Vec<Read> = ops.iter().map(|o| self.classify(o, &res, linear)).collect();
        let dtypes: Vec<DType> = ops.iter().map(|o| self.dtype_of(&[o])).collect();
        let other = self.dtype_of(ops);
        // A literal takes the type of the other operand (a `select` condition is bool).
        let lit_ty = |i: usize, w: &Self| match ops[i] {
            Operand::Lit(_) => {
                if ops.len() == 3 && i == 0 {
                    DType::Bool
                } else if ops.len() == 3 {
                    w.dtype_of(&[ops[1], ops[2]])
                } else {
                    other
                }
            }
            Operand::Value(_) => dtypes[i],
        };
        if res.is_empty() {
            if reads.iter().any(|r| matches!(r, Read::Shared { .. })) {
                self.sync_reads(&reads.iter().collect::<Vec<_>>());
                self.broadcast_scalar(dst, ty.dtype, |w| {
                    let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| w.read(r, lit_ty(i, w), &res)).collect();
                    f(w, &xs)
                });
            } else {
                let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| self.read(r, lit_ty(i, self), &res)).collect();
                let v = f(self, &xs);
                let id = self.ident(dst);
                self.line(format!("let {id}: {} = {v};", reg_ty(ty.dtype)));
            }
            return;
        }
        if self.plan.inlined.contains(dst)
            && !self.plan.publish.contains(dst)
            && !reads.iter().any(|r| matches!(r, Read::Shared { .. }))
        {
            // Computed where its one reader reads it, element by element, never stored.
            self.line("// computed where it is read");
            let tys: Vec<DType> = (0..ops.len()).map(|i| lit_ty(i, self)).collect();
            self.deferred.insert(dst.to_string(), Deferred { reads, tys, f: std::rc::Rc::new(f) });
            return;
        }
        self.sync_reads(&reads.iter().collect::<Vec<_>>());
        let fused = self.open_fused(dst);
        let (d, c) = (ty.dtype, self.plan.row_len().unwrap_or(1));
        let value = |w: &mut Self| {
            let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| w.read(r, lit_ty(i, w), &res)).collect();
            let v = f(w, &xs);
            if fused.is_empty() {
                return v;
            }
            let x = w.t();
            w.line(format!("let {x} = {v};"));
            let row = w.row_of_slot(&res, c);
            for (rid, op, _) in &fused {
                let cell = format!("{rid}[{row}]");
                let y = w.reduce_combine(*op, d, &cell, &x);
                w.line(format!("{cell} = {y};"));
            }
            x
        };
        self.hoist = self.rows_read(&reads);
        if self.plan.fused_only.contains(dst) {
            // Only its reductions read it: made element by element into them, never kept.
            self.each(&res, |w| {
                value(w);
            });
        } else {
            let id = self.declare_block(dst);
            self.each_into(&res, &id, d, value);
        }
        // 16-bit floats accumulate in `f32` and round once.
        for (rid, _, rows) in fused.iter().filter(|_| d.is_float() && d != DType::F32) {
            self.open(format!("for (var r = 0u; r < {rows}u; r++)"));
            let v = self.round16(d, &format!("{rid}[r]"));
            self.line(format!("{rid}[r] = {v};"));
            self.close();
        }
        self.defined(dst);
    }

    /// The reductions along rows made with `dst` ([`Plan::fused`]): their private arrays
    /// declared and set to the reduction's identity.
    fn open_fused(&mut self, dst: &str) -> Vec<(String, ReduceOp, usize)> {
        let mut fused: Vec<(&String, ReduceOp)> =
            self.plan.fused.iter().filter(|(_, (_, src))| src == dst).map(|(r, (op, _))| (r, *op)).collect();
        fused.sort_by_key(|f| f.0);
        let d = self.ty(dst).dtype;
        (fused.into_iter())
            .map(|(r, op)| {
                let id = self.declare_block(r);
                let slots = self.slots(&self.ty(r).shape);
                let init = reduce_init(op, d);
                self.line(format!("for (var r = 0u; r < {slots}u; r++) {{ {id}[r] = {init}; }}"));
                (id, op, slots)
            })
            .collect()
    }

    fn write_stmt(&mut self, s: &Stmt) {
        if self.plan.folded(s) {
            self.line("// done by the dot, which adds into the resident block");
            return;
        }
        let dst = s.results.first().cloned().unwrap_or_default();
        match &s.op {
            Op::Load { src, index, mask, other } => self.write_load(&dst, src, index.as_deref(), mask.as_deref(), *other),
            Op::Store { dst: d, index, value, mask } => self.write_store(d, index.as_deref(), value, mask.as_deref()),
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axis = match a {
                    AxisRef::Pos(p) => *p,
                    AxisRef::Name(nm) => self.grid.iter().position(|g| &g.name == nm).expect("verified axis"),
                };
                let v = if matches!(s.op, Op::ProgramId(_)) { format!("c{axis}") } else { format!("{}i", self.grid[axis].size) };
                let id = self.ident(&dst);
                self.line(format!("let {id}: i32 = {v};"));
            }
            Op::Iota { dim } => {
                let ty = self.ty(&dst);
                let (st, size) = (strides(&ty.shape)[*dim], ty.shape[*dim]);
                let cast = reg_ty(ty.dtype);
                self.elementwise(&dst, &[], false, move |_, _| format!("{cast}((e / {st}u) % {size}u)"));
            }
            Op::Full(l) => {
                let d = self.ty(&dst).dtype;
                let v = literal(*l, d);
                self.elementwise(&dst, &[], false, move |_, _| v.clone());
            }
            Op::Zeros => {
                let d = self.ty(&dst).dtype;
                let v = literal(Literal::Int(0), d);
                self.elementwise(&dst, &[], false, move |_, _| v.clone());
            }
            Op::Unary(op, a) => {
                let (d, op) = (self.dtype_of(&[a]), *op);
                self.elementwise(&dst, &[a], false, move |w, x| w.unary(op, d, &x[0]));
            }
            Op::Binary(op, a, b) => {
                let (d, op) = (self.dtype_of(&[a, b]), *op);
                self.elementwise(&dst, &[a, b], false, move |w, x| w.binary(op, d, &x[0], &x[1]));
            }
            Op::Compare(op, a, b) => {
                let (d, op) = (self.dtype_of(&[a, b]), *op);
                self.elementwise(&dst, &[a, b], false, move |_, x| compare(op, d, &x[0], &x[1]));
            }
            Op::Select(c, a, b) => {
                self.elementwise(&dst, &[c, a, b], false, |_, x| format!("select({}, {}, {})", x[2], x[1], x[0]))
            }
            Op::Cast(a) => {
                let (from, to) = (self.dtype_of(&[a]), self.ty(&dst).dtype);
                self.elementwise(&dst, &[a], false, move |w, x| w.cast(from, to, &x[0]));
            }
            Op::Bitcast(a) => {
                let (from, to) = (self.dtype_of(&[a]), self.ty(&dst).dtype);
                self.elementwise(&dst, &[a], false, move |w, x| w.bitcast(from, to, &x[0]));
            }
            Op::Broadcast(a) => self.elementwise(&dst, &[a], false, |_, x| x[0].clone()),
            Op::Reshape(a) => self.elementwise(&dst, &[a], true, |_, x| x[0].clone()),
            Op::Transpose { arg, perm } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: transpose of a value") };
                let in_st = strides(&self.ty(src).shape);
                let out_shape = self.ty(&dst).shape.clone();
                let out_st = strides(&out_shape);
                let idx = perm
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| format!("((e / {}u) % {}u) * {}u", out_st[d], out_shape[d], in_st[p]))
                    .collect::<Vec<_>>()
                    .join(" + ");
                self.gather(&dst, &[src], move |w, offs| {
                    let d = w.ty(src).dtype;
                    from_word(d, &format!("tk_ws[wsb + {}u + {idx}]", offs[0]))
                });
            }
            Op::Reduce { op, arg, axis, .. } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: reduce of a value") };
                if self.plan.fused.contains_key(&dst) {
                    self.line(format!("// made in the loop that makes %{src}"));
                    self.defined(&dst);
                } else {
                    self.write_reduce(&dst, *op, src, *axis);
                }
            }
            Op::Dot { a, b, trans_a, trans_b } => {
                let (Operand::Value(a), Operand::Value(b)) = (a, b) else { unreachable!("verifier: dot of values") };
                self.write_dot(s, &dst, a, b, *trans_a, *trans_b);
            }
            Op::When { cond, body } => {
                let c = match cond {
                    Operand::Lit(l) => literal(*l, DType::Bool),
                    Operand::Value(v) => self.ident(v),
                };
                let before = self.flags();
                self.open(format!("if ({c})"));
                self.write_body(body);
                self.close();
                self.merge_flags(before);
            }
            Op::For { var, lo, hi, step, iters, body } => self.write_for(s, var, lo, hi, step.as_ref(), iters, body),
            Op::Yield(_) => unreachable!("yield is written by its for"),
        }
    }

    /// Values whose elements are read by other invocations: they are published ([`Plan::publish`]),
    /// and a barrier separates their publication from the reads. Returns their word offsets.
    fn read_published(&mut self, srcs: &[&str]) -> Vec<u64> {
        let reads: Vec<Read> =
            srcs.iter().map(|s| Read::Shared { name: s.to_string(), shape: Vec::new(), linear: false }).collect();
        self.sync_reads(&reads.iter().collect::<Vec<_>>());
        srcs.iter().map(|s| *self.offsets.get(*s).unwrap_or_else(|| panic!("the plan publishes %{s}"))).collect()
    }

    /// A block (or scalar) result whose elements read other elements of `srcs`: the sources are
    /// published; `f` gets their word offsets and writes the element expression for `e`.
    fn gather(&mut self, dst: &str, srcs: &[&str], f: impl Fn(&mut Self, &[u64]) -> String) {
        let offs = self.read_published(srcs);
        let ty = self.ty(dst);
        if ty.is_scalar() {
            self.broadcast_scalar(dst, ty.dtype, |w| f(w, &offs));
            return;
        }
        let id = self.declare_block(dst);
        self.each_into(&ty.shape, &id, ty.dtype, |w| f(w, &offs));
        self.defined(dst);
    }

    /// `op` of the accumulator `acc` and `x`, of `dtype`: `max`/`min` of floats propagate NaN.
    fn reduce_combine(&mut self, op: ReduceOp, dtype: DType, acc: &str, x: &str) -> String {
        match (op, dtype.is_float()) {
            (ReduceOp::Sum, _) => format!("{acc} + {x}"),
            (ReduceOp::Prod, _) => format!("{acc} * {x}"),
            (ReduceOp::Max, true) => {
                self.helper("tk_max");
                format!("tk_max({acc}, {x})")
            }
            (ReduceOp::Min, true) => {
                self.helper("tk_min");
                format!("tk_min({acc}, {x})")
            }
            (ReduceOp::Max, false) => format!("max({acc}, {x})"),
            (ReduceOp::Min, false) => format!("min({acc}, {x})"),
        }
    }

    fn write_reduce(&mut self, dst: &str, op: ReduceOp, src: &str, axis: usize) {
        let sty = self.ty(src);
        let (d, shape) = (sty.dtype, sty.shape.clone());
        let inner: usize = shape[axis + 1..].iter().product();
        let n = shape[axis];
        let float = d.is_float();
        let acc_ty = reg_ty(d);
        let init = reduce_init(op, d);
        let combine = move |w: &mut Self, acc: &str, x: &str| w.reduce_combine(op, d, acc, x);
        if self.plan.row_reduce(&shape, axis) {
            // In the row layout: each invocation reduces its own rows. Where the order cannot
            // change the result (`max`/`min`, integers) and the row is a multiple of 4 long, in
            // four interleaved partial results (independent chains the driver can overlap),
            // combined pairwise; float sums and products add in ascending order, as the
            // interpreter does.
            let (sid, id) = (self.ident(src), self.declare_block(dst));
            let rshape = self.ty(dst).shape.clone();
            let exact = matches!(op, ReduceOp::Max | ReduceOp::Min) || !float;
            let lanes = if exact && n.is_multiple_of(4) && n >= 8 { 4 } else { 1 };
            // Rows held as `vec4`s are read a quad at a time.
            let quads = self.quad_value(&shape);
            // A float `max`/`min` over quads: the builtin on each element, and whether any
            // quad held a NaN, one test of the whole quad; NaN at the end where one did (what
            // `tk_max` at every step gives, for a fraction of its work).
            let nan_flag = quads && float && matches!(op, ReduceOp::Max | ReduceOp::Min);
            let combine = move |w: &mut Self, acc: &str, x: &str| {
                if nan_flag {
                    format!("{}({acc}, {x})", if op == ReduceOp::Max { "max" } else { "min" })
                } else {
                    w.reduce_combine(op, d, acc, x)
                }
            };
            self.each(&rshape, |w| {
                let acc = w.t();
                for l in 0..lanes {
                    w.line(format!("var {acc}_{l}: {acc_ty} = {init};"));
                }
                if nan_flag {
                    w.helper("tk_isnan4");
                    w.line(format!("var {acc}_nan = false;"));
                }
                if quads {
                    w.open(format!("for (var r = 0u; r < {}u; r++)", n / 4));
                    let q = match w.plan.row_forwarded.get(src) {
                        Some(&pi) => w.row_quad(pi, &format!("(k * {}u + r)", n / 4)),
                        None => format!("{sid}[k * {}u + r]", n / 4),
                    };
                    w.line(format!("let q = {q};"));
                    if nan_flag {
                        w.line(format!("{acc}_nan = {acc}_nan | tk_isnan4(q);"));
                    }
                    for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                        let l = t % lanes;
                        let x = combine(w, &format!("{acc}_{l}"), &format!("q.{c}"));
                        w.line(format!("{acc}_{l} = {x};"));
                    }
                } else {
                    w.open(format!("for (var r = 0u; r < {n}u; r += {lanes}u)"));
                    for l in 0..lanes {
                        let c = combine(w, &format!("{acc}_{l}"), &format!("{sid}[k * {n}u + r + {l}u]"));
                        w.line(format!("{acc}_{l} = {c};"));
                    }
                }
                w.close();
                let all = if lanes == 4 {
                    let (lo, hi) = (
                        combine(w, &format!("{acc}_0"), &format!("{acc}_1")),
                        combine(w, &format!("{acc}_2"), &format!("{acc}_3")),
                    );
                    combine(w, &lo, &hi)
                } else {
                    format!("{acc}_0")
                };
                let all = if nan_flag {
                    w.helper("tk_f32_bits");
                    format!("select({all}, tk_f32_bits(0x7fc00000u), {acc}_nan)")
                } else {
                    all
                };
                w.line(format!("let {acc} = {all};"));
                let v = w.round16(d, &acc);
                w.line(format!("{id}[k] = {v};"));
            });
            self.defined(dst);
            return;
        }
        self.gather(dst, &[src], move |w, offs| {
            let acc = w.t();
            w.line(format!("var {acc}: {acc_ty} = {init};"));
            w.line(format!("let {acc}_base = (e / {inner}u) * {}u + e % {inner}u;", n * inner));
            w.open(format!("for (var r = 0u; r < {n}u; r++)"));
            let x = from_word(d, &format!("tk_ws[wsb + {}u + {acc}_base + r * {inner}u]", offs[0]));
            let c = combine(w, &acc, &x);
            w.line(format!("{acc} = {c};"));
            w.close();
            w.round16(d, &acc)
        });
    }

    /// `dot`: each invocation accumulates its own output elements in the result's private array
    /// (zero-initialised), the contraction index outermost, so that the operand element all its
    /// outputs share (the column of `b`, when the workgroup size is a multiple of `N`) is read
    /// once per step. Each output sums in ascending order, as the interpreter does.
    fn write_dot(&mut self, s: &Stmt, dst: &str, a: &str, b: &str, trans_a: bool, trans_b: bool) {
        let (ash, bsh) = (self.ty(a).shape.clone(), self.ty(b).shape.clone());
        let (m, kk) = if trans_a { (ash[1], ash[0]) } else { (ash[0], ash[1]) };
        let n = if trans_b { bsh[0] } else { bsh[1] };
        let da = self.ty(a).dtype;
        let published: Vec<&str> = [a, b].into_iter().filter(|v| !self.plan.forwarded.contains_key(*v)).collect();
        let offs = self.read_published(&published);
        let total = m * n;
        let id = self.declare_block(dst);
        let slots = self.slots(&[m, n]);
        // Where the tile goes: the result's slot, or added into the resident output's.
        let fused = self.plan.accumulating.get(dst).map(|a| a.0);
        let into = |slot: usize, x: &str| match fused {
            Some(ri) => format!("r{ri}[{slot}] = r{ri}[{slot}] + {x};"),
            None => format!("{id}[{slot}] = {x};"),
        };
        // Element (row, col) of an operand block: from its argument's buffer where it is a
        // loaded input block (no copy, no barrier), else from the workspace where it was
        // published.
        let reader = |w: &Self, v: &str, cols: usize| -> Reader {
            match w.plan.forwarded.get(v) {
                Some(&pi) => w.direct_reader(pi),
                None => {
                    let off = offs[published.iter().position(|p| *p == v).expect("published")];
                    Box::new(move |row: &str, col: &str| {
                        from_word(da, &format!("tk_ws[wsb + {off}u + ({row}) * {cols}u + {col}]"))
                    })
                }
            }
        };
        let (ra, rb) = (reader(self, a, ash[1]), reader(self, b, bsh[1]));
        let a_at = |i: &str| if trans_a { ra("r", i) } else { ra(i, "r") };
        let b_at = |j: &str| if trans_b { rb(j, "r") } else { rb("r", j) };
        let wg = self.plan.wg as usize;
        let g = self.plan.group;
        let tiled = crate::lower::dot_tiling(self.plan, s).is_some_and(|t| t.0);
        // On hardware, operand chunks of `kc` contraction steps go through workgroup memory.
        let kc = crate::lower::staged_chunk(m, n, kk);
        if let (true, Strategy::Gpu, Some(kc)) = (tiled, self.plan.strategy, kc) {
            let at_a = |row: &str, q: &str| if trans_a { ra(q, row) } else { ra(row, q) };
            let at_b = |q: &str, col: &str| if trans_b { rb(col, q) } else { rb(q, col) };
            self.staged = (self.staged.0.max(m * kc), self.staged.1.max(kc * n));
            self.tile_begin(dst, slots, n, &format!("; operands staged in workgroup memory, {kc} steps at a time"));
            self.open(format!("for (var r0 = 0u; r0 < {kk}u; r0 += {kc}u)"));
            // The previous chunk's reads are done before this one overwrites it.
            self.line("workgroupBarrier();");
            self.open(format!("for (var i = lid; i < {}u; i += {wg}u)", m * kc));
            let x = at_a(&format!("i / {kc}u"), &format!("r0 + i % {kc}u"));
            self.line(format!("tk_sa[i] = {};", to_word(da, &x)));
            self.close();
            let db = self.ty(b).dtype;
            self.open(format!("for (var i = lid; i < {}u; i += {wg}u)", kc * n));
            let x = at_b(&format!("r0 + i / {n}u"), &format!("i % {n}u"));
            self.line(format!("tk_sb[i] = {};", to_word(db, &x)));
            self.close();
            self.line("workgroupBarrier();");
            self.open(format!("for (var q = 0u; q < {kc}u; q++)"));
            self.tile_step(
                [m, n],
                slots,
                |t| from_word(db, &format!("tk_sb[q * {n}u + tc0 + {t}u]")),
                |row| from_word(da, &format!("tk_sa[{row} * {kc}u + q]")),
            );
            self.close();
            self.tile_end(dst, slots, into);
            return;
        }
        let quads = (tiled && !trans_a && !trans_b && kk.is_multiple_of(4))
            .then(|| Some((self.vec4_reader(a)?, self.vec4_reader(b)?)))
            .flatten();
        if let Some((qa, qb)) = quads {
            // The register tile with `vec4` reads: four steps of the contraction at once, a row
            // of the tile's `a` and four rows of its `b` columns as one read each.
            self.line(format!("// a register tile of {} rows x {g} columns per invocation, vec4 reads", slots / g));
            self.line("{");
            self.indent += 1;
            self.line(format!("let tc0 = ({g}u * lid) % {n}u;"));
            let acc_ty = reg_ty(self.ty(dst).dtype);
            let quads = g / 4;
            for j in 0..slots / g {
                for q in 0..quads {
                    self.line(format!("var acc{j}_{q}: vec4<{acc_ty}>;"));
                }
            }
            self.open(format!("for (var r = 0u; r < {kk}u; r += 4u)"));
            for t in 0..4 {
                for q in 0..quads {
                    self.line(format!("let bq{t}_{q} = {};", qb(&format!("r + {t}u"), &format!("tc0 + {}u", 4 * q))));
                }
            }
            let guard = self.ragged(&[m, n]);
            for j in 0..slots / g {
                let e = self.element(&[m, n], g * j);
                self.open_group(&e, total, guard);
                let row = self.tile_row(&[m, n], j, &e);
                self.line(format!("let aq = {};", qa(&row, "r")));
                // Ascending in the contraction, as the interpreter sums.
                for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                    for q in 0..quads {
                        self.line(format!("acc{j}_{q} = acc{j}_{q} + aq.{c} * bq{t}_{q};"));
                    }
                }
                self.close();
            }
            self.close();
            for j in 0..slots / g {
                for q in 0..quads {
                    for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                        let line = into(g * j + 4 * q + t, &format!("acc{j}_{q}.{c}"));
                        self.line(line);
                    }
                }
            }
            self.close();
            self.defined(dst);
            return;
        }
        if tiled {
            // A register tile: the invocation's groups are `g` adjacent columns of rows `g wg / n`
            // apart, so each step reads `g` elements of `b` and one of `a` per row.
            self.tile_begin(dst, slots, n, "");
            self.open(format!("for (var r = 0u; r < {kk}u; r++)"));
            self.tile_step([m, n], slots, |t| b_at(&format!("(tc0 + {t}u)")), |row| a_at(row));
            self.tile_end(dst, slots, into);
            return;
        }
        let shared_col = g == 1 && wg.is_multiple_of(n);
        self.open(format!("for (var r = 0u; r < {kk}u; r++)"));
        if shared_col {
            self.line(format!("let bv = {};", b_at(&format!("lid % {n}u"))));
        }
        self.open(format!("for (var k = 0u; k < {slots}u; k++)"));
        let e = self.element_of_var(&[m, n]);
        self.line(format!("let e = {e};"));
        let guard = self.ragged(&[m, n]);
        if guard {
            self.open(format!("if (e < {total}u)"));
        }
        if !shared_col {
            self.line(format!("let bv = {};", b_at(&format!("e % {n}u"))));
        }
        self.line(format!("{id}[k] = {id}[k] + {} * bv;", a_at(&format!("e / {n}u"))));
        if guard {
            self.close();
        }
        self.close();
        self.close();
        if let Some(ri) = fused {
            self.each(&[m, n], |w| w.line(format!("r{ri}[k] = r{ri}[k] + {id}[k];")));
        }
        self.defined(dst);
    }

    /// Opens a scalar register tile of `dot` result `dst` (`n` columns): the tile's first
    /// column and its accumulators, in scalars (registers), not in the value's array (memory).
    fn tile_begin(&mut self, dst: &str, slots: usize, n: usize, how: &str) {
        let g = self.plan.group;
        self.line(format!("// a register tile of {} rows x {g} columns per invocation{how}", slots / g));
        self.line("{");
        self.indent += 1;
        self.line(format!("let tc0 = ({g}u * lid) % {n}u;"));
        let acc_ty = reg_ty(self.ty(dst).dtype);
        for s in 0..slots {
            self.line(format!("var acc{s}: {acc_ty};"));
        }
    }

    /// One step of the contraction of a scalar register tile over a `dot` result of `shape`: the
    /// `g` values of `b` for the tile's columns (`b_of(t)`), then for each of the invocation's
    /// rows the value of `a` (`a_of(row)`, `row` a WGSL expression) times them into the
    /// accumulators `acc{slot}`.
    fn tile_step(&mut self, shape: [usize; 2], slots: usize, b_of: impl Fn(usize) -> String, a_of: impl Fn(&str) -> String) {
        let (g, [m, n]) = (self.plan.group, shape);
        for t in 0..g {
            self.line(format!("let b{t} = {};", b_of(t)));
        }
        let guard = self.ragged(&shape);
        for j in 0..slots / g {
            let e = self.element(&shape, g * j);
            self.open_group(&e, m * n, guard);
            let row = self.tile_row(&shape, j, &e);
            self.line(format!("let av = {};", a_of(&row)));
            for t in 0..g {
                let s = g * j + t;
                self.line(format!("acc{s} = acc{s} + av * b{t};"));
            }
            self.close();
        }
    }

    /// Closes a scalar register tile's contraction loop and block: each accumulator goes where
    /// `into(slot, accumulator)` says.
    fn tile_end(&mut self, dst: &str, slots: usize, into: impl Fn(usize, &str) -> String) {
        self.close();
        for s in 0..slots {
            let line = into(s, &format!("acc{s}"));
            self.line(line);
        }
        self.close();
        self.defined(dst);
    }

    /// The row of a register tile's group `j`, whose first element is `e`, in a `dot` result of
    /// `shape`: its place in the invocation's run of rows where there is one.
    fn tile_row(&self, shape: &[usize], j: usize, e: &str) -> String {
        match self.plan.row_runs(shape) {
            Some((groups, rows)) => format!("({rows}u * (lid / {groups}u) + {j}u)"),
            None => format!("(({e}) / {}u)", shape[1]),
        }
    }

    /// Opens the block of a register tile's group at element `e`: an `if` where the group may lie
    /// past the `total` elements (`guard`), a plain block otherwise.
    fn open_group(&mut self, e: &str, total: usize, guard: bool) {
        if guard {
            self.open(format!("if ({e} < {total}u)"));
        } else {
            self.line("{");
            self.indent += 1;
        }
    }

    /// Binds argument `pi` a second time as `array<vec4<T>>` where there is room; whether it is.
    fn view(&mut self, pi: usize) -> bool {
        let room = self.plan.views.contains(&pi);
        if room {
            self.views.insert(pi);
        }
        room
    }

    /// Where `v` is a forwarded input block that lies inside its array at every grid point, with
    /// rows of a multiple of 4 elements at column origins of a multiple of 4: reads the four
    /// elements (row, col ..= col + 3) of its block (`col` a multiple of 4) as one `vec4`, from a
    /// second binding of the argument's buffer as `array<vec4<T>>`.
    fn vec4_reader(&mut self, v: &str) -> Option<Reader> {
        let &pi = self.plan.forwarded.get(v)?;
        let p = &self.v.kernel().params[pi];
        let dims = p.ty.shape.clone();
        if !quad_able(self.grid, p) || !self.view(pi) {
            return None;
        }
        let origin = |d: usize| self.origin(pi, d);
        let (o0, o1) = (origin(0), origin(1));
        Some(Box::new(move |row: &str, col: &str| {
            format!("a{pi}v[(u32({o0} + i32({row})) * {}u + u32({o1} + i32({col}))) / 4u]", dims[1])
        }))
    }

    /// Whether every block of argument `pi` lies inside the array in dimension `d`, at every
    /// point of the grid.
    fn block_inside(&self, pi: usize, d: usize) -> bool {
        inside(self.grid, &self.v.kernel().params[pi], d)
    }

    /// Reads element (row, col) of argument `pi`'s block from its buffer: 0 outside the array,
    /// the check dropped in each dimension where every block of the grid is inside.
    fn direct_reader(&self, pi: usize) -> Reader {
        let p = &self.v.kernel().params[pi];
        let dims = p.ty.shape.clone();
        let inside: Vec<bool> = (0..2).map(|d| self.block_inside(pi, d)).collect();
        let origin = |d: usize| self.origin(pi, d);
        let (o0, o1) = (origin(0), origin(1));
        let zero = literal(Literal::Int(0), p.ty.dtype);
        Box::new(move |row: &str, col: &str| {
            let (gr, gc) = (format!("({o0} + i32({row}))"), format!("({o1} + i32({col}))"));
            let cell = format!("a{pi}[u32({gr}) * {}u + u32({gc})]", dims[1]);
            let checks: Vec<String> = [(inside[0], &gr, dims[0]), (inside[1], &gc, dims[1])]
                .into_iter()
                .filter(|(inside, _, _)| !inside)
                .map(|(_, g, dim)| format!("u32({g}) < {dim}u"))
                .collect();
            if checks.is_empty() { cell } else { format!("select({zero}, {cell}, {})", checks.join(" && ")) }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn write_for(
        &mut self,
        s: &Stmt,
        var: &str,
        lo: &Operand,
        hi: &Operand,
        step: Option<&Operand>,
        iters: &[(String, Operand)],
        body: &[Stmt],
    ) {
        let scalar = |w: &mut Self, o: &Operand| match o {
            Operand::Lit(l) => literal(*l, DType::I32),
            Operand::Value(v) => w.ident(v),
        };
        let (lo, hi) = (scalar(self, lo), scalar(self, hi));
        let step = step.map(|o| scalar(self, o)).unwrap_or_else(|| "1i".into());
        // The carried values: one variable each, assigned at the start and by `yield`.
        for (name, init) in iters {
            let ty = self.ty(name);
            let id = self.ident(name);
            let reg = reg_ty(ty.dtype);
            if ty.is_scalar() {
                let v = match init {
                    Operand::Lit(l) => literal(*l, ty.dtype),
                    Operand::Value(x) => self.ident(x),
                };
                self.line(format!("var {id}: {reg} = {v};"));
            } else {
                match init {
                    Operand::Value(x) => {
                        let x = self.ident(x);
                        self.line(format!("var {id} = {x};"));
                    }
                    Operand::Lit(l) => {
                        let l = literal(*l, ty.dtype);
                        let arr = self.array_ty(&ty.shape, ty.dtype);
                        self.line(format!("var {id}: {arr};"));
                        self.each_into(&ty.shape, &id, ty.dtype, |_| l.clone());
                    }
                }
            }
        }
        let i = self.ident(var);
        let go = self.t();
        self.line(format!("var {i}: i32 = {lo};"));
        self.line(format!("var {go} = {step} > 0i && {lo} < {hi};"));
        let before = self.flags();
        self.open("loop");
        self.line(format!("if (!{go}) {{ break; }}"));
        self.loop_barrier();
        for (name, _) in iters {
            self.defined(name);
        }
        let (last, rest) = match body.split_last() {
            Some((l, r)) if matches!(l.op, Op::Yield(_)) => (Some(l), r),
            _ => (None, body),
        };
        self.write_body(rest);
        if let Some(Stmt { op: Op::Yield(values), .. }) = last {
            self.line("// yield");
            let tmps: Vec<String> = values
                .iter()
                .zip(iters)
                .map(|(v, (name, _))| {
                    let t = self.t();
                    let d = self.ty(name).dtype;
                    let x = match v {
                        Operand::Lit(l) => literal(*l, d),
                        Operand::Value(x) => self.ident(x),
                    };
                    self.line(format!("let {t} = {x};"));
                    t
                })
                .collect();
            for ((name, _), t) in iters.iter().zip(tmps) {
                let id = self.ident(name);
                self.line(format!("{id} = {t};"));
            }
        }
        let next = self.t();
        self.line(format!("let {next} = {i} + {step};"));
        self.line(format!("{go} = {next} > {i} && {next} < {hi};"));
        self.line(format!("{i} = {next};"));
        self.close();
        self.merge_flags(before);
        for (r, (name, _)) in s.results.iter().zip(iters) {
            let (rid, id) = (self.ident(r), self.ident(name));
            // Blocks are `var`s, which may be indexed by a variable.
            let kw = if self.ty(r).is_scalar() { "let" } else { "var" };
            self.line(format!("{kw} {rid} = {id};"));
            self.defined(r);
        }
    }

    // ---- memory ----

    /// The region selected by `index` in `param`'s block, per dimension: the start expression,
    /// the length, whether the dimension stays, and the range of the start over the whole grid
    /// where it is known (no dynamic start).
    fn region(&mut self, pi: usize, param: &Param, index: Option<&[Index]>) -> Vec<Dim> {
        let block = param.block_shape().to_vec();
        (0..block.len())
            .map(|d| {
                let (origin, range) = match &param.block {
                    Some(_) => (format!("o{pi}_{d}"), Some(origin_range(self.grid, param, d))),
                    None => ("0i".to_string(), Some((0, 0))),
                };
                let start = |w: &mut Self, o: &Operand| match o {
                    Operand::Lit(l) => {
                        let v = l.as_i64();
                        (format!("({origin} + {}i)", v as i32), range.map(|(lo, hi)| (lo + v, hi + v)))
                    }
                    Operand::Value(v) => {
                        let id = w.ident(v);
                        let cast = if w.ty(v).dtype == DType::U32 { format!("bitcast<i32>({id})") } else { id };
                        (format!("({origin} + {cast})"), None)
                    }
                };
                let (start, len, keep, range) = match index.map(|ix| &ix[d]) {
                    None | Some(Index::Full) => (origin.clone(), block[d], true, range),
                    Some(Index::Slice { start: s, size }) => {
                        let (st, r) = start(self, s);
                        (st, *size, true, r)
                    }
                    Some(Index::At(a)) => {
                        let (st, r) = start(self, a);
                        (st, 1, false, r)
                    }
                };
                Dim { start, len, keep, range }
            })
            .collect()
    }

    /// Writes the flat index of element `e` of a region and its bounds check; returns (the
    /// check, or `None` where every element is provably inside the array, and the flat index).
    fn address(&mut self, region: &[Dim], dims: &[usize]) -> (Option<String>, String) {
        let lens: Vec<usize> = region.iter().map(|r| r.len).collect();
        let (ls, ast) = (strides(&lens), strides(dims));
        let flat = self.t();
        let mut conds = Vec::new();
        let mut terms = Vec::new();
        for (d, r) in region.iter().enumerate() {
            let g = self.t();
            let pos = if r.len == 1 { String::new() } else { format!("i32((e / {}u) % {}u) + ", ls[d], r.len) };
            self.line(format!("let {g} = {pos}{};", r.start));
            // Drop the check where it is redundant (docs/language.md §5).
            let inside = r.range.is_some_and(|(lo, hi)| lo >= 0 && hi + r.len as i64 <= dims[d] as i64);
            if !inside {
                conds.push(format!("u32({g}) < {}u", dims[d]));
            }
            terms.push(format!("u32({g}) * {}u", ast[d]));
        }
        let terms = if terms.is_empty() { "0u".to_string() } else { terms.join(" + ") };
        self.line(format!("let {flat} = {terms};"));
        (if conds.is_empty() { None } else { Some(conds.join(" && ")) }, flat)
    }

    /// The bounds check and the mask together, as a `let`; `None` when neither applies.
    fn access_ok(&mut self, check: Option<String>, mask: Option<String>) -> Option<String> {
        let cond = match (check, mask) {
            (None, None) => return None,
            (Some(c), None) | (None, Some(c)) => c,
            (Some(c), Some(m)) => format!("{c} && {m}"),
        };
        let ok = self.t();
        self.line(format!("let {ok} = {cond};"));
        Some(ok)
    }

    /// The storage expression of element `flat` of argument or scratch `p`.
    fn cell(&mut self, pi: usize, p: &Param, flat: &str) -> String {
        if p.kind == ParamKind::Scratch {
            let off = self.offsets.get(&p.name).copied().unwrap_or(0);
            format!("tk_ws[wsb + {off}u + {flat}]")
        } else {
            format!("a{pi}[{flat}]")
        }
    }

    fn param(&self, name: &str) -> (usize, Param) {
        let k = self.v.kernel();
        let pi = k.params.iter().position(|p| p.name == name).expect("verified argument");
        (pi, k.params[pi].clone())
    }

    fn write_load(&mut self, dst: &str, src: &str, index: Option<&[Index]>, mask: Option<&str>, other: Option<Literal>) {
        if self.plan.dot_only.contains(dst) {
            self.line("// read by its dot straight from the buffer");
            return;
        }
        if self.plan.row_forwarded.contains_key(dst) {
            self.line("// read where it is used, a vec4 of its buffer at a time");
            return;
        }
        if let Some(&pi) = self.plan.resident.get(src) {
            let id = self.declare_block(dst);
            let ty = self.ty(dst);
            self.each_into(&ty.shape, &id, ty.dtype, |_| format!("r{pi}[k]"));
            self.defined(dst);
            return;
        }
        let (pi, p) = self.param(src);
        let d = p.ty.dtype;
        let region = self.region(pi, &p, index);
        let res = self.ty(dst).shape.clone();
        if self.plan.vec4_load(&p, index, mask, &res) && (self.plan.quad_inputs.contains(&pi) || self.view(pi)) {
            // Four adjacent elements of the block, inside the array, as one read: from the
            // argument bound as `vec4`s, or from its `vec4` view.
            let arr = if self.plan.quad_inputs.contains(&pi) { format!("a{pi}") } else { format!("a{pi}v") };
            let id = self.declare_block(dst);
            self.each_quad(&res, |w, slot| {
                let (_, flat) = w.address(&region, &p.ty.shape);
                let q = w.t();
                w.line(format!("let {q} = {arr}[{flat} / 4u];"));
                if w.quad_value(&res) {
                    w.line(format!("{id}[j] = {q};"));
                } else {
                    for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                        w.line(format!("{id}[{}] = {q}.{c};", slot(t)));
                    }
                }
            });
            self.defined(dst);
            return;
        }
        let mask_read = mask.map(|m| self.classify(&Operand::Value(m.to_string()), &res, false));
        if p.kind != ParamKind::In && self.pending_store {
            self.storage_barrier();
        }
        self.sync_reads(&mask_read.iter().collect::<Vec<_>>());
        if p.kind != ParamKind::In {
            self.pending_ref_load = true;
        }
        let other = literal(other.unwrap_or(Literal::Int(0)), d);
        let body = |w: &mut Self| -> String {
            let (check, flat) = w.address(&region, &p.ty.shape);
            let mv = mask_read.as_ref().map(|m| w.read(m, DType::Bool, &res));
            let ok = w.access_ok(check, mv);
            let x = w.t();
            let cell = w.cell(pi, &p, &flat);
            // Scratch cells and `bool` arrays hold words; other arrays hold the register type.
            let val = if p.kind == ParamKind::Scratch || d == DType::Bool { from_word(d, &cell) } else { cell };
            match ok {
                Some(ok) => {
                    w.line(format!("var {x}: {} = {other};", reg_ty(d)));
                    w.line(format!("if ({ok}) {{ {x} = {val}; }}"));
                }
                None => w.line(format!("let {x}: {} = {val};", reg_ty(d))),
            }
            x
        };
        if res.is_empty() {
            self.broadcast_scalar(dst, d, body);
            return;
        }
        let id = self.declare_block(dst);
        self.each_into(&res, &id, d, body);
        self.defined(dst);
    }

    fn write_store(&mut self, dst: &str, index: Option<&[Index]>, value: &Operand, mask: Option<&str>) {
        let (pi, p) = self.param(dst);
        let d = p.ty.dtype;
        let region = self.region(pi, &p, index);
        let sel: Vec<usize> = region.iter().filter(|r| r.keep).map(|r| r.len).collect();
        let vread = self.classify(value, &sel, false);
        let mask_read = mask.map(|m| self.classify(&Operand::Value(m.to_string()), &sel, false));
        if let Some(&ri) = self.plan.resident.get(dst) {
            self.sync_reads(&[&vread]);
            self.each(&sel, |w| {
                let v = w.read(&vread, d, &sel);
                w.line(format!("r{ri}[k] = {v};"));
            });
            return;
        }
        if self.pending_store || self.pending_ref_load {
            self.storage_barrier();
        }
        let mut reads = vec![&vread];
        reads.extend(mask_read.iter());
        self.sync_reads(&reads);
        if self.plan.quad_outputs.contains(&pi) {
            // Four adjacent elements as one write, to the argument bound as `vec4`s.
            let rt = reg_ty(d);
            let start = self.row_start(pi).filter(|_| self.quad_value(&sel) && index.is_none());
            self.each_quad(&sel, |w, slot| {
                // The invocation's row from its start, or the element's address (inside the
                // array: `quad_able`).
                let cell = match &start {
                    Some(start) => format!("{start} + j"),
                    None => format!("{} / 4u", w.address(&region, &p.ty.shape).1),
                };
                let q = match &vread {
                    Read::Own(id) if w.quad_value(&sel) => format!("{id}[j]"),
                    Read::Row(name) if w.quad_value(&sel) => w.row_quad(w.plan.row_forwarded[name], "j"),
                    Read::Own(id) => {
                        format!("vec4<{rt}>({})", (0..4).map(|t| format!("{id}[{}]", slot(t))).collect::<Vec<_>>().join(", "))
                    }
                    _ => {
                        let q = w.t();
                        w.line(format!("var {q}: vec4<{rt}>;"));
                        if w.quad_value(&sel) {
                            let rows = w.rows_read(std::slice::from_ref(&vread));
                            w.hoist_rows(&rows);
                        }
                        for t in 0..4 {
                            w.line("{");
                            w.indent += 1;
                            w.line(format!("let k = {};", slot(t)));
                            w.line(format!("let e = e + {t}u;"));
                            let outer = w.quad_lane.replace(t);
                            let v = w.read(&vread, d, &sel);
                            w.quad_lane = outer;
                            w.line(format!("{q}[{t}] = {v};"));
                            w.close();
                        }
                        w.hoisted.clear();
                        q
                    }
                };
                w.line(format!("a{pi}[{cell}] = {q};"));
            });
            self.pending_store = true;
            return;
        }
        let sel2 = sel.clone();
        self.store_cells(pi, &p, &region, &sel.clone(), mask_read.map(|m| (m, sel2)), |w| w.read(&vread, d, &sel));
    }

    /// Stores the `n` elements of `region` of argument or scratch `pi`, element `e` from
    /// `value` (slot `k`), where the mask (read for a result of the given shape) allows.
    fn store_cells(
        &mut self,
        pi: usize,
        p: &Param,
        region: &[Dim],
        shape: &[usize],
        mask: Option<(Read, Vec<usize>)>,
        value: impl Fn(&mut Self) -> String,
    ) {
        let d = p.ty.dtype;
        self.each(shape, |w| {
            let (check, flat) = w.address(region, &p.ty.shape);
            let mv = mask.as_ref().map(|(m, sel)| w.read(m, DType::Bool, sel));
            let ok = w.access_ok(check, mv);
            let v = value(w);
            let cell = w.cell(pi, p, &flat);
            let word = if p.kind == ParamKind::Scratch || d == DType::Bool { to_word(d, &v) } else { v };
            match ok {
                Some(ok) => w.line(format!("if ({ok}) {{ {cell} = {word}; }}")),
                None => w.line(format!("{cell} = {word};")),
            }
        });
        self.pending_store = true;
    }

    // ---- element operations ----

    /// Rounds a float register expression to a 16-bit float type (no-op otherwise).
    fn round16(&mut self, d: DType, x: &str) -> String {
        match d {
            DType::F16 => {
                self.helper("tk_round_f16");
                format!("tk_round_f16({x})")
            }
            DType::BF16 => {
                self.helper("tk_round_bf16");
                format!("tk_round_bf16({x})")
            }
            _ => x.to_string(),
        }
    }

    fn unary(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let v = match (op, d) {
            (UnaryOp::Neg, DType::U32) => format!("(0u - {x})"),
            (UnaryOp::Neg, _) => format!("(-{x})"),
            (UnaryOp::Abs, DType::U32) => x.to_string(),
            (UnaryOp::Abs, _) => format!("abs({x})"),
            (UnaryOp::Not, DType::Bool) => format!("(!{x})"),
            (UnaryOp::Not, _) => format!("(~{x})"),
            (UnaryOp::Exp, _) => self.call(libm::exp, &[x]),
            (UnaryOp::Exp2, _) => self.call(libm::exp2, &[x]),
            (UnaryOp::Log, _) => self.call(libm::log, &[x]),
            (UnaryOp::Log2, _) => self.call(libm::log2, &[x]),
            (UnaryOp::Sqrt, _) => format!("sqrt({x})"),
            (UnaryOp::Rsqrt, _) => format!("inverseSqrt({x})"),
            (UnaryOp::Sin, _) => self.call(libm::sin, &[x]),
            (UnaryOp::Cos, _) => self.call(libm::cos, &[x]),
            (UnaryOp::Tanh, _) => self.call(libm::tanh, &[x]),
            (UnaryOp::Logistic, _) => self.call(libm::logistic, &[x]),
            (UnaryOp::Floor, _) => format!("floor({x})"),
            (UnaryOp::Ceil, _) => format!("ceil({x})"),
        };
        self.round16(d, &v)
    }

    fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let float = d.is_float();
        let sfx = if d == DType::I32 { "i32" } else { "u32" };
        let v = match op {
            BinaryOp::Add => format!("({x} + {y})"),
            BinaryOp::Sub => format!("({x} - {y})"),
            BinaryOp::Mul => format!("({x} * {y})"),
            BinaryOp::Div if float => format!("({x} / {y})"),
            // WGSL's `%` is x - y trunc(x / y), not C's fmod.
            BinaryOp::Rem if float => self.call(libm::fmod, &[x, y]),
            BinaryOp::Div | BinaryOp::Rem => {
                let name = if op == BinaryOp::Div { "div" } else { "rem" };
                let h = match (name, sfx) {
                    ("div", "i32") => "tk_div_i32",
                    ("div", _) => "tk_div_u32",
                    (_, "i32") => "tk_rem_i32",
                    _ => "tk_rem_u32",
                };
                self.helper(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max | BinaryOp::Min if float => {
                let h = if op == BinaryOp::Max { "tk_max" } else { "tk_min" };
                self.helper(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max => format!("max({x}, {y})"),
            BinaryOp::Min => format!("min({x}, {y})"),
            BinaryOp::And => format!("({x} & {y})"),
            BinaryOp::Or => format!("({x} | {y})"),
            BinaryOp::Xor if d == DType::Bool => format!("({x} != {y})"),
            BinaryOp::Xor => format!("({x} ^ {y})"),
            BinaryOp::Shl => format!("({x} << (u32({y}) & 31u))"),
            BinaryOp::Shr => format!("({x} >> (u32({y}) & 31u))"),
            BinaryOp::Pow => self.call(libm::pow, &[x, y]),
        };
        if float { self.round16(d, &v) } else { v }
    }

    fn cast(&mut self, from: DType, to: DType, x: &str) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            (a, b) if a.is_float() && b.is_float() => self.round16(b, x),
            (a, DType::Bool) if a.is_float() => format!("((bitcast<u32>({x}) & 0x7fffffffu) != 0u)"),
            (a, DType::I32) if a.is_float() => {
                self.helper("tk_f2i");
                format!("tk_f2i({x})")
            }
            (a, DType::U32) if a.is_float() => {
                self.helper("tk_f2u");
                format!("tk_f2u({x})")
            }
            // Floats made from integers pass through `tk_f32_bits` too: an integer the driver
            // can compute (`xor %n, %n`) would otherwise be a float constant it folds with.
            (DType::Bool, b) if b.is_float() => {
                self.helper("tk_f32_bits");
                format!("tk_f32_bits(select(0u, 1065353216u, {x}))")
            }
            (_, b) if b.is_float() => {
                self.helper("tk_f32_bits");
                let v = format!("tk_f32_bits(bitcast<u32>(f32({x})))");
                self.round16(b, &v)
            }
            (DType::Bool, DType::I32) => format!("select(0i, 1i, {x})"),
            (DType::Bool, DType::U32) => format!("select(0u, 1u, {x})"),
            (DType::I32, DType::Bool) => format!("({x} != 0i)"),
            (DType::U32, DType::Bool) => format!("({x} != 0u)"),
            (_, b) => format!("bitcast<{}>({x})", reg_ty(b)),
        }
    }

    fn bitcast(&mut self, from: DType, to: DType, x: &str) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            (DType::F16, DType::BF16) => {
                self.helper("tk_f16_bits");
                format!("bitcast<f32>(tk_f16_bits({x}) << 16u)")
            }
            (DType::BF16, DType::F16) => format!("unpack2x16float(bitcast<u32>({x}) >> 16u).x"),
            // Opaque, as a cast to a float is (`cast`).
            (DType::I32 | DType::U32, DType::F32) => format!("tk_f32_bits(bitcast<u32>({x}))"),
            (_, b) => format!("bitcast<{}>({x})", reg_ty(b)),
        }
    }

    // ---- module ----

    fn finish(mut self, zeroed: &[String]) -> String {
        // Literals and the maths functions are written as text; the helpers they call are found
        // in it.
        for (name, _) in HELPERS {
            let call = format!("{name}(");
            if self.out.contains(&call) || self.libm.values().any(|f| f.contains(&call)) {
                self.helper(name);
            }
        }
        let [gx, gy] = self.plan.groups;
        let groups = if gy == 1 { format!("{gx}") } else { format!("{gx}×{gy}") };
        let walk = if self.plan.strided { ", each walking the programs with a stride" } else { "" };
        let k = self.v.kernel();
        let mut m = String::new();
        let _ = writeln!(m, "// tessel: kernel `{}` for the wgpu backend", k.name);
        let grid: Vec<String> =
            self.grid.iter().map(|a| format!("{}: {}{}", a.name, a.size, if a.seq { " seq" } else { "" })).collect();
        let _ = writeln!(
            m,
            "// grid ({}): {} programs on {groups} workgroups of {} invocations{walk}; {} workspace bytes per workgroup",
            grid.join(", "),
            self.plan.programs,
            self.plan.wg,
            self.next_word * 4
        );
        let _ = writeln!(
            m,
            "// strategy: {}",
            match self.plan.strategy {
                Strategy::Cpu => "cpu (operands read from their buffers; no workgroup memory)",
                Strategy::Gpu => "gpu (dot operands staged in workgroup memory; no row layout)",
            }
        );
        let _ = writeln!(
            m,
            "// elements: {}",
            if let Some(c) = self.plan.row_len() {
                format!("whole rows of {c} per invocation (row layout: reductions along rows stay in the invocation)")
            } else if self.plan.group > 1 && self.plan.dots {
                format!(
                    "each invocation owns groups of {} adjacent ones (register tiles for dot){}",
                    self.plan.group,
                    self.runs()
                )
            } else if self.plan.group > 1 {
                format!("each invocation owns groups of {} adjacent ones (vec4 reads and writes)", self.plan.group)
            } else {
                "one by one, invocation lid owning lid, lid + workgroup size, ...".to_string()
            }
        );
        if !self.plan.row_forwarded.is_empty() {
            let mut names: Vec<String> = self.plan.row_forwarded.keys().map(|x| format!("%{x}")).collect();
            names.sort();
            let _ = writeln!(m, "// loads read where they are used, a vec4 of the buffer at a time: {}", names.join(", "));
        }
        if !self.plan.fused.is_empty() {
            let mut names: Vec<String> =
                self.plan.fused.iter().map(|(r, (op, x))| format!("%{r} ({} of %{x})", op.name())).collect();
            names.sort();
            let _ = writeln!(m, "// reductions made in the loop that makes their operand: {}", names.join(", "));
        }
        if !self.plan.resident.is_empty() {
            let mut names: Vec<&str> = self.plan.resident.keys().map(String::as_str).collect();
            names.sort();
            let mut folded: Vec<&str> = self.plan.accumulating.keys().map(String::as_str).collect();
            folded.sort();
            let folded =
                if folded.is_empty() { String::new() } else { format!("; dots adding into them: %{}", folded.join(", %")) };
            let _ = writeln!(m, "// outputs kept in registers across the seq steps: {}{folded}", names.join(", "));
        }
        let _ = writeln!(
            m,
            "// outputs zeroed before the dispatch: {}",
            if zeroed.is_empty() { "none (each is stored whole before any read)".to_string() } else { zeroed.join(", ") }
        );
        let _ = writeln!(m);
        let _ = writeln!(m, "const PROGRAMS: u32 = {}u;", self.plan.programs);
        let _ = writeln!(
            m,
            "const GROUPS: u32 = {};",
            if self.plan.strided { format!("{gx}u") } else { format!("{}u", u64::from(gx) * u64::from(gy)) }
        );
        let _ = writeln!(m, "const WS_WORDS: u32 = {}u;", self.next_word);
        let _ = writeln!(m);
        let mut binding = 0;
        for (pi, p) in k.params.iter().enumerate() {
            if p.kind == ParamKind::Scratch {
                continue;
            }
            let access = if p.kind == ParamKind::In { "read" } else { "read_write" };
            let _ = writeln!(
                m,
                "@group(0) @binding({binding}) var<storage, {access}> a{pi}: array<{}>; // {} {}: {}{}",
                if self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi) {
                    format!("vec4<{}>", buf_ty(p.ty.dtype))
                } else {
                    buf_ty(p.ty.dtype).to_string()
                },
                p.kind.keyword(),
                p.name,
                p.ty,
                if self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi) { ", as vec4" } else { "" }
            );
            binding += 1;
        }
        if self.next_word > 0 {
            let _ = writeln!(m, "@group(0) @binding({binding}) var<storage, read_write> tk_ws: array<u32>; // workspace");
            binding += 1;
        }
        for &pi in &self.views {
            let p = &k.params[pi];
            let _ = writeln!(
                m,
                "@group(0) @binding({binding}) var<storage, read> a{pi}v: array<vec4<{}>>; // {} again, as vec4",
                buf_ty(p.ty.dtype),
                p.name
            );
            binding += 1;
        }
        if self.uses_broadcast {
            let _ = writeln!(m, "var<workgroup> tk_bc: u32;");
        }
        if self.staged.0 > 0 {
            let _ = writeln!(m, "var<workgroup> tk_sa: array<u32, {}>; // dot operand chunks", self.staged.0);
            let _ = writeln!(m, "var<workgroup> tk_sb: array<u32, {}>;", self.staged.1);
        }
        if self.helpers.contains("tk_f32_bits") {
            let _ = writeln!(m, "var<private> tk_zero: u32;");
        }
        let _ = writeln!(m);
        for (name, text) in HELPERS {
            if self.helpers.contains(name) {
                let _ = writeln!(m, "{text}\n");
            }
        }
        for text in self.libm.values() {
            let _ = writeln!(m, "{text}");
        }
        let _ = writeln!(m, "@compute @workgroup_size({})", self.plan.wg);
        let _ = writeln!(m, "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{");
        if self.helpers.contains("tk_f32_bits") {
            // The dispatch is one workgroup deep, so `wid.z` is 0, which no compiler can know.
            m.push_str("    tk_zero = wid.z;\n");
        }
        m.push_str(&format!("    let gid = wid.y * {gx}u + wid.x;\n"));
        if self.next_word > 0 {
            m.push_str("    let wsb = gid * WS_WORDS;\n");
        }
        m.push_str(&self.out);
        m.push_str("}\n");
        m
    }
}

/// The flat index into a value of shape `from` that numpy broadcasting reads for element `e`
/// of a result of shape `to`.
/// The identity of reduction `op` over `d`: the accumulator's first value.
fn reduce_init(op: ReduceOp, d: DType) -> String {
    match (op, d) {
        (ReduceOp::Sum, _) => literal(Literal::Int(0), d),
        (ReduceOp::Prod, _) => literal(Literal::Int(1), d),
        (ReduceOp::Max, DType::I32) => "i32(-2147483648)".into(),
        (ReduceOp::Min, DType::I32) => "2147483647i".into(),
        (ReduceOp::Max, DType::U32) => "0u".into(),
        (ReduceOp::Min, DType::U32) => "4294967295u".into(),
        (ReduceOp::Max, _) => float_lit(f32::NEG_INFINITY),
        (ReduceOp::Min, _) => float_lit(f32::INFINITY),
    }
}

fn broadcast_index(to: &[usize], from: &[usize]) -> String {
    if from == to {
        return "e".into();
    }
    let lead = to.len() - from.len();
    let (ts, fs) = (strides(to), strides(from));
    let terms: Vec<String> = (lead..to.len())
        .filter(|&d| from[d - lead] != 1)
        .map(|d| format!("((e / {}u) % {}u) * {}u", ts[d], to[d], fs[d - lead]))
        .collect();
    if terms.is_empty() { "0u".into() } else { format!("({})", terms.join(" + ")) }
}

fn compare(op: CmpOp, d: DType, x: &str, y: &str) -> String {
    // Float `ne` is unordered (true for NaN), as in IEEE and Rust; WGSL's `!=` is ordered.
    match op {
        CmpOp::Eq => format!("({x} == {y})"),
        CmpOp::Ne if d.is_float() => format!("(!({x} == {y}))"),
        CmpOp::Ne => format!("({x} != {y})"),
        CmpOp::Lt => format!("({x} < {y})"),
        CmpOp::Le => format!("({x} <= {y})"),
        CmpOp::Gt => format!("({x} > {y})"),
        CmpOp::Ge => format!("({x} >= {y})"),
    }
}
