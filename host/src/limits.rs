//! The most tessel reads of a file it reads whole, and reading within it. A file past its limit
//! (or one that never ends, as `/dev/zero`) is an error after `limit + 1` bytes, never a process
//! that grows until memory runs out. `.npy` inputs are not read here: their header gives their
//! size, checked against the file's length before anything is allocated (`crate::npy`).

use std::io::{self, Read};
use std::path::Path;

/// The most bytes of a kernel file (`.tk`): 16 MiB, a thousand times the largest example.
pub const KERNEL_FILE: u64 = 16 << 20;
/// The most bytes of a tuning record (at most 256 trials of a few hundred bytes each).
pub const TUNING_RECORD: u64 = 4 << 20;
/// The most bytes of a lowered-text cache entry.
pub const CACHE_ENTRY: u64 = 64 << 20;

/// A file larger than what tessel reads of its kind.
#[derive(Clone, Copy, Debug)]
pub struct TooLarge {
    /// Its size, where the file system tells it (not for a device or a pipe).
    pub size: Option<u64>,
    /// The limit.
    pub limit: u64,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.size {
            Some(size) if size < 1024 => write!(f, "it is {size} bytes, more than the {} tessel reads", show(self.limit)),
            Some(size) => write!(f, "it is {} ({size} bytes), more than the {} tessel reads", show(size), show(self.limit)),
            None => write!(f, "it goes on past the {} tessel reads", show(self.limit)),
        }
    }
}

impl std::error::Error for TooLarge {}

/// Bytes in binary units: `16 MiB`, `1.5 KiB`, `17 bytes`.
pub fn show(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let (mut v, mut unit) = (bytes as f64 / 1024.0, 0);
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v.fract() == 0.0 { format!("{v} {}", UNITS[unit]) } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// The whole of `path`, if it has at most `limit` bytes; past it, an error of kind
/// `InvalidData` holding a [`TooLarge`] (see [`too_large`]).
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let size = meta.is_file().then_some(meta.len());
    if size.is_some_and(|s| s > limit) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, TooLarge { size, limit }));
    }
    let mut bytes = Vec::with_capacity(size.unwrap_or(0) as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::InvalidData, TooLarge { size, limit }));
    }
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

/// The [`TooLarge`] an error of [`read`] holds, if that was the problem.
pub fn too_large(e: &io::Error) -> Option<&TooLarge> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<TooLarge>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_its_limit_is_refused_and_an_endless_one_stops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.tk");
        std::fs::write(&path, "x".repeat(100)).unwrap();
        assert_eq!(read(&path, 100).unwrap().len(), 100);
        let e = read(&path, 99).unwrap_err();
        assert_eq!(e.to_string(), "it is 100 bytes, more than the 99 bytes tessel reads");
        assert_eq!(too_large(&e).map(|t| (t.size, t.limit)), Some((Some(100), 99)));
        let e = read(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "it goes on past the 1 MiB tessel reads");
        assert_eq!(show(KERNEL_FILE), "16 MiB");
        assert_eq!(show(1536), "1.5 KiB");
    }
}
