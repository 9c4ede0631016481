//! The lowering of every kernel file (`examples/*.tk`, `tests/in/{,regressions/,pallas/}*.tk`) for
//! every target and strategy, through each backend's compiler directly: no host, no plugin, no
//! adapter, no subprocess. One snapshot per (file, target) in `snapshots/lowering/`:
//!
//! - `ptx@FILE`: Mosaic GPU's PTX for sm_90a (the file's first kernel), assembled by NVIDIA's
//!   `ptxas`, whose register and spill counts are `ptxas@FILE`;
//! - `wgsl-cpu@FILE` and `wgsl-gpu@FILE`: the wgpu backend's WGSL under each strategy (every kernel
//!   of the file, as one launch), with llvmpipe's loop check, each module validated by naga;
//! - `plan-ptx@FILE`, `plan-wgsl-cpu@FILE`, `plan-wgsl-gpu@FILE`: the plan each was written from,
//!   as `tessel lower --plan` prints it (`Compiler::plan_text`): every decision of layout,
//!   residency, workspace and dispatch, so that a change of plan shows beside the code it makes.
//!
//! The text is as `tessel lower` prints it. Review changes with `cargo insta review`; never
//! accept them blindly. A file Mosaic GPU refuses by design is listed with its refusal.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::{assemble, ptxas, root, skip};
use tessel_mosaic_gpu::{MosaicGpu, Schedule};
use tessel_plugin_api::abi::MeshBox;
use tessel_plugin_api::backend::{BackendImpl, Call, Compiler, Request};
use tessel_plugin_api::ir::{self, Kernel};
use tessel_plugin_api::mesh::MeshSpec;
use tessel_wgpu::lower::{Strategy, Target};
use tessel_wgpu::{Wgpu, WgpuCompiler};

/// Kernel files the Mosaic GPU backend refuses by design, with the refusal's first line.
const REFUSED_BY_MOSAIC: &[(&str, &str)] = &[
    ("dyn_grid", "dynamic grid bounds not supported in the Mosaic GPU backend"),
    ("dyn_from_input", "dynamic grid bounds not supported in the Mosaic GPU backend"),
    // Megablox's grid is as long as the count of active tiles, an operand (Pallas's own refusal).
    ("tpu_megablox_gmm", "dynamic grid bounds not supported in the Mosaic GPU backend"),
];

/// The loop budget of Mesa's llvmpipe (`backends/wgpu-fallback/src/lower/loops.rs`), so that the
/// WGSL is the same on every machine, adapter or not.
const LOOP_BUDGET: u64 = 65535;

/// The file's kernels, as the host sends them to a backend: canonical text, parsed again.
fn kernels(path: &Path) -> Vec<Arc<Kernel>> {
    let verified = tessel::load_file(path).unwrap_or_else(|e| panic!("{e}"));
    let text: Vec<String> = verified.iter().map(|v| ir::print_kernel(v.kernel())).collect();
    let module = ir::parse(&text.join("\n")).unwrap_or_else(|e| panic!("{}: canonical text: {e}", path.display()));
    module.kernels.into_iter().map(Arc::new).collect()
}

/// The stem of a kernel file (`mesh_grid`).
fn stem(path: &Path) -> &str {
    path.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 file name")
}

/// The stages as `tessel lower` prints them.
fn printed(backend: &str, stages: &[(String, String)]) -> String {
    stages.iter().map(|(name, text)| format!("// ---- {name} ({backend}) ----\n{text}\n")).collect()
}

/// `text` as snapshot `target` of the file the glob is at, under `snapshots/lowering/FOLDER`.
fn snapshot(folder: &str, target: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots/lowering").join(folder));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(target, text));
}

/// naga's validator with every check on; `Err` carries naga's report.
fn validate(name: &str, wgsl: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string_with_path(wgsl, name))?;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
        .validate(&module)
        .map(drop)
        .map_err(|e| e.emit_to_string_with_path(wgsl, name))
}

/// Mosaic GPU's PTX for the file's first kernel (with its mesh where it needs one), assembled by
/// `ptxas` where it is found; `false` where the backend refuses the file by design.
fn ptx(folder: &str, path: &Path, ptxas: Option<&Path>) -> bool {
    let name = stem(path);
    let backend = MosaicGpu::new();
    let mesh: Option<MeshBox> = (name == "mesh_grid")
        .then(|| backend.make_mesh(&MeshSpec::parse("mosaic_gpu(i: 4, j: 2)").expect("a mesh")).expect("its own mesh"));
    let launch = Request::new(vec![Call { kernel: kernels(path).remove(0), mesh: mesh.as_ref() }], Vec::new(), BTreeMap::new());
    let refusal = REFUSED_BY_MOSAIC.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
    let compiler = backend.compiler().expect("a compiler");
    let stages = match (compiler.lower(&launch), refusal) {
        (Ok(stages), None) => stages,
        (Err(e), Some(first)) => {
            assert_eq!(e.message.lines().next(), Some(first), "{name}: refusal {}", e.message);
            return false;
        }
        (Ok(_), Some(_)) => panic!("{name} was expected to be refused"),
        (Err(e), None) => panic!("{name} does not lower for Mosaic GPU:\n{}", e.message),
    };
    let [(stage, text)] = stages.as_slice() else { panic!("{name}: one PTX module, got {}", stages.len()) };
    assert!(text.contains(".version 8.0\n.target sm_90a\n.address_size 64\n"), "{name}: header");
    snapshot(folder, "ptx", &printed("mosaic-gpu", &stages));
    snapshot(folder, "plan-ptx", &compiler.plan_text(&compiler.plan(&launch).expect("planned")));
    match ptxas {
        Some(p) => {
            let info = assemble(p, name, text).unwrap_or_else(|e| panic!("ptxas rejects {stage} of {name}:\n{e}"));
            assert!(info.contains("registers"), "{name}: {info}");
            snapshot(folder, "ptxas", &info);
        }
        None => skip(&format!("ptxas for {name}"), "ptxas not found (scripts/test installs it from pip)", "TESSEL_REQUIRE_PTXAS"),
    }
    // The Hopper path's other schedules (`TESSEL_MOSAIC_SCHEDULE`), for the files that show them
    // best: `ptx-specialized@FILE`, `ptx-persistent@FILE` and their `ptxas-` counts.
    if let Some((_, schedules)) = SCHEDULED.iter().find(|(n, _)| *n == name) {
        for &schedule in *schedules {
            let stages = MosaicGpu::with_schedule(schedule).lower(&launch).unwrap_or_else(|e| panic!("{name}: {}", e.message));
            snapshot(folder, &format!("ptx-{}", schedule.name()), &printed("mosaic-gpu", &stages));
            if let Some(p) = ptxas {
                let info = assemble(p, name, &stages[0].1)
                    .unwrap_or_else(|e| panic!("ptxas rejects {name} ({}):\n{e}", schedule.name()));
                snapshot(folder, &format!("ptxas-{}", schedule.name()), &info);
            }
        }
    }
    true
}

/// Files whose PTX is also snapshotted under the Hopper path's other schedules: the pipeline
/// turning over (seven steps through four stages), the epilogue (bias and gelu), and causal
/// attention (whose persistent schedule is its specialized one).
const SCHEDULED: &[(&str, &[Schedule])] = &[
    ("wgmma_steps", &[Schedule::Specialized, Schedule::Persistent]),
    ("wgmma_epilogue", &[Schedule::Specialized, Schedule::Persistent]),
    ("attention_causal_bf16", &[Schedule::Specialized]),
];

/// The wgpu backend's WGSL of every kernel of the file, as one launch, under `strategy`: each
/// module validated by naga. Returns how many modules it checked.
fn wgsl(folder: &str, path: &Path, strategy: Strategy) -> usize {
    let name = stem(path);
    let mesh: Option<MeshBox> =
        (name == "mesh_grid").then(|| Wgpu::new().make_mesh(&MeshSpec::parse("grid(i: 4, j: 2)").expect("a mesh")).expect("a mesh"));
    let grid: BTreeMap<String, u64> = if name == "dyn_grid" { [("i".to_string(), 3)].into() } else { BTreeMap::new() };
    let calls = kernels(path).into_iter().map(|kernel| Call { kernel, mesh: mesh.as_ref() }).collect();
    let launch = Request::new(calls, Vec::new(), grid);
    let compiler = WgpuCompiler::new(Target { strategy, loop_budget: Some(LOOP_BUDGET) });
    let stages = compiler.lower(&launch).unwrap_or_else(|e| panic!("{name} does not lower for wgpu:\n{}", e.message));
    for (stage, text) in &stages {
        validate(stage, text).unwrap_or_else(|e| panic!("naga rejects {stage} of {name}:\n{e}\n{text}"));
        // WebGPU's default maxStorageBuffersPerShaderStage: vec4 views must not push past it.
        // (The loop check's status word is bound only on llvmpipe, whose limit is far higher. A
        // kernel of more arrays than 8 less the workspace needs an adapter with more, as every
        // desktop one has; the launch checks the adapter's limit and names it.)
        let bindings = text.matches("@binding(").count() - text.matches("tk_status: array<u32>").count();
        let views = text.matches("again, as vec4").count();
        assert!(
            bindings <= 8 || views == 0,
            "{stage} of {name} has {bindings} storage bindings, {views} of them vec4 views, more than WebGPU's default 8"
        );
        assert!(text.contains(&format!("// strategy: {}", strategy.name())), "{stage} of {name}: the strategy in the header");
    }
    snapshot(folder, &format!("wgsl-{}", strategy.name()), &printed("wgpu", &stages));
    snapshot(folder, &format!("plan-wgsl-{}", strategy.name()), &compiler.plan_text(&compiler.plan(&launch).expect("planned")));
    stages.len()
}

/// Every target of one kernel file.
fn lower_everywhere(folder: &str, path: &Path, ptxas: Option<&Path>, counts: &mut (usize, usize)) {
    counts.0 += usize::from(ptx(folder, path, ptxas));
    counts.1 += wgsl(folder, path, Strategy::Cpu) + wgsl(folder, path, Strategy::Gpu);
}

#[test]
fn every_kernel_file_lowers_for_every_target() {
    let ptxas = ptxas();
    let mut counts = (0, 0);
    insta::glob!("../examples", "*.tk", |path| lower_everywhere("examples", path, ptxas.as_deref(), &mut counts));
    insta::glob!("in", "{*.tk,regressions/*.tk,pallas/*.tk}", |path| lower_everywhere("in", path, ptxas.as_deref(), &mut counts));
    let files = common::kernel_files().len();
    assert!(files >= 60, "only {files} kernel files");
    assert_eq!(counts.0 + REFUSED_BY_MOSAIC.len(), files, "every file lowered for Mosaic GPU or refused by design");
    assert!(counts.1 >= 2 * files, "only {} WGSL modules validated for {files} files", counts.1);
}
