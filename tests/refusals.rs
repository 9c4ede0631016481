//! Every refusal of every backend, by its type: each backend's `Refusal` enum (and the shared
//! `MeshRefusal`) is iterated, and every variant must have a case here that reaches it through the
//! command line or the library and checks its first line, written out literally, and its hint.
//! A variant that cannot be reached on this machine is listed with the reason; a new variant with
//! neither fails the test.

mod common;

use std::collections::HashSet;
use std::hash::Hash;

use common::{lowered, root, tessel, wgpu_adapter};
use strum::IntoEnumIterator;
use tessel_plugin_api::abi::ErrorKind;
use tessel_plugin_api::refusal::MeshRefusalKind;

/// How a refusal is reached.
enum How {
    /// `tessel ARGS` (files under `tests/` or `examples/` relative to the root; `@NAME` a kernel
    /// written by the case).
    Cli(Vec<String>),
    /// A library call returning the error's message.
    Call(fn() -> Result<(), String>),
    /// Not reachable here: why.
    Elsewhere(&'static str),
}

struct Case<K> {
    kind: K,
    how: How,
    /// The first line, byte for byte.
    first: String,
}

fn cli(args: &[&str]) -> How {
    How::Cli(args.iter().map(|a| a.to_string()).collect())
}

fn file(rel: &str) -> String {
    root().join(rel).display().to_string()
}

/// Writes a kernel into a temporary folder and gives its path.
fn kernel(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(format!("{name}.tk"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The message of the refusal `how` reaches: exit code 1 and two lines (first, hint).
fn refused(what: &str, how: &How) -> Option<String> {
    match how {
        How::Cli(args) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = tessel(&args);
            assert_eq!(r.code, 1, "{what}: {args:?} should be refused: {}{}", r.stdout, r.stderr);
            Some(r.stderr.strip_prefix("error: ").unwrap_or(&r.stderr).trim_end().to_string())
        }
        How::Call(f) => Some(f().expect_err(what)),
        How::Elsewhere(_) => None,
    }
}

/// Every kind has exactly one case; each reachable case gives its first line and a hint.
fn check<K: IntoEnumIterator + Copy + Eq + Hash + std::fmt::Debug>(cases: &[Case<K>]) {
    let kinds: HashSet<K> = cases.iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), cases.len(), "a kind has two cases");
    let missing: Vec<K> = K::iter().filter(|k| !kinds.contains(k)).collect();
    assert!(missing.is_empty(), "refusals without a case: {missing:?}");
    for c in cases {
        let what = format!("{:?}", c.kind);
        match &c.how {
            How::Elsewhere(why) => eprintln!("{what}: not reachable here: {why}"),
            how => {
                let text = refused(&what, how).unwrap();
                let (first, hint) = text.split_once('\n').unwrap_or((&text, ""));
                assert_eq!(first, c.first, "{what}");
                assert!(hint.starts_with("  ") && hint.trim().len() > 10, "{what}: a hint says what would work: {text:?}");
                assert_eq!(text.lines().count(), 2, "{what}: {text:?}");
            }
        }
    }
}

/// The refusal of `backend`'s `make_mesh(spec)`.
fn make_mesh(backend: &str, spec: &str) -> Result<(), String> {
    let rt = tessel::Runtime::new(&[]).unwrap();
    let m = rt.registry().get(backend).unwrap().backend.make_mesh(spec.into()).into_result();
    let e = m.err().ok_or("made")?;
    assert_eq!(e.kind, ErrorKind::Unsupported);
    Err(e.message.to_string())
}

/// `tessel lower KERNEL --backend BACKEND FLAGS...`.
fn lower_on(backend: &str, kernel: &str, flags: &[&str]) -> How {
    let mut a = vec!["lower", kernel, "--backend", backend];
    a.extend_from_slice(flags);
    cli(&a)
}

/// The interpreter's `grid(...)` mesh handed to mosaic-gpu: the downcast fails.
fn mosaic_foreign_mesh() -> Result<(), String> {
    let rt = tessel::Runtime::new(&[]).unwrap();
    let kernels = tessel::load_file(&root().join("examples/add.tk")).unwrap();
    let mesh = rt.registry().get("interpret").unwrap().backend.make_mesh("grid(i: 8)".into()).into_result().unwrap();
    let call = [tessel::Call::on(kernels[0].clone(), mesh)];
    lowered(&rt, "mosaic-gpu", &call).map(drop).map_err(|e| e.to_string())
}

#[test]
fn every_mosaic_gpu_refusal_is_reached_with_its_words() {
    use tessel_mosaic_gpu::error::RefusalKind as K;
    let dir = tempfile::tempdir().unwrap();
    let add = file("examples/add.tk");
    let big = kernel(&dir, "big", "kernel big\n  in x: f32[16385]\n  out o: f32[16385]\n{\n  %x = load x\n  store o, %x\n}\n");
    let wide = kernel(
        &dir,
        "wide",
        "kernel wide\n  grid (i: 65536, j: 65536)\n  in x: f32[8]\n  out o: f32[8]\n{\n  %x = load x\n  store o, %x\n}\n",
    );
    // Threads that wait on each other, more than a CTA has warpgroups.
    let pipeline = std::fs::read_to_string(root().join("tests/concurrent/pipeline_matmul.tk")).unwrap();
    let twelve_threads = kernel(&dir, "twelve_threads", &pipeline.replace("grid (wg: 3 thread)", "grid (wg: 12 thread)"));
    // 16 GiB of f32, which an H200 holds: past 32-bit element indices.
    let long = kernel(
        &dir,
        "long",
        "kernel long\n  grid (i: 33554433)\n  in  x: f32[4294967424] block [128] at (i)\n  out o: f32[4294967424] block [128] at (i)\n{\n  %x = load x\n  store o, %x\n}\n",
    );
    let lower = |k: &str, flags: &[&str]| lower_on("mosaic-gpu", k, flags);
    let pair = file("tests/in/scratch_pair.tk");
    let two = file("tests/in/two_kernels.tk");
    check(&[
        Case { kind: K::ScratchInMpmd, how: lower(&pair, &["--kernel", "copy_rows", "--kernel", "running_sum"]), first: "Scratch operands are not supported by the Mosaic GPU mpmd_map lowering".into() },
        Case { kind: K::MultipleKernels, how: lower(&two, &["--kernel", "scale", "--kernel", "shift"]), first: "Lowering multiple mesh/function pairs is not supported by the Mosaic GPU backend".into() },
        Case { kind: K::ExternalMeshes, how: lower(&add, &["--external-mesh", "device(x: 2)"]), first: "External meshes are not supported by the Mosaic GPU backend".into() },
        Case { kind: K::ForeignMesh, how: How::Call(mosaic_foreign_mesh), first: "Mesh grid(i: 8) is not supported by the Mosaic GPU backend".into() },
        Case { kind: K::DeviceMesh, how: lower(&add, &["--mesh", "device(x: 2, y: 4)"]), first: "Mesh device(x: 2, y: 4) is not supported by the Mosaic GPU backend".into() },
        Case { kind: K::MeshKind, how: How::Call(|| make_mesh("mosaic-gpu", "wgpu(i: 8)")), first: "the Mosaic GPU backend makes mosaic_gpu(...) meshes, not wgpu(...)".into() },
        Case { kind: K::DynamicGrid, how: lower(&file("tests/in/dyn_grid.tk"), &["--grid", "i=4"]), first: "dynamic grid bounds not supported in the Mosaic GPU backend".into() },
        Case {
            kind: K::ClusterRank,
            how: lower(&add, &["--mesh", "mosaic_gpu(i: 8, a: 1 cluster, b: 1 cluster, c: 1 cluster, d: 1 cluster)"]),
            first: "cluster= must be at most 3D, got Mesh(grid=(8,), grid_names=('i',), cluster=(1, 1, 1, 1), cluster_names=('a', 'b', 'c', 'd'), num_threads=None, thread_name=None).".into(),
        },
        Case {
            kind: K::ThreadsUnpaired,
            how: How::Call(|| {
                tessel_mosaic_gpu::MosaicGpuMesh::new(vec![("i".into(), 8)], vec![], Some(2), None).map(drop).map_err(|e| e.message.to_string())
            }),
            first: "num_threads and thread_name must be either both set or both None, got Mesh(grid=(8,), grid_names=('i',), cluster=(), cluster_names=(), num_threads=2, thread_name=None)".into(),
        },
        Case {
            kind: K::SeveralThreadAxes,
            how: lower(&add, &["--mesh", "mosaic_gpu(i: 8, a: 2 thread, b: 2 thread)"]),
            first: "num_threads and thread_name must be either both set or both None, got mosaic_gpu(i: 8, a: 2 thread, b: 2 thread)".into(),
        },
        Case {
            kind: K::TooManyThreads,
            how: lower(&add, &["--mesh", "mosaic_gpu(i: 8, wg: 17 thread)"]),
            first: "Requested too many CUDA threads per block. Each Mosaic thread corresponds to 128 CUDA threads. At most 16 are supported, got Mesh(grid=(8,), grid_names=('i',), cluster=(), cluster_names=(), num_threads=17, thread_name='wg')".into(),
        },
        Case { kind: K::BlockTooLarge, how: lower(&big, &[]), first: "block value %x has 16385 elements (f32[16385]), more than the 16384 the Mosaic GPU backend lowers".into() },
        Case { kind: K::TooManyCtas, how: lower(&wide, &[]), first: "the parallel grid has 4294967296 programs, more than the 2147483647 CTAs of one Mosaic GPU launch".into() },
        Case { kind: K::ArrayTooLarge, how: lower(&long, &[]), first: "argument `x` (f32[4294967424]) has 4294967424 elements, more than the 2147483647 the Mosaic GPU backend indexes".into() },
        Case { kind: K::Workspace, how: How::Elsewhere("a guard: 4 GiB of workspace per CTA takes tens of thousands of 64 KiB values"), first: String::new() },
        Case { kind: K::SharedMemory, how: How::Elsewhere("the shared memory of a device is known only on a Hopper GPU (scripts/gpu-check)"), first: String::new() },
        Case {
            kind: K::Unimplemented,
            how: lower(&twelve_threads, &[]),
            first: "Unimplemented primitive in Mosaic GPU lowering: barriers between 12 threads of one program (at most 8 warpgroups of a CTA run at once)".into(),
        },
    ]);
}

#[test]
fn every_wgpu_refusal_is_reached_with_its_words() {
    use tessel_wgpu::error::RefusalKind as K;
    let dir = tempfile::tempdir().unwrap();
    let add = file("examples/add.tk");
    let big = kernel(&dir, "big", "kernel big\n  in x: f32[65537]\n  out o: f32[65537]\n{\n  %x = load x\n  store o, %x\n}\n");
    let wide = kernel(
        &dir,
        "wide",
        "kernel wide\n  grid (i: 65536, j: 65536)\n  in x: f32[8]\n  out o: f32[8]\n{\n  %x = load x\n  %z = program_id i\n  %c = eq %z, 0\n  when %c {\n    store o, %x\n  }\n}\n",
    );
    let long = kernel(
        &dir,
        "long",
        "kernel long\n  in x: f32[2147483648] block [4] at (0)\n  out o: f32[4]\n{\n  %x = load x\n  store o, %x\n}\n",
    );
    let huge = kernel(
        &dir,
        "huge",
        "kernel huge\n  in x: f32[4]\n  out o: f32[2147483647] block [4] at (0)\n{\n  %x = load x\n  store o, %x\n}\n",
    );
    let seq_threads = kernel(
        &dir,
        "seq_threads",
        "kernel seq_threads\n  grid (k: 2 seq, wg: 2 thread)\n  in x: f32[16]\n  out o: f32[16]\n{\n  %wg = program_id wg\n  %first = eq %wg, 0\n  when %first {\n    %x = load x\n    store o, %x\n  }\n}\n",
    );
    // A load, 16,383 `add`s and a store: one statement past the limit.
    let adds: String = (1..16_384).map(|i| format!("  %v{i} = add %v{}, 1.0\n", i - 1)).collect();
    let chain = kernel(
        &dir,
        "chain",
        &format!("kernel chain\n  in x: f32[8]\n  out o: f32[8]\n{{\n  %v0 = load x\n{adds}  store o, %v16383\n}}\n"),
    );
    let out = dir.path().join("out").display().to_string();
    let lower = |k: &str, flags: &[&str]| lower_on("wgpu", k, flags);
    let adapter = wgpu_adapter("every wgpu refusal: the adapter's limits");
    let cases = vec![
        Case {
            kind: K::DeviceMesh,
            how: lower(&add, &["--mesh", "device(x: 2, y: 4)"]),
            first: "device(x: 2, y: 4) is a mesh of devices, not a kernel grid: the wgpu backend runs a kernel on one adapter"
                .into(),
        },
        Case {
            kind: K::ExternalAxisRole,
            how: lower(&add, &["--external-mesh", "mosaic_gpu(x: 2, wg: 2 thread)"]),
            first: "external mesh mosaic_gpu(x: 2, wg: 2 thread) has the thread axis `wg`, which only a kernel mesh can have"
                .into(),
        },
        Case {
            kind: K::ExternalAxisName,
            how: lower(&add, &["--external-mesh", "device(i: 2)"]),
            first: "external mesh device(i: 2) names `i`, which is also a grid axis of the kernel".into(),
        },
        Case {
            kind: K::BlockTooLarge,
            how: lower(&big, &[]),
            first: "block value %x has 65537 elements (f32[65537]), more than the 65536 the wgpu backend lowers".into(),
        },
        Case {
            kind: K::ArrayTooLarge,
            how: lower(&long, &[]),
            first: "argument `x` (f32[2147483648]) has 2147483648 elements, more than the 2147483647 the wgpu backend indexes"
                .into(),
        },
        Case {
            kind: K::TooManyPrograms,
            how: lower(&wide, &[]),
            first: "kernel `wide` has 4294967296 parallel programs, more than the 2147483648 the wgpu backend runs in one launch"
                .into(),
        },
        Case {
            kind: K::TooLong,
            how: lower(&chain, &[]),
            first: "kernel `chain` has 16385 statements, more than the 16384 the wgpu backend compiles (naga's shader compiler takes time quadratic in a function's length)".into(),
        },
        Case {
            kind: K::LoopBudget,
            how: match &adapter {
                Some(a) if a.contains("llvmpipe") => lower(&file("tests/in/long/long_loops.tk"), &[]),
                _ => How::Elsewhere("only on Mesa's llvmpipe, whose budget it is"),
            },
            first: "kernel `long_loops` makes 70001 loop iterations in one invocation, more than the 65533 this adapter's driver (Mesa's llvmpipe) runs before it silently stops every loop".into(),
        },
        Case {
            kind: K::Threads,
            how: lower(&seq_threads, &[]),
            first: "kernel `seq_threads` runs 2 threads per program each through the steps of `seq` axis `k` at its own pace, which the wgpu backend does not schedule".into(),
        },
        Case {
            kind: K::Workspace,
            how: How::Elsewhere("a guard: 128 MiB of workspace per program takes hundreds of 64 Ki-element values"),
            first: String::new(),
        },
        Case {
            kind: K::AdapterLimit,
            how: match &adapter {
                Some(_) => cli(&["run", &huge, "--backend", "wgpu", "--out-dir", &out]),
                None => How::Elsewhere("no wgpu adapter here (a counted skip)"),
            },
            first: String::new(),
        },
    ];
    // The adapter's limits and name vary: only the start of that line is fixed.
    let (limited, rest): (Vec<_>, Vec<_>) = cases.into_iter().partition(|c| c.kind == K::AdapterLimit);
    check(
        &rest
            .into_iter()
            .chain(limited.iter().map(|c| Case { kind: c.kind, how: How::Elsewhere("checked below"), first: String::new() }))
            .collect::<Vec<_>>(),
    );
    if let Some(how @ How::Cli(_)) = limited.first().map(|c| &c.how) {
        let text = refused("AdapterLimit", how).unwrap();
        assert!(
            text.starts_with(
                "an array of f32[2147483647] (8589934588 bytes on the device) needs 8589934588, more than this adapter's max"
            ),
            "{text}"
        );
        assert_eq!(text.lines().count(), 2, "{text}");
    }
}

#[test]
fn every_interpret_refusal_is_reached_with_its_words() {
    use tessel_interpret::error::RefusalKind as K;
    let dir = tempfile::tempdir().unwrap();
    let add = file("examples/add.tk");
    let big =
        kernel(&dir, "big", "kernel big\n  in x: f32[16777217]\n  out o: f32[16777217]\n{\n  %x = load x\n  store o, %x\n}\n");
    let long = kernel(
        &dir,
        "long",
        "kernel long\n  in x: f32[4294967297] block [4] at (0)\n  out o: f32[4]\n{\n  %x = load x\n  store o, %x\n}\n",
    );
    let lower = |k: &str, flags: &[&str]| lower_on("interpret", k, flags);
    check(&[
        Case {
            kind: K::DeviceMesh,
            how: lower(&add, &["--mesh", "device(x: 2)"]),
            first: "device(x: 2) describes devices for sharding, not a kernel's grid: the interpret backend runs one kernel on one CPU".into(),
        },
        Case { kind: K::MeshKind, how: How::Call(|| make_mesh("interpret", "wgpu(i: 8)")), first: "the interpret backend makes `grid(...)` meshes, not `wgpu(...)`".into() },
        Case { kind: K::ArrayTooLarge, how: lower(&long, &[]), first: "argument `x` (f32[4294967297]) has 4294967297 elements, more than the 4294967296 the interpret backend runs".into() },
        Case { kind: K::BlockTooLarge, how: lower(&big, &[]), first: "block value %x (f32[16777217]) has 16777217 elements, more than the 16777216 the interpret backend runs".into() },
        Case {
            kind: K::KeptInSeveralKernels,
            how: How::Call(|| common::kept_in_two_kernels("interpret", &[])),
            first: "output `o` starts from given contents (an aliased input) in a launch of several kernels, which the interpreter runs on fresh outputs".into(),
        },
    ]);
}

#[test]
fn every_shared_mesh_refusal_is_reached_with_its_words() {
    use MeshRefusalKind as K;
    let add = file("examples/add.tk");
    let free = file("tests/in/mesh_grid.tk");
    check(&[
        Case {
            kind: K::MissingAxis,
            how: cli(&["lower", &free, "--backend", "interpret", "--mesh", "grid(i: 4)"]),
            first: "kernel `mesh_grid` uses axis `j`, which the mesh grid(i: 4) does not name".into(),
        },
        Case {
            kind: K::MixesMeshAndGrid,
            how: cli(&["lower", &add, "--backend", "interpret", "--mesh", "grid(j: 8)"]),
            first: "i mixes mesh and grid axes".into(),
        },
    ]);
}
