//! The body of a kernel: statements, the operations they apply (`load`, `store`, `dot`, `when`,
//! `for`, `if`, ...), index lists, operands and literals.

use super::{PResult, Parser};
use crate::ir::lexer::Tok;
use crate::ir::limits::MAX_NESTING;
use crate::ir::*;

impl Parser<'_> {
    // ---- body ----

    pub(super) fn block(&mut self) -> Vec<Stmt> {
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
        if op.has_body() {
            if self.nesting >= MAX_NESTING {
                // The caller skips the line with the body it opens.
                return Err(Diagnostic::new(
                    span,
                    format!("this `{}` is nested {} deep, past the limit of {MAX_NESTING}", op.mnemonic(), self.nesting + 1),
                )
                .expected(format!(
                    "expected at most {MAX_NESTING} `when`, `for` and `if` bodies inside one another: merge conditions with `and`, or loops into one"
                )));
            }
            self.nesting += 1;
            let stmt = self.finish_block_stmt(results, op, span);
            self.nesting -= 1;
            return stmt;
        }
        let ty = if self.eat(&Tok::Colon) { Some(self.ty()?) } else { None };
        if ty.is_some() {
            span = span.to(self.prev_span());
        }
        self.expect_line_end()?;
        Ok(Stmt { results, op, ty, span })
    }

    /// `when`, `for` and `if`: the header is parsed; now `{`, the body, `}` (and for `if`,
    /// `else {`, the second body, `}`).
    fn finish_block_stmt(&mut self, results: Vec<String>, mut op: Op, span: Span) -> PResult<Stmt> {
        let m = op.mnemonic();
        let first = self.braced_body(m, span)?;
        match &mut op {
            Op::When { body, .. } | Op::For(ForLoop { body, .. }) => *body = first,
            Op::If(IfElse { then, els, .. }) => {
                *then = first;
                if !self.eat_ident("else") {
                    return Err(self.unexpected("`else {` after the `if` body: an `if` has both branches (`when` has one)"));
                }
                *els = self.braced_body(m, span)?;
            }
            _ => unreachable!("only when, for and if have bodies"),
        }
        self.expect_line_end()?;
        Ok(Stmt { results, op, ty: None, span })
    }

    /// `{`, the end of the line, a body, `}`.
    fn braced_body(&mut self, mnemonic: &str, span: Span) -> PResult<Vec<Stmt>> {
        self.expect(Tok::LBrace, "`{` to open the body")?;
        self.expect_line_end()?;
        let inner = self.block();
        if !self.eat(&Tok::RBrace) {
            let found = self.peek().map_or("the end of the file".to_string(), Tok::describe);
            return Err(Diagnostic::new(span, format!("the `{mnemonic}` body opened here is not closed"))
                .expected(format!("expected `}}` on a line of its own before {found}")));
        }
        Ok(inner)
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
                let perm = self.int_list("perm", "the permutation, as in `perm (1, 0)`", "a dimension number")?;
                Op::Transpose { arg, perm }
            }
            "tile" => {
                let arg = self.operand()?;
                let reps = self.int_list("reps", "the copies along each dimension, as in `reps (2, 1)`", "a count of copies")?;
                Op::Tile { arg, reps }
            }
            "repeat" => {
                let arg = self.operand()?;
                self.expect_keyword("times")?;
                let times = self.int("the copies of each element, as in `repeat %v times 2 axis 1`")?;
                self.expect_keyword("axis")?;
                Op::Repeat { arg, times, axis: self.int("a dimension number")? }
            }
            "slice" => {
                let arg = self.operand()?;
                let start = self.int_list("start", "where the slice starts, as in `start (0, 4)`", "an element index")?;
                let stride = if self.at_ident("stride") {
                    self.int_list("stride", "the step along each dimension, as in `stride (1, 2)`", "a positive step")?
                } else {
                    vec![1; start.len()]
                };
                Op::Slice { arg, start, stride }
            }
            "concatenate" => {
                let mut args = vec![self.operand()?];
                while self.eat(&Tok::Comma) {
                    args.push(self.operand()?);
                }
                self.expect_keyword("axis")?;
                Op::Concatenate { args, axis: self.int("a dimension number")? }
            }
            "dot" => {
                let a = self.operand()?;
                self.expect(Tok::Comma, "`,` between the two matrices")?;
                let b = self.operand()?;
                let trans_a = self.eat_ident("trans_a");
                let trans_b = self.eat_ident("trans_b");
                Op::Dot { a, b, trans_a, trans_b }
            }
            "arrive" => Op::Sync(SyncOp::Arrive(self.barrier_at()?)),
            "wait" => Op::Sync(SyncOp::Wait(self.barrier_at()?)),
            "copy_async" => {
                let dst = self.ref_at("the output or scratch the copy writes")?;
                self.expect(Tok::Comma, "`,` and the region copied, as in `copy_async s[0, :, :], x[ds(%m, 64), :]`")?;
                let src = self.ref_at("the argument or scratch the copy reads")?;
                let arrive = if self.eat_ident("arrive") { Some(self.barrier_at()?) } else { None };
                Op::Sync(SyncOp::Copy { dst, src, arrive })
            }
            "commit_copies" => Op::Sync(SyncOp::CommitCopies),
            "wait_copies" => {
                let pending = self.int("the groups that may stay pending, as in `wait_copies 0`")?;
                Op::Sync(SyncOp::WaitCopies { pending, reads: self.eat_ident("reads") })
            }
            "fence" => Op::Sync(SyncOp::Fence),
            "mma_async" => {
                let acc = self.ref_at("the accumulator scratch")?;
                self.expect(Tok::Comma, "`,` and the left operand, as in `mma_async acc, a[0, :, :], b[0, :, :]`")?;
                let a = match self.peek() {
                    Some(Tok::Value(_)) => MmaLhs::Value(self.operand()?),
                    _ => MmaLhs::Ref(self.ref_at("the scratch of the left operand, or a value")?),
                };
                self.expect(Tok::Comma, "`,` and the right operand")?;
                let b = self.ref_at("the scratch of the right operand")?;
                let trans_a = self.eat_ident("trans_a");
                let trans_b = self.eat_ident("trans_b");
                Op::Sync(SyncOp::Mma { acc, a, b, trans_a, trans_b })
            }
            "mma_wait" => {
                Op::Sync(SyncOp::MmaWait { pending: self.int("the groups that may stay pending, as in `mma_wait 0`")? })
            }
            "max_registers" => {
                let count = self.int("the registers a CUDA thread, as in `max_registers 232 increase`")?;
                let increase = match (self.eat_ident("increase"), self.eat_ident("decrease")) {
                    (true, _) => true,
                    (_, true) => false,
                    _ => return Err(self.unexpected("`increase` or `decrease`, as in `max_registers 40 decrease`")),
                };
                Op::Sync(SyncOp::MaxRegisters { count, increase })
            }
            "when" => Op::When { cond: self.operand()?, body: Vec::new() },
            "for" => self.for_header()?,
            "if" => Op::If(IfElse { cond: self.operand()?, then: Vec::new(), els: Vec::new() }),
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
            return Err(Diagnostic::new(name_span, format!("unknown operation `{name}`")).expected(
                "expected an operation of docs/language.md, such as load, store, add, exp, sum, dot, when, for or if",
            ));
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
        let cond =
            if self.eat_ident("while") { Some(self.value_name("a carried `bool` such as `%go` after `while`")?) } else { None };
        Ok(Op::For(ForLoop { var, lo, hi, step, iters, cond, body: Vec::new() }))
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

    /// `NAME[k]`: one barrier of a barrier array.
    fn barrier_at(&mut self) -> PResult<BarrierAt> {
        let (name, _) = self.ident("a barrier, as in `full[%k]`")?;
        self.expect(Tok::LBracket, "`[` and which barrier of the array, as in `full[%k]`")?;
        let index = self.operand()?;
        self.expect(Tok::RBracket, "`]` after the barrier's index")?;
        Ok(BarrierAt { name, index })
    }

    /// `NAME[IDX]?`: a region, as `load` names it.
    fn ref_at(&mut self, what: &str) -> PResult<RefAt> {
        let (name, _) = self.ident(what)?;
        Ok(RefAt { name, index: self.index_list()? })
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
                let stride = if self.eat(&Tok::Comma) { self.size("a slice stride")? } else { 1 };
                self.expect(Tok::RParen, "`)` to close `ds(...)`")?;
                Index::Slice { start, size, stride }
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
            _ => {
                // A literal that starts but is malformed (an integer past 64 bits) keeps its own
                // error; anything else is not an operand.
                let at = self.pos;
                self.literal()
                    .map(Operand::Lit)
                    .map_err(|d| if self.pos == at { self.unexpected("a `%value` or a literal") } else { d })
            }
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
                if v.is_infinite() {
                    return Err(Diagnostic::new(self.prev_span(), format!("float `{s}` is past the largest 64-bit float"))
                        .expected("expected a float below about 1.8e308, or `inf` for infinity"));
                }
                let mantissa = s.split(['e', 'E']).next().unwrap_or_default();
                if v == 0.0 && mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
                    return Err(Diagnostic::new(
                        self.prev_span(),
                        format!("float `{s}` is below the smallest 64-bit float, and would be 0.0"),
                    )
                    .expected("expected a float above about 4.9e-324, or 0.0"));
                }
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

impl Parser<'_> {
    /// `KEYWORD (N, ...)`: the keyword, then a parenthesised list of `item`s (non-negative
    /// integers); `what` says what the list is in the error for a missing `(`.
    fn int_list(&mut self, keyword: &str, what: &str, item: &str) -> PResult<Vec<usize>> {
        self.expect_keyword(keyword)?;
        self.expect(Tok::LParen, &format!("`(` and {what}"))?;
        let mut list = Vec::new();
        loop {
            list.push(self.int(item)?);
            if self.eat(&Tok::RParen) {
                return Ok(list);
            }
            self.expect(Tok::Comma, &format!("`,` or `)` after {item}"))?;
        }
    }
}
