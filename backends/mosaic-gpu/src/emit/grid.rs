//! Where a thread is, for both paths: its lane, warpgroup and CTA (`%tid.x`, `%ctaid.x`), the
//! grid coordinates decoded from a counter, and the element origin of every argument's block at
//! those coordinates.

use tessel_plugin_api::ir::size::{SizeExpr, SizeOp};
use tessel_plugin_api::ir::{AxisSize, BlockIndex, index};

use super::writer::Writer;
use crate::limits::THREADS;

impl Writer<'_> {
    /// `%tid.x`, the thread's lane in its warpgroup (`self.tid`) and its warpgroup
    /// (`self.warpgroup`), `%ctaid.x`: the registers of `%tid.x` and `%ctaid.x`.
    pub(super) fn write_ids(&mut self) -> (String, String) {
        let tid_x = self.r();
        self.insf(format_args!("mov.u32 {tid_x}, %tid.x"));
        self.tid = self.r();
        self.warpgroup = self.r();
        let (tid, wg) = (self.tid.clone(), self.warpgroup.clone());
        self.insf(format_args!("rem.u32 {tid}, {tid_x}, {THREADS}"));
        self.insf(format_args!("div.u32 {wg}, {tid_x}, {THREADS}"));
        let cta = self.r();
        self.insf(format_args!("mov.u32 {cta}, %ctaid.x"));
        (tid_x, cta)
    }

    /// The coordinates of grid `axes` from the row-major `counter` over them (the last fastest).
    pub(super) fn decode(&mut self, counter: &str, axes: &[usize]) {
        let grid = self.plan.kernel.grid();
        let mut stride: u64 = 1;
        for &a in axes.iter().rev() {
            let AxisSize::Fixed(n) = grid[a].size else { unreachable!("plan refuses dyn axes") };
            let c = self.r();
            self.insf(format_args!("div.u32 {c}, {counter}, {stride}"));
            self.insf(format_args!("rem.u32 {c}, {c}, {n}"));
            self.coords[a] = c;
            stride *= n;
        }
    }

    /// The origin registers [`Writer::write_origins`] made for argument `name`.
    pub(super) fn origin_of(&self, name: &str) -> Vec<String> {
        self.origins.iter().find(|(n, _)| n == name).map(|(_, o)| o.clone()).expect("origins computed")
    }

    /// Element origin of every argument's block at this grid point: `E_d * B_d`, a computed
    /// `E_d` clamped to the array's blocks.
    pub(super) fn write_origins(&mut self) {
        let k = self.plan.kernel.kernel();
        let grid = self.plan.kernel.grid().to_vec();
        self.origins.clear();
        for p in &k.params {
            let mut regs = Vec::new();
            if let Some(b) = &p.block {
                for (d, (e, &bs)) in b.index.iter().zip(&b.shape).enumerate() {
                    let o = match e {
                        BlockIndex::Affine(e) => {
                            let o = self.r();
                            self.insf(format_args!("mov.b32 {o}, {}", e.constant as i32));
                            for (c, name) in &e.terms {
                                let a = grid.iter().position(|g| &g.name == name).expect("verified axis");
                                let coord = self.coords[a].clone();
                                self.insf(format_args!("mad.lo.s32 {o}, {coord}, {}, {o}", *c as i32));
                            }
                            o
                        }
                        BlockIndex::Computed(e) => {
                            // Negative from the end once, then clamped (`index::IndexEval::clamp`).
                            let (o, n) = (self.index_expr(e), index::blocks(p, d));
                            let (c, neg) = (self.r(), self.p());
                            self.insf(format_args!("setp.lt.s32 {neg}, {o}, 0"));
                            self.insf(format_args!("add.s32 {c}, {o}, {n}"));
                            self.insf(format_args!("selp.b32 {c}, {c}, {o}, {neg}"));
                            self.insf(format_args!("max.s32 {c}, {c}, 0"));
                            self.insf(format_args!("min.s32 {c}, {c}, {}", n - 1));
                            c
                        }
                    };
                    self.insf(format_args!("mul.lo.s32 {o}, {o}, {bs}"));
                    regs.push(o);
                }
            } else {
                for _ in &p.ty.shape {
                    let z = self.imm(0);
                    regs.push(z);
                }
            }
            self.origins.push((p.name.clone(), regs));
        }
    }

    /// A register holding computed block index `e` (the arithmetic of [`index::IndexEval`]).
    fn index_expr(&mut self, e: &SizeExpr) -> String {
        let r = self.r();
        match e {
            SizeExpr::Int(v) => self.insf(format_args!("mov.b32 {r}, {}", *v as i32)),
            SizeExpr::Name(n) => {
                let a = self.plan.kernel.grid().iter().position(|g| &g.name == n).expect("verified axis");
                let coord = self.coords[a].clone();
                self.insf(format_args!("mov.b32 {r}, {coord}"));
            }
            SizeExpr::Neg(x) => {
                let x = self.index_expr(x);
                self.insf(format_args!("neg.s32 {r}, {x}"));
            }
            SizeExpr::Select(abc) => {
                let [c, a, b] = abc.as_ref();
                let (c, a, b) = (self.index_expr(c), self.index_expr(a), self.index_expr(b));
                let p = self.p();
                self.insf(format_args!("setp.ne.s32 {p}, {c}, 0"));
                self.insf(format_args!("selp.b32 {r}, {a}, {b}, {p}"));
            }
            SizeExpr::Bin(op, a, b) => {
                let (x, y) = (self.index_expr(a), self.index_expr(b));
                self.index_op(*op, &r, &x, &y);
            }
            SizeExpr::Read(name, at) => {
                let at: Vec<String> = at.iter().map(|e| self.index_expr(e)).collect();
                let table = self.plan.kernel.kernel().params.iter().find(|p| &p.name == name).expect("verified read");
                let shape = table.ty.shape.clone();
                let base = self.args.iter().find(|(n, _)| n == name).expect("an argument's pointer").1.clone();
                // Inside where every index is in 0..dim (compared unsigned, so negatives fail).
                let (flat, inside) = (self.r(), (!at.is_empty()).then(|| self.p()));
                self.insf(format_args!("mov.b32 {flat}, 0"));
                for (n, (i, &dim)) in at.iter().zip(&shape).enumerate() {
                    let ok = self.p();
                    self.insf(format_args!("setp.lt.u32 {ok}, {i}, {}", dim.min(u32::MAX as usize)));
                    let inside = inside.as_ref().expect("an index");
                    if n == 0 {
                        self.insf(format_args!("mov.pred {inside}, {ok}"));
                    } else {
                        self.insf(format_args!("and.pred {inside}, {inside}, {ok}"));
                    }
                    self.insf(format_args!("mad.lo.u32 {flat}, {flat}, {dim}, {i}"));
                }
                let addr = self.rd();
                self.insf(format_args!("mul.wide.u32 {addr}, {flat}, 4"));
                self.insf(format_args!("add.u64 {addr}, {base}, {addr}"));
                self.insf(format_args!("mov.b32 {r}, 0"));
                let guard = inside.map(|p| format!("@{p} ")).unwrap_or_default();
                self.insf(format_args!("{guard}ld.global.b32 {r}, [{addr}]"));
            }
        }
        r
    }

    /// `r = x OP y` in 32 bits: wrapping `+ - *`, floored `/ %`, `cdiv`, 0 for a divisor of 0.
    fn index_op(&mut self, op: SizeOp, r: &str, x: &str, y: &str) {
        let cmp = |op: SizeOp| match op {
            SizeOp::Eq => "eq",
            SizeOp::Ne => "ne",
            SizeOp::Lt => "lt",
            SizeOp::Le => "le",
            SizeOp::Gt => "gt",
            _ => "ge",
        };
        match op {
            SizeOp::Add => self.insf(format_args!("add.s32 {r}, {x}, {y}")),
            SizeOp::Sub => self.insf(format_args!("sub.s32 {r}, {x}, {y}")),
            SizeOp::Mul => self.insf(format_args!("mul.lo.s32 {r}, {x}, {y}")),
            SizeOp::Min => self.insf(format_args!("min.s32 {r}, {x}, {y}")),
            SizeOp::Max => self.insf(format_args!("max.s32 {r}, {x}, {y}")),
            SizeOp::Div | SizeOp::Rem | SizeOp::Cdiv => {
                // Truncating quotient and remainder by a divisor of 1 where it is 0, then floored:
                // where the remainder is not 0 and its sign differs from the divisor's.
                let (zero, adjust, differ) = (self.p(), self.p(), self.p());
                let (d, q, m, t) = (self.r(), self.r(), self.r(), self.r());
                self.insf(format_args!("setp.eq.s32 {zero}, {y}, 0"));
                self.insf(format_args!("selp.b32 {d}, 1, {y}, {zero}"));
                self.insf(format_args!("div.s32 {q}, {x}, {d}"));
                self.insf(format_args!("rem.s32 {m}, {x}, {d}"));
                self.insf(format_args!("xor.b32 {t}, {m}, {d}"));
                self.insf(format_args!("setp.lt.s32 {differ}, {t}, 0"));
                self.insf(format_args!("setp.ne.s32 {adjust}, {m}, 0"));
                self.insf(format_args!("and.pred {differ}, {differ}, {adjust}"));
                self.insf(format_args!("@{differ} sub.s32 {q}, {q}, 1"));
                self.insf(format_args!("@{differ} add.s32 {m}, {m}, {d}"));
                match op {
                    SizeOp::Div => self.insf(format_args!("mov.b32 {r}, {q}")),
                    SizeOp::Rem => self.insf(format_args!("mov.b32 {r}, {m}")),
                    _ => {
                        // Rounded up: the floor plus one where the remainder is not 0.
                        self.insf(format_args!("setp.ne.s32 {adjust}, {m}, 0"));
                        self.insf(format_args!("selp.b32 {t}, 1, 0, {adjust}"));
                        self.insf(format_args!("add.s32 {r}, {q}, {t}"));
                    }
                }
                self.insf(format_args!("selp.b32 {r}, 0, {r}, {zero}"));
            }
            op => {
                let p = self.p();
                self.insf(format_args!("setp.{}.s32 {p}, {x}, {y}", cmp(op)));
                self.insf(format_args!("selp.b32 {r}, 1, 0, {p}"));
            }
        }
    }
}
