//! The PTX of the Hopper path (`crate::wgmma` says which kernels take it and the model): tensor
//! copies into swizzled shared-memory stages, an mbarrier per stage, `wgmma.mma_async` from
//! shared-memory descriptors into `f32` registers, and the epilogue from registers.

use std::collections::HashMap;

use tessel_plugin_api::ir::{DType, Op, Operand};

use super::conv::{f32_imm, half_bits, half_ty};
use super::header::SHARED;
use super::writer::Writer;
use crate::wgmma::{Epilogue, Gemm, Init, ROW, SWIZZLE, WG_ROWS};

/// Bytes from one 8-row group of a swizzle atom to the next: 8 rows of 128 bytes.
const ATOM: u64 = 8 * SWIZZLE as u64;

/// The constant bits of a shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"):
/// leading and stride byte offsets (>> 4, bits 16 and 32) and the 128-byte swizzle mode (1 in
/// bits 62-63). The start address (>> 4, bits 0-13) is added per use.
fn descriptor_bits(lbo: u64, sbo: u64) -> u64 {
    ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)
}

impl Writer<'_> {
    pub(super) fn write_gemm(&mut self, g: &Gemm) {
        let plan = self.plan;
        let entry = plan.entry.clone();
        let (tid_x, cta) = self.write_ids();
        let out = self.rd();
        self.ins(format!("ld.param.u64 {out}, [{entry}_{}]", g.out));
        self.ins(format!("cvta.to.global.u64 {out}, {out}"));
        let maps: Vec<String> = (g.maps.iter())
            .map(|m| {
                let r = self.rd();
                self.ins(format!("mov.b64 {r}, {entry}_{}_map", m.array));
                self.ins(format!("cvta.param.u64 {r}, {r}"));
                r
            })
            .collect();
        let grid = plan.kernel.grid().to_vec();
        let par: Vec<usize> = (0..grid.len()).filter(|&a| !grid[a].seq).collect();
        let seq: Vec<usize> = (0..grid.len()).filter(|&a| grid[a].seq).collect();
        self.coords = grid.iter().map(|_| String::new()).collect();
        self.decode(&cta, &par);
        for &a in &seq {
            self.coords[a] = self.imm(0);
        }
        // The output block is the same at every step: its origin once.
        self.write_origins();
        let origin = self.origin_of(&g.out);
        self.comment(&format!("{} stages of {} bytes, then an mbarrier per stage", g.stages, g.stage_bytes()));
        let smem = self.r();
        self.ins(format!("mov.u32 {smem}, {SHARED}"));
        let bars = self.r();
        self.ins(format!("add.u32 {bars}, {smem}, {}", g.stages * g.stage_bytes()));
        let leader = self.p();
        self.ins(format!("setp.eq.u32 {leader}, {tid_x}, 0"));
        let skip = self.label("init");
        self.ins(format!("@!{leader} bra {skip}"));
        for s in 0..g.stages {
            let bar = self.r();
            self.ins(format!("add.u32 {bar}, {bars}, {}", 8 * s));
            self.ins(format!("mbarrier.init.shared::cta.b64 [{bar}], 1"));
        }
        self.ins("fence.mbarrier_init.release.cluster");
        self.ins("fence.proxy.async.shared::cta");
        self.place_label(&skip);
        self.ins("bar.sync 0");
        self.comment(&format!("thread 0 starts the copies of steps 0..{}", g.stages));
        let skip = self.label("prologue");
        self.ins(format!("@!{leader} bra {skip}"));
        for s in 0..g.stages {
            let (stage, step) = (self.imm(s as u32), self.imm(s as u32));
            self.issue(g, &maps, &seq, (&stage, &step), (&smem, &bars));
        }
        self.place_label(&skip);
        // The accumulator: register i of a thread is the element `Wgmma` fragment i says.
        let acc: Vec<String> = (1..=g.bn / 2).map(|i| format!("%f{i}")).collect();
        for f in &acc {
            self.ins(format!("mov.b32 {f}, 0f00000000"));
        }
        if g.init == Init::Output {
            self.comment("the accumulator starts from the output block");
            self.fragment(g, &out, &origin, |w, at| {
                let (ok, addr) = (at.ok, at.addr);
                match at.regs {
                    [x, y] => w.ins(format!("@{ok} ld.global.v2.b32 {{{x}, {y}}}, [{addr}]")),
                    _ => w.ins(format!("@{ok} ld.global.b32 {}, [{addr}]", at.regs[0])),
                }
            });
        }
        let (step, top) = (self.r(), self.label("step"));
        self.ins(format!("mov.u32 {step}, 0"));
        self.place_label(&top);
        let (stage, parity) = (self.r(), self.r());
        self.ins(format!("rem.u32 {stage}, {step}, {}", g.stages));
        self.ins(format!("div.u32 {parity}, {step}, {}", g.stages));
        self.ins(format!("and.b32 {parity}, {parity}, 1"));
        let (bar, base) = (self.r(), self.r());
        self.ins(format!("mad.lo.u32 {bar}, {stage}, 8, {bars}"));
        self.ins(format!("mad.lo.u32 {base}, {stage}, {}, {smem}", g.stage_bytes()));
        self.comment("wait for this step's operands");
        let (wait, ready) = (self.label("wait"), self.p());
        self.place_label(&wait);
        self.ins(format!("mbarrier.try_wait.parity.shared::cta.b64 {ready}, [{bar}], {parity}"));
        self.ins(format!("@!{ready} bra {wait}"));
        self.write_wgmmas(g, &base, &acc);
        self.comment("this step's wgmmas stay in flight; the previous step's are done, so once every");
        self.comment("warpgroup is past them thread 0 refills their stage with the step `stages` later");
        self.ins("wgmma.wait_group.sync.aligned 1");
        self.ins("bar.sync 0");
        let (next, more, started) = (self.r(), self.p(), self.p());
        self.ins(format!("add.u32 {next}, {step}, {}", g.stages - 1));
        self.ins(format!("setp.lt.u32 {more}, {next}, {}", g.steps));
        self.ins(format!("setp.ne.u32 {started}, {step}, 0"));
        self.ins(format!("and.pred {more}, {more}, {started}"));
        self.ins(format!("and.pred {more}, {more}, {leader}"));
        let skip = self.label("refill");
        self.ins(format!("@!{more} bra {skip}"));
        let previous = self.r();
        self.ins(format!("rem.u32 {previous}, {next}, {}", g.stages));
        self.issue(g, &maps, &seq, (&previous, &next), (&smem, &bars));
        self.place_label(&skip);
        self.ins(format!("add.u32 {step}, {step}, 1"));
        let again = self.p();
        self.ins(format!("setp.lt.u32 {again}, {step}, {}", g.steps));
        self.ins(format!("@{again} bra.uni {top}"));
        self.ins("wgmma.wait_group.sync.aligned 0");
        self.comment("the epilogue: the accumulator to the output, from registers");
        let dtype = g.out_dtype;
        let inputs = self.epilogue_inputs(g);
        self.fragment(g, &out, &origin, |w, at| {
            let f: Vec<String> = match &g.epilogue {
                Some(e) if !e.stmts.is_empty() => {
                    at.regs.iter().zip(at.cols).map(|(x, c)| w.epilogue_element(e, &inputs, x, at.row, c)).collect()
                }
                _ => at.regs.to_vec(),
            };
            let (ok, addr) = (at.ok, at.addr);
            if half_bits(dtype) {
                let h: Vec<String> = f.iter().map(|_| w.h()).collect();
                for (h, x) in h.iter().zip(&f) {
                    w.ins(format!("cvt.rn.{}.f32 {h}, {x}", half_ty(dtype)));
                }
                match &h[..] {
                    [lo, hi] => {
                        let pair = w.r();
                        w.ins(format!("mov.b32 {pair}, {{{lo}, {hi}}}"));
                        w.ins(format!("@{ok} st.global.b32 [{addr}], {pair}"));
                    }
                    _ => w.ins(format!("@{ok} st.global.b16 [{addr}], {}", h[0])),
                }
            } else {
                match &f[..] {
                    [x, y] => w.ins(format!("@{ok} st.global.v2.b32 [{addr}], {{{x}, {y}}}")),
                    _ => w.ins(format!("@{ok} st.global.b32 [{addr}], {}", f[0])),
                }
            }
        });
    }

    /// The global address of every input the epilogue loads, by name.
    fn epilogue_inputs(&mut self, g: &Gemm) -> HashMap<String, String> {
        let entry = self.plan.entry.clone();
        let mut inputs = HashMap::new();
        for s in g.epilogue.iter().flat_map(|e| &e.stmts) {
            if let Op::Load { src, .. } = &s.op {
                if !inputs.contains_key(src) {
                    let r = self.rd();
                    self.ins(format!("ld.param.u64 {r}, [{entry}_{src}]"));
                    self.ins(format!("cvta.to.global.u64 {r}, {r}"));
                    inputs.insert(src.clone(), r);
                }
            }
        }
        inputs
    }

    /// The epilogue of the accumulator element `acc`, at `row` and `col` of the output block, in
    /// `f32`: each statement on this one element (numpy's broadcasting picks the element of a
    /// loaded block: index 0 along its dimensions of one), as the general path computes it.
    fn epilogue_element(&mut self, e: &Epilogue, inputs: &HashMap<String, String>, acc: &str, row: &str, col: &str) -> String {
        let mut env: HashMap<&str, String> = HashMap::from([(e.acc.as_str(), acc.to_string())]);
        for s in &e.stmts {
            let ty = s.ty.as_ref().expect("a verified statement has its type");
            let val = |w: &mut Self, env: &HashMap<&str, String>, o: &Operand| match o {
                Operand::Value(x) => env[x.as_str()].clone(),
                Operand::Lit(l) => {
                    let r = w.r();
                    w.ins(format!("mov.b32 {r}, {}", f32_imm(l.as_f64() as f32)));
                    r
                }
            };
            let v = match &s.op {
                Op::Load { src, .. } => self.epilogue_load(src, &inputs[src], row, col),
                Op::Unary(op, x) => {
                    let x = val(self, &env, x);
                    self.unary(*op, DType::F32, &x)
                }
                Op::Binary(op, x, y) => {
                    let (x, y) = (val(self, &env, x), val(self, &env, y));
                    self.binary(*op, DType::F32, &x, &y)
                }
                Op::Compare(op, x, y) => {
                    let (x, y) = (val(self, &env, x), val(self, &env, y));
                    self.compare(*op, DType::F32, &x, &y)
                }
                Op::Select(c, x, y) => {
                    let (c, x, y) = (val(self, &env, c), val(self, &env, x), val(self, &env, y));
                    let (p, v) = (self.p(), self.r());
                    self.ins(format!("setp.ne.u32 {p}, {c}, 0"));
                    self.ins(format!("selp.b32 {v}, {x}, {y}, {p}"));
                    v
                }
                // To `f32` from a value held in `f32` already (16-bit floats are): the same bits.
                Op::Cast(x) | Op::Broadcast(x) => val(self, &env, x),
                _ => unreachable!("the Hopper path's epilogue takes elementwise statements only (crate::wgmma)"),
            };
            debug_assert!(matches!(ty.dtype, DType::F32 | DType::Bool) || matches!(s.op, Op::Load { .. }));
            env.insert(s.results[0].as_str(), v);
        }
        env[e.stored.as_str()].clone()
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
        self.ins(format!("setp.eq.u32 {ok}, 0, 0"));
        self.ins(format!("mov.b32 {linear}, 0"));
        for (d, (&b, l)) in block.iter().zip(local).enumerate() {
            let (i, inside) = (self.r(), self.p());
            if b == 1 {
                self.ins(format!("mov.b32 {i}, {}", origin[d]));
            } else {
                self.ins(format!("add.s32 {i}, {}, {l}", origin[d]));
            }
            self.ins(format!("setp.lt.u32 {inside}, {i}, {}", dims[d]));
            self.ins(format!("and.pred {ok}, {ok}, {inside}"));
            self.ins(format!("mad.lo.u32 {linear}, {linear}, {}, {i}", dims[d]));
        }
        let (at, v) = (self.rd(), self.r());
        let bytes = if half_bits(p.ty.dtype) { 2 } else { 4 };
        self.ins(format!("mul.wide.u32 {at}, {linear}, {bytes}"));
        self.ins(format!("add.u64 {at}, {base}, {at}"));
        self.ins(format!("mov.b32 {v}, 0f00000000"));
        if half_bits(p.ty.dtype) {
            let h = self.h();
            self.ins(format!("mov.b16 {h}, 0"));
            self.ins(format!("@{ok} ld.global.b16 {h}, [{at}]"));
            self.ins(format!("cvt.f32.{} {v}, {h}", half_ty(p.ty.dtype)));
        } else {
            self.ins(format!("@{ok} ld.global.b32 {v}, [{at}]"));
        }
        v
    }

    /// Thread 0's copies of step `step`'s operand blocks into stage `stage`, announced to the
    /// stage's mbarrier as the bytes it will receive.
    fn issue(&mut self, g: &Gemm, maps: &[String], seq: &[usize], (stage, step): (&str, &str), (smem, bars): (&str, &str)) {
        self.decode(step, seq);
        self.write_origins();
        let (bar, base) = (self.r(), self.r());
        self.ins(format!("mad.lo.u32 {bar}, {stage}, 8, {bars}"));
        self.ins(format!("mad.lo.u32 {base}, {stage}, {}, {smem}", g.stage_bytes()));
        let state = self.rd();
        self.ins(format!("mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{bar}], {}", g.stage_bytes()));
        let (na, nb) = g.boxes();
        for (map, (spec, boxes, offset)) in maps.iter().zip([(&g.maps[0], na, 0), (&g.maps[1], nb, g.a_bytes())]) {
            // A box is the block's rows by 64 elements; the block's boxes lie one after another.
            let rows = u64::from(spec.boxes[1]);
            let origin = self.origin_of(&spec.array);
            for j in 0..boxes as u64 {
                let (dst, x) = (self.r(), self.r());
                self.ins(format!("add.u32 {dst}, {base}, {}", offset + j * rows * SWIZZLE as u64));
                self.ins(format!("add.s32 {x}, {}, {}", origin[1], j * ROW as u64));
                self.ins(format!(
                    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{x}, {}}}], [{bar}]",
                    origin[0]
                ));
            }
        }
    }

    /// One step's `wgmma`s: the warpgroup's 64 rows of `a` times the stage's `b`, 16 of the
    /// contraction each, committed as one group.
    fn write_wgmmas(&mut self, g: &Gemm, base: &str, acc: &[String]) {
        let (abase, bbase) = (self.r(), self.r());
        let wg = self.warpgroup.clone();
        // A warpgroup's rows start 64 rows (8 atoms) into every box of `a`.
        self.ins(format!("mad.lo.u32 {abase}, {wg}, {}, {base}", WG_ROWS as u64 / 8 * ATOM));
        self.ins(format!("add.u32 {bbase}, {base}, {}", g.a_bytes()));
        let one = self.p();
        self.ins(format!("setp.eq.u32 {one}, {wg}, {wg}"));
        self.ins("wgmma.fence.sync.aligned");
        let ty = half_ty(g.dtype);
        let (bm, bn, bk) = (g.bm as u64, g.bn as u64, g.bk as u64);
        for kk in (0..bk).step_by(16) {
            // K-major `a`: box kk / 64 of `bm` rows, kk % 64 elements into each 128-byte row.
            let a = self.descriptor(&abase, (kk / ROW as u64) * bm * SWIZZLE as u64 + (kk % ROW as u64) * 2, 16, ATOM);
            let b = if g.b_k_major {
                self.descriptor(&bbase, (kk / ROW as u64) * bn * SWIZZLE as u64 + (kk % ROW as u64) * 2, 16, ATOM)
            } else {
                // N-major `b`: K rows of 128 bytes; the boxes of 64 columns `bk` rows apart.
                self.descriptor(&bbase, kk * SWIZZLE as u64, bk * SWIZZLE as u64, ATOM)
            };
            let trans_b = u8::from(!g.b_k_major);
            self.ins(format!(
                "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty} {{{}}}, {a}, {b}, {one}, 1, 1, 0, {trans_b}",
                acc.join(", ")
            ));
        }
        self.ins("wgmma.commit_group.sync.aligned");
    }

    /// A descriptor of the matrix at shared address `base + offset`.
    fn descriptor(&mut self, base: &str, offset: u64, lbo: u64, sbo: u64) -> String {
        let (addr, d) = (self.r(), self.rd());
        self.ins(format!("add.u32 {addr}, {base}, {offset}"));
        self.ins(format!("shr.u32 {addr}, {addr}, 4"));
        self.ins(format!("cvt.u64.u32 {d}, {addr}"));
        self.ins(format!("or.b64 {d}, {d}, {:#018x}", descriptor_bits(lbo, sbo)));
        d
    }

    /// `f(place)` for the accumulator registers of the thread: their elements of the output
    /// block (warp `w` of the warpgroup: rows 16w + lane/4, +8; columns 2 (lane % 4) + 8j, +1),
    /// where they lie inside the array. Where rows have an even number of elements, the two
    /// registers of each column pair together (one 8- or 4-byte access, aligned: the pair starts
    /// on an even column, and both are inside the array or neither); else one at a time.
    fn fragment(&mut self, g: &Gemm, out: &str, origin: &[String], f: impl Fn(&mut Self, &Place<'_>)) {
        let k = self.plan.kernel.kernel();
        let dims = k.param(&g.out).expect("verified argument").ty.shape.clone();
        let bytes = if half_bits(g.out_dtype) { 2 } else { 4 };
        let (lane, wg) = (self.tid.clone(), self.warpgroup.clone());
        // Block-local row and column of the thread's first register.
        let (lrow, lcol, t) = (self.r(), self.r(), self.r());
        self.ins(format!("mul.lo.u32 {lrow}, {wg}, {WG_ROWS}"));
        self.ins(format!("div.u32 {t}, {lane}, 32"));
        self.ins(format!("mad.lo.u32 {lrow}, {t}, 16, {lrow}"));
        self.ins(format!("rem.u32 {t}, {lane}, 32"));
        self.ins(format!("div.u32 {t}, {t}, 4"));
        self.ins(format!("add.u32 {lrow}, {lrow}, {t}"));
        self.ins(format!("rem.u32 {t}, {lane}, 4"));
        self.ins(format!("mul.lo.u32 {lcol}, {t}, 2"));
        let mut rows = Vec::new();
        for half in 0..2 {
            let (local, r, inside, at) = (self.r(), self.r(), self.p(), self.rd());
            self.ins(format!("add.u32 {local}, {lrow}, {}", 8 * half));
            self.ins(format!("add.u32 {r}, {local}, {}", origin[0]));
            self.ins(format!("setp.lt.u32 {inside}, {r}, {}", dims[0]));
            self.ins(format!("mul.wide.u32 {at}, {r}, {}", dims[1] * bytes));
            self.ins(format!("add.u64 {at}, {out}, {at}"));
            rows.push((local, inside, at));
        }
        let together = if dims[1].is_multiple_of(2) { 2 } else { 1 };
        for i in (0..g.bn / 2).step_by(together) {
            let (local, inside, at) = rows[(i / 2) % 2].clone();
            let (lc, c, ok, wide, addr) = (self.r(), self.r(), self.p(), self.rd(), self.rd());
            self.ins(format!("add.u32 {lc}, {lcol}, {}", 8 * (i / 4) + i % 2));
            self.ins(format!("add.u32 {c}, {lc}, {}", origin[1]));
            self.ins(format!("setp.lt.u32 {ok}, {c}, {}", dims[1]));
            self.ins(format!("and.pred {ok}, {ok}, {inside}"));
            self.ins(format!("mul.wide.u32 {wide}, {c}, {bytes}"));
            self.ins(format!("add.u64 {addr}, {at}, {wide}"));
            let regs: Vec<String> = (i..i + together).map(|j| format!("%f{}", j + 1)).collect();
            let mut cols = vec![lc.clone()];
            // The second register's column, for an epilogue that reads it.
            if together == 2 && g.epilogue.as_ref().is_some_and(|e| !e.stmts.is_empty()) {
                let next = self.r();
                self.ins(format!("add.u32 {next}, {lc}, 1"));
                cols.push(next);
            }
            f(self, &Place { ok: &ok, addr: &addr, regs: &regs, row: &local, cols: &cols });
        }
    }
}

/// One or two of a thread's accumulator registers and where their elements go.
struct Place<'a> {
    /// Whether they lie inside the output array.
    ok: &'a str,
    /// The global address of the first.
    addr: &'a str,
    regs: &'a [String],
    /// Their row in the output block, and each one's column.
    row: &'a str,
    cols: &'a [String],
}
