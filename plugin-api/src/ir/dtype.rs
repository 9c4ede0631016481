//! Element types: their names in `.tk` text, their widths, and the integer rules (wrapping,
//! limits) every backend computes by.

use std::fmt;

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary16.
    F16,
    /// bfloat16: the top 16 bits of an `f32`.
    BF16,
    /// Two's complement 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Boolean.
    Bool,
    /// Two's complement 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Two's complement 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
}

impl DType {
    /// Every dtype, in the order the language lists them.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::I32,
        DType::U32,
        DType::Bool,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
    ];

    /// The name used in `.tk` text.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
        }
    }

    /// Looks a dtype up by its `.tk` name.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// `f32`, `f16` or `bf16`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// An integer of any width.
    pub fn is_int(self) -> bool {
        self.is_signed() || self.is_unsigned()
    }

    /// `i8`, `i16` or `i32`.
    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32)
    }

    /// `u8`, `u16` or `u32`.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32)
    }

    /// An integer narrower than 32 bits: computed as `i32` (signed) or `u32` (unsigned), wrapped to
    /// its width after every operation.
    pub fn is_narrow_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I16 | DType::U16)
    }

    /// The 32-bit type an integer is computed in (`i32` or `u32`); other dtypes are their own.
    pub fn widened(self) -> DType {
        match self {
            DType::I8 | DType::I16 => DType::I32,
            DType::U8 | DType::U16 => DType::U32,
            d => d,
        }
    }

    /// An integer's value wrapped to its width (sign-extended for signed types); a value of any
    /// other dtype unchanged.
    pub fn wrap(self, v: i64) -> i64 {
        match self {
            DType::I8 => i64::from(v as i8),
            DType::U8 => i64::from(v as u8),
            DType::I16 => i64::from(v as i16),
            DType::U16 => i64::from(v as u16),
            DType::I32 => i64::from(v as i32),
            DType::U32 => i64::from(v as u32),
            _ => v,
        }
    }

    /// The least and greatest values of an integer type.
    pub fn int_range(self) -> Option<(i64, i64)> {
        match self {
            DType::I8 => Some((i8::MIN.into(), i8::MAX.into())),
            DType::U8 => Some((0, u8::MAX.into())),
            DType::I16 => Some((i16::MIN.into(), i16::MAX.into())),
            DType::U16 => Some((0, u16::MAX.into())),
            DType::I32 => Some((i32::MIN.into(), i32::MAX.into())),
            DType::U32 => Some((0, u32::MAX.into())),
            _ => None,
        }
    }

    /// A float or an integer (not `bool`).
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// Width in bits (`bool` counts as 8).
    pub fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::Bool | DType::I8 | DType::U8 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
