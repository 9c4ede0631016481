//! The interpreter's own mesh: a `grid(...)` made by `make_mesh`. The interpreter also takes the
//! portable view of any other kernel mesh (its grid and cluster axes become parallel grid axes,
//! its thread axes extra parallel programs); only `device(...)` meshes are refused.

use tessel_plugin_api::abi::{BackendError, MeshBox};
/// A grid mesh made by this backend (its spec, nothing more).
pub use tessel_plugin_api::backend::SpecMesh as InterpretMesh;
use tessel_plugin_api::backend::make_mesh_object;
use tessel_plugin_api::mesh::MeshSpec;

use crate::error::Refusal;

/// `make_mesh`: `grid(...)` only.
pub fn make(spec: &MeshSpec) -> Result<MeshBox, BackendError> {
    match spec.kind.as_str() {
        "grid" => Ok(make_mesh_object(InterpretMesh(spec.clone()))),
        "device" => Err(Refusal::DeviceMesh { mesh: spec.to_string() }.into()),
        other => Err(Refusal::MeshKind {
            kind: other.to_string(),
            grid: MeshSpec { kind: "grid".into(), axes: spec.axes.clone() }.to_string(),
        }
        .into()),
    }
}
