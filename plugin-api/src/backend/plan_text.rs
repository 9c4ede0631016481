//! A plan printed ([`super::Compiler::plan_text`]: `tessel lower --plan`, and the plan
//! snapshots `tests/lowering.rs` keeps beside the code each plan produces): one line a decision,
//! `name: value`, in the backend's order, each value by its name and every set in a stable order,
//! so that a plan reads, diffs and snapshots as the decision it is.

use std::fmt::{Display, Write};

use crate::ir::{AxisSize, ValueId, ValueMap, ValueSet, Verified};

/// The printed plan of one kernel: its header (name and grid), then the backend's lines.
pub struct PlanText<'v> {
    out: String,
    kernel: &'v Verified,
}

impl<'v> PlanText<'v> {
    /// The plan of `kernel`, its header written: `kernel NAME` and its grid as verified
    /// (a mesh's axes included), each axis with its size and role.
    pub fn new(kernel: &'v Verified) -> PlanText<'v> {
        let mut out = format!("kernel {}\n", kernel.name());
        let axes: Vec<String> = kernel
            .grid()
            .iter()
            .map(|a| {
                let size = match a.size {
                    AxisSize::Fixed(n) => n.to_string(),
                    AxisSize::Dyn => "dyn".to_string(),
                };
                let role = if a.thread {
                    " thread"
                } else if a.seq {
                    " seq"
                } else {
                    ""
                };
                format!("{}: {size}{role}", a.name)
            })
            .collect();
        let _ = writeln!(out, "  grid: ({})", axes.join(", "));
        PlanText { out, kernel }
    }

    /// `name: value`.
    pub fn line(&mut self, name: &str, value: impl Display) -> &mut Self {
        let _ = writeln!(self.out, "  {name}: {value}");
        self
    }

    /// `name: %a %b ...` (by id), or `none`.
    pub fn values(&mut self, name: &str, ids: impl IntoIterator<Item = ValueId>) -> &mut Self {
        let names: Vec<String> = ids.into_iter().map(|id| format!("%{}", self.kernel.values().name(id))).collect();
        self.line(name, if names.is_empty() { "none".to_string() } else { names.join(" ") })
    }

    /// `name: %a %b ...` for a set of values.
    pub fn value_set(&mut self, name: &str, set: &ValueSet) -> &mut Self {
        self.values(name, set.iter())
    }

    /// `name: %a -> what, %b -> what` (by id), or `none`.
    pub fn value_map<T>(&mut self, name: &str, map: &ValueMap<T>, what: impl Fn(&T) -> String) -> &mut Self {
        let entries: Vec<String> =
            map.iter().map(|(id, t)| format!("%{} -> {}", self.kernel.values().name(id), what(t))).collect();
        self.line(name, if entries.is_empty() { "none".to_string() } else { entries.join(", ") })
    }

    /// `name: a b ...`, sorted, or `none`.
    pub fn names<S: AsRef<str>>(&mut self, name: &str, names: impl IntoIterator<Item = S>) -> &mut Self {
        let mut names: Vec<String> = names.into_iter().map(|s| s.as_ref().to_string()).collect();
        names.sort();
        self.line(name, if names.is_empty() { "none".to_string() } else { names.join(" ") })
    }

    /// The name of value `id`, for a backend's own lines.
    pub fn value_name(&self, id: ValueId) -> &str {
        self.kernel.values().name(id)
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The plan of a backend whose plan is the verified kernels themselves (the interpreter, the
/// cpu plugin): each kernel's header, its decisions made when it is compiled.
pub fn verified_only(kernels: &[Verified], note: &str) -> String {
    kernels
        .iter()
        .map(|k| {
            let mut t = PlanText::new(k);
            t.line("decided", note);
            t.finish()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir;

    #[test]
    fn a_plan_prints_its_grid_and_values_by_name_in_a_stable_order() {
        let text = "kernel k\n  grid (i: 4, j: 2 seq)\n  in x: f32[64] block [16] at (i)\n  out o: f32[64] block [16] at (i)\n{\n  %x = load x\n  %y = neg %x\n  store o, %y\n}\n";
        let v = ir::verify(&ir::parse(text).unwrap().kernels.remove(0)).unwrap();
        let mut set = ValueSet::new();
        set.insert(v.id("y"));
        set.insert(v.id("x"));
        let mut map = ValueMap::new();
        map.insert(v.id("y"), 3usize);
        let mut t = PlanText::new(&v);
        t.value_set("inlined", &set).value_map("slots", &map, |n| format!("word {n}")).names("kept", ["o", "a"]);
        t.values("none here", []);
        assert_eq!(
            t.finish(),
            "kernel k\n  grid: (i: 4, j: 2 seq)\n  inlined: %x %y\n  slots: %y -> word 3\n  kept: a o\n  none here: none\n"
        );
    }
}
