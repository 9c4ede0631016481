//! The runtime: the registry of backends, their ranking, meshes, specialization and device
//! arrays. Launches go through [`crate::launch`]. Every backend, the built-in interpreter
//! included, is reached only through its ABI-stable object.

use std::collections::BTreeMap;
use std::path::PathBuf;

use abi_stable::std_types::{RSlice, RStr};
use tessel_plugin_api::abi::{Availability, BackendError, CacheStats, ErrorKind, MeshBox};
use tessel_plugin_api::backend::make_mesh_object;
use tessel_plugin_api::ir::generic::Generic;
use tessel_plugin_api::ir::{Type, Verified};
use tessel_plugin_api::mesh::MeshSpec;

use crate::registry::{Loaded, Registry};
use crate::{Error, HostArray, Result};

/// A `grid(...)` or `device(...)` mesh made by the host: foreign to every plugin, which reads its
/// portable view (or refuses it, as Mosaic GPU does).
pub use tessel_plugin_api::backend::SpecMesh as HostMesh;

/// Backends and launches.
pub struct Runtime {
    registry: Registry,
}

impl Runtime {
    /// Built-ins, `TESSEL_PLUGIN_PATH`, then the `explicit` plugins (whose failure is an error).
    pub fn new(explicit: &[PathBuf]) -> Result<Runtime> {
        Ok(Runtime { registry: Registry::discover(explicit)? })
    }

    /// A runtime for launches on the backend `named` (`None`: any): the built-ins, the
    /// `explicit` plugins, and those of `TESSEL_PLUGIN_PATH` only until one provides `named`
    /// ([`Registry::discover_for`]).
    pub fn for_backend(explicit: &[PathBuf], named: Option<&str>) -> Result<Runtime> {
        Ok(Runtime { registry: Registry::discover_for(explicit, named)? })
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The ordinary kernel `kernel` of `file` is for a launch on inputs of `shapes` (by argument
    /// name) with `given` parameter values (docs/language.md §9): shape parameters from the
    /// shapes, then `given`, then the tuning record of `backend` (when one is named), then the
    /// defaults. Returns it verified, with where each value came from and the record used.
    /// A kernel from a file or one built in Rust ([`GenericBuilder`](tessel_plugin_api::ir::builder::GenericBuilder));
    /// errors are rendered against its text, named `file` in the messages.
    pub fn specialize(
        &self,
        kernel: &Generic,
        file: &str,
        given: &BTreeMap<String, i64>,
        shapes: &BTreeMap<String, Vec<usize>>,
        backend: Option<&str>,
    ) -> Result<Specialized> {
        let render = |d| Error::Kernel(kernel.render(&d, file));
        let (binding, tuned) = self.bind(kernel, given, shapes, backend)?;
        match (kernel.specialize(&binding.values), &tuned.record) {
            (Ok(verified), _) => Ok(Specialized { kernel: verified, binding, tuned }),
            // The record's values do not make a kernel that verifies: the record is ignored,
            // not the launch refused for values the user never gave.
            (Err(d), Some(path)) => {
                let why = render(d).to_string();
                let tuned = crate::tune::ignored(path, &first_line(&why));
                let (binding, _) = self.bind(kernel, given, shapes, None)?;
                let verified = kernel.specialize(&binding.values).map_err(render)?;
                Ok(Specialized { kernel: verified, binding, tuned })
            }
            (Err(d), None) => Err(render(d)),
        }
    }

    /// The values [`Runtime::specialize`] gives `kernel`'s parameters, without specializing (for a
    /// caller that keeps specializations by their values), and what the tuning record gave.
    pub fn bind(
        &self,
        kernel: &Generic,
        given: &BTreeMap<String, i64>,
        shapes: &BTreeMap<String, Vec<usize>>,
        backend: Option<&str>,
    ) -> Result<(tessel_plugin_api::ir::generic::Binding, crate::tune::Tuned)> {
        let tuned = match backend {
            Some(b) => self.tuned(kernel, given, shapes, b)?,
            None => crate::tune::Tuned::default(),
        };
        match (kernel.bind(given, &tuned.values, shapes), &tuned.record) {
            (Ok(binding), _) => Ok((binding, tuned)),
            // Values from a record that do not bind: the record is ignored, with a warning.
            (Err(e), Some(path)) => {
                let tuned = crate::tune::ignored(path, &first_line(&e.to_string()));
                Ok((kernel.bind(given, &BTreeMap::new(), shapes)?, tuned))
            }
            (Err(e), None) => Err(e.into()),
        }
    }

    /// What `tessel tune`'s record gives the generic `kernel` on `backend` for a launch on
    /// inputs of `shapes` (by argument name) with `given` values: values for its tuned parameters not given (docs/language.md
    /// §9). Pass them to [`KernelFile::specialize_for`](crate::KernelFile::specialize_for).
    pub fn tuned(
        &self,
        kernel: &Generic,
        given: &BTreeMap<String, i64>,
        shapes: &BTreeMap<String, Vec<usize>>,
        backend: &str,
    ) -> Result<crate::tune::Tuned> {
        Ok(crate::tune::tuned(kernel, given, shapes, self.backend(backend)?))
    }

    /// The backend called `name` if it can run here: an unknown name is refused as by
    /// [`Runtime::backend`], an unavailable backend with its reason. Lowering needs no device
    /// and does not ask this; every launch does.
    pub fn available(&self, name: &str) -> Result<&Loaded> {
        let b = self.backend(name)?;
        ensure_available(b)?;
        Ok(b)
    }

    /// The backend called `name`, or an error listing those that exist.
    pub fn backend(&self, name: &str) -> Result<&Loaded> {
        self.registry.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.registry.backends.iter().map(|b| b.name.as_str()).collect();
            // A name the given one begins, or one a typo away (a quarter of its letters, at least one).
            let distance = |n: &str| strsim::damerau_levenshtein(n, name);
            let close = names
                .iter()
                .filter(|n| n.starts_with(name) || distance(n) <= (name.len() / 4).max(1))
                .min_by_key(|n| distance(n));
            let available =
                self.registry
                    .backends
                    .iter()
                    .map(|b| {
                        if b.backend.availability().available { b.name.clone() } else { format!("{} (unavailable here)", b.name) }
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
            // A plugin that would have provided it may be among those that did not load.
            let failed: String =
                self.registry.failed.iter().map(|f| format!("\n  not loaded: {}", first_line(&f.error.to_string()))).collect();
            Error::UnknownBackend {
                name: tessel_plugin_api::clip::clip(name).into_owned(),
                suggestion: close.map(|n| format!("; did you mean `{n}`?")).unwrap_or_default(),
                available: available + &failed,
            }
        })
    }

    /// The backends in the order `auto` tries them: by the [`DeviceClass`] each declares when it
    /// is available (a vendor compiler for this chip, then a portable API on hardware, then the
    /// CPU, then a device emulated in software, which the multi-threaded interpreter outruns:
    /// `examples/matmul.tk` takes 9 ms on the interpreter and 320-400 ms on lavapipe). The
    /// unavailable come first, so that `auto`'s report says why each is not used before it names
    /// the one chosen. Within a class a plugin ranks before a built-in: the built-in interpreter,
    /// the reference, is the CPU's fallback, and a compiling CPU plugin (`tessel-cpu`) goes first.
    /// Other ties keep the registry's name order.
    pub fn ranked(&self) -> Vec<(&Loaded, Availability)> {
        let mut v: Vec<(&Loaded, Availability)> = self.registry.backends.iter().map(|b| (b, b.backend.availability())).collect();
        v.sort_by_key(|(b, a)| (a.available, a.class, b.source == crate::registry::Source::BuiltIn));
        v
    }

    /// A mesh from its text form: `grid(...)` and `device(...)` are host meshes; any other kind is
    /// made by the backend that lists it in its capabilities, `backend` first.
    pub fn mesh(&self, backend: &str, text: &str) -> Result<MeshBox> {
        let spec = MeshSpec::parse(text).map_err(Error::Mesh)?;
        if spec.kind == "grid" || spec.kind == "device" {
            return Ok(make_mesh_object(HostMesh(spec)));
        }
        let makes = |b: &&Loaded| b.backend.capabilities().mesh_kinds.iter().any(|k| k.as_str() == spec.kind);
        let maker = Some(backend)
            .filter(|b| !b.is_empty())
            .and_then(|b| self.registry.get(b))
            .filter(makes)
            .or_else(|| self.registry.backends.iter().find(makes));
        match maker {
            Some(b) => b.backend.make_mesh(RStr::from_str(text)).into_result().map_err(|e| backend_error(b, e)),
            None => Err(Error::NoMeshMaker { kind: spec.kind.clone(), available: self.registry.names() }),
        }
    }

    /// The right mesh for `backend` from a portable spec, so that shared launch code never
    /// branches by backend: a `grid(...)` spec becomes the backend's own mesh where it makes one
    /// (a `MosaicGpuMesh` for mosaic-gpu), and stays a host grid mesh for backends that read
    /// portable views; any other kind is made as [`Runtime::mesh`] makes it.
    pub fn mesh_for(&self, backend: &str, text: &str) -> Result<MeshBox> {
        let spec = MeshSpec::parse(text).map_err(Error::Mesh)?;
        let b = self.backend(backend)?;
        let caps = b.backend.capabilities();
        let own = caps.mesh_kinds.iter().any(|k| k.as_str() == "grid" || k.as_str() == spec.kind);
        if spec.kind == "grid" && !caps.mesh_kinds.is_empty() && (own || !caps.portable_meshes) {
            return b.backend.make_mesh(RStr::from_str(text)).into_result().map_err(|e| backend_error(b, e));
        }
        self.mesh(backend, text)
    }

    /// The counters of a backend's in-memory compile cache.
    pub fn cache_stats(&self, backend: &str) -> Result<CacheStats> {
        Ok(self.backend(backend)?.backend.cache_stats())
    }
}

/// A generic kernel specialized for a launch ([`Runtime::specialize`]).
#[derive(Debug)]
pub struct Specialized {
    /// The ordinary kernel, verified.
    pub kernel: Verified,
    /// Every parameter's value and where it came from.
    pub binding: tessel_plugin_api::ir::generic::Binding,
    /// What the tuning record gave, and where it is.
    pub tuned: crate::tune::Tuned,
}

/// An array in a backend's memory, made by [`Runtime::upload`] or [`Runtime::alloc`]: it stays
/// there between launches ([`crate::Planned::launch_resident`]) until [`Runtime::free`].
#[derive(Debug)]
pub struct DeviceArray {
    pub(crate) backend: String,
    pub(crate) id: u64,
    pub(crate) ty: Type,
}

impl DeviceArray {
    /// The array's type.
    pub fn ty(&self) -> &Type {
        &self.ty
    }
}

impl Runtime {
    /// A zeroed array of `ty` in `backend`'s memory (an unavailable backend is refused).
    pub fn alloc(&self, backend: &str, ty: &Type) -> Result<DeviceArray> {
        let b = self.available(backend)?;
        let shape: Vec<u64> = ty.shape.iter().map(|&d| d as u64).collect();
        let id = b
            .backend
            .alloc(RStr::from_str(ty.dtype.name()), RSlice::from_slice(&shape))
            .into_result()
            .map_err(|e| backend_error(b, e))?;
        Ok(DeviceArray { backend: b.name.clone(), id, ty: ty.clone() })
    }

    /// Copies `array` into `backend`'s memory.
    pub fn upload(&self, backend: &str, array: &HostArray) -> Result<DeviceArray> {
        let d = self.alloc(backend, &array.ty())?;
        let b = self.backend(backend)?;
        if let Err(e) = array.with_rarray_ref(|r| b.backend.upload(d.id, r)).into_result() {
            self.free(d);
            return Err(backend_error(b, e));
        }
        Ok(d)
    }

    /// Copies an array back to the host.
    pub fn download(&self, array: &DeviceArray) -> Result<HostArray> {
        let b = self.backend(&array.backend)?;
        let r = b.backend.download(array.id).into_result().map_err(|e| backend_error(b, e))?;
        HostArray::from_rarray(&r).map_err(|m| Error::Backend {
            backend: b.name.clone(),
            kind: ErrorKind::Internal,
            message: format!("backend returned a malformed array: {m}"),
        })
    }

    /// Frees an array (a backend that cannot is ignored: the memory is its own).
    pub fn free(&self, array: DeviceArray) {
        if let Ok(b) = self.backend(&array.backend) {
            let _ = b.backend.free(array.id);
        }
    }
}

/// The first line of a message (the fact; the lines after say what would work).
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string()
}

/// `Ok` if `b` says it is available, else a [`ErrorKind::Unavailable`] error with its reason:
/// `backend NAME is unavailable: REASON`.
pub(crate) fn ensure_available(b: &Loaded) -> Result<()> {
    let a = b.backend.availability();
    if a.available {
        return Ok(());
    }
    Err(Error::Backend {
        backend: b.name.clone(),
        kind: ErrorKind::Unavailable,
        message: format!(
            "backend {} is unavailable: {}\n  choose one that is available (`tessel backends` lists them), or `--backend auto`",
            b.name, a.reason
        ),
    })
}

pub(crate) fn backend_error(b: &Loaded, e: BackendError) -> Error {
    Error::Backend { backend: b.name.clone(), kind: e.kind, message: e.message.into_string() }
}
