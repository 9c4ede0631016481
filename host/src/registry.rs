//! The backends a host can launch on: built-ins submitted through `inventory`, and plugins loaded
//! from shared libraries named by `TESSEL_PLUGIN_PATH` or `--plugin`.
//!
//! Plugins are loaded with `lib_header_from_path(..).init_root_module()`, keyed by canonical
//! path (the per-type cached loader of abi_stable would hand back the first library for every
//! path). Libraries are never unloaded. Every failure is one short paragraph naming the file and
//! what would work; abi_stable's long layout report goes to the log at debug level.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use abi_stable::library::{LibraryError, lib_header_from_path};
use tessel_plugin_api::abi::{BackendBox, BuiltinBackend, IR_FORMAT_VERSION, PLUGIN_API_VERSION, TesselPluginRef};

// Name every built-in backend crate, so that the linker keeps its `inventory` submission.
use tessel_interpret as _;
use tessel_mosaic_gpu as _;
use tessel_wgpu as _;

/// Where a backend came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Compiled into this `tessel`.
    BuiltIn,
    /// Loaded from a shared library (canonical path).
    Plugin(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::BuiltIn => f.write_str("built-in"),
            Source::Plugin(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A backend ready to use.
pub struct Loaded {
    /// Its registry name.
    pub name: String,
    /// Where it came from.
    pub source: Source,
    /// The backend object.
    pub backend: BackendBox,
    /// What loading it changed, e.g. "replaces the built-in interpret".
    pub note: Option<String>,
}

/// A plugin that did not load, with the reason.
#[derive(Debug)]
pub struct Failed {
    /// The path as given.
    pub path: PathBuf,
    /// Why.
    pub error: PluginError,
}

/// Why a plugin did not load. Each message is one paragraph: the file, the fact, what would work.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No such file.
    #[error("plugin `{}` does not exist\n  give the path of a backend's shared library (lib<name>.so), or a folder holding them, in --plugin or TESSEL_PLUGIN_PATH", path.display())]
    NotFound {
        /// The path.
        path: PathBuf,
    },
    /// Not a loadable shared library.
    #[error("plugin `{}` is not a shared library that can be loaded: {detail}\n  build the backend crate as a cdylib (`crate-type = [\"rlib\", \"cdylib\"]`, see docs/writing-a-backend.md) and pass the .so it produces", path.display())]
    NotALibrary {
        /// The path.
        path: PathBuf,
        /// The loader's words.
        detail: String,
    },
    /// A shared library without a tessel root module.
    #[error("plugin `{}` is a shared library but not a tessel plugin: it exports no tessel root module\n  export one with `tessel_plugin_api::export_plugin!(...)` in the backend crate (see docs/writing-a-backend.md)", path.display())]
    NotAPlugin {
        /// The path.
        path: PathBuf,
    },
    /// Built against an older or otherwise incompatible plugin-api.
    #[error("plugin `{}` was built against tessel-plugin-api {plugin}, but this tessel has tessel-plugin-api {host}{why}\n  rebuild the plugin against tessel-plugin-api {host} or newer (a plugin must be at least as new as the host)", path.display())]
    Incompatible {
        /// The path.
        path: PathBuf,
        /// The plugin's plugin-api version.
        plugin: String,
        /// The host's.
        host: String,
        /// The layout difference, if that was the problem.
        why: String,
    },
    /// Built against a plugin-api whose root module has another layout.
    #[error("plugin `{}` was built against a tessel-plugin-api whose root module layout differs from this host's ({why}); the plugin records version {plugin}, this host has {host}\n  rebuild the plugin against tessel-plugin-api {host} (TESSEL_LOG=debug shows abi_stable's full report)", path.display())]
    Layout {
        /// The path.
        path: PathBuf,
        /// The plugin's recorded plugin-api version.
        plugin: String,
        /// The host's.
        host: String,
        /// The first difference.
        why: String,
    },
    /// The plugin's constructor failed or panicked.
    #[error("plugin `{}` failed to start its backend: {message}", path.display())]
    Constructor {
        /// The path.
        path: PathBuf,
        /// Its error.
        message: String,
    },
    /// A folder given with `--plugin` that holds no shared library.
    #[error("plugin folder `{}` holds no shared library (*.{})\n  give the path of a backend's shared library (lib<name>.so), or a folder holding them", path.display(), std::env::consts::DLL_EXTENSION)]
    EmptyFolder {
        /// The folder.
        path: PathBuf,
    },
    /// A plugin that any user could have replaced, refused when running as root.
    #[error("plugin `{}` is not loaded: {why}, so another user could have put code there that would run as root\n  make it writable only by its owner (`chmod go-w {}`), or load it as another user", path.display(), fix.display())]
    WorldWritable {
        /// The path.
        path: PathBuf,
        /// What is writable by every user.
        why: String,
        /// The file or folder to fix.
        fix: PathBuf,
    },
    /// Two plugins with one backend name.
    #[error("two plugins are both called `{name}`: `{}` and `{}`\n  keep one of them in --plugin / TESSEL_PLUGIN_PATH; the second was not loaded", first.display(), second.display())]
    Duplicate {
        /// The backend name.
        name: String,
        /// The one loaded.
        first: PathBuf,
        /// The one refused.
        second: PathBuf,
    },
}

/// Built-ins and plugins, by name.
#[derive(Default)]
pub struct Registry {
    /// The usable backends, built-ins first.
    pub backends: Vec<Loaded>,
    /// Plugins from `TESSEL_PLUGIN_PATH` that did not load.
    pub failed: Vec<Failed>,
    /// What loading found wrong but did not refuse (a plugin any user may write, loaded by a
    /// user who is not root), one sentence each.
    pub warnings: Vec<String>,
    loaded_paths: HashSet<PathBuf>,
}

/// The files a `TESSEL_PLUGIN_PATH` entry names: the file itself, or the shared libraries of a
/// folder in name order.
fn plugin_files(entry: &Path) -> Vec<PathBuf> {
    if !entry.is_dir() {
        return vec![entry.to_path_buf()];
    }
    let ext = std::env::consts::DLL_EXTENSION;
    let mut files: Vec<PathBuf> = std::fs::read_dir(entry)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).filter(|p| p.extension().is_some_and(|x| x == ext)).collect())
        .unwrap_or_default();
    files.sort();
    files
}

impl Registry {
    /// The built-in backends only.
    pub fn builtins() -> Registry {
        let mut r = Registry::default();
        for b in inventory::iter::<BuiltinBackend> {
            let backend = (b.make)();
            r.backends.push(Loaded { name: backend.name().to_string(), source: Source::BuiltIn, backend, note: None });
        }
        r.backends.sort_by(|a, b| a.name.cmp(&b.name));
        r
    }

    /// Built-ins, then every plugin of `TESSEL_PLUGIN_PATH` (failures are kept in `failed`),
    /// then `explicit` plugins, files or folders of them (a failure is returned).
    pub fn discover(explicit: &[PathBuf]) -> Result<Registry, PluginError> {
        Registry::discover_for(explicit, None)
    }

    /// [`Registry::discover`] for launches on the backend `named` only (`None`: every plugin):
    /// built-ins, then `explicit` plugins, then those of `TESSEL_PLUGIN_PATH` in order until one
    /// provides `named` — none when a built-in or an explicit plugin does. A library that
    /// crashes while loading then takes down only the commands that may need it; a
    /// `TESSEL_PLUGIN_PATH` plugin named like a built-in replaces it only where every plugin is
    /// loaded (`tessel backends`, `--backend auto`); `--plugin` replaces it always.
    pub fn discover_for(explicit: &[PathBuf], named: Option<&str>) -> Result<Registry, PluginError> {
        let mut r = Registry::builtins();
        let explicit_files = || -> Result<Vec<PathBuf>, PluginError> {
            let mut files = Vec::new();
            for p in explicit {
                let found = plugin_files(p);
                if found.is_empty() {
                    return Err(PluginError::EmptyFolder { path: p.clone() });
                }
                files.extend(found);
            }
            Ok(files)
        };
        if named.is_some() {
            for file in explicit_files()? {
                r.load(&file)?;
            }
        }
        if let Some(path) = std::env::var_os("TESSEL_PLUGIN_PATH") {
            'path: for entry in std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()) {
                for file in plugin_files(&entry) {
                    if named.is_some_and(|n| r.get(n).is_some()) {
                        break 'path;
                    }
                    if let Err(error) = r.load(&file) {
                        r.failed.push(Failed { path: file, error });
                    }
                }
            }
        }
        if named.is_none() {
            for file in explicit_files()? {
                r.load(&file)?;
            }
        }
        Ok(r)
    }

    /// Loads one plugin. A plugin named like a built-in replaces it; two plugins of one name are
    /// refused; the same file twice is loaded once.
    pub fn load(&mut self, path: &Path) -> Result<&Loaded, PluginError> {
        let canonical = path.canonicalize().map_err(|_| PluginError::NotFound { path: path.to_path_buf() })?;
        if self.loaded_paths.contains(&canonical) {
            let i = self
                .backends
                .iter()
                .position(|b| b.source == Source::Plugin(canonical.clone()))
                .expect("loaded path has a backend");
            return Ok(&self.backends[i]);
        }
        if let Some(warning) = check_writers(path, &canonical)? {
            self.warnings.push(warning);
        }
        let backend = open(path, &canonical)?;
        let name = backend.name().to_string();
        let mut note = None;
        if let Some(i) = self.backends.iter().position(|b| b.name == name) {
            match &self.backends[i].source {
                Source::BuiltIn => {
                    note = Some(format!("replaces the built-in {name}"));
                    self.backends.remove(i);
                }
                Source::Plugin(first) => {
                    return Err(PluginError::Duplicate { name, first: first.clone(), second: canonical });
                }
            }
        }
        self.loaded_paths.insert(canonical.clone());
        self.backends.push(Loaded { name, source: Source::Plugin(canonical), backend, note });
        Ok(self.backends.last().expect("just pushed"))
    }

    /// The backend called `name`.
    pub fn get(&self, name: &str) -> Option<&Loaded> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// Every backend name, for messages.
    pub fn names(&self) -> String {
        self.backends.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// Whether a user other than the owner could have replaced the plugin: the file writable by its
/// group or every user, or one of its folders so writable without the sticky bit (which `/tmp`
/// has: there only a file's owner may replace it). As `ssh` treats a key, such a plugin is refused
/// when running as root (its code would run as root); for any other user it is loaded with a
/// warning (returned).
fn check_writers(path: &Path, canonical: &Path) -> Result<Option<String>, PluginError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const OTHERS_WRITE: u32 = 0o002;
    const GROUP_WRITE: u32 = 0o020;
    const STICKY: u32 = 0o1000;
    let meta = |p: &Path| std::fs::metadata(p).map(|m| (m.permissions().mode(), m.gid(), m.uid())).unwrap_or((0, 0, 0));
    let root = running_as_root();
    // Who besides the owner may write `p`, where someone may. A group's write counts always as
    // root (as `ssh` refuses a group-writable key); for another user not where the group is the
    // owner's own (a user private group, gid = uid: umask 002 makes every file so).
    let writers = |p: &Path| {
        let (mode, gid, uid) = meta(p);
        if mode & OTHERS_WRITE != 0 {
            Some("every user".to_string())
        } else if mode & GROUP_WRITE != 0 && (root || gid != uid) {
            Some(format!("its group (gid {gid})"))
        } else {
            None
        }
    };
    let found = if let Some(who) = writers(canonical) {
        Some((format!("the file is writable by {who}"), canonical.to_path_buf()))
    } else {
        (canonical.ancestors().skip(1))
            .find_map(|d| writers(d).filter(|_| meta(d).0 & STICKY == 0).map(|who| (d, who)))
            .map(|(d, who)| (format!("its folder `{}` is writable by {who} (and not sticky)", d.display()), d.to_path_buf()))
    };
    let Some((why, fix)) = found else { return Ok(None) };
    if root {
        return Err(PluginError::WorldWritable { path: path.to_path_buf(), why, fix });
    }
    Ok(Some(format!(
        "plugin `{}` is loaded although {why}: another user could have put code there; `chmod go-w {}` (as root it would be refused)",
        path.display(),
        fix.display()
    )))
}

/// Whether this process runs as root (effective user 0).
fn running_as_root() -> bool {
    // SAFETY: `geteuid` has no preconditions, touches no memory of ours and cannot fail.
    #[allow(unsafe_code, reason = "libc::geteuid is an FFI call")]
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// Opens, checks and starts one plugin.
fn open(path: &Path, canonical: &Path) -> Result<BackendBox, PluginError> {
    let header = lib_header_from_path(canonical).map_err(|e| classify(path, e, None))?;
    let plugin_version = header.version_strings().version.to_string();
    let root = header.init_root_module::<TesselPluginRef>().map_err(|e| classify(path, e, Some(&plugin_version)))?;
    if root.ir_format() != IR_FORMAT_VERSION {
        return Err(PluginError::Incompatible {
            path: path.to_path_buf(),
            plugin: root.plugin_api_version().to_string(),
            host: PLUGIN_API_VERSION.to_string(),
            why: format!(" (it reads kernel text format {}, this host writes format {IR_FORMAT_VERSION})", root.ir_format()),
        });
    }
    // Launches on the plugin see this thread's cancellation token.
    root.follow_cancel()(tessel_plugin_api::abi::TokenSource { token: tessel_plugin_api::cancel::host_token });
    root.new_backend()()
        .into_result()
        .map_err(|e| PluginError::Constructor { path: path.to_path_buf(), message: e.message.to_string() })
}

/// The first mismatch of abi_stable's layout report in one line: each `Error:` line with the
/// `Expected:` and `Found:` values under it.
fn layout_summary(report: &str) -> String {
    let lines: Vec<&str> = report.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(err) = l.strip_prefix("Error:") else { continue };
        let after = |tag: &str| {
            let at = lines[i..].iter().position(|x| *x == tag)?;
            lines.get(i + at + 1).filter(|v| !v.is_empty()).copied()
        };
        let mut s = err.trim().to_string();
        if let (Some(e), Some(f)) = (after("Expected:"), after("Found:")) {
            s.push_str(&format!(": expected {e}, found {f}"));
        }
        if !out.contains(&s) {
            out.push(s);
        }
        if out.len() == 3 {
            break;
        }
    }
    let mut s = if out.is_empty() { "the layouts differ".to_string() } else { out.join("; ") };
    s.truncate(800);
    s
}

/// Turns abi_stable's error into a short paragraph; its long report goes to the debug log.
fn classify(path: &Path, e: LibraryError, plugin_version: Option<&str>) -> PluginError {
    let path = path.to_path_buf();
    match e {
        LibraryError::OpenError { err, .. } => {
            let detail = err.to_string();
            let detail = detail.rsplit(": ").next().unwrap_or(&detail).trim().to_string();
            PluginError::NotALibrary { path, detail }
        }
        LibraryError::GetSymbolError { .. } => PluginError::NotAPlugin { path },
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => PluginError::Incompatible {
            path,
            plugin: actual_version.to_string(),
            host: expected_version.to_string(),
            why: String::new(),
        },
        LibraryError::AbiInstability(report) => {
            let report = report.to_string();
            log::debug!("abi_stable layout report for {}:\n{report}", path.display());
            PluginError::Layout {
                path,
                plugin: plugin_version.unwrap_or("an unknown version").to_string(),
                host: PLUGIN_API_VERSION.to_string(),
                why: layout_summary(&report),
            }
        }
        LibraryError::InvalidAbiHeader(_) | LibraryError::InvalidCAbi { .. } | LibraryError::ParseVersionError(_) => {
            PluginError::Incompatible {
                path,
                plugin: plugin_version.unwrap_or("an unknown version").to_string(),
                host: PLUGIN_API_VERSION.to_string(),
                why: " (it was built with an incompatible abi_stable or Rust ABI)".to_string(),
            }
        }
        LibraryError::RootModule { err, .. } => PluginError::Constructor { path, message: err.to_string() },
        LibraryError::Many(errors) => match errors.into_iter().next() {
            Some(first) => classify(&path, first, plugin_version),
            None => PluginError::NotAPlugin { path },
        },
    }
}

/// What a backend's build is: for a plugin, its file by path, size and modification time; for a
/// built-in, the fingerprint of the sources it was built from (`build.rs`), so that every program
/// built from the same sources (the command line, the Python module) shares cache entries and
/// tuning records.
pub(crate) fn build_identity(source: &Source) -> String {
    match source {
        Source::Plugin(path) => {
            let meta = std::fs::metadata(path).ok();
            let modified =
                meta.as_ref().and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            format!("plugin {path:?} {:?} {modified:?}", meta.map(|m| m.len()))
        }
        Source::BuiltIn => format!("built-in, sources {}", env!("TESSEL_SOURCE_HASH")),
    }
}
