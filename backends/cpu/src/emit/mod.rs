//! The C a kernel becomes: one function per kernel that runs a range of its programs (points of
//! the parallel grid axes, row-major), each program's `seq` steps in order inside it.
//!
//! - Scalars are C locals, declared where the kernel defines them (C's block scopes are the
//!   language's: a value is visible to the end of the body that defines it).
//! - Block values live in a per-worker arena, each at its own offset (`Layout`), in their compute
//!   type (`prelude.h`); `reshape` and a `for`'s results alias their operand's memory.
//! - Runs of statements that are elementwise over one shape — loads, stores, arithmetic, casts,
//!   broadcasts — become one loop nest (`group.rs`), values only that run reads staying in
//!   registers; the C compiler vectorizes it. A run whose accesses all lie inside their arrays
//!   (checked once, before the loop) takes a loop without per-element bounds checks.
//! - Reductions, products (`sgemm`, the `gemm` crate, called back) and shape changes are loops of
//!   their own (`shape.rs`).

mod accumulate;
mod c;
mod group;
mod libm;
mod shape;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tessel_plugin_api::ir::size::{SizeExpr, SizeOp};

use tessel_plugin_api::ir::{
    BlockIndex, DType, ForLoop, IfElse, Literal, Op, Operand, ParamKind, Stmt, Type, ValueId, Verified, analysis,
};

pub use c::{compute, storage};

/// What the C needs beside itself: each kernel's function name and arena size.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// The whole file.
    pub source: String,
    /// Per kernel: its function's name and the bytes of arena each worker gives a program.
    pub kernels: Vec<(String, usize)>,
    /// Whether a float `dot` calls the product library (`tk_ctx.gemm`, [`gemm_source`]).
    pub gemm: bool,
}

/// The product library's C: `gemm.h` behind one exported function, `tk_gemm`, which the
/// kernels call through `tk_ctx.gemm`. Compiled once for the machine and cached as kernels are,
/// so that a kernel with a `dot` does not compile the product's tiles again (about 0.25 s of
/// GCC each).
pub fn gemm_source() -> String {
    let mut source = include_str!("prelude.h").to_string();
    source.push('\n');
    source.push_str(include_str!("gemm.h"));
    source.push_str(
        "\nvoid tk_gemm(const tk_ctx *cx, int64_t m, int64_t n, int64_t k, float *c, int64_t ldc, const float *a,\n"
    );
    source.push_str("        int64_t ars, int64_t acs, const float *b, int64_t ldb, int32_t accumulate) {\n");
    source.push_str("    tk_sgemm_pool(cx, m, n, k, c, ldc, a, ars, acs, b, ldb, accumulate);\n}\n");
    source
}

/// The C file of a launch's kernels, `tk_k0`, `tk_k1`, ... in order.
pub fn emit(kernels: &[Verified]) -> Emitted {
    let mut calls = c::Calls::new();
    let mut bodies = String::new();
    let mut out = Vec::new();
    let mut gemm = false;
    for (n, v) in kernels.iter().enumerate() {
        let name = format!("tk_k{n}");
        let mut w = Writer::new(v, &mut calls);
        w.kernel(&name);
        gemm |= w.gemm;
        let _ = write!(bodies, "/* kernel `{}` */\n{}", v.name(), w.out);
        out.push((name, w.arena));
    }
    let mut source = include_str!("prelude.h").to_string();
    for f in calls.values() {
        source.push('\n');
        source.push_str(&libm::function(f));
    }
    source.push('\n');
    source.push_str(&bodies);
    Emitted { source, kernels: out, gemm }
}

/// Where a value's elements are.
#[derive(Clone, Debug)]
enum Place {
    /// A C local (`v12`): scalars.
    Local,
    /// Arena memory (`v12` is a pointer to it).
    Buffer,
}

/// What a `yield` assigns to: a `for`'s carried values or an `if`'s results.
struct YieldTo {
    targets: Vec<ValueId>,
    /// Whether these are a `for`'s carried values (a yield may read them) rather than an `if`'s
    /// fresh results.
    carried: bool,
}

pub(crate) struct Writer<'v, 'c> {
    v: &'v Verified,
    calls: &'c mut c::Calls,
    out: String,
    /// Declarations at the function's top (arena pointers).
    decls: String,
    depth: usize,
    arena: usize,
    places: HashMap<ValueId, Place>,
    /// The value whose buffer each aliasing value's pointer is (`reshape`, a `for`'s results).
    root: HashMap<ValueId, ValueId>,
    /// How many statements read each value, anywhere in the kernel.
    uses: HashMap<ValueId, usize>,
    yields: Vec<YieldTo>,
    fresh: usize,
    /// Whether a float `dot` calls the product library (`tk_ctx.gemm`).
    gemm: bool,
    /// How many of each value's reads are operands of a `dot` (which takes strided operands).
    dot_reads: HashMap<ValueId, usize>,
    /// The C expression of the distance between rows of a 2-D value that may be a strided view
    /// of its input (`group.rs::view_of`); a value not here has rows of its own width.
    row_stride: HashMap<ValueId, String>,
    /// Statements written as part of another (`accumulate.rs`), by address: never on their own.
    absorbed: HashSet<usize>,
}

impl<'v, 'c> Writer<'v, 'c> {
    fn new(v: &'v Verified, calls: &'c mut c::Calls) -> Writer<'v, 'c> {
        let (mut uses, mut dot_reads) = (HashMap::new(), HashMap::new());
        analysis::visit(&v.kernel().body, &mut |s| {
            for r in analysis::reads(&s.op) {
                *uses.entry(v.id(r)).or_insert(0) += 1;
                if matches!(s.op, Op::Dot { .. }) {
                    *dot_reads.entry(v.id(r)).or_insert(0) += 1;
                }
            }
        });
        Writer {
            v,
            calls,
            out: String::new(),
            decls: String::new(),
            depth: 1,
            arena: 0,
            places: HashMap::new(),
            root: HashMap::new(),
            uses,
            yields: Vec::new(),
            fresh: 0,
            gemm: false,
            dot_reads,
            row_stride: HashMap::new(),
            absorbed: HashSet::new(),
        }
    }

    fn line(&mut self, text: impl AsRef<str>) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(text.as_ref());
        self.out.push('\n');
    }

    fn fresh(&mut self, stem: &str) -> String {
        self.fresh += 1;
        format!("{stem}{}", self.fresh)
    }

    fn ty(&self, id: ValueId) -> &'v Type {
        self.v.values().ty(id)
    }

    fn id(&self, name: &str) -> ValueId {
        self.v.id(name)
    }

    /// A 64-byte aligned slice of the arena for `n` 4-byte elements, as a declared pointer.
    fn alloc(&mut self, name: &str, ctype: &str, n: usize) {
        let off = self.arena;
        self.arena += (n * 4).div_ceil(64) * 64 + 64;
        let _ = writeln!(self.decls, "    {ctype} *const {name} = ({ctype} *)(arena + {off});");
    }

    /// Arena memory for value `id` behind a pointer that may be pointed elsewhere (a view of an
    /// input's block, `group.rs`); its offset in the arena.
    fn view_buffer(&mut self, id: ValueId) -> usize {
        let ty = self.ty(id);
        let (ctype, n) = (c::compute(ty.dtype), ty.numel());
        let off = self.arena;
        self.arena += (n * 4).div_ceil(64) * 64 + 64;
        let _ = writeln!(self.decls, "    {ctype} *v{} = ({ctype} *)(arena + {off});", id.index());
        self.places.insert(id, Place::Buffer);
        off
    }

    /// Gives value `id` arena memory of its own.
    fn buffer(&mut self, id: ValueId) {
        let ty = self.ty(id);
        let (ctype, n) = (c::compute(ty.dtype), ty.numel());
        self.alloc(&format!("v{}", id.index()), ctype, n);
        self.places.insert(id, Place::Buffer);
    }

    fn is_scalar(&self, id: ValueId) -> bool {
        self.ty(id).is_scalar()
    }

    /// The dtype an operand has, given the dtype a literal in its place takes.
    fn dtype_of(&self, op: &Operand, lit: DType) -> DType {
        self.v.operand_type(op).map_or(lit, |t| t.dtype)
    }

    /// A scalar operand as a C expression of `d`'s compute type.
    fn scalar(&self, op: &Operand, d: DType) -> String {
        match op {
            Operand::Value(n) => format!("v{}", self.id(n).index()),
            Operand::Lit(l) => c::literal(*l, d),
        }
    }

    /// The pointer of a block operand.
    fn pointer(&self, op: &Operand) -> String {
        match op {
            Operand::Value(n) => format!("v{}", self.id(n).index()),
            Operand::Lit(_) => unreachable!("verifier: blocks are values"),
        }
    }

    /// The function of kernel `v`: its arguments' pointers, the parallel axes from `pt`, scratch
    /// zeroed, the `seq` axes looped in order around the body.
    fn kernel(&mut self, name: &str) {
        let k = self.v.kernel();
        let grid = self.v.grid();
        for (n, p) in k.params.iter().enumerate() {
            let st = c::storage(p.ty.dtype);
            match p.kind {
                ParamKind::In => self.line(format!("const {st} *const a{n} = (const {st} *)cx->args[{n}];")),
                ParamKind::Out => self.line(format!("{st} *const a{n} = ({st} *)cx->args[{n}];")),
                ParamKind::Scratch => self.alloc(&format!("a{n}"), c::compute(p.ty.dtype), p.ty.numel()),
            }
        }
        // Programs `begin` to `end` in row-major order of the parallel axes (the last fastest).
        self.line("for (int64_t p = begin; p < end; p++) {");
        self.depth += 1;
        self.line("int64_t rest = p; (void)rest;");
        for (n, a) in grid.iter().enumerate().rev() {
            if !a.seq {
                self.line(format!("const int64_t g{n} = rest % cx->grid[{n}]; rest /= cx->grid[{n}];"));
            }
        }
        for (n, p) in k.params.iter().enumerate() {
            if p.kind == ParamKind::Scratch {
                self.line(format!("memset(a{n}, 0, {});", p.ty.numel() * 4));
            }
        }
        let opened = grid.iter().filter(|a| a.seq).count();
        for (n, a) in grid.iter().enumerate() {
            if a.seq {
                self.line(format!("for (int64_t g{n} = 0; g{n} < cx->grid[{n}]; g{n}++) {{"));
                self.depth += 1;
            }
        }
        self.origins();
        self.body(&k.body);
        for _ in 0..=opened {
            self.depth -= 1;
            self.line("}");
        }
        let body = std::mem::take(&mut self.out);
        self.out = format!(
            "void {name}(const tk_ctx *cx, int64_t begin, int64_t end, char *arena) {{\n    (void)arena;\n{}{}}}\n",
            self.decls, body
        );
    }

    /// Each blocked argument's origin per dimension, `o{n}_{d}`, at this grid point.
    fn origins(&mut self) {
        let k = self.v.kernel();
        let axes: Vec<&str> = self.v.grid().iter().map(|a| a.name.as_str()).collect();
        for (n, p) in k.params.iter().enumerate() {
            let Some(b) = &p.block else { continue };
            for (d, ix) in b.index.iter().enumerate() {
                let expr = match ix {
                    BlockIndex::Affine(e) => {
                        let mut expr = format!("(int64_t){}", e.constant);
                        for (coef, axis) in &e.terms {
                            let g = axes.iter().position(|a| a == axis).expect("verifier: an axis of the grid");
                            let _ = write!(expr, " + (int64_t){coef} * g{g}");
                        }
                        expr
                    }
                    // Brought into the array's blocks: negative counts from the end once, then
                    // clamped (docs/language.md §2).
                    BlockIndex::Computed(e) => {
                        let blocks = p.ty.shape[d].div_ceil(b.shape[d].max(1)) as i64;
                        let v = self.size_expr(e, &axes);
                        format!("tk_iclamp({v}, {blocks})")
                    }
                };
                self.line(format!("const int64_t o{n}_{d} = ({expr}) * (int64_t){};", b.shape[d]));
            }
        }
    }

    /// A computed block index in 32-bit two's complement (`IndexEval`'s arithmetic): reads of
    /// integer inputs give 0 outside their arrays.
    fn size_expr(&self, e: &SizeExpr, axes: &[&str]) -> String {
        let go = |e: &SizeExpr| self.size_expr(e, axes);
        let wrap = |op: &str, a: &SizeExpr, b: &SizeExpr| format!("(int32_t)((uint32_t)({}) {op} (uint32_t)({}))", go(a), go(b));
        match e {
            SizeExpr::Int(v) => format!("(int32_t){}", *v as i32),
            SizeExpr::Name(n) => {
                let g = axes.iter().position(|a| a == n).expect("verifier: a grid axis");
                format!("(int32_t)g{g}")
            }
            SizeExpr::Neg(a) => format!("(int32_t)(0u - (uint32_t)({}))", go(a)),
            SizeExpr::Bin(op, a, b) => match op {
                SizeOp::Add => wrap("+", a, b),
                SizeOp::Sub => wrap("-", a, b),
                SizeOp::Mul => wrap("*", a, b),
                SizeOp::Div => format!("tk_ifloordiv({}, {})", go(a), go(b)),
                SizeOp::Rem => format!("tk_ifloormod({}, {})", go(a), go(b)),
                SizeOp::Cdiv => format!("tk_icdiv({}, {})", go(a), go(b)),
                SizeOp::Min => format!("tk_imin({}, {})", go(a), go(b)),
                SizeOp::Max => format!("tk_imax({}, {})", go(a), go(b)),
                SizeOp::Eq => format!("(int32_t)(({}) == ({}))", go(a), go(b)),
                SizeOp::Ne => format!("(int32_t)(({}) != ({}))", go(a), go(b)),
                SizeOp::Lt => format!("(int32_t)(({}) < ({}))", go(a), go(b)),
                SizeOp::Le => format!("(int32_t)(({}) <= ({}))", go(a), go(b)),
                SizeOp::Gt => format!("(int32_t)(({}) > ({}))", go(a), go(b)),
                SizeOp::Ge => format!("(int32_t)(({}) >= ({}))", go(a), go(b)),
            },
            SizeExpr::Select(abc) => format!("(({}) != 0 ? ({}) : ({}))", go(&abc[0]), go(&abc[1]), go(&abc[2])),
            SizeExpr::Read(name, ix) => {
                let k = self.v.kernel();
                let (n, p) = k.params.iter().enumerate().find(|(_, p)| p.name == *name).expect("verifier: an input");
                let dims = &p.ty.shape;
                let at: Vec<String> = ix.iter().map(go).collect();
                let mut addr = "0".to_string();
                let mut inside = vec!["1".to_string()];
                for (d, i) in at.iter().enumerate() {
                    addr = format!("({addr}) * {} + (int64_t)({i})", dims[d]);
                    inside.push(format!("(uint64_t)(int64_t)({i}) < {}u", dims[d]));
                }
                format!("(({}) ? (int32_t)a{n}[{addr}] : 0)", inside.join(" && "))
            }
        }
    }

    /// A body: `c += a b` as one product into `c`, runs of elementwise statements fused, the rest
    /// one by one.
    fn body(&mut self, stmts: &'v [Stmt]) {
        let found = self.accumulations(stmts);
        self.absorbed.extend(Self::absorbed(&found));
        let mut i = 0;
        while i < stmts.len() {
            let s = &stmts[i];
            if self.absorbed.contains(&(s as *const Stmt as usize)) {
                i += 1;
                continue;
            }
            if let Some(acc) = found.iter().find(|f| std::ptr::eq(f.dot, s)) {
                self.accumulate(acc);
                i += 1;
                continue;
            }
            if let Some(end) = self.group(stmts, i) {
                i = end;
                continue;
            }
            self.stmt(&stmts[i]);
            i += 1;
        }
    }

    /// One statement that is not part of an elementwise run.
    fn stmt(&mut self, s: &'v Stmt) {
        let result = self.v.result(s);
        match &s.op {
            Op::When { cond, body } => {
                self.line(format!("if ({}) {{", self.scalar(cond, DType::Bool)));
                self.depth += 1;
                self.body(body);
                self.depth -= 1;
                self.line("}");
            }
            Op::If(f) => self.if_else(s, f),
            Op::For(f) => self.for_loop(s, f),
            Op::Yield(values) => self.yield_(values),
            Op::ProgramId(axis) | Op::NumPrograms(axis) => {
                let n = self.axis(axis);
                let id = result.expect("one result");
                let what = if matches!(s.op, Op::ProgramId(_)) { format!("g{n}") } else { format!("cx->grid[{n}]") };
                self.line(format!("const int32_t v{} = (int32_t){what};", id.index()));
                self.places.insert(id, Place::Local);
            }
            Op::Sync(_) => unreachable!("plan: the concurrent model is refused"),
            _ if result.is_some_and(|id| self.is_scalar(id)) && group::elementwise(&s.op) => {
                self.scalar_stmt(s);
            }
            _ => self.shape_op(s),
        }
    }

    fn axis(&self, axis: &tessel_plugin_api::ir::AxisRef) -> usize {
        match axis {
            tessel_plugin_api::ir::AxisRef::Pos(n) => *n,
            tessel_plugin_api::ir::AxisRef::Name(name) => {
                self.v.grid().iter().position(|a| a.name == *name).expect("verifier: a grid axis")
            }
        }
    }

    /// `%r, ... = if %c { ... yield ... } else { ... yield ... }`.
    fn if_else(&mut self, s: &'v Stmt, f: &'v IfElse) {
        let targets = self.v.result_ids(s);
        for &t in &targets {
            self.declare_mutable(t);
        }
        self.line(format!("if ({}) {{", self.scalar(&f.cond, DType::Bool)));
        self.yields.push(YieldTo { targets: targets.clone(), carried: false });
        self.depth += 1;
        self.body(&f.then);
        self.depth -= 1;
        self.line("} else {");
        self.depth += 1;
        self.body(&f.els);
        self.depth -= 1;
        self.yields.pop();
        self.line("}");
    }

    /// A scalar declared to be assigned later (`ctype v;`), or a block given its memory.
    fn declare_mutable(&mut self, id: ValueId) {
        if self.is_scalar(id) {
            self.line(format!("{} v{} = 0;", c::compute(self.ty(id).dtype), id.index()));
            self.places.insert(id, Place::Local);
        } else {
            self.buffer(id);
        }
    }

    /// `%r, ... = for %i = lo to hi step s iter (%a = v, ...) (while %go)? { ... }`.
    fn for_loop(&mut self, s: &'v Stmt, f: &'v ForLoop) {
        let i32t = DType::I32;
        let (lo, hi) = (self.fresh("lo"), self.fresh("hi"));
        let step = self.fresh("st");
        self.line(format!("const int64_t {lo} = {};", self.scalar(&f.lo, i32t)));
        self.line(format!("const int64_t {hi} = {};", self.scalar(&f.hi, i32t)));
        let st = f.step.as_ref().map_or("1".to_string(), |st| self.scalar(st, i32t));
        self.line(format!("const int64_t {step} = {st};"));
        let carried: Vec<ValueId> = f.iters.iter().map(|(a, _)| self.id(a)).collect();
        for ((_, init), &a) in f.iters.iter().zip(&carried) {
            self.declare_mutable(a);
            self.assign(a, init);
        }
        let ii = self.fresh("ii");
        self.line(format!("for (int64_t {ii} = {lo}; {step} > 0 && {ii} < {hi}; {ii} += {step}) {{"));
        self.depth += 1;
        if let Some(go) = &f.cond {
            self.line(format!("if (!v{}) break;", self.id(go).index()));
        }
        let var = self.id(&f.var);
        self.line(format!("const int32_t v{} = (int32_t){ii};", var.index()));
        self.places.insert(var, Place::Local);
        self.yields.push(YieldTo { targets: carried.clone(), carried: true });
        self.body(&f.body);
        self.yields.pop();
        self.depth -= 1;
        self.line("}");
        for (r, &a) in s.results.iter().zip(&carried) {
            let r = self.id(r);
            let ct = c::compute(self.ty(r).dtype);
            if self.is_scalar(r) {
                self.line(format!("const {ct} v{} = v{};", r.index(), a.index()));
                self.places.insert(r, Place::Local);
            } else {
                self.line(format!("{ct} *const v{} = v{};", r.index(), a.index()));
                self.places.insert(r, Place::Buffer);
                let root = self.root_of(a);
                self.root.insert(r, root);
            }
        }
    }

    fn root_of(&self, id: ValueId) -> ValueId {
        let mut id = id;
        while let Some(&r) = self.root.get(&id) {
            id = r;
        }
        id
    }

    /// Sets a declared (mutable) value to an operand of its type: an assignment or a copy.
    fn assign(&mut self, dst: ValueId, src: &Operand) {
        let d = self.ty(dst).dtype;
        if self.is_scalar(dst) {
            self.line(format!("v{} = {};", dst.index(), self.scalar(src, d)));
        } else {
            let bytes = self.ty(dst).numel() * 4;
            self.line(format!("memmove(v{}, {}, {bytes});", dst.index(), self.pointer(src)));
        }
    }

    fn yield_(&mut self, values: &'v [Operand]) {
        let to = self.yields.pop().expect("verifier: a yield ends a for or an if body");
        // Where a carried block's new value is (or aliases, through `reshape`s) another carried
        // block, every block goes through a temporary: each new value read before any is written.
        let crossing = to.carried
            && values.iter().enumerate().any(|(n, y)| match y {
                Operand::Value(name) => {
                    let r = self.root_of(self.id(name));
                    to.targets.iter().enumerate().any(|(m, &c)| m != n && c == r && !self.is_scalar(c))
                }
                Operand::Lit(_) => false,
            });
        let mut later = Vec::new();
        for (y, &t) in values.iter().zip(&to.targets) {
            if self.is_scalar(t) {
                // Every new value computed before any is assigned.
                let tmp = self.fresh("y");
                let d = self.ty(t).dtype;
                self.line(format!("const {} {tmp} = {};", c::compute(d), self.scalar(y, d)));
                later.push(format!("v{} = {tmp};", t.index()));
            } else if crossing {
                let tmp = self.fresh("yt");
                let ty = self.ty(t);
                let bytes = ty.numel() * 4;
                self.alloc(&tmp, c::compute(ty.dtype), ty.numel());
                self.line(format!("memmove({tmp}, {}, {bytes});", self.pointer(y)));
                later.push(format!("memmove(v{}, {tmp}, {bytes});", t.index()));
            } else {
                self.assign(t, y);
            }
        }
        for l in later {
            self.line(l);
        }
        self.yields.push(to);
    }

    /// A scalar statement: a C local.
    fn scalar_stmt(&mut self, s: &'v Stmt) {
        let id = self.v.result(s).expect("a scalar statement has a result");
        let (pre, e) = group::Scalar.expr(self, s);
        if let Some(pre) = pre {
            self.line(pre);
        }
        let ct = c::compute(self.ty(id).dtype);
        self.line(format!("const {ct} v{} = {e};", id.index()));
        self.places.insert(id, Place::Local);
    }

    /// A literal of `d`.
    fn lit(&self, l: Literal, d: DType) -> String {
        c::literal(l, d)
    }
}
