//! Draws docs/performance.svg from the last `cargo bench --bench wgpu` run: for each benchmark,
//! the hand-written kernels' median time over tessel's (above 1: tessel is faster), from the
//! estimates criterion keeps under target/criterion. `scripts/bench` runs it.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// (group, tessel's function, the baselines' functions with their labels).
const BENCHES: &[(&str, &[(&str, &str)])] = &[
    ("launch_tiny", &[("raw_wgpu_same_wgsl", "tiny launch: raw wgpu, same WGSL")]),
    ("add_16m", &[("raw_wgpu_vec4", "add 16M f32: hand-written vec4")]),
    (
        "matmul_1024",
        &[
            ("raw_wgpu_register_tiled_vec4", "matmul 1024³: hand-written register-tiled vec4"),
            ("raw_wgpu_naive", "matmul 1024³: hand-written naive"),
        ],
    ),
    ("softmax_16384", &[("raw_wgpu_row_per_invocation", "softmax 16384×512: hand-written, a row per invocation")]),
];

/// Criterion's median estimate (ns) of one benchmark.
fn median(criterion: &Path, group: &str, function: &str) -> Result<f64, String> {
    let path = criterion.join(group).join(function).join("new/estimates.json");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e} (run `cargo bench --bench wgpu` first)", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    v["median"]["point_estimate"].as_f64().ok_or_else(|| format!("{}: no median", path.display()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let criterion = std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), PathBuf::from).join("criterion");
    let mut bars: Vec<(String, f64)> = Vec::new();
    for (group, baselines) in BENCHES {
        let Ok(tessel) = median(&criterion, group, "tessel") else { continue };
        for (function, label) in *baselines {
            if let Ok(base) = median(&criterion, group, function) {
                bars.push((label.to_string(), base / tessel));
            }
        }
    }
    if bars.is_empty() {
        return Err(format!("no wgpu bench results under {}: run `cargo bench --bench wgpu` first", criterion.display()).into());
    }
    let out = root.join("docs/performance.svg");
    let height = 90 + 44 * bars.len() as u32;
    let area = SVGBackend::new(&out, (900, height)).into_drawing_area();
    area.fill(&WHITE)?;
    let top = bars.iter().map(|b| b.1).fold(1.0f64, f64::max).min(100.0) * 1.15;
    let mut chart = ChartBuilder::on(&area)
        .caption("tessel on wgpu (lavapipe): baseline time / tessel time (above 1: tessel faster)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(380)
        .build_cartesian_2d(0.0..top, (0..bars.len()).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or(String::new(), |b| b.0.clone()),
            _ => String::new(),
        })
        .x_desc("ratio")
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, r))| {
        let color = if *r >= 1.0 { GREEN.mix(0.7) } else { RED.mix(0.7) };
        Rectangle::new([(0.0, SegmentValue::Exact(i)), (r.min(top), SegmentValue::Exact(i + 1))], color.filled())
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, r))| {
        Text::new(format!("{r:.2}"), (r.min(top) + top * 0.01, SegmentValue::CenterOf(i)), ("sans-serif", 14))
    }))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(bars.len()))],
        BLACK.stroke_width(2),
    )))?;
    area.present()?;
    println!("wrote {}", out.display());
    for (label, r) in &bars {
        println!("{label}: {r:.2}");
    }
    Ok(())
}
