//! WGSL spellings of IR dtypes and literals, and the moves between registers and the `u32`
//! words of storage: pure functions of their arguments, no plan and no writer. The writer
//! (`emit/`) and the maths functions (`libm.rs`, which writes float constants with [`float_lit`])
//! both use them; this file imports nothing of this crate.

use tessel_plugin_api::ir::{DType, Literal};

/// The WGSL type of a register holding an element of `d`.
pub(crate) fn reg_ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 | DType::I8 | DType::I16 => "i32",
        DType::U32 | DType::U8 | DType::U16 => "u32",
        DType::Bool => "bool",
    }
}

/// The WGSL element type of an argument buffer of `d`.
pub(crate) fn buf_ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 | DType::I8 | DType::I16 => "i32",
        DType::U32 | DType::Bool | DType::U8 | DType::U16 => "u32",
    }
}

/// A literal as a WGSL expression of the register type of `d`.
pub(crate) fn literal(l: Literal, d: DType) -> String {
    match d {
        DType::Bool => (l.as_f64() != 0.0).to_string(),
        d if d.is_signed() => {
            let v = d.wrap(l.as_i64()) as i32;
            if v == i32::MIN { "i32(-2147483648)".into() } else { format!("{v}i") }
        }
        d if d.is_unsigned() => format!("{}u", d.wrap(l.as_i64()) as u32),
        _ => {
            let v = l.as_f64() as f32;
            let v = match d {
                DType::F16 => half::f16::from_f32(v).to_f32(),
                DType::BF16 => half::bf16::from_f32(v).to_f32(),
                _ => v,
            };
            opaque_f32(v)
        }
    }
}

/// An `f32` as WGSL. Infinities and NaN go through a helper, since naga refuses non-finite
/// constants; so do zeros, since a driver that may assume no infinity, NaN or signed zero
/// (Vulkan without `SignedZeroInfNanPreserve`, which Mesa's lavapipe does not honour) folds
/// `x * 0.0` and `x / 0.0` to 0 and `x + 0.0` to `x` when it sees the constant. The helper's
/// bits pass through `tk_zero`, a zero the compiler cannot see (`emit/header.rs`).
pub(crate) fn float_lit(v: f32) -> String {
    if v.is_finite() && v != 0.0 { format!("{v:?}f") } else { format!("tk_f32_bits({}u)", v.to_bits()) }
}

/// A kernel's float literal: always through `tk_f32_bits`, its value in a comment. lavapipe folds
/// with any zero it can compute, not only a written one: `floor(0.5) * x` to 0, `x / (1.5 - 1.5)`
/// to 0 (`tests/in/regressions/computed_zero.tk`), so no float the kernel computes may start from
/// a constant the driver sees. (The libm functions' constants only meet run-time values.)
fn opaque_f32(v: f32) -> String {
    format!("tk_f32_bits({}u /* {v:?} */)", v.to_bits())
}

/// Register value to a `u32` storage word.
pub(crate) fn to_word(d: DType, x: &str) -> String {
    match d {
        d if d.is_unsigned() => x.to_string(),
        DType::Bool => format!("select(0u, 1u, {x})"),
        _ => format!("bitcast<u32>({x})"),
    }
}

/// A `u32` storage word to a register value.
pub(crate) fn from_word(d: DType, w: &str) -> String {
    match d {
        d if d.is_unsigned() => w.to_string(),
        DType::Bool => format!("({w} != 0u)"),
        d if d.is_signed() => format!("bitcast<i32>({w})"),
        _ => format!("bitcast<f32>({w})"),
    }
}
