//! `.tk` text to IR. Recursive descent over a line-oriented token stream; an error skips to the end
//! of its line (keeping braces balanced) and parsing goes on, so one run reports every error.
//!
//! Size expressions (docs/language.md §9) are computed here, where they are read: the parser is
//! given the values of a kernel's parameters ([`Sizes`]) and writes numbers into the IR, so that
//! a specialized kernel keeps the spans of its generic text.

use std::collections::BTreeMap;
use std::fmt;

use super::lexer::{Tok, lex};
use super::size::{SizeError, SizeExpr, SizeOp};
use super::*;

/// Parses a whole file. On failure returns every syntax error found, in source order. A kernel
/// with parameters takes their defaults; one without a default is an error (bind it through
/// [`generic::Source`](super::generic::Source)).
pub fn parse(source: &str) -> Result<Module, Diagnostics> {
    let (toks, bad) = lex(source);
    // Holes stand only where a parameter has no default (an error already): keep them positive.
    let kernels = parse_tokens(source, &toks, bad, Sizes::Defaults, 1)?;
    Ok(Module { kernels: kernels.into_iter().map(|p| p.kernel).collect() })
}

/// How the parser gives size expressions their values.
#[derive(Clone, Copy)]
pub(crate) enum Sizes<'a> {
    /// Every parameter takes its default; one without is an error.
    Defaults,
    /// The values of a launch, for every parameter.
    Bound(&'a BTreeMap<String, i64>),
    /// Names and syntax only: an expression that names a parameter reads as a *hole*, the number
    /// `hole_base + n` for the `n`-th such expression of the kernel (see `generic.rs`).
    Template,
}

/// A size parameter of a generic kernel: `N`, `BM = 16 in (8, 16, 32, 64)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeParam {
    /// Its name.
    pub name: String,
    /// Its default, if it has one.
    pub default: Option<i64>,
    /// Values for `tessel tune` to try (empty: not tuned).
    pub candidates: Vec<i64>,
    /// Where it is declared.
    pub span: Span,
}

/// An argument of a generic kernel as declared: `in x: f32[N, D]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgDecl {
    /// Its name.
    pub name: String,
    /// `in`, `out` or `scratch`.
    pub kind: ParamKind,
    /// Its element type.
    pub dtype: DType,
    /// Its dimensions as written (after folding): integers or expressions of parameters.
    pub dims: Vec<SizeExpr>,
}

impl fmt::Display for ArgDecl {
    /// The declared type, `f32[N, D]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dtype.name())?;
        if !self.dims.is_empty() {
            let dims: Vec<String> = self.dims.iter().map(ToString::to_string).collect();
            write!(f, "[{}]", dims.join(", "))?;
        }
        Ok(())
    }
}

/// One kernel as parsed, with what a generic kernel needs besides its IR.
pub(crate) struct Parsed {
    pub kernel: Kernel,
    /// Its size parameters, in declaration order.
    pub params: Vec<SizeParam>,
    /// Its arguments with their dimensions as written.
    pub args: Vec<ArgDecl>,
    /// In a template, the expression behind each hole.
    pub holes: Vec<SizeExpr>,
    /// The index of its `kernel` token.
    pub first_tok: usize,
}

/// Names that may not be parameters: they mean something where a size can stand.
const RESERVED: [&str; 8] = ["cdiv", "min", "max", "dyn", "inf", "nan", "true", "false"];

/// Parses every kernel of lexed text with `sizes`; `bad` are the characters the lexer refused.
pub(crate) fn parse_tokens(
    source: &str,
    toks: &[(Tok, Span)],
    bad: Vec<super::lexer::BadChar>,
    sizes: Sizes<'_>,
    hole_base: i64,
) -> Result<Vec<Parsed>, Diagnostics> {
    let mut p = Parser::new(source, toks, sizes, hole_base);
    let map = SourceMap::new(source);
    // After a character that starts no token, the rest of its line would only give cascades.
    let bad_at: Vec<(usize, usize)> = bad.iter().map(|b| map.line_col(b.span.start as usize)).collect();
    let kernels = p.module();
    p.diags.retain(|d| {
        let (line, col) = map.line_col(d.span.start as usize);
        !bad_at.iter().any(|&(bl, bc)| bl == line && bc <= col)
    });
    for b in bad {
        p.diags.push(
            Diagnostic::new(b.span, format!("unexpected character `{}`", b.text))
                .expected("expected names, `%values`, numbers or one of ( ) [ ] { } , : = * + - / %"),
        );
    }
    if p.diags.is_empty() {
        Ok(kernels)
    } else {
        p.diags.sort_by_key(|d| d.span.start);
        Err(Diagnostics(p.diags))
    }
}

/// Parses the one kernel whose `kernel` token is `first_tok`, with every parameter bound.
pub(crate) fn parse_kernel_at(
    source: &str,
    toks: &[(Tok, Span)],
    first_tok: usize,
    values: &BTreeMap<String, i64>,
) -> Result<Kernel, Diagnostics> {
    let mut p = Parser::new(source, toks, Sizes::Bound(values), 0);
    p.pos = first_tok;
    let parsed = p.kernel();
    match parsed {
        Some(k) if p.diags.is_empty() => Ok(k.kernel),
        _ => {
            p.diags.sort_by_key(|d| d.span.start);
            Err(Diagnostics(p.diags))
        }
    }
}

type PResult<T> = Result<T, Diagnostic>;

struct Parser<'t> {
    toks: &'t [(Tok, Span)],
    pos: usize,
    diags: Vec<Diagnostic>,
    eof: Span,
    sizes: Sizes<'t>,
    hole_base: i64,
    /// The current kernel's parameters and, outside a template, their values.
    declared: Vec<SizeParam>,
    values: BTreeMap<String, i64>,
    /// The current kernel's holes (in a template) and `in` dimensions as written.
    holes: Vec<SizeExpr>,
    args: Vec<ArgDecl>,
    /// Whether the current kernel is read as a template (a parameter had no value).
    template: bool,
    /// The dimensions of the last type read, as written.
    last_dims: Vec<SizeExpr>,
}

impl<'t> Parser<'t> {
    fn new(source: &str, toks: &'t [(Tok, Span)], sizes: Sizes<'t>, hole_base: i64) -> Parser<'t> {
        super::counters::parsed();
        Parser {
            toks,
            pos: 0,
            diags: Vec::new(),
            eof: Span::new(source.len(), source.len()),
            sizes,
            hole_base,
            declared: Vec::new(),
            values: BTreeMap::new(),
            holes: Vec::new(),
            args: Vec::new(),
            template: false,
            last_dims: Vec::new(),
        }
    }

    // ---- token plumbing ----

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn span(&self) -> Span {
        self.toks.get(self.pos).map_or(self.eof, |t| t.1)
    }

    fn prev_span(&self) -> Span {
        self.pos.checked_sub(1).and_then(|p| self.toks.get(p)).map_or(self.eof, |t| t.1)
    }

    fn bump(&mut self) -> Option<(Tok, Span)> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += usize::from(t.is_some());
        t
    }

    fn at(&self, tok: &Tok) -> bool {
        self.peek() == Some(tok)
    }

    fn at_ident(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(s)) if s == word)
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        let hit = self.at(tok);
        self.pos += usize::from(hit);
        hit
    }

    fn eat_ident(&mut self, word: &str) -> bool {
        let hit = self.at_ident(word);
        self.pos += usize::from(hit);
        hit
    }

    /// An error at the current token: "unexpected X", with what was expected.
    fn unexpected(&self, expected: &str) -> Diagnostic {
        let found = self.peek().map_or("end of file".to_string(), Tok::describe);
        Diagnostic::new(self.span(), format!("unexpected {found}")).expected(format!("expected {expected}"))
    }

    fn expect(&mut self, tok: Tok, expected: &str) -> PResult<Span> {
        if self.eat(&tok) { Ok(self.prev_span()) } else { Err(self.unexpected(expected)) }
    }

    fn expect_keyword(&mut self, word: &str) -> PResult<Span> {
        if self.eat_ident(word) { Ok(self.prev_span()) } else { Err(self.unexpected(&format!("`{word}`"))) }
    }

    fn ident(&mut self, expected: &str) -> PResult<(String, Span)> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok((s, self.prev_span()))
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn value_name(&mut self, expected: &str) -> PResult<String> {
        match self.peek() {
            Some(Tok::Value(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn int<T: TryFrom<i64>>(&mut self, expected: &str) -> PResult<T> {
        let v = self.unsigned_int(expected)?;
        T::try_from(v).map_err(|_| {
            Diagnostic::new(self.prev_span(), format!("`{v}` is out of range")).expected(format!("expected {expected}"))
        })
    }

    /// An integer literal without sign.
    fn unsigned_int(&mut self, expected: &str) -> PResult<i64> {
        match self.peek() {
            Some(Tok::Int(s)) => {
                let s = s.clone();
                self.pos += 1;
                s.parse::<i64>().map_err(|_| {
                    Diagnostic::new(self.prev_span(), format!("integer `{s}` does not fit in 64 bits"))
                        .expected("expected an integer between -2^63 and 2^63-1")
                })
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    /// The end of a header line: a newline, or the `{` that opens the body on the same line.
    fn expect_header_end(&mut self) -> PResult<()> {
        if self.at(&Tok::LBrace) {
            return Ok(());
        }
        self.expect_line_end()
    }

    fn skip_newlines(&mut self) {
        while self.eat(&Tok::Newline) {}
    }

    fn at_line_end(&self) -> bool {
        matches!(self.peek(), None | Some(Tok::Newline))
    }

    fn expect_line_end(&mut self) -> PResult<()> {
        if self.at_line_end() || self.at(&Tok::RBrace) {
            self.eat(&Tok::Newline);
            Ok(())
        } else {
            Err(self.unexpected("end of line"))
        }
    }

    /// Skips to the end of the current line. A `{` opened on the way is skipped with its whole
    /// body; a `}` closing an enclosing body is left for its owner.
    fn recover_line(&mut self) {
        let mut depth = 0usize;
        while let Some(tok) = self.peek() {
            match tok {
                Tok::Newline if depth == 0 => {
                    self.pos += 1;
                    return;
                }
                Tok::LBrace => depth += 1,
                Tok::RBrace if depth == 0 => return,
                Tok::RBrace => depth -= 1,
                _ => {}
            }
            self.pos += 1;
        }
    }

    // ---- file and header ----

    fn module(&mut self) -> Vec<Parsed> {
        let mut kernels = Vec::new();
        loop {
            self.skip_newlines();
            if self.peek().is_none() {
                break;
            }
            if self.at_ident("kernel") {
                if let Some(k) = self.kernel() {
                    kernels.push(k);
                }
            } else {
                let d = self.unexpected("`kernel NAME` to start a kernel");
                self.diags.push(d);
                self.recover_line();
                // Skip a stray body so its statements are not reported one by one.
                if self.eat(&Tok::RBrace) {
                    self.recover_line();
                }
            }
        }
        if kernels.is_empty() && self.diags.is_empty() {
            self.diags.push(
                Diagnostic::new(self.eof, "the file defines no kernel")
                    .expected("expected at least one `kernel NAME` with a header and a `{ ... }` body (see docs/language.md)"),
            );
        }
        kernels
    }

    fn kernel(&mut self) -> Option<Parsed> {
        let first_tok = self.pos;
        let start = self.span();
        self.pos += 1; // `kernel`
        let name = match self.ident("a kernel name after `kernel`") {
            Ok((n, _)) => n,
            Err(d) => {
                self.diags.push(d);
                String::new()
            }
        };
        let span = start.to(self.prev_span());
        self.declared.clear();
        self.holes.clear();
        self.args.clear();
        let mut recovered = false;
        if self.at(&Tok::LBracket) {
            match self.size_params() {
                Ok(params) => self.declared = params,
                Err(d) => {
                    self.diags.push(d);
                    self.recover_line();
                    recovered = true;
                }
            }
        }
        self.bind_declared(&name, span);
        if let Err(d) = self.expect_line_end().map_err(|d| (!recovered).then_some(d)) {
            self.diags.extend(d);
            self.recover_line();
        }
        let mut kernel = Kernel { name, grid: None, params: Vec::new(), body: Vec::new(), span };
        let mut missing_brace = false;
        loop {
            self.skip_newlines();
            let res = match self.peek() {
                Some(Tok::LBrace) => break,
                Some(Tok::Ident(w)) if w == "grid" => self.grid(&mut kernel),
                Some(Tok::Ident(w)) if w == "in" || w == "out" || w == "scratch" => self.param().map(|p| kernel.params.push(p)),
                Some(Tok::Ident(w)) if w == "kernel" => {
                    let d = self.unexpected("`{` to open the body of kernel before the next kernel");
                    self.diags.push(d);
                    return None;
                }
                None => {
                    let d = self.unexpected("`{` to open the kernel body");
                    self.diags.push(d);
                    return None;
                }
                Some(Tok::Value(_)) => {
                    // A statement: the `{` is missing. Say so once and read the body from here.
                    let d = self.unexpected("`{` on its own line to open the body before the first statement");
                    self.diags.push(d);
                    missing_brace = true;
                    break;
                }
                Some(Tok::RBrace) => {
                    let d = self.unexpected("a header line (`grid`, `in`, `out`, `scratch`) or `{` to open the body");
                    self.diags.push(d);
                    self.pos += 1;
                    continue;
                }
                _ => Err(self.unexpected("a header line (`grid`, `in`, `out`, `scratch`) or `{` to open the body")),
            };
            if let Err(d) = res {
                self.diags.push(d);
                let before = self.pos;
                self.recover_line();
                if self.pos == before {
                    self.pos += 1;
                }
            }
        }
        if !missing_brace {
            self.pos += 1; // `{`
            if let Err(d) = self.expect_line_end() {
                self.diags.push(d);
                self.recover_line();
            }
        }
        kernel.body = self.block();
        if !self.eat(&Tok::RBrace) {
            let found = self.peek().map_or("the end of the file".to_string(), Tok::describe);
            let d = Diagnostic::new(kernel.span, format!("the body of kernel `{}` is not closed", kernel.name))
                .expected(format!("expected `}}` on a line of its own before {found}"));
            self.diags.push(d);
            return None;
        }
        if let Err(d) = self.expect_line_end() {
            self.diags.push(d);
            self.recover_line();
        }
        self.check_param_names(&kernel);
        Some(Parsed {
            kernel,
            params: std::mem::take(&mut self.declared),
            args: std::mem::take(&mut self.args),
            holes: std::mem::take(&mut self.holes),
            first_tok,
        })
    }

    // ---- parameters and size expressions ----

    /// `[N, D, BM = 16 in (8, 16, 32, 64)]` after the kernel's name.
    fn size_params(&mut self) -> PResult<Vec<SizeParam>> {
        self.pos += 1; // `[`
        let mut out: Vec<SizeParam> = Vec::new();
        loop {
            let (name, span) = self.ident("a parameter name, as in `kernel softmax[N, D, BM = 16]`")?;
            if RESERVED.contains(&name.as_str()) {
                return Err(Diagnostic::new(span, format!("`{name}` cannot name a parameter"))
                    .expected(format!("expected a name other than {}", RESERVED.join(", "))));
            }
            if out.iter().any(|p| p.name == name) {
                return Err(Diagnostic::new(span, format!("parameter `{name}` is declared twice"))
                    .expected("expected each parameter once"));
            }
            let mut default = None;
            let mut candidates = Vec::new();
            if self.eat(&Tok::Eq) {
                default = Some(self.constant_size("a default value")?);
                if self.eat_ident("in") {
                    self.expect(Tok::LParen, "`(` and the candidates, as in `BM = 16 in (8, 16, 32)`")?;
                    loop {
                        candidates.push(self.constant_size("a candidate value")?);
                        if self.eat(&Tok::RParen) {
                            break;
                        }
                        self.expect(Tok::Comma, "`,` or `)` in the candidates")?;
                    }
                }
            }
            out.push(SizeParam { name, default, candidates, span: span.to(self.prev_span()) });
            if self.eat(&Tok::RBracket) {
                return Ok(out);
            }
            self.expect(Tok::Comma, "`,` or `]` after a parameter")?;
        }
    }

    /// A default or candidate: an expression of integers alone.
    fn constant_size(&mut self, what: &str) -> PResult<i64> {
        let start = self.span();
        if let Some(Tok::Ident(w)) = self.peek()
            && SizeOp::from_call(w).is_none()
        {
            return Err(Diagnostic::new(start, format!("unexpected `{w}` in {what}"))
                .expected("expected an integer (defaults and candidates name no parameters)"));
        }
        let (e, span) = self.size_expr(false)?;
        e.eval(&|_| None).map_err(|err| self.size_error(&err, &e, span))
    }

    /// Gives the declared parameters their values for this kernel, per [`Sizes`].
    fn bind_declared(&mut self, kernel: &str, span: Span) {
        self.values.clear();
        self.template = matches!(self.sizes, Sizes::Template);
        match self.sizes {
            Sizes::Template => {}
            Sizes::Bound(values) => self.values = values.clone(),
            Sizes::Defaults => {
                let missing: Vec<&str> = self.declared.iter().filter(|p| p.default.is_none()).map(|p| p.name.as_str()).collect();
                if !missing.is_empty() {
                    self.diags.push(
                        Diagnostic::new(span, format!("kernel `{kernel}` has parameters without a value: {}", missing.join(", ")))
                            .expected("expected defaults for all of them here; a launch binds them (`--param N=V`, or the shape of an input)"),
                    );
                    // Read the rest for its syntax only.
                    self.template = true;
                }
                self.values = self.declared.iter().filter_map(|p| Some((p.name.clone(), p.default?))).collect();
            }
        }
    }

    /// Parameters may not share a name with an argument or a grid axis: inside `at (...)` a
    /// parameter would hide the axis.
    fn check_param_names(&mut self, kernel: &Kernel) {
        for p in &self.declared {
            let clash = if kernel.param(&p.name).is_some() {
                Some("an argument")
            } else if kernel.grid.iter().flatten().any(|a| a.name == p.name) {
                Some("a grid axis")
            } else {
                None
            };
            if let Some(what) = clash {
                self.diags.push(
                    Diagnostic::new(p.span, format!("parameter `{}` has the name of {what}", p.name))
                        .expected("expected parameters with names of their own, such as `N` or `BM`"),
                );
            }
        }
    }

    fn is_param(&self, name: &str) -> bool {
        self.declared.iter().any(|p| p.name == name)
    }

    /// Whether the tokens from `at` start a size expression (in an operand's place).
    fn size_starts(&self, at: usize) -> bool {
        let tok = |i: usize| self.toks.get(i).map(|t| &t.0);
        match tok(at) {
            Some(Tok::Int(_) | Tok::LParen) => true,
            Some(Tok::Minus) => self.size_starts(at + 1),
            Some(Tok::Ident(w)) => self.is_param(w) || (SizeOp::from_call(w).is_some() && tok(at + 1) == Some(&Tok::LParen)),
            _ => false,
        }
    }

    /// A size expression and its span; `axes` lets names that are not parameters stand for grid
    /// axes (inside `at (...)`).
    fn size_expr(&mut self, axes: bool) -> PResult<(SizeExpr, Span)> {
        let start = self.span();
        let e = self.size_sum(axes)?;
        Ok((e, start.to(self.prev_span())))
    }

    fn size_sum(&mut self, axes: bool) -> PResult<SizeExpr> {
        let mut e = self.size_term(axes)?;
        loop {
            let op = if self.eat(&Tok::Plus) {
                SizeOp::Add
            } else if self.eat(&Tok::Minus) {
                SizeOp::Sub
            } else {
                return Ok(e);
            };
            e = SizeExpr::Bin(op, Box::new(e), Box::new(self.size_term(axes)?));
        }
    }

    fn size_term(&mut self, axes: bool) -> PResult<SizeExpr> {
        let mut e = self.size_unary(axes)?;
        loop {
            let rhs = match self.peek() {
                Some(Tok::Star) => (SizeOp::Mul, None),
                Some(Tok::Slash) => (SizeOp::Div, None),
                Some(Tok::Percent) => (SizeOp::Rem, None),
                // `N %BM` lexes as `N` and the value name `%BM`; no value may follow a size.
                Some(Tok::Value(v)) => (SizeOp::Rem, Some(v.clone())),
                _ => return Ok(e),
            };
            self.pos += 1;
            let b = match rhs.1 {
                Some(text) => match text.parse::<i64>() {
                    Ok(v) => SizeExpr::Int(v),
                    Err(_) => self.size_name(text, axes, self.prev_span())?,
                },
                None => self.size_unary(axes)?,
            };
            e = SizeExpr::Bin(rhs.0, Box::new(e), Box::new(b));
        }
    }

    fn size_unary(&mut self, axes: bool) -> PResult<SizeExpr> {
        if self.eat(&Tok::Minus) {
            return Ok(SizeExpr::Neg(Box::new(self.size_unary(axes)?)));
        }
        match self.peek().cloned() {
            Some(Tok::Int(s)) => {
                self.pos += 1;
                s.parse::<i64>().map(SizeExpr::Int).map_err(|_| {
                    Diagnostic::new(self.prev_span(), format!("integer `{s}` does not fit in 64 bits"))
                        .expected("expected an integer between -2^63 and 2^63-1")
                })
            }
            Some(Tok::LParen) => {
                self.pos += 1;
                let e = self.size_sum(axes)?;
                self.expect(Tok::RParen, "`)` to close the parenthesis")?;
                Ok(e)
            }
            Some(Tok::Ident(w)) => {
                self.pos += 1;
                let span = self.prev_span();
                match SizeOp::from_call(&w) {
                    Some(op) if self.eat(&Tok::LParen) => {
                        let a = self.size_sum(axes)?;
                        self.expect(Tok::Comma, &format!("`,` and the second argument of `{w}(...)`"))?;
                        let b = self.size_sum(axes)?;
                        self.expect(Tok::RParen, &format!("`)` to close `{w}(...)`"))?;
                        Ok(SizeExpr::Bin(op, Box::new(a), Box::new(b)))
                    }
                    _ => self.size_name(w, axes, span),
                }
            }
            _ => Err(self.unexpected("a size: an integer, a parameter, or an expression such as `cdiv(N, 128)`")),
        }
    }

    fn size_name(&self, name: String, axes: bool, span: Span) -> PResult<SizeExpr> {
        if axes || self.is_param(&name) {
            return Ok(SizeExpr::Name(name));
        }
        let expected = if self.declared.is_empty() {
            "expected an integer, or a parameter declared after the kernel's name, as in `kernel add[N]`".to_string()
        } else {
            let names: Vec<&str> = self.declared.iter().map(|p| p.name.as_str()).collect();
            format!("expected an integer or one of this kernel's parameters: {}", names.join(", "))
        };
        Err(Diagnostic::new(span, format!("unknown size `{name}`")).expected(expected))
    }

    /// The value of a size expression here, or its hole in a template.
    fn size_value(&mut self, e: &SizeExpr, span: Span) -> PResult<i64> {
        if self.template && e.names().iter().any(|n| self.is_param(n)) {
            return Ok(self.hole(e));
        }
        let values = &self.values;
        e.eval(&|n| values.get(n).copied()).map_err(|err| self.size_error(&err, e, span))
    }

    fn hole(&mut self, e: &SizeExpr) -> i64 {
        self.holes.push(e.clone().fold());
        self.hole_base + self.holes.len() as i64 - 1
    }

    /// A size: a positive integer of type `T`. A plain literal is left to the verifier.
    fn size<T: TryFrom<i64>>(&mut self, what: &str) -> PResult<T> {
        Ok(self.size_written(what)?.0)
    }

    /// A size and the expression it was written as.
    fn size_written<T: TryFrom<i64>>(&mut self, what: &str) -> PResult<(T, SizeExpr)> {
        let (e, span) = self.size_expr(false)?;
        let v = self.size_value(&e, span)?;
        if !matches!(e, SizeExpr::Int(_)) && v <= 0 {
            return Err(Diagnostic::new(span, format!("`{e}` is {v}{}, but {what} must be at least 1", self.with_values(&e)))
                .expected("expected a positive size; choose parameters that give one"));
        }
        match T::try_from(v) {
            Ok(v) => Ok((v, e)),
            Err(_) => Err(Diagnostic::new(span, format!("{what} `{e}` is {v}, out of range"))
                .expected(format!("expected {what} that fits"))),
        }
    }

    /// ` with N = 1000, BM = 16 (the defaults)` for the parameters `e` names, where the values
    /// are defaults (a launch's values are named by whoever specialized the kernel).
    fn with_values(&self, e: &SizeExpr) -> String {
        if !matches!(self.sizes, Sizes::Defaults) {
            return String::new();
        }
        let named: Vec<String> = e.names().into_iter().filter_map(|n| Some(format!("{n} = {}", self.values.get(n)?))).collect();
        if named.is_empty() { String::new() } else { format!(" with {} (the defaults)", named.join(", ")) }
    }

    fn size_error(&self, err: &SizeError, e: &SizeExpr, span: Span) -> Diagnostic {
        let expected = match err {
            SizeError::Unbound(_) => "expected a value for it at launch: `--param N=V`, or an input whose shape has it",
            SizeError::Divisor { .. } => "expected a positive divisor",
            SizeError::Overflow => "expected sizes within 64 bits",
            SizeError::NotAffine(_) => {
                "expected a block index such as `i`, `2*i + 1` or `N / 128 - 1 - i`: axes times integers, plus integers"
            }
        };
        let message = match err {
            SizeError::NotAffine(_) => format!("{err}{}", self.with_values(e)),
            _ => format!("`{e}`: {err}{}", self.with_values(e)),
        };
        Diagnostic::new(span, message).expected(expected)
    }

    fn grid(&mut self, kernel: &mut Kernel) -> PResult<()> {
        let start = self.span();
        self.pos += 1; // `grid`
        self.expect(Tok::LParen, "`(` after `grid`, as in `grid (i: 8, k: 4 seq)`")?;
        let mut axes = Vec::new();
        loop {
            let (name, name_span) = self.ident("an axis name, as in `i: 8`")?;
            self.expect(Tok::Colon, "`:` and the axis size, as in `i: 8`")?;
            let size = if self.eat_ident("dyn") { AxisSize::Dyn } else { AxisSize::Fixed(self.size("a grid size")?) };
            let seq = self.eat_ident("seq");
            axes.push(GridAxis { name, size, seq, span: name_span.to(self.prev_span()) });
            if self.eat(&Tok::RParen) {
                break;
            }
            self.expect(Tok::Comma, "`,` or `)` in the grid")?;
        }
        if kernel.grid.is_some() {
            return Err(Diagnostic::new(start.to(self.prev_span()), "a second `grid` line")
                .expected("expected one `grid (...)` line per kernel, listing every axis"));
        }
        kernel.grid = Some(axes);
        self.expect_header_end()
    }

    fn param(&mut self) -> PResult<Param> {
        let start = self.span();
        let kind = match self.bump() {
            Some((Tok::Ident(w), _)) if w == "in" => ParamKind::In,
            Some((Tok::Ident(w), _)) if w == "out" => ParamKind::Out,
            _ => ParamKind::Scratch,
        };
        let (name, _) = self.ident(&format!("an argument name after `{}`", kind.keyword()))?;
        self.expect(Tok::Colon, "`:` and a type, as in `x: f32[1024]`")?;
        let ty = self.ty()?;
        let dims = self.last_dims.iter().cloned().map(SizeExpr::fold).collect();
        self.args.push(ArgDecl { name: name.clone(), kind, dtype: ty.dtype, dims });
        let mut block = None;
        if self.eat_ident("block") {
            let shape = self.dims("block dimensions, as in `block [128]`")?;
            self.expect_keyword("at")?;
            self.expect(Tok::LParen, "`(` and the block index, as in `at (i)`")?;
            let mut index = Vec::new();
            loop {
                index.push(self.affine()?);
                if self.eat(&Tok::RParen) {
                    break;
                }
                self.expect(Tok::Comma, "`,` or `)` in the block index")?;
            }
            block = Some(BlockSpec { shape, index });
        }
        let span = start.to(self.prev_span());
        self.expect_header_end()?;
        Ok(Param { kind, name, ty, block, span })
    }

    fn dims(&mut self, expected: &str) -> PResult<Vec<usize>> {
        self.expect(Tok::LBracket, expected)?;
        let mut dims = Vec::new();
        self.last_dims.clear();
        loop {
            let (dim, written) = self.size_written("a dimension")?;
            dims.push(dim);
            self.last_dims.push(written);
            if self.eat(&Tok::RBracket) {
                return Ok(dims);
            }
            self.expect(Tok::Comma, "`,` or `]` in the dimensions")?;
        }
    }

    fn ty(&mut self) -> PResult<Type> {
        let (name, span) = self.ident("a type such as `f32` or `f32[16, 96]`")?;
        let dtype = DType::from_name(&name).ok_or_else(|| {
            Diagnostic::new(span, format!("unknown dtype `{name}`")).expected("expected one of f32 i32 u32 bool f16 bf16")
        })?;
        self.last_dims.clear();
        let shape = if self.at(&Tok::LBracket) { self.dims("dimensions")? } else { Vec::new() };
        Ok(Type { dtype, shape })
    }

    /// A block index: a size expression in which names that are not parameters are grid axes,
    /// affine in them.
    fn affine(&mut self) -> PResult<Affine> {
        let (e, span) = self.size_expr(true)?;
        if self.template && e.names().iter().any(|n| self.is_param(n)) {
            return Ok(Affine::constant(self.hole(&e)));
        }
        let values = &self.values;
        let declared = &self.declared;
        // A declared parameter without a value reads as 0 so that it is never taken for an axis
        // (only where an error was already reported).
        let param = |n: &str| values.get(n).copied().or_else(|| declared.iter().any(|p| p.name == n).then_some(0));
        e.affine(&param).map_err(|err| self.size_error(&err, &e, span))
    }

    // ---- body ----

    fn block(&mut self) -> Vec<Stmt> {
        let mut stmts = Vec::new();
        loop {
            self.skip_newlines();
            match self.peek() {
                None | Some(Tok::RBrace) => return stmts,
                Some(Tok::Ident(w)) if w == "kernel" => return stmts,
                _ => {}
            }
            match self.stmt() {
                Ok(s) => stmts.push(s),
                Err(d) => {
                    self.diags.push(d);
                    self.recover_line();
                }
            }
        }
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        let start = self.span();
        let mut results = Vec::new();
        if matches!(self.peek(), Some(Tok::Value(_))) {
            loop {
                results.push(self.value_name("a result name such as `%r`")?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            self.expect(Tok::Eq, "`=` after the result names")?;
        }
        let (name, name_span) = self.ident("an operation such as `load`, `add` or `store`")?;
        let op = self.op(&name, name_span)?;
        let mut span = start.to(self.prev_span());
        if matches!(op, Op::When { .. } | Op::For { .. }) {
            return self.finish_block_stmt(results, op, span);
        }
        let ty = if self.eat(&Tok::Colon) { Some(self.ty()?) } else { None };
        if ty.is_some() {
            span = span.to(self.prev_span());
        }
        self.expect_line_end()?;
        Ok(Stmt { results, op, ty, span })
    }

    /// `when` and `for`: the header is parsed; now `{`, the body, `}`.
    fn finish_block_stmt(&mut self, results: Vec<String>, mut op: Op, span: Span) -> PResult<Stmt> {
        self.expect(Tok::LBrace, "`{` to open the body")?;
        self.expect_line_end()?;
        let inner = self.block();
        if !self.eat(&Tok::RBrace) {
            let found = self.peek().map_or("the end of the file".to_string(), Tok::describe);
            return Err(Diagnostic::new(span, format!("the `{}` body opened here is not closed", op.mnemonic()))
                .expected(format!("expected `}}` on a line of its own before {found}")));
        }
        match &mut op {
            Op::When { body, .. } | Op::For { body, .. } => *body = inner,
            _ => unreachable!("only when and for have bodies"),
        }
        self.expect_line_end()?;
        Ok(Stmt { results, op, ty: None, span })
    }

    fn op(&mut self, name: &str, name_span: Span) -> PResult<Op> {
        Ok(match name {
            "load" => self.load()?,
            "store" => self.store()?,
            "program_id" => Op::ProgramId(self.axis_ref()?),
            "num_programs" => Op::NumPrograms(self.axis_ref()?),
            "iota" => Op::Iota { dim: self.int("the dimension that counts, as in `iota 0 : i32[128]`")? },
            "full" => Op::Full(self.literal()?),
            "zeros" => Op::Zeros,
            "select" => {
                let c = self.operand()?;
                self.expect(Tok::Comma, "`,` after the condition")?;
                let a = self.operand()?;
                self.expect(Tok::Comma, "`,` between the two choices")?;
                Op::Select(c, a, self.operand()?)
            }
            "cast" => Op::Cast(self.operand()?),
            "bitcast" => Op::Bitcast(self.operand()?),
            "broadcast" => Op::Broadcast(self.operand()?),
            "reshape" => Op::Reshape(self.operand()?),
            "transpose" => {
                let arg = self.operand()?;
                self.expect_keyword("perm")?;
                self.expect(Tok::LParen, "`(` and the permutation, as in `perm (1, 0)`")?;
                let mut perm = Vec::new();
                loop {
                    perm.push(self.int("a dimension number")?);
                    if self.eat(&Tok::RParen) {
                        break;
                    }
                    self.expect(Tok::Comma, "`,` or `)` in the permutation")?;
                }
                Op::Transpose { arg, perm }
            }
            "dot" => {
                let a = self.operand()?;
                self.expect(Tok::Comma, "`,` between the two matrices")?;
                let b = self.operand()?;
                let trans_a = self.eat_ident("trans_a");
                let trans_b = self.eat_ident("trans_b");
                Op::Dot { a, b, trans_a, trans_b }
            }
            "when" => Op::When { cond: self.operand()?, body: Vec::new() },
            "for" => self.for_header()?,
            "yield" => {
                let mut vals = Vec::new();
                if !self.at_line_end() && !self.at(&Tok::RBrace) {
                    loop {
                        vals.push(self.operand()?);
                        if !self.eat(&Tok::Comma) {
                            break;
                        }
                    }
                }
                Op::Yield(vals)
            }
            _ => self.arith(name, name_span)?,
        })
    }

    /// Unary, binary, compare and reduce operations (`max`/`min` are both binary and reduce).
    fn arith(&mut self, name: &str, name_span: Span) -> PResult<Op> {
        if let Some(op) = UnaryOp::from_name(name) {
            return Ok(Op::Unary(op, self.operand()?));
        }
        let reduce = ReduceOp::from_name(name);
        let binary = BinaryOp::from_name(name);
        let compare = CmpOp::from_name(name);
        if reduce.is_none() && binary.is_none() && compare.is_none() {
            return Err(Diagnostic::new(name_span, format!("unknown operation `{name}`"))
                .expected("expected an operation of docs/language.md, such as load, store, add, exp, sum, dot, when or for"));
        }
        let lhs = self.operand()?;
        if let Some(op) = reduce
            && self.eat_ident("axis")
        {
            let axis = self.int("the axis number")?;
            let keepdims = self.eat_ident("keepdims");
            return Ok(Op::Reduce { op, arg: lhs, axis, keepdims });
        }
        if binary.is_none() && compare.is_none() {
            return Err(self.unexpected(&format!("`axis N` after `{name} %value`")));
        }
        let expect =
            if reduce.is_some() { "`,` and a second operand, or `axis N` for a reduction" } else { "`,` and a second operand" };
        self.expect(Tok::Comma, expect)?;
        let rhs = self.operand()?;
        Ok(match (binary, compare) {
            (Some(op), _) => Op::Binary(op, lhs, rhs),
            (None, Some(op)) => Op::Compare(op, lhs, rhs),
            (None, None) => unreachable!("checked above"),
        })
    }

    fn for_header(&mut self) -> PResult<Op> {
        let var = self.value_name("the induction variable, as in `for %i = 0 to 8`")?;
        self.expect(Tok::Eq, "`=` after the induction variable")?;
        let lo = self.operand()?;
        self.expect_keyword("to")?;
        let hi = self.operand()?;
        let step = if self.eat_ident("step") { Some(self.operand()?) } else { None };
        let mut iters = Vec::new();
        if self.eat_ident("iter") {
            self.expect(Tok::LParen, "`(` and the carried values, as in `iter (%acc = %init)`")?;
            loop {
                let name = self.value_name("a carried value name such as `%acc`")?;
                self.expect(Tok::Eq, "`=` and the initial value")?;
                iters.push((name, self.operand()?));
                if self.eat(&Tok::RParen) {
                    break;
                }
                self.expect(Tok::Comma, "`,` or `)` in `iter (...)`")?;
            }
        }
        Ok(Op::For { var, lo, hi, step, iters, body: Vec::new() })
    }

    fn load(&mut self) -> PResult<Op> {
        let (src, _) = self.ident("the argument or scratch to load from")?;
        let index = self.index_list()?;
        let mask = if self.eat_ident("mask") { Some(self.value_name("a `bool` mask value after `mask`")?) } else { None };
        let other = if self.eat_ident("other") { Some(self.literal()?) } else { None };
        Ok(Op::Load { src, index, mask, other })
    }

    fn store(&mut self) -> PResult<Op> {
        let (dst, _) = self.ident("the output or scratch to store to")?;
        let index = self.index_list()?;
        self.expect(Tok::Comma, "`,` and the value to store, as in `store o, %v`")?;
        let value = self.operand()?;
        let mask = if self.eat_ident("mask") { Some(self.value_name("a `bool` mask value after `mask`")?) } else { None };
        Ok(Op::Store { dst, index, value, mask })
    }

    fn index_list(&mut self) -> PResult<Option<Vec<Index>>> {
        if !self.eat(&Tok::LBracket) {
            return Ok(None);
        }
        let mut out = Vec::new();
        loop {
            out.push(if self.eat(&Tok::Colon) {
                Index::Full
            } else if self.eat_ident("ds") {
                self.expect(Tok::LParen, "`(` after `ds`, as in `ds(%start, 128)`")?;
                let start = self.operand()?;
                self.expect(Tok::Comma, "`,` and the slice size")?;
                let size = self.size("a slice size")?;
                self.expect(Tok::RParen, "`)` to close `ds(...)`")?;
                Index::Slice { start, size }
            } else {
                Index::At(self.operand()?)
            });
            if self.eat(&Tok::RBracket) {
                return Ok(Some(out));
            }
            self.expect(Tok::Comma, "`,` or `]` in the index")?;
        }
    }

    fn axis_ref(&mut self) -> PResult<AxisRef> {
        match self.peek() {
            Some(Tok::Int(_)) => Ok(AxisRef::Pos(self.int("an axis position")?)),
            _ => Ok(AxisRef::Name(self.ident("a grid axis name or position")?.0)),
        }
    }

    fn operand(&mut self) -> PResult<Operand> {
        match self.peek() {
            Some(Tok::Value(_)) => Ok(Operand::Value(self.value_name("a value")?)),
            _ => self.literal().map(Operand::Lit).map_err(|_| self.unexpected("a `%value` or a literal")),
        }
    }

    fn literal(&mut self) -> PResult<Literal> {
        if self.size_starts(self.pos) {
            let (e, span) = self.size_expr(false)?;
            return Ok(Literal::Int(self.size_value(&e, span)?));
        }
        let neg = self.eat(&Tok::Minus);
        let sign = if neg { -1.0 } else { 1.0 };
        let lit = match self.peek().cloned() {
            Some(Tok::Float(s)) => {
                self.pos += 1;
                let v: f64 = s.parse().map_err(|_| {
                    Diagnostic::new(self.prev_span(), format!("malformed float `{s}`"))
                        .expected("expected a float such as 0.5 or 1e-5")
                })?;
                Literal::Float(sign * v)
            }
            Some(Tok::Ident(w)) if w == "inf" => {
                self.pos += 1;
                Literal::Float(sign * f64::INFINITY)
            }
            Some(Tok::Ident(w)) if w == "nan" && !neg => {
                self.pos += 1;
                Literal::Float(f64::NAN)
            }
            Some(Tok::Ident(w)) if (w == "true" || w == "false") && !neg => {
                self.pos += 1;
                Literal::Bool(w == "true")
            }
            _ => return Err(self.unexpected("a literal: an integer, a float, inf, -inf, nan, true or false")),
        };
        Ok(lit)
    }
}
