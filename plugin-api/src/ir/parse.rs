//! `.tk` text to IR. Recursive descent over a line-oriented token stream; an error skips to the end
//! of its line (keeping braces balanced) and parsing goes on, so one run reports every error.

use super::lexer::{Tok, lex};
use super::*;

/// Parses a whole file. On failure returns every syntax error found, in source order.
pub fn parse(source: &str) -> Result<Module, Diagnostics> {
    let (toks, bad) = lex(source);
    let mut p = Parser { toks, pos: 0, diags: Vec::new(), eof: Span::new(source.len(), source.len()) };
    let map = SourceMap::new(source);
    // After a character that starts no token, the rest of its line would only give cascades.
    let bad_at: Vec<(usize, usize)> = bad.iter().map(|b| map.line_col(b.span.start as usize)).collect();
    let module = p.module();
    p.diags.retain(|d| {
        let (line, col) = map.line_col(d.span.start as usize);
        !bad_at.iter().any(|&(bl, bc)| bl == line && bc <= col)
    });
    for b in bad {
        p.diags.push(
            Diagnostic::new(b.span, format!("unexpected character `{}`", b.text))
                .expected("expected names, `%values`, numbers or one of ( ) [ ] { } , : = * + -"),
        );
    }
    if p.diags.is_empty() {
        Ok(module)
    } else {
        p.diags.sort_by_key(|d| d.span.start);
        Err(Diagnostics(p.diags))
    }
}

type PResult<T> = Result<T, Diagnostic>;

struct Parser {
    toks: Vec<(Tok, Span)>,
    pos: usize,
    diags: Vec<Diagnostic>,
    eof: Span,
}

impl Parser {
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
        let v = self.signed_int(false, expected)?;
        T::try_from(v).map_err(|_| {
            Diagnostic::new(self.prev_span(), format!("`{v}` is out of range")).expected(format!("expected {expected}"))
        })
    }

    /// An integer literal, with a leading `-` when `allow_minus`.
    fn signed_int(&mut self, allow_minus: bool, expected: &str) -> PResult<i64> {
        let start = self.span();
        let neg = allow_minus && self.eat(&Tok::Minus);
        match self.peek() {
            Some(Tok::Int(s)) => {
                let text = if neg { format!("-{s}") } else { s.clone() };
                self.pos += 1;
                text.parse::<i64>().map_err(|_| {
                    Diagnostic::new(start.to(self.prev_span()), format!("integer `{text}` does not fit in 64 bits"))
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

    fn module(&mut self) -> Module {
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
        Module { kernels }
    }

    fn kernel(&mut self) -> Option<Kernel> {
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
        if let Err(d) = self.expect_line_end() {
            self.diags.push(d);
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
        Some(kernel)
    }

    fn grid(&mut self, kernel: &mut Kernel) -> PResult<()> {
        let start = self.span();
        self.pos += 1; // `grid`
        self.expect(Tok::LParen, "`(` after `grid`, as in `grid (i: 8, k: 4 seq)`")?;
        let mut axes = Vec::new();
        loop {
            let (name, name_span) = self.ident("an axis name, as in `i: 8`")?;
            self.expect(Tok::Colon, "`:` and the axis size, as in `i: 8`")?;
            let size =
                if self.eat_ident("dyn") { AxisSize::Dyn } else { AxisSize::Fixed(self.int("a positive axis size or `dyn`")?) };
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
        loop {
            dims.push(self.int("a dimension size")?);
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
        let shape = if self.at(&Tok::LBracket) { self.dims("dimensions")? } else { Vec::new() };
        Ok(Type { dtype, shape })
    }

    fn affine(&mut self) -> PResult<Affine> {
        let mut out = Affine::default();
        let mut sign = if self.eat(&Tok::Minus) { -1 } else { 1 };
        loop {
            match self.peek() {
                Some(Tok::Int(_)) => {
                    let c: i64 = self.int("an integer")?;
                    if self.eat(&Tok::Star) {
                        let (name, _) = self.ident("an axis name after `*`")?;
                        out.add_term(sign * c, &name);
                    } else {
                        out.constant = out.constant.wrapping_add(sign * c);
                    }
                }
                Some(Tok::Ident(_)) => {
                    let (name, _) = self.ident("an axis name")?;
                    let c = if self.eat(&Tok::Star) { self.int::<i64>("an integer coefficient")? } else { 1 };
                    out.add_term(sign * c, &name);
                }
                _ => return Err(self.unexpected("an affine index such as `i`, `2*i + 1` or `0`")),
            }
            sign = if self.eat(&Tok::Plus) {
                1
            } else if self.eat(&Tok::Minus) {
                -1
            } else {
                return Ok(out);
            };
        }
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
                let size = self.int("a slice size (an integer literal)")?;
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
        let neg = self.eat(&Tok::Minus);
        let sign = if neg { -1.0 } else { 1.0 };
        let lit = match self.peek().cloned() {
            Some(Tok::Int(_)) => {
                self.pos -= usize::from(neg);
                Literal::Int(self.signed_int(true, "an integer")?)
            }
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
