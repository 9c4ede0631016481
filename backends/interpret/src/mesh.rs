//! The interpreter's own mesh: a `grid(...)` made by `make_mesh`. The interpreter also takes the
//! portable view of any other kernel mesh (its grid and cluster axes become parallel grid axes,
//! its thread axes extra parallel programs); only `device(...)` meshes are refused.

use tessel_plugin_api::abi::{BackendError, ErrorKind, MeshBox};
/// A grid mesh made by this backend (its spec, nothing more).
pub use tessel_plugin_api::backend::SpecMesh as InterpretMesh;
use tessel_plugin_api::backend::make_mesh_object;
use tessel_plugin_api::mesh::MeshSpec;

/// `make_mesh`: `grid(...)` only.
pub fn make(spec: &MeshSpec) -> Result<MeshBox, BackendError> {
    match spec.kind.as_str() {
        "grid" => Ok(make_mesh_object(InterpretMesh(spec.clone()))),
        "device" => Err(refuse_device(spec)),
        other => Err(BackendError::new(
            ErrorKind::Unsupported,
            format!(
                "the interpret backend makes `grid(...)` meshes, not `{other}(...)`\n  write {}; a `{other}` mesh made by its own backend is also accepted at launch",
                MeshSpec { kind: "grid".into(), axes: spec.axes.clone() }
            ),
        )),
    }
}

/// The interpreter's words for a `device(...)` mesh given as a kernel mesh.
pub fn refuse_device(spec: &MeshSpec) -> BackendError {
    BackendError::new(
        ErrorKind::Unsupported,
        format!(
            "{spec} describes devices for sharding, not a kernel's grid: the interpret backend runs one kernel on one CPU\n  pass a kernel mesh such as grid(...) or none"
        ),
    )
}
