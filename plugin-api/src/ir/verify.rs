//! The verifier: checks a kernel once and proves it in the type [`Verified`], which every later
//! stage requires. It reports every error of a kernel, each with its span and what was expected.

use std::collections::{HashMap, HashSet};

use super::print::print_stmt_head;
use super::*;

/// A kernel that passed [`verify`]: every value has a known type, every statement with one result
/// carries it in `Stmt::ty`, and the header obeys the rules of `docs/language.md`.
#[derive(Clone, Debug)]
pub struct Verified {
    kernel: Kernel,
    types: HashMap<String, Type>,
    mesh_axes: Vec<String>,
    /// The canonical text, printed once on first use (every launch sends it to the backend).
    text: std::sync::OnceLock<String>,
}

impl Verified {
    /// The kernel, with result types filled in.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The grid axes (empty for a kernel with no grid).
    pub fn grid(&self) -> &[GridAxis] {
        self.kernel.grid.as_deref().unwrap_or(&[])
    }

    /// The type of the value `%name` (any scope).
    pub fn value_type(&self, name: &str) -> &Type {
        self.types.get(name).unwrap_or_else(|| panic!("verified kernel has no value %{name}"))
    }

    /// The kernel's canonical text ([`print_kernel`](super::print_kernel)), printed once.
    pub fn text(&self) -> &str {
        self.text.get_or_init(|| super::print_kernel(&self.kernel))
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.kernel.name
    }

    /// Axis names a kernel without `grid` uses (in `at (...)`, `program_id`, `num_programs`):
    /// they must come from the mesh it is launched with (docs/language.md §4). Empty for a kernel
    /// with a grid.
    pub fn mesh_axes(&self) -> &[String] {
        &self.mesh_axes
    }
}

/// Verifies every kernel of a module; kernel names must be distinct.
pub fn verify_module(module: &Module) -> Result<Vec<Verified>, Diagnostics> {
    let mut diags = Vec::new();
    let mut out = Vec::new();
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for k in &module.kernels {
        if seen.insert(&k.name, k.span).is_some() {
            diags.push(
                Diagnostic::new(k.span, format!("kernel `{}` is defined twice in this file", k.name))
                    .expected("expected each kernel of a file to have its own name"),
            );
        }
        match verify(k) {
            Ok(v) => out.push(v),
            Err(d) => diags.extend(d.0),
        }
    }
    if diags.is_empty() { Ok(out) } else { Err(Diagnostics(diags)) }
}

/// Verifies one kernel.
pub fn verify(kernel: &Kernel) -> Result<Verified, Diagnostics> {
    super::counters::verified();
    check(kernel)
}

/// Verifies a kernel a backend derived from a verified one (the interpreter's merged programs),
/// counted apart from the launch's own kernels ([`super::counters::Counts::derived`]).
pub fn verify_derived(kernel: &Kernel) -> Result<Verified, Diagnostics> {
    super::counters::derived();
    check(kernel)
}

fn check(kernel: &Kernel) -> Result<Verified, Diagnostics> {
    let mut kernel = kernel.clone();
    let mut body = std::mem::take(&mut kernel.body);
    let mut c = Checker {
        k: &kernel,
        diags: Vec::new(),
        defined: HashSet::new(),
        scopes: vec![HashMap::new()],
        types: HashMap::new(),
        snippet: None,
        for_results: Vec::new(),
        mesh_axes: Vec::new(),
    };
    c.header();
    c.body(&mut body, BodyKind::Kernel);
    let (diags, types, mesh_axes) = (c.diags, c.types, c.mesh_axes);
    kernel.body = body;
    if diags.is_empty() {
        Ok(Verified { kernel, types, mesh_axes, text: std::sync::OnceLock::new() })
    } else {
        let mut diags = diags;
        diags.sort_by_key(|d| d.span.start);
        Err(Diagnostics(diags))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum BodyKind {
    Kernel,
    When,
    For { iters: usize },
}

/// An operand after lookup.
#[derive(Clone)]
enum Arg {
    Val(Type),
    Lit(Literal),
}

/// `None`: the value is poisoned by an earlier error; nothing more is reported about it.
type Checked<T> = Option<T>;

struct Checker<'k> {
    k: &'k Kernel,
    diags: Vec<Diagnostic>,
    defined: HashSet<String>,
    scopes: Vec<HashMap<String, Option<Type>>>,
    types: HashMap<String, Type>,
    /// Canonical text of the statement being checked, for IR that has no source.
    snippet: Option<String>,
    /// The result types of the `for` just checked.
    for_results: Vec<Checked<Type>>,
    /// Axis names used by a kernel without `grid`: the mesh's at launch.
    mesh_axes: Vec<String>,
}

fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() { 1 } else { a[i - (n - a.len())] };
        let db = if i < n - b.len() { 1 } else { b[i - (n - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// "an f32", "a u32", "a bool": the dtype with its article, for messages.
fn with_article(t: impl std::fmt::Display) -> String {
    let text = t.to_string();
    let article = if text.starts_with(['f', 'i']) { "an" } else { "a" };
    format!("{article} {text}")
}

fn shape_text(s: &[usize]) -> String {
    format!("[{}]", s.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
}

/// Whether the literal can stand for an element of `dtype`.
fn literal_fits(lit: Literal, dtype: DType) -> Result<(), String> {
    match (lit, dtype) {
        (Literal::Bool(_), DType::Bool) => Ok(()),
        (Literal::Int(v), DType::I32) if i32::try_from(v).is_ok() => Ok(()),
        (Literal::Int(v), DType::U32) if u32::try_from(v).is_ok() => Ok(()),
        (Literal::Int(v), DType::I32 | DType::U32) => Err(format!("integer literal `{v}` does not fit in {dtype}")),
        (Literal::Int(_) | Literal::Float(_), d) if d.is_float() => Ok(()),
        (l, d) => Err(format!("literal `{}` cannot stand for {} element", print::literal_text(l), with_article(d))),
    }
}

impl<'k> Checker<'k> {
    fn err(&mut self, span: Span, message: impl Into<String>, expected: impl Into<String>) {
        let mut d = Diagnostic::new(span, message).expected(expected);
        if !span.is_known()
            && let Some(s) = &self.snippet
        {
            d = d.snippet(s.clone());
        }
        self.diags.push(d);
    }

    // ---- header ----

    /// Records an axis a kernel without `grid` takes from its mesh.
    fn use_mesh_axis(&mut self, name: &str) {
        if !self.mesh_axes.iter().any(|a| a == name) {
            self.mesh_axes.push(name.to_string());
        }
    }

    fn axis_names(&self) -> Vec<&'k str> {
        let k: &'k Kernel = self.k;
        k.grid.iter().flatten().map(|a| a.name.as_str()).collect()
    }

    fn header(&mut self) {
        let k = self.k;
        let mut names: HashSet<&str> = HashSet::new();
        if let Some(grid) = &k.grid {
            if grid.is_empty() {
                self.err(k.span, "`grid ()` has no axes", "expected at least one axis, or no `grid` line for one program");
            }
            for a in grid {
                if !names.insert(&a.name) {
                    self.err(a.span, format!("grid axis `{}` is declared twice", a.name), "expected distinct axis names");
                }
                if a.size == AxisSize::Fixed(0) {
                    self.err(a.span, format!("grid axis `{}` has size 0", a.name), "expected a positive size or `dyn`");
                }
            }
        }
        let mut params: HashSet<&str> = HashSet::new();
        for p in &k.params {
            if !params.insert(&p.name) {
                self.err(p.span, format!("argument `{}` is declared twice", p.name), "expected distinct argument names");
            }
            self.param(p);
        }
        self.parallel_write_rule();
    }

    fn param(&mut self, p: &Param) {
        let kw = p.kind.keyword();
        if p.ty.shape.contains(&0) {
            self.err(p.span, format!("argument `{}` has a dimension of size 0", p.name), "expected positive dimensions");
        }
        if p.ty.is_scalar() && p.kind != ParamKind::In {
            self.err(
                p.span,
                format!("`{kw} {}` is a scalar", p.name),
                format!("expected an array type such as `{}[16]`; only `in` arguments may be scalars", p.ty.dtype),
            );
        }
        let Some(b) = &p.block else { return };
        if p.kind == ParamKind::Scratch || p.ty.is_scalar() {
            self.err(
                p.span,
                format!("`{kw} {}` cannot have a block", p.name),
                "expected `block` only on array `in` and `out` arguments; scratch is per-program memory",
            );
            return;
        }
        let rank = p.ty.shape.len();
        if b.shape.len() != rank {
            self.err(
                p.span,
                format!(
                    "block {} of `{}` has rank {}, but the array {} has rank {rank}",
                    shape_text(&b.shape),
                    p.name,
                    b.shape.len(),
                    p.ty
                ),
                format!("expected {rank} block dimension{}", if rank == 1 { "" } else { "s" }),
            );
        }
        if b.shape.contains(&0) {
            self.err(p.span, format!("block of `{}` has a dimension of size 0", p.name), "expected positive block dimensions");
        }
        if b.index.len() != b.shape.len() {
            self.err(
                p.span,
                format!(
                    "`at (...)` of `{}` has {} index expressions for a block of rank {}",
                    p.name,
                    b.index.len(),
                    b.shape.len()
                ),
                "expected one block index per dimension",
            );
        }
        let axes = self.axis_names();
        for e in &b.index {
            for (_, name) in &e.terms {
                if self.k.grid.is_none() {
                    self.use_mesh_axis(name);
                } else if !axes.contains(&name.as_str()) {
                    let known = if axes.is_empty() {
                        "the kernel has no grid: declare one with `grid (...)`".to_string()
                    } else {
                        format!("expected a grid axis: {}", axes.join(", "))
                    };
                    self.err(p.span, format!("`at (...)` of `{}` uses `{name}`, which is not a grid axis", p.name), known);
                }
            }
        }
    }

    /// Two programs that differ in a parallel axis must not write the same output block.
    fn parallel_write_rule(&mut self) {
        let k = self.k;
        let Some(grid) = &k.grid else { return };
        for p in k.params_of(ParamKind::Out) {
            let Some(b) = &p.block else { continue };
            for a in grid.iter().filter(|a| !a.seq && a.size != AxisSize::Fixed(1)) {
                if !b.index.iter().any(|e| e.uses(&a.name)) {
                    self.err(
                        p.span,
                        format!(
                            "output `{}` is written by every program along parallel axis `{}`, but its block index `at ({})` does not use `{}`",
                            p.name,
                            a.name,
                            b.index.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                            a.name
                        ),
                        format!(
                            "use `{}` in `at (...)`, or mark the axis sequential so its points revisit the block in order: `{}: {} seq`",
                            a.name, a.name, a.size
                        ),
                    );
                }
            }
        }
    }

    // ---- scopes ----

    fn lookup(&mut self, name: &str, span: Span) -> Checked<Type> {
        for scope in self.scopes.iter().rev() {
            if let Some(t) = scope.get(name) {
                return t.clone();
            }
        }
        let mut visible: Vec<&String> = self.scopes.iter().flat_map(|s| s.keys()).collect();
        visible.sort();
        let hint = if self.defined.contains(name) {
            format!("`%{name}` is defined in a nested body and is not visible here; carry it out with `for ... iter` / `yield`")
        } else if visible.is_empty() {
            "expected a value defined above this line; none is defined yet".to_string()
        } else {
            let shown: Vec<String> = visible.iter().take(8).map(|v| format!("%{v}")).collect();
            format!("expected a value defined above this line: {}", shown.join(", "))
        };
        self.err(span, format!("unknown value `%{name}`"), hint);
        None
    }

    fn define(&mut self, name: &str, ty: Checked<Type>, span: Span) {
        if !self.defined.insert(name.to_string()) {
            self.err(span, format!("value `%{name}` is defined twice"), "expected each value of a kernel to have its own name");
        }
        if let Some(t) = &ty {
            self.types.insert(name.to_string(), t.clone());
        }
        self.scopes.last_mut().expect("a scope is open").insert(name.to_string(), ty);
    }

    fn arg(&mut self, o: &Operand, span: Span) -> Checked<Arg> {
        match o {
            Operand::Value(v) => self.lookup(v, span).map(Arg::Val),
            Operand::Lit(l) => Some(Arg::Lit(*l)),
        }
    }

    /// A value operand (literals have no type of their own here).
    fn val(&mut self, o: &Operand, span: Span, what: &str) -> Checked<Type> {
        match self.arg(o, span)? {
            Arg::Val(t) => Some(t),
            Arg::Lit(l) => {
                self.err(
                    span,
                    format!("{what} is the literal `{}`, which has no type here", print::literal_text(l)),
                    "expected a `%value`; make a constant with `full LIT : T[SHAPE]`",
                );
                None
            }
        }
    }

    /// A scalar integer: an index, a slice start or a loop bound.
    fn scalar_int(&mut self, o: &Operand, span: Span, what: &str, i32_only: bool) {
        let expected =
            if i32_only { "an `i32` scalar or an integer literal" } else { "an `i32` or `u32` scalar or an integer literal" };
        match self.arg(o, span) {
            None => {}
            Some(Arg::Lit(Literal::Int(v))) if i32::try_from(v).is_ok() => {}
            Some(Arg::Val(t)) if t.is_scalar() && (t.dtype == DType::I32 || (!i32_only && t.dtype == DType::U32)) => {}
            Some(Arg::Val(t)) => self.err(span, format!("{what} `{o}` has type {t}"), format!("expected {expected}")),
            Some(Arg::Lit(l)) => {
                self.err(span, format!("{what} is `{}`", print::literal_text(l)), format!("expected {expected}"))
            }
        }
    }

    /// Two operands of one elementwise op: their common dtype and broadcast shape.
    fn pair(&mut self, a: &Operand, b: &Operand, span: Span, op: &str) -> Checked<(DType, Vec<usize>)> {
        let (x, y) = (self.arg(a, span), self.arg(b, span));
        let (x, y) = (x?, y?);
        match (x, y) {
            (Arg::Val(s), Arg::Val(t)) => {
                if s.dtype != t.dtype {
                    self.err(
                        span,
                        format!("`{op}` operands have different dtypes: `{a}` is {s}, `{b}` is {t}"),
                        format!("expected the same dtype on both sides; convert one with `cast {b} : {}`", s.dtype),
                    );
                    return None;
                }
                match broadcast(&s.shape, &t.shape) {
                    Some(shape) => Some((s.dtype, shape)),
                    None => {
                        self.err(
                            span,
                            format!("`{op}` operands do not broadcast: {s} and {t}"),
                            "expected shapes that agree from the right, where each dimension is equal or 1 (numpy broadcasting)",
                        );
                        None
                    }
                }
            }
            (Arg::Val(t), Arg::Lit(l)) | (Arg::Lit(l), Arg::Val(t)) => {
                if let Err(m) = literal_fits(l, t.dtype) {
                    self.err(span, m, format!("expected a literal of the other operand's dtype, {}", t.dtype));
                    return None;
                }
                Some((t.dtype, t.shape))
            }
            (Arg::Lit(_), Arg::Lit(_)) => {
                self.err(
                    span,
                    format!("both operands of `{op}` are literals"),
                    "expected at least one `%value` to give the type",
                );
                None
            }
        }
    }

    // ---- body ----

    fn body(&mut self, body: &mut [Stmt], kind: BodyKind) {
        let n = body.len();
        for (i, s) in body.iter_mut().enumerate() {
            let last = i + 1 == n;
            if let Op::Yield(_) = &s.op
                && !(last && matches!(kind, BodyKind::For { .. }))
            {
                self.err(
                    s.span,
                    "`yield` is only allowed as the last statement of a `for` body",
                    "expected `yield` to end a `for` loop body",
                );
                continue;
            }
            self.stmt(s);
        }
        if let BodyKind::For { iters } = kind
            && iters > 0
            && !matches!(body.last().map(|s| &s.op), Some(Op::Yield(_)))
        {
            let span = body.last().map_or(Span::NONE, |s| s.span);
            self.err(
                span,
                format!(
                    "the `for` body does not end with `yield` for its {iters} `iter` value{}",
                    if iters == 1 { "" } else { "s" }
                ),
                "expected `yield` with the next value of each `iter` argument as the last statement",
            );
        }
    }

    fn stmt(&mut self, s: &mut Stmt) {
        self.snippet = if s.span.is_known() { None } else { Some(print_stmt_head(s)) };
        let span = s.span;
        // Result count.
        let want = match &s.op {
            Op::Store { .. } | Op::When { .. } | Op::Yield(_) => 0,
            Op::For { iters, .. } => iters.len(),
            _ => 1,
        };
        if s.results.len() != want {
            let m = s.op.mnemonic();
            let msg = match want {
                0 => format!(
                    "`{m}` defines no value, but {} result name{} given",
                    s.results.len(),
                    if s.results.len() == 1 { " is" } else { "s are" }
                ),
                1 => format!("`{m}` defines one value, but {} result names are given", s.results.len()),
                n => {
                    format!("this `for` carries {n} `iter` values, so it defines {n} results, but {} are given", s.results.len())
                }
            };
            self.err(
                span,
                msg,
                if want == 0 {
                    "expected no `%name =` before it".to_string()
                } else {
                    format!("expected {want} result name{}", if want == 1 { "" } else { "s" })
                },
            );
        }
        if s.op.needs_annotation() && s.ty.is_none() {
            let m = s.op.mnemonic();
            self.err(
                span,
                format!("`{m}` needs a result type"),
                format!("expected `: TYPE` saying what to make, as in `{m} ... : f32[16, 16]`"),
            );
        }
        let ann = s.ty.clone();
        let ty = self.op(&mut s.op, ann.as_ref(), span);
        if let (Some(t), Some(a), false) = (&ty, &ann, s.op.needs_annotation())
            && t != a
            && s.op.has_single_result()
        {
            self.err(
                span,
                format!("the result type is written as `{a}`, but `{}` gives `{t}`", s.op.mnemonic()),
                format!("expected `: {t}` or no annotation"),
            );
        }
        if s.op.has_single_result() {
            if let Some(t) = &ty {
                s.ty = Some(t.clone());
            }
            if let Some(r) = s.results.first() {
                self.define(r, ty, span);
            }
        } else if matches!(s.op, Op::For { .. }) {
            let types = std::mem::take(&mut self.for_results);
            for (r, t) in s.results.iter().zip(types) {
                self.define(r, t, span);
            }
        }
    }

    /// Checks one operation and returns its result type (single-result ops).
    fn op(&mut self, op: &mut Op, ann: Option<&Type>, span: Span) -> Checked<Type> {
        match op {
            Op::Load { src, index, mask, other } => self.load(src, index.as_deref(), mask.as_deref(), *other, span),
            Op::Store { dst, index, value, mask } => {
                self.store(dst, index.as_deref(), value, mask.as_deref(), span);
                None
            }
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axes = self.axis_names();
                if let (None, AxisRef::Name(n)) = (&self.k.grid, &*a) {
                    self.use_mesh_axis(n);
                    return Some(Type::scalar(DType::I32));
                }
                let ok = match a {
                    AxisRef::Name(n) => axes.contains(&n.as_str()),
                    AxisRef::Pos(p) => *p < axes.len(),
                };
                if !ok {
                    let expected = if axes.is_empty() {
                        "the kernel has no grid: declare one with `grid (...)`".to_string()
                    } else {
                        format!("expected a grid axis name ({}) or a position below {}", axes.join(", "), axes.len())
                    };
                    self.err(span, format!("`{a}` is not an axis of the grid"), expected);
                    return None;
                }
                Some(Type::scalar(DType::I32))
            }
            Op::Iota { dim } => {
                let t = ann?.clone();
                if !t.dtype.is_int() || t.is_scalar() {
                    self.err(
                        span,
                        format!("`iota` cannot make `{t}`"),
                        "expected an `i32` or `u32` block type such as `i32[128]`",
                    );
                    return None;
                }
                if *dim >= t.shape.len() {
                    self.err(
                        span,
                        format!("`iota {dim}` counts along dimension {dim} of a rank-{} block", t.shape.len()),
                        format!("expected a dimension below {}", t.shape.len()),
                    );
                    return None;
                }
                Some(t)
            }
            Op::Full(l) => {
                let t = ann?.clone();
                if let Err(m) = literal_fits(*l, t.dtype) {
                    self.err(span, m, format!("expected {} literal", with_article(t.dtype)));
                    return None;
                }
                Some(t)
            }
            Op::Zeros => ann.cloned(),
            Op::Unary(u, a) => self.unary(*u, a, span),
            Op::Binary(b, x, y) => self.binary(*b, x, y, span),
            Op::Compare(c, x, y) => {
                let (d, shape) = self.pair(x, y, span, c.name())?;
                if d == DType::Bool && !matches!(c, CmpOp::Eq | CmpOp::Ne) {
                    self.err(
                        span,
                        format!("`{}` orders its operands, which are bool", c.name()),
                        "expected numbers; bool compares only with `eq` and `ne`",
                    );
                    return None;
                }
                Some(Type::array(DType::Bool, shape))
            }
            Op::Select(c, a, b) => {
                let ct = self.val(c, span, "the condition of `select`");
                let ab = self.pair(a, b, span, "select");
                let (ct, (d, shape)) = (ct?, ab?);
                if ct.dtype != DType::Bool {
                    self.err(
                        span,
                        format!("the condition `{c}` of `select` is {ct}"),
                        "expected a `bool` condition; make one with a comparison such as `lt`",
                    );
                    return None;
                }
                match broadcast(&ct.shape, &shape) {
                    Some(s) => Some(Type::array(d, s)),
                    None => {
                        self.err(
                            span,
                            format!("the condition {ct} of `select` does not broadcast with {}", Type::array(d, shape)),
                            "expected shapes that agree from the right (numpy broadcasting)",
                        );
                        None
                    }
                }
            }
            Op::Cast(a) => self.convert(a, ann, span, false),
            Op::Bitcast(a) => self.convert(a, ann, span, true),
            Op::Broadcast(a) => {
                let (t, target) = (self.val(a, span, "the operand of `broadcast`")?, ann?.clone());
                if t.dtype != target.dtype || broadcast(&t.shape, &target.shape).as_deref() != Some(&target.shape[..]) {
                    self.err(
                        span,
                        format!("cannot broadcast {t} to {target}"),
                        format!(
                            "expected {} type whose shape {} stretches to (numpy broadcasting)",
                            with_article(t.dtype),
                            shape_text(&t.shape)
                        ),
                    );
                    return None;
                }
                Some(target)
            }
            Op::Reshape(a) => {
                let (t, target) = (self.val(a, span, "the operand of `reshape`")?, ann?.clone());
                if t.dtype != target.dtype || t.numel() != target.numel() {
                    self.err(
                        span,
                        format!("cannot reshape {t} ({} elements) to {target} ({} elements)", t.numel(), target.numel()),
                        format!("expected {} type with {} elements", with_article(t.dtype), t.numel()),
                    );
                    return None;
                }
                Some(target)
            }
            Op::Transpose { arg, perm } => {
                let t = self.val(arg, span, "the operand of `transpose`")?;
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..t.shape.len()).collect::<Vec<_>>() {
                    self.err(
                        span,
                        format!(
                            "`perm ({})` is not a permutation of the {} dimensions of {t}",
                            perm.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                            t.shape.len()
                        ),
                        format!("expected each of 0..{} exactly once", t.shape.len()),
                    );
                    return None;
                }
                Some(Type::array(t.dtype, perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>()))
            }
            Op::Reduce { op, arg, axis, keepdims } => {
                let t = self.val(arg, span, "the operand of a reduction")?;
                if !t.dtype.is_numeric() || t.is_scalar() || *axis >= t.shape.len() {
                    let expected = if t.is_scalar() || !t.dtype.is_numeric() {
                        "expected a numeric block value".to_string()
                    } else {
                        format!("expected an axis below {}", t.shape.len())
                    };
                    self.err(span, format!("cannot `{}` {t} along axis {axis}", op.name()), expected);
                    return None;
                }
                let mut shape = t.shape.clone();
                if *keepdims {
                    shape[*axis] = 1;
                } else {
                    shape.remove(*axis);
                }
                Some(Type::array(t.dtype, shape))
            }
            Op::Dot { a, b, trans_a, trans_b } => self.dot(a, b, *trans_a, *trans_b, span),
            Op::When { cond, body } => {
                if let Some(t) = self.val(cond, span, "the condition of `when`")
                    && (t.dtype != DType::Bool || !t.is_scalar())
                {
                    self.err(
                        span,
                        format!("the condition `{cond}` of `when` is {t}"),
                        "expected a scalar `bool`, such as `%first = eq %k, 0`",
                    );
                }
                self.scopes.push(HashMap::new());
                self.body(body, BodyKind::When);
                self.scopes.pop();
                None
            }
            Op::For { .. } => {
                self.for_loop(op, span);
                None
            }
            Op::Yield(_) => None,
        }
    }

    fn unary(&mut self, u: UnaryOp, a: &Operand, span: Span) -> Checked<Type> {
        let t = self.val(a, span, &format!("the operand of `{}`", u.name()))?;
        let ok = match u {
            UnaryOp::Not => !t.dtype.is_float(),
            UnaryOp::Neg | UnaryOp::Abs => t.dtype.is_numeric(),
            _ => t.dtype.is_float(),
        };
        if !ok {
            let expected = match u {
                UnaryOp::Not => "expected `bool` or an integer",
                UnaryOp::Neg | UnaryOp::Abs => "expected a number",
                _ => "expected f32, f16 or bf16; convert with `cast %v : f32`",
            };
            self.err(span, format!("`{}` does not take {}", u.name(), t.dtype), expected);
            return None;
        }
        Some(t)
    }

    fn binary(&mut self, b: BinaryOp, x: &Operand, y: &Operand, span: Span) -> Checked<Type> {
        let (d, shape) = self.pair(x, y, span, b.name())?;
        let (ok, expected) = match b {
            BinaryOp::Pow => (d.is_float(), "expected float operands"),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => (!d.is_float(), "expected `bool` or integer operands"),
            BinaryOp::Shl | BinaryOp::Shr => (d.is_int(), "expected integer operands"),
            _ => (d.is_numeric(), "expected numbers"),
        };
        if !ok {
            self.err(span, format!("`{}` does not take {d}", b.name()), expected);
            return None;
        }
        Some(Type::array(d, shape))
    }

    fn convert(&mut self, a: &Operand, ann: Option<&Type>, span: Span, bit: bool) -> Checked<Type> {
        let name = if bit { "bitcast" } else { "cast" };
        let t = self.val(a, span, &format!("the operand of `{name}`"))?;
        let ann = ann?;
        if !ann.is_scalar() && ann.shape != t.shape {
            self.err(
                span,
                format!("`{name}` changes the shape from {} to {}", shape_text(&t.shape), shape_text(&ann.shape)),
                format!("expected `: {}` (the element type alone is enough)", Type::array(ann.dtype, t.shape.clone())),
            );
            return None;
        }
        if bit && (t.dtype.bits() != ann.dtype.bits() || t.dtype == DType::Bool || ann.dtype == DType::Bool) {
            self.err(
                span,
                format!("cannot bitcast {} ({} bits) to {} ({} bits)", t.dtype, t.dtype.bits(), ann.dtype, ann.dtype.bits()),
                "expected element types of the same width, not bool; use `cast` to convert values",
            );
            return None;
        }
        Some(Type::array(ann.dtype, t.shape))
    }

    fn dot(&mut self, a: &Operand, b: &Operand, ta: bool, tb: bool, span: Span) -> Checked<Type> {
        let x = self.val(a, span, "the left operand of `dot`");
        let y = self.val(b, span, "the right operand of `dot`");
        let (x, y) = (x?, y?);
        if x.shape.len() != 2 || y.shape.len() != 2 || x.dtype != y.dtype || x.dtype == DType::Bool {
            self.err(
                span,
                format!("`dot` takes two 2-D matrices of one numeric dtype, got {x} and {y}"),
                "expected operands such as f32[M, K] and f32[K, N]",
            );
            return None;
        }
        let (m, k1) = if ta { (x.shape[1], x.shape[0]) } else { (x.shape[0], x.shape[1]) };
        let (k2, n) = if tb { (y.shape[1], y.shape[0]) } else { (y.shape[0], y.shape[1]) };
        if k1 != k2 {
            self.err(
                span,
                format!(
                    "`dot` contracts {k1} against {k2}: {x}{} times {y}{}",
                    if ta { " (transposed)" } else { "" },
                    if tb { " (transposed)" } else { "" }
                ),
                "expected the inner dimensions to agree: [M, K] times [K, N]",
            );
            return None;
        }
        let d = if x.dtype.is_float() { DType::F32 } else { x.dtype };
        Some(Type::array(d, [m, n]))
    }

    fn ref_param(&mut self, name: &str, span: Span) -> Option<&Param> {
        let k = self.k;
        match k.param(name) {
            Some(p) => Some(p),
            None => {
                let names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
                self.err(
                    span,
                    format!("unknown argument `{name}`"),
                    format!("expected an argument or scratch of this kernel: {}", names.join(", ")),
                );
                None
            }
        }
    }

    /// The shape an index list selects from a block, checking each index.
    fn indexed_shape(&mut self, p: &Param, index: Option<&[Index]>, span: Span) -> Checked<Vec<usize>> {
        let block = p.block_shape().to_vec();
        let Some(index) = index else { return Some(block) };
        if index.len() != block.len() {
            self.err(
                span,
                format!(
                    "`{}` is indexed with {} ind{}, but its block {} has rank {}",
                    p.name,
                    index.len(),
                    if index.len() == 1 { "ex" } else { "ices" },
                    shape_text(&block),
                    block.len()
                ),
                format!("expected {} indices, one per dimension (`:` for a whole one)", block.len()),
            );
            return None;
        }
        let mut shape = Vec::new();
        for (ix, &dim) in index.iter().zip(&block) {
            match ix {
                Index::Full => shape.push(dim),
                Index::Slice { start, size } => {
                    self.scalar_int(start, span, "the start of `ds`", false);
                    if *size == 0 {
                        self.err(span, "`ds(..., 0)` selects nothing", "expected a positive slice size");
                    }
                    shape.push(*size);
                }
                Index::At(v) => self.scalar_int(v, span, "an index", false),
            }
        }
        Some(shape)
    }

    fn mask(&mut self, mask: Option<&str>, shape: &[usize], span: Span) {
        let Some(m) = mask else { return };
        let Some(t) = self.lookup(m, span) else { return };
        if t.dtype != DType::Bool || broadcast(&t.shape, shape).as_deref() != Some(shape) {
            self.err(
                span,
                format!("the mask `%{m}` is {t}"),
                format!("expected a bool mask that broadcasts to {}", shape_text(shape)),
            );
        }
    }

    fn load(
        &mut self,
        src: &str,
        index: Option<&[Index]>,
        mask: Option<&str>,
        other: Option<Literal>,
        span: Span,
    ) -> Checked<Type> {
        let p = self.ref_param(src, span)?.clone();
        if p.ty.is_scalar() {
            if index.is_some() || mask.is_some() || other.is_some() {
                self.err(
                    span,
                    format!("`{src}` is a scalar argument"),
                    format!("expected `load {src}` with no index, mask or other"),
                );
            }
            return Some(p.ty.clone());
        }
        let shape = self.indexed_shape(&p, index, span)?;
        self.mask(mask, &shape, span);
        if let Some(l) = other
            && let Err(m) = literal_fits(l, p.ty.dtype)
        {
            self.err(span, format!("`other`: {m}"), format!("expected {} literal", with_article(p.ty.dtype)));
        }
        Some(Type::array(p.ty.dtype, shape))
    }

    fn store(&mut self, dst: &str, index: Option<&[Index]>, value: &Operand, mask: Option<&str>, span: Span) {
        let Some(p) = self.ref_param(dst, span).cloned() else { return };
        if p.kind == ParamKind::In {
            self.err(span, format!("cannot store to input `{dst}`"), "expected an `out` or `scratch` argument");
            return;
        }
        let Some(shape) = self.indexed_shape(&p, index, span) else { return };
        self.mask(mask, &shape, span);
        match self.arg(value, span) {
            Some(Arg::Lit(l)) => {
                if let Err(m) = literal_fits(l, p.ty.dtype) {
                    self.err(span, m, format!("expected {} literal", with_article(p.ty.dtype)));
                }
            }
            Some(Arg::Val(t)) if t.dtype != p.ty.dtype || broadcast(&t.shape, &shape).as_deref() != Some(&shape[..]) => {
                self.err(
                    span,
                    format!("cannot store {t} into `{dst}`, whose selected block is {}", Type::array(p.ty.dtype, shape.clone())),
                    format!("expected {} value whose shape broadcasts to {}", with_article(p.ty.dtype), shape_text(&shape)),
                );
            }
            None | Some(Arg::Val(_)) => {}
        }
    }

    fn for_loop(&mut self, op: &mut Op, span: Span) {
        let Op::For { var, lo, hi, step, iters, body } = op else { unreachable!("called on a for") };
        self.scalar_int(lo, span, "the lower bound", true);
        self.scalar_int(hi, span, "the upper bound", true);
        if let Some(s) = step {
            self.scalar_int(s, span, "the step", true);
            if let Operand::Lit(Literal::Int(v)) = s
                && *v <= 0
            {
                self.err(span, format!("the loop step is {v}"), "expected a positive step");
            }
        }
        let inits: Vec<Checked<Type>> = iters
            .iter()
            .map(|(n, v)| {
                let what = format!("the initial value of `%{n}`");
                self.val(v, span, &what)
            })
            .collect();
        self.scopes.push(HashMap::new());
        self.define(var, Some(Type::scalar(DType::I32)), span);
        for ((n, _), t) in iters.iter().zip(&inits) {
            self.define(n, t.clone(), span);
        }
        self.body(body, BodyKind::For { iters: iters.len() });
        // `yield` must give each carried value its own type.
        if let Some(Stmt { op: Op::Yield(vals), span: ys, .. }) = body.last() {
            let ys = *ys;
            if vals.len() != iters.len() {
                self.err(
                    ys,
                    format!(
                        "`yield` gives {} value{}, but the loop carries {}",
                        vals.len(),
                        if vals.len() == 1 { "" } else { "s" },
                        iters.len()
                    ),
                    format!(
                        "expected one value per `iter` argument ({})",
                        iters.iter().map(|(n, _)| format!("%{n}")).collect::<Vec<_>>().join(", ")
                    ),
                );
            } else {
                for ((v, (n, _)), init) in vals.iter().zip(iters.iter()).zip(&inits) {
                    let Some(want) = init else { continue };
                    let got = self.val(v, ys, "a yielded value");
                    if let Some(got) = got
                        && &got != want
                    {
                        self.err(
                            ys,
                            format!("`yield` gives {got} for `%{n}`, which is {want}"),
                            format!("expected {} value", with_article(want)),
                        );
                    }
                }
            }
        }
        self.scopes.pop();
        // Results are defined after the loop, with the carried types.
        // (Names are taken from the statement by the caller: see `stmt_for_results`.)
        self.for_results = inits;
    }
}
