//! Runs of elementwise statements as one loop nest, and the element expressions they (and
//! scalar statements) are made of: loads and stores with their bounds and masks, arithmetic,
//! casts, broadcasts.
//!
//! A run is a maximal sequence of statements elementwise over one iteration shape (a value's
//! shape, a load's or store's region) — scalar statements that read no memory are hoisted in
//! front of it. It stops at a load of a reference that the run stored through another index, or
//! a store through another index than the run's earlier accesses of that reference used: then
//! every element sees the same memory it would statement by statement.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tessel_plugin_api::ir::{DType, Index, Literal, Op, Operand, Param, ParamKind, Stmt, ValueId, analysis};

use super::{Place, Writer, c};

/// Whether `op` computes each element from the same element of its operands (or from memory).
pub(super) fn elementwise(op: &Op) -> bool {
    match op {
        Op::Load { .. } | Op::Store { .. } => true,
        Op::Unary(..)
        | Op::Binary(..)
        | Op::Compare(..)
        | Op::Select(..)
        | Op::Cast(_)
        | Op::Bitcast(_)
        | Op::Broadcast(_)
        | Op::Full(_)
        | Op::Zeros
        | Op::Iota { .. } => true,
        _ => false,
    }
}

/// Where element expressions are evaluated: the loop variables over an iteration shape, the
/// run's values held in registers, and whether accesses check their bounds.
pub(super) struct Ctx {
    shape: Vec<usize>,
    temps: HashSet<ValueId>,
    checked: bool,
    /// The buffer reads the loop body makes, each bound to a local before the statements
    /// (`const float r3 = v12[i1];`): no element read sits inside a conditional expression, where
    /// GCC 12 vectorizes it as a masked load and, in some loop nests, loads zeros (`-O3 -mavx2`;
    /// `tests/cpu.rs` keeps the kernel that showed it). With each, the loops its index varies in:
    /// a read of a row's value (a broadcast `keepdims` result) is made in the row's loop, not in
    /// the inner one (GCC vectorizes the inner loop then without versioning it for aliasing; with
    /// the read inside, the alias check failed at run time and the scalar loop ran).
    reads: RefCell<Vec<(String, &'static str, String, usize)>>,
}

impl Ctx {
    fn new(shape: Vec<usize>, temps: HashSet<ValueId>, checked: bool) -> Ctx {
        Ctx { shape, temps, checked, reads: RefCell::new(Vec::new()) }
    }
}

/// The context of a scalar statement: no loop, bounds checked.
pub(super) struct Scalar;

impl Scalar {
    /// A line that reads memory first (a load's), and the statement's expression.
    pub(super) fn expr<'v>(&self, w: &mut Writer<'v, '_>, s: &'v Stmt) -> (Option<String>, String) {
        let ctx = Ctx::new(Vec::new(), HashSet::new(), true);
        match &s.op {
            Op::Load { .. } => w.load_expr(s, &ctx),
            _ => (None, w.value_expr(s, &ctx)),
        }
    }
}

/// How one access of a run reaches memory.
struct Access {
    /// Per array dimension, the coordinate (C `int64_t`).
    coords: Vec<String>,
    /// Per array dimension, the least and greatest coordinate over the iteration shape.
    range: Vec<(String, String)>,
    /// The array's dimensions.
    dims: Vec<usize>,
    /// Whether an index vector places elements (their range is not known before the loop).
    gathered: bool,
}

impl Access {
    fn address(&self) -> String {
        let mut stride = 1usize;
        let mut terms = Vec::new();
        for (c, d) in self.coords.iter().zip(&self.dims).rev() {
            terms.push(if stride == 1 { c.clone() } else { format!("({c}) * {stride}") });
            stride *= d;
        }
        if terms.is_empty() { "0".into() } else { terms.join(" + ") }
    }

    fn inside(&self) -> String {
        let tests: Vec<String> = self.coords.iter().zip(&self.dims).map(|(c, d)| format!("(uint64_t)({c}) < {d}u")).collect();
        if tests.is_empty() { "1".into() } else { tests.join(" && ") }
    }

    fn fast(&self) -> Vec<String> {
        if self.gathered {
            return vec!["0".into()];
        }
        self.range.iter().zip(&self.dims).map(|((lo, hi), d)| format!("({lo}) >= 0 && ({hi}) < {d}")).collect()
    }
}

/// Whether a load's or store's `index` reaches the whole block.
pub(super) fn whole(index: &Option<Vec<Index>>) -> bool {
    index.as_ref().is_none_or(|ix| ix.iter().all(|i| matches!(i, Index::Full)))
}

/// How many of the loops over `shape` (outermost first) a value of `vshape` broadcast over it
/// varies in: 0 for one element, `shape.len()` where it varies in the innermost.
fn loops_varied(vshape: &[usize], shape: &[usize]) -> usize {
    if vshape == shape {
        return shape.len(); // read at `f`, the flat index (`index_in`)
    }
    let off = shape.len() - vshape.len();
    (0..vshape.len()).rev().find(|&j| vshape[j] != 1).map_or(0, |j| j + off + 1)
}

fn var(k: usize) -> String {
    format!("i{k}")
}

impl<'v> Writer<'v, '_> {
    pub(super) fn param(&self, name: &str) -> (usize, &'v Param) {
        let k = self.v.kernel();
        k.params.iter().enumerate().find(|(_, p)| p.name == name).expect("verifier: an argument")
    }

    /// The coordinates of a load's or store's elements over `shape`.
    fn access(&self, name: &str, index: Option<&[Index]>, shape: &[usize], temps: Option<&HashSet<ValueId>>) -> Access {
        let (n, p) = self.param(name);
        let dims = p.ty.shape.clone();
        let mut coords = Vec::new();
        let mut range = Vec::new();
        let mut k = 0;
        let mut gathered = false;
        for d in 0..dims.len() {
            let origin = if p.block.is_some() { format!("o{n}_{d}") } else { "0".into() };
            let (rel, lo, hi) = match index.map(|ix| &ix[d]) {
                None | Some(Index::Full) => {
                    let r = (var(k), "0".to_string(), format!("{}", shape[k].saturating_sub(1)));
                    k += 1;
                    r
                }
                Some(Index::Slice { start, size, stride }) => {
                    let s = format!("(int64_t){}", self.scalar(start, DType::I32));
                    let r =
                        (format!("{s} + {} * {stride}", var(k)), s.clone(), format!("{s} + {}", size.saturating_sub(1) * stride));
                    k += 1;
                    r
                }
                Some(Index::At(at)) => {
                    let s = format!("(int64_t){}", self.scalar(at, DType::I32));
                    (s.clone(), s.clone(), s)
                }
                // The index vector's element at this loop variable; its range is unknown, so
                // a run with a gather always checks its bounds.
                Some(Index::Gather { index, .. }) => {
                    let Operand::Value(iv) = index else { unreachable!("verifier: an index vector is a value") };
                    let id = self.id(iv);
                    let e = if temps.is_some_and(|t| t.contains(&id)) {
                        format!("t{}", id.index())
                    } else {
                        format!("v{}[{}]", id.index(), var(k))
                    };
                    k += 1;
                    gathered = true;
                    (format!("(int64_t){e}"), String::new(), String::new())
                }
            };
            coords.push(format!("{origin} + {rel}"));
            range.push((format!("{origin} + {lo}"), format!("{origin} + {hi}")));
        }
        Access { coords, range, dims, gathered }
    }

    /// The flat index of the iteration point in a value of `vshape`, broadcast over `shape`.
    fn index_in(&self, vshape: &[usize], shape: &[usize]) -> String {
        if vshape == shape {
            return "f".into();
        }
        let off = shape.len() - vshape.len();
        let mut stride = 1usize;
        let mut terms = Vec::new();
        for (j, &d) in vshape.iter().enumerate().rev() {
            if d != 1 {
                terms.push(if stride == 1 { var(j + off) } else { format!("{} * {stride}", var(j + off)) });
            }
            stride *= d;
        }
        if terms.is_empty() { "0".into() } else { terms.join(" + ") }
    }

    /// An operand's element at the iteration point, as `d`'s compute type.
    fn element(&self, op: &Operand, d: DType, ctx: &Ctx) -> String {
        let Operand::Value(name) = op else { return self.scalar(op, d) };
        let id = self.id(name);
        if ctx.temps.contains(&id) {
            return format!("t{}", id.index());
        }
        match self.places.get(&id) {
            Some(Place::Buffer) => {
                let vshape = &self.ty(id).shape;
                let read = format!("v{}[{}]", id.index(), self.index_in(vshape, &ctx.shape));
                let mut reads = ctx.reads.borrow_mut();
                if let Some((name, ..)) = reads.iter().find(|(_, _, r, _)| *r == read) {
                    return name.clone();
                }
                let name = format!("r{}", reads.len());
                reads.push((name.clone(), c::compute(self.ty(id).dtype), read, loops_varied(vshape, &ctx.shape)));
                name
            }
            _ => format!("v{}", id.index()),
        }
    }

    /// A value statement's element expression.
    pub(super) fn value_expr(&mut self, s: &'v Stmt, ctx: &Ctx) -> String {
        let ty = s.ty.as_ref().expect("verified");
        let d = ty.dtype;
        match &s.op {
            Op::Unary(op, a) => {
                let x = self.element(a, d, ctx);
                c::unary(self.calls, *op, d, &x)
            }
            Op::Binary(op, a, b) => {
                let (x, y) = (self.element(a, d, ctx), self.element(b, d, ctx));
                c::binary(self.calls, *op, d, &x, &y)
            }
            Op::Compare(op, a, b) => {
                let od = self.dtype_of(a, self.dtype_of(b, DType::F32));
                c::compare(*op, &self.element(a, od, ctx), &self.element(b, od, ctx))
            }
            Op::Select(cond, a, b) => {
                let c = self.element(cond, DType::Bool, ctx);
                format!("(({c}) ? {} : {})", self.element(a, d, ctx), self.element(b, d, ctx))
            }
            Op::Cast(a) => {
                let from = self.dtype_of(a, d);
                c::cast(from, d, &self.element(a, from, ctx))
            }
            Op::Bitcast(a) => {
                let from = self.dtype_of(a, d);
                c::bitcast(from, d, &self.element(a, from, ctx))
            }
            Op::Broadcast(a) => self.element(a, d, ctx),
            Op::Full(l) => self.lit(*l, d),
            Op::Zeros => self.lit(Literal::Int(0), d),
            Op::Iota { dim } => format!("({}){}", c::compute(d), var(*dim)),
            _ => unreachable!("not elementwise: {}", s.op.mnemonic()),
        }
    }

    /// A load's element: (a line that reads memory unconditionally, if any; the expression).
    fn load_expr(&mut self, s: &'v Stmt, ctx: &Ctx) -> (Option<String>, String) {
        let Op::Load { src, index, mask, other } = &s.op else { unreachable!() };
        let d = s.ty.as_ref().expect("verified").dtype;
        let (n, p) = self.param(src);
        let a = self.access(src, index.as_deref(), &ctx.shape, Some(&ctx.temps));
        let read = if p.kind == ParamKind::Scratch {
            format!("a{n}[{}]", a.address())
        } else {
            c::from_storage(d, &format!("a{n}[{}]", a.address()))
        };
        let other = self.lit(other.unwrap_or(Literal::Int(0)), d);
        let m = mask.as_ref().map(|m| self.element(&Operand::Value(m.clone()), DType::Bool, ctx));
        if ctx.checked {
            // Read at element 0 where outside (the array is not empty: a loop runs), so that
            // the read is not conditional; the selection then keeps `other`.
            let inside = a.inside();
            let cond = match &m {
                Some(m) => format!("{inside} && ({m})"),
                None => inside.clone(),
            };
            let clamped = format!("a{n}[({inside}) ? {} : 0]", a.address());
            let read = if p.kind == ParamKind::Scratch { clamped } else { c::from_storage(d, &clamped) };
            let l = format!("l{}", self.fresh_id());
            return (Some(format!("const {} {l} = {read};", c::compute(d))), format!("(({cond}) ? {l} : {other})"));
        }
        match m {
            Some(m) => {
                let l = format!("l{}", self.id(&s.results[0]).index());
                (Some(format!("const {} {l} = {read};", c::compute(d))), format!("(({m}) ? {l} : {other})"))
            }
            None => (None, read),
        }
    }

    fn fresh_id(&mut self) -> usize {
        self.fresh += 1;
        self.fresh
    }

    /// A store's line.
    fn store_line(&mut self, s: &'v Stmt, ctx: &Ctx) -> String {
        let Op::Store { dst, index, value, mask } = &s.op else { unreachable!() };
        let (n, p) = self.param(dst);
        let d = p.ty.dtype;
        let a = self.access(dst, index.as_deref(), &ctx.shape, Some(&ctx.temps));
        let x = self.element(value, d, ctx);
        let x = if p.kind == ParamKind::Scratch { x } else { c::to_storage(d, &x) };
        let m = mask.as_ref().map(|m| self.element(&Operand::Value(m.clone()), DType::Bool, ctx));
        let cond = match (ctx.checked, m) {
            (true, Some(m)) => Some(format!("{} && ({m})", a.inside())),
            (true, None) => Some(a.inside()),
            (false, m) => m,
        };
        match cond {
            Some(c) => format!("if ({c}) a{n}[{}] = {x};", a.address()),
            None => format!("a{n}[{}] = {x};", a.address()),
        }
    }

    /// A scalar store (every index single).
    pub(super) fn scalar_store(&mut self, s: &'v Stmt) {
        let ctx = Ctx::new(Vec::new(), HashSet::new(), true);
        let l = self.store_line(s, &ctx);
        self.line(l);
    }

    /// The iteration shape of an elementwise statement.
    fn iteration(&self, s: &Stmt) -> Option<Vec<usize>> {
        if !elementwise(&s.op) {
            return None;
        }
        match &s.op {
            Op::Store { dst, index, .. } => Some(analysis::region_shape(self.param(dst).1, index.as_deref())),
            _ => s.ty.as_ref().map(|t| t.shape.clone()),
        }
    }

    /// The elementwise run that starts at `stmts[i]`, written as one loop nest; the index after
    /// it, or `None` where `stmts[i]` starts none.
    pub(super) fn group(&mut self, stmts: &'v [Stmt], i: usize) -> Option<usize> {
        let shape = self.iteration(&stmts[i]).filter(|s| !s.is_empty())?;
        let mut members: Vec<&'v Stmt> = Vec::new();
        let mut hoisted: Vec<&'v Stmt> = Vec::new();
        // Per reference: the index of the run's accesses, and whether one stored.
        // Per reference: the indices of the run's accesses, whether one stored, whether one
        // placed elements by an index vector.
        let mut touched: HashMap<&'v str, (HashSet<String>, bool, bool)> = HashMap::new();
        let mut j = i;
        while j < stmts.len() {
            let s = &stmts[j];
            if self.absorbed.contains(&(s as *const Stmt as usize)) {
                break;
            }
            if self.iteration(s).as_ref() == Some(&shape) {
                let (name, index, store) = match &s.op {
                    Op::Load { src, index, .. } => (Some(src.as_str()), index, false),
                    Op::Store { dst, index, .. } => (Some(dst.as_str()), index, true),
                    _ => (None, &None, false),
                };
                if let Some(name) = name {
                    // A reference the run stores through must be accessed through one index,
                    // and not an index vector (whose repeated entries would meet across lanes):
                    // then every lane sees the memory it would statement by statement.
                    let gather = index.iter().flatten().any(|i| matches!(i, Index::Gather { .. }));
                    let (mut sigs, mut stored, mut gathered) = touched.get(name).cloned().unwrap_or_default();
                    sigs.insert(format!("{index:?}"));
                    stored |= store;
                    gathered |= gather;
                    if stored && (sigs.len() > 1 || gathered) && !members.is_empty() {
                        break;
                    }
                    touched.insert(name, (sigs, stored, gathered));
                }
                members.push(s);
            } else if s.results.len() == 1
                && self.is_scalar(self.id(&s.results[0]))
                && (matches!(s.op, Op::ProgramId(_) | Op::NumPrograms(_))
                    || (elementwise(&s.op) && !matches!(s.op, Op::Load { .. })))
            {
                hoisted.push(s);
            } else {
                break;
            }
            j += 1;
        }
        for s in hoisted {
            self.stmt(s);
        }
        self.run(&members, shape);
        Some(j)
    }

    /// Where a load's value can be its input's memory: an `f32`, `i32` or `u32` input read whole,
    /// without a mask, whose blocks are contiguous (every dimension but the first whole), or 2-D
    /// blocks of a wider `f32` array read only by `dot`s (which take rows at any distance): the
    /// argument's position, the offset of the block's first element and, for the latter, the
    /// distance between its rows.
    fn view_of(&self, s: &Stmt) -> Option<(usize, String, Option<usize>)> {
        let Op::Load { src, index, mask: None, .. } = &s.op else { return None };
        let (n, p) = self.param(src);
        let whole = whole(index);
        let same = matches!(p.ty.dtype, DType::F32 | DType::I32 | DType::U32);
        let block = p.block_shape();
        if p.kind != ParamKind::In || !whole || !same || block.len() != p.ty.shape.len() || p.ty.shape.is_empty() {
            return None;
        }
        if block.iter().zip(&p.ty.shape).skip(1).all(|(b, d)| b == d) {
            if p.block.is_none() {
                return Some((n, "0".into(), None));
            }
            let row: usize = p.ty.shape[1..].iter().product();
            return Some((n, format!("o{n}_0 * {row}"), None));
        }
        let id = self.id(&s.results[0]);
        let only_dots = self.dot_reads.get(&id).is_some_and(|d| Some(d) == self.uses.get(&id));
        if block.len() != 2 || p.ty.dtype != DType::F32 || !only_dots {
            return None;
        }
        let row = p.ty.shape[1];
        Some((n, format!("o{n}_0 * {row} + o{n}_1"), Some(row)))
    }

    /// Emits a run's loop nest (twice where it touches memory: without bounds checks when every
    /// access lies inside its array, with them otherwise).
    fn run(&mut self, members: &[&'v Stmt], shape: Vec<usize>) {
        // Values read outside the run get memory; the others stay in registers.
        let mut inside: HashMap<ValueId, usize> = HashMap::new();
        for s in members {
            for r in analysis::reads(&s.op) {
                *inside.entry(self.id(r)).or_insert(0) += 1;
            }
        }
        let made: Vec<ValueId> = members.iter().filter_map(|s| s.results.first().map(|r| self.id(r))).collect();
        let mut kept = HashSet::new();
        // Loads kept in memory that can be the input's own block where the run is inside its
        // arrays: no copy then (their pointer is set before the loops).
        let mut views: Vec<(ValueId, usize, String)> = Vec::new();
        // Of those, the ones whose rows are apart in the input: (value, its own row width, the input's).
        let mut strided: Vec<(ValueId, usize, usize)> = Vec::new();
        for s in members {
            let Some(id) = s.results.first().map(|r| self.id(r)) else { continue };
            if self.uses.get(&id).copied().unwrap_or(0) <= inside.get(&id).copied().unwrap_or(0) {
                continue;
            }
            kept.insert(id);
            match self.view_of(s) {
                Some((n, at, row)) => {
                    let off = self.view_buffer(id);
                    views.push((id, off, format!("a{n} + {at}")));
                    if let Some(row) = row {
                        strided.push((id, self.ty(id).shape[1], row));
                        self.row_stride.insert(id, format!("ld{}", id.index()));
                    }
                }
                None => self.buffer(id),
            }
        }
        let mut fast = Vec::new();
        for s in members {
            match &s.op {
                Op::Load { src: name, index, .. } | Op::Store { dst: name, index, .. } => {
                    fast.extend(self.access(name, index.as_deref(), &shape, None).fast());
                }
                _ => {}
            }
        }
        let temps: HashSet<ValueId> = made.iter().copied().collect();
        if fast.is_empty() {
            for &(id, own, _) in &strided {
                self.line(format!("const int64_t ld{} = {own};", id.index()));
            }
            self.nest(members, &Ctx::new(shape, temps, false), &kept);
        } else {
            let flag = self.fresh("fast");
            self.line(format!("const int {flag} = {};", fast.join(" && ")));
            for (id, off, at) in &views {
                let ct = c::compute(self.ty(*id).dtype);
                self.line(format!("v{} = {flag} ? ({ct} *)({at}) : ({ct} *)(arena + {off});", id.index()));
            }
            for &(id, own, row) in &strided {
                self.line(format!("const int64_t ld{} = {flag} ? {row} : {own};", id.index()));
            }
            self.line(format!("if ({flag}) {{"));
            self.depth += 1;
            let viewed: HashSet<ValueId> = views.iter().map(|v| v.0).collect();
            let written: HashSet<ValueId> = kept.difference(&viewed).copied().collect();
            self.nest(members, &Ctx::new(shape.clone(), temps.clone(), false), &written);
            self.depth -= 1;
            self.line("} else {");
            self.depth += 1;
            self.nest(members, &Ctx::new(shape, temps, true), &kept);
            self.depth -= 1;
            self.line("}");
        }
        for id in made {
            self.places.entry(id).or_insert(Place::Local);
            if !kept.contains(&id) {
                // Only the run reads it: no memory, no name outside the loop.
                self.places.remove(&id);
            }
        }
    }

    fn nest(&mut self, members: &[&'v Stmt], ctx: &Ctx, kept: &HashSet<ValueId>) {
        let r = ctx.shape.len();
        let mut flat = String::new();
        let mut stride = 1usize;
        for k in (0..r).rev() {
            if !flat.is_empty() {
                flat.insert_str(0, " + ");
            }
            flat.insert_str(0, &if stride == 1 { var(k) } else { format!("{} * {stride}", var(k)) });
            stride *= ctx.shape[k];
        }
        let mut lines = Vec::new();
        for s in members {
            if let Op::Store { .. } = s.op {
                lines.push(self.store_line(s, ctx));
                continue;
            }
            let id = self.id(&s.results[0]);
            let ct = c::compute(self.ty(id).dtype);
            let e = if let Op::Load { .. } = s.op {
                let (pre, e) = self.load_expr(s, ctx);
                lines.extend(pre);
                e
            } else {
                self.value_expr(s, ctx)
            };
            let mut l = format!("const {ct} t{} = {e};", id.index());
            if kept.contains(&id) {
                let _ = write!(l, " v{}[f] = t{};", id.index(), id.index());
            }
            lines.push(l);
        }
        // Each read in the loop of the innermost variable its index takes (the first, for reads of
        // one element: inside a loop, so that two runs' locals never meet in one C scope).
        let reads = ctx.reads.take();
        for (k, d) in ctx.shape.iter().enumerate() {
            self.line(format!("for (int64_t {v} = 0; {v} < {d}; {v}++) {{", v = var(k)));
            self.depth += 1;
            for (name, ct, read, _) in reads.iter().filter(|x| x.3.max(1) == k + 1 && k + 1 < r) {
                self.line(format!("const {ct} {name} = {read};"));
            }
        }
        self.line(format!("const int64_t f = {flat}; (void)f;"));
        for (name, ct, read, _) in reads.iter().filter(|x| x.3.max(1) >= r) {
            self.line(format!("const {ct} {name} = {read};"));
        }
        for l in lines {
            self.line(l);
        }
        for _ in 0..r {
            self.depth -= 1;
            self.line("}");
        }
    }
}
