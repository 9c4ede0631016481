//! `dot` on the general path: float operands on the tensor cores (`mma.sync`, gathered from the
//! operands' slots), integer operands like a reduction, one output element a thread. (The Hopper
//! path's `wgmma` is `wgmma.rs`.)

use tessel_plugin_api::ir::{BinaryOp, DType, Operand};

use super::conv::half_ty;
use super::writer::Writer;
use crate::limits::THREADS;

/// The operands and shape of one `dot`: `dst[m, n] = a[m, k] b[k, n]`.
struct Dot<'a> {
    a: &'a str,
    b: &'a str,
    ta: bool,
    tb: bool,
    dst: &'a str,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
}

impl Dot<'_> {
    /// The contraction covered by one `mma.sync`: 8 on `tf32`, 16 on 16-bit floats.
    fn kstep(&self) -> u32 {
        if self.dtype == DType::F32 { 8 } else { 16 }
    }

    /// 8-column tiles across the result.
    fn tiles_n(&self) -> usize {
        self.n.div_ceil(8)
    }
}

impl Writer<'_> {
    pub(super) fn write_dot(&mut self, a: &Operand, b: &Operand, ta: bool, tb: bool, dst: &str, out: &[usize]) {
        let (Operand::Value(a), Operand::Value(b)) = (a, b) else { unreachable!("verifier: dot of values") };
        let d = self.plan.kernel.value_type(a).dtype;
        let sa = self.shape_of(a);
        let (m, n) = (out[0], out[1]);
        let k = if ta { sa[0] } else { sa[1] };
        let (a, b, dst) = (a.to_string(), b.to_string(), dst.to_string());
        if d.is_float() {
            let dot = Dot { a: &a, b: &b, ta, tb, dst: &dst, m, n, k, dtype: d };
            return self.write_dot_mma(&dot);
        }
        self.each(m * n, |w, e| {
            let (row, col) = (w.r(), w.r());
            w.insf(format_args!("div.u32 {row}, {e}, {n}"));
            w.insf(format_args!("rem.u32 {col}, {e}, {n}"));
            let acc = w.imm(0);
            let p = w.imm(0);
            let (top, end) = (w.label("dot"), w.label("enddot"));
            w.place_label(&top);
            let done = w.p();
            w.insf(format_args!("setp.ge.u32 {done}, {p}, {k}"));
            w.insf(format_args!("@{done} bra {end}"));
            let (ia, ib) = (w.r(), w.r());
            // a[row, p] (a[p, row] when transposed), b[p, col] (b[col, p] when transposed).
            if ta {
                w.insf(format_args!("mad.lo.u32 {ia}, {p}, {m}, {row}"))
            } else {
                w.insf(format_args!("mad.lo.u32 {ia}, {row}, {k}, {p}"))
            }
            if tb {
                w.insf(format_args!("mad.lo.u32 {ib}, {col}, {k}, {p}"))
            } else {
                w.insf(format_args!("mad.lo.u32 {ib}, {p}, {n}, {col}"))
            }
            let (x, y) = (w.load_slot(&a, &ia), w.load_slot(&b, &ib));
            let prod = w.binary32(BinaryOp::Mul, d, &x, &y);
            let sum = w.binary32(BinaryOp::Add, d, &acc, &prod);
            w.insf(format_args!("mov.b32 {acc}, {sum}"));
            w.insf(format_args!("add.u32 {p}, {p}, 1"));
            w.insf(format_args!("bra {top}"));
            w.place_label(&end);
            w.store_slot(&dst, e, &acc);
        });
    }

    /// Float `dot` on the tensor cores: each warp of the warpgroup takes 16x8 tiles of the result
    /// in turn and walks the contraction in steps of `mma.sync` — `m16n8k16` on `f16`/`bf16`
    /// inputs (exact products, `f32` accumulation), `m16n8k8` on `f32` inputs split exactly into
    /// three `tf32` parts each, with the six products that reach `2^-22` of `hi * hi`: `f32`
    /// accuracy, which the language's contract asks of an `f32` dot (3xTF32's two parts fell short
    /// on sums with cancellation; docs/language.md §8). Fragments are gathered from
    /// the operands' slots with the PTX ISA's layouts (`g` = lane / 4, `t` = lane % 4); elements
    /// past the operands' edges read 0, so any shape works.
    fn write_dot_mma(&mut self, dot: &Dot<'_>) {
        let kstep = dot.kstep();
        let tiles = dot.m.div_ceil(16) * dot.tiles_n();
        self.comment(&format!(
            "{} tiles of 16x8 over the 4 warps, {} steps of k = {kstep}",
            tiles,
            dot.k.div_ceil(kstep as usize)
        ));
        let (lane, warp, g, t) = (self.r(), self.r(), self.r(), self.r());
        let tid = self.tid.clone();
        self.insf(format_args!("and.b32 {lane}, {tid}, 31"));
        self.insf(format_args!("shr.u32 {warp}, {tid}, 5"));
        self.insf(format_args!("shr.u32 {g}, {lane}, 2"));
        self.insf(format_args!("and.b32 {t}, {lane}, 3"));
        let warps = THREADS / 32;
        self.count(&warp, tiles, warps, true, ("tile", "tiles"), |w, tile| w.mma_tile(dot, tile, &g, &t));
    }

    /// One 16x8 tile of a tensor-core `dot` for the warp (see [`Writer::write_dot_mma`]).
    fn mma_tile(&mut self, dot: &Dot<'_>, tile: &str, g: &str, t: &str) {
        let tiles_n = dot.tiles_n();
        let (r0, c0) = (self.r(), self.r());
        self.insf(format_args!("div.u32 {r0}, {tile}, {tiles_n}"));
        self.insf(format_args!("mul.lo.u32 {r0}, {r0}, 16"));
        self.insf(format_args!("rem.u32 {c0}, {tile}, {tiles_n}"));
        self.insf(format_args!("mul.lo.u32 {c0}, {c0}, 8"));
        // This lane's rows and columns: g and g + 8 of the tile; 2t and 2t + 1.
        let (row_lo, row_hi, col) = (self.r(), self.r(), self.r());
        self.insf(format_args!("add.u32 {row_lo}, {r0}, {g}"));
        self.insf(format_args!("add.u32 {row_hi}, {row_lo}, 8"));
        self.insf(format_args!("mad.lo.u32 {col}, {t}, 2, {c0}"));
        let acc: Vec<String> = (0..4).map(|_| self.imm(0)).collect();
        self.count("0", dot.k, dot.kstep(), true, ("k", "kdone"), |w, kk| {
            // The B column of this lane is c0 + g; its A rows are row_lo and row_hi.
            let bcol = w.r();
            w.insf(format_args!("add.u32 {bcol}, {c0}, {g}"));
            if dot.dtype == DType::F32 {
                // A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (t, g), b1 (t+4, g).
                let (k0, k4) = (w.r(), w.r());
                w.insf(format_args!("add.u32 {k0}, {kk}, {t}"));
                w.insf(format_args!("add.u32 {k4}, {k0}, 4"));
                let a: Vec<String> = [(&row_lo, &k0), (&row_hi, &k0), (&row_lo, &k4), (&row_hi, &k4)]
                    .into_iter()
                    .map(|(r, c)| w.dot_a(dot, r, c))
                    .collect();
                let b: Vec<String> = [&k0, &k4].into_iter().map(|r| w.dot_b(dot, r, &bcol)).collect();
                let [a_hi, a_mid, a_lo] = w.split_tf32(&a);
                let [b_hi, b_mid, b_lo] = w.split_tf32(&b);
                // The six products down to 2^-22 of hi * hi, the small ones first.
                let products =
                    [(&a_lo, &b_hi), (&a_hi, &b_lo), (&a_mid, &b_mid), (&a_mid, &b_hi), (&a_hi, &b_mid), (&a_hi, &b_hi)];
                for (x, y) in products {
                    w.mma("m16n8k8.row.col.f32.tf32.tf32.f32", &acc, x, y);
                }
            } else {
                // A: a_i at row g (+8 for i = 2, 3, 6, 7), column 2t + i%2 (+8 for i >= 4), two to a
                // register, the lower index in the low half; B: b_i at row 2t + i%2 (+8 for i >= 2).
                let (k0, k1, k8, k9) = (w.r(), w.r(), w.r(), w.r());
                w.insf(format_args!("mad.lo.u32 {k0}, {t}, 2, {kk}"));
                w.insf(format_args!("add.u32 {k1}, {k0}, 1"));
                w.insf(format_args!("add.u32 {k8}, {k0}, 8"));
                w.insf(format_args!("add.u32 {k9}, {k0}, 9"));
                let pairs_a = [(&row_lo, &k0, &k1), (&row_hi, &k0, &k1), (&row_lo, &k8, &k9), (&row_hi, &k8, &k9)];
                let a: Vec<String> = pairs_a
                    .into_iter()
                    .map(|(r, c, c1)| {
                        let (x, y) = (w.dot_a(dot, r, c), w.dot_a(dot, r, c1));
                        w.pack16(dot.dtype, &x, &y)
                    })
                    .collect();
                let b: Vec<String> = [(&k0, &k1), (&k8, &k9)]
                    .into_iter()
                    .map(|(r, r1)| {
                        let (x, y) = (w.dot_b(dot, r, &bcol), w.dot_b(dot, r1, &bcol));
                        w.pack16(dot.dtype, &x, &y)
                    })
                    .collect();
                let shape = format!("m16n8k16.row.col.f32.{t}.{t}.f32", t = half_ty(dot.dtype));
                w.mma(&shape, &acc, &a, &b);
            }
        });
        // D: d_i at row g (+8 for i >= 2), column 2t + i%2; inside the result only.
        for (i, v) in acc.iter().enumerate() {
            let r = if i < 2 { &row_lo } else { &row_hi };
            let (c, idx, inside, ok) = (self.r(), self.r(), self.p(), self.p());
            self.insf(format_args!("add.u32 {c}, {col}, {}", i % 2));
            self.insf(format_args!("setp.lt.u32 {inside}, {r}, {}", dot.m));
            self.insf(format_args!("setp.lt.u32 {ok}, {c}, {}", dot.n));
            self.insf(format_args!("and.pred {ok}, {ok}, {inside}"));
            self.insf(format_args!("mad.lo.u32 {idx}, {r}, {}, {c}", dot.n));
            let skip = self.label("skip");
            self.insf(format_args!("@!{ok} bra {skip}"));
            self.store_slot(dot.dst, &idx, v);
            self.place_label(&skip);
        }
    }

    /// `a[row, col]` of a dot (`a[col, row]` when transposed), or 0 past its edges.
    fn dot_a(&mut self, dot: &Dot<'_>, row: &str, col: &str) -> String {
        self.dot_operand(dot.a, (row, col), (dot.m, dot.k), dot.ta)
    }

    /// `b[row, col]` of a dot (`b[col, row]` when transposed), or 0 past its edges.
    fn dot_b(&mut self, dot: &Dot<'_>, row: &str, col: &str) -> String {
        self.dot_operand(dot.b, (row, col), (dot.k, dot.n), dot.tb)
    }

    /// Element `(row, col)` of a `rows x cols` operand stored row-major (column-major when
    /// `transposed`), or 0 past its edges.
    fn dot_operand(&mut self, name: &str, (row, col): (&str, &str), (rows, cols): (usize, usize), transposed: bool) -> String {
        let (major, minor, stride) = if transposed { (col, row, rows) } else { (row, col, cols) };
        let (ok, inside, idx, v) = (self.p(), self.p(), self.r(), self.imm(0));
        self.insf(format_args!("setp.lt.u32 {ok}, {row}, {rows}"));
        self.insf(format_args!("setp.lt.u32 {inside}, {col}, {cols}"));
        self.insf(format_args!("and.pred {ok}, {ok}, {inside}"));
        self.insf(format_args!("mad.lo.u32 {idx}, {major}, {stride}, {minor}"));
        let addr = self.slot_addr(name, &idx);
        self.insf(format_args!("@{ok} ld.{}.b32 {v}, [{addr}]", self.space()));
        v
    }

    /// `f32` values split exactly into three `tf32` parts, `x = hi + mid + lo`: each part is the
    /// `tf32` rounding of what the parts before it leave (11 significant bits each; the
    /// subtractions are exact, and the last remainder has at most 3 bits).
    fn split_tf32(&mut self, xs: &[String]) -> [Vec<String>; 3] {
        let mut parts: [Vec<String>; 3] = Default::default();
        for x in xs {
            let (hi, mid, lo, rest) = (self.r(), self.r(), self.r(), self.r());
            self.insf(format_args!("cvt.rna.tf32.f32 {hi}, {x}"));
            self.insf(format_args!("sub.rn.f32 {rest}, {x}, {hi}"));
            self.insf(format_args!("cvt.rna.tf32.f32 {mid}, {rest}"));
            self.insf(format_args!("sub.rn.f32 {rest}, {rest}, {mid}"));
            self.insf(format_args!("cvt.rna.tf32.f32 {lo}, {rest}"));
            for (part, r) in parts.iter_mut().zip([hi, mid, lo]) {
                part.push(r);
            }
        }
        parts
    }

    /// Two 16-bit floats (held as `f32`) in one register, `lo` in the low half.
    fn pack16(&mut self, d: DType, lo: &str, hi: &str) -> String {
        let (hl, hh, v) = (self.h(), self.h(), self.r());
        self.insf(format_args!("cvt.rn.{}.f32 {hl}, {lo}", half_ty(d)));
        self.insf(format_args!("cvt.rn.{}.f32 {hh}, {hi}", half_ty(d)));
        self.insf(format_args!("mov.b32 {v}, {{{hl}, {hh}}}"));
        v
    }

    /// `acc = a b + acc` on the tensor cores, for the warp.
    fn mma(&mut self, shape: &str, acc: &[String], a: &[String], b: &[String]) {
        let acc = acc.join(", ");
        self.insf(format_args!("mma.sync.aligned.{shape} {{{acc}}}, {{{}}}, {{{}}}, {{{acc}}}", a.join(", "), b.join(", ")));
    }
}
