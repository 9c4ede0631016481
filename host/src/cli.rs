//! The `tessel` command line (see DESIGN.md, "Command line").

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};
use serde::Serialize;
use tessel_plugin_api::abi::MeshBox;
use tessel_plugin_api::array::agreement;
use tessel_plugin_api::ir::Verified;
use tessel_plugin_api::ir::generic::Generic;

use crate::{Choice, Error, HostArray, KernelLaunch, Launch, LaunchArgs, Plan, Planned, Result, Runtime};

/// tessel: block-level kernels, written once, launched on any backend.
#[derive(Debug, Parser)]
#[command(name = "tessel", version, about, long_about = None)]
struct Cli {
    /// Load a backend plugin (a shared library); may be given several times. Added to the
    /// plugins of TESSEL_PLUGIN_PATH; one named like a built-in replaces it.
    #[arg(long = "plugin", value_name = "PATH", global = true)]
    plugins: Vec<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the backends: source, version, availability and reason, capabilities.
    Backends {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the standard suite against a backend or plugin: lowering, runs against the
    /// interpreter, refusals, mesh round trips. Prints a table; exits 1 on any failure.
    Conformance {
        /// The backend to test.
        #[arg(long)]
        backend: String,
    },
    /// Time a kernel on a backend: compile time, run time (median of --runs after one warm-up),
    /// GB/s of argument traffic and, for kernels with `dot`, GFLOP/s.
    Bench {
        #[command(flatten)]
        launch: LaunchFlags,
        /// Timed runs.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print one JSON object (the fields of DESIGN.md's `bench --json`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Parse and verify a .tk file; print its canonical text, or every error with line:col. A
    /// generic kernel is verified with its defaults and the values given.
    Check {
        /// The kernel file.
        file: PathBuf,
        /// A value for a kernel parameter: P=V.
        #[arg(long = "param", value_name = "P=V")]
        params: Vec<String>,
    },
    /// Try every combination of the candidates of a kernel's parameters on one backend, check
    /// each against the interpreter, and record the fastest in the cache folder for `run` and
    /// `bench` (docs/language.md §9).
    Tune {
        #[command(flatten)]
        launch: LaunchFlags,
        /// An input array: NAME=FILE.npy. Without any, seeded random inputs are made.
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Timed runs per candidate.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Print what a backend lowers a launch to (PTX, WGSL, ...); needs no device.
    Lower {
        #[command(flatten)]
        launch: LaunchFlags,
    },
    /// Run a kernel and write each output as DIR/NAME.npy.
    Run {
        #[command(flatten)]
        launch: LaunchFlags,
        /// An input array: NAME=FILE.npy. Without any, seeded random inputs are made.
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where to write the outputs [default: tessel-out/KERNEL].
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
        /// Also run the reference interpreter on the same inputs and compare every output.
        #[arg(long)]
        check: bool,
    },
}

/// What a launch names, shared by `lower` and `run`.
#[derive(Debug, clap::Args)]
struct LaunchFlags {
    /// The kernel file.
    file: PathBuf,
    /// The backend: a name, or `auto` for the first available that takes the launch [default:
    /// auto for `run`, interpret for `lower` and `bench`].
    #[arg(long)]
    backend: Option<String>,
    /// The kernel of the file (needed when it defines several); twice or more for one launch of
    /// several kernels.
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// The kernel mesh, as `grid(i: 4)` for every kernel or `KERNEL=mosaic_gpu(...)` for one.
    #[arg(long = "mesh", value_name = "MESH")]
    meshes: Vec<String>,
    /// An external mesh (devices around the launch).
    #[arg(long = "external-mesh", value_name = "MESH")]
    external_meshes: Vec<String>,
    /// The size of a `dyn` grid axis: AXIS=N.
    #[arg(long = "grid", value_name = "AXIS=N")]
    grid: Vec<String>,
    /// A value for a kernel parameter: P=V (docs/language.md §9).
    #[arg(long = "param", value_name = "P=V")]
    params: Vec<String>,
    /// Print which backend was chosen and why every other was skipped (with --backend auto).
    #[arg(long)]
    explain: bool,
}

/// Runs the command line `args` (the first is the program name), printing to `out` and `err`.
/// Returns the exit code: 0 success, 1 user error, 2 bad command line.
pub fn main<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.render().to_string();
            return if e.use_stderr() {
                let _ = write!(err, "{text}");
                2
            } else {
                let _ = write!(out, "{text}");
                0
            };
        }
    };
    let result = match cli.command {
        Command::Check { file, params } => check(&file, &params, out),
        Command::Backends { json } => Runtime::new(&cli.plugins).and_then(|rt| backends(&rt, json, out)),
        Command::Bench { launch, runs, seed, json } => {
            Runtime::new(&cli.plugins).and_then(|rt| bench(&rt, &launch, runs, seed, json, out, err))
        }
        Command::Conformance { backend } => Runtime::new(&cli.plugins).and_then(|rt| conformance(&rt, &backend, out)),
        Command::Lower { launch } => Runtime::new(&cli.plugins).and_then(|rt| lower(&rt, &launch, out, err)),
        Command::Run { launch, inputs, seed, out_dir, check } => {
            let opts = RunOptions { inputs, seed, out_dir, check };
            Runtime::new(&cli.plugins).and_then(|rt| run(&rt, &launch, &opts, out, err))
        }
        Command::Tune { launch, inputs, runs, seed } => {
            Runtime::new(&cli.plugins).and_then(|rt| tune(&rt, &launch, &inputs, runs, seed, out))
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let text = e.to_string();
            let _ = if text.contains(": error:") { write!(err, "{text}") } else { writeln!(err, "error: {text}") };
            1
        }
    }
}

/// Floating-point operations of the `dot`s of a kernel over its whole grid (loops with literal
/// bounds counted by their trip count).
fn dot_flops(v: &Verified, grid_points: u64) -> u64 {
    use tessel_plugin_api::ir::{Literal, Op, Operand, Stmt};
    fn walk(v: &Verified, body: &[Stmt], times: u64) -> u64 {
        body.iter()
            .map(|s| match &s.op {
                Op::Dot { a, trans_a, .. } => {
                    let out = s.ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
                    let Operand::Value(a) = a else { return 0 };
                    let sa = &v.value_type(a).shape;
                    let k = if *trans_a { sa[0] } else { sa[1] };
                    times * 2 * (out[0] * out[1] * k) as u64
                }
                Op::When { body, .. } => walk(v, body, times),
                Op::For { lo, hi, step, body, .. } => {
                    let lit = |o: &Operand| if let Operand::Lit(Literal::Int(n)) = o { Some(*n) } else { None };
                    let trips = match (lit(lo), lit(hi), step.as_ref().map_or(Some(1), lit)) {
                        (Some(l), Some(h), Some(st)) if st > 0 && h > l => ((h - l + st - 1) / st) as u64,
                        _ => 1,
                    };
                    walk(v, body, times * trips)
                }
                _ => 0,
            })
            .sum()
    }
    walk(v, &v.kernel().body, grid_points)
}

/// `tessel bench --json`: times in milliseconds, rates on the kernel's time on the device.
#[derive(Serialize)]
struct BenchReport {
    backend: String,
    /// The adapter or GPU, as the backend describes where it runs.
    target: String,
    kernel: String,
    /// The kernels' parameters (docs/language.md §9) as bound.
    params: BTreeMap<String, i64>,
    /// The sizes of `dyn` grid axes.
    grid: BTreeMap<String, u64>,
    compile_ms: f64,
    /// The launch alone on arrays already on the device (median), or `null` where the backend
    /// could not keep them there.
    kernel_ms: Option<f64>,
    /// How `kernel_ms` was taken: `gpu-timestamps` (the device's clock, from the start of the
    /// first dispatch to the end of the last) where the backend has them, else `submit-and-wait`
    /// (the launch and the wait for it, on the host clock).
    kernel_timing: &'static str,
    /// The launch and the wait for it on the host clock (median), arrays on the device.
    launch_ms: Option<f64>,
    run_ms: f64,
    runs: usize,
    bytes: u64,
    flops: u64,
    gbs: Option<f64>,
    gflops: Option<f64>,
}

fn bench(
    rt: &Runtime,
    flags: &LaunchFlags,
    runs: usize,
    seed: u64,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    let p = prepare(rt, flags, LOWER_DEFAULT, &BTreeMap::new())?;
    p.warn(err);
    if !json {
        explain(&p, flags, out);
    }
    let launch = LaunchArgs { inputs: random_inputs(&p, seed)?, grid: p.grid.clone() };
    let (compile, mut times) = p.planned(rt, |planned| {
        let start = Instant::now();
        planned.lower()?;
        let compile = start.elapsed();
        planned.launch(&launch)?;
        let times: Vec<f64> = (0..runs.max(1))
            .map(|_| {
                let t = Instant::now();
                planned.launch(&launch).map(|_| t.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?;
        Ok((compile, times))
    })?;
    times.sort_by(f64::total_cmp);
    let median = middle(&times);
    let resident = resident_times(rt, &p, &launch, runs.max(1));
    let bytes: u64 = p
        .kernels
        .iter()
        .flat_map(|k| k.kernel().params.iter())
        .filter(|a| a.kind != tessel_plugin_api::ir::ParamKind::Scratch)
        .map(|a| (a.ty.numel() as u64) * u64::from(a.ty.dtype.bits() / 8))
        .sum();
    let grid_points = |k: &Verified| -> u64 {
        k.grid()
            .iter()
            .map(|a| match a.size {
                tessel_plugin_api::ir::AxisSize::Fixed(n) => n,
                tessel_plugin_api::ir::AxisSize::Dyn => p.grid.get(&a.name).copied().unwrap_or(1),
            })
            .product()
    };
    let flops: u64 = p.kernels.iter().map(|k| dot_flops(k, grid_points(k))).sum();
    let names: Vec<&str> = p.kernels.iter().map(Verified::name).collect();
    if json {
        let launch_ms = resident.as_ref().ok().map(|t| middle(&t.host));
        let gpu = resident.as_ref().ok().and_then(|t| t.device.as_deref().map(middle));
        let on_device = gpu.or(launch_ms);
        let target = rt.backend(&p.backend).map(|b| b.backend.availability().reason).unwrap_or_default();
        let report = BenchReport {
            backend: p.backend.clone(),
            target: target.to_string(),
            kernel: names.join(","),
            params: p.values.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            grid: p.grid.clone(),
            compile_ms: compile.as_secs_f64() * 1e3,
            kernel_ms: on_device.map(|d| d * 1e3),
            kernel_timing: if gpu.is_some() { "gpu-timestamps" } else { "submit-and-wait" },
            launch_ms: launch_ms.map(|d| d * 1e3),
            run_ms: median * 1e3,
            runs: times.len(),
            bytes,
            flops,
            gbs: on_device.map(|d| bytes as f64 / d / 1e9),
            gflops: on_device.filter(|_| flops > 0).map(|d| flops as f64 / d / 1e9),
        };
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
        return Ok(());
    }
    let _ = writeln!(out, "bench `{}` on {} ({} runs after a warm-up)", names.join("`, `"), p.backend, times.len());
    let _ = writeln!(out, "  compile (lower, cold): {:.3} ms", compile.as_secs_f64() * 1e3);
    let _ = writeln!(out, "  run (median, with transfers): {}", spread(&times));
    // On the device: the launch alone, its arrays uploaded once before (submit and wait).
    let on_device = match &resident {
        Ok(t) => {
            let _ = writeln!(out, "  launch (median, arrays on the device, submit and wait): {}", spread(&t.host));
            match &t.device {
                Some(d) => {
                    let _ = writeln!(out, "  kernel (median, the device's clock, GPU timestamps): {}", spread(d));
                    Some(middle(d))
                }
                None => {
                    let _ = writeln!(out, "  kernel on the device's clock: not measured ({} has no GPU timestamps)", p.backend);
                    Some(middle(&t.host))
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  launch with arrays on the device: not measured ({e})");
            None
        }
    };
    let rates = |per: f64| match on_device {
        Some(d) => format!("{:.2} with transfers, {:.2} on the device", per / median / 1e9, per / d / 1e9),
        None => format!("{:.2}", per / median / 1e9),
    };
    let _ = writeln!(out, "  arguments: {:.2} MB, GB/s: {}", bytes as f64 / 1e6, rates(bytes as f64));
    if flops > 0 {
        let _ = writeln!(out, "  dot: {:.3} GFLOP, GFLOP/s: {}", flops as f64 / 1e9, rates(flops as f64));
    }
    Ok(())
}

/// Sorted times of `runs` launches (after a warm-up) on arrays uploaded to the backend once:
/// inputs as given, outputs allocated there; every array freed after.
/// The median of sorted times.
fn middle(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

/// Sorted times in seconds as `median ms (min .., max ..)`.
fn spread(sorted: &[f64]) -> String {
    let ms = |t: f64| t * 1e3;
    format!("{:.3} ms (min {:.3}, max {:.3})", ms(middle(sorted)), ms(sorted[0]), ms(sorted[sorted.len() - 1]))
}

/// Times of launches on arrays uploaded once, in seconds, sorted: on the host clock (submit and
/// wait), and on the device's own where the backend has GPU timestamps (separate launches, so
/// that reading the timestamps back is not in the host's times).
struct ResidentTimes {
    host: Vec<f64>,
    device: Option<Vec<f64>>,
}

fn resident_times(rt: &Runtime, p: &Prepared, launch: &LaunchArgs, runs: usize) -> Result<ResidentTimes> {
    let mut arrays: Vec<(String, crate::DeviceArray)> = Vec::new();
    let result = (|| -> Result<ResidentTimes> {
        for k in &p.kernels {
            for a in k.kernel().params.iter().filter(|a| a.kind != tessel_plugin_api::ir::ParamKind::Scratch) {
                if arrays.iter().any(|(n, _)| n == &a.name) {
                    continue;
                }
                let d = match launch.inputs.get(&a.name) {
                    Some(h) => rt.upload(&p.backend, h)?,
                    None => rt.alloc(&p.backend, &a.ty)?,
                };
                arrays.push((a.name.clone(), d));
            }
        }
        let bound: Vec<(&str, &crate::DeviceArray)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let (mut host, device) = p.planned(rt, |planned| {
            planned.launch_resident(&bound, false)?;
            let host: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    planned.launch_resident(&bound, false).map(|_| t.elapsed().as_secs_f64())
                })
                .collect::<Result<_>>()?;
            let timed = |_| planned.launch_resident(&bound, true);
            let device: Option<Vec<f64>> =
                (0..runs).map(timed).collect::<Result<Vec<_>>>()?.into_iter().map(|d| d.map(|d| d.as_secs_f64())).collect();
            Ok((host, device))
        })?;
        host.sort_by(f64::total_cmp);
        let device = device.map(|mut d| {
            d.sort_by(f64::total_cmp);
            d
        });
        Ok(ResidentTimes { host, device })
    })();
    for (_, a) in arrays {
        rt.free(a);
    }
    result
}

fn conformance(rt: &Runtime, backend: &str, out: &mut dyn Write) -> Result<()> {
    let rows = crate::conformance::run(rt, backend)?;
    let (table, ok) = crate::conformance::table(backend, &rows);
    let _ = write!(out, "{table}");
    let failed = rows.iter().filter(|r| matches!(r.verdict, crate::conformance::Verdict::Fail(_))).count();
    if ok { Ok(()) } else { Err(Error::ConformanceFailed { backend: backend.to_string(), failed }) }
}

fn check(file: &Path, params: &[String], out: &mut dyn Write) -> Result<()> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::Read { path: file.to_path_buf(), source })?;
    let checked = crate::check_source(&file.display().to_string(), &text, &parse_params(params)?)?;
    let texts: Vec<String> = checked
        .iter()
        .map(|(text, how)| match how {
            crate::Checked::Verified(None) => text.clone(),
            crate::Checked::Verified(Some(values)) => format!("{text}# verified with {values}\n"),
            crate::Checked::Unbound(names) => format!(
                "{text}# names and syntax checked; not verified: no value for {} (give --param {}=V)\n",
                names.join(", "),
                names[0]
            ),
        })
        .collect();
    let _ = write!(out, "{}", texts.join("\n"));
    Ok(())
}

/// `--param P=V` flags as values.
fn parse_params(flags: &[String]) -> Result<BTreeMap<String, i64>> {
    const EXPECTED: &str = "P=V with V an integer, as in `--param BM=32`";
    let mut out = BTreeMap::new();
    for f in flags {
        let (name, v) = split_flag("--param", f, EXPECTED)?;
        let v: i64 = v.parse().map_err(|_| Error::BadFlag {
            flag: "--param",
            value: f.clone(),
            why: format!("`{v}` is not an integer"),
            expected: EXPECTED,
        })?;
        out.insert(name.to_string(), v);
    }
    Ok(out)
}

/// One backend as `tessel backends --json` prints it.
#[derive(Serialize)]
struct BackendReport {
    name: String,
    source: String,
    version: String,
    platform: String,
    available: bool,
    reason: String,
    /// The device class `auto` ranks by (`native`, `hardware`, `cpu`, `software`); absent when
    /// unavailable.
    class: Option<&'static str>,
    note: Option<String>,
    capabilities: CapabilityReport,
}

#[derive(Serialize)]
struct CapabilityReport {
    mesh_kinds: Vec<String>,
    portable_meshes: bool,
    dtypes: Vec<String>,
    dynamic_grid: bool,
    multiple_kernels: bool,
    external_meshes: bool,
    targets: Vec<String>,
    max_block_elements: u64,
}

#[derive(Serialize)]
struct FailedReport {
    path: String,
    error: String,
}

#[derive(Serialize)]
struct BackendsReport {
    backends: Vec<BackendReport>,
    failed_plugins: Vec<FailedReport>,
}

fn strings(v: &abi_stable::std_types::RVec<abi_stable::std_types::RString>) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// What `tessel backends --json` prints: every backend (source, version, platform, availability
/// and its reason, capabilities) and the plugins that failed to load, as JSON text.
pub fn backends_json(rt: &Runtime) -> String {
    serde_json::to_string_pretty(&backends_report(rt)).expect("the report serialises")
}

fn backends(rt: &Runtime, json: bool, out: &mut dyn Write) -> Result<()> {
    let report = backends_report(rt);
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
        return Ok(());
    }
    for b in &report.backends {
        let state = if b.available { "available" } else { "unavailable" };
        let _ = writeln!(out, "{} {} ({})", b.name, b.version, b.source);
        match b.class {
            Some(class) => {
                let _ = writeln!(out, "  {state} ({class}): {}", b.reason);
            }
            None => {
                let _ = writeln!(out, "  {state}: {}", b.reason);
            }
        }
        if let Some(n) = &b.note {
            let _ = writeln!(out, "  note: {n}");
        }
        let c = &b.capabilities;
        let _ = writeln!(out, "  platform: {}", b.platform);
        let _ = writeln!(
            out,
            "  meshes: {}; dtypes: {}; targets: {}",
            c.mesh_kinds.join(" "),
            c.dtypes.join(" "),
            c.targets.join(" ")
        );
        let yes = |v: bool| if v { "yes" } else { "no" };
        let _ = writeln!(
            out,
            "  dynamic grid: {}; several kernels per launch: {}; external meshes: {}",
            yes(c.dynamic_grid),
            yes(c.multiple_kernels),
            yes(c.external_meshes)
        );
    }
    for f in &report.failed_plugins {
        let _ = writeln!(out, "failed plugin {}\n  {}", f.path, f.error.replace('\n', "\n  "));
    }
    Ok(())
}

fn backends_report(rt: &Runtime) -> BackendsReport {
    let reg = rt.registry();
    BackendsReport {
        backends: reg
            .backends
            .iter()
            .map(|b| {
                let a = b.backend.availability();
                let c = b.backend.capabilities();
                BackendReport {
                    name: b.name.clone(),
                    source: b.source.to_string(),
                    version: b.backend.version().into_string(),
                    platform: b.backend.platform().into_string(),
                    available: a.available,
                    class: a.available.then(|| a.class.name()),
                    reason: a.reason.into_string(),
                    note: b.note.clone(),
                    capabilities: CapabilityReport {
                        mesh_kinds: strings(&c.mesh_kinds),
                        portable_meshes: c.portable_meshes,
                        dtypes: strings(&c.dtypes),
                        dynamic_grid: c.dynamic_grid,
                        multiple_kernels: c.multiple_kernels,
                        external_meshes: c.external_meshes,
                        targets: strings(&c.targets),
                        max_block_elements: c.max_block_elements,
                    },
                }
            })
            .collect(),
        failed_plugins: reg
            .failed
            .iter()
            .map(|f| FailedReport { path: f.path.display().to_string(), error: f.error.to_string() })
            .collect(),
    }
}

/// A launch resolved from the flags: the kernels and meshes, ready for the runtime.
struct Prepared {
    backend: String,
    /// The backend's acceptance of the launch, asked once ([`Runtime::plan`]).
    plan: Option<Plan>,
    /// How `auto` chose, one line per backend tried.
    explanation: Vec<String>,
    /// How each generic kernel's parameters were bound, one line each.
    bound: Vec<String>,
    /// Every parameter value, by name (kernels of one launch share names).
    values: BTreeMap<String, i64>,
    /// Tuning records that could not be read.
    warnings: Vec<String>,
    kernels: Vec<Verified>,
    meshes: Vec<Option<MeshBox>>,
    externals: Vec<MeshBox>,
    grid: BTreeMap<String, u64>,
}

impl Prepared {
    fn launches(&self) -> Vec<KernelLaunch<'_>> {
        self.kernels.iter().zip(&self.meshes).map(|(kernel, mesh)| KernelLaunch { kernel, mesh: mesh.as_ref() }).collect()
    }

    fn externals(&self) -> Vec<&MeshBox> {
        self.externals.iter().collect()
    }

    fn launch(&self) -> Launch<'_> {
        Launch::new(&self.launches(), &self.externals(), &self.grid)
    }

    /// `f` on the launch as planned: the backend is not asked again.
    fn planned<T>(&self, rt: &Runtime, f: impl FnOnce(&Planned<'_, '_>) -> Result<T>) -> Result<T> {
        let launch = self.launch();
        let plan = self.plan.clone().expect("a prepared launch is planned");
        f(&rt.resume(plan, &launch)?)
    }

    fn warn(&self, err: &mut dyn Write) {
        for w in &self.warnings {
            let _ = writeln!(err, "warning: {w}");
        }
    }
}

fn split_flag<'a>(flag: &'static str, value: &'a str, expected: &'static str) -> Result<(&'a str, &'a str)> {
    match value.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k, v)),
        _ => Err(Error::BadFlag { flag, value: value.to_string(), why: "it is not of the form NAME=VALUE".into(), expected }),
    }
}

fn pick_kernels<'a>(file: &Path, all: &'a [Generic], names: &[String]) -> Result<Vec<&'a Generic>> {
    let available = || all.iter().map(Generic::name).collect::<Vec<_>>().join(", ");
    if names.is_empty() {
        return match all {
            [one] => Ok(vec![one]),
            _ => Err(Error::AmbiguousKernel { file: file.to_path_buf(), available: available() }),
        };
    }
    names
        .iter()
        .map(|name| {
            all.iter().find(|k| k.name() == name).ok_or_else(|| Error::UnknownKernel {
                file: file.to_path_buf(),
                name: name.clone(),
                available: available(),
            })
        })
        .collect()
}

/// The backend `run` uses without `--backend`: the first available that takes the launch, so that
/// `tessel run K.tk --check` compares a real backend with the interpreter.
const RUN_DEFAULT: &str = "auto";
/// The backend `lower` and `bench` use without `--backend`.
const LOWER_DEFAULT: &str = tessel_interpret::NAME;

fn prepare(rt: &Runtime, flags: &LaunchFlags, default: &str, inputs: &BTreeMap<String, HostArray>) -> Result<Prepared> {
    let file = crate::read_kernels(&flags.file)?;
    prepare_with(rt, &file, flags, default, inputs, &parse_params(&flags.params)?, true)
}

/// [`prepare`] with the parameter values `given`, and tuning records used or not.
fn prepare_with(
    rt: &Runtime,
    file: &crate::KernelFile,
    flags: &LaunchFlags,
    default: &str,
    inputs: &BTreeMap<String, HostArray>,
    given: &BTreeMap<String, i64>,
    records: bool,
) -> Result<Prepared> {
    let asked = flags.backend.as_deref().unwrap_or(default);
    let auto = asked == "auto";
    // With `auto`, meshes are made by the backend that owns their kind; else by the one named.
    let backend = if auto { String::new() } else { asked.to_string() };
    if !auto {
        rt.backend(&backend)?;
    }
    let generics = pick_kernels(&flags.file, file.kernels(), &flags.kernels)?;
    crate::check_param_names(&generics, given)?;
    let (kernels, bound) = specialize(rt, file, &generics, given, inputs, records.then_some(backend.as_str()))?;
    let mut meshes: Vec<Option<MeshBox>> = kernels.iter().map(|_| None).collect();
    for m in &flags.meshes {
        // `KERNEL=MESH` names the kernel before the mesh's `(`; a plain mesh is for every kernel.
        let target = m.split_once('=').filter(|(k, _)| !k.contains('('));
        match target {
            Some((name, text)) => {
                let i = kernels.iter().position(|k| k.name() == name).ok_or_else(|| Error::BadFlag {
                    flag: "--mesh",
                    value: m.clone(),
                    why: format!("`{name}` is not a kernel of this launch"),
                    expected: "MESH for every kernel, or KERNEL=MESH for a kernel given with --kernel",
                })?;
                meshes[i] = Some(rt.mesh(&backend, text)?);
            }
            None => {
                for slot in meshes.iter_mut() {
                    *slot = Some(rt.mesh(&backend, m)?);
                }
            }
        }
    }
    let externals = flags.external_meshes.iter().map(|m| rt.mesh(&backend, m)).collect::<Result<Vec<_>>>()?;
    let mut grid = BTreeMap::new();
    for g in &flags.grid {
        let (axis, n) = split_flag("--grid", g, "AXIS=N with N a positive integer, as in `--grid i=8`")?;
        let n: u64 = n.parse().map_err(|_| Error::BadFlag {
            flag: "--grid",
            value: g.clone(),
            why: format!("`{n}` is not a non-negative integer"),
            expected: "AXIS=N with N a positive integer, as in `--grid i=8`",
        })?;
        grid.insert(axis.to_string(), n);
    }
    let mut p = Prepared {
        backend,
        plan: None,
        explanation: Vec::new(),
        bound: bound.lines,
        values: bound.values,
        warnings: bound.warnings,
        kernels,
        meshes,
        externals,
        grid,
    };
    let plan = rt.plan(Choice::of(asked), &p.launch())?.into_plan();
    if auto {
        p.backend = plan.backend().to_string();
        p.explanation = plan.decisions().to_vec();
    }
    p.plan = Some(plan);
    // Now that the backend is known, its tuning records may give other values: specialize and
    // plan again only then.
    if auto && records && retuned(rt, &generics, given, inputs, &p)? {
        let (kernels, bound) = specialize(rt, file, &generics, given, inputs, Some(&p.backend))?;
        p.kernels = kernels;
        (p.bound, p.values, p.warnings) = (bound.lines, bound.values, bound.warnings);
        let explanation = std::mem::take(&mut p.explanation);
        p.plan = Some(rt.plan(Choice::Named(&p.backend), &p.launch())?.into_plan());
        p.explanation = explanation;
    }
    Ok(p)
}

/// Whether the chosen backend's tuning records bind any kernel's parameters to other values
/// than the launch was specialized with.
fn retuned(
    rt: &Runtime,
    generics: &[&Generic],
    given: &BTreeMap<String, i64>,
    inputs: &BTreeMap<String, HostArray>,
    p: &Prepared,
) -> Result<bool> {
    let shapes = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
    for g in generics.iter().filter(|g| g.is_generic()) {
        let (binding, tuned) = rt.bind(g, &crate::given_for(g, given), &shapes, Some(&p.backend))?;
        if tuned.record.is_some() && binding.values.iter().any(|(n, v)| p.values.get(n) != Some(v)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How the kernels of a launch were bound.
#[derive(Default)]
struct Bound {
    lines: Vec<String>,
    values: BTreeMap<String, i64>,
    warnings: Vec<String>,
}

/// Binds and specializes every kernel of a launch; with a `backend` (not empty), values not given
/// come from its tuning records where they exist.
fn specialize(
    rt: &Runtime,
    file: &crate::KernelFile,
    generics: &[&Generic],
    given: &BTreeMap<String, i64>,
    inputs: &BTreeMap<String, HostArray>,
    backend: Option<&str>,
) -> Result<(Vec<Verified>, Bound)> {
    let mut bound = Bound::default();
    let mut kernels = Vec::new();
    let shapes = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
    let backend = backend.filter(|b| !b.is_empty());
    for g in generics {
        let s = rt.specialize(g, &file.name, &crate::given_for(g, given), &shapes, backend)?;
        if let (Some(path), Some(b)) = (&s.tuned.record, backend) {
            bound.lines.push(format!("tuning record for `{}` on {b}: {}", g.name(), path.display()));
        }
        bound.warnings.extend(s.tuned.warning);
        if g.is_generic() {
            bound.lines.push(format!("params of `{}`: {}", g.name(), s.binding.explain(g)));
        }
        bound.values.extend(s.binding.values);
        kernels.push(s.kernel);
    }
    Ok((kernels, bound))
}

fn explain(p: &Prepared, flags: &LaunchFlags, out: &mut dyn Write) {
    if flags.explain {
        for l in &p.explanation {
            let _ = writeln!(out, "auto: {l}");
        }
        if p.explanation.is_empty() {
            let _ = writeln!(out, "backend {} as asked (--backend auto chooses and explains)", p.backend);
        }
        for l in &p.bound {
            let _ = writeln!(out, "{l}");
        }
    }
}

fn lower(rt: &Runtime, flags: &LaunchFlags, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    let p = prepare(rt, flags, LOWER_DEFAULT, &BTreeMap::new())?;
    p.warn(err);
    explain(&p, flags, out);
    let (stages, cache) = p.planned(rt, |planned| planned.lower_cached())?;
    if flags.explain {
        let _ = writeln!(out, "cache: {cache}");
    }
    for (name, text) in stages {
        let _ = writeln!(out, "// ---- {name} ({}) ----\n{text}", p.backend);
    }
    Ok(())
}

struct RunOptions {
    inputs: Vec<String>,
    seed: u64,
    out_dir: Option<PathBuf>,
    check: bool,
}

/// The `--input NAME=FILE.npy` arrays.
fn read_inputs(flags: &[String]) -> Result<BTreeMap<String, HostArray>> {
    let files = flags
        .iter()
        .map(|i| split_flag("--input", i, "NAME=FILE.npy, as in `--input x=x.npy`").map(|(n, p)| (n, PathBuf::from(p))))
        .collect::<Result<Vec<_>>>()?;
    // The files' bytes must fit before any is read.
    let bytes = files.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).fold(0u64, u64::saturating_add);
    crate::memory::check(|| format!("reading {}", flags.join(" ")), crate::memory::Need { inputs: bytes, ..Default::default() })?;
    let mut inputs = BTreeMap::new();
    for (name, path) in files {
        let array =
            crate::npy::read(&path).map_err(|source| Error::Npy { name: name.to_string(), path: path.clone(), source })?;
        inputs.insert(name.to_string(), array);
    }
    Ok(inputs)
}

/// Seeded random inputs for every kernel of a launch (of the shapes its parameters give), once
/// the launch's inputs and outputs are known to fit in memory.
fn random_inputs(p: &Prepared, seed: u64) -> Result<BTreeMap<String, HostArray>> {
    let kernels: Vec<&Verified> = p.kernels.iter().collect();
    let need = crate::memory::Need::of(&kernels, crate::memory::threads());
    let names = || kernels.iter().map(|k| k.name()).collect::<Vec<_>>().join("`, `");
    crate::memory::check(|| format!("the launch of `{}` with random inputs", names()), need)?;
    let mut inputs = BTreeMap::new();
    for k in &p.kernels {
        for (name, array) in crate::inputs::random_inputs(k.kernel(), seed) {
            inputs.entry(name).or_insert(array);
        }
    }
    Ok(inputs)
}

fn run(rt: &Runtime, flags: &LaunchFlags, opts: &RunOptions, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    // `TESSEL_LOG=debug` times each phase of the process.
    let mut phase = Instant::now();
    let mut lap = |what: &str| {
        log::debug!("{what}: {:.2} ms", phase.elapsed().as_secs_f64() * 1e3);
        phase = Instant::now();
    };
    // Random inputs and the interpreter run on rayon's pool: its threads start (about a third of
    // a millisecond each) while this one reads and parses.
    rayon::spawn(|| ());
    let given = read_inputs(&opts.inputs)?;
    lap("read the inputs");
    let p = prepare(rt, flags, RUN_DEFAULT, &given)?;
    lap("parsed, verified and chose the backend");
    if p.backend == tessel_interpret::NAME {
        tessel_interpret::warm_up(&p.kernels);
    }
    p.warn(err);
    explain(&p, flags, out);
    let inputs = if given.is_empty() { random_inputs(&p, opts.seed)? } else { given };
    lap("made the random inputs");
    let launch = LaunchArgs { inputs, grid: p.grid.clone() };
    let start = Instant::now();
    let outputs = p.planned(rt, |planned| planned.launch(&launch))?;
    let elapsed = start.elapsed();
    lap("launched");
    let names: Vec<&str> = p.kernels.iter().map(Verified::name).collect();
    let _ = writeln!(out, "ran `{}` on {} in {:.2} ms", names.join("`, `"), p.backend, elapsed.as_secs_f64() * 1e3);
    let report = if opts.check {
        if p.backend == tessel_interpret::NAME {
            let _ = writeln!(
                out,
                "  note: --check compares the interpreter with itself{}",
                if p.explanation.is_empty() {
                    ""
                } else {
                    " (no other backend here is faster and takes this launch; --explain says why)"
                }
            );
        }
        let reference = rt.launch(tessel_interpret::NAME, &p.launches(), &p.externals(), &launch)?;
        Some(compare(&outputs, &reference))
    } else {
        None
    };
    if opts.check {
        lap("ran the interpreter for --check");
    }
    let dir = opts.out_dir.clone().unwrap_or_else(|| PathBuf::from("tessel-out").join(names.join("+")));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Write { path: dir.clone(), source })?;
    for (name, array) in &outputs {
        let path = dir.join(format!("{name}.npy"));
        crate::npy::write(&path, array).map_err(|source| Error::Write { path: path.clone(), source })?;
        let _ = writeln!(out, "  {name}: {} -> {}", array.ty(), path.display());
    }
    lap("wrote the outputs");
    if let Some((lines, failed)) = report {
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        if !failed.is_empty() {
            return Err(Error::CheckFailed(format!("{} beyond tolerance against interpret", failed.join(", "))));
        }
    }
    Ok(())
}

/// `tessel tune`: every combination of the candidates not given, on one backend.
fn tune(rt: &Runtime, flags: &LaunchFlags, input_flags: &[String], runs: usize, seed: u64, out: &mut dyn Write) -> Result<()> {
    let Some(backend) = flags.backend.as_deref().filter(|b| *b != "auto") else {
        return Err(Error::Tune(
            "tessel tune needs --backend NAME: a tuning record is for one backend\n  name one of `tessel backends`".to_string(),
        ));
    };
    let loaded = rt.backend(backend)?;
    let file = crate::read_kernels(&flags.file)?;
    let generics = pick_kernels(&flags.file, file.kernels(), &flags.kernels)?;
    let [kernel] = generics.as_slice() else {
        return Err(Error::Tune("tessel tune tunes one kernel at a time\n  give one --kernel NAME".to_string()));
    };
    let given = parse_params(&flags.params)?;
    crate::check_param_names(&generics, &given)?;
    let inputs = read_inputs(input_flags)?;
    let names: Vec<&str> = crate::tune::tunable(kernel).into_iter().filter(|n| !given.contains_key(*n)).collect();
    if names.is_empty() {
        return Err(Error::Tune(format!(
            "kernel `{}` has no parameter with candidates left to tune\n  declare candidates, as in `kernel {}[BM = 16 in (8, 16, 32)]`, and do not fix them all with --param",
            kernel.name(),
            kernel.name()
        )));
    }
    let combos = crate::tune::combinations(kernel, &names).map_err(|count| {
        Error::Tune(format!(
            "kernel `{}` has {count} combinations of candidates, more than {}\n  fix some parameters with --param P=V",
            kernel.name(),
            crate::tune::MAX_COMBINATIONS
        ))
    })?;
    let _ = writeln!(
        out,
        "tune `{}` on {backend}: {} candidate(s) of {}, {runs} timed runs each",
        kernel.name(),
        combos.len(),
        names.join(", ")
    );
    let bar = indicatif::ProgressBar::new(combos.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("  {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let describe = |c: &BTreeMap<String, i64>| c.iter().map(|(n, v)| format!("{n} = {v}")).collect::<Vec<_>>().join(", ");
    let mut trials = Vec::new();
    let mut shapes = BTreeMap::new();
    for combo in &combos {
        bar.set_message(describe(combo));
        let mut values = given.clone();
        values.extend(combo.clone());
        let trial = (|| -> Result<std::result::Result<f64, String>> {
            let p = prepare_with(rt, &file, flags, backend, &inputs, &values, false)?;
            shapes = crate::tune::shapes_of(kernel, &p.values);
            let launch = LaunchArgs {
                inputs: if inputs.is_empty() { random_inputs(&p, seed)? } else { inputs.clone() },
                grid: p.grid.clone(),
            };
            let got = p.planned(rt, |planned| planned.launch(&launch))?;
            let want = rt.launch(tessel_interpret::NAME, &p.launches(), &p.externals(), &launch)?;
            let (lines, failed) = compare(&got, &want);
            if !failed.is_empty() {
                let detail = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join("; ");
                return Ok(Err(format!("DISAGREES with the interpreter, a bug of {backend}; not chosen ({detail})")));
            }
            let t = resident_times(rt, &p, &launch, runs.max(1))?;
            Ok(Ok(middle(t.device.as_deref().unwrap_or(&t.host)) * 1e3))
        })();
        let (kernel_ms, verdict) = match trial {
            Ok(Ok(ms)) => (Some(ms), "ok".to_string()),
            Ok(Err(v)) => (None, v),
            Err(e) => (None, format!("not run: {}", e.to_string().lines().next().unwrap_or_default())),
        };
        bar.suspend(|| {
            let _ = match kernel_ms {
                Some(ms) => writeln!(out, "  {}: {ms:.3} ms", describe(combo)),
                None => writeln!(out, "  {}: {verdict}", describe(combo)),
            };
        });
        bar.inc(1);
        trials.push(crate::tune::Trial { values: combo.clone(), kernel_ms, verdict });
    }
    bar.finish_and_clear();
    let best = trials
        .iter()
        .filter_map(|t| Some((t, t.kernel_ms?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(t, ms)| (t.values.clone(), ms));
    let Some((chosen, ms)) = best else {
        return Err(Error::Tune(format!("no candidate of `{}` ran and agreed with the interpreter on {backend}", kernel.name())));
    };
    let _ = writeln!(out, "chosen: {} ({ms:.3} ms)", describe(&chosen));
    let record = crate::tune::record(kernel, loaded, shapes.clone(), chosen, trials);
    match crate::tune::path(kernel, &shapes, loaded) {
        Some(path) => {
            let existed = matches!(crate::tune::lookup(kernel, &shapes, loaded), crate::tune::Lookup::Corrupt(..));
            crate::tune::write(&path, &record).map_err(|source| Error::Write { path: path.clone(), source })?;
            let note = if existed { " (it replaces a record that did not read back)" } else { "" };
            let _ = writeln!(out, "record: {}{note}", path.display());
        }
        None => {
            let _ = writeln!(out, "record: not written (the cache is off: TESSEL_CACHE=off or no cache folder)");
        }
    }
    Ok(())
}

/// A report line per output and the outputs beyond their dtype's tolerance.
fn compare(outputs: &[(String, HostArray)], reference: &[(String, HostArray)]) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for ((name, got), (_, want)) in outputs.iter().zip(reference) {
        let a = agreement(got, want);
        lines.push(format!(
            "  check {name}: max abs error {:e} against interpret (tolerance {:e} + {:e}*|x|): {}",
            a.max_abs_error,
            a.tolerance.atol,
            a.tolerance.rtol,
            if a.within { "ok" } else { "MISMATCH" }
        ));
        if !a.within {
            failed.push(name.clone());
        }
    }
    (lines, failed)
}
