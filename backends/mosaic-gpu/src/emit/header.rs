//! The PTX around the body, written last because it declares what the body used: the comment
//! lines saying what the kernel became, `.version`/`.target`, the dynamic shared memory, the
//! entry's parameters (workspace, arrays, tensor maps) and the register declarations.

use std::fmt::Write as _;

use tessel_plugin_api::ir::ParamKind;

use super::writer::Writer;
use crate::wgmma::{PRODUCER_REGISTERS, SWIZZLE, Schedule};

/// The dynamic shared memory of a CTA: its workspace when it fits.
pub(super) const SHARED: &str = "tessel_smem";

impl Writer<'_> {
    pub(super) fn finish(self) -> String {
        let k = self.plan.kernel.kernel();
        let mut head = String::new();
        let _ = writeln!(head, "// tessel: kernel `{}` for the Mosaic GPU backend", k.name);
        let _ = writeln!(
            head,
            "// {} CTAs of {} threads, {} bytes of {} per CTA",
            self.plan.ctas,
            self.plan.threads(),
            self.plan.workspace_per_cta,
            if self.plan.shared { "shared memory" } else { "global workspace" }
        );
        if !self.plan.shared && self.plan.scratch_shared() {
            let _ = writeln!(head, "// the scratch: {} bytes of shared memory from byte 0", self.plan.scratch_bytes);
        }
        if self.plan.barrier_bytes > 0 {
            let _ = writeln!(
                head,
                "// {} mbarriers: {} bytes of shared memory from byte {}; warpgroups run at once and wait on them",
                self.plan.barrier_bytes / 8,
                self.plan.barrier_bytes,
                self.plan.barrier_offset()
            );
        }
        let gemm = self.plan.gemm.as_ref();
        // After the Hopper path's line: how its warpgroups divide the work, where they do.
        let specialized = |head: &mut String| {
            if let Some((producer, entry, consumer)) = self.plan.specialized() {
                let _ = writeln!(
                    head,
                    "// warp-specialized: warpgroup {producer} produces (setmaxnreg {PRODUCER_REGISTERS}), the others consume ({consumer} registers, {entry} at entry); stages handed over on full and empty mbarriers",
                );
            }
        };
        if let Some(g) = gemm {
            let _ = writeln!(
                head,
                "// hopper: dot of {} {} x {} on wgmma m64n{}k16 ({} warpgroup{}), operands by TMA with {}-byte swizzle, {} stages over {} steps, into {} ({})",
                g.dtype,
                if g.a_k_major { format!("[{}, {}]", g.bm, g.bk) } else { format!("[{}, {}]^T", g.bk, g.bm) },
                if g.b_k_major { format!("[{}, {}]^T", g.bn, g.bk) } else { format!("[{}, {}]", g.bk, g.bn) },
                g.bn,
                g.warpgroups(),
                if g.warpgroups() == 1 { "" } else { "s" },
                SWIZZLE,
                g.stages,
                g.steps,
                g.out,
                g.out_dtype
            );
            specialized(&mut head);
            if g.schedule == Schedule::Persistent {
                let _ = writeln!(
                    head,
                    "// persistent: min({}, SMs) CTAs, each looping over output blocks %ctaid.x, + %nctaid.x, ...",
                    self.plan.ctas
                );
            }
        }
        if let Some(a) = &self.plan.attention {
            let _ = writeln!(
                head,
                "// hopper: attention of {} q [{}, {}] against k [{}, {}]^T and v [{}, {}] a trip, wgmma m64n{}k16 and m64n{}k16 ({} warpgroup{}), operands by TMA with {}-byte swizzle, {} stages, into {}",
                a.dtype,
                a.bq,
                a.d,
                a.bkv,
                a.d,
                a.bkv,
                a.dv,
                a.bkv,
                a.dv,
                a.warpgroups(),
                if a.warpgroups() == 1 { "" } else { "s" },
                SWIZZLE,
                a.stages,
                a.out
            );
            specialized(&mut head);
        }
        for m in self.plan.tensor_maps() {
            let boxes: Vec<String> = m.boxes.iter().map(u32::to_string).collect();
            let _ = writeln!(
                head,
                "// tensor map {}_{}: {}, box {}, swizzle {}",
                self.plan.entry,
                m.param,
                m.array,
                boxes.join(" x "),
                m.swizzle
            );
        }
        let _ = writeln!(head, ".version 8.0\n.target sm_90a\n.address_size 64\n");
        let mut params = Vec::new();
        if self.plan.shared_bytes() > 0 {
            // The 128-byte swizzle repeats every 1024 bytes: its stages start on that boundary.
            let align = if self.plan.tensor_maps().is_empty() { 16 } else { 1024 };
            let _ = writeln!(head, ".extern .shared .align {align} .b8 {SHARED}[];\n");
        }
        if !self.plan.shared {
            params.push(format!("\t.param .u64 {}_workspace", self.plan.entry));
        }
        for p in k.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
            params.push(format!("\t.param .u64 {}_{}", self.plan.entry, p.name));
        }
        for m in self.plan.tensor_maps() {
            params.push(format!("\t.param .align 64 .b8 {}_{}[128]", self.plan.entry, m.param));
        }
        let _ = writeln!(
            head,
            ".visible .entry {}(\n{}\n)\n.maxntid {}, 1, 1",
            self.plan.entry,
            params.join(",\n"),
            self.plan.threads()
        );
        // Registers at entry, fixed: `setmaxnreg` moves registers between warpgroups of a CTA
        // whose count `ptxas` knows (else it drops them, C7508), and `inc` takes from that pool.
        if let Some(entry) = self.plan.entry_registers() {
            let _ = writeln!(head, ".maxnreg {entry}");
        }
        head.push_str("{\n");
        head.push_str(&self.names.declarations());
        if let Some(g) = gemm {
            let _ = writeln!(head, "\t.reg .f32 %f<{}>;", g.bn / 2 + 1);
        }
        for (i, (_, [m, n])) in self.plan.mma.accumulators.iter().enumerate() {
            let _ = writeln!(head, "\t.reg .f32 %acc{i}_<{}>;", m / crate::async_mma::WG_ROWS * n / 2);
        }
        head.push('\n');
        head + &self.out + "\tret;\n}\n"
    }
}
