//! The wgpu backend's own mesh: `wgpu(...)` (or `grid(...)`) made by `make_mesh`. At launch the
//! backend also takes the portable view of any other kernel mesh: its grid and cluster axes
//! become parallel workgroup axes and its thread axis extra programs (docs/language.md §8).
//! `device(...)` meshes are refused.

use tessel_plugin_api::abi::{BackendError, MeshBox};
/// A mesh made by this backend (its spec, nothing more).
pub use tessel_plugin_api::backend::SpecMesh as WgpuMesh;
use tessel_plugin_api::backend::make_mesh_object;
use tessel_plugin_api::mesh::{AxisRole, MeshSpec};

use crate::error::Refusal;

/// `make_mesh`: a `grid(...)` or `wgpu(...)` spec as it is; any other kernel mesh spec becomes a
/// `wgpu(...)` mesh whose axes are all grid axes.
pub fn make(spec: &MeshSpec) -> Result<MeshBox, BackendError> {
    match spec.kind.as_str() {
        "device" => return Err(Refusal::DeviceMesh { mesh: spec.to_string() }.into()),
        "grid" | "wgpu" => return Ok(make_mesh_object(WgpuMesh(spec.clone()))),
        _ => {}
    }
    let axes = spec.axes.iter().map(|a| tessel_plugin_api::mesh::MeshAxis { role: AxisRole::Grid, ..a.clone() }).collect();
    Ok(make_mesh_object(WgpuMesh(MeshSpec { kind: "wgpu".into(), axes })))
}

/// Whether an external mesh fits a launch on one adapter: its axes must be grid or device axes
/// (a thread or cluster axis belongs to a kernel mesh) and must not reuse a grid axis name.
pub fn check_external(spec: &MeshSpec, grid_axes: &[String]) -> Result<(), BackendError> {
    if let Some(a) = spec.axes.iter().find(|a| a.role != AxisRole::Grid) {
        let role = if a.role == AxisRole::Thread { "thread" } else { "cluster" };
        return Err(Refusal::ExternalAxisRole { mesh: spec.to_string(), role, axis: a.name.clone() }.into());
    }
    if let Some(a) = spec.axes.iter().find(|a| grid_axes.contains(&a.name)) {
        return Err(Refusal::ExternalAxisName { mesh: spec.to_string(), axis: a.name.clone() }.into());
    }
    Ok(())
}
