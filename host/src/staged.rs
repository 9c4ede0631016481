//! Files written whole: the outputs of `tessel run`, lowered-text cache entries and tuning
//! records. Each file of a [`Batch`] is written to a hidden temporary file beside its destination
//! (`.NAME.XXXXXX.tmp`, in the same folder, so that the rename cannot cross file systems); only
//! when every one is complete are they renamed into place, together. A failure while writing
//! (a full disk, an unwritable folder) removes the temporaries and leaves every destination as it
//! was; a failure while renaming (a folder in the way) puts back what was already renamed.
//!
//! Temporaries are created with the mode ordinary files get (`0666` less the umask), not the
//! `0600` of `tempfile`'s default, so that what is renamed into place reads like any other file.
//!
//! [`remove_on_signals`] (called by the `tessel` command, not by the library) removes the
//! temporaries that exist when SIGINT, SIGTERM or SIGHUP arrives and exits with 128 + the
//! signal's number (130, 143, 129). A batch not yet renamed when the signal arrives is not
//! renamed; one being renamed holds the list of temporaries, so the signal's cleanup waits until
//! it is all in place (the outputs are then whole and new, and the exit status still says that
//! the command was interrupted).
//!
//! Not durable against a power cut: nothing is `fsync`ed (a kernel's outputs are cheap to make
//! again, and a sync costs more than the write).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// Every temporary that exists now: what a signal removes.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set in the signal handler itself, at once, when SIGINT, SIGTERM or SIGHUP arrives: a batch
/// not yet renamed is then not renamed at all (the thread that removes the temporaries may be
/// scheduled only after the writing thread reached the renames).
static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

fn pending() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic while the list was held leaves it as consistent as ever: a list of paths.
    PENDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A file of a batch that could not be written, and why.
#[derive(Debug)]
pub struct Failed {
    /// The destination.
    pub path: PathBuf,
    /// Why.
    pub source: io::Error,
}

/// A temporary and where it goes. Dropped unrenamed, it removes the temporary.
struct Temp {
    file: Option<tempfile::NamedTempFile>,
    dest: PathBuf,
}

impl Temp {
    /// Removes the temporary (if still there) and takes it off the list, in that order, the
    /// list held meanwhile.
    fn discard(&mut self, list: &mut Vec<PathBuf>) {
        if let Some(file) = self.file.take() {
            let path = file.path().to_path_buf();
            drop(file);
            list.retain(|p| *p != path);
        }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if self.file.is_some() {
            self.discard(&mut pending());
        }
    }
}

/// Files written together: all renamed into place, or none.
#[derive(Default)]
pub struct Batch {
    files: Vec<Temp>,
}

/// The folder a file goes in (`.` for a bare name).
fn folder_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A fresh temporary beside `dest` (`.NAME.XXXXXX.SUFFIX`), made by `make` (given the path) and
/// put on the list before it exists.
fn beside<R>(dest: &Path, suffix: &str, mut make: impl FnMut(&Path) -> io::Result<R>) -> io::Result<tempfile::NamedTempFile<R>> {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(suffix).make_in(folder_of(dest), |path| {
        pending().push(path.to_path_buf());
        let made = make(path);
        if made.is_err() {
            pending().retain(|p| p != path);
        }
        made
    })
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Writes `dest`'s bytes (through `write`, buffered) to a temporary beside it; nothing is at
    /// `dest` until [`Batch::commit`].
    pub fn add(&mut self, dest: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), Failed> {
        let failed = |source| Failed { path: dest.to_path_buf(), source };
        // `create_new` with the default mode: 0666 less the umask, as for any new file.
        let file = beside(dest, ".tmp", |path| OpenOptions::new().write(true).create_new(true).open(path)).map_err(failed)?;
        let mut temp = Temp { file: Some(file), dest: dest.to_path_buf() };
        let f: &mut File = temp.file.as_mut().expect("just made").as_file_mut();
        let mut w = BufWriter::with_capacity(1 << 20, f);
        write(&mut w).and_then(|()| w.flush()).map_err(failed)?;
        drop(w);
        self.files.push(temp);
        Ok(())
    }

    /// Renames every file into place. A destination that is a folder is refused before anything
    /// moves; any other failure puts back what had moved. Either way, no temporary is left.
    pub fn commit(mut self) -> Result<(), Failed> {
        let mut list = pending();
        let result = place(&mut self.files, &mut list);
        for t in &mut self.files {
            t.discard(&mut list);
        }
        result
    }
}

/// Writes one file whole (a batch of one).
pub fn write(dest: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), Failed> {
    let mut batch = Batch::new();
    batch.add(dest, write)?;
    batch.commit()
}

/// Renames each temporary to its destination, an existing file moved aside first (so that the
/// rename does not replace a file: on ext4 that would write the new one back to disk at once),
/// and the files moved aside removed at the end. On a failure, the destinations already renamed
/// get their old files back (or are removed where there was none).
fn place(files: &mut [Temp], list: &mut Vec<PathBuf>) -> Result<(), Failed> {
    if let Some(t) = files.first()
        && INTERRUPTED.load(Ordering::SeqCst)
    {
        let source = io::Error::new(io::ErrorKind::Interrupted, "interrupted by a signal before it was renamed into place");
        return Err(Failed { path: t.dest.clone(), source });
    }
    for t in files.iter() {
        if std::fs::symlink_metadata(&t.dest).is_ok_and(|m| m.is_dir()) {
            return Err(Failed {
                path: t.dest.clone(),
                source: io::Error::new(io::ErrorKind::IsADirectory, "a folder of that name is in the way"),
            });
        }
    }
    let mut done: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    for t in files.iter_mut() {
        match place_one(t, list) {
            Ok(aside) => done.push((t.dest.clone(), aside)),
            Err(source) => {
                for (dest, aside) in done.into_iter().rev() {
                    let _ = match aside {
                        Some(old) => std::fs::rename(old, &dest),
                        None => std::fs::remove_file(&dest),
                    };
                }
                return Err(Failed { path: t.dest.clone(), source });
            }
        }
    }
    for aside in done.into_iter().filter_map(|(_, aside)| aside) {
        let _ = std::fs::remove_file(aside);
    }
    Ok(())
}

/// Renames one temporary into place; returns where the file it replaces was moved.
fn place_one(t: &mut Temp, list: &mut Vec<PathBuf>) -> io::Result<Option<PathBuf>> {
    let aside = match std::fs::symlink_metadata(&t.dest).and_then(|_| move_aside(&t.dest)) {
        Ok(moved) => Some(moved),
        // None there, or another process (sharing a cache folder) moved it meanwhile.
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let file = t.file.take().expect("each temporary is placed once");
    let path = file.path().to_path_buf();
    match file.persist(&t.dest) {
        Ok(_) => {
            list.retain(|p| *p != path);
            Ok(aside)
        }
        Err(e) => {
            t.file = Some(e.file);
            if let Some(old) = aside {
                let _ = std::fs::rename(old, &t.dest);
            }
            Err(e.error)
        }
    }
}

/// Renames `dest` to a fresh hidden name beside it (`.NAME.XXXXXX.old`).
fn move_aside(dest: &Path) -> io::Result<PathBuf> {
    // Off the list of temporaries: a signal waits for the batch, which removes it or puts it back.
    let moved = tempfile::Builder::new()
        .prefix(&format!(".{}.", dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()))
        .suffix(".old")
        .make_in(folder_of(dest), |path| {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            std::fs::rename(dest, path)
        })?;
    let (_, path) = moved.keep().map_err(|e| e.error)?;
    Ok(path)
}

/// On SIGINT, SIGTERM or SIGHUP: removes every temporary that exists and exits with 128 + the
/// signal's number. For a program's `main` (the `tessel` command); a library leaves signals to
/// its program.
pub fn remove_on_signals() -> io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&INTERRUPTED))?;
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new().name("tessel-signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let mut list = pending();
            for path in list.drain(..) {
                let _ = std::fs::remove_file(path);
            }
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// A batch whose second file cannot be placed (a folder of its name) leaves the first file
    /// as it was, and no temporary.
    #[test]
    fn a_batch_is_placed_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "old a").unwrap();
        std::fs::create_dir(&b).unwrap();
        let mut batch = Batch::new();
        batch.add(&a, |w| w.write_all(b"new a")).unwrap();
        batch.add(&b, |w| w.write_all(b"new b")).unwrap();
        assert_eq!(names(dir.path()).len(), 4, "two temporaries beside a and b");
        let e = batch.commit().unwrap_err();
        assert_eq!(e.path, b);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
        assert_eq!(names(dir.path()), ["a", "b"]);
        // A failure part-way through the renames puts back what moved: `b`'s temporary goes
        // missing (its folder renamed) after `a` is placed.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let b = sub.join("b");
        let mut batch = Batch::new();
        batch.add(&a, |w| w.write_all(b"new a")).unwrap();
        batch.add(&b, |w| w.write_all(b"new b")).unwrap();
        std::fs::rename(&sub, dir.path().join("moved")).unwrap();
        let e = batch.commit().unwrap_err();
        assert_eq!((e.path, e.source.kind()), (b, io::ErrorKind::NotFound));
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a", "a is put back");
        assert_eq!(names(dir.path()), ["a", "b", "moved"]);
    }

    /// A failing write removes its temporary; a good one replaces the old file and leaves
    /// nothing beside it.
    #[test]
    fn a_failed_write_leaves_nothing_and_a_good_one_only_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.npy");
        std::fs::write(&a, "old").unwrap();
        let e = write(&a, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("the disk is full"))
        })
        .unwrap_err();
        assert_eq!(e.source.to_string(), "the disk is full");
        assert_eq!(names(dir.path()), ["a.npy"]);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old");
        write(&a, |w| w.write_all(b"new")).unwrap();
        assert_eq!(names(dir.path()), ["a.npy"]);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "new");
        assert!(pending().iter().all(|p| !p.starts_with(dir.path())), "nothing left on the signal list");
    }
}
