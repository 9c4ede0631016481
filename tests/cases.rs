//! Semantics cases as files: every `tests/cases/*.tk` runs on every executor (the interpreter,
//! wgpu, Mosaic GPU's PTX on the emulator) and its outputs must be the values its comment lines
//! give, worked out by hand:
//!
//! ```text
//! # in  NAME = v, v, ...     every element of input NAME, row-major (its type is the kernel's)
//! # grid AXIS = N            the size of a `dyn` grid axis
//! # out NAME = v, v, ...     every element of output NAME, as it must come out
//! ```
//!
//! Values are decimal, `0x` hexadecimal (for the bits of `u32`), `true`/`false`, `nan`, `inf`;
//! floats compare within the dtype's tolerance (docs/language.md §10), integers exactly. A new
//! language rule is a new file here. A missing adapter is a recorded skip; a refusal by design
//! (Mosaic GPU takes no `dyn` grid) is said on stderr.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::exec::Exec;
use common::{assert_close, root};
use tessel::HostArray;
use tessel_plugin_api::ir::{DType, ParamKind, Verified};

/// One case file: its kernel text and what its comment lines say.
struct Case {
    path: PathBuf,
    text: String,
    inputs: Vec<(String, Vec<f64>)>,
    grid: Vec<(String, u64)>,
    outputs: Vec<(String, Vec<f64>)>,
}

fn value(path: &Path, v: &str) -> f64 {
    let v = v.trim();
    match v {
        "true" => 1.0,
        "false" => 0.0,
        _ => match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("{}: `{v}`: {e}", path.display())) as f64,
            None => v.parse().unwrap_or_else(|e| panic!("{}: `{v}` is not a number: {e}", path.display())),
        },
    }
}

fn read(path: PathBuf) -> Case {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut case = Case { path: path.clone(), text: text.clone(), inputs: Vec::new(), grid: Vec::new(), outputs: Vec::new() };
    for line in text.lines().filter_map(|l| l.strip_prefix('#')) {
        let mut words = line.trim_start().splitn(2, ' ');
        let (Some(what @ ("in" | "out" | "grid")), Some(rest)) = (words.next(), words.next()) else { continue };
        let (name, values) = rest.split_once('=').unwrap_or_else(|| panic!("{}: `#{line}` needs `NAME = ...`", path.display()));
        let name = name.trim().to_string();
        let values: Vec<f64> = values.split(',').map(|v| value(&path, v)).collect();
        match what {
            "in" => case.inputs.push((name, values)),
            "out" => case.outputs.push((name, values)),
            _ => case.grid.push((name, values[0] as u64)),
        }
    }
    assert!(!case.outputs.is_empty(), "{}: no `# out` line says what must come out", path.display());
    case
}

fn cases() -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("tests/cases"))
        .expect("tests/cases")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tk"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "the case files are missing");
    files.into_iter().map(read).collect()
}

/// `values` as an array of the kernel's type for argument `name`.
fn array(case: &Case, kernel: &Verified, name: &str, values: &[f64]) -> HostArray {
    let p = kernel.kernel().params.iter().find(|p| p.name == name);
    let p = p.unwrap_or_else(|| panic!("{}: the kernel has no argument `{name}`", case.path.display()));
    assert_eq!(values.len(), p.ty.numel(), "{}: `{name}` is {} but {} values are given", case.path.display(), p.ty, values.len());
    common::array_of(&p.ty, values)
}

fn check(case: &Case, ex: Exec) {
    let what = |out: &str| format!("{} on {ex:?}: `{out}`", case.path.strip_prefix(root()).unwrap_or(&case.path).display());
    let kernels = tessel::load_source("case.tk", &case.text).unwrap_or_else(|e| panic!("{e}"));
    let inputs: Vec<(&str, HostArray)> = case.inputs.iter().map(|(n, v)| (n.as_str(), array(case, &kernels[0], n, v))).collect();
    let grid: Vec<(&str, u64)> = case.grid.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let Some(outputs): Option<BTreeMap<String, HostArray>> = ex.run(&case.text, inputs, &grid) else { return };
    let declared: Vec<&str> = kernels[0].kernel().params_of(ParamKind::Out).map(|p| p.name.as_str()).collect();
    for name in &declared {
        assert!(case.outputs.iter().any(|(n, _)| n == name), "{}: no `# out {name} = ...` line", what(name));
    }
    for (name, want) in &case.outputs {
        let got = outputs.get(name).unwrap_or_else(|| panic!("{}: not an output of the kernel", what(name)));
        let dtype: DType = got.dtype();
        assert_close(&what(name), got, want, dtype);
    }
}

#[test]
fn every_case_file_on_the_interpreter() {
    cases().iter().for_each(|c| check(c, Exec::Interpret));
}

#[test]
fn every_case_file_on_wgpu() {
    cases().iter().for_each(|c| check(c, Exec::Wgpu));
}

#[test]
fn every_case_file_on_mosaic_gpu_emulated() {
    cases().iter().for_each(|c| check(c, Exec::MosaicEmulated));
}
