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
