//! Snapshots of canonical text (`snapshots/ir/`) for every kernel file in `examples/` and
//! `tests/in/`, and of the errors (`snapshots/errors/`) for every file in `tests/in/errors/`.
//! Review changes with `cargo insta review`; never accept them blindly.

mod common;

use std::path::{Path, PathBuf};

use common::root;

fn tk_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    files
}

/// The file as named in messages: relative to the repository root, so snapshots do not depend on
/// where the checkout lives.
fn display_name(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

fn snapshot(kind: &str, path: &Path, text: &str) {
    let stem = path.file_stem().and_then(|s| s.to_str()).expect("utf-8 file name");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots").join(kind));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_input_file(path);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(stem, text));
}

#[test]
fn canonical_text_of_every_kernel_file() {
    let files: Vec<PathBuf> = tk_files("examples").into_iter().chain(tk_files("tests/in")).collect();
    assert!(files.len() >= 9, "the examples are missing");
    for path in files {
        let source = std::fs::read_to_string(&path).expect("readable");
        let kernels = tessel::load_source(&display_name(&path), &source).unwrap_or_else(|e| panic!("{e}"));
        let text: Vec<String> = kernels.iter().map(|k| tessel_plugin_api::ir::print_kernel(k.kernel())).collect();
        let text = text.join("\n");
        // The canonical text is a fixed point: checking it again gives it back.
        let again = tessel::load_source("canonical.tk", &text).unwrap_or_else(|e| panic!("{e}"));
        let again: Vec<String> = again.iter().map(|k| tessel_plugin_api::ir::print_kernel(k.kernel())).collect();
        assert_eq!(again.join("\n"), text, "{}: canonical text is not stable", path.display());
        snapshot("ir", &path, &text);
        // A generic kernel's own canonical text, with its parameters: a fixed point too.
        let file = tessel::parse_kernels(&display_name(&path), &source).unwrap_or_else(|e| panic!("{e}"));
        if file.kernels().iter().any(|k| k.is_generic()) {
            let generic: Vec<&str> = file.kernels().iter().map(|k| k.template_text()).collect();
            let generic = generic.join("\n");
            let again = tessel::parse_kernels("canonical.tk", &generic).unwrap_or_else(|e| panic!("{e}"));
            let again: Vec<&str> = again.kernels().iter().map(|k| k.template_text()).collect();
            assert_eq!(again.join("\n"), generic, "{}: generic canonical text is not stable", path.display());
            let stem = path.file_stem().and_then(|s| s.to_str()).expect("utf-8 name");
            snapshot("ir", &path.with_file_name(format!("{stem}.generic.tk")), &generic);
        }
    }
}

/// Binding a generic kernel at launch: every way it fails, as the command line says it.
#[test]
fn errors_of_binding_generic_kernels() {
    let dir = tempfile::tempdir().expect("temp dir");
    let npy = |name: &str, shape: &[usize]| {
        let a = tessel::HostArray::zeros(tessel_plugin_api::ir::DType::F32, shape);
        let path = dir.path().join(format!("{name}.npy"));
        tessel::npy::write(&path, &a).expect("write");
        format!("{}={}", &name[..1], path.display())
    };
    let (x4096, y1000, x2d) = (npy("x4096", &[4096]), npy("y1000", &[1000]), npy("x2d", &[8, 8]));
    let cases: [&[&str]; 6] = [
        &["run", "examples/add.tk", "--input", &x4096, "--input", &y1000],
        &["run", "examples/add.tk", "--input", &x4096, "--param", "N=1000"],
        &["run", "examples/add.tk", "--param", "M=3"],
        &["run", "examples/softmax.tk", "--input", &x2d, "--param", "BM=0"],
        &["lower", "examples/matmul.tk", "--param", "K=0"],
        &["run", "tests/in/errors/param_no_default.tk"],
    ];
    let mut text = String::new();
    for args in cases {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = tessel::cli::main(std::iter::once("tessel").chain(args.iter().copied()), &mut out, &mut err);
        let err = String::from_utf8(err).expect("utf-8").replace(&dir.path().display().to_string(), "DIR");
        assert_eq!(code, 1, "{args:?}: {err}");
        text.push_str(&format!("$ tessel {}\n{err}\n", args.join(" ").replace(&dir.path().display().to_string(), "DIR")));
    }
    snapshot("errors", &root().join("tests/in/errors/binding.tk"), &text);
}

#[test]
fn errors_of_every_malformed_kernel() {
    let files = tk_files("tests/in/errors");
    assert!(files.len() >= 15, "at least 15 malformed kernels, found {}", files.len());
    for path in files {
        let source = std::fs::read_to_string(&path).expect("readable");
        let name = display_name(&path);
        let err = match tessel::load_source(&name, &source) {
            Ok(_) => panic!("{name} should not verify"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(&format!("{name}:")), "{name}: errors carry file:line:col\n{err}");
        snapshot("errors", &path, &err);
    }
}

/// The kernels of `tests/concurrent/` as wgpu runs them: several threads per program scheduled as
/// one (`ir::schedule`), their asynchronous statements made synchronous (`ir::synchronous`), in
/// `snapshots/schedule/` — the schedule read as the decision it is.
#[test]
fn the_schedule_compiled_into_every_concurrent_kernel() {
    use tessel_plugin_api::ir;
    let files = tk_files("tests/concurrent");
    assert!(files.len() >= 3, "the concurrent kernels are missing");
    for path in files {
        let source = std::fs::read_to_string(&path).expect("readable");
        let module = ir::parse(&source).unwrap_or_else(|d| panic!("{}: {d}", path.display()));
        let v = ir::verify(&module.kernels[0]).unwrap_or_else(|d| panic!("{}: {d}", path.display()));
        let one = ir::synchronous::synchronous(&v).unwrap_or_else(|u| panic!("{}: not scheduled: {u:?}", path.display()));
        let text = ir::print_kernel(one.kernel());
        // What wgpu runs is a kernel of the language: its text checks and prints back as itself.
        let again = tessel::load_source("scheduled.tk", &text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
        assert_eq!(ir::print_kernel(again[0].kernel()), text, "{}: the scheduled text is not stable", path.display());
        snapshot("schedule", &path, &text);
    }
}
