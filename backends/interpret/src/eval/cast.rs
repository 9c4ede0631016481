//! Conversions between dtypes: `cast` converts each value, `bitcast` reinterprets its bits.

use tessel_plugin_api::ir::DType;

use super::float::round_all;
use super::value::{Data, Slice, Val, View};

/// Integers of `to` from values given as `i64`: wrapped to its width (sign-extended where signed).
fn ints(to: DType, v: impl Iterator<Item = i64>) -> Data {
    if to.is_signed() { Data::I(v.map(|x| to.wrap(x) as i32).collect()) } else { Data::U(v.map(|x| to.wrap(x) as u32).collect()) }
}

pub(crate) fn cast(a: View<'_>, to: DType) -> Val {
    let data = match (a.data, to) {
        (Slice::F(v), DType::I32) => Data::I(v.iter().map(|&x| x as i32).collect()),
        (Slice::F(v), DType::U32) => Data::U(v.iter().map(|&x| x as u32).collect()),
        // Truncated toward zero, saturated at the type's limits, NaN to 0 (as Rust's `as` does).
        (Slice::F(v), d) if d.is_int() => {
            let (lo, hi) = d.int_range().expect("an integer type");
            ints(d, v.iter().map(|&x| if x.is_nan() { 0 } else { (x as i64).clamp(lo, hi) }))
        }
        (Slice::F(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0.0).collect()),
        (Slice::F(v), d) => Data::F(round_all(d, v.to_vec())),
        (Slice::I(v), DType::I32) => Data::I(v.to_vec()),
        (Slice::I(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0).collect()),
        (Slice::I(v), d) if d.is_int() => ints(d, v.iter().map(|&x| i64::from(x))),
        (Slice::I(v), d) => Data::F(round_all(d, v.iter().map(|&x| x as f32).collect())),
        (Slice::U(v), DType::U32) => Data::U(v.to_vec()),
        (Slice::U(v), DType::Bool) => Data::B(v.iter().map(|&x| x != 0).collect()),
        (Slice::U(v), d) if d.is_int() => ints(d, v.iter().map(|&x| i64::from(x))),
        (Slice::U(v), d) => Data::F(round_all(d, v.iter().map(|&x| x as f32).collect())),
        (Slice::B(v), DType::Bool) => Data::B(v.to_vec()),
        (Slice::B(v), d) if d.is_int() => ints(d, v.iter().map(|&x| i64::from(x))),
        (Slice::B(v), _) => Data::F(v.iter().map(|&x| f32::from(u8::from(x))).collect()),
    };
    Val { dtype: to, shape: a.shape.to_vec(), data }
}

pub(crate) fn bitcast(a: &Val, to: DType) -> Val {
    Val::from_bits(to, a.shape.clone(), a.to_bits())
}
