//! The wgpu backend: kernels planned (`lower/`), written as WGSL (`emit/`) and run with wgpu on
//! any adapter — Vulkan, Metal, DX12 or GL, and Mesa's lavapipe on a machine without a GPU
//! (`runtime.rs`). The limits the plan and the writer hold to are `limits.rs`; the WGSL spellings
//! of dtypes and literals that the writer and the maths functions (`libm.rs`) share, `conv.rs`.
//!
//! It runs what Mosaic GPU refuses: `dyn` grid bounds (`--grid AXIS=N`), several (mesh, kernel)
//! pairs in one launch (one submission, in order), and external meshes that fit one adapter. It
//! takes `grid(...)` and `wgpu(...)` meshes and the portable view of any other kernel mesh;
//! `device(...)` is refused in its own words.

mod conv;
pub mod emit;
pub mod error;
mod libm;
mod limits;
pub mod lower;
pub mod mesh;
pub mod runtime;
mod spirv;

use std::collections::BTreeMap;
use std::sync::Arc;

use tessel_plugin_api::abi::{BackendError, BuiltinBackend, Capabilities, DeviceClass, ErrorKind, MeshBox};
use tessel_plugin_api::backend::{Artifact, Available, BackendImpl, Compiler, Options, Request, export, mesh_spec, verify_call};
use tessel_plugin_api::ir::{AxisSize, ForLoop, Op, ParamKind, Stmt, Type, Verified, synchronous};
use tessel_plugin_api::launch::{LaunchAxis, resolve_grid};
use tessel_plugin_api::mesh::MeshSpec;

pub use error::Refusal;
pub use mesh::WgpuMesh;

/// The backend's name.
pub const NAME: &str = "wgpu";

/// The WGSL function `tk_exp` the backend writes for `exp` (1 ulp; `plugin-api/src/libm/`):
/// for hand-written baselines held to the same accuracy as tessel's kernels.
pub fn exp_wgsl() -> String {
    libm::function(tessel_plugin_api::libm::exp())
}

/// The wgpu backend.
#[derive(Default)]
pub struct Wgpu;

/// The lowering strategy: `TESSEL_WGPU_STRATEGY` where set, else `cpu` on a software adapter (or
/// none) and `gpu` on a hardware one.
fn strategy() -> Result<lower::Strategy, BackendError> {
    Ok(lower::Strategy::forced()?.unwrap_or(match runtime::adapter() {
        Ok(a) if !a.software => lower::Strategy::Gpu,
        _ => lower::Strategy::Cpu,
    }))
}

/// The strategy, and the loop budget: `TESSEL_WGPU_LOOP_BUDGET` where set (a number, or `none`;
/// so that tests lower alike on every machine), else the adapter's where it has one.
fn target() -> Result<lower::Target, BackendError> {
    let loop_budget = match std::env::var("TESSEL_WGPU_LOOP_BUDGET") {
        Ok(v) if v == "none" => None,
        Ok(v) if !v.is_empty() => Some(v.parse::<u64>().ok().filter(|&n| n > 2).ok_or_else(|| {
            BackendError::new(
                ErrorKind::InvalidInput,
                format!("TESSEL_WGPU_LOOP_BUDGET={v} is not a loop budget\n  use a number above 2, or none, or unset it to let the adapter decide"),
            )
        })?),
        _ => runtime::adapter().ok().and_then(|a| a.loop_budget),
    };
    Ok(lower::Target { strategy: strategy()?, loop_budget })
}

/// Every value and scratch buffer of a kernel is small enough, of a dtype it lowers.
fn check_values(v: &Verified) -> Result<(), BackendError> {
    fn walk(v: &Verified, body: &[Stmt]) -> Result<(), BackendError> {
        for s in body {
            for r in &s.results {
                check_type(&format!("block value %{r}"), v.value_type(r))?;
            }
            if let Op::For(ForLoop { iters, .. }) = &s.op {
                for (n, _) in iters {
                    check_type(&format!("block value %{n}"), v.value_type(n))?;
                }
            }
            for body in s.op.bodies() {
                walk(v, body)?;
            }
        }
        Ok(())
    }
    for p in &v.kernel().params {
        if p.kind == ParamKind::Scratch {
            check_type(&format!("scratch `{}`", p.name), &p.ty)?;
        }
    }
    walk(v, &v.kernel().body)
}

fn check_type(what: &str, ty: &Type) -> Result<(), BackendError> {
    if ty.numel() > limits::MAX_BLOCK_ELEMENTS {
        return Err(Refusal::BlockTooLarge { what: what.to_string(), elements: ty.numel(), ty: ty.to_string() }.into());
    }
    Ok(())
}

impl Wgpu {
    /// The backend object.
    pub fn new() -> Wgpu {
        Wgpu
    }
}

/// The wgpu backend's compiler: kernels planned (`lower/`) and written as WGSL (`emit/`) for one
/// [`lower::Target`] (a strategy and a loop budget), without an adapter.
#[derive(Clone, Copy, Debug)]
pub struct WgpuCompiler {
    target: lower::Target,
}

impl WgpuCompiler {
    /// The compiler for `target`.
    pub fn new(target: lower::Target) -> WgpuCompiler {
        WgpuCompiler { target }
    }

    /// Every refusal, then each kernel verified with its mesh and its grid sizes.
    fn checked(&self, launch: &Request<'_>) -> Result<Vec<(Verified, Vec<LaunchAxis>)>, BackendError> {
        let several = launch.calls.len() > 1;
        launch
            .calls
            .iter()
            .map(|c| {
                let v = verify_call::<Refusal>(c)?;
                let v = match synchronous::synchronous(&v) {
                    Ok(lifted) => lifted.into_owned(),
                    Err(u) => {
                        return Err(Refusal::Threads { kernel: v.name().to_string(), threads: u.threads, why: u.why.to_string() }.into());
                    }
                };
                let names: Vec<String> = v.grid().iter().map(|a| a.name.clone()).collect();
                for m in &launch.external_meshes {
                    mesh::check_external(&mesh_spec(m), &names)?;
                }
                // In a launch of several kernels, each takes the sizes of its own `dyn` axes.
                let sizes: BTreeMap<String, u64> = if several {
                    let dyns: Vec<&str> = v.grid().iter().filter(|a| a.size == AxisSize::Dyn).map(|a| a.name.as_str()).collect();
                    launch.grid.iter().filter(|(n, _)| dyns.contains(&n.as_str())).map(|(n, s)| (n.clone(), *s)).collect()
                } else {
                    launch.grid.clone()
                };
                let axes = resolve_grid(&v, &sizes).map_err(|e| BackendError::new(ErrorKind::InvalidInput, e.to_string()))?;
                check_values(&v)?;
                Ok((v, axes))
            })
            .collect()
    }
}

impl Compiler for WgpuCompiler {
    /// Each kernel's plan (`lower/`).
    type Plan = Arc<Vec<lower::KernelPlan>>;
    /// Each kernel's WGSL and dispatch.
    type Artifact = Vec<emit::Lowered>;

    fn options(&self) -> Options {
        let options = Options::new().with("strategy", self.target.strategy.name());
        match self.target.loop_budget {
            Some(n) => options.with("loop budget", n),
            None => options,
        }
    }

    fn plan(&self, launch: &Request<'_>) -> Result<Self::Plan, BackendError> {
        let plans: Vec<lower::KernelPlan> =
            self.checked(launch)?.into_iter().map(|(v, axes)| lower::plan(v, axes, self.target)).collect::<Result<_, _>>()?;
        Ok(Arc::new(plans))
    }

    /// Each plan written; one that holds an output the launch keeps (it starts from given
    /// contents, `Request::kept`) in registers across `seq` steps is planned again without holding
    /// it ([`lower::plan_keeping`]), so that its block never starts as zeros. The kept outputs
    /// are part of the compiled launch's key (`backend::exported`), so this is compiled once.
    fn compile(&self, launch: &Request<'_>, plans: Self::Plan) -> Result<Self::Artifact, BackendError> {
        plans
            .iter()
            .map(|p| {
                if p.resident.keys().any(|n| launch.kept.contains(n)) {
                    let again = lower::plan_keeping(p.kernel.clone(), p.grid.clone(), self.target, &launch.kept)?;
                    return Ok(emit::lower(&again));
                }
                Ok(emit::lower(p))
            })
            .collect()
    }

    fn plan_text(&self, plans: &Self::Plan) -> String {
        plans.iter().map(lower::print::text).collect::<Vec<_>>().join("\n")
    }

    fn stages(&self, compiled: &Self::Artifact) -> Vec<(String, String)> {
        compiled.iter().map(|l| (format!("{}.wgsl", l.name), l.wgsl.clone())).collect()
    }
}

impl BackendImpl for Wgpu {
    type Memory = runtime::Gpu;

    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn platform(&self) -> String {
        match runtime::adapter() {
            Ok(a) => a.description.clone(),
            Err(_) => "any wgpu adapter (Vulkan, Metal, DX12, GL); none found here".into(),
        }
    }

    fn availability(&self) -> Result<Available, String> {
        runtime::adapter().map(|a| Available {
            class: if a.software { DeviceClass::Software } else { DeviceClass::Hardware },
            on: a.description.clone(),
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mesh_kinds: vec!["grid".into(), "wgpu".into()].into(),
            portable_meshes: true,
            dtypes: limits::DTYPES.iter().map(|d| d.name().into()).collect(),
            dynamic_grid: true,
            multiple_kernels: true,
            external_meshes: true,
            targets: vec!["wgsl".into()].into(),
            max_block_elements: limits::MAX_BLOCK_ELEMENTS as u64,
        }
    }

    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError> {
        mesh::make(spec)
    }

    type Compiler = WgpuCompiler;

    /// For the adapter's strategy and loop budget, or those the environment forces.
    fn compiler(&self) -> Result<WgpuCompiler, BackendError> {
        Ok(WgpuCompiler::new(target()?))
    }

    fn memory(&self) -> Result<&runtime::Gpu, BackendError> {
        runtime::gpu()
    }

    fn run(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, runtime::DeviceBuffer>,
    ) -> Result<(), BackendError> {
        self.dispatch(compiled, launch, buffers, false).map(drop)
    }

    fn run_timed(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, runtime::DeviceBuffer>,
    ) -> Result<Option<u64>, BackendError> {
        self.dispatch(compiled, launch, buffers, true)
    }
}

impl Wgpu {
    /// Checks the buffers' types and runs the launch ([`runtime::Gpu::launch`]).
    fn dispatch(
        &self,
        compiled: &[emit::Lowered],
        launch: &Request<'_>,
        buffers: &BTreeMap<String, runtime::DeviceBuffer>,
        timed: bool,
    ) -> Result<Option<u64>, BackendError> {
        for c in &launch.calls {
            for p in c.kernel.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
                if let Some(b) = buffers.get(&p.name).filter(|b| b.ty != p.ty) {
                    return Err(BackendError::new(
                        ErrorKind::InvalidInput,
                        format!("kernel `{}`: argument `{}` is {} but its buffer holds {}", c.kernel.name, p.name, p.ty, b.ty),
                    ));
                }
            }
        }
        runtime::gpu()?.launch(compiled, buffers, &launch.kept, timed)
    }
}

inventory::submit! {
    BuiltinBackend { make: || export(Wgpu::new()) }
}

#[cfg(feature = "plugin")]
tessel_plugin_api::export_plugin!(Wgpu::new());
