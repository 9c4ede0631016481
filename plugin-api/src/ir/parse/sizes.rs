//! Size expressions (docs/language.md §9) as the parser reads and computes them, and what is
//! written with them: types and their dimensions, and block indices (affine in the grid axes).

use super::{PResult, Parser, Sizes};
use crate::ir::lexer::Tok;
use crate::ir::limits::{MAX_ARRAY_ELEMENTS, MAX_SIZE_TERMS, elements_within_limit};
use crate::ir::size::{SizeError, SizeExpr, SizeOp};
use crate::ir::*;

impl Parser<'_> {
    /// A default or candidate: an expression of integers alone.
    pub(super) fn constant_size(&mut self, what: &str) -> PResult<i64> {
        let start = self.span();
        if let Some(Tok::Ident(w)) = self.peek()
            && SizeOp::from_call(w).is_none()
            && w != "select"
        {
            return Err(Diagnostic::new(start, format!("unexpected `{w}` in {what}"))
                .expected("expected an integer (defaults and candidates name no parameters)"));
        }
        let (e, span) = self.size_expr(false)?;
        e.eval(&|_| None).map_err(|err| self.size_error(&err, &e, span))
    }

    fn is_param(&self, name: &str) -> bool {
        self.declared.iter().any(|p| p.name == name)
    }

    /// Whether the tokens from `at` start a size expression (in an operand's place).
    pub(super) fn size_starts(&self, at: usize) -> bool {
        let tok = |i: usize| self.toks.get(i).map(|t| &t.0);
        match tok(at) {
            Some(Tok::Int(_) | Tok::LParen) => true,
            Some(Tok::Minus) => self.size_starts(at + 1),
            Some(Tok::Ident(w)) => {
                self.is_param(w) || ((SizeOp::from_call(w).is_some() || w == "select") && tok(at + 1) == Some(&Tok::LParen))
            }
            _ => false,
        }
    }

    /// A size expression and its span; `axes` lets names that are not parameters stand for grid
    /// axes (inside `at (...)`).
    pub(super) fn size_expr(&mut self, axes: bool) -> PResult<(SizeExpr, Span)> {
        let start = self.span();
        self.size_terms = 0;
        let e = self.size_sum(axes)?;
        Ok((e, start.to(self.prev_span())))
    }

    /// Counts one operator, parenthesis or call of the current size expression.
    fn size_term_read(&mut self) -> PResult<()> {
        self.size_terms += 1;
        if self.size_terms > MAX_SIZE_TERMS {
            return Err(Diagnostic::new(
                self.prev_span(),
                format!("this size expression has more than {MAX_SIZE_TERMS} operators, parentheses and calls"),
            )
            .expected(format!("expected at most {MAX_SIZE_TERMS}: give the size a parameter, as in `kernel k[N = ...]`")));
        }
        Ok(())
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
            self.size_term_read()?;
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
            self.size_term_read()?;
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
            self.size_term_read()?;
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
                self.size_term_read()?;
                let e = self.size_sum(axes)?;
                self.expect(Tok::RParen, "`)` to close the parenthesis")?;
                Ok(e)
            }
            Some(Tok::Ident(w)) => {
                self.pos += 1;
                let span = self.prev_span();
                if w == "select" && self.at(&Tok::LParen) {
                    return self.size_select();
                }
                if axes && self.at(&Tok::LBracket) {
                    return self.size_read(w);
                }
                match SizeOp::from_call(&w) {
                    Some(op) if self.eat(&Tok::LParen) => {
                        self.size_term_read()?;
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

    /// `select(c, a, b)`, after `select`.
    fn size_select(&mut self) -> PResult<SizeExpr> {
        self.expect(Tok::LParen, "`(` after `select`")?;
        self.size_term_read()?;
        let c = self.size_sum(true)?;
        self.expect(Tok::Comma, "`,` and the value where the condition holds")?;
        let a = self.size_sum(true)?;
        self.expect(Tok::Comma, "`,` and the value where it does not")?;
        let b = self.size_sum(true)?;
        self.expect(Tok::RParen, "`)` to close `select(...)`")?;
        Ok(SizeExpr::Select(Box::new([c, a, b])))
    }

    /// `NAME[E, ...]`, after `NAME`: an element of an input array, in a block index.
    fn size_read(&mut self, name: String) -> PResult<SizeExpr> {
        self.expect(Tok::LBracket, "`[`")?;
        self.size_term_read()?;
        let mut at = Vec::new();
        loop {
            at.push(self.size_sum(true)?);
            if self.eat(&Tok::RBracket) {
                return Ok(SizeExpr::Read(name, at));
            }
            self.expect(Tok::Comma, "`,` or `]` in the element's indices")?;
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
    pub(super) fn size_value(&mut self, e: &SizeExpr, span: Span) -> PResult<i64> {
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
    pub(super) fn size<T: TryFrom<i64>>(&mut self, what: &str) -> PResult<T> {
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

    pub(super) fn dims(&mut self, expected: &str) -> PResult<Vec<usize>> {
        let open = self.expect(Tok::LBracket, expected)?;
        let mut dims = Vec::new();
        self.last_dims.clear();
        loop {
            let (dim, written) = self.size_written("a dimension")?;
            dims.push(dim);
            self.last_dims.push(written);
            if self.eat(&Tok::RBracket) {
                // A template's dimensions are placeholders until bound; the verifier checks them then.
                if !self.template && elements_within_limit(&dims).is_none() {
                    return Err(Diagnostic::new(open.to(self.prev_span()), format!("{dims:?} is more than 2^48 elements"))
                        .expected(format!("expected at most {MAX_ARRAY_ELEMENTS} (2^48) elements in an array or block")));
                }
                return Ok(dims);
            }
            self.expect(Tok::Comma, "`,` or `]` in the dimensions")?;
        }
    }

    pub(super) fn ty(&mut self) -> PResult<Type> {
        let (name, span) = self.ident("a type such as `f32` or `f32[16, 96]`")?;
        let dtype = DType::from_name(&name).ok_or_else(|| {
            Diagnostic::new(span, format!("unknown dtype `{name}`")).expected("expected one of f32 i32 u32 bool f16 bf16")
        })?;
        self.last_dims.clear();
        let shape = if self.at(&Tok::LBracket) { self.dims("dimensions")? } else { Vec::new() };
        Ok(Type { dtype, shape })
    }

    /// A block index: a size expression in which names that are not parameters are grid axes
    /// (or scalar inputs, told apart when the header is read): affine in the axes where it is,
    /// else computed, with the parameters' values put in.
    pub(super) fn block_index(&mut self) -> PResult<BlockIndex> {
        let (e, span) = self.size_expr(true)?;
        if self.template && e.names().iter().any(|n| self.is_param(n)) {
            return Ok(BlockIndex::Affine(Affine::constant(self.hole(&e))));
        }
        let values = &self.values;
        let declared = &self.declared;
        // A declared parameter without a value reads as 0 so that it is never taken for an axis
        // (only where an error was already reported).
        let param = |n: &str| values.get(n).copied().or_else(|| declared.iter().any(|p| p.name == n).then_some(0));
        match e.affine(&param) {
            Ok(a) => Ok(BlockIndex::Affine(a)),
            // A divisor that is not positive, or a value past 64 bits, in an index: computed by
            // the index's own arithmetic (a divisor of 0 gives 0, a negative one floors; 32 bits),
            // as the same division of an axis would be.
            Err(SizeError::NotAffine(_) | SizeError::Divisor { .. } | SizeError::Overflow) => {
                Ok(BlockIndex::Computed(e.bind(&param).fold()))
            }
            Err(err) => Err(self.size_error(&err, &e, span)),
        }
    }
}
