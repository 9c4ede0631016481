//! The on-disk cache of lowered text: one file per launch key (see
//! `tessel_plugin_api::backend::cache_key`: kernel text, meshes, grid sizes, backend and versions)
//! in `TESSEL_CACHE_DIR`, else `$XDG_CACHE_HOME/tessel`, else `~/.cache/tessel`;
//! `TESSEL_CACHE=off` turns it off. Entries are written to a temporary file and renamed into place,
//! so several processes may share the folder; an entry that does not read back whole (or is over
//! [`crate::limits::CACHE_ENTRY`]) is ignored and written again.

use std::fmt::Write as _;
use std::path::PathBuf;

use tessel_plugin_api::abi::BackendError;

const MAGIC: &str = "tessel lowered-text cache v1";

/// What the cache did for one lowering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Read from this file.
    Hit(PathBuf),
    /// Lowered and written to this file (or `None` if it could not be written).
    Miss(Option<PathBuf>),
    /// Found this file unreadable or corrupt; lowered and wrote it again.
    Rewritten(PathBuf),
    /// The cache is off or has no folder.
    Off,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Hit(p) => write!(f, "hit, read {}", p.display()),
            Outcome::Miss(Some(p)) => write!(f, "miss, lowered and wrote {}", p.display()),
            Outcome::Miss(None) => write!(f, "miss, lowered (the cache folder is not writable)"),
            Outcome::Rewritten(p) => write!(f, "corrupt entry {} ignored, lowered and wrote it again", p.display()),
            Outcome::Off => write!(f, "off"),
        }
    }
}

/// The cache folder, if caching is on.
pub fn dir() -> Option<PathBuf> {
    if std::env::var("TESSEL_CACHE").is_ok_and(|v| v == "off") {
        return None;
    }
    if let Some(d) = std::env::var_os("TESSEL_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("tessel"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessel"))
}

fn hex(key: &[u8; 32]) -> String {
    key.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn encode(key: &str, stages: &[(String, String)]) -> String {
    let mut out = format!("{MAGIC}\nkey {key}\n");
    for (name, text) in stages {
        let _ = write!(out, "stage {} {}\n{text}\n", name.replace(char::is_whitespace, "_"), text.len());
    }
    out.push_str("end\n");
    out
}

fn decode(key: &str, text: &str) -> Option<Vec<(String, String)>> {
    let rest = text.strip_prefix(MAGIC)?.strip_prefix('\n')?;
    let mut rest = rest.strip_prefix(&format!("key {key}\n"))?;
    let mut stages = Vec::new();
    loop {
        if rest == "end\n" {
            return Some(stages);
        }
        let (line, after) = rest.split_once('\n')?;
        let mut words = line.strip_prefix("stage ")?.split(' ');
        let (name, len) = (words.next()?, words.next()?.parse::<usize>().ok()?);
        let body = after.get(..len)?;
        rest = after.get(len..)?.strip_prefix('\n')?;
        stages.push((name.to_string(), body.to_string()));
    }
}

/// The stages for `key`, from the cache or from `lower` (then stored).
pub fn lowered(
    key: &[u8; 32],
    lower: impl FnOnce() -> Result<Vec<(String, String)>, BackendError>,
) -> Result<(Vec<(String, String)>, Outcome), BackendError> {
    let Some(dir) = dir() else { return Ok((lower()?, Outcome::Off)) };
    let key = hex(key);
    let path = dir.join(format!("{key}.lowered"));
    let existed = path.exists();
    let text = crate::limits::read_to_string(&path, crate::limits::CACHE_ENTRY).ok();
    if let Some(stages) = text.as_deref().and_then(|t| decode(&key, t)) {
        return Ok((stages, Outcome::Hit(path)));
    }
    let stages = lower()?;
    let written = write(&dir, &path, &encode(&key, &stages));
    // Listing the folder on every new entry would add I/O to every lowering: one new entry in
    // 16 (by its key's first digit) does it, so the folder holds ENTRIES_KEPT and a few more.
    if written && !existed && key.starts_with('0') {
        prune(&dir);
    }
    let outcome = match (existed, written) {
        (true, true) => Outcome::Rewritten(path),
        (false, true) => Outcome::Miss(Some(path)),
        (_, false) => Outcome::Miss(None),
    };
    Ok((stages, outcome))
}

/// Entries kept on disk: past it, the least recently written go (oldest modification first),
/// checked on one new entry in 16.
pub const ENTRIES_KEPT: usize = 4096;

/// Removes the oldest entries of `dir` past [`ENTRIES_KEPT`]; a file that cannot be read or
/// removed is left (another process may be pruning too).
fn prune(dir: &std::path::Path) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<(std::time::SystemTime, std::path::PathBuf)> = read
        .filter_map(|e| {
            let e = e.ok()?;
            let path = e.path();
            (path.extension()? == "lowered").then_some(())?;
            Some((e.metadata().ok()?.modified().ok()?, path))
        })
        .collect();
    if entries.len() <= ENTRIES_KEPT {
        return;
    }
    entries.sort();
    for (_, path) in &entries[..entries.len() - ENTRIES_KEPT] {
        let _ = std::fs::remove_file(path);
    }
}

fn write(dir: &std::path::Path, path: &std::path::Path, text: &str) -> bool {
    let attempt = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        crate::staged::write(path, |w| w.write_all(text.as_bytes())).map_err(|f| f.source)
    };
    match attempt() {
        Ok(()) => true,
        Err(e) => {
            log::debug!("cannot write the cache entry {}: {e}", path.display());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_cache_keeps_its_bound_and_only_its_own_files() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..ENTRIES_KEPT + 3 {
            std::fs::write(dir.path().join(format!("{n:05}.lowered")), "x").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        prune(dir.path());
        let left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(left.iter().filter(|n| n.ends_with(".lowered")).count(), ENTRIES_KEPT);
        assert!(left.iter().any(|n| n == "notes.txt"));
    }

    #[test]
    fn entries_round_trip_and_damage_is_detected() {
        let stages = vec![("k.ptx".to_string(), "line 1\nline 2\n".to_string()), ("k.tk".to_string(), String::new())];
        let text = encode("abc", &stages);
        assert_eq!(decode("abc", &text), Some(stages));
        assert_eq!(decode("abd", &text), None, "another key");
        assert_eq!(decode("abc", &text[..text.len() - 3]), None, "truncated");
        assert_eq!(decode("abc", &text.replace("line 2", "line 22")), None, "a wrong length");
    }
}
