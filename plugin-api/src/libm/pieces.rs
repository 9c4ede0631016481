//! The pieces the functions share: `e^x` from a reduced argument, the reductions and polynomials
//! of the logarithms, the sine and cosine with their range reduction (Cody–Waite for small
//! arguments, Payne–Hanek for large ones), and scaling by powers of two.

use super::builder::Builder;
use super::{Op, Ty, Var};

/// Natural logarithm of any `x` (fdlibm's reduction and order), with C's special cases.
pub(super) fn log_of(b: &mut Builder, x: Var) -> Var {
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
}

/// `e^x` for any `x`, NaN passing through.
pub(super) fn exp_of(b: &mut Builder, x: Var) -> Var {
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
pub(super) fn exp2_split(b: &mut Builder, f: Var, lo: Var, k: Var) -> Var {
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
pub(super) struct LogParts {
    pub(super) k: Var,
    pub(super) f: Var,
    pub(super) s: Var,
    pub(super) hfsq: Var,
    pub(super) poly: Var,
}

pub(super) fn log_reduce(b: &mut Builder, x: Var) -> LogParts {
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
pub(super) fn log2_split(b: &mut Builder, x: Var) -> (Var, Var) {
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
pub(super) fn log2_wide(b: &mut Builder, x: Var) -> (Var, Var) {
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
pub(super) fn log_specials(b: &mut Builder, x: Var, y: Var) -> Var {
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
pub(super) fn significand(b: &mut Builder, a: Var) -> (Var, Var) {
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
pub(super) fn sin_cos(b: &mut Builder, x: Var, cos: bool) -> Var {
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
