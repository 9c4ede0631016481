//! Every way the interpreter says no: the first line (`Display`) says what it will not run,
//! [`Refusal::hint`] what would work. Nothing else in the crate builds an `Unsupported` error.

use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::refusal::Refusal as Refuse;

use crate::limits::{MAX_ARRAY_ELEMENTS, MAX_BLOCK_ELEMENTS};

/// What the interpreter refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(RefusalKind), derive(strum::EnumIter, Hash))]
pub enum Refusal {
    /// A `device(...)` spec as a kernel mesh.
    #[error("{mesh} describes devices for sharding, not a kernel's grid: the interpret backend runs one kernel on one CPU")]
    DeviceMesh {
        /// The spec's `Display`.
        mesh: String,
    },
    /// A spec of another kind asked of `make_mesh`.
    #[error("the interpret backend makes `grid(...)` meshes, not `{kind}(...)`")]
    MeshKind {
        /// The kind asked for.
        kind: String,
        /// The same axes as a `grid(...)` spec.
        grid: String,
    },
    /// An argument past the interpreter's indexing.
    #[error("argument `{name}` ({ty}) has {elements} elements, more than the {MAX_ARRAY_ELEMENTS} the interpret backend runs")]
    ArrayTooLarge {
        /// The argument.
        name: String,
        /// Its type.
        ty: String,
        /// Its element count (saturated).
        elements: usize,
    },
    /// A block value past what the interpreter holds.
    #[error("block value %{value} ({ty}) has {elements} elements, more than the {MAX_BLOCK_ELEMENTS} the interpret backend runs")]
    BlockTooLarge {
        /// The value.
        value: String,
        /// Its type.
        ty: String,
        /// Its element count (saturated).
        elements: usize,
    },
    /// A kept output (an aliased input's buffer) in a launch of several kernels, which runs on
    /// fresh outputs.
    #[error("output `{name}` starts from given contents (an aliased input) in a launch of several kernels, which the interpreter runs on fresh outputs")]
    KeptInSeveralKernels {
        /// The output.
        name: String,
    },
}

impl Refuse for Refusal {
    fn hint(&self) -> String {
        match self {
            Refusal::DeviceMesh { .. } => "pass a kernel mesh such as grid(...) or none".into(),
            Refusal::MeshKind { kind, grid } => {
                format!("write {grid}; a `{kind}` mesh made by its own backend is also accepted at launch")
            }
            Refusal::ArrayTooLarge { .. } | Refusal::BlockTooLarge { .. } => "use smaller blocks (or arrays)".into(),
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
