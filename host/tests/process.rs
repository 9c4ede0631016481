//! The real `tessel` process: exit codes and clean messages (no panic, no backtrace), even with
//! `RUST_BACKTRACE=1`.

use std::process::Command;

fn tessel(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("tessel runs")
}

#[test]
fn user_errors_exit_1_without_backtrace() {
    for args in [
        &["check", "no/such.tk"][..],
        &["check", "tests/in/errors/unknown_value.tk"],
        &["run", "examples/add.tk", "--backend", "nope"],
        &["run", "examples/add.tk", "--input", "x=missing.npy"],
        &["run", "examples/add.tk", "--grid", "i=x"],
    ] {
        let out = tessel(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{args:?}: {stderr}");
    }
}

#[test]
fn bad_command_line_exits_2() {
    let out = tessel(&["run", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_succeeds_on_every_example() {
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples")).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "tk") {
            let out = tessel(&["check", path.to_str().expect("utf-8")]);
            assert_eq!(out.status.code(), Some(0), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        }
    }
}
