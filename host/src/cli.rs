//! The `tessel` command line (see DESIGN.md, "Command line").

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};
use tessel_plugin_api::array::max_abs_error;
use tessel_plugin_api::ir::{Verified, print_kernel};

use crate::{Error, HostArray, LaunchArgs, Result, Tolerance};

/// tessel: block-level kernels, written once, launched on any backend.
#[derive(Debug, Parser)]
#[command(name = "tessel", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse and verify a .tk file; print its canonical text, or every error with line:col.
    Check {
        /// The kernel file.
        file: PathBuf,
    },
    /// Run a kernel and write each output as DIR/NAME.npy.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The kernel file.
    file: PathBuf,
    /// The backend to run on: a name, or `auto` for the best available.
    #[arg(long, default_value = "interpret")]
    backend: String,
    /// The kernel of the file to run (needed when it defines several).
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// An input array: NAME=FILE.npy. Without any, seeded random inputs are made.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// The size of a `dyn` grid axis: AXIS=N.
    #[arg(long = "grid", value_name = "AXIS=N")]
    grid: Vec<String>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the outputs [default: tessel-out/KERNEL].
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Also run the reference interpreter on the same inputs and compare every output.
    #[arg(long)]
    check: bool,
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
        Command::Check { file } => check(&file, out),
        Command::Run(args) => run(&args, out),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let text = e.to_string();
            let _ = if text.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '`') && !text.contains(": error:") {
                writeln!(err, "error: {text}")
            } else {
                write!(err, "{text}")
            };
            1
        }
    }
}

fn check(file: &Path, out: &mut dyn Write) -> Result<()> {
    let kernels = crate::load_file(file)?;
    let text: Vec<String> = kernels.iter().map(|k| print_kernel(k.kernel())).collect();
    let _ = write!(out, "{}", text.join("\n"));
    Ok(())
}

fn split_flag<'a>(flag: &'static str, value: &'a str, expected: &'static str) -> Result<(&'a str, &'a str)> {
    match value.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k, v)),
        _ => Err(Error::BadFlag { flag, value: value.to_string(), why: "it is not of the form NAME=VALUE".into(), expected }),
    }
}

fn pick_kernel<'k>(file: &Path, kernels: &'k [Verified], names: &[String], backend: &str) -> Result<&'k Verified> {
    let available = || kernels.iter().map(|k| k.name().to_string()).collect::<Vec<_>>().join(", ");
    match names {
        [] if kernels.len() == 1 => Ok(&kernels[0]),
        [] => Err(Error::AmbiguousKernel { file: file.to_path_buf(), available: available() }),
        [name] => kernels.iter().find(|k| k.name() == name).ok_or_else(|| Error::UnknownKernel {
            file: file.to_path_buf(),
            name: name.clone(),
            available: available(),
        }),
        several => {
            if let Some(missing) = several.iter().find(|n| !kernels.iter().any(|k| k.name() == n.as_str())) {
                return Err(Error::UnknownKernel { file: file.to_path_buf(), name: missing.clone(), available: available() });
            }
            Err(Error::SeveralKernels { backend: backend.to_string(), count: several.len() })
        }
    }
}

fn launch_args(kernel: &Verified, args: &RunArgs) -> Result<LaunchArgs> {
    let mut grid = BTreeMap::new();
    for g in &args.grid {
        let (axis, n) = split_flag("--grid", g, "AXIS=N with N a positive integer, as in `--grid i=8`")?;
        let n: u64 = n.parse().map_err(|_| Error::BadFlag {
            flag: "--grid",
            value: g.clone(),
            why: format!("`{n}` is not a non-negative integer"),
            expected: "AXIS=N with N a positive integer, as in `--grid i=8`",
        })?;
        grid.insert(axis.to_string(), n);
    }
    let inputs = if args.inputs.is_empty() {
        crate::inputs::random_inputs(kernel.kernel(), args.seed)
    } else {
        let mut inputs = BTreeMap::new();
        for i in &args.inputs {
            let (name, path) = split_flag("--input", i, "NAME=FILE.npy, as in `--input x=x.npy`")?;
            let path = PathBuf::from(path);
            let array =
                crate::npy::read(&path).map_err(|source| Error::Npy { name: name.to_string(), path: path.clone(), source })?;
            inputs.insert(name.to_string(), array);
        }
        inputs
    };
    Ok(LaunchArgs { inputs, grid })
}

fn run(args: &RunArgs, out: &mut dyn Write) -> Result<()> {
    let kernels = crate::load_file(&args.file)?;
    if !crate::BACKENDS.contains(&args.backend.as_str()) && args.backend != "auto" {
        return Err(Error::UnknownBackend {
            name: args.backend.clone(),
            available: format!("{}, auto", crate::BACKENDS.join(", ")),
        });
    }
    let kernel = pick_kernel(&args.file, &kernels, &args.kernels, &args.backend)?;
    let launch = launch_args(kernel, args)?;
    let start = Instant::now();
    let outputs = crate::run_kernel(&args.backend, kernel, &launch)?;
    let elapsed = start.elapsed();
    let backend = if args.backend == "auto" { tessel_interpret::NAME } else { args.backend.as_str() };
    let _ = writeln!(out, "ran `{}` on {backend} in {:.2} ms", kernel.name(), elapsed.as_secs_f64() * 1e3);
    let report = if args.check { Some(compare_with_reference(kernel, &launch, &outputs)?) } else { None };
    let dir = args.out_dir.clone().unwrap_or_else(|| PathBuf::from("tessel-out").join(kernel.name()));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Write { path: dir.clone(), source })?;
    for (name, array) in &outputs {
        let path = dir.join(format!("{name}.npy"));
        crate::npy::write(&path, array).map_err(|source| Error::Write { path: path.clone(), source })?;
        let _ = writeln!(out, "  {name}: {} -> {}", array.ty(), path.display());
    }
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

/// Runs the interpreter on the same inputs; returns a report line per output and the outputs
/// beyond their dtype's tolerance.
fn compare_with_reference(
    kernel: &Verified,
    launch: &LaunchArgs,
    outputs: &[(String, HostArray)],
) -> Result<(Vec<String>, Vec<String>)> {
    let reference = crate::run_kernel(tessel_interpret::NAME, kernel, launch)?;
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for ((name, got), (_, want)) in outputs.iter().zip(&reference) {
        let tol = Tolerance::for_dtype(want.dtype());
        let ok = got.to_f64().iter().zip(want.to_f64()).all(|(&g, w)| tol.close(g, w));
        let err = max_abs_error(got, want);
        lines.push(format!(
            "  check {name}: max abs error {err:e} against interpret (tolerance {:e} + {:e}*|x|): {}",
            tol.atol,
            tol.rtol,
            if ok { "ok" } else { "MISMATCH" }
        ));
        if !ok {
            failed.push(name.clone());
        }
    }
    Ok((lines, failed))
}
