//! The system's C compiler, and the shared libraries it makes, cached on disk by the hash of the
//! source, the compiler and the machine (`-march=native` code runs only where it was made).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use tessel_plugin_api::abi::{BackendError, ErrorKind};

/// Flags every file is compiled with: optimized and vectorized for this machine, every float
/// operation rounded once as written (no contraction into fused multiply-adds, no fast maths).
const FLAGS: &[&str] = &[
    "-O3",
    "-march=native",
    "-std=gnu11",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-w",
    // Whole AVX-512 registers where the machine has them (GCC otherwise keeps to 256 bits):
    // `tanh` in an epilogue runs a quarter faster.
    #[cfg(target_arch = "x86_64")]
    "-mprefer-vector-width=512",
];

/// The compiler found on this machine.
#[derive(Debug)]
pub struct Toolchain {
    /// `$CC`, else `cc`.
    pub cc: String,
    /// Flags after [`FLAGS`]: `TESSEL_CPU_CFLAGS`, split at white space (empty by default).
    pub extra: Vec<String>,
    /// The first line of `cc --version`.
    pub version: String,
    /// What `-march=native` means here (`skylake-avx512`), or a hash of the CPU's flags.
    pub machine: String,
}

/// The toolchain, looked for once per process: `Err(why not)` where there is no C compiler.
pub fn toolchain() -> Result<&'static Toolchain, &'static str> {
    static T: OnceLock<Result<Toolchain, String>> = OnceLock::new();
    T.get_or_init(find).as_ref().map_err(|e| e.as_str())
}

fn find() -> Result<Toolchain, String> {
    let cc = std::env::var("CC").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".to_string());
    let out = Command::new(&cc)
        .arg("--version")
        .output()
        .map_err(|e| format!("no C compiler: `{cc} --version` failed ({e}); install gcc or clang, or set CC"))?;
    if !out.status.success() {
        return Err(format!("no C compiler: `{cc} --version` exited with {}", out.status));
    }
    let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string();
    let machine = Command::new(&cc)
        .args(["-march=native", "-Q", "--help=target"])
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let line = text.lines().find(|l| l.trim_start().starts_with("-march="))?.to_string();
            line.split_whitespace().nth(1).map(str::to_string)
        })
        .unwrap_or_else(|| {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let flags = info.lines().find(|l| l.starts_with("flags") || l.starts_with("Features")).unwrap_or_default();
            format!("cpu-{}", &blake3::hash(flags.as_bytes()).to_hex()[..16])
        });
    let extra = std::env::var("TESSEL_CPU_CFLAGS").unwrap_or_default().split_whitespace().map(str::to_string).collect();
    Ok(Toolchain { cc, extra, version, machine })
}

/// A compiled file, loaded.
#[derive(Debug)]
pub struct Library {
    lib: libloading::Library,
    /// Where it was loaded from (in the cache, or a temporary file already removed).
    pub path: PathBuf,
}

/// A generated kernel function: `void tk_kN(const tk_ctx *, int64_t begin, int64_t end, char
/// *arena)`, running programs `begin..end` (the context is `run::Ctx`).
pub type KernelFn = unsafe extern "C" fn(*const std::ffi::c_void, i64, i64, *mut u8);

/// The product library's function, `tk_gemm` (`emit::gemm_source`; `prelude.h`'s `tk_ctx.gemm`).
pub type GemmFn =
    unsafe extern "C" fn(*const std::ffi::c_void, i64, i64, i64, *mut f32, i64, *const f32, i64, i64, *const f32, i64, i32);

impl Library {
    /// The product library's `tk_gemm`.
    pub fn gemm(&self) -> Result<GemmFn, BackendError> {
        // SAFETY: the symbol is the function `emit::gemm_source` defines with exactly this
        // signature, and `self.lib` outlives every use: each kernel using it holds the library.
        #[allow(unsafe_code)]
        let f = unsafe { self.lib.get::<GemmFn>(b"tk_gemm") };
        f.map(|s| *s).map_err(|e| internal(format!("{} has no function `tk_gemm`: {e}", self.path.display())))
    }

    /// The kernel function called `name`.
    pub fn kernel(&self, name: &str) -> Result<KernelFn, BackendError> {
        // SAFETY: the symbol is a function the generated C defines with exactly this signature
        // (`emit::Writer::kernel`), and `self.lib` outlives every use: the artifact holds both.
        #[allow(unsafe_code)]
        let f = unsafe { self.lib.get::<KernelFn>(name.as_bytes()) };
        f.map(|s| *s).map_err(|e| internal(format!("{} has no function `{name}`: {e}", self.path.display())))
    }
}

fn internal(msg: String) -> BackendError {
    BackendError::new(ErrorKind::Internal, msg)
}

/// The cache folder for compiled kernels: the host's rule (`TESSEL_CACHE=off`, `TESSEL_CACHE_DIR`,
/// `XDG_CACHE_HOME/tessel`, `~/.cache/tessel`), its `cpu/` folder.
fn cache_dir() -> Option<PathBuf> {
    if std::env::var("TESSEL_CACHE").is_ok_and(|v| v == "off") {
        return None;
    }
    let base = std::env::var_os("TESSEL_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("tessel")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessel")))?;
    let dir = base.join("cpu");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// The key of `source` compiled by `t`: what the library's file is named by.
pub fn key(t: &Toolchain, source: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [t.cc.as_str(), &t.version, &t.machine, &FLAGS.join(" "), &t.extra.join(" "), source] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex()[..32].to_string()
}

/// Builds under way in this process, by key: a second thread asking for a library being built
/// (a launch after its warm-up) waits for that build instead of running the compiler again.
type Building = std::collections::HashMap<String, Arc<OnceLock<Result<Arc<Library>, BackendError>>>>;

/// `source` compiled and loaded: from the disk cache where it was compiled before; one compiler
/// run per source in this process however many threads ask at once.
pub fn build(source: &str) -> Result<Arc<Library>, BackendError> {
    static BUILDING: std::sync::Mutex<Option<Building>> = std::sync::Mutex::new(None);
    let t = toolchain().map_err(|e| BackendError::new(ErrorKind::Unavailable, e))?;
    let key = key(t, source);
    let building = || BUILDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cell = Arc::clone(building().get_or_insert_with(Default::default).entry(key.clone()).or_default());
    let built = cell.get_or_init(|| build_keyed(t, &key, source)).clone();
    // Later asks find the library on disk (or build again where there is no disk cache).
    if let Some(map) = building().as_mut() {
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            map.remove(&key);
        }
    }
    built
}

fn build_keyed(t: &Toolchain, key: &str, source: &str) -> Result<Arc<Library>, BackendError> {
    let dir = cache_dir();
    if let Some(dir) = &dir {
        let path = dir.join(format!("{key}.so"));
        if path.exists() {
            if let Ok(lib) = open(&path) {
                return Ok(Arc::new(lib));
            }
        }
    }
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let work = dir.clone().unwrap_or_else(std::env::temp_dir);
    let stem = format!("{key}.tmp{}-{n}", std::process::id());
    let c_path = work.join(format!("{stem}.c"));
    let so_tmp = work.join(format!("{stem}.so"));
    std::fs::write(&c_path, source).map_err(|e| internal(format!("cannot write {}: {e}", c_path.display())))?;
    let out = Command::new(&t.cc).args(FLAGS).args(&t.extra).arg("-o").arg(&so_tmp).arg(&c_path).arg("-lm").output();
    let result = match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{} failed on {} ({}):\n{}",
            t.cc,
            c_path.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).lines().take(20).collect::<Vec<_>>().join("\n")
        )),
        Err(e) => Err(format!("cannot run {}: {e}", t.cc)),
    };
    if let Err(e) = result {
        let _ = std::fs::remove_file(&so_tmp);
        return Err(internal(e));
    }
    let _ = std::fs::remove_file(&c_path);
    let lib = match &dir {
        Some(dir) => {
            let path = dir.join(format!("{key}.so"));
            std::fs::rename(&so_tmp, &path).map_err(|e| internal(format!("cannot move {}: {e}", so_tmp.display())))?;
            if n % 16 == 0 {
                prune(dir, KEPT_ON_DISK);
            }
            open(&path)?
        }
        None => {
            let lib = open(&so_tmp);
            let _ = std::fs::remove_file(&so_tmp);
            lib?
        }
    };
    Ok(Arc::new(lib))
}

/// Compiled kernels kept in the cache folder; past it the least recently made go.
pub const KEPT_ON_DISK: usize = 1024;

/// Removes the oldest libraries of `dir` past `keep`, and temporaries an hour old (a process
/// that died while compiling). A library loaded by a running process stays mapped after removal.
pub fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let mut libs = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let (name, meta) = (e.file_name().to_string_lossy().into_owned(), e.metadata());
        let Ok(modified) = meta.and_then(|m| m.modified()) else { continue };
        if name.contains(".tmp") {
            if modified < hour_ago {
                let _ = std::fs::remove_file(e.path());
            }
        } else if name.ends_with(".so") {
            libs.push((modified, e.path()));
        }
    }
    if libs.len() > keep {
        libs.sort();
        for (_, path) in &libs[..libs.len() - keep] {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn open(path: &Path) -> Result<Library, BackendError> {
    // SAFETY: the library is one this backend compiled from its own C (the cache folder is the
    // user's own); loading it runs no initialisers beyond the C runtime's.
    #[allow(unsafe_code)]
    let lib = unsafe { libloading::Library::new(path) };
    lib.map(|lib| Library { lib, path: path.to_path_buf() }).map_err(|e| internal(format!("cannot load {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::{build, prune, toolchain};

    #[test]
    fn threads_asking_for_one_source_at_once_share_one_compiler_run() {
        if toolchain().is_err() {
            eprintln!("SKIPPED: no C compiler");
            return;
        }
        // A source no cache holds: each thread would otherwise run the compiler and load its own.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let source = format!("int tk_probe(void) {{ return {}; }}\n", nanos % 1_000_000_007);
        let start = std::sync::Barrier::new(3);
        let libs: Vec<_> = std::thread::scope(|s| {
            let ts: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        build(&source).unwrap()
                    })
                })
                .collect();
            ts.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(libs.iter().all(|l| std::sync::Arc::ptr_eq(l, &libs[0])), "each thread compiled its own library");
    }

    #[test]
    fn prune_keeps_the_newest_libraries_and_removes_old_temporaries() {
        let dir = std::env::temp_dir().join(format!("tessel-cpu-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let age = |path: &std::path::Path, secs: u64| {
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
            std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
        };
        for (n, secs) in [(0, 50), (1, 40), (2, 30), (3, 20)] {
            let p = dir.join(format!("{n}.so"));
            std::fs::write(&p, b"x").unwrap();
            age(&p, secs);
        }
        let (old_tmp, new_tmp) = (dir.join("a.tmp1-0.c"), dir.join("b.tmp1-1.c"));
        std::fs::write(&old_tmp, b"x").unwrap();
        std::fs::write(&new_tmp, b"x").unwrap();
        age(&old_tmp, 7200);
        prune(&dir, 2);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["2.so", "3.so", "b.tmp1-1.c"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
