//! The `tessel` command line (see DESIGN.md, "Command line").
//!
//! This file holds the clap definitions and [`main`], which dispatches to one file per command
//! family:
//! - `prepare.rs`: the flags a launch names (`LaunchFlags`) and the launch they resolve to
//!   (`Prepared`: kernels bound and specialized, meshes, grid, the backend's plan), shared by
//!   every command that launches; inputs read or made at random;
//! - `run.rs`: `run` and `lower`, and the comparison with the interpreter (`run --check`, `tune`);
//! - `bench.rs`: `bench`, and the timing of launches on arrays kept on the device;
//! - `tune.rs`: `tune`;
//! - `report.rs`: `backends` (text and JSON);
//! - `check.rs`: `check` (a file) and `conformance` (a backend).

mod bench;
mod check;
mod prepare;
mod report;
mod run;
mod tune;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::{Error, Result, Runtime};
use bench::bench;
use check::{check, conformance};
use prepare::{LOWER_DEFAULT, LaunchFlags, RUN_DEFAULT};
use report::backends;
pub use report::backends_json;
use run::{RunOptions, lower, run};
use tune::tune;

/// tessel: block-level kernels, written once, launched on any backend.
#[derive(Debug, Parser)]
#[command(name = "tessel", version, about, long_about = None)]
struct Cli {
    /// Load a backend plugin: a shared library, or a folder whose every shared library is
    /// loaded; may be given several times. Added to the plugins of TESSEL_PLUGIN_PATH; one named
    /// like a built-in replaces it. A plugin any user may write is refused as root.
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
        /// Print the backend's plan of the launch (every decision it made: layout, residency,
        /// workspace, dispatch) instead of the text it lowers to.
        #[arg(long)]
        plan: bool,
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

/// The exit code of a command whose standard output was closed under it (`tessel ... | head`):
/// what a shell reports for a tool ended by SIGPIPE (128 + 13), without a message, as `cat` and
/// other Unix tools end. Not 0: what was asked for was not all delivered.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// Runs the command line `args` (the first is the program name), printing to `out` and `err`.
/// Returns the exit code: 0 success, 1 user error (a failed write to `out` included: `cannot
/// write to standard output: ...`), 2 bad command line, [`EXIT_BROKEN_PIPE`] when `out` is a
/// closed pipe.
pub fn main<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut checked = Checked { inner: out, error: None };
    let result = match Cli::try_parse_from(args) {
        Ok(cli) => command(cli, &mut checked, err),
        Err(e) => {
            let text = e.render().to_string();
            if e.use_stderr() {
                let _ = write!(err, "{text}");
                return 2;
            }
            write!(checked, "{text}").map_err(Error::Stdout)
        }
    };
    // The first failed write to standard output, wherever it happened, fails the command.
    let result = result.and_then(|()| checked.flush().map_err(Error::Stdout));
    let result = match (result, checked.error.take()) {
        (Err(Error::Stdout(_)), Some(first)) => Err(Error::Stdout(first)),
        (result, _) => result,
    };
    match result {
        Ok(()) => 0,
        Err(Error::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => EXIT_BROKEN_PIPE,
        Err(e) => {
            let text = e.to_string();
            let _ = if text.contains(": error:") { write!(err, "{text}") } else { writeln!(err, "error: {text}") };
            1
        }
    }
}

/// Runs one parsed command.
fn command(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    // Plugins of TESSEL_PLUGIN_PATH are loaded only where they may be needed: for a backend named
    // (until it is found), not at all when it is a built-in; all of them for `backends` and `auto`.
    let runtime = |named: Option<&str>, err: &mut dyn Write| -> Result<Runtime> {
        let rt = Runtime::for_backend(&cli.plugins, named.filter(|n| *n != "auto"))?;
        for w in &rt.registry().warnings {
            let _ = writeln!(err, "warning: {w}");
        }
        Ok(rt)
    };
    let named = |launch: &LaunchFlags, default: &'static str| launch.backend.clone().unwrap_or_else(|| default.to_string());
    match &cli.command {
        Command::Check { file, params } => check(file, params, out),
        Command::Backends { json } => backends(&runtime(None, err)?, *json, out),
        Command::Bench { launch, runs, seed, json } => {
            let rt = runtime(Some(&named(launch, LOWER_DEFAULT)), err)?;
            bench(&rt, launch, *runs, *seed, *json, out, err)
        }
        Command::Conformance { backend } => conformance(&runtime(Some(backend), err)?, backend, out),
        Command::Lower { launch, plan } => lower(&runtime(Some(&named(launch, LOWER_DEFAULT)), err)?, launch, *plan, out, err),
        Command::Run { launch, inputs, seed, out_dir, check } => {
            let opts = RunOptions { inputs: inputs.clone(), seed: *seed, out_dir: out_dir.clone(), check: *check };
            run(&runtime(Some(&named(launch, RUN_DEFAULT)), err)?, launch, &opts, out, err)
        }
        Command::Tune { launch, inputs, runs, seed } => {
            tune(&runtime(launch.backend.as_deref(), err)?, launch, inputs, *runs, *seed, out)
        }
    }
}

/// Standard output for the commands: the first write error is kept, and every later write and
/// flush fails with it, so that nothing more is attempted and [`main`] reports it.
struct Checked<'w> {
    inner: &'w mut dyn Write,
    error: Option<std::io::Error>,
}

/// A copy of an I/O error (they are not `Clone`): the same OS error, or the same kind and words.
fn copy(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

impl Checked<'_> {
    fn keep<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            self.error.get_or_insert(copy(e));
        }
        r
    }
}

impl Write for Checked<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(e) = &self.error {
            return Err(copy(e));
        }
        let r = self.inner.write(buf);
        self.keep(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(e) = &self.error {
            return Err(copy(e));
        }
        let r = self.inner.flush();
        self.keep(r)
    }
}
