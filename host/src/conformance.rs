//! `tessel conformance --backend NAME`: the standard suite, against any backend or plugin.
//!
//! - **lower**: every suite kernel lowers, or the backend refuses it with a reason (no device);
//! - **run**: every kernel it takes runs on seeded inputs and agrees with the interpreter within
//!   its dtype's tolerance (skipped, with the reason, where the backend is unavailable);
//! - **refuse**: a `device(...)` mesh given as a kernel mesh is refused;
//! - **mesh**: each mesh kind the backend makes round-trips through `make_mesh` and its portable
//!   view.
//!
//! The kernels are compiled into the binary, so the suite runs from any folder and on a machine
//! that has only the binary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use tessel_plugin_api::abi::MeshBox;
use tessel_plugin_api::backend::mesh_spec;
use tessel_plugin_api::mesh::MeshSpec;

use tessel_plugin_api::array::agreement;

use crate::{Call, Choice, Launch, LaunchArgs, Runtime};

/// The suite's kernels: (name, text, the mesh a kernel without grid needs).
pub const KERNELS: &[(&str, &str, Option<&str>)] = &[
    ("add", include_str!("../../examples/add.tk"), None),
    ("fused", include_str!("../../examples/fused.tk"), None),
    ("transpose_bias", include_str!("../../examples/transpose_bias.tk"), None),
    ("row_reduce", include_str!("../../examples/row_reduce.tk"), None),
    ("matmul", include_str!("../../examples/matmul.tk"), None),
    ("softmax", include_str!("../../examples/softmax.tk"), None),
    ("masked", include_str!("../../examples/masked.tk"), None),
    ("ragged", include_str!("../../examples/ragged.tk"), None),
    ("flash_attention", include_str!("../../examples/flash_attention.tk"), None),
    ("ops", include_str!("../../tests/in/ops.tk"), None),
    ("half", include_str!("../../tests/in/half.tk"), None),
    ("pow", include_str!("../../tests/in/pow.tk"), None),
    ("warpgroups", include_str!("../../tests/in/warpgroups.tk"), None),
    ("dyn_grid", include_str!("../../tests/in/dyn_grid.tk"), None),
    ("mesh_grid", include_str!("../../tests/in/mesh_grid.tk"), Some("grid(i: 4, j: 2)")),
    ("long_loops", include_str!("../../tests/in/long/long_loops.tk"), None),
];

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It did what the suite asks.
    Pass,
    /// The backend declined, with its reason (a refusal, or no device).
    Skip(String),
    /// It did something wrong.
    Fail(String),
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// `lower`, `run`, `refuse`, `mesh`.
    pub part: &'static str,
    /// What was tried.
    pub case: String,
    /// How it ended.
    pub verdict: Verdict,
    /// A detail for passes (max error, stage sizes).
    pub detail: String,
}

fn row(part: &'static str, case: &str, verdict: Verdict, detail: impl Into<String>) -> Row {
    Row { part, case: case.to_string(), verdict, detail: detail.into() }
}

fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Runs the suite against `backend`.
pub fn run(rt: &Runtime, backend: &str) -> crate::Result<Vec<Row>> {
    let b = rt.backend(backend)?;
    let availability = b.backend.availability();
    let mut rows = Vec::new();
    for (name, text, mesh_text) in KERNELS {
        let kernels = crate::load_source(&format!("{name}.tk"), text)?;
        let kernel = &kernels[0];
        let mesh: Option<MeshBox> = match mesh_text {
            Some(m) => Some(rt.mesh_for(backend, m)?),
            None => None,
        };
        let call = Call { kernel: Arc::new(kernel.clone()), mesh: mesh.map(Arc::new) };
        let grid: BTreeMap<String, u64> = kernel
            .grid()
            .iter()
            .filter(|a| a.size == tessel_plugin_api::ir::AxisSize::Dyn)
            .map(|a| (a.name.clone(), 4))
            .collect();
        let launch = Launch::new([call.clone()], [], grid.clone());
        let planned = match rt.plan(Choice::Named(backend), &launch) {
            Ok(p) => p,
            Err(e) => {
                let reason = format!("refused: {}", first_line(&e));
                rows.push(row("lower", name, Verdict::Skip(reason.clone()), ""));
                rows.push(row("run", name, Verdict::Skip(reason), ""));
                continue;
            }
        };
        match planned.lower() {
            Ok(stages) => {
                let bytes: usize = stages.iter().map(|(_, t)| t.len()).sum();
                rows.push(row("lower", name, Verdict::Pass, format!("{} stage(s), {bytes} bytes", stages.len())));
            }
            Err(e) => rows.push(row("lower", name, Verdict::Fail(first_line(&e)), "")),
        }
        if !availability.available {
            rows.push(row("run", name, Verdict::Skip(format!("unavailable: {}", availability.reason)), ""));
            continue;
        }
        let args = LaunchArgs { inputs: crate::inputs::random_inputs(kernel.kernel(), 1), grid: grid.clone() };
        let got = planned.launch(&args);
        let want = rt
            .plan(crate::Choice::Named(tessel_interpret::NAME), &crate::Launch::new([call], [], args.grid.clone()))
            .and_then(|p| p.launch(&args));
        rows.push(match (got, want) {
            (Err(e), _) => row("run", name, Verdict::Fail(first_line(&e)), ""),
            (_, Err(e)) => row("run", name, Verdict::Fail(format!("the interpreter failed: {}", first_line(&e))), ""),
            (Ok(got), Ok(want)) => compare(name, &got, &want),
        });
    }
    // Every backend refuses a device mesh as a kernel mesh, in its own words.
    let add = &crate::load_source("add.tk", KERNELS[0].1)?[0];
    let device = rt.mesh(backend, "device(x: 2, y: 4)")?;
    let launch = crate::Launch::kernels([Call::on(add.clone(), device)]);
    rows.push(match rt.plan(crate::Choice::Named(backend), &launch).map(drop) {
        Err(e) => row("refuse", "device(x: 2, y: 4) as a kernel mesh", Verdict::Pass, first_line(&e)),
        Ok(()) => row("refuse", "device(x: 2, y: 4) as a kernel mesh", Verdict::Fail("accepted".into()), ""),
    });
    // Each kind the backend makes round-trips.
    let kinds: Vec<String> = b.backend.capabilities().mesh_kinds.iter().map(|k| k.to_string()).collect();
    for kind in kinds {
        let text = if kind == "mosaic_gpu" {
            "mosaic_gpu(i: 4, j: 2, c: 2 cluster, wg: 2 thread)".to_string()
        } else {
            format!("{kind}(i: 4, j: 2)")
        };
        let case = format!("make_mesh {text}");
        rows.push(match b.backend.make_mesh(text.as_str().into()).into_result() {
            Err(e) => row("mesh", &case, Verdict::Fail(first_line(&e)), ""),
            Ok(m) => {
                let back = mesh_spec(&m);
                let want = MeshSpec::parse(&text).expect("the suite's mesh text parses");
                if back == want {
                    row("mesh", &case, Verdict::Pass, m.display().to_string())
                } else {
                    row("mesh", &case, Verdict::Fail(format!("portable view {back} differs")), "")
                }
            }
        });
    }
    Ok(rows)
}

fn compare(name: &str, got: &[(String, crate::HostArray)], want: &[(String, crate::HostArray)]) -> Row {
    let mut worst = 0.0f64;
    for ((n, g), (_, w)) in got.iter().zip(want) {
        if g.ty() != w.ty() {
            return row("run", name, Verdict::Fail(format!("output {n} is {}, the interpreter's is {}", g.ty(), w.ty())), "");
        }
        let a = agreement(g, w);
        if !a.within {
            let e = a.max_abs_error;
            return row("run", name, Verdict::Fail(format!("output {n} differs from the interpreter: max abs error {e:e}")), "");
        }
        worst = worst.max(a.max_abs_error);
    }
    row("run", name, Verdict::Pass, format!("max abs error {worst:e}"))
}

/// The table, and whether everything that ran passed.
pub fn table(backend: &str, rows: &[Row]) -> (String, bool) {
    let mut out = String::new();
    let _ = writeln!(out, "conformance of {backend}");
    // The case column as wide as its longest case, so that no case spills into the status.
    let width = rows.iter().map(|r| r.case.chars().count()).max().unwrap_or(0).max(4);
    let _ = writeln!(out, "{:<7} {:<width$} {:<6} detail", "part", "case", "status");
    let (mut pass, mut skip, mut fail) = (0, 0, 0);
    for r in rows {
        let (word, detail) = match &r.verdict {
            Verdict::Pass => {
                pass += 1;
                ("ok", r.detail.clone())
            }
            Verdict::Skip(why) => {
                skip += 1;
                ("skip", why.clone())
            }
            Verdict::Fail(why) => {
                fail += 1;
                ("FAIL", why.clone())
            }
        };
        let _ = writeln!(out, "{:<7} {:<width$} {word:<6} {detail}", r.part, r.case);
    }
    let _ = writeln!(out, "{pass} passed, {skip} skipped, {fail} failed");
    (out, fail == 0)
}
