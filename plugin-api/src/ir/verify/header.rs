//! The kernel's header: grid axes, arguments, their blocks and `at (...)` indices, and the rule
//! that programs along a parallel axis write distinct output blocks.

use std::collections::HashSet;

use super::{Checker, shape_text};
use crate::ir::limits::{MAX_ARRAY_ELEMENTS, elements_within_limit};
use crate::ir::*;
use crate::launch::MAX_AXIS_SIZE;

impl<'k> Checker<'k> {
    // ---- header ----

    /// Records an axis a kernel without `grid` takes from its mesh.
    pub(super) fn use_mesh_axis(&mut self, name: &str) {
        if !self.mesh_axes.iter().any(|a| a == name) {
            self.mesh_axes.push(name.to_string());
        }
    }

    pub(super) fn axis_names(&self) -> Vec<&'k str> {
        let k: &'k Kernel = self.k;
        k.grid.iter().flatten().map(|a| a.name.as_str()).collect()
    }

    pub(super) fn header(&mut self) {
        let k = self.k;
        let mut names: HashSet<&str> = HashSet::new();
        if let Some(grid) = &k.grid {
            if grid.is_empty() {
                self.err(k.span, "`grid ()` has no axes", "expected at least one axis, or no `grid` line for one program");
            }
            for a in grid {
                if !names.insert(&a.name) {
                    self.err(a.span, format!("grid axis `{}` is declared twice", a.name), "expected distinct axis names");
                }
                if a.size == AxisSize::Fixed(0) {
                    self.err(a.span, format!("grid axis `{}` has size 0", a.name), "expected a positive size or `dyn`");
                }
                if let AxisSize::Fixed(n) = a.size
                    && n > MAX_AXIS_SIZE
                {
                    self.err(
                        a.span,
                        format!("grid axis `{}` has size {n}, more than {MAX_AXIS_SIZE}", a.name),
                        "expected at most 2^31 - 1 points on an axis (`program_id` is `i32`): use larger blocks",
                    );
                }
            }
        }
        for a in k.grid.iter().flatten() {
            let Some(from) = &a.from else { continue };
            let p = k.params.iter().find(|p| &p.name == from);
            if !p.is_some_and(|p| p.kind == ParamKind::In && p.ty.is_scalar() && matches!(p.ty.dtype, DType::I32 | DType::U32)) {
                let what = match p {
                    None => "which is not an argument".to_string(),
                    Some(p) => format!("which is `{} {}: {}`", p.kind.keyword(), p.name, p.ty),
                };
                self.err(
                    a.span,
                    format!("grid axis `{}` takes its size from `{from}`, {what}", a.name),
                    "expected a scalar `in` argument of type i32 or u32, as in `in n: i32`",
                );
            }
        }
        let mut params: HashSet<&str> = HashSet::new();
        for p in &k.params {
            if !params.insert(&p.name) {
                self.err(p.span, format!("argument `{}` is declared twice", p.name), "expected distinct argument names");
            }
            self.param(p);
        }
        self.parallel_write_rule();
    }

    fn param(&mut self, p: &Param) {
        let kw = p.kind.keyword();
        if p.ty.shape.contains(&0) {
            self.err(p.span, format!("argument `{}` has a dimension of size 0", p.name), "expected positive dimensions");
        }
        if elements_within_limit(&p.ty.shape).is_none() {
            self.err(
                p.span,
                format!("argument `{}` ({}) has more than 2^48 elements", p.name, p.ty),
                format!("expected at most {MAX_ARRAY_ELEMENTS} elements"),
            );
        }
        if p.ty.is_scalar() && p.kind != ParamKind::In {
            self.err(
                p.span,
                format!("`{kw} {}` is a scalar", p.name),
                format!("expected an array type such as `{}[16]`; only `in` arguments may be scalars", p.ty.dtype),
            );
        }
        let Some(b) = &p.block else { return };
        if p.kind == ParamKind::Scratch || p.ty.is_scalar() {
            self.err(
                p.span,
                format!("`{kw} {}` cannot have a block", p.name),
                "expected `block` only on array `in` and `out` arguments; scratch is per-program memory",
            );
            return;
        }
        let rank = p.ty.shape.len();
        if b.shape.len() != rank {
            self.err(
                p.span,
                format!(
                    "block {} of `{}` has rank {}, but the array {} has rank {rank}",
                    shape_text(&b.shape),
                    p.name,
                    b.shape.len(),
                    p.ty
                ),
                format!("expected {rank} block dimension{}", if rank == 1 { "" } else { "s" }),
            );
        }
        if b.shape.contains(&0) {
            self.err(p.span, format!("block of `{}` has a dimension of size 0", p.name), "expected positive block dimensions");
        }
        if b.index.len() != b.shape.len() {
            self.err(
                p.span,
                format!(
                    "`at (...)` of `{}` has {} index expressions for a block of rank {}",
                    p.name,
                    b.index.len(),
                    b.shape.len()
                ),
                "expected one block index per dimension",
            );
        }
        for e in &b.index {
            for name in e.axes() {
                self.block_index_axis(p, name);
            }
            if let BlockIndex::Computed(e) = e {
                self.computed_index(p, e);
            }
        }
    }

    fn block_index_axis(&mut self, p: &Param, name: &str) {
        let axes = self.axis_names();
        if self.k.grid.is_none() {
            self.use_mesh_axis(name);
        } else if !axes.contains(&name) {
            let known = if axes.is_empty() {
                "the kernel has no grid: declare one with `grid (...)`".to_string()
            } else {
                format!("expected a grid axis: {}, or a scalar `in` argument of type i32 or u32", axes.join(", "))
            };
            self.err(p.span, format!("`at (...)` of `{}` uses `{name}`, which is not a grid axis", p.name), known);
        }
    }

    /// A computed block index: its literals fit `i32` (it is computed in 32 bits), and each input
    /// it reads is an `i32` or `u32` array without a block (or such a scalar), indexed once per
    /// dimension.
    fn computed_index(&mut self, p: &Param, root: &size::SizeExpr) {
        use size::SizeExpr;
        let k = self.k;
        let mut stack = vec![root];
        while let Some(e) = stack.pop() {
            stack.extend(e.children());
            match e {
                SizeExpr::Int(v) if i32::try_from(*v).is_err() => self.err(
                    p.span,
                    format!("block index `{root}` of `{}` holds {e}, which does not fit in 32 bits", p.name),
                    "expected integers between -2^31 and 2^31 - 1: a computed block index is an `i32`",
                ),
                SizeExpr::Read(name, at) => {
                    let table = k.params.iter().find(|t| &t.name == name);
                    let what = match table {
                        None => Some("which is not an argument".to_string()),
                        Some(t) if t.kind != ParamKind::In => Some(format!("which is an `{}` argument", t.kind.keyword())),
                        Some(t) if !matches!(t.ty.dtype, DType::I32 | DType::U32) => Some(format!("which is {}", t.ty)),
                        Some(t) if t.block.is_some() => Some("which has a block".to_string()),
                        Some(t) if t.ty.shape.len() != at.len() => {
                            Some(format!("with {} indices, but it has rank {}", at.len(), t.ty.shape.len()))
                        }
                        Some(_) => None,
                    };
                    if let Some(what) = what {
                        self.err(
                            p.span,
                            format!("`at (...)` of `{}` reads `{name}`, {what}", p.name),
                            "expected a read of an `in` argument of type i32 or u32 without a block, one index per dimension, as in `tbl[i]` (a scalar by its name)",
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// Two programs that differ in a parallel axis must not write the same output block.
    fn parallel_write_rule(&mut self) {
        let k = self.k;
        let Some(grid) = &k.grid else { return };
        for p in k.params_of(ParamKind::Out) {
            let Some(b) = &p.block else { continue };
            for a in grid.iter().filter(|a| !a.seq && !a.thread && a.size != AxisSize::Fixed(1)) {
                if !b.index.iter().any(|e| e.uses(&a.name)) {
                    self.err(
                        p.span,
                        format!(
                            "output `{}` is written by every program along parallel axis `{}`, but its block index `at ({})` does not use `{}`",
                            p.name,
                            a.name,
                            b.index.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                            a.name
                        ),
                        format!(
                            "use `{}` in `at (...)`, or mark the axis sequential so its points revisit the block in order: `{}: {} seq`",
                            a.name, a.name, a.size
                        ),
                    );
                }
            }
        }
    }
}
