//! Loads and stores: the region an index selects, bounds checks (dropped where every block of
//! the grid is inside the array) and masks lane by lane, `vec4` accesses of arguments bound as
//! `vec4`s or of a second `vec4` view, and the blocks read from their buffers where they are
//! used (row-forwarded).

use tessel_plugin_api::ir::analysis::origin_range;
use tessel_plugin_api::ir::*;

use super::layout::strides;
use super::{Read, Writer};
use crate::conv::{from_word, literal, reg_ty, to_word};
use crate::lower::meetings::Site;

/// One dimension of the region a load or store selects.
#[derive(Clone, Debug)]
pub(super) struct Dim {
    /// First array index, an `i32` expression.
    start: String,
    len: usize,
    /// Elements from one to the next (`ds`'s stride; 1 elsewhere).
    stride: usize,
    /// Whether the dimension stays in the result (not a single-element index).
    keep: bool,
    /// Range of `start` over the whole grid, where known.
    range: Option<(i64, i64)>,
    /// A gathered dimension: the workspace word offset of its (published) index vector and the
    /// vector's dtype; element `j` along it is at `start` plus entry `j`.
    gather: Option<(u64, DType)>,
}

impl<'k> Writer<'k> {
    /// In the row layout, where each invocation owns at most one row of the `vec4`-bound block of
    /// argument `pi` (it has no more rows than the workgroup has invocations): the name of the
    /// `vec4` where the invocation's row starts, so that quad `j` of the row is `{start} + j`
    /// (array rows and block columns are multiples of 4, [`crate::lower::quad_able`]).
    pub(super) fn row_start(&self, pi: usize) -> Option<String> {
        let p = &self.v.kernel().params[pi];
        let c = self.plan.row_len().filter(|c| c.is_multiple_of(4))?;
        let bound = self.plan.quad_outputs.contains(&pi) || self.plan.quad_inputs.contains(&pi);
        let block = p.block_shape();
        (bound && p.ty.shape.len() == 2 && block[1] == c && block[0] <= self.plan.wg as usize).then(|| format!("rq{pi}"))
    }

    /// The `vec4` of argument `pi`'s buffer that holds quad `j` (an expression) of its
    /// row-forwarded block: row `lid + wg (4j / c)` of the block, from column `(4j) % c`.
    pub(super) fn row_quad(&self, pi: usize, j: &str) -> String {
        if let Some(start) = self.row_start(pi) {
            return format!("a{pi}[{start} + {j}]");
        }
        let p = &self.v.kernel().params[pi];
        let c = self.plan.row_len().expect("row layout");
        let origin = |d: usize| self.origin(pi, d);
        let (row, col) = (format!("lid + {}u * (4u * {j} / {c}u)", self.plan.wg), format!("(4u * {j}) % {c}u"));
        format!("a{pi}[(u32({} + i32({row})) * {}u + u32({}) + {col}) / 4u]", origin(0), p.ty.shape[1], origin(1))
    }

    /// Reads quad `j` of each row-forwarded block in `names` into `{id}_q`, for the four
    /// elements that follow.
    pub(super) fn hoist_rows(&mut self, names: &[String]) {
        for name in names {
            let q = self.row_quad(self.plan.row_forwarded[self.plan.id(name)], "j");
            let id = self.ident(name);
            self.line(format!("let {id}_q = {q};"));
            self.hoisted.insert(name.clone());
        }
    }

    /// Binds argument `pi` a second time as `array<vec4<T>>` where there is room; whether it is.
    pub(super) fn view(&mut self, pi: usize) -> bool {
        let room = self.plan.views.contains(&pi);
        if room {
            self.views.insert(pi);
        }
        room
    }

    /// The region selected by `index` in `param`'s block, per dimension: the start expression,
    /// the length, whether the dimension stays, and the range of the start over the whole grid
    /// where it is known (no dynamic start).
    pub(super) fn region(&mut self, pi: usize, param: &Param, index: Option<&[Index]>) -> Vec<Dim> {
        let block = param.block_shape().to_vec();
        (0..block.len())
            .map(|d| {
                let (origin, range) = match &param.block {
                    Some(_) => (format!("o{pi}_{d}"), Some(origin_range(self.grid, param, d))),
                    None => ("0i".to_string(), Some((0, 0))),
                };
                let start = |w: &mut Self, o: &Operand| match o {
                    Operand::Lit(l) => {
                        let v = l.as_i64();
                        (format!("({origin} + {}i)", v as i32), range.map(|(lo, hi)| (lo + v, hi + v)))
                    }
                    Operand::Value(v) => {
                        let id = w.ident(v);
                        let cast = if w.ty(v).dtype == DType::U32 { format!("bitcast<i32>({id})") } else { id };
                        (format!("({origin} + {cast})"), None)
                    }
                };
                let (start, len, keep, range, stride) = match index.map(|ix| &ix[d]) {
                    None | Some(Index::Full) => (origin.clone(), block[d], true, range, 1),
                    Some(Index::Slice { start: s, size, stride }) => {
                        let (st, r) = start(self, s);
                        (st, *size, true, r, *stride)
                    }
                    Some(Index::At(a)) => {
                        let (st, r) = start(self, a);
                        (st, 1, false, r, 1)
                    }
                    Some(Index::Gather { len, .. }) => (origin.clone(), *len, true, None, 1),
                };
                let gather = match index.map(|ix| &ix[d]) {
                    Some(Index::Gather { index: Operand::Value(v), .. }) => {
                        let off = self.read_published(Site::Index(d), &[v.as_str()])[0];
                        Some((off, self.ty(v).dtype))
                    }
                    _ => None,
                };
                Dim { start, len, stride, keep, range, gather }
            })
            .collect()
    }

    /// Writes the flat index of element `e` of a region and its bounds check; returns (the
    /// check, or `None` where every element is provably inside the array, and the flat index).
    fn address(&mut self, region: &[Dim], dims: &[usize]) -> (Option<String>, String) {
        let lens: Vec<usize> = region.iter().map(|r| r.len).collect();
        let (ls, ast) = (strides(&lens), strides(dims));
        let flat = self.t();
        let mut conds = Vec::new();
        let mut terms = Vec::new();
        for (d, r) in region.iter().enumerate() {
            let g = self.t();
            let stride = if r.stride == 1 { String::new() } else { format!(" * {}i", r.stride) };
            let pos = match r.gather {
                // The entry of the index vector at this element's place along the dimension.
                Some((off, dt)) => {
                    let entry = from_word(dt, &format!("tk_ws[wsb + {off}u + (e / {}u) % {}u]", ls[d], r.len));
                    format!("i32({entry}) + ")
                }
                None if r.len == 1 => String::new(),
                None => format!("i32((e / {}u) % {}u){stride} + ", ls[d], r.len),
            };
            self.line(format!("let {g} = {pos}{};", r.start));
            // Drop the check where it is redundant (docs/language.md §5): the last element is
            // `(len - 1) * stride` past the start.
            let span = ((r.len - 1) * r.stride + 1) as i64;
            let inside = r.range.is_some_and(|(lo, hi)| lo >= 0 && hi + span <= dims[d] as i64);
            if !inside {
                conds.push(format!("u32({g}) < {}u", dims[d]));
            }
            terms.push(format!("u32({g}) * {}u", ast[d]));
        }
        let terms = if terms.is_empty() { "0u".to_string() } else { terms.join(" + ") };
        self.line(format!("let {flat} = {terms};"));
        (if conds.is_empty() { None } else { Some(conds.join(" && ")) }, flat)
    }

    /// The bounds check and the mask together, as a `let`; `None` when neither applies.
    fn access_ok(&mut self, check: Option<String>, mask: Option<String>) -> Option<String> {
        let cond = match (check, mask) {
            (None, None) => return None,
            (Some(c), None) | (None, Some(c)) => c,
            (Some(c), Some(m)) => format!("{c} && {m}"),
        };
        let ok = self.t();
        self.line(format!("let {ok} = {cond};"));
        Some(ok)
    }

    /// The storage expression of element `flat` of argument or scratch `p`.
    fn cell(&mut self, pi: usize, p: &Param, flat: &str) -> String {
        if p.kind == ParamKind::Scratch {
            let off = self.plan.scratch_at(&p.name);
            format!("tk_ws[wsb + {off}u + {flat}]")
        } else {
            format!("a{pi}[{flat}]")
        }
    }

    fn param(&self, name: &str) -> (usize, Param) {
        let k = self.v.kernel();
        let pi = k.params.iter().position(|p| p.name == name).expect("verified argument");
        (pi, k.params[pi].clone())
    }

    pub(super) fn write_load(
        &mut self,
        dst: &str,
        src: &str,
        index: Option<&[Index]>,
        mask: Option<&str>,
        other: Option<Literal>,
    ) {
        if self.plan.dot_only.contains(self.plan.id(dst)) {
            self.line("// read by its dot straight from the buffer");
            return;
        }
        if self.plan.row_forwarded.contains_key(self.plan.id(dst)) {
            self.line("// read where it is used, a vec4 of its buffer at a time");
            return;
        }
        if let Some(&pi) = self.plan.resident.get(src) {
            let id = self.declare_block(dst);
            let ty = self.ty(dst);
            self.each_into(&ty.shape, &id, ty.dtype, |_| format!("r{pi}[k]"));
            self.defined(dst);
            return;
        }
        let (pi, p) = self.param(src);
        let d = p.ty.dtype;
        let region = self.region(pi, &p, index);
        let res = self.ty(dst).shape.clone();
        if self.plan.vec4_load(&p, index, mask, &res) && (self.plan.quad_inputs.contains(&pi) || self.view(pi)) {
            // Four adjacent elements of the block, inside the array, as one read: from the
            // argument bound as `vec4`s, or from its `vec4` view.
            let arr = if self.plan.quad_inputs.contains(&pi) { format!("a{pi}") } else { format!("a{pi}v") };
            let id = self.declare_block(dst);
            self.each_quad(&res, |w, slot| {
                let (_, flat) = w.address(&region, &p.ty.shape);
                let q = w.t();
                w.line(format!("let {q} = {arr}[{flat} / 4u];"));
                if w.quad_value(&res) {
                    w.line(format!("{id}[j] = {q};"));
                } else {
                    for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                        w.line(format!("{id}[{}] = {q}.{c};", slot(t)));
                    }
                }
            });
            self.defined(dst);
            return;
        }
        let mask_read = mask.map(|m| self.classify(&Operand::Value(m.to_string()), &res, false));
        self.meet(Site::RefLoad);
        self.meet(Site::Reads);
        let other = literal(other.unwrap_or(Literal::Int(0)), d);
        let body = |w: &mut Self| -> String {
            let (check, flat) = w.address(&region, &p.ty.shape);
            let mv = mask_read.as_ref().map(|m| w.read(m, DType::Bool, &res));
            let ok = w.access_ok(check, mv);
            let x = w.t();
            let cell = w.cell(pi, &p, &flat);
            // Scratch cells and `bool` arrays hold words; other arrays hold the register type.
            let val = if p.kind == ParamKind::Scratch || d == DType::Bool { from_word(d, &cell) } else { cell };
            match ok {
                Some(ok) => {
                    w.line(format!("var {x}: {} = {other};", reg_ty(d)));
                    w.line(format!("if ({ok}) {{ {x} = {val}; }}"));
                }
                None => w.line(format!("let {x}: {} = {val};", reg_ty(d))),
            }
            x
        };
        if res.is_empty() {
            self.broadcast_scalar(dst, d, body);
            return;
        }
        let id = self.declare_block(dst);
        self.each_into(&res, &id, d, body);
        self.defined(dst);
    }

    pub(super) fn write_store(&mut self, dst: &str, index: Option<&[Index]>, value: &Operand, mask: Option<&str>) {
        let (pi, p) = self.param(dst);
        let d = p.ty.dtype;
        let region = self.region(pi, &p, index);
        let sel: Vec<usize> = region.iter().filter(|r| r.keep).map(|r| r.len).collect();
        let vread = self.classify(value, &sel, false);
        let mask_read = mask.map(|m| self.classify(&Operand::Value(m.to_string()), &sel, false));
        if let Some(&ri) = self.plan.resident.get(dst) {
            self.meet(Site::Reads);
            self.each(&sel, |w| {
                let v = w.read(&vread, d, &sel);
                w.line(format!("r{ri}[k] = {v};"));
            });
            return;
        }
        self.meet(Site::Store);
        self.meet(Site::Reads);
        if self.plan.quad_outputs.contains(&pi) {
            // Four adjacent elements as one write, to the argument bound as `vec4`s.
            let rt = reg_ty(d);
            let start = self.row_start(pi).filter(|_| self.quad_value(&sel) && index.is_none());
            self.each_quad(&sel, |w, slot| {
                // The invocation's row from its start, or the element's address (inside the
                // array: `quad_able`).
                let cell = match &start {
                    Some(start) => format!("{start} + j"),
                    None => format!("{} / 4u", w.address(&region, &p.ty.shape).1),
                };
                let q = match &vread {
                    Read::Own(id) if w.quad_value(&sel) => format!("{id}[j]"),
                    Read::Row(name) if w.quad_value(&sel) => w.row_quad(w.plan.row_forwarded[w.plan.id(name)], "j"),
                    Read::Own(id) => {
                        format!("vec4<{rt}>({})", (0..4).map(|t| format!("{id}[{}]", slot(t))).collect::<Vec<_>>().join(", "))
                    }
                    _ => {
                        let q = w.t();
                        w.line(format!("var {q}: vec4<{rt}>;"));
                        if w.quad_value(&sel) {
                            let rows = w.rows_read(std::slice::from_ref(&vread));
                            w.hoist_rows(&rows);
                        }
                        for t in 0..4 {
                            w.line("{");
                            w.indent += 1;
                            w.line(format!("let k = {};", slot(t)));
                            w.line(format!("let e = e + {t}u;"));
                            let outer = w.quad_lane.replace(t);
                            let v = w.read(&vread, d, &sel);
                            w.quad_lane = outer;
                            w.line(format!("{q}[{t}] = {v};"));
                            w.close();
                        }
                        w.hoisted.clear();
                        q
                    }
                };
                w.line(format!("a{pi}[{cell}] = {q};"));
            });
            return;
        }
        let sel2 = sel.clone();
        self.store_cells(pi, &p, &region, &sel.clone(), mask_read.map(|m| (m, sel2)), |w| w.read(&vread, d, &sel));
    }

    /// Stores the `n` elements of `region` of argument or scratch `pi`, element `e` from
    /// `value` (slot `k`), where the mask (read for a result of the given shape) allows.
    pub(super) fn store_cells(
        &mut self,
        pi: usize,
        p: &Param,
        region: &[Dim],
        shape: &[usize],
        mask: Option<(Read, Vec<usize>)>,
        value: impl Fn(&mut Self) -> String,
    ) {
        let d = p.ty.dtype;
        self.each(shape, |w| {
            let (check, flat) = w.address(region, &p.ty.shape);
            let mv = mask.as_ref().map(|(m, sel)| w.read(m, DType::Bool, sel));
            let ok = w.access_ok(check, mv);
            let v = value(w);
            let cell = w.cell(pi, p, &flat);
            let word = if p.kind == ParamKind::Scratch || d == DType::Bool { to_word(d, &v) } else { v };
            match ok {
                Some(ok) => w.line(format!("if ({ok}) {{ {cell} = {word}; }}")),
                None => w.line(format!("{cell} = {word};")),
            }
        });
    }
}
