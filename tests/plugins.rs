//! Plugins as real shared libraries: listing, launching through them, and every way loading one
//! can fail. The libraries are built here with cargo (a no-op when they are up to date).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::{cargo_build, root, target_dir};

/// Builds the `tessel` binary, the interpreter as a plugin, and the fixture plugins, once.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        // The host on its own: built with a backend's `plugin` feature it would export a root module.
        cargo_build(&["-p", "tessel"]);
        cargo_build(&["-p", "tessel-interpret", "--features", "plugin"]);
        cargo_build(&["-p", "tessel-mosaic-gpu", "--features", "plugin"]);
        cargo_build(&[
            "-p",
            "tessel-fixture-panics",
            "-p",
            "tessel-fixture-old-api",
            "-p",
            "tessel-fixture-bad-layout",
            "-p",
            "tessel-fixture-not-a-plugin",
        ]);
        target_dir()
    })
}

fn lib(name: &str) -> PathBuf {
    built().join(format!("{}{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX))
}

fn tessel(args: &[&str], plugin_path: Option<&str>, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(built().join("tessel"));
    cmd.current_dir(root()).args(args).env_remove("TESSEL_PLUGIN_PATH").env("RUST_BACKTRACE", "1");
    if let Some(p) = plugin_path {
        cmd.env("TESSEL_PLUGIN_PATH", p);
    }
    cmd.envs(envs.iter().copied());
    cmd.output().expect("tessel runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A plugin error: exit 1, one short paragraph naming the file, no panic, no backtrace.
fn assert_refused(out: &Output, file: &str, needles: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(file), "names the file `{file}`: {err}");
    for n in needles {
        assert!(err.contains(n), "lacks {n:?}: {err}");
    }
    assert!(err.len() < 2000, "one short paragraph, got {} bytes", err.len());
    assert!(!err.contains("panicked at") && !err.contains("stack backtrace"), "{err}");
}

/// A folder holding a copy of the interpreter plugin under `name`.
fn plugin_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(lib("tessel_interpret"), dir.path().join(name)).expect("copy plugin");
    dir
}

#[test]
fn registry_has_built_ins() {
    let reg = tessel::registry::Registry::builtins();
    assert!(
        !reg.backends.is_empty(),
        "inventory found no built-in backend: is every backend crate named in host/src/registry.rs?"
    );
    assert!(reg.get("interpret").is_some());
}

#[test]
fn plugin_path_folder_lists_plugins_with_their_paths() {
    let dir = plugin_copy("libtessel_interpret.so");
    let out = tessel(&["backends", "--json"], Some(dir.path().to_str().unwrap()), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let b =
        json["backends"].as_array().expect("backends").iter().find(|b| b["name"] == "interpret").expect("interpret is listed");
    let path = dir.path().join("libtessel_interpret.so").canonicalize().unwrap();
    assert_eq!(b["name"], "interpret");
    assert_eq!(b["source"], path.display().to_string());
    assert_eq!(b["note"], "replaces the built-in interpret");
    assert_eq!(b["available"], true);
    assert!(b["capabilities"]["dtypes"].as_array().unwrap().iter().any(|d| d == "bf16"));
}

#[test]
fn launches_through_a_plugin_match_the_built_in() {
    let dir = plugin_copy("libtessel_interpret.so");
    let outs = tempfile::tempdir().unwrap();
    for (sub, plugin) in [("builtin", None), ("plugin", Some(dir.path().to_str().unwrap()))] {
        let out_dir = outs.path().join(sub);
        let out =
            tessel(&["run", "examples/flash_attention.tk", "--seed", "4", "--out-dir", out_dir.to_str().unwrap()], plugin, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let a = std::fs::read(outs.path().join("builtin/o.npy")).unwrap();
    let b = std::fs::read(outs.path().join("plugin/o.npy")).unwrap();
    assert_eq!(a, b, "the plugin computes exactly what the built-in does");
}

#[test]
fn missing_plugin_file() {
    let out = tessel(&["--plugin", "no/such/libplugin.so", "backends"], None, &[]);
    assert_refused(&out, "no/such/libplugin.so", &["does not exist"]);
}

#[test]
fn file_that_is_not_a_shared_library() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libfake.so");
    std::fs::write(&fake, "not an ELF file\n").unwrap();
    let out = tessel(&["--plugin", fake.to_str().unwrap(), "backends"], None, &[]);
    assert_refused(&out, "libfake.so", &["is not a shared library that can be loaded", "cdylib"]);
}

#[test]
fn shared_library_that_is_not_a_plugin() {
    let l = lib("tessel_fixture_not_a_plugin");
    let out = tessel(&["--plugin", l.to_str().unwrap(), "backends"], None, &[]);
    assert_refused(&out, "libtessel_fixture_not_a_plugin", &["not a tessel plugin", "export_plugin!"]);
}

#[test]
fn plugin_built_against_an_older_plugin_api() {
    let l = lib("tessel_fixture_old_api");
    let out = tessel(&["--plugin", l.to_str().unwrap(), "backends"], None, &[]);
    assert_refused(
        &out,
        "libtessel_fixture_old_api",
        &["built against tessel-plugin-api 0.1.0", "this tessel has tessel-plugin-api 0.5.0", "rebuild the plugin"],
    );
}

#[test]
fn plugin_with_a_changed_layout() {
    let l = lib("tessel_fixture_bad_layout");
    let out = tessel(&["--plugin", l.to_str().unwrap(), "backends"], None, &[]);
    assert_refused(&out, "libtessel_fixture_bad_layout", &["root module layout differs", "version 0.5.0", "rebuild the plugin"]);
    let debug = tessel(&["--plugin", l.to_str().unwrap(), "backends"], None, &[("TESSEL_LOG", "debug")]);
    assert!(text(&debug.stderr).contains("abi_stable layout report"), "the full report goes to the debug log");
}

#[test]
fn failed_plugins_on_the_path_are_listed_and_the_rest_works() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(lib("tessel_fixture_old_api"), dir.path().join("libold.so")).unwrap();
    std::fs::write(dir.path().join("libjunk.so"), "junk").unwrap();
    let out = tessel(&["backends"], Some(dir.path().to_str().unwrap()), &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(stdout.contains("interpret 0.1.0, threads ") && stdout.contains(" (built-in)"), "{stdout}");
    assert!(
        stdout.contains("failed plugin")
            && stdout.contains("libold.so")
            && stdout.contains("built against tessel-plugin-api 0.1.0"),
        "{stdout}"
    );
    assert!(stdout.contains("libjunk.so") && stdout.contains("not a shared library"), "{stdout}");
}

#[test]
fn two_plugins_with_one_name() {
    let (a, b) = (plugin_copy("libtessel_interpret.so"), plugin_copy("libtessel_interpret.so"));
    let path = format!("{}:{}", a.path().display(), b.path().display());
    let out = tessel(&["backends"], Some(&path), &[]);
    let stdout = text(&out.stdout);
    let (pa, pb) = (a.path().canonicalize().unwrap(), b.path().canonicalize().unwrap());
    assert!(stdout.contains("two plugins are both called `interpret`"), "{stdout}");
    assert!(stdout.contains(&pa.display().to_string()) && stdout.contains(&pb.display().to_string()), "both paths: {stdout}");
    // The same file twice is one plugin, not a duplicate.
    let twice = format!("{}:{}", a.path().display(), a.path().display());
    assert!(!text(&tessel(&["backends"], Some(&twice), &[]).stdout).contains("two plugins"));
}

#[test]
fn panics_in_a_plugin_are_caught() {
    let l = lib("tessel_fixture_panics");
    let l = l.to_str().unwrap();
    let out = tessel(&["--plugin", l, "backends"], None, &[("TESSEL_FIXTURE_PANIC_IN", "new")]);
    assert_refused(&out, "libtessel_fixture_panics", &["panicked in `new_backend`", "fixture panics in new on purpose"]);

    let out = tessel(&["--plugin", l, "backends"], None, &[("TESSEL_FIXTURE_PANIC_IN", "availability")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("unavailable: the backend panicked in `availability`"), "{}", text(&out.stdout));

    for place in ["supports", "launch"] {
        let dir = tempfile::tempdir().unwrap();
        let args = ["--plugin", l, "run", "examples/add.tk", "--backend", "panicky", "--out-dir", dir.path().to_str().unwrap()];
        let out = tessel(&args, None, &[("TESSEL_FIXTURE_PANIC_IN", place)]);
        assert_refused(&out, &format!("panicked in `{place}`"), &["the host caught it"]);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "no output after a failed launch");
    }
}

#[test]
fn meshes_are_owned_by_the_library_that_made_them() {
    use tessel_interpret::mesh::InterpretMesh;
    let mut reg = tessel::registry::Registry::builtins();
    let dir = plugin_copy("libtessel_interpret.so");
    let builtin_mesh = reg.get("interpret").unwrap().backend.make_mesh("grid(i: 4)".into()).unwrap();
    assert!(builtin_mesh.obj.downcast_as::<InterpretMesh>().is_ok(), "a mesh made by this library downcasts");
    let plugin = reg.load(&dir.path().join("libtessel_interpret.so")).expect("loads");
    let plugin_mesh = plugin.backend.make_mesh("grid(i: 4)".into()).unwrap();
    assert!(plugin_mesh.obj.downcast_as::<InterpretMesh>().is_err(), "the same type made by another library does not");
    assert_eq!(plugin_mesh.display().as_str(), "grid(i: 4)");
}

#[test]
fn device_meshes_are_refused_as_kernel_meshes() {
    let out = tessel(&["run", "examples/add.tk", "--mesh", "device(x: 2)"], None, &[]);
    assert_refused(
        &out,
        "device(x: 2) describes devices for sharding, not a kernel's grid",
        &["pass a kernel mesh such as grid(...)"],
    );
    let out = tessel(&["lower", "examples/add.tk", "--mesh", "grid(i: 4)"], None, &[]);
    assert_refused(&out, "i mixes mesh and grid axes", &["declares `i: 8`"]);
}

#[test]
fn the_mosaic_gpu_plugin_lowers_like_the_built_in() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(lib("tessel_mosaic_gpu"), dir.path().join("libtessel_mosaic_gpu.so")).unwrap();
    let plugin = dir.path().join("libtessel_mosaic_gpu.so");
    let args = ["lower", "examples/softmax.tk", "--backend", "mosaic-gpu", "--mesh", "mosaic_gpu(i: 64)"];
    let builtin = tessel(&args, None, &[]);
    let mut with_plugin = vec!["--plugin", plugin.to_str().unwrap()];
    with_plugin.extend(args);
    let loaded = tessel(&with_plugin, None, &[]);
    assert_eq!(builtin.status.code(), Some(0), "{}", text(&builtin.stderr));
    assert_eq!(loaded.status.code(), Some(0), "{}", text(&loaded.stderr));
    assert_eq!(text(&builtin.stdout), text(&loaded.stdout), "the plugin lowers exactly like the built-in");
    // Its own meshes are made by the plugin: a mesh made by the built-in would be foreign to it.
    let refused = tessel(
        &["--plugin", plugin.to_str().unwrap(), "lower", "examples/add.tk", "--backend", "mosaic-gpu", "--mesh", "grid(i: 8)"],
        None,
        &[],
    );
    assert_refused(&refused, "Mesh grid(i: 8) is not supported by the Mosaic GPU backend", &[]);
}

/// A backend named for a launch that says it is unavailable is refused with its reason, before
/// anything runs or is written (it used to be launched anyway); lowering needs no device and
/// still works, and `tessel backends` lists it as unavailable.
#[test]
fn a_named_unavailable_backend_is_refused_with_its_reason() {
    let l = lib("tessel_fixture_panics");
    let l = l.to_str().unwrap();
    let unavailable = [("TESSEL_FIXTURE_UNAVAILABLE", "no panicky device here")];
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    for args in [
        &["run", "examples/add.tk", "--backend", "panicky", "--out-dir", out_dir][..],
        &["bench", "examples/add.tk", "--backend", "panicky", "--runs", "1"],
        &["tune", "examples/add.tk", "--backend", "panicky", "--runs", "1"],
    ] {
        let out = tessel(&[&["--plugin", l][..], args].concat(), None, &unavailable);
        assert_refused(&out, "backend panicky is unavailable: no panicky device here", &["`tessel backends` lists them"]);
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "no output");
    // TESSEL_BACKEND names a backend too.
    let out = tessel(
        &["--plugin", l, "run", "examples/add.tk", "--out-dir", out_dir],
        None,
        &[unavailable[0], ("TESSEL_BACKEND", "panicky")],
    );
    assert_refused(&out, "backend panicky is unavailable: no panicky device here", &[]);
    // A panic in `availability` makes it unavailable, with that reason.
    let out = tessel(
        &["--plugin", l, "run", "examples/add.tk", "--backend", "panicky", "--out-dir", out_dir],
        None,
        &[("TESSEL_FIXTURE_PANIC_IN", "availability")],
    );
    assert_refused(&out, "backend panicky is unavailable: the backend panicked in `availability`", &[]);
    let out = tessel(&["--plugin", l, "lower", "examples/add.tk", "--backend", "panicky"], None, &unavailable);
    assert_eq!(out.status.code(), Some(0), "lowering needs no device: {}", text(&out.stderr));
    let out = tessel(&["--plugin", l, "backends"], None, &unavailable);
    assert!(text(&out.stdout).contains("unavailable: no panicky device here"), "{}", text(&out.stdout));
}

/// Plugins of TESSEL_PLUGIN_PATH are loaded only where they may be needed: a library that
/// crashes while loading (here: ends the process in its constructor, which no host can catch) no longer
/// takes down a run on a built-in backend; `backends` and `auto` still load every plugin.
#[test]
fn a_crashing_plugin_on_the_path_spares_runs_on_other_backends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(lib("tessel_fixture_panics"), dir.path().join("libpanicky.so")).unwrap();
    let path = Some(dir.path().to_str().unwrap());
    let exits = [("TESSEL_FIXTURE_EXIT_ON_LOAD", "1")];
    let outs = tempfile::tempdir().unwrap();
    let out_dir = outs.path().to_str().unwrap();
    let out = tessel(&["run", "examples/add.tk", "--backend", "interpret", "--out-dir", out_dir], path, &exits);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = tessel(&["lower", "examples/add.tk"], path, &exits);
    assert_eq!(out.status.code(), Some(0), "lower's default backend is a built-in: {}", text(&out.stderr));
    // Where every plugin is loaded, the crash is still the library's: the process ends with it.
    for args in [
        &["backends"][..],
        &["run", "examples/add.tk", "--out-dir", out_dir],
        &["lower", "examples/add.tk", "--backend", "panicky"],
    ] {
        let out = tessel(args, path, &exits);
        assert_eq!(out.status.code(), Some(86), "{args:?} loads the plugin, which ends the process: {}", text(&out.stderr));
    }
    // Without the crash, a plugin on the path is found by name.
    let out = tessel(&["lower", "examples/add.tk", "--backend", "panicky"], path, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `--plugin` takes a folder, as its help says: every shared library in it is loaded. A folder
/// without one is refused, naming it.
#[test]
fn a_plugin_folder_loads_every_library_in_it() {
    let dir = plugin_copy("libtessel_interpret.so");
    let out = tessel(&["--plugin", dir.path().to_str().unwrap(), "backends", "--json"], None, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let b = json["backends"].as_array().unwrap().iter().find(|b| b["name"] == "interpret").unwrap().clone();
    let path = dir.path().join("libtessel_interpret.so").canonicalize().unwrap();
    assert_eq!(b["source"], path.display().to_string());
    let empty = tempfile::tempdir().unwrap();
    let out = tessel(&["--plugin", empty.path().to_str().unwrap(), "backends"], None, &[]);
    assert_refused(&out, &empty.path().display().to_string(), &["holds no shared library (*.so)"]);
}

/// Whether these tests run as root (`id -u`).
fn as_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("id runs");
    text(&out.stdout).trim() == "0"
}

/// A plugin that another user could have replaced (the file, or a folder above it without the
/// sticky bit, writable by its group or every user) is refused as root, as `ssh` refuses such a key, and
/// loaded with a warning for any other user (it used to be loaded silently).
#[test]
fn a_plugin_any_user_may_write_is_refused_as_root() {
    use std::os::unix::fs::PermissionsExt;
    let dir = plugin_copy("libtessel_interpret.so");
    let file = dir.path().join("libtessel_interpret.so");
    let chmod = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    let folder = dir.path().to_path_buf();
    for (what, writable, fix, bad, good) in [
        ("the file is writable by every user", &file, &file, 0o666, 0o644),
        ("the file is writable by its group (gid ", &file, &file, 0o664, 0o644),
        ("its folder", &folder, &folder, 0o777, 0o700),
        ("is writable by its group (gid ", &folder, &folder, 0o770, 0o700),
    ] {
        chmod(writable, bad);
        let out = tessel(&["--plugin", file.to_str().unwrap(), "backends"], None, &[]);
        if as_root() {
            assert_refused(
                &out,
                "libtessel_interpret.so",
                &["is not loaded: ", what, &format!("chmod go-w {}", fix.canonicalize().unwrap().display())],
            );
            // From TESSEL_PLUGIN_PATH it is listed as a failed plugin, and named where its
            // backend is asked for.
            let listed = tessel(&["backends"], Some(file.to_str().unwrap()), &[]);
            assert_eq!(listed.status.code(), Some(0));
            assert!(
                text(&listed.stdout).contains("failed plugin") && text(&listed.stdout).contains(what),
                "{}",
                text(&listed.stdout)
            );
            let named = tessel(&["lower", "examples/add.tk", "--backend", "mine"], Some(file.to_str().unwrap()), &[]);
            assert_refused(&named, "unknown backend `mine`", &["not loaded: plugin `", what]);
        } else {
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            assert!(text(&out.stderr).contains("warning: plugin") && text(&out.stderr).contains(what), "{}", text(&out.stderr));
        }
        chmod(writable, good);
    }
    let out = tessel(&["--plugin", file.to_str().unwrap(), "backends"], None, &[]);
    assert_eq!(out.status.code(), Some(0), "owner-only again: {}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("warning"), "{}", text(&out.stderr));
}
