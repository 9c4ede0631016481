//! The wgpu backend: every kernel file run on the adapter against the interpreter with the same
//! seeded inputs, what Mosaic GPU refuses and wgpu runs, and wgpu's own refusals. (The WGSL of every
//! kernel file under both strategies, validated by naga, is `tests/lowering.rs`.)

mod common;

use common::*;

fn run(args: &[String]) -> Outcome {
    tessel(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn every_kernel_agrees_with_the_interpreter_on_wgpu() {
    let Some(adapter) = wgpu_adapter("wgpu differential") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for path in kernel_files() {
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        for seed in ["1", "2"] {
            let mut args =
                vec!["run".to_string(), path.display().to_string(), "--backend".into(), "wgpu".into(), "--check".into()];
            args.extend(["--seed".into(), seed.into(), "--out-dir".into(), dir.path().display().to_string()]);
            args.extend(launch_flags(&path));
            if !header_inputs(&path).is_empty() {
                // Inputs the file gives (a block table, lengths): every input as a file.
                let kernel = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}")).remove(0);
                for (input, a) in file_inputs(&path, &kernel, seed.parse().expect("a seed")) {
                    let file = dir.path().join(format!("{name}-{input}.npy"));
                    tessel::npy::write(&file, &a).expect("writes");
                    args.extend(["--input".into(), format!("{input}={}", file.display())]);
                }
            }
            let r = run(&args);
            assert_eq!(r.code, 0, "{name} (seed {seed}) on {adapter}:\n{}{}", r.stdout, r.stderr);
            let checks: Vec<&str> = r.stdout.lines().filter(|l| l.trim_start().starts_with("check ")).collect();
            assert!(!checks.is_empty() && checks.iter().all(|l| l.ends_with(": ok")), "{name}: {}", r.stdout);
            ran += 1;
        }
    }
    assert!(ran >= 34, "{ran} runs");
}

#[test]
fn the_portable_view_of_a_mosaic_mesh_runs_on_wgpu() {
    let Some(_) = wgpu_adapter("wgpu mosaic mesh") else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = root().join("tests/in/warpgroups.tk").display().to_string();
    let out = dir.path().display().to_string();
    // The thread axis `wg` becomes extra programs.
    let args = ["run", &file, "--backend", "wgpu", "--mesh", "mosaic_gpu(i: 4, wg: 2 thread)", "--check", "--out-dir", &out];
    let r = tessel(&args);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("check o: max abs error 0e0 against interpret"), "{}", r.stdout);
    // Mosaic GPU takes the same kernel only with a mesh it made itself, and refuses a grid mesh.
    let r = tessel(&["lower", &file, "--backend", "mosaic-gpu", "--mesh", "grid(i: 4, wg: 2)"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with("error: Mesh grid(i: 4, wg: 2) is not supported by the Mosaic GPU backend\n"), "{}", r.stderr);
}

#[test]
fn what_mosaic_refuses_wgpu_runs() {
    let Some(_) = wgpu_adapter("wgpu beyond mosaic") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let dyn_grid = root().join("tests/in/dyn_grid.tk").display().to_string();
    let two = root().join("tests/in/two_kernels.tk").display().to_string();
    let add = root().join("examples/add.tk").display().to_string();
    // A dynamic grid bound: 4 row blocks of 16 cover the 64 rows; with 2 the rest stays zero.
    for n in ["4", "2"] {
        let r = tessel(&["run", &dyn_grid, "--backend", "wgpu", "--grid", &format!("i={n}"), "--check", "--out-dir", &out]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let o = read_output(dir.path(), "o").to_f64();
        let written = o.iter().filter(|&&v| v != 0.0).count();
        assert!(if n == "4" { written > 64 * 32 * 9 / 10 } else { o[32 * 32..].iter().all(|&v| v == 0.0) }, "i={n}");
    }
    // Two kernels in one launch: `shift` reads what `scale` wrote.
    let r = tessel(&["run", &two, "--backend", "wgpu", "--kernel", "scale", "--kernel", "shift", "--check", "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("ran `scale`, `shift` on wgpu"), "{}", r.stdout);
    // An external mesh of devices around a one-adapter launch.
    let r = tessel(&["run", &add, "--backend", "wgpu", "--external-mesh", "device(x: 2)", "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

#[test]
fn the_strategy_is_in_the_header_and_a_bad_one_is_refused_by_name() {
    let r = run(&["lower".into(), root().join("examples/matmul.tk").display().to_string(), "--backend".into(), "wgpu".into()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("// strategy: cpu (") || r.stdout.contains("// strategy: gpu ("), "{}", r.stdout);
    // The staged dot only under the gpu strategy, and only there workgroup memory.
    assert_eq!(r.stdout.contains("// strategy: gpu"), r.stdout.contains("var<workgroup> tk_sa"), "{}", r.stdout);
}

#[test]
fn wgpu_refusals_say_what_would_work() {
    let add = root().join("examples/add.tk").display().to_string();
    let cases: &[(&str, &[&str], &str)] = &[
        ("device_mesh", &["--mesh", "device(x: 2, y: 4)"], "device(x: 2, y: 4) is a mesh of devices, not a kernel grid"),
        ("external_thread_axis", &["--external-mesh", "mosaic_gpu(x: 2, wg: 2 thread)"], "which only a kernel mesh can have"),
        ("external_reuses_axis", &["--external-mesh", "device(i: 2)"], "names `i`, which is also a grid axis"),
        ("mixes_mesh_and_grid", &["--mesh", "grid(j: 8)"], "i mixes mesh and grid axes"),
    ];
    for (name, flags, want) in cases {
        let mut args = vec!["lower", &add, "--backend", "wgpu"];
        args.extend_from_slice(flags);
        let r = tessel(&args);
        assert_eq!(r.code, 1, "{name}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(want), "{name}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 2, "{name}: the second line says what would work: {}", r.stderr);
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(root().join("snapshots/errors"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.bind(|| insta::assert_snapshot!(format!("wgpu_{name}"), r.stderr.replace(&root().display().to_string(), ".")));
    }
}

#[test]
fn a_block_past_the_limit_is_refused_at_lowering_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tk");
    let n = tessel_wgpu::emit::MAX_BLOCK_ELEMENTS + 1;
    std::fs::write(&path, format!("kernel big\n  in x: f32[{n}]\n  out o: f32[{n}]\n{{\n  %x = load x\n  store o, %x\n}}\n"))
        .unwrap();
    let r = tessel(&["lower", path.to_str().unwrap(), "--backend", "wgpu"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stderr.contains(&format!("has {n} elements")) && r.stderr.contains("more than the 65536 the wgpu backend lowers"),
        "{}",
        r.stderr
    );
    // A grid past 2^31 programs is refused, never truncated.
    let path = dir.path().join("wide.tk");
    std::fs::write(
        &path,
        "kernel wide\n  grid (i: 65536, j: 65536)\n  in x: f32[8]\n  out o: f32[8]\n{\n  %x = load x\n  %z = program_id i\n  %c = eq %z, 0\n  when %c {\n    store o, %x\n  }\n}\n",
    )
    .unwrap();
    let r = tessel(&["lower", path.to_str().unwrap(), "--backend", "wgpu"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("4294967296 parallel programs, more than the 2147483648"), "{}", r.stderr);
}

#[test]
fn a_grid_wider_than_one_dispatch_runs_every_program() {
    let Some(_) = wgpu_adapter("wgpu wide grid") else { return };
    // 100,000 programs: more than the 65,535 workgroups of one dispatch dimension.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.tk");
    std::fs::write(
        &path,
        "kernel wide\n  grid (i: 100000)\n  out o: i32[100000] block [1] at (i)\n{\n  %p = program_id i\n  %v = broadcast %p : i32[1]\n  store o, %v\n}\n",
    )
    .unwrap();
    let out = dir.path().display().to_string();
    let r = tessel(&["run", path.to_str().unwrap(), "--backend", "wgpu", "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let o = read_output(dir.path(), "o").to_f64();
    assert!(o.iter().enumerate().all(|(i, &v)| v == i as f64), "every program wrote its index");
}

#[test]
fn device_resident_outputs_start_as_zeros_at_every_launch() {
    use tessel::Runtime;
    use tessel_plugin_api::array::ArrayData;
    let Some(_) = wgpu_adapter("wgpu resident arrays") else { return };
    let rt = Runtime::new(&[]).unwrap();
    let dyn_grid = tessel::load_file(&root().join("tests/in/dyn_grid.tk")).unwrap().remove(0);
    let add = tessel::load_file(&root().join("examples/add.tk")).unwrap().remove(0);
    let ones = |n: usize| f32_array(&[n], vec![1.0; n]);
    // An output left full of ones by an earlier use: rows the launch does not store read 0.
    let x = rt.upload("wgpu", &f32_array(&[64, 32], vec![2.0; 64 * 32])).unwrap();
    let o = rt.upload("wgpu", &f32_array(&[64, 32], vec![1.0; 64 * 32])).unwrap();
    let grid: std::collections::BTreeMap<String, u64> = [("i".to_string(), 2u64)].into_iter().collect();
    let call = [tessel::Call::new(dyn_grid.clone())];
    for _ in 0..2 {
        rt.plan(tessel::Choice::Named("wgpu"), &tessel::Launch::new(call.clone(), [], grid.clone()))
            .and_then(|p| p.launch_resident(&[("x", &x), ("o", &o)], false))
            .map(drop)
            .unwrap();
        let got = rt.download(&o).unwrap().to_f64();
        assert!(got[32 * 32..].iter().all(|&v| v == 0.0), "rows past the 2 blocks are zero");
        assert!(got[..32 * 32].iter().all(|&v| v != 0.0 && v != 1.0), "the 2 blocks are written");
    }
    // A kernel that stores its whole output is not zeroed first (its WGSL says so); the result
    // is the same either way.
    let (a, b) = (rt.upload("wgpu", &ones(1024)).unwrap(), rt.upload("wgpu", &ones(1024)).unwrap());
    let out = rt.upload("wgpu", &ones(1024)).unwrap();
    let call = [tessel::Call::new(add.clone())];
    rt.plan(tessel::Choice::Named("wgpu"), &tessel::Launch::kernels(call.clone()))
        .and_then(|p| p.launch_resident(&[("x", &a), ("y", &b), ("o", &out)], false))
        .map(drop)
        .unwrap();
    assert_eq!(rt.download(&out).unwrap().data, ArrayData::F32(vec![2.0; 1024]));
    let wgsl = lowered(&rt, "wgpu", &call).unwrap().remove(0).1;
    assert!(wgsl.contains("// outputs zeroed before the dispatch: none"), "{wgsl}");
    // A wrong binding is an error naming the argument, not a crash.
    let err = rt
        .plan(tessel::Choice::Named("wgpu"), &tessel::Launch::kernels(call.clone()))
        .and_then(|p| p.launch_resident(&[("x", &a), ("y", &x), ("o", &out)], false))
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("argument `y` is f32[1024]") && err.to_string().contains("f32[64, 32]"), "{err}");
    for d in [x, o, a, b, out] {
        rt.free(d);
    }
}

#[test]
fn programs_whose_workspace_exceeds_a_binding_take_turns_on_fewer_workgroups() {
    let Some(_) = wgpu_adapter("wgpu strided programs") else { return };
    // 2,100 programs with 128 KiB of published values each: more than one storage binding holds,
    // so 1,024 workgroups walk the programs with a stride.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strided.tk");
    std::fs::write(
        &path,
        "kernel strided\n  grid (i: 2100)\n  in x: f32[128, 128]\n  out o: f32[2100, 128] block [1, 128] at (i, 0)\n{\n  %x = load x\n  %t = transpose %x perm (1, 0)\n  %s = sum %t axis 0\n  %p = program_id i\n  %pf = cast %p : f32\n  %r = add %s, %pf\n  %r2 = reshape %r : f32[1, 128]\n  store o, %r2\n}\n",
    )
    .unwrap();
    let file = path.display().to_string();
    let r = tessel(&["lower", &file, "--backend", "wgpu"]);
    assert!(
        r.stdout.contains("2100 programs on 1024 workgroups of 256 invocations, each walking the programs with a stride"),
        "{}",
        r.stdout
    );
    let out = dir.path().display().to_string();
    let r = tessel(&["run", &file, "--backend", "wgpu", "--check", "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("check o: max abs error") && r.stdout.contains(": ok"), "{}", r.stdout);
}

#[test]
fn an_array_too_large_for_the_device_is_refused_naming_the_limit() {
    let Some(_) = wgpu_adapter("wgpu array over the limits") else { return };
    // 2^31 - 1 f32 (8 GiB on the device): past every adapter's buffer and binding limits. The
    // output is never made on the host: the device refuses it first.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.tk");
    std::fs::write(
        &path,
        "kernel huge\n  in x: f32[4]\n  out o: f32[2147483647] block [4] at (0)\n{\n  %x = load x\n  store o, %x\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let r = tessel(&["run", path.to_str().unwrap(), "--backend", "wgpu", "--out-dir", out.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(
            "an array of f32[2147483647] (8589934588 bytes on the device) needs 8589934588, more than this adapter's max"
        ),
        "{}",
        r.stderr
    );
    assert!(!out.join("o.npy").exists(), "nothing written");
}

/// Whether the adapter tessel picks (the first high-performance one, as `runtime.rs` does
/// without `TESSEL_WGPU_ADAPTER`) has timestamp queries, asked of wgpu directly.
fn adapter_has_timestamps() -> bool {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let options = wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    pollster::block_on(instance.request_adapter(&options)).is_ok_and(|a| a.features().contains(wgpu::Features::TIMESTAMP_QUERY))
}

#[test]
fn bench_times_the_kernel_on_the_gpu_clock_where_the_adapter_has_timestamps() {
    let Some(adapter) = wgpu_adapter("wgpu bench timestamps") else { return };
    let file = root().join("examples/softmax.tk").display().to_string();
    let r = tessel(&["bench", &file, "--backend", "wgpu", "--runs", "3", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    let want = if adapter_has_timestamps() { "gpu-timestamps" } else { "submit-and-wait" };
    assert_eq!(v["kernel_timing"], want, "on {adapter}: {v}");
    let (kernel, launch, run) =
        (v["kernel_ms"].as_f64().unwrap(), v["launch_ms"].as_f64().unwrap(), v["run_ms"].as_f64().unwrap());
    // The kernel alone takes some time, and less than a run that also uploads and downloads.
    assert!(kernel > 0.0 && kernel < run && launch < run, "{v}");
    let gbs = v["gbs"].as_f64().unwrap();
    assert!((gbs - v["bytes"].as_f64().unwrap() / kernel / 1e6).abs() <= 1e-6 * gbs, "rates on kernel_ms: {v}");
    let text = tessel(&["bench", &file, "--backend", "wgpu", "--runs", "2"]);
    let line = if want == "gpu-timestamps" {
        "kernel (median, the device's clock, GPU timestamps): "
    } else {
        "not measured (wgpu has no GPU timestamps)"
    };
    assert!(
        text.stdout.contains("launch (median, arrays on the device, submit and wait): ") && text.stdout.contains(line),
        "{}",
        text.stdout
    );
}

/// A kernel whose one program counts to `trips` in a `for` of a block of 8.
fn counting_loop(trips: &str) -> String {
    format!(
        "kernel count\n  grid (i: 1)\n  out o: f32[8] block [8] at (i)\n{{\n  %z = zeros : f32[8]\n  %r = for %j = 0 to {trips} iter (%a = %z) {{\n    %b = add %a, 1.0\n    yield %b\n  }}\n  store o, %r\n}}\n"
    )
}

/// Runs `text`'s first kernel on wgpu (an input `x` of `ones` ones where given): its output
/// `o`, or the error's text.
fn on_wgpu(text: &str, ones: usize) -> Result<Vec<f64>, String> {
    let kernels = tessel::load_source("loops.tk", text).unwrap_or_else(|e| panic!("{e}"));
    let mut args = tessel::LaunchArgs::default();
    if ones > 0 {
        args.inputs.insert("x".into(), f32_array(&[ones], vec![1.0; ones]));
    }
    let outs = tessel::run_kernel("wgpu", &kernels[0], &args).map_err(|e| format!("{e:#}"))?;
    Ok(outs.into_iter().find(|(n, _)| n == "o").expect("output o").1.to_f64())
}

/// Mesa's llvmpipe stops every loop of an invocation once 65,535 iterations ran in it, silently
/// (issue 38: a `for` of 70,000 added 65,535, a `seq` axis of 70,000 steps gave zeros, a sum of
/// 8,388,608 ones gave 0). Each such kernel now gives the right answer or says why it will not,
/// never a wrong one: refused when planned where the loops are counted, and where they are not
/// (a trip count from `program_id`, the loops of a large reduction), failed by the module's own
/// check after the run, its outputs never read.
#[test]
fn loops_past_the_software_drivers_budget_are_right_or_refused() {
    let Some(adapter) = wgpu_adapter("wgpu loop budget") else { return };
    let llvmpipe = adapter.contains("llvmpipe");
    let nested = "kernel nested\n  grid (i: 1)\n  out o: f32[8] block [8] at (i)\n{\n  %z = zeros : f32[8]\n  %r = for %j = 0 to 300 iter (%a = %z) {\n    %r2 = for %k = 0 to 300 iter (%c = %a) {\n      %b = add %c, 1.0\n      yield %b\n    }\n    yield %r2\n  }\n  store o, %r\n}\n";
    let seq = "kernel steps\n  grid (i: 70000 seq)\n  out o: f32[8] block [8] at (0)\n{\n  %a = load o\n  %b = add %a, 1.0\n  store o, %b\n}\n";
    let dynamic = "kernel dynamic\n  grid (i: 2)\n  out o: f32[16] block [8] at (i)\n{\n  %p = program_id i\n  %n = mul %p, 70000\n  %z = zeros : f32[8]\n  %r = for %j = 0 to %n iter (%a = %z) {\n    %b = add %a, 1.0\n    yield %b\n  }\n  store o, %r\n}\n";
    let sum = "kernel total\n  grid (i: 1)\n  in  x: f32[8388608]\n  out o: f32[1] block [1] at (i)\n{\n  %z = zeros : f32[1]\n  %r = for %j = 0 to 8388608 step 65536 iter (%a = %z) {\n    %b = load x[ds(%j, 65536)]\n    %s = sum %b axis 0 keepdims\n    %c = add %a, %s\n    yield %c\n  }\n  store o, %r\n}\n";
    let cases: Vec<(&str, String, usize, Vec<f64>)> = vec![
        ("a for of 70,000 trips", counting_loop("70000"), 0, vec![70_000.0; 8]),
        ("two nested fors of 300", nested.into(), 0, vec![90_000.0; 8]),
        ("a seq axis of 70,000 steps", seq.into(), 0, vec![70_000.0; 8]),
        ("a trip count from program_id", dynamic.into(), 0, [vec![0.0; 8], vec![70_000.0; 8]].concat()),
        ("a sum of 8,388,608 ones", sum.into(), 8_388_608, vec![8_388_608.0]),
    ];
    for (what, text, ones, want) in cases {
        match on_wgpu(&text, ones) {
            Ok(got) => {
                assert_eq!(got, want, "{what} on {adapter}: a wrong answer");
                assert!(!llvmpipe, "{what} ran on llvmpipe, whose loops stop at 65,535 iterations, and was right?");
            }
            Err(e) => {
                assert!(e.contains("silently stops every loop") && e.contains("interpret"), "{what}: {e}");
                assert!(llvmpipe, "{what} failed on {adapter}, which has no loop budget: {e}");
            }
        }
    }
    // Where the budget's edge lies (measured; a change in Mesa shows here): 65,532 trips leave
    // room for the module's check, 65,533 do not.
    if llvmpipe {
        assert_eq!(on_wgpu(&counting_loop("65532"), 0), Ok(vec![65_532.0; 8]));
        let e = on_wgpu(&counting_loop("65533"), 0).expect_err("65,533 trips are refused");
        assert!(e.contains("makes 65534 loop iterations in one invocation, more than the 65533"), "{e}");
        // The same trip count from a value the plan cannot count: the module's check.
        let from_value = counting_loop("%n").replace("  %z = zeros", "  %p = program_id i\n  %n = add %p, 65533\n  %z = zeros");
        let e = on_wgpu(&from_value, 0).expect_err("the module's check fails the launch");
        assert!(e.contains("made more loop iterations in one invocation than the 65533"), "{e}");
    }
}

/// Ten reductions of each of five dtypes over a 32×8 block, each added back into its block:
/// 6,976 lines of WGSL whose workspace reductions llvmpipe unrolled whole, and which it had not
/// compiled after 5 minutes (issue 38; 15 minutes in the report). Their loops now keep a bound
/// the driver cannot see through, and the kernel compiles in seconds and agrees with the
/// interpreter.
#[test]
fn many_reductions_compile_in_reasonable_time_and_agree() {
    let Some(_) = wgpu_adapter("wgpu many reductions") else { return };
    let dtypes = ["f32", "i32", "u32", "f16", "bf16"];
    let mut text = String::from("kernel reds\n");
    for (j, d) in dtypes.iter().enumerate() {
        text += &format!("  in  x{j}: {d}[32, 8]\n  out o{j}: {d}[32, 8]\n");
    }
    text += "{\n";
    for j in 0..dtypes.len() {
        text += &format!("  %x{j} = load x{j}\n");
        let mut acc = format!("%x{j}");
        for k in 0..10 {
            let op = ["sum", "max", "min", "sum", "max"][k / 2];
            text += &format!("  %r{j}_{k} = {op} %x{j} axis {} keepdims\n  %a{j}_{k} = add {acc}, %r{j}_{k}\n", k % 2);
            acc = format!("%a{j}_{k}");
        }
        text += &format!("  store o{j}, {acc}\n");
    }
    text += "}\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reds.tk");
    std::fs::write(&path, text).unwrap();
    let out = dir.path().display().to_string();
    let r = tessel(&["run", path.to_str().unwrap(), "--backend", "wgpu", "--check", "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let checks = r.stdout.lines().filter(|l| l.trim_start().starts_with("check ") && l.ends_with(": ok")).count();
    assert_eq!(checks, 5, "{}", r.stdout);
}
