//! Random differential testing: well-typed kernels made from a seed (elementwise chains,
//! reductions with broadcasting back, `dot` (transposed, and on f16/bf16 operands), masks from
//! `iota`, ragged blocks, `when`, `if`, `for` with carried values, `for ... while` with a
//! data-dependent trip count, computed block indices reading a table, strided loads, integer
//! chains, outputs revisited along a `seq` axis) run on the interpreter, on wgpu, and as Mosaic GPU PTX on the PTX
//! emulator, with the same seeded inputs; they must
//! agree within the dtype's tolerance (exact for integers). A disagreement is shrunk (fewer
//! steps, smaller blocks, while it still disagrees) and saved under `tests/in/regressions/`,
//! where `tests/wgpu.rs` and `tests/mosaic.rs` run it from then on.
//!
//! A third of the kernels also compute an `e` output at the edges of the float operations:
//! special literals (`inf`, `nan`, `-0.0`, huge and tiny) as operands of `add sub mul div rem
//! pow max min` on either side, blocks with special values masked in, and `exp`, `log`, `sin`,
//! `cos`, `tanh`, `logistic`, `pow` and `rem` of arguments scaled to their edges. Only values
//! every backend computes bit for bit (the inputs, exact operations) feed them, so that a
//! 2-ulp difference upstream cannot become a different `sin(1e30 x)`.
//!
//! `TESSEL_RANDOM_KERNELS=N` sets how many kernels (default 60; the closing notes record runs of
//! thousands). `TESSEL_RANDOM_SEED=S` starts elsewhere.

//!
//! `generate.rs` makes the kernels ([`Spec`], [`generate`]); this file runs them and shrinks
//! disagreements.

#[path = "../common/mod.rs"]
mod common;
mod generate;

use common::*;
use generate::{Spec, generate};
use tessel::{LaunchArgs, Runtime};

/// What runs a kernel against the interpreter.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Wgpu,
    /// The Mosaic GPU backend's PTX on the PTX emulator; threads in reverse order for odd seeds.
    MosaicEmulated,
    /// The cpu backend's plugin (C compiled for this machine).
    Cpu,
}

/// `Ok` if `target` agrees with the interpreter on the kernel, else what differs.
fn differ(rt: &Runtime, target: Target, text: &str, seed: u64) -> Result<(), String> {
    let kernels = tessel::load_source("random.tk", text).map_err(|e| format!("does not verify: {e}"))?;
    let k = &kernels[0];
    let call = [tessel::Call::new(k.clone())];
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), seed), grid: Default::default() };
    let want = launched(&rt, "interpret", &call, &args).map_err(|e| format!("interpret: {e}"))?;
    // The interpreter's fused runs give the bits of its statements one by one.
    let unfused = tessel_interpret::compile_unfused(k).run(&args).map_err(|e| format!("interpret, unfused: {e}"))?;
    for ((name, w), (_, u)) in want.iter().zip(&unfused) {
        if w.to_bits() != u.to_bits() {
            return Err(format!("output {name}: the interpreter's fused program differs from its statements one by one"));
        }
    }
    let got = match target {
        Target::Wgpu => match launched(&rt, "wgpu", &call, &args) {
            // A driver's loop budget (Mesa's llvmpipe) refuses the long loops: right, not a
            // disagreement.
            Err(e) if e.to_string().contains("silently stops every loop") => return Ok(()),
            r => r.map_err(|e| format!("wgpu: {e}"))?,
        },
        Target::Cpu => launched(&rt, "cpu", &call, &args).map_err(|e| format!("cpu: {e}"))?,
        Target::MosaicEmulated => {
            let (_, ptx) = lowered(&rt, "mosaic-gpu", &call).map_err(|e| format!("mosaic-gpu: {e}"))?.remove(0);
            if let Some(ptxas) = ptxas() {
                assemble(&ptxas, "random", &ptx).map_err(|e| format!("ptxas refuses the PTX: {e}"))?;
            }
            emulate(&ptx, k, &args, seed % 2 == 1).map_err(|e| format!("mosaic-gpu (emulated): {e}"))?
        }
    };
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let a = tessel_plugin_api::array::agreement(g, w);
        if !a.within {
            return Err(format!("output {name}: max abs error {} beyond {:?}", a.max_abs_error, a.tolerance));
        }
    }
    Ok(())
}

/// The smallest spec derived from `s` that still disagrees: fewer steps, then smaller blocks
/// and grids.
fn shrink(rt: &Runtime, target: Target, mut s: Spec) -> Spec {
    loop {
        let candidates = [
            Spec { steps: s.steps.saturating_sub(1).max(1), ..s.clone() },
            Spec { r: (s.r / 2).max(1), short_r: 0, ..s.clone() },
            Spec { c: (s.c / 2).max(1), short_c: 0, ..s.clone() },
            Spec { gi: 1, ..s.clone() },
            Spec { gj: 1, ..s.clone() },
            Spec { short_r: 0, short_c: 0, ..s.clone() },
            Spec { edges: s.edges.saturating_sub(1).max(usize::from(s.edges > 0)), ..s.clone() },
        ];
        let next = candidates.into_iter().find(|c| {
            let smaller = (c.steps, c.r, c.c, c.gi, c.gj, c.short_r + c.short_c, c.edges)
                != (s.steps, s.r, s.c, s.gi, s.gj, s.short_r + s.short_c, s.edges);
            smaller && differ(rt, target, &generate(c), c.seed).is_err()
        });
        match next {
            Some(c) => s = c,
            None => return s,
        }
    }
}

/// Runs the seeded kernels on `target`; the disagreements, each shrunk and saved.
fn run_random(rt: &Runtime, target: Target) -> (u64, u64, Vec<String>) {
    let count: u64 = std::env::var("TESSEL_RANDOM_KERNELS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let start: u64 = std::env::var("TESSEL_RANDOM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut failures = Vec::new();
    for seed in start..start + count {
        let spec = Spec::random_for(seed, target);
        let text = generate(&spec);
        if let Err(e) = differ(rt, target, &text, seed) {
            let small = shrink(rt, target, spec);
            let text = generate(&small);
            let why = differ(rt, target, &text, small.seed).err().unwrap_or(e);
            let dir = root().join("tests/in/regressions");
            std::fs::create_dir_all(&dir).unwrap();
            let name = match target {
                Target::Wgpu => format!("random_{seed}"),
                Target::MosaicEmulated => format!("random_mosaic_{seed}"),
                Target::Cpu => format!("random_cpu_{seed}"),
            };
            let path = dir.join(format!("{name}.tk"));
            let why_lines: String = why.lines().map(|l| format!("# {}\n", l.trim_end())).collect();
            std::fs::write(&path, format!("# found by tests/random_kernels/, shrunk:\n{why_lines}{text}")).unwrap();
            failures.push(format!("seed {seed}: {why} (shrunk into {})", path.display()));
        }
    }
    (count, start, failures)
}

#[test]
fn random_kernels_agree_on_interpret_and_wgpu() {
    let Some(adapter) = wgpu_adapter("random differential kernels") else { return };
    let rt = Runtime::new(&[]).unwrap();
    let (count, start, failures) = run_random(&rt, Target::Wgpu);
    eprintln!("{count} random kernels from seed {start} on {adapter}: {} disagreements", failures.len());
    assert!(failures.is_empty(), "wgpu disagrees with the interpreter:\n{}", failures.join("\n"));
}

#[test]
fn random_kernels_agree_on_interpret_and_cpu() {
    let Some(plugin) = cpu_plugin("random differential kernels on cpu") else { return };
    let rt = Runtime::new(&[plugin]).unwrap();
    let (count, start, failures) = run_random(&rt, Target::Cpu);
    eprintln!("{count} random kernels from seed {start} on cpu: {} disagreements", failures.len());
    assert!(failures.is_empty(), "cpu disagrees with the interpreter:\n{}", failures.join("\n"));
}

#[test]
fn random_kernels_agree_on_interpret_and_emulated_mosaic_ptx() {
    let rt = Runtime::new(&[]).unwrap();
    let (count, start, failures) = run_random(&rt, Target::MosaicEmulated);
    eprintln!("{count} random kernels from seed {start} as emulated Mosaic GPU PTX: {} disagreements", failures.len());
    assert!(failures.is_empty(), "the emulated Mosaic GPU PTX disagrees with the interpreter:\n{}", failures.join("\n"));
}

#[test]
fn the_generator_makes_kernels_that_verify_and_vary() {
    let texts: Vec<String> = (1..=200).map(|seed| generate(&Spec::random(seed))).collect();
    for t in &texts {
        tessel::load_source("random.tk", t).unwrap_or_else(|e| panic!("{e}\n{t}"));
    }
    for op in [
        "dot",
        "sum",
        "for",
        "when",
        "select",
        "iota",
        "seq",
        "rem",
        "exp",
        "trans_a",
        ": f16",
        ": bf16",
        "store e",
        ", inf",
        "nan",
        "-0.0",
        "pow",
        "e30",
        "for %long = 0 to 700",
        "{\n  when ",
        "t[",
        "select(",
        ") / (",
        "while %",
        ", 3)]",
        "round",
        "stride (2, 1)",
        "load y[%gi, :]",
        " = if %",
        "  } else {",
    ] {
        assert!(texts.iter().any(|t| t.contains(op)), "no generated kernel uses {op}");
    }
    // The narrow integers, one of them at least (each alone is drawn rarely).
    assert!(texts.iter().any(|t| [": i8", ": u8", ": i16", ": u16"].iter().any(|d| t.contains(d))), "no narrow integer");
    // The stress classes are drawn, among the 60 kernels `scripts/test` runs too.
    let specs: Vec<Spec> = (1..=60).map(Spec::random).collect();
    assert!(specs.iter().any(|s| s.trips >= 70_000), "no long loop in the first 60");
    assert!(specs.iter().any(|s| s.depth >= 16 && !s.seq), "no deep nesting in the first 60");
    assert!(specs.iter().any(|s| s.wide && s.gi >= 200), "no wide grid in the first 60");
    assert!(specs.iter().any(|s| s.big && s.r * s.c >= 8192), "no big block in the first 60");
}
