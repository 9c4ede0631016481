//! `tessel tune`: every combination of a kernel's candidates on one backend, each checked
//! against the interpreter and timed; the fastest written as a tuning record.

use std::collections::BTreeMap;
use std::io::Write;

use super::bench::{middle, resident_times};
use super::prepare::{LaunchFlags, parse_params, pick_kernels, prepare_with, random_inputs, read_inputs};
use super::run::compare;
use crate::{Error, LaunchArgs, Result, Runtime};

/// `tessel tune`: every combination of the candidates not given, on one backend.
pub(super) fn tune(
    rt: &Runtime,
    flags: &LaunchFlags,
    input_flags: &[String],
    runs: usize,
    seed: u64,
    out: &mut dyn Write,
) -> Result<()> {
    let Some(backend) = flags.backend.as_deref().filter(|b| *b != "auto") else {
        return Err(Error::Tune(
            "tessel tune needs --backend NAME: a tuning record is for one backend\n  name one of `tessel backends`".to_string(),
        ));
    };
    let loaded = rt.available(backend)?;
    let file = crate::read_kernels(&flags.file)?;
    let generics = pick_kernels(&flags.file, file.kernels(), &flags.kernels)?;
    let [kernel] = generics.as_slice() else {
        return Err(Error::Tune("tessel tune tunes one kernel at a time\n  give one --kernel NAME".to_string()));
    };
    let given = parse_params(&flags.params)?;
    crate::check_param_names(&generics, &given)?;
    let inputs = read_inputs(input_flags)?;
    let names: Vec<&str> = crate::tune::tunable(kernel).into_iter().filter(|n| !given.contains_key(*n)).collect();
    if names.is_empty() {
        return Err(Error::Tune(format!(
            "kernel `{}` has no parameter with candidates left to tune\n  declare candidates, as in `kernel {}[BM = 16 in (8, 16, 32)]`, and do not fix them all with --param",
            kernel.name(),
            kernel.name()
        )));
    }
    let combos = crate::tune::combinations(kernel, &names).map_err(|count| {
        Error::Tune(format!(
            "kernel `{}` has {count} combinations of candidates, more than {}\n  fix some parameters with --param P=V",
            kernel.name(),
            crate::tune::MAX_COMBINATIONS
        ))
    })?;
    let _ = writeln!(
        out,
        "tune `{}` on {backend}: {} candidate(s) of {}, {runs} timed runs each",
        kernel.name(),
        combos.len(),
        names.join(", ")
    );
    let bar = indicatif::ProgressBar::new(combos.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("  {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let describe = |c: &BTreeMap<String, i64>| c.iter().map(|(n, v)| format!("{n} = {v}")).collect::<Vec<_>>().join(", ");
    let mut trials = Vec::new();
    let mut shapes = BTreeMap::new();
    for combo in &combos {
        bar.set_message(describe(combo));
        let mut values = given.clone();
        values.extend(combo.clone());
        let trial = (|| -> Result<std::result::Result<f64, String>> {
            let p = prepare_with(rt, &file, flags, backend, &inputs, &values, false)?;
            shapes = crate::tune::shapes_of(kernel, &p.values);
            let launch = LaunchArgs {
                inputs: if inputs.is_empty() { random_inputs(&p, seed)? } else { inputs.clone() },
                grid: p.grid.clone(),
            };
            let got = p.planned(rt, |planned| planned.launch(&launch))?;
            let want = rt.plan(crate::Choice::Named(tessel_interpret::NAME), &p.launch())?.launch(&launch)?;
            let (lines, failed) = compare(&got, &want);
            if !failed.is_empty() {
                let detail = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join("; ");
                return Ok(Err(format!("DISAGREES with the interpreter, a bug of {backend}; not chosen ({detail})")));
            }
            let t = resident_times(rt, &p, &launch, runs.max(1))?;
            Ok(Ok(middle(t.device.as_deref().unwrap_or(&t.host)) * 1e3))
        })();
        let (kernel_ms, verdict) = match trial {
            Ok(Ok(ms)) => (Some(ms), "ok".to_string()),
            Ok(Err(v)) => (None, v),
            Err(e) => (None, format!("not run: {}", e.to_string().lines().next().unwrap_or_default())),
        };
        bar.suspend(|| {
            let _ = match kernel_ms {
                Some(ms) => writeln!(out, "  {}: {ms:.3} ms", describe(combo)),
                None => writeln!(out, "  {}: {verdict}", describe(combo)),
            };
        });
        bar.inc(1);
        // Standard output that cannot be written ends the tuning here, not after every candidate.
        out.flush().map_err(Error::Stdout)?;
        trials.push(crate::tune::Trial { values: combo.clone(), kernel_ms, verdict });
    }
    bar.finish_and_clear();
    let best = trials
        .iter()
        .filter_map(|t| Some((t, t.kernel_ms?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(t, ms)| (t.values.clone(), ms));
    let Some((chosen, ms)) = best else {
        return Err(Error::Tune(format!("no candidate of `{}` ran and agreed with the interpreter on {backend}", kernel.name())));
    };
    let _ = writeln!(out, "chosen: {} ({ms:.3} ms)", describe(&chosen));
    let record = crate::tune::record(kernel, loaded, shapes.clone(), chosen, trials);
    match crate::tune::path(kernel, &shapes, loaded) {
        Some(path) => {
            let existed = matches!(crate::tune::lookup(kernel, &shapes, loaded), crate::tune::Lookup::Corrupt(..));
            crate::tune::write(&path, &record).map_err(|source| Error::Write { path: path.clone(), source })?;
            let note = if existed { " (it replaces a record that did not read back)" } else { "" };
            let _ = writeln!(out, "record: {}{note}", path.display());
        }
        None => {
            let _ = writeln!(out, "record: not written (the cache is off: TESSEL_CACHE=off or no cache folder)");
        }
    }
    Ok(())
}
