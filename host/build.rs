//! The source fingerprint of the built-in backends: a hash of the Rust sources of the host, the
//! plugin API and every backend, and of `Cargo.lock`, with the build profile. It keys the compile
//! cache and tuning records for built-in backends, so that the command line and the Python module
//! built from the same sources share them, and a change to any source is a new key.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    // The `tessel` command as a position-dependent executable on Linux: a PIE's 18,000 relative
    // relocations write to some 90 pages of `.data.rel.ro` and the GOT at every start, each a
    // copy-on-write fault. Without them the command starts 0.37 ms sooner (2.53 -> 2.16 ms for
    // `tessel --version`, 300 alternating runs), a sixth of its start-up. The shared libraries,
    // heap and stack are still placed at random; the executable's own image is not.
    let cfg = |v: &str| std::env::var(v).unwrap_or_default();
    if cfg("CARGO_CFG_TARGET_OS") == "linux" && cfg("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bin=tessel=-no-pie");
    }
    let host = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = host.parent().expect("host/ is in the workspace").to_path_buf();
    let dirs = [host.join("src"), root.join("plugin-api/src"), root.join("backends")];
    let mut all = Vec::new();
    for d in &dirs {
        println!("cargo:rerun-if-changed={}", d.display());
        files(d, &mut all);
    }
    let lock = root.join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    all.push(lock);
    all.sort();
    let mut h = blake3::Hasher::new();
    for f in &all {
        let rel = f.strip_prefix(&root).unwrap_or(f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update(&std::fs::read(f).unwrap_or_default());
    }
    h.update(std::env::var("PROFILE").unwrap_or_default().as_bytes());
    println!("cargo:rustc-env=TESSEL_SOURCE_HASH={}", &h.finalize().to_hex()[..32]);
}
