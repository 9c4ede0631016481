//! Where a semantics case runs: the interpreter, wgpu, and Mosaic GPU's PTX on the emulator.

use std::collections::BTreeMap;

use tessel::{HostArray, LaunchArgs};

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exec {
    Interpret,
    Wgpu,
    MosaicEmulated,
}

impl Exec {
    /// The outputs of the kernel in `src` on this executor, or `None` after a recorded skip.
    pub fn run(self, src: &str, inputs: Vec<(&str, HostArray)>, grid: &[(&str, u64)]) -> Option<BTreeMap<String, HostArray>> {
        let kernels = tessel::load_source("test.tk", src).unwrap_or_else(|e| panic!("{e}"));
        let args = LaunchArgs {
            inputs: inputs.into_iter().map(|(n, a)| (n.to_string(), a)).collect(),
            grid: grid.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        };
        let what = format!("semantics on {self:?}");
        let outputs = match self {
            Exec::Interpret => tessel::run_kernel("interpret", &kernels[0], &args).unwrap_or_else(|e| panic!("{e}")),
            Exec::Wgpu => {
                super::wgpu_adapter(&what)?;
                tessel::run_kernel("wgpu", &kernels[0], &args).unwrap_or_else(|e| panic!("{e}"))
            }
            Exec::MosaicEmulated => {
                let rt = tessel::Runtime::new(&[]).expect("runtime");
                let call = [tessel::Call::new(kernels[0].clone())];
                let ptx =
                    match rt.plan(tessel::Choice::Named("mosaic-gpu"), &tessel::Launch::kernels(call.clone())).and_then(|p| p.lower()) {
                        Ok(mut l) => l.remove(0).1,
                        // The one refusal by design among these cases (DESIGN.md's sentence).
                        Err(e) if e.to_string().starts_with("dynamic grid bounds not supported in the Mosaic GPU backend") => {
                            eprintln!(
                                "{what}: refused by design, as it should be: {}",
                                e.to_string().lines().next().unwrap_or_default()
                            );
                            return None;
                        }
                        Err(e) => panic!("{e}"),
                    };
                super::emulate(&ptx, &kernels[0], &args, false).unwrap_or_else(|e| panic!("{e}"))
            }
        };
        Some(outputs.into_iter().collect())
    }
}

impl Exec {
    /// Every executor.
    pub const ALL: [Exec; 3] = [Exec::Interpret, Exec::Wgpu, Exec::MosaicEmulated];
}
