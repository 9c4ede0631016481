//! Helpers shared by the workspace tests: the CLI in-process, `.npy` files, seeded data, closeness.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod exec;

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessel::{HostArray, Tolerance};
use tessel_plugin_api::array::ArrayData;
use tessel_plugin_api::ir::DType;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An array of type `ty` holding `values` (each converted as the dtype converts a number).
#[allow(dead_code)] // not every test binary builds arrays from numbers
pub fn array_of(ty: &tessel_plugin_api::ir::Type, values: &[f64]) -> tessel::HostArray {
    use tessel_plugin_api::array::ArrayData;
    use tessel_plugin_api::ir::DType;
    let data = match ty.dtype {
        DType::F32 => ArrayData::F32(values.iter().map(|&v| v as f32).collect()),
        DType::F16 => ArrayData::F16(values.iter().map(|&v| half::f16::from_f64(v)).collect()),
        DType::BF16 => ArrayData::BF16(values.iter().map(|&v| half::bf16::from_f64(v)).collect()),
        DType::I32 => ArrayData::I32(values.iter().map(|&v| v as i32).collect()),
        DType::U32 => ArrayData::U32(values.iter().map(|&v| v as u32).collect()),
        DType::Bool => ArrayData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        DType::I8 => ArrayData::I8(values.iter().map(|&v| v as i8).collect()),
        DType::U8 => ArrayData::U8(values.iter().map(|&v| v as u8).collect()),
        DType::I16 => ArrayData::I16(values.iter().map(|&v| v as i16).collect()),
        DType::U16 => ArrayData::U16(values.iter().map(|&v| v as u16).collect()),
    };
    tessel::HostArray { shape: ty.shape.clone(), data }
}

/// The inputs a kernel file's tests launch `kernel` with: seeded random ones, except those the
/// file's header gives (`# in  NAME = v, v, ...`: block tables, lengths, group offsets, which
/// must make sense for the kernel to do any work).
#[allow(dead_code)] // not every test binary launches kernel files
pub fn file_inputs(
    path: &Path,
    kernel: &tessel_plugin_api::ir::Verified,
    seed: u64,
) -> std::collections::BTreeMap<String, tessel::HostArray> {
    let mut inputs = tessel::inputs::random_inputs(kernel.kernel(), seed);
    for (name, values) in header_inputs(path) {
        let p = kernel.kernel().param(&name).unwrap_or_else(|| panic!("{}: no input `{name}`", path.display()));
        assert_eq!(values.len(), p.ty.numel(), "{}: `{name}` is {} but {} values are given", path.display(), p.ty, values.len());
        inputs.insert(name, array_of(&p.ty, &values));
    }
    inputs
}

/// The `# in  NAME = v, v, ...` lines of a kernel file.
#[allow(dead_code)]
pub fn header_inputs(path: &Path) -> Vec<(String, Vec<f64>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("# in ")?.split_once('='))
        .map(|(name, values)| {
            let parse = |v: &str| v.trim().parse::<f64>().unwrap_or_else(|e| panic!("{}: `{v}`: {e}", path.display()));
            (name.trim().to_string(), values.split(',').map(parse).collect())
        })
        .collect()
}

/// Every kernel file of the tests: `examples/`, `tests/in/`, `tests/in/regressions/` and
/// `tests/in/pallas/` (JAX's shipped Pallas ops as translated: `scripts/translate-pallas-ops`),
/// sorted.
#[allow(dead_code)] // not every test binary walks them
pub fn kernel_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["examples", "tests/in", "tests/in/regressions", "tests/in/pallas"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root().join(d)).expect("a folder of kernels").filter_map(|e| Some(e.ok()?.path())))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    files
}

/// `target/debug` (or wherever this test binary's profile lives).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// Runs `cargo build ARGS` in the repository (a no-op when everything is up to date).
pub fn cargo_build(args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Quiet: its "Compiling" lines would fill the test output (errors still show).
    let status =
        std::process::Command::new(cargo).current_dir(root()).args(["build", "--quiet"]).args(args).status().expect("cargo runs");
    assert!(status.success(), "cargo build {args:?} failed");
}

/// Output of one in-process `tessel` command.
pub struct Outcome {
    pub code: u8,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `tessel ARGS...` in-process.
pub fn tessel(args: &[&str]) -> Outcome {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let argv = std::iter::once("tessel").chain(args.iter().copied());
    let code = tessel::cli::main(argv, &mut out, &mut err);
    Outcome { code, stdout: String::from_utf8(out).expect("utf-8"), stderr: String::from_utf8(err).expect("utf-8") }
}

/// A seeded stream of test data, independent of tessel's own input generator.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ 0x007e_55e1)
}

/// `n` floats uniform in [-1, 1).
pub fn floats(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

pub fn f32_array(shape: &[usize], data: Vec<f32>) -> HostArray {
    assert_eq!(shape.iter().product::<usize>(), data.len());
    HostArray { shape: shape.to_vec(), data: ArrayData::F32(data) }
}

/// Writes `array` as `dir/name.npy` and returns the `--input name=path` argument.
pub fn input_arg(dir: &Path, name: &str, array: &HostArray) -> String {
    let path = dir.join(format!("in_{name}.npy"));
    tessel::npy::write(&path, array).expect("write input");
    format!("{name}={}", path.display())
}

pub fn read_output(dir: &Path, name: &str) -> HostArray {
    tessel::npy::read(&dir.join(format!("{name}.npy"))).expect("output written")
}

/// Asserts `got` is within the f32 tolerance of `want` everywhere.
pub fn assert_close(what: &str, got: &HostArray, want: &[f64], dtype: DType) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let got = got.to_f64();
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let tol = Tolerance::for_dtype(dtype);
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !tol.close(**g, **w))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g} want {w}"))
        .collect();
    assert!(bad.is_empty(), "{what}: {} beyond tolerance, first: {}", bad.len(), bad.join("; "));
}

/// Records a test that could not run here: loud on stderr, counted by `scripts/test` from
/// `target/tessel-skips.txt`. With `require` set (CI), a skip is a failure instead.
pub fn skip(test: &str, reason: &str, require: &str) {
    if std::env::var(require).is_ok_and(|v| v == "1") {
        panic!("{test}: {reason}, and {require}=1 makes that a failure");
    }
    eprintln!("SKIPPED {test}: {reason} (set {require}=1 to make this a failure)");
    let log = root().join("target").join("tessel-skips.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        use std::io::Write as _;
        let _ = writeln!(f, "{test}: {reason}");
    }
}

/// NVIDIA's `ptxas`: `TESSEL_PTXAS`, the venv `scripts/test` installs under `target/`, or `PATH`.
pub fn ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TESSEL_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = root().join("target/venv/lib");
    let found = std::fs::read_dir(&venv).ok().into_iter().flatten().filter_map(|e| e.ok()).find_map(|py| {
        let nvidia = py.path().join("site-packages/nvidia");
        std::fs::read_dir(nvidia).ok()?.filter_map(|e| e.ok()).map(|cu| cu.path().join("bin/ptxas")).find(|p| p.exists())
    });
    found.or_else(|| {
        std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("ptxas")).find(|p| p.exists()))
    })
}

/// The wgpu adapter, described (name, type, API), or `None` after a recorded skip: with
/// `TESSEL_REQUIRE_ADAPTER=1` (CI) no adapter is a failure.
pub fn wgpu_adapter(test: &str) -> Option<String> {
    let r = tessel(&["backends", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("backends --json");
    let b = v["backends"].as_array().expect("backends").iter().find(|b| b["name"] == "wgpu").expect("wgpu is built in").clone();
    let reason = b["reason"].as_str().unwrap_or_default().to_string();
    if b["available"].as_bool() == Some(true) {
        eprintln!("{test}: wgpu runs on {reason}");
        Some(reason)
    } else {
        skip(test, &format!("wgpu: {reason}"), "TESSEL_REQUIRE_ADAPTER");
        None
    }
}

/// How a Mosaic GPU PTX module is launched, from its header comment.
pub struct LaunchShape {
    pub ctas: u32,
    pub threads: u32,
    /// Workspace bytes per CTA.
    pub per_cta: usize,
    /// Whether the workspace is dynamic shared memory (else a global buffer, the first parameter).
    pub shared: bool,
}

/// "// N CTAs of T threads, W bytes of shared memory per CTA" (or "of global workspace"); a
/// persistent grid ("// persistent: ...") launched as on a device with half as many SMs as it
/// has output blocks (rounded up), so that its CTAs loop over two blocks each, `%nctaid.x`
/// apart.
pub fn launch_shape(ptx: &str) -> LaunchShape {
    let header = ptx.lines().find(|l| l.contains("CTAs of")).expect("plan comment");
    let words: Vec<&str> = header.split_whitespace().collect();
    let ctas: u32 = words[1].parse().expect("CTA count");
    let persistent = ptx.lines().any(|l| l.starts_with("// persistent: "));
    LaunchShape {
        ctas: if persistent { ctas.div_ceil(2) } else { ctas },
        threads: words[4].parse().expect("threads per CTA"),
        per_cta: words[6].parse().expect("workspace bytes"),
        shared: header.contains("bytes of shared memory"),
    }
}

/// Runs the Mosaic GPU PTX of `kernel` on the PTX emulator (`tests/ptx-emu`) with `inputs`, threads
/// in order or in reverse order; returns the outputs.
pub fn emulate(
    ptx: &str,
    kernel: &tessel_plugin_api::ir::Verified,
    inputs: &tessel::LaunchArgs,
    reverse: bool,
) -> Result<Vec<(String, tessel::HostArray)>, String> {
    emulate_counted(ptx, kernel, inputs, reverse).map(|(outputs, _)| outputs)
}

/// [`emulate`], with what the emulator executed.
pub fn emulate_counted(
    ptx: &str,
    kernel: &tessel_plugin_api::ir::Verified,
    inputs: &tessel::LaunchArgs,
    reverse: bool,
) -> Result<(Vec<(String, tessel::HostArray)>, tessel_ptx_emu::Counts), String> {
    use tessel_plugin_api::ir::ParamKind;
    let module = tessel_ptx_emu::parse(ptx)?;
    let LaunchShape { ctas, threads, per_cta, shared } = launch_shape(ptx);
    let mut mem = tessel_ptx_emu::Memory::default();
    let mut params = Vec::new();
    if !shared {
        params.push(mem.alloc(ctas as usize * per_cta));
    }
    let mut outputs = Vec::new();
    let mut arrays = std::collections::HashMap::new();
    // Arrays as the runtime lays them out: 16-bit types 2 bytes an element, 8-bit integers 1,
    // the rest 4.
    let width = |ty: &tessel_plugin_api::ir::Type| tessel_mosaic_gpu::emit::element_bytes(ty.dtype);
    for p in kernel.kernel().params.iter().filter(|p| p.kind != ParamKind::Scratch) {
        let addr = mem.alloc(p.ty.numel() * width(&p.ty));
        if p.kind == ParamKind::In {
            mem.write_elements(addr, width(&p.ty), &inputs.inputs[&p.name].to_bits());
        } else {
            outputs.push((p.name.clone(), p.ty.clone(), addr));
        }
        arrays.insert(p.name.clone(), (addr, p.ty.clone()));
        params.push(addr);
    }
    // The tensor maps the runtime would encode, from the PTX's header ("// tensor map PARAM: ARRAY,
    // box X x Y ..., swizzle S", the contiguous dimension first), in the entry's order.
    let mut maps = Vec::new();
    for line in ptx.lines().filter_map(|l| l.strip_prefix("// tensor map ")) {
        let (array, rest) = line.split_once(": ").and_then(|(_, r)| r.split_once(", box ")).expect("a tensor map line");
        let (boxes, swizzle) = rest.split_once(", swizzle ").expect("a swizzle");
        let (addr, ty) = &arrays[array];
        let elem = width(ty) as u64;
        let dims: Vec<u64> = ty.shape.iter().rev().map(|&n| n as u64).collect();
        let strides = (1..dims.len()).map(|d| dims[..d].iter().product::<u64>() * elem).collect();
        maps.push(tessel_ptx_emu::TensorMap {
            address: *addr,
            dims,
            strides,
            elem_bytes: elem as u32,
            boxes: boxes.split(" x ").map(|b| b.parse().expect("box")).collect(),
            swizzle: swizzle.parse().expect("swizzle"),
        });
    }
    // Scratch in shared memory alone ("// the scratch: B bytes of shared memory from byte 0") and
    // the concurrent model's mbarriers ("// N mbarriers: B bytes of shared memory from byte O;").
    let end_of = |l: &str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (bytes, from) = (w[w.len() - 8], w[w.len() - 1].trim_end_matches(';'));
        bytes.parse::<usize>().expect("bytes") + from.parse::<usize>().expect("offset")
    };
    let extra = (ptx.lines().filter_map(|l| l.strip_prefix("// ")))
        .filter(|l| l.starts_with("the scratch: ") || l.contains(" mbarriers: "))
        .map(|l| end_of(l.split(';').next().expect("a line")))
        .max()
        .unwrap_or(0);
    let shared_bytes = (if shared { per_cta } else { 0 }).max(extra);
    let counts = module.launch_with_maps(&mut mem, &params, &maps, ctas, threads, shared_bytes, reverse)?;
    let outputs = outputs
        .into_iter()
        .map(|(name, ty, addr)| {
            let bits = mem.read_elements(addr, width(&ty), ty.numel());
            (name, tessel::HostArray::from_bits(ty.dtype, &ty.shape, bits))
        })
        .collect();
    Ok((outputs, counts))
}

/// `ptxas -arch=sm_90a -v`: Ok(the register and spill lines) or Err(its errors).
pub fn assemble(ptxas: &Path, name: &str, ptx: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join(format!("{name}.ptx"));
    std::fs::write(&src, ptx).expect("write ptx");
    let out = std::process::Command::new(ptxas)
        .arg("-arch=sm_90a")
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join("out.cubin"))
        .output()
        .expect("ptxas runs");
    let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(log);
    }
    Ok(log
        .lines()
        .filter(|l| {
            l.contains("Used") || l.contains("spill") || l.contains("warning") || l.contains("Potential Performance Loss")
        })
        .map(|l| l.trim().replace(&dir.path().display().to_string(), ""))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Runs the built `tessel` binary with `ARGS...` and extra environment `envs` (for what an
/// in-process run cannot set, such as the cache folder).
pub fn tessel_env(args: &[&str], envs: &[(&str, &str)]) -> Outcome {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| cargo_build(&["-p", "tessel", "--bin", "tessel"]));
    let out = std::process::Command::new(target_dir().join("tessel"))
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("the tessel binary runs");
    Outcome {
        code: out.status.code().map_or(255, |c| c as u8),
        stdout: String::from_utf8(out.stdout).expect("utf-8"),
        stderr: String::from_utf8(out.stderr).expect("utf-8"),
    }
}

/// The cpu backend's plugin (`libtessel_cpu.so`), built here, or `None` after a recorded skip
/// where this machine has no C compiler for it (`TESSEL_REQUIRE_CC=1`, set by CI, makes that a
/// failure).
pub fn cpu_plugin(test: &str) -> Option<PathBuf> {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| cargo_build(&["-p", "tessel-cpu"]));
    let cc = std::env::var("CC").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".into());
    if !std::process::Command::new(&cc).arg("--version").output().is_ok_and(|o| o.status.success()) {
        skip(test, &format!("the cpu backend needs a C compiler (`{cc}`)"), "TESSEL_REQUIRE_CC");
        return None;
    }
    let lib = format!("{}tessel_cpu{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    Some(target_dir().join(lib))
}

/// The launch flags a kernel file needs for `tessel run`: every kernel of the file (several make
/// one MPMD launch), and a mesh or grid sizes where the file needs them.
#[allow(dead_code)]
pub fn launch_flags(path: &Path) -> Vec<String> {
    let name = path.file_stem().unwrap().to_str().unwrap();
    let mut args = Vec::new();
    for k in tessel::load_file(path).unwrap_or_else(|e| panic!("{e}")) {
        args.extend(["--kernel".to_string(), k.name().to_string()]);
    }
    match name {
        "dyn_grid" => args.extend(["--grid".into(), "i=3".into()]),
        "mesh_grid" => args.extend(["--mesh".into(), "grid(i: 4, j: 2)".into()]),
        _ => {}
    }
    args
}

/// A kept output (an aliased input's buffer) in an in-place launch of two kernels on `backend`:
/// the refusal's message.
#[allow(dead_code)]
pub fn kept_in_two_kernels(backend: &str, plugins: &[PathBuf]) -> Result<(), String> {
    let rt = tessel::Runtime::new(plugins).unwrap();
    let text = "kernel a\n  out o: f32[8]\n{\n  %z = full 1.0 : f32[8]\n  store o, %z\n}\nkernel b\n  out p: f32[8]\n{\n  %z = full 2.0 : f32[8]\n  store p, %z\n}\n";
    let kernels = tessel::load_source("two.tk", text).unwrap();
    let calls: Vec<_> = kernels.iter().map(|k| tessel::Call::new(k.clone())).collect();
    let ty = kernels[0].kernel().param("o").unwrap().ty.clone();
    let (mut o, mut p) = (vec![0u8; 32], vec![0u8; 32]);
    let mut place = tessel::InPlace::default();
    place.outputs.insert("o".into(), tessel::BytesMut { ty: ty.clone(), bytes: &mut o, keep: true });
    place.outputs.insert("p".into(), tessel::BytesMut { ty, bytes: &mut p, keep: false });
    rt.plan(tessel::Choice::of(backend), &tessel::Launch::new(calls.clone(), [], place.grid.clone()))
        .and_then(|p| p.run_in_place(&mut place))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The stages of `calls` lowered on `backend` (planned first, as every launch is).
#[allow(dead_code)]
pub fn lowered(rt: &tessel::Runtime, backend: &str, calls: &[tessel::Call]) -> tessel::Result<Vec<(String, String)>> {
    rt.plan(tessel::Choice::Named(backend), &tessel::Launch::kernels(calls.to_vec()))?.lower()
}

/// The outputs of `calls` launched on `backend` with `args` (planned first, as every launch is).
#[allow(dead_code)]
pub fn launched(
    rt: &tessel::Runtime,
    backend: &str,
    calls: &[tessel::Call],
    args: &tessel::LaunchArgs,
) -> tessel::Result<Vec<(String, HostArray)>> {
    rt.plan(tessel::Choice::Named(backend), &tessel::Launch::new(calls.to_vec(), [], args.grid.clone()))?.launch(args)
}
