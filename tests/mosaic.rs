//! The Mosaic GPU backend without a device: every refusal of DESIGN.md, reached from the command
//! line, first line byte for byte; PTX that runs on the emulator as the interpreter computes; the
//! Hopper paths taken. (The PTX of every kernel file, assembled by `ptxas`, is `tests/lowering.rs`.)

mod common;

use std::path::Path;

use common::*;

/// Kernel files the Mosaic GPU backend refuses by design, with the refusal's first line (their
/// refusals are checked in `tests/lowering.rs`).
const REFUSED: &[(&str, &str)] = &[
    ("dyn_grid", "dynamic grid bounds not supported in the Mosaic GPU backend"),
    ("dyn_from_input", "dynamic grid bounds not supported in the Mosaic GPU backend"),
    // Megablox's grid is as long as the count of active tiles, an operand (Pallas's own refusal).
    ("tpu_megablox_gmm", "dynamic grid bounds not supported in the Mosaic GPU backend"),
];

/// Kernel files whose kernel has no grid, with the mesh that gives it one.
const MESHES: &[(&str, &str)] = &[("mesh_grid", "mosaic_gpu(i: 4, j: 2)")];

fn mesh_for(name: &str) -> Option<&'static str> {
    MESHES.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

/// `tessel lower FILE --backend mosaic-gpu --kernel KERNEL`: the PTX, or the error.
fn lower(path: &Path, kernel: &str) -> Result<String, String> {
    let file = path.display().to_string();
    let r = tessel(&["lower", &file, "--backend", "mosaic-gpu", "--kernel", kernel]);
    if r.code == 0 { Ok(r.stdout) } else { Err(r.stderr) }
}

/// Runs `tessel ARGS` and returns (first line of stderr without `error: `, the rest).
fn refusal(args: &[&str]) -> (String, String) {
    let r = tessel(args);
    assert_eq!(r.code, 1, "{args:?} should be refused: {}{}", r.stdout, r.stderr);
    let text = r.stderr.strip_prefix("error: ").unwrap_or(&r.stderr).to_string();
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    assert!(!rest.trim().is_empty(), "{args:?}: a second line says what would work");
    (first.to_string(), text)
}

fn file(rel: &str) -> String {
    root().join(rel).display().to_string()
}

#[test]
fn every_refusal_of_design_md_first_line_byte_for_byte() {
    let add = file("examples/add.tk");
    let pair = file("tests/in/scratch_pair.tk");
    let two = file("tests/in/two_kernels.tk");
    let cases: Vec<(&str, Vec<&str>, String)> = vec![
        ("mesh_grid", vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "grid(i: 8)"], "Mesh grid(i: 8) is not supported by the Mosaic GPU backend".into()),
        ("mesh_device", vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "device(x: 2, y: 4)"], "Mesh device(x: 2, y: 4) is not supported by the Mosaic GPU backend".into()),
        ("external_mesh", vec!["lower", &add, "--backend", "mosaic-gpu", "--external-mesh", "device(x: 2)"], "External meshes are not supported by the Mosaic GPU backend".into()),
        ("multiple_pairs", vec!["lower", &two, "--backend", "mosaic-gpu", "--kernel", "scale", "--kernel", "shift"], "Lowering multiple mesh/function pairs is not supported by the Mosaic GPU backend".into()),
        ("dynamic_grid", vec!["lower", "tests/in/dyn_grid.tk", "--backend", "mosaic-gpu", "--grid", "i=4"], "dynamic grid bounds not supported in the Mosaic GPU backend".into()),
        ("scratch_mpmd", vec!["lower", &pair, "--backend", "mosaic-gpu", "--kernel", "copy_rows", "--kernel", "running_sum"], "Scratch operands are not supported by the Mosaic GPU mpmd_map lowering".into()),
        (
            "cluster_4d",
            vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "mosaic_gpu(i: 8, a: 1 cluster, b: 1 cluster, c: 1 cluster, d: 1 cluster)"],
            "cluster= must be at most 3D, got Mesh(grid=(8,), grid_names=('i',), cluster=(1, 1, 1, 1), cluster_names=('a', 'b', 'c', 'd'), num_threads=None, thread_name=None).".into(),
        ),
        (
            "too_many_threads",
            vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "mosaic_gpu(i: 8, wg: 17 thread)"],
            "Requested too many CUDA threads per block. Each Mosaic thread corresponds to 128 CUDA threads. At most 16 are supported, got Mesh(grid=(8,), grid_names=('i',), cluster=(), cluster_names=(), num_threads=17, thread_name='wg')".into(),
        ),
        (
            "two_thread_axes",
            vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "mosaic_gpu(i: 8, a: 2 thread, b: 2 thread)"],
            "num_threads and thread_name must be either both set or both None, got mosaic_gpu(i: 8, a: 2 thread, b: 2 thread)".into(),
        ),
        ("mixes_mesh_and_grid", vec!["lower", &add, "--backend", "mosaic-gpu", "--mesh", "mosaic_gpu(j: 8)"], "i mixes mesh and grid axes".into()),
    ];
    for (name, args, want) in cases {
        let args: Vec<&str> =
            args.iter().map(|a| if a.starts_with("tests/") { Box::leak(file(a).into_boxed_str()) as &str } else { a }).collect();
        let (first, text) = refusal(&args);
        assert_eq!(first, want, "{name}");
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(root().join("snapshots/errors"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.set_description(args.join(" ").replace(&root().display().to_string(), "."));
        settings.bind(|| insta::assert_snapshot!(format!("mosaic_{name}"), text.replace(&root().display().to_string(), ".")));
    }
}

#[test]
fn a_mesh_made_by_another_backend_is_refused() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let kernels = tessel::load_file(&root().join("examples/add.tk")).expect("add");
    let interpret_mesh = rt
        .registry()
        .get("interpret")
        .unwrap()
        .backend
        .make_mesh("grid(i: 8)".into())
        .into_result()
        .expect("interpret makes grid meshes");
    let call = [tessel::Call::on(kernels[0].clone(), interpret_mesh)];
    let err = lowered(&rt, "mosaic-gpu", &call).expect_err("foreign mesh").to_string();
    assert!(err.starts_with("Mesh grid(i: 8) is not supported by the Mosaic GPU backend\n"), "{err}");
    // The interpreter takes the Mosaic mesh's portable view.
    let mosaic_mesh = rt.mesh("mosaic-gpu", "mosaic_gpu(i: 8)").expect("mosaic mesh");
    let call = [tessel::Call::on(kernels[0].clone(), mosaic_mesh)];
    rt.plan(tessel::Choice::Named("interpret"), &tessel::Launch::kernels(call.clone()))
        .map(drop)
        .expect("interpret reads the portable view");
    lowered(&rt, "mosaic-gpu", &call).expect("mosaic takes its own mesh");
    // A portable grid spec becomes a Mosaic mesh when mosaic-gpu makes it.
    let made = rt.registry().get("mosaic-gpu").unwrap().backend.make_mesh("grid(i: 8)".into()).into_result().expect("made");
    assert_eq!(
        made.display().as_str(),
        "Mesh(grid=(8,), grid_names=('i',), cluster=(), cluster_names=(), num_threads=None, thread_name=None)"
    );
}

#[test]
fn without_a_gpu_mosaic_is_unavailable_with_a_reason() {
    let r = tessel(&["backends", "--json"]);
    assert_eq!(r.code, 0);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    let m = json["backends"].as_array().unwrap().iter().find(|b| b["name"] == "mosaic-gpu").expect("mosaic-gpu is built in");
    if m["available"] == true {
        eprintln!("mosaic-gpu is available here: {}", m["reason"]);
        return;
    }
    let reason = m["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no CUDA driver library") || reason.starts_with("no device") || reason.contains("compute capability"),
        "{reason}"
    );
    let dir = tempfile::tempdir().unwrap();
    let r = tessel(&["run", &file("examples/add.tk"), "--backend", "mosaic-gpu", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(r.code, 1);
    // Refused before anything is handed to it, with the reason `tessel backends` gives.
    assert!(r.stderr.contains(&format!("backend mosaic-gpu is unavailable: {reason}")), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

/// `ptx` run on the emulator with its threads in order and in reverse gives the interpreter's
/// outputs `want`, within each dtype's tolerance (a missing barrier makes an order differ).
fn agrees_in_both_orders(
    name: &str,
    ptx: &str,
    kernel: &tessel_plugin_api::ir::Verified,
    args: &tessel::LaunchArgs,
    want: &[(String, tessel::HostArray)],
) {
    for reverse in [false, true] {
        let got = emulate(ptx, kernel, args, reverse).unwrap_or_else(|e| panic!("{name}: {e}"));
        for ((n, g), (_, w)) in got.iter().zip(want) {
            let tol = tessel::Tolerance::for_dtype(w.dtype());
            let bad: Vec<String> = (g.to_f64().iter().zip(w.to_f64()).enumerate())
                .filter(|(_, (a, b))| !tol.close(**a, *b))
                .take(3)
                .map(|(i, (a, b))| format!("[{i}] {a} vs {b}"))
                .collect();
            assert!(bad.is_empty(), "{name}: output {n} (reverse={reverse}) differs from the interpreter: {}", bad.join(", "));
        }
    }
}

#[test]
fn emulated_ptx_agrees_with_the_interpreter() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let mut checked = 0;
    for path in kernel_files() {
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if REFUSED.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let kernels = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        // Every kernel of the file, each launched on its own.
        for kernel in &kernels {
            let name = format!("{name}/{}", kernel.name());
            let mesh = mesh_for(path.file_stem().unwrap().to_str().unwrap()).map(|m| rt.mesh("mosaic-gpu", m).expect("mesh"));
            let call = [tessel::Call { kernel: std::sync::Arc::new(kernel.clone()), mesh: mesh.map(std::sync::Arc::new) }];
            let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
            let args = tessel::LaunchArgs { inputs: file_inputs(&path, kernel, 7), grid: Default::default() };
            let want = launched(&rt, "interpret", &call, &args).expect("interpreter runs");
            // Both thread orders: a missing barrier would make them differ.
            agrees_in_both_orders(&name, &ptx, kernel, &args, &want);
            checked += 1;
        }
    }
    assert!(checked >= 24, "only {checked} kernels emulated");
}

#[test]
fn a_thread_axis_runs_as_the_warpgroups_of_one_cta() {
    use tessel::{Runtime, Tolerance};
    let rt = Runtime::new(&[]).expect("runtime");
    let kernels = tessel::load_file(&root().join("tests/in/warpgroups.tk")).expect("kernel");
    let mesh = rt.mesh("mosaic-gpu", "mosaic_gpu(i: 4, wg: 2 thread)").expect("mesh");
    let call = [tessel::Call::on(kernels[0].clone(), mesh)];
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
    assert!(
        ptx.contains("// 4 CTAs of 256 threads") && ptx.contains(".maxntid 256, 1, 1"),
        "one CTA of 2 x 128 threads per program"
    );
    assert!(ptx.contains("bar.sync %r"), "each warpgroup has its own barrier");
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 3), grid: Default::default() };
    let want = launched(&rt, "interpret", &call, &args).expect("the interpreter takes the portable view");
    for reverse in [false, true] {
        let got = emulate(&ptx, &kernels[0], &args, reverse).expect("emulates");
        let tol = Tolerance::for_dtype(want[0].1.dtype());
        assert!(got[0].1.to_f64().iter().zip(want[0].1.to_f64()).all(|(a, b)| tol.close(*a, b)), "reverse={reverse}");
    }
}

#[test]
fn a_thread_axis_past_eight_warpgroups_runs_several_points_per_warpgroup() {
    use tessel::{Runtime, Tolerance};
    // CUDA launches at most 1,024 threads per block, so 12 points of `wg` run on 8 warpgroups,
    // the first 4 taking two points each.
    let text = std::fs::read_to_string(root().join("tests/in/warpgroups.tk"))
        .unwrap()
        .replace("wg: 2)", "wg: 12)")
        .replace("2*i + wg", "12*i + wg")
        .replace("f32[8, 64]", "f32[48, 64]");
    let kernels = tessel::load_source("warpgroups12.tk", &text).expect("kernel");
    let rt = Runtime::new(&[]).expect("runtime");
    let mesh = rt.mesh("mosaic-gpu", "mosaic_gpu(i: 4, wg: 12 thread)").expect("mesh");
    let call = [tessel::Call::on(kernels[0].clone(), mesh)];
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
    assert!(ptx.contains("// 4 CTAs of 1024 threads") && ptx.contains("12 thread-axis points on 8 warpgroups"), "{ptx}");
    if let Some(ptxas) = ptxas() {
        assemble(&ptxas, "warpgroups12", &ptx).unwrap_or_else(|e| panic!("ptxas: {e}"));
    }
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 5), grid: Default::default() };
    let want = launched(&rt, "interpret", &call, &args).expect("the interpreter takes the portable view");
    for reverse in [false, true] {
        let got = emulate(&ptx, &kernels[0], &args, reverse).expect("emulates");
        let tol = Tolerance::for_dtype(want[0].1.dtype());
        assert!(got[0].1.to_f64().iter().zip(want[0].1.to_f64()).all(|(a, b)| tol.close(*a, b)), "reverse={reverse}");
    }
}

/// The kernels written for the Hopper path take it: their PTX copies operands with TMA, waits on
/// mbarriers and multiplies with `wgmma` (a kernel that fell to the general path would still
/// agree with the interpreter, so the emulator alone would not notice). An epilogue with a
/// reduction in it is not elementwise, and keeps its kernel on the general path.
#[test]
fn the_hopper_kernels_take_the_hopper_path() {
    let hopper = |ptx: &str| ptx.contains("wgmma.mma_async") && ptx.contains("cp.async.bulk.tensor") && ptx.contains("mbarrier");
    let files = [
        "tests/in/wgmma_bf16.tk",
        "tests/in/wgmma_f16_wide.tk",
        "tests/in/wgmma_scratch.tk",
        "tests/in/wgmma_steps.tk",
        "tests/in/wgmma_epilogue.tk",
        "tests/in/wgmma_trans_a.tk",
        "tests/in/attention_f16.tk",
        "tests/in/attention_causal_bf16.tk",
        "examples/matmul_bf16.tk",
        "benches/kernels/matmul_bf16_4096.tk",
        "benches/kernels/matmul_bf16_gelu_4096.tk",
        "benches/kernels/attention_bf16_16384.tk",
    ];
    for f in files {
        let path = root().join(f);
        let kernel = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"))[0].name().to_string();
        let ptx = lower(&path, &kernel).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(hopper(&ptx), "{f} fell off the Hopper path");
    }
    let text = std::fs::read_to_string(root().join("tests/in/wgmma_epilogue.tk")).expect("kernel file");
    let reduced = text.replace("    %y = mul %g, 0.5\n", "    %m = max %g axis 1 keepdims\n    %y = sub %g, %m\n");
    assert_ne!(reduced, text);
    let path = std::env::temp_dir().join(format!("tessel-epilogue-{}.tk", std::process::id()));
    std::fs::write(&path, reduced).expect("temporary kernel file");
    let ptx = lower(&path, "wgmma_epilogue");
    std::fs::remove_file(&path).ok();
    let ptx = ptx.unwrap_or_else(|e| panic!("the reducing epilogue: {e}"));
    assert!(!hopper(&ptx) && ptx.contains("mma.sync"), "an epilogue with a reduction took the Hopper path");
}

/// Mosaic GPU's PTX of `kernel` with the Hopper path on `schedule`, through the compiler directly
/// (`TESSEL_MOSAIC_SCHEDULE` is the process's, and tests run side by side).
fn on_schedule(kernel: &tessel_plugin_api::ir::Verified, schedule: tessel_mosaic_gpu::Schedule) -> String {
    use tessel_plugin_api::backend::{Call, Compiler, Request};
    let call = Call { kernel: std::sync::Arc::new(kernel.kernel().clone()), mesh: None };
    let launch = Request::new(vec![call], Vec::new(), Default::default());
    let stages = tessel_mosaic_gpu::MosaicGpu::with_schedule(schedule).lower(&launch).expect("lowers");
    stages.into_iter().next().expect("one module").1
}

/// The Hopper matmuls under each schedule `TESSEL_MOSAIC_SCHEDULE` names: the warp-specialized
/// kernel (a producer warpgroup for the copies, stages handed over on full and empty mbarriers)
/// and the persistent one (launched on half as many CTAs as it has output blocks, so that each
/// CTA loops over two and its pipeline runs on from one to the next) run on the
/// emulator as the interpreter computes, in both thread orders; the emulator refuses a copy into
/// a stage a `wgmma` still reads, so a stage handed back too early fails here. Each is assembled
/// by `ptxas` at 0 spills with no warning and no `setmaxnreg` dropped (C7508), the
/// 128x256 tiles of the 4096³ bench kernels included.
#[test]
fn every_schedule_of_the_hopper_matmuls_agrees_with_the_interpreter() {
    use tessel::{Runtime, Tolerance};
    use tessel_mosaic_gpu::Schedule;

    let rt = Runtime::new(&[]).expect("runtime");
    let ptxas = ptxas();
    let assembled = |name: &str, ptx: &str| {
        let Some(p) = &ptxas else { return };
        let info = assemble(p, name, ptx).unwrap_or_else(|e| panic!("ptxas rejects {name}:\n{e}"));
        let quiet = !info.contains("warning") && !info.contains("Potential Performance Loss");
        assert!(info.contains("0 bytes spill stores") && quiet, "{name}: {info}");
    };
    let mut checked = 0;
    for schedule in [Schedule::Specialized, Schedule::Persistent] {
        // The matmuls, then the attention kernels (warp-specialized on either schedule; a
        // program's trips already run in one CTA, so their grid stays as it is).
        let files = [
            "wgmma_bf16",
            "wgmma_f16_wide",
            "wgmma_scratch",
            "wgmma_steps",
            "wgmma_epilogue",
            "wgmma_trans_a",
            "attention_f16",
            "attention_causal_bf16",
        ];
        let mut kernels: Vec<(String, std::path::PathBuf, tessel_plugin_api::ir::Verified)> = files
            .iter()
            .map(|f| {
                let path = root().join(format!("tests/in/{f}.tk"));
                let kernel = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}")).remove(0);
                (f.to_string(), path, kernel)
            })
            .collect();
        // Five output blocks: a persistent grid of three CTAs takes two, two and one.
        let path = root().join("tests/in/wgmma_steps.tk");
        let text = std::fs::read_to_string(&path).expect("kernel file");
        let five = text
            .replace("grid (i: 2,", "grid (i: 5,")
            .replace("a: bf16[128,", "a: bf16[320,")
            .replace("c: f32[128,", "c: f32[320,");
        assert_ne!(five, text);
        kernels.push((
            "wgmma_steps, 5 blocks".into(),
            path,
            tessel::load_source("five.tk", &five).unwrap_or_else(|e| panic!("{e}")).remove(0),
        ));
        for (f, path, kernel) in &kernels {
            let name = format!("{f} ({})", schedule.name());
            let ptx = on_schedule(kernel, schedule);
            assert!(ptx.contains("// warp-specialized: ") && ptx.contains("setmaxnreg.dec"), "{name} is not warp-specialized");
            let matmul = f.starts_with("wgmma");
            assert_eq!(ptx.contains("// persistent: "), matmul && schedule == Schedule::Persistent, "{name}");
            assert!(matmul || ptx.contains("// hopper: attention"), "{name} left the Hopper attention path");
            assembled(f, &ptx);
            let call = [tessel::Call::new(kernel.clone())];
            let args = tessel::LaunchArgs { inputs: file_inputs(path, kernel, 7), grid: Default::default() };
            let want = launched(&rt, "interpret", &call, &args).expect("interpreter runs");
            for reverse in [false, true] {
                let got = emulate(&ptx, kernel, &args, reverse).unwrap_or_else(|e| panic!("{name}: {e}"));
                for ((n, g), (_, w)) in got.iter().zip(&want) {
                    let tol = Tolerance::for_dtype(w.dtype());
                    let bad = g.to_f64().iter().zip(w.to_f64()).filter(|(a, b)| !tol.close(**a, *b)).count();
                    assert_eq!(bad, 0, "{name}: output {n} (reverse={reverse}) differs from the interpreter in {bad} elements");
                }
            }
            checked += 1;
        }
        for f in ["matmul_bf16_4096", "matmul_bf16_gelu_4096", "matmul_f16_gelu_4096", "attention_bf16_16384"] {
            let path = root().join(format!("benches/kernels/{f}.tk"));
            let kernel = &tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"))[0];
            let ptx = on_schedule(kernel, schedule);
            assert!(ptx.contains("// warp-specialized: "), "{f} ({}) is not warp-specialized", schedule.name());
            assembled(f, &ptx);
        }
    }
    assert_eq!(checked, 18);
    if ptxas.is_none() {
        skip("ptxas for the schedules", "ptxas not found (scripts/test installs it from pip)", "TESSEL_REQUIRE_PTXAS");
    }
}

/// The emulator's check the schedules rely on: a stage refilled while the `wgmma`s of its last
/// step may still read it is refused, rather than computed with operands the hardware might not
/// have read yet. The cooperative kernel with its `wgmma.wait_group 1` taken out refills a stage
/// too early; so does the warp-specialized one whose consumers hand a stage back before their
/// `wgmma`s retire, or whose producer does not wait for them to.
#[test]
fn the_emulator_refuses_a_stage_refilled_while_a_wgmma_reads_it() {
    use tessel_mosaic_gpu::Schedule;

    let path = root().join("tests/in/wgmma_steps.tk");
    let kernel = &tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"))[0];
    let args = tessel::LaunchArgs { inputs: file_inputs(&path, kernel, 7), grid: Default::default() };
    for schedule in Schedule::ALL {
        let ptx = on_schedule(kernel, schedule);
        assert!(emulate(&ptx, kernel, &args, false).is_ok(), "{}", schedule.name());
        let mut racy = vec![ptx.replace("\twgmma.wait_group.sync.aligned 1;\n", "")];
        if schedule.specialized() {
            // The producer's wait for the consumers skipped: its branch around it taken always.
            let lines: Vec<&str> = ptx.lines().collect();
            let at = lines.iter().position(|l| l.contains("wait until the consumers are done")).expect("the producer waits");
            let (_, target) = lines[at - 1].split_once(" bra ").expect("a branch around the wait");
            let mut edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            edited[at - 1] = format!("\tbra {target}");
            racy.push(edited.join("\n") + "\n");
        }
        for r in racy {
            assert_ne!(r, ptx);
            // A producer that does not wait may also run a whole round ahead, arriving on a
            // stage's full mbarrier twice in one phase: refused too.
            let err = emulate(&r, kernel, &args, false).expect_err("a race");
            assert!(err.contains("still reads") || err.contains("more arrivals"), "{}: {err}", schedule.name());
        }
    }
}

/// The concurrent model (docs/language.md §10) lowered as written: the threads of a program are
/// the warpgroups of one CTA running at once, its barriers mbarriers that they arrive at and wait
/// on, each copy and product made by the warpgroup that issues it. Every kernel of
/// `tests/concurrent/` agrees with the interpreter on the emulator in both thread orders (a
/// warpgroup that ran past a wait would read a stage before its copy and differ), and `ptxas`
/// assembles it without spills.
/// Concurrent kernels whose copies go by TMA (tiles of arrays of up to 5 dimensions), with how
/// many tensor copies into shared memory and out of it their PTX issues.
const BY_TMA: &[(&str, usize, usize)] = &[
    ("pipeline_matmul", 2, 0),
    ("staged_epilogue", 2, 1),
    ("attention", 7, 1),
    ("attention_causal", 7, 1),
    ("attention_dkv", 10, 2),
    ("attention_dq", 8, 1),
    ("attention_pipeline", 5, 1),
    ("hopper_matmul", 6, 4),
    ("mixed_type_matmul", 6, 4),
    ("ragged_dot", 4, 0),
    ("ragged_dot_rhs_t", 4, 0),
];

/// Concurrent kernels whose products go on `wgmma` (`crate::async_mma`: operands copied in by
/// TMA, accumulators in registers), with how many `wgmma.mma_async`s their PTX issues (one per
/// 64 rows by 16 of the contraction).
const BY_WGMMA: &[(&str, usize)] = &[
    ("hopper_matmul", 2),
    ("attention", 8),
    ("attention_causal", 16),
    ("attention_dkv", 16),
    ("attention_dq", 12),
    ("attention_pipeline", 8),
    ("mixed_type_matmul", 2),
    ("ragged_dot", 4),
    ("ragged_dot_rhs_t", 4),
];

/// Concurrent kernels whose PTX `ptxas` spills: the causal attention's masking outgrows the 232
/// registers a thread its consumers take (`max_registers`, `setmaxnreg`).
const SPILLS: &[&str] = &["attention_causal"];

#[test]
fn the_concurrent_kernels_run_their_warpgroups_at_once_meeting_at_mbarriers() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    // The language's own kernels, and JAX's ops as `tessel.pallas.translate` writes them.
    let mut files: Vec<_> = ["tests/concurrent", "tests/concurrent/jax"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root().join(d)).expect("folder").map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    assert!(files.len() >= 12, "{files:?}");
    for path in files {
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        let kernels = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let call = [tessel::Call::new(kernels[0].clone())];
        let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0);
        let barriers = kernels[0].kernel().barriers.iter().map(|b| b.count).sum::<usize>();
        assert_eq!(ptx.matches("mbarrier.init.shared::cta.b64").count(), barriers, "{name}: an mbarrier per barrier");
        assert!(ptx.contains("mbarrier.try_wait.parity") && ptx.contains("mbarrier.arrive"), "{name}");
        let copies =
            (ptx.matches(".shared::cluster.global.mbarrier").count(), ptx.matches(".global.shared::cta.bulk_group").count());
        let want_copies = BY_TMA.iter().find(|(n, ..)| *n == name).map_or((0, 0), |(_, into, out)| (*into, *out));
        assert_eq!(copies, want_copies, "{name}: copies by TMA into shared memory and out of it");
        let products = ptx.matches("wgmma.mma_async").count();
        let want_products = BY_WGMMA.iter().find(|(n, _)| *n == name).map_or(0, |(_, c)| *c);
        assert_eq!(products, want_products, "{name}: products on wgmma");
        let threads = kernels[0].grid().iter().find(|a| a.thread).map_or(1, |a| match a.size {
            tessel_plugin_api::ir::AxisSize::Fixed(n) => n,
            tessel_plugin_api::ir::AxisSize::Dyn => unreachable!("a thread axis is fixed"),
        });
        assert!(ptx.contains(&format!(".maxntid {}, 1, 1", 128 * threads)), "{name}: a warpgroup per thread");
        // Pallas's `set_max_registers` moves registers between three or more warpgroups, which
        // start with 168 a thread.
        let hints = kernels[0].text().matches("max_registers").count();
        let moved = if threads >= 3 { hints } else { 0 };
        assert_eq!(ptx.matches("setmaxnreg.").count(), moved, "{name}: setmaxnreg per max_registers");
        assert_eq!(ptx.contains(".maxnreg 168"), moved > 0, "{name}: registers at entry");
        if let Some(ptxas) = ptxas() {
            let info = assemble(&ptxas, &name, &ptx).unwrap_or_else(|e| panic!("ptxas {name}: {e}"));
            assert!(info.contains("0 bytes spill stores") || SPILLS.contains(&name.as_str()), "{name}: {info}");
        }
        let args = tessel::LaunchArgs { inputs: fixture_inputs(&name, kernels[0].kernel()), grid: Default::default() };
        let want = launched(&rt, "interpret", &call, &args).expect("the interpreter runs it race-free");
        agrees_in_both_orders(&name, &ptx, &kernels[0], &args, &want);
    }
}

/// Seeded random inputs for a concurrent fixture, as its op would be called: the ragged dots'
/// group sizes (`x0`) 64, 0, 128 and 64 rows of their 256 (random integers would make most
/// groups empty or negative); the attention backward kernels' inputs a quarter of the range
/// (their log-sum-exp and row sums random, not the forward pass's, make `exp(s - lse)` large,
/// so that the `f16` probabilities' roundings, where a 1-ulp `exp` moves them, swing whole
/// outputs).
fn fixture_inputs(name: &str, kernel: &tessel_plugin_api::ir::Kernel) -> std::collections::BTreeMap<String, tessel::HostArray> {
    use tessel_plugin_api::array::ArrayData;
    let mut inputs = tessel::inputs::random_inputs(kernel, 11);
    if name.contains("ragged_dot") {
        inputs.insert("x0".into(), tessel::HostArray { shape: vec![4], data: ArrayData::I32(vec![64, 0, 128, 64]) });
    }
    if name.starts_with("attention_d") {
        for a in inputs.values_mut() {
            a.data = match &a.data {
                ArrayData::F16(v) => ArrayData::F16(v.iter().map(|x| half::f16::from_f32(x.to_f32() / 4.0)).collect()),
                ArrayData::F32(v) => ArrayData::F32(v.iter().map(|x| x / 4.0).collect()),
                other => other.clone(),
            };
        }
    }
    inputs
}

/// The mbarrier waits are what orders the warpgroups: with the consumers' `wait` for their stage
/// removed (a kernel the interpreter refuses as a data race), the emulated PTX goes wrong in some
/// thread order — the producer's tensor copies arrive on a phase no consumer waited out (the
/// emulator stops: more arrivals than the mbarrier expects), or stages are multiplied before
/// their copies land and the outputs differ from the kernel as written.
#[test]
fn without_its_wait_the_pipeline_goes_wrong_on_the_emulator() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let text = std::fs::read_to_string(root().join("tests/concurrent/pipeline_matmul.tk")).unwrap();
    let racy = text.replacen("      wait full[%stage]\n", "", 1);
    assert_ne!(racy, text, "the consumers' wait is in the kernel");
    let kernels = tessel::load_source("pipeline_matmul.tk", &text).expect("kernel");
    let mutated = tessel::load_source("racy.tk", &racy).expect("the mutation verifies");
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 3), grid: Default::default() };
    let call = [tessel::Call::new(kernels[0].clone())];
    let want = launched(&rt, "interpret", &call, &args).expect("the kernel as written runs");
    let racy_call = [tessel::Call::new(mutated[0].clone())];
    let e = launched(&rt, "interpret", &racy_call, &args).expect_err("the interpreter finds the race");
    assert!(e.to_string().contains("data race"), "{e}");
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &racy_call).expect("lowers").remove(0);
    let wrong = [false, true].iter().any(|&reverse| match emulate(&ptx, &mutated[0], &args, reverse) {
        Err(e) => e.contains("mbarrier") || e.contains("deadlock"),
        Ok(got) => got[0].1.to_f64() != want[0].1.to_f64(),
    });
    assert!(wrong, "without the wait some thread order reads a stage before its copy");
}

/// A mesh's thread axis on a kernel whose own grid does not make it a `thread` axis names
/// separate programs, each with its own barriers (docs/language.md §10): they stay separate CTAs
/// with their own mbarriers, not warpgroups sharing one set (where two programs' arrivals would
/// complete each other's phases).
#[test]
fn a_mesh_thread_axis_over_a_kernel_with_barriers_stays_separate_programs() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let kernels = tessel::load_file(&root().join("tests/concurrent/staged_epilogue.tk")).expect("kernel");
    let mesh = rt.mesh("mosaic-gpu", "mosaic_gpu(i: 2 thread)").expect("mesh");
    let call = [tessel::Call::on(kernels[0].clone(), mesh)];
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
    assert!(ptx.contains("// 2 CTAs of 128 threads"), "{}", ptx.lines().take(4).collect::<Vec<_>>().join("\n"));
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 5), grid: Default::default() };
    let want = launched(&rt, "interpret", &call, &args).expect("the interpreter runs it");
    agrees_in_both_orders("staged_epilogue on a mesh", &ptx, &kernels[0], &args, &want);
}

/// The products on `wgmma` are asynchronous until their `mma_wait`: with JAX's Hopper matmul's
/// consumers handing a stage back (`arrive`) before waiting for the product that reads it (a
/// kernel the interpreter refuses as a data race), the producer's next tensor copy into that
/// stage lands while the `wgmma` may still read it, which the emulator reports in some thread
/// order; as written, both orders agree with the interpreter (the test above).
#[test]
fn a_stage_handed_back_before_its_mma_wait_is_reported_by_the_emulator() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let text = std::fs::read_to_string(root().join("tests/concurrent/jax/hopper_matmul.tk")).unwrap();
    let racy =
        text.replacen("        mma_wait 0\n        arrive r1[%v136]\n", "        arrive r1[%v136]\n        mma_wait 0\n", 1);
    assert_ne!(racy, text, "the consumers wait for their product, then hand the stage back");
    let mutated = tessel::load_source("racy.tk", &racy).expect("the mutation verifies");
    let args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(mutated[0].kernel(), 5), grid: Default::default() };
    let call = [tessel::Call::new(mutated[0].clone())];
    let e = launched(&rt, "interpret", &call, &args).expect_err("the interpreter finds the race");
    assert!(e.to_string().contains("data race"), "{e}");
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
    assert_eq!(ptx.matches("wgmma.mma_async").count(), 2, "the products are on wgmma");
    let reports: Vec<String> =
        [false, true].iter().filter_map(|&reverse| emulate(&ptx, &mutated[0], &args, reverse).err()).collect();
    assert!(reports.iter().any(|e| e.contains("still reads")), "some thread order refills a stage a wgmma reads: {reports:?}");
}

/// JAX's `transposed_ragged_dot_mgpu` refills a pipeline stage while nothing has waited for the
/// `wgmma` that reads it (docs/pallas.md, "The ragged dot has a data race"): the interpreter
/// reports the race, and on its PTX, whose products go on `wgmma`, the emulator finds the tensor
/// copy landing in the bytes a `wgmma` still reads in some thread order.
#[test]
fn jax_transposed_ragged_dot_race_is_reported_by_the_interpreter_and_the_emulator() {
    use tessel::Runtime;
    let rt = Runtime::new(&[]).expect("runtime");
    let kernels = tessel::load_file(&root().join("tests/concurrent/jax/races/transposed_ragged_dot.tk")).expect("kernel");
    let args = tessel::LaunchArgs { inputs: fixture_inputs("ragged_dot", kernels[0].kernel()), grid: Default::default() };
    let call = [tessel::Call::new(kernels[0].clone())];
    let e = launched(&rt, "interpret", &call, &args).expect_err("the interpreter finds the race");
    assert!(e.to_string().contains("data race") && e.to_string().contains("mma_async"), "{e}");
    let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).expect("lowers").remove(0);
    assert!(ptx.contains("wgmma.mma_async"), "the products are on wgmma");
    let reports: Vec<String> =
        [false, true].iter().filter_map(|&reverse| emulate(&ptx, &kernels[0], &args, reverse).err()).collect();
    assert!(reports.iter().any(|e| e.contains("still reads")), "some thread order refills a stage a wgmma reads: {reports:?}");
}
