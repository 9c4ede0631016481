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
