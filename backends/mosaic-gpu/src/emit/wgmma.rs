//! The PTX of the Hopper path (`crate::wgmma` says which kernels take it and the model): tensor
//! copies into swizzled shared-memory stages, an mbarrier per stage, `wgmma.mma_async` from
//! shared-memory descriptors into `f32` registers, and the epilogue from registers.

use std::collections::HashMap;

use tessel_plugin_api::ir::{DType, Op, Operand};

use super::conv::{f32_imm, half_bits, half_ty};
use super::header::SHARED;
use super::writer::Writer;
use crate::limits::THREADS;
use crate::wgmma::{Epilogue, Gemm, Init, Mma, PRODUCER_REGISTERS, ROW, SWIZZLE, Schedule, WG_ROWS};

/// Bytes from one 8-row group of a swizzle atom to the next: 8 rows of 128 bytes.
const ATOM: u64 = 8 * SWIZZLE as u64;

/// The constant bits of a shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"):
/// leading and stride byte offsets (>> 4, bits 16 and 32) and the swizzle mode of `span` bytes
/// (bits 62-63: 1 for 128, 2 for 64, 3 for 32). The start address (>> 4, bits 0-13) is added
/// per use.
pub(super) fn descriptor_bits(lbo: u64, sbo: u64, span: u32) -> u64 {
    let mode: u64 = match span {
        128 => 1,
        64 => 2,
        32 => 3,
        _ => unreachable!("a swizzle span of 128, 64 or 32 bytes"),
    };
    ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62)
}

impl Writer<'_> {
    pub(super) fn write_gemm(&mut self, g: &Gemm) {
        if g.schedule.specialized() {
            return self.write_gemm_specialized(g);
        }
        let ([tid_x, cta, out], maps) = self.hopper_entry(&g.out);
        let (par, seq) = self.gemm_axes();
        self.decode(&cta, &par);
        self.zero_steps(&seq);
        // The output block is the same at every step: its origin once.
        self.write_origins();
        let origin = self.origin_of(&g.out);
        self.comment(&format!("{} stages of {} bytes, then an mbarrier per stage", g.stages, g.stage_bytes()));
        let smem = self.r();
        self.insf(format_args!("mov.u32 {smem}, {SHARED}"));
        let bars = self.r();
        self.insf(format_args!("add.u32 {bars}, {smem}, {}", g.stages * g.stage_bytes()));
        let leader = self.p();
        self.insf(format_args!("setp.eq.u32 {leader}, {tid_x}, 0"));
        self.init_barriers(&leader, &[(&bars, g.stages, 1)]);
        self.comment(&format!("thread 0 starts the copies of steps 0..{}", g.stages));
        let skip = self.label("prologue");
        self.insf(format_args!("@!{leader} bra {skip}"));
        for s in 0..g.stages {
            let (stage, step) = (self.imm(s as u32), self.imm(s as u32));
            self.issue(g, &maps, &seq, (&stage, &step), (&smem, &bars));
        }
        self.place_label(&skip);
        let acc = self.start_accumulator(g, &out, &origin);
        let (step, top) = (self.r(), self.label("step"));
        self.insf(format_args!("mov.u32 {step}, 0"));
        self.place_label(&top);
        self.multiply_stage(g, &step, (&smem, &bars), &acc);
        self.comment("this step's wgmmas stay in flight; the previous step's are done, so once every");
        self.comment("warpgroup is past them thread 0 refills their stage with the step `stages` later");
        self.ins("wgmma.wait_group.sync.aligned 1");
        self.ins("bar.sync 0");
        let (next, more, started) = (self.r(), self.p(), self.p());
        self.insf(format_args!("add.u32 {next}, {step}, {}", g.stages - 1));
        self.insf(format_args!("setp.lt.u32 {more}, {next}, {}", g.steps));
        self.insf(format_args!("setp.ne.u32 {started}, {step}, 0"));
        self.insf(format_args!("and.pred {more}, {more}, {started}"));
        self.insf(format_args!("and.pred {more}, {more}, {leader}"));
        let skip = self.label("refill");
        self.insf(format_args!("@!{more} bra {skip}"));
        let previous = self.r();
        self.insf(format_args!("rem.u32 {previous}, {next}, {}", g.stages));
        self.issue(g, &maps, &seq, (&previous, &next), (&smem, &bars));
        self.place_label(&skip);
        self.insf(format_args!("add.u32 {step}, {step}, 1"));
        let again = self.p();
        self.insf(format_args!("setp.lt.u32 {again}, {step}, {}", g.steps));
        self.insf(format_args!("@{again} bra.uni {top}"));
        self.ins("wgmma.wait_group.sync.aligned 0");
        self.finish_gemm(g, &out, &origin);
    }

    /// The warp-specialized kernel ([`Schedule::Specialized`], [`Schedule::Persistent`]): the
    /// last warpgroup produces, one thread of it issuing every step's copies into the stages
    /// in turn, each once its consumers have released it; the others consume, each step
    /// waiting for its stage to fill, multiplying, and releasing the stage of the step before
    /// once its `wgmma`s retire. Stage `i % stages` serves the CTA's `i`-th step, counted across
    /// the output blocks a persistent CTA loops over, so its `full` mbarrier completes phase
    /// `i / stages` when step `i`'s bytes land and its `empty` one when the consumers are done.
    fn write_gemm_specialized(&mut self, g: &Gemm) {
        let ([tid_x, cta, out], maps) = self.hopper_entry(&g.out);
        let (par, seq) = self.gemm_axes();
        let blocks: u64 = par.iter().map(|&a| crate::wgmma::fixed(&self.plan.kernel.grid()[a])).product();
        let persistent = g.schedule == Schedule::Persistent;
        let consumers = g.warpgroups();
        self.comment(&format!(
            "{} stages of {} bytes, then their full and their empty mbarriers; warpgroup {consumers} produces",
            g.stages,
            g.stage_bytes()
        ));
        let (smem, full, empty) = (self.r(), self.r(), self.r());
        self.insf(format_args!("mov.u32 {smem}, {SHARED}"));
        self.insf(format_args!("add.u32 {full}, {smem}, {}", g.stages * g.stage_bytes()));
        self.insf(format_args!("add.u32 {empty}, {full}, {}", 8 * g.stages));
        let leader = self.p();
        self.insf(format_args!("setp.eq.u32 {leader}, {tid_x}, 0"));
        self.init_barriers(&leader, &[(&full, g.stages, 1), (&empty, g.stages, consumers * THREADS)]);
        let end = self.label("end");
        let consume = self.producer_start(&end, "issues the copies");
        let issued = self.r();
        self.insf(format_args!("mov.u32 {issued}, 0"));
        self.over_blocks(&cta, persistent, blocks, |w, block| {
            w.decode(block, &par);
            w.over_steps(g, |w, step| {
                let stage = w.reusable_stage(g.stages, &issued, &empty);
                w.issue(g, &maps, &seq, (&stage, step), (&smem, &full));
                w.insf(format_args!("add.u32 {issued}, {issued}, 1"));
            });
        });
        self.consumers_start(&consume, &end, "the products");
        let done = self.r();
        self.insf(format_args!("mov.u32 {done}, 0"));
        self.over_blocks(&cta, persistent, blocks, |w, block| {
            w.decode(block, &par);
            w.zero_steps(&seq);
            w.write_origins();
            let origin = w.origin_of(&g.out);
            let acc = w.start_accumulator(g, &out, &origin);
            w.over_steps(g, |w, step| {
                w.multiply_stage(g, &done, (&smem, &full), &acc);
                w.comment("the step before's wgmmas are done: release its stage");
                w.ins("wgmma.wait_group.sync.aligned 1");
                let (first, skip) = (w.p(), w.label("released"));
                w.insf(format_args!("setp.eq.u32 {first}, {step}, 0"));
                w.insf(format_args!("@{first} bra {skip}"));
                w.release(g, &done, &empty);
                w.place_label(&skip);
                w.insf(format_args!("add.u32 {done}, {done}, 1"));
            });
            w.ins("wgmma.wait_group.sync.aligned 0");
            w.release(g, &done, &empty);
            w.finish_gemm(g, &out, &origin);
        });
        self.place_label(&end);
    }

    /// The CTA's `step`-th step: once its stage's `full` mbarrier (in `bars`) says the operands
    /// landed, its `wgmma`s into `acc`, committed as one group.
    fn multiply_stage(&mut self, g: &Gemm, step: &str, (smem, bars): (&str, &str), acc: &[String]) {
        let (stage, parity) = self.stage_of(g.stages, step, 0);
        let (bar, base) = (self.r(), self.r());
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {bars}"));
        self.insf(format_args!("mad.lo.u32 {base}, {stage}, {}, {smem}", g.stage_bytes()));
        self.comment("wait for this step's operands");
        self.wait_phase(&bar, &parity);
        self.write_wgmmas(&g.mma(), &base, (&base, g.a_bytes()), acc);
    }

    /// Where a warp-specialized kernel splits: the last warpgroup (the producer) gives its
    /// registers back to the pool and all its threads but the first go to `end`; the producer's
    /// code (which `doing` describes) follows. Returns the label the consumers start at
    /// ([`Writer::consumers_start`]).
    pub(super) fn producer_start(&mut self, end: &str, doing: &str) -> String {
        let (producers, _, _) = self.plan.specialized().expect("a warp-specialized plan");
        let (producer, consume) = (self.p(), self.label("consume"));
        self.insf(format_args!("setp.eq.u32 {producer}, {}, {producers}", self.warpgroup.clone()));
        self.insf(format_args!("@!{producer} bra {consume}"));
        self.comment(&format!("the producer: its registers to the pool, then thread 0 of it {doing}"));
        self.insf(format_args!("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGISTERS}"));
        let idle = self.p();
        self.insf(format_args!("setp.ne.u32 {idle}, {}, 0", self.tid.clone()));
        self.insf(format_args!("@{idle} bra {end}"));
        consume
    }

    /// After the producer's code: it goes to `end`; the consumers start at `consume`, taking the
    /// producer's registers (`setmaxnreg.inc`, where there is more than they have), then do
    /// what `doing` says.
    pub(super) fn consumers_start(&mut self, consume: &str, end: &str, doing: &str) {
        let (_, entry, consumer) = self.plan.specialized().expect("a warp-specialized plan");
        self.insf(format_args!("bra.uni {end}"));
        self.place_label(consume);
        self.comment(&format!("the consumers: the producer's registers, then {doing}"));
        if consumer > entry {
            self.insf(format_args!("setmaxnreg.inc.sync.aligned.u32 {consumer}"));
        }
    }

    /// The parallel and the `seq` grid axes of a Hopper kernel.
    fn gemm_axes(&mut self) -> (Vec<usize>, Vec<usize>) {
        let grid = self.plan.kernel.grid().to_vec();
        let par: Vec<usize> = (0..grid.len()).filter(|&a| !grid[a].seq).collect();
        let seq: Vec<usize> = (0..grid.len()).filter(|&a| grid[a].seq).collect();
        self.coords = grid.iter().map(|_| String::new()).collect();
        (par, seq)
    }

    /// The `seq` coordinates at 0, where the output block (which does not follow them) is placed.
    fn zero_steps(&mut self, seq: &[usize]) {
        for &a in seq {
            self.coords[a] = self.imm(0);
        }
    }

    /// Thread 0 makes `n` mbarriers of `count` arrivals from each `(address, n, count)`, then
    /// the CTA meets, so that no thread waits on one before it exists.
    fn init_barriers(&mut self, leader: &str, sets: &[(&str, u64, u32)]) {
        let skip = self.label("init");
        self.insf(format_args!("@!{leader} bra {skip}"));
        for &(bars, n, count) in sets {
            for s in 0..n {
                let bar = self.r();
                self.insf(format_args!("add.u32 {bar}, {bars}, {}", 8 * s));
                self.insf(format_args!("mbarrier.init.shared::cta.b64 [{bar}], {count}"));
            }
        }
        self.ins("fence.mbarrier_init.release.cluster");
        self.ins("fence.proxy.async.shared::cta");
        self.place_label(&skip);
        self.ins("bar.sync 0");
    }

    /// The stage of the `step`-th step and the parity of the phase to wait for: that of its
    /// round through the stages, `behind` rounds before.
    pub(super) fn stage_of(&mut self, stages: u64, step: &str, behind: u64) -> (String, String) {
        let (stage, parity) = (self.r(), self.r());
        self.insf(format_args!("rem.u32 {stage}, {step}, {stages}"));
        self.insf(format_args!("div.u32 {parity}, {step}, {stages}"));
        if behind % 2 == 1 {
            self.insf(format_args!("add.u32 {parity}, {parity}, 1"));
        }
        self.insf(format_args!("and.b32 {parity}, {parity}, 1"));
        (stage, parity)
    }

    /// The producer's stage for its `n`-th copy, once its consumers are done with it: from the
    /// `stages`-th copy on, a wait on the stage's `empty` mbarrier (at `empty`) for the phase
    /// of the copy `stages` before.
    pub(super) fn reusable_stage(&mut self, stages: u64, n: &str, empty: &str) -> String {
        let (stage, parity) = self.stage_of(stages, n, 1);
        let (reuse, fill) = (self.p(), self.label("fill"));
        self.insf(format_args!("setp.ge.u32 {reuse}, {n}, {stages}"));
        self.insf(format_args!("@!{reuse} bra {fill}"));
        self.comment("wait until the consumers are done with the stage's previous use");
        let bar = self.r();
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {empty}"));
        self.wait_phase(&bar, &parity);
        self.place_label(&fill);
        stage
    }

    /// Every thread of the consumers arrives on the `empty` mbarrier of the stage of step
    /// `done - 1`.
    fn release(&mut self, g: &Gemm, done: &str, empty: &str) {
        let (stage, bar, state) = (self.r(), self.r(), self.rd());
        self.insf(format_args!("add.u32 {stage}, {done}, {}", g.stages - 1));
        self.insf(format_args!("rem.u32 {stage}, {stage}, {}", g.stages));
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {empty}"));
        self.insf(format_args!("mbarrier.arrive.shared::cta.b64 {state}, [{bar}]"));
    }

    /// `body` once per output block the CTA owns: its own (`%ctaid.x`), or on a persistent grid
    /// `%ctaid.x`, `+ %nctaid.x`, ... below `blocks`.
    fn over_blocks(&mut self, cta: &str, persistent: bool, blocks: u64, body: impl FnOnce(&mut Self, &str)) {
        if !persistent {
            return body(self, cta);
        }
        let stride = self.r();
        self.insf(format_args!("mov.u32 {stride}, %nctaid.x"));
        self.count(cta, blocks as usize, &stride, true, ("block", "blocks_done"), body);
    }

    /// `body` for each of the `seq` steps, given the step's register.
    fn over_steps(&mut self, g: &Gemm, body: impl FnOnce(&mut Self, &str)) {
        let (step, top, again) = (self.r(), self.label("step"), self.p());
        self.insf(format_args!("mov.u32 {step}, 0"));
        self.place_label(&top);
        body(self, &step);
        self.insf(format_args!("add.u32 {step}, {step}, 1"));
        self.insf(format_args!("setp.lt.u32 {again}, {step}, {}", g.steps));
        self.insf(format_args!("@{again} bra.uni {top}"));
    }

    /// The accumulator's registers (register i of a thread is the element `Wgmma` fragment i
    /// says), at zero or from the output block.
    fn start_accumulator(&mut self, g: &Gemm, out: &str, origin: &[String]) -> Vec<String> {
        let acc: Vec<String> = (1..=g.bn / 2).map(|i| format!("%f{i}")).collect();
        for f in &acc {
            self.insf(format_args!("mov.b32 {f}, 0f00000000"));
        }
        if g.init == Init::Output {
            self.comment("the accumulator starts from the output block");
            let frag = self.fragment((&g.out, g.bn), out, origin);
            for at in &frag.places {
                let (ok, addr) = self.address(&frag, at);
                match &at.regs[..] {
                    [x, y] => self.insf(format_args!("@{ok} ld.global.v2.b32 {{{x}, {y}}}, [{addr}]")),
                    _ => self.insf(format_args!("@{ok} ld.global.b32 {}, [{addr}]", at.regs[0])),
                }
            }
        }
        acc
    }

    /// After the last step's `wgmma`s retire: the epilogue, and the accumulator to the output
    /// block at `origin`, from registers.
    fn finish_gemm(&mut self, g: &Gemm, out: &str, origin: &[String]) {
        self.comment("the epilogue: the accumulator to the output, from registers");
        let dtype = g.out_dtype;
        let inputs = self.epilogue_inputs(g);
        let frag = self.fragment((&g.out, g.bn), out, origin);
        let epilogue = g.epilogue.as_ref().filter(|e| !e.stmts.is_empty());
        // The epilogue a few column pairs at a time, statement by statement across them: their
        // independent chains interleave, where one element at a time would wait on each result.
        let mut loaded = HashMap::new();
        for group in frag.places.chunks(if epilogue.is_some() { EPILOGUE_GROUP } else { 1 }) {
            let values: Vec<Vec<String>> = match epilogue {
                Some(e) => {
                    let elements: Vec<Element> = group
                        .iter()
                        .flat_map(|at| {
                            at.regs.iter().enumerate().map(|(j, x)| Element {
                                acc: x.clone(),
                                half: at.half,
                                column: at.column + j,
                            })
                        })
                        .collect();
                    let mut v = self.epilogue(e, &frag, &inputs, &mut loaded, &elements).into_iter();
                    group.iter().map(|at| at.regs.iter().map(|_| v.next().expect("a value per element")).collect()).collect()
                }
                None => group.iter().map(|at| at.regs.clone()).collect(),
            };
            for (at, f) in group.iter().zip(values) {
                let (ok, addr) = self.address(&frag, at);
                self.store_pair(dtype, &ok, &addr, &f);
            }
        }
    }

    /// The start of both Hopper paths' kernels: `%tid.x`, `%ctaid.x` and the output's global
    /// address (`[tid_x, cta, out]`), and the address of each tensor map parameter.
    pub(super) fn hopper_entry(&mut self, output: &str) -> ([String; 3], Vec<String>) {
        let plan = self.plan;
        let entry = plan.entry.clone();
        let (tid_x, cta) = self.write_ids();
        let out = self.rd();
        self.insf(format_args!("ld.param.u64 {out}, [{entry}_{output}]"));
        self.insf(format_args!("cvta.to.global.u64 {out}, {out}"));
        let maps: Vec<String> = (plan.tensor_maps().iter())
            .map(|m| {
                let r = self.rd();
                self.insf(format_args!("mov.b64 {r}, {entry}_{}", m.param));
                self.insf(format_args!("cvta.param.u64 {r}, {r}"));
                r
            })
            .collect();
        ([tid_x, cta, out], maps)
    }

    /// Registers `f` (one element, or a column pair) to the output at `addr` where `ok`, in its
    /// dtype.
    pub(super) fn store_pair(&mut self, dtype: DType, ok: &str, addr: &str, f: &[String]) {
        if half_bits(dtype) {
            let h: Vec<String> = f.iter().map(|_| self.h()).collect();
            for (h, x) in h.iter().zip(f) {
                self.insf(format_args!("cvt.rn.{}.f32 {h}, {x}", half_ty(dtype)));
            }
            match &h[..] {
                [lo, hi] => {
                    let pair = self.r();
                    self.insf(format_args!("mov.b32 {pair}, {{{lo}, {hi}}}"));
                    self.insf(format_args!("@{ok} st.global.b32 [{addr}], {pair}"));
                }
                _ => self.insf(format_args!("@{ok} st.global.b16 [{addr}], {}", h[0])),
            }
        } else {
            match f {
                [x, y] => self.insf(format_args!("@{ok} st.global.v2.b32 [{addr}], {{{x}, {y}}}")),
                _ => self.insf(format_args!("@{ok} st.global.b32 [{addr}], {}", f[0])),
            }
        }
    }

    /// The global address of every input the epilogue loads, by name.
    fn epilogue_inputs(&mut self, g: &Gemm) -> HashMap<String, String> {
        let entry = self.plan.entry.clone();
        let mut inputs = HashMap::new();
        for s in g.epilogue.iter().flat_map(|e| &e.stmts) {
            if let Op::Load { src, .. } = &s.op {
                if !inputs.contains_key(src) {
                    let r = self.rd();
                    self.insf(format_args!("ld.param.u64 {r}, [{entry}_{src}]"));
                    self.insf(format_args!("cvta.to.global.u64 {r}, {r}"));
                    inputs.insert(src.clone(), r);
                }
            }
        }
        inputs
    }

    /// The epilogue of accumulator `elements`, in `f32`: each statement on every element before
    /// the next statement (numpy's broadcasting picks the element of a loaded block: index 0
    /// along its dimensions of one), as the general path computes it. Elements of other inputs
    /// already `loaded` (by input, row half and column, where the address depends on them) are
    /// not loaded again.
    fn epilogue(
        &mut self,
        e: &Epilogue,
        frag: &Fragment,
        inputs: &HashMap<String, String>,
        loaded: &mut HashMap<(String, Option<usize>, Option<usize>), String>,
        elements: &[Element],
    ) -> Vec<String> {
        let mut env: Vec<HashMap<&str, String>> =
            elements.iter().map(|el| HashMap::from([(e.acc.as_str(), el.acc.clone())])).collect();
        let mut literals: HashMap<u32, String> = HashMap::new();
        for s in &e.stmts {
            for (env, el) in env.iter_mut().zip(elements) {
                let mut val = |w: &mut Self, o: &Operand| match o {
                    Operand::Value(x) => env[x.as_str()].clone(),
                    Operand::Lit(l) => {
                        let bits = (l.as_f64() as f32).to_bits();
                        literals
                            .entry(bits)
                            .or_insert_with(|| {
                                let r = w.r();
                                w.insf(format_args!("mov.b32 {r}, {}", f32_imm(f32::from_bits(bits))));
                                r
                            })
                            .clone()
                    }
                };
                let v = match &s.op {
                    Op::Load { src, .. } => {
                        let block = self.plan.kernel.kernel().param(src).expect("a verified argument").block_shape();
                        // What the element's address depends on: its row where the block has
                        // rows, its column where it has columns.
                        let by_row = (block.len() == 2 && block[0] > 1).then_some(el.half);
                        let by_column = block.last().is_some_and(|&b| b > 1).then_some(el.column);
                        let key = (src.clone(), by_row, by_column);
                        match loaded.get(&key) {
                            Some(v) => v.clone(),
                            None => {
                                let row = frag.rows[el.half].0.clone();
                                let col = self.r();
                                self.insf(format_args!("add.u32 {col}, {}, {}", frag.lcol, el.column));
                                let v = self.epilogue_load(src, &inputs[src], &row, &col);
                                loaded.insert(key, v.clone());
                                v
                            }
                        }
                    }
                    Op::Unary(op, x) => {
                        let x = val(self, x);
                        self.unary(*op, DType::F32, &x)
                    }
                    Op::Binary(op, x, y) => {
                        let (x, y) = (val(self, x), val(self, y));
                        self.binary(*op, DType::F32, &x, &y)
                    }
                    Op::Compare(op, x, y) => {
                        let (x, y) = (val(self, x), val(self, y));
                        self.compare(*op, DType::F32, &x, &y)
                    }
                    Op::Select(c, x, y) => {
                        let (c, x, y) = (val(self, c), val(self, x), val(self, y));
                        let (p, v) = (self.p(), self.r());
                        self.insf(format_args!("setp.ne.u32 {p}, {c}, 0"));
                        self.insf(format_args!("selp.b32 {v}, {x}, {y}, {p}"));
                        v
                    }
                    // To `f32` from a value held in `f32` already (16-bit floats are): the same bits.
                    Op::Cast(x) | Op::Broadcast(x) => val(self, x),
                    _ => unreachable!("the Hopper path's epilogue takes elementwise statements only (crate::wgmma)"),
                };
                env.insert(s.results[0].as_str(), v);
            }
        }
        env.iter().map(|env| env[e.stored.as_str()].clone()).collect()
    }

    /// The element of input `name`'s block (a whole load, zeros outside the array) that
    /// broadcasts to `row` and `col` of the output block, as an `f32`.
    fn epilogue_load(&mut self, name: &str, base: &str, row: &str, col: &str) -> String {
        let p = self.plan.kernel.kernel().param(name).expect("a verified argument");
        let (dims, block) = (p.ty.shape.clone(), p.block_shape());
        let origin = self.origin_of(name);
        let local = [row, col];
        let local = &local[2 - block.len()..];
        let (ok, linear) = (self.p(), self.r());
        self.insf(format_args!("setp.eq.u32 {ok}, 0, 0"));
        self.insf(format_args!("mov.b32 {linear}, 0"));
        for (d, (&b, l)) in block.iter().zip(local).enumerate() {
            let (i, inside) = (self.r(), self.p());
            if b == 1 {
                self.insf(format_args!("mov.b32 {i}, {}", origin[d]));
            } else {
                self.insf(format_args!("add.s32 {i}, {}, {l}", origin[d]));
            }
            self.insf(format_args!("setp.lt.u32 {inside}, {i}, {}", dims[d]));
            self.insf(format_args!("and.pred {ok}, {ok}, {inside}"));
            self.insf(format_args!("mad.lo.u32 {linear}, {linear}, {}, {i}", dims[d]));
        }
        let (at, v) = (self.rd(), self.r());
        let bytes = if half_bits(p.ty.dtype) { 2 } else { 4 };
        self.insf(format_args!("mul.wide.u32 {at}, {linear}, {bytes}"));
        self.insf(format_args!("add.u64 {at}, {base}, {at}"));
        self.insf(format_args!("mov.b32 {v}, 0f00000000"));
        if half_bits(p.ty.dtype) {
            let h = self.h();
            self.insf(format_args!("mov.b16 {h}, 0"));
            self.insf(format_args!("@{ok} ld.global.b16 {h}, [{at}]"));
            self.insf(format_args!("cvt.f32.{} {v}, {h}", half_ty(p.ty.dtype)));
        } else {
            self.insf(format_args!("@{ok} ld.global.b32 {v}, [{at}]"));
        }
        v
    }

    /// Thread 0's copies of step `step`'s operand blocks into stage `stage`, announced to the
    /// stage's mbarrier as the bytes it will receive.
    fn issue(&mut self, g: &Gemm, maps: &[String], seq: &[usize], (stage, step): (&str, &str), (smem, bars): (&str, &str)) {
        self.decode(step, seq);
        self.write_origins();
        let (bar, base) = (self.r(), self.r());
        self.insf(format_args!("mad.lo.u32 {bar}, {stage}, 8, {bars}"));
        self.insf(format_args!("mad.lo.u32 {base}, {stage}, {}, {smem}", g.stage_bytes()));
        let state = self.rd();
        self.insf(format_args!("mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{bar}], {}", g.stage_bytes()));
        let (na, nb) = g.boxes();
        for (map, (spec, boxes, offset)) in maps.iter().zip([(&g.maps[0], na, 0), (&g.maps[1], nb, g.a_bytes())]) {
            // A box is the block's rows by 64 elements; the block's boxes lie one after another.
            let rows = u64::from(spec.boxes[1]);
            let origin = self.origin_of(&spec.array);
            for j in 0..boxes as u64 {
                let (dst, x) = (self.r(), self.r());
                self.insf(format_args!("add.u32 {dst}, {base}, {}", offset + j * rows * SWIZZLE as u64));
                self.insf(format_args!("add.s32 {x}, {}, {}", origin[1], j * ROW as u64));
                self.tensor_copy(&dst, map, (&x, &origin[0]), &bar);
            }
        }
    }

    /// A tensor copy of the box at coordinates (`x` along the contiguous dimension, `y`) of
    /// `map` to shared address `dst`, its bytes counted on the mbarrier at `bar`.
    pub(super) fn tensor_copy(&mut self, dst: &str, map: &str, (x, y): (&str, &str), bar: &str) {
        self.insf(format_args!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{x}, {y}}}], [{bar}]"
        ));
    }

    /// One step's `wgmma`s: the warpgroup's 64 rows of `a` (its boxes from `base`) times `b`
    /// (at `b_at + b_offset`), 16 of the contraction each, committed as one group.
    pub(super) fn write_wgmmas(&mut self, g: &Mma, base: &str, (b_at, b_offset): (&str, u64), acc: &[String]) {
        let (abase, bbase) = (self.r(), self.r());
        let wg = self.warpgroup.clone();
        // A warpgroup's rows start 64 rows (8 atoms) into every box of a K-major `a`; of an
        // M-major one, they are a box of their own (64 columns of M by `bk` rows).
        let wg_offset = if g.a_k_major { WG_ROWS as u64 / 8 * ATOM } else { g.bk as u64 * SWIZZLE as u64 };
        self.insf(format_args!("mad.lo.u32 {abase}, {wg}, {wg_offset}, {base}"));
        self.insf(format_args!("add.u32 {bbase}, {b_at}, {b_offset}"));
        let one = self.p();
        self.insf(format_args!("setp.eq.u32 {one}, {wg}, {wg}"));
        self.ins("wgmma.fence.sync.aligned");
        let ty = half_ty(g.dtype);
        let (bm, bn, bk) = (g.bm as u64, g.bn as u64, g.bk as u64);
        for kk in (0..bk).step_by(16) {
            let a = if g.a_k_major {
                // K-major `a`: box kk / 64 of `bm` rows, kk % 64 elements into each 128-byte row.
                self.descriptor(&abase, (kk / ROW as u64) * bm * SWIZZLE as u64 + (kk % ROW as u64) * 2, 16, ATOM)
            } else {
                // M-major `a`: K rows of 128 bytes (the warpgroup's 64 of M), read transposed.
                self.descriptor(&abase, kk * SWIZZLE as u64, bk * SWIZZLE as u64, ATOM)
            };
            let b = if g.b_k_major {
                self.descriptor(&bbase, (kk / ROW as u64) * bn * SWIZZLE as u64 + (kk % ROW as u64) * 2, 16, ATOM)
            } else {
                // N-major `b`: K rows of 128 bytes; the boxes of 64 columns `bk` rows apart.
                self.descriptor(&bbase, kk * SWIZZLE as u64, bk * SWIZZLE as u64, ATOM)
            };
            let (trans_a, trans_b) = (u8::from(!g.a_k_major), u8::from(!g.b_k_major));
            self.insf(format_args!(
                "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty} {{{}}}, {a}, {b}, {one}, 1, 1, {trans_a}, {trans_b}",
                acc.join(", ")
            ));
        }
        self.ins("wgmma.commit_group.sync.aligned");
    }

    /// A descriptor of the matrix at shared address `base + offset`.
    fn descriptor(&mut self, base: &str, offset: u64, lbo: u64, sbo: u64) -> String {
        let (addr, d) = (self.r(), self.rd());
        self.insf(format_args!("add.u32 {addr}, {base}, {offset}"));
        self.insf(format_args!("shr.u32 {addr}, {addr}, 4"));
        self.insf(format_args!("cvt.u64.u32 {d}, {addr}"));
        self.insf(format_args!("or.b64 {d}, {d}, {:#018x}", descriptor_bits(lbo, sbo, SWIZZLE)));
        d
    }

    /// The thread's accumulator registers and where their elements go in the output block
    /// (warp `w` of the warpgroup: rows 16w + lane/4, +8; columns 2 (lane % 4) + 8j, +1). Where
    /// rows have an even number of elements, the two registers of each column pair go together
    /// (one 8- or 4-byte access, aligned: the pair starts on an even column, and both are inside
    /// the array or neither); else one at a time. Only what every place shares is computed here;
    /// each place's address is computed where it is used ([`Writer::address`]), so that few
    /// registers live at once.
    pub(super) fn fragment(&mut self, (name, bn): (&str, usize), out: &str, origin: &[String]) -> Fragment {
        let k = self.plan.kernel.kernel();
        let p = k.param(name).expect("verified argument");
        let dims = p.ty.shape.clone();
        let bytes = if half_bits(p.ty.dtype) { 2 } else { 4 };
        let (lrow, lcol) = self.fragment_origin();
        let col0 = self.r();
        self.insf(format_args!("add.u32 {col0}, {lcol}, {}", origin[1]));
        let mut rows = Vec::new();
        for half in 0..2 {
            let (local, r, inside, at) = (self.r(), self.r(), self.p(), self.rd());
            self.insf(format_args!("add.u32 {local}, {lrow}, {}", 8 * half));
            self.insf(format_args!("add.u32 {r}, {local}, {}", origin[0]));
            self.insf(format_args!("setp.lt.u32 {inside}, {r}, {}", dims[0]));
            self.insf(format_args!("mul.wide.u32 {at}, {r}, {}", dims[1] * bytes));
            self.insf(format_args!("add.u64 {at}, {out}, {at}"));
            rows.push((local, inside, at));
        }
        let together = if dims[1].is_multiple_of(2) { 2 } else { 1 };
        let places = (0..bn / 2)
            .step_by(together)
            .map(|i| Place {
                regs: (i..i + together).map(|j| format!("%f{}", j + 1)).collect(),
                half: (i / 2) % 2,
                column: 8 * (i / 4) + i % 2,
            })
            .collect();
        Fragment { lcol, col0, rows, places, columns: dims[1], bytes }
    }

    /// The block-local row and column of the thread's first accumulator register: warp `w` of
    /// warpgroup `g` holds rows `64 g + 16 w + lane / 4` (and 8 below), columns from `2 (lane % 4)`.
    pub(super) fn fragment_origin(&mut self) -> (String, String) {
        let (lane, wg) = (self.tid.clone(), self.warpgroup.clone());
        let (lrow, lcol, t) = (self.r(), self.r(), self.r());
        self.insf(format_args!("mul.lo.u32 {lrow}, {wg}, {WG_ROWS}"));
        self.insf(format_args!("div.u32 {t}, {lane}, 32"));
        self.insf(format_args!("mad.lo.u32 {lrow}, {t}, 16, {lrow}"));
        self.insf(format_args!("rem.u32 {t}, {lane}, 32"));
        self.insf(format_args!("div.u32 {t}, {t}, 4"));
        self.insf(format_args!("add.u32 {lrow}, {lrow}, {t}"));
        self.insf(format_args!("rem.u32 {t}, {lane}, 4"));
        self.insf(format_args!("mul.lo.u32 {lcol}, {t}, 2"));
        (lrow, lcol)
    }

    /// Waits until the mbarrier at `bar` completes the phase of `parity`.
    pub(super) fn wait_phase(&mut self, bar: &str, parity: &str) {
        let (wait, ready) = (self.label("wait"), self.p());
        self.place_label(&wait);
        self.insf(format_args!("mbarrier.try_wait.parity.shared::cta.b64 {ready}, [{bar}], {parity}"));
        self.insf(format_args!("@!{ready} bra {wait}"));
    }

    /// Whether place `at` lies inside the output array, and its first element's address.
    pub(super) fn address(&mut self, frag: &Fragment, at: &Place) -> (String, String) {
        let (_, inside, row) = &frag.rows[at.half];
        let (c, ok, wide, addr) = (self.r(), self.p(), self.rd(), self.rd());
        self.insf(format_args!("add.u32 {c}, {}, {}", frag.col0, at.column));
        self.insf(format_args!("setp.lt.u32 {ok}, {c}, {}", frag.columns));
        self.insf(format_args!("and.pred {ok}, {ok}, {inside}"));
        self.insf(format_args!("mul.wide.u32 {wide}, {c}, {}", frag.bytes));
        self.insf(format_args!("add.u64 {addr}, {row}, {wide}"));
        (ok, addr)
    }
}

/// Column pairs whose epilogue is written together, statement by statement.
const EPILOGUE_GROUP: usize = 8;

/// What the places of a thread's accumulator registers share.
pub(super) struct Fragment {
    /// The block-local column of the thread's first register, and its column in the array.
    pub(super) lcol: String,
    col0: String,
    /// Per row half: the block-local row, whether it is inside the array, its row's address.
    pub(super) rows: Vec<(String, String, String)>,
    pub(super) places: Vec<Place>,
    /// The output's columns, and bytes an element.
    columns: usize,
    bytes: usize,
}

/// One or two of a thread's accumulator registers: a column pair in one row half.
pub(super) struct Place {
    pub(super) regs: Vec<String>,
    /// Row half (0: the first 8 rows of the warp's 16, 1: the others).
    pub(super) half: usize,
    /// The first one's column, from the thread's first column.
    pub(super) column: usize,
}

/// One accumulator element for the epilogue.
struct Element {
    acc: String,
    half: usize,
    /// Its column, from the thread's first column.
    column: usize,
}
