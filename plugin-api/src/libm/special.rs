//! The special functions of issue 36: `expm1`, `log1p`, `erf`, `erf_inv`, `atan2`, and from them
//! `atan`, `asin`, `acos`, `sinh` and `cosh`, written as the others are (mod.rs says how), each
//! checked against `f64` on the CPU by the tests in mod.rs.

use super::builder::Builder;
use super::pieces::{exp_of, log_of};
use super::{Op, Ty, Var};

/// `erf(x) / x = P(x^2)` for `|x| < 0.5`, highest degree first (a least-squares fit).
const ERF_SMALL: [u32; 8] = [0xb7620101, 0x38fbb13f, 0xba600ff1, 0x3bab2dcf, 0xbcdc1671, 0x3de71791, 0xbec093a3, 0x3f906ebb];
/// `erf` on `[0.5 k, 0.5 (k + 1))` for k = 1..=7 (the last to 3.92): the centre `c` and `P(x - c)`,
/// highest degree first (least-squares fits of degree 11).
const ERF_PIECES: [(u32, [u32; 12]); 7] = [
    (0x3f400000, [0x3a1f6f5c, 0x392fb496, 0xbb81fd71, 0x3b16edf9, 0x3c970563, 0xbcdc23d0, 0xbd5a150c, 0x3e1a4daf, 0x3cdb742d, 0xbef6e2b2, 0x3f249721, 0x3f360e4c]),
    (0x3fa00000, [0xb9a4188f, 0x3a4d839b, 0x3a65d813, 0xbbbaae3c, 0x3b6da272, 0x3cae7ff7, 0xbd4140e7, 0xbbc9d4d3, 0x3e2b8e81, 0xbe975f9f, 0x3e723298, 0x3f6c432f]),
    (0x3fe00000, [0xb7230de3, 0xb9e1bde3, 0x3a6a8132, 0x3a3f2a23, 0xbbc6889f, 0x3c12d9d8, 0x3bd9112d, 0xbd4506d3, 0x3db8a462, 0xbdbd2545, 0x3d582a98, 0x3f7c9684]),
    (0x40100000, [0x3885e2ba, 0xb781d840, 0xb9c19030, 0x3a830a83, 0xba2fc23d, 0xbb3e572b, 0x3c2e9d8c, 0xbc9c54c2, 0x3cb1f7b1, 0xbc83a5b0, 0x3bea0a1d, 0x3f7fa024]),
    (0x40300000, [0xb78808cb, 0x38654160, 0xb8951712, 0xb8ba9905, 0x3a295a64, 0xbad93abc, 0x3b349acc, 0xbb558613, 0x3b34e7a3, 0xbad3528d, 0x3a19b066, 0x3f7ff968]),
    (0x40500000, [0xb68fdec9, 0xb603302e, 0x37db4d05, 0xb8ab4595, 0x39323c0a, 0xb98a2a2d, 0x39a48533, 0xb9963eaf, 0x394d5245, 0xb8c6f1e7, 0x37f4daf4, 0x3f7fffb8]),
    (0x406d70a4, [0xb601b407, 0xb60ac317, 0x36ff59f2, 0xb7648d52, 0x37a95794, 0xb7cc566c, 0x37c5da07, 0xb7972245, 0x37303bc9, 0xb693e0ff, 0x359f702b, 0x3f7ffffd]),
];

/// `e^x - 1` without the cancellation of `exp(x) - 1` near 0: the Taylor series to `x^11` where
/// `|x| < 1` (its next term is below 2^-28 of the result), `exp(x) - 1` elsewhere (where `e^x` is
/// at least `e` or at most `1/e`, so the subtraction costs about an ulp).
pub(super) fn expm1_of(b: &mut Builder, x: Var) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    // 1/n! for n = 11 down to 2.
    let mut q = b.f(1.0 / 39_916_800.0);
    for n in (2..=10).rev() {
        let c = b.f((1..=n).map(|k| k as f32).product::<f32>().recip());
        q = b.fma(q, x, c);
    }
    let z = b.mul(x, x);
    let small = b.fma(z, q, x);
    let e = exp_of(b, x);
    let one = b.f(1.0);
    let large = b.sub(e, one);
    let near = b.op(Ty::Bool, Op::Lt(ax, one));
    let y = b.op(Ty::F32, Op::Select(near, small, large));
    b.nan_passes(x, y)
}

/// `ln(1 + x)` without the rounding of `1 + x`: Kahan's `log(u) x / (u - 1)` with `u = 1 + x`
/// rounded (exact where `u` is 1: then `x`), and `log(u)` where `x` is so large that `u - 1` is
/// `x` anyway (and `u` may be infinite).
pub(super) fn log1p_of(b: &mut Builder, x: Var) -> Var {
    let one = b.f(1.0);
    let u = b.add(one, x);
    let lu = log_of(b, u);
    let d = b.sub(u, one);
    let r = b.op(Ty::F32, Op::Div(x, d));
    let y = b.mul(lu, r);
    let exact = b.op(Ty::Bool, Op::Eq(u, one));
    let y = b.op(Ty::F32, Op::Select(exact, x, y));
    let big = b.f(16_777_216.0);
    let large = b.op(Ty::Bool, Op::Lt(big, x));
    let y = b.op(Ty::F32, Op::Select(large, lu, y));
    b.nan_passes(x, y)
}

/// The error function: `x P(x^2)` below 0.5, a polynomial in `|x| - c` on each half-unit piece
/// up to 3.92 (the coefficients chosen by the piece, so that no branch diverges), and 1 from
/// there (where `erf` rounds to 1 in `f32`); odd.
pub(super) fn erf_of(b: &mut Builder, x: Var) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    // Near 0.
    let z = b.mul(ax, ax);
    let p = horner(b, &ERF_SMALL, z);
    let small = b.mul(ax, p);
    // The piece: k = floor(2 |x|), 1..=7 (NaN and large arguments clamped; selected away below).
    let a = b.clamp(ax, 0.5, 3.75);
    let twice = b.add(a, a);
    let k = b.op(Ty::F32, Op::Trunc(twice));
    let mut centre = b.f(f32::from_bits(ERF_PIECES[0].0));
    let mut coef: Vec<Var> = ERF_PIECES[0].1.iter().map(|&c| b.f(f32::from_bits(c))).collect();
    for (i, (c, cs)) in ERF_PIECES.iter().enumerate().skip(1) {
        let ki = b.f((i + 1) as f32);
        let here = b.op(Ty::Bool, Op::Eq(k, ki));
        let cv = b.f(f32::from_bits(*c));
        centre = b.op(Ty::F32, Op::Select(here, cv, centre));
        for (slot, &c) in coef.iter_mut().zip(cs) {
            let cv = b.f(f32::from_bits(c));
            *slot = b.op(Ty::F32, Op::Select(here, cv, *slot));
        }
    }
    let t = b.sub(ax, centre);
    let mut q = coef[0];
    for &c in &coef[1..] {
        q = b.fma(q, t, c);
    }
    let lo = b.f(0.5);
    let below = b.op(Ty::Bool, Op::Lt(ax, lo));
    let y = b.op(Ty::F32, Op::Select(below, small, q));
    let edge = b.f(3.92);
    let inside = b.op(Ty::Bool, Op::Lt(ax, edge));
    let one = b.f(1.0);
    let y = b.op(Ty::F32, Op::Select(inside, y, one));
    let y = b.copy_sign(y, x);
    b.nan_passes(x, y)
}

/// `(atan(u) - u) / u^3 = P(u^2)` for `|u| <= tan(pi/8)`, highest degree first (a least-squares fit).
const ATAN_POLY: [u32; 8] = [0x3d0c226b, 0xbd79f04c, 0x3d9c1b5b, 0xbdba15cb, 0x3de38d61, 0xbe124923, 0x3e4ccccd, 0xbeaaaaab];
/// `erf_inv(x) / x = P(w - 2.5)` where `w = -ln((1 - x)(1 + x)) < 5`, highest degree first.
const ERFINV_CENTRAL: [u32; 11] = [0x2f363290, 0xb21bda67, 0x32aecda8, 0x34fc303a, 0xb66734fa, 0xb6a709d7, 0x3964e7de, 0xbaa4324e, 0xbb88e227, 0x3e7c8f45, 0x3fc02e2f];
/// `erf_inv(x) / x = P(sqrt(w) - 3)` where `w >= 5`, highest degree first.
const ERFINV_TAIL: [u32; 9] = [0xb92bcb3a, 0x386c6da4, 0x3aacd2d0, 0xbb6ddb38, 0x3bbc4ce1, 0xbbfa2e04, 0x3c1aa3fe, 0x3f8036e3, 0x40354f7e];

/// `c[0] t^n + ... + c[n]` by Horner's rule, the coefficients as `f32` bits.
fn horner(b: &mut Builder, coef: &[u32], t: Var) -> Var {
    let mut q = b.f(f32::from_bits(coef[0]));
    for &c in &coef[1..] {
        let c = b.f(f32::from_bits(c));
        q = b.fma(q, t, c);
    }
    q
}

/// `a + b` for `a` given as the two floats `hi + lo`.
fn plus_two(b: &mut Builder, hi: f64, x: Var) -> Var {
    let h = hi as f32;
    let l = (hi - f64::from(h)) as f32;
    let (h, l) = (b.f(h), b.f(l));
    let t = b.add(l, x);
    b.add(h, t)
}

/// `atan2(y, x)`, C's: the angle of `(x, y)`, with C's signed zeros and infinities. The ratio
/// of the smaller magnitude to the larger is brought to `|u| <= tan(pi/8)` (`(t - 1) / (t + 1)`
/// and `pi/4` above it), then `u + u^3 P(u^2)`, and the octant restored with `pi/2 - a` and
/// `pi - a` (the constants in two floats).
pub(super) fn atan2_of(b: &mut Builder, y: Var, x: Var) -> Var {
    let (ax, ay) = (b.op(Ty::F32, Op::Abs(x)), b.op(Ty::F32, Op::Abs(y)));
    let steep = b.op(Ty::Bool, Op::Lt(ax, ay));
    let mn = b.op(Ty::F32, Op::Select(steep, ax, ay));
    let mx = b.op(Ty::F32, Op::Select(steep, ay, ax));
    let t = b.op(Ty::F32, Op::Div(mn, mx));
    // 0/0 (both zero) gives 0; inf/inf (both infinite) gives 1.
    let zero = b.f(0.0);
    let one = b.f(1.0);
    let both_zero = b.op(Ty::Bool, Op::Eq(mx, zero));
    let t = b.op(Ty::F32, Op::Select(both_zero, zero, t));
    let inf = b.f(f32::INFINITY);
    let mn_inf = b.op(Ty::Bool, Op::Eq(mn, inf));
    let t = b.op(Ty::F32, Op::Select(mn_inf, one, t));
    let limit = b.f(std::f32::consts::SQRT_2 - 1.0);
    let high = b.op(Ty::Bool, Op::Lt(limit, t));
    let tm = b.sub(t, one);
    let tp = b.add(t, one);
    let reduced = b.op(Ty::F32, Op::Div(tm, tp));
    let u = b.op(Ty::F32, Op::Select(high, reduced, t));
    let z = b.mul(u, u);
    let p = horner(b, &ATAN_POLY, z);
    let u3 = b.mul(u, z);
    let at = b.fma(u3, p, u);
    let quarter = plus_two(b, std::f64::consts::FRAC_PI_4, at);
    let a = b.op(Ty::F32, Op::Select(high, quarter, at));
    let na = b.op(Ty::F32, Op::Neg(a));
    let half = plus_two(b, std::f64::consts::FRAC_PI_2, na);
    let a = b.op(Ty::F32, Op::Select(steep, half, a));
    // x negative, -0 included: pi - a.
    let bx = b.bits(x);
    let sign = b.u(0x8000_0000);
    let sx = b.and(bx, sign);
    let nz = b.u(0);
    let x_pos = b.op(Ty::Bool, Op::Eq(sx, nz));
    let na = b.op(Ty::F32, Op::Neg(a));
    let back = plus_two(b, std::f64::consts::PI, na);
    let a = b.op(Ty::F32, Op::Select(x_pos, a, back));
    let a = b.copy_sign(a, y);
    let a = b.nan_passes(x, a);
    b.nan_passes(y, a)
}

/// The inverse error function on `[-1, 1]` (infinite at the ends, NaN beyond): `x P(w)` with
/// `w = -ln((1 - x)(1 + x))`, a polynomial in `w - 2.5` below 5 and in `sqrt(w) - 3` above
/// (least-squares fits against `f64`).
pub(super) fn erf_inv_of(b: &mut Builder, x: Var) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    let one = b.f(1.0);
    let prod = one_minus_square(b, x);
    let l = log_of(b, prod);
    let w = b.op(Ty::F32, Op::Neg(l));
    let c = b.f(2.5);
    let wc = b.sub(w, c);
    let central = horner(b, &ERFINV_CENTRAL, wc);
    let sw = sqrt_of(b, w);
    let three = b.f(3.0);
    let st = b.sub(sw, three);
    let tail = horner(b, &ERFINV_TAIL, st);
    let five = b.f(5.0);
    let near = b.op(Ty::Bool, Op::Lt(w, five));
    let p = b.op(Ty::F32, Op::Select(near, central, tail));
    let y = b.mul(p, x);
    // The ends: +-inf at +-1, NaN outside.
    let inf = b.f(f32::INFINITY);
    let end = b.op(Ty::Bool, Op::Eq(ax, one));
    let signed_inf = b.copy_sign(inf, x);
    let y = b.op(Ty::F32, Op::Select(end, signed_inf, y));
    let outside = b.op(Ty::Bool, Op::Lt(one, ax));
    let nan = b.f(f32::NAN);
    let y = b.op(Ty::F32, Op::Select(outside, nan, y));
    b.nan_passes(x, y)
}

/// `sqrt(w)` for a positive normal `w`, to about an ulp, from the operations every target rounds
/// exactly: the reciprocal square root from its classic bit-level guess and three Newton steps,
/// then `w / sqrt(w)` corrected once.
fn sqrt_of(b: &mut Builder, w: Var) -> Var {
    let bits = b.bits(w);
    let one = b.u(1);
    let half_bits = b.op(Ty::U32, Op::Shr(bits, one));
    let magic = b.u(0x5f37_59df);
    let guess = b.op(Ty::U32, Op::Sub(magic, half_bits));
    let mut r = b.op(Ty::F32, Op::Bits(guess));
    let (half, three_halves) = (b.f(0.5), b.f(1.5));
    let hw = b.mul(half, w);
    for _ in 0..3 {
        let rr = b.mul(r, r);
        let nt = b.op(Ty::F32, Op::Neg(hw));
        let step = b.fma(nt, rr, three_halves);
        r = b.mul(r, step);
    }
    let s = b.mul(w, r);
    let ns = b.op(Ty::F32, Op::Neg(s));
    let e = b.fma(ns, s, w);
    let hr = b.mul(half, r);
    b.fma(e, hr, s)
}

/// `atan(x)`: `atan2(x, 1)`.
pub(super) fn atan_of(b: &mut Builder, x: Var) -> Var {
    let one = b.f(1.0);
    atan2_of(b, x, one)
}

/// `1 - x^2` as `(1 - |x|)(1 + |x|)`: each factor exact where `|x|` is near 1 (Sterbenz), so the
/// product is rounded once.
fn one_minus_square(b: &mut Builder, x: Var) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    let one = b.f(1.0);
    let lo = b.sub(one, ax);
    let hi = b.add(one, ax);
    b.mul(lo, hi)
}

/// `sqrt(1 - x^2)`, the other side of the unit triangle; garbage beyond 1 (the callers select
/// NaN there).
fn cathetus(b: &mut Builder, x: Var) -> Var {
    let w = one_minus_square(b, x);
    let s = sqrt_of(b, w);
    // At |x| = 1 the product is 0, which `sqrt_of` (for positive normals) does not take.
    let zero = b.f(0.0);
    let end = b.op(Ty::Bool, Op::Eq(w, zero));
    b.op(Ty::F32, Op::Select(end, zero, s))
}

/// NaN where `|x| > 1` (outside the domain of `asin` and `acos`), else `y`.
fn unit_domain(b: &mut Builder, x: Var, y: Var) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    let one = b.f(1.0);
    let outside = b.op(Ty::Bool, Op::Lt(one, ax));
    let nan = b.f(f32::NAN);
    let y = b.op(Ty::F32, Op::Select(outside, nan, y));
    b.nan_passes(x, y)
}

/// `asin(x) = atan2(x, sqrt(1 - x^2))`.
pub(super) fn asin_of(b: &mut Builder, x: Var) -> Var {
    let c = cathetus(b, x);
    let y = atan2_of(b, x, c);
    unit_domain(b, x, y)
}

/// `acos(x) = atan2(sqrt(1 - x^2), x)`.
pub(super) fn acos_of(b: &mut Builder, x: Var) -> Var {
    let c = cathetus(b, x);
    let y = atan2_of(b, c, x);
    unit_domain(b, x, y)
}

/// `sinh` or `cosh` of `x` from `e^|x|`: below 1 (sinh only) `(e + e / (e + 1)) / 2` with
/// `e = expm1(|x|)`, free of the cancellation of `e^x - e^-x`; up to 88 `(h -+ 1/h) / 2` with
/// `h = e^|x|`; beyond, where `e^|x|` overflows before the result does, `(h/2) h` with
/// `h = e^(|x|/2)`. `sinh` takes the sign of `x`.
fn hyperbolic(b: &mut Builder, x: Var, cosh: bool) -> Var {
    let ax = b.op(Ty::F32, Op::Abs(x));
    let (half, one) = (b.f(0.5), b.f(1.0));
    let h = exp_of(b, ax);
    let r = b.op(Ty::F32, Op::Div(one, h));
    let mid = if cosh { b.add(h, r) } else { b.sub(h, r) };
    let mid = b.mul(mid, half);
    let ah = b.mul(ax, half);
    let hh = exp_of(b, ah);
    let hh2 = b.mul(hh, half);
    let far = b.mul(hh2, hh);
    let limit = b.f(88.0);
    let beyond = b.op(Ty::Bool, Op::Lt(limit, ax));
    let mut y = b.op(Ty::F32, Op::Select(beyond, far, mid));
    if !cosh {
        let e = expm1_of(b, ax);
        let e1 = b.add(e, one);
        let q = b.op(Ty::F32, Op::Div(e, e1));
        let s = b.add(e, q);
        let small = b.mul(s, half);
        let near = b.op(Ty::Bool, Op::Lt(ax, one));
        y = b.op(Ty::F32, Op::Select(near, small, y));
        y = b.copy_sign(y, x);
    }
    b.nan_passes(x, y)
}

/// Hyperbolic sine.
pub(super) fn sinh_of(b: &mut Builder, x: Var) -> Var {
    hyperbolic(b, x, false)
}

/// Hyperbolic cosine.
pub(super) fn cosh_of(b: &mut Builder, x: Var) -> Var {
    hyperbolic(b, x, true)
}
