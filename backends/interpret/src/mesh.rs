//! The interpreter's own mesh: a `grid(...)` made by `make_mesh`. The interpreter also takes the
//! portable view of any other kernel mesh (its grid and cluster axes become parallel grid axes,
//! its thread axes extra parallel programs); only `device(...)` meshes are refused.

use tessel_plugin_api::abi::{BackendError, MeshBox};
/// A grid mesh made by this backend (its spec, nothing more).
pub use tessel_plugin_api::backend::SpecMesh as InterpretMesh;
use tessel_plugin_api::backend::make_grid_mesh;
use tessel_plugin_api::mesh::MeshSpec;

use crate::error::Refusal;

/// `make_mesh`: `grid(...)` only.
pub fn make(spec: &MeshSpec) -> Result<MeshBox, BackendError> {
    make_grid_mesh::<Refusal>(spec)
}
