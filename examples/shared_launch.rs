//! One launch function, used unchanged for every backend this machine has: it builds the right
//! mesh for each backend from one portable spec (`Runtime::mesh_for`), asks the backend before
//! launching (`Runtime::plan`), and reports what ran where, or why not.
//!
//!     cargo run -p tessel-suite --example shared_launch
//!
//! The JAX Pallas version of this code needs a branch per backend: Mosaic GPU refuses a mesh it
//! did not make (`Mesh ... is not supported by the Mosaic GPU backend`).

use std::sync::Arc;

use tessel::{Call, Choice, Launch, LaunchArgs, Runtime};
use tessel_plugin_api::ir::Verified;

/// The shared launch code: one kernel, one portable mesh spec, any backend.
fn launch(rt: &Runtime, backend: &str, kernel: &Verified, mesh: &str, args: &LaunchArgs) -> Result<String, String> {
    let mesh = Arc::new(rt.mesh_for(backend, mesh).map_err(|e| format!("cannot make its mesh: {e}"))?);
    let launch = Launch::new([Call::on(kernel.clone(), mesh.clone())], [], args.grid.clone());
    let planned = rt
        .plan(Choice::Named(backend), &launch)
        .map_err(|e| format!("refuses the launch: {}", e.to_string().lines().next().unwrap_or("")))?;
    let b = rt.backend(backend).map_err(|e| e.to_string())?;
    let availability = b.backend.availability();
    if !availability.available {
        return Err(format!("takes the launch, but is unavailable here: {}", availability.reason));
    }
    let start = std::time::Instant::now();
    let got = planned.launch(args).map_err(|e| e.to_string())?;
    let took = start.elapsed();
    let want = rt
        .plan(Choice::Named("interpret"), &launch)
        .and_then(|p| p.launch(args))
        .map_err(|e| e.to_string())?;
    let (name, g) = &got[0];
    let ok = tessel_plugin_api::array::agreement(g, &want[0].1).within;
    Ok(format!(
        "ran on mesh {} in {:.2} ms; `{name}` {} the interpreter",
        mesh.display(),
        took.as_secs_f64() * 1e3,
        if ok { "agrees with" } else { "DISAGREES with" }
    ))
}

fn main() {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code, reason = "setting the environment before any thread exists")]
    unsafe {
        tessel::quiet_headless_mesa();
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/in/mesh_grid.tk");
    let kernels = tessel::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let kernel = &kernels[0];
    let rt = Runtime::new(&[]).unwrap_or_else(|e| panic!("{e}"));
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(kernel.kernel(), 1), grid: Default::default() };
    let mesh = "grid(i: 4, j: 2)";
    println!("kernel `{}` with the portable mesh {mesh}, on every backend:", kernel.name());
    for (b, _) in rt.ranked() {
        match launch(&rt, &b.name, kernel, mesh, &args) {
            Ok(report) => println!("  {}: {report}", b.name),
            Err(why) => println!("  {}: skipped, {why}", b.name),
        }
    }
    // `auto` in one call, with its report: where it ran, why, and what it cost.
    let m = rt.mesh_for("interpret", mesh).expect("mesh");
    let launch = Launch::new([Call::on(kernel.clone(), m)], [], args.grid.clone());
    // The loop above lowered the kernel on every backend, so `auto` finds it in the compile cache.
    for attempt in ["a", "another"] {
        match rt.plan(Choice::of("auto"), &launch).and_then(|p| p.run(&args)) {
            Ok(r) => {
                println!(
                    "--backend auto, {attempt} launch: ran on {} ({}, run {:.2} ms)",
                    r.backend,
                    if r.cache_hit {
                        "lowered before: from the compile cache".to_string()
                    } else {
                        format!("lowered in {:.2} ms", r.compile.as_secs_f64() * 1e3)
                    },
                    r.run.as_secs_f64() * 1e3
                );
                for l in r.decisions.iter().filter(|_| attempt == "a") {
                    println!("  {l}");
                }
            }
            Err(e) => println!("--backend auto finds no backend: {e}"),
        }
    }
}
