//! The PTX of the Hopper attention path (`crate::attention` says which kernels take it and the
//! model): the query block and each trip's key and value blocks copied by TMA into swizzled
//! shared memory, `wgmma` for the scores and for `P V`, and the kernel's row-wise statements on
//! the accumulator registers.
//!
//! Every value lives in registers ([`Class`]): a scalar in one, a row in one per row half the
//! thread holds (rows `r` and `r + 8` of its warp's 16), a `[BQ, N]` block in `N / 2`, register
//! `i` at row half `(i / 2) % 2` and column `2 (lane % 4) + 8 (i / 4) + i % 2`: the layout of a
//! `wgmma` accumulator, so the scores are used where the instruction leaves them.

use std::collections::HashMap;

use tessel_plugin_api::ir::*;

use super::conv::{combining, half_ty, lit_bits};
use super::header::SHARED;
use super::writer::Writer;
use crate::attention::{Attention, Class, class};
use crate::limits::THREADS;
use crate::wgmma::{Mma, ROW, SWIZZLE};

/// What the loop's statements need besides the writer: the values' registers and where things
/// are.
struct Frame<'a> {
    a: &'a Attention,
    /// Each value's registers, in its class's order.
    env: HashMap<String, Vec<String>>,
    /// The block-local row of each row half the thread holds, and its first column.
    rows: [String; 2],
    col: String,
    /// Shared memory: its start, the mbarriers, this trip's stage.
    smem: String,
    bars: String,
    stage: String,
    /// The tensor maps of `q`, `k` and `v`.
    maps: Vec<String>,
    /// The loop: its variable, first value and step, and its body (for the copies' starts).
    var: String,
    lo: String,
    step: String,
    /// On a warp-specialized schedule: the first `empty` mbarrier (a stage's consumers are done
    /// with it), and the label past the output's store, where the producer ends.
    empty: String,
    end: String,
}

/// Row half of register `i` of a block.
fn half(i: usize) -> usize {
    (i / 2) % 2
}

/// Column of register `i` of a block, from the thread's first column.
fn column(i: usize) -> usize {
    8 * (i / 4) + i % 2
}

impl Writer<'_> {
    pub(super) fn write_attention(&mut self, a: &Attention) {
        let plan = self.plan;
        let ([tid_x, cta, out], maps) = self.hopper_entry(&a.out);
        let grid = plan.kernel.grid().to_vec();
        self.coords = grid.iter().map(|_| String::new()).collect();
        let par: Vec<usize> = (0..grid.len()).filter(|&x| !grid[x].seq).collect();
        self.decode(&cta, &par);
        for x in (0..grid.len()).filter(|&x| grid[x].seq) {
            self.coords[x] = self.imm(0);
        }
        self.write_origins();
        self.comment(&format!(
            "the query block ({} bytes), the probabilities ({}), {} stages of a key and a value block ({} bytes), then mbarriers",
            a.q_bytes(),
            a.p_bytes(),
            a.stages,
            a.stage_bytes()
        ));
        let smem = self.r();
        self.insf(format_args!("mov.u32 {smem}, {SHARED}"));
        let bars = self.r();
        self.insf(format_args!("add.u32 {bars}, {smem}, {}", a.stages_at() + a.stages * a.stage_bytes()));
        let empty = if a.schedule.specialized() {
            let empty = self.r();
            self.insf(format_args!("add.u32 {empty}, {bars}, {}", 8 * (1 + a.stages)));
            empty
        } else {
            String::new()
        };
        let leader = self.p();
        self.insf(format_args!("setp.eq.u32 {leader}, {tid_x}, 0"));
        let skip = self.label("init");
        self.insf(format_args!("@!{leader} bra {skip}"));
        for s in 0..=a.stages {
            let bar = self.r();
            self.insf(format_args!("add.u32 {bar}, {bars}, {}", 8 * s));
            self.insf(format_args!("mbarrier.init.shared::cta.b64 [{bar}], 1"));
        }
        // A producer's stages come back on an `empty` mbarrier each: every consumer thread arrives.
        if a.schedule.specialized() {
            for s in 0..a.stages {
                let bar = self.r();
                self.insf(format_args!("add.u32 {bar}, {empty}, {}", 8 * s));
                self.insf(format_args!("mbarrier.init.shared::cta.b64 [{bar}], {}", a.warpgroups() * THREADS));
            }
        }
        self.ins("fence.mbarrier_init.release.cluster");
        self.ins("fence.proxy.async.shared::cta");
        self.comment("thread 0 copies the query block");
        let q_origin = self.origin_of(&a.q);
        let state = self.rd();
        self.insf(format_args!("mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{bars}], {}", a.q_bytes()));
        for j in 0..(a.d / ROW) as u64 {
            let (dst, x) = (self.r(), self.r());
            self.insf(format_args!("add.u32 {dst}, {smem}, {}", j * a.bq as u64 * SWIZZLE as u64));
            self.insf(format_args!("add.s32 {x}, {}, {}", q_origin[1], j * ROW as u64));
            self.tensor_copy(&dst, &maps[0], (&x, &q_origin[0]), &bars);
        }
        self.place_label(&skip);
        self.ins("bar.sync 0");
        // Where the thread's registers are: block-local rows and first column.
        let (lrow, col) = self.fragment_origin();
        let second = self.r();
        self.insf(format_args!("add.u32 {second}, {lrow}, 8"));
        let mut f = Frame {
            a,
            env: HashMap::new(),
            rows: [lrow, second],
            col,
            smem,
            bars,
            stage: String::new(),
            maps,
            var: String::new(),
            lo: String::new(),
            step: String::new(),
            empty,
            end: if a.schedule.specialized() { self.label("end") } else { String::new() },
        };
        let body = &plan.kernel.kernel().body;
        for s in body {
            match &s.op {
                Op::For(l) => self.write_trips(&mut f, s, l, &leader),
                Op::Store { value: Operand::Value(x), .. } => {
                    self.comment("the output block, from registers");
                    let origin = self.origin_of(&a.out);
                    let frag = self.fragment((&a.out, a.dv), &out, &origin);
                    let regs = f.env[x].clone();
                    let dtype = plan.kernel.kernel().param(&a.out).expect("verified output").ty.dtype;
                    for at in &frag.places {
                        let (ok, addr) = self.address(&frag, at);
                        let first = 4 * (at.column / 8) + 2 * at.half + at.column % 2;
                        let values: Vec<String> = (first..first + at.regs.len()).map(|i| regs[i].clone()).collect();
                        self.store_pair(dtype, &ok, &addr, &values);
                    }
                }
                _ => self.statement(&mut f, s),
            }
        }
        if !f.end.is_empty() {
            self.place_label(&f.end);
        }
    }

    /// The loop: thread 0 starts the copies of the first `stages` trips; each trip waits for
    /// its stage, runs the body and, once every thread is past it, thread 0 refills the stage.
    fn write_trips(&mut self, f: &mut Frame<'_>, s: &Stmt, l: &ForLoop, leader: &str) {
        let a = f.a;
        let scalar = |w: &mut Self, f: &Frame<'_>, o: &Operand| match o {
            Operand::Value(x) => f.env[x][0].clone(),
            Operand::Lit(l) => w.imm(lit_bits(*l, DType::I32)),
        };
        let lo = scalar(self, f, &l.lo);
        let hi = scalar(self, f, &l.hi);
        let step = match &l.step {
            Some(o) => scalar(self, f, o),
            None => self.imm(1),
        };
        (f.var, f.lo, f.step) = (l.var.clone(), lo.clone(), step.clone());
        self.comment("trips: (hi - lo - 1) / step + 1, none where either is not positive");
        let (span, trips, none, bad) = (self.r(), self.r(), self.p(), self.p());
        self.insf(format_args!("sub.s32 {span}, {hi}, {lo}"));
        self.insf(format_args!("sub.s32 {trips}, {span}, 1"));
        self.insf(format_args!("div.s32 {trips}, {trips}, {step}"));
        self.insf(format_args!("add.s32 {trips}, {trips}, 1"));
        self.insf(format_args!("setp.le.s32 {none}, {span}, 0"));
        self.insf(format_args!("setp.le.s32 {bad}, {step}, 0"));
        self.insf(format_args!("or.pred {none}, {none}, {bad}"));
        self.insf(format_args!("selp.b32 {trips}, 0, {trips}, {none}"));
        for st in (0..a.stages).filter(|_| !a.schedule.specialized()) {
            let (go, skip) = (self.p(), self.label("prologue"));
            self.insf(format_args!("setp.lt.s32 {go}, {st}, {trips}"));
            self.insf(format_args!("and.pred {go}, {go}, {leader}"));
            self.insf(format_args!("@!{go} bra {skip}"));
            let (stage, trip) = (self.imm(st as u32), self.imm(st as u32));
            self.issue_trip(f, &l.body, &stage, &trip);
            self.place_label(&skip);
        }
        // The carried values, in registers of their own.
        let carried: Vec<Vec<String>> = l
            .iters
            .iter()
            .map(|(name, init)| {
                let regs = self.operand_regs(f, init, name);
                let own: Vec<String> = regs.iter().map(|_| self.r()).collect();
                for (o, r) in own.iter().zip(&regs) {
                    self.insf(format_args!("mov.b32 {o}, {r}"));
                }
                f.env.insert(name.clone(), own.clone());
                own
            })
            .collect();
        if a.schedule.specialized() {
            self.produce_trips(f, &l.body, &trips);
        }
        self.comment("wait for the query block");
        let zero = self.imm(0);
        self.wait_phase(&f.bars.clone(), &zero);
        let (n, top, end) = (self.r(), self.label("trip"), self.label("trips_done"));
        self.insf(format_args!("mov.u32 {n}, 0"));
        self.place_label(&top);
        let done = self.p();
        self.insf(format_args!("setp.ge.s32 {done}, {n}, {trips}"));
        self.insf(format_args!("@{done} bra.uni {end}"));
        let iv = self.r();
        self.insf(format_args!("mad.lo.s32 {iv}, {n}, {step}, {lo}"));
        f.env.insert(l.var.clone(), vec![iv]);
        let (stage, parity) = self.stage_of(a.stages, &n, 0);
        let bar = self.r();
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {}", f.bars));
        self.insf(format_args!("add.u32 {bar}, {bar}, 8"));
        f.stage = self.r();
        self.insf(format_args!("mad.lo.u32 {}, {stage}, {}, {}", f.stage, a.stage_bytes(), f.smem));
        self.insf(format_args!("add.u32 {}, {}, {}", f.stage, f.stage, a.stages_at()));
        self.comment("wait for this trip's key and value blocks");
        self.wait_phase(&bar, &parity);
        for st in &l.body {
            match &st.op {
                Op::Yield(values) => {
                    // Through temporaries, so that yielding carried values in another order
                    // cannot clobber them.
                    let next: Vec<Vec<String>> = values
                        .iter()
                        .zip(&l.iters)
                        .map(|(o, (name, _))| {
                            let regs = self.operand_regs(f, o, name);
                            regs.iter()
                                .map(|r| {
                                    let t = self.r();
                                    self.insf(format_args!("mov.b32 {t}, {r}"));
                                    t
                                })
                                .collect()
                        })
                        .collect();
                    for (own, new) in carried.iter().zip(next) {
                        for (o, r) in own.iter().zip(new) {
                            self.insf(format_args!("mov.b32 {o}, {r}"));
                        }
                    }
                }
                _ => self.statement(f, st),
            }
        }
        if a.schedule.specialized() {
            self.comment("this trip's wgmmas are retired: hand its stage back to the producer");
            let (bar, state) = (self.r(), self.rd());
            self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {}", f.empty));
            self.insf(format_args!("mbarrier.arrive.shared::cta.b64 {state}, [{bar}]"));
        } else {
            self.comment("every thread is past this trip's stage and probabilities: thread 0 refills the stage");
            self.ins("bar.sync 0");
            let (next, more, skip) = (self.r(), self.p(), self.label("refill"));
            self.insf(format_args!("add.u32 {next}, {n}, {}", a.stages));
            self.insf(format_args!("setp.lt.s32 {more}, {next}, {trips}"));
            self.insf(format_args!("and.pred {more}, {more}, {leader}"));
            self.insf(format_args!("@!{more} bra {skip}"));
            self.issue_trip(f, &l.body, &stage, &next);
            self.place_label(&skip);
        }
        self.insf(format_args!("add.u32 {n}, {n}, 1"));
        self.insf(format_args!("bra.uni {top}"));
        self.place_label(&end);
        for (r, regs) in s.results.iter().zip(carried) {
            f.env.insert(r.clone(), regs);
        }
    }

    /// The warp-specialized split at the loop: the last warpgroup (the producer) lowers its
    /// registers and one thread of it copies every trip's blocks into the stages in turn, each
    /// once its consumers have handed it back (trip `n` reuses the stage of trip `n - stages`),
    /// then ends; the consumers raise their registers and go on to the trips.
    fn produce_trips(&mut self, f: &Frame<'_>, body: &[Stmt], trips: &str) {
        let a = f.a;
        let consume = self.producer_start(&f.end, "copies every trip's blocks");
        let (n, top, done) = (self.r(), self.label("copy"), self.label("copies_done"));
        self.insf(format_args!("mov.u32 {n}, 0"));
        self.place_label(&top);
        let past = self.p();
        self.insf(format_args!("setp.ge.s32 {past}, {n}, {trips}"));
        self.insf(format_args!("@{past} bra {done}"));
        let stage = self.reusable_stage(a.stages, &n, &f.empty);
        self.issue_trip(f, body, &stage, &n);
        self.insf(format_args!("add.u32 {n}, {n}, 1"));
        self.insf(format_args!("bra {top}"));
        self.place_label(&done);
        self.consumers_start(&consume, &f.end, "the trips");
    }

    /// Thread 0's copies of trip `trip`'s key and value blocks into stage `stage`: their rows
    /// start where the loads' `ds` starts are at that trip.
    fn issue_trip(&mut self, f: &Frame<'_>, body: &[Stmt], stage: &str, trip: &str) {
        let a = f.a;
        let iv = self.r();
        self.insf(format_args!("mad.lo.s32 {iv}, {trip}, {}, {}", f.step, f.lo));
        let k_row = self.start_at(f, body, &iv, &a.k_start);
        let v_row = self.start_at(f, body, &iv, &a.v_start);
        let (bar, base) = (self.r(), self.r());
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {}", f.bars));
        self.insf(format_args!("add.u32 {bar}, {bar}, 8"));
        self.insf(format_args!("mad.lo.u32 {base}, {stage}, {}, {}", a.stage_bytes(), f.smem));
        let state = self.rd();
        self.insf(format_args!("mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{bar}], {}", a.stage_bytes()));
        for (map, row, width, offset) in [(&f.maps[1], &k_row, a.d, 0), (&f.maps[2], &v_row, a.dv, a.k_bytes())] {
            for j in 0..(width / ROW) as u64 {
                let (dst, x) = (self.r(), self.r());
                self.insf(format_args!("add.u32 {dst}, {base}, {}", a.stages_at() + offset + j * a.bkv as u64 * SWIZZLE as u64));
                self.insf(format_args!("mov.b32 {x}, {}", j * ROW as u64));
                self.tensor_copy(&dst, map, (&x, row), &bar);
            }
        }
    }

    /// The value of `start` (`crate::attention`'s trip-only form) where the loop variable is `iv`.
    fn start_at(&mut self, f: &Frame<'_>, body: &[Stmt], iv: &str, start: &Operand) -> String {
        match start {
            Operand::Lit(l) => self.imm(lit_bits(*l, DType::I32)),
            Operand::Value(x) if *x == f.var => iv.to_string(),
            Operand::Value(x) => match body.iter().find(|s| s.results.first() == Some(x)) {
                Some(Stmt { op: Op::Binary(op, p, q), .. }) => {
                    let (p, q) = (self.start_at(f, body, iv, p), self.start_at(f, body, iv, q));
                    self.binary(*op, DType::I32, &p, &q)
                }
                _ => f.env[x][0].clone(),
            },
        }
    }

    /// The registers of operand `o` where it stands for a value typed like `like`.
    fn operand_regs(&mut self, f: &Frame<'_>, o: &Operand, like: &str) -> Vec<String> {
        match o {
            Operand::Value(x) => f.env[x].clone(),
            Operand::Lit(l) => {
                let ty = self.plan.kernel.value_type(like).clone();
                let r = self.imm(lit_bits(*l, ty.dtype));
                vec![r; count(class(&ty, f.a.bq))]
            }
        }
    }

    /// One statement on registers (any but the loop and the output's store), its registers
    /// named in its own scope.
    fn statement(&mut self, f: &mut Frame<'_>, s: &Stmt) {
        let back = self.names.enter(s);
        self.statement_in_scope(f, s);
        self.names.leave(back);
    }

    fn statement_in_scope(&mut self, f: &mut Frame<'_>, s: &Stmt) {
        let a = f.a;
        let plan = self.plan;
        let v = &plan.kernel;
        let Some(r) = s.results.first() else {
            match &s.op {
                Op::Load { .. } | Op::Yield(_) => {}
                _ => unreachable!("crate::attention takes no other statement without results"),
            }
            return;
        };
        let ty = v.value_type(r).clone();
        let to = class(&ty, a.bq);
        let n = count(to);
        let dtype_of = |ops: &[&Operand]| {
            ops.iter()
                .find_map(|o| match o {
                    Operand::Value(x) => Some(v.value_type(x).dtype),
                    Operand::Lit(_) => None,
                })
                .unwrap_or(ty.dtype)
        };
        // Element `i` of an operand broadcast to the result.
        let pick = |w: &mut Self, f: &Frame<'_>, o: &Operand, d: DType, lits: &mut HashMap<u32, String>| -> Vec<String> {
            match o {
                Operand::Lit(l) => {
                    let bits = lit_bits(*l, d);
                    let r = lits.entry(bits).or_insert_with(|| w.imm(bits)).clone();
                    vec![r; n]
                }
                Operand::Value(x) => {
                    let regs = &f.env[x];
                    match class(v.value_type(x), a.bq) {
                        Some(Class::Scalar) => vec![regs[0].clone(); n],
                        Some(Class::Row) if matches!(to, Some(Class::Block(_))) => {
                            (0..n).map(|i| regs[half(i)].clone()).collect()
                        }
                        _ => regs.clone(),
                    }
                }
            }
        };
        let mut lits = HashMap::new();
        let regs: Vec<String> = match &s.op {
            Op::Load { .. } => return,
            Op::ProgramId(axis) | Op::NumPrograms(axis) => {
                let grid = v.grid();
                let x = match axis {
                    AxisRef::Name(name) => grid.iter().position(|g| &g.name == name).expect("verified axis"),
                    AxisRef::Pos(p) => *p,
                };
                if matches!(s.op, Op::ProgramId(_)) {
                    vec![self.coords[x].clone()]
                } else {
                    vec![self.imm(crate::wgmma::fixed(&grid[x]) as u32)]
                }
            }
            Op::Full(l) => vec![self.imm(lit_bits(*l, ty.dtype)); n],
            Op::Zeros => vec![self.imm(0); n],
            Op::Iota { dim } => (0..n)
                .map(|i| {
                    let index = match (to, dim) {
                        (Some(Class::Block(_)), 1) => {
                            let c = self.r();
                            self.insf(format_args!("add.u32 {c}, {}, {}", f.col, column(i)));
                            c
                        }
                        (Some(Class::Block(_)), _) => f.rows[half(i)].clone(),
                        (Some(Class::Row), 0) => f.rows[i].clone(),
                        _ => self.imm(0),
                    };
                    self.cast(DType::I32, ty.dtype, &index)
                })
                .collect(),
            Op::Unary(op, x) => {
                let d = dtype_of(&[x]);
                let xs = pick(self, f, x, d, &mut lits);
                xs.iter().map(|x| self.unary(*op, d, x)).collect()
            }
            Op::Binary(BinaryOp::Add, x, y) if a.folded.as_ref() == Some(r) => {
                let other = if *x == Operand::Value(a.product.clone()) { y } else { x };
                let Operand::Value(o) = other else { unreachable!("crate::attention folds an add of values") };
                let acc: Vec<String> = f.env[o]
                    .clone()
                    .iter()
                    .map(|x| {
                        let r = self.r();
                        self.insf(format_args!("mov.b32 {r}, {x}"));
                        r
                    })
                    .collect();
                self.product(f, &acc);
                acc
            }
            Op::Binary(op, x, y) => {
                let d = dtype_of(&[x, y]);
                let (xs, ys) = (pick(self, f, x, d, &mut lits), pick(self, f, y, d, &mut lits));
                xs.iter().zip(&ys).map(|(x, y)| self.binary(*op, d, x, y)).collect()
            }
            Op::Compare(op, x, y) => {
                let d = dtype_of(&[x, y]);
                let (xs, ys) = (pick(self, f, x, d, &mut lits), pick(self, f, y, d, &mut lits));
                xs.iter().zip(&ys).map(|(x, y)| self.compare(*op, d, x, y)).collect()
            }
            Op::Select(c, x, y) => {
                let d = dtype_of(&[x, y]);
                let cs = pick(self, f, c, DType::Bool, &mut lits);
                let (xs, ys) = (pick(self, f, x, d, &mut lits), pick(self, f, y, d, &mut lits));
                (0..n)
                    .map(|i| {
                        let (p, r) = (self.p(), self.r());
                        self.insf(format_args!("setp.ne.u32 {p}, {}, 0", cs[i]));
                        self.insf(format_args!("selp.b32 {r}, {}, {}, {p}", xs[i], ys[i]));
                        r
                    })
                    .collect()
            }
            Op::Cast(x) => {
                let from = dtype_of(&[x]);
                let xs = pick(self, f, x, from, &mut lits);
                xs.iter().map(|x| self.cast(from, ty.dtype, x)).collect()
            }
            Op::Broadcast(x) => pick(self, f, x, ty.dtype, &mut lits),
            Op::Reshape(x) => pick(self, f, x, ty.dtype, &mut lits),
            Op::Reduce { op, arg, .. } => {
                let Operand::Value(x) = arg else { unreachable!("verifier: reduce of a value") };
                self.row_reduce(*op, ty.dtype, &f.env[x].clone())
            }
            Op::If(ie) => {
                self.register_if(f, s, ie);
                return;
            }
            Op::Dot { .. } if *r == a.scores => {
                self.comment("the scores: q kᵀ on wgmma");
                let acc: Vec<String> = (0..a.bkv / 2).map(|_| self.imm(0)).collect();
                let mma = Mma { dtype: a.dtype, bm: a.bq, bn: a.bkv, bk: a.d, a_k_major: true, b_k_major: true };
                let stage = f.stage.clone();
                self.write_wgmmas(&mma, &f.smem.clone(), (&stage, 0), &acc);
                self.ins("wgmma.wait_group.sync.aligned 0");
                acc
            }
            Op::Dot { a: Operand::Value(p), .. } => {
                self.write_probabilities(f, &f.env[p].clone());
                if a.folded.is_some() {
                    // Multiplied where the add that takes it is.
                    return;
                }
                let acc: Vec<String> = (0..a.dv / 2).map(|_| self.imm(0)).collect();
                self.product(f, &acc);
                acc
            }
            _ => unreachable!("crate::attention takes no other statement"),
        };
        f.env.insert(r.clone(), regs);
    }

    /// `%r, ... = if %c { ... } else { ... }`: the branch taken (the condition is a scalar, the
    /// same for every thread) yields into the results' registers.
    fn register_if(&mut self, f: &mut Frame<'_>, s: &Stmt, ie: &IfElse) {
        let results: Vec<Vec<String>> = s
            .results
            .iter()
            .map(|r| (0..count(class(self.plan.kernel.value_type(r), f.a.bq))).map(|_| self.r()).collect())
            .collect();
        let cond = match &ie.cond {
            Operand::Value(c) => f.env[c][0].clone(),
            Operand::Lit(l) => self.imm(lit_bits(*l, DType::Bool)),
        };
        let (p, other, end) = (self.p(), self.label("else"), self.label("endif"));
        self.insf(format_args!("setp.ne.u32 {p}, {cond}, 0"));
        self.insf(format_args!("@!{p} bra.uni {other}"));
        for (body, label) in [(&ie.then, Some(&end)), (&ie.els, None)] {
            for st in body {
                match &st.op {
                    Op::Yield(values) => {
                        for ((o, regs), r) in values.iter().zip(&results).zip(&s.results) {
                            let xs = self.operand_regs(f, o, r);
                            for (dst, x) in regs.iter().zip(xs) {
                                self.insf(format_args!("mov.b32 {dst}, {x}"));
                            }
                        }
                    }
                    _ => self.statement(f, st),
                }
            }
            if let Some(end) = label {
                self.insf(format_args!("bra.uni {end}"));
                self.place_label(&other);
            }
        }
        self.place_label(&end);
        for (r, regs) in s.results.iter().zip(results) {
            f.env.insert(r.clone(), regs);
        }
    }

    /// `sum`/`max`/`min`/`prod` along the rows of a block: the thread's elements of each row
    /// half in column order, then the four lanes that share the row (`shfl.sync.bfly` by 1 and 2:
    /// each lane combines the same values, so all four agree). 16-bit floats accumulate in `f32`
    /// and round once.
    fn row_reduce(&mut self, op: ReduceOp, d: DType, regs: &[String]) -> Vec<String> {
        let bop = combining(op);
        (0..2)
            .map(|h| {
                let mut mine = (0..regs.len()).filter(|&i| half(i) == h).map(|i| regs[i].clone());
                let mut acc = mine.next().expect("a block has columns");
                for x in mine {
                    acc = self.binary32(bop, d, &acc, &x);
                }
                for lanes in [1, 2] {
                    let other = self.r();
                    self.insf(format_args!("shfl.sync.bfly.b32 {other}, {acc}, {lanes}, 31, -1"));
                    acc = self.binary32(bop, d, &acc, &other);
                }
                self.narrow(d, &acc);
                acc
            })
            .collect()
    }

    /// The probabilities `p` (a `[BQ, BKV]` block of 16-bit floats) into shared memory as a
    /// K-major `wgmma` operand: boxes of 64 columns, each `BQ` rows of 128 bytes, the 16-byte
    /// chunks of row `r` swizzled by `r % 8`.
    fn write_probabilities(&mut self, f: &Frame<'_>, p: &[String]) {
        let a = f.a;
        self.comment("the probabilities to shared memory, as wgmma reads its a operand");
        let lane_bytes = self.r();
        self.insf(format_args!("mul.lo.u32 {lane_bytes}, {}, 2", f.col));
        let mut at = Vec::new();
        for row in &f.rows {
            let (base, swizzle) = (self.r(), self.r());
            self.insf(format_args!("mad.lo.u32 {base}, {row}, {SWIZZLE}, {}", f.smem));
            self.insf(format_args!("add.u32 {base}, {base}, {}", a.q_bytes()));
            self.insf(format_args!("and.b32 {swizzle}, {row}, 7"));
            self.insf(format_args!("shl.b32 {swizzle}, {swizzle}, 4"));
            at.push((base, swizzle));
        }
        for i in (0..p.len()).step_by(2) {
            let j = (i / 4) as u64;
            let (base, swizzle) = &at[half(i)];
            let (chunk, addr) = (self.r(), self.r());
            self.insf(format_args!("xor.b32 {chunk}, {swizzle}, {}", 16 * (j % 8)));
            self.insf(format_args!("add.u32 {addr}, {base}, {}", (j / 8) * a.bq as u64 * SWIZZLE as u64));
            self.insf(format_args!("add.u32 {addr}, {addr}, {chunk}"));
            self.insf(format_args!("add.u32 {addr}, {addr}, {lane_bytes}"));
            let (lo, hi, pair) = (self.h(), self.h(), self.r());
            let t = half_ty(a.dtype);
            self.insf(format_args!("cvt.rn.{t}.f32 {lo}, {}", p[i]));
            self.insf(format_args!("cvt.rn.{t}.f32 {hi}, {}", p[i + 1]));
            self.insf(format_args!("mov.b32 {pair}, {{{lo}, {hi}}}"));
            self.insf(format_args!("st.shared.b32 [{addr}], {pair}"));
        }
        self.ins("fence.proxy.async.shared::cta");
        // The compute warpgroups meet (a producer has no part in this).
        if a.schedule.specialized() {
            self.insf(format_args!("bar.sync 1, {}", a.warpgroups() * THREADS));
        } else {
            self.ins("bar.sync 0");
        }
    }

    /// `acc += P V` on wgmma, the probabilities from shared memory and the value block from this
    /// trip's stage.
    fn product(&mut self, f: &Frame<'_>, acc: &[String]) {
        let a = f.a;
        self.comment("p v on wgmma");
        let mma = Mma { dtype: a.dtype, bm: a.bq, bn: a.dv, bk: a.bkv, a_k_major: true, b_k_major: false };
        let p = self.r();
        self.insf(format_args!("add.u32 {p}, {}, {}", f.smem, a.q_bytes()));
        self.write_wgmmas(&mma, &p, (&f.stage.clone(), a.k_bytes()), acc);
        self.ins("wgmma.wait_group.sync.aligned 0");
    }
}

/// Registers of a value of class `c`.
fn count(c: Option<Class>) -> usize {
    match c {
        Some(Class::Scalar) | None => 1,
        Some(Class::Row) => 2,
        Some(Class::Block(n)) => n / 2,
    }
}
