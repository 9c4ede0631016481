//! The reference interpreter: runs verified kernels on the CPU and defines what every other
//! backend must compute (`docs/language.md`).
//!
//! Stages, as in every backend: `lower.rs` turns the verified IR into a program of instructions
//! over numbered slots (`program.rs`; there is no text to emit, so no `emit.rs`), with runs of
//! elementwise statements fused (`fuse.rs`); `eval/` computes whole block values; `runtime/`
//! binds memory and runs the grid, parallel programs on all cores.

mod coarsen;
pub mod error;
mod eval;
mod fuse;
mod limits;
mod lower;
pub mod mesh;
mod program;
mod runtime;

pub use error::Refusal;
pub use limits::{MAX_ARRAY_ELEMENTS, MAX_BLOCK_ELEMENTS};

use std::collections::{BTreeMap, BTreeSet};

use tessel_plugin_api::abi::{BackendError, BuiltinBackend, Capabilities, DeviceClass, ErrorKind, MeshBox};
use tessel_plugin_api::array::{DataRef, HostArray};
use tessel_plugin_api::backend::{
    Artifact, Available, BackendImpl, Compiler, Options, Request, export, HostMemory, verify_call,
};
use tessel_plugin_api::ir::{DType, ParamKind, Type, Verified, print_kernel};
use tessel_plugin_api::launch::{self, LaunchArgs, LaunchError};
use tessel_plugin_api::mesh::MeshSpec;

/// The backend's name.
pub const NAME: &str = "interpret";

/// Refuses kernels whose block values or arrays exceed the interpreter's limits.
fn check_limits(v: &Verified) -> Result<(), BackendError> {
    let k = v.kernel();
    for p in &k.params {
        if p.ty.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > MAX_ARRAY_ELEMENTS) {
            let elements = p.ty.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
            return Err(Refusal::ArrayTooLarge { name: p.name.clone(), ty: p.ty.to_string(), elements }.into());
        }
    }
    fn walk(
        v: &Verified,
        body: &[tessel_plugin_api::ir::Stmt],
        f: &mut dyn FnMut(&str, &Type) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        for s in body {
            for r in &s.results {
                f(r, v.value_type(r))?;
            }
            for body in s.op.bodies() {
                walk(v, body, f)?;
            }
        }
        Ok(())
    }
    walk(v, &k.body, &mut |name, ty| {
        let n = ty.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
        if n > MAX_BLOCK_ELEMENTS {
            Err(Refusal::BlockTooLarge { value: name.to_string(), ty: ty.to_string(), elements: n }.into())
        } else {
            Ok(())
        }
    })
}

/// What can go wrong when running a kernel: a launch that does not fit it, or one cancelled
/// (`tessel_plugin_api::cancel`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Inputs or grid sizes that do not fit the kernel.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// A kernel lowered once, to be run many times.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The kernel the program runs: the one given, or it with programs merged (`coarsen.rs`).
    kernel: Verified,
    program: program::Program,
    /// How programs were merged, if they were.
    merged: Option<coarsen::Merged>,
}

/// Starts, on rayon's pool, what the first `f32` GEMM of the process would otherwise do inside
/// a launch: the gemm crate reads the CPU's cache sizes from sysfs (some 80 files, about 0.4 ms
/// here) before its first blocked product, while the pool's other threads wait for it. Called as
/// soon as a kernel is known to run here ([`BackendImpl::warm_up`]), it overlaps with making or
/// reading the inputs. Does nothing for kernels without a `dot`.
fn warm_up<'k>(kernels: impl IntoIterator<Item = &'k Verified>) {
    let has_dot = |k: &Verified| {
        let mut dot = false;
        tessel_plugin_api::ir::analysis::visit(&k.kernel().body, &mut |s| {
            dot |= matches!(s.op, tessel_plugin_api::ir::Op::Dot { .. });
        });
        dot
    };
    if kernels.into_iter().any(has_dot) {
        rayon::spawn(eval::warm_gemm);
    }
}

/// Lowers a verified kernel for the interpreter: programs merged where that changes no result
/// (`coarsen.rs`), elementwise runs fused.
pub fn compile(kernel: &Verified) -> Compiled {
    compile_for(kernel, rayon::current_num_threads())
}

/// [`compile`] for a pool of `threads` workers.
fn compile_for(kernel: &Verified, threads: usize) -> Compiled {
    let kernel = &*tessel_plugin_api::ir::legalize::for_backend(kernel);
    if kernel.kernel().is_concurrent() {
        // Its threads share scratch and meet at barriers: no programs merged, nothing fused.
        return Compiled { kernel: kernel.clone(), program: lower::lower(kernel, false), merged: None };
    }
    match coarsen::coarsen(kernel, threads) {
        Some((merged, how)) => Compiled { program: lower::lower(&merged, true), kernel: merged, merged: Some(how) },
        None => Compiled { kernel: kernel.clone(), program: lower::lower(kernel, true), merged: None },
    }
}

/// Lowers as written: no programs merged, no elementwise runs fused, every statement on its
/// whole block — the definition the compiled program must match bit for bit (the tests compare
/// the two).
pub fn compile_unfused(kernel: &Verified) -> Compiled {
    let kernel = &*tessel_plugin_api::ir::legalize::for_backend(kernel);
    Compiled { kernel: kernel.clone(), program: lower::lower(kernel, false), merged: None }
}

impl Compiled {
    /// How many programs run as one (`coarsen.rs`); 1 where none were merged.
    pub fn merged_programs(&self) -> u64 {
        self.merged.as_ref().map_or(1, |m| m.factor)
    }

    /// How many fused runs the program has (`fuse.rs`), nested bodies included.
    pub fn fused_runs(&self) -> usize {
        self.program.fused_runs()
    }

    /// Runs the kernel over its whole grid; returns every output, in declaration order.
    pub fn run(&self, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>, Error> {
        let grid = launch::bind(&self.kernel, args)?;
        let inputs = args.inputs.iter().map(|(n, a)| (n.clone(), a.data.as_data_ref())).collect();
        // Outputs of 4-byte elements are written in place into zeroed arrays (pages the
        // allocator has not touched stay untouched until a program writes them).
        let k = self.kernel.kernel();
        let mut fresh: Vec<(String, HostArray)> = k
            .params_of(ParamKind::Out)
            .filter(|p| p.ty.dtype.bits() == 32)
            .map(|p| (p.name.clone(), HostArray::zeros(p.ty.dtype, &p.ty.shape)))
            .collect();
        let zeroed = fresh.iter_mut().filter_map(|(n, a)| Some((n.as_str(), a.le_bytes_mut()?))).collect();
        let mut rest = runtime::Machine::run_lent(&self.kernel, &self.program, &grid, &inputs, zeroed)?;
        // Outputs in declaration order, whichever way each was written.
        Ok(k.params_of(ParamKind::Out)
            .map(|p| {
                let from = |v: &mut Vec<(String, HostArray)>| v.iter().position(|(n, _)| *n == p.name).map(|i| v.remove(i));
                from(&mut rest).or_else(|| from(&mut fresh)).expect("every output is made")
            })
            .collect())
    }

    /// Runs the kernel on memory the caller owns: `inputs` read in place (of the declared types,
    /// as the caller checked), each output's elements written into `outputs` as little-endian
    /// bytes.
    pub fn run_in_place(
        &self,
        inputs: &BTreeMap<String, DataRef<'_>>,
        grid: &BTreeMap<String, u64>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
        kept: &BTreeSet<String>,
    ) -> Result<(), Error> {
        let grid = launch::resolve_grid(&self.kernel, grid)?;
        runtime::Machine::run_into(&self.kernel, &self.program, &grid, inputs, outputs, kept)?;
        Ok(())
    }
}

/// Compiles and runs in one call.
pub fn run(kernel: &Verified, args: &LaunchArgs) -> Result<Vec<(String, HostArray)>, Error> {
    compile(kernel).run(args)
}

/// The interpreter as a backend: built in through `inventory`, or a plugin with `--features plugin`.
#[derive(Debug, Default)]
pub struct Interpreter;

impl Interpreter {
    /// The backend object.
    pub fn new() -> Interpreter {
        Interpreter
    }
}

/// Applies each call's mesh and verifies the kernel, refusing `device(...)` meshes.
fn verified(launch: &Request<'_>) -> Result<Vec<Verified>, BackendError> {
    launch
        .calls
        .iter()
        .map(|c| {
            let v = verify_call::<Refusal>(c)?;
            check_limits(&v)?;
            Ok(v)
        })
        .collect()
}

fn launch_error(e: LaunchError) -> BackendError {
    BackendError::new(ErrorKind::InvalidInput, e.to_string())
}

/// The interpreter's compiler: each kernel verified with its mesh, programs merged where a pool
/// of `threads` workers gains by it (`coarsen.rs`), lowered to the interpreter's program.
#[derive(Clone, Copy, Debug)]
pub struct InterpretCompiler {
    threads: usize,
}

impl InterpretCompiler {
    /// The compiler for a pool of `threads` workers (the backend's: rayon's global pool).
    pub fn new(threads: usize) -> InterpretCompiler {
        InterpretCompiler { threads: threads.max(1) }
    }
}

impl Compiler for InterpretCompiler {
    /// Each kernel verified with its mesh.
    type Plan = Vec<Verified>;
    /// Each kernel lowered to the interpreter's program.
    type Artifact = Vec<Compiled>;

    /// How many workers the programs are merged for.
    fn options(&self) -> Options {
        Options::new().with("threads", self.threads)
    }

    fn plan(&self, launch: &Request<'_>) -> Result<Vec<Verified>, BackendError> {
        verified(launch)
    }

    fn compile(&self, _: &Request<'_>, plan: Vec<Verified>) -> Result<Vec<Compiled>, BackendError> {
        Ok(plan.iter().map(|k| compile_for(k, self.threads)).collect())
    }

    fn plan_text(&self, plan: &Vec<Verified>) -> String {
        tessel_plugin_api::backend::plan_text::verified_only(
            plan,
            "the kernel as verified; fusion and the thread count are chosen when it is compiled",
        )
    }

    fn stages(&self, compiled: &Vec<Compiled>) -> Vec<(String, String)> {
        let mut stages = Vec::new();
        for c in compiled {
            let header = match &c.merged {
                Some(m) => format!(
                    "# interpret: programs merged {} at a time along `{}` (blocks {}× longer in dimension {})\n",
                    m.factor, m.axis, m.factor, m.dim
                ),
                None => String::new(),
            };
            stages.push((format!("{}.tk", c.kernel.name()), header + &print_kernel(c.kernel.kernel())));
            stages.push((format!("{}.program", c.kernel.name()), format!("{:#?}", c.program)));
        }
        stages
    }
}

impl BackendImpl for Interpreter {
    type Memory = HostMemory;

    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn platform(&self) -> String {
        format!("CPU, {} threads", rayon::current_num_threads())
    }

    fn availability(&self) -> Result<Available, String> {
        Ok(Available { class: DeviceClass::Cpu, on: "always: runs on the CPU".to_string() })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mesh_kinds: vec!["grid".into()].into(),
            portable_meshes: true,
            dtypes: DType::ALL.iter().map(|d| d.name().into()).collect(),
            dynamic_grid: true,
            multiple_kernels: true,
            external_meshes: true,
            targets: vec!["cpu".into()].into(),
            max_block_elements: MAX_BLOCK_ELEMENTS as u64,
        }
    }

    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError> {
        mesh::make(spec)
    }

    type Compiler = InterpretCompiler;

    fn compiler(&self) -> Result<InterpretCompiler, BackendError> {
        Ok(InterpretCompiler::new(rayon::current_num_threads()))
    }

    fn memory(&self) -> Result<&HostMemory, BackendError> {
        Ok(&HostMemory)
    }

    /// One kernel in place on the caller's memory; a launch of several (each seeing the outputs
    /// of the ones before) goes through buffers.
    fn run_host(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        inputs: &BTreeMap<String, DataRef<'_>>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
    ) -> Option<Result<(), BackendError>> {
        let [c] = compiled.as_slice() else { return None };
        Some(c.run_in_place(inputs, &launch.grid, outputs, &launch.kept).map_err(|Error::Launch(e)| launch_error(e)))
    }

    fn warm_up(&self, plan: &Vec<Verified>) {
        warm_up(plan);
    }

    /// Runs the kernels in order; each sees the outputs of the ones before it.
    fn run(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, HostArray>,
    ) -> Result<(), BackendError> {
        if let Some(name) = launch.kept.iter().next() {
            // One kernel runs in place (`run_host`), kept outputs included; this path makes
            // every output afresh.
            return Err(Refusal::KeptInSeveralKernels { name: name.clone() }.into());
        }
        for c in compiled {
            let k = c.kernel.kernel();
            let mut inputs = BTreeMap::new();
            for p in k.params_of(ParamKind::In) {
                if let Some(a) = buffers.remove(&p.name) {
                    inputs.insert(p.name.clone(), a);
                }
            }
            let args = LaunchArgs { inputs, grid: launch.grid.clone() };
            let result = c.run(&args);
            buffers.extend(args.inputs);
            let outputs = result.map_err(|Error::Launch(e)| launch_error(e))?;
            for (name, array) in outputs {
                buffers.insert(name, array);
            }
        }
        Ok(())
    }
}

inventory::submit! {
    BuiltinBackend { make: || export(Interpreter::new()) }
}

#[cfg(feature = "plugin")]
tessel_plugin_api::export_plugin!(Interpreter::new());
