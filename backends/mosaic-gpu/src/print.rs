//! The plan printed ([`PlanText`]): every decision [`crate::lower::plan`] made, in the order of
//! [`KernelPlan`]'s fields, arguments and values by name (`tessel lower --backend mosaic-gpu --plan`,
//! and the `plan-ptx` snapshots of `tests/lowering.rs`).

use tessel_plugin_api::backend::PlanText;
use tessel_plugin_api::ir::analysis;
use tessel_plugin_api::ir::print::print_stmt_head;

use crate::lower::meetings::At;
use crate::lower::{KernelPlan, Slot};
use crate::wgmma::{Init, TensorMapSpec};

/// `byte 64: f32[128, 4]`.
fn slot(s: &Slot) -> String {
    let dims: Vec<String> = s.shape.iter().map(usize::to_string).collect();
    format!("byte {}: {}[{}]", s.offset, s.dtype.name(), dims.join(", "))
}

/// `a_map (a, boxes 64 x 128, swizzle 128)`.
fn map(m: &TensorMapSpec) -> String {
    let boxes: Vec<String> = m.boxes.iter().map(u32::to_string).collect();
    format!("{} ({}, boxes {}, swizzle {})", m.param, m.array, boxes.join(" x "), m.swizzle)
}

fn maps(ms: &[TensorMapSpec]) -> String {
    if ms.is_empty() { "none".to_string() } else { ms.iter().map(map).collect::<Vec<_>>().join(", ") }
}

/// The plan as text.
pub fn text(plan: &KernelPlan) -> String {
    let mut t = PlanText::new(&plan.kernel);
    t.line("entry", &plan.entry)
        .line("ctas", plan.ctas)
        .line("warpgroups a cta", plan.warpgroups)
        .line("thread points", plan.thread_points)
        .line("thread axis", plan.thread_axis.and_then(|a| plan.kernel.grid().get(a)).map_or("none", |a| a.name.as_str()))
        .line("threads a cta", plan.threads())
        .line("workspace", if plan.shared { "shared memory" } else { "global memory" })
        .line("workspace bytes a cta", plan.workspace_per_cta)
        .line("scratch bytes", plan.scratch_bytes)
        .line("value bytes a warpgroup", plan.value_bytes)
        .line("barrier bytes", plan.barrier_bytes)
        .line("shared bytes", plan.shared_bytes())
        .line("global workspace bytes", plan.global_workspace_bytes())
        .value_set("values in registers", &plan.in_registers);
    let mut scratch: Vec<(&String, &Slot)> = plan.scratch.iter().collect();
    scratch.sort_by_key(|(n, s)| (s.offset, n.as_str()));
    t.line("scratch slots", scratch.len());
    for (name, s) in scratch {
        t.line(&format!("  {name}"), slot(s));
    }
    t.line("value slots", plan.values.len());
    for (id, s) in plan.values.iter() {
        t.line(&format!("  %{}", plan.kernel.values().name(id)), slot(s));
    }
    t.value_map("carried values' yield slots", &plan.yielded, slot);
    t.line("tensor maps", maps(&plan.maps));
    match &plan.gemm {
        None => t.line("hopper matmul", "no"),
        Some(g) => t.line(
            "hopper matmul",
            format!(
                "{} x {} into {} (out {} {}), {}, blocks {} x {} x {}, a {}, b {}, {} steps, {} stages, from {}, schedule {}, epilogue {}, maps {}",
                g.a,
                g.b,
                g.c,
                g.out,
                g.out_dtype.name(),
                g.dtype.name(),
                g.bm,
                g.bn,
                g.bk,
                if g.a_k_major { "k-major" } else { "m-major" },
                if g.b_k_major { "k-major" } else { "n-major" },
                g.steps,
                g.stages,
                match g.init {
                    Init::Zero => "zero",
                    Init::Output => "the output",
                },
                g.schedule.name(),
                g.epilogue.as_ref().map_or_else(|| "none".to_string(), |e| format!("{} statements on %{}", e.stmts.len(), e.acc)),
                maps(&g.maps)
            ),
        ),
    };
    match &plan.attention {
        None => t.line("hopper attention", "no"),
        Some(a) => t.line(
            "hopper attention",
            format!(
                "{} {} {} -> {}, {}, blocks q {} x {} kv {} x {}, {} stages, scores %{}, product %{}{}, starts {} {}, schedule {}, maps {}",
                a.q,
                a.k,
                a.v,
                a.out,
                a.dtype.name(),
                a.bq,
                a.d,
                a.bkv,
                a.dv,
                a.stages,
                a.scores,
                a.product,
                a.folded.as_ref().map_or_else(String::new, |f| format!(" folded into %{f}")),
                a.k_start,
                a.v_start,
                a.schedule.name(),
                maps(&a.maps)
            ),
        ),
    };
    let mut swizzled: Vec<String> = plan.mma.swizzled.iter().map(|(n, b)| format!("{n} ({b} bytes)")).collect();
    swizzled.sort();
    let accumulators: Vec<String> = plan.mma.accumulators.iter().map(|(n, [m, nn])| format!("{n} [{m}, {nn}]")).collect();
    t.names("wgmma operands swizzled", swizzled)
        .line(
            "wgmma accumulators in registers",
            if accumulators.is_empty() { "none".to_string() } else { accumulators.join(", ") },
        )
        .line("wgmma takes every product", plan.mma.all)
        .names("wgmma operands threads write", &plan.mma.thread_written);
    // The meetings, each beside its statement's number and head.
    let mut stmts = Vec::new();
    analysis::visit(&plan.kernel.kernel().body, &mut |s| stmts.push(s));
    let points: Vec<(usize, At)> = plan.meetings.points().collect();
    t.line("meetings", points.len()).line("meeting after each step", plan.meetings.after_step());
    for (n, at) in points {
        t.line(&format!("  #{n} {}", print_stmt_head(stmts[n])), at);
    }
    t.finish()
}
