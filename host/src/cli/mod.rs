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

use crate::Runtime;
use bench::bench;
use check::{check, conformance};
use prepare::LaunchFlags;
use report::backends;
pub use report::backends_json;
use run::{RunOptions, lower, run};
use tune::tune;

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
