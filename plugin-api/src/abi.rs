//! The ABI-stable boundary between the host and a backend plugin (abi_stable 0.11).
//!
//! - [`TesselPlugin`] is the root module a plugin exports: a prefix type whose fields are only
//!   ever appended (the last field of the first version carries `#[sabi(last_prefix_field)]`).
//! - [`Backend`] and [`Mesh`] are `#[sabi_trait]` objects. A backend makes its own meshes with
//!   `TD_CanDowncast`, and accepts its own mesh by downcasting, which only succeeds for objects
//!   made by the same library: every other mesh is foreign.
//! - Kernels cross as canonical `.tk` text with [`IR_FORMAT_VERSION`]; each side parses it into plain
//!   Rust types. Arrays cross as little-endian bytes ([`RArray`]).
//! - Errors cross as [`BackendError`]: a kind and a message whose first line is the user-facing
//!   sentence.
//!
//! Backend authors do not implement [`Backend`] by hand: they implement the plain Rust trait
//! [`crate::backend::BackendImpl`] and call [`crate::backend::export`], which runs every method under
//! `catch_unwind`, so that a panic becomes an error instead of crossing the boundary.

use std::sync::atomic::AtomicBool;

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RArc, RBox, ROption, RResult, RSlice, RSliceMut, RStr, RString, RVec};
use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};

pub use self::traits::{Backend, Backend_TO, Mesh, Mesh_TO};

/// Version of the kernel text format that crosses the boundary (the canonical `.tk` text).
pub const IR_FORMAT_VERSION: u32 = 1;

/// The version of this crate, which a plugin records when it is built.
pub const PLUGIN_API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What kind of failure a [`BackendError`] is.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The backend refuses this kernel, mesh or launch (a refusal, before anything runs).
    Unsupported,
    /// The backend cannot run on this machine (no driver, no device).
    Unavailable,
    /// The request itself is malformed (bad text, wrong inputs, unknown buffer).
    InvalidInput,
    /// The device failed while running.
    Device,
    /// The plugin panicked; the panic was caught at the boundary.
    Panic,
    /// A broken invariant inside the plugin.
    Internal,
}

/// An error crossing the boundary. The first line of `message` is the user-facing sentence; the
/// following lines say what would work.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// The kind of failure.
    pub kind: ErrorKind,
    /// The message.
    pub message: RString,
}

impl BackendError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> BackendError {
        BackendError { kind, message: RString::from(message.into()) }
    }

    /// What [`Backend::lower_plan`] answers where `backend` prints no plan.
    pub fn no_plan_text(backend: &str) -> BackendError {
        BackendError::new(ErrorKind::Unsupported, format!("the {backend} backend does not print its plans"))
    }

    /// What [`Backend::launch_external`] answers where `backend` does not launch on another
    /// runtime's memory: `Unsupported`, so that the caller stages the arrays instead.
    pub fn no_external_launch(backend: &str) -> BackendError {
        BackendError::new(
            ErrorKind::Unsupported,
            format!("the {backend} backend does not launch on another runtime's device memory"),
        )
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {}

/// What kind of device an available backend runs on, as the backend declares it. `auto` tries
/// backends in this order (`Native` first); a tuning record with measured times overrides it.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceClass {
    /// A hardware accelerator, through its vendor's own compiler for this exact chip (PTX for
    /// `sm_90a`).
    Native,
    /// A hardware accelerator, through a portable API (wgpu on a GPU adapter).
    Hardware,
    /// The host CPU, run natively.
    Cpu,
    /// A device emulated in software (wgpu on Mesa's lavapipe or llvmpipe): slower than running
    /// on the CPU directly.
    Software,
}

impl DeviceClass {
    /// Lower case, as `tessel backends` prints it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Native => "native",
            DeviceClass::Hardware => "hardware",
            DeviceClass::Cpu => "cpu",
            DeviceClass::Software => "software",
        }
    }
}

/// Whether a backend can run here, and if not, why.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    /// It can run.
    pub available: bool,
    /// Why not (or what it runs on, when it can).
    pub reason: RString,
    /// What it runs on, when it can (meaningless when it cannot).
    pub class: DeviceClass,
}

/// What a backend takes, readable without a device.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Mesh kinds this backend makes with `make_mesh` and accepts as its own (`mosaic_gpu`).
    pub mesh_kinds: RVec<RString>,
    /// Whether it also takes the portable view of any other kernel mesh.
    pub portable_meshes: bool,
    /// Element types it runs.
    pub dtypes: RVec<RString>,
    /// Whether `dyn` grid axes are accepted.
    pub dynamic_grid: bool,
    /// Whether one launch may hold several (mesh, kernel) pairs.
    pub multiple_kernels: bool,
    /// Whether external meshes are accepted.
    pub external_meshes: bool,
    /// What it lowers to (`sm_90a`, `wgsl`, `cpu`).
    pub targets: RVec<RString>,
    /// The largest block value it runs, in elements.
    pub max_block_elements: u64,
}

impl Capabilities {
    /// Takes nothing: what a backend whose `capabilities` failed reports.
    pub fn none() -> Capabilities {
        Capabilities {
            mesh_kinds: RVec::new(),
            portable_meshes: false,
            dtypes: RVec::new(),
            dynamic_grid: false,
            multiple_kernels: false,
            external_meshes: false,
            targets: RVec::new(),
            max_block_elements: 0,
        }
    }
}

/// The counters of a backend's compile cache.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Launches (and lowerings) served from the cache.
    pub hits: u64,
    /// Launches that were compiled.
    pub misses: u64,
    /// Compiled launches held.
    pub entries: u64,
    /// Times the backend planned a launch (its `supports`), whether it then took it or not.
    pub plans: u64,
    /// Nanoseconds spent compiling, in all: a launch's compile time is the difference.
    pub compile_ns: u64,
}

/// The role of a mesh axis, across the boundary.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RAxisRole {
    /// Grid axis.
    Grid,
    /// Cluster axis.
    Cluster,
    /// Thread axis.
    Thread,
}

/// One axis of a mesh's portable view.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct RMeshAxis {
    /// Axis name.
    pub name: RString,
    /// Number of points.
    pub size: u64,
    /// Its role.
    pub role: RAxisRole,
}

/// The portable view every mesh exposes: a kind and its axes.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct RMeshView {
    /// The mesh kind.
    pub kind: RString,
    /// Its axes.
    pub axes: RVec<RMeshAxis>,
}

/// One named stage of lowered text (`ptx`, `wgsl`, `program`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// Stage name.
    pub name: RString,
    /// Its text.
    pub text: RString,
}

/// An array crossing the boundary: dtype name, shape, little-endian bytes.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct RArray {
    /// `f32`, `i32`, ... (the `.tk` name).
    pub dtype: RString,
    /// Dimensions.
    pub shape: RVec<u64>,
    /// Elements, little-endian, row-major.
    pub bytes: RVec<u8>,
}

/// An array lent across the boundary for the length of one call (uploads).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct RArrayRef<'a> {
    /// `f32`, `i32`, ... (the `.tk` name).
    pub dtype: RStr<'a>,
    /// Dimensions.
    pub shape: RSlice<'a, u64>,
    /// Elements, little-endian, row-major.
    pub bytes: RSlice<'a, u8>,
}

/// An array lent across the boundary for the length of one call, to be written: an output of
/// [`Backend::launch_host`], or the destination of [`Backend::download_into`].
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct RArrayMut<'a> {
    /// `f32`, `i32`, ... (the `.tk` name).
    pub dtype: RStr<'a>,
    /// Dimensions.
    pub shape: RSlice<'a, u64>,
    /// Elements, little-endian, row-major; the callee writes every one.
    pub bytes: RSliceMut<'a, u8>,
}

/// An input of [`Backend::launch_host`]: an argument name and its array, lent.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct HostInput<'a> {
    /// Argument name.
    pub name: RStr<'a>,
    /// The array.
    pub array: RArrayRef<'a>,
}

/// An output of [`Backend::launch_host`]: an argument name and the caller's memory for it.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct HostOutput<'a> {
    /// Argument name.
    pub name: RStr<'a>,
    /// Where its elements go.
    pub array: RArrayMut<'a>,
    /// Whether `array` holds the output's starting contents (XLA's buffer of an input it
    /// aliases, Pallas's `input_output_aliases`): an element no program stores keeps them, and a
    /// load sees them until a store. Otherwise the output starts as zeros (language §3).
    pub keep: bool,
}

/// One kernel of a launch and the mesh it is given, if any.
#[repr(C)]
#[derive(StableAbi)]
pub struct KernelCall<'a> {
    /// Kernel name in the request's source.
    pub kernel: RStr<'a>,
    /// Its mesh.
    pub mesh: ROption<&'a MeshBox>,
}

/// The size of a `dyn` grid axis.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct GridSize<'a> {
    /// Axis name.
    pub axis: RStr<'a>,
    /// Its size.
    pub size: u64,
}

/// A launch as a backend sees it: what to run, on which meshes, with which dynamic sizes.
#[repr(C)]
#[derive(StableAbi)]
pub struct LaunchRequest<'a> {
    /// Must equal [`IR_FORMAT_VERSION`].
    pub ir_format: u32,
    /// Canonical `.tk` text holding every kernel named in `calls`.
    pub source: RStr<'a>,
    /// The (kernel, mesh) pairs, in launch order.
    pub calls: RSlice<'a, KernelCall<'a>>,
    /// External meshes.
    pub external_meshes: RSlice<'a, &'a MeshBox>,
    /// Sizes of `dyn` grid axes.
    pub grid: RSlice<'a, GridSize<'a>>,
}

/// A kernel argument bound to a device buffer.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct BufferArg<'a> {
    /// Argument name (`in` or `out`).
    pub name: RStr<'a>,
    /// Buffer id from `alloc`.
    pub buffer: u64,
    /// For an output: whether the buffer holds its starting contents (an aliased input's,
    /// uploaded), which the launch keeps where no program stores; else it starts as zeros.
    pub keep: bool,
}

/// A kernel argument at an address of another runtime's device memory
/// ([`Backend::launch_external`]).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct DeviceArg<'a> {
    /// Argument name (`in` or `out`).
    pub name: RStr<'a>,
    /// Its device address (a `CUdeviceptr` for mosaic-gpu).
    pub address: u64,
    /// For an output: whether its memory holds its starting contents (an aliased input's),
    /// which the launch keeps where no program stores; else it starts as zeros.
    pub keep: bool,
}

impl<'a> DeviceArg<'a> {
    /// Argument `name` at device address `address`, its starting contents kept where `keep`.
    pub fn new(name: &'a str, address: u64, keep: bool) -> DeviceArg<'a> {
        DeviceArg { name: RStr::from_str(name), address, keep }
    }
}

/// A mesh owned by whoever made it.
pub type MeshBox = Mesh_TO<RBox<()>>;

/// A backend object.
pub type BackendBox = Backend_TO<RBox<()>>;

#[allow(
    non_local_definitions,
    unsafe_code,
    clippy::undocumented_unsafe_blocks,
    reason = "the code #[sabi_trait] generates (abi_stable 0.11): for the unsafe `launch_external`, a call through the vtable under its caller's promise"
)]
mod traits {
    use super::*;
    use abi_stable::sabi_trait;

    /// A mesh: a portable view and a `Display` text. Made with `TD_CanDowncast` by the code that
    /// owns its type, so that only that code can downcast it back.
    #[sabi_trait]
    pub trait Mesh: Send + Sync + 'static {
        /// Kind and axes.
        fn view(&self) -> RMeshView;
        /// How the mesh prints in messages (`Mesh(grid=(4, 2), ...)` for Mosaic GPU).
        #[sabi(last_prefix_field)]
        fn display(&self) -> RString;
    }

    /// A backend, as the host sees it. Implement [`crate::backend::BackendImpl`] instead.
    #[sabi_trait]
    pub trait Backend: Send + Sync + 'static {
        /// Registry name (`interpret`, `mosaic-gpu`, `wgpu`).
        fn name(&self) -> RString;
        /// Version of the backend.
        fn version(&self) -> RString;
        /// What it runs on, in words.
        fn platform(&self) -> RString;
        /// Whether it can run here; touches no device until asked, never panics.
        fn availability(&self) -> Availability;
        /// What it takes.
        fn capabilities(&self) -> Capabilities;
        /// Builds this backend's mesh from the portable text form.
        fn make_mesh(&self, spec: RStr<'_>) -> RResult<MeshBox, BackendError>;
        /// Ok, or the refusal, without a device.
        fn supports(&self, req: &LaunchRequest<'_>) -> RResult<(), BackendError>;
        /// Named stages of lowered text, without a device.
        fn lower(&self, req: &LaunchRequest<'_>) -> RResult<RVec<Stage>, BackendError>;
        /// A device buffer of `dtype[shape]`, zeroed.
        fn alloc(&self, dtype: RStr<'_>, shape: RSlice<'_, u64>) -> RResult<u64, BackendError>;
        /// Copies host data into a buffer of the same type.
        fn upload(&self, buffer: u64, data: RArrayRef<'_>) -> RResult<(), BackendError>;
        /// Copies a buffer back.
        fn download(&self, buffer: u64) -> RResult<RArray, BackendError>;
        /// Frees a buffer.
        fn free(&self, buffer: u64) -> RResult<(), BackendError>;
        /// Runs the launch on buffers bound by argument name.
        fn launch(&self, req: &LaunchRequest<'_>, args: RSlice<'_, BufferArg<'_>>) -> RResult<(), BackendError>;
        /// [`Backend::launch`], timed on the device: nanoseconds from the start of its first
        /// dispatch to the end of its last on the device's own clock (GPU timestamp queries), or
        /// none where the backend cannot time on its device (the host then times the launch).
        fn launch_timed(&self, req: &LaunchRequest<'_>, args: RSlice<'_, BufferArg<'_>>) -> RResult<ROption<u64>, BackendError>;
        /// Runs the launch on memory the caller owns, where the backend computes in host memory:
        /// `inputs` read in place, every element of every output written into `outputs`. `false`
        /// where the backend does not (a device backend): the caller uses buffers instead.
        fn launch_host(
            &self,
            req: &LaunchRequest<'_>,
            inputs: RSlice<'_, HostInput<'_>>,
            outputs: RSliceMut<'_, HostOutput<'_>>,
        ) -> RResult<bool, BackendError>;
        /// Copies a buffer into the caller's memory of its type (one copy from the device).
        fn download_into(&self, buffer: u64, out: RArrayMut<'_>) -> RResult<(), BackendError>;
        /// What the lowering depends on besides the kernel and the version (`strategy gpu`), or
        /// empty: part of every cache key.
        fn options(&self) -> RString;
        /// The compile cache's counters.
        #[sabi(last_prefix_field)]
        fn cache_stats(&self) -> CacheStats;
        /// Starts, off the caller's thread, what the first launch of `req` would otherwise do
        /// inside it (a compiler run, a library built): called once a launch is planned, while
        /// the caller makes its inputs or XLA compiles around it. Never waits and never fails (a
        /// launch that cannot be warmed up fails when it runs). New in plugin-api 0.5, as
        /// [`Backend::lower_plan`] and [`Backend::launch_external`]: abi_stable loads no plugin whose vtable has fewer
        /// methods than the host's, so a 0.4 plugin is refused by its version (rebuild it).
        fn warm_up(&self, req: &LaunchRequest<'_>) {
            let _ = req;
        }
        /// Every decision the backend's plan of the launch made, as text (`tessel lower
        /// --plan`), without a device. `Unsupported` where it prints none (the default).
        fn lower_plan(&self, req: &LaunchRequest<'_>) -> RResult<RString, BackendError> {
            let _ = req;
            RResult::RErr(BackendError::no_plan_text(&self.name()))
        }
        /// Enqueues the launch on memory and a stream another runtime owns (XLA's, inside
        /// `jax.jit` on a GPU): `stream` is a stream of the backend's device API (a `CUstream`
        /// for mosaic-gpu), `args` the arguments' device addresses. Returns once the work is
        /// enqueued; nothing is copied or waited for. `Unsupported` where the backend does not
        /// (the default): the caller then stages the arrays through host memory.
        ///
        /// # Safety
        /// `stream` is live, each address is memory of that stream's device holding its
        /// argument's type as the backend lays it out, and nothing else writes it until the
        /// stream reaches the launch's end.
        unsafe fn launch_external(
            &self,
            req: &LaunchRequest<'_>,
            stream: u64,
            args: RSlice<'_, DeviceArg<'_>>,
        ) -> RResult<(), BackendError> {
            let _ = (req, stream, args);
            RResult::RErr(BackendError::no_external_launch(&self.name()))
        }
    }
}

pub use self::root::{TesselPlugin, TesselPluginRef, TokenSource};

/// The root module: the code abi_stable's derive generates for the fields appended after the
/// prefix, and `declare_root_module_statics!` for its statics, contain `unsafe` blocks (the
/// accessors themselves are safe), so this module allows them.
#[allow(unsafe_code, reason = "the code #[derive(StableAbi)] and declare_root_module_statics! generate for the root module")]
mod root {
    use super::*;

    /// The root module every plugin exports with `#[export_root_module]`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = TesselPluginRef)))]
    #[sabi(missing_field(option))]
    pub struct TesselPlugin {
        /// The `tessel-plugin-api` version the plugin was built against.
        pub plugin_api_version: RStr<'static>,
        /// The kernel text format it reads.
        pub ir_format: u32,
        /// Makes the backend. Runs under `catch_unwind` in the plugin.
        pub new_backend: extern "C" fn() -> RResult<BackendBox, BackendError>,
        /// Gives the plugin the host's [`crate::cancel::host_token`], so that its launches see the
        /// host thread's cancellation token (Ctrl-C in Python). New in plugin-api 0.4: abi_stable
        /// loads no plugin with fewer root-module fields than the host's, so a 0.3 plugin is
        /// refused by its version (rebuild it). Fields added later go after this one.
        #[sabi(last_prefix_field)]
        pub follow_cancel: extern "C" fn(host: TokenSource),
    }

    /// Where a plugin asks for the calling thread's cancellation token: the host's
    /// [`crate::cancel::host_token`] (abi_stable takes a function pointer as a parameter only so).
    #[repr(transparent)]
    #[derive(StableAbi, Clone, Copy)]
    pub struct TokenSource {
        /// The calling thread's cancellation flag, if it has one.
        pub token: extern "C" fn() -> ROption<RArc<AtomicBool>>,
    }

    impl RootModule for TesselPluginRef {
        declare_root_module_statics! {TesselPluginRef}
        const BASE_NAME: &'static str = "tessel_plugin";
        const NAME: &'static str = "tessel plugin";
        const VERSION_STRINGS: VersionStrings = package_version_strings!();
    }
}

/// Everything a built-in backend submits to the host's registry with `inventory::submit!`.
pub struct BuiltinBackend {
    /// Makes the backend object (the same one its plugin would export).
    pub make: fn() -> BackendBox,
}

inventory::collect!(BuiltinBackend);
