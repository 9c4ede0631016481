//! Pure mappings the writer uses everywhere: dtypes to PTX type names and widths, literals to
//! the bits the workspace holds, float immediates, row-major strides. No `Writer`.

use tessel_plugin_api::ir::{BinaryOp, DType, Literal, ReduceOp};
/// The binary operation a reduction combines its elements with.
pub(super) fn combining(op: ReduceOp) -> BinaryOp {
    match op {
        ReduceOp::Sum => BinaryOp::Add,
        ReduceOp::Prod => BinaryOp::Mul,
        ReduceOp::Max => BinaryOp::Max,
        ReduceOp::Min => BinaryOp::Min,
    }
}

/// `0f3F800000`: a float immediate.
pub(super) fn f32_imm(v: f32) -> String {
    format!("0f{:08X}", v.to_bits())
}

/// The bits of a literal as an element of `dtype` in the workspace (16-bit floats are held as
/// the `f32` of their value, as the interpreter holds them).
pub(super) fn lit_bits(lit: Literal, dtype: DType) -> u32 {
    match dtype {
        DType::Bool => u32::from(lit.as_f64() != 0.0),
        DType::F16 => half::f16::from_f32(lit.as_f64() as f32).to_f32().to_bits(),
        DType::BF16 => half::bf16::from_f32(lit.as_f64() as f32).to_f32().to_bits(),
        DType::F32 => (lit.as_f64() as f32).to_bits(),
        // Integers as their registers hold them: 32 bits, sign-extended where signed.
        d => d.wrap(lit.as_i64()) as u32,
    }
}

/// Whether elements of `d` are 16-bit floats, which arrays hold as 2 bytes an element.
pub fn half_bits(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

pub use crate::limits::element_bytes;

/// The `ld` type of an array element of `d` (read into a 32-bit register: 8- and 16-bit integers
/// sign- or zero-extended as their type is).
pub(super) fn load_ty(d: DType) -> &'static str {
    match d {
        DType::I8 => "s8",
        DType::U8 => "u8",
        DType::I16 => "s16",
        DType::F16 | DType::BF16 | DType::U16 => "u16",
        _ => "b32",
    }
}

/// The `st` type of an array element of `d` (the low bits of a 32-bit register).
pub(super) fn store_ty(d: DType) -> &'static str {
    match element_bytes(d) {
        1 => "u8",
        2 => "u16",
        _ => "b32",
    }
}

/// The PTX type name of a 16-bit float.
pub(super) fn half_ty(d: DType) -> &'static str {
    if d == DType::BF16 { "bf16" } else { "f16" }
}

pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The width-suffix for comparisons and integer ops of a dtype.
pub(super) fn int_ty(d: DType) -> &'static str {
    if d.is_signed() { "s32" } else { "u32" }
}
