//! The cpu backend, loaded as a plugin (`libtessel_cpu.so`, never linked into the host): every
//! kernel file against the interpreter on seeded inputs, the conformance suite, `auto` choosing
//! it before the interpreter (and falling back to the interpreter for what it refuses), its
//! refusals word for word, and compiled code taken from the disk cache by a second process.

mod common;

use std::path::Path;

use common::*;

/// `tessel ARGS` with the plugin loaded and compiled code cached under `cache`.
fn on_cpu(plugin: &Path, cache: &Path, args: &[String]) -> Outcome {
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = plugin.display().to_string();
    a.extend(["--plugin", &p]);
    tessel_env(&a, &[("TESSEL_CACHE_DIR", &cache.display().to_string())])
}

#[test]
fn every_kernel_agrees_with_the_interpreter_on_cpu() {
    let Some(plugin) = cpu_plugin("cpu differential") else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = root().join("target/tessel-cache");
    let (mut ran, mut refused) = (0, Vec::new());
    for path in kernel_files() {
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        for seed in ["1", "2"] {
            let mut args =
                vec!["run".to_string(), path.display().to_string(), "--backend".into(), "cpu".into(), "--check".into()];
            args.extend(["--seed".into(), seed.into(), "--out-dir".into(), dir.path().display().to_string()]);
            args.extend(launch_flags(&path));
            if !header_inputs(&path).is_empty() {
                let kernel = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}")).remove(0);
                for (input, a) in file_inputs(&path, &kernel, seed.parse().expect("a seed")) {
                    let file = dir.path().join(format!("{name}-{input}.npy"));
                    tessel::npy::write(&file, &a).expect("writes");
                    args.extend(["--input".into(), format!("{input}={}", file.display())]);
                }
            }
            let r = on_cpu(&plugin, &cache, &args);
            if r.code == 1 && r.stderr.contains("which the cpu backend does not compile") {
                refused.push(name.clone());
                break;
            }
            assert_eq!(r.code, 0, "{name} (seed {seed}) on cpu:\n{}{}", r.stdout, r.stderr);
            let checks: Vec<&str> = r.stdout.lines().filter(|l| l.trim_start().starts_with("check ")).collect();
            assert!(!checks.is_empty() && checks.iter().all(|l| l.ends_with(": ok")), "{name}: {}", r.stdout);
            ran += 1;
        }
    }
    eprintln!("cpu: {ran} runs agree with the interpreter; refused (the concurrent model): {refused:?}");
    assert!(ran >= 110, "{ran} runs");
    assert!(refused.len() <= 2, "refused: {refused:?}");
}

#[test]
fn the_conformance_suite_passes_on_cpu() {
    let Some(plugin) = cpu_plugin("cpu conformance") else { return };
    let cache = root().join("target/tessel-cache");
    let r = on_cpu(&plugin, &cache, &["conformance".into(), "--backend".into(), "cpu".into()]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let last = r.stdout.lines().last().unwrap_or_default();
    assert!(last.ends_with("0 skipped, 0 failed"), "{}", r.stdout);
}

#[test]
fn auto_takes_cpu_before_the_interpreter_and_the_interpreter_for_what_cpu_refuses() {
    let Some(plugin) = cpu_plugin("cpu under auto") else { return };
    let cache = root().join("target/tessel-cache");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let add = root().join("examples/add.tk").display().to_string();
    let r = on_cpu(&plugin, &cache, &["run".into(), add, "--explain".into(), "--out-dir".into(), out.clone()]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(text.contains("cpu: chosen"), "{text}");
    // A kernel of the concurrent model: refused by cpu, run by the interpreter.
    let handoff = root().join("tests/concurrent/handoff.tk").display().to_string();
    let r = on_cpu(&plugin, &cache, &["run".into(), handoff, "--explain".into(), "--out-dir".into(), out]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains("cpu: skipped, refuses the launch: kernel `handoff` uses the concurrent model")
            && text.contains("interpret: chosen"),
        "{text}"
    );
}

#[test]
fn a_second_process_takes_the_compiled_kernel_from_the_disk_cache() {
    let Some(plugin) = cpu_plugin("cpu disk cache") else { return };
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["run", &root().join("examples/softmax.tk").display().to_string(), "--backend", "cpu"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--out-dir".into(), dir.path().display().to_string()])
        .collect();
    let libraries = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(cache.path().join("cpu"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let first = on_cpu(&plugin, cache.path(), &args);
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    let made = libraries();
    assert_eq!(made.len(), 1, "one library, no temporary left: {made:?}");
    assert!(made[0].ends_with(".so") || made[0].ends_with(".dylib"), "{made:?}");
    let stamp = std::fs::metadata(cache.path().join("cpu").join(&made[0])).unwrap().modified().unwrap();
    let second = on_cpu(&plugin, cache.path(), &args);
    assert_eq!(second.code, 0, "{}{}", second.stdout, second.stderr);
    assert_eq!(libraries(), made);
    let again = std::fs::metadata(cache.path().join("cpu").join(&made[0])).unwrap().modified().unwrap();
    assert_eq!(stamp, again, "the second process compiled again");
    assert_eq!(std::fs::read(dir.path().join("o.npy")).ok().map(|b| b.len()).unwrap_or(0) > 0, true);
}

#[test]
fn every_cpu_refusal_is_reached_with_its_words() {
    use strum::IntoEnumIterator;
    use tessel_cpu::error::RefusalKind as K;
    let Some(plugin) = cpu_plugin("cpu refusals") else { return };
    let cache = root().join("target/tessel-cache");
    let add = root().join("examples/add.tk").display().to_string();
    let handoff = root().join("tests/concurrent/handoff.tk").display().to_string();
    let lower = |k: &str, flags: &[&str]| -> String {
        let mut a: Vec<String> = ["lower", k, "--backend", "cpu"].iter().map(|s| s.to_string()).collect();
        a.extend(flags.iter().map(|s| s.to_string()));
        let r = on_cpu(&plugin, &cache, &a);
        assert_eq!(r.code, 1, "{a:?} should be refused: {}{}", r.stdout, r.stderr);
        r.stderr.strip_prefix("error: ").unwrap_or(&r.stderr).trim_end().to_string()
    };
    let mut seen = Vec::new();
    for kind in K::iter() {
        let (text, first) = match kind {
            K::DeviceMesh => (
                lower(&add, &["--mesh", "device(x: 2)"]),
                "device(x: 2) describes devices for sharding, not a kernel's grid: the cpu backend runs one kernel on one CPU",
            ),
            K::MeshKind => {
                let rt = tessel::Runtime::new(std::slice::from_ref(&plugin)).unwrap();
                let e = rt
                    .registry()
                    .get("cpu")
                    .unwrap()
                    .backend
                    .make_mesh("wgpu(i: 8)".into())
                    .into_result()
                    .err()
                    .expect("refused");
                (e.message.to_string(), "the cpu backend makes `grid(...)` meshes, not `wgpu(...)`")
            }
            K::Concurrent => (
                lower(&handoff, &[]),
                "kernel `handoff` uses the concurrent model (threads, barriers, asynchronous copies), which the cpu backend does not compile",
            ),
            K::KeptInSeveralKernels => (
                kept_in_two_kernels("cpu", std::slice::from_ref(&plugin)).unwrap_err(),
                "output `o` starts from given contents (an aliased input) in a launch of several kernels, which the cpu backend runs on fresh outputs",
            ),
        };
        let (line, hint) = text.split_once('\n').unwrap_or((&text, ""));
        assert_eq!(line, first, "{kind:?}");
        assert!(hint.starts_with("  ") && hint.trim().len() > 10, "{kind:?}: {text:?}");
        seen.push(kind);
    }
    assert_eq!(seen.len(), 4);
}

/// The ulp by which the cpu backend's `op` misses `f64`'s `want`, rounded, at most, over 2^20
/// arguments spread over every exponent from 2^-20 to `top`, both signs; and where.
fn sweep(plugin: &Path, op: &str, want: fn(f64) -> f64, top: f32) -> (u32, f32) {
    let n = 1usize << 20;
    let text = format!("kernel t\n  in  x: f32[{n}]\n  out o: f32[{n}]\n{{\n  %x = load x\n  %y = {op} %x\n  store o, %y\n}}\n");
    let (lo, hi) = ((2.0f32).powi(-20).to_bits(), top.to_bits());
    let step = (hi - lo) / (n as u32 / 2);
    let xs: Vec<f32> = (0..n)
        .map(|i| {
            let v = f32::from_bits(lo + (i as u32 / 2) * step);
            if i % 2 == 1 { -v } else { v }
        })
        .collect();
    let rt = tessel::Runtime::new(&[plugin.to_path_buf()]).unwrap();
    let kernels = tessel::load_source("sweep.tk", &text).unwrap();
    let call = [tessel::Call::new(kernels[0].clone())];
    let args = tessel::LaunchArgs { inputs: [("x".to_string(), f32_array(&[n], xs.clone()))].into(), grid: Default::default() };
    let out = launched(&rt, "cpu", &call, &args).unwrap().remove(0).1.to_f64();
    let ulps = |got: f32, want: f32| -> u32 {
        let key = |v: f32| if v.is_sign_negative() { -(v.to_bits() as i64 & 0x7fff_ffff) } else { v.to_bits() as i64 };
        (key(got) - key(want)).unsigned_abs() as u32
    };
    let worst = xs.iter().zip(&out).map(|(&x, &g)| (ulps(g as f32, want(x as f64) as f32), x)).max_by_key(|w| w.0).unwrap();
    eprintln!("{op} on cpu: at most {} ulp (at {:e})", worst.0, worst.1);
    worst
}

/// The cpu backend's own `tanh` and `exp` (`emit/prelude.h`, not the portable programs) within
/// §8's bounds (2 and 1 ulp) on a sweep each: `tanh` through its switch from the series to the
/// exponential at 0.625 and up to where it rounds to 1, `exp` from subnormal results to overflow.
#[test]
fn the_cpu_tanh_and_exp_are_within_their_bounds_on_a_sweep() {
    let Some(plugin) = cpu_plugin("cpu tanh and exp sweeps") else { return };
    let (worst, at) = sweep(&plugin, "tanh", f64::tanh, 32.0);
    assert!(worst <= 2, "tanh({at:e}) is {worst} ulp off");
    let (worst, at) = sweep(&plugin, "exp", f64::exp, 110.0);
    assert!(worst <= 1, "exp({at:e}) is {worst} ulp off");
}

/// `kernel` on cpu and on the interpreter with `inputs` (the rest seeded): the same outputs
/// within the dtype's tolerance, or what differs.
fn agrees(plugin: &Path, text: &str, inputs: &[(&str, tessel::HostArray)]) {
    let rt = tessel::Runtime::new(&[plugin.to_path_buf()]).unwrap();
    let kernels = tessel::load_source("case.tk", text).unwrap_or_else(|e| panic!("{e}"));
    let call = [tessel::Call::new(kernels[0].clone())];
    let mut args = tessel::LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 3), grid: Default::default() };
    for (name, a) in inputs {
        args.inputs.insert(name.to_string(), a.clone());
    }
    let want = launched(&rt, "interpret", &call, &args).unwrap();
    let got = launched(&rt, "cpu", &call, &args).unwrap();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let a = tessel_plugin_api::array::agreement(g, w);
        assert!(a.within, "{}: output {name}: cpu {:?} against interpret {:?}", kernels[0].name(), g.to_f64(), w.to_f64());
    }
}

/// What a review of the C writer found (each wrong before its fix): a `for` whose new carried
/// block is the other carried block (a swap: the copies go through temporaries, every new value
/// read before any is written); a run that loads a scratch through two windows and stores through
/// one of them (not fused: a lane would read what an earlier lane stored); a gather and a scatter
/// through the same index vector with repeated entries (not fused either); a product of a grid of
/// two programs spread over the pool (a worker may run another run meanwhile: each takes its own
/// arena); a column sum of a million columns (its accumulator in the arena, not on the stack).
#[test]
fn the_writer_keeps_carried_swaps_overlapping_windows_and_repeated_scatters_apart() {
    let Some(plugin) = cpu_plugin("cpu writer hazards") else { return };
    let fib = "kernel fib\n  out o: f32[8]\n{\n  %one = full 1.0 : f32[8]\n  %zero = zeros : f32[8]\n  %a, %b = for %i = 0 to 5 iter (%x = %one, %y = %zero) {\n    %n = add %x, %y\n    yield %n, %x\n  }\n  store o, %a\n}\n";
    agrees(&plugin, fib, &[]);
    let swap = "kernel swap\n  out o: f32[2, 4]\n{\n  %p = full 1.0 : f32[2, 4]\n  %q = full 2.0 : f32[8]\n  %a, %b = for %i = 0 to 3 iter (%x = %p, %y = %q) {\n    %rx = reshape %x : f32[8]\n    %ry = reshape %y : f32[2, 4]\n    %s = add %ry, 1.0\n    yield %s, %rx\n  }\n  store o, %a\n}\n";
    agrees(&plugin, swap, &[]);
    let shift = "kernel shift\n  out o: f32[9]\n  scratch s: f32[9]\n{\n  %x = iota 0 : i32[9]\n  %f = cast %x : f32\n  store s, %f\n  %a = load s[ds(0, 8)]\n  %b = load s[ds(1, 8)]\n  %c = add %a, %b\n  store s[ds(1, 8)], %c\n  %r = load s\n  store o, %r\n}\n";
    agrees(&plugin, shift, &[]);
    let hist = "kernel hist\n  in  idx: i32[8]\n  out o: f32[4]\n  scratch s: f32[4]\n{\n  %i = load idx\n  %v = load s[%i]\n  %w = add %v, 1.0\n  store s[%i], %w\n  %r = load s\n  store o, %r\n}\n";
    let idx = tessel::HostArray::from_bits(tessel_plugin_api::ir::DType::I32, &[8], vec![0, 0, 0, 0, 1, 1, 2, 3]);
    agrees(&plugin, hist, &[("idx", idx)]);
    let dot = "kernel pdot\n  grid (i: 2)\n  in  a: f32[512, 512] block [256, 512] at (i, 0)\n  in  b: f32[512, 512]\n  out o: f32[512, 512] block [256, 512] at (i, 0)\n{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  store o, %p\n}\n";
    for _ in 0..4 {
        agrees(&plugin, dot, &[]);
    }
    let colsum = "kernel colsum\n  grid (i: 2)\n  in  x: f32[8, 1048576] block [4, 1048576] at (i, 0)\n  out o: f32[2, 1048576] block [1, 1048576] at (i, 0)\n{\n  %x = load x\n  %s = sum %x axis 0 keepdims\n  store o, %s\n}\n";
    agrees(&plugin, colsum, &[]);
}

/// A `dot`'s flags: ` trans_a`, ` trans_b`, both or none.
fn transposes(ta: bool, tb: bool) -> String {
    [(ta, " trans_a"), (tb, " trans_b")].iter().filter(|f| f.0).map(|f| f.1).collect()
}

/// Products inside a grid of several programs (`gemm.h`'s inline `tk_sgemm`, not the pool's):
/// every transpose, edges of every tile (rows past the 8-row and 4-row tiles, columns past the
/// last whole vector), a contraction in several chunks of 256, one column, one row; tiles read in
/// place; `c += a b` added into an output block and into a scratch accumulator; products of one
/// program split over the pool.
#[test]
fn products_of_every_shape_and_transpose_agree_with_the_interpreter() {
    let Some(plugin) = cpu_plugin("cpu products") else { return };
    // The operands' types of an m x n x k product and its flags, for each transpose.
    let operands = |(m, n, k): (usize, usize, usize), ta: bool, tb: bool| {
        let a = if ta { format!("f32[{k}, {m}]") } else { format!("f32[{m}, {k}]") };
        let b = if tb { format!("f32[{n}, {k}]") } else { format!("f32[{k}, {n}]") };
        (a, b, transposes(ta, tb))
    };
    for (m, n, k) in [(64, 64, 64), (13, 37, 300), (1, 1, 1), (7, 16, 3), (12, 33, 513), (33, 1, 70), (1, 96, 8)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (a, b, flags) = operands((m, n, k), ta, tb);
            let text = format!(
                "kernel prod\n  grid (i: 3)\n  in  a: {a}\n  in  b: {b}\n  out o: f32[{m}, {n}]\n{{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b{flags}\n  %i = program_id i\n  %z = eq %i, 0\n  when %z {{\n    store o, %p\n  }}\n}}\n"
            );
            agrees(&plugin, &text, &[]);
        }
    }
    // One program (fewer than the workers): products over 2^18 multiply-adds split by rows of 32
    // over the pool, the last part short.
    for (ta, tb) in [(false, false), (true, true)] {
        let (m, n) = (100, 80);
        let (a, b, flags) = operands((m, n, 70), ta, tb);
        let text = format!(
            "kernel one\n  in  a: {a}\n  in  b: {b}\n  out o: f32[{m}, {n}]\n{{\n  %a = load a\n  %b = load b\n  %p = dot %a, %b{flags}\n  store o, %p\n}}\n"
        );
        agrees(&plugin, &text, &[]);
    }
    // Tiles of wider arrays read in place (rows at the array's distance) where the tile lies
    // inside, copied where it runs past an edge: 100 x 72 x 90 in 32^3 tiles, each transpose.
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = if ta { "f32[90, 100] block [32, 32] at (k, i)" } else { "f32[100, 90] block [32, 32] at (i, k)" };
        let b = if tb { "f32[72, 90] block [32, 32] at (j, k)" } else { "f32[90, 72] block [32, 32] at (k, j)" };
        let flags = transposes(ta, tb);
        let text = format!(
            "kernel tiles\n  grid (i: 4, j: 3, k: 3 seq)\n  in  a: {a}\n  in  b: {b}\n  out c: f32[100, 72] block [32, 32] at (i, j)\n{{\n  %k = program_id k\n  %first = eq %k, 0\n  when %first {{\n    %z = zeros : f32[32, 32]\n    store c, %z\n  }}\n  %a = load a\n  %b = load b\n  %p = dot %a, %b{flags}\n  %acc = load c\n  %sum = add %acc, %p\n  store c, %sum\n}}\n"
        );
        agrees(&plugin, &text, &[]);
    }
    // `c += a b` as Pallas writes it (the load of `c` first) into an output, and into a scratch
    // accumulator written out at the last step: each one product added in place.
    let tiles = "grid (i: 4, j: 3, k: 3 seq)\n  in  a: f32[100, 90] block [32, 32] at (i, k)\n  in  b: f32[90, 72] block [32, 32] at (k, j)\n  out c: f32[100, 72] block [32, 32] at (i, j)";
    let pallas = format!(
        "kernel pallas\n  {tiles}\n{{\n  %acc = load c\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  %sum = add %acc, %p\n  store c, %sum\n}}\n"
    );
    agrees(&plugin, &pallas, &[]);
    let scratch = format!(
        "kernel scratch\n  {tiles}\n  scratch s: f32[32, 32]\n{{\n  %k = program_id k\n  %acc = load s\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  %sum = add %p, %acc\n  store s, %sum\n  %last = eq %k, 2\n  when %last {{\n    %r = load s\n    store c, %r\n  }}\n}}\n"
    );
    agrees(&plugin, &scratch, &[]);
    // Every axis sequential (megablox's grid): one program, each step's product over the pool.
    let seq = pallas.replace("(i: 4, j: 3, k: 3 seq)", "(i: 4 seq, j: 3 seq, k: 3 seq)").replace("32, 32]", "64, 64]");
    let seq = seq
        .replace("f32[100, 90]", "f32[200, 180]")
        .replace("f32[90, 72]", "f32[180, 144]")
        .replace("f32[100, 72]", "f32[200, 144]");
    agrees(&plugin, &seq, &[]);
}

/// `Planned::warm_up` compiles a planned launch's C off the caller's thread: the library is on
/// disk before anything is launched, and the launch then takes it (no second library, the first
/// not rewritten). Runs in a child process of this test binary with a cache folder of its own,
/// so that no other test's libraries are counted.
#[test]
fn a_planned_launch_warmed_up_is_compiled_before_it_runs() {
    let Some(plugin) = cpu_plugin("cpu warm-up") else { return };
    let Some(cache) = std::env::var_os("TESSEL_WARM_UP_CHILD") else {
        let dir = tempfile::tempdir().unwrap();
        let me = std::env::current_exe().unwrap();
        let out = std::process::Command::new(me)
            .args(["--exact", "a_planned_launch_warmed_up_is_compiled_before_it_runs", "--nocapture"])
            .env("TESSEL_WARM_UP_CHILD", dir.path())
            .env("TESSEL_CACHE_DIR", dir.path())
            .env_remove("TESSEL_CACHE")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("1 passed"), "the child: {said}");
        return;
    };
    let libraries = || -> Vec<(String, std::time::SystemTime)> {
        let mut v: Vec<_> = std::fs::read_dir(Path::new(&cache).join("cpu"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().modified().unwrap()))
                    .filter(|(n, _)| (n.ends_with(".so") || n.ends_with(".dylib")) && !n.contains(".tmp"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let rt = tessel::Runtime::new(&[plugin]).unwrap();
    let text = "kernel warm\n  in  a: f32[1000]\n  out o: f32[1000]\n{\n  %a = load a\n  %s = mul %a, 3.0\n  %o = add %s, 1.0\n  store o, %o\n}\n";
    let kernels = tessel::load_source("warm.tk", text).unwrap();
    let call = [tessel::Call::new(kernels[0].clone())];
    let launch = tessel::Launch::kernels(call.clone());
    let planned = rt.plan(tessel::Choice::Named("cpu"), &launch).unwrap();
    assert!(libraries().is_empty(), "planning compiles nothing: {:?}", libraries());
    planned.warm_up();
    // Waits for the compiler the warm-up started (a liveness bound, not a speed limit).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while libraries().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no library five minutes after the warm-up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let warm = libraries();
    let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 100.0).collect();
    let args = tessel::LaunchArgs {
        inputs: [(
            "a".to_string(),
            tessel::HostArray::from_bits(tessel_plugin_api::ir::DType::F32, &[1000], a.iter().map(|x| x.to_bits()).collect()),
        )]
        .into(),
        grid: Default::default(),
    };
    let out = planned.launch(&args).unwrap();
    let want: Vec<f64> = a.iter().map(|&x| (x * 3.0 + 1.0) as f64).collect();
    assert_eq!(out[0].1.to_f64(), want);
    assert_eq!(libraries(), warm, "the launch compiled again");
}
