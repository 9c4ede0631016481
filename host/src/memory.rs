//! Whether a launch's arrays fit in this machine's memory, asked before any of them is made: a
//! launch that cannot fit is an error naming the bytes it needs, not a process the kernel's
//! out-of-memory killer ends without a word.

use tessel_plugin_api::ir::{ParamKind, Verified};

/// What a launch's host arrays take, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Need {
    /// The `in` arrays (each name once).
    pub inputs: u64,
    /// The `out` arrays (each name once).
    pub outputs: u64,
    /// Scratch, once per thread that runs programs.
    pub scratch: u64,
}

impl Need {
    /// The arrays of `kernels` (names shared across a launch counted once), with scratch for
    /// `threads` programs at a time.
    pub fn of(kernels: &[&Verified], threads: u64) -> Need {
        let mut seen = std::collections::BTreeSet::new();
        let mut need = Need::default();
        for k in kernels {
            for p in &k.kernel().params {
                let bytes = (p.ty.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)))
                    .and_then(|n| n.checked_mul(u64::from(p.ty.dtype.bits().div_ceil(8))))
                    .unwrap_or(u64::MAX);
                match p.kind {
                    ParamKind::Scratch => need.scratch = need.scratch.saturating_add(bytes.saturating_mul(threads)),
                    _ if !seen.insert(p.name.clone()) => {}
                    ParamKind::In => need.inputs = need.inputs.saturating_add(bytes),
                    ParamKind::Out => need.outputs = need.outputs.saturating_add(bytes),
                }
            }
        }
        need
    }

    /// All of it.
    pub fn total(&self) -> u64 {
        self.inputs.saturating_add(self.outputs).saturating_add(self.scratch)
    }
}

/// Memory this process can still take: `MemAvailable` of `/proc/meminfo`, lowered to what a
/// cgroup (v2) limit leaves and to what the address-space limit (`RLIMIT_AS`, `ulimit -v`)
/// leaves above the process's virtual size. `None` where none of them can be read (not Linux):
/// no check is made.
pub fn available() -> Option<u64> {
    let meminfo = || -> Option<u64> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().trim_end_matches("kB").trim();
        kib.parse::<u64>().ok().map(|k| k.saturating_mul(1024))
    };
    let cgroup = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok()?.trim().parse::<u64>().ok();
    let cgroup_left = match (cgroup("memory.max"), cgroup("memory.current")) {
        (Some(max), Some(current)) => Some(max.saturating_sub(current)),
        _ => None,
    };
    [meminfo(), cgroup_left, address_space_left()].into_iter().flatten().min()
}

/// What `RLIMIT_AS` (the soft limit) leaves above the process's virtual size (`VmSize` of
/// `/proc/self/status`); `None` without a limit, or where either cannot be read. A launch's
/// arrays are new mappings, each adding at least its size to the virtual size: past the limit,
/// an allocation fails and the process aborts.
pub fn address_space_left() -> Option<u64> {
    let limit = limits::address_space()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmSize:"))?.trim().trim_end_matches("kB").trim();
    let size = kib.parse::<u64>().ok()?.saturating_mul(1024);
    Some(limit.saturating_sub(size))
}

#[cfg(unix)]
mod limits {
    #![allow(unsafe_code, reason = "getrlimit")]

    /// The soft `RLIMIT_AS` in bytes, or `None` where it is unlimited or cannot be read.
    #[allow(clippy::unnecessary_cast, reason = "`rlim_t` is `u64` on Linux, not on every unix")]
    pub fn address_space() -> Option<u64> {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the limit into the struct it is given, which lives across the call.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut l) } == 0;
        (ok && l.rlim_cur != libc::RLIM_INFINITY).then_some(l.rlim_cur as u64)
    }
}

#[cfg(not(unix))]
mod limits {
    /// No address-space limit is read here.
    pub fn address_space() -> Option<u64> {
        None
    }
}

/// `bytes` for people: `1.5 GB`, `12.0 MB`, `512 bytes`.
pub fn show(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MB", b as f64 / f64::from(1u32 << 20)),
        b => format!("{b} bytes"),
    }
}

/// Launches below this many bytes are not checked: asking costs reads of `/proc` on every
/// launch (tens of microseconds, a tiny launch's own time), and so little memory always fits.
const UNCHECKED: u64 = 64 << 20;

/// Refuses `need` where it is more than the memory available (where that is known).
pub fn check(what: impl FnOnce() -> String, need: Need) -> crate::Result<()> {
    if need.total() < UNCHECKED {
        return Ok(());
    }
    match available() {
        Some(available) if need.total() > available => Err(crate::Error::Memory { what: what(), need, available }),
        _ => Ok(()),
    }
}

/// Refuses a launch of `kernels` whose outputs (and the interpreter's scratch) cannot fit in the
/// memory left, before any is made: what `Planned::launch`, the Python module and the FFI
/// handler ask.
pub fn outputs_fit(kernels: &[&Verified]) -> crate::Result<()> {
    let need = Need { inputs: 0, ..Need::of(kernels, threads()) };
    check(|| format!("making the outputs of `{}`", kernels.iter().map(|k| k.name()).collect::<Vec<_>>().join("`, `")), need)
}

/// The threads that run programs at once: the interpreter's pool, rayon's global one. rayon
/// asked the standard library once when it built the pool; asking again would read the
/// cgroup's CPU quota from `/proc` and `/sys` once more (a third of a tiny launch).
pub fn threads() -> u64 {
    rayon::current_num_threads() as u64
}
