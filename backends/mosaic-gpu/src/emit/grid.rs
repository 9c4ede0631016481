//! Where a thread is, for both paths: its lane, warpgroup and CTA (`%tid.x`, `%ctaid.x`), the
//! grid coordinates decoded from a counter, and the element origin of every argument's block at
//! those coordinates.

use tessel_plugin_api::ir::AxisSize;

use super::writer::Writer;
use crate::limits::THREADS;

impl Writer<'_> {
    /// `%tid.x`, the thread's lane in its warpgroup (`self.tid`) and its warpgroup
    /// (`self.warpgroup`), `%ctaid.x`: the registers of `%tid.x` and `%ctaid.x`.
    pub(super) fn write_ids(&mut self) -> (String, String) {
        let tid_x = self.r();
        self.ins(format!("mov.u32 {tid_x}, %tid.x"));
        self.tid = self.r();
        self.warpgroup = self.r();
        let (tid, wg) = (self.tid.clone(), self.warpgroup.clone());
        self.ins(format!("rem.u32 {tid}, {tid_x}, {THREADS}"));
        self.ins(format!("div.u32 {wg}, {tid_x}, {THREADS}"));
        let cta = self.r();
        self.ins(format!("mov.u32 {cta}, %ctaid.x"));
        (tid_x, cta)
    }

    /// The coordinates of grid `axes` from the row-major `counter` over them (the last fastest).
    pub(super) fn decode(&mut self, counter: &str, axes: &[usize]) {
        let grid = self.plan.kernel.grid();
        let mut stride: u64 = 1;
        for &a in axes.iter().rev() {
            let AxisSize::Fixed(n) = grid[a].size else { unreachable!("plan refuses dyn axes") };
            let c = self.r();
            self.ins(format!("div.u32 {c}, {counter}, {stride}"));
            self.ins(format!("rem.u32 {c}, {c}, {n}"));
            self.coords[a] = c;
            stride *= n;
        }
    }

    /// The origin registers [`Writer::write_origins`] made for argument `name`.
    pub(super) fn origin_of(&self, name: &str) -> Vec<String> {
        self.origins.iter().find(|(n, _)| n == name).map(|(_, o)| o.clone()).expect("origins computed")
    }

    /// Element origin of every argument's block at this grid point: `E_d * B_d`.
    pub(super) fn write_origins(&mut self) {
        let k = self.plan.kernel.kernel();
        let grid = self.plan.kernel.grid().to_vec();
        self.origins.clear();
        for p in &k.params {
            let mut regs = Vec::new();
            if let Some(b) = &p.block {
                for (e, &bs) in b.index.iter().zip(&b.shape) {
                    let o = self.r();
                    self.ins(format!("mov.b32 {o}, {}", e.constant as i32));
                    for (c, name) in &e.terms {
                        let a = grid.iter().position(|g| &g.name == name).expect("verified axis");
                        let coord = self.coords[a].clone();
                        self.ins(format!("mad.lo.s32 {o}, {coord}, {}, {o}", *c as i32));
                    }
                    self.ins(format!("mul.lo.s32 {o}, {o}, {bs}"));
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
}
