//! Host arrays: the data a launch reads and writes, one `Vec` per dtype.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::ir::{DType, Type};

/// The elements of a host array.
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u16` elements.
    U16(Vec<u16>),
}

/// Elements borrowed from memory someone else owns (a caller's numpy array): what a host-memory
/// backend reads inputs from without a copy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DataRef<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `f16` elements.
    F16(&'a [f16]),
    /// `bf16` elements.
    BF16(&'a [bf16]),
    /// `i32` elements.
    I32(&'a [i32]),
    /// `u32` elements.
    U32(&'a [u32]),
    /// `bool` elements.
    Bool(&'a [bool]),
    /// `i8` elements.
    I8(&'a [i8]),
    /// `u8` elements.
    U8(&'a [u8]),
    /// `i16` elements.
    I16(&'a [i16]),
    /// `u16` elements.
    U16(&'a [u16]),
}

impl ArrayData {
    /// The elements, borrowed.
    pub fn as_data_ref(&self) -> DataRef<'_> {
        match self {
            ArrayData::F32(v) => DataRef::F32(v),
            ArrayData::F16(v) => DataRef::F16(v),
            ArrayData::BF16(v) => DataRef::BF16(v),
            ArrayData::I32(v) => DataRef::I32(v),
            ArrayData::U32(v) => DataRef::U32(v),
            ArrayData::Bool(v) => DataRef::Bool(v),
            ArrayData::I8(v) => DataRef::I8(v),
            ArrayData::U8(v) => DataRef::U8(v),
            ArrayData::I16(v) => DataRef::I16(v),
            ArrayData::U16(v) => DataRef::U16(v),
        }
    }
}

impl<'a> DataRef<'a> {
    /// The elements of `dtype` in little-endian `bytes`, without a copy: `None` where they cannot
    /// be read in place (a big-endian machine, bytes not aligned for the dtype, a `bool` byte
    /// that is neither 0 nor 1), and the caller copies instead.
    pub fn from_le_bytes(dtype: DType, bytes: &'a [u8]) -> Option<DataRef<'a>> {
        if cfg!(target_endian = "big") {
            return None;
        }
        Some(match dtype {
            DType::F32 => DataRef::F32(bytemuck::try_cast_slice(bytes).ok()?),
            DType::F16 => DataRef::F16(bytemuck::try_cast_slice(bytes).ok()?),
            DType::BF16 => DataRef::BF16(bytemuck::try_cast_slice(bytes).ok()?),
            DType::I32 => DataRef::I32(bytemuck::try_cast_slice(bytes).ok()?),
            DType::U32 => DataRef::U32(bytemuck::try_cast_slice(bytes).ok()?),
            DType::Bool => DataRef::Bool(bytemuck::checked::try_cast_slice(bytes).ok()?),
            DType::I8 => DataRef::I8(bytemuck::try_cast_slice(bytes).ok()?),
            DType::U8 => DataRef::U8(bytes),
            DType::I16 => DataRef::I16(bytemuck::try_cast_slice(bytes).ok()?),
            DType::U16 => DataRef::U16(bytemuck::try_cast_slice(bytes).ok()?),
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            DataRef::F32(v) => v.len(),
            DataRef::F16(v) => v.len(),
            DataRef::BF16(v) => v.len(),
            DataRef::I32(v) => v.len(),
            DataRef::U32(v) => v.len(),
            DataRef::Bool(v) => v.len(),
            DataRef::I8(v) => v.len(),
            DataRef::U8(v) => v.len(),
            DataRef::I16(v) => v.len(),
            DataRef::U16(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes each element's bit pattern (as [`HostArray::from_bits`] takes it) into `out` as the
/// little-endian bytes of `dtype`; `out` holds exactly `bits.len()` elements.
pub fn write_le_bits(dtype: DType, bits: impl IntoIterator<Item = u32>, out: &mut [u8]) {
    let width = (dtype.bits() / 8) as usize;
    for (chunk, b) in out.chunks_exact_mut(width).zip(bits) {
        match width {
            4 => chunk.copy_from_slice(&b.to_le_bytes()),
            2 => chunk.copy_from_slice(&(b as u16).to_le_bytes()),
            _ => chunk[0] = b as u8, // `bool`'s bits are 0 or 1
        }
    }
}

/// Each element's bit pattern (as [`write_le_bits`] writes it, zero-extended) read from the
/// little-endian bytes of `dtype` in `bytes`.
pub fn read_le_bits(dtype: DType, bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let width = (dtype.bits() / 8).max(1) as usize;
    bytes.chunks_exact(width).map(move |c| match width {
        4 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        2 => u32::from(u16::from_le_bytes([c[0], c[1]])),
        _ => u32::from(c[0]),
    })
}

/// A dense row-major array on the host (shape `[]` for a scalar).
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements in row-major order; `shape.iter().product()` of them.
    pub data: ArrayData,
}

impl HostArray {
    /// An array of zeros.
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostArray {
        // `vec![zero; n]` asks the allocator for zeroed memory: untouched pages stay untouched.
        let n = shape.iter().product();
        let data = match dtype {
            DType::F32 => ArrayData::F32(vec![0.0; n]),
            DType::F16 => ArrayData::F16(vec![f16::ZERO; n]),
            DType::BF16 => ArrayData::BF16(vec![bf16::ZERO; n]),
            DType::I32 => ArrayData::I32(vec![0; n]),
            DType::U32 => ArrayData::U32(vec![0; n]),
            DType::Bool => ArrayData::Bool(vec![false; n]),
            DType::I8 => ArrayData::I8(vec![0; n]),
            DType::U8 => ArrayData::U8(vec![0; n]),
            DType::I16 => ArrayData::I16(vec![0; n]),
            DType::U16 => ArrayData::U16(vec![0; n]),
        };
        HostArray { shape: shape.to_vec(), data }
    }

    /// Builds an array from each element's bit pattern (the low bits for 8- and 16-bit types, 0/1
    /// for bool).
    pub fn from_bits(dtype: DType, shape: &[usize], bits: Vec<u32>) -> HostArray {
        let data = match dtype {
            DType::F32 => ArrayData::F32(bits.into_iter().map(f32::from_bits).collect()),
            DType::F16 => ArrayData::F16(bits.into_iter().map(|b| f16::from_bits(b as u16)).collect()),
            DType::BF16 => ArrayData::BF16(bits.into_iter().map(|b| bf16::from_bits(b as u16)).collect()),
            DType::I32 => ArrayData::I32(bits.into_iter().map(|b| b as i32).collect()),
            DType::U32 => ArrayData::U32(bits),
            DType::Bool => ArrayData::Bool(bits.into_iter().map(|b| b != 0).collect()),
            DType::I8 => ArrayData::I8(bits.into_iter().map(|b| b as i8).collect()),
            DType::U8 => ArrayData::U8(bits.into_iter().map(|b| b as u8).collect()),
            DType::I16 => ArrayData::I16(bits.into_iter().map(|b| b as i16).collect()),
            DType::U16 => ArrayData::U16(bits.into_iter().map(|b| b as u16).collect()),
        };
        HostArray { shape: shape.to_vec(), data }
    }

    /// Each element's bit pattern, as [`HostArray::from_bits`] takes it.
    pub fn to_bits(&self) -> Vec<u32> {
        match &self.data {
            ArrayData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            ArrayData::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            ArrayData::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            ArrayData::I32(v) => v.iter().map(|&x| x as u32).collect(),
            ArrayData::U32(v) => v.clone(),
            ArrayData::Bool(v) => v.iter().map(|&x| u32::from(x)).collect(),
            ArrayData::I8(v) => v.iter().map(|&x| u32::from(x as u8)).collect(),
            ArrayData::U8(v) => v.iter().map(|&x| u32::from(x)).collect(),
            ArrayData::I16(v) => v.iter().map(|&x| u32::from(x as u16)).collect(),
            ArrayData::U16(v) => v.iter().map(|&x| u32::from(x)).collect(),
        }
    }

    /// Every element as an `f64` (for comparisons and reports).
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            ArrayData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            ArrayData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            ArrayData::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::U32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
            ArrayData::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::U16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.data {
            ArrayData::F32(_) => DType::F32,
            ArrayData::F16(_) => DType::F16,
            ArrayData::BF16(_) => DType::BF16,
            ArrayData::I32(_) => DType::I32,
            ArrayData::U32(_) => DType::U32,
            ArrayData::Bool(_) => DType::Bool,
            ArrayData::I8(_) => DType::I8,
            ArrayData::U8(_) => DType::U8,
            ArrayData::I16(_) => DType::I16,
            ArrayData::U16(_) => DType::U16,
        }
    }

    /// The array's type.
    pub fn ty(&self) -> Type {
        Type::array(self.dtype(), self.shape.clone())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl HostArray {
    /// The elements as little-endian bytes: borrowed where the memory already is (every dtype
    /// but `bool` on a little-endian machine), copied otherwise.
    pub fn le_bytes(&self) -> Cow<'_, [u8]> {
        fn pod<T: bytemuck::Pod, const N: usize>(v: &[T], le: impl Fn(T) -> [u8; N]) -> Cow<'_, [u8]> {
            if cfg!(target_endian = "little") {
                Cow::Borrowed(bytemuck::cast_slice(v))
            } else {
                Cow::Owned(v.iter().flat_map(|&x| le(x)).collect())
            }
        }
        match &self.data {
            ArrayData::F32(v) => pod(v, f32::to_le_bytes),
            ArrayData::F16(v) => pod(v, |x: f16| x.to_le_bytes()),
            ArrayData::BF16(v) => pod(v, |x: bf16| x.to_le_bytes()),
            ArrayData::I32(v) => pod(v, i32::to_le_bytes),
            ArrayData::U32(v) => pod(v, u32::to_le_bytes),
            ArrayData::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
            ArrayData::I8(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            ArrayData::U8(v) => Cow::Borrowed(v),
            ArrayData::I16(v) => pod(v, i16::to_le_bytes),
            ArrayData::U16(v) => pod(v, u16::to_le_bytes),
        }
    }

    /// The elements as little-endian bytes to be written, in place: `None` for `bool` (one byte
    /// per element, but not every byte is a `bool`) and on a big-endian machine.
    pub fn le_bytes_mut(&mut self) -> Option<&mut [u8]> {
        if cfg!(target_endian = "big") {
            return None;
        }
        Some(match &mut self.data {
            ArrayData::F32(v) => bytemuck::cast_slice_mut(v),
            ArrayData::F16(v) => bytemuck::cast_slice_mut(v),
            ArrayData::BF16(v) => bytemuck::cast_slice_mut(v),
            ArrayData::I32(v) => bytemuck::cast_slice_mut(v),
            ArrayData::U32(v) => bytemuck::cast_slice_mut(v),
            ArrayData::Bool(_) => return None,
            ArrayData::I8(v) => bytemuck::cast_slice_mut(v),
            ArrayData::U8(v) => v,
            ArrayData::I16(v) => bytemuck::cast_slice_mut(v),
            ArrayData::U16(v) => bytemuck::cast_slice_mut(v),
        })
    }

    /// An array from little-endian bytes (one copy); an error names what does not fit.
    pub fn from_le_bytes(dtype: DType, shape: &[usize], b: &[u8]) -> Result<HostArray, String> {
        let width = (dtype.bits() / 8) as usize;
        let n: usize = shape.iter().product();
        if b.len() != n * width {
            return Err(format!("{} bytes for {n} elements of {dtype}, expected {}", b.len(), n * width));
        }
        fn pod<T: bytemuck::Pod, const N: usize>(b: &[u8], le: impl Fn([u8; N]) -> T) -> Vec<T> {
            if cfg!(target_endian = "little") {
                bytemuck::pod_collect_to_vec(b)
            } else {
                b.chunks_exact(N).map(|c| le(c.try_into().expect("N bytes"))).collect()
            }
        }
        let data = match dtype {
            DType::F32 => ArrayData::F32(pod(b, f32::from_le_bytes)),
            DType::I32 => ArrayData::I32(pod(b, i32::from_le_bytes)),
            DType::U32 => ArrayData::U32(pod(b, u32::from_le_bytes)),
            DType::F16 => ArrayData::F16(pod(b, f16::from_le_bytes)),
            DType::BF16 => ArrayData::BF16(pod(b, bf16::from_le_bytes)),
            DType::Bool => ArrayData::Bool(b.iter().map(|&x| x != 0).collect()),
            DType::I8 => ArrayData::I8(bytemuck::cast_slice(b).to_vec()),
            DType::U8 => ArrayData::U8(b.to_vec()),
            DType::I16 => ArrayData::I16(pod(b, i16::from_le_bytes)),
            DType::U16 => ArrayData::U16(pod(b, u16::from_le_bytes)),
        };
        Ok(HostArray { shape: shape.to_vec(), data })
    }

    /// The array as it crosses the plugin boundary by value (downloads).
    pub fn to_rarray(&self) -> crate::abi::RArray {
        crate::abi::RArray {
            dtype: self.dtype().name().into(),
            shape: self.shape.iter().map(|&d| d as u64).collect(),
            bytes: self.le_bytes().into_owned().into(),
        }
    }

    /// A borrowed view for the plugin boundary (uploads): no copy where [`HostArray::le_bytes`]
    /// borrows.
    pub fn with_rarray_ref<T>(&self, f: impl FnOnce(crate::abi::RArrayRef<'_>) -> T) -> T {
        let shape: Vec<u64> = self.shape.iter().map(|&d| d as u64).collect();
        let bytes = self.le_bytes();
        f(crate::abi::RArrayRef {
            dtype: abi_stable::std_types::RStr::from_str(self.dtype().name()),
            shape: abi_stable::std_types::RSlice::from_slice(&shape),
            bytes: abi_stable::std_types::RSlice::from_slice(&bytes),
        })
    }

    /// The inverse of [`HostArray::to_rarray`].
    pub fn from_rarray(r: &crate::abi::RArray) -> Result<HostArray, String> {
        let shape: Vec<usize> = r.shape.iter().map(|&d| d as usize).collect();
        HostArray::from_le_bytes(parse_dtype(r.dtype.as_str())?, &shape, r.bytes.as_slice())
    }

    /// The inverse of [`HostArray::with_rarray_ref`].
    pub fn from_rarray_ref(r: &crate::abi::RArrayRef<'_>) -> Result<HostArray, String> {
        let shape: Vec<usize> = r.shape.iter().map(|&d| d as usize).collect();
        HostArray::from_le_bytes(parse_dtype(r.dtype.as_str())?, &shape, r.bytes.as_slice())
    }
}

fn parse_dtype(name: &str) -> Result<DType, String> {
    DType::from_name(name).ok_or_else(|| format!("unknown dtype `{name}`"))
}

/// How far apart two results of one dtype may be: `|a - b| <= atol + rtol * |b|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tolerance {
    /// The tolerance tessel uses to compare backends: exact for integers and bool, a few ulp of
    /// accumulated error for floats.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance { atol: 1e-5, rtol: 1e-4 },
            DType::F16 => Tolerance { atol: 1e-3, rtol: 1e-2 },
            DType::BF16 => Tolerance { atol: 1e-2, rtol: 2e-2 },
            _ => Tolerance { atol: 0.0, rtol: 0.0 }, // integers and bool: exact
        }
    }

    /// Whether `got` is close enough to `want` (NaN matches NaN, infinities must match exactly).
    pub fn close(self, got: f64, want: f64) -> bool {
        if got.is_nan() || want.is_nan() {
            return got.is_nan() && want.is_nan();
        }
        if got.is_infinite() || want.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }
}

/// The largest `|got - want|` over two arrays of the same length (NaN where they disagree on NaN).
pub fn max_abs_error(got: &HostArray, want: &HostArray) -> f64 {
    got.to_f64().iter().zip(want.to_f64()).fold(0.0, |m: f64, (&g, w)| {
        if m.is_nan() || (g.is_nan() && w.is_nan()) || g == w {
            m
        } else {
            let e = (g - w).abs();
            if e.is_nan() { f64::NAN } else { m.max(e) }
        }
    })
}

/// How an output compares with a reference output of the same type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// The tolerance of the reference's dtype.
    pub tolerance: Tolerance,
    /// The largest `|got - want|` (NaN where they disagree on NaN).
    pub max_abs_error: f64,
    /// Whether every element is within the tolerance.
    pub within: bool,
}

/// Compares `got` with `want` element by element, in one pass.
pub fn agreement(got: &HostArray, want: &HostArray) -> Agreement {
    let tolerance = Tolerance::for_dtype(want.dtype());
    let (g, w) = (got.to_f64(), want.to_f64());
    let within = g.len() == w.len() && g.iter().zip(&w).all(|(&a, &b)| tolerance.close(a, b));
    Agreement { tolerance, max_abs_error: max_abs_error(got, want), within }
}
