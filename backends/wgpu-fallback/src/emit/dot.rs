//! `dot`: register tiles of the plan's groups, their operands read straight from the buffers of
//! loaded input blocks (as `vec4`s where they can be) or from the workspace, and on a hardware
//! adapter staged in workgroup memory a chunk of the contraction at a time.

use tessel_plugin_api::ir::analysis::inside;
use tessel_plugin_api::ir::*;

use super::Writer;
use crate::conv::{from_word, literal, reg_ty, to_word};
use crate::lower::meetings::Site;
use crate::lower::{Strategy, dot_tiling, quad_able, staged_chunk};

/// Writes the WGSL expression of element (row, col) of an operand block.
type Reader = Box<dyn Fn(&str, &str) -> String>;

/// One `dot` as its writers read it: the result (`dst`, its array `id`), the product's sizes
/// (`m` x `kk` times `kk` x `n`, `slots` of the result an invocation holds), each operand's
/// element reader (before its transpose) and type, and the resident output the tile adds into.
struct Product {
    dst: String,
    id: String,
    m: usize,
    n: usize,
    kk: usize,
    slots: usize,
    trans_a: bool,
    trans_b: bool,
    da: DType,
    db: DType,
    ra: Reader,
    rb: Reader,
    fused: Option<usize>,
}

impl Product {
    /// Element (`i`, `r`) of `a`: row `i` at contraction step `r`.
    fn a_at(&self, i: &str) -> String {
        if self.trans_a { (self.ra)("r", i) } else { (self.ra)(i, "r") }
    }

    /// Element (`r`, `j`) of `b`: column `j` at contraction step `r`.
    fn b_at(&self, j: &str) -> String {
        if self.trans_b { (self.rb)(j, "r") } else { (self.rb)("r", j) }
    }

    /// The line that puts accumulator `x` into the result's `slot`: the result's array, or
    /// added into the resident output's registers.
    fn put(&self, slot: usize, x: &str) -> String {
        match self.fused {
            Some(ri) => format!("r{ri}[{slot}] = r{ri}[{slot}] + {x};"),
            None => format!("{}[{slot}] = {x};", self.id),
        }
    }
}

impl<'k> Writer<'k> {
    /// `dot`: each invocation accumulates its own output elements in the result's private array
    /// (zero-initialised), the contraction index outermost, so that the operand element all its
    /// outputs share (the column of `b`, when the workgroup size is a multiple of `N`) is read
    /// once per step. Each output sums in ascending order, as the interpreter does. Written one
    /// of four ways: operands staged in workgroup memory (on hardware), a register tile with
    /// `vec4` reads, a register tile, or element by element.
    pub(super) fn write_dot(&mut self, s: &Stmt, dst: &str, a: &str, b: &str, trans_a: bool, trans_b: bool) {
        let (ash, bsh) = (self.ty(a).shape.clone(), self.ty(b).shape.clone());
        let (m, kk) = if trans_a { (ash[1], ash[0]) } else { (ash[0], ash[1]) };
        let n = if trans_b { bsh[0] } else { bsh[1] };
        let (da, db) = (self.ty(a).dtype, self.ty(b).dtype);
        let published: Vec<&str> = [a, b].into_iter().filter(|v| !self.plan.forwarded.contains_key(self.plan.id(v))).collect();
        let offs = self.read_published(Site::Reads, &published);
        let id = self.declare_block(dst);
        let slots = self.slots(&[m, n]);
        // Where the tile goes: the result's slot, or added into the resident output's.
        let fused = self.plan.accumulating.get(self.plan.id(dst)).map(|a| a.0);
        // Element (row, col) of an operand block: from its argument's buffer where it is a
        // loaded input block (no copy, no barrier), else from the workspace where it was
        // published.
        let reader = |w: &Self, v: &str, cols: usize, d: DType| -> Reader {
            match w.plan.forwarded.get(w.plan.id(v)) {
                Some(&pi) => w.direct_reader(pi),
                None => {
                    let off = offs[published.iter().position(|p| *p == v).expect("published")];
                    Box::new(move |row: &str, col: &str| {
                        from_word(d, &format!("tk_ws[wsb + {off}u + ({row}) * {cols}u + {col}]"))
                    })
                }
            }
        };
        let (ra, rb) = (reader(self, a, ash[1], da), reader(self, b, bsh[1], db));
        let p = Product { dst: dst.to_string(), id, m, n, kk, slots, trans_a, trans_b, da, db, ra, rb, fused };
        let tiled = dot_tiling(self.plan, s).is_some_and(|t| t.0);
        // On hardware, operand chunks of `kc` contraction steps go through workgroup memory.
        if let (true, Strategy::Gpu, Some(kc)) = (tiled, self.plan.strategy, staged_chunk(m, n, kk)) {
            return self.staged_dot(&p, kc);
        }
        let quads = (tiled && !trans_a && !trans_b && kk.is_multiple_of(4))
            .then(|| Some((self.vec4_reader(a)?, self.vec4_reader(b)?)))
            .flatten();
        match quads {
            Some((qa, qb)) => self.quad_dot(&p, qa, qb),
            None if tiled => {
                // A register tile: the invocation's groups are `g` adjacent columns of rows
                // `g wg / n` apart, so each step reads `g` elements of `b` and one of `a` per row.
                self.tile_begin(dst, slots, n, "");
                self.open(format!("for (var r = 0u; r < {kk}u; r++)"));
                self.tile_step([m, n], slots, |t| p.b_at(&format!("(tc0 + {t}u)")), |row| p.a_at(row));
                self.tile_end(dst, slots, |slot, x| p.put(slot, x));
            }
            None => self.plain_dot(&p),
        }
    }

    /// A register tile whose operand chunks of `kc` contraction steps are staged in workgroup
    /// memory (`tk_sa`, `tk_sb`), the workgroup meeting before and after each chunk is written.
    fn staged_dot(&mut self, p: &Product, kc: usize) {
        let Product { m, n, kk, slots, da, db, .. } = *p;
        let wg = self.plan.wg as usize;
        let at_a = |row: &str, q: &str| if p.trans_a { (p.ra)(q, row) } else { (p.ra)(row, q) };
        let at_b = |q: &str, col: &str| if p.trans_b { (p.rb)(col, q) } else { (p.rb)(q, col) };
        self.staged = (self.staged.0.max(m * kc), self.staged.1.max(kc * n));
        self.tile_begin(&p.dst, slots, n, &format!("; operands staged in workgroup memory, {kc} steps at a time"));
        self.open(format!("for (var r0 = 0u; r0 < {kk}u; r0 += {kc}u)"));
        // The previous chunk's reads are done before this one overwrites it.
        self.line("workgroupBarrier();");
        self.open(format!("for (var i = lid; i < {}u; i += {wg}u)", m * kc));
        let x = at_a(&format!("i / {kc}u"), &format!("r0 + i % {kc}u"));
        self.line(format!("tk_sa[i] = {};", to_word(da, &x)));
        self.close();
        self.open(format!("for (var i = lid; i < {}u; i += {wg}u)", kc * n));
        let x = at_b(&format!("r0 + i / {n}u"), &format!("i % {n}u"));
        self.line(format!("tk_sb[i] = {};", to_word(db, &x)));
        self.close();
        self.line("workgroupBarrier();");
        self.open(format!("for (var q = 0u; q < {kc}u; q++)"));
        self.tile_step(
            [m, n],
            slots,
            |t| from_word(db, &format!("tk_sb[q * {n}u + tc0 + {t}u]")),
            |row| from_word(da, &format!("tk_sa[{row} * {kc}u + q]")),
        );
        self.close();
        self.tile_end(&p.dst, slots, |slot, x| p.put(slot, x));
    }

    /// The register tile with `vec4` reads: four steps of the contraction at once, a row of the
    /// tile's `a` and four rows of its `b` columns as one read each.
    fn quad_dot(&mut self, p: &Product, qa: Reader, qb: Reader) {
        let Product { m, n, kk, slots, .. } = *p;
        let g = self.plan.group;
        self.line(format!("// a register tile of {} rows x {g} columns per invocation, vec4 reads", slots / g));
        self.line("{");
        self.indent += 1;
        self.line(format!("let tc0 = ({g}u * lid) % {n}u;"));
        let acc_ty = reg_ty(self.ty(&p.dst).dtype);
        let quads = g / 4;
        for j in 0..slots / g {
            for q in 0..quads {
                self.line(format!("var acc{j}_{q}: vec4<{acc_ty}>;"));
            }
        }
        self.open(format!("for (var r = 0u; r < {kk}u; r += 4u)"));
        for t in 0..4 {
            for q in 0..quads {
                self.line(format!("let bq{t}_{q} = {};", qb(&format!("r + {t}u"), &format!("tc0 + {}u", 4 * q))));
            }
        }
        let guard = self.ragged(&[m, n]);
        for j in 0..slots / g {
            let e = self.element(&[m, n], g * j);
            self.open_group(&e, m * n, guard);
            let row = self.tile_row(&[m, n], j, &e);
            self.line(format!("let aq = {};", qa(&row, "r")));
            // Ascending in the contraction, as the interpreter sums.
            for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                for q in 0..quads {
                    self.line(format!("acc{j}_{q} = acc{j}_{q} + aq.{c} * bq{t}_{q};"));
                }
            }
            self.close();
        }
        self.close();
        for j in 0..slots / g {
            for q in 0..quads {
                for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                    let line = p.put(g * j + 4 * q + t, &format!("acc{j}_{q}.{c}"));
                    self.line(line);
                }
            }
        }
        self.close();
        self.defined(&p.dst);
    }

    /// Element by element: each of the invocation's slots accumulates in the result's array,
    /// the column of `b` read once per step where every slot shares it.
    fn plain_dot(&mut self, p: &Product) {
        let Product { m, n, kk, slots, .. } = *p;
        let (g, wg, id) = (self.plan.group, self.plan.wg as usize, &p.id);
        let shared_col = g == 1 && wg.is_multiple_of(n);
        self.open(format!("for (var r = 0u; r < {kk}u; r++)"));
        if shared_col {
            self.line(format!("let bv = {};", p.b_at(&format!("lid % {n}u"))));
        }
        self.open(format!("for (var k = 0u; k < {slots}u; k++)"));
        let e = self.element_of_var(&[m, n]);
        self.line(format!("let e = {e};"));
        let guard = self.ragged(&[m, n]);
        if guard {
            self.open(format!("if (e < {}u)", m * n));
        }
        if !shared_col {
            self.line(format!("let bv = {};", p.b_at(&format!("e % {n}u"))));
        }
        self.line(format!("{id}[k] = {id}[k] + {} * bv;", p.a_at(&format!("e / {n}u"))));
        if guard {
            self.close();
        }
        self.close();
        self.close();
        if let Some(ri) = p.fused {
            self.each(&[m, n], |w| w.line(format!("r{ri}[k] = r{ri}[k] + {id}[k];")));
        }
        self.defined(&p.dst);
    }

    /// Opens a scalar register tile of `dot` result `dst` (`n` columns): the tile's first
    /// column and its accumulators, in scalars (registers), not in the value's array (memory).
    fn tile_begin(&mut self, dst: &str, slots: usize, n: usize, how: &str) {
        let g = self.plan.group;
        self.line(format!("// a register tile of {} rows x {g} columns per invocation{how}", slots / g));
        self.line("{");
        self.indent += 1;
        self.line(format!("let tc0 = ({g}u * lid) % {n}u;"));
        let acc_ty = reg_ty(self.ty(dst).dtype);
        for s in 0..slots {
            self.line(format!("var acc{s}: {acc_ty};"));
        }
    }

    /// One step of the contraction of a scalar register tile over a `dot` result of `shape`: the
    /// `g` values of `b` for the tile's columns (`b_of(t)`), then for each of the invocation's
    /// rows the value of `a` (`a_of(row)`, `row` a WGSL expression) times them into the
    /// accumulators `acc{slot}`.
    fn tile_step(&mut self, shape: [usize; 2], slots: usize, b_of: impl Fn(usize) -> String, a_of: impl Fn(&str) -> String) {
        let (g, [m, n]) = (self.plan.group, shape);
        for t in 0..g {
            self.line(format!("let b{t} = {};", b_of(t)));
        }
        let guard = self.ragged(&shape);
        for j in 0..slots / g {
            let e = self.element(&shape, g * j);
            self.open_group(&e, m * n, guard);
            let row = self.tile_row(&shape, j, &e);
            self.line(format!("let av = {};", a_of(&row)));
            for t in 0..g {
                let s = g * j + t;
                self.line(format!("acc{s} = acc{s} + av * b{t};"));
            }
            self.close();
        }
    }

    /// Closes a scalar register tile's contraction loop and block: each accumulator goes where
    /// `into(slot, accumulator)` says.
    fn tile_end(&mut self, dst: &str, slots: usize, into: impl Fn(usize, &str) -> String) {
        self.close();
        for s in 0..slots {
            let line = into(s, &format!("acc{s}"));
            self.line(line);
        }
        self.close();
        self.defined(dst);
    }

    /// The row of a register tile's group `j`, whose first element is `e`, in a `dot` result of
    /// `shape`: its place in the invocation's run of rows where there is one.
    fn tile_row(&self, shape: &[usize], j: usize, e: &str) -> String {
        match self.plan.row_runs(shape) {
            Some((groups, rows)) => format!("({rows}u * (lid / {groups}u) + {j}u)"),
            None => format!("(({e}) / {}u)", shape[1]),
        }
    }

    /// Opens the block of a register tile's group at element `e`: an `if` where the group may lie
    /// past the `total` elements (`guard`), a plain block otherwise.
    fn open_group(&mut self, e: &str, total: usize, guard: bool) {
        if guard {
            self.open(format!("if ({e} < {total}u)"));
        } else {
            self.line("{");
            self.indent += 1;
        }
    }

    /// Where `v` is a forwarded input block that lies inside its array at every grid point, with
    /// rows of a multiple of 4 elements at column origins of a multiple of 4: reads the four
    /// elements (row, col ..= col + 3) of its block (`col` a multiple of 4) as one `vec4`, from a
    /// second binding of the argument's buffer as `array<vec4<T>>`.
    fn vec4_reader(&mut self, v: &str) -> Option<Reader> {
        let &pi = self.plan.forwarded.get(self.plan.id(v))?;
        let p = &self.v.kernel().params[pi];
        let dims = p.ty.shape.clone();
        if !quad_able(self.grid, p) || !self.view(pi) {
            return None;
        }
        let origin = |d: usize| self.origin(pi, d);
        let (o0, o1) = (origin(0), origin(1));
        Some(Box::new(move |row: &str, col: &str| {
            format!("a{pi}v[(u32({o0} + i32({row})) * {}u + u32({o1} + i32({col}))) / 4u]", dims[1])
        }))
    }

    /// Whether every block of argument `pi` lies inside the array in dimension `d`, at every
    /// point of the grid.
    fn block_inside(&self, pi: usize, d: usize) -> bool {
        inside(self.grid, &self.v.kernel().params[pi], d)
    }

    /// Reads element (row, col) of argument `pi`'s block from its buffer: 0 outside the array,
    /// the check dropped in each dimension where every block of the grid is inside.
    fn direct_reader(&self, pi: usize) -> Reader {
        let p = &self.v.kernel().params[pi];
        let dims = p.ty.shape.clone();
        let inside: Vec<bool> = (0..2).map(|d| self.block_inside(pi, d)).collect();
        let origin = |d: usize| self.origin(pi, d);
        let (o0, o1) = (origin(0), origin(1));
        let zero = literal(Literal::Int(0), p.ty.dtype);
        Box::new(move |row: &str, col: &str| {
            let (gr, gc) = (format!("({o0} + i32({row}))"), format!("({o1} + i32({col}))"));
            let cell = format!("a{pi}[u32({gr}) * {}u + u32({gc})]", dims[1]);
            let checks: Vec<String> = [(inside[0], &gr, dims[0]), (inside[1], &gc, dims[1])]
                .into_iter()
                .filter(|(inside, _, _)| !inside)
                .map(|(_, g, dim)| format!("u32({g}) < {dim}u"))
                .collect();
            if checks.is_empty() { cell } else { format!("select({zero}, {cell}, {})", checks.join(" && ")) }
        })
    }
}
