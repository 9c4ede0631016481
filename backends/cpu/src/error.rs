//! Every way the cpu backend says no: the first line (`Display`) says what it will not run,
//! [`Refusal::hint`] what would work. Under `auto` the interpreter takes what it refuses.

use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::refusal::Refusal as Refuse;

/// What the cpu backend refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(RefusalKind), derive(strum::EnumIter, Hash))]
pub enum Refusal {
    /// A `device(...)` spec as a kernel mesh.
    #[error("{mesh} describes devices for sharding, not a kernel's grid: the cpu backend runs one kernel on one CPU")]
    DeviceMesh {
        /// The spec's `Display`.
        mesh: String,
    },
    /// A spec of another kind asked of `make_mesh`.
    #[error("the cpu backend makes `grid(...)` meshes, not `{kind}(...)`")]
    MeshKind {
        /// The kind asked for.
        kind: String,
        /// The same axes as a `grid(...)` spec.
        grid: String,
    },
    /// A kernel of the concurrent model (threads, barriers, asynchronous copies and products).
    #[error(
        "kernel `{kernel}` uses the concurrent model (threads, barriers, asynchronous copies), which the cpu backend does not compile"
    )]
    Concurrent {
        /// The kernel.
        kernel: String,
    },
    /// A kept output in a launch of several kernels, which runs on fresh outputs.
    #[error(
        "output `{name}` starts from given contents (an aliased input) in a launch of several kernels, which the cpu backend runs on fresh outputs"
    )]
    KeptInSeveralKernels {
        /// The output.
        name: String,
    },
}

impl Refuse for Refusal {
    fn hint(&self) -> String {
        match self {
            Refusal::DeviceMesh { .. } => "pass a kernel mesh such as grid(...) or none".into(),
            Refusal::MeshKind { grid, .. } => format!("write {grid}"),
            Refusal::Concurrent { .. } => {
                "run it on the interpret backend (`--backend interpret`, or `auto`, which falls back to it)".into()
            }
            Refusal::KeptInSeveralKernels { .. } => "launch the kernel that keeps it on its own".into(),
        }
    }
}

impl From<Refusal> for BackendError {
    fn from(r: Refusal) -> BackendError {
        r.into_error()
    }
}

tessel_plugin_api::mesh_refusals!(Refusal, device: Refusal::DeviceMesh, kind: Refusal::MeshKind);
