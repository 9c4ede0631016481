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
//!
//! The files: this one holds the program form ([`Func`] and its parts), the functions and their
//! tests (each run on the CPU); the pieces the functions share (range reductions, polynomials,
//! exponent scaling) are `pieces.rs`, the builder they are written with `builder.rs`.

mod builder;
mod pieces;
mod special;

use std::sync::OnceLock;

use builder::Builder;
use pieces::{exp_of, exp2_split, log_of, log_specials, log2_split, log2_wide, significand, sin_cos};

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
        Builder::func("tk_log", 1, |b, p| log_of(b, p[0]))
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

/// `e^x - 1`, accurate near 0.
pub fn expm1() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_expm1", 1, |b, p| special::expm1_of(b, p[0])))
}

/// `ln(1 + x)`, accurate near 0.
pub fn log1p() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_log1p", 1, |b, p| special::log1p_of(b, p[0])))
}

/// The error function.
pub fn erf() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_erf", 1, |b, p| special::erf_of(b, p[0])))
}

/// The inverse error function.
pub fn erf_inv() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_erf_inv", 1, |b, p| special::erf_inv_of(b, p[0])))
}

/// C's `atan2(y, x)`.
pub fn atan2() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_atan2", 2, |b, p| special::atan2_of(b, p[0], p[1])))
}

/// Arc tangent.
pub fn atan() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_atan", 1, |b, p| special::atan_of(b, p[0])))
}

/// Arc sine, on `[-1, 1]`.
pub fn asin() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_asin", 1, |b, p| special::asin_of(b, p[0])))
}

/// Arc cosine, on `[-1, 1]`.
pub fn acos() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_acos", 1, |b, p| special::acos_of(b, p[0])))
}

/// Hyperbolic sine.
pub fn sinh() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_sinh", 1, |b, p| special::sinh_of(b, p[0])))
}

/// Hyperbolic cosine.
pub fn cosh() -> &'static Func {
    static F: OnceLock<Func> = OnceLock::new();
    F.get_or_init(|| Builder::func("tk_cosh", 1, |b, p| special::cosh_of(b, p[0])))
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
    fn expm1_log1p_and_erf_within_two_ulp() {
        check_unary(expm1(), f64::exp_m1, 2);
        check_unary(log1p(), f64::ln_1p, 2);
        check_unary(erf(), libm::erf, 2);
        // And densely where each changes method: every 2^-16 across the pieces and the joins.
        let dense = |lo: f32, hi: f32| (0..).map(move |i| lo + i as f32 / 65_536.0).take_while(move |&x| x <= hi);
        for (f, want, (lo, hi)) in [
            (expm1(), f64::exp_m1 as fn(f64) -> f64, (-2.0, 2.0)),
            (log1p(), f64::ln_1p, (-0.999, 2.0)),
            (erf(), libm::erf, (-4.5, 4.5)),
        ] {
            for (i, x) in dense(lo, hi).enumerate() {
                let (got, w) = (eval(f, &[x], i % 2 == 0), want(f64::from(x)) as f32);
                assert!(ulps(got, w) <= 2, "{}({x:e}) = {got:e}, want {w:e}", f.name);
            }
        }
    }

    /// `erf_inv` in `f64`: Newton's steps on `libm::erf` from a rough start.
    fn erf_inv_ref(x: f64) -> f64 {
        if x.is_nan() || x.abs() > 1.0 {
            return f64::NAN;
        }
        if x.abs() == 1.0 {
            return f64::INFINITY.copysign(x);
        }
        let l = (1.0 - x * x).ln();
        let t = 2.0 / (std::f64::consts::PI * 0.147) + l / 2.0;
        let mut y = ((t * t - l / 0.147).sqrt() - t).sqrt().copysign(x);
        for _ in 0..100 {
            let e = libm::erf(y) - x;
            if e == 0.0 {
                break;
            }
            let step = e / (2.0 / std::f64::consts::PI.sqrt() * (-y * y).exp());
            if !step.is_finite() {
                break;
            }
            y -= step;
        }
        y
    }

    #[test]
    fn erf_inv_within_three_ulp_and_atan2_within_two() {
        check_unary(erf_inv(), erf_inv_ref, 3);
        // Every 10^-6 across the domain, and the last 4096 floats below 1.
        let ends = (1..=4096u32).map(|k| f32::from_bits(1.0f32.to_bits() - k));
        let dense = (0..=2_000_000).map(|i| -1.0 + i as f32 / 1_000_000.0).chain(ends);
        let mut worst = (0, 0.0f32);
        for (i, x) in dense.enumerate() {
            let d = ulps(eval(erf_inv(), &[x], i % 2 == 0), erf_inv_ref(f64::from(x)) as f32);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 3, "erf_inv: {} ulp at {:e}", worst.0, worst.1);
        let xs = sample();
        let mut worst = (0, 0.0f32, 0.0f32);
        for (i, &y) in xs.iter().enumerate() {
            let x = xs[(i * 7919 + 13) % xs.len()];
            let got = eval(atan2(), &[y, x], i % 2 == 0);
            let want = f64::from(y).atan2(f64::from(x)) as f32;
            let d = ulps(got, want);
            assert!(got.is_nan() || got.to_bits() >> 31 == want.to_bits() >> 31, "sign of atan2({y:e}, {x:e})");
            if d > worst.0 {
                worst = (d, y, x);
            }
        }
        assert!(worst.0 <= 2, "atan2: {} ulp at ({:e}, {:e})", worst.0, worst.1, worst.2);
        // C's special cases.
        let (inf, pi) = (f32::INFINITY, std::f32::consts::PI);
        for (y, x, want) in [(0.0, -0.0, pi), (-0.0, -0.0, -pi), (0.0, 0.0, 0.0), (-0.0, 1.0, -0.0), (1.0, 0.0, pi / 2.0), (inf, inf, pi / 4.0), (inf, -inf, 3.0 * pi / 4.0), (-inf, -inf, -3.0 * pi / 4.0), (1.0, -inf, pi), (-1.0, inf, -0.0)] {
            let got = eval(atan2(), &[y, x], true);
            assert!(ulps(got, want) <= 1 && got.to_bits() >> 31 == want.to_bits() >> 31, "atan2({y}, {x}) = {got}, want {want}");
        }
    }

    #[test]
    fn inverse_trigonometric_and_hyperbolic_functions_within_three_ulp() {
        check_unary(atan(), f64::atan, 2);
        check_unary(asin(), f64::asin, 3);
        check_unary(acos(), f64::acos, 3);
        check_unary(sinh(), f64::sinh, 2);
        check_unary(cosh(), f64::cosh, 2);
        // Densely across the domains and where the methods change (1 and 88 for sinh, cosh).
        let dense = |lo: f32, hi: f32, step: f32| (0..).map(move |i| lo + i as f32 * step).take_while(move |&x| x <= hi);
        for (f, want, (lo, hi, step)) in [
            (asin(), f64::asin as fn(f64) -> f64, (-1.0, 1.0, 1.0 / 65_536.0)),
            (acos(), f64::acos, (-1.0, 1.0, 1.0 / 65_536.0)),
            (sinh(), f64::sinh, (-90.0, 90.0, 1.0 / 1024.0)),
            (cosh(), f64::cosh, (-90.0, 90.0, 1.0 / 1024.0)),
        ] {
            for (i, x) in dense(lo, hi, step).enumerate() {
                let (got, w) = (eval(f, &[x], i % 2 == 0), want(f64::from(x)) as f32);
                assert!(ulps(got, w) <= 3, "{}({x:e}) = {got:e}, want {w:e}", f.name);
            }
        }
        // The last floats below 1 and the ends.
        for k in 0..4096u32 {
            let x = f32::from_bits(1.0f32.to_bits() - k);
            for (f, want) in [(asin(), f64::asin as fn(f64) -> f64), (acos(), f64::acos)] {
                for x in [x, -x] {
                    let (got, w) = (eval(f, &[x], k % 2 == 0), want(f64::from(x)) as f32);
                    assert!(ulps(got, w) <= 3, "{}({x:e}) = {got:e}, want {w:e}", f.name);
                }
            }
        }
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
