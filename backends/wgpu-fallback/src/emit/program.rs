//! The program's structure: the loop over the programs and the `seq` steps, the grid
//! coordinates and block origins, the outputs kept in registers across the steps, the body
//! statement by statement (each op a call into the file that writes it: `elements.rs` for
//! values made element by element or gathered), `when` and `for`.

use std::collections::BTreeSet;

use tessel_plugin_api::ir::size::{SizeExpr, SizeOp};
use tessel_plugin_api::ir::*;

use super::Writer;
use crate::conv::{literal, reg_ty};
use crate::lower::meetings::Site;

impl<'k> Writer<'k> {
    pub(super) fn write_main(&mut self) {
        let k = self.v.kernel();
        let par: Vec<usize> = (0..self.grid.len()).filter(|&a| !self.grid[a].seq).collect();
        let seq: Vec<usize> = (0..self.grid.len()).filter(|&a| self.grid[a].seq).collect();
        if self.plan.strided {
            self.open("for (var prog = gid; prog < PROGRAMS; prog += GROUPS)");
            if self.plan.meetings.program_top() {
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
            let off = self.plan.scratch_at(&p.name);
            self.line(format!("// scratch {}: {}", p.name, p.ty));
            self.each(&[n], |w| w.line(format!("tk_ws[wsb + {off}u + e] = 0u;")));
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
            if self.plan.meetings.step_top() {
                self.storage_barrier();
            }
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
                    let expr = match e {
                        BlockIndex::Affine(e) => {
                            let mut expr = format!("{}i", e.constant as i32);
                            for (c, name) in &e.terms {
                                let a = self.grid.iter().position(|g| &g.name == name).expect("verified axis");
                                expr = format!("{expr} + {}i * c{a}", *c as i32);
                            }
                            expr
                        }
                        BlockIndex::Computed(e) => {
                            // Negative from the end once, then clamped (`index::IndexEval::clamp`).
                            let (v, n) = (self.index_expr(e), index::blocks(p, d));
                            format!("clamp(select({v}, {v} + {n}i, {v} < 0i), 0i, {}i)", n - 1)
                        }
                    };
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

    /// A name for computed block index `e` (the arithmetic of `index::IndexEval`), one `let` a
    /// node; a read of an input is 0 outside it.
    fn index_expr(&mut self, e: &SizeExpr) -> String {
        let value = match e {
            SizeExpr::Int(v) => return format!("({}i)", *v as i32),
            SizeExpr::Name(n) => {
                let a = self.grid.iter().position(|g| &g.name == n).expect("verified axis");
                return format!("c{a}");
            }
            SizeExpr::Neg(x) => format!("-{}", self.index_expr(x)),
            SizeExpr::Select(abc) => {
                let [c, a, b] = abc.as_ref();
                let (c, a, b) = (self.index_expr(c), self.index_expr(a), self.index_expr(b));
                format!("select({b}, {a}, {c} != 0i)")
            }
            SizeExpr::Bin(op, a, b) => {
                let (x, y) = (self.index_expr(a), self.index_expr(b));
                let (helper, cmp) = match op {
                    SizeOp::Div => (Some("tk_fdiv_i32"), ""),
                    SizeOp::Rem => (Some("tk_frem_i32"), ""),
                    SizeOp::Cdiv => (Some("tk_cdiv_i32"), ""),
                    SizeOp::Eq => (None, "=="),
                    SizeOp::Ne => (None, "!="),
                    SizeOp::Lt => (None, "<"),
                    SizeOp::Le => (None, "<="),
                    SizeOp::Gt => (None, ">"),
                    SizeOp::Ge => (None, ">="),
                    _ => (None, ""),
                };
                match (op, helper) {
                    (_, Some(h)) => {
                        self.helper(h);
                        format!("{h}({x}, {y})")
                    }
                    (SizeOp::Add, _) => format!("{x} + {y}"),
                    (SizeOp::Sub, _) => format!("{x} - {y}"),
                    (SizeOp::Mul, _) => format!("{x} * {y}"),
                    (SizeOp::Min, _) => format!("min({x}, {y})"),
                    (SizeOp::Max, _) => format!("max({x}, {y})"),
                    _ => format!("select(0i, 1i, {x} {cmp} {y})"),
                }
            }
            SizeExpr::Read(name, at) => {
                let at: Vec<String> = at.iter().map(|e| self.index_expr(e)).collect();
                let k = self.v.kernel();
                let pi = k.params.iter().position(|p| &p.name == name).expect("verified read");
                let shape = k.params[pi].ty.shape.clone();
                let mut flat = "0u".to_string();
                let mut inside = Vec::new();
                for (i, dim) in at.iter().zip(&shape) {
                    flat = format!("({flat}) * {dim}u + u32({i})");
                    inside.push(format!("u32({i}) < {dim}u"));
                }
                let quad = self.plan.quad_inputs.contains(&pi);
                let (f, elem) = (self.t(), self.t());
                self.line(format!("let {f} = {flat};"));
                let word = if quad { format!("a{pi}[{f} / 4u][{f} % 4u]") } else { format!("a{pi}[{f}]") };
                self.line(format!("let {elem} = bitcast<i32>({word});"));
                if inside.is_empty() {
                    return elem;
                }
                format!("select(0i, {elem}, {})", inside.join(" && "))
            }
        };
        let t = self.t();
        self.line(format!("let {t} = {value};"));
        t
    }

    /// The element origin of argument `pi`'s block along dimension `d` (`0i` for a whole array).
    pub(super) fn origin(&self, pi: usize, d: usize) -> String {
        if self.v.kernel().params[pi].block.is_some() { format!("o{pi}_{d}") } else { "0i".to_string() }
    }

    /// The statements of `body` (a closing `yield` is its `for`'s or `if`'s to write), each
    /// numbered as the plan's meetings number them.
    fn write_body(&mut self, body: &[Stmt]) {
        let outer = self.stmt;
        for s in body {
            self.stmt = self.next_stmt;
            self.next_stmt += 1;
            if matches!(s.op, Op::Yield(_)) {
                continue;
            }
            let head = tessel_plugin_api::ir::print::print_stmt_head(s);
            self.line(format!("// {head}"));
            self.scoped(s, |w| w.write_stmt(s));
        }
        self.stmt = outer;
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
            Op::Iota { .. }
            | Op::Full(_)
            | Op::Zeros
            | Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Cast(_)
            | Op::Bitcast(_)
            | Op::Broadcast(_)
            | Op::Reshape(_) => self.write_elementwise(&s.op, &dst),
            Op::Transpose { .. } | Op::Slice { .. } | Op::Concatenate { .. } => self.write_gathered(&s.op, &dst),
            Op::Reduce { op, arg, axis, .. } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: reduce of a value") };
                if self.plan.fused.contains_key(self.plan.id(&dst)) {
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
                self.open(format!("if ({c})"));
                self.write_body(body);
                self.close();
            }
            Op::For(f) => self.write_for(s, f),
            Op::If(i) => self.write_if(s, i),
            Op::Yield(_) => unreachable!("yield is written by its for or if"),
            Op::Sync(_) => unreachable!("checked() makes the concurrent model synchronous (ir::synchronous)"),
            Op::Tile { .. } | Op::Repeat { .. } => unreachable!("legalize rewrites tile and repeat before planning"),
        }
    }

    /// `if`: one variable per result, declared before and assigned at the end of each branch by
    /// its `yield`.
    fn write_if(&mut self, s: &Stmt, i: &IfElse) {
        for r in &s.results {
            let ty = self.ty(r);
            let id = self.ident(r);
            let t = if ty.is_scalar() { reg_ty(ty.dtype).to_string() } else { self.array_ty(&ty.shape, ty.dtype) };
            self.line(format!("var {id}: {t};"));
        }
        let c = match &i.cond {
            Operand::Lit(l) => literal(*l, DType::Bool),
            Operand::Value(v) => self.ident(v),
        };
        for (k, body) in [&i.then, &i.els].into_iter().enumerate() {
            if k == 0 {
                self.open(format!("if ({c})"));
            } else {
                self.indent -= 1;
                self.line("} else {");
                self.indent += 1;
            }
            let yields = match body.last() {
                Some(Stmt { op: Op::Yield(vals), .. }) => vals.as_slice(),
                _ => &[][..],
            };
            self.write_body(body);
            for (r, v) in s.results.iter().zip(yields) {
                let Operand::Value(v) = v else { unreachable!("verifier: yields are values") };
                let (rid, vid) = (self.ident(r), self.ident(v));
                self.line(format!("{rid} = {vid};"));
            }
        }
        self.close();
        for r in &s.results {
            self.defined(r);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write_for(&mut self, s: &Stmt, f: &ForLoop) {
        let ForLoop { var, lo, hi, step, iters, cond, body } = f;
        let step = step.as_ref();
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
        self.open("loop");
        self.line(format!("if (!{go}) {{ break; }}"));
        if let Some(c) = cond {
            // `while %c`: the carried bool, checked before every trip.
            let c = self.ident(c);
            self.line(format!("if (!{c}) {{ break; }}"));
        }
        self.meet(Site::LoopTop);
        for (name, _) in iters {
            self.defined(name);
        }
        self.write_body(body);
        if let Some(Stmt { op: Op::Yield(values), .. }) = body.last() {
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
        for (r, (name, _)) in s.results.iter().zip(iters) {
            let (rid, id) = (self.ident(r), self.ident(name));
            // Blocks are `var`s, which may be indexed by a variable.
            let kw = if self.ty(r).is_scalar() { "let" } else { "var" };
            self.line(format!("{kw} {rid} = {id};"));
            self.defined(r);
        }
    }
}
