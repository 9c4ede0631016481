//! A file's kernels and their headers: `kernel NAME[PARAMS]`, `grid (...)` and the argument
//! lines, with what a generic kernel keeps of them (its size parameters and declared arguments).

use super::{PResult, Parsed, Parser, SizeParam, Sizes};
use crate::ir::lexer::Tok;
use crate::ir::size::SizeExpr;
use crate::ir::*;

/// Names that may not be parameters: they mean something where a size can stand.
const RESERVED: [&str; 8] = ["cdiv", "min", "max", "dyn", "inf", "nan", "true", "false"];

impl Parser<'_> {
    // ---- file and header ----

    pub(super) fn module(&mut self) -> Vec<Parsed> {
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

    pub(super) fn kernel(&mut self) -> Option<Parsed> {
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
        let mut kernel = Kernel { name, grid: None, params: Vec::new(), barriers: Vec::new(), body: Vec::new(), span };
        let mut missing_brace = false;
        loop {
            self.skip_newlines();
            let res = match self.peek() {
                Some(Tok::LBrace) => break,
                Some(Tok::Ident(w)) if w == "grid" => self.grid(&mut kernel),
                Some(Tok::Ident(w)) if w == "in" || w == "out" || w == "scratch" => self.param().map(|p| kernel.params.push(p)),
                Some(Tok::Ident(w)) if w == "barrier" => self.barrier().map(|b| kernel.barriers.push(b)),
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
                    let d = self.unexpected("a header line (`grid`, `in`, `out`, `scratch`, `barrier`) or `{` to open the body");
                    self.diags.push(d);
                    self.pos += 1;
                    continue;
                }
                _ => Err(self.unexpected("a header line (`grid`, `in`, `out`, `scratch`, `barrier`) or `{` to open the body")),
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
        crate::ir::index::resolve_scalar_reads(&mut kernel);
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

    fn grid(&mut self, kernel: &mut Kernel) -> PResult<()> {
        let start = self.span();
        self.pos += 1; // `grid`
        self.expect(Tok::LParen, "`(` after `grid`, as in `grid (i: 8, k: 4 seq)`")?;
        let mut axes = Vec::new();
        loop {
            let (name, name_span) = self.ident("an axis name, as in `i: 8`")?;
            self.expect(Tok::Colon, "`:` and the axis size, as in `i: 8`")?;
            let (size, from) = if self.eat_ident("dyn") {
                let from = if self.eat(&Tok::LParen) {
                    let (n, _) = self.ident("the scalar `in` argument that gives the size, as in `dyn(n)`")?;
                    self.expect(Tok::RParen, "`)` to close `dyn(...)`")?;
                    Some(n)
                } else {
                    None
                };
                (AxisSize::Dyn, from)
            } else {
                (AxisSize::Fixed(self.size("a grid size")?), None)
            };
            let seq = self.eat_ident("seq");
            let thread = !seq && self.eat_ident("thread");
            axes.push(GridAxis { name, size, seq, thread, from, span: name_span.to(self.prev_span()) });
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

    /// `barrier NAME[COUNT] arrivals K`.
    fn barrier(&mut self) -> PResult<BarrierDecl> {
        let start = self.span();
        self.pos += 1; // `barrier`
        let (name, _) = self.ident("a barrier name, as in `barrier full[2] arrivals 1`")?;
        self.expect(Tok::LBracket, "`[` and how many barriers, as in `barrier full[2] arrivals 1`")?;
        let count: usize = self.size("a count of barriers")?;
        self.expect(Tok::RBracket, "`]` after the count of barriers")?;
        self.expect_keyword("arrivals")?;
        let arrivals: usize = self.size("the arrivals that complete a phase")?;
        let span = start.to(self.prev_span());
        self.expect_header_end()?;
        Ok(BarrierDecl { name, count, arrivals, span })
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
                index.push(self.block_index()?);
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
}
