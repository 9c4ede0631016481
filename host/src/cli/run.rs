//! `tessel run` (launch once, write the outputs, `--check` against the interpreter) and
//! `tessel lower` (the backend's text for a launch, or with `--plan` its plan), and the comparison of outputs with the
//! interpreter's that `run --check` and `tune` share.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tessel_plugin_api::array::agreement;

use super::prepare::{LOWER_DEFAULT, LaunchFlags, RUN_DEFAULT, explain, prepare, random_inputs, read_inputs};
use crate::{Error, HostArray, LaunchArgs, Result, Runtime};

pub(super) fn lower(rt: &Runtime, flags: &LaunchFlags, plan: bool, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    let p = prepare(rt, flags, LOWER_DEFAULT, &BTreeMap::new())?;
    p.warn(err);
    explain(&p, flags, out);
    if plan {
        let text = p.planned(rt, |planned| planned.plan_text())?;
        let _ = write!(out, "// ---- plan ({}) ----\n{text}", p.backend);
        return Ok(());
    }
    let (stages, cache) = p.planned(rt, |planned| planned.lower_cached())?;
    if flags.explain {
        let _ = writeln!(out, "cache: {cache}");
    }
    for (name, text) in stages {
        let _ = writeln!(out, "// ---- {name} ({}) ----\n{text}", p.backend);
    }
    Ok(())
}

pub(super) struct RunOptions {
    pub(super) inputs: Vec<String>,
    pub(super) seed: u64,
    pub(super) out_dir: Option<PathBuf>,
    pub(super) check: bool,
}

pub(super) fn run(rt: &Runtime, flags: &LaunchFlags, opts: &RunOptions, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    // `TESSEL_LOG=debug` times each phase of the process.
    let mut phase = Instant::now();
    let mut lap = |what: &str| {
        log::debug!("{what}: {:.2} ms", phase.elapsed().as_secs_f64() * 1e3);
        phase = Instant::now();
    };
    // Random inputs and the interpreter run on rayon's pool: its threads start (about a third of
    // a millisecond each) while this one reads and parses.
    rayon::spawn(|| ());
    let given = read_inputs(&opts.inputs)?;
    lap("read the inputs");
    let p = prepare(rt, flags, RUN_DEFAULT, &given)?;
    lap("parsed, verified and chose the backend");
    // A backend named but unavailable is refused before inputs are made for it.
    rt.available(&p.backend)?;
    p.planned(rt, |planned| {
        planned.warm_up();
        Ok(())
    })?;
    p.warn(err);
    explain(&p, flags, out);
    let inputs = if given.is_empty() { random_inputs(&p, opts.seed)? } else { given };
    lap("made the random inputs");
    let launch = LaunchArgs { inputs, grid: p.grid.clone() };
    let start = Instant::now();
    let outputs = p.planned(rt, |planned| planned.launch(&launch))?;
    let elapsed = start.elapsed();
    lap("launched");
    let names: Vec<&str> = p.kernels.iter().map(|k| k.name()).collect();
    let _ = writeln!(out, "ran `{}` on {} in {:.2} ms", names.join("`, `"), p.backend, elapsed.as_secs_f64() * 1e3);
    let report = if opts.check {
        if p.backend == tessel_interpret::NAME {
            let _ = writeln!(
                out,
                "  note: --check compares the interpreter with itself{}",
                if p.explanation.is_empty() {
                    ""
                } else {
                    " (no other backend here is faster and takes this launch; --explain says why)"
                }
            );
        }
        let reference = rt.plan(crate::Choice::Named(tessel_interpret::NAME), &p.launch())?.launch(&launch)?;
        Some(compare(&outputs, &reference))
    } else {
        None
    };
    if opts.check {
        lap("ran the interpreter for --check");
    }
    let dir = opts.out_dir.clone().unwrap_or_else(|| PathBuf::from("tessel-out").join(names.join("+")));
    // Standard output that cannot be written fails the command: before the outputs, not after.
    out.flush().map_err(Error::Stdout)?;
    write_outputs(&dir, &outputs)?;
    for (name, array) in &outputs {
        let _ = writeln!(out, "  {name}: {} -> {}", array.ty(), dir.join(format!("{name}.npy")).display());
    }
    lap("wrote the outputs");
    if let Some((lines, failed)) = report {
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        if !failed.is_empty() {
            return Err(Error::CheckFailed(format!("{} beyond tolerance against interpret", failed.join(", "))));
        }
    }
    Ok(())
}

/// Writes every output as `DIR/NAME.npy`, all or none ([`crate::staged::Batch`]): on a failure
/// no output is new, none is changed, no temporary is left, and a folder made for them is
/// removed again.
fn write_outputs(dir: &Path, outputs: &[(String, HostArray)]) -> Result<()> {
    let made = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|source| Error::Write { path: dir.to_path_buf(), source })?;
    let written = (|| {
        let mut batch = crate::staged::Batch::new();
        for (name, array) in outputs {
            batch.add(&dir.join(format!("{name}.npy")), |w| crate::npy::write_to(w, array))?;
        }
        batch.commit()
    })();
    written.map_err(|f| {
        if made {
            let _ = std::fs::remove_dir(dir);
        }
        Error::Write { path: f.path, source: f.source }
    })
}

/// A report line per output and the outputs beyond their dtype's tolerance.
pub(super) fn compare(outputs: &[(String, HostArray)], reference: &[(String, HostArray)]) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for ((name, got), (_, want)) in outputs.iter().zip(reference) {
        let a = agreement(got, want);
        lines.push(format!(
            "  check {name}: max abs error {:e} against interpret (tolerance {:e} + {:e}*|x|): {}",
            a.max_abs_error,
            a.tolerance.atol,
            a.tolerance.rtol,
            if a.within { "ok" } else { "MISMATCH" }
        ));
        if !a.within {
            failed.push(name.clone());
        }
    }
    (lines, failed)
}
