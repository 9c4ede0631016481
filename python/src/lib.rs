//! The `tessel` Python module (`tessel._tessel`; the package `python/tessel` around it holds the
//! exception classes and the type stubs). A thin layer over the host crate's [`Runtime`]: kernels
//! load, verify, lower and launch exactly as `tessel run` does them, numpy arrays are the inputs
//! and outputs, and every error is one of `tessel._errors`' exceptions carrying the command
//! line's message. The GIL is released while a kernel compiles and runs.

// The `tessel` command's allocator (`tessel::alloc`): the interpreter's programs make and drop
// small vectors all the time, which mimalloc's thread caches take at a fraction of glibc's cost.
// Only Rust's own allocations go through it: numpy and Python keep their allocators.
#[global_allocator]
static ALLOCATOR: tessel::alloc::Allocator = tessel::alloc::Allocator;

mod arrays;
mod ffi;
mod interrupt;
mod runtimes;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use numpy::PyArrayMethods;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tessel::{BytesMut, BytesRef, Call, Error, InPlace, KernelFile, Report, Runtime};
use tessel_plugin_api::abi::ErrorKind;
use tessel_plugin_api::ir::generic::Generic;
use tessel_plugin_api::ir::size::SizeExpr;
use tessel_plugin_api::ir::{ArgDecl, ParamKind, Type, Verified};
use tessel_plugin_api::launch::MAX_AXIS_SIZE;
use tessel_plugin_api::clip::clip;
use tessel_plugin_api::kept::Kept;

use arrays::{Lent, fresh_outputs, lend, numpy_name};
use interrupt::interruptible;
use runtimes::runtime;

/// What the module raises: a tessel error, an input refused here, or a panic.
enum Failure {
    Tessel(Error),
    Input(String),
    Kernel(String),
    Panic(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Tessel(e)
    }
}

/// The exception of `tessel._errors` that `f` calls for, with the CLI's message.
fn raise(py: Python<'_>, f: Failure) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let errors = py.import("tessel._errors")?;
        let class = |name: &str| errors.getattr(name);
        let err = match f {
            Failure::Input(m) => PyErr::from_value(class("InputError")?.call1((m,))?),
            Failure::Kernel(m) => PyErr::from_value(class("KernelError")?.call1((m,))?),
            Failure::Panic(m) => PyErr::from_value(class("TesselError")?.call1((format!("tessel panicked: {m}"),))?),
            Failure::Tessel(e) => {
                let message = e.to_string();
                let (name, backend) = match &e {
                    Error::Kernel(_)
                    | Error::UnknownKernel { .. }
                    | Error::AmbiguousKernel { .. }
                    | Error::Read { .. }
                    | Error::TooLarge { .. } => ("KernelError", None),
                    Error::Launch(_)
                    | Error::Bind(_)
                    | Error::Npy { .. }
                    | Error::BadFlag { .. }
                    | Error::Mesh(_)
                    | Error::NoMeshMaker { .. }
                    | Error::UnknownBackend { .. } => ("InputError", None),
                    Error::Backend { backend, kind, .. } => match kind {
                        ErrorKind::Unsupported => ("UnsupportedError", Some(backend.clone())),
                        ErrorKind::Unavailable => ("BackendUnavailable", Some(backend.clone())),
                        ErrorKind::InvalidInput => ("InputError", None),
                        _ => ("TesselError", None),
                    },
                    Error::NoBackend { .. } => ("BackendUnavailable", None),
                    _ => ("TesselError", None),
                };
                let value = match name {
                    "UnsupportedError" => {
                        // The first line is the backend's sentence; the rest says what would work.
                        let hint = message.split_once('\n').map(|(_, h)| h.trim().to_string()).filter(|h| !h.is_empty());
                        class(name)?.call1((message.clone(), backend, hint))?
                    }
                    "BackendUnavailable" => class(name)?.call1((message.clone(), backend))?,
                    _ => class(name)?.call1((message.clone(),))?,
                };
                PyErr::from_value(value)
            }
        };
        Ok(err)
    };
    build().unwrap_or_else(|e| e)
}

/// Runs `f` without the GIL; a panic inside becomes a [`Failure::Panic`]. What `f` warned of
/// ([`warn_later`]) is then a Python `UserWarning`, as the CLI's `warning:` lines.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    let r = py.detach(|| match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Failure::Panic(panic_message(&*p))),
    });
    for w in WARNINGS.with_borrow_mut(std::mem::take) {
        let text = std::ffi::CString::new(w.replace('\0', " ")).expect("no NUL left");
        PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyUserWarning>(), &text, 1)?;
    }
    r.map_err(|f| raise(py, f))
}

thread_local! {
    /// Warnings of the work [`detached`] runs on this thread, raised when it returns.
    static WARNINGS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A warning for the Python caller of the [`detached`] work running on this thread.
fn warn_later(warning: String) {
    WARNINGS.with_borrow_mut(|w| w.push(warning));
}

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// A kernel: load one with `tessel.load(path)` or `tessel.compile(text)`, call it with numpy
/// arrays by argument name. A generic kernel (language §9) is specialized for each call's shapes
/// and `params`; its specializations are kept.
#[pyclass(frozen, module = "tessel", name = "Kernel")]
struct Kernel {
    file: Arc<KernelFile>,
    index: usize,
    /// Specializations by their parameter values (`{}` for a kernel without parameters).
    specialized: Kept<BTreeMap<String, i64>, Arc<Verified>>,
    /// Each launch's plan (the backend's acceptance, asked once) by what decides it.
    plans: Kept<PlanKey, tessel::Plan>,
}

/// What decides a launch's plan: the runtime's generation (a plugin loaded since makes a new
/// one), the parameter values, the backend asked, the mesh and external meshes as written and
/// the grid.
type PlanKey = (u64, BTreeMap<String, i64>, String, Option<String>, Vec<String>, BTreeMap<String, u64>);

/// Bumped by every `load_plugin`: plans kept for the runtime before it are not used after.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most specializations one kernel keeps.
const KEPT: usize = 64;

/// What a launch did: its outputs, the backend that ran it and why, and its times.
#[pyclass(frozen, module = "tessel", name = "RunResult")]
struct RunResult {
    /// Output name -> numpy array.
    #[pyo3(get)]
    outputs: Py<PyDict>,
    /// The backend that ran it.
    #[pyo3(get)]
    backend: String,
    /// One line per backend `auto` tried: why it was skipped, or that it was chosen.
    #[pyo3(get)]
    decisions: Vec<String>,
    /// Seconds to lower (0 when the compile cache had it).
    #[pyo3(get)]
    compile_s: f64,
    /// Seconds of the launch: uploads, run, downloads.
    #[pyo3(get)]
    run_s: f64,
    /// Whether the backend's compile cache held the launch already.
    #[pyo3(get)]
    cache_hit: bool,
    /// The values the kernel's parameters took (from the arrays, `params`, a tuning record of
    /// the backend named, or the defaults); empty for a kernel without parameters.
    #[pyo3(get)]
    params: BTreeMap<String, i64>,
}

#[pymethods]
impl RunResult {
    fn __repr__(&self, py: Python<'_>) -> String {
        let names: Vec<String> = self.outputs.bind(py).keys().iter().map(|k| k.to_string()).collect();
        let hit = if self.cache_hit { "True" } else { "False" };
        format!("RunResult(backend={:?}, outputs=[{}], cache_hit={hit})", self.backend, names.join(", "))
    }
}

/// The launch arguments every call takes besides the arrays (named apart from `tessel::Launch`,
/// which these become once the meshes are made).
struct LaunchOptions<'a> {
    backend: &'a str,
    mesh: Option<String>,
    external_meshes: Vec<String>,
    grid: BTreeMap<String, u64>,
    params: BTreeMap<String, i64>,
}

impl Kernel {
    /// The kernel of `file` called `name` (or its only one), verified with its defaults where it
    /// has them all, so that errors show at load.
    fn new(py: Python<'_>, file: KernelFile, name: Option<&str>, what: &str) -> PyResult<Kernel> {
        let names = || file.kernels().iter().map(Generic::name).collect::<Vec<_>>().join(", ");
        let index = match name {
            Some(n) => file.kernels().iter().position(|k| k.name() == n).ok_or_else(|| {
                raise(py, Failure::Kernel(format!("{what} has no kernel `{n}`\n  its kernels are: {}", names())))
            })?,
            None if file.kernels().len() == 1 => 0,
            None => {
                let m = format!("{what} defines several kernels: {}\n  choose one with kernel=\"NAME\"", names());
                return Err(raise(py, Failure::Kernel(m)));
            }
        };
        let k =
            Kernel { file: Arc::new(file), index, specialized: Kept::new(KEPT), plans: Kept::new(KEPT) };
        if k.generic().params().iter().all(|p| p.default.is_some()) {
            detached(py, || k.specialize(&BTreeMap::new(), &BTreeMap::new(), "auto").map(drop))?;
        }
        Ok(k)
    }

    fn generic(&self) -> &Generic {
        &self.file.kernels()[self.index]
    }

    /// The kernel specialized for `inputs` with `given` values, and for a backend named (not
    /// "auto") the values of its tuning record (from the kept ones where it was before).
    fn specialize(
        &self,
        given: &BTreeMap<String, i64>,
        shapes: &BTreeMap<String, Vec<usize>>,
        backend: &str,
    ) -> Result<(Arc<Verified>, BTreeMap<String, i64>), Failure> {
        // Without a backend named, no tuning record applies and no runtime is needed yet.
        let binding = match backend {
            "auto" => self.generic().bind(given, &BTreeMap::new(), shapes).map_err(Error::from)?,
            b => {
                let (binding, tuned) = runtime(b)?.bind(self.generic(), given, shapes, Some(b))?;
                tuned.warning.into_iter().for_each(warn_later);
                binding
            }
        };
        let v = self.specialized.get_or_try_insert(binding.values.clone(), || Ok::<_, Error>(Arc::new(self.file.specialize(self.generic(), &binding)?)))?;
        Ok((v, binding.values))
    }

    fn args_of(&self, kind: ParamKind) -> impl Iterator<Item = &ArgDecl> {
        self.generic().args().iter().filter(move |a| a.kind == kind)
    }

    /// The signature of arguments of `kind` as a dict: name -> (dtype, shape tuple), a dimension
    /// that is a parameter expression as its text.
    fn signature<'py>(&self, py: Python<'py>, kind: ParamKind) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for a in self.args_of(kind) {
            let dims: Vec<Bound<'py, PyAny>> = a
                .dims
                .iter()
                .map(|e| match e {
                    SizeExpr::Int(v) => v.into_pyobject(py).map(Bound::into_any).map_err(PyErr::from),
                    e => e.to_string().into_pyobject(py).map(Bound::into_any).map_err(PyErr::from),
                })
                .collect::<PyResult<_>>()?;
            d.set_item(&a.name, (a.dtype.name(), PyTuple::new(py, dims)?))?;
        }
        Ok(d)
    }

    /// The launch options `run` and `lower` take, `grid` and `params` checked.
    fn options<'a, 'py>(
        &self,
        py: Python<'py>,
        backend: &'a str,
        mesh: Option<String>,
        external_meshes: Option<Vec<String>>,
        grid: Option<Bound<'py, PyDict>>,
        params: Option<Bound<'py, PyDict>>,
    ) -> PyResult<LaunchOptions<'a>> {
        let (grid, params) = (self.grid_sizes(py, grid)?, self.param_values(py, params)?);
        Ok(LaunchOptions::new(backend, mesh, external_meshes, grid, params))
    }

    /// The sizes of `dyn` grid axes given as `grid={"n": 16}`: each a Python int from 1 to
    /// [`MAX_AXIS_SIZE`] (a `program_id` is an `i32`); anything else is refused naming the axis.
    fn grid_sizes<'py>(&self, py: Python<'py>, grid: Option<Bound<'py, PyDict>>) -> PyResult<BTreeMap<String, u64>> {
        let kernel = self.generic().name();
        let sizes = int_entries(
            py,
            grid,
            |n| (1..=MAX_AXIS_SIZE as i64).contains(&n),
            |key| format!("grid={{...}} of kernel `{kernel}` has the key {key}, not an axis name\n  name each `dyn` axis by a string: grid={{\"n\": 16}}"),
            |axis, size| format!("grid axis `{axis}` of kernel `{kernel}` cannot have size {size}\n  expected an int from 1 to {MAX_AXIS_SIZE}"),
        )?;
        Ok(sizes.into_iter().map(|(axis, n)| (axis, n as u64)).collect())
    }

    /// `params={...}` as the kernel's parameter values, each an int of 64 bits, named in the
    /// message where one is not (a bare `OverflowError` named neither parameter nor kernel).
    fn param_values<'py>(&self, py: Python<'py>, params: Option<Bound<'py, PyDict>>) -> PyResult<BTreeMap<String, i64>> {
        let kernel = self.generic().name();
        int_entries(
            py,
            params,
            |_| true,
            |key| {
                format!(
                    "params={{...}} of kernel `{kernel}` has the key {}, not a parameter name\n  name each parameter by a string: params={{\"B\": 128}}",
                    clip(&key)
                )
            },
            |name, value| {
                format!(
                    "parameter `{}` of kernel `{kernel}` cannot be {}\n  expected an int from {} to {}",
                    clip(name),
                    clip(&value),
                    i64::MIN,
                    i64::MAX
                )
            },
        )
    }

    /// Every `in` argument, lent, refusing missing and unknown names first.
    fn lend_inputs<'py>(&self, py: Python<'py>, arrays: Option<&Bound<'py, PyDict>>) -> PyResult<BTreeMap<String, Lent<'py>>> {
        let name = self.generic().name();
        let given: BTreeMap<String, Bound<'py, PyAny>> = match arrays {
            Some(d) => d.iter().map(|(k, v)| Ok((k.extract::<String>()?, v))).collect::<PyResult<_>>()?,
            None => BTreeMap::new(),
        };
        let ins: Vec<&ArgDecl> = self.args_of(ParamKind::In).collect();
        for g in given.keys() {
            if !ins.iter().any(|p| &p.name == g) {
                let names: Vec<&str> = ins.iter().map(|p| p.name.as_str()).collect();
                return Err(raise(
                    py,
                    Failure::Input(format!("kernel `{name}` has no input `{g}`\n  its inputs are: {}", names.join(", "))),
                ));
            }
        }
        let mut out = BTreeMap::new();
        for p in ins {
            let Some(obj) = given.get(&p.name) else {
                return Err(raise(
                    py,
                    Failure::Input(format!(
                        "kernel `{name}` needs input `{}`: {p}\n  pass it by name: kernel({}=array, ...)",
                        p.name, p.name
                    )),
                ));
            };
            out.insert(p.name.clone(), lend(py, name, p, obj)?);
        }
        Ok(out)
    }

    /// Specializes for the inputs and launches on them where they are, the GIL released, into
    /// fresh numpy arrays: a host-memory backend (the interpreter) reads the inputs in place and
    /// writes each output once; a device backend uploads from them and downloads into the
    /// outputs. Returns the report, the outputs and the parameters' values.
    fn launch<'py>(
        &self,
        py: Python<'py>,
        how: LaunchOptions<'_>,
        inputs: BTreeMap<String, Lent<'py>>,
    ) -> PyResult<(Report, Bound<'py, PyDict>, BTreeMap<String, i64>)> {
        let shapes: BTreeMap<String, Vec<usize>> = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
        let (kernel, values) = detached(py, || self.specialize(&how.params, &shapes, how.backend))?;
        // Refused before numpy allocates them (as `tessel run` refuses): outputs past the memory
        // left would be faulted in by the launch until the kernel's OOM killer ends the process.
        tessel::memory::outputs_fit(&[&kernel]).map_err(|e| raise(py, e.into()))?;
        let outputs = fresh_outputs(py, &kernel)?;
        let readers: Vec<(String, Type, numpy::PyReadonlyArray1<'py, u8>)> = inputs
            .into_iter()
            .map(|(n, a)| Ok((n, Type::array(a.dtype, a.shape), a.bytes.try_readonly()?)))
            .collect::<PyResult<_>>()?;
        let mut writers: Vec<(String, Type, numpy::PyReadwriteArray1<'py, u8>)> =
            outputs.iter().map(|(n, t, _, b)| Ok((n.clone(), t.clone(), b.try_readwrite()?))).collect::<PyResult<_>>()?;
        // The grid goes with the launch planned below, not with the arrays.
        let mut args = InPlace::default();
        for (n, ty, r) in &readers {
            args.inputs.insert(n.clone(), BytesRef { ty: ty.clone(), bytes: r.as_slice()? });
        }
        for (n, ty, w) in &mut writers {
            args.outputs.insert(n.clone(), BytesMut { ty: ty.clone(), bytes: w.as_slice_mut()?, keep: false });
        }
        let report = interruptible(py, || {
            let rt = runtime(how.backend)?;
            // A launch planned before is not asked again (one plan per distinct launch): its
            // plan holds the launch, meshes made and all.
            let key: PlanKey = (
                GENERATION.load(std::sync::atomic::Ordering::Relaxed),
                values.clone(),
                how.backend.to_string(),
                how.mesh.clone(),
                how.external_meshes.clone(),
                how.grid.clone(),
            );
            let planned = match self.plans.get(&key) {
                Some(plan) => rt.resume(plan)?,
                None => {
                    let launch = how.launch(&rt, kernel.clone())?;
                    let planned = rt.plan(tessel::Choice::of(how.backend), &launch)?;
                    self.plans.insert(key, planned.plan().clone());
                    planned
                }
            };
            Ok(planned.run_in_place(&mut args)?)
        })?;
        drop(writers);
        let d = PyDict::new(py);
        for (name, _, arr, _) in outputs {
            d.set_item(name, arr)?;
        }
        Ok((report, d, values))
    }
}

impl<'a> LaunchOptions<'a> {
    /// The launch arguments of `run` and `lower`, each absent one empty.
    fn new(
        backend: &'a str,
        mesh: Option<String>,
        external_meshes: Option<Vec<String>>,
        grid: BTreeMap<String, u64>,
        params: BTreeMap<String, i64>,
    ) -> LaunchOptions<'a> {
        LaunchOptions { backend, mesh, external_meshes: external_meshes.unwrap_or_default(), grid, params }
    }

    /// The launch of `kernel` these options describe, its meshes made by the backend named
    /// (under `auto`, each by the backend that owns its kind), as the command line makes them.
    fn launch(&self, rt: &Runtime, kernel: Arc<Verified>) -> Result<tessel::Launch, Error> {
        let maker = if self.backend == "auto" { "" } else { self.backend };
        let mesh = self.mesh.as_deref().map(|m| rt.mesh(maker, m)).transpose()?;
        let externals = self.external_meshes.iter().map(|m| rt.mesh(maker, m).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
        Ok(tessel::Launch::new([Call { kernel, mesh: mesh.map(Arc::new) }], externals, self.grid.clone()))
    }
}

#[pymethods]
impl Kernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.generic().name()
    }

    /// Its canonical `.tk` text; a generic kernel's keeps its parameters.
    #[getter]
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        if self.generic().is_generic() {
            return Ok(self.generic().template_text().to_string());
        }
        detached(py, || Ok(self.specialize(&BTreeMap::new(), &BTreeMap::new(), "auto")?.0.text().to_string()))
    }

    /// `in` arguments: name -> (dtype name, shape tuple); a generic dimension as its text.
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.signature(py, ParamKind::In)
    }

    /// `out` arguments: name -> (dtype name, shape tuple); a generic dimension as its text.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.signature(py, ParamKind::Out)
    }

    /// Parameters (language §9): name -> default, or None where a launch must give it.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in self.generic().params() {
            d.set_item(&p.name, p.default)?;
        }
        Ok(d)
    }

    /// Runs the kernel on `backend` ("auto": the first that takes it) with its inputs given by
    /// name; returns a dict output name -> numpy array.
    #[pyo3(signature = (*, backend = "auto", **arrays))]
    fn __call__<'py>(&self, py: Python<'py>, backend: &str, arrays: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyDict>> {
        let inputs = self.lend_inputs(py, arrays)?;
        let how = LaunchOptions::new(backend, None, None, BTreeMap::new(), BTreeMap::new());
        Ok(self.launch(py, how, inputs)?.1)
    }

    /// Runs the kernel and reports where and how: `mesh` for the kernel, `external_meshes` around
    /// the launch, `grid` sizes of `dyn` axes, `params` values of its parameters; with `explain`,
    /// prints why the backend was chosen.
    #[pyo3(signature = (*, backend = "auto", mesh = None, external_meshes = None, grid = None, params = None, explain = false, **arrays))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        backend: &str,
        mesh: Option<String>,
        external_meshes: Option<Vec<String>>,
        grid: Option<Bound<'py, PyDict>>,
        params: Option<Bound<'py, PyDict>>,
        explain: bool,
        arrays: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<RunResult> {
        let how = self.options(py, backend, mesh, external_meshes, grid, params)?;
        let inputs = self.lend_inputs(py, arrays)?;
        let (report, outputs, params) = self.launch(py, how, inputs)?;
        if explain {
            let text: String = report.decisions.iter().map(|d| format!("{d}\n")).collect();
            py.import("sys")?.getattr("stderr")?.call_method1("write", (text,))?;
        }
        Ok(RunResult {
            outputs: outputs.unbind(),
            backend: report.backend,
            decisions: report.decisions,
            compile_s: report.compile.as_secs_f64(),
            run_s: report.run.as_secs_f64(),
            cache_hit: report.cache_hit,
            params,
        })
    }

    /// The lowered text (PTX, WGSL) for `backend`, without a device: the stages joined, each
    /// under a `// ---- NAME (BACKEND) ----` line, as `tessel lower` prints them; with `plan`,
    /// the backend's plan instead, as `tessel lower --plan` prints it. A generic kernel takes
    /// `params` and its defaults.
    #[pyo3(signature = (backend = "interpret", *, mesh = None, external_meshes = None, grid = None, params = None, plan = false))]
    #[allow(clippy::too_many_arguments, reason = "Python's keyword arguments")]
    fn lower<'py>(
        &self,
        py: Python<'py>,
        backend: &str,
        mesh: Option<String>,
        external_meshes: Option<Vec<String>>,
        grid: Option<Bound<'py, PyDict>>,
        params: Option<Bound<'py, PyDict>>,
        plan: bool,
    ) -> PyResult<String> {
        let how = self.options(py, backend, mesh, external_meshes, grid, params)?;
        detached(py, move || {
            let kernel = self.specialize(&how.params, &BTreeMap::new(), how.backend)?;
            let rt = runtime(backend)?;
            let launch = how.launch(&rt, kernel.0)?;
            let planned = rt.plan(tessel::Choice::of(backend), &launch)?;
            if plan {
                return Ok(format!("// ---- plan ({}) ----\n{}", planned.backend(), planned.plan_text()?));
            }
            let (stages, backend) = (planned.lower()?, planned.backend());
            Ok(stages.into_iter().map(|(name, text)| format!("// ---- {name} ({backend}) ----\n{text}\n")).collect())
        })
    }

    /// For `tessel.jax.call`: the kernel specialized for inputs of `shapes` (by name) and
    /// `params`, with a backend named (not `auto`) its tuning record's values. Returns its text
    /// and its `in` and `out` arguments in declared order as (name, dtype name, shape).
    #[pyo3(signature = (shapes, params = None, backend = "auto"))]
    fn _specialize<'py>(
        &self,
        py: Python<'py>,
        shapes: BTreeMap<String, Vec<usize>>,
        params: Option<Bound<'py, PyDict>>,
        backend: &str,
    ) -> PyResult<(String, Vec<Signature>, Vec<Signature>)> {
        let params = self.param_values(py, params)?;
        let kernel = detached(py, || {
            let (kernel, _) = self.specialize(&params, &shapes, backend)?;
            let types: BTreeMap<String, Type> = kernel
                .kernel()
                .params_of(ParamKind::In)
                .filter_map(|p| shapes.get(&p.name).map(|s| (p.name.clone(), Type::array(p.ty.dtype, s.clone()))))
                .collect();
            tessel_plugin_api::launch::check_input_types(kernel.kernel(), &types, true).map_err(Error::from)?;
            Ok(kernel)
        })?;
        let sig = |kind| {
            kernel
                .kernel()
                .params_of(kind)
                .map(|p| (p.name.clone(), numpy_name(p.ty.dtype).to_string(), p.ty.shape.clone()))
                .collect()
        };
        Ok((kernel.text().to_string(), sig(ParamKind::In), sig(ParamKind::Out)))
    }

    fn __repr__(&self) -> String {
        let args = |kind| self.args_of(kind).map(|a| format!("{}: {a}", a.name)).collect::<Vec<_>>().join(", ");
        let params = match self.generic().params() {
            [] => String::new(),
            ps => format!("[{}]", ps.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")),
        };
        format!("Kernel({}{params}, in: [{}], out: [{}])", self.generic().name(), args(ParamKind::In), args(ParamKind::Out))
    }
}

/// Every backend, as `tessel backends --json` lists them: a list of dicts (name, source,
/// version, platform, available, reason, capabilities).
#[pyfunction]
fn backends(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let text = detached(py, || Ok(tessel::cli::backends_json(&*runtime("auto")?)))?;
    let report = py.import("json")?.call_method1("loads", (text,))?;
    report.get_item("backends")
}

/// The kernel of a `.tk` file (`kernel`: which, where the file has several).
#[pyfunction]
#[pyo3(signature = (path, kernel = None))]
fn load(py: Python<'_>, path: PathBuf, kernel: Option<&str>) -> PyResult<Kernel> {
    let file = detached(py, || Ok(tessel::read_kernels(&path)?))?;
    Kernel::new(py, file, kernel, &format!("`{}`", path.display()))
}

/// The kernel of `.tk` text (`kernel`: which, where the text has several).
#[pyfunction]
#[pyo3(signature = (text, kernel = None))]
fn compile(py: Python<'_>, text: &str, kernel: Option<&str>) -> PyResult<Kernel> {
    let file = detached(py, || Ok(tessel::parse_kernels("<text>", text)?))?;
    Kernel::new(py, file, kernel, "the text")
}

/// The canonical text of every kernel of `.tk` text (a generic kernel's with its parameters,
/// verified with its defaults where it has them), or `KernelError` with every error.
#[pyfunction]
fn check(py: Python<'_>, text: &str) -> PyResult<String> {
    let all = detached(py, || Ok(tessel::check_source("<text>", text, &BTreeMap::new())?))?;
    Ok(all.into_iter().map(|(t, _)| t).collect::<Vec<_>>().join("\n"))
}

/// Loads a backend plugin (a shared library), as the command line's `--plugin` does.
#[pyfunction]
fn load_plugin(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    detached(py, move || {
        runtimes::load_plugin(path)?;
        GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ffi::forget();
        Ok(())
    })
}

/// The entries of a `{name: int}` dict given to a call (`grid=`, `params=`): each key a str, each
/// value an int or a numpy integer (what `operator.index` takes, never a bool) that `fits`;
/// anything else is an `InputError` with `bad_key(the key's repr)` or `bad_value(name, the
/// value's repr)`.
fn int_entries<'py>(
    py: Python<'py>,
    dict: Option<Bound<'py, PyDict>>,
    fits: impl Fn(i64) -> bool,
    bad_key: impl Fn(String) -> String,
    bad_value: impl Fn(&str, String) -> String,
) -> PyResult<BTreeMap<String, i64>> {
    let mut entries = BTreeMap::new();
    for (key, value) in dict.iter().flat_map(|d| d.iter()) {
        let Ok(name) = key.extract::<String>() else {
            return Err(raise(py, Failure::Input(bad_key(key.repr()?.to_string()))));
        };
        match value.extract::<i64>() {
            Ok(n) if !value.is_instance_of::<pyo3::types::PyBool>() && fits(n) => {
                entries.insert(name, n);
            }
            _ => return Err(raise(py, Failure::Input(bad_value(&name, value.repr()?.to_string())))),
        }
    }
    Ok(entries)
}

/// An argument as `tessel.jax` sees it: name, numpy dtype name, shape.
type Signature = (String, String, Vec<usize>);

/// The XLA FFI handlers as capsules: `tessel_call` (the CPU platform), `tessel_call_cuda` (the
/// CUDA platform), and `tessel_empty` (does nothing: the
/// baseline of the per-call overhead benchmark).
#[pyfunction]
fn _ffi_capsules(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let handlers = [("tessel_call", ffi::handler()), ("tessel_call_cuda", ffi::cuda_handler()), ("tessel_empty", ffi::empty_handler())];
    for (name, ptr) in handlers {
        let ptr = std::ptr::NonNull::new(ptr).expect("a function's address");
        // SAFETY: the address of an `extern "C"` XLA FFI handler of this module, which lives as
        // long as the process (the module is never unloaded).
        #[allow(unsafe_code)]
        let capsule = unsafe { pyo3::types::PyCapsule::new_with_pointer(py, ptr, c"xla._CUSTOM_CALL_TARGET")? };
        d.set_item(name, capsule)?;
    }
    Ok(d)
}

/// The XLA FFI structs as declared here: (C name, size, [(C field, offset)]), for the tests
/// that compare them with jaxlib's header.
#[pyfunction]
fn _ffi_layout() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
    ffi::c_api::layout()
}

/// The handler's counters: calls, prepared-launch cache hits and misses, failures, the most
/// calls that ran at once, and launches by backend.
#[pyfunction]
fn _ffi_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = ffi::stats();
    let d = PyDict::new(py);
    d.set_item("calls", s.calls)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("failures", s.failures)?;
    d.set_item("most_in_flight", s.most_in_flight)?;
    d.set_item("staged", s.staged)?;
    d.set_item("launches", s.launches.into_iter().collect::<BTreeMap<_, _>>())?;
    Ok(d)
}

/// How often this process has parsed kernel text, verified kernels (and kernels a backend
/// derived), and had a backend plan a launch (`tessel_plugin_api::ir::counters`): what the
/// launch-path tests pin.
#[pyfunction]
fn _counts(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = tessel_plugin_api::ir::counters::counts();
    let d = PyDict::new(py);
    d.set_item("parses", c.parses)?;
    d.set_item("verifies", c.verifies)?;
    d.set_item("plans", c.plans)?;
    d.set_item("derived", c.derived)?;
    Ok(d)
}

/// Prepares the launch a `tessel_call` of these attributes makes (at lowering time, so that a
/// refusal is a Python exception then): parsed, verified, its outputs checked against the memory
/// left (`tessel::memory`), its backend chosen (or asked, when named) and kept for the handler.
/// Returns the backend and why.
#[pyfunction]
#[pyo3(signature = (text, backend = "auto", mesh = "", externals = ""))]
fn _ffi_prepare(py: Python<'_>, text: &str, backend: &str, mesh: &str, externals: &str) -> PyResult<(String, Vec<String>)> {
    detached(py, || {
        let p = ffi::prepared(&*runtime(backend)?, text, backend, mesh, externals)?;
        Ok((p.plan.backend().to_string(), p.plan.decisions().to_vec()))
    })
}

#[pymodule]
fn _tessel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Kernel>()?;
    m.add_class::<RunResult>()?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(_ffi_capsules, m)?)?;
    m.add_function(wrap_pyfunction!(_ffi_layout, m)?)?;
    m.add_function(wrap_pyfunction!(_ffi_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_ffi_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(_counts, m)?)?;
    Ok(())
}
