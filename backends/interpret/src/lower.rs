//! Verified IR to the interpreter's program form: values become slot numbers (their ids), argument
//! names become array numbers, literals and constant blocks (`iota`, `full`, `zeros`) are built
//! once. Execution then never looks anything up by name.

use std::collections::HashMap;

use tessel_plugin_api::ir::*;

use crate::eval::Val;
use crate::program::{BarrierRef, Branch, DotArg, Instr, Ix, MemRef, Program, Region, Src, SyncInstr};

struct Lowerer<'a> {
    v: &'a Verified,
    /// The shape of each slot a statement defines.
    shapes: HashMap<usize, Vec<usize>>,
    /// For a kernel of the concurrent model, the line of each statement in its canonical text
    /// (by the statement's address) and the statements checked so far (`Program::stmts`).
    lines: Option<HashMap<*const Stmt, usize>>,
    stmts: Vec<String>,
}

/// Lowers a verified kernel, with its elementwise runs fused where `fuse` says. Infallible: the
/// verifier has checked everything.
pub(crate) fn lower(v: &Verified, fuse: bool) -> Program {
    let concurrent = v.kernel().is_concurrent();
    let mut l = Lowerer { v, shapes: HashMap::new(), lines: concurrent.then(|| canonical_lines(v.kernel())), stmts: Vec::new() };
    let body = l.body(&v.kernel().body);
    let slots = v.values().len();
    let stmts = std::mem::take(&mut l.stmts);
    if !fuse || concurrent {
        return Program { body, slots, stmts, concurrent };
    }
    let mut uses = HashMap::new();
    crate::fuse::count_uses(&body, &mut uses);
    let body = dot_views(body, v, &uses);
    let mut uses = HashMap::new();
    crate::fuse::count_uses(&body, &mut uses);
    let body = crate::fuse::fuse(body, &crate::fuse::Facts { v, shapes: &l.shapes, uses: &uses });
    Program { body, slots, stmts, concurrent: false }
}

/// The line of each statement of `k` in its canonical text, by the statement's address: the
/// printer writes one statement a line, in the order [`analysis::visit`] meets them.
fn canonical_lines(k: &Kernel) -> HashMap<*const Stmt, usize> {
    let text = print_kernel(k);
    let lines: Vec<&str> = text.lines().collect();
    let mut at = lines.iter().position(|l| *l == "{").unwrap_or(0);
    let mut out = HashMap::new();
    analysis::visit(&k.body, &mut |s| {
        let head = print::print_stmt_head(s);
        if let Some(n) = lines[at + 1..].iter().position(|l| l.trim_start().starts_with(head.as_str())) {
            at += 1 + n;
            out.insert(s as *const Stmt, at + 1);
        }
    });
    out
}

impl Lowerer<'_> {
    /// The slot of `%name`: its id's position.
    fn slot(&self, name: &str) -> usize {
        self.v.id(name).index()
    }

    /// An operand; a literal takes the dtype `dtype` (that of the op's other operands).
    fn src(&mut self, o: &Operand, dtype: DType) -> Src {
        match o {
            Operand::Value(n) => Src::Slot(self.slot(n)),
            Operand::Lit(l) => Src::Const(Val::scalar_literal(dtype, *l)),
        }
    }

    fn dtype_of(&self, o: &Operand) -> Option<DType> {
        self.v.operand_type(o).map(|t| t.dtype)
    }

    /// The common dtype of operands where at least one is a value.
    fn common(&self, ops: &[&Operand]) -> DType {
        ops.iter().find_map(|o| self.dtype_of(o)).expect("verifier: one operand is a value")
    }

    fn mem(&self, name: &str) -> MemRef {
        MemRef(self.v.kernel().params.iter().position(|p| p.name == name).expect("verifier: known argument"))
    }

    fn index(&mut self, index: &Option<Vec<Index>>) -> Option<Vec<Ix>> {
        index.as_ref().map(|ix| {
            ix.iter()
                .map(|i| match i {
                    Index::Full => Ix::Full,
                    Index::Slice { start, size, stride } => Ix::Slice(self.src(start, DType::I32), *size, *stride),
                    Index::At(v) => Ix::At(self.src(v, DType::I32)),
                    Index::Gather { index, .. } => Ix::Gather(self.src(index, DType::I32)),
                })
                .collect()
        })
    }

    fn axis(&self, a: &AxisRef) -> usize {
        match a {
            AxisRef::Pos(p) => *p,
            AxisRef::Name(n) => self.v.grid().iter().position(|g| &g.name == n).expect("verifier: known axis"),
        }
    }

    fn body(&mut self, body: &[Stmt]) -> Vec<Instr> {
        body.iter().filter(|s| !matches!(s.op, Op::Yield(_))).map(|s| self.checked(s)).collect()
    }

    /// A statement; in a kernel of the concurrent model its loads and stores are checked for
    /// races, and its asynchronous statements numbered, as [`Program::stmts`] names them.
    fn checked(&mut self, s: &Stmt) -> Instr {
        let Some(lines) = &self.lines else { return self.stmt(s) };
        let line = lines.get(&(s as *const Stmt)).copied();
        let named = |s: &Stmt| {
            let text = print::print_stmt_head(s);
            match line {
                Some(n) => format!("`{text}` (line {n})"),
                None => format!("`{text}`"),
            }
        };
        match &s.op {
            Op::Load { .. } | Op::Store { .. } => {
                self.stmts.push(named(s));
                let stmt = self.stmts.len() - 1;
                Instr::Checked { stmt, instr: Box::new(self.stmt(s)) }
            }
            Op::Sync(op) => {
                self.stmts.push(named(s));
                let stmt = self.stmts.len() - 1;
                Instr::Sync { stmt, op: self.sync(op) }
            }
            _ => self.stmt(s),
        }
    }

    fn sync(&mut self, op: &SyncOp) -> SyncInstr {
        let k = self.v.kernel();
        let barrier = |b: &BarrierAt, l: &mut Self| {
            let first: usize = k.barriers.iter().take_while(|d| d.name != b.name).map(|d| d.count).sum();
            let count = k.barrier(&b.name).expect("verifier: a declared barrier").count;
            BarrierRef { first, count, index: l.src(&b.index, DType::I32) }
        };
        let region = |r: &RefAt, l: &mut Self| {
            let mem = l.mem(&r.name);
            Region { mem, index: l.index(&r.index), dtype: k.params[mem.0].ty.dtype }
        };
        match op {
            SyncOp::Arrive(b) => SyncInstr::Arrive { barrier: barrier(b, self) },
            SyncOp::Wait(b) => SyncInstr::Wait { barrier: barrier(b, self) },
            SyncOp::Copy { dst, src, arrive } => SyncInstr::Copy {
                dst: region(dst, self),
                src: region(src, self),
                arrive: arrive.as_ref().map(|b| barrier(b, self)),
            },
            SyncOp::CommitCopies => SyncInstr::CommitCopies,
            SyncOp::WaitCopies { pending, reads } => SyncInstr::WaitCopies { pending: *pending, reads: *reads },
            SyncOp::Fence => SyncInstr::Fence,
            SyncOp::Mma { acc, a, b, trans_a, trans_b } => SyncInstr::Mma {
                acc: region(acc, self),
                a: match a {
                    MmaLhs::Ref(r) => Ok(region(r, self)),
                    MmaLhs::Value(v) => Err(self.src(v, DType::F32)),
                },
                b: region(b, self),
                trans_a: *trans_a,
                trans_b: *trans_b,
            },
            SyncOp::MmaWait { pending } => SyncInstr::MmaWait { pending: *pending },
            SyncOp::MaxRegisters { .. } => SyncInstr::Hint,
        }
    }

    fn stmt(&mut self, s: &Stmt) -> Instr {
        let ty = s.ty.clone();
        let dst = s.results.first().map(|r| self.slot(r)).unwrap_or(usize::MAX);
        if let (Some(t), [_], false) = (&ty, s.results.as_slice(), s.op.has_body()) {
            self.shapes.insert(dst, t.shape.clone());
        }
        let result_ty = || ty.clone().expect("verifier: result type filled");
        match &s.op {
            Op::Load { src, index, mask, other } => {
                let mem = self.mem(src);
                let index = self.index(index);
                let mask = mask.as_ref().map(|m| self.slot(m));
                Instr::Load { dst, mem, index, mask, other: other.unwrap_or(Literal::Int(0)), dtype: result_ty().dtype }
            }
            Op::Store { dst: d, index, value, mask } => {
                let mem = self.mem(d);
                let dtype = self.v.kernel().params[mem.0].ty.dtype;
                let index = self.index(index);
                let value = self.src(value, dtype);
                let mask = mask.as_ref().map(|m| self.slot(m));
                Instr::Store { mem, index, value, mask }
            }
            Op::ProgramId(a) => Instr::ProgramId { dst, axis: self.axis(a) },
            Op::NumPrograms(a) => Instr::NumPrograms { dst, axis: self.axis(a) },
            Op::Iota { dim } => {
                let t = result_ty();
                Instr::Const { dst, val: Val::iota(t.dtype, &t.shape, *dim) }
            }
            Op::Full(l) => {
                let t = result_ty();
                Instr::Const { dst, val: Val::splat(t.dtype, &t.shape, *l) }
            }
            Op::Zeros => {
                let t = result_ty();
                Instr::Const { dst, val: Val::splat(t.dtype, &t.shape, Literal::Int(0)) }
            }
            Op::Unary(op, a) => {
                let d = self.common(&[a]);
                Instr::Unary { dst, op: *op, a: self.src(a, d) }
            }
            Op::Binary(op, a, b) => {
                let d = self.common(&[a, b]);
                Instr::Binary { dst, op: *op, a: self.src(a, d), b: self.src(b, d) }
            }
            Op::Compare(op, a, b) => {
                let d = self.common(&[a, b]);
                Instr::Compare { dst, op: *op, a: self.src(a, d), b: self.src(b, d) }
            }
            Op::Select(c, a, b) => {
                let d = self.common(&[a, b]);
                Instr::Select { dst, c: self.src(c, DType::Bool), a: self.src(a, d), b: self.src(b, d) }
            }
            Op::Cast(a) => Instr::Cast { dst, a: self.src(a, DType::F32), to: result_ty().dtype },
            Op::Bitcast(a) => Instr::Bitcast { dst, a: self.src(a, DType::F32), to: result_ty().dtype },
            Op::Broadcast(a) => Instr::Broadcast { dst, a: self.src(a, DType::F32), shape: result_ty().shape },
            Op::Reshape(a) => Instr::Reshape { dst, a: self.src(a, DType::F32), shape: result_ty().shape },
            Op::Transpose { arg, perm } => Instr::Transpose { dst, a: self.src(arg, DType::F32), perm: perm.clone() },
            Op::Slice { arg, start, stride } => Instr::Slice {
                dst,
                a: self.src(arg, DType::F32),
                start: start.clone(),
                stride: stride.clone(),
                shape: result_ty().shape,
            },
            Op::Concatenate { args, axis } => {
                Instr::Concatenate { dst, args: args.iter().map(|a| self.src(a, DType::F32)).collect(), axis: *axis }
            }
            Op::Reduce { op, arg, axis, keepdims } => {
                Instr::Reduce { dst, op: *op, a: self.src(arg, DType::F32), axis: *axis, keepdims: *keepdims }
            }
            Op::Dot { a, b, trans_a, trans_b } => {
                let (a, b) = (DotArg::Value(self.src(a, DType::F32)), DotArg::Value(self.src(b, DType::F32)));
                Instr::Dot { dst, a, b, trans_a: *trans_a, trans_b: *trans_b }
            }
            Op::When { cond, body } => Instr::When { cond: self.src(cond, DType::Bool), body: self.body(body) },
            Op::For(ForLoop { var, lo, hi, step, iters: carried, cond, body }) => {
                let var = self.slot(var);
                let lo = self.src(lo, DType::I32);
                let hi = self.src(hi, DType::I32);
                let step = step.as_ref().map_or(Src::Const(Val::i32_scalar(1)), |s| self.src(s, DType::I32));
                let iters: Vec<(usize, Src)> = carried
                    .iter()
                    .map(|(n, init)| {
                        let d = self.common(&[init]);
                        (self.slot(n), self.src(init, d))
                    })
                    .collect();
                let yields = match body.last().map(|s| &s.op) {
                    Some(Op::Yield(vals)) => vals
                        .iter()
                        .zip(carried)
                        .map(|(v, (n, _))| {
                            let d = self.v.value_type(n).dtype;
                            self.src(v, d)
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let body = self.body(body);
                let results = s.results.iter().map(|r| self.slot(r)).collect();
                let cond = cond.as_ref().map(|c| self.slot(c));
                Instr::For { var, lo, hi, step, iters, cond, results, body, yields }
            }
            Op::If(IfElse { cond, then, els }) => {
                let results: Vec<usize> = s.results.iter().map(|r| self.slot(r)).collect();
                let mut branch = |body: &[Stmt]| {
                    let yields = match body.last().map(|s| &s.op) {
                        Some(Op::Yield(vals)) => vals
                            .iter()
                            .zip(&s.results)
                            .map(|(v, r)| {
                                let d = self.v.value_type(r).dtype;
                                self.src(v, d)
                            })
                            .collect(),
                        _ => Vec::new(),
                    };
                    Branch { body: self.body(body), yields }
                };
                let (then, els) = (branch(then), branch(els));
                Instr::If { cond: self.src(cond, DType::Bool), then, els, results }
            }
            Op::Yield(_) => unreachable!("yield is taken by its for or if"),
            Op::Tile { .. } | Op::Repeat { .. } => unreachable!("legalize rewrites tile and repeat before planning"),
            Op::Sync(_) => unreachable!("`checked` lowers the concurrent model's statements"),
        }
    }
}

/// `body` with each whole-block load of a 2-D `f32` input that only a later `dot` of the same
/// body reads folded into that `dot` as [`DotArg::Block`]: the block is not copied.
fn dot_views(body: Vec<Instr>, v: &Verified, uses: &HashMap<usize, usize>) -> Vec<Instr> {
    let viewable = |instr: &Instr| match instr {
        Instr::Load { dst, mem, index: None, mask: None, dtype: DType::F32, .. } => {
            let p = &v.kernel().params[mem.0];
            (p.kind == ParamKind::In && p.ty.shape.len() == 2 && uses.get(dst) == Some(&1)).then_some((*dst, *mem))
        }
        _ => None,
    };
    let loads: HashMap<usize, MemRef> = body.iter().filter_map(viewable).collect();
    let mut taken: Vec<usize> = Vec::new();
    let mut fold = |arg: DotArg| match arg {
        DotArg::Value(Src::Slot(n)) if loads.contains_key(&n) => {
            taken.push(n);
            DotArg::Block(loads[&n])
        }
        other => other,
    };
    let body: Vec<Instr> = body
        .into_iter()
        .map(|instr| match instr {
            Instr::Dot { dst, a, b, trans_a, trans_b } => Instr::Dot { dst, a: fold(a), b: fold(b), trans_a, trans_b },
            other => other.map_bodies(|b| dot_views(b, v, uses)),
        })
        .collect();
    body.into_iter().filter(|i| !viewable(i).is_some_and(|(dst, _)| taken.contains(&dst))).collect()
}
