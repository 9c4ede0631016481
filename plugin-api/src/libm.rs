//! Accurate `f32` maths for the GPU backends, written once.
//!
//! WGSL leaves `exp`, `log`, `sin` and `cos` loosely specified (lavapipe's `exp(88.7)` is 27 ulp
//! off and its `sin(1e30)` is -1) and PTX's `.approx` instructions are good to about 2^-22 near
//! zero and wrong for large arguments, so neither meets the language's 2 ulp. Each function here
//! is a small program over operations that both targets compute exactly: IEEE `+ - * /` and fused
//! multiply-add, each rounded once; integer and bit operations; comparisons and selects; with
//! the range reductions a libm does (Cody–Waite for small arguments, Payne–Hanek with 2/π to 224
//! bits for large ones), and exact products split by Veltkamp and Dekker rather than by a fused
//! multiply-add, which WGSL does not promise. A backend writes each [`Func`] in its own language — WGSL functions,
//! inline PTX — so every GPU backend computes the same bits.
//!
//! Each function is built once per process and shared (`&'static`).
//!
//! The algorithms are the classic ones (Cephes' polynomials for `exp`, `sin`, `cos`; fdlibm's
//! reduction and polynomial for `log`, `log2`); `docs/language.md` §8 gives the accuracy each
//! reaches, measured against `f64` by `tests/edge_values.rs`.

use std::sync::OnceLock;

/// The type of a [`Var`]: 32-bit values, and predicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// IEEE binary32.
    F32,
    /// Two's complement 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// A predicate (the result of a comparison).
    Bool,
}

/// A variable of a [`Func`]: an index into [`Func::types`]. Variables may be set more than once
/// (inside [`Stmt::If`] and [`Stmt::While`]); parameters never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Var(pub usize);

/// One operation. Operand types are those of the variables; the result type is the type of the
/// variable set ([`Stmt::Set`]).
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// A constant: the bits of an `f32`, `i32` or `u32` (never a `Bool`).
    Const(u32),
    /// The value of another variable of the same type.
    Copy(Var),
    /// `a + b`: float rounded once, integers wrapping.
    Add(Var, Var),
    /// `a - b`: float rounded once, integers wrapping.
    Sub(Var, Var),
    /// `a * b`: float rounded once, integers wrapping (low 32 bits).
    Mul(Var, Var),
    /// Float `a / b`, correctly rounded.
    Div(Var, Var),
    /// Float `a * b + c`, rounded once where the target fuses it, else twice (WGSL's `fma` may
    /// be a multiply and an add, as on lavapipe): no function here needs it fused.
    Fma(Var, Var, Var),
    /// Float negation (flips the sign bit).
    Neg(Var),
    /// Float absolute value (clears the sign bit).
    Abs(Var),
    /// Float to the nearest integral value, ties to even.
    Rint(Var),
    /// Float toward zero to an integral value.
    Trunc(Var),
    /// `a < b`: ordered for floats, signed for `i32`, unsigned for `u32`.
    Lt(Var, Var),
    /// `a == b`: ordered for floats.
    Eq(Var, Var),
    /// The bits of a 32-bit value as another 32-bit type.
    Bits(Var),
    /// A numeric conversion between `f32` and an integer type: float to integer truncates (the
    /// value must be in range), integer to float rounds to nearest.
    Convert(Var),
    /// The high 32 bits of the 64-bit product of two `u32`.
    MulHi(Var, Var),
    /// `a << b`, `b` a `u32` below 32.
    Shl(Var, Var),
    /// `a >> b`, `b` a `u32` below 32: arithmetic for `i32`, logical for `u32`.
    Shr(Var, Var),
    /// Bitwise and (logical on `Bool`).
    And(Var, Var),
    /// Bitwise or (logical on `Bool`).
    Or(Var, Var),
    /// Bitwise exclusive or.
    Xor(Var, Var),
    /// `u32` remainder, the divisor not zero.
    Rem(Var, Var),
    /// Leading zero bits of a `u32` (32 for zero).
    Clz(Var),
    /// Logical not of a `Bool`.
    Not(Var),
    /// `if c { a } else { b }`, `c` a `Bool`, `a` and `b` of the result type (never `Bool`).
    Select(Var, Var, Var),
}

/// A statement.
#[derive(Clone, Debug)]
pub enum Stmt {
    /// Sets a variable.
    Set(Var, Op),
    /// Runs the body where the `Bool` variable is true.
    If(Var, Vec<Stmt>),
    /// Runs the body while the `Bool` variable is true (tested before each iteration; the body
    /// sets it again).
    While(Var, Vec<Stmt>),
}

/// A function of `f32` parameters returning an `f32`.
#[derive(Clone, Debug)]
pub struct Func {
    /// Its name in generated code (`tk_exp`).
    pub name: &'static str,
    /// The type of every variable, parameters first.
    pub types: Vec<Ty>,
    /// The parameters (`f32`).
    pub params: Vec<Var>,
    /// The body.
    pub body: Vec<Stmt>,
    /// The variable returned.
    pub result: Var,
}

/// `e^x`.
pub fn exp() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_exp", 1, |b, p| exp_of(b, p[0])))
}

/// `2^x`.
pub fn exp2() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_exp2", 1, |b, p| {
            let x = p[0];
            let xc = b.clamp(x, -152.0, 130.0);
            let k = b.op(Ty::F32, Op::Rint(xc));
            let f = b.sub(xc, k);
            let zero = b.f(0.0);
            let y = exp2_split(b, f, zero, k);
            b.nan_passes(x, y)
        })
    })
}

/// Natural logarithm.
pub fn log() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_log", 1, |b, p| {
            let x = p[0];
            let r = log_reduce(b, x);
            // log(x) = k ln2_hi - ((hfsq - (s (hfsq + R) + k ln2_lo)) - f), fdlibm's order.
            let (ln2_hi, ln2_lo) = (b.f(f32::from_bits(0x3f31_7180)), b.f(f32::from_bits(0x3717_f7d1)));
            let sr = b.add(r.hfsq, r.poly);
            let klo = b.mul(r.k, ln2_lo);
            let t = b.fma(r.s, sr, klo);
            let t = b.sub(r.hfsq, t);
            let t = b.sub(t, r.f);
            let khi = b.mul(r.k, ln2_hi);
            let y = b.sub(khi, t);
            log_specials(b, x, y)
        })
    })
}

/// Base-2 logarithm.
pub fn log2() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_log2", 1, |b, p| {
            let x = p[0];
            let (hi, lo) = log2_split(b, x);
            let y = b.add(hi, lo);
            log_specials(b, x, y)
        })
    })
}

/// Sine.
pub fn sin() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_sin", 1, |b, p| sin_cos(b, p[0], false)))
}

/// Cosine.
pub fn cos() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_cos", 1, |b, p| sin_cos(b, p[0], true)))
}

/// Hyperbolic tangent.
pub fn tanh() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_tanh", 1, |b, p| {
            let x = p[0];
            let ax = b.op(Ty::F32, Op::Abs(x));
            let y = b.var(Ty::F32);
            // Small |x|: the Taylor series x + c3 x^3 + ... + c21 x^21 (its next term is below
            // 2^-30 of the result at 0.625).
            let z = b.mul(ax, ax);
            let c = [
                -0.333_333_34_f32,
                0.133_333_34,
                -0.053_968_254,
                0.021_869_488,
                -0.008_863_236,
                0.003_592_128,
                -0.001_455_834_4,
                0.000_590_027_4,
                -0.000_239_129_12,
                9.691_538e-5,
            ];
            let mut q = b.f(c[c.len() - 1]);
            for &ci in c.iter().rev().skip(1) {
                let ci = b.f(ci);
                q = b.fma(q, z, ci);
            }
            let xz = b.mul(ax, z);
            let small = b.fma(xz, q, ax);
            b.set(y, Op::Copy(small));
            // Otherwise 1 - 2 / (e^(2|x|) + 1), which is 1 once e^(2|x|) overflows.
            let limit = b.f(0.625);
            let large = b.op(Ty::Bool, Op::Lt(ax, limit));
            let large = b.op(Ty::Bool, Op::Not(large));
            // Both branches, then a select: no divergent branch for the cheap function.
            let two = b.f(2.0);
            let ax2 = b.mul(ax, two);
            let e = exp_of(b, ax2);
            let one = b.f(1.0);
            let e1 = b.add(e, one);
            let q = b.op(Ty::F32, Op::Div(two, e1));
            let t = b.sub(one, q);
            b.set(y, Op::Select(large, t, y));
            let y = b.copy_sign(y, x);
            b.nan_passes(x, y)
        })
    })
}

/// The logistic function `1 / (1 + e^-x)`, as `e^x / (1 + e^x)` for negative `x` so that it
/// does not overflow on the way to a subnormal result.
pub fn logistic() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_logistic", 1, |b, p| {
            let x = p[0];
            let ax = b.op(Ty::F32, Op::Abs(x));
            let nax = b.op(Ty::F32, Op::Neg(ax));
            let t = exp_of(b, nax);
            let one = b.f(1.0);
            let d = b.add(one, t);
            let zero = b.f(0.0);
            let neg = b.op(Ty::Bool, Op::Lt(x, zero));
            let num = b.op(Ty::F32, Op::Select(neg, t, one));
            b.op(Ty::F32, Op::Div(num, d))
        })
    })
}

/// C's `fmod`: `x - n y` with `n` the quotient truncated toward zero, exact. The integer
/// significands are reduced 8 bits at a time (`(r << 8) % my` fits in 32 bits), so at most 32
/// iterations for the farthest exponents.
pub fn fmod() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_fmod", 2, |b, p| {
            let (x, y) = (p[0], p[1]);
            let (bx, by) = (b.bits(x), b.bits(y));
            let abs_mask = b.u(0x7fff_ffff);
            let (ax, ay) = (b.and(bx, abs_mask), b.and(by, abs_mask));
            let sign_mask = b.u(0x8000_0000);
            let sx = b.and(bx, sign_mask);
            let result = b.var(Ty::F32);
            b.set(result, Op::Copy(x));
            // |x| >= |y| with both finite and y nonzero: reduce.
            let small = b.op(Ty::Bool, Op::Lt(ax, ay));
            let big = b.op(Ty::Bool, Op::Not(small));
            let inf = b.u(0x7f80_0000);
            let x_finite = b.op(Ty::Bool, Op::Lt(ax, inf));
            let zero = b.u(0);
            let y_zero = b.op(Ty::Bool, Op::Eq(ay, zero));
            let y_nonzero = b.op(Ty::Bool, Op::Not(y_zero));
            let reduce = b.op(Ty::Bool, Op::And(big, x_finite));
            let reduce = b.op(Ty::Bool, Op::And(reduce, y_nonzero));
            b.when(reduce, |b| {
                let (ex, mx) = significand(b, ax);
                let (ey, my) = significand(b, ay);
                let r = b.var(Ty::U32);
                b.set(r, Op::Rem(mx, my));
                let d = b.var(Ty::U32);
                b.set(d, Op::Sub(ex, ey));
                let zero = b.u(0);
                let more = b.var(Ty::Bool);
                b.set(more, Op::Lt(zero, d));
                b.repeat(more, |b| {
                    let eight = b.u(8);
                    let short = b.op(Ty::Bool, Op::Lt(d, eight));
                    let s = b.op(Ty::U32, Op::Select(short, d, eight));
                    let shifted = b.op(Ty::U32, Op::Shl(r, s));
                    b.set(r, Op::Rem(shifted, my));
                    b.set(d, Op::Sub(d, s));
                    b.set(more, Op::Lt(zero, d));
                });
                // r 2^(ey - 150), exact: r < my < 2^24, and a multiple of 2^(ey - 150) below |y|.
                let rf = b.op(Ty::F32, Op::Convert(r));
                let ulp = b.f(f32::from_bits(0x3400_0000)); // 2^-23
                let rf = b.mul(rf, ulp);
                let twenty_three = b.u(23);
                let scale_bits = b.op(Ty::U32, Op::Shl(ey, twenty_three));
                let scale = b.op(Ty::F32, Op::Bits(scale_bits));
                let mag = b.mul(rf, scale);
                let mag_bits = b.bits(mag);
                let signed = b.op(Ty::U32, Op::Or(mag_bits, sx));
                b.set(result, Op::Bits(signed));
            });
            // NaN for y = 0, x infinite, or either NaN.
            let x_not_finite = b.op(Ty::Bool, Op::Not(x_finite));
            let y_nan = b.op(Ty::Bool, Op::Lt(inf, ay));
            let bad = b.op(Ty::Bool, Op::Or(y_zero, x_not_finite));
            let bad = b.op(Ty::Bool, Op::Or(bad, y_nan));
            let nan = b.f(f32::NAN);
            b.op(Ty::F32, Op::Select(bad, nan, result))
        })
    })
}

/// C's `pow`, with all its special cases: `2^(y log2 |x|)` with `log2 |x|` to about 2^-31
/// ([`log2_wide`]) and the product split exactly, so that large results keep their accuracy.
pub fn pow() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| {
        Builder::func("tk_pow", 2, |b, p| {
            let (x, y) = (p[0], p[1]);
            let ax = b.op(Ty::F32, Op::Abs(x));
            let (lh, ll) = log2_wide(b, ax);
            let (t, te) = b.two_prod(y, lh);
            let te = b.fma(y, ll, te);
            // Where t is clamped the result is 0 or inf anyway, and te may be NaN (inf - inf).
            let tc = b.clamp(t, -152.0, 130.0);
            let moderate = b.op(Ty::Bool, Op::Eq(tc, t));
            // At |x| = 1, t = 0 and y may be too large to split (te NaN); the result is exact there.
            let te_nan = b.is_nan(te);
            let te_ok = b.op(Ty::Bool, Op::Not(te_nan));
            let moderate = b.op(Ty::Bool, Op::And(moderate, te_ok));
            let zero = b.f(0.0);
            let te = b.op(Ty::F32, Op::Select(moderate, te, zero));
            let k = b.op(Ty::F32, Op::Rint(tc));
            let f = b.sub(tc, k);
            let mag = exp2_split(b, f, te, k);
            // |x| = 0 or inf, or |y| = inf: the magnitude is 0 or inf.
            let (inf, zero_f) = (b.f(f32::INFINITY), b.f(0.0));
            let y_neg = b.op(Ty::Bool, Op::Lt(y, zero_f));
            let inf_if_neg = b.op(Ty::F32, Op::Select(y_neg, inf, zero_f));
            let zero_if_neg = b.op(Ty::F32, Op::Select(y_neg, zero_f, inf));
            let ax_zero = b.op(Ty::Bool, Op::Eq(ax, zero_f));
            let mag = b.op(Ty::F32, Op::Select(ax_zero, inf_if_neg, mag));
            let ax_inf = b.op(Ty::Bool, Op::Eq(ax, inf));
            let mag = b.op(Ty::F32, Op::Select(ax_inf, zero_if_neg, mag));
            let one = b.f(1.0);
            let below_one = b.op(Ty::Bool, Op::Lt(ax, one));
            let y_big = b.op(Ty::F32, Op::Select(below_one, inf_if_neg, zero_if_neg));
            let ay = b.op(Ty::F32, Op::Abs(y));
            let y_inf = b.op(Ty::Bool, Op::Eq(ay, inf));
            let mag = b.op(Ty::F32, Op::Select(y_inf, y_big, mag));
            // The sign: negative for a negative x (or -0) and an odd integer y.
            let yt = b.op(Ty::F32, Op::Trunc(y));
            let y_int = b.op(Ty::Bool, Op::Eq(yt, y));
            let half = b.f(0.5);
            let yh = b.mul(y, half);
            let yht = b.op(Ty::F32, Op::Trunc(yh));
            let y_even = b.op(Ty::Bool, Op::Eq(yht, yh));
            let y_odd = b.op(Ty::Bool, Op::Not(y_even));
            let y_odd = b.op(Ty::Bool, Op::And(y_odd, y_int));
            let bx = b.bits(x);
            let sign_mask = b.u(0x8000_0000);
            let sx = b.and(bx, sign_mask);
            let zero_u = b.u(0);
            let odd_mask = b.op(Ty::U32, Op::Select(y_odd, sign_mask, zero_u));
            let sign = b.and(sx, odd_mask);
            let mag_bits = b.bits(mag);
            let r_bits = b.op(Ty::U32, Op::Xor(mag_bits, sign));
            let r = b.op(Ty::F32, Op::Bits(r_bits));
            // A finite negative x and a finite non-integer y: NaN.
            let nan = b.f(f32::NAN);
            let neg = b.op(Ty::Bool, Op::Lt(x, zero));
            let x_finite = b.finite(x);
            let y_finite = b.finite(y);
            let not_int = b.op(Ty::Bool, Op::Not(y_int));
            let bad = b.op(Ty::Bool, Op::And(neg, x_finite));
            let bad = b.op(Ty::Bool, Op::And(bad, y_finite));
            let bad = b.op(Ty::Bool, Op::And(bad, not_int));
            let r = b.op(Ty::F32, Op::Select(bad, nan, r));
            let x_nan = b.is_nan(x);
            let y_nan = b.is_nan(y);
            let any_nan = b.op(Ty::Bool, Op::Or(x_nan, y_nan));
            let r = b.op(Ty::F32, Op::Select(any_nan, nan, r));
            // (-1)^(+-inf) = 1; x^0 = 1 and 1^y = 1, even for NaN.
            let ax_one = b.op(Ty::Bool, Op::Eq(ax, one));
            let unit = b.op(Ty::Bool, Op::And(ax_one, y_inf));
            let y0 = b.op(Ty::Bool, Op::Eq(y, zero));
            let x1 = b.op(Ty::Bool, Op::Eq(x, one));
            let unit = b.op(Ty::Bool, Op::Or(unit, y0));
            let unit = b.op(Ty::Bool, Op::Or(unit, x1));
            b.op(Ty::F32, Op::Select(unit, one, r))
        })
    })
}

// ---- shared pieces ----

/// `e^x` for any `x`, NaN passing through.
fn exp_of(b: &mut Builder, x: Var) -> Var {
    let xc = b.clamp(x, -104.0, 89.0);
    let log2e = b.f(std::f32::consts::LOG2_E);
    let t = b.mul(xc, log2e);
    let k = b.op(Ty::F32, Op::Rint(t));
    // Cody–Waite: ln 2 as 0.693359375 (exact products with k) minus 2.12194440e-4.
    let nk = b.op(Ty::F32, Op::Neg(k));
    let (c1, c2) = (b.f(0.693_359_4), b.f(-2.121_944_4e-4));
    let r = b.fma(nk, c1, xc);
    let r = b.fma(nk, c2, r);
    let y = exp_poly(b, r, None);
    let y = scale2(b, y, k);
    b.nan_passes(x, y)
}

/// `2^(f + lo) 2^k` for `|f| <= 0.5`: `f ln 2` split into two floats, then [`exp_poly`].
fn exp2_split(b: &mut Builder, f: Var, lo: Var, k: Var) -> Var {
    let (ln2, ln2_lo) = (b.f(f32::from_bits(0x3f31_7218)), b.f(f32::from_bits(0xb102_e308)));
    let (hi, err) = b.two_prod(f, ln2);
    let err = b.fma(f, ln2_lo, err);
    let rlo = b.fma(lo, ln2, err);
    let y = exp_poly(b, hi, Some(rlo));
    scale2(b, y, k)
}

/// `e^(r + lo)` for `|r| <= ln2 / 2` and a tiny `lo` (none: 0): Cephes' degree-7 polynomial,
/// then `e^r (1 + lo)`.
fn exp_poly(b: &mut Builder, r: Var, lo: Option<Var>) -> Var {
    let c = [1.987_569_2e-4_f32, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
    let mut p = b.f(c[0]);
    for &ci in &c[1..] {
        let ci = b.f(ci);
        p = b.fma(p, r, ci);
    }
    let rr = b.mul(r, r);
    let t = b.fma(rr, p, r);
    let one = b.f(1.0);
    let y = b.add(t, one);
    match lo {
        Some(lo) => b.fma(y, lo, y),
        None => y,
    }
}

/// `y 2^k` for an integral `k` in [-152, 130], by two exact powers of two (so that a subnormal
/// result is rounded once).
fn scale2(b: &mut Builder, y: Var, k: Var) -> Var {
    let half = b.f(0.5);
    let kh = b.mul(k, half);
    let k1 = b.op(Ty::F32, Op::Trunc(kh));
    let k2 = b.sub(k, k1);
    let p1 = pow2(b, k1);
    let p2 = pow2(b, k2);
    let y = b.mul(y, p1);
    b.mul(y, p2)
}

/// `2^n` for an integral `f32` `n` in [-126, 127].
fn pow2(b: &mut Builder, n: Var) -> Var {
    let ni = b.op(Ty::I32, Op::Convert(n));
    let bias = b.i(127);
    let e = b.add(ni, bias);
    let eu = b.op(Ty::U32, Op::Bits(e));
    let shift = b.u(23);
    let bits = b.op(Ty::U32, Op::Shl(eu, shift));
    b.op(Ty::F32, Op::Bits(bits))
}

/// The pieces of fdlibm's logarithm of a positive finite `x`: `x = 2^k (1 + f)` with
/// `1 + f` in [sqrt(1/2), sqrt(2)), `s = f / (2 + f)`, `hfsq = f^2 / 2`, and the polynomial `R`.
struct LogParts {
    k: Var,
    f: Var,
    s: Var,
    hfsq: Var,
    poly: Var,
}

fn log_reduce(b: &mut Builder, x: Var) -> LogParts {
    // Subnormals are scaled into the normal range first.
    let min_normal = b.f(f32::MIN_POSITIVE);
    let sub = b.op(Ty::Bool, Op::Lt(x, min_normal));
    let two25 = b.f(33_554_432.0);
    let scaled = b.mul(x, two25);
    let xs = b.op(Ty::F32, Op::Select(sub, scaled, x));
    let (m25, zero) = (b.f(-25.0), b.f(0.0));
    let kadj = b.op(Ty::F32, Op::Select(sub, m25, zero));
    let ix = b.bits(xs);
    let off = b.u(0x3f80_0000 - 0x3f35_04f3);
    let ix = b.add(ix, off);
    let shift = b.u(23);
    let e = b.op(Ty::U32, Op::Shr(ix, shift));
    let e = b.op(Ty::I32, Op::Bits(e));
    let bias = b.i(127);
    let e = b.sub(e, bias);
    let k = b.op(Ty::F32, Op::Convert(e));
    let k = b.add(k, kadj);
    let mant = b.u(0x007f_ffff);
    let m = b.and(ix, mant);
    let base = b.u(0x3f35_04f3);
    let m = b.add(m, base);
    let m = b.op(Ty::F32, Op::Bits(m));
    let one = b.f(1.0);
    let f = b.sub(m, one);
    let two = b.f(2.0);
    let d = b.add(f, two);
    let s = b.op(Ty::F32, Op::Div(f, d));
    let z = b.mul(s, s);
    let w = b.mul(z, z);
    let lg = [0x3f2a_aaaa_u32, 0x3ecc_ce13, 0x3e91_e9ee, 0x3e78_9e26].map(f32::from_bits);
    let (lg1, lg2, lg3, lg4) = (b.f(lg[0]), b.f(lg[1]), b.f(lg[2]), b.f(lg[3]));
    let t1 = b.fma(w, lg4, lg2);
    let t1 = b.mul(w, t1);
    let t2 = b.fma(w, lg3, lg1);
    let t2 = b.mul(z, t2);
    let poly = b.add(t2, t1);
    let half = b.f(0.5);
    let hf = b.mul(half, f);
    let hfsq = b.mul(hf, f);
    LogParts { k, f, s, hfsq, poly }
}

/// `log2 x = hi + lo` (fdlibm's `log2f`, its last sum kept as two floats), `x` positive finite.
fn log2_split(b: &mut Builder, x: Var) -> (Var, Var) {
    let r = log_reduce(b, x);
    let hi = b.sub(r.f, r.hfsq);
    let hb = b.bits(hi);
    let mask = b.u(0xffff_f000);
    let hb = b.and(hb, mask);
    let hi = b.op(Ty::F32, Op::Bits(hb));
    let lo = b.sub(r.f, hi);
    let lo = b.sub(lo, r.hfsq);
    let sr = b.add(r.hfsq, r.poly);
    let lo = b.fma(r.s, sr, lo);
    let (iv_hi, iv_lo) = (b.f(f32::from_bits(0x3fb8_b000)), b.f(f32::from_bits(0xb938_9ad4)));
    // hi * iv_hi is exact (12 and 12 significant bits); k + that as an exact two-sum.
    let p = b.mul(hi, iv_hi);
    let (s, e) = b.two_sum(r.k, p);
    let lohi = b.add(lo, hi);
    let t = b.mul(lohi, iv_lo);
    let t = b.fma(lo, iv_hi, t);
    let lo = b.add(t, e);
    // Renormalised, so that hi is the rounded log2.
    b.two_sum(s, lo)
}

/// `log2 x = hi + lo` to about 2^-31 of the result, `x` positive finite, for `pow`: `ln(1 + f)
/// = 2 atanh(s)`, `s = f / (2 + f)` carried as two floats, `2s + s^3 P(s^2)` with the Taylor
/// series of `P` to 2^-33, then times `1 / ln 2` in two floats.
fn log2_wide(b: &mut Builder, x: Var) -> (Var, Var) {
    let r = log_reduce(b, x);
    // s = f / (2 + f) as sh + sl: 2 + f as a two-sum, then the division's remainder.
    let two = b.f(2.0);
    let (u, ue) = b.two_sum(two, r.f);
    let sh = b.op(Ty::F32, Op::Div(r.f, u));
    let (p, pe) = b.two_prod(sh, u);
    let rem = b.sub(r.f, p);
    let rem = b.sub(rem, pe);
    let sue = b.mul(sh, ue);
    let rem = b.sub(rem, sue);
    let sl = b.op(Ty::F32, Op::Div(rem, u));
    // P(z) = 2/3 + 2/5 z + ... + 2/15 z^6.
    let z = b.mul(sh, sh);
    let coeffs = [2.0 / 15.0, 2.0 / 13.0, 2.0 / 11.0, 2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0_f64];
    let mut q = b.f(coeffs[0] as f32);
    for &c in &coeffs[1..] {
        let c = b.f(c as f32);
        q = b.fma(q, z, c);
    }
    let s3 = b.mul(z, sh);
    let tail = b.mul(s3, q);
    // ln(1 + f) = 2 sh + (2 sl + 2 sh^2 sl + tail).
    let lh = b.add(sh, sh);
    let zsl = b.mul(z, sl);
    let ll = b.add(sl, zsl);
    let ll = b.add(ll, ll);
    let ll = b.add(ll, tail);
    // Times 1 / ln 2 = ivh + ivl, plus k.
    let (ivh, ivl) = (b.f(std::f32::consts::LOG2_E), b.f(1.925_963e-8));
    let (mh, me) = b.two_prod(lh, ivh);
    let a = b.mul(lh, ivl);
    let c = b.mul(ll, ivh);
    let me = b.add(me, a);
    let me = b.add(me, c);
    let (s, e) = b.two_sum(r.k, mh);
    let lo = b.add(e, me);
    b.two_sum(s, lo)
}

/// Logarithms at their edges: NaN below 0 and for NaN, -inf at ±0, inf at inf.
fn log_specials(b: &mut Builder, x: Var, y: Var) -> Var {
    let bx = b.bits(x);
    let inf_bits = b.u(0x7f80_0000);
    // As unsigned bits, every negative number, inf and NaN are >= inf's bits.
    let below = b.op(Ty::Bool, Op::Lt(bx, inf_bits));
    let is_inf = b.op(Ty::Bool, Op::Eq(bx, inf_bits));
    let (inf, nan, ninf) = (b.f(f32::INFINITY), b.f(f32::NAN), b.f(f32::NEG_INFINITY));
    let edge = b.op(Ty::F32, Op::Select(is_inf, inf, nan));
    let y = b.op(Ty::F32, Op::Select(below, y, edge));
    let zero = b.f(0.0);
    let is_zero = b.op(Ty::Bool, Op::Eq(x, zero));
    b.op(Ty::F32, Op::Select(is_zero, ninf, y))
}

/// `(exponent field at least 1, integer significand)` of a finite nonzero `|x|`'s bits.
fn significand(b: &mut Builder, a: Var) -> (Var, Var) {
    let shift = b.u(23);
    let e = b.op(Ty::U32, Op::Shr(a, shift));
    let mant = b.u(0x007f_ffff);
    let m = b.and(a, mant);
    let hidden = b.u(0x0080_0000);
    let mh = b.op(Ty::U32, Op::Or(m, hidden));
    let zero = b.u(0);
    let sub = b.op(Ty::Bool, Op::Eq(e, zero));
    let m = b.op(Ty::U32, Op::Select(sub, m, mh));
    let one = b.u(1);
    let e = b.op(Ty::U32, Op::Select(sub, one, e));
    (e, m)
}

/// `sin x` or `cos x`: `|x| = q π/2 + r` with `|r| <= π/4`, then the polynomial of the quadrant.
fn sin_cos(b: &mut Builder, x: Var, cos: bool) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    let (r, q) = (b.var(Ty::F32), b.var(Ty::U32));
    // Below 6000 (a quotient below 2^12), Cody–Waite with π/2 in three parts, the first two of
    // 12 bits so that their products with the quotient are exact (past it on zero, which keeps
    // the integer conversion in range).
    let limit = b.f(6000.0);
    let small = b.op(Ty::Bool, Op::Lt(ax, limit));
    let zero = b.f(0.0);
    let ax = b.op(Ty::F32, Op::Select(small, ax, zero));
    let j = {
        let two_over_pi = b.f(std::f32::consts::FRAC_2_PI);
        let t = b.mul(ax, two_over_pi);
        b.op(Ty::F32, Op::Rint(t))
    };
    let nj = b.op(Ty::F32, Op::Neg(j));
    let parts = [0x3fc9_0000_u32, 0x39fd_a000, 0x33a2_2169].map(f32::from_bits);
    let mut rr = ax;
    for part in parts {
        let c = b.f(part);
        let p = b.mul(nj, c);
        rr = b.add(rr, p);
    }
    b.set(r, Op::Copy(rr));
    let ji = b.op(Ty::I32, Op::Convert(j));
    b.set(q, Op::Bits(ji));
    let large = b.op(Ty::Bool, Op::Not(small));
    let ax = b.op(Ty::F32, Op::Abs(x));
    b.when(large, |b| payne_hanek(b, ax, r, q));
    // sin r and cos r on [-π/4, π/4] (Cephes).
    let z = b.mul(r, r);
    let s = {
        let (s1, s2, s3) = (b.f(-1.951_529_6e-4), b.f(8.332_161e-3), b.f(-1.666_665_5e-1));
        let p = b.fma(s1, z, s2);
        let p = b.fma(p, z, s3);
        let rz = b.mul(r, z);
        b.fma(rz, p, r)
    };
    let c = {
        let (c1, c2, c3) = (b.f(2.443_315_7e-5), b.f(-1.388_731_6e-3), b.f(4.166_664_6e-2));
        let p = b.fma(c1, z, c2);
        let p = b.fma(p, z, c3);
        let zz = b.mul(z, z);
        let (mhalf, one) = (b.f(-0.5), b.f(1.0));
        let h = b.fma(mhalf, z, one);
        b.fma(zz, p, h)
    };
    // cos x = sin(x + π/2): one quadrant further.
    let q = if cos {
        let one = b.u(1);
        b.add(q, one)
    } else {
        q
    };
    let one = b.u(1);
    let odd = b.and(q, one);
    let odd = b.op(Ty::Bool, Op::Eq(odd, one));
    let v = b.op(Ty::F32, Op::Select(odd, c, s));
    // Quadrants 2 and 3 negate; sin is odd in x, cos even.
    let two = b.u(2);
    let flip = b.and(q, two);
    let thirty = b.u(30);
    let mut sign = b.op(Ty::U32, Op::Shl(flip, thirty));
    if !cos {
        let bx = b.bits(x);
        let sign_mask = b.u(0x8000_0000);
        let sx = b.and(bx, sign_mask);
        sign = b.op(Ty::U32, Op::Xor(sign, sx));
    }
    let vb = b.bits(v);
    let vb = b.op(Ty::U32, Op::Xor(vb, sign));
    let v = b.op(Ty::F32, Op::Bits(vb));
    // Infinities and NaN give NaN.
    let finite = b.finite(x);
    let nan = b.f(f32::NAN);
    b.op(Ty::F32, Op::Select(finite, v, nan))
}

/// Payne–Hanek: `ax 2/π` mod 4 from 96 bits of 2/π at the exponent of `ax` (`ax >= 2^12`), the
/// quadrant into `q` and the remainder times π/2 into `r`.
fn payne_hanek(b: &mut Builder, ax: Var, r: Var, q: Var) {
    // 2/π to 224 bits, after two zero words (so that the window may start before the point).
    const TWO_OVER_PI: [u32; 9] =
        [0, 0, 0xa2f9_836e, 0x4e44_1529, 0xfc27_57d1, 0xf534_ddc0, 0xdb62_9599, 0x3c43_9041, 0xfe51_63ab];
    let ix = b.bits(ax);
    let (e, m) = significand(b, ix);
    // ax = m 2^(e - 150); the bits of 2/π from position e - 1 (+63 for the padding) on are
    // the ones that matter mod 4.
    let off = b.u(150 + 1 - 63);
    let start = b.sub(e, off);
    let five = b.u(5);
    let word = b.op(Ty::U32, Op::Shr(start, five));
    let mask = b.u(31);
    let sh = b.and(start, mask);
    let thirty_two = b.u(32);
    let rsh = b.sub(thirty_two, sh);
    let rsh = b.and(rsh, mask);
    let zero = b.u(0);
    let aligned = b.op(Ty::Bool, Op::Eq(sh, zero));
    let words: Vec<Var> = (0..4)
        .map(|i| {
            let di = b.u(i);
            let idx = b.add(word, di);
            let mut w = b.u(0);
            for (n, &bits) in TWO_OVER_PI.iter().enumerate() {
                let nn = b.u(n as u32);
                let hit = b.op(Ty::Bool, Op::Eq(idx, nn));
                let c = b.u(bits);
                w = b.op(Ty::U32, Op::Select(hit, c, w));
            }
            w
        })
        .collect();
    // c2 c1 c0: the 96 bits of the window, most significant first.
    let window: Vec<Var> = (0..3)
        .map(|i| {
            let hi = b.op(Ty::U32, Op::Shl(words[i], sh));
            let lo = b.op(Ty::U32, Op::Shr(words[i + 1], rsh));
            let lo = b.op(Ty::U32, Op::Select(aligned, zero, lo));
            b.op(Ty::U32, Op::Or(hi, lo))
        })
        .collect();
    let (c2, c1, c0) = (window[0], window[1], window[2]);
    // m * (c2 c1 c0), 120 bits in p3 p2 p1 p0 (only p2 p1 p0 matter).
    let p0 = b.mul(m, c0);
    let h0 = b.op(Ty::U32, Op::MulHi(m, c0));
    let l1 = b.mul(m, c1);
    let h1 = b.op(Ty::U32, Op::MulHi(m, c1));
    let l2 = b.mul(m, c2);
    let p1 = b.add(h0, l1);
    let one = b.u(1);
    let carry = b.op(Ty::Bool, Op::Lt(p1, l1));
    let carry = b.op(Ty::U32, Op::Select(carry, one, zero));
    let p2 = b.add(h1, l2);
    let p2 = b.add(p2, carry);
    // Bits 95 and 94 are the quadrant; bits 93 down the fraction, 64 of them in fh fl.
    let thirty = b.u(30);
    let two = b.u(2);
    let quad = b.op(Ty::U32, Op::Shr(p2, thirty));
    let fh = b.op(Ty::U32, Op::Shl(p2, two));
    let t = b.op(Ty::U32, Op::Shr(p1, thirty));
    let fh = b.op(Ty::U32, Op::Or(fh, t));
    let fl = b.op(Ty::U32, Op::Shl(p1, two));
    let t = b.op(Ty::U32, Op::Shr(p0, thirty));
    let fl = b.op(Ty::U32, Op::Or(fl, t));
    // A fraction of a half or more rounds the quadrant up and leaves 1 - fraction, negated.
    let top = b.u(0x8000_0000);
    let up_bit = b.and(fh, top);
    let up = b.op(Ty::Bool, Op::Eq(up_bit, top));
    let round_up = b_select_u(b, up, one, zero);
    let quad = b.add(quad, round_up);
    let ones = b.u(u32::MAX);
    let nfl = b.op(Ty::U32, Op::Xor(fl, ones));
    let nfl = b.add(nfl, one);
    let nfh = b.op(Ty::U32, Op::Xor(fh, ones));
    let fl_zero = b.op(Ty::Bool, Op::Eq(fl, zero));
    let borrow = b_select_u(b, fl_zero, one, zero);
    let nfh = b.add(nfh, borrow);
    let fh = b.op(Ty::U32, Op::Select(up, nfh, fh));
    let fl = b.op(Ty::U32, Op::Select(up, nfl, fl));
    // Normalise the 64 bits (a word first if the high one is zero).
    let fh_zero = b.op(Ty::Bool, Op::Eq(fh, zero));
    let extra = b_select_u(b, fh_zero, thirty_two, zero);
    let h = b.op(Ty::U32, Op::Select(fh_zero, fl, fh));
    let l = b.op(Ty::U32, Op::Select(fh_zero, zero, fl));
    let z = b.op(Ty::U32, Op::Clz(h));
    let z = b.and(z, mask);
    let zr = b.sub(thirty_two, z);
    let zr = b.and(zr, mask);
    let z_zero = b.op(Ty::Bool, Op::Eq(z, zero));
    let hs = b.op(Ty::U32, Op::Shl(h, z));
    let carry_in = b.op(Ty::U32, Op::Shr(l, zr));
    let carry_in = b.op(Ty::U32, Op::Select(z_zero, zero, carry_in));
    let h = b.op(Ty::U32, Op::Or(hs, carry_in));
    let l = b.op(Ty::U32, Op::Shl(l, z));
    // value = (top 2^-24 + next 2^-48) 2^-(z + extra): two exact floats.
    let eight = b.u(8);
    let sixteen = b.u(16);
    let top = b.op(Ty::U32, Op::Shr(h, eight));
    let byte = b.u(0xff);
    let low8 = b.and(h, byte);
    let low8 = b.op(Ty::U32, Op::Shl(low8, sixteen));
    let l16 = b.op(Ty::U32, Op::Shr(l, sixteen));
    let next = b.op(Ty::U32, Op::Or(low8, l16));
    let zt = b.add(z, extra);
    let exp_bits = b.u(127 - 24);
    let eb = b.sub(exp_bits, zt);
    let twenty_three = b.u(23);
    let eb = b.op(Ty::U32, Op::Shl(eb, twenty_three));
    let scale = b.op(Ty::F32, Op::Bits(eb));
    let topf = b.op(Ty::F32, Op::Convert(top));
    let nextf = b.op(Ty::F32, Op::Convert(next));
    let rh = b.mul(topf, scale);
    let ulp = b.f(f32::from_bits(0x3380_0000)); // 2^-24
    let rl = b.mul(nextf, scale);
    let rl = b.mul(rl, ulp);
    // (rh + rl) π/2 to about 48 bits, rounded once.
    let (ph_c, pl_c) = (b.f(f32::from_bits(0x3fc9_0fdb)), b.f(f32::from_bits(0xb33b_bd2e)));
    let (ph, pe) = b.two_prod(rh, ph_c);
    let pe = b.fma(rl, ph_c, pe);
    let pe = b.fma(rh, pl_c, pe);
    let v = b.add(ph, pe);
    let nv = b.op(Ty::F32, Op::Neg(v));
    b.set(r, Op::Select(up, nv, v));
    b.set(q, Op::Copy(quad));
}

fn b_select_u(b: &mut Builder, c: Var, t: Var, f: Var) -> Var {
    b.op(Ty::U32, Op::Select(c, t, f))
}

// ---- the builder ----

/// Builds a [`Func`] statement by statement.
struct Builder {
    types: Vec<Ty>,
    /// The open bodies, innermost last.
    bodies: Vec<Vec<Stmt>>,
}

impl Builder {
    fn func(name: &'static str, params: usize, body: impl FnOnce(&mut Builder, &[Var]) -> Var) -> Func {
        let mut b = Builder { types: vec![Ty::F32; params], bodies: vec![Vec::new()] };
        let params: Vec<Var> = (0..params).map(Var).collect();
        let result = body(&mut b, &params);
        let body = b.bodies.pop().expect("the function body");
        Func { name, types: b.types, params, body, result }
    }

    fn var(&mut self, t: Ty) -> Var {
        self.types.push(t);
        Var(self.types.len() - 1)
    }

    fn ty(&self, v: Var) -> Ty {
        self.types[v.0]
    }

    fn set(&mut self, v: Var, op: Op) {
        self.bodies.last_mut().expect("an open body").push(Stmt::Set(v, op));
    }

    fn op(&mut self, t: Ty, op: Op) -> Var {
        let v = self.var(t);
        self.set(v, op);
        v
    }

    fn when(&mut self, c: Var, body: impl FnOnce(&mut Builder)) {
        self.bodies.push(Vec::new());
        body(self);
        let inner = self.bodies.pop().expect("the if body");
        self.bodies.last_mut().expect("an open body").push(Stmt::If(c, inner));
    }

    fn repeat(&mut self, c: Var, body: impl FnOnce(&mut Builder)) {
        self.bodies.push(Vec::new());
        body(self);
        let inner = self.bodies.pop().expect("the loop body");
        self.bodies.last_mut().expect("an open body").push(Stmt::While(c, inner));
    }

    fn f(&mut self, v: f32) -> Var {
        self.op(Ty::F32, Op::Const(v.to_bits()))
    }

    fn u(&mut self, v: u32) -> Var {
        self.op(Ty::U32, Op::Const(v))
    }

    fn i(&mut self, v: i32) -> Var {
        self.op(Ty::I32, Op::Const(v as u32))
    }

    fn add(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Add(a, c))
    }

    fn sub(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Sub(a, c))
    }

    fn mul(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Mul(a, c))
    }

    fn fma(&mut self, a: Var, c: Var, d: Var) -> Var {
        self.op(Ty::F32, Op::Fma(a, c, d))
    }

    fn and(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::And(a, c))
    }

    fn bits(&mut self, a: Var) -> Var {
        self.op(Ty::U32, Op::Bits(a))
    }

    /// `x` limited to `[lo, hi]` (NaN stays NaN).
    fn clamp(&mut self, x: Var, lo: f32, hi: f32) -> Var {
        let (l, h) = (self.f(lo), self.f(hi));
        let below = self.op(Ty::Bool, Op::Lt(x, l));
        let x = self.op(Ty::F32, Op::Select(below, l, x));
        let above = self.op(Ty::Bool, Op::Lt(h, x));
        self.op(Ty::F32, Op::Select(above, h, x))
    }

    /// The bits of `|x|`, and those of inf: NaN's are above, finite ones below.
    fn magnitude(&mut self, x: Var) -> (Var, Var) {
        let bx = self.bits(x);
        let m = self.u(0x7fff_ffff);
        let a = self.and(bx, m);
        (a, self.u(0x7f80_0000))
    }

    fn is_nan(&mut self, x: Var) -> Var {
        let (a, inf) = self.magnitude(x);
        self.op(Ty::Bool, Op::Lt(inf, a))
    }

    fn finite(&mut self, x: Var) -> Var {
        let (a, inf) = self.magnitude(x);
        self.op(Ty::Bool, Op::Lt(a, inf))
    }

    /// `y`, or `x` where `x` is NaN.
    fn nan_passes(&mut self, x: Var, y: Var) -> Var {
        let n = self.is_nan(x);
        self.op(Ty::F32, Op::Select(n, x, y))
    }

    /// `|y|` with the sign of `x`.
    fn copy_sign(&mut self, y: Var, x: Var) -> Var {
        let (by, bx) = (self.bits(y), self.bits(x));
        let m = self.u(0x7fff_ffff);
        let s = self.u(0x8000_0000);
        let a = self.and(by, m);
        let sx = self.and(bx, s);
        let r = self.op(Ty::U32, Op::Or(a, sx));
        self.op(Ty::F32, Op::Bits(r))
    }

    /// `(p, e)` with `p = a c` rounded and `p + e = a c` exactly (Dekker's product of
    /// Veltkamp's 12-bit halves; no fused multiply-add needed). `a c` must not overflow.
    fn two_prod(&mut self, a: Var, c: Var) -> (Var, Var) {
        let p = self.mul(a, c);
        let (ah, al) = self.split(a);
        let (ch, cl) = self.split(c);
        let hh = self.mul(ah, ch);
        let e = self.sub(hh, p);
        let hl = self.mul(ah, cl);
        let e = self.add(e, hl);
        let lh = self.mul(al, ch);
        let e = self.add(e, lh);
        let ll = self.mul(al, cl);
        let e = self.add(e, ll);
        (p, e)
    }

    /// Veltkamp's split of `a` into 12-bit `hi` and `lo` with `hi + lo = a`.
    fn split(&mut self, a: Var) -> (Var, Var) {
        let k = self.f(4097.0);
        let t = self.mul(a, k);
        let d = self.sub(t, a);
        let hi = self.sub(t, d);
        let lo = self.sub(a, hi);
        (hi, lo)
    }

    /// `(s, e)` with `s = a + c` rounded and `s + e = a + c` exactly (Knuth's two-sum).
    fn two_sum(&mut self, a: Var, c: Var) -> (Var, Var) {
        let s = self.add(a, c);
        let av = self.sub(s, c);
        let cv = self.sub(s, av);
        let ae = self.sub(a, av);
        let ce = self.sub(c, cv);
        let e = self.add(ae, ce);
        (s, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a function on the CPU with Rust's IEEE operations: how the algorithms are checked
    /// here, before any backend writes them (the backends are checked against f64 by
    /// `tests/edge_values.rs`).
    /// With `fused` false, `Fma` rounds twice, as a WGSL `fma` may.
    fn eval(f: &Func, args: &[f32], fused: bool) -> f32 {
        let mut vals = vec![0u32; f.types.len()];
        for (p, a) in f.params.iter().zip(args) {
            vals[p.0] = a.to_bits();
        }
        run(f, &f.body, &mut vals, fused);
        f32::from_bits(vals[f.result.0])
    }

    fn run(f: &Func, body: &[Stmt], vals: &mut Vec<u32>, fused: bool) {
        for s in body {
            match s {
                Stmt::Set(v, op) => vals[v.0] = apply(f, *v, *op, vals, fused),
                Stmt::If(c, inner) => {
                    if vals[c.0] != 0 {
                        run(f, inner, vals, fused);
                    }
                }
                Stmt::While(c, inner) => {
                    let mut n = 0;
                    while vals[c.0] != 0 {
                        run(f, inner, vals, fused);
                        n += 1;
                        assert!(n < 1000, "{}: endless loop", f.name);
                    }
                }
            }
        }
    }

    fn apply(f: &Func, v: Var, op: Op, vals: &[u32], fused: bool) -> u32 {
        let t = f.types[v.0];
        let x = |a: Var| vals[a.0];
        let fl = |a: Var| f32::from_bits(vals[a.0]);
        let ty = |a: Var| f.types[a.0];
        let float = |r: f32| r.to_bits();
        match op {
            Op::Const(c) => c,
            Op::Copy(a) => x(a),
            Op::Add(a, c) if t == Ty::F32 => float(fl(a) + fl(c)),
            Op::Sub(a, c) if t == Ty::F32 => float(fl(a) - fl(c)),
            Op::Mul(a, c) if t == Ty::F32 => float(fl(a) * fl(c)),
            Op::Add(a, c) => x(a).wrapping_add(x(c)),
            Op::Sub(a, c) => x(a).wrapping_sub(x(c)),
            Op::Mul(a, c) => x(a).wrapping_mul(x(c)),
            Op::Div(a, c) => float(fl(a) / fl(c)),
            Op::Fma(a, c, d) if fused => float(fl(a).mul_add(fl(c), fl(d))),
            Op::Fma(a, c, d) => float(fl(a) * fl(c) + fl(d)),
            Op::Neg(a) => float(-fl(a)),
            Op::Abs(a) => float(fl(a).abs()),
            Op::Rint(a) => float(fl(a).round_ties_even()),
            Op::Trunc(a) => float(fl(a).trunc()),
            Op::Lt(a, c) => u32::from(match ty(a) {
                Ty::F32 => fl(a) < fl(c),
                Ty::I32 => (x(a) as i32) < (x(c) as i32),
                _ => x(a) < x(c),
            }),
            Op::Eq(a, c) if ty(a) == Ty::F32 => u32::from(fl(a) == fl(c)),
            Op::Eq(a, c) => u32::from(x(a) == x(c)),
            Op::Bits(a) => x(a),
            Op::Convert(a) => match (ty(a), t) {
                (Ty::F32, Ty::I32) => fl(a) as i32 as u32,
                (Ty::F32, _) => fl(a) as u32,
                (Ty::I32, _) => float(x(a) as i32 as f32),
                _ => float(x(a) as f32),
            },
            Op::MulHi(a, c) => ((u64::from(x(a)) * u64::from(x(c))) >> 32) as u32,
            Op::Shl(a, c) => {
                assert!(x(c) < 32, "{}: shift by {}", f.name, x(c));
                x(a) << x(c)
            }
            Op::Shr(a, c) if ty(a) == Ty::I32 => ((x(a) as i32) >> x(c)) as u32,
            Op::Shr(a, c) => {
                assert!(x(c) < 32, "{}: shift by {}", f.name, x(c));
                x(a) >> x(c)
            }
            Op::And(a, c) => x(a) & x(c),
            Op::Or(a, c) => x(a) | x(c),
            Op::Xor(a, c) => x(a) ^ x(c),
            Op::Rem(a, c) => x(a) % x(c),
            Op::Clz(a) => x(a).leading_zeros(),
            Op::Not(a) => u32::from(x(a) == 0),
            Op::Select(c, a, d) => {
                if x(c) != 0 {
                    x(a)
                } else {
                    x(d)
                }
            }
        }
    }

    /// Distance in ulp between two f32, NaN equal to NaN.
    fn ulps(a: f32, b: f32) -> u64 {
        if a.is_nan() && b.is_nan() {
            return 0;
        }
        if a.is_nan() || b.is_nan() {
            return u64::MAX;
        }
        let key = |v: f32| {
            let b = v.to_bits() as i64;
            if b < 0x8000_0000 { b } else { 0x8000_0000 - b }
        };
        key(a).abs_diff(key(b))
    }

    /// Arguments spread over every binade, with the edges.
    fn sample() -> Vec<f32> {
        let mut v = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN_POSITIVE, 1e-45];
        let mut s = 0x1234_5678u32;
        for i in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // Half of them any bits, half where the reductions change (|x| up to 2^14).
            let spread = (s >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0;
            v.push(if i % 2 == 0 { f32::from_bits(s) } else { spread * (1 << (i % 15)) as f32 });
        }
        v
    }

    fn check_unary(f: &Func, want: impl Fn(f64) -> f64, max_ulps: u64) {
        let mut worst = (0, 0.0f32);
        for (i, x) in sample().into_iter().enumerate() {
            let got = eval(f, &[x], i % 2 == 0);
            let w = want(f64::from(x)) as f32;
            let d = ulps(got, w);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= max_ulps, "{}: {} ulp at {:e} (bits {:#x})", f.name, worst.0, worst.1, worst.1.to_bits());
    }

    #[test]
    fn exp_and_exp2_within_one_ulp() {
        check_unary(exp(), f64::exp, 1);
        check_unary(exp2(), f64::exp2, 1);
    }

    #[test]
    fn logs_within_one_ulp() {
        check_unary(log(), f64::ln, 1);
        check_unary(log2(), f64::log2, 1);
    }

    #[test]
    fn sin_and_cos_within_two_ulp_at_any_argument() {
        check_unary(sin(), f64::sin, 2);
        check_unary(cos(), f64::cos, 2);
    }

    #[test]
    fn tanh_and_logistic_within_two_ulp() {
        check_unary(tanh(), f64::tanh, 2);
        check_unary(logistic(), |x| 1.0 / (1.0 + (-x).exp()), 2);
    }

    #[test]
    fn fmod_is_exact() {
        let f = fmod();
        let xs = sample();
        for (i, &x) in xs.iter().enumerate().take(50_000) {
            let y = xs[(i * 7919 + 13) % xs.len()];
            let got = eval(f, &[x, y], i % 2 == 0);
            let want = (f64::from(x) % f64::from(y)) as f32;
            assert_eq!(ulps(got, want), 0, "fmod({x:e}, {y:e}) = {got:e}, want {want:e}");
            assert!(got.is_nan() || got.to_bits() >> 31 == want.to_bits() >> 31, "sign of fmod({x:e}, {y:e})");
        }
    }

    #[test]
    fn pow_follows_c() {
        // 2 ulp while |y log2 x| <= 16, and beyond.
        let f = pow();
        let xs = sample();
        let mut worst = [(0, 0.0f32, 0.0f32); 2];
        for (i, &x) in xs.iter().enumerate().take(150_000) {
            // Any bits; small integers; and exponents that take the result anywhere from the
            // subnormals to the overflow (|y log2 x| up to 150).
            let t = (i % 3000) as f64 / 10.0 - 150.0;
            let y = match i % 3 {
                0 => xs[(i * 7919 + 13) % xs.len()],
                1 => (i % 41) as f32 - 20.0,
                _ => (t / f64::from(x).abs().log2()) as f32,
            };
            let got = eval(f, &[x, y], i % 4 < 2);
            let want = f64::from(x).powf(f64::from(y));
            let far = usize::from((f64::from(y) * f64::from(x).abs().log2()).abs() > 16.0);
            let d = ulps(got, want as f32);
            if d > worst[far].0 {
                worst[far] = (d, x, y);
            }
        }
        assert!(worst[0].0 <= 2, "pow: {} ulp at ({:e}, {:e})", worst[0].0, worst[0].1, worst[0].2);
        assert!(worst[1].0 <= 2, "pow: {} ulp at ({:e}, {:e})", worst[1].0, worst[1].1, worst[1].2);
    }
}
