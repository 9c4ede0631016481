//! Host arrays: the data a launch reads and writes, one `Vec` per dtype.

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
        let n = shape.iter().product();
        HostArray::from_bits(dtype, shape, vec![0; n])
    }

    /// Builds an array from each element's bit pattern (low bits for 16-bit types, 0/1 for bool).
    pub fn from_bits(dtype: DType, shape: &[usize], bits: Vec<u32>) -> HostArray {
        let data = match dtype {
            DType::F32 => ArrayData::F32(bits.into_iter().map(f32::from_bits).collect()),
            DType::F16 => ArrayData::F16(bits.into_iter().map(|b| f16::from_bits(b as u16)).collect()),
            DType::BF16 => ArrayData::BF16(bits.into_iter().map(|b| bf16::from_bits(b as u16)).collect()),
            DType::I32 => ArrayData::I32(bits.into_iter().map(|b| b as i32).collect()),
            DType::U32 => ArrayData::U32(bits),
            DType::Bool => ArrayData::Bool(bits.into_iter().map(|b| b != 0).collect()),
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
    /// The array as it crosses the plugin boundary: dtype name, shape, little-endian bytes.
    pub fn to_rarray(&self) -> crate::abi::RArray {
        let width = (self.dtype().bits() / 8) as usize;
        let mut bytes = Vec::with_capacity(self.len() * width);
        for b in self.to_bits() {
            bytes.extend_from_slice(&b.to_le_bytes()[..width]);
        }
        crate::abi::RArray {
            dtype: self.dtype().name().into(),
            shape: self.shape.iter().map(|&d| d as u64).collect(),
            bytes: bytes.into(),
        }
    }

    /// The inverse of [`HostArray::to_rarray`]; an error names what does not fit.
    pub fn from_rarray(r: &crate::abi::RArray) -> Result<HostArray, String> {
        let dtype = DType::from_name(r.dtype.as_str()).ok_or_else(|| format!("unknown dtype `{}`", r.dtype))?;
        let shape: Vec<usize> = r.shape.iter().map(|&d| d as usize).collect();
        let width = (dtype.bits() / 8) as usize;
        let n: usize = shape.iter().product();
        if r.bytes.len() != n * width {
            return Err(format!("{} bytes for {n} elements of {dtype}, expected {}", r.bytes.len(), n * width));
        }
        let bits = r
            .bytes
            .chunks_exact(width)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..width].copy_from_slice(c);
                u32::from_le_bytes(b)
            })
            .collect();
        Ok(HostArray::from_bits(dtype, &shape, bits))
    }
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
            DType::I32 | DType::U32 | DType::Bool => Tolerance { atol: 0.0, rtol: 0.0 },
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
