//! The float rules every operation keeps: `f16` and `bf16` values (held as `f32`) rounded to
//! their dtype after each operation, and a maximum and minimum that propagate NaN.

use half::{bf16, f16};
use tessel_plugin_api::ir::DType;

pub(super) fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Signed integers narrower than 32 bits (held as `i32`) wrapped to their width after an
/// operation; `i32` values unchanged.
pub(super) fn wrap_i(dtype: DType, mut v: Vec<i32>) -> Vec<i32> {
    match dtype {
        DType::I8 => v.iter_mut().for_each(|x| *x = i32::from(*x as i8)),
        DType::I16 => v.iter_mut().for_each(|x| *x = i32::from(*x as i16)),
        _ => {}
    }
    v
}

/// Unsigned integers narrower than 32 bits (held as `u32`) wrapped to their width.
pub(super) fn wrap_u(dtype: DType, mut v: Vec<u32>) -> Vec<u32> {
    match dtype {
        DType::U8 => v.iter_mut().for_each(|x| *x &= 0xff),
        DType::U16 => v.iter_mut().for_each(|x| *x &= 0xffff),
        _ => {}
    }
    v
}

pub(super) fn round_all(dtype: DType, mut v: Vec<f32>) -> Vec<f32> {
    if matches!(dtype, DType::F16 | DType::BF16) {
        v.iter_mut().for_each(|x| *x = round(dtype, *x));
    }
    v
}

/// Maximum that propagates NaN (`a > b` is false when either is NaN; `a + b` is then NaN).
pub(super) fn nan_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else if b >= a {
        b
    } else {
        a + b
    }
}

/// Minimum that propagates NaN.
pub(super) fn nan_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else if b <= a {
        b
    } else {
        a + b
    }
}
