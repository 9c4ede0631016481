//! What every launching command shares: the flags that name a launch ([`LaunchFlags`]), the
//! launch they resolve to ([`Prepared`]: kernels picked, bound and specialized, meshes, grid and
//! the backend's plan, asked once), `--explain`'s lines, and the inputs of a launch (read from
//! `--input` files or made at random).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessel_plugin_api::abi::MeshBox;
use tessel_plugin_api::ir::Verified;
use tessel_plugin_api::ir::generic::Generic;

use crate::{Call, Choice, Error, HostArray, Launch, Plan, Planned, Result, Runtime};

/// What a launch names, shared by `lower` and `run`.
#[derive(Debug, clap::Args)]
pub(super) struct LaunchFlags {
    /// The kernel file.
    pub(super) file: PathBuf,
    /// The backend: a name, or `auto` for the first available that takes the launch [default:
    /// auto for `run`, interpret for `lower` and `bench`].
    #[arg(long)]
    pub(super) backend: Option<String>,
    /// The kernel of the file (needed when it defines several); twice or more for one launch of
    /// several kernels.
    #[arg(long = "kernel", value_name = "NAME")]
    pub(super) kernels: Vec<String>,
    /// The kernel mesh, as `grid(i: 4)` for every kernel or `KERNEL=mosaic_gpu(...)` for one.
    #[arg(long = "mesh", value_name = "MESH")]
    meshes: Vec<String>,
    /// An external mesh (devices around the launch).
    #[arg(long = "external-mesh", value_name = "MESH")]
    external_meshes: Vec<String>,
    /// The size of a `dyn` grid axis: AXIS=N.
    #[arg(long = "grid", value_name = "AXIS=N")]
    grid: Vec<String>,
    /// A value for a kernel parameter: P=V (docs/language.md §9).
    #[arg(long = "param", value_name = "P=V")]
    pub(super) params: Vec<String>,
    /// Print which backend was chosen and why every other was skipped (with --backend auto).
    #[arg(long)]
    pub(super) explain: bool,
}

/// A launch resolved from the flags: the kernels and meshes, ready for the runtime.
pub(super) struct Prepared {
    pub(super) backend: String,
    /// The backend's acceptance of the launch, asked once ([`Runtime::plan`]).
    plan: Option<Plan>,
    /// How `auto` chose, one line per backend tried.
    pub(super) explanation: Vec<String>,
    /// How each generic kernel's parameters were bound, one line each.
    bound: Vec<String>,
    /// Every parameter value, by name (kernels of one launch share names).
    pub(super) values: BTreeMap<String, i64>,
    /// Tuning records that could not be read.
    warnings: Vec<String>,
    pub(super) kernels: Vec<Arc<Verified>>,
    meshes: Vec<Option<Arc<MeshBox>>>,
    externals: Vec<Arc<MeshBox>>,
    pub(super) grid: BTreeMap<String, u64>,
}

impl Prepared {
    /// The launch: the kernels with their meshes, the external meshes, the grid (shared, not
    /// copied).
    pub(super) fn launch(&self) -> Launch {
        let calls =
            self.kernels.iter().zip(&self.meshes).map(|(kernel, mesh)| Call { kernel: kernel.clone(), mesh: mesh.clone() });
        Launch::new(calls, self.externals.iter().cloned(), self.grid.clone())
    }

    /// `f` on the launch as planned: the backend is not asked again.
    pub(super) fn planned<T>(&self, rt: &Runtime, f: impl FnOnce(&Planned<'_>) -> Result<T>) -> Result<T> {
        let plan = self.plan.clone().expect("a prepared launch is planned");
        f(&rt.resume(plan)?)
    }

    pub(super) fn warn(&self, err: &mut dyn Write) {
        for w in &self.warnings {
            let _ = writeln!(err, "warning: {w}");
        }
    }
}

fn split_flag<'a>(flag: &'static str, value: &'a str, expected: &'static str) -> Result<(&'a str, &'a str)> {
    match value.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k, v)),
        _ => Err(Error::BadFlag { flag, value: value.to_string(), why: "it is not of the form NAME=VALUE".into(), expected }),
    }
}

pub(super) fn pick_kernels<'a>(file: &Path, all: &'a [Generic], names: &[String]) -> Result<Vec<&'a Generic>> {
    let available = || all.iter().map(Generic::name).collect::<Vec<_>>().join(", ");
    if names.is_empty() {
        return match all {
            [one] => Ok(vec![one]),
            _ => Err(Error::AmbiguousKernel { file: file.to_path_buf(), available: available() }),
        };
    }
    names
        .iter()
        .map(|name| {
            all.iter().find(|k| k.name() == name).ok_or_else(|| Error::UnknownKernel {
                file: file.to_path_buf(),
                name: name.clone(),
                available: available(),
            })
        })
        .collect()
}

/// The backend `run` uses without `--backend`: the first available that takes the launch, so that
/// `tessel run K.tk --check` compares a real backend with the interpreter.
pub(super) const RUN_DEFAULT: &str = "auto";
/// The backend `lower` and `bench` use without `--backend`.
pub(super) const LOWER_DEFAULT: &str = tessel_interpret::NAME;

pub(super) fn prepare(
    rt: &Runtime,
    flags: &LaunchFlags,
    default: &str,
    inputs: &BTreeMap<String, HostArray>,
) -> Result<Prepared> {
    let file = crate::read_kernels(&flags.file)?;
    prepare_with(rt, &file, flags, default, inputs, &parse_params(&flags.params)?, true)
}

/// [`prepare`] with the parameter values `given`, and tuning records used or not.
pub(super) fn prepare_with(
    rt: &Runtime,
    file: &crate::KernelFile,
    flags: &LaunchFlags,
    default: &str,
    inputs: &BTreeMap<String, HostArray>,
    given: &BTreeMap<String, i64>,
    records: bool,
) -> Result<Prepared> {
    let asked = flags.backend.as_deref().unwrap_or(default);
    let auto = asked == "auto";
    // With `auto`, meshes are made by the backend that owns their kind; else by the one named.
    let backend = if auto { String::new() } else { asked.to_string() };
    if !auto {
        rt.backend(&backend)?;
    }
    let generics = pick_kernels(&flags.file, file.kernels(), &flags.kernels)?;
    crate::check_param_names(&generics, given)?;
    let (kernels, bound) = specialize(rt, file, &generics, given, inputs, records.then_some(backend.as_str()))?;
    let mut meshes: Vec<Option<MeshBox>> = kernels.iter().map(|_| None).collect();
    for m in &flags.meshes {
        // `KERNEL=MESH` names the kernel before the mesh's `(`; a plain mesh is for every kernel.
        let target = m.split_once('=').filter(|(k, _)| !k.contains('('));
        match target {
            Some((name, text)) => {
                let i = kernels.iter().position(|k| k.name() == name).ok_or_else(|| Error::BadFlag {
                    flag: "--mesh",
                    value: m.clone(),
                    why: format!("`{name}` is not a kernel of this launch"),
                    expected: "MESH for every kernel, or KERNEL=MESH for a kernel given with --kernel",
                })?;
                meshes[i] = Some(rt.mesh(&backend, text)?);
            }
            None => {
                for slot in meshes.iter_mut() {
                    *slot = Some(rt.mesh(&backend, m)?);
                }
            }
        }
    }
    let externals = flags.external_meshes.iter().map(|m| rt.mesh(&backend, m)).collect::<Result<Vec<_>>>()?;
    let mut grid = BTreeMap::new();
    for g in &flags.grid {
        let (axis, n) = split_flag("--grid", g, "AXIS=N with N a positive integer, as in `--grid i=8`")?;
        let n: u64 = n.parse().map_err(|_| Error::BadFlag {
            flag: "--grid",
            value: g.clone(),
            why: format!("`{n}` is not a non-negative integer"),
            expected: "AXIS=N with N a positive integer, as in `--grid i=8`",
        })?;
        once("--grid", g, grid.insert(axis.to_string(), n).map(|old| format!("{axis}={old}")))?;
    }
    let mut p = Prepared {
        backend,
        plan: None,
        explanation: Vec::new(),
        bound: bound.lines,
        values: bound.values,
        warnings: bound.warnings,
        kernels: kernels.into_iter().map(Arc::new).collect(),
        meshes: meshes.into_iter().map(|m| m.map(Arc::new)).collect(),
        externals: externals.into_iter().map(Arc::new).collect(),
        grid,
    };
    let plan = rt.plan(Choice::of(asked), &p.launch())?.into_plan();
    if auto {
        p.backend = plan.backend().to_string();
        p.explanation = plan.decisions().to_vec();
    }
    p.plan = Some(plan);
    // Now that the backend is known, its tuning records may give other values: specialize and
    // plan again only then.
    if auto && records && retuned(rt, &generics, given, inputs, &p)? {
        let (kernels, bound) = specialize(rt, file, &generics, given, inputs, Some(&p.backend))?;
        p.kernels = kernels.into_iter().map(Arc::new).collect();
        (p.bound, p.values, p.warnings) = (bound.lines, bound.values, bound.warnings);
        let explanation = std::mem::take(&mut p.explanation);
        p.plan = Some(rt.plan(Choice::Named(&p.backend), &p.launch())?.into_plan());
        p.explanation = explanation;
    }
    Ok(p)
}

/// Whether the chosen backend's tuning records bind any kernel's parameters to other values
/// than the launch was specialized with.
fn retuned(
    rt: &Runtime,
    generics: &[&Generic],
    given: &BTreeMap<String, i64>,
    inputs: &BTreeMap<String, HostArray>,
    p: &Prepared,
) -> Result<bool> {
    let shapes = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
    for g in generics.iter().filter(|g| g.is_generic()) {
        let (binding, tuned) = rt.bind(g, &crate::given_for(g, given), &shapes, Some(&p.backend))?;
        if tuned.record.is_some() && binding.values.iter().any(|(n, v)| p.values.get(n) != Some(v)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How the kernels of a launch were bound.
#[derive(Default)]
struct Bound {
    lines: Vec<String>,
    values: BTreeMap<String, i64>,
    warnings: Vec<String>,
}

/// Binds and specializes every kernel of a launch; with a `backend` (not empty), values not given
/// come from its tuning records where they exist.
fn specialize(
    rt: &Runtime,
    file: &crate::KernelFile,
    generics: &[&Generic],
    given: &BTreeMap<String, i64>,
    inputs: &BTreeMap<String, HostArray>,
    backend: Option<&str>,
) -> Result<(Vec<Verified>, Bound)> {
    let mut bound = Bound::default();
    let mut kernels = Vec::new();
    let shapes = inputs.iter().map(|(n, a)| (n.clone(), a.shape.clone())).collect();
    let backend = backend.filter(|b| !b.is_empty());
    for g in generics {
        let s = rt.specialize(g, &file.name, &crate::given_for(g, given), &shapes, backend)?;
        if let (Some(path), Some(b)) = (&s.tuned.record, backend) {
            bound.lines.push(format!("tuning record for `{}` on {b}: {}", g.name(), path.display()));
        }
        if let Some(w) = s.tuned.warning {
            // `--explain` says so too, beside the values the kernel got instead.
            bound.lines.push(w.clone());
            bound.warnings.push(w);
        }
        if g.is_generic() {
            bound.lines.push(format!("params of `{}`: {}", g.name(), s.binding.explain(g)));
        }
        bound.values.extend(s.binding.values);
        kernels.push(s.kernel);
    }
    Ok((kernels, bound))
}

pub(super) fn explain(p: &Prepared, flags: &LaunchFlags, out: &mut dyn Write) {
    if flags.explain {
        for l in &p.explanation {
            let _ = writeln!(out, "auto: {l}");
        }
        if p.explanation.is_empty() {
            let _ = writeln!(out, "backend {} as asked (--backend auto chooses and explains)", p.backend);
        }
        for l in &p.bound {
            let _ = writeln!(out, "{l}");
        }
    }
}

/// `--param P=V` flags as values.
pub(super) fn parse_params(flags: &[String]) -> Result<BTreeMap<String, i64>> {
    const EXPECTED: &str = "P=V with V an integer, as in `--param BM=32`";
    let mut out = BTreeMap::new();
    for f in flags {
        let (name, v) = split_flag("--param", f, EXPECTED)?;
        let v: i64 = v.parse().map_err(|_| Error::BadFlag {
            flag: "--param",
            value: f.clone(),
            why: format!("`{v}` is not an integer"),
            expected: EXPECTED,
        })?;
        once("--param", f, out.insert(name.to_string(), v).map(|old| format!("{name}={old}")))?;
    }
    Ok(out)
}

/// An error if a flag gave its name a value before (`earlier`, as `NAME=VALUE`): a name is given
/// once, never silently the last of several.
fn once(flag: &'static str, value: &str, earlier: Option<String>) -> Result<()> {
    match earlier {
        None => Ok(()),
        Some(earlier) => Err(Error::BadFlag {
            flag,
            value: value.to_string(),
            why: format!("`{}` is given twice (`{flag} {earlier}` before)", earlier.split('=').next().unwrap_or_default()),
            expected: "each name once",
        }),
    }
}

/// The `--input NAME=FILE.npy` arrays.
pub(super) fn read_inputs(flags: &[String]) -> Result<BTreeMap<String, HostArray>> {
    let files = flags
        .iter()
        .map(|i| split_flag("--input", i, "NAME=FILE.npy, as in `--input x=x.npy`").map(|(n, p)| (n, PathBuf::from(p))))
        .collect::<Result<Vec<_>>>()?;
    // The files' bytes must fit before any is read.
    let bytes = files.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).fold(0u64, u64::saturating_add);
    crate::memory::check(|| format!("reading {}", flags.join(" ")), crate::memory::Need { inputs: bytes, ..Default::default() })?;
    for (i, (name, _)) in files.iter().enumerate() {
        if let Some((_, first)) = files[..i].iter().find(|(n, _)| n == name) {
            once("--input", &flags[i], Some(format!("{name}={}", first.display())))?;
        }
    }
    let mut inputs = BTreeMap::new();
    for (name, path) in files {
        let array =
            crate::npy::read(&path).map_err(|source| Error::Npy { name: name.to_string(), path: path.clone(), source })?;
        inputs.insert(name.to_string(), array);
    }
    Ok(inputs)
}

/// Seeded random inputs for every kernel of a launch (of the shapes its parameters give), once
/// the launch's inputs and outputs are known to fit in memory.
pub(super) fn random_inputs(p: &Prepared, seed: u64) -> Result<BTreeMap<String, HostArray>> {
    let kernels: Vec<&Verified> = p.kernels.iter().map(|k| &**k).collect();
    let need = crate::memory::Need::of(&kernels, crate::memory::threads());
    let names = || kernels.iter().map(|k| k.name()).collect::<Vec<_>>().join("`, `");
    crate::memory::check(|| format!("the launch of `{}` with random inputs", names()), need)?;
    let mut inputs = BTreeMap::new();
    for k in &p.kernels {
        for (name, array) in crate::inputs::random_inputs(k.kernel(), seed) {
            inputs.entry(name).or_insert(array);
        }
    }
    Ok(inputs)
}
