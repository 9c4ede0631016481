//! Follows docs/writing-a-backend.md step by step: copy the interpreter into a new crate with the
//! page's Cargo.toml, rename it, build it as a plugin, load it and run on it.

mod common;

use std::path::Path;
use std::process::Command;

use common::{cargo_build, root, target_dir};

/// The fenced code blocks of the page, in order: (language, text).
fn code_blocks(doc: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            blocks.push((lang.to_string(), body.join("\n") + "\n"));
        }
    }
    blocks
}

fn sh(script: &str, dir: &Path, path: &str) -> std::process::Output {
    Command::new("bash")
        .arg("-euc")
        .arg(script)
        .current_dir(dir)
        .env("TESSEL", root())
        .env("PATH", path)
        .env_remove("TESSEL_PLUGIN_PATH")
        .output()
        .expect("bash runs")
}

#[test]
fn the_page_builds_and_loads_a_new_backend() {
    cargo_build(&["-p", "tessel"]);
    let doc = std::fs::read_to_string(root().join("docs/writing-a-backend.md")).expect("the page");
    let blocks = code_blocks(&doc);
    let [(l0, copy), (l1, manifest), (l2, old_line), (l3, new_line), (l4, build), (l5, use_it)] = &blocks[..] else {
        panic!("the page has six code blocks (copy, Cargo.toml, two lines of lib.rs, build, use), found {}", blocks.len());
    };
    assert_eq!([l0, l1, l2, l3, l4, l5], ["sh", "toml", "rust", "rust", "sh", "sh"]);
    let path = format!("{}:{}", target_dir().display(), std::env::var("PATH").unwrap_or_default());
    let work = tempfile::tempdir().expect("tempdir");

    // 1. Copy the interpreter.
    let out = sh(copy, work.path(), &path);
    assert!(out.status.success(), "step 1: {}", String::from_utf8_lossy(&out.stderr));
    let krate = work.path().join("tessel-mybackend");

    // 2. Its Cargo.toml, with $TESSEL spelled out (cargo does not expand variables). The crate
    // shares this repository's lock file and target folder, so nothing is compiled twice.
    let manifest = manifest.replace("$TESSEL", &root().display().to_string());
    std::fs::write(krate.join("Cargo.toml"), manifest).expect("write Cargo.toml");
    std::fs::copy(root().join("Cargo.lock"), krate.join("Cargo.lock")).expect("lock file");
    std::os::unix::fs::symlink(root().join("target"), krate.join("target")).expect("share target/");

    // 3. Rename.
    let lib = krate.join("src/lib.rs");
    let text = std::fs::read_to_string(&lib).expect("lib.rs");
    assert!(text.contains(old_line.trim()), "src/lib.rs has the line the page says to change");
    std::fs::write(&lib, text.replace(old_line.trim(), new_line.trim())).expect("rename");

    // 4. Build the plugin.
    let out = sh(build, work.path(), &path);
    assert!(out.status.success(), "step 4: {}", String::from_utf8_lossy(&out.stderr));

    // 5. Load it and run on it.
    let out = sh(use_it, &krate, &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "step 5: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("mybackend 0.1.0, threads "), "backends lists the new backend with its options and path: {stdout}");
    assert!(stdout.contains("libtessel_mybackend.so)"), "{stdout}");
    assert!(stdout.contains("ran `softmax` on mybackend"), "{stdout}");
    assert!(stdout.contains("check o: max abs error") && stdout.contains(": ok"), "{stdout}");
}
