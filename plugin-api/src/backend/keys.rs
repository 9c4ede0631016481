//! What identifies a launch ([`request_key`], [`cache_key`]) and the decoding of a launch request
//! into Rust types ([`decode`]).

use std::sync::Arc;

use super::mesh::mesh_spec;
use super::{Call, Launch, invalid};
use crate::abi::*;
use crate::ir::{self, Kernel};

/// What identifies a launch request whatever the backend: the plugin-api and kernel text format
/// versions, the kernel text, each call's kernel and mesh (its text and portable view), the
/// external meshes, and the dynamic grid sizes.
pub fn request_key(req: &LaunchRequest<'_>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(PLUGIN_API_VERSION.as_bytes());
    field(&req.ir_format.to_le_bytes());
    field(req.source.as_str().as_bytes());
    let mesh_text = |m: &MeshBox| format!("{} {}", m.display(), mesh_spec(m));
    for c in req.calls.iter() {
        field(c.kernel.as_str().as_bytes());
        field(c.mesh.into_option().map(mesh_text).unwrap_or_default().as_bytes());
    }
    for m in req.external_meshes.iter() {
        field(mesh_text(m).as_bytes());
    }
    for g in req.grid.iter() {
        field(g.axis.as_str().as_bytes());
        field(&g.size.to_le_bytes());
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

/// Decodes a request: format version, kernel text, kernels by name.
pub fn decode<'a>(req: &LaunchRequest<'a>) -> Result<Launch<'a>, BackendError> {
    decode_keyed(req, request_key(req), None)
}

/// [`decode`] with the request's key known, and the kernels when an earlier decoding of the same
/// request made them.
pub(super) fn decode_keyed<'a>(
    req: &LaunchRequest<'a>,
    key: [u8; 32],
    known: Option<&[Arc<Kernel>]>,
) -> Result<Launch<'a>, BackendError> {
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
    Ok(Launch { calls, external_meshes: req.external_meshes.iter().copied().collect(), grid, key, kept: Default::default() })
}
