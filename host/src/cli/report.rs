//! `tessel backends`: every backend (source, version, platform, availability and its reason,
//! capabilities) and the plugins that failed to load, as text or JSON ([`backends_json`], which
//! the Python module prints too).

use std::io::Write;

use serde::Serialize;

use crate::{Result, Runtime};

/// One backend as `tessel backends --json` prints it.
#[derive(Serialize)]
struct BackendReport {
    name: String,
    source: String,
    version: String,
    /// What its lowering depends on besides the kernel and the version (`strategy cpu`), or empty.
    options: String,
    platform: String,
    available: bool,
    reason: String,
    /// The device class `auto` ranks by (`native`, `hardware`, `cpu`, `software`); absent when
    /// unavailable.
    class: Option<&'static str>,
    note: Option<String>,
    capabilities: CapabilityReport,
}

#[derive(Serialize)]
struct CapabilityReport {
    mesh_kinds: Vec<String>,
    portable_meshes: bool,
    dtypes: Vec<String>,
    dynamic_grid: bool,
    multiple_kernels: bool,
    external_meshes: bool,
    targets: Vec<String>,
    max_block_elements: u64,
}

#[derive(Serialize)]
struct FailedReport {
    path: String,
    error: String,
}

#[derive(Serialize)]
struct BackendsReport {
    backends: Vec<BackendReport>,
    failed_plugins: Vec<FailedReport>,
}

fn strings(v: &abi_stable::std_types::RVec<abi_stable::std_types::RString>) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// What `tessel backends --json` prints: every backend (source, version, platform, availability
/// and its reason, capabilities) and the plugins that failed to load, as JSON text.
pub fn backends_json(rt: &Runtime) -> String {
    serde_json::to_string_pretty(&backends_report(rt)).expect("the report serialises")
}

pub(super) fn backends(rt: &Runtime, json: bool, out: &mut dyn Write) -> Result<()> {
    let report = backends_report(rt);
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
        return Ok(());
    }
    for b in &report.backends {
        let state = if b.available { "available" } else { "unavailable" };
        let options = if b.options.is_empty() { String::new() } else { format!(", {}", b.options) };
        let _ = writeln!(out, "{} {}{options} ({})", b.name, b.version, b.source);
        match b.class {
            Some(class) => {
                let _ = writeln!(out, "  {state} ({class}): {}", b.reason);
            }
            None => {
                let _ = writeln!(out, "  {state}: {}", b.reason);
            }
        }
        if let Some(n) = &b.note {
            let _ = writeln!(out, "  note: {n}");
        }
        let c = &b.capabilities;
        let _ = writeln!(out, "  platform: {}", b.platform);
        let _ = writeln!(
            out,
            "  meshes: {}; dtypes: {}; targets: {}",
            c.mesh_kinds.join(" "),
            c.dtypes.join(" "),
            c.targets.join(" ")
        );
        let yes = |v: bool| if v { "yes" } else { "no" };
        let _ = writeln!(
            out,
            "  dynamic grid: {}; several kernels per launch: {}; external meshes: {}",
            yes(c.dynamic_grid),
            yes(c.multiple_kernels),
            yes(c.external_meshes)
        );
    }
    for f in &report.failed_plugins {
        let _ = writeln!(out, "failed plugin {}\n  {}", f.path, f.error.replace('\n', "\n  "));
    }
    Ok(())
}

fn backends_report(rt: &Runtime) -> BackendsReport {
    let reg = rt.registry();
    BackendsReport {
        backends: reg
            .backends
            .iter()
            .map(|b| {
                let a = b.backend.availability();
                let c = b.backend.capabilities();
                BackendReport {
                    name: b.name.clone(),
                    source: b.source.to_string(),
                    version: b.backend.version().into_string(),
                    options: b.backend.options().into_string(),
                    platform: b.backend.platform().into_string(),
                    available: a.available,
                    class: a.available.then(|| a.class.name()),
                    reason: a.reason.into_string(),
                    note: b.note.clone(),
                    capabilities: CapabilityReport {
                        mesh_kinds: strings(&c.mesh_kinds),
                        portable_meshes: c.portable_meshes,
                        dtypes: strings(&c.dtypes),
                        dynamic_grid: c.dynamic_grid,
                        multiple_kernels: c.multiple_kernels,
                        external_meshes: c.external_meshes,
                        targets: strings(&c.targets),
                        max_block_elements: c.max_block_elements,
                    },
                }
            })
            .collect(),
        failed_plugins: reg
            .failed
            .iter()
            .map(|f| FailedReport { path: f.path.display().to_string(), error: f.error.to_string() })
            .collect(),
    }
}
