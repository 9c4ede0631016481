//! The runtime: the registry of backends and launches through the plugin boundary. Every backend,
//! the built-in interpreter included, is reached only through its ABI-stable object.

use std::collections::BTreeMap;
use std::path::PathBuf;

use abi_stable::std_types::{ROption, RSlice, RSliceMut, RStr};
use tessel_plugin_api::abi::{
    BackendError, BufferArg, CacheStats, ErrorKind, GridSize, HostInput, HostOutput, IR_FORMAT_VERSION, KernelCall,
    LaunchRequest, MeshBox, RArrayMut, RArrayRef,
};
use tessel_plugin_api::backend::{cache_key, make_mesh_object};
use tessel_plugin_api::ir::generic::Generic;
use tessel_plugin_api::ir::{ParamKind, Type, Verified};
use tessel_plugin_api::launch::{check_input_types, check_inputs};
use tessel_plugin_api::mesh::MeshSpec;

use crate::registry::{Loaded, Registry};
use crate::{Error, HostArray, LaunchArgs, Result};

/// A `grid(...)` or `device(...)` mesh made by the host: foreign to every plugin, which reads its
/// portable view (or refuses it, as Mosaic GPU does).
pub use tessel_plugin_api::backend::SpecMesh as HostMesh;

/// One kernel of a launch with its mesh.
pub struct KernelLaunch<'a> {
    /// The verified kernel.
    pub kernel: &'a Verified,
    /// Its mesh, if any.
    pub mesh: Option<&'a MeshBox>,
}

/// Backends and launches.
pub struct Runtime {
    registry: Registry,
}

impl Runtime {
    /// Built-ins, `TESSEL_PLUGIN_PATH`, then the `explicit` plugins (whose failure is an error).
    pub fn new(explicit: &[PathBuf]) -> Result<Runtime> {
        Ok(Runtime { registry: Registry::discover(explicit)? })
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
        let (binding, tuned) = self.bind(kernel, given, shapes, backend)?;
        let verified = kernel.specialize(&binding.values).map_err(|d| Error::Kernel(kernel.render(&d, file)))?;
        Ok(Specialized { kernel: verified, binding, tuned })
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
        Ok((kernel.bind(given, &tuned.values, shapes)?, tuned))
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
            Error::UnknownBackend {
                name: name.to_string(),
                suggestion: close.map(|n| format!("; did you mean `{n}`?")).unwrap_or_default(),
                available,
            }
        })
    }

    /// The backends in the order `auto` tries them, by expected speed: mosaic-gpu, then wgpu on a
    /// hardware adapter, then other plugins, then the interpreter, then wgpu on a software adapter
    /// (which the multi-threaded interpreter outruns: `examples/matmul.tk` takes 9 ms on the
    /// interpreter and 320-400 ms on lavapipe).
    pub fn ranked(&self) -> Vec<&Loaded> {
        let rank = |b: &Loaded| match b.name.as_str() {
            "mosaic-gpu" => 0,
            "wgpu" if !software(b) => 1,
            "interpret" => 3,
            "wgpu" => 4,
            _ => 2,
        };
        let mut v: Vec<&Loaded> = self.registry.backends.iter().collect();
        v.sort_by_key(|b| rank(b));
        v
    }

    /// Picks the backend for a launch: `TESSEL_BACKEND` if set, else the first of [`Runtime::ranked`]
    /// that is available and whose `supports` says yes. Returns it with one line per backend
    /// tried (why it was skipped, or that it was chosen).
    pub fn choose(
        &self,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
    ) -> Result<(String, Vec<String>)> {
        if let Ok(forced) = std::env::var("TESSEL_BACKEND") {
            self.backend(&forced)?;
            return Ok((forced.clone(), vec![format!("{forced}: chosen by TESSEL_BACKEND")]));
        }
        let mut lines = Vec::new();
        let ranked = self.ranked();
        for (n, b) in ranked.iter().enumerate() {
            let a = b.backend.availability();
            if !a.available {
                lines.push(format!("{}: skipped, unavailable: {}", b.name, a.reason));
                continue;
            }
            match self.supports(&b.name, kernels, externals, grid) {
                Ok(()) => {
                    // A software adapter ranks below the interpreter: say so where it is passed over.
                    if b.name == tessel_interpret::NAME {
                        for later in ranked[n + 1..].iter().filter(|l| software(l)) {
                            lines.push(format!(
                                "{}: skipped, software adapter ({}): the interpreter is faster here; --backend {} to use it",
                                later.name,
                                later.backend.platform(),
                                later.name
                            ));
                        }
                    }
                    lines.push(format!("{}: chosen ({})", b.name, a.reason));
                    return Ok((b.name.clone(), lines));
                }
                // The refusal's hint lines stay, indented under it: they say what would work.
                Err(e) => lines.push(format!(
                    "{}: skipped, refuses the launch: {}",
                    b.name,
                    e.to_string().lines().map(str::trim).collect::<Vec<_>>().join("\n      ")
                )),
            }
        }
        Err(Error::NoBackend { reasons: lines.join("\n  ") })
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

    /// Asks `backend` whether it takes this launch, without a device.
    pub fn supports(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
    ) -> Result<()> {
        let b = self.backend(backend)?;
        with_request(kernels, externals, grid, |req| b.backend.supports(req).into_result()).map_err(|e| backend_error(b, e))
    }

    /// The lowered stages (`ptx`, `wgsl`, ...) of a launch, without a device.
    pub fn lower(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
    ) -> Result<Vec<(String, String)>> {
        self.lower_cached(backend, kernels, externals, grid).map(|(stages, _)| stages)
    }

    /// [`Runtime::lower`], through the on-disk cache of lowered text (see [`crate::cache`]). The
    /// backend is asked `supports` every time; refusals are never cached.
    pub fn lower_cached(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
    ) -> Result<(Vec<(String, String)>, crate::cache::Outcome)> {
        let b = self.backend(backend)?;
        with_request(kernels, externals, grid, |req| {
            b.backend.supports(req).into_result()?;
            // The build as well as the version: a rebuilt backend of the same version may lower
            // differently, and must not read what its predecessor wrote.
            let version = format!("{} {}", b.backend.version(), build_identity(&b.source));
            let key = cache_key(&b.name, &version, req);
            crate::cache::lowered(&key, || {
                let stages = b.backend.lower(req).into_result()?;
                Ok(stages.into_iter().map(|s| (s.name.into_string(), s.text.into_string())).collect())
            })
        })
        .map_err(|e| backend_error(b, e))
    }

    /// The counters of a backend's in-memory compile cache.
    pub fn cache_stats(&self, backend: &str) -> Result<CacheStats> {
        Ok(self.backend(backend)?.backend.cache_stats())
    }

    /// Runs a launch and returns every output of every kernel (in launch order, each name once).
    /// It is [`Runtime::launch_in_place`] on the inputs' memory and on fresh output arrays: a
    /// backend that computes in host memory (the interpreter) reads the inputs where they are and
    /// writes each output once; a device backend uploads from them and downloads into the outputs.
    pub fn launch(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        args: &LaunchArgs,
    ) -> Result<Vec<(String, HostArray)>> {
        // Every kernel's inputs must be given; names are shared across the kernels of a launch.
        for k in kernels {
            check_inputs(k.kernel.kernel(), &args.inputs, kernels.len() == 1)?;
        }
        let verified: Vec<&Verified> = kernels.iter().map(|k| k.kernel).collect();
        let need = crate::memory::Need { inputs: 0, ..crate::memory::Need::of(&verified, crate::memory::threads()) };
        crate::memory::check(
            || format!("the outputs of `{}`", verified.iter().map(|k| k.name()).collect::<Vec<_>>().join("`, `")),
            need,
        )?;
        let mut outputs: Vec<(String, HostArray)> = Vec::new();
        for k in kernels {
            for p in k.kernel.kernel().params_of(ParamKind::Out) {
                if !outputs.iter().any(|(n, _)| *n == p.name) {
                    outputs.push((p.name.clone(), HostArray::zeros(p.ty.dtype, &p.ty.shape)));
                }
            }
        }
        let input_bytes: Vec<(&String, Type, std::borrow::Cow<'_, [u8]>)> =
            args.inputs.iter().map(|(n, a)| (n, a.ty(), a.le_bytes())).collect();
        // `bool` arrays are not bytes in place: they are written into bytes and converted after.
        let mut bool_bytes: BTreeMap<String, Vec<u8>> = outputs
            .iter()
            .filter(|(_, a)| a.dtype() == tessel_plugin_api::ir::DType::Bool)
            .map(|(n, a)| (n.clone(), vec![0u8; a.len()]))
            .collect();
        let types: Vec<Type> = outputs.iter().map(|(_, a)| a.ty()).collect();
        {
            let mut in_place = InPlace {
                inputs: input_bytes.iter().map(|(n, ty, b)| ((*n).clone(), BytesRef { ty: ty.clone(), bytes: b })).collect(),
                outputs: BTreeMap::new(),
                grid: args.grid.clone(),
            };
            let mut bool_slots: BTreeMap<&str, &mut Vec<u8>> = bool_bytes.iter_mut().map(|(n, b)| (n.as_str(), b)).collect();
            for ((name, array), ty) in outputs.iter_mut().zip(types) {
                let bytes = match array.le_bytes_mut() {
                    Some(b) => b,
                    None => bool_slots.remove(name.as_str()).expect("bool outputs have bytes").as_mut_slice(),
                };
                in_place.outputs.insert(name.clone(), BytesMut { ty, bytes });
            }
            self.launch_in_place(backend, kernels, externals, &mut in_place)?;
        }
        for (name, array) in &mut outputs {
            if let Some(bytes) = bool_bytes.get(name.as_str()) {
                *array = HostArray::from_le_bytes(tessel_plugin_api::ir::DType::Bool, &array.shape, bytes)
                    .expect("one byte per element");
            }
        }
        Ok(outputs)
    }

    /// A launch on memory the caller owns: inputs read where they are, outputs written into the
    /// caller's arrays. A backend that computes in host memory (the interpreter) reads the inputs
    /// in place and writes the outputs once; a device backend uploads from them and downloads
    /// into them, one copy each way.
    pub fn launch_in_place(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        args: &mut InPlace<'_>,
    ) -> Result<()> {
        self.in_place(backend, kernels, externals, args, true)
    }

    /// [`Runtime::launch_in_place`] of a launch the backend accepted before ([`Runtime::supports`]
    /// said yes to the same kernels, meshes and grid): not asked again, so a launch found in
    /// the backend's compile cache costs no planning. One that is not there is planned (and may
    /// still be refused) when it is compiled, as any launch is. For callers that launch the same
    /// thing many times, such as the XLA FFI handler.
    pub fn relaunch_in_place(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        args: &mut InPlace<'_>,
    ) -> Result<()> {
        self.in_place(backend, kernels, externals, args, false)
    }

    fn in_place(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        args: &mut InPlace<'_>,
        ask: bool,
    ) -> Result<()> {
        let b = self.backend(backend)?;
        let fail = |e: BackendError| backend_error(b, e);
        let types: BTreeMap<String, Type> = args.inputs.iter().map(|(n, a)| (n.clone(), a.ty.clone())).collect();
        for k in kernels {
            check_input_types(k.kernel.kernel(), &types, kernels.len() == 1)?;
            for p in k.kernel.kernel().params_of(ParamKind::Out) {
                if args.outputs.get(&p.name).map(|o| &o.ty) != Some(&p.ty) {
                    return Err(Error::Backend {
                        backend: b.name.clone(),
                        kind: ErrorKind::InvalidInput,
                        message: format!("output `{}` has no array of its type {} to be written into", p.name, p.ty),
                    });
                }
            }
        }
        let shapes = |ty: &Type| ty.shape.iter().map(|&d| d as u64).collect::<Vec<u64>>();
        let in_shapes: BTreeMap<&str, Vec<u64>> = args.inputs.iter().map(|(n, a)| (n.as_str(), shapes(&a.ty))).collect();
        let out_shapes: BTreeMap<String, Vec<u64>> = args.outputs.iter().map(|(n, a)| (n.clone(), shapes(&a.ty))).collect();
        let lend = |name: &'_ str| -> RArrayRef<'_> {
            let a = &args.inputs[name];
            RArrayRef {
                dtype: RStr::from_str(a.ty.dtype.name()),
                shape: RSlice::from_slice(&in_shapes[name]),
                bytes: RSlice::from_slice(a.bytes),
            }
        };
        with_request(kernels, externals, &args.grid, |req| {
            if ask {
                b.backend.supports(req).into_result().map_err(fail)?;
            }
            let inputs: Vec<HostInput<'_>> =
                args.inputs.keys().map(|n| HostInput { name: RStr::from_str(n), array: lend(n) }).collect();
            let mut outputs: Vec<HostOutput<'_>> = args
                .outputs
                .iter_mut()
                .map(|(n, a)| HostOutput {
                    name: RStr::from_str(n),
                    array: RArrayMut {
                        dtype: RStr::from_str(a.ty.dtype.name()),
                        shape: RSlice::from_slice(&out_shapes[n]),
                        bytes: RSliceMut::from_mut_slice(a.bytes),
                    },
                })
                .collect();
            let ran = b
                .backend
                .launch_host(req, RSlice::from_slice(&inputs), RSliceMut::from_mut_slice(&mut outputs))
                .into_result()
                .map_err(fail)?;
            if ran {
                return Ok(());
            }
            let upload = |name: &str, id: u64| b.backend.upload(id, lend(name)).into_result();
            let mut outputs: BTreeMap<&str, &mut HostOutput<'_>> = outputs.iter_mut().map(|o| (o.name.as_str(), o)).collect();
            with_buffers(b, req, kernels, upload, |name, id| {
                let o = outputs.get_mut(name).expect("every output has an array (checked above)");
                let into = RArrayMut {
                    dtype: o.array.dtype,
                    shape: o.array.shape,
                    bytes: RSliceMut::from_mut_slice(o.array.bytes.as_mut_slice()),
                };
                b.backend.download_into(id, into).into_result().map_err(fail)
            })
            .map(drop)
        })
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

/// Arrays of a launch on memory the caller owns ([`Runtime::launch_in_place`]).
#[derive(Debug, Default)]
pub struct InPlace<'a> {
    /// Inputs by name, read where they are.
    pub inputs: BTreeMap<String, BytesRef<'a>>,
    /// Outputs by name, each the caller's memory of the output's type; every element is written.
    pub outputs: BTreeMap<String, BytesMut<'a>>,
    /// The size of each `dyn` grid axis, by name.
    pub grid: BTreeMap<String, u64>,
}

/// An array's type and its elements as little-endian bytes, borrowed.
#[derive(Debug)]
pub struct BytesRef<'a> {
    /// Its type.
    pub ty: Type,
    /// Its elements.
    pub bytes: &'a [u8],
}

/// An array's type and the memory its little-endian elements go to, borrowed.
#[derive(Debug)]
pub struct BytesMut<'a> {
    /// Its type.
    pub ty: Type,
    /// Where its elements go.
    pub bytes: &'a mut [u8],
}

/// Allocates a buffer per argument of `kernels` (each name once), fills the inputs with
/// `upload`, launches, hands every output to `finish` (launch order), and frees every buffer.
fn with_buffers<T>(
    b: &Loaded,
    req: &LaunchRequest<'_>,
    kernels: &[KernelLaunch<'_>],
    upload: impl Fn(&str, u64) -> std::result::Result<(), BackendError>,
    mut finish: impl FnMut(&str, u64) -> Result<T>,
) -> Result<Vec<(String, T)>> {
    let fail = |e: BackendError| backend_error(b, e);
    let mut bound: Vec<(String, u64)> = Vec::new();
    let mut outputs: Vec<String> = Vec::new();
    let result = (|| {
        for k in kernels {
            for p in &k.kernel.kernel().params {
                if p.kind == ParamKind::Scratch || bound.iter().any(|(n, _)| *n == p.name) {
                    continue;
                }
                let shape: Vec<u64> = p.ty.shape.iter().map(|&d| d as u64).collect();
                let id =
                    b.backend.alloc(RStr::from_str(p.ty.dtype.name()), RSlice::from_slice(&shape)).into_result().map_err(fail)?;
                bound.push((p.name.clone(), id));
                match p.kind {
                    ParamKind::In => upload(&p.name, id).map_err(fail)?,
                    _ => outputs.push(p.name.clone()),
                }
            }
        }
        let buffer_args: Vec<BufferArg<'_>> =
            bound.iter().map(|(n, id)| BufferArg { name: RStr::from_str(n), buffer: *id }).collect();
        b.backend.launch(req, RSlice::from_slice(&buffer_args)).into_result().map_err(fail)?;
        outputs
            .iter()
            .map(|name| {
                let id = bound.iter().find(|(n, _)| n == name).map(|(_, id)| *id).expect("outputs are bound");
                Ok((name.clone(), finish(name, id)?))
            })
            .collect::<Result<Vec<_>>>()
    })();
    for (_, id) in &bound {
        // A buffer that cannot be freed is the backend's problem; the launch result stands.
        let _ = b.backend.free(*id);
    }
    result
}

/// What a launch by [`Runtime::run`] did: its outputs and the report shared launch code logs.
#[derive(Debug)]
pub struct Report {
    /// Every output of every kernel, in launch order.
    pub outputs: Vec<(String, HostArray)>,
    /// The backend that ran it.
    pub backend: String,
    /// One line per backend `auto` tried: why it was skipped, or that it was chosen.
    pub decisions: Vec<String>,
    /// Time to lower (zero when the backend's compile cache had it).
    pub compile: std::time::Duration,
    /// Time of the launch itself: uploads, run, downloads.
    pub run: std::time::Duration,
    /// Whether the backend's in-memory compile cache held the launch already.
    pub cache_hit: bool,
}

impl Runtime {
    /// Launches on `backend`, or on the first that takes it when `backend` is `auto` (see
    /// [`Runtime::choose`]), and reports what ran where, why, and how long it took.
    pub fn run(&self, backend: &str, kernels: &[KernelLaunch<'_>], externals: &[&MeshBox], args: &LaunchArgs) -> Result<Report> {
        let mut report = self.lowered_for_run(backend, kernels, externals, &args.grid)?;
        let start = std::time::Instant::now();
        report.outputs = self.launch(&report.backend, kernels, externals, args)?;
        report.run = start.elapsed();
        Ok(report)
    }

    /// [`Runtime::run`] on memory the caller owns ([`Runtime::launch_in_place`]): the report's
    /// `outputs` are empty, the caller's arrays hold them.
    pub fn run_in_place(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        args: &mut InPlace<'_>,
    ) -> Result<Report> {
        let mut report = self.lowered_for_run(backend, kernels, externals, &args.grid)?;
        let start = std::time::Instant::now();
        self.launch_in_place(&report.backend, kernels, externals, args)?;
        report.run = start.elapsed();
        Ok(report)
    }

    /// The backend chosen (or named), the launch lowered through its in-memory cache (the launch
    /// after finds it there), and the report so far.
    fn lowered_for_run(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
    ) -> Result<Report> {
        let (backend, decisions) = if backend == "auto" {
            self.choose(kernels, externals, grid)?
        } else {
            self.backend(backend)?;
            (backend.to_string(), vec![format!("{backend}: chosen by name")])
        };
        let b = self.backend(&backend)?;
        let before = self.cache_stats(&backend)?;
        let start = std::time::Instant::now();
        with_request(kernels, externals, grid, |req| b.backend.lower(req).into_result()).map_err(|e| backend_error(b, e))?;
        let compile = start.elapsed();
        let cache_hit = self.cache_stats(&backend)?.hits > before.hits;
        Ok(Report {
            outputs: Vec::new(),
            backend,
            decisions,
            compile: if cache_hit { std::time::Duration::ZERO } else { compile },
            run: std::time::Duration::ZERO,
            cache_hit,
        })
    }
}

/// An array in a backend's memory, made by [`Runtime::upload`] or [`Runtime::alloc`]: it stays
/// there between launches ([`Runtime::launch_resident`]) until [`Runtime::free`].
#[derive(Debug)]
pub struct DeviceArray {
    backend: String,
    id: u64,
    ty: Type,
}

impl DeviceArray {
    /// The array's type.
    pub fn ty(&self) -> &Type {
        &self.ty
    }
}

impl Runtime {
    /// A zeroed array of `ty` in `backend`'s memory.
    pub fn alloc(&self, backend: &str, ty: &Type) -> Result<DeviceArray> {
        let b = self.backend(backend)?;
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

    /// Launches on arrays already in `backend`'s memory, bound by argument name; outputs are
    /// written in place. Nothing is copied between host and device.
    pub fn launch_resident(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
        arrays: &[(&str, &DeviceArray)],
    ) -> Result<()> {
        self.resident(backend, kernels, externals, grid, arrays, false).map(|_| ())
    }

    /// [`Runtime::launch_resident`], timed on the device: how long its dispatches took on the
    /// device's own clock (GPU timestamp queries), or `None` where the backend cannot tell.
    pub fn launch_resident_timed(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
        arrays: &[(&str, &DeviceArray)],
    ) -> Result<Option<std::time::Duration>> {
        self.resident(backend, kernels, externals, grid, arrays, true)
    }

    fn resident(
        &self,
        backend: &str,
        kernels: &[KernelLaunch<'_>],
        externals: &[&MeshBox],
        grid: &BTreeMap<String, u64>,
        arrays: &[(&str, &DeviceArray)],
        timed: bool,
    ) -> Result<Option<std::time::Duration>> {
        let b = self.backend(backend)?;
        for k in kernels {
            for p in k.kernel.kernel().params.iter().filter(|p| p.kind != ParamKind::Scratch) {
                match arrays.iter().find(|(n, _)| *n == p.name) {
                    None => {
                        return Err(Error::Backend {
                            backend: b.name.clone(),
                            kind: ErrorKind::InvalidInput,
                            message: format!(
                                "kernel `{}`: no array is bound to argument `{}` ({})",
                                k.kernel.name(),
                                p.name,
                                p.ty
                            ),
                        });
                    }
                    Some((_, a)) if a.backend != b.name || a.ty != p.ty => {
                        return Err(Error::Backend {
                            backend: b.name.clone(),
                            kind: ErrorKind::InvalidInput,
                            message: format!(
                                "kernel `{}`: argument `{}` is {} on {}, but the array bound to it is {} on {}",
                                k.kernel.name(),
                                p.name,
                                p.ty,
                                b.name,
                                a.ty,
                                a.backend
                            ),
                        });
                    }
                    Some(_) => {}
                }
            }
        }
        let args: Vec<BufferArg<'_>> = arrays.iter().map(|(n, a)| BufferArg { name: RStr::from_str(n), buffer: a.id }).collect();
        let args = RSlice::from_slice(&args);
        with_request(kernels, externals, grid, |req| {
            let r = if timed {
                b.backend.launch_timed(req, args).into_result().map(|ns| ns.into_option().map(std::time::Duration::from_nanos))
            } else {
                b.backend.launch(req, args).into_result().map(|()| None)
            };
            r.map_err(|e| backend_error(b, e))
        })
    }
}

/// What a backend's build is: for a plugin, its file by path, size and modification time; for a
/// built-in, the fingerprint of the sources it was built from (`build.rs`), so that every program
/// built from the same sources (the command line, the Python module) shares cache entries and
/// tuning records.
pub(crate) fn build_identity(source: &crate::registry::Source) -> String {
    match source {
        crate::registry::Source::Plugin(path) => {
            let meta = std::fs::metadata(path).ok();
            let modified =
                meta.as_ref().and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            format!("plugin {path:?} {:?} {modified:?}", meta.map(|m| m.len()))
        }
        crate::registry::Source::BuiltIn => format!("built-in, sources {}", env!("TESSEL_SOURCE_HASH")),
    }
}

fn backend_error(b: &Loaded, e: BackendError) -> Error {
    Error::Backend { backend: b.name.clone(), kind: e.kind, message: e.message.into_string() }
}

/// Builds the boundary's view of a launch (borrowing everything) and hands it to `f`.
fn with_request<T, E>(
    kernels: &[KernelLaunch<'_>],
    externals: &[&MeshBox],
    grid: &BTreeMap<String, u64>,
    f: impl FnOnce(&LaunchRequest<'_>) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let source: std::borrow::Cow<'_, str> = match kernels {
        [one] => one.kernel.text().into(),
        _ => kernels.iter().map(|k| k.kernel.text()).collect::<Vec<_>>().join("\n").into(),
    };
    let calls: Vec<KernelCall<'_>> = kernels
        .iter()
        .map(|k| KernelCall { kernel: RStr::from_str(k.kernel.name()), mesh: k.mesh.map_or(ROption::RNone, ROption::RSome) })
        .collect();
    let sizes: Vec<GridSize<'_>> = grid.iter().map(|(axis, &size)| GridSize { axis: RStr::from_str(axis), size }).collect();
    let req = LaunchRequest {
        ir_format: IR_FORMAT_VERSION,
        source: RStr::from_str(&source),
        calls: RSlice::from_slice(&calls),
        external_meshes: RSlice::from_slice(externals),
        grid: RSlice::from_slice(&sizes),
    };
    f(&req)
}

/// Whether a backend runs on a software adapter (its platform says so, as wgpu's does for
/// lavapipe, llvmpipe and WARP).
fn software(b: &Loaded) -> bool {
    b.name == "wgpu" && b.backend.platform().as_str().contains("software")
}
