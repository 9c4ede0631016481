//! The verifier: checks a kernel once and proves it in the type [`Verified`], which every later
//! stage requires. It reports every error of a kernel, each with its span and what was expected.
//!
//! The files of this folder are impl blocks of one `Checker`: this one holds the entry points,
//! the checker's state, its scopes and the operand rules every op shares; `header.rs` checks the
//! grid and the arguments (their blocks and `at (...)` indices, the parallel-write rule);
//! `body.rs` statements and nested bodies (result counts, annotations, `yield`, `for` loops);
//! `ops.rs` the typing rule of each operation; `memory.rs` `load` and `store` (the argument, its
//! index list, the mask).

mod body;
mod header;
mod memory;
mod ops;
mod shapes;
mod sync;

use std::collections::{HashMap, HashSet};

use super::*;

/// A kernel that passed [`verify`]: every value has a known type, every statement with one result
/// carries it in `Stmt::ty`, and the header obeys the rules of `docs/language.md`.
#[derive(Clone, Debug)]
pub struct Verified {
    kernel: Kernel,
    values: ValueTable,
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
        self.values.ty(self.values.id(name))
    }

    /// Every value of the kernel: ids, names and types ([`ValueTable`]).
    pub fn values(&self) -> &ValueTable {
        &self.values
    }

    /// The id of the value `%name` (any scope); the kernel must define it.
    pub fn id(&self, name: &str) -> ValueId {
        self.values.id(name)
    }

    /// The id of a value operand; `None` for a literal. With the accessors below, the way to
    /// reach a statement's values without going through their names (the first step to values
    /// as ids in the IR itself).
    pub fn operand_id(&self, o: &Operand) -> Option<ValueId> {
        match o {
            Operand::Value(name) => Some(self.values.id(name)),
            Operand::Lit(_) => None,
        }
    }

    /// The type of a value operand; `None` for a literal.
    pub fn operand_type(&self, o: &Operand) -> Option<&Type> {
        self.operand_id(o).map(|id| self.values.ty(id))
    }

    /// The ids of statement `s`'s results, in order (a `for`'s one per carried value).
    pub fn result_ids(&self, s: &Stmt) -> Vec<ValueId> {
        s.results.iter().map(|r| self.values.id(r)).collect()
    }

    /// The id of statement `s`'s first result (its only one but for `for` and `if`), if any.
    pub fn result(&self, s: &Stmt) -> Option<ValueId> {
        s.results.first().map(|r| self.values.id(r))
    }

    /// The type of statement `s`'s first result, if any: what `Stmt::ty` holds for a statement
    /// with one result.
    pub fn result_type(&self, s: &Stmt) -> Option<&Type> {
        self.result(s).map(|id| self.values.ty(id))
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
        values: ValueTable::default(),
        snippet: None,
        for_results: Vec::new(),
        mesh_axes: Vec::new(),
        nesting: 0,
    };
    c.header();
    c.concurrency_header();
    c.body(&mut body, BodyKind::Kernel);
    let (diags, values, mesh_axes) = (c.diags, c.values, c.mesh_axes);
    kernel.body = body;
    if diags.is_empty() {
        Ok(Verified { kernel, values, mesh_axes, text: std::sync::OnceLock::new() })
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
    /// A `for` body with this many carried values, the loop at `at`.
    For { iters: usize, at: Span },
    /// A branch of an `if` with this many results, the `if` at `at` (where an empty branch's
    /// missing `yield` is reported).
    If { results: usize, at: Span },
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
    values: ValueTable,
    /// Canonical text of the statement being checked, for IR that has no source.
    snippet: Option<String>,
    /// The result types of the `for` just checked.
    for_results: Vec<Checked<Type>>,
    /// Axis names used by a kernel without `grid`: the mesh's at launch.
    mesh_axes: Vec<String>,
    /// `when`, `for` and `if` bodies open around the statement being checked.
    nesting: usize,
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
        (Literal::Int(v), d) if d.int_range().is_some_and(|(lo, hi)| (lo..=hi).contains(&v)) => Ok(()),
        (Literal::Int(v), d) if d.is_int() => Err(format!("integer literal `{v}` does not fit in {dtype}")),
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
            self.values.define(name, t.clone());
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
}
