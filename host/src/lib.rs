//! tessel: write a block-level kernel once, launch it on whatever backend the machine has.
//!
//! This crate is the host: it reads `.tk` files, checks them, binds inputs and launches kernels
//! on a backend, and is the `tessel` command (`cli`). The kernel language and IR live in
//! `tessel-plugin-api`; the reference interpreter in `tessel-interpret`.
#![deny(missing_docs)]

pub mod alloc;
pub mod cache;
pub mod cli;
pub mod conformance;
pub mod inputs;
pub mod launch;
pub mod limits;
pub mod memory;
pub mod npy;
pub mod registry;
pub mod runtime;
pub mod staged;
pub mod tune;

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use tessel_plugin_api::ir::generic::{BindError, Binding, Generic, Source};
use tessel_plugin_api::ir::{self, Verified};
use tessel_plugin_api::launch::LaunchError;

pub use launch::{BytesMut, BytesRef, Call, Choice, InPlace, Launch, Plan, Planned, Report};
pub use runtime::{DeviceArray, Runtime, Specialized};
pub use tessel_plugin_api::array::{HostArray, Tolerance};
pub use tessel_plugin_api::launch::LaunchArgs;

/// A user error: each message names the thing and says what would work. The CLI prints it and
/// exits with 1.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file that cannot be read.
    #[error("cannot read `{}`: {source}\n  expected a readable file", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A kernel file larger than tessel reads ([`limits::KERNEL_FILE`]), or one that never ends.
    #[error("cannot read `{}` as a kernel file: {source}\n  expected a .tk file of at most {}", path.display(), limits::show(source.limit))]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size and the limit.
        source: limits::TooLarge,
    },
    /// Standard output that cannot be written (a full disk, `/dev/full`).
    #[error("cannot write to standard output: {0}")]
    Stdout(std::io::Error),
    /// Syntax or verification errors, rendered with `line:col` against the source.
    #[error("{0}")]
    Kernel(String),
    /// `--kernel NAME` that the file does not define.
    #[error("`{}` has no kernel `{name}`\n  its kernels are: {available}", file.display())]
    UnknownKernel {
        /// The file.
        file: PathBuf,
        /// The name given.
        name: String,
        /// The kernels it has.
        available: String,
    },
    /// A file with several kernels and no `--kernel`.
    #[error("`{}` defines several kernels: {available}\n  choose one with `--kernel NAME`", file.display())]
    AmbiguousKernel {
        /// The file.
        file: PathBuf,
        /// The kernels it has.
        available: String,
    },
    /// A backend name that is not registered.
    #[error("unknown backend `{name}`{suggestion}\n  backends here: {available}")]
    UnknownBackend {
        /// The name given.
        name: String,
        /// `; did you mean `...`?` where a registered name is close, else empty.
        suggestion: String,
        /// Those that exist, each with whether it can run here.
        available: String,
    },
    /// A launch whose arrays do not fit in memory, found before any is made.
    #[error(
        "{what} needs {} of memory ({}), more than the {} this process has available\n  use smaller arrays (or parameters), a higher memory limit (`ulimit -v`, the cgroup's), or a machine with more memory",
        memory::show(need.total()),
        parts(need),
        memory::show(*available)
    )]
    Memory {
        /// What: `the launch of `add``, `input `x``.
        what: String,
        /// The bytes it needs.
        need: memory::Need,
        /// The bytes available.
        available: u64,
    },
    /// An input file that is not a usable `.npy`.
    #[error("input `{name}` from `{}`: {source}", path.display())]
    Npy {
        /// The argument.
        name: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: npy::NpyError,
    },
    /// A malformed flag value.
    #[error("bad `{flag} {value}`: {why}\n  expected {expected}")]
    BadFlag {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
        /// What would work.
        expected: &'static str,
    },
    /// Inputs or grid sizes that do not fit the kernel.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// An output that cannot be written.
    #[error("cannot write `{}`: {source}\n  nothing was written; expected a writable folder (for outputs, --out-dir DIR)", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A plugin that did not load.
    #[error(transparent)]
    Plugin(#[from] registry::PluginError),
    /// A backend's refusal or failure; the message's first line is the backend's sentence.
    #[error("{message}")]
    Backend {
        /// The backend.
        backend: String,
        /// What kind of failure: a refusal, unavailable, bad input, a device failure, a panic.
        kind: tessel_plugin_api::abi::ErrorKind,
        /// Its message.
        message: String,
    },
    /// `--backend auto` found no backend that takes the launch.
    #[error("no backend takes this launch:\n  {reasons}")]
    NoBackend {
        /// One line per backend tried.
        reasons: String,
    },
    /// A mesh text that does not parse.
    #[error(transparent)]
    Mesh(#[from] tessel_plugin_api::mesh::MeshParseError),
    /// No backend makes meshes of this kind.
    #[error(
        "no backend makes `{kind}(...)` meshes (the backends here are {available})\n  use grid(...), or load the plugin that owns `{kind}` meshes with --plugin"
    )]
    NoMeshMaker {
        /// The mesh kind.
        kind: String,
        /// The backends there are.
        available: String,
    },
    /// `tessel conformance` found failures (the table says which).
    #[error("conformance of {backend}: {failed} case(s) failed")]
    ConformanceFailed {
        /// The backend.
        backend: String,
        /// How many failed.
        failed: usize,
    },
    /// `--check` found outputs beyond their dtype's tolerance.
    #[error("--check failed: {0}")]
    CheckFailed(String),
    /// A launch's values that do not bind a generic kernel's parameters.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// `tessel tune` found nothing to tune, too much, or no candidate that agrees.
    #[error("{0}")]
    Tune(String),
}

/// On a machine without a desktop session, Mesa's Vulkan and GL drivers (the software adapter
/// wgpu finds there) print `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`
/// at every start, from libwayland, although nothing is wrong. This sets `XDG_RUNTIME_DIR` to the
/// temporary folder where it is unset or empty (any absolute path quiets it; nothing opens a window). The
/// `tessel` command and the Python module do it; a Rust program using [`Runtime`] calls it first
/// in `main`.
///
/// # Safety
///
/// It changes the environment: call it before any other thread exists (the first statement of
/// `main`), as [`std::env::set_var`] requires.
#[allow(unsafe_code, reason = "std::env::set_var is unsafe; the caller guarantees one thread")]
pub unsafe fn quiet_headless_mesa() {
    // Set but empty is as bad to Mesa as unset ("invalid or not set").
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty()) {
        // SAFETY: the caller guarantees that no other thread reads or writes the environment.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) }
    }
}

/// The parts of a memory need that are not zero: `inputs 32.0 GB, outputs 16.0 GB`.
fn parts(need: &memory::Need) -> String {
    let parts = [("inputs", need.inputs), ("outputs", need.outputs), ("scratch", need.scratch)];
    parts.iter().filter(|(_, b)| *b > 0).map(|(n, b)| format!("{n} {}", memory::show(*b))).collect::<Vec<_>>().join(", ")
}

/// `type Result<T> = Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads, parses and verifies every kernel of a `.tk` file; errors are rendered with the file's
/// name and `line:col`.
pub fn load_file(path: &Path) -> Result<Vec<Verified>> {
    load_source(&path.display().to_string(), &read_kernel_text(path)?)
}

/// Kernel text given whole (`tessel.compile`, the FFI handler's attribute) holds to the limit of
/// a kernel file, [`limits::KERNEL_FILE`].
fn within_limit(name: &str, text: &str) -> Result<()> {
    let size = text.len() as u64;
    if size > limits::KERNEL_FILE {
        return Err(Error::TooLarge { path: PathBuf::from(name), source: limits::TooLarge { size: Some(size), limit: limits::KERNEL_FILE } });
    }
    Ok(())
}

/// The text of a kernel file, at most [`limits::KERNEL_FILE`] bytes of UTF-8.
pub fn read_kernel_text(path: &Path) -> Result<String> {
    limits::read_to_string(path, limits::KERNEL_FILE).map_err(|source| match limits::too_large(&source) {
        Some(t) => Error::TooLarge { path: path.to_path_buf(), source: *t },
        None => Error::Read { path: path.to_path_buf(), source },
    })
}

/// Parses and verifies `.tk` text named `name` in messages. A generic kernel takes its defaults
/// (one without is an error); its errors name them.
pub fn load_source(name: &str, source: &str) -> Result<Vec<Verified>> {
    within_limit(name, source)?;
    let render = |d: ir::Diagnostics| Error::Kernel(d.render(name, source));
    // Two kernels of one name are reported by the verifier, with everything else.
    let generic = ir::generic::has_parameters(source).then(|| Source::parse(source).ok()).flatten();
    let Some(file) = generic.filter(|f| f.kernels().iter().all(|k| k.params().iter().all(|p| p.default.is_some()))) else {
        // Without parameters, or with one that has no default (which this parse reports).
        let module = ir::parse(source).map_err(render)?;
        return ir::verify::verify_module(&module).map_err(render);
    };
    let mut verified = Vec::new();
    let mut diags = Vec::new();
    for k in file.kernels() {
        let defaults = k.params().iter().filter_map(|p| Some((p.name.clone(), p.default?))).collect();
        match file.specialize(k, &defaults) {
            Ok(v) => verified.push(v),
            Err(d) => diags.extend(d.0),
        }
    }
    if diags.is_empty() { Ok(verified) } else { Err(render(ir::Diagnostics(diags))) }
}

/// Runs one verified kernel on a backend by name (`auto` picks the first available) through a
/// fresh [`Runtime`] with the built-ins and `TESSEL_PLUGIN_PATH`.
pub fn run_kernel(backend: &str, kernel: &Verified, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>> {
    let rt = Runtime::new(&[])?;
    let launch = Launch::new([Call::new(kernel.clone())], [], args.grid.clone());
    rt.plan(Choice::of(backend), &launch)?.launch(args)
}

/// The kernels of a `.tk` file, generic (docs/language.md §9) or not, with the text and the name
/// its messages quote.
#[derive(Debug)]
pub struct KernelFile {
    /// The file as named in messages.
    pub name: String,
    /// Its kernels.
    pub source: Source,
}

/// Reads and parses a `.tk` file; a kernel with parameters is checked for its names and syntax
/// and waits for [`KernelFile::specialize`].
pub fn read_kernels(path: &Path) -> Result<KernelFile> {
    parse_kernels(&path.display().to_string(), &read_kernel_text(path)?)
}

/// Parses `.tk` text named `name` in messages (see [`read_kernels`]).
pub fn parse_kernels(name: &str, text: &str) -> Result<KernelFile> {
    within_limit(name, text)?;
    let source = Source::parse(text).map_err(|d| Error::Kernel(d.render(name, text)))?;
    Ok(KernelFile { name: name.to_string(), source })
}

impl KernelFile {
    /// The kernels in file order.
    pub fn kernels(&self) -> &[Generic] {
        self.source.kernels()
    }

    /// The kernel called `name`, or an error listing those the file has.
    pub fn kernel(&self, name: &str) -> Result<&Generic> {
        self.source.kernel(name).ok_or_else(|| Error::UnknownKernel {
            file: PathBuf::from(&self.name),
            name: name.to_string(),
            available: self.kernels().iter().map(Generic::name).collect::<Vec<_>>().join(", "),
        })
    }

    /// Binds `kernel`'s parameters for a launch on `inputs` (shape parameters from their shapes)
    /// with `given` values, then `tuned` ones, then defaults, and specializes it.
    pub fn specialize_for(
        &self,
        kernel: &Generic,
        given: &BTreeMap<String, i64>,
        tuned: &BTreeMap<String, i64>,
        inputs: &BTreeMap<String, HostArray>,
    ) -> Result<(Verified, Binding)> {
        let shapes = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
        let binding = kernel.bind(given, tuned, &shapes)?;
        Ok((self.specialize(kernel, &binding)?, binding))
    }

    /// The ordinary kernel `kernel` is with `binding`, verified; errors are rendered against the
    /// generic text and name the values.
    pub fn specialize(&self, kernel: &Generic, binding: &Binding) -> Result<Verified> {
        kernel.specialize(&binding.values).map_err(|d| Error::Kernel(kernel.render(&d, &self.name)))
    }
}

/// How [`check_source`] found one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Verified: a kernel without parameters, or a generic one with these values
    /// (`N = 1024, B = 128`).
    Verified(Option<String>),
    /// Names and syntax only: these parameters had no value.
    Unbound(Vec<String>),
}

/// `tessel check`: the canonical text of every kernel of `.tk` text named `name` in messages,
/// and what was verified. A generic kernel keeps its parameters in its text and is verified with
/// its defaults and `given`; one with parameters left without a value is checked for names and
/// syntax. Without generic kernels, every error of every kernel is reported at once.
pub fn check_source(name: &str, text: &str, given: &BTreeMap<String, i64>) -> Result<Vec<(String, Checked)>> {
    let file = parse_kernels(name, text).ok().filter(|f| f.kernels().iter().any(Generic::is_generic));
    let Some(file) = file else {
        let kernels = load_source(name, text)?;
        check_param_names(&[], given)?;
        return Ok(kernels.iter().map(|k| (ir::print_kernel(k.kernel()), Checked::Verified(None))).collect());
    };
    check_param_names(&file.kernels().iter().collect::<Vec<_>>(), given)?;
    let mut out = Vec::new();
    for k in file.kernels() {
        if !k.is_generic() {
            out.push((ir::print_kernel(file.specialize(k, &Binding::default())?.kernel()), Checked::Verified(None)));
            continue;
        }
        match k.bind(&given_for(k, given), &BTreeMap::new(), &BTreeMap::new()) {
            Ok(b) => {
                file.specialize(k, &b)?;
                out.push((k.template_text().to_string(), Checked::Verified(Some(b.describe(k)))));
            }
            Err(BindError::Unbound { names, .. }) => out.push((k.template_text().to_string(), Checked::Unbound(names))),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Every value given must be a parameter of some kernel of the launch (`kernels`); the error
/// names the first kernel's parameters.
pub fn check_param_names(kernels: &[&Generic], given: &BTreeMap<String, i64>) -> Result<()> {
    for name in given.keys() {
        if !kernels.iter().any(|k| k.params().iter().any(|p| &p.name == name)) {
            let (kernel, known) = match kernels.first() {
                Some(k) if k.is_generic() => {
                    let names: Vec<&str> = k.params().iter().map(|p| p.name.as_str()).collect();
                    (k.name(), format!("its parameters are: {}", names.join(", ")))
                }
                Some(k) => (k.name(), "it has no parameters".to_string()),
                None => ("", "it has no parameters".to_string()),
            };
            return Err(BindError::Unknown { kernel: kernel.to_string(), name: name.clone(), known }.into());
        }
    }
    Ok(())
}

/// The values of `given` that are parameters of `kernel`.
pub fn given_for(kernel: &Generic, given: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    given.iter().filter(|(n, _)| kernel.params().iter().any(|p| &p.name == *n)).map(|(n, v)| (n.clone(), *v)).collect()
}
