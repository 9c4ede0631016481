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

fn root() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A write error on standard output fails the command (`tessel check K.tk > /dev/full` used to
/// exit 0; `lower` onto a full disk left a truncated file and exit 0).
#[test]
fn a_full_standard_output_is_an_error() {
    let full = std::path::Path::new("/dev/full");
    assert!(full.exists(), "this test needs Linux's /dev/full");
    for args in [&["check", "examples/add.tk"][..], &["lower", "examples/matmul.tk"], &["backends"], &["--help"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
            .args(args)
            .current_dir(root())
            .stdout(std::fs::File::create(full).expect("/dev/full opens"))
            .output()
            .expect("tessel runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "error: cannot write to standard output: No space left on device (os error 28)",
            "{args:?}"
        );
    }
}

/// A closed standard output (`tessel ... | head`) ends the command quietly with 141, what a
/// shell reports for a tool ended by SIGPIPE, never 0.
#[test]
fn a_closed_standard_output_is_not_success() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["check", "examples/add.tk"])
        .current_dir(root())
        .stdout(writer)
        .output()
        .expect("tessel runs");
    assert_eq!(out.status.code(), Some(141));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "quietly");
}

/// Mode bits of a file.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// Outputs and cache entries get the mode any new file gets (0666 less the umask), not the
/// 0600 of a temporary file.
#[test]
fn written_files_get_the_umask_mode() {
    let dir = tempfile::tempdir().unwrap();
    for (umask, want) in [("022", 0o644), ("027", 0o640)] {
        let out = dir.path().join(umask);
        let cache = dir.path().join(format!("cache{umask}"));
        let script = format!(
            "umask {umask} && \"$0\" run examples/add.tk --backend interpret --out-dir {} && \"$0\" lower examples/add.tk",
            out.display()
        );
        let status = Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_tessel")])
            .current_dir(root())
            .env("TESSEL_CACHE_DIR", &cache)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("sh runs");
        assert!(status.success());
        assert_eq!(mode(&out.join("o.npy")), want, "an output under umask {umask}");
        let entry =
            std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "lowered"));
        assert_eq!(mode(&entry.expect("a cache entry")), want, "a cache entry under umask {umask}");
    }
}

/// Sends `signal` to `child` at once (a `kill` process would take longer to start than a write
/// takes).
fn signal(child: &std::process::Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: `kill` reads no memory of ours; `pid` is our child, not yet waited for.
    #[allow(unsafe_code, reason = "libc::kill is an FFI call")]
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "signal {signal} sent");
}

/// SIGTERM while outputs are being written leaves no temporary file (it used to leave hidden
/// files of up to 524 MB) and no partial output: the command exits with 143. The command is
/// frozen (SIGSTOP) as soon as its temporary appears, so that the signal is known to land while
/// it writes; if it had already finished (a loaded machine), it is tried again.
#[test]
fn a_signal_while_writing_leaves_no_temporary() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let names = || -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
                .unwrap_or_default();
            v.sort();
            v
        };
        // 2^25 f32 elements: a 128 MiB output, long enough to write that the signal lands meanwhile.
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessel"))
            .args(["run", "examples/add.tk", "--backend", "interpret", "--param", "N=33554432", "--param", "B=1024"])
            .arg("--out-dir")
            .arg(dir.path())
            .current_dir(root())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("tessel runs");
        // Wait for the temporary of `o.npy` to appear.
        while names().is_empty() && child.try_wait().expect("wait").is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if child.try_wait().expect("wait").is_some() {
            continue;
        }
        signal(&child, libc::SIGSTOP);
        let frozen = names();
        if frozen.iter().any(|n| n == "o.npy") {
            signal(&child, libc::SIGCONT);
            child.wait().expect("wait");
            continue;
        }
        assert!(
            matches!(&frozen[..], [t] if t.starts_with(".o.npy.") && t.ends_with(".tmp")),
            "a temporary beside o.npy, nothing else: {frozen:?}"
        );
        signal(&child, libc::SIGTERM);
        signal(&child, libc::SIGCONT);
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(143), "ended by the signal while writing: {status:?}");
        assert_eq!(names(), Vec::<String>::new(), "nothing is left");
        return;
    }
    panic!("in 5 runs the output was written before it could be seen being written");
}
