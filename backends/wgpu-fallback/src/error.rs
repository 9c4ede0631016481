//! Every way the wgpu backend says no: the first line (`Display`) says what it will not run,
//! [`Refusal::hint`] what would work. Nothing else in the crate builds an `Unsupported` error.

use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::refusal::Refusal as Refuse;

use crate::limits::{MAX_BLOCK_ELEMENTS, MAX_PROGRAMS, MAX_STATEMENTS, WORKSPACE_BUDGET};

/// What works instead of a kernel past a driver's loop budget: the refusal's hint, and the
/// runtime's where the module's own check finds the budget spent (`runtime.rs`).
pub const LOOP_BUDGET_HINT: &str =
    "run it on interpret (or under auto), or give each program less work: more programs, fewer `seq` steps, shorter loops";

/// What the wgpu backend refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(RefusalKind), derive(strum::EnumIter, Hash))]
pub enum Refusal {
    /// A `device(...)` spec as a kernel mesh.
    #[error("{mesh} is a mesh of devices, not a kernel grid: the wgpu backend runs a kernel on one adapter")]
    DeviceMesh {
        /// The spec's `Display`.
        mesh: String,
    },
    /// An external mesh with a thread or cluster axis.
    #[error("external mesh {mesh} has the {role} axis `{axis}`, which only a kernel mesh can have")]
    ExternalAxisRole {
        /// The mesh's `Display`.
        mesh: String,
        /// `thread` or `cluster`.
        role: &'static str,
        /// The axis.
        axis: String,
    },
    /// An external mesh axis named like a grid axis of the kernel.
    #[error("external mesh {mesh} names `{axis}`, which is also a grid axis of the kernel")]
    ExternalAxisName {
        /// The mesh's `Display`.
        mesh: String,
        /// The axis.
        axis: String,
    },
    /// A block value (or scratch buffer) past what one invocation holds.
    #[error("{what} has {elements} elements ({ty}), more than the {MAX_BLOCK_ELEMENTS} the wgpu backend lowers")]
    BlockTooLarge {
        /// `block value %x` or ``scratch `s` ``.
        what: String,
        /// Its element count.
        elements: usize,
        /// Its type.
        ty: String,
    },
    /// An argument past 32-bit signed indexing.
    #[error("argument `{name}` ({ty}) has {elements} elements, more than the {} the wgpu backend indexes", i32::MAX)]
    ArrayTooLarge {
        /// The argument.
        name: String,
        /// Its type.
        ty: String,
        /// Its element count.
        elements: usize,
    },
    /// More parallel programs or `seq` steps than one launch runs.
    #[error("kernel `{kernel}` has {count} {what}, more than the {MAX_PROGRAMS} the wgpu backend runs in one launch")]
    TooManyPrograms {
        /// The kernel.
        kernel: String,
        /// How many.
        count: u64,
        /// `parallel programs` or ``seq` steps per program``.
        what: &'static str,
    },
    /// A kernel past the statements one shader compiles in reasonable time.
    #[error("kernel `{kernel}` has {statements} statements, more than the {MAX_STATEMENTS} the wgpu backend compiles (naga's shader compiler takes time quadratic in a function's length)")]
    TooLong {
        /// The kernel.
        kernel: String,
        /// Its statements, nested ones included.
        statements: usize,
    },
    /// A workspace per program past one storage binding.
    #[error(
        "kernel `{kernel}` needs {bytes} bytes of workspace per program, more than the {WORKSPACE_BUDGET} of a storage binding"
    )]
    Workspace {
        /// The kernel.
        kernel: String,
        /// Its workspace per program.
        bytes: u64,
    },
    /// More loop iterations per invocation than the adapter runs (Mesa's llvmpipe).
    #[error(
        "kernel `{kernel}` makes {iterations} loop iterations in one invocation, more than the {room} this adapter's driver (Mesa's llvmpipe) runs before it silently stops every loop"
    )]
    LoopBudget {
        /// The kernel.
        kernel: String,
        /// The iterations counted (`seq` steps, programs walked, `for` loops with literal
        /// bounds; each loop's last test of its condition too).
        iterations: u64,
        /// What the driver's budget leaves the kernel.
        room: u64,
    },
    /// A kernel of the concurrent model whose threads the backend does not schedule as one
    /// (`ir::schedule`).
    #[error("kernel `{kernel}` runs {threads} threads per program {why}, which the wgpu backend does not schedule")]
    Threads {
        /// The kernel.
        kernel: String,
        /// Threads per program.
        threads: u64,
        /// How they run (`ir::schedule::Why`).
        why: String,
    },
    /// A limit of this adapter (known only with the adapter).
    #[error("{what} needs {need}, more than this adapter's {limit_name} of {limit} ({adapter})")]
    AdapterLimit {
        /// What needs it.
        what: String,
        /// How much.
        need: u64,
        /// The WebGPU limit's name.
        limit_name: &'static str,
        /// The adapter's value of it.
        limit: u64,
        /// The adapter.
        adapter: String,
    },
}

impl Refuse for Refusal {
    fn hint(&self) -> String {
        match self {
            Refusal::DeviceMesh { .. } => {
                "pass a grid(...) or wgpu(...) mesh as the kernel's mesh, and the device mesh as --external-mesh".into()
            }
            Refusal::ExternalAxisRole { .. } => "pass it as the kernel's --mesh, or drop the axis".into(),
            Refusal::ExternalAxisName { .. } => "rename the external axis".into(),
            Refusal::BlockTooLarge { .. } | Refusal::Workspace { .. } => "use smaller blocks".into(),
            Refusal::ArrayTooLarge { .. } => "split the array".into(),
            Refusal::TooManyPrograms { .. } => "use larger blocks, or split the launch".into(),
            Refusal::TooLong { .. } => {
                "run it on interpret, whose compile is linear in the kernel's length, or loop with `for` instead of unrolling".into()
            }
            Refusal::LoopBudget { .. } => LOOP_BUDGET_HINT.into(),
            Refusal::Threads { .. } => {
                "run it on interpret, which runs a program's threads deterministically and checks them for races".into()
            }
            Refusal::AdapterLimit { .. } => {
                "use smaller blocks or arrays, or run on interpret, which has no adapter limits".into()
            }
        }
    }
}

impl From<Refusal> for BackendError {
    fn from(r: Refusal) -> BackendError {
        r.into_error()
    }
}

tessel_plugin_api::mesh_refusals!(Refusal, device: Refusal::DeviceMesh);
