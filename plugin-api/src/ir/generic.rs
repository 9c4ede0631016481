//! Generic kernels (docs/language.md §9): a kernel with parameters is kept as its text, bound at
//! launch (from the shapes of its inputs, values given, tuned values and defaults) and
//! specialized into an ordinary kernel, which is verified and lowered like any other. Backends
//! never see a parameter: the specialized kernel's canonical text crosses the plugin boundary and
//! keys every cache.
//!
//! Specializing parses the kernel's tokens again with the values bound, so a specialized kernel
//! keeps the spans of the generic text and its errors point at the generic line.
//!
//! The canonical text of a generic kernel is printed by the ordinary printer from a *template*
//! parse, in which each expression that names a parameter reads as a distinct number (a hole);
//! the printer's output then has each hole replaced by its expression. Result types are kept
//! where the text writes them: they may depend on the parameters.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::lexer::{Tok, lex};
use super::parse::{ArgDecl, Parsed, SizeParam, Sizes, parse_kernel_at, parse_tokens};
use super::size::SizeExpr;
use super::*;

/// The first hole number; moved down if the text has integers in the range holes use.
const HOLE_BASE: i64 = 2_000_000_000;
/// The most holes one kernel may have.
const HOLE_RANGE: i64 = 1 << 24;

/// The kernels of one `.tk` text, generic or not.
#[derive(Debug)]
pub struct Source {
    text: Arc<Text>,
    kernels: Vec<Generic>,
}

/// A text and its tokens, shared by its kernels.
#[derive(Debug)]
struct Text {
    text: String,
    toks: Vec<(Tok, Span)>,
}

/// Makes the kernel of a [`Generic`] built in Rust for bound values.
pub type BuildFn = dyn Fn(&BTreeMap<String, i64>) -> Kernel + Send + Sync;

/// Where a generic kernel's ordinary kernels come from.
#[derive(Clone)]
enum Origin {
    /// Its text, parsed again with the values bound (its `kernel` token's index); a kernel
    /// without parameters keeps what the first parse made, and is not parsed again.
    Text(Arc<Text>, usize, Option<Arc<Kernel>>),
    /// A Rust function of the values ([`crate::ir::builder::GenericBuilder`]).
    Built(Arc<BuildFn>),
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Text(_, first, _) => write!(f, "Text(token {first})"),
            Origin::Built(_) => f.write_str("Built"),
        }
    }
}

/// A generic kernel: its name, parameters, declared arguments and canonical generic text, from a
/// [`Source`] or built in Rust.
#[derive(Clone, Debug)]
pub struct Generic {
    name: String,
    params: Vec<SizeParam>,
    args: Vec<ArgDecl>,
    origin: Origin,
    template: String,
}

/// Where a bound value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueFrom {
    /// A dimension of an input array.
    Input {
        /// The input.
        array: String,
        /// The dimension.
        dim: usize,
    },
    /// Given at launch (`--param P=V`, `params=`).
    Given,
    /// A tuning record.
    Tuned,
    /// The parameter's default.
    Default,
}

/// A value for every parameter of a kernel, and where each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    /// Parameter values by name.
    pub values: BTreeMap<String, i64>,
    /// Where each came from.
    pub from: BTreeMap<String, ValueFrom>,
}

impl Binding {
    /// `N = 4096, BM = 16` in declaration order of `kernel`.
    pub fn describe(&self, kernel: &Generic) -> String {
        kernel
            .params
            .iter()
            .filter_map(|p| Some(format!("{} = {}", p.name, self.values.get(&p.name)?)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `N = 4096 (input x, dimension 0), BM = 16 (default)`, for `--explain`.
    pub fn explain(&self, kernel: &Generic) -> String {
        let why = |f: &ValueFrom| match f {
            ValueFrom::Input { array, dim } => format!("input `{array}`, dimension {dim}"),
            ValueFrom::Given => "given".to_string(),
            ValueFrom::Tuned => "tuned".to_string(),
            ValueFrom::Default => "default".to_string(),
        };
        kernel
            .params
            .iter()
            .filter_map(|p| Some(format!("{} = {} ({})", p.name, self.values.get(&p.name)?, why(self.from.get(&p.name)?))))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A launch whose values do not bind a kernel's parameters. Each message names the parameter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// A value for a name that is not a parameter.
    #[error("kernel `{kernel}` has no parameter `{name}`\n  {known}")]
    Unknown {
        /// The kernel.
        kernel: String,
        /// The name given.
        name: String,
        /// Its parameters, as a sentence.
        known: String,
    },
    /// Two inputs give a parameter different values.
    #[error("inputs of kernel `{kernel}` disagree on parameter `{param}`: {a}, {b}\n  give arrays whose shapes agree on {param}")]
    Disagree {
        /// The kernel.
        kernel: String,
        /// The parameter.
        param: String,
        /// What the first input says: "`x` says N = 4096 (its dimension 0)".
        a: String,
        /// What the second says.
        b: String,
    },
    /// A value given for a parameter that an input's shape gives otherwise.
    #[error(
        "parameter `{param}` of kernel `{kernel}` is given as {given}, but input `{array}` says {param} = {value} (its dimension {dim})\n  leave {param} out (the input gives it), or give an input with {param} = {given}"
    )]
    GivenDisagrees {
        /// The kernel.
        kernel: String,
        /// The parameter.
        param: String,
        /// The value given.
        given: i64,
        /// The input.
        array: String,
        /// Its dimension.
        dim: usize,
        /// Its value.
        value: i64,
    },
    /// Parameters with no value from anywhere.
    #[error("kernel `{kernel}` needs a value for {}\n  {how}", names_sentence(names))]
    Unbound {
        /// The kernel.
        kernel: String,
        /// The parameters.
        names: Vec<String>,
        /// How to give them.
        how: String,
    },
}

fn names_sentence(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [one] => format!("parameter {one}"),
        _ => format!("parameters {}", quoted.join(", ")),
    }
}

/// Whether `text` declares a kernel with parameters (`kernel NAME[...]`), found by its tokens
/// alone.
pub fn has_parameters(text: &str) -> bool {
    let (toks, _) = lex(text);
    toks.windows(3)
        .any(|w| matches!(&w[0].0, Tok::Ident(k) if k == "kernel") && matches!(w[1].0, Tok::Ident(_)) && w[2].0 == Tok::LBracket)
}

impl Source {
    /// Parses every kernel of `text` for its names and syntax; values come at [`Source::specialize`].
    pub fn parse(text: &str) -> Result<Source, Diagnostics> {
        let (toks, bad) = lex(text);
        let mut base = HOLE_BASE;
        while toks
            .iter()
            .any(|(t, _)| matches!(t, Tok::Int(s) if s.parse::<i64>().is_ok_and(|v| (base..base + HOLE_RANGE).contains(&v))))
        {
            base -= HOLE_RANGE;
        }
        let parsed = parse_tokens(text, &toks, bad, Sizes::Template, base)?;
        let shared = Arc::new(Text { text: text.to_string(), toks });
        let mut diags = Vec::new();
        let mut kernels: Vec<Generic> = Vec::new();
        for p in parsed {
            if kernels.iter().any(|k| k.name == p.kernel.name) {
                diags.push(
                    Diagnostic::new(p.kernel.span, format!("kernel `{}` is defined twice in this file", p.kernel.name))
                        .expected("expected each kernel of a file to have its own name"),
                );
            }
            if p.holes.len() as i64 >= HOLE_RANGE {
                diags.push(
                    Diagnostic::new(p.kernel.span, "too many size expressions in one kernel")
                        .expected(format!("expected fewer than {HOLE_RANGE} expressions that name parameters")),
                );
            }
            kernels.push(Generic::from_parsed(p, base, &shared));
        }
        if diags.is_empty() { Ok(Source { text: shared, kernels }) } else { Err(Diagnostics(diags)) }
    }

    /// The text as given.
    pub fn text(&self) -> &str {
        &self.text.text
    }

    /// The kernels in file order.
    pub fn kernels(&self) -> &[Generic] {
        &self.kernels
    }

    /// The kernel called `name`.
    pub fn kernel(&self, name: &str) -> Option<&Generic> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The ordinary kernel `kernel` is with `values` (one for every parameter), verified. Errors
    /// point at the generic text and name the values ([`Generic::specialize`]).
    pub fn specialize(&self, kernel: &Generic, values: &BTreeMap<String, i64>) -> Result<Verified, Diagnostics> {
        kernel.specialize(values)
    }
}

impl Generic {
    fn from_parsed(p: Parsed, base: i64, text: &Arc<Text>) -> Generic {
        let mut template = print_kernel(&p.kernel);
        if !p.params.is_empty() {
            template = with_params(&fill_holes(&template, base, &p.holes), &p.kernel.name, &p.params);
        }
        let parsed = p.params.is_empty().then(|| Arc::new(p.kernel.clone()));
        let origin = Origin::Text(Arc::clone(text), p.first_tok, parsed);
        Generic { name: p.kernel.name, params: p.params, args: p.args, origin, template }
    }

    /// A generic kernel built in Rust: `build` makes its kernel for bound values. Its text, for
    /// messages and tuning records, is the kernel built with the defaults (or the header alone).
    pub(crate) fn built(name: &str, params: Vec<SizeParam>, args: Vec<ArgDecl>, build: Arc<BuildFn>) -> Generic {
        let defaults: Option<BTreeMap<String, i64>> = params.iter().map(|p| Some((p.name.clone(), p.default?))).collect();
        let body = match defaults {
            Some(d) => print_kernel(&build(&d)),
            None => format!("kernel {name}\n"),
        };
        let template = format!("# built in Rust\n{}", with_params(&body, name, &params));
        Generic { name: name.to_string(), params, args, origin: Origin::Built(build), template }
    }

    /// `errors` of this kernel as a message: against its text (named `file`) where it has one.
    pub fn render(&self, errors: &Diagnostics, file: &str) -> String {
        match &self.origin {
            Origin::Text(text, _, _) => errors.render(file, &text.text),
            Origin::Built(_) => errors.to_string(),
        }
    }

    /// The ordinary kernel this is with `values` (one for every parameter), verified. Errors of
    /// a kernel from text point at its generic text; every error names the values.
    pub fn specialize(&self, values: &BTreeMap<String, i64>) -> Result<Verified, Diagnostics> {
        let result = match &self.origin {
            Origin::Text(_, _, Some(kernel)) => verify(kernel),
            Origin::Text(text, first, None) => parse_kernel_at(&text.text, &text.toks, *first, values).and_then(|k| verify(&k)),
            Origin::Built(build) => verify(&build(values)),
        };
        result.map_err(|mut d| {
            if self.is_generic() {
                let with = self.params.iter().filter_map(|p| Some(format!("{} = {}", p.name, values.get(&p.name)?)));
                let with = with.collect::<Vec<_>>().join(", ");
                for e in &mut d.0 {
                    e.message = format!("{} (kernel `{}` with {with})", e.message, self.name);
                }
            }
            d
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its parameters in declaration order.
    pub fn params(&self) -> &[SizeParam] {
        &self.params
    }

    /// Whether it has parameters.
    pub fn is_generic(&self) -> bool {
        !self.params.is_empty()
    }

    /// Canonical text with its parameters and expressions, result types as written. For a kernel
    /// without parameters, the canonical text is that of its verified kernel instead.
    pub fn template_text(&self) -> &str {
        &self.template
    }

    /// Its arguments as declared, in declaration order.
    pub fn args(&self) -> &[ArgDecl] {
        &self.args
    }

    /// The `in` arguments whose dimension `dim` is the parameter `param` alone.
    pub fn shape_sources(&self, param: &str) -> Vec<(&str, usize)> {
        let mut out = Vec::new();
        for a in self.args.iter().filter(|a| a.kind == ParamKind::In) {
            for (d, e) in a.dims.iter().enumerate() {
                if matches!(e, SizeExpr::Name(n) if n == param) {
                    out.push((a.name.as_str(), d));
                }
            }
        }
        out
    }

    /// Binds every parameter: from the shapes of the inputs given (`shapes`, by argument name),
    /// then `given` values, then `tuned` ones, then defaults. A value given for a parameter an
    /// input's shape also gives must agree with it.
    pub fn bind(
        &self,
        given: &BTreeMap<String, i64>,
        tuned: &BTreeMap<String, i64>,
        shapes: &BTreeMap<String, Vec<usize>>,
    ) -> Result<Binding, BindError> {
        for name in given.keys() {
            if !self.params.iter().any(|p| &p.name == name) {
                let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
                let known = if names.is_empty() {
                    "it has no parameters".to_string()
                } else {
                    format!("its parameters are: {}", names.join(", "))
                };
                return Err(BindError::Unknown { kernel: self.name.clone(), name: name.clone(), known });
            }
        }
        let mut b = Binding::default();
        for p in &self.params {
            let mut seen: Option<(&str, usize, i64)> = None;
            for (array, dim) in self.shape_sources(&p.name) {
                let Some(shape) = shapes.get(array) else { continue };
                let Some(&len) = shape.get(dim).filter(|_| shape.len() == self.rank_of(array)) else { continue };
                let value = len as i64;
                match seen {
                    Some((a, a_dim, a_value)) if a_value != value => {
                        let says = |a: &str, d: usize, v: i64| format!("`{a}` says {} = {v} (its dimension {d})", p.name);
                        return Err(BindError::Disagree {
                            kernel: self.name.clone(),
                            param: p.name.clone(),
                            a: says(a, a_dim, a_value),
                            b: says(array, dim, value),
                        });
                    }
                    Some(_) => {}
                    None => seen = Some((array, dim, value)),
                }
            }
            let (value, from) = match (seen, given.get(&p.name)) {
                (Some((array, dim, value)), Some(&g)) if g != value => {
                    return Err(BindError::GivenDisagrees {
                        kernel: self.name.clone(),
                        param: p.name.clone(),
                        given: g,
                        array: array.to_string(),
                        dim,
                        value,
                    });
                }
                (Some((array, dim, value)), _) => (value, ValueFrom::Input { array: array.to_string(), dim }),
                (None, Some(&g)) => (g, ValueFrom::Given),
                (None, None) => match (tuned.get(&p.name), p.default) {
                    (Some(&t), _) => (t, ValueFrom::Tuned),
                    (None, Some(d)) => (d, ValueFrom::Default),
                    (None, None) => continue,
                },
            };
            b.values.insert(p.name.clone(), value);
            b.from.insert(p.name.clone(), from);
        }
        let unbound: Vec<String> =
            self.params.iter().filter(|p| !b.values.contains_key(&p.name)).map(|p| p.name.clone()).collect();
        if !unbound.is_empty() {
            let mut ways: Vec<String> = Vec::new();
            for n in &unbound {
                let sources: Vec<String> = self.shape_sources(n).iter().map(|(a, d)| format!("`{a}` (dimension {d})")).collect();
                ways.push(match sources.as_slice() {
                    [] => format!("`--param {n}=V`"),
                    _ => format!("an input {} or `--param {n}=V`", sources.join(" or ")),
                });
            }
            let how = format!("give {}", ways.join("; "));
            return Err(BindError::Unbound { kernel: self.name.clone(), names: unbound, how });
        }
        Ok(b)
    }

    fn rank_of(&self, array: &str) -> usize {
        self.args.iter().find(|a| a.name == array).map_or(0, |a| a.dims.len())
    }
}

/// `text` (canonical text starting `kernel NAME`) with `[params]` after the name.
fn with_params(text: &str, name: &str, params: &[SizeParam]) -> String {
    let head = format!("kernel {name}");
    let params: Vec<String> = params.iter().map(param_text).collect();
    let rest = text.strip_prefix(head.as_str()).unwrap_or(text);
    format!("{head}[{}]{rest}", params.join(", "))
}

/// `BM = 16 in (8, 16, 32)`.
fn param_text(p: &SizeParam) -> String {
    let mut s = p.name.clone();
    if let Some(d) = p.default {
        s.push_str(&format!(" = {d}"));
    }
    if !p.candidates.is_empty() {
        let c: Vec<String> = p.candidates.iter().map(ToString::to_string).collect();
        s.push_str(&format!(" in ({})", c.join(", ")));
    }
    s
}

/// `text` with every hole number (a whole number token from `base`) replaced by its expression.
fn fill_holes(text: &str, base: i64, holes: &[SizeExpr]) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'%';
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() && (i == 0 || !word(bytes[i - 1])) {
            let end = (i..bytes.len()).find(|&j| !bytes[j].is_ascii_digit()).unwrap_or(bytes.len());
            let hole = text[i..end].parse::<i64>().ok().map(|v| v - base).filter(|h| (0..holes.len() as i64).contains(h));
            if let Some(h) = hole.filter(|_| end == bytes.len() || !word(bytes[end])) {
                out.push_str(&holes[h as usize].to_string());
                i = end;
                continue;
            }
            out.push_str(&text[i..end]);
            i = end;
            continue;
        }
        let ch = text[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

impl fmt::Display for Generic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.template)
    }
}
