//! Which invocation owns which element of a value (the plan's layout: `Layout::group_of`,
//! `KernelPlan::row_runs`), the private array that holds an invocation's elements (of `vec4`s for
//! whole rows of a multiple of 4), and the loops of the invocations over a value's elements
//! (`each` and its kin), unrolled where they are short.

use tessel_plugin_api::ir::*;

use super::Writer;
use crate::conv::reg_ty;

/// Element loops of at most this many slots per invocation are unrolled.
const UNROLL: usize = 8;

impl<'k> Writer<'k> {
    /// [`Layout::group_of`](crate::lower::Layout::group_of).
    fn group_of(&self, shape: &[usize]) -> usize {
        self.plan.group_of(shape)
    }

    /// Private slots per invocation of a value of `shape`.
    pub(super) fn slots(&self, shape: &[usize]) -> usize {
        let (g, n) = (self.group_of(shape), shape.iter().product::<usize>());
        g * n.div_ceil(g * self.plan.wg as usize)
    }

    /// The element of slot `k` (a constant) of a value of `shape`, as a WGSL expression of `lid`.
    pub(super) fn element(&self, shape: &[usize], k: usize) -> String {
        let wg = self.plan.wg as usize;
        let g = self.group_of(shape);
        if self.plan.row_runs(shape).is_some() {
            return self.run_element(shape, &format!("{}u", k / g), &format!("{}u", k % g));
        }
        if g > 1 { format!("{g}u * lid + {}u", g * wg * (k / g) + k % g) } else { format!("lid + {}u", k * wg) }
    }

    /// Where invocations own runs of rows of `shape` ([`KernelPlan::row_runs`](crate::lower::KernelPlan::row_runs)):
    /// the element of the invocation's group `j` (its `j`-th row), column `t` of the group (WGSL
    /// expressions).
    fn run_element(&self, shape: &[usize], j: &str, t: &str) -> String {
        let (groups, rows) = self.plan.row_runs(shape).expect("values owned in runs of rows");
        let (g, n) = (self.group_of(shape), shape[1]);
        format!("{n}u * ({rows}u * (lid / {groups}u) + {j}) + {g}u * (lid % {groups}u) + {t}")
    }

    /// The element of the slot in the WGSL variable `k`, of a value of `shape`.
    pub(super) fn element_of_var(&self, shape: &[usize]) -> String {
        let g = self.group_of(shape);
        if self.plan.row_runs(shape).is_some() {
            return self.run_element(shape, &format!("k / {g}u"), &format!("k % {g}u"));
        }
        if g > 1 {
            format!("{g}u * (lid + {}u * (k / {g}u)) + k % {g}u", self.plan.wg)
        } else {
            format!("lid + k * {}u", self.plan.wg)
        }
    }

    /// Whether some invocation's last slots of a value of `shape` lie past its elements.
    pub(super) fn ragged(&self, shape: &[usize]) -> bool {
        let per = self.group_of(shape) * self.plan.wg as usize;
        !shape.iter().product::<usize>().is_multiple_of(per)
    }

    /// In the row layout, which of the invocation's rows slot `k` of a value of shape `res`
    /// (rows of `len`) lies in: `0u` where each invocation owns at most one row, so that the
    /// driver sees a constant index and keeps the row's `[R, 1]` values in registers.
    pub(super) fn row_of_slot(&self, res: &[usize], len: usize) -> String {
        let rows = res.iter().product::<usize>() / len.max(1);
        if rows <= self.plan.wg as usize { "0u".to_string() } else { format!("k / {len}u") }
    }

    /// Whether values of `shape` are held four elements to a `vec4` (`array<vec4<T>, slots / 4>`,
    /// slot `k` at `[k / 4][k % 4]`): in the row layout, values owned by whole rows of a multiple
    /// of 4, so that loads, stores and reductions move four elements at a time.
    pub(super) fn quad_value(&self, shape: &[usize]) -> bool {
        self.plan.row_len().is_some_and(|c| c.is_multiple_of(4) && self.group_of(shape) == c)
    }

    /// Slot `k` of the private array `id` of a value of `shape`.
    pub(super) fn at(&self, id: &str, shape: &[usize]) -> String {
        match (self.quad_value(shape), self.quad_lane) {
            (true, Some(t)) => format!("{id}[j].{}", ["x", "y", "z", "w"][t]),
            (true, None) => format!("{id}[k / 4u][k % 4u]"),
            (false, _) => format!("{id}[k]"),
        }
    }

    /// The WGSL type of the private array of a value of `shape` and `dtype`.
    pub(super) fn array_ty(&self, shape: &[usize], dtype: DType) -> String {
        let slots = self.slots(shape);
        if self.quad_value(shape) {
            format!("array<vec4<{}>, {}>", reg_ty(dtype), slots / 4)
        } else {
            format!("array<{}, {slots}>", reg_ty(dtype))
        }
    }

    /// A loop of the invocations over `n` elements: `k` is the private slot, `e` the element.
    /// Up to [`UNROLL`] slots are written out one by one, so that the private arrays are indexed
    /// by constants and the driver can keep them in registers.
    pub(super) fn each(&mut self, shape: &[usize], body: impl FnMut(&mut Self)) {
        self.each_sink(shape, None, body);
    }

    /// [`Writer::each`] writing the private array `id` (of `dtype`): `value` gives each slot's
    /// expression. A quad value's four elements are gathered in a local `vec4` and written with
    /// one store.
    pub(super) fn each_into(&mut self, shape: &[usize], id: &str, dtype: DType, mut value: impl FnMut(&mut Self) -> String) {
        let quad = self.quad_value(shape);
        let local = format!("{id}_q");
        self.each_sink(shape, quad.then(|| (local.clone(), format!("vec4<{}>", reg_ty(dtype)), id.to_string())), |w| {
            let v = value(w);
            let cell = if quad { format!("{local}[{}]", w.quad_lane.unwrap_or(0)) } else { w.at(id, shape) };
            w.line(format!("{cell} = {v};"));
        });
    }

    /// [`Writer::each`], for a quad value with a local `vec4` (name, type) declared before each
    /// quad's four elements and stored to `array[j]` after them.
    fn each_sink(&mut self, shape: &[usize], sink: Option<(String, String, String)>, mut body: impl FnMut(&mut Self)) {
        let hoist = std::mem::take(&mut self.hoist);
        let n: usize = shape.iter().product();
        let slots = self.slots(shape);
        let guard = self.ragged(shape);
        if self.quad_value(shape) {
            // Quad by quad (`j`), its four slots written out, each element addressed statically.
            let quads = slots / 4;
            let unrolled = slots <= UNROLL;
            for q in 0..if unrolled { quads } else { 1 } {
                if unrolled {
                    self.line("{");
                    self.indent += 1;
                    self.line(format!("let j = {q}u;"));
                } else {
                    self.open(format!("for (var j = 0u; j < {quads}u; j++)"));
                }
                if let Some((local, ty, _)) = &sink {
                    self.line(format!("var {local}: {ty};"));
                }
                self.hoist_rows(&hoist);
                for t in 0..4 {
                    self.line("{");
                    self.indent += 1;
                    self.line(format!("let k = 4u * j + {t}u;"));
                    let e = self.element_of_var(shape);
                    self.line(format!("let e = {e};"));
                    if guard {
                        self.open(format!("if (e < {n}u)"));
                    }
                    let outer = self.quad_lane.replace(t);
                    body(self);
                    self.quad_lane = outer;
                    if guard {
                        self.close();
                    }
                    self.close();
                }
                if let Some((local, _, array)) = &sink {
                    self.line(format!("{array}[j] = {local};"));
                }
                self.close();
            }
            self.hoisted.clear();
            return;
        }
        let mut one = |w: &mut Self, slot: Option<usize>| {
            match slot {
                Some(k) => {
                    w.line("{");
                    w.indent += 1;
                    w.line(format!("let k = {k}u;"));
                    let e = w.element(shape, k);
                    w.line(format!("let e = {e};"));
                }
                None => {
                    w.open(format!("for (var k = 0u; k < {slots}u; k++)"));
                    let e = w.element_of_var(shape);
                    w.line(format!("let e = {e};"));
                }
            }
            if guard {
                w.open(format!("if (e < {n}u)"));
            }
            body(w);
            if guard {
                w.close();
            }
            w.close();
        };
        if slots <= UNROLL {
            for k in 0..slots {
                one(self, Some(k));
            }
        } else {
            one(self, None);
        }
    }

    /// A loop of the invocations over the `n` elements (a multiple of 4) four at a time, for
    /// groups of a multiple of 4 ([`Writer::group`]): `e` is the first element of the four, `j`
    /// the invocation's quad, and `slot(t)` the slot of element `e + t`.
    pub(super) fn each_quad(&mut self, shape: &[usize], mut body: impl FnMut(&mut Self, &dyn Fn(usize) -> String)) {
        let n: usize = shape.iter().product();
        let quads = self.slots(shape) / 4;
        let guard = self.ragged(shape);
        let (g, wg) = (self.group_of(shape), self.plan.wg as usize);
        let unrolled = quads <= UNROLL / 4;
        for q in 0..if unrolled { quads } else { 1 } {
            let slot: Box<dyn Fn(usize) -> String> = if unrolled {
                self.line("{");
                self.indent += 1;
                if self.quad_value(shape) {
                    self.line(format!("let j = {q}u;"));
                }
                let e = self.element(shape, 4 * q);
                self.line(format!("let e = {e};"));
                Box::new(move |t| format!("{}u", 4 * q + t))
            } else {
                self.open(format!("for (var j = 0u; j < {quads}u; j++)"));
                let e = match self.plan.row_runs(shape) {
                    Some(_) => self.run_element(shape, &format!("4u * j / {g}u"), &format!("(4u * j) % {g}u")),
                    None => format!("{g}u * (lid + {wg}u * (4u * j / {g}u)) + (4u * j) % {g}u"),
                };
                self.line(format!("let e = {e};"));
                Box::new(|t| format!("4u * j + {t}u"))
            };
            if guard {
                self.open(format!("if (e < {n}u)"));
            }
            body(self, &slot);
            if guard {
                self.close();
            }
            self.close();
        }
    }

    /// Declares the private array of block value `name`.
    pub(super) fn declare_block(&mut self, name: &str) -> String {
        let ty = self.ty(name);
        let id = self.ident(name);
        let arr = self.array_ty(&ty.shape, ty.dtype);
        self.line(format!("var {id}: {arr};"));
        id
    }
}

pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The flat index into a value of shape `from` that numpy broadcasting reads for element `e`
/// of a result of shape `to`.
pub(super) fn broadcast_index(to: &[usize], from: &[usize]) -> String {
    if from == to {
        return "e".into();
    }
    let lead = to.len() - from.len();
    let (ts, fs) = (strides(to), strides(from));
    let terms: Vec<String> = (lead..to.len())
        .filter(|&d| from[d - lead] != 1)
        .map(|d| format!("((e / {}u) % {}u) * {}u", ts[d], to[d], fs[d - lead]))
        .collect();
    if terms.is_empty() { "0u".into() } else { format!("({})", terms.join(" + ")) }
}
