//! The module around the body (`finish`): the header comments that say how the kernel was
//! lowered, the constants, the storage bindings, the workgroup variables, the helper and maths
//! functions the body calls, and the entry point.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use tessel_plugin_api::ir::*;

use super::Writer;
use super::helpers::HELPERS;
use crate::conv::buf_ty;
use crate::lower::Strategy;

impl<'k> Writer<'k> {
    /// The header's account of the values owned in runs of rows
    /// ([`KernelPlan::row_runs`](crate::lower::KernelPlan::row_runs)), if any.
    fn runs(&self) -> String {
        let mut shapes = BTreeSet::new();
        tessel_plugin_api::ir::analysis::visit(&self.v.kernel().body, &mut |s| {
            for r in &s.results {
                let shape = &self.v.value_type(r).shape;
                if let Some((_, rows)) = self.plan.row_runs(shape) {
                    shapes.insert((shape.clone(), rows));
                }
            }
        });
        let runs: Vec<String> = shapes.iter().map(|(s, rows)| format!("{s:?} in runs of {rows} rows")).collect();
        if runs.is_empty() { String::new() } else { format!("; {}", runs.join(", ")) }
    }

    pub(super) fn finish(mut self, zeroed: &[String]) -> String {
        // Literals and the maths functions are written as text; the helpers they call are found
        // in it.
        for (name, _) in HELPERS {
            let call = format!("{name}(");
            if self.out.contains(&call) || self.libm.values().any(|f| f.contains(&call)) {
                self.helper(name);
            }
        }
        let mut m = self.summary(zeroed);
        self.declarations(&mut m);
        self.entry_point(&mut m);
        m
    }

    /// The comment lines that say what the plan decided (grid, strategy, layout, residency).
    fn summary(&self, zeroed: &[String]) -> String {
        let [gx, gy] = self.plan.groups;
        let groups = if gy == 1 { format!("{gx}") } else { format!("{gx}×{gy}") };
        let walk = if self.plan.strided { ", each walking the programs with a stride" } else { "" };
        let k = self.v.kernel();
        let mut m = String::new();
        let _ = writeln!(m, "// tessel: kernel `{}` for the wgpu backend", k.name);
        let grid: Vec<String> =
            self.grid.iter().map(|a| format!("{}: {}{}", a.name, a.size, if a.seq { " seq" } else { "" })).collect();
        let _ = writeln!(
            m,
            "// grid ({}): {} programs on {groups} workgroups of {} invocations{walk}; {} workspace bytes per workgroup",
            grid.join(", "),
            self.plan.programs,
            self.plan.wg,
            self.plan.workspace_words * 4
        );
        let _ = writeln!(
            m,
            "// strategy: {}",
            match self.plan.strategy {
                Strategy::Cpu => "cpu (operands read from their buffers; no workgroup memory)",
                Strategy::Gpu => "gpu (dot operands staged in workgroup memory; no row layout)",
            }
        );
        let _ = writeln!(
            m,
            "// elements: {}",
            if let Some(c) = self.plan.row_len() {
                format!("whole rows of {c} per invocation (row layout: reductions along rows stay in the invocation)")
            } else if self.plan.group > 1 && self.plan.dots {
                format!(
                    "each invocation owns groups of {} adjacent ones (register tiles for dot){}",
                    self.plan.group,
                    self.runs()
                )
            } else if self.plan.group > 1 {
                format!("each invocation owns groups of {} adjacent ones (vec4 reads and writes)", self.plan.group)
            } else {
                "one by one, invocation lid owning lid, lid + workgroup size, ...".to_string()
            }
        );
        if !self.plan.row_forwarded.is_empty() {
            let values = self.v.values();
            let mut names: Vec<String> = self.plan.row_forwarded.keys().map(|x| format!("%{}", values.name(x))).collect();
            names.sort();
            let _ = writeln!(m, "// loads read where they are used, a vec4 of the buffer at a time: {}", names.join(", "));
        }
        let values = self.v.values();
        if !self.plan.fused.is_empty() {
            let mut names: Vec<String> = (self.plan.fused.iter())
                .map(|(r, &(op, x))| format!("%{} ({} of %{})", values.name(r), op.name(), values.name(x)))
                .collect();
            names.sort();
            let _ = writeln!(m, "// reductions made in the loop that makes their operand: {}", names.join(", "));
        }
        if !self.plan.resident.is_empty() {
            let mut names: Vec<&str> = self.plan.resident.keys().map(String::as_str).collect();
            names.sort();
            let mut folded: Vec<&str> = self.plan.accumulating.keys().map(|x| values.name(x)).collect();
            folded.sort();
            let folded =
                if folded.is_empty() { String::new() } else { format!("; dots adding into them: %{}", folded.join(", %")) };
            let _ = writeln!(m, "// outputs kept in registers across the seq steps: {}{folded}", names.join(", "));
        }
        let _ = writeln!(
            m,
            "// outputs zeroed before the dispatch: {}",
            if zeroed.is_empty() { "none (each is stored whole before any read)".to_string() } else { zeroed.join(", ") }
        );
        let _ = writeln!(m);
        m
    }

    /// The constants, the bindings in order, and the workgroup and private variables.
    fn declarations(&self, m: &mut String) {
        let [gx, gy] = self.plan.groups;
        let k = self.v.kernel();
        let _ = writeln!(m, "const PROGRAMS: u32 = {}u;", self.plan.programs);
        let _ = writeln!(
            m,
            "const GROUPS: u32 = {};",
            if self.plan.strided { format!("{gx}u") } else { format!("{}u", u64::from(gx) * u64::from(gy)) }
        );
        let _ = writeln!(m, "const WS_WORDS: u32 = {}u;", self.plan.workspace_words);
        let _ = writeln!(m);
        let mut binding = 0;
        for (pi, p) in k.params.iter().enumerate() {
            if p.kind == ParamKind::Scratch {
                continue;
            }
            let access = if p.kind == ParamKind::In { "read" } else { "read_write" };
            let _ = writeln!(
                m,
                "@group(0) @binding({binding}) var<storage, {access}> a{pi}: array<{}>; // {} {}: {}{}",
                if self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi) {
                    format!("vec4<{}>", buf_ty(p.ty.dtype))
                } else {
                    buf_ty(p.ty.dtype).to_string()
                },
                p.kind.keyword(),
                p.name,
                p.ty,
                if self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi) { ", as vec4" } else { "" }
            );
            binding += 1;
        }
        if self.plan.workspace_words > 0 {
            let _ = writeln!(m, "@group(0) @binding({binding}) var<storage, read_write> tk_ws: array<u32>; // workspace");
            binding += 1;
        }
        for &pi in &self.views {
            let p = &k.params[pi];
            let _ = writeln!(
                m,
                "@group(0) @binding({binding}) var<storage, read> a{pi}v: array<vec4<{}>>; // {} again, as vec4",
                buf_ty(p.ty.dtype),
                p.name
            );
            binding += 1;
        }
        if self.plan.loop_budget.is_some() {
            let _ =
                writeln!(m, "@group(0) @binding({binding}) var<storage, read_write> tk_status: array<u32>; // the loop check");
        }
        if self.uses_broadcast {
            let _ = writeln!(m, "var<workgroup> tk_bc: u32;");
        }
        if self.staged.0 > 0 {
            let _ = writeln!(m, "var<workgroup> tk_sa: array<u32, {}>; // dot operand chunks", self.staged.0);
            let _ = writeln!(m, "var<workgroup> tk_sb: array<u32, {}>;", self.staged.1);
        }
        if self.helpers.contains("tk_f32_bits") {
            let _ = writeln!(m, "var<private> tk_zero: u32;");
        }
        let _ = writeln!(m);
    }

    /// The helpers and maths functions used, then `main`: the program index, the body, the
    /// loop-budget check.
    fn entry_point(&self, m: &mut String) {
        let gx = self.plan.groups[0];
        for (name, text) in HELPERS {
            if self.helpers.contains(name) {
                let _ = writeln!(m, "{text}\n");
            }
        }
        for text in self.libm.values() {
            let _ = writeln!(m, "{text}");
        }
        let _ = writeln!(m, "@compute @workgroup_size({})", self.plan.wg);
        let _ = writeln!(m, "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{");
        if self.helpers.contains("tk_f32_bits") {
            // The dispatch is one workgroup deep, so `wid.z` is 0, which no compiler can know.
            m.push_str("    tk_zero = wid.z;\n");
        }
        m.push_str(&format!("    let gid = wid.y * {gx}u + wid.x;\n"));
        if self.plan.workspace_words > 0 {
            m.push_str("    let wsb = gid * WS_WORDS;\n");
        }
        m.push_str(&self.out);
        if let Some(budget) = self.plan.loop_budget {
            let _ = writeln!(
                m,
                "    // The driver stops every loop of an invocation once {budget} iterations ran in it: then a loop"
            );
            m.push_str("    // that must run twice runs once, and the launch is reported as failed.\n");
            m.push_str("    var tk_runs = 0u;\n");
            m.push_str("    loop { tk_runs += 1u; if (tk_runs >= 2u + wid.z) { break; } }\n");
            m.push_str("    if (tk_runs < 2u) { tk_status[0] = 1u; }\n");
        }
        m.push_str("}\n");
    }
}
