//! Writing a backend: implement [`BackendImpl`] with plain Rust types and call [`export`]. The
//! exported object runs every method under `catch_unwind` (a panic becomes an
//! [`ErrorKind::Panic`] error and the panic message is kept out of the terminal), decodes launch
//! requests, and keeps the table of device buffers. See `docs/writing-a-backend.md`.
//!
//! The files of this folder: this one holds what a backend author writes against
//! ([`BackendImpl`] and the types it is handed, [`export`], [`check_upload`],
//! [`export_plugin!`](crate::export_plugin)); `compiler.rs` the pure half ([`Compiler`], its
//! [`Options`]); `exported.rs` the ABI adapter [`export`] makes and its caches; `guard.rs` the panic guard; `keys.rs` what identifies a launch and how a request is
//! decoded; `mesh.rs` the portable view of meshes and a kernel's grid from its mesh;
//! `plan_text.rs` how a plan prints.

mod compiler;
mod exported;
mod guard;
mod keys;
mod mesh;
pub mod plan_text;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use abi_stable::sabi_trait::TD_Opaque;

use crate::abi::*;
use crate::array::{DataRef, HostArray};
use crate::ir::{Kernel, Type};
use crate::mesh::MeshSpec;
use exported::Exported;
use guard::install_quiet_panic_hook;
pub use compiler::{Compiler, Options};
pub use guard::{guard, new_backend_guarded};
pub use keys::{cache_key, decode, request_key};
pub use plan_text::PlanText;
pub use mesh::{
    DeviceMeshRefusal, MeshKindRefusal, SpecMesh, make_grid_mesh, make_mesh_object, mesh_spec, mesh_view, verify_call,
    verify_with_mesh,
};

/// One (kernel, mesh) pair of a decoded launch.
pub struct Call<'a> {
    /// The kernel as parsed from the request (not yet verified: its grid may come from the mesh).
    pub kernel: Arc<Kernel>,
    /// Its mesh, if the launch gave one.
    pub mesh: Option<&'a MeshBox>,
}

/// A launch request decoded for the backend: what the host calls a `Launch` (its kernels with
/// their meshes, the external meshes, the grid), as the plugin side names it; its ABI form is
/// [`LaunchRequest`](crate::abi::LaunchRequest).
pub struct Request<'a> {
    /// The (kernel, mesh) pairs in order.
    pub calls: Vec<Call<'a>>,
    /// External meshes.
    pub external_meshes: Vec<&'a MeshBox>,
    /// Sizes of `dyn` grid axes.
    pub grid: BTreeMap<String, u64>,
    /// What identifies this launch for any backend ([`request_key`]): the kernel text, each
    /// call's kernel and mesh (its text and portable view), the external meshes, the grid sizes.
    /// A backend whose answers depend on nothing else may remember them by it.
    pub key: [u8; 32],
    /// The outputs that start from what their memory holds (an aliased input's values: Pallas's
    /// `input_output_aliases` through XLA), not from zeros: [`crate::abi::BufferArg::keep`] and
    /// [`crate::abi::HostOutput::keep`] of the run. Not part of `key` (`supports` plans before it
    /// is known, so a plan does not depend on it) but part of the compiled launch's key: a
    /// backend's `compile` may (wgpu holds no kept output in registers across `seq` steps).
    pub kept: BTreeSet<String>,
}

/// An available backend: the class of device it runs on (which ranks it under `auto`) and what
/// that device is, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// The class `auto` ranks by.
    pub class: DeviceClass,
    /// What it runs on (`NVIDIA H200 (sm_90)`, `llvmpipe (software, Vulkan)`).
    pub on: String,
}

/// Where a backend's buffers live: made zeroed, filled from the host, read back. A backend
/// computing in host memory uses [`HostMemory`]; a device backend implements it on its device.
pub trait Memory {
    /// A buffer.
    type Buffer: Send + 'static;
    /// A zeroed buffer of `ty`.
    fn alloc(&self, ty: &Type) -> Result<Self::Buffer, BackendError>;
    /// The type the buffer was made with.
    fn type_of(&self, buffer: &Self::Buffer) -> Type;
    /// Copies host data in, of the buffer's type (the caller checked it: [`check_upload`]).
    fn upload(&self, buffer: &mut Self::Buffer, data: HostArray) -> Result<(), BackendError>;
    /// Copies a buffer out (host memory lends it instead).
    fn download<'b>(&self, buffer: &'b Self::Buffer) -> Result<std::borrow::Cow<'b, HostArray>, BackendError>;
}

/// Host memory: a buffer is the array itself, uploaded by moving it in and downloaded by lending it.
pub struct HostMemory;

impl Memory for HostMemory {
    type Buffer = HostArray;

    fn alloc(&self, ty: &Type) -> Result<HostArray, BackendError> {
        Ok(HostArray::zeros(ty.dtype, &ty.shape))
    }

    fn type_of(&self, buffer: &HostArray) -> Type {
        buffer.ty()
    }

    fn upload(&self, buffer: &mut HostArray, data: HostArray) -> Result<(), BackendError> {
        *buffer = data;
        Ok(())
    }

    fn download<'b>(&self, buffer: &'b HostArray) -> Result<std::borrow::Cow<'b, HostArray>, BackendError> {
        Ok(std::borrow::Cow::Borrowed(buffer))
    }
}

/// A buffer of backend `B`'s memory.
pub type Buffer<B> = <<B as BackendImpl>::Memory as Memory>::Buffer;

/// A backend in plain Rust. [`export`] turns it into the ABI-stable object the host loads.
pub trait BackendImpl: Send + Sync + 'static {
    /// Where its buffers live.
    type Memory: Memory;
    /// Registry name.
    fn name(&self) -> &str;
    /// Backend version.
    fn version(&self) -> &str;
    /// What it runs on, in words.
    fn platform(&self) -> String;
    /// `Ok` with the class of device it runs on and what that is, or `Err(why it cannot run
    /// here)`. Must not touch a device it has not been asked to use, and must be cheap.
    fn availability(&self) -> Result<Available, String>;
    /// What it takes, readable without a device.
    fn capabilities(&self) -> Capabilities;
    /// Builds this backend's own mesh from a portable spec.
    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError>;
    /// Its compiler (the pure half: plans, lowering, text).
    type Compiler: Compiler;
    /// The compiler for the device it runs on now (its options read from the adapter, a
    /// strategy forced by the environment): cheap, called for every launch; no device is opened
    /// for it. Fails where the environment asks for options that do not exist.
    fn compiler(&self) -> Result<Self::Compiler, BackendError>;
    /// Its memory, opening its device on first use (an error where there is none).
    fn memory(&self) -> Result<&Self::Memory, BackendError>;
    /// Runs a compiled launch; `buffers` holds the bound arguments by name.
    fn run(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, <Self::Memory as Memory>::Buffer>,
    ) -> Result<(), BackendError>;
    /// [`BackendImpl::run`], timed on the device where the backend can: the nanoseconds its
    /// dispatches took on the device's own clock, else `None` (the default: the host times it).
    fn run_timed(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, <Self::Memory as Memory>::Buffer>,
    ) -> Result<Option<u64>, BackendError> {
        self.run(compiled, launch, buffers).map(|()| None)
    }
    /// Runs a compiled launch on memory the caller owns, for a backend that computes in host
    /// memory: `inputs` borrowed by argument name, every element of each output written as
    /// little-endian bytes into `outputs` (the caller's arrays of the outputs' types), which start
    /// as zeros except those in [`Request::kept`]. `None`, the default, where the backend does not
    /// (the host then uses buffers).
    fn run_host(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        inputs: &BTreeMap<String, DataRef<'_>>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
    ) -> Option<Result<(), BackendError>> {
        let _ = (compiled, launch, inputs, outputs);
        None
    }
    /// Enqueues a compiled launch on memory and a stream another runtime owns
    /// ([`Backend::launch_external`]): `args` holds the device address of each `in` and `out`
    /// argument by name; the outputs start as zeros except those in [`Request::kept`], which
    /// start from what their memory holds. `None`, the default, where the backend does not. An
    /// `Unsupported` error means nothing was enqueued (the caller stages the launch instead).
    ///
    /// # Safety
    /// `stream` is a live stream of the backend's device API; each address is memory of that
    /// stream's device holding its argument's type as the backend lays it out, not written by
    /// anyone else until the stream reaches the launch's end.
    #[allow(unsafe_code, reason = "device addresses another runtime owns")]
    unsafe fn run_external(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        stream: u64,
        args: &BTreeMap<String, u64>,
    ) -> Option<Result<(), BackendError>> {
        let _ = (compiled, launch, stream, args);
        None
    }
    /// Starts, off the caller's thread, the slow part of the first launch of `plan` (the C
    /// compiler run of the cpu plugin, the GEMM set-up of the interpreter) so that it overlaps
    /// with what the caller does before launching; the launch itself must not depend on it
    /// having run or finished. Nothing, the default.
    fn warm_up(&self, plan: &<Self::Compiler as Compiler>::Plan) {
        let _ = plan;
    }
}

/// What a backend's compiler makes and its `run` runs.
pub type Artifact<B> = <<B as BackendImpl>::Compiler as Compiler>::Artifact;

/// Wraps a backend into the object a plugin's root module returns and a built-in submits.
pub fn export<B: BackendImpl>(backend: B) -> BackendBox {
    install_quiet_panic_hook();
    Backend_TO::from_value(Exported::new(backend), TD_Opaque)
}

fn invalid(msg: impl Into<String>) -> BackendError {
    BackendError::new(ErrorKind::InvalidInput, msg)
}

/// The refusal of an upload whose array is not of the buffer's type (before [`Memory::upload`]).
pub fn check_upload(buffer: &Type, data: &HostArray) -> Result<(), BackendError> {
    if data.ty() != *buffer {
        return Err(invalid(format!("cannot upload {} into a buffer of {buffer}", data.ty())));
    }
    Ok(())
}

/// Exports a backend as a plugin: defines the root module of a `cdylib`. Put it behind a cargo
/// feature (`plugin`), so that two backends linked into one host do not both define the root
/// module symbol:
///
/// ```ignore
/// #[cfg(feature = "plugin")]
/// tessel_plugin_api::export_plugin!(MyBackend::new());
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($make:expr) => {
        #[allow(unsafe_code, reason = "the loader static #[export_root_module] generates")]
        #[::abi_stable::export_root_module]
        pub fn tessel_plugin_root() -> $crate::abi::TesselPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            extern "C" fn new_backend() -> ::abi_stable::std_types::RResult<$crate::abi::BackendBox, $crate::abi::BackendError> {
                $crate::backend::new_backend_guarded(|| $crate::backend::export($make))
            }
            $crate::abi::TesselPlugin {
                plugin_api_version: ::abi_stable::std_types::RStr::from_str($crate::abi::PLUGIN_API_VERSION),
                ir_format: $crate::abi::IR_FORMAT_VERSION,
                new_backend,
                follow_cancel: $crate::cancel::follow_host,
            }
            .leak_into_prefix()
        }
    };
}
