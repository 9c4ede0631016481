//! Block values and the operations on whole blocks. Floats of every precision are held as `f32`
//! and rounded to their dtype after each operation, which gives exactly the IEEE result of `f16`
//! and `bf16` arithmetic for the basic operations (f32 has more than twice their precision).

use std::borrow::Cow;

use half::{bf16, f16};
use tessel_plugin_api::ir::{BinaryOp, CmpOp, DType, Literal, ReduceOp, UnaryOp};

/// Elements of a block value.
#[derive(Clone, Debug)]
pub(crate) enum Data {
    F(Vec<f32>),
    I(Vec<i32>),
    U(Vec<u32>),
    B(Vec<bool>),
}

impl Data {
    /// How many elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
            Data::U(v) => v.len(),
            Data::B(v) => v.len(),
        }
    }

    /// Copies `n` elements of `other` (of the same kind) from `from` into `self` at `at`.
    pub fn copy_from(&mut self, at: usize, other: Slice<'_>, from: usize, n: usize) {
        match (self, other) {
            (Data::F(a), Slice::F(b)) => a[at..at + n].copy_from_slice(&b[from..from + n]),
            (Data::I(a), Slice::I(b)) => a[at..at + n].copy_from_slice(&b[from..from + n]),
            (Data::U(a), Slice::U(b)) => a[at..at + n].copy_from_slice(&b[from..from + n]),
            (Data::B(a), Slice::B(b)) => a[at..at + n].copy_from_slice(&b[from..from + n]),
            _ => unreachable!("a value's parts are of its dtype"),
        }
    }

    /// Appends the elements of `other` (of the same kind).
    pub fn extend_from(&mut self, other: Slice<'_>) {
        match (self, other) {
            (Data::F(a), Slice::F(b)) => a.extend_from_slice(b),
            (Data::I(a), Slice::I(b)) => a.extend_from_slice(b),
            (Data::U(a), Slice::U(b)) => a.extend_from_slice(b),
            (Data::B(a), Slice::B(b)) => a.extend_from_slice(b),
            _ => unreachable!("the chunks of one value are of one dtype"),
        }
    }
}

/// A block value (shape `[]` for a scalar).
#[derive(Clone)]
pub(crate) struct Val {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

impl std::fmt::Debug for Val {
    /// The type and at most the first eight elements: program listings stay short.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn head<T: std::fmt::Debug>(v: &[T]) -> String {
            let shown: Vec<String> = v.iter().take(8).map(|x| format!("{x:?}")).collect();
            format!("[{}{}]", shown.join(", "), if v.len() > 8 { ", …" } else { "" })
        }
        let elems = match &self.data {
            Data::F(v) => head(v),
            Data::I(v) => head(v),
            Data::U(v) => head(v),
            Data::B(v) => head(v),
        };
        write!(f, "{} {elems}", tessel_plugin_api::ir::Type::array(self.dtype, self.shape.clone()))
    }
}

fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn round_all(dtype: DType, mut v: Vec<f32>) -> Vec<f32> {
    if matches!(dtype, DType::F16 | DType::BF16) {
        v.iter_mut().for_each(|x| *x = round(dtype, *x));
    }
    v
}

/// Maximum that propagates NaN (`a > b` is false when either is NaN; `a + b` is then NaN).
fn nan_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else if b >= a {
        b
    } else {
        a + b
    }
}

/// Minimum that propagates NaN.
fn nan_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else if b <= a {
        b
    } else {
        a + b
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// numpy broadcasting of two shapes (the verifier has checked they agree).
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            da.max(db)
        })
        .collect()
}

/// `data` of `shape` stretched to `out` (numpy broadcasting); borrowed when nothing stretches.
pub(crate) fn expand<'a, T: Copy>(data: &'a [T], shape: &[usize], out: &[usize]) -> Cow<'a, [T]> {
    if shape == out {
        return Cow::Borrowed(data);
    }
    let n: usize = out.iter().product();
    if data.len() == 1 {
        return Cow::Owned(vec![data[0]; n]);
    }
    let lead = out.len() - shape.len();
    let src = strides(shape);
    // Stride in `data` of each output dimension (0 where it stretches).
    let st: Vec<usize> = (0..out.len()).map(|d| if d < lead || shape[d - lead] == 1 { 0 } else { src[d - lead] }).collect();
    // Whole rows at a time: the innermost dimension is either copied or filled.
    let last = out.len() - 1;
    let row = out[last];
    let mut res = Vec::with_capacity(n);
    let mut idx = vec![0usize; last];
    let mut off = 0usize;
    for _ in 0..n / row {
        if st[last] == 0 {
            res.resize(res.len() + row, data[off]);
        } else {
            res.extend_from_slice(&data[off..off + row]);
        }
        for d in (0..last).rev() {
            idx[d] += 1;
            off += st[d];
            if idx[d] < out[d] {
                break;
            }
            off -= st[d] * idx[d];
            idx[d] = 0;
        }
    }
    Cow::Owned(res)
}

/// A block value's elements, borrowed: from a [`Val`], or in place from an argument's memory or
/// a part of a value (the fused runs' chunks).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slice<'a> {
    F(&'a [f32]),
    I(&'a [i32]),
    U(&'a [u32]),
    B(&'a [bool]),
}

/// A block value, borrowed: what the elementwise operations and reductions read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: Slice<'a>,
}

impl View<'_> {
    /// Calls `f` with the bit pattern of each element of `range`, in order: what a store writes
    /// (16-bit floats as their 16 bits). One loop per kind of element.
    pub fn for_each_bits(&self, range: std::ops::Range<usize>, mut f: impl FnMut(u32)) {
        match self.data {
            Slice::F(v) => match self.dtype {
                DType::F16 => v[range].iter().for_each(|&x| f(u32::from(f16::from_f32(x).to_bits()))),
                DType::BF16 => v[range].iter().for_each(|&x| f(u32::from(bf16::from_f32(x).to_bits()))),
                _ => v[range].iter().for_each(|x| f(x.to_bits())),
            },
            Slice::I(v) => v[range].iter().for_each(|&x| f(x as u32)),
            Slice::U(v) => v[range].iter().for_each(|&x| f(x)),
            Slice::B(v) => v[range].iter().for_each(|&x| f(u32::from(x))),
        }
    }

    /// Writes the bit patterns of the elements in `range` into `out`, one each, as
    /// [`View::for_each_bits`] gives them (in loops the compiler vectorizes).
    pub fn write_bits(&self, range: std::ops::Range<usize>, out: &mut [u32]) {
        fn put<T: Copy>(v: &[T], out: &mut [u32], bits: impl Fn(T) -> u32) {
            out.iter_mut().zip(v).for_each(|(o, &x)| *o = bits(x));
        }
        match self.data {
            Slice::F(v) => match self.dtype {
                DType::F16 => put(&v[range], out, |x| u32::from(f16::from_f32(x).to_bits())),
                DType::BF16 => put(&v[range], out, |x| u32::from(bf16::from_f32(x).to_bits())),
                _ => put(&v[range], out, f32::to_bits),
            },
            Slice::I(v) => put(&v[range], out, |x| x as u32),
            Slice::U(v) => out.copy_from_slice(&v[range]),
            Slice::B(v) => put(&v[range], out, u32::from),
        }
    }

    /// An owned copy.
    pub fn to_val(self) -> Val {
        let data = match self.data {
            Slice::F(v) => Data::F(v.to_vec()),
            Slice::I(v) => Data::I(v.to_vec()),
            Slice::U(v) => Data::U(v.to_vec()),
            Slice::B(v) => Data::B(v.to_vec()),
        };
        Val { dtype: self.dtype, shape: self.shape.to_vec(), data }
    }
}

impl Val {
    /// The value, borrowed.
    pub fn view(&self) -> View<'_> {
        let data = match &self.data {
            Data::F(v) => Slice::F(v),
            Data::I(v) => Slice::I(v),
            Data::U(v) => Slice::U(v),
            Data::B(v) => Slice::B(v),
        };
        View { dtype: self.dtype, shape: &self.shape, data }
    }

    pub fn scalar_literal(dtype: DType, lit: Literal) -> Val {
        Val::splat(dtype, &[], lit)
    }

    /// A block of `shape` with every element `lit`.
    pub fn splat(dtype: DType, shape: &[usize], lit: Literal) -> Val {
        let n = shape.iter().product();
        let data = match dtype {
            DType::I32 => Data::I(vec![lit.as_i64() as i32; n]),
            DType::U32 => Data::U(vec![lit.as_i64() as u32; n]),
            DType::Bool => Data::B(vec![lit.as_f64() != 0.0; n]),
            _ => Data::F(vec![round(dtype, lit.as_f64() as f32); n]),
        };
        Val { dtype, shape: shape.to_vec(), data }
    }

    pub fn iota(dtype: DType, shape: &[usize], dim: usize) -> Val {
        let st = strides(shape);
        let n: usize = shape.iter().product();
        let idx = (0..n).map(|f| (f / st[dim]) % shape[dim]);
        let data = match dtype {
            DType::U32 => Data::U(idx.map(|i| i as u32).collect()),
            _ => Data::I(idx.map(|i| i as i32).collect()),
        };
        Val { dtype, shape: shape.to_vec(), data }
    }

    pub fn i32_scalar(v: i64) -> Val {
        Val { dtype: DType::I32, shape: Vec::new(), data: Data::I(vec![v as i32]) }
    }

    /// A scalar as `i64` (integer scalars: indices and loop bounds).
    pub fn as_i64(&self) -> i64 {
        match &self.data {
            Data::I(v) => i64::from(v[0]),
            Data::U(v) => i64::from(v[0]),
            Data::F(v) => v[0] as i64,
            Data::B(v) => i64::from(v[0]),
        }
    }

    pub fn as_bool(&self) -> bool {
        match &self.data {
            Data::B(v) => v[0],
            _ => self.as_i64() != 0,
        }
    }

    /// Bit patterns of every element, for stores (16-bit floats as their 16 bits).
    pub fn to_bits(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.data.len());
        self.view().for_each_bits(0..self.data.len(), |b| out.push(b));
        out
    }

    /// The inverse of [`Val::to_bits`].
    pub fn from_bits(dtype: DType, shape: Vec<usize>, bits: Vec<u32>) -> Val {
        let data = match dtype {
            DType::F32 => Data::F(bits.into_iter().map(f32::from_bits).collect()),
            DType::F16 => Data::F(bits.into_iter().map(|b| f16::from_bits(b as u16).to_f32()).collect()),
            DType::BF16 => Data::F(bits.into_iter().map(|b| bf16::from_bits(b as u16).to_f32()).collect()),
            DType::I32 => Data::I(bits.into_iter().map(|b| b as i32).collect()),
            DType::U32 => Data::U(bits),
            DType::Bool => Data::B(bits.into_iter().map(|b| b != 0).collect()),
        };
        Val { dtype, shape, data }
    }

    fn with(&self, shape: Vec<usize>, data: Data) -> Val {
        Val { dtype: self.dtype, shape, data }
    }
}

/// Maps every element with a closure; each call site is its own monomorphic, vectorisable loop.
fn map<T: Copy, R>(v: &[T], f: impl Fn(T) -> R) -> Vec<R> {
    v.iter().map(|&x| f(x)).collect()
}

/// A transcendental computed in f64 and rounded, as docs/language.md specifies.
fn via_f64(v: &[f32], f: impl Fn(f64) -> f64) -> Vec<f32> {
    map(v, |x| f(f64::from(x)) as f32)
}

pub(crate) fn unary(op: UnaryOp, a: View<'_>) -> Val {
    let data = match a.data {
        Slice::F(v) => Data::F(round_all(
            a.dtype,
            match op {
                UnaryOp::Neg => map(v, |x| -x),
                UnaryOp::Abs => map(v, f32::abs),
                UnaryOp::Exp => crate::fastmath::exp(v),
                UnaryOp::Exp2 => via_f64(v, f64::exp2),
                UnaryOp::Log => via_f64(v, f64::ln),
                UnaryOp::Log2 => via_f64(v, f64::log2),
                UnaryOp::Sqrt => map(v, f32::sqrt),
                UnaryOp::Rsqrt => via_f64(v, |x| 1.0 / x.sqrt()),
                UnaryOp::Sin => via_f64(v, f64::sin),
                UnaryOp::Cos => via_f64(v, f64::cos),
                UnaryOp::Tanh => via_f64(v, f64::tanh),
                UnaryOp::Logistic => via_f64(v, |x| 1.0 / (1.0 + (-x).exp())),
                UnaryOp::Floor => map(v, f32::floor),
                UnaryOp::Ceil => map(v, f32::ceil),
                UnaryOp::Not => unreachable!("verifier: not on floats"),
            },
        )),
        Slice::I(v) => Data::I(match op {
            UnaryOp::Neg => map(v, i32::wrapping_neg),
            UnaryOp::Abs => map(v, i32::wrapping_abs),
            _ => map(v, |x| !x),
        }),
        Slice::U(v) => Data::U(match op {
            UnaryOp::Neg => map(v, u32::wrapping_neg),
            UnaryOp::Abs => v.to_vec(),
            _ => map(v, |x| !x),
        }),
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
fn per_row<T: Copy, R>(full: &[T], col: &[T], row: usize, f: impl Fn(T, T) -> R, dst: &mut impl Extend<R>) {
    for (r, &c) in full.chunks_exact(row).zip(col) {
        dst.extend(r.iter().map(|&e| f(e, c)));
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
    /// `f` of each pair of `x[i]` and `y[i]` (of one length), appended.
    fn zip2<T: Copy>(&mut self, x: &[T], y: &[T], f: impl Fn(T, T) -> R);
}

impl<R: Copy> Sink<R> for Vec<R> {
    fn zip2<T: Copy>(&mut self, x: &[T], y: &[T], f: impl Fn(T, T) -> R) {
        let n = x.len().min(y.len());
        self.reserve(n);
        let start = self.len();
        zip_slices(x, y, &mut self.spare_capacity_mut()[..n], |a, b| std::mem::MaybeUninit::new(f(a, b)));
        // SAFETY: `zip_slices` wrote each of the `n` spare elements after `start`.
        #[allow(unsafe_code)]
        unsafe {
            self.set_len(start + n)
        };
    }
}

impl<R: Copy> Sink<R> for Filler<'_, R> {
    fn zip2<T: Copy>(&mut self, x: &[T], y: &[T], f: impl Fn(T, T) -> R) {
        let n = x.len().min(y.len()).min(self.out.len() - self.at);
        zip_slices(x, y, &mut self.out[self.at..self.at + n], f);
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
        (Slice::I(x), Slice::I(y)) => {
            Data::I(collected(n, |v| binary_i32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)))
        }
        (Slice::U(x), Slice::U(y)) => {
            Data::U(collected(n, |v| binary_u32(op, &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape }, v)))
        }
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
        (Slice::I(x), Slice::I(y), _) => binary_i32(
            op,
            &Pair { x, xs: a.shape, y, ys: b.shape, out: &shape },
            &mut Filler { out: bytemuck::cast_slice_mut(out), at: 0 },
        ),
        (Slice::U(x), Slice::U(y), _) => {
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
        B::Pow => unreachable!("verifier: pow on integers"),
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
        B::Pow => unreachable!("verifier: pow on integers"),
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

pub(crate) fn cast(a: View<'_>, to: DType) -> Val {
    let data = match (a.data, to) {
        (Slice::F(v), DType::I32) => Data::I(v.iter().map(|&x| x as i32).collect()),
        (Slice::F(v), DType::U32) => Data::U(v.iter().map(|&x| x as u32).collect()),
        (Slice::F(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0.0).collect()),
        (Slice::F(v), d) => Data::F(round_all(d, v.to_vec())),
        (Slice::I(v), DType::I32) => Data::I(v.to_vec()),
        (Slice::I(v), DType::U32) => Data::U(v.iter().map(|&x| x as u32).collect()),
        (Slice::I(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0).collect()),
        (Slice::I(v), d) => Data::F(round_all(d, v.iter().map(|&x| x as f32).collect())),
        (Slice::U(v), DType::I32) => Data::I(v.iter().map(|&x| x as i32).collect()),
        (Slice::U(v), DType::U32) => Data::U(v.to_vec()),
        (Slice::U(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0).collect()),
        (Slice::U(v), d) => Data::F(round_all(d, v.iter().map(|&x| x as f32).collect())),
        (Slice::B(v), DType::I32) => Data::I(v.iter().map(|&x| i32::from(x)).collect()),
        (Slice::B(v), DType::U32) => Data::U(v.iter().map(|&x| u32::from(x)).collect()),
        (Slice::B(v), DType::Bool) => Data::B(v.to_vec()),
        (Slice::B(v), _) => Data::F(v.iter().map(|&x| f32::from(u8::from(x))).collect()),
    };
    Val { dtype: to, shape: a.shape.to_vec(), data }
}

pub(crate) fn bitcast(a: &Val, to: DType) -> Val {
    Val::from_bits(to, a.shape.clone(), a.to_bits())
}

pub(crate) fn broadcast_to(a: &Val, shape: &[usize]) -> Val {
    let data = match &a.data {
        Data::F(v) => Data::F(expand(v, &a.shape, shape).into_owned()),
        Data::I(v) => Data::I(expand(v, &a.shape, shape).into_owned()),
        Data::U(v) => Data::U(expand(v, &a.shape, shape).into_owned()),
        Data::B(v) => Data::B(expand(v, &a.shape, shape).into_owned()),
    };
    a.with(shape.to_vec(), data)
}

pub(crate) fn reshape(a: &Val, shape: &[usize]) -> Val {
    a.with(shape.to_vec(), a.data.clone())
}

fn permute<T: Copy>(v: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out_st: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let n = v.len();
    let mut res = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    let mut off = 0;
    for _ in 0..n {
        res.push(v[off]);
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            off += out_st[d];
            if idx[d] < out_shape[d] {
                break;
            }
            off -= out_st[d] * idx[d];
            idx[d] = 0;
        }
    }
    res
}

pub(crate) fn transpose(a: &Val, perm: &[usize]) -> Val {
    let shape: Vec<usize> = perm.iter().map(|&p| a.shape[p]).collect();
    let data = match &a.data {
        Data::F(v) => Data::F(permute(v, &a.shape, perm)),
        Data::I(v) => Data::I(permute(v, &a.shape, perm)),
        Data::U(v) => Data::U(permute(v, &a.shape, perm)),
        Data::B(v) => Data::B(permute(v, &a.shape, perm)),
    };
    a.with(shape, data)
}

/// `f` over one row, left to right from its first element.
fn fold_row<T: Copy>(row: &[T], f: impl Fn(T, T) -> T) -> T {
    row[1..].iter().fold(row[0], |acc, &x| f(acc, x))
}

/// Folds `[outer, n, inner]` along the middle dimension, in order.
fn fold_axis<T: Copy>(v: &[T], outer: usize, n: usize, inner: usize, f: impl Fn(T, T) -> T) -> Vec<T> {
    if inner == 1 {
        // Along the innermost axis: each output folds one contiguous row, left to right. Rows go
        // [`ROWS`] at a time, one element of each in turn: that many independent chains of `f`,
        // where one row alone is a chain whose every step waits for the last. Each row's order,
        // and so every bit, is unchanged.
        const ROWS: usize = 8;
        let mut out = Vec::with_capacity(outer);
        let mut groups = v.chunks_exact(n * ROWS);
        for group in &mut groups {
            let rows: [&[T]; ROWS] = std::array::from_fn(|k| &group[k * n..(k + 1) * n]);
            let mut acc: [T; ROWS] = std::array::from_fn(|k| rows[k][0]);
            for r in 1..n {
                for (acc, row) in acc.iter_mut().zip(&rows) {
                    *acc = f(*acc, row[r]);
                }
            }
            out.extend_from_slice(&acc);
        }
        out.extend(groups.remainder().chunks_exact(n).map(|row| fold_row(row, &f)));
        return out;
    }
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * n * inner;
        out.extend_from_slice(&v[base..base + inner]);
        let row = &mut out[o * inner..];
        for r in 1..n {
            let src = &v[base + r * inner..base + (r + 1) * inner];
            for (acc, &x) in row.iter_mut().zip(src) {
                *acc = f(*acc, x);
            }
        }
    }
    out
}

/// The maximum (`MAX`) or minimum of each contiguous row of `n`: bit for bit the left-to-right
/// fold of [`nan_max`] or [`nan_min`], computed in vector lanes. The lanes' winner is the fold's
/// wherever it is the only float of its value — neither zero (`-0.0` and `0.0` tie, and the fold
/// keeps the later) nor NaN (whose payload the fold's order picks); such rows fold in order.
fn extreme_rows<const MAX: bool>(v: &[f32], n: usize) -> Vec<f32> {
    const LANES: usize = 16;
    let better = |x: f32, m: f32| if MAX { x > m } else { x < m };
    let fold = if MAX { nan_max } else { nan_min };
    v.chunks_exact(n)
        .map(|row| {
            let (mut best, mut nan) = ([row[0]; LANES], [false; LANES]);
            let mut lanes = row.chunks_exact(LANES);
            for c in &mut lanes {
                for ((m, nan), &x) in best.iter_mut().zip(&mut nan).zip(c) {
                    *m = if better(x, *m) { x } else { *m };
                    *nan |= x.is_nan();
                }
            }
            let rest = lanes.remainder();
            let m = best.iter().chain(rest).fold(row[0], |m, &x| if better(x, m) { x } else { m });
            // A NaN anywhere, `row[0]` included, is in a lane or the rest.
            if m == 0.0 || nan.contains(&true) || rest.iter().any(|x| x.is_nan()) { fold_row(row, fold) } else { m }
        })
        .collect()
}

pub(crate) fn reduce(op: ReduceOp, a: View<'_>, axis: usize, keepdims: bool) -> Val {
    let outer: usize = a.shape[..axis].iter().product();
    let n = a.shape[axis];
    let inner: usize = a.shape[axis + 1..].iter().product();
    let mut shape = a.shape.to_vec();
    if keepdims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    let data = match a.data {
        Slice::F(v) => Data::F(round_all(
            a.dtype,
            match op {
                ReduceOp::Sum => fold_axis(v, outer, n, inner, |x, y| x + y),
                ReduceOp::Prod => fold_axis(v, outer, n, inner, |x, y| x * y),
                ReduceOp::Max if inner == 1 => extreme_rows::<true>(v, n),
                ReduceOp::Min if inner == 1 => extreme_rows::<false>(v, n),
                ReduceOp::Max => fold_axis(v, outer, n, inner, nan_max),
                ReduceOp::Min => fold_axis(v, outer, n, inner, nan_min),
            },
        )),
        Slice::I(v) => Data::I(match op {
            ReduceOp::Sum => fold_axis(v, outer, n, inner, i32::wrapping_add),
            ReduceOp::Prod => fold_axis(v, outer, n, inner, i32::wrapping_mul),
            ReduceOp::Max => fold_axis(v, outer, n, inner, i32::max),
            ReduceOp::Min => fold_axis(v, outer, n, inner, i32::min),
        }),
        Slice::U(v) => Data::U(match op {
            ReduceOp::Sum => fold_axis(v, outer, n, inner, u32::wrapping_add),
            ReduceOp::Prod => fold_axis(v, outer, n, inner, u32::wrapping_mul),
            ReduceOp::Max => fold_axis(v, outer, n, inner, u32::max),
            ReduceOp::Min => fold_axis(v, outer, n, inner, u32::min),
        }),
        Slice::B(_) => unreachable!("verifier: reduce on bool"),
    };
    Val { dtype: a.dtype, shape, data }
}

/// `c[m, n] = sum_k a[m, k] * b[k, n]`, `k` ascending, accumulating in `T` (the integer dots:
/// wrapping, so any order gives the same result).
fn matmul<T: Copy + Default>(a: &[T], b: &[T], m: usize, k: usize, n: usize, mul_add: impl Fn(T, T, T) -> T) -> Vec<T> {
    let mut c = vec![T::default(); m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (acc, &y) in row.iter_mut().zip(brow) {
                *acc = mul_add(*acc, x, y);
            }
        }
    }
    c
}

/// Multiply-adds above which an f32 `dot` splits its rows over rayon's pool. Below, one
/// program's product is one task; parallel programs already keep every core busy, and a split
/// made while they do runs on the thread that made it (rayon's work stealing), so programs ×
/// GEMM threads never exceed the pool.
const SPLIT_MACS: usize = 1 << 21;

/// An f32 matrix in memory: its elements and the strides of its rows and columns (a transposed
/// operand is the same memory with the strides swapped).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    rows: isize,
    cols: isize,
}

/// `c = a b` (`m × k` by `k × n`) through the `gemm` crate's blocked, vectorised kernels. Each
/// product of `f32`-held `f16`/`bf16` values is exact in `f32`; the sums are in the order the
/// GEMM blocks them, with a fused multiply-add where the CPU has one (docs/language.md §8).
fn sgemm(a: Strided<'_>, b: Strided<'_>, m: usize, k: usize, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0f32; m * n];
    }
    // The GEMM writes every element without reading it (`read_dst` false): no zeroing first.
    let mut c = Vec::<f32>::with_capacity(m * n);
    let rows_per_task = if m * n * k >= SPLIT_MACS { m.div_ceil(4 * rayon::current_num_threads()).max(8) } else { m };
    c.spare_capacity_mut()[..m * n].par_chunks_mut(rows_per_task * n).enumerate().for_each(|(t, c)| {
        let rows = c.len() / n;
        let a_task = &a.data[t * rows_per_task * a.rows as usize..];
        // The last element either operand is read at, which must lie inside its slice.
        let last = |s: Strided<'_>, r: usize, q: usize| (r - 1) * s.rows as usize + (q - 1) * s.cols as usize;
        assert!(last(Strided { data: a_task, ..a }, rows, k) < a_task.len() && last(b, k, n) < b.data.len());
        // SAFETY: the GEMM reads `rows × k` elements of `a_task` and `k × n` of `b` at their
        // (positive) strides, all inside the slices (the assert above), and writes `rows × n`
        // elements of `c` contiguously, which is this task's own chunk of the spare capacity;
        // it does not read `c` (`read_dst` false), so the chunk may start uninitialized.
        #[allow(unsafe_code)]
        unsafe {
            gemm::gemm(
                rows,
                n,
                k,
                c.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                false,
                a_task.as_ptr(),
                a.cols,
                a.rows,
                b.data.as_ptr(),
                b.cols,
                b.rows,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
    // SAFETY: the tasks above wrote all `m × n` elements.
    #[allow(unsafe_code)]
    unsafe {
        c.set_len(m * n)
    };
    c
}

/// One small blocked product (16 × 16 × 16: neither a vector nor small enough for the gemm
/// crate's unblocked kernels), so that the crate's one-time set-up is done (see `warm_up`).
pub(crate) fn warm_gemm() {
    let x = [1.0f32; 256];
    let m = Strided { data: &x, rows: 16, cols: 1 };
    std::hint::black_box(sgemm(m, m, 16, 16, 16));
}

/// A row-major `f32` matrix in memory: `rows × cols`, rows `stride` elements apart (a block of
/// a larger array, read in place).
#[derive(Clone, Copy)]
pub(crate) struct Matrix<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> Matrix<'a> {
    /// A 2-D float value as a matrix; `None` for integers.
    pub fn of(v: &'a Val) -> Option<Matrix<'a>> {
        match &v.data {
            Data::F(x) => Some(Matrix { data: x, rows: v.shape[0], cols: v.shape[1], stride: v.shape[1] }),
            _ => None,
        }
    }

    /// Its memory with the strides of its rows and columns; transposed, they swap.
    fn strided(self, transposed: bool) -> Strided<'a> {
        let (rows, cols) = if transposed { (1, self.stride as isize) } else { (self.stride as isize, 1) };
        Strided { data: self.data, rows, cols }
    }
}

/// `dot` of two `f32` matrices (each transposed where its flag says), by [`sgemm`].
pub(crate) fn dot_f32(a: Matrix<'_>, b: Matrix<'_>, trans_a: bool, trans_b: bool) -> Val {
    let (m, k) = if trans_a { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let n = if trans_b { b.rows } else { b.cols };
    Val { dtype: DType::F32, shape: vec![m, n], data: Data::F(sgemm(a.strided(trans_a), b.strided(trans_b), m, k, n)) }
}

pub(crate) fn dot(a: &Val, b: &Val, trans_a: bool, trans_b: bool) -> Val {
    if let (Some(x), Some(y)) = (Matrix::of(a), Matrix::of(b)) {
        return dot_f32(x, y, trans_a, trans_b);
    }
    let (m, k) = if trans_a { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let n = if trans_b { b.shape[0] } else { b.shape[1] };
    let a = if trans_a { Cow::Owned(transpose(a, &[1, 0])) } else { Cow::Borrowed(a) };
    let b = if trans_b { Cow::Owned(transpose(b, &[1, 0])) } else { Cow::Borrowed(b) };
    let data = match (&a.data, &b.data) {
        (Data::I(x), Data::I(y)) => Data::I(matmul(x, y, m, k, n, |c, x, y| c.wrapping_add(x.wrapping_mul(y)))),
        (Data::U(x), Data::U(y)) => Data::U(matmul(x, y, m, k, n, |c, x, y| c.wrapping_add(x.wrapping_mul(y)))),
        _ => unreachable!("verifier: dot on two numeric matrices of one dtype"),
    };
    Val { dtype: a.dtype, shape: vec![m, n], data }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row folds taken eight rows at a time give each row's left-to-right fold, bit for bit: row
    /// counts around the group size, rows of one element, and float sums whose order shows.
    #[test]
    fn row_folds_keep_each_rows_order() {
        let mut state = 7u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 * 1e-3 - 8e3
        };
        for (rows, n) in [(1, 1), (7, 3), (8, 1), (8, 256), (9, 5), (17, 33), (64, 2)] {
            let v: Vec<f32> = (0..rows * n).map(|_| next()).collect();
            for f in [|a: f32, b: f32| a + b, nan_max, |a: f32, b: f32| a * b] {
                let want: Vec<u32> = v.chunks(n).map(|row| row.iter().skip(1).fold(row[0], |a, &x| f(a, x)).to_bits()).collect();
                let got: Vec<u32> = fold_axis(&v, rows, n, 1, f).iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{rows} rows of {n}");
            }
        }
    }

    /// `f32` dots against an `f64` reference, for shapes that take each of the GEMM crate's
    /// paths (a vector on either side, tiny products, blocked ones, a split over the pool) and
    /// each transposition. The result's memory starts uninitialized, so each product is made
    /// right after freeing a buffer of its size full of NaNs: were any element left unwritten,
    /// or read before written, the allocator's reuse of that buffer would show.
    #[test]
    fn f32_dots_write_every_element_of_the_product() {
        let mut state = 3u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 23) as f32 - 1.0
        };
        for (m, k, n) in
            [(1, 5, 1), (1, 7, 9), (9, 7, 1), (3, 4, 5), (16, 16, 16), (17, 33, 19), (100, 3, 70), (512, 64, 128), (4, 0, 3)]
        {
            for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
                let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
                let (br, bc) = if trans_b { (n, k) } else { (k, n) };
                let at = |i: usize, p: usize| f64::from(if trans_a { a[p * m + i] } else { a[i * k + p] });
                let bt = |p: usize, j: usize| f64::from(if trans_b { b[j * k + p] } else { b[p * n + j] });
                drop(std::hint::black_box(vec![f32::NAN; m * n]));
                let got = dot_f32(
                    Matrix { data: &a, rows: ar, cols: ac, stride: ac },
                    Matrix { data: &b, rows: br, cols: bc, stride: bc },
                    trans_a,
                    trans_b,
                );
                assert_eq!(got.shape, [m, n]);
                let Data::F(c) = &got.data else { panic!("an f32 product") };
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                        let g = f64::from(c[i * n + j]);
                        assert!(
                            (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{m}x{k}x{n} {trans_a} {trans_b} at ({i}, {j}): {g} against {want}"
                        );
                    }
                }
            }
        }
    }

    /// Row maxima and minima in lanes give the in-order fold's bits: rows of distinct values,
    /// rows whose extreme is a tie of `-0.0` and `0.0` in either order, NaNs (with payloads)
    /// anywhere, infinities, and rows shorter and longer than the lanes.
    #[test]
    fn row_extremes_are_the_in_order_fold() {
        let quiet_nan = f32::from_bits(0x7fc0_0001);
        let specials = [0.0, -0.0, f32::NAN, -f32::NAN, quiet_nan, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, 1e-40];
        let mut state = 11u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state >> 8 // the high bits: an LCG's low bits repeat with short periods
        };
        for n in [1, 3, 15, 16, 17, 40, 256] {
            for _ in 0..400 {
                // Mostly small negative values, so that zeros are often the extreme.
                let row: Vec<f32> = (0..n)
                    .map(|_| match next() % 8 {
                        0 => specials[(next() % specials.len() as u32) as usize],
                        1 | 2 => [0.0, -0.0][(next() % 2) as usize],
                        _ => -((next() % 1000) as f32),
                    })
                    .collect();
                let rows: Vec<f32> = row.iter().chain(&row).copied().collect();
                for (got, f) in
                    [(extreme_rows::<true>(&rows, n), nan_max as fn(f32, f32) -> f32), (extreme_rows::<false>(&rows, n), nan_min)]
                {
                    let want = row[1..].iter().fold(row[0], |a, &x| f(a, x));
                    assert_eq!(got.len(), 2);
                    assert!(got.iter().all(|g| g.to_bits() == want.to_bits()), "{row:?}: {got:?}, in order {want:?}");
                }
            }
        }
    }
}
