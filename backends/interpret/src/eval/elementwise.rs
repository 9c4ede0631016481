//! The elementwise operations: `unary`, `binary` (also written straight into a store's
//! destination, [`binary_into`]), `compare` and `select`, their operands broadcast by numpy's
//! rules.

use std::borrow::Cow;

use tessel_plugin_api::ir::{BinaryOp, CmpOp, DType, UnaryOp};

use super::float::{nan_max, nan_min, round_all, wrap_i, wrap_u};
use super::layout::{broadcast_shape, expand};
use super::value::{Data, Slice, Val, View};

/// Maps every element with a closure; each call site is its own monomorphic, vectorisable loop.
fn map<T: Copy, R>(v: &[T], f: impl Fn(T) -> R) -> Vec<R> {
    v.iter().map(|&x| f(x)).collect()
}

/// A transcendental computed in f64 and rounded, as docs/language.md specifies.
fn via_f64(v: &[f32], f: impl Fn(f64) -> f64) -> Vec<f32> {
    map(v, |x| f(f64::from(x)) as f32)
}

/// The inverse error function in `f64`: Newton's steps on `libm::erf` from Winitzki's
/// approximation, to the `f64` the steps settle on (within an ulp or two of `f64`, far inside
/// the `f32` rounding).
fn erf_inv(x: f64) -> f64 {
    if x.is_nan() || x.abs() > 1.0 {
        return f64::NAN;
    }
    if x.abs() == 1.0 {
        return f64::INFINITY.copysign(x);
    }
    const A: f64 = 0.147;
    let l = (1.0 - x * x).ln();
    let t = 2.0 / (std::f64::consts::PI * A) + l / 2.0;
    let mut y = ((t * t - l / A).sqrt() - t).sqrt().copysign(x);
    for _ in 0..50 {
        let step = (libm::erf(y) - x) / (std::f64::consts::FRAC_2_SQRT_PI * (-y * y).exp());
        if step == 0.0 || !step.is_finite() {
            break;
        }
        y -= step;
    }
    y
}

pub(crate) fn unary(op: UnaryOp, a: View<'_>) -> Val {
    let data = match a.data {
        Slice::F(v) => Data::F(round_all(
            a.dtype,
            match op {
                UnaryOp::Neg => map(v, |x| -x),
                UnaryOp::Abs => map(v, f32::abs),
                UnaryOp::Exp => super::fastmath::exp(v),
                UnaryOp::Exp2 => via_f64(v, f64::exp2),
                UnaryOp::Log => via_f64(v, f64::ln),
                UnaryOp::Log2 => via_f64(v, f64::log2),
                UnaryOp::Sqrt => map(v, f32::sqrt),
                UnaryOp::Rsqrt => via_f64(v, |x| 1.0 / x.sqrt()),
                UnaryOp::Sin => via_f64(v, f64::sin),
                UnaryOp::Cos => via_f64(v, f64::cos),
                UnaryOp::Tanh => via_f64(v, f64::tanh),
                UnaryOp::Logistic => via_f64(v, |x| 1.0 / (1.0 + (-x).exp())),
                UnaryOp::Expm1 => via_f64(v, f64::exp_m1),
                UnaryOp::Log1p => via_f64(v, f64::ln_1p),
                UnaryOp::Erf => via_f64(v, libm::erf),
                UnaryOp::ErfInv => via_f64(v, erf_inv),
                UnaryOp::Asin => via_f64(v, f64::asin),
                UnaryOp::Acos => via_f64(v, f64::acos),
                UnaryOp::Atan => via_f64(v, f64::atan),
                UnaryOp::Sinh => via_f64(v, f64::sinh),
                UnaryOp::Cosh => via_f64(v, f64::cosh),
                UnaryOp::Floor => map(v, f32::floor),
                UnaryOp::Ceil => map(v, f32::ceil),
                UnaryOp::Round => map(v, f32::round_ties_even),
                UnaryOp::Not => unreachable!("verifier: not on floats"),
            },
        )),
        Slice::I(v) => Data::I(wrap_i(
            a.dtype,
            match op {
                UnaryOp::Neg => map(v, i32::wrapping_neg),
                UnaryOp::Abs => map(v, i32::wrapping_abs),
                _ => map(v, |x| !x),
            },
        )),
        Slice::U(v) => Data::U(wrap_u(
            a.dtype,
            match op {
                UnaryOp::Neg => map(v, u32::wrapping_neg),
                UnaryOp::Abs => v.to_vec(),
                _ => map(v, |x| !x),
            },
        )),
        Slice::B(v) => Data::B(map(v, |x| !x)),
    };
    Val { dtype: a.dtype, shape: a.shape.to_vec(), data }
}

/// The operands of a binary operation: `x` of shape `xs` and `y` of shape `ys`, broadcast to
/// `out` (numpy's rules).
struct Pair<'a, T> {
    x: &'a [T],
    xs: &'a [usize],
    y: &'a [T],
    ys: &'a [usize],
    out: &'a [usize],
}

impl<T: Copy> Pair<'_, T> {
    /// `f` of each pair of elements broadcasting makes, in row-major order over `out`.
    fn zip<R: Copy>(&self, f: impl Fn(T, T) -> R) -> Vec<R> {
        collected(self.out.iter().product(), |v| self.zip_to(f, v))
    }

    /// [`Pair::zip`] into `dst`. A scalar and a column (`[..., 1]`, one element a row, as a
    /// reduction with `keepdims` makes it) are read where they are, not stretched into a block
    /// first; other shapes are.
    fn zip_to<R: Copy>(&self, f: impl Fn(T, T) -> R, dst: &mut impl Sink<R>) {
        let (x, y, out) = (self.x, self.y, self.out);
        let row = out.last().copied().unwrap_or(1);
        let column =
            |s: &[usize]| row > 0 && s.len() == out.len() && s.last() == Some(&1) && s[..s.len() - 1] == out[..out.len() - 1];
        match (self.xs == out, self.ys == out) {
            (true, true) => dst.zip2(x, y, f),
            (true, false) if y.len() == 1 => dst.extend(x.iter().map(|&a| f(a, y[0]))),
            (false, true) if x.len() == 1 => dst.extend(y.iter().map(|&b| f(x[0], b))),
            (true, false) if column(self.ys) => per_row(x, y, row, f, dst),
            (false, true) if column(self.xs) => per_row(y, x, row, |b, a| f(a, b), dst),
            _ => {
                let (x, y) = (expand(x, self.xs, out), expand(y, self.ys, out));
                dst.extend(x.iter().zip(y.iter()).map(|(&a, &b)| f(a, b)));
            }
        }
    }
}

/// `f(e, c)` for each element `e` of `full`'s rows of `row` elements and the element `c` of
/// `col` for that row, into `dst`.
fn per_row<T: Copy, R: Copy>(full: &[T], col: &[T], row: usize, f: impl Fn(T, T) -> R, dst: &mut impl Sink<R>) {
    let rows = (full.len() / row).min(col.len());
    dst.fill(rows * row, |out| row_slices(&full[..rows * row], col, row, out, |a, b| Put::put(f(a, b))));
}

/// `out[i] = f(full[i], col[i / row])` where `out` has `row` elements a row, compiled for the
/// vector units the CPU has: the loop of an operation between a block and a `keepdims` reduction
/// of it (`x - max`, `e / sum`).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn row_slices<T: Copy, R>(full: &[T], col: &[T], row: usize, out: &mut [R], f: impl Fn(T, T) -> R) {
    for ((o, r), &c) in out.chunks_exact_mut(row).zip(full.chunks_exact(row)).zip(col) {
        for (o, &e) in o.iter_mut().zip(r) {
            *o = f(e, c);
        }
    }
}

/// A vector of the `n` results `fill` appends.
fn collected<R>(n: usize, fill: impl FnOnce(&mut Vec<R>)) -> Vec<R> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v);
    v
}

/// Memory that results are written into in order, one element each: a store's destination,
/// where an operation's results go straight there ([`binary_into`]).
struct Filler<'o, R> {
    out: &'o mut [R],
    at: usize,
}

/// Where elementwise results go: a fresh vector, or an output's memory ([`Filler`]).
pub(crate) trait Sink<R: Copy>: Extend<R> {
    /// What one element is written as: itself, or itself in uninitialised memory.
    type Slot: Put<R>;
    /// Appends `n` elements, which `write` writes into the `n` slots it is given, every one.
    fn fill(&mut self, n: usize, write: impl FnOnce(&mut [Self::Slot]));

    /// `f` of each pair of `x[i]` and `y[i]` (of one length), appended.
    fn zip2<T: Copy>(&mut self, x: &[T], y: &[T], f: impl Fn(T, T) -> R) {
        let n = x.len().min(y.len());
        self.fill(n, |out| zip_slices(x, y, out, |a, b| Self::Slot::put(f(a, b))));
    }
}

/// A slot of a [`Sink`] that a value is written into.
pub(crate) trait Put<R> {
    fn put(r: R) -> Self;
}

impl<R> Put<R> for R {
    fn put(r: R) -> R {
        r
    }
}

impl<R> Put<R> for std::mem::MaybeUninit<R> {
    fn put(r: R) -> Self {
        std::mem::MaybeUninit::new(r)
    }
}

impl<R: Copy> Sink<R> for Vec<R> {
    type Slot = std::mem::MaybeUninit<R>;

    fn fill(&mut self, n: usize, write: impl FnOnce(&mut [Self::Slot])) {
        self.reserve(n);
        let start = self.len();
        write(&mut self.spare_capacity_mut()[..n]);
        // SAFETY: `write` was given exactly the `n` spare slots after `start`, and writes every
        // one (the contract of `fill`; each caller's loop covers its whole slice).
        #[allow(unsafe_code)]
        unsafe {
            self.set_len(start + n)
        };
    }
}

impl<R: Copy> Sink<R> for Filler<'_, R> {
    type Slot = R;

    fn fill(&mut self, n: usize, write: impl FnOnce(&mut [R])) {
        let n = n.min(self.out.len() - self.at);
        write(&mut self.out[self.at..self.at + n]);
        self.at += n;
    }
}

/// `out[i] = f(x[i], y[i])`, compiled for the vector units the CPU has (AVX-512, AVX2, NEON) and
/// chosen when first called: the elementwise loop every same-shape binary op runs.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn zip_slices<T: Copy, R>(x: &[T], y: &[T], out: &mut [R], f: impl Fn(T, T) -> R) {
    for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
        *o = f(a, b);
    }
}

impl<R> Extend<R> for Filler<'_, R> {
    fn extend<I: IntoIterator<Item = R>>(&mut self, items: I) {
        let mut n = 0;
        self.out[self.at..].iter_mut().zip(items).for_each(|(o, x)| {
            *o = x;
            n += 1;
        });
        self.at += n;
    }
}

pub(crate) fn binary(op: BinaryOp, a: View<'_>, b: View<'_>) -> Val {
    let shape = broadcast_shape(a.shape, b.shape);
    let n = shape.iter().product();
    let data = match (a.data, b.data) {
        (Slice::F(x), Slice::F(y)) => Data::F(round_all(
            a.dtype,
            collected(n, |v| binary_f32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)),
        )),
        (Slice::I(x), Slice::I(y)) => Data::I(wrap_i(
            a.dtype,
            collected(n, |v| binary_i32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)),
        )),
        (Slice::U(x), Slice::U(y)) => Data::U(wrap_u(
            a.dtype,
            collected(n, |v| binary_u32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)),
        )),
        (Slice::B(x), Slice::B(y)) => {
            Data::B(collected(n, |v| binary_bool(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)))
        }
        _ => unreachable!("verifier: operands of one dtype"),
    };
    Val { dtype: a.dtype, shape, data }
}

/// [`binary`] written straight into `out`, the bit patterns of a block of its shape and dtype
/// (a store's destination), where the dtype is held in 32 bits as the value holds it (`f32`,
/// `i32`, `u32`); whether it could.
pub(crate) fn binary_into(op: BinaryOp, a: View<'_>, b: View<'_>, out: &mut [u32]) -> bool {
    let shape: Cow<'_, [usize]> =
        if a.shape == b.shape { Cow::Borrowed(a.shape) } else { Cow::Owned(broadcast_shape(a.shape, b.shape)) };
    if shape.iter().product::<usize>() != out.len() {
        return false;
    }
    match (a.data, b.data, a.dtype) {
        (Slice::F(x), Slice::F(y), DType::F32) => binary_f32(
            op,
            &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape },
            &mut Filler { out: bytemuck::cast_slice_mut(out), at: 0 },
        ),
        (Slice::I(x), Slice::I(y), DType::I32) => binary_i32(
            op,
            &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape },
            &mut Filler { out: bytemuck::cast_slice_mut(out), at: 0 },
        ),
        (Slice::U(x), Slice::U(y), DType::U32) => {
            binary_u32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, &mut Filler { out, at: 0 })
        }
        _ => return false,
    }
    true
}

fn binary_f32(op: BinaryOp, p: &Pair<'_, f32>, dst: &mut impl Sink<f32>) {
    use BinaryOp as B;
    match op {
        B::Add => p.zip_to(|x, y| x + y, dst),
        B::Sub => p.zip_to(|x, y| x - y, dst),
        B::Mul => p.zip_to(|x, y| x * y, dst),
        B::Div => p.zip_to(|x, y| x / y, dst),
        B::Rem => p.zip_to(|x, y| x % y, dst),
        B::Pow => p.zip_to(|x, y| f64::from(x).powf(f64::from(y)) as f32, dst),
        B::Atan2 => p.zip_to(|x, y| f64::from(x).atan2(f64::from(y)) as f32, dst),
        B::Max => p.zip_to(nan_max, dst),
        B::Min => p.zip_to(nan_min, dst),
        _ => unreachable!("verifier: bit op on floats"),
    }
}

fn binary_i32(op: BinaryOp, p: &Pair<'_, i32>, dst: &mut impl Sink<i32>) {
    use BinaryOp as B;
    match op {
        B::Add => p.zip_to(i32::wrapping_add, dst),
        B::Sub => p.zip_to(i32::wrapping_sub, dst),
        B::Mul => p.zip_to(i32::wrapping_mul, dst),
        B::Div => p.zip_to(|x, y| if y == 0 { 0 } else { x.wrapping_div(y) }, dst),
        B::Rem => p.zip_to(|x, y| if y == 0 { 0 } else { x.wrapping_rem(y) }, dst),
        B::Max => p.zip_to(i32::max, dst),
        B::Min => p.zip_to(i32::min, dst),
        B::And => p.zip_to(|x, y| x & y, dst),
        B::Or => p.zip_to(|x, y| x | y, dst),
        B::Xor => p.zip_to(|x, y| x ^ y, dst),
        B::Shl => p.zip_to(|x, y| x.wrapping_shl(y as u32), dst),
        B::Shr => p.zip_to(|x, y| x.wrapping_shr(y as u32), dst),
        B::Pow | B::Atan2 => unreachable!("verifier: pow and atan2 on integers"),
    }
}

fn binary_u32(op: BinaryOp, p: &Pair<'_, u32>, dst: &mut impl Sink<u32>) {
    use BinaryOp as B;
    match op {
        B::Add => p.zip_to(u32::wrapping_add, dst),
        B::Sub => p.zip_to(u32::wrapping_sub, dst),
        B::Mul => p.zip_to(u32::wrapping_mul, dst),
        B::Div => p.zip_to(|x, y| x.checked_div(y).unwrap_or(0), dst),
        B::Rem => p.zip_to(|x, y| x.checked_rem(y).unwrap_or(0), dst),
        B::Max => p.zip_to(u32::max, dst),
        B::Min => p.zip_to(u32::min, dst),
        B::And => p.zip_to(|x, y| x & y, dst),
        B::Or => p.zip_to(|x, y| x | y, dst),
        B::Xor => p.zip_to(|x, y| x ^ y, dst),
        B::Shl => p.zip_to(u32::wrapping_shl, dst),
        B::Shr => p.zip_to(u32::wrapping_shr, dst),
        B::Pow | B::Atan2 => unreachable!("verifier: pow and atan2 on integers"),
    }
}

fn binary_bool(op: BinaryOp, p: &Pair<'_, bool>, dst: &mut impl Sink<bool>) {
    use BinaryOp as B;
    match op {
        B::And => p.zip_to(|x, y| x & y, dst),
        B::Or => p.zip_to(|x, y| x | y, dst),
        B::Xor => p.zip_to(|x, y| x ^ y, dst),
        _ => unreachable!("verifier: arithmetic on bool"),
    }
}

fn cmp<T: PartialOrd + Copy>(op: CmpOp, p: Pair<'_, T>) -> Vec<bool> {
    match op {
        CmpOp::Eq => p.zip(|x, y| x == y),
        CmpOp::Ne => p.zip(|x, y| x != y),
        CmpOp::Lt => p.zip(|x, y| x < y),
        CmpOp::Le => p.zip(|x, y| x <= y),
        CmpOp::Gt => p.zip(|x, y| x > y),
        CmpOp::Ge => p.zip(|x, y| x >= y),
    }
}

pub(crate) fn compare(op: CmpOp, a: View<'_>, b: View<'_>) -> Val {
    let shape = broadcast_shape(a.shape, b.shape);
    let out = match (a.data, b.data) {
        (Slice::F(x), Slice::F(y)) => cmp(op, Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }),
        (Slice::I(x), Slice::I(y)) => cmp(op, Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }),
        (Slice::U(x), Slice::U(y)) => cmp(op, Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }),
        (Slice::B(x), Slice::B(y)) => cmp(op, Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }),
        _ => unreachable!("verifier: operands of one dtype"),
    };
    Val { dtype: DType::Bool, shape, data: Data::B(out) }
}

fn pick<T: Copy>(c: &[bool], x: &[T], y: &[T]) -> Vec<T> {
    c.iter().zip(x.iter().zip(y)).map(|(&c, (&x, &y))| if c { x } else { y }).collect()
}

pub(crate) fn select(c: View<'_>, a: View<'_>, b: View<'_>) -> Val {
    let shape = broadcast_shape(&broadcast_shape(c.shape, a.shape), b.shape);
    let Slice::B(cv) = c.data else { unreachable!("verifier: bool condition") };
    let cv = expand(cv, c.shape, &shape);
    let data = match (a.data, b.data) {
        (Slice::F(x), Slice::F(y)) => Data::F(pick(&cv, &expand(x, a.shape, &shape), &expand(y, b.shape, &shape))),
        (Slice::I(x), Slice::I(y)) => Data::I(pick(&cv, &expand(x, a.shape, &shape), &expand(y, b.shape, &shape))),
        (Slice::U(x), Slice::U(y)) => Data::U(pick(&cv, &expand(x, a.shape, &shape), &expand(y, b.shape, &shape))),
        (Slice::B(x), Slice::B(y)) => Data::B(pick(&cv, &expand(x, a.shape, &shape), &expand(y, b.shape, &shape))),
        _ => unreachable!("verifier: operands of one dtype"),
    };
    Val { dtype: a.dtype, shape, data }
}
