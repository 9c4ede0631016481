//! The compile cache: in memory per backend object (counters), and on disk for lowered text
//! (shared by processes, corrupt entries rewritten).

mod common;

use std::process::Command;

use common::*;
use tessel::{LaunchArgs, Runtime};

#[test]
fn the_same_launch_twice_is_compiled_once() {
    let rt = Runtime::new(&[]).expect("runtime");
    let kernels = tessel::load_file(&root().join("examples/softmax.tk")).expect("softmax");
    let call = [tessel::Call::new(kernels[0].clone())];
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(kernels[0].kernel(), 1), grid: Default::default() };
    let before = rt.cache_stats("interpret").unwrap();
    let first = launched(&rt, "interpret", &call, &args).unwrap();
    let second = launched(&rt, "interpret", &call, &args).unwrap();
    let after = rt.cache_stats("interpret").unwrap();
    assert_eq!(first, second);
    assert_eq!(after.misses - before.misses, 1, "compiled once: {after:?}");
    assert_eq!(after.hits - before.hits, 1, "found the second time: {after:?}");
    // Another kernel is another entry.
    let other = tessel::load_file(&root().join("examples/add.tk")).expect("add");
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(other[0].kernel(), 1), grid: Default::default() };
    rt.plan(
        tessel::Choice::Named("interpret"),
        &tessel::Launch::new([tessel::Call::new(other[0].clone())], [], args.grid.clone()),
    )
    .and_then(|p| p.launch(&args))
    .unwrap();
    assert_eq!(rt.cache_stats("interpret").unwrap().misses - before.misses, 2);
}

fn lower(cache: &std::path::Path) -> (String, String) {
    let out = Command::new(target_dir().join("tessel"))
        .current_dir(root())
        .args(["lower", "examples/matmul.tk", "--backend", "mosaic-gpu", "--explain"])
        .env("TESSEL_CACHE_DIR", cache)
        .env_remove("TESSEL_PLUGIN_PATH")
        .output()
        .expect("tessel runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let status = stdout.lines().find(|l| l.starts_with("cache: ")).expect("--explain says what the cache did").to_string();
    let text = stdout.lines().filter(|l| !l.starts_with("cache: ") && !l.starts_with("backend ")).collect::<Vec<_>>().join("\n");
    (status, text)
}

#[test]
fn a_second_process_finds_the_lowered_text_on_disk() {
    cargo_build(&["-p", "tessel"]);
    let cache = tempfile::tempdir().unwrap();
    let (s1, t1) = lower(cache.path());
    assert!(s1.starts_with("cache: miss, lowered and wrote "), "{s1}");
    let (s2, t2) = lower(cache.path());
    assert!(s2.starts_with("cache: hit, read "), "{s2}");
    assert_eq!(t1, t2, "the cached text is the lowered text");
    // A damaged entry is ignored and written again.
    let entry = std::fs::read_dir(cache.path()).unwrap().next().unwrap().unwrap().path();
    let whole = std::fs::read_to_string(&entry).unwrap();
    std::fs::write(&entry, &whole[..whole.len() / 2]).unwrap();
    let (s3, t3) = lower(cache.path());
    assert!(s3.starts_with("cache: corrupt entry "), "{s3}");
    assert_eq!(t3, t1);
    assert_eq!(std::fs::read_to_string(&entry).unwrap(), whole, "rewritten whole");
    // Several processes at once share the folder.
    let fresh = tempfile::tempdir().unwrap();
    let texts: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| lower(fresh.path()).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(texts.iter().all(|t| *t == t1));
    let names: Vec<_> = std::fs::read_dir(fresh.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "one entry, no temporary files left: {names:?}");
}
