//! `tessel bench`: compile and run times, rates of argument traffic and of `dot`s, as text or
//! JSON; and the timing of launches on arrays kept on the device, which `tune` uses too.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use serde::Serialize;
use tessel_plugin_api::ir::Verified;

use super::prepare::{LOWER_DEFAULT, LaunchFlags, Prepared, explain, prepare, random_inputs};
use crate::{LaunchArgs, Result, Runtime};

/// Floating-point operations of the `dot`s of a kernel over its whole grid (loops with literal
/// bounds counted by their trip count).
fn dot_flops(v: &Verified, grid_points: u64) -> u64 {
    use tessel_plugin_api::ir::{ForLoop, Literal, Op, Operand, Stmt};
    fn walk(v: &Verified, body: &[Stmt], times: u64) -> u64 {
        body.iter()
            .map(|s| match &s.op {
                Op::Dot { a, trans_a, .. } => {
                    let out = s.ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
                    let Operand::Value(a) = a else { return 0 };
                    // The last two dimensions are the matrices; any before them, the batch.
                    let sa = &v.value_type(a).shape;
                    let r = sa.len() - 2;
                    let k = if *trans_a { sa[r] } else { sa[r + 1] };
                    times * 2 * (out.iter().product::<usize>() * k) as u64
                }
                Op::When { body, .. } => walk(v, body, times),
                // As a `when` counts as if it ran: the dearer branch.
                Op::If(i) => walk(v, &i.then, times).max(walk(v, &i.els, times)),
                Op::For(ForLoop { lo, hi, step, body, .. }) => {
                    let lit = |o: &Operand| if let Operand::Lit(Literal::Int(n)) = o { Some(*n) } else { None };
                    let trips = match (lit(lo), lit(hi), step.as_ref().map_or(Some(1), lit)) {
                        (Some(l), Some(h), Some(st)) if st > 0 && h > l => ((h - l + st - 1) / st) as u64,
                        _ => 1,
                    };
                    walk(v, body, times * trips)
                }
                _ => 0,
            })
            .sum()
    }
    walk(v, &v.kernel().body, grid_points)
}

/// `tessel bench --json`: times in milliseconds, rates on the kernel's time on the device.
#[derive(Serialize)]
struct BenchReport {
    backend: String,
    /// The adapter or GPU, as the backend describes where it runs.
    target: String,
    kernel: String,
    /// The kernels' parameters (docs/language.md §9) as bound.
    params: BTreeMap<String, i64>,
    /// The sizes of `dyn` grid axes.
    grid: BTreeMap<String, u64>,
    compile_ms: f64,
    /// The launch alone on arrays already on the device (median), or `null` where the backend
    /// could not keep them there.
    kernel_ms: Option<f64>,
    /// How `kernel_ms` was taken: `gpu-timestamps` (the device's clock, from the start of the
    /// first dispatch to the end of the last) where the backend has them, else `submit-and-wait`
    /// (the launch and the wait for it, on the host clock).
    kernel_timing: &'static str,
    /// The launch and the wait for it on the host clock (median), arrays on the device.
    launch_ms: Option<f64>,
    run_ms: f64,
    runs: usize,
    bytes: u64,
    flops: u64,
    gbs: Option<f64>,
    gflops: Option<f64>,
}

pub(super) fn bench(
    rt: &Runtime,
    flags: &LaunchFlags,
    runs: usize,
    seed: u64,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    let p = prepare(rt, flags, LOWER_DEFAULT, &BTreeMap::new())?;
    rt.available(&p.backend)?;
    p.warn(err);
    if !json {
        explain(&p, flags, out);
    }
    let launch = LaunchArgs { inputs: random_inputs(&p, seed)?, grid: p.grid.clone() };
    let (compile, mut times) = p.planned(rt, |planned| {
        let start = Instant::now();
        planned.lower()?;
        let compile = start.elapsed();
        planned.launch(&launch)?;
        let times: Vec<f64> = (0..runs.max(1))
            .map(|_| {
                let t = Instant::now();
                planned.launch(&launch).map(|_| t.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?;
        Ok((compile, times))
    })?;
    times.sort_by(f64::total_cmp);
    let median = middle(&times);
    let resident = resident_times(rt, &p, &launch, runs.max(1));
    let bytes: u64 = p
        .kernels
        .iter()
        .flat_map(|k| k.kernel().params.iter())
        .filter(|a| a.kind != tessel_plugin_api::ir::ParamKind::Scratch)
        .map(|a| (a.ty.numel() as u64) * u64::from(a.ty.dtype.bits() / 8))
        .sum();
    let grid_points = |k: &Verified| -> u64 {
        k.grid()
            .iter()
            .map(|a| match a.size {
                tessel_plugin_api::ir::AxisSize::Fixed(n) => n,
                tessel_plugin_api::ir::AxisSize::Dyn => p.grid.get(&a.name).copied().unwrap_or(1),
            })
            .product()
    };
    let flops: u64 = p.kernels.iter().map(|k| dot_flops(k, grid_points(k))).sum();
    let names: Vec<&str> = p.kernels.iter().map(|k| k.name()).collect();
    if json {
        let launch_ms = resident.as_ref().ok().map(|t| middle(&t.host));
        let gpu = resident.as_ref().ok().and_then(|t| t.device.as_deref().map(middle));
        let on_device = gpu.or(launch_ms);
        let target = rt.backend(&p.backend).map(|b| b.backend.availability().reason).unwrap_or_default();
        let report = BenchReport {
            backend: p.backend.clone(),
            target: target.to_string(),
            kernel: names.join(","),
            params: p.values.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            grid: p.grid.clone(),
            compile_ms: compile.as_secs_f64() * 1e3,
            kernel_ms: on_device.map(|d| d * 1e3),
            kernel_timing: if gpu.is_some() { "gpu-timestamps" } else { "submit-and-wait" },
            launch_ms: launch_ms.map(|d| d * 1e3),
            run_ms: median * 1e3,
            runs: times.len(),
            bytes,
            flops,
            gbs: on_device.map(|d| bytes as f64 / d / 1e9),
            gflops: on_device.filter(|_| flops > 0).map(|d| flops as f64 / d / 1e9),
        };
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
        return Ok(());
    }
    let _ = writeln!(out, "bench `{}` on {} ({} runs after a warm-up)", names.join("`, `"), p.backend, times.len());
    let _ = writeln!(out, "  compile (lower, cold): {:.3} ms", compile.as_secs_f64() * 1e3);
    let _ = writeln!(out, "  run (median, with transfers): {}", spread(&times));
    // On the device: the launch alone, its arrays uploaded once before (submit and wait).
    let on_device = match &resident {
        Ok(t) => {
            let _ = writeln!(out, "  launch (median, arrays on the device, submit and wait): {}", spread(&t.host));
            match &t.device {
                Some(d) => {
                    let _ = writeln!(out, "  kernel (median, the device's clock, GPU timestamps): {}", spread(d));
                    Some(middle(d))
                }
                None => {
                    let _ = writeln!(out, "  kernel on the device's clock: not measured ({} has no GPU timestamps)", p.backend);
                    Some(middle(&t.host))
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  launch with arrays on the device: not measured ({e})");
            None
        }
    };
    let rates = |per: f64| match on_device {
        Some(d) => format!("{:.2} with transfers, {:.2} on the device", per / median / 1e9, per / d / 1e9),
        None => format!("{:.2}", per / median / 1e9),
    };
    let _ = writeln!(out, "  arguments: {:.2} MB, GB/s: {}", bytes as f64 / 1e6, rates(bytes as f64));
    if flops > 0 {
        let _ = writeln!(out, "  dot: {:.3} GFLOP, GFLOP/s: {}", flops as f64 / 1e9, rates(flops as f64));
    }
    Ok(())
}

/// Sorted times of `runs` launches (after a warm-up) on arrays uploaded to the backend once:
/// inputs as given, outputs allocated there; every array freed after.
/// The median of sorted times.
pub(super) fn middle(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

/// Sorted times in seconds as `median ms (min .., max ..)`.
fn spread(sorted: &[f64]) -> String {
    let ms = |t: f64| t * 1e3;
    format!("{:.3} ms (min {:.3}, max {:.3})", ms(middle(sorted)), ms(sorted[0]), ms(sorted[sorted.len() - 1]))
}

/// Times of launches on arrays uploaded once, in seconds, sorted: on the host clock (submit and
/// wait), and on the device's own where the backend has GPU timestamps (separate launches, so
/// that reading the timestamps back is not in the host's times).
pub(super) struct ResidentTimes {
    pub(super) host: Vec<f64>,
    pub(super) device: Option<Vec<f64>>,
}

pub(super) fn resident_times(rt: &Runtime, p: &Prepared, launch: &LaunchArgs, runs: usize) -> Result<ResidentTimes> {
    let mut arrays: Vec<(String, crate::DeviceArray)> = Vec::new();
    let result = (|| -> Result<ResidentTimes> {
        for k in &p.kernels {
            for a in k.kernel().params.iter().filter(|a| a.kind != tessel_plugin_api::ir::ParamKind::Scratch) {
                if arrays.iter().any(|(n, _)| n == &a.name) {
                    continue;
                }
                let d = match launch.inputs.get(&a.name) {
                    Some(h) => rt.upload(&p.backend, h)?,
                    None => rt.alloc(&p.backend, &a.ty)?,
                };
                arrays.push((a.name.clone(), d));
            }
        }
        let bound: Vec<(&str, &crate::DeviceArray)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let (mut host, device) = p.planned(rt, |planned| {
            planned.launch_resident(&bound, false)?;
            let host: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    planned.launch_resident(&bound, false).map(|_| t.elapsed().as_secs_f64())
                })
                .collect::<Result<_>>()?;
            let timed = |_| planned.launch_resident(&bound, true);
            let device: Option<Vec<f64>> =
                (0..runs).map(timed).collect::<Result<Vec<_>>>()?.into_iter().map(|d| d.map(|d| d.as_secs_f64())).collect();
            Ok((host, device))
        })?;
        host.sort_by(f64::total_cmp);
        let device = device.map(|mut d| {
            d.sort_by(f64::total_cmp);
            d
        });
        Ok(ResidentTimes { host, device })
    })();
    for (_, a) in arrays {
        rt.free(a);
    }
    result
}
