//! The Mosaic GPU backend: JAX Pallas's Mosaic GPU lowering as a tessel backend. It accepts only its
//! own mesh (`MosaicGpuMesh`, made by `make_mesh`, recognised by downcasting) and refuses what
//! Pallas's Mosaic GPU backend refuses, in Pallas's words; it lowers kernels to PTX for `sm_90a`
//! (`lower.rs` plans, `emit/` writes) without a device, and runs them through cudarc
//! (`runtime.rs`) where a Hopper GPU and its driver exist.

pub mod async_mma;
pub mod attention;
pub mod emit;
pub mod error;
pub mod external;
pub mod limits;
pub mod lower;
pub mod mesh;
pub mod print;
pub mod runtime;
pub mod tma;
pub mod wgmma;

use std::collections::{BTreeMap, HashMap};

use tessel_plugin_api::abi::{BackendError, BuiltinBackend, Capabilities, DeviceClass, ErrorKind, MeshBox};
use tessel_plugin_api::backend::{
    Artifact, Available, BackendImpl, Compiler, Options, Request, export, make_mesh_object, verify_with_mesh,
};
use tessel_plugin_api::ir::{AxisSize, ParamKind};
use tessel_plugin_api::launch::resolve_grid;
use tessel_plugin_api::mesh::{AxisRole, MeshSpec};

pub use error::Refusal;
pub use mesh::MosaicGpuMesh;
pub use wgmma::Schedule;

/// The backend's name.
pub const NAME: &str = "mosaic-gpu";

/// The Mosaic GPU backend, and its compiler: what it lowers depends on the Hopper path's
/// [`Schedule`] alone.
#[derive(Debug, Default)]
pub struct MosaicGpu {
    schedule: Schedule,
}

impl MosaicGpu {
    /// The backend object, its Hopper path on the default schedule.
    pub fn new() -> MosaicGpu {
        MosaicGpu::default()
    }

    /// Its compiler with the Hopper path on `schedule`.
    pub fn with_schedule(schedule: Schedule) -> MosaicGpu {
        MosaicGpu { schedule }
    }

    /// Every refusal, in Pallas's order, then the plan of each kernel.
    fn planned(&self, launch: &Request<'_>) -> Result<Vec<lower::KernelPlan>, BackendError> {
        if launch.calls.len() > 1 {
            if launch.calls.iter().any(|c| c.kernel.params_of(ParamKind::Scratch).next().is_some()) {
                return Err(Refusal::ScratchInMpmd.into());
            }
            return Err(Refusal::MultipleKernels.into());
        }
        if !launch.external_meshes.is_empty() {
            return Err(Refusal::ExternalMeshes.into());
        }
        launch
            .calls
            .iter()
            .map(|call| {
                let own = match call.mesh {
                    None => None,
                    Some(m) => match m.obj.downcast_as::<MosaicGpuMesh>() {
                        Ok(own) => Some(own.clone()),
                        Err(_) => {
                            return Err(Refusal::ForeignMesh { mesh: m.display().to_string() }.into());
                        }
                    },
                };
                if call.kernel.grid.iter().flatten().any(|a| a.size == AxisSize::Dyn) {
                    return Err(Refusal::DynamicGrid.into());
                }
                let spec = own.as_ref().map(MosaicGpuMesh::spec);
                let verified = verify_with_mesh(&call.kernel, spec.as_ref())?;
                lower::plan(&verified, own.as_ref().and_then(|m| m.thread_name.as_deref()), self.schedule)
            })
            .collect()
    }
}

impl Compiler for MosaicGpu {
    /// Each kernel's plan.
    type Plan = Vec<lower::KernelPlan>;
    /// Each kernel's plan and its PTX.
    type Artifact = Vec<external::Compiled>;

    fn options(&self) -> Options {
        Options::new().with("schedule", self.schedule.name())
    }

    fn plan(&self, launch: &Request<'_>) -> Result<Vec<lower::KernelPlan>, BackendError> {
        self.planned(launch)
    }

    fn compile(&self, _: &Request<'_>, plan: Vec<lower::KernelPlan>) -> Result<Self::Artifact, BackendError> {
        plan.into_iter().map(external::Compiled::new).collect()
    }

    fn plan_text(&self, plans: &Vec<lower::KernelPlan>) -> String {
        plans.iter().map(print::text).collect::<Vec<_>>().join("\n")
    }

    fn stages(&self, compiled: &Self::Artifact) -> Vec<(String, String)> {
        compiled.iter().map(|c| (format!("{}.ptx", c.kernel().name()), c.ptx().to_string())).collect()
    }
}

impl BackendImpl for MosaicGpu {
    type Memory = runtime::Gpu;

    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn platform(&self) -> String {
        "NVIDIA Hopper (sm_90a) through the CUDA driver API (cudarc)".into()
    }

    fn availability(&self) -> Result<Available, String> {
        runtime::gpu().map(|g| Available { class: DeviceClass::Native, on: g.description.clone() })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mesh_kinds: vec!["mosaic_gpu".into()].into(),
            portable_meshes: false,
            dtypes: lower::DTYPES.iter().map(|d| d.name().into()).collect(),
            dynamic_grid: false,
            multiple_kernels: false,
            external_meshes: false,
            targets: vec!["sm_90a".into()].into(),
            max_block_elements: limits::MAX_BLOCK_ELEMENTS as u64,
        }
    }

    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError> {
        match spec.kind.as_str() {
            // A portable grid spec becomes a Mosaic mesh with the same grid axes.
            "mosaic_gpu" | "grid" => Ok(make_mesh_object(MosaicGpuMesh::from_spec(spec)?)),
            "device" => Err(Refusal::DeviceMesh { mesh: spec.to_string() }.into()),
            other => Err(Refusal::MeshKind {
                kind: other.to_string(),
                axes: spec
                    .axes
                    .iter()
                    .map(|a| format!("{}: {}{}", a.name, a.size, if a.role == AxisRole::Grid { "" } else { " ?" }))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into()),
        }
    }

    type Compiler = MosaicGpu;

    /// The backend is its own compiler: it lowers for `sm_90a` alone, the Hopper path on the
    /// schedule `TESSEL_MOSAIC_SCHEDULE` names (an unknown name is an error saying which exist).
    fn compiler(&self) -> Result<MosaicGpu, BackendError> {
        let schedule = Schedule::from_env().map_err(|e| BackendError::new(ErrorKind::InvalidInput, e))?;
        Ok(MosaicGpu::with_schedule(schedule))
    }

    fn memory(&self) -> Result<&runtime::Gpu, BackendError> {
        runtime::require()
    }

    /// Runs each kernel on the bound buffers: outputs start as the buffers hold them (allocated
    /// zeroed, or uploaded by the host for those in [`Request::kept`]).
    fn run(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, runtime::DeviceBuffer>,
    ) -> Result<(), BackendError> {
        let gpu = runtime::require()?;
        for external::Compiled { plan, ptx, .. } in compiled {
            resolve_grid(&plan.kernel, &launch.grid).map_err(|e| BackendError::new(ErrorKind::InvalidInput, e.to_string()))?;
            let k = plan.kernel.kernel();
            let bound: HashMap<String, runtime::DeviceBuffer> = k
                .params
                .iter()
                .filter(|p| p.kind != ParamKind::Scratch)
                .filter_map(|p| buffers.remove(&p.name).map(|b| (p.name.clone(), b)))
                .collect();
            let result = gpu.launch(plan, ptx, &bound);
            buffers.extend(bound);
            result?;
        }
        Ok(())
    }

    /// Enqueues each kernel on the caller's `CUstream` at the caller's device addresses
    /// ([`external`]): XLA's, inside `jax.jit` on a GPU.
    #[allow(unsafe_code, reason = "device addresses another runtime owns")]
    unsafe fn run_external(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        stream: u64,
        args: &BTreeMap<String, u64>,
    ) -> Option<Result<(), BackendError>> {
        // Refused before any kernel is enqueued: the caller stages the whole launch.
        if let Some(refused) = compiled.iter().find_map(external::Compiled::external_refusal) {
            return Some(Err(refused));
        }
        // SAFETY: the caller's promise (`BackendImpl::run_external`): a live stream of a Hopper
        // device's primary context, each address that device's memory holding its argument.
        Some(compiled.iter().try_for_each(|c| unsafe { c.enqueue(stream as *mut std::ffi::c_void, args, &launch.kept) }))
    }
}

inventory::submit! {
    BuiltinBackend { make: || export(MosaicGpu::new()) }
}

#[cfg(feature = "plugin")]
tessel_plugin_api::export_plugin!(MosaicGpu::new());
