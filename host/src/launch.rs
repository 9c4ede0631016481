//! One launch, planned once. A [`Launch`] names the kernels (each with its mesh: a [`Call`]),
//! the external meshes and the `dyn` grid sizes, owned and cheap to clone; [`Runtime::plan`] is
//! the only place that asks a backend's `supports`: by name, or under `auto` each backend in
//! [`Runtime::ranked`] order until one takes it, keeping a line per backend asked. The
//! [`Planned`] launch holds the [`Plan`] (the choice, and the launch it was made for, whose
//! request text is printed once) and lowers, launches in place, launches on resident arrays or
//! runs with a report, never asking again. Callers that keep a launch across calls (the CLI, the
//! Python module, the XLA FFI handler) keep its `Plan` and [`Runtime::resume`] it.
//!
//! ```text
//! Launch ──plan(Auto | Named)──▶ Planned ──lower ─────────────▶ stages (cache::lowered)
//!            │ supports, once     │        launch / launch_in_place ─▶ launch_host, else
//!            │ per backend asked  │            buffers: alloc, upload, launch, download
//!            ▼                    │        launch_resident ─────────▶ launch(_timed)
//!      decisions, text            ▼
//!                            into_plan ──▶ Plan ──resume──▶ Planned (no supports)
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use abi_stable::std_types::{ROption, RSlice, RSliceMut, RStr};
use tessel_plugin_api::abi::{
    BackendError, BufferArg, DeviceArg, DeviceClass, ErrorKind, GridSize, HostInput, HostOutput, IR_FORMAT_VERSION, KernelCall,
    LaunchRequest, MeshBox, RArrayMut, RArrayRef,
};
use tessel_plugin_api::backend::cache_key;
use tessel_plugin_api::ir::{DType, ParamKind, Type, Verified};
use tessel_plugin_api::launch::{check_input_types, check_inputs, scalar_value, sizes_from_data, sizes_from_inputs};

use crate::registry::{Loaded, build_identity};
use crate::runtime::{DeviceArray, Runtime, backend_error};
use crate::{Error, HostArray, LaunchArgs, Result};

/// One kernel of a launch and its mesh, owned (cloning one clones two `Arc`s).
#[derive(Clone)]
pub struct Call {
    /// The verified kernel.
    pub kernel: Arc<Verified>,
    /// Its mesh, if any.
    pub mesh: Option<Arc<MeshBox>>,
}

impl Call {
    /// `kernel` without a mesh.
    pub fn new(kernel: impl Into<Arc<Verified>>) -> Call {
        Call { kernel: kernel.into(), mesh: None }
    }

    /// `kernel` on `mesh`.
    pub fn on(kernel: impl Into<Arc<Verified>>, mesh: impl Into<Arc<MeshBox>>) -> Call {
        Call { kernel: kernel.into(), mesh: Some(mesh.into()) }
    }
}

/// What one launch runs: kernels with their meshes, external meshes, `dyn` grid sizes. Owned
/// and immutable; a clone shares it.
#[derive(Clone)]
pub struct Launch(Arc<Spec>);

struct Spec {
    calls: Vec<Call>,
    externals: Vec<Arc<MeshBox>>,
    grid: BTreeMap<String, u64>,
    /// The request text of several kernels, joined once (one kernel's is its own, kept by its
    /// `Verified`).
    joined: Option<String>,
}

impl Launch {
    /// A launch of `calls` with `externals` and `grid`.
    pub fn new(
        calls: impl IntoIterator<Item = Call>,
        externals: impl IntoIterator<Item = Arc<MeshBox>>,
        grid: BTreeMap<String, u64>,
    ) -> Launch {
        let calls: Vec<Call> = calls.into_iter().collect();
        let joined = (calls.len() != 1).then(|| calls.iter().map(|c| c.kernel.text()).collect::<Vec<_>>().join("\n"));
        Launch(Arc::new(Spec { calls, externals: externals.into_iter().collect(), grid, joined }))
    }

    /// `calls` with no external mesh and no `dyn` grid sizes.
    pub fn kernels(calls: impl IntoIterator<Item = Call>) -> Launch {
        Launch::new(calls, [], BTreeMap::new())
    }

    /// One kernel without a mesh.
    pub fn one(kernel: impl Into<Arc<Verified>>) -> Launch {
        Launch::kernels([Call::new(kernel)])
    }

    /// The kernels, in launch order, with their meshes.
    pub fn calls(&self) -> &[Call] {
        &self.0.calls
    }

    /// The external meshes (devices around the launch).
    pub fn externals(&self) -> &[Arc<MeshBox>] {
        &self.0.externals
    }

    /// The size of each `dyn` grid axis, by name.
    pub fn grid(&self) -> &BTreeMap<String, u64> {
        &self.0.grid
    }

    /// The request text: every kernel's canonical text.
    fn source(&self) -> &str {
        match (&self.0.joined, self.0.calls.as_slice()) {
            (Some(joined), _) => joined,
            (None, [one]) => one.kernel.text(),
            (None, _) => unreachable!("several kernels' text is joined"),
        }
    }

    /// The same launch with more grid sizes.
    fn with_sizes(&self, sizes: BTreeMap<String, u64>) -> Launch {
        let mut grid = self.0.grid.clone();
        grid.extend(sizes);
        Launch(Arc::new(Spec {
            grid,
            calls: self.0.calls.clone(),
            externals: self.0.externals.clone(),
            joined: self.0.joined.clone(),
        }))
    }

    /// Builds the boundary's view of the launch (borrowing everything) and hands it to `f`.
    fn request<T>(&self, f: impl FnOnce(&LaunchRequest<'_>) -> T) -> T {
        let calls: Vec<KernelCall<'_>> = (self.calls().iter())
            .map(|c| KernelCall {
                kernel: RStr::from_str(c.kernel.name()),
                mesh: c.mesh.as_deref().map_or(ROption::RNone, ROption::RSome),
            })
            .collect();
        let externals: Vec<&MeshBox> = self.externals().iter().map(|m| &**m).collect();
        let sizes: Vec<GridSize<'_>> =
            self.grid().iter().map(|(axis, &size)| GridSize { axis: RStr::from_str(axis), size }).collect();
        f(&LaunchRequest {
            ir_format: IR_FORMAT_VERSION,
            source: RStr::from_str(self.source()),
            calls: RSlice::from_slice(&calls),
            external_meshes: RSlice::from_slice(&externals),
            grid: RSlice::from_slice(&sizes),
        })
    }
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kernels: Vec<&str> = self.calls().iter().map(|c| c.kernel.name()).collect();
        (f.debug_struct("Launch"))
            .field("kernels", &kernels)
            .field("meshes", &self.calls().iter().filter(|c| c.mesh.is_some()).count())
            .field("externals", &self.externals().len())
            .field("grid", self.grid())
            .finish()
    }
}

/// Which backend a launch is planned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<'n> {
    /// `TESSEL_BACKEND` if set, else the first of [`Runtime::ranked`] that takes it.
    Auto,
    /// This one.
    Named(&'n str),
}

impl<'n> Choice<'n> {
    /// `auto` or a backend's name.
    pub fn of(name: &'n str) -> Choice<'n> {
        if name == "auto" { Choice::Auto } else { Choice::Named(name) }
    }
}

/// What planning decided, and the launch it decided for: owned and cheap to clone, kept by
/// callers that launch the same thing again ([`Runtime::resume`]).
#[derive(Clone, Debug)]
pub struct Plan {
    backend: Arc<str>,
    decisions: Arc<[String]>,
    launch: Launch,
}

impl Plan {
    /// The backend chosen.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// One line per backend asked: why it was skipped, or that it was chosen.
    pub fn decisions(&self) -> &[String] {
        &self.decisions
    }

    /// The launch planned.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }
}

/// A launch a backend has accepted.
pub struct Planned<'r> {
    b: &'r Loaded,
    plan: Plan,
    /// Set once the backend has said it is available: every launch asks first (a backend
    /// named by the caller is planned, and lowers, without a device), once per `Planned`.
    available: OnceLock<()>,
}

impl Runtime {
    /// Plans `launch` on the backend `choice` names, or under `auto` on the first available one
    /// (by [`Runtime::ranked`]) whose `supports` says yes. The only caller of `supports`: each
    /// backend asked is asked once. `TESSEL_BACKEND` overrides `auto`. A backend named is planned
    /// whether or not it is available (lowering needs no device); a launch on one that is not is
    /// refused with its reason.
    pub fn plan(&self, choice: Choice<'_>, launch: &Launch) -> Result<Planned<'_>> {
        let ask = |b: &Loaded| launch.request(|req| b.backend.supports(req).into_result());
        let forced = std::env::var("TESSEL_BACKEND").ok().filter(|f| !f.is_empty());
        // Under `auto`, the backend chosen has just said it is available.
        let (b, decisions, available) = match (choice, forced.as_deref()) {
            (Choice::Named(name), _) | (Choice::Auto, Some(name)) => {
                let b = self.backend(name)?;
                ask(b).map_err(|e| backend_error(b, e))?;
                let why = if choice == Choice::Auto { "chosen by TESSEL_BACKEND" } else { "chosen by name" };
                (b, vec![format!("{name}: {why}")], OnceLock::new())
            }
            (Choice::Auto, None) => {
                let mut lines = Vec::new();
                let ranked = self.ranked();
                let mut chosen = None;
                for (n, (b, a)) in ranked.iter().enumerate() {
                    if !a.available {
                        lines.push(format!("{}: skipped, unavailable: {}", b.name, a.reason));
                        continue;
                    }
                    match ask(b) {
                        Ok(()) => {
                            // A software device ranks below the CPU: say so where one is passed over.
                            if a.class == DeviceClass::Cpu {
                                for (later, l) in
                                    ranked[n + 1..].iter().filter(|(_, l)| l.available && l.class == DeviceClass::Software)
                                {
                                    lines.push(format!(
                                        "{}: skipped, software device ({}): the CPU is faster here; --backend {} to use it",
                                        later.name, l.reason, later.name
                                    ));
                                }
                            }
                            lines.push(format!("{}: chosen ({})", b.name, a.reason));
                            chosen = Some(*b);
                            break;
                        }
                        // The refusal's hint lines stay, indented under it: they say what would work.
                        Err(e) => lines.push(format!(
                            "{}: skipped, refuses the launch: {}",
                            b.name,
                            e.to_string().lines().map(str::trim).collect::<Vec<_>>().join("\n      ")
                        )),
                    }
                }
                (chosen.ok_or_else(|| Error::NoBackend { reasons: lines.join("\n  ") })?, lines, OnceLock::from(()))
            }
        };
        let plan = Plan { backend: b.name.as_str().into(), decisions: decisions.into(), launch: launch.clone() };
        Ok(Planned { b, plan, available })
    }

    /// A launch planned before ([`Planned::into_plan`]: the plan holds its launch), not asked
    /// again: a launch found in the backend's compile cache costs no planning; one that is not
    /// there is planned (and may still be refused) when it is compiled, as any launch is.
    pub fn resume(&self, plan: Plan) -> Result<Planned<'_>> {
        Ok(Planned { b: self.backend(&plan.backend)?, plan, available: OnceLock::new() })
    }
}

/// Arrays of a launch on memory the caller owns ([`Planned::launch_in_place`]).
#[derive(Debug, Default)]
pub struct InPlace<'a> {
    /// Inputs by name, read where they are.
    pub inputs: BTreeMap<String, BytesRef<'a>>,
    /// Outputs by name, each the caller's memory of the output's type; every element is written.
    pub outputs: BTreeMap<String, BytesMut<'a>>,
    /// The size of each `dyn` grid axis, by name (ignored by [`Planned`], whose launch has them).
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
    /// Whether `bytes` hold the output's starting contents (XLA's buffer of the input it
    /// aliases: Pallas's `input_output_aliases`), which an element no program stores keeps and
    /// a load sees until a store; else the output starts as zeros.
    pub keep: bool,
}

/// What [`Planned::run`] did: its outputs and the report shared launch code logs.
#[derive(Debug)]
pub struct Report {
    /// Every output of every kernel, in launch order.
    pub outputs: Vec<(String, HostArray)>,
    /// The backend that ran it.
    pub backend: String,
    /// One line per backend `auto` tried: why it was skipped, or that it was chosen.
    pub decisions: Vec<String>,
    /// Time to compile (zero when the backend's compile cache had it), from the backend's
    /// cache counters.
    pub compile: Duration,
    /// Time of the launch itself, less the compile: uploads, run, downloads.
    pub run: Duration,
    /// Whether the backend's in-memory compile cache held the launch already.
    pub cache_hit: bool,
}

impl Planned<'_> {
    /// The backend chosen.
    pub fn backend(&self) -> &str {
        &self.plan.backend
    }

    /// One line per backend asked: why it was skipped, or that it was chosen.
    pub fn decisions(&self) -> &[String] {
        &self.plan.decisions
    }

    /// The decision, to keep for [`Runtime::resume`].
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The owned decision, for [`Runtime::resume`].
    pub fn into_plan(self) -> Plan {
        self.plan
    }

    fn request<T>(&self, f: impl FnOnce(&LaunchRequest<'_>) -> T) -> T {
        self.plan.launch.request(f)
    }

    /// `Ok` if the backend is available (asked once): a launch on one that is not is refused
    /// with its reason, never handed to it.
    fn check_available(&self) -> Result<()> {
        if self.available.get().is_none() {
            crate::runtime::ensure_available(self.b)?;
            let _ = self.available.set(());
        }
        Ok(())
    }

    /// Has the backend start, off this thread, what the first launch would otherwise do inside
    /// it (compile, set up): for callers with work of their own before launching (making
    /// inputs, XLA compiling around a call). Does nothing where the backend is unavailable or
    /// has nothing to start; a launch never depends on it.
    pub fn warm_up(&self) {
        if self.check_available().is_ok() {
            self.request(|req| self.b.backend.warm_up(req));
        }
    }

    fn fail(&self) -> impl Fn(BackendError) -> Error + '_ {
        |e| backend_error(self.b, e)
    }

    /// Each stage of the lowering (name, text), through the on-disk cache of lowered text (see
    /// [`crate::cache`]); whether that cache had it.
    pub fn lower_cached(&self) -> Result<(Vec<(String, String)>, crate::cache::Outcome)> {
        let b = self.b;
        self.request(|req| {
            // The build as well as the version: a rebuilt backend of the same version may lower
            // differently, and must not read what its predecessor wrote.
            let version = format!("{} {}", b.backend.version(), build_identity(&b.source));
            let key = cache_key(&b.name, &version, &b.backend.options(), req);
            crate::cache::lowered(&key, || {
                let stages = b.backend.lower(req).into_result()?;
                Ok(stages.into_iter().map(|s| (s.name.into_string(), s.text.into_string())).collect())
            })
        })
        .map_err(self.fail())
    }

    /// Each stage of the lowering (name, text).
    pub fn lower(&self) -> Result<Vec<(String, String)>> {
        self.lower_cached().map(|(stages, _)| stages)
    }

    /// Every decision the backend's plan made, as the backend prints it (`tessel lower --plan`):
    /// the plan `supports` made and kept, no device.
    pub fn plan_text(&self) -> Result<String> {
        self.request(|req| self.b.backend.lower_plan(req).into_result()).map(|t| t.into_string()).map_err(self.fail())
    }

    /// Runs the launch and returns every output of every kernel (in launch order, each name
    /// once): [`Planned::launch_in_place`] on the inputs' memory and on fresh output arrays.
    pub fn launch(&self, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>> {
        self.check_available()?;
        let kernels = self.plan.launch.calls();
        // Every kernel's inputs must be given; names are shared across the kernels of a launch.
        for k in kernels {
            check_inputs(k.kernel.kernel(), &args.inputs, kernels.len() == 1)?;
        }
        let verified: Vec<&Verified> = kernels.iter().map(|k| &*k.kernel).collect();
        crate::memory::outputs_fit(&verified)?;
        let mut outputs: Vec<(String, HostArray)> = Vec::new();
        for k in kernels {
            for p in k.kernel.kernel().params_of(ParamKind::Out) {
                if !outputs.iter().any(|(n, _)| *n == p.name) {
                    outputs.push((p.name.clone(), HostArray::zeros(p.ty.dtype, &p.ty.shape)));
                }
            }
        }
        let input_bytes: Vec<(&String, Type, Cow<'_, [u8]>)> =
            args.inputs.iter().map(|(n, a)| (n, a.ty(), a.le_bytes())).collect();
        // `bool` arrays are not bytes in place: they are written into bytes and converted after.
        let mut bool_bytes: BTreeMap<String, Vec<u8>> =
            outputs.iter().filter(|(_, a)| a.dtype() == DType::Bool).map(|(n, a)| (n.clone(), vec![0u8; a.len()])).collect();
        let types: Vec<Type> = outputs.iter().map(|(_, a)| a.ty()).collect();
        {
            let mut in_place = InPlace {
                inputs: input_bytes.iter().map(|(n, ty, b)| ((*n).clone(), BytesRef { ty: ty.clone(), bytes: b })).collect(),
                outputs: BTreeMap::new(),
                grid: BTreeMap::new(),
            };
            let mut bool_slots: BTreeMap<&str, &mut Vec<u8>> = bool_bytes.iter_mut().map(|(n, b)| (n.as_str(), b)).collect();
            for ((name, array), ty) in outputs.iter_mut().zip(types) {
                let bytes = match array.le_bytes_mut() {
                    Some(b) => b,
                    None => bool_slots.remove(name.as_str()).expect("bool outputs have bytes").as_mut_slice(),
                };
                in_place.outputs.insert(name.clone(), BytesMut { ty, bytes, keep: false });
            }
            self.launch_in_place(&mut in_place)?;
        }
        for (name, array) in &mut outputs {
            if let Some(bytes) = bool_bytes.get(name.as_str()) {
                *array = HostArray::from_le_bytes(DType::Bool, &array.shape, bytes).expect("one byte per element");
            }
        }
        Ok(outputs)
    }

    /// The launch on memory the caller owns: inputs read where they are, outputs written into the
    /// caller's arrays. A backend that computes in host memory (the interpreter) reads the inputs
    /// in place and writes the outputs once; a device backend uploads from them and downloads
    /// into them, one copy each way.
    pub fn launch_in_place(&self, args: &mut InPlace<'_>) -> Result<()> {
        self.check_available()?;
        // Grid sizes from the inputs (`dyn(n)`): where they are not the planned ones the launch
        // with them is another request, which the backend plans when it compiles it (once, and
        // refused there with its reason, as any launch it has not planned); where one is 0 no
        // program runs and the outputs are zeros.
        let launch = &self.plan.launch;
        let sized = launch.calls().iter().filter(|k| sizes_from_data(k.kernel.kernel()));
        let mut grid: BTreeMap<String, u64> = BTreeMap::new();
        for k in sized.clone() {
            grid.extend(sizes_from_inputs(k.kernel.kernel(), |n| {
                args.inputs.get(n).and_then(|a| scalar_value(a.ty.dtype, a.bytes))
            }));
        }
        if grid.iter().any(|(axis, size)| launch.grid().get(axis) != Some(size)) {
            if sized
                .flat_map(|k| k.kernel.kernel().grid.iter().flatten())
                .any(|a| a.from.is_some() && grid.get(&a.name) == Some(&0))
            {
                args.outputs.values_mut().for_each(|o| o.bytes.fill(0));
                return Ok(());
            }
            let plan = Plan { launch: launch.with_sizes(grid), ..self.plan.clone() };
            let planned = Planned { b: self.b, plan, available: OnceLock::from(()) };
            return planned.launch_in_place(args);
        }
        let b = self.b;
        let kernels = launch.calls();
        let fail = self.fail();
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
        self.request(|req| {
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
                    keep: a.keep,
                })
                .collect();
            let ran = b
                .backend
                .launch_host(req, RSlice::from_slice(&inputs), RSliceMut::from_mut_slice(&mut outputs))
                .into_result()
                .map_err(&fail)?;
            if ran {
                return Ok(());
            }
            let mut outputs: BTreeMap<&str, &mut HostOutput<'_>> = outputs.iter_mut().map(|o| (o.name.as_str(), o)).collect();
            // Inputs, and outputs that start from their memory's contents, go to the device.
            // (Whether the buffer keeps what was uploaded: an output's starting contents.)
            let upload = |name: &str, id: u64, outputs: &BTreeMap<&str, &mut HostOutput<'_>>| match outputs.get(name) {
                None => b.backend.upload(id, lend(name)).into_result().map(|()| false),
                Some(o) if o.keep => {
                    let a = RArrayRef {
                        dtype: o.array.dtype,
                        shape: o.array.shape,
                        bytes: RSlice::from_slice(o.array.bytes.as_slice()),
                    };
                    b.backend.upload(id, a).into_result().map(|()| true)
                }
                Some(_) => Ok(false),
            };
            with_buffers(b, req, kernels, &mut outputs, upload, |outputs, name, id| {
                let o = outputs.get_mut(name).expect("every output has an array (checked above)");
                let into = RArrayMut {
                    dtype: o.array.dtype,
                    shape: o.array.shape,
                    bytes: RSliceMut::from_mut_slice(o.array.bytes.as_mut_slice()),
                };
                b.backend.download_into(id, into).into_result().map_err(&fail)
            })
            .map(drop)
        })
    }

    /// The launch on arrays already in the backend's memory, bound by argument name; outputs are
    /// written in place. Nothing is copied between host and device. With `timed`, how long its
    /// dispatches took on the device's own clock (GPU timestamp queries), or `None` where the
    /// backend cannot tell.
    pub fn launch_resident(&self, arrays: &[(&str, &DeviceArray)], timed: bool) -> Result<Option<Duration>> {
        self.check_available()?;
        let b = self.b;
        for k in self.plan.launch.calls() {
            // A grid size from data must be given: the data is on the device.
            let mut grid = k.kernel.kernel().grid.iter().flatten();
            if let Some(a) = grid.find(|a| a.from.is_some() && !self.plan.launch.grid().contains_key(&a.name)) {
                return Err(Error::Backend {
                    backend: b.name.clone(),
                    kind: ErrorKind::InvalidInput,
                    message: format!(
                        "kernel `{}`: grid axis `{}` takes its size from input `{}`, which is on the device\n  give the size with the launch's grid (`--grid {}=N`), or launch from host arrays",
                        k.kernel.name(),
                        a.name,
                        a.from.as_deref().unwrap_or_default(),
                        a.name
                    ),
                });
            }
            for p in k.kernel.kernel().params.iter().filter(|p| p.kind != ParamKind::Scratch) {
                let bound = arrays.iter().find(|(n, _)| *n == p.name).map(|(_, a)| a);
                let message = match bound {
                    None => format!("kernel `{}`: no array is bound to argument `{}` ({})", k.kernel.name(), p.name, p.ty),
                    Some(a) if a.backend != b.name || a.ty != p.ty => format!(
                        "kernel `{}`: argument `{}` is {} on {}, but the array bound to it is {} on {}",
                        k.kernel.name(),
                        p.name,
                        p.ty,
                        b.name,
                        a.ty,
                        a.backend
                    ),
                    Some(_) => continue,
                };
                return Err(Error::Backend { backend: b.name.clone(), kind: ErrorKind::InvalidInput, message });
            }
        }
        let args: Vec<BufferArg<'_>> =
            arrays.iter().map(|(n, a)| BufferArg { name: RStr::from_str(n), buffer: a.id, keep: false }).collect();
        let args = RSlice::from_slice(&args);
        self.request(|req| {
            let r = if timed {
                b.backend.launch_timed(req, args).into_result().map(|ns| ns.into_option().map(Duration::from_nanos))
            } else {
                b.backend.launch(req, args).into_result().map(|()| None)
            };
            r.map_err(self.fail())
        })
    }

    /// The launch enqueued on memory and a stream another runtime owns (XLA's, inside `jax.jit`
    /// on a GPU): `stream` is a stream of the backend's device API (a `CUstream` for
    /// mosaic-gpu); `args` gives each `in` and `out` argument's device address, and for an output
    /// whether its memory holds its starting contents (an aliased input's). Returns once the
    /// work is enqueued: nothing is copied or waited for. An `Unsupported` error where the
    /// backend does not launch so (every backend but mosaic-gpu): stage the arrays through host
    /// memory and [`Planned::launch_in_place`] instead.
    ///
    /// # Safety
    /// `stream` is live; each address is memory of that stream's device holding its argument's
    /// type as the backend lays it out (mosaic-gpu: 2 bytes an element for 16-bit floats, 4 for
    /// 32-bit types), not written by anyone else until the stream reaches the launch's end.
    #[allow(unsafe_code, reason = "device addresses another runtime owns")]
    pub unsafe fn launch_external(&self, stream: u64, args: &[DeviceArg<'_>]) -> Result<()> {
        self.check_available()?;
        // SAFETY: as the caller promises.
        self.request(|req| unsafe { self.b.backend.launch_external(req, stream, RSlice::from_slice(args)) }.into_result())
            .map_err(self.fail())
    }

    /// [`Planned::launch`], reporting what ran where, why, and how long compiling (from the
    /// backend's cache counters) and running took.
    pub fn run(&self, args: &LaunchArgs) -> Result<Report> {
        let mut outputs = Vec::new();
        let mut report = self.timed(|| {
            outputs = self.launch(args)?;
            Ok(())
        })?;
        report.outputs = outputs;
        Ok(report)
    }

    /// [`Planned::run`] on memory the caller owns ([`Planned::launch_in_place`]): the report's
    /// `outputs` are empty, the caller's arrays hold them.
    pub fn run_in_place(&self, args: &mut InPlace<'_>) -> Result<Report> {
        self.timed(|| self.launch_in_place(args))
    }

    fn timed(&self, launch: impl FnOnce() -> Result<()>) -> Result<Report> {
        let before = self.b.backend.cache_stats();
        let start = Instant::now();
        launch()?;
        let took = start.elapsed();
        let after = self.b.backend.cache_stats();
        let compile = Duration::from_nanos(after.compile_ns.saturating_sub(before.compile_ns));
        Ok(Report {
            outputs: Vec::new(),
            backend: self.plan.backend.to_string(),
            decisions: self.plan.decisions.to_vec(),
            compile,
            run: took.saturating_sub(compile),
            cache_hit: after.misses == before.misses,
        })
    }
}

/// Allocates a buffer per argument of `kernels` (each name once), hands each to `upload` (which
/// fills the inputs, and the outputs that start from given contents), launches, hands every
/// output to `finish` (launch order), and frees every buffer. `state` is lent to both.
fn with_buffers<S, T>(
    b: &Loaded,
    req: &LaunchRequest<'_>,
    kernels: &[Call],
    state: &mut S,
    upload: impl Fn(&str, u64, &S) -> std::result::Result<bool, BackendError>,
    mut finish: impl FnMut(&mut S, &str, u64) -> Result<T>,
) -> Result<Vec<(String, T)>> {
    let fail = |e: BackendError| backend_error(b, e);
    let mut bound: Vec<(String, u64)> = Vec::new();
    let mut keeps: Vec<bool> = Vec::new();
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
                let keep = upload(&p.name, id, state).map_err(fail)?;
                if p.kind != ParamKind::In {
                    outputs.push(p.name.clone());
                }
                keeps.push(keep);
            }
        }
        let buffer_args: Vec<BufferArg<'_>> =
            bound.iter().zip(&keeps).map(|((n, id), &keep)| BufferArg { name: RStr::from_str(n), buffer: *id, keep }).collect();
        b.backend.launch(req, RSlice::from_slice(&buffer_args)).into_result().map_err(fail)?;
        outputs
            .iter()
            .map(|name| {
                let id = bound.iter().find(|(n, _)| n == name).map(|(_, id)| *id).expect("outputs are bound");
                Ok((name.clone(), finish(state, name, id)?))
            })
            .collect::<Result<Vec<_>>>()
    })();
    for (_, id) in &bound {
        // A buffer that cannot be freed is the backend's problem; the launch result stands.
        let _ = b.backend.free(*id);
    }
    result
}
