//! Every way the Mosaic GPU backend says no. The first line of each is byte for byte what
//! DESIGN.md gives (Pallas's own words where Pallas has them); [`Refusal::hint`] says what would
//! work. Nothing else in the crate builds an `Unsupported` error but `external.rs`, whose
//! answer to a launch on another runtime's memory of a kernel with `bool` arrays is not a
//! refusal of the kernel: the CUDA handler then stages it through host memory.

use tessel_plugin_api::abi::BackendError;
use tessel_plugin_api::refusal::Refusal as Refuse;

use crate::limits::{
    MAX_ARRAY_ELEMENTS, MAX_BARRIERS_PER_ARRAY, MAX_BLOCK_ELEMENTS, MAX_CTAS, MAX_NUM_THREADS, MAX_WARPGROUPS, THREADS,
};

/// What the Mosaic GPU backend refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(RefusalKind), derive(strum::EnumIter, Hash))]
pub enum Refusal {
    /// Several kernels in one launch when one of them has scratch operands.
    #[error("Scratch operands are not supported by the Mosaic GPU mpmd_map lowering")]
    ScratchInMpmd,
    /// Several (mesh, kernel) pairs in one launch.
    #[error("Lowering multiple mesh/function pairs is not supported by the Mosaic GPU backend")]
    MultipleKernels,
    /// Any external mesh.
    #[error("External meshes are not supported by the Mosaic GPU backend")]
    ExternalMeshes,
    /// A kernel mesh that is not a `MosaicGpuMesh` (the downcast failed).
    #[error("Mesh {mesh} is not supported by the Mosaic GPU backend")]
    ForeignMesh {
        /// The mesh's `Display`.
        mesh: String,
    },
    /// A `device(...)` spec asked of `make_mesh`.
    #[error("Mesh {mesh} is not supported by the Mosaic GPU backend")]
    DeviceMesh {
        /// The spec's `Display`.
        mesh: String,
    },
    /// A spec of another kind asked of `make_mesh`.
    #[error("the Mosaic GPU backend makes mosaic_gpu(...) meshes, not {kind}(...)")]
    MeshKind {
        /// The kind asked for.
        kind: String,
        /// The spec's axes written as a Mosaic mesh's (`i: 4, c: 2 ?`).
        axes: String,
    },
    /// A `dyn` grid axis.
    #[error("dynamic grid bounds not supported in the Mosaic GPU backend")]
    DynamicGrid,
    /// More than three cluster axes.
    #[error("cluster= must be at most 3D, got {mesh}.")]
    ClusterRank {
        /// The mesh's `Display`.
        mesh: String,
    },
    /// `num_threads` without `thread_name` or the other way round.
    #[error("num_threads and thread_name must be either both set or both None, got {mesh}")]
    ThreadsUnpaired {
        /// The mesh's `Display`.
        mesh: String,
    },
    /// A portable spec with more than one `thread` axis.
    #[error("num_threads and thread_name must be either both set or both None, got {mesh}")]
    SeveralThreadAxes {
        /// The spec's `Display`.
        mesh: String,
    },
    /// More warpgroups per CTA than Pallas allows.
    #[error(
        "Requested too many CUDA threads per block. Each Mosaic thread corresponds to {THREADS} CUDA threads. At most {MAX_NUM_THREADS} are supported, got {mesh}"
    )]
    TooManyThreads {
        /// The mesh's `Display`.
        mesh: String,
    },
    /// A block value larger than the registers the backend spreads one over.
    #[error(
        "block value %{value} has {elements} elements ({ty}), more than the {MAX_BLOCK_ELEMENTS} the Mosaic GPU backend lowers"
    )]
    BlockTooLarge {
        /// The value's name.
        value: String,
        /// Its element count.
        elements: usize,
        /// Its type.
        ty: String,
    },
    /// An argument past 32-bit signed indexing.
    #[error(
        "argument `{name}` ({ty}) has {elements} elements, more than the {MAX_ARRAY_ELEMENTS} the Mosaic GPU backend indexes"
    )]
    ArrayTooLarge {
        /// The argument.
        name: String,
        /// Its type.
        ty: String,
        /// Its element count.
        elements: usize,
    },
    /// More CTAs than one launch takes.
    #[error("the parallel grid has {ctas} programs, more than the {MAX_CTAS} CTAs of one Mosaic GPU launch")]
    TooManyCtas {
        /// The parallel programs asked for.
        ctas: u64,
    },
    /// A workspace per CTA past 32-bit offsets.
    #[error("kernel `{kernel}` needs {bytes} bytes of workspace per program")]
    Workspace {
        /// The kernel.
        kernel: String,
        /// Its workspace per CTA.
        bytes: u64,
    },
    /// More shared memory per CTA than the device has (known only with a device).
    #[error("kernel `{kernel}` needs {bytes} bytes of shared memory per CTA; {device} allows {limit}")]
    SharedMemory {
        /// The kernel.
        kernel: String,
        /// What it needs.
        bytes: u64,
        /// The device's name.
        device: String,
        /// What the device allows.
        limit: u64,
    },
    /// A part of the concurrent model this backend does not lower: threads that wait on each
    /// other past a CTA's warpgroups, a barrier array past a register of parity bits.
    #[error("Unimplemented primitive in Mosaic GPU lowering: {op}")]
    Unimplemented {
        /// What it is, with the limit it passes.
        op: String,
    },
}

impl Refuse for Refusal {
    fn hint(&self) -> String {
        match self {
            Refusal::ScratchInMpmd => "launch each kernel on its own, or move its scratch into an output; wgpu and interpret run several kernels with scratch".into(),
            Refusal::MultipleKernels => "launch one kernel at a time, or run on wgpu or interpret, which take several (mesh, kernel) pairs".into(),
            Refusal::ExternalMeshes => "leave out --external-mesh, or run on wgpu, which takes external meshes whose portable view fits".into(),
            Refusal::ForeignMesh { .. } => "build the mesh with mosaic_gpu(...) (Runtime::mesh(\"mosaic-gpu\", spec) makes one from any portable spec), or pass none".into(),
            Refusal::DeviceMesh { .. } => "a device(...) mesh describes GPUs for sharding, not a kernel's grid; build the kernel mesh with mosaic_gpu(...)".into(),
            Refusal::MeshKind { axes, .. } => format!("write mosaic_gpu({axes})"),
            Refusal::DynamicGrid => "give every grid axis a fixed size, or run on wgpu or interpret, which take `--grid AXIS=N`".into(),
            Refusal::ClusterRank { .. } => "give at most three `cluster` axes".into(),
            Refusal::ThreadsUnpaired { .. } => "write one `NAME: N thread` axis, or none".into(),
            Refusal::SeveralThreadAxes { .. } => "a Mosaic GPU mesh has at most one `thread` axis".into(),
            Refusal::TooManyThreads { .. } => format!("use at most {MAX_NUM_THREADS} warpgroups in the `thread` axis"),
            Refusal::BlockTooLarge { .. } | Refusal::Workspace { .. } | Refusal::SharedMemory { .. } => "use smaller blocks".into(),
            Refusal::TooManyCtas { .. } => "use larger blocks or make an axis `seq`".into(),
            Refusal::ArrayTooLarge { .. } => "split the array, or run on interpret".into(),
            Refusal::Unimplemented { .. } => format!("give the threads that wait on each other at most {MAX_WARPGROUPS} points and each barrier array at most {MAX_BARRIERS_PER_ARRAY} barriers, or run on interpret (which checks the kernel for races) or wgpu (docs/language.md, \"Threads, barriers and asynchronous operations\")"),
        }
    }
}

impl From<Refusal> for BackendError {
    fn from(r: Refusal) -> BackendError {
        r.into_error()
    }
}
