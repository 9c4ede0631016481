//! What identifies a launch ([`request_key`], [`cache_key`]) and the decoding of a launch request
//! into Rust types ([`decode`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::mesh::mesh_spec;
use super::{Call, Request, invalid};
use crate::abi::*;
use crate::ir::{self, Kernel};

/// What identifies a launch request whatever the backend: the plugin-api and kernel text format
/// versions, the kernel text, each call's kernel and mesh (its text and portable view), the
/// external meshes, and the dynamic grid sizes.
pub fn request_key(req: &LaunchRequest<'_>) -> [u8; 32] {
    launch_hash(
        &[PLUGIN_API_VERSION.as_bytes(), &req.ir_format.to_le_bytes(), req.source.as_str().as_bytes()],
        req.calls.iter().map(|c| (c.kernel.as_str(), c.mesh.into_option())),
        req.external_meshes.iter().copied(),
        req.grid.iter().map(|g| (g.axis.as_str(), g.size)),
    )
}

/// The hash of a launch: `head`, then each call's kernel (its name, or its text) and mesh, the
/// external meshes and the grid sizes, each field length-prefixed.
fn launch_hash<'m, 'g, K: AsRef<[u8]>>(
    head: &[&[u8]],
    calls: impl Iterator<Item = (K, Option<&'m MeshBox>)>,
    external_meshes: impl Iterator<Item = &'m MeshBox>,
    grid: impl Iterator<Item = (&'g str, u64)>,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for bytes in head {
        field(bytes);
    }
    let mesh_text = |m: &MeshBox| format!("{} {}", m.display(), mesh_spec(m));
    for (kernel, mesh) in calls {
        field(kernel.as_ref());
        field(mesh.map(mesh_text).unwrap_or_default().as_bytes());
    }
    for m in external_meshes {
        field(mesh_text(m).as_bytes());
    }
    for (axis, size) in grid {
        field(axis.as_bytes());
        field(&size.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// What identifies a compiled launch: the backend, its version and options, and the
/// [`request_key`].
pub fn cache_key(backend: &str, version: &str, options: &str, req: &LaunchRequest<'_>) -> [u8; 32] {
    keyed(backend, version, options, &request_key(req))
}

pub(super) fn keyed(backend: &str, version: &str, options: &str, request: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for bytes in [backend.as_bytes(), version.as_bytes(), options.as_bytes()] {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    h.update(request);
    *h.finalize().as_bytes()
}

/// The key of a compiled launch: `key` (the plan's) where no output is kept, else `key` with the
/// names of the kept outputs, which a backend may compile differently for (wgpu holds no kept
/// output in registers). Plans stay keyed without them: `supports` plans before they are known.
pub(super) fn with_kept(key: [u8; 32], kept: &std::collections::BTreeSet<String>) -> [u8; 32] {
    if kept.is_empty() {
        return key;
    }
    let mut h = blake3::Hasher::new();
    h.update(&key);
    for name in kept {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
    }
    *h.finalize().as_bytes()
}

/// Decodes a request: format version, kernel text, kernels by name.
pub fn decode<'a>(req: &LaunchRequest<'a>) -> Result<Request<'a>, BackendError> {
    decode_keyed(req, request_key(req), None)
}

/// [`decode`] with the request's key known, and the kernels when an earlier decoding of the same
/// request made them.
pub(super) fn decode_keyed<'a>(
    req: &LaunchRequest<'a>,
    key: [u8; 32],
    known: Option<&[Arc<Kernel>]>,
) -> Result<Request<'a>, BackendError> {
    if req.ir_format != IR_FORMAT_VERSION {
        return Err(invalid(format!(
            "the host sent kernel text format {}, this backend reads format {IR_FORMAT_VERSION}\n  rebuild the plugin against the host's tessel-plugin-api",
            req.ir_format
        )));
    }
    let calls = match known {
        Some(kernels) => {
            req.calls.iter().zip(kernels).map(|(c, k)| Call { kernel: Arc::clone(k), mesh: c.mesh.into_option() }).collect()
        }
        None => {
            let module = ir::parse(req.source.as_str()).map_err(|d| invalid(format!("the kernel text does not parse:\n{d}")))?;
            req.calls
                .iter()
                .map(|c| {
                    let kernel = module.kernels.iter().find(|k| k.name == c.kernel.as_str()).cloned().ok_or_else(|| {
                        invalid(format!("the request names kernel `{}`, which its source does not define", c.kernel))
                    })?;
                    Ok(Call { kernel: Arc::new(kernel), mesh: c.mesh.into_option() })
                })
                .collect::<Result<Vec<_>, BackendError>>()?
        }
    };
    let grid = req.grid.iter().map(|g| (g.axis.to_string(), g.size)).collect();
    Ok(Request { calls, external_meshes: req.external_meshes.iter().copied().collect(), grid, key, kept: Default::default() })
}

impl<'a> Request<'a> {
    /// A launch made in Rust rather than decoded from a host's request (a test or a tool that
    /// lowers through a [`super::Compiler`] directly): its key hashes each call's kernel, as
    /// canonical text, and mesh, the external meshes and the grid sizes.
    pub fn new(calls: Vec<Call<'a>>, external_meshes: Vec<&'a MeshBox>, grid: BTreeMap<String, u64>) -> Request<'a> {
        let key = launch_hash(
            &[PLUGIN_API_VERSION.as_bytes()],
            calls.iter().map(|c| (ir::print_kernel(&c.kernel), c.mesh)),
            external_meshes.iter().copied(),
            grid.iter().map(|(a, s)| (a.as_str(), *s)),
        );
        Request { calls, external_meshes, grid, key, kept: Default::default() }
    }
}
