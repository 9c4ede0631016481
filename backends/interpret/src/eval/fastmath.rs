//! `exp` over whole blocks, as fast as a vector loop and bit for bit what `(x as f64).exp() as
//! f32` gives (the interpreter's definition, docs/language.md §8).
//!
//! Each element is computed in `f64` by a polynomial the compiler vectorises (no call per
//! element), accurate to about 2^7 ulps of `f64`. Rounding that to `f32` gives the same bits as
//! rounding libm's `f64` result unless the two `f64` values straddle an `f32` rounding boundary,
//! which needs the `f64` value within a few hundred `f64` ulps of a halfway point. Those elements — and
//! every argument outside the range where the result is a normal `f32` — are recomputed with libm,
//! so the result never differs from the libm definition; `tests` checks that on millions of values.

/// `log2(e)`.
const LOG2_E: f64 = std::f64::consts::LOG2_E;
use super::{Put, Sink};

/// `ln 2` in two parts: the first has 32 trailing zero bits, so `n * LN2_HI` is exact.
const LN2_HI: f64 = 0.693_147_180_369_123_8;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// The arguments whose `f32` result is a normal number: below, it is subnormal or 0; above,
/// infinite. Outside them libm decides.
const LO: f32 = -87.0;
const HI: f32 = 88.5;
/// How near (in units of the last place of `f64`) to an `f32` halfway point an element must be
/// for libm to recompute it: well above the polynomial's and libm's combined error.
const MARGIN: u64 = 1 << 10;

/// `e^r` on `|r| <= 0.3468` (`ln 2 / 2` and a little: the reduction rounds `n` from a rounded
/// product) as a polynomial of degree 9, lowest power first: the Chebyshev interpolant at 10
/// nodes of that interval, in monomial form (computed once, with numpy's `chebfit` and
/// `cheb2poly`). Its error, below `2^-45` relative (about 2^7 ulps of `f64`, where Taylor's
/// series needs degree 10 for `2^-41`), is far inside [`MARGIN`]; a test measures it.
const POLY: [f64; 10] = [
    1.000_000_000_000_013_3,
    1.000_000_000_000_002,
    0.499_999_999_994_376_4,
    0.166_666_666_666_212_8,
    0.041_666_667_041_258_25,
    0.008_333_333_363_594_365,
    0.001_388_880_162_645_614_7,
    0.000_198_411_958_532_002_86,
    2.488_452_152_728_676_4e-5,
    2.763_049_249_619_744_7e-6,
];
/// `1.5 * 2^52`: adding it rounds an `f64` of magnitude below `2^51` to an integer, which its
/// low mantissa bits then hold (the way to round without a libm call on every x86-64).
const ROUNDER: f64 = 6_755_399_441_055_744.0;

/// `e^x` in `f64` for `x` in `[LO, HI]`: `2^n e^r` with `|r| <= ln 2 / 2`, and `e^r` by
/// [`POLY`] in Horner form, each step one fused multiply-add where the vector unit has them
/// (`FMA`; a multiply and an add where it has not), as are the reduction's products. Straight-
/// line code over `f64` and `u64`, so a loop of it vectorises; inlined into each compiled
/// version of its caller, so that it takes that version's instructions.
#[inline(always)]
fn exp_f64<const FMA: bool>(x: f64) -> f64 {
    let madd = |a: f64, b: f64, c: f64| if FMA { a.mul_add(b, c) } else { a * b + c };
    let t = madd(x, LOG2_E, ROUNDER);
    let n = t - ROUNDER;
    // n * LN2_HI is exact (n has at most 11 bits), so x - n * LN2_HI is too, fused or not.
    let r = madd(-n, LN2_LO, madd(-n, LN2_HI, x));
    let mut p = POLY[POLY.len() - 1];
    for &c in POLY[..POLY.len() - 1].iter().rev() {
        p = madd(p, r, c);
    }
    // n (|n| < 1023) is the low bits of t's mantissa; 2^n is built from its exponent bits.
    let n_bits = t.to_bits().wrapping_sub(ROUNDER.to_bits());
    p * f64::from_bits(n_bits.wrapping_add(1023) << 52)
}

/// Whether rounding `y` to `f32` could differ from rounding a value a few ulps away.
fn near_halfway(y: f64) -> bool {
    // The 29 mantissa bits that f32 drops: halfway is 1 << 28. (Values near an f32 itself,
    // low bits near 0, round to it from either side: rounding is monotonic.)
    let low = y.to_bits() & ((1 << 29) - 1);
    low.abs_diff(1 << 28) <= MARGIN
}

/// Whether libm must recompute `exp(x)`, whose polynomial value is `w`.
fn needs_libm(x: f32, w: f64) -> bool {
    // NaN fails both comparisons.
    !(x > LO && x < HI) || near_halfway(w)
}

/// `w[i] = e^x[i]` by the polynomial and `out[i]` that rounded; whether any element needs libm. Compiled for the vector
/// units the CPU has (AVX-512, AVX2 with FMA, NEON), chosen when first called; the
/// polynomial's exact bits may differ between them, never the rounded result.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn polynomial<S: Put<f32>>(x: &[f32], w: &mut [f64], out: &mut [S]) -> bool {
    // A constant in each compiled version: whether its vector unit fuses multiply-adds (else
    // `mul_add` would be a libm call per element).
    let fma = const { multiversion::target::selected_target!().supports_feature_str("fma") || cfg!(target_arch = "aarch64") };
    if fma { fill::<true, S>(x, w, out) } else { fill::<false, S>(x, w, out) }
}

/// `w[i] = e^x[i]` by the polynomial and `out[i]` that rounded, in the caller's instructions;
/// whether any element needs libm, found in the same pass (a second pass over `w` cost a third
/// of the time again).
#[inline(always)]
fn fill<const FMA: bool, S: Put<f32>>(x: &[f32], w: &mut [f64], out: &mut [S]) -> bool {
    let mut any = false;
    for ((w, o), &x) in w.iter_mut().zip(out.iter_mut()).zip(x) {
        *w = exp_f64::<FMA>(f64::from(x.clamp(LO, HI)));
        *o = S::put(*w as f32);
        any |= needs_libm(x, *w);
    }
    any
}

/// `e^x` of every element, rounded to `f32` from `f64`.
pub(crate) fn exp(v: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len());
    out.fill(v.len(), |slots| exp_into(v, slots));
    out
}

/// [`exp`] of `v` into `out` (of its length), every slot written.
fn exp_into<S: Put<f32>>(v: &[f32], out: &mut [S]) {
    let mut wide = [0.0f64; 256];
    for (chunk, out) in v.chunks(wide.len()).zip(out.chunks_mut(wide.len())) {
        let wide = &mut wide[..chunk.len()];
        if polynomial(chunk, wide, out) {
            for ((o, &x), &w) in out.iter_mut().zip(chunk).zip(wide.iter()) {
                if needs_libm(x, w) {
                    *o = S::put(f64::from(x).exp() as f32);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libm(x: f32) -> f32 {
        f64::from(x).exp() as f32
    }

    #[test]
    fn exp_is_libm_rounded_bit_for_bit() {
        // Every 97th f32 bit pattern (about 44 million values: every sign, exponent and a
        // spread of mantissas), and the edges of the fast range.
        let mut xs: Vec<f32> = (0..u32::MAX / 97).map(|i| f32::from_bits(i.wrapping_mul(97))).collect();
        xs.extend([LO, HI, -LO, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.72, -103.9, 1e-30]);
        for chunk in xs.chunks(1 << 16) {
            for (&x, y) in chunk.iter().zip(exp(chunk)) {
                let want = libm(x);
                assert!(y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()), "exp({x:e}) = {y:e}, libm {want:e}");
            }
        }
    }

    #[test]
    fn the_polynomial_alone_is_within_a_few_f64_ulps() {
        // The fast path's error bound, which MARGIN must exceed, with and without fused
        // multiply-adds: the interpolant's own (2^7 ulps) and the rounding of its evaluation.
        let mut worst = 0u64;
        for i in 0..200_000 {
            let x = f64::from(LO + (HI - LO) * (i as f32 / 200_000.0));
            for a in [exp_f64::<false>(x), exp_f64::<true>(x)] {
                worst = worst.max(a.to_bits().abs_diff(x.exp().to_bits()));
            }
        }
        assert!(worst <= 1 << 8, "{worst} ulps");
        const { assert!(1 << 8 <= MARGIN / 4) };
    }
}
