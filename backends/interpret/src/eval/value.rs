//! The block value ([`Val`]), its elements ([`Data`]) and its borrowed forms ([`View`],
//! [`Slice`]): constructors, scalars read back, and the bit patterns that stores write.

use half::{bf16, f16};
use tessel_plugin_api::ir::{DType, Literal};

use super::float::round;
use super::layout::strides;

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

    /// No elements, of the same kind, with room for `n`.
    pub fn empty_with_capacity(&self, n: usize) -> Data {
        match self {
            Data::F(_) => Data::F(Vec::with_capacity(n)),
            Data::I(_) => Data::I(Vec::with_capacity(n)),
            Data::U(_) => Data::U(Vec::with_capacity(n)),
            Data::B(_) => Data::B(Vec::with_capacity(n)),
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

/// A block value's elements, borrowed: from a [`Val`], or in place from an argument's memory or
/// a part of a value (the fused runs' chunks).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slice<'a> {
    F(&'a [f32]),
    I(&'a [i32]),
    U(&'a [u32]),
    B(&'a [bool]),
}

impl<'a> Slice<'a> {
    /// The elements in `r`.
    pub fn range(self, r: std::ops::Range<usize>) -> Slice<'a> {
        match self {
            Slice::F(v) => Slice::F(&v[r]),
            Slice::I(v) => Slice::I(&v[r]),
            Slice::U(v) => Slice::U(&v[r]),
            Slice::B(v) => Slice::B(&v[r]),
        }
    }
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
            d if d.is_signed() => Data::I(vec![d.wrap(lit.as_i64()) as i32; n]),
            d if d.is_unsigned() => Data::U(vec![d.wrap(lit.as_i64()) as u32; n]),
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
            DType::I8 => Data::I(bits.into_iter().map(|b| i32::from(b as i8)).collect()),
            DType::I16 => Data::I(bits.into_iter().map(|b| i32::from(b as i16)).collect()),
            DType::U8 => Data::U(bits.into_iter().map(|b| b & 0xff).collect()),
            DType::U16 => Data::U(bits.into_iter().map(|b| b & 0xffff).collect()),
        };
        Val { dtype, shape, data }
    }

    pub(super) fn with(&self, shape: Vec<usize>, data: Data) -> Val {
        Val { dtype: self.dtype, shape, data }
    }
}
