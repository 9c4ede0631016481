//! tessel's compiling CPU backend, shipped as a plugin (`libtessel_cpu.so` on the plugin path;
//! never linked into the host). Each launch's kernels become one C file (`emit/`), compiled by
//! the system's C compiler for the machine it runs on and cached on disk (`cc.rs`), and run with
//! the grid's programs spread over all cores (`run.rs`).
//!
//! It declares the `Cpu` device class, and ranks before the interpreter (a built-in of the same
//! class) under `auto`; what it refuses (`error.rs`) the interpreter runs.

mod cc;
pub mod emit;
pub mod error;
mod run;

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

pub use error::Refusal;
use tessel_plugin_api::abi::{BackendError, Capabilities, DeviceClass, ErrorKind, MeshBox};
use tessel_plugin_api::array::{DataRef, HostArray};
use tessel_plugin_api::backend::{
    Artifact, Available, BackendImpl, Compiler, Options, Request, HostMemory, make_grid_mesh, verify_call,
};
use tessel_plugin_api::ir::{DType, ParamKind, Verified, analysis, legalize};
use tessel_plugin_api::kept::Kept;
use tessel_plugin_api::launch::{self, LaunchError};
use tessel_plugin_api::mesh::MeshSpec;

/// The backend's name.
pub const NAME: &str = "cpu";

/// The compiling CPU backend.
#[derive(Debug, Default)]
pub struct Cpu;

impl Cpu {
    /// The backend object.
    pub fn new() -> Cpu {
        Cpu
    }
}

/// Refuses what the C writer does not compile: the concurrent model.
fn check(v: &Verified) -> Result<(), BackendError> {
    let k = v.kernel();
    if k.is_concurrent() {
        return Err(Refusal::Concurrent { kernel: k.name.clone() }.into());
    }
    Ok(())
}

/// The compiler: kernels verified with their meshes, then C, then a library.
#[derive(Clone, Copy, Debug)]
pub struct CpuCompiler;

/// One launch compiled: its kernels in order, and the C they were compiled from.
#[derive(Debug)]
pub struct CompiledLaunch {
    kernels: Vec<run::Kernel>,
    source: String,
}

/// A launch's kernels legalized (as every backend's lowering takes them) and the C file they
/// become.
pub struct LoweredC {
    /// The kernels, legalized.
    pub legal: Vec<Verified>,
    /// Their C.
    pub emitted: emit::Emitted,
}

/// The most launches whose C is kept ([`lower_to_c`]).
const C_KEPT: usize = 64;

/// The C file a launch's kernels become, made once per process for the same kernels (while
/// they are kept): the warm-up's thread and the launch's compile, which follows it, share it,
/// and one that asks while the other makes it waits for that (one `OnceLock` a launch).
pub fn lower_to_c(kernels: &[Verified]) -> Arc<LoweredC> {
    static MADE: Kept<[u8; 32], Arc<OnceLock<Arc<LoweredC>>>> = Kept::new(C_KEPT);
    let mut h = blake3::Hasher::new();
    for k in kernels {
        h.update(&(k.text().len() as u64).to_le_bytes());
        h.update(k.text().as_bytes());
    }
    let once = MADE.shared(*h.finalize().as_bytes(), || Arc::new(OnceLock::new()));
    Arc::clone(once.get_or_init(|| {
        let legal: Vec<Verified> = kernels.iter().map(|k| legalize::for_backend(k).into_owned()).collect();
        let emitted = emit::emit(&legal);
        Arc::new(LoweredC { legal, emitted })
    }))
}

impl Compiler for CpuCompiler {
    type Plan = Vec<Verified>;
    type Artifact = CompiledLaunch;

    /// The compiler and the machine its code is made for.
    fn options(&self) -> Options {
        match cc::toolchain() {
            Ok(t) => Options::new().with("cc", &t.version).with("march", &t.machine).with("cflags", t.extra.join(" ")),
            Err(_) => Options::new().with("cc", "none"),
        }
    }

    fn plan(&self, launch: &Request<'_>) -> Result<Vec<Verified>, BackendError> {
        launch
            .calls
            .iter()
            .map(|c| {
                let v = verify_call::<Refusal>(c)?;
                check(&v)?;
                Ok(v)
            })
            .collect()
    }

    fn compile(&self, _: &Request<'_>, plan: Vec<Verified>) -> Result<CompiledLaunch, BackendError> {
        let c = lower_to_c(&plan);
        let e = &c.emitted;
        let lib = cc::build(&e.source)?;
        let gemm = if e.gemm { Some(gemm_library()?) } else { None };
        let kernels = (c.legal.iter().cloned())
            .zip(&e.kernels)
            .map(|(v, (name, arena))| run::Kernel::new(v, Arc::clone(&lib), name, *arena, gemm.clone()))
            .collect::<Result<_, _>>()?;
        Ok(CompiledLaunch { kernels, source: e.source.clone() })
    }

    fn plan_text(&self, plan: &Vec<Verified>) -> String {
        tessel_plugin_api::backend::plan_text::verified_only(
            plan,
            "the kernel as verified; it is legalized, and its C, runs and products written, when it is compiled",
        )
    }

    fn stages(&self, compiled: &CompiledLaunch) -> Vec<(String, String)> {
        let name = compiled.kernels.first().map_or("launch", |k| k.verified.name());
        vec![(format!("{name}.c"), compiled.source.clone())]
    }

    /// Lowers without compiling: the C is the text (no compiler needed).
    fn lower(&self, launch: &Request<'_>) -> Result<Vec<(String, String)>, BackendError> {
        let plan = self.plan(launch)?;
        let c = lower_to_c(&plan);
        Ok(vec![(format!("{}.c", plan.first().map_or("launch", |k| k.name())), c.emitted.source.clone())])
    }
}

/// The product library (`emit::gemm_source`) and its `tk_gemm`, compiled or read from the disk
/// cache, and its function looked up, once per process.
fn gemm_library() -> Result<run::Gemm, BackendError> {
    static GEMM: std::sync::OnceLock<run::Gemm> = std::sync::OnceLock::new();
    if let Some(g) = GEMM.get() {
        return Ok(g.clone());
    }
    let lib = cc::build(&emit::gemm_source())?;
    let f = lib.gemm()?;
    Ok(GEMM.get_or_init(|| (f, lib)).clone())
}

fn launch_error(e: LaunchError) -> BackendError {
    BackendError::new(ErrorKind::InvalidInput, e.to_string())
}

/// A pointer to an input's elements.
fn input_ptr(d: &DataRef<'_>) -> *mut c_void {
    let p: *const c_void = match d {
        DataRef::F32(v) => v.as_ptr().cast(),
        DataRef::F16(v) => v.as_ptr().cast(),
        DataRef::BF16(v) => v.as_ptr().cast(),
        DataRef::I32(v) => v.as_ptr().cast(),
        DataRef::U32(v) => v.as_ptr().cast(),
        DataRef::Bool(v) => v.as_ptr().cast(),
        DataRef::I8(v) => v.as_ptr().cast(),
        DataRef::U8(v) => v.as_ptr().cast(),
        DataRef::I16(v) => v.as_ptr().cast(),
        DataRef::U16(v) => v.as_ptr().cast(),
    };
    p.cast_mut()
}

impl CompiledLaunch {
    /// Runs kernel `n` on inputs read in place and outputs written in place (little-endian bytes
    /// of the outputs' types; those not aligned for their type go through an aligned copy).
    fn run_kernel(
        &self,
        n: usize,
        grid: &BTreeMap<String, u64>,
        inputs: &BTreeMap<String, DataRef<'_>>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
        kept: &std::collections::BTreeSet<String>,
    ) -> Result<(), BackendError> {
        let k = &self.kernels[n];
        let grid = launch::resolve_grid(&k.verified, grid).map_err(launch_error)?;
        let mut args = Vec::new();
        let mut copies: Vec<(String, Vec<u64>)> = Vec::new();
        for p in &k.verified.kernel().params {
            let bytes = p.ty.numel() * (p.ty.dtype.bits() as usize).div_ceil(8);
            match p.kind {
                ParamKind::In => {
                    let d = inputs.get(&p.name).ok_or_else(|| missing(&p.name))?;
                    if d.len() != p.ty.numel() {
                        return Err(BackendError::new(
                            ErrorKind::InvalidInput,
                            format!("input `{}` has {} elements, not the {} of {}", p.name, d.len(), p.ty.numel(), p.ty),
                        ));
                    }
                    args.push(input_ptr(d));
                }
                ParamKind::Out => {
                    let out = outputs.get_mut(&p.name).ok_or_else(|| missing(&p.name))?;
                    if out.len() != bytes {
                        return Err(BackendError::new(
                            ErrorKind::InvalidInput,
                            format!("output `{}` has {} bytes, not the {bytes} of {}", p.name, out.len(), p.ty),
                        ));
                    }
                    // Outputs start as zeros (XLA's result buffers hold whatever they held),
                    // unless kept, or every element is stored before anything could read it.
                    if !kept.contains(&p.name) && !analysis::overwritten(k.verified.kernel(), &grid, p) {
                        out.fill(0);
                    }
                    let align = (p.ty.dtype.bits() as usize / 8).max(1);
                    if (out.as_ptr() as usize) % align == 0 {
                        args.push(out.as_mut_ptr().cast());
                    } else {
                        let mut copy = vec![0u64; bytes.div_ceil(8)];
                        bytemuck_copy(out, &mut copy);
                        args.push(copy.as_mut_ptr().cast());
                        copies.push((p.name.clone(), copy));
                    }
                }
                ParamKind::Scratch => args.push(std::ptr::null_mut()),
            }
        }
        k.run(&grid, &args)?;
        for (name, copy) in copies {
            let out = outputs.get_mut(&name).expect("bound above");
            let len = out.len();
            for (i, b) in out.iter_mut().enumerate().take(len) {
                *b = (copy[i / 8] >> (8 * (i % 8))) as u8;
            }
        }
        Ok(())
    }
}

fn bytemuck_copy(from: &[u8], to: &mut [u64]) {
    for (i, b) in from.iter().enumerate() {
        to[i / 8] |= u64::from(*b) << (8 * (i % 8));
    }
}

fn missing(name: &str) -> BackendError {
    BackendError::new(ErrorKind::InvalidInput, format!("argument `{name}` was not given"))
}

impl BackendImpl for Cpu {
    type Memory = HostMemory;

    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn platform(&self) -> String {
        match cc::toolchain() {
            Ok(t) => format!("CPU ({}), {} threads, C by {}", t.machine, rayon::current_num_threads(), t.version),
            Err(e) => format!("CPU, {} threads, {e}", rayon::current_num_threads()),
        }
    }

    fn availability(&self) -> Result<Available, String> {
        let t = cc::toolchain().map_err(str::to_string)?;
        Ok(Available { class: DeviceClass::Cpu, on: format!("compiled for {} by {}", t.machine, t.version) })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mesh_kinds: vec!["grid".into()].into(),
            portable_meshes: true,
            dtypes: DType::ALL.iter().map(|d| d.name().into()).collect(),
            dynamic_grid: true,
            multiple_kernels: true,
            external_meshes: true,
            targets: vec!["c".into()].into(),
            max_block_elements: 1 << 24,
        }
    }

    fn make_mesh(&self, spec: &MeshSpec) -> Result<MeshBox, BackendError> {
        make_grid_mesh::<Refusal>(spec)
    }

    type Compiler = CpuCompiler;

    fn compiler(&self) -> Result<CpuCompiler, BackendError> {
        Ok(CpuCompiler)
    }

    fn memory(&self) -> Result<&HostMemory, BackendError> {
        Ok(&HostMemory)
    }

    fn run_host(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        inputs: &BTreeMap<String, DataRef<'_>>,
        outputs: &mut BTreeMap<String, &mut [u8]>,
    ) -> Option<Result<(), BackendError>> {
        if compiled.kernels.len() != 1 {
            return None;
        }
        Some(compiled.run_kernel(0, &launch.grid, inputs, outputs, &launch.kept))
    }

    /// Runs the C compiler on the launch's C (and builds the product library where it has a
    /// `dot`) on a thread of its own: the launch's compile then finds the library on disk, or
    /// waits for the build under way (`cc::build` runs the compiler once per source).
    fn warm_up(&self, plan: &Vec<Verified>) {
        let plan = plan.clone();
        let _ = std::thread::Builder::new().name("tessel-cpu warm-up".into()).spawn(move || {
            let c = lower_to_c(&plan);
            let _ = cc::build(&c.emitted.source);
            if c.emitted.gemm {
                let _ = gemm_library();
            }
        });
    }

    /// Runs the kernels in order; each sees the outputs of the ones before it.
    fn run(
        &self,
        compiled: &Artifact<Self>,
        launch: &Request<'_>,
        buffers: &mut BTreeMap<String, HostArray>,
    ) -> Result<(), BackendError> {
        if let Some(name) = launch.kept.iter().next() {
            return Err(Refusal::KeptInSeveralKernels { name: name.clone() }.into());
        }
        for n in 0..compiled.kernels.len() {
            let k = compiled.kernels[n].verified.kernel();
            // Outputs written in place into fresh arrays (bool ones through bytes: a `bool`
            // array cannot lend its bytes).
            let mut outs: Vec<(String, HostArray)> =
                k.params_of(ParamKind::Out).map(|p| (p.name.clone(), HostArray::zeros(p.ty.dtype, &p.ty.shape))).collect();
            let mut bools: Vec<(String, Vec<u8>)> =
                outs.iter().filter(|(_, a)| a.dtype() == DType::Bool).map(|(n, a)| (n.clone(), vec![0u8; a.len()])).collect();
            {
                let inputs: BTreeMap<String, DataRef<'_>> = k
                    .params_of(ParamKind::In)
                    .filter_map(|p| buffers.get(&p.name).map(|a| (p.name.clone(), a.data.as_data_ref())))
                    .collect();
                let mut outputs: BTreeMap<String, &mut [u8]> = BTreeMap::new();
                for (name, a) in &mut outs {
                    if let Some(bytes) = a.le_bytes_mut() {
                        outputs.insert(name.clone(), bytes);
                    }
                }
                for (name, b) in &mut bools {
                    outputs.insert(name.clone(), b.as_mut_slice());
                }
                compiled.run_kernel(n, &launch.grid, &inputs, &mut outputs, &launch.kept)?;
            }
            for (name, bytes) in bools {
                let a = outs.iter_mut().find(|(n, _)| *n == name).expect("an output");
                a.1 = HostArray::from_le_bytes(DType::Bool, &a.1.ty().shape, &bytes)
                    .map_err(|e| BackendError::new(ErrorKind::Internal, e))?;
            }
            buffers.extend(outs);
        }
        Ok(())
    }
}

tessel_plugin_api::export_plugin!(Cpu::new());

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessel_plugin_api::ir;

    #[test]
    fn a_launchs_c_is_made_once_for_the_warm_up_and_the_compile() {
        let text = "kernel twice\n  in x: f32[8]\n  out o: f32[8]\n{\n  %x = load x\n  %y = neg %x\n  store o, %y\n}\n";
        let v = ir::verify(&ir::parse(text).unwrap().kernels.remove(0)).unwrap();
        let first = super::lower_to_c(std::slice::from_ref(&v));
        assert!(first.emitted.source.contains("twice"));
        // The same kernels again (a copy, as the warm-up's thread holds): the same C, not made again.
        assert!(Arc::ptr_eq(&first, &super::lower_to_c(&[v.clone()])));
        let other = ir::verify(&ir::parse(&text.replace("neg", "exp")).unwrap().kernels.remove(0)).unwrap();
        assert!(!Arc::ptr_eq(&first, &super::lower_to_c(&[other])));
    }
}
