//! Tuning records (docs/language.md §9): what `tessel tune` chose for a generic kernel, kept in the
//! cache folder and read by `run` and `bench` for the parameters a launch does not give.
//!
//! A record is keyed by the kernel's canonical generic text, the values of its parameters that
//! have no candidates (the shapes), and the backend with its build and target: a record made for
//! other shapes, another adapter or an older build is simply not found. Records are JSON, written
//! whole (`crate::staged`); one that does not read back, is over [`crate::limits::TUNING_RECORD`],
//! chooses a value outside the kernel's candidates, or gives values the kernel cannot be
//! specialized with, is ignored with a warning naming its file, and the next `tune` writes it
//! again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessel_plugin_api::ir::generic::Generic;

use crate::registry::Loaded;

/// The version of the record format.
const FORMAT: u32 = 1;

/// The most candidate combinations one `tune` runs.
pub const MAX_COMBINATIONS: usize = 256;

/// One candidate combination as `tune` found it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Trial {
    /// The values of the tuned parameters.
    pub values: BTreeMap<String, i64>,
    /// The kernel's time on the device (median, ms), where it ran and agreed.
    pub kernel_ms: Option<f64>,
    /// `ok`, or why it was not a choice (refused, failed, disagreed with the interpreter).
    pub verdict: String,
}

/// A tuning record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The record format.
    pub format: u32,
    /// The kernel.
    pub kernel: String,
    /// The backend.
    pub backend: String,
    /// Where it ran (the adapter or GPU, as the backend says).
    pub target: String,
    /// The parameters without candidates, as bound when tuning.
    pub shapes: BTreeMap<String, i64>,
    /// The fastest combination that agreed with the interpreter.
    pub chosen: BTreeMap<String, i64>,
    /// Every combination tried.
    pub trials: Vec<Trial>,
}

/// What looking for a record found.
#[derive(Debug)]
pub enum Lookup {
    /// A record for this launch.
    Found(Record, PathBuf),
    /// A file that is not a record (or of another format): ignored.
    Corrupt(PathBuf, String),
    /// None (or no cache folder).
    Missing,
}

/// What a launch takes from the tuning records for one kernel on one backend.
#[derive(Debug, Default)]
pub struct Tuned {
    /// Values for the tuned parameters the launch does not give.
    pub values: BTreeMap<String, i64>,
    /// The record they came from.
    pub record: Option<PathBuf>,
    /// A record that was there and could not be read (ignored).
    pub warning: Option<String>,
}

/// The values the record of `kernel` on `backend` gives for a launch with `given` values on
/// inputs of `shapes` (by argument name); nothing where the kernel has nothing to tune, the
/// launch does not bind, or there is no record.
pub fn tuned(kernel: &Generic, given: &BTreeMap<String, i64>, shapes: &BTreeMap<String, Vec<usize>>, backend: &Loaded) -> Tuned {
    if tunable(kernel).is_empty() {
        return Tuned::default();
    }
    // The shapes key the record: bind once without it to know them.
    let Ok(b) = kernel.bind(given, &BTreeMap::new(), shapes) else { return Tuned::default() };
    match lookup(kernel, &shapes_of(kernel, &b.values), backend) {
        Lookup::Found(r, path) => Tuned {
            values: r.chosen.into_iter().filter(|(n, _)| !given.contains_key(n)).collect(),
            record: Some(path),
            warning: None,
        },
        Lookup::Corrupt(path, why) => ignored(&path, &why),
        Lookup::Missing => Tuned::default(),
    }
}

/// Nothing from the record at `path`, with the warning that says why it was ignored.
pub fn ignored(path: &Path, why: &str) -> Tuned {
    Tuned {
        warning: Some(format!("tuning record {} ignored ({why}); `tessel tune` writes it again", path.display())),
        ..Tuned::default()
    }
}

/// The parameters `tune` may choose: those with candidates.
pub fn tunable(kernel: &Generic) -> Vec<&str> {
    kernel.params().iter().filter(|p| !p.candidates.is_empty()).map(|p| p.name.as_str()).collect()
}

/// The values of the parameters without candidates, from a binding's values.
pub fn shapes_of(kernel: &Generic, values: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    kernel
        .params()
        .iter()
        .filter(|p| p.candidates.is_empty())
        .filter_map(|p| Some((p.name.clone(), *values.get(&p.name)?)))
        .collect()
}

/// Every combination of the candidates of `names` (none given), in declaration order, the last
/// parameter fastest; `Err(count)` past [`MAX_COMBINATIONS`].
pub fn combinations(kernel: &Generic, names: &[&str]) -> Result<Vec<BTreeMap<String, i64>>, usize> {
    let lists: Vec<(&str, &[i64])> = kernel
        .params()
        .iter()
        .filter(|p| names.contains(&p.name.as_str()))
        .map(|p| (p.name.as_str(), p.candidates.as_slice()))
        .collect();
    let count = lists.iter().try_fold(1usize, |n, (_, c)| n.checked_mul(c.len())).unwrap_or(usize::MAX);
    if count > MAX_COMBINATIONS {
        return Err(count);
    }
    let mut out = vec![BTreeMap::new()];
    for (name, cands) in lists {
        out = out
            .into_iter()
            .flat_map(|base| {
                cands.iter().map(move |&c| {
                    let mut m = base.clone();
                    m.insert(name.to_string(), c);
                    m
                })
            })
            .collect();
    }
    Ok(out)
}

/// The record file for `kernel` with `shapes` on `backend`, if there is a cache folder.
pub fn path(kernel: &Generic, shapes: &BTreeMap<String, i64>, backend: &Loaded) -> Option<PathBuf> {
    let mut h = blake3::Hasher::new();
    let mut field = |s: &str| {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field("tessel tuning record v1");
    field(kernel.template_text());
    for (k, v) in shapes {
        field(&format!("{k}={v}"));
    }
    field(&backend.name);
    field(backend.backend.version().as_str());
    field(backend.backend.options().as_str());
    field(&crate::registry::build_identity(&backend.source));
    field(backend.backend.availability().reason.as_str());
    Some(crate::cache::dir()?.join("tune").join(format!("{}.json", h.finalize().to_hex())))
}

/// The record for `kernel` with `shapes` on `backend`.
pub fn lookup(kernel: &Generic, shapes: &BTreeMap<String, i64>, backend: &Loaded) -> Lookup {
    let Some(path) = path(kernel, shapes, backend) else { return Lookup::Missing };
    let text = match crate::limits::read_to_string(&path, crate::limits::TUNING_RECORD) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
        Err(e) => return Lookup::Corrupt(path, e.to_string()),
    };
    match serde_json::from_str::<Record>(&text) {
        Ok(r) if r.format == FORMAT && r.kernel == kernel.name() && r.shapes == *shapes => match unfit(kernel, &r.chosen) {
            Some(why) => Lookup::Corrupt(path, why),
            None => Lookup::Found(r, path),
        },
        Ok(r) if r.format != FORMAT => Lookup::Corrupt(path, format!("format {} (this build reads {FORMAT})", r.format)),
        Ok(_) => Lookup::Corrupt(path, "it is for another kernel or other shapes".to_string()),
        Err(e) => Lookup::Corrupt(path, e.to_string()),
    }
}

/// Why a record's chosen values cannot be `kernel`'s: a parameter it lacks or has no
/// candidates for, or a value not among the candidates (a record edited by hand, or written for
/// an older version of the kernel's text with the same shapes). `None` if they fit.
fn unfit(kernel: &Generic, chosen: &BTreeMap<String, i64>) -> Option<String> {
    chosen.iter().find_map(|(name, value)| {
        let Some(p) = kernel.params().iter().find(|p| &p.name == name) else {
            return Some(format!("it chooses `{name}`, which kernel `{}` does not have", kernel.name()));
        };
        let list = || p.candidates.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        if p.candidates.is_empty() {
            Some(format!("it chooses `{name}`, which has no candidates to tune"))
        } else if !p.candidates.contains(value) {
            Some(format!("it chooses {name} = {value}, which is not one of its candidates ({})", list()))
        } else {
            None
        }
    })
}

/// A new record (format filled in).
pub fn record(
    kernel: &Generic,
    backend: &Loaded,
    shapes: BTreeMap<String, i64>,
    chosen: BTreeMap<String, i64>,
    trials: Vec<Trial>,
) -> Record {
    Record {
        format: FORMAT,
        kernel: kernel.name().to_string(),
        backend: backend.name.clone(),
        target: backend.backend.availability().reason.into_string(),
        shapes,
        chosen,
        trials,
    }
}

/// Writes `record` to `path` whole (temporary file, then rename).
pub fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    let dir = path.parent().expect("records live in a folder");
    std::fs::create_dir_all(dir)?;
    crate::staged::write(path, |w| {
        serde_json::to_writer_pretty(&mut *w, record).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    })
    .map_err(|f| f.source)
}
