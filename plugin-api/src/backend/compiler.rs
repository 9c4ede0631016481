//! The pure half of a backend: [`Compiler`] turns a launch into a plan and the plan into an
//! artifact and its text, touching no device; [`Options`] says what else its output depends on.
//! A test, a benchmark or a tool lowers through it directly, without the host, a plugin or an
//! adapter (`tests/lowering.rs` snapshots every kernel file so, for every target and strategy).

use std::fmt;

use super::Request;
use crate::abi::BackendError;

/// What a backend's lowering depends on besides the kernels and the backend's version: named
/// settings (a strategy, a loop budget, a thread count), in the order the compiler gives them.
/// Hashed into the key of every compiled launch, lowered text on disk and tuning record (by its
/// text, which `tessel backends` shows), so that output made under other options is never taken
/// for this one's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Options(Vec<(String, String)>);

impl Options {
    /// No options: the output depends on the kernels and the version alone.
    pub fn new() -> Options {
        Options(Vec::new())
    }

    /// These options and `name` set to `value`.
    pub fn with(mut self, name: &str, value: impl fmt::Display) -> Options {
        self.0.push((name.to_string(), value.to_string()));
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `strategy cpu, loop budget 65535`; empty for none.
impl fmt::Display for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.0.iter().enumerate() {
            write!(f, "{}{name} {value}", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }
}

/// A backend's compiler: kernels in, plans, artifacts and lowered text out, without a device.
/// Everything it decides is in its [`Options`], fixed when it is made (the backend makes one for
/// the device it runs on: [`super::BackendImpl::compiler`]).
pub trait Compiler: Send + Sync {
    /// What `plan` decided and `compile` consumes (verified kernels, their grids, the lowering's
    /// choices), so that a launch is checked and planned once.
    type Plan: Clone + Send + Sync + 'static;
    /// A launch lowered: what the backend runs. The host's adapter caches it by launch.
    type Artifact: Send + Sync + 'static;
    /// What its output depends on besides the kernels and the backend's version.
    fn options(&self) -> Options {
        Options::new()
    }
    /// The plan, or the refusal: cheap, no lowering. It is where a backend checks that a mesh is
    /// its own. The host asks it once per launch it plans (`Runtime::plan`; under `auto`, once per
    /// backend it tries), and its adapter keeps the plan by launch.
    fn plan(&self, launch: &Request<'_>) -> Result<Self::Plan, BackendError>;
    /// Lowers a launch from the plan `plan` made for it.
    fn compile(&self, launch: &Request<'_>, plan: Self::Plan) -> Result<Self::Artifact, BackendError>;
    /// Every decision `plan` made, as text ([`PlanText`](super::PlanText)): `tessel lower
    /// --plan` prints it, and `tests/lowering.rs` snapshots it beside the code it produces.
    fn plan_text(&self, plan: &Self::Plan) -> String;
    /// Named stages of lowered text (`ptx`, `wgsl`, ...), for `tessel lower`.
    fn stages(&self, artifact: &Self::Artifact) -> Vec<(String, String)>;
    /// `plan`, `compile` and `stages` in one: the launch's lowered text.
    fn lower(&self, launch: &Request<'_>) -> Result<Vec<(String, String)>, BackendError> {
        let plan = self.plan(launch)?;
        Ok(self.stages(&self.compile(launch, plan)?))
    }
}

#[cfg(test)]
mod tests {
    use super::Options;

    #[test]
    fn options_print_in_order_and_differ_by_any_value() {
        let a = Options::new().with("strategy", "cpu").with("loop budget", 65535);
        assert_eq!(a.to_string(), "strategy cpu, loop budget 65535");
        assert_eq!(a.get("loop budget"), Some("65535"));
        assert_eq!(Options::new().to_string(), "");
        assert_ne!(a, Options::new().with("strategy", "gpu").with("loop budget", 65535));
    }
}
