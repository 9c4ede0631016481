//! The plan printed ([`PlanText`]): every decision [`super::plan`] made, in the order of
//! [`KernelPlan`]'s fields, arguments and values by name (`tessel lower --backend wgpu --plan`, and
//! the `plan-wgsl-*` snapshots of `tests/lowering.rs`).

use std::collections::BTreeSet;

use tessel_plugin_api::backend::PlanText;
use tessel_plugin_api::ir::analysis;
use tessel_plugin_api::ir::print::print_stmt_head;

use super::KernelPlan;

/// The plan as text.
pub fn text(plan: &KernelPlan) -> String {
    let k = plan.kernel.kernel();
    let param = |pi: usize| k.params[pi].name.clone();
    let params = |set: &BTreeSet<usize>| set.iter().map(|&pi| param(pi)).collect::<Vec<_>>();
    let value = |id| format!("%{}", plan.kernel.values().name(id));
    let grid: Vec<String> =
        plan.grid.iter().map(|a| format!("{}: {}{}", a.name, a.size, if a.seq { " seq" } else { "" })).collect();
    let mut t = PlanText::new(&plan.kernel);
    t.line("launch grid", format!("({})", grid.join(", ")))
        .line("strategy", plan.strategy.name())
        .line("loop budget", plan.loop_budget.map_or_else(|| "none".to_string(), |b| b.to_string()))
        .line("programs", plan.programs)
        .line("seq steps a program", plan.steps)
        .line("elements an invocation owns together", plan.group)
        .line(
            "row layout",
            plan.row_layout.map_or_else(|| "no".to_string(), |(len, wg)| format!("rows of {len}, {wg} invocations a workgroup")),
        )
        .line("has dot", plan.dots)
        .names("outputs resident in registers", plan.resident.keys())
        .value_map("dots adding into a resident output", &plan.accumulating, |&(pi, a, b)| {
            format!("{} (from {} {})", param(pi), value(a), value(b))
        })
        .names("outputs bound as vec4", params(&plan.quad_outputs))
        .names("inputs bound as vec4", params(&plan.quad_inputs))
        .value_map("whole input blocks, read from the buffer", &plan.forwarded, |&pi| param(pi))
        .value_set("of those, read by dots only", &plan.dot_only)
        .value_set("values computed where read", &plan.inlined)
        .value_map("row-layout loads read in place", &plan.row_forwarded, |&pi| param(pi))
        .value_map("reductions fused into their operand's loop", &plan.fused, |&(op, of)| {
            format!("{} of {}", op.name(), value(of))
        })
        .value_set("fused operands held nowhere", &plan.fused_only)
        .line("invocations a workgroup", plan.wg)
        .line("workspace words a workgroup", plan.workspace_words)
        .names("scratch in the workspace, at word", plan.scratch_words.iter().map(|(n, w)| format!("{n} {w}")))
        .value_map("values published to the workspace, at word", &plan.published_words, u64::to_string)
        .line(
            "dispatch",
            format!(
                "{} x {} workgroups{}",
                plan.groups[0],
                plan.groups[1],
                if plan.strided { ", strided over the programs" } else { "" }
            ),
        )
        .line("invocations share memory", plan.shares)
        .line("stores outside registers", plan.stores)
        .names("inputs also bound as vec4 views", params(&plan.views));
    // The barriers, each beside its statement's number and head.
    let mut stmts = Vec::new();
    analysis::visit(&k.body, &mut |s| stmts.push(s));
    let m = &plan.meetings;
    let points: Vec<_> = m.points().collect();
    t.line("barrier at each program's top", m.program_top())
        .line("barrier at each step's top", m.step_top())
        .line("barriers in statements", points.len());
    for (n, site, barrier) in points {
        t.line(&format!("  #{n} {}", print_stmt_head(stmts[n])), format!("{} ({barrier})", site));
    }
    t.finish()
}
