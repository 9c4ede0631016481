//! The concurrent model's products on `wgmma` (`crate::async_mma` says which): `mma_async` as
//! `wgmma.mma_async` from swizzled shared-memory operand buffers into the accumulator's registers,
//! `mma_wait` as `wgmma.wait_group`, and the accumulator's `store` and `load` as moves between
//! its registers (the `wgmma` accumulator layout) and a value's slot.

use tessel_plugin_api::ir::{DType, Index, MmaLhs, Operand, RefAt, SyncOp};

use super::conv::half_ty;
use super::wgmma::descriptor_bits;
use super::writer::Writer;
use crate::async_mma::WG_ROWS;
use crate::limits::element_bytes;

/// The left operand of a product: in shared memory, or each thread's registers per 64 rows and
/// 16 of the contraction.
enum Left {
    Shared(Window),
    Registers(Vec<[String; 4]>),
}

/// An operand buffer's window as a descriptor sees it: the shared address its window starts at,
/// and its tile's rows, swizzle span and elements a slab.
struct Window {
    start: String,
    rows: u64,
    span: u64,
    slab: u64,
}

impl Writer<'_> {
    /// The accumulator registers: register `j` of buffer `i`.
    pub(super) fn accumulator_register(i: usize, j: usize) -> String {
        format!("%acc{i}_{j}")
    }

    /// Every accumulator in registers starts as zeros, as scratch does.
    pub(super) fn zero_accumulators(&mut self) {
        let accs = self.plan.mma.accumulators.clone();
        for (i, (name, [m, n])) in accs.iter().enumerate() {
            self.comment(&format!("{name}: each warpgroup's tile in registers (wgmma's accumulator layout), zeros"));
            for j in 0..m / WG_ROWS * n / 2 {
                self.insf(format_args!("mov.b32 {}, 0", Self::accumulator_register(i, j)));
            }
        }
    }

    /// `mma_async ACC, A, B`: the warpgroup's `wgmma`s, 64 rows of the accumulator by 16 of
    /// the contraction each, committed as one group.
    pub(super) fn write_async_mma(&mut self, op: &SyncOp) {
        let SyncOp::Mma { acc, a, b, trans_a, trans_b } = op else { unreachable!("a product") };
        let (i, [m, n]) = self.plan.mma.accumulator(&acc.name).expect("the plan takes this product");
        let dtype = self.plan.kernel.kernel().param(&b.name).expect("verified operand").ty.dtype;
        let contraction = self.region_columns(b, *trans_b);
        // The left operand: a buffer's window, or each thread's registers of the value, all of
        // them gathered before the fence that orders them before the products.
        let left = match a {
            MmaLhs::Ref(a) => Left::Shared(self.window(a)),
            MmaLhs::Value(Operand::Value(v)) => Left::Registers(self.left_fragments(v, [m as u64, contraction], *trans_a, dtype)),
            MmaLhs::Value(Operand::Lit(_)) => unreachable!("the plan takes products of value operands"),
        };
        let wb = self.window(b);
        let one = self.p();
        self.insf(format_args!("setp.eq.u32 {one}, 0, 0"));
        self.ins("wgmma.fence.sync.aligned");
        let ty = half_ty(dtype);
        for block in 0..(m / WG_ROWS) as u64 {
            let regs: Vec<String> = (0..n / 2).map(|j| Self::accumulator_register(i, block as usize * n / 2 + j)).collect();
            for kk in (0..contraction).step_by(16) {
                // B is N-major ([K, N]) or, with trans_b, K-major ([N, K]).
                let db = if *trans_b { self.k_major(&wb, kk, 0) } else { self.mn_major(&wb, kk, 0) };
                let ib = u8::from(!trans_b);
                let d = regs.join(", ");
                match &left {
                    // A is K-major ([M, K]) or, with trans_a, M-major ([K, M]).
                    Left::Shared(wa) => {
                        let da = if *trans_a {
                            self.mn_major(wa, kk, block * WG_ROWS as u64)
                        } else {
                            self.k_major(wa, kk, block * WG_ROWS as u64)
                        };
                        let ia = u8::from(*trans_a);
                        self.insf(format_args!(
                            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d}}}, {da}, {db}, {one}, 1, 1, {ia}, {ib}"
                        ));
                    }
                    Left::Registers(fragments) => {
                        let ra = fragments[(block * contraction.div_ceil(16) + kk / 16) as usize].join(", ");
                        self.insf(format_args!(
                            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d}}}, {{{ra}}}, {db}, {one}, 1, 1, {ib}"
                        ));
                    }
                }
            }
        }
        self.ins("wgmma.commit_group.sync.aligned");
    }

    /// Each thread's registers of the left operand `v` (`[M, K]`, `[K, M]` with `trans`) for
    /// every 64 rows and 16 of the contraction: four of two elements each (PTX ISA "Register
    /// Fragments" of `wgmma` A, the `mma.m16n8k16` layout per warp): warp `w`'s rows from `16 w`,
    /// row `lane / 4` (+8 for the second and fourth), columns `2 (lane % 4)` and one more (+8 for
    /// the third and fourth), the first in the low half.
    fn left_fragments(&mut self, v: &str, [m, k]: [u64; 2], trans: bool, dtype: DType) -> Vec<[String; 4]> {
        let (row, col) = self.lane_origin();
        let first = self.r();
        // The flat index of the thread's first element; each other is a constant from it.
        let at = |r: u64, c: u64| if trans { c * m + r } else { r * k + c };
        let (a, b) = if trans { (col.clone(), row.clone()) } else { (row.clone(), col.clone()) };
        let stride = if trans { m } else { k };
        self.insf(format_args!("mad.lo.u32 {first}, {a}, {stride}, {b}"));
        let ty = half_ty(dtype);
        let mut out = Vec::new();
        for block in 0..m / WG_ROWS as u64 {
            for kk in (0..k).step_by(16) {
                let regs = std::array::from_fn(|q| {
                    let q = q as u64;
                    let halves: Vec<String> = (0..2)
                        .map(|h| {
                            let (e, x) = (self.r(), self.h());
                            let offset = at(WG_ROWS as u64 * block + 8 * (q % 2), kk + 8 * (q / 2) + h);
                            self.insf(format_args!("add.u32 {e}, {first}, {offset}"));
                            let bits = self.load_slot(v, &e);
                            self.insf(format_args!("cvt.rn.{ty}.f32 {x}, {bits}"));
                            x
                        })
                        .collect();
                    let r = self.r();
                    self.insf(format_args!("mov.b32 {r}, {{{}, {}}}", halves[0], halves[1]));
                    r
                });
                out.push(regs);
            }
        }
        out
    }

    /// `mma_wait N`: at most `N` of the warpgroup's groups pending (all of them when some of
    /// the kernel's products are made where issued, which this count would not see).
    pub(super) fn write_mma_wait(&mut self, pending: usize) {
        let n = if self.plan.mma.all { pending } else { 0 };
        self.insf(format_args!("wgmma.wait_group.sync.aligned {n}"));
    }

    /// `store ACC[t, :, :], value`: each thread's accumulator registers from its elements of
    /// the value, once no product still writes them.
    pub(super) fn write_accumulator_store(&mut self, acc: &str, value: &Operand) {
        let tile = self.plan.mma.accumulator(acc).expect("an accumulator in registers").1;
        for (reg, e) in self.accumulator_elements(acc) {
            let x = self.operand(value, DType::F32, &e, &tile);
            self.insf(format_args!("mov.b32 {reg}, {x}"));
        }
    }

    /// `%v = load ACC[t, :, :]`: each thread's accumulator registers to its elements of the
    /// value's slot, once no product still writes them.
    pub(super) fn write_accumulator_load(&mut self, acc: &str, dst: &str) {
        for (reg, e) in self.accumulator_elements(acc) {
            self.store_slot(dst, &e, &reg);
        }
    }

    /// Once no product still writes them, each of the thread's accumulator registers of `acc`
    /// and the register of its element's flat index in the tile.
    fn accumulator_elements(&mut self, acc: &str) -> Vec<(String, String)> {
        let (i, [m, n]) = self.plan.mma.accumulator(acc).expect("an accumulator in registers");
        self.ins("wgmma.wait_group.sync.aligned 0");
        let first = self.fragment_element(n);
        (fragment_offsets(m, n).into_iter().enumerate())
            .map(|(j, offset)| {
                let e = self.r();
                self.insf(format_args!("add.u32 {e}, {first}, {offset}"));
                (Self::accumulator_register(i, j), e)
            })
            .collect()
    }

    /// The flat index in an `[M, N]` tile of the thread's first accumulator element.
    fn fragment_element(&mut self, n: usize) -> String {
        let (row, col) = self.lane_origin();
        let e = self.r();
        self.insf(format_args!("mad.lo.u32 {e}, {row}, {n}, {col}"));
        e
    }

    /// The row and column of the thread's first element in a warpgroup's 64-row fragment (of
    /// the accumulator, or of a register left operand): warp `w` holds rows `16 w + lane / 4`
    /// (and 8 below) from column `2 (lane % 4)`.
    fn lane_origin(&mut self) -> (String, String) {
        let (row, col) = (self.r(), self.r());
        let tid = self.tid.clone();
        self.insf(format_args!("div.u32 {row}, {tid}, 32"));
        self.insf(format_args!("mul.lo.u32 {row}, {row}, 16"));
        self.insf(format_args!("rem.u32 {col}, {tid}, 32"));
        self.insf(format_args!("div.u32 {col}, {col}, 4"));
        self.insf(format_args!("add.u32 {row}, {row}, {col}"));
        self.insf(format_args!("rem.u32 {col}, {tid}, 4"));
        self.insf(format_args!("mul.lo.u32 {col}, {col}, 2"));
        (row, col)
    }

    /// The operand buffer region `r`'s window: the shared address of its first element.
    fn window(&mut self, r: &RefAt) -> Window {
        let plan = self.plan;
        let p = plan.kernel.kernel().param(&r.name).expect("verified operand");
        let shape = &p.ty.shape;
        let lead = shape.len() - 2;
        let elem = element_bytes(p.ty.dtype) as u64;
        let span = u64::from(plan.mma.span(&r.name));
        let (rows, slab) = (shape[lead] as u64, span / elem);
        let ix = r.index.clone().unwrap_or_else(|| vec![Index::Full; shape.len()]);
        let (start, base) = (self.rd(), self.scratch.clone());
        self.insf(format_args!("add.u64 {start}, {base}, {}", plan.scratch[&r.name].offset));
        // Each leading index steps whole tiles; the window's rows `span` bytes each, its columns
        // whole slabs of `rows` rows.
        let mut tile = shape[lead..].iter().product::<usize>() as u64 * elem;
        let mut steps = Vec::new();
        for d in (0..shape.len()).rev() {
            match &ix[d] {
                Index::At(at) => steps.push((at.clone(), tile, 1)),
                Index::Slice { start, .. } if d == lead => steps.push((start.clone(), span, 1)),
                Index::Slice { start, .. } if d == lead + 1 => steps.push((start.clone(), rows * span, slab)),
                _ => {}
            }
            if d < lead {
                tile *= shape[d] as u64;
            }
        }
        for (at, bytes, per) in steps {
            let (k, wide) = (self.scalar(&at), self.rd());
            if per > 1 {
                self.insf(format_args!("div.u32 {k}, {k}, {per}"));
            }
            self.insf(format_args!("mul.wide.u32 {wide}, {k}, {bytes}"));
            self.insf(format_args!("add.u64 {start}, {start}, {wide}"));
        }
        let addr = self.r();
        self.insf(format_args!("cvt.u32.u64 {addr}, {start}"));
        Window { start: addr, rows, span, slab }
    }

    /// Elements of region `r`'s last dimension (`columns`) or the one before it.
    fn region_columns(&self, r: &RefAt, columns: bool) -> u64 {
        let p = self.plan.kernel.kernel().param(&r.name).expect("verified operand");
        let shape = tessel_plugin_api::ir::analysis::region_shape(p, r.index.as_deref());
        shape[shape.len() - if columns { 1 } else { 2 }] as u64
    }

    /// The descriptor of a K-major operand's 16 contraction elements from `kk`, rows from
    /// `row`: rows (M or N) `span` bytes apart in atoms of 8, `8 span` apart; the contraction
    /// along a row, its slabs `rows` rows apart.
    fn k_major(&mut self, w: &Window, kk: u64, row: u64) -> String {
        let offset = row * w.span + (kk / w.slab) * w.rows * w.span + (kk % w.slab) * 2;
        self.swizzled_descriptor(w, offset, 16)
    }

    /// The descriptor of an MN-major operand's 16 contraction rows from `kk`, columns (M or N)
    /// from `column` (a whole slab): slabs `rows` rows apart (the leading byte offset).
    fn mn_major(&mut self, w: &Window, kk: u64, column: u64) -> String {
        let offset = kk * w.span + (column / w.slab) * w.rows * w.span;
        self.swizzled_descriptor(w, offset, w.rows * w.span)
    }

    fn swizzled_descriptor(&mut self, w: &Window, offset: u64, lbo: u64) -> String {
        let (addr, d) = (self.r(), self.rd());
        self.insf(format_args!("add.u32 {addr}, {}, {offset}", w.start));
        self.insf(format_args!("shr.u32 {addr}, {addr}, 4"));
        self.insf(format_args!("cvt.u64.u32 {d}, {addr}"));
        self.insf(format_args!("or.b64 {d}, {d}, {:#018x}", descriptor_bits(lbo, 8 * w.span, w.span as u32)));
        d
    }
}

/// Each accumulator register's flat index in the `[m, n]` tile, from the thread's first one:
/// register `j` of 64-row block `b` is row `64 b + 8 ((j / 2) % 2)`, column `8 (j / 4) + j % 2`.
fn fragment_offsets(m: usize, n: usize) -> Vec<usize> {
    (0..m / WG_ROWS).flat_map(|b| (0..n / 2).map(move |j| (WG_ROWS * b + 8 * ((j / 2) % 2)) * n + 8 * (j / 4) + j % 2)).collect()
}
