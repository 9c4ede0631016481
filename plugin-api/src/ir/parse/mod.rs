//! `.tk` text to IR. Recursive descent over a line-oriented token stream; an error skips to the end
//! of its line (keeping braces balanced) and parsing goes on, so one run reports every error.
//!
//! Size expressions (docs/language.md §9) are computed here, where they are read: the parser is
//! given the values of a kernel's parameters ([`Sizes`]) and writes numbers into the IR, so that
//! a specialized kernel keeps the spans of its generic text.
//!
//! The files of this folder are impl blocks of one `Parser`: this one holds the entry points,
//! the parser's state and its token plumbing; `header.rs` reads a file's kernels and their headers
//! (size parameters, `grid`, arguments); `sizes.rs` size expressions and the types, dimensions and
//! block indices written with them; `ops.rs` the body: statements, operations and operands.

mod header;
mod ops;
mod sizes;

use std::collections::BTreeMap;
use std::fmt;

use super::lexer::{Tok, lex};
use super::size::SizeExpr;
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
    /// `when`, `for` and `if` bodies open around the statement being read.
    nesting: usize,
    /// Operators, parentheses and calls read in the current size expression.
    size_terms: usize,
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
            nesting: 0,
            size_terms: 0,
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
}
