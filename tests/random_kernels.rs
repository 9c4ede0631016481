//! Random differential testing: well-typed kernels made from a seed (elementwise chains,
//! reductions with broadcasting back, `dot` (transposed, and on f16/bf16 operands), masks from
//! `iota`, ragged blocks, `when`, `if`, `for` with carried values, `for ... while` with a
//! data-dependent trip count, computed block indices reading a table, strided loads, integer
//! chains, outputs revisited along a `seq` axis) run on the interpreter, on wgpu, and as Mosaic GPU PTX on the PTX
//! emulator, with the same seeded inputs; they must
//! agree within the dtype's tolerance (exact for integers). A disagreement is shrunk (fewer
//! steps, smaller blocks, while it still disagrees) and saved under `tests/in/regressions/`,
//! where `tests/wgpu.rs` and `tests/mosaic.rs` run it from then on.
//!
//! A third of the kernels also compute an `e` output at the edges of the float operations:
//! special literals (`inf`, `nan`, `-0.0`, huge and tiny) as operands of `add sub mul div rem
//! pow max min` on either side, blocks with special values masked in, and `exp`, `log`, `sin`,
//! `cos`, `tanh`, `logistic`, `pow` and `rem` of arguments scaled to their edges. Only values
//! every backend computes bit for bit (the inputs, exact operations) feed them, so that a
//! 2-ulp difference upstream cannot become a different `sin(1e30 x)`.
//!
//! `TESSEL_RANDOM_KERNELS=N` sets how many kernels (default 60; the closing notes record runs of
//! thousands). `TESSEL_RANDOM_SEED=S` starts elsewhere.

mod common;

use std::fmt::Write as _;

use common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tessel::{KernelLaunch, LaunchArgs, Runtime};

/// The shape of one generated kernel: everything the text is made from.
#[derive(Clone, Debug)]
struct Spec {
    seed: u64,
    /// Block rows and columns; grid sizes; how much the array falls short of whole blocks.
    r: usize,
    c: usize,
    gi: usize,
    gj: usize,
    short_r: usize,
    short_c: usize,
    /// `j` is a `seq` axis and the output accumulates over it.
    seq: bool,
    steps: usize,
    /// Edge steps of the `e` output (0: no `e`).
    edges: usize,
    /// The classes issue 38 found unguarded, drawn now and then (from a stream of their own,
    /// so that kernels without them stay as they were): a `for` of this many trips (0: none;
    /// else past 70,000, beyond some drivers' loop budget), this many `when`s nested around
    /// the last store (0: none; else up to the nesting limit), a grid of hundreds of
    /// programs over blocks of one or two rows, and blocks of 8,192 to 32,768 elements (wgpu
    /// lowers up to 65,536) on a grid of one program.
    trips: usize,
    depth: usize,
    wide: bool,
    big: bool,
    /// Computed block indices of `y` (rows, columns), reading a table `t: i32[5]` now and then
    /// (from a stream of their own); `None`: `at (i, j)`.
    index: Option<[String; 2]>,
    /// A `while` loop after the steps (from a stream of its own): halving the last value until
    /// its largest magnitude is at most 1, a trip count that depends on the data.
    halve: bool,
    /// A strided load of `y` beside the whole one (from a stream of its own): every second row
    /// and every third column from the block's origin, reaching past the block (and the array).
    strided: bool,
    /// A gather of `y`'s rows by an index vector (from a stream of its own): rows `(7 k + a) mod
    /// (2 r) - b` of the block for k in [0, r), some before the block, some past it (and the array).
    gather: Option<(usize, usize)>,
    /// An `if` after the steps (from a stream of its own): its condition exact on every backend
    /// (an integer sum of `n` and the program id), its branches computing a float and an
    /// integer result each, the first branch holding a second `if` now and then.
    branch: Option<bool>,
}

impl Spec {
    /// The spec of `seed` with the stress classes drawn (all of them on wgpu; on the emulated
    /// Mosaic GPU PTX only the deep nesting: the emulator runs a CTA's 128 threads one
    /// instruction at a time, and a 70,000-trip loop or 600 CTAs take it minutes, for classes
    /// that are wgpu's and the interpreter's).
    fn random_for(seed: u64, target: Target) -> Spec {
        let s = Spec::random(seed);
        match target {
            Target::Wgpu => s,
            Target::MosaicEmulated => Spec { depth: s.depth, ..Spec::plain(seed) },
        }
    }

    fn random(seed: u64) -> Spec {
        Spec::plain(seed).stressed()
    }

    fn plain(seed: u64) -> Spec {
        let mut g = rng(seed);
        let (r, c) = (g.random_range(1..=12), g.random_range(1..=40));
        Spec {
            seed,
            r,
            c,
            gi: g.random_range(1..=4),
            gj: g.random_range(1..=3),
            short_r: g.random_range(0..r),
            short_c: g.random_range(0..c),
            seq: g.random_bool(0.3),
            steps: g.random_range(1..=10),
            edges: if g.random_bool(0.35) { g.random_range(1..=6) } else { 0 },
            trips: 0,
            depth: 0,
            wide: false,
            big: false,
            index: Spec::computed_index(seed),
            halve: rng(seed ^ 0x3417).random_bool(0.25),
            strided: rng(seed ^ 0x57d).random_bool(0.25),
            gather: Spec::gather(seed),
            branch: Spec::branch(seed),
        }
    }

    /// An `if` for a quarter of the seeds: whether its first branch nests a second one.
    fn branch(seed: u64) -> Option<bool> {
        let mut g = rng(seed ^ 0x1f3);
        g.random_bool(0.25).then(|| g.random_bool(0.5))
    }

    /// A gather of `y` for a quarter of the seeds: the offsets `a` and `b` of its row indices.
    fn gather(seed: u64) -> Option<(usize, usize)> {
        let mut g = rng(seed ^ 0x6a7);
        g.random_bool(0.25).then(|| (g.random_range(0..8), g.random_range(0..4)))
    }

    /// `y`'s computed block indices for a third of the seeds: expressions of the axes with every
    /// operation of a computed index and reads of the table `t`.
    fn computed_index(seed: u64) -> Option<[String; 2]> {
        let mut g = rng(seed ^ 0x1dc5);
        g.random_bool(0.3).then(|| [index_expr(&mut g, "i", 2), index_expr(&mut g, "j", 2)])
    }

    /// Draws the stress classes (`trips`, `depth`, `wide`, `big`).
    fn stressed(mut self) -> Spec {
        let mut g = rng(self.seed ^ 0x5722);
        if g.random_bool(0.05) {
            self.trips = g.random_range(70_000..=70_100);
        }
        if g.random_bool(0.1) {
            self.depth = g.random_range(16..=62);
        }
        // Not both a long loop and hundreds of programs: the interpreter runs 70,000 trips per
        // program, and a debug build takes a minute for 600 of them.
        if g.random_bool(0.05) && self.trips == 0 {
            self.wide = true;
            self.gi = g.random_range(200..=600);
            self.r = g.random_range(1..=2);
            self.short_r = g.random_range(0..self.r);
        }
        if g.random_bool(0.05) && self.trips == 0 && !self.wide {
            self.big = true;
            (self.gi, self.gj) = (1, 1);
            self.r = g.random_range(64..=128);
            self.c = g.random_range(128..=256);
            self.short_r = g.random_range(0..self.r);
            self.short_c = g.random_range(0..self.c);
        }
        self
    }

    fn height(&self) -> usize {
        (self.r * self.gi - self.short_r).max(1)
    }

    fn width(&self) -> usize {
        (self.c * self.gj - self.short_c).max(1)
    }
}

/// A random computed block index over `axis` (and now and then the other axis) of `depth` levels.
fn index_expr(g: &mut ChaCha8Rng, axis: &str, depth: usize) -> String {
    if depth == 0 || g.random_bool(0.25) {
        return match g.random_range(0..4) {
            0 => g.random_range(-2..5).to_string(),
            1 => if axis == "i" { "j" } else { "i" }.to_string(),
            _ => axis.to_string(),
        };
    }
    let mut sub = || index_expr(g, axis, depth - 1);
    let (a, b) = (sub(), sub());
    match g.random_range(0..9) {
        0 => format!("{a} + {b}"),
        1 => format!("({a}) - ({b})"),
        2 => format!("({a})*({b})"),
        3 => format!("({a}) / ({b})"),
        4 => format!("({a}) % ({b})"),
        5 => {
            let f = ["cdiv", "min", "max", "eq", "ne", "lt", "le", "gt", "ge"][g.random_range(0..9)];
            format!("{f}({a}, {b})")
        }
        6 => {
            let c = index_expr(g, axis, depth - 1);
            format!("select({c}, {a}, {b})")
        }
        7 => format!("t[{a}] % 5"),
        _ => format!("-({a})"),
    }
}

/// Values of the body by shape class: full blocks `[R, C]` of f32 and of i32.
struct Body {
    text: String,
    next: usize,
    floats: Vec<String>,
    ints: Vec<String>,
    /// Float values computed only with exact operations from the inputs (safe to compare).
    exact: Vec<String>,
}

impl Body {
    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// `tanh` of `v`, in (-1, 1): a new value.
    fn bounded(&mut self, v: &str) -> String {
        let t = self.fresh();
        self.line(&format!("{t} = tanh {v}"));
        t
    }

    fn line(&mut self, s: &str) {
        let _ = writeln!(self.text, "  {s}");
    }

    fn pick(g: &mut ChaCha8Rng, from: &[String]) -> String {
        from[g.random_range(0..from.len())].clone()
    }
}

/// The kernel text of a spec.
fn generate(s: &Spec) -> String {
    let mut g = rng(s.seed ^ 0x5eed);
    let (r, c, h, w) = (s.r, s.c, s.height(), s.width());
    let mut head = String::new();
    let _ = writeln!(head, "# random kernel, seed {} (tests/random_kernels.rs)", s.seed);
    let _ = writeln!(head, "kernel random_{}", s.seed);
    let _ = writeln!(head, "  grid (i: {}, j: {}{})", s.gi, s.gj, if s.seq { " seq" } else { "" });
    let _ = writeln!(head, "  in  x: f32[{h}, {w}] block [{r}, {c}] at (i, j)");
    let y_at = s.index.as_ref().map_or("i, j".to_string(), |[a, b]| format!("{a}, {b}"));
    let _ = writeln!(head, "  in  y: f32[{h}, {w}] block [{r}, {c}] at ({y_at})");
    let _ = writeln!(head, "  in  n: i32[{h}, {w}] block [{r}, {c}] at (i, j)");
    let _ = writeln!(head, "  in  wt: f32[{c}, {c}]");
    if s.index.is_some() {
        // Last, so that the other inputs keep their seeded values.
        let _ = writeln!(head, "  in  t: i32[5]");
    }
    let out_w = if s.seq { c } else { w };
    let at = if s.seq { "(i, 0)" } else { "(i, j)" };
    let _ = writeln!(head, "  out o: f32[{h}, {out_w}] block [{r}, {c}] at {at}");
    let _ = writeln!(head, "  out q: i32[{h}, {out_w}] block [{r}, {c}] at {at}");
    if s.edges > 0 {
        let _ = writeln!(head, "  out e: f32[{h}, {out_w}] block [{r}, {c}] at {at}");
    }
    let mut b = Body { text: String::new(), next: 0, floats: vec![], ints: vec![], exact: vec![] };
    let full = format!("[{r}, {c}]");
    b.line("%x = load x");
    b.line("%y = load y");
    b.line("%n = load n");
    b.floats.extend(["%x".to_string(), "%y".to_string()]);
    b.exact.extend(["%x".to_string(), "%y".to_string()]);
    if s.strided {
        b.line(&format!("%ys = load y[ds(0, {r}, 2), ds(1, {c}, 3)]"));
        b.floats.push("%ys".into());
        b.exact.push("%ys".into());
    }
    if let Some((a, off)) = s.gather {
        b.line(&format!("%gk = iota 0 : i32[{r}]"));
        b.line("%g7 = mul %gk, 7");
        b.line(&format!("%ga = add %g7, {a}"));
        b.line(&format!("%gm = rem %ga, {}", 2 * r));
        b.line(&format!("%gi = sub %gm, {off}"));
        b.line("%yg = load y[%gi, :]");
        b.floats.push("%yg".into());
        b.exact.push("%yg".into());
    }
    b.ints.push("%n".into());
    for _ in 0..s.steps {
        let v = b.fresh();
        let a = Body::pick(&mut g, &b.floats);
        let a2 = Body::pick(&mut g, &b.floats);
        match g.random_range(0..17) {
            16 if r % 2 == 0 => {
                // Strided slices of a value (the even rows, the odd ones), then the two joined
                // odd rows first, or the even ones copied whole (`tile`) or each in a row (`repeat`).
                let ev = b.fresh();
                b.line(&format!("{ev} = slice {a} start (0, 0) stride (2, 1) : f32[{}, {c}]", r / 2));
                match g.random_range(0..3) {
                    0 => {
                        let od = b.fresh();
                        b.line(&format!("{od} = slice {a} start (1, 0) stride (2, 1) : f32[{}, {c}]", r / 2));
                        b.line(&format!("{v} = concatenate {od}, {ev} axis 0"));
                    }
                    1 => b.line(&format!("{v} = tile {ev} reps (2, 1)")),
                    _ => b.line(&format!("{v} = repeat {ev} times 2 axis 0")),
                }
            }
            15 | 16 => {
                // `round` of an exact value (another backend's last bit could move a computed one
                // across a half).
                let e = Body::pick(&mut g, &b.exact);
                let t = b.fresh();
                b.line(&format!("{t} = mul {e}, 4.0"));
                b.line(&format!("{v} = round {t}"));
            }
            0 => {
                let op = ["add", "sub", "mul", "max", "min"][g.random_range(0..5)];
                b.line(&format!("{v} = {op} {a}, {a2}"));
            }
            1 => {
                let op = ["neg", "abs", "tanh", "logistic", "sin", "cos"][g.random_range(0..6)];
                // sin and cos of a bounded argument: of a large one (a dot of integers), one ulp of
                // difference in a correct sum is more than the f32 tolerance of the result.
                let x = if op == "sin" || op == "cos" { b.bounded(&a) } else { a };
                b.line(&format!("{v} = {op} {x}"));
            }
            2 => {
                // Bounded first, so that exp cannot overflow.
                let t = b.bounded(&a);
                b.line(&format!("{v} = exp {t}"));
            }
            3 => {
                let (t, u) = (b.fresh(), b.fresh());
                b.line(&format!("{t} = abs {a2}"));
                b.line(&format!("{u} = add {t}, 1.0"));
                b.line(&format!("{v} = div {a}, {u}"));
            }
            4 => {
                // Of an exact value: sqrt's slope is unbounded at 0, so near 0 the last bit of a
                // sum (whose order differs between backends: the interpreter's blocked GEMM,
                // wgpu's ascending loop, tensor cores) would become more than the tolerance
                // (seed 23258 did, on correct sums).
                let (e, t) = (Body::pick(&mut g, &b.exact), b.fresh());
                b.line(&format!("{t} = abs {e}"));
                b.line(&format!("{v} = sqrt {t}"));
            }
            5 => {
                // A reduction broadcast back: softmax's shape of computation.
                let op = ["sum", "max", "min"][g.random_range(0..3)];
                let axis = g.random_range(0..2);
                let t = b.fresh();
                b.line(&format!("{t} = {op} {a} axis {axis} keepdims"));
                b.line(&format!("{v} = sub {a}, {t}"));
            }
            6 => {
                // A reduction to a vector, then broadcast along the other axis. Of a bounded
                // operand: a column sum of dot results cancels, and multiplied by them again the
                // last bits of the dots' sums (in another order on each backend) grew past the
                // f32 tolerance (seed 2507: 2.4e-5 off after a `tanh` near 0).
                let (ab, t) = (b.bounded(&a), b.fresh());
                b.line(&format!("{t} = sum {ab} axis 0"));
                b.line(&format!("{v} = mul {ab}, {t}"));
            }
            7 => {
                // Of a bounded operand: dots in a row (`y wt wt`) would multiply magnitudes, and a
                // later dot's cancellation magnify the last bits of their sums (whose order the
                // interpreter's GEMM and wgpu choose differently) past the f32 tolerance: seed
                // 41186 did, 4e-5 off with both backends as close to an f64 reference.
                let (t, tr) = (b.fresh(), if g.random_bool(0.5) { " trans_b" } else { "" });
                let ab = b.bounded(&a);
                b.line(&format!("{t} = load wt"));
                b.line(&format!("{v} = dot {ab}, {t}{tr}"));
            }
            13 => {
                // A dot of 16-bit floats (f32 result), cast from inputs: a value computed with a
                // transcendental could round to a neighbouring f16 on another backend, which the
                // f32 tolerance of the result would not forgive.
                let ty = ["f16", "bf16"][g.random_range(0..2)];
                let input = ["%x", "%y"][g.random_range(0..2)];
                let (ah, wt, wh) = (b.fresh(), b.fresh(), b.fresh());
                b.line(&format!("{ah} = cast {input} : {ty}"));
                b.line(&format!("{wt} = load wt"));
                b.line(&format!("{wh} = cast {wt} : {ty}"));
                b.line(&format!("{v} = dot {ah}, {wh}"));
            }
            14 => {
                // Both transposes: s = tanh(a a2^T) is [r, r], then s^T a is [r, c] again. Every
                // operand bounded (tanh) keeps the chain well conditioned: two dots in a row
                // multiply magnitudes, and their cancellation would magnify rounding past the f32
                // tolerance (seed 41186 chained this step twice on a dot of `wt`).
                let (ab, a2b, sq) = (b.bounded(&a), b.bounded(&a2), b.fresh());
                b.line(&format!("{sq} = dot {ab}, {a2b} trans_b"));
                let sb = b.bounded(&sq);
                b.line(&format!("{v} = dot {sb}, {ab} trans_a"));
            }
            8 => {
                // A mask from exact values only.
                let (io, m) = (b.fresh(), b.fresh());
                let dim = g.random_range(0..2);
                let lim = g.random_range(0..=if dim == 0 { r } else { c });
                b.line(&format!("{io} = iota {dim} : i32{full}"));
                b.line(&format!("{m} = lt {io}, {lim}"));
                b.line(&format!("{v} = select {m}, {a}, {a2}"));
            }
            9 => {
                let (e1, e2) = (Body::pick(&mut g, &b.exact), Body::pick(&mut g, &b.exact));
                let m = b.fresh();
                b.line(&format!("{m} = gt {e1}, {e2}"));
                b.line(&format!("{v} = select {m}, {a}, {a2}"));
            }
            10 => {
                // A loop carrying a block.
                let (t, acc, m1, m2) = (b.fresh(), b.fresh(), b.fresh(), b.fresh());
                let trips = g.random_range(0..4);
                b.line(&format!("{v} = for {t} = 0 to {trips} iter ({acc} = {a}) {{"));
                b.line(&format!("  {m1} = mul {acc}, 0.5"));
                b.line(&format!("  {m2} = add {m1}, {a2}"));
                b.line(&format!("  yield {m2}"));
                b.line("}");
            }
            11 => {
                let i = Body::pick(&mut g, &b.ints);
                let i2 = Body::pick(&mut g, &b.ints);
                let e = match g.random_range(0..9) {
                    8 => {
                        // Through an 8- or 16-bit integer: both operands cast (wrapping), one
                        // operation there (wrapping again), and back to i32.
                        let ty = ["i8", "u8", "i16", "u16"][g.random_range(0..4)];
                        let (n1, n2, n3) = (b.fresh(), b.fresh(), b.fresh());
                        b.line(&format!("{n1} = cast {i} : {ty}"));
                        b.line(&format!("{n2} = cast {i2} : {ty}"));
                        let op = ["add", "sub", "mul", "max", "shr", "div"][g.random_range(0..6)];
                        b.line(&format!("{n3} = {op} {n1}, {n2}"));
                        format!("cast {n3} : i32")
                    }
                    0 => format!("add {i}, {i2}"),
                    1 => format!("mul {i}, {i2}"),
                    2 => format!("xor {i}, {i2}"),
                    3 => format!("shr {i}, {}", g.random_range(0..5)),
                    4 => format!("rem {i}, {}", [-7, 3, 5][g.random_range(0..3)]),
                    5 => format!("div {i}, {}", [-3, 2, 9][g.random_range(0..3)]),
                    6 => format!("max {i}, {i2}"),
                    _ => format!("and {i}, {}", g.random_range(1..256)),
                };
                b.line(&format!("{v} = {e}"));
                b.ints.push(v);
                continue;
            }
            _ => {
                // Integers (which chains of `mul` make large) as floats in [-2, 2): `rem`, the
                // cast and a power-of-two scale are exact everywhere; large values would make
                // dots of them cancel past the f32 tolerance (seed 5296 did, on a correct sum).
                let i = Body::pick(&mut g, &b.ints);
                let (r, c) = (b.fresh(), b.fresh());
                b.line(&format!("{r} = rem {i}, 256"));
                b.line(&format!("{c} = cast {r} : f32"));
                b.line(&format!("{v} = mul {c}, 0.0078125"));
                b.floats.push(v.clone());
                b.exact.push(v);
                continue;
            }
        }
        b.floats.push(v);
    }
    if s.trips > 0 {
        // A long loop on a row summary: it converges (to twice the summary), so every backend's
        // rounding stays within tolerance.
        let last = b.floats.last().cloned().expect("a float value");
        let (sum, t, l, acc, m, n, v) = (b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh());
        b.line(&format!("{sum} = sum {last} axis 1 keepdims"));
        b.line(&format!("{t} = tanh {sum}"));
        b.line(&format!("{l} = for %long = 0 to {} iter ({acc} = {t}) {{", s.trips));
        b.line(&format!("  {m} = mul {acc}, 0.5"));
        b.line(&format!("  {n} = add {m}, {t}"));
        b.line(&format!("  yield {n}"));
        b.line("}");
        b.line(&format!("{v} = add {last}, {l}"));
        b.floats.push(v);
    }
    if s.halve {
        // Halving is exact, and so are `abs`, `max` and the comparison: every backend stops
        // after the same trip (at most 64, where an infinity never shrinks).
        let last = b.floats.last().cloned().expect("a float value");
        let (a, rows, m, go) = (b.fresh(), b.fresh(), b.fresh(), b.fresh());
        let (h, hm, hg, hv, hx, hgo, h2, hx2, hg2) =
            (b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh());
        b.line(&format!("{a} = abs {last}"));
        b.line(&format!("{rows} = max {a} axis 1"));
        b.line(&format!("{m} = max {rows} axis 0"));
        b.line(&format!("{go} = gt {m}, 1.0"));
        b.line(&format!("{h}, {hm}, {hg} = for %halving = 0 to 64 iter ({hv} = {last}, {hx} = {m}, {hgo} = {go}) while {hgo} {{"));
        b.line(&format!("  {h2} = mul {hv}, 0.5"));
        b.line(&format!("  {hx2} = mul {hx}, 0.5"));
        b.line(&format!("  {hg2} = gt {hx2}, 1.0"));
        b.line(&format!("  yield {h2}, {hx2}, {hg2}"));
        b.line("}");
        b.floats.push(h);
    }
    if let Some(nested) = s.branch {
        if_else(&mut b, nested);
    }
    if s.edges > 0 {
        let e = edge_steps(s, &mut b);
        b.line(&format!("store e, {e}"));
    }
    // Squash what may have grown, then store; a `when` stores only on the first row of programs.
    let last = b.floats.last().cloned().expect("a float value");
    let fin = b.fresh();
    b.line(&format!("{fin} = tanh {last}"));
    let qi = b.ints.last().cloned().expect("an int value");
    if s.seq {
        let (po, so, pq, sq) = (b.fresh(), b.fresh(), b.fresh(), b.fresh());
        b.line(&format!("{po} = load o"));
        b.line(&format!("{so} = add {po}, {fin}"));
        b.line(&format!("store o, {so}"));
        b.line(&format!("{pq} = load q"));
        b.line(&format!("{sq} = add {pq}, {qi}"));
        b.line(&format!("store q, {sq}"));
    } else {
        b.line(&format!("store o, {fin}"));
        let (p, cnd) = (b.fresh(), b.fresh());
        b.line(&format!("{p} = program_id i"));
        b.line(&format!("{cnd} = eq {p}, 0"));
        for _ in 0..=s.depth {
            b.line(&format!("when {cnd} {{"));
        }
        b.line(&format!("  store q, {qi}"));
        for _ in 0..=s.depth {
            b.line("}");
        }
    }
    format!("{head}{{\n{}}}\n", b.text)
}

/// `%f, %k = if %c { ... } else { ... }` on the last float and integer values, `%c` exact on
/// every backend (integer sums wrap the same way in any order); with `nested`, the first branch
/// holds a second `if` on the program id.
fn if_else(b: &mut Body, nested: bool) {
    let (last, qi) = (b.floats.last().cloned().expect("a float"), b.ints.last().cloned().expect("an int"));
    let (rows, total, m, c, f, k) = (b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh());
    b.line(&format!("{rows} = sum %n axis 1"));
    b.line(&format!("{total} = sum {rows} axis 0"));
    b.line(&format!("{m} = rem {total}, 3"));
    b.line(&format!("{c} = eq {m}, 0"));
    let (a, t, k1) = (b.fresh(), b.fresh(), b.fresh());
    b.line(&format!("{f}, {k} = if {c} {{"));
    b.line(&format!("  {a} = mul {last}, 0.5"));
    b.line(&format!("  {t} = tanh {a}"));
    if nested {
        let (p, odd, pm, inner, u, v) = (b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh(), b.fresh());
        b.line(&format!("  {p} = program_id i"));
        b.line(&format!("  {pm} = rem {p}, 2"));
        b.line(&format!("  {odd} = eq {pm}, 1"));
        b.line(&format!("  {inner} = if {odd} {{"));
        b.line(&format!("    {u} = add {qi}, 1"));
        b.line(&format!("    yield {u}"));
        b.line("  } else {");
        b.line(&format!("    {v} = sub {qi}, 1"));
        b.line(&format!("    yield {v}"));
        b.line("  }");
        b.line(&format!("  yield {t}, {inner}"));
    } else {
        b.line(&format!("  {k1} = add {qi}, 1"));
        b.line(&format!("  yield {t}, {k1}"));
    }
    let (ng, k2) = (b.fresh(), b.fresh());
    b.line("} else {");
    b.line(&format!("  {ng} = neg {last}"));
    b.line(&format!("  {k2} = mul {qi}, 3"));
    b.line(&format!("  yield {ng}, {k2}"));
    b.line("}");
    b.floats.push(f);
    b.ints.push(k);
}

/// Special literals, and scales that take a value in [-1, 1) to a function's edges.
const SPECIALS: &[&str] = &["inf", "-inf", "nan", "-0.0", "0.0", "1e30", "-1e30", "1e-30", "3.4028235e38", "1e-40", "1e-45"];
const SCALES: &[&str] = &["88.0", "-100.0", "1e4", "1e30", "1e-40", "3.4028235e38", "150.0"];

/// The `e` output: edge operations on exact values, combined by masks; returns its value.
fn edge_steps(s: &Spec, b: &mut Body) -> String {
    // A stream of its own, so that kernels without edges stay as they were.
    let mut g = rng(s.seed ^ 0xed9e);
    let full = format!("[{}, {}]", s.r, s.c);
    // Values every backend computes bit for bit: operands of further edge steps.
    let mut exact = b.exact.clone();
    let mut results: Vec<String> = Vec::new();
    for _ in 0..s.edges {
        let v = b.fresh();
        let a = Body::pick(&mut g, &exact);
        let lit = SPECIALS[g.random_range(0..SPECIALS.len())];
        match g.random_range(0..4) {
            0 => {
                // Exactly rounded operations with a special literal on either side.
                let op = ["add", "sub", "mul", "div", "rem", "max", "min"][g.random_range(0..7)];
                if g.random_bool(0.5) {
                    b.line(&format!("{v} = {op} {a}, {lit}"));
                } else {
                    b.line(&format!("{v} = {op} {lit}, {a}"));
                }
                exact.push(v.clone());
            }
            1 => {
                // Special values masked into part of a block.
                let (io, m, c) = (b.fresh(), b.fresh(), b.fresh());
                let dim = g.random_range(0..2);
                let lim = g.random_range(0..=if dim == 0 { s.r } else { s.c });
                b.line(&format!("{io} = iota {dim} : i32{full}"));
                b.line(&format!("{m} = lt {io}, {lim}"));
                b.line(&format!("{c} = full {lit} : f32{full}"));
                b.line(&format!("{v} = select {m}, {c}, {a}"));
                exact.push(v.clone());
            }
            2 => {
                // A function of an argument scaled to its edges.
                let f = ["exp", "exp2", "log", "log2", "sin", "cos", "tanh", "logistic", "sqrt", "rsqrt", "expm1", "log1p", "erf"]
                    [g.random_range(0..13)];
                let t = b.fresh();
                b.line(&format!("{t} = mul {a}, {}", SCALES[g.random_range(0..SCALES.len())]));
                b.line(&format!("{v} = {f} {t}"));
            }
            _ => {
                // rem and pow of two exact values, or of one and a special literal.
                let a2 = Body::pick(&mut g, &exact);
                let op = ["rem", "pow", "atan2"][g.random_range(0..3)];
                let other = if g.random_bool(0.5) { a2 } else { lit.to_string() };
                b.line(&format!("{v} = {op} {a}, {other}"));
                if op == "rem" {
                    exact.push(v.clone());
                }
            }
        }
        results.push(v);
    }
    // One block: each result on the columns a mask gives it.
    let mut acc = results[0].clone();
    for r in &results[1..] {
        let (io, m, v) = (b.fresh(), b.fresh(), b.fresh());
        b.line(&format!("{io} = iota 1 : i32{full}"));
        b.line(&format!("{m} = lt {io}, {}", g.random_range(0..=s.c)));
        b.line(&format!("{v} = select {m}, {r}, {acc}"));
        acc = v;
    }
    acc
}

/// What runs a kernel against the interpreter.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Wgpu,
    /// The Mosaic GPU backend's PTX on the PTX emulator; threads in reverse order for odd seeds.
    MosaicEmulated,
}

/// `Ok` if `target` agrees with the interpreter on the kernel, else what differs.
fn differ(rt: &Runtime, target: Target, text: &str, seed: u64) -> Result<(), String> {
    let kernels = tessel::load_source("random.tk", text).map_err(|e| format!("does not verify: {e}"))?;
    let k = &kernels[0];
    let call = [KernelLaunch { kernel: k, mesh: None }];
    let args = LaunchArgs { inputs: tessel::inputs::random_inputs(k.kernel(), seed), grid: Default::default() };
    let want = rt.launch("interpret", &call, &[], &args).map_err(|e| format!("interpret: {e}"))?;
    // The interpreter's fused runs give the bits of its statements one by one.
    let unfused = tessel_interpret::compile_unfused(k).run(&args).map_err(|e| format!("interpret, unfused: {e}"))?;
    for ((name, w), (_, u)) in want.iter().zip(&unfused) {
        if w.to_bits() != u.to_bits() {
            return Err(format!("output {name}: the interpreter's fused program differs from its statements one by one"));
        }
    }
    let got = match target {
        Target::Wgpu => match rt.launch("wgpu", &call, &[], &args) {
            // A driver's loop budget (Mesa's llvmpipe) refuses the long loops: right, not a
            // disagreement.
            Err(e) if e.to_string().contains("silently stops every loop") => return Ok(()),
            r => r.map_err(|e| format!("wgpu: {e}"))?,
        },
        Target::MosaicEmulated => {
            let (_, ptx) =
                rt.lower("mosaic-gpu", &call, &[], &Default::default()).map_err(|e| format!("mosaic-gpu: {e}"))?.remove(0);
            if let Some(ptxas) = ptxas() {
                assemble(&ptxas, "random", &ptx).map_err(|e| format!("ptxas refuses the PTX: {e}"))?;
            }
            emulate(&ptx, k, &args, seed % 2 == 1).map_err(|e| format!("mosaic-gpu (emulated): {e}"))?
        }
    };
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let a = tessel_plugin_api::array::agreement(g, w);
        if !a.within {
            return Err(format!("output {name}: max abs error {} beyond {:?}", a.max_abs_error, a.tolerance));
        }
    }
    Ok(())
}

/// The smallest spec derived from `s` that still disagrees: fewer steps, then smaller blocks
/// and grids.
fn shrink(rt: &Runtime, target: Target, mut s: Spec) -> Spec {
    loop {
        let candidates = [
            Spec { steps: s.steps.saturating_sub(1).max(1), ..s.clone() },
            Spec { r: (s.r / 2).max(1), short_r: 0, ..s.clone() },
            Spec { c: (s.c / 2).max(1), short_c: 0, ..s.clone() },
            Spec { gi: 1, ..s.clone() },
            Spec { gj: 1, ..s.clone() },
            Spec { short_r: 0, short_c: 0, ..s.clone() },
            Spec { edges: s.edges.saturating_sub(1).max(usize::from(s.edges > 0)), ..s.clone() },
        ];
        let next = candidates.into_iter().find(|c| {
            let smaller = (c.steps, c.r, c.c, c.gi, c.gj, c.short_r + c.short_c, c.edges)
                != (s.steps, s.r, s.c, s.gi, s.gj, s.short_r + s.short_c, s.edges);
            smaller && differ(rt, target, &generate(c), c.seed).is_err()
        });
        match next {
            Some(c) => s = c,
            None => return s,
        }
    }
}

/// Runs the seeded kernels on `target`; the disagreements, each shrunk and saved.
fn run_random(rt: &Runtime, target: Target) -> (u64, u64, Vec<String>) {
    let count: u64 = std::env::var("TESSEL_RANDOM_KERNELS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let start: u64 = std::env::var("TESSEL_RANDOM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut failures = Vec::new();
    for seed in start..start + count {
        let spec = Spec::random_for(seed, target);
        let text = generate(&spec);
        if let Err(e) = differ(rt, target, &text, seed) {
            let small = shrink(rt, target, spec);
            let text = generate(&small);
            let why = differ(rt, target, &text, small.seed).err().unwrap_or(e);
            let dir = root().join("tests/in/regressions");
            std::fs::create_dir_all(&dir).unwrap();
            let name = if target == Target::Wgpu { format!("random_{seed}") } else { format!("random_mosaic_{seed}") };
            let path = dir.join(format!("{name}.tk"));
            let why_lines: String = why.lines().map(|l| format!("# {}\n", l.trim_end())).collect();
            std::fs::write(&path, format!("# found by tests/random_kernels.rs, shrunk:\n{why_lines}{text}")).unwrap();
            failures.push(format!("seed {seed}: {why} (shrunk into {})", path.display()));
        }
    }
    (count, start, failures)
}

#[test]
fn random_kernels_agree_on_interpret_and_wgpu() {
    let Some(adapter) = wgpu_adapter("random differential kernels") else { return };
    let rt = Runtime::new(&[]).unwrap();
    let (count, start, failures) = run_random(&rt, Target::Wgpu);
    eprintln!("{count} random kernels from seed {start} on {adapter}: {} disagreements", failures.len());
    assert!(failures.is_empty(), "wgpu disagrees with the interpreter:\n{}", failures.join("\n"));
}

#[test]
fn random_kernels_agree_on_interpret_and_emulated_mosaic_ptx() {
    let rt = Runtime::new(&[]).unwrap();
    let (count, start, failures) = run_random(&rt, Target::MosaicEmulated);
    eprintln!("{count} random kernels from seed {start} as emulated Mosaic GPU PTX: {} disagreements", failures.len());
    assert!(failures.is_empty(), "the emulated Mosaic GPU PTX disagrees with the interpreter:\n{}", failures.join("\n"));
}

#[test]
fn the_generator_makes_kernels_that_verify_and_vary() {
    let texts: Vec<String> = (1..=200).map(|seed| generate(&Spec::random(seed))).collect();
    for t in &texts {
        tessel::load_source("random.tk", t).unwrap_or_else(|e| panic!("{e}\n{t}"));
    }
    for op in [
        "dot",
        "sum",
        "for",
        "when",
        "select",
        "iota",
        "seq",
        "rem",
        "exp",
        "trans_a",
        ": f16",
        ": bf16",
        "store e",
        ", inf",
        "nan",
        "-0.0",
        "pow",
        "e30",
        "for %long = 0 to 700",
        "{\n  when ",
        "t[",
        "select(",
        ") / (",
        "while %",
        ", 3)]",
        "round",
        "stride (2, 1)",
        "load y[%gi, :]",
        " = if %",
        "  } else {",
    ] {
        assert!(texts.iter().any(|t| t.contains(op)), "no generated kernel uses {op}");
    }
    // The narrow integers, one of them at least (each alone is drawn rarely).
    assert!(texts.iter().any(|t| [": i8", ": u8", ": i16", ": u16"].iter().any(|d| t.contains(d))), "no narrow integer");
    // The stress classes are drawn, among the 60 kernels `scripts/test` runs too.
    let specs: Vec<Spec> = (1..=60).map(Spec::random).collect();
    assert!(specs.iter().any(|s| s.trips >= 70_000), "no long loop in the first 60");
    assert!(specs.iter().any(|s| s.depth >= 16 && !s.seq), "no deep nesting in the first 60");
    assert!(specs.iter().any(|s| s.wide && s.gi >= 200), "no wide grid in the first 60");
    assert!(specs.iter().any(|s| s.big && s.r * s.c >= 8192), "no big block in the first 60");
}
