//! The reference interpreter: runs verified kernels on the CPU and defines what every other
//! backend must compute (`docs/language.md`).
//!
//! Stages, as in every backend: `lower.rs` turns the verified IR into a program of instructions
//! over numbered slots (there is no text to emit, so no `emit.rs`); `eval.rs` computes whole
//! block values; `runtime.rs` binds memory and runs the grid, parallel programs on all cores.

mod eval;
mod lower;
mod runtime;

use tessel_plugin_api::array::HostArray;
use tessel_plugin_api::ir::Verified;
use tessel_plugin_api::launch::{self, LaunchArgs, LaunchError};

/// The backend's name.
pub const NAME: &str = "interpret";

/// What can go wrong when running a kernel: only a launch that does not fit it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Inputs or grid sizes that do not fit the kernel.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// A kernel lowered once, to be run many times.
#[derive(Clone, Debug)]
pub struct Compiled {
    kernel: Verified,
    program: lower::Program,
}

/// Lowers a verified kernel for the interpreter.
pub fn compile(kernel: &Verified) -> Compiled {
    Compiled { kernel: kernel.clone(), program: lower::lower(kernel) }
}

impl Compiled {
    /// Runs the kernel over its whole grid; returns every output, in declaration order.
    pub fn run(&self, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>, Error> {
        let grid = launch::bind(&self.kernel, args)?;
        Ok(runtime::Machine::new(&self.kernel, &self.program, &grid, &args.inputs).run())
    }
}

/// Compiles and runs in one call.
pub fn run(kernel: &Verified, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>, Error> {
    compile(kernel).run(args)
}
