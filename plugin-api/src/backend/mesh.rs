//! Meshes as the host and backends share them: the portable view of a mesh object
//! ([`mesh_spec`], [`mesh_view`], [`SpecMesh`]), a kernel given the grid of its mesh
//! ([`verify_with_mesh`]), and mesh objects only their own library downcasts
//! ([`make_mesh_object`]).

use std::collections::BTreeMap;

use abi_stable::std_types::RString;

use super::invalid;
use crate::abi::*;
use crate::ir::{self, AxisSize, GridAxis, Kernel, Span, Verified};
use crate::mesh::{AxisRole, MeshAxis, MeshSpec};
use crate::refusal::MeshRefusal;

/// The portable view of a mesh object as a [`MeshSpec`].
pub fn mesh_spec(mesh: &MeshBox) -> MeshSpec {
    let v = mesh.view();
    MeshSpec {
        kind: v.kind.to_string(),
        axes: v
            .axes
            .iter()
            .map(|a| MeshAxis {
                name: a.name.to_string(),
                size: a.size,
                role: match a.role {
                    RAxisRole::Grid => AxisRole::Grid,
                    RAxisRole::Cluster => AxisRole::Cluster,
                    RAxisRole::Thread => AxisRole::Thread,
                },
            })
            .collect(),
    }
}

/// A mesh that is its portable spec and nothing more: what the host makes from `grid(...)` and
/// `device(...)` text, and what backends that read portable views make for themselves.
#[derive(Clone, Debug)]
pub struct SpecMesh(pub MeshSpec);

impl Mesh for SpecMesh {
    fn view(&self) -> RMeshView {
        mesh_view(&self.0)
    }

    fn display(&self) -> RString {
        self.0.to_string().into()
    }
}

/// The portable view of a [`MeshSpec`], for `Mesh::view`.
pub fn mesh_view(spec: &MeshSpec) -> RMeshView {
    RMeshView {
        kind: spec.kind.as_str().into(),
        axes: spec
            .axes
            .iter()
            .map(|a| RMeshAxis {
                name: a.name.as_str().into(),
                size: a.size,
                role: match a.role {
                    AxisRole::Grid => RAxisRole::Grid,
                    AxisRole::Cluster => RAxisRole::Cluster,
                    AxisRole::Thread => RAxisRole::Thread,
                },
            })
            .collect(),
    }
}

/// Gives a kernel the grid of its mesh (docs/language.md §4): a kernel without `grid` takes the
/// mesh's axes as parallel grid axes; a kernel with one must match the mesh axis for axis, else
/// `AXIS mixes mesh and grid axes`. Then verifies it, and writes each batched `dot` as 2-D ones and
/// each `tile` and `repeat` as reshapes and broadcasts ([`ir::legalize::legalize`]), so that a
/// backend meets only those.
pub fn verify_with_mesh(kernel: &Kernel, mesh: Option<&MeshSpec>) -> Result<Verified, BackendError> {
    let mut kernel = kernel.clone();
    if let Some(m) = mesh {
        match &kernel.grid {
            None => {
                // Every axis the kernel uses must be one of the mesh's.
                if let Ok(v) = ir::verify(&kernel)
                    && let Some(missing) = v.mesh_axes().iter().find(|a| !m.axes.iter().any(|x| &x.name == *a))
                {
                    return Err(MeshRefusal::MissingAxis {
                        kernel: kernel.name.clone(),
                        axis: missing.to_string(),
                        mesh: m.to_string(),
                        uses: v.mesh_axes().iter().map(|a| a.to_string()).collect(),
                    }
                    .into());
                }
                let axes = m.axes.iter().map(|a| GridAxis {
                    name: a.name.clone(),
                    size: AxisSize::Fixed(a.size),
                    seq: false,
                    thread: false,
                    from: None,
                    span: Span::NONE,
                });
                // A mesh of no axes (Pallas's `plgpu.kernel` without a grid) is one program.
                let axes: Vec<GridAxis> = axes.collect();
                kernel.grid = (!axes.is_empty()).then_some(axes);
            }
            Some(grid) => {
                for a in grid {
                    let matches =
                        m.axes.iter().any(|x| x.name == a.name && (a.size == AxisSize::Fixed(x.size) || a.size == AxisSize::Dyn));
                    if !matches {
                        return Err(MeshRefusal::MixesMeshAndGrid {
                            kernel: kernel.name.clone(),
                            axis: a.name.clone(),
                            size: a.size.to_string(),
                            mesh: m.to_string(),
                        }
                        .into());
                    }
                }
            }
        }
    }
    let v = ir::verify(&kernel).map_err(|d| invalid(format!("kernel `{}` does not verify:\n{d}", kernel.name)))?;
    if !v.mesh_axes().is_empty() {
        // No mesh gave the axes the kernel uses.
        let e = crate::launch::resolve_grid(&v, &BTreeMap::new()).expect_err("a kernel with mesh axes needs a mesh");
        return Err(invalid(e.to_string()));
    }
    let name = v.name().to_string();
    ir::legalize::legalize(v).map_err(|d| {
        BackendError::new(ErrorKind::Internal, format!("kernel `{name}` legalized does not verify:\n{d}"))
    })
}

/// Makes a mesh object from a value owned by the caller's library (`TD_CanDowncast`), so that
/// only that library can downcast it back.
pub fn make_mesh_object<M: Mesh + 'static>(mesh: M) -> MeshBox {
    Mesh_TO::from_value(mesh, abi_stable::sabi_trait::TD_CanDowncast)
}

/// How a backend that runs a kernel on one device refuses a `device(...)` mesh (devices for
/// sharding) given as a kernel's mesh, in its own words (its `Refusal` enum).
pub trait DeviceMeshRefusal {
    /// The refusal of `mesh`.
    fn device_mesh(mesh: &MeshSpec) -> BackendError;
}

/// How a backend whose own meshes are `grid(...)` ones refuses another kind of mesh.
pub trait MeshKindRefusal: DeviceMeshRefusal {
    /// The refusal of a `kind` mesh, naming `grid`, the same axes as a `grid(...)` spec.
    fn mesh_kind(kind: &str, grid: &MeshSpec) -> BackendError;
}

/// Implements [`DeviceMeshRefusal`] (and, with `kind:`, [`MeshKindRefusal`]) for a backend's
/// refusal enum from its variants `Name { mesh }` and `Name { kind, grid }`:
///
/// ```ignore
/// tessel_plugin_api::mesh_refusals!(Refusal, device: Refusal::DeviceMesh, kind: Refusal::MeshKind);
/// ```
#[macro_export]
macro_rules! mesh_refusals {
    ($refusal:ty, device: $device:path) => {
        impl $crate::backend::DeviceMeshRefusal for $refusal {
            fn device_mesh(mesh: &$crate::mesh::MeshSpec) -> $crate::abi::BackendError {
                $device { mesh: mesh.to_string() }.into()
            }
        }
    };
    ($refusal:ty, device: $device:path, kind: $kind:path) => {
        $crate::mesh_refusals!($refusal, device: $device);
        impl $crate::backend::MeshKindRefusal for $refusal {
            fn mesh_kind(kind: &str, grid: &$crate::mesh::MeshSpec) -> $crate::abi::BackendError {
                $kind { kind: kind.to_string(), grid: grid.to_string() }.into()
            }
        }
    };
}

/// `call`'s kernel given the grid of its mesh's portable view and verified
/// ([`verify_with_mesh`]), for a backend that reads any kernel mesh's view: a `device(...)` mesh
/// is refused in `R`'s words.
pub fn verify_call<R: DeviceMeshRefusal>(call: &super::Call<'_>) -> Result<Verified, BackendError> {
    let spec = call.mesh.map(mesh_spec);
    if let Some(s) = spec.as_ref().filter(|s| s.kind == "device") {
        return Err(R::device_mesh(s));
    }
    verify_with_mesh(&call.kernel, spec.as_ref())
}

/// `make_mesh` of a backend whose own meshes are `grid(...)` specs kept as they are
/// ([`SpecMesh`]): any other kind is refused in `R`'s words.
pub fn make_grid_mesh<R: MeshKindRefusal>(spec: &MeshSpec) -> Result<MeshBox, BackendError> {
    match spec.kind.as_str() {
        "grid" => Ok(make_mesh_object(SpecMesh(spec.clone()))),
        "device" => Err(R::device_mesh(spec)),
        other => Err(R::mesh_kind(other, &MeshSpec { kind: "grid".into(), axes: spec.axes.clone() })),
    }
}
