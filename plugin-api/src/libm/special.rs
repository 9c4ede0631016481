//! The special functions of issue 36: `expm1`, `log1p` and `erf`, written as the others are
//! (mod.rs says how), each checked against `f64` on the CPU by the tests in mod.rs.

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
    let mut p = b.f(f32::from_bits(ERF_SMALL[0]));
    for &c in &ERF_SMALL[1..] {
        let c = b.f(f32::from_bits(c));
        p = b.fma(p, z, c);
    }
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
