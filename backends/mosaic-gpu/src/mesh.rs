//! `MosaicGpuMesh`, Pallas's `plgpu.Mesh`: grid axes, at most three cluster axes, and
//! `num_threads` warpgroups of 128 CUDA threads (at most 16) named by `thread_name`. Made only by
//! this backend's `make_mesh`, accepted only by downcasting.

use std::fmt;

use abi_stable::std_types::RString;
use tessel_plugin_api::abi::{BackendError, Mesh, RMeshView};
use tessel_plugin_api::backend::mesh_view;
use tessel_plugin_api::mesh::{AxisRole, MeshAxis, MeshSpec};

use crate::error::Refusal;
use crate::limits::MAX_NUM_THREADS;

/// The Mosaic GPU mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MosaicGpuMesh {
    /// Grid axes: (name, size).
    pub grid: Vec<(String, u64)>,
    /// Cluster axes: (name, size), at most three.
    pub cluster: Vec<(String, u64)>,
    /// Warpgroups per program.
    pub num_threads: Option<u64>,
    /// The name of the thread axis.
    pub thread_name: Option<String>,
}

fn tuple<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let v: Vec<String> = items.map(|x| x.to_string()).collect();
    match v.len() {
        1 => format!("({},)", v[0]),
        _ => format!("({})", v.join(", ")),
    }
}

impl fmt::Display for MosaicGpuMesh {
    /// As Pallas prints a `plgpu.Mesh`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: &Option<String>| v.as_ref().map_or("None".to_string(), |s| format!("'{s}'"));
        write!(
            f,
            "Mesh(grid={}, grid_names={}, cluster={}, cluster_names={}, num_threads={}, thread_name={})",
            tuple(self.grid.iter().map(|a| a.1)),
            tuple(self.grid.iter().map(|a| format!("'{}'", a.0))),
            tuple(self.cluster.iter().map(|a| a.1)),
            tuple(self.cluster.iter().map(|a| format!("'{}'", a.0))),
            self.num_threads.map_or("None".to_string(), |n| n.to_string()),
            opt(&self.thread_name)
        )
    }
}

impl MosaicGpuMesh {
    /// Checks a mesh as Pallas's `plgpu.Mesh.__post_init__` does, with its words.
    pub fn new(
        grid: Vec<(String, u64)>,
        cluster: Vec<(String, u64)>,
        num_threads: Option<u64>,
        thread_name: Option<String>,
    ) -> Result<MosaicGpuMesh, BackendError> {
        let mesh = MosaicGpuMesh { grid, cluster, num_threads, thread_name };
        if mesh.cluster.len() > 3 {
            return Err(Refusal::ClusterRank { mesh: mesh.to_string() }.into());
        }
        if mesh.num_threads.is_some() != mesh.thread_name.is_some() {
            return Err(Refusal::ThreadsUnpaired { mesh: mesh.to_string() }.into());
        }
        if mesh.num_threads.is_some_and(|n| n > MAX_NUM_THREADS) {
            return Err(Refusal::TooManyThreads { mesh: mesh.to_string() }.into());
        }
        Ok(mesh)
    }

    /// From the portable text form `mosaic_gpu(i: 4, c: 2 cluster, wg: 2 thread)`.
    pub fn from_spec(spec: &MeshSpec) -> Result<MosaicGpuMesh, BackendError> {
        let pick = |role| spec.axes_of(role).map(|a: &MeshAxis| (a.name.clone(), a.size)).collect::<Vec<_>>();
        let threads = pick(AxisRole::Thread);
        if threads.len() > 1 {
            return Err(Refusal::SeveralThreadAxes { mesh: spec.to_string() }.into());
        }
        let (num_threads, thread_name) = match threads.into_iter().next() {
            Some((n, s)) => (Some(s), Some(n)),
            None => (None, None),
        };
        MosaicGpuMesh::new(pick(AxisRole::Grid), pick(AxisRole::Cluster), num_threads, thread_name)
    }

    /// The portable form.
    pub fn spec(&self) -> MeshSpec {
        let axis = |(n, s): &(String, u64), role| MeshAxis { name: n.clone(), size: *s, role };
        let mut axes: Vec<MeshAxis> = self.grid.iter().map(|a| axis(a, AxisRole::Grid)).collect();
        axes.extend(self.cluster.iter().map(|a| axis(a, AxisRole::Cluster)));
        if let (Some(n), Some(name)) = (self.num_threads, &self.thread_name) {
            axes.push(MeshAxis { name: name.clone(), size: n, role: AxisRole::Thread });
        }
        MeshSpec { kind: "mosaic_gpu".into(), axes }
    }
}

impl Mesh for MosaicGpuMesh {
    fn view(&self) -> RMeshView {
        mesh_view(&self.spec())
    }

    fn display(&self) -> RString {
        self.to_string().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    #[test]
    fn displays_like_pallas() {
        let m = MosaicGpuMesh::new(axes(&[("i", 4), ("j", 2)]), axes(&[("c", 2)]), Some(2), Some("wg".into())).unwrap();
        assert_eq!(
            m.to_string(),
            "Mesh(grid=(4, 2), grid_names=('i', 'j'), cluster=(2,), cluster_names=('c',), num_threads=2, thread_name='wg')"
        );
        let m = MosaicGpuMesh::new(axes(&[("i", 4)]), vec![], None, None).unwrap();
        assert_eq!(
            m.to_string(),
            "Mesh(grid=(4,), grid_names=('i',), cluster=(), cluster_names=(), num_threads=None, thread_name=None)"
        );
    }

    #[test]
    fn checks_like_pallas() {
        let e = MosaicGpuMesh::new(vec![], axes(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]), None, None).unwrap_err();
        assert!(e.message.starts_with("cluster= must be at most 3D, got Mesh(grid=(), "), "{}", e.message);
        let e = MosaicGpuMesh::new(vec![], vec![], Some(2), None).unwrap_err();
        assert!(
            e.message.starts_with("num_threads and thread_name must be either both set or both None, got Mesh("),
            "{}",
            e.message
        );
        let e = MosaicGpuMesh::new(vec![], vec![], Some(17), Some("wg".into())).unwrap_err();
        assert!(e.message.starts_with("Requested too many CUDA threads per block. Each Mosaic thread corresponds to 128 CUDA threads. At most 16 are supported, got Mesh("), "{}", e.message);
    }
}
