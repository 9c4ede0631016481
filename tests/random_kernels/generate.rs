//! The random kernels' generator: a [`Spec`] drawn from a seed, and the kernel text it makes
//! ([`generate`]), with the edge steps of a third of them.

use std::fmt::Write as _;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::Target;
use crate::common::rng;

/// The shape of one generated kernel: everything the text is made from.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) seed: u64,
    /// Block rows and columns; grid sizes; how much the array falls short of whole blocks.
    pub(crate) r: usize,
    pub(crate) c: usize,
    pub(crate) gi: usize,
    pub(crate) gj: usize,
    pub(crate) short_r: usize,
    pub(crate) short_c: usize,
    /// `j` is a `seq` axis and the output accumulates over it.
    pub(crate) seq: bool,
    pub(crate) steps: usize,
    /// Edge steps of the `e` output (0: no `e`).
    pub(crate) edges: usize,
    /// The classes issue 38 found unguarded, drawn now and then (from a stream of their own,
    /// so that kernels without them stay as they were): a `for` of this many trips (0: none;
    /// else past 70,000, beyond some drivers' loop budget), this many `when`s nested around
    /// the last store (0: none; else up to the nesting limit), a grid of hundreds of
    /// programs over blocks of one or two rows, and blocks of 8,192 to 32,768 elements (wgpu
    /// lowers up to 65,536) on a grid of one program.
    pub(crate) trips: usize,
    pub(crate) depth: usize,
    pub(crate) wide: bool,
    pub(crate) big: bool,
    /// Computed block indices of `y` (rows, columns), reading a table `t: i32[5]` now and then
    /// (from a stream of their own); `None`: `at (i, j)`.
    pub(crate) index: Option<[String; 2]>,
    /// A `while` loop after the steps (from a stream of its own): halving the last value until
    /// its largest magnitude is at most 1, a trip count that depends on the data.
    pub(crate) halve: bool,
    /// A strided load of `y` beside the whole one (from a stream of its own): every second row
    /// and every third column from the block's origin, reaching past the block (and the array).
    pub(crate) strided: bool,
    /// A gather of `y`'s rows by an index vector (from a stream of its own): rows `(7 k + a) mod
    /// (2 r) - b` of the block for k in [0, r), some before the block, some past it (and the array).
    pub(crate) gather: Option<(usize, usize)>,
    /// An `if` after the steps (from a stream of its own): its condition exact on every backend
    /// (an integer sum of `n` and the program id), its branches computing a float and an
    /// integer result each, the first branch holding a second `if` now and then.
    pub(crate) branch: Option<bool>,
}

impl Spec {
    /// The spec of `seed` with the stress classes drawn (all of them on wgpu; on the emulated
    /// Mosaic GPU PTX only the deep nesting: the emulator runs a CTA's 128 threads one
    /// instruction at a time, and a 70,000-trip loop or 600 CTAs take it minutes, for classes
    /// that are wgpu's and the interpreter's).
    pub(crate) fn random_for(seed: u64, target: Target) -> Spec {
        let s = Spec::random(seed);
        match target {
            Target::Wgpu | Target::Cpu => s,
            Target::MosaicEmulated => Spec { depth: s.depth, ..Spec::plain(seed) },
        }
    }

    pub(crate) fn random(seed: u64) -> Spec {
        Spec::plain(seed).stressed()
    }

    pub(crate) fn plain(seed: u64) -> Spec {
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
    pub(crate) fn branch(seed: u64) -> Option<bool> {
        let mut g = rng(seed ^ 0x1f3);
        g.random_bool(0.25).then(|| g.random_bool(0.5))
    }

    /// A gather of `y` for a quarter of the seeds: the offsets `a` and `b` of its row indices.
    pub(crate) fn gather(seed: u64) -> Option<(usize, usize)> {
        let mut g = rng(seed ^ 0x6a7);
        g.random_bool(0.25).then(|| (g.random_range(0..8), g.random_range(0..4)))
    }

    /// `y`'s computed block indices for a third of the seeds: expressions of the axes with every
    /// operation of a computed index and reads of the table `t`.
    pub(crate) fn computed_index(seed: u64) -> Option<[String; 2]> {
        let mut g = rng(seed ^ 0x1dc5);
        g.random_bool(0.3).then(|| [index_expr(&mut g, "i", 2), index_expr(&mut g, "j", 2)])
    }

    /// Draws the stress classes (`trips`, `depth`, `wide`, `big`).
    pub(crate) fn stressed(mut self) -> Spec {
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

    pub(crate) fn height(&self) -> usize {
        (self.r * self.gi - self.short_r).max(1)
    }

    pub(crate) fn width(&self) -> usize {
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
pub(crate) fn generate(s: &Spec) -> String {
    let mut g = rng(s.seed ^ 0x5eed);
    let (r, c, h, w) = (s.r, s.c, s.height(), s.width());
    let mut head = String::new();
    let _ = writeln!(head, "# random kernel, seed {} (tests/random_kernels/)", s.seed);
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
        b.line(&format!(
            "{h}, {hm}, {hg} = for %halving = 0 to 64 iter ({hv} = {last}, {hx} = {m}, {hgo} = {go}) while {hgo} {{"
        ));
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
                let f =
                    ["exp", "exp2", "log", "log2", "sin", "cos", "tanh", "logistic", "sqrt", "rsqrt", "expm1", "log1p", "erf"]
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
