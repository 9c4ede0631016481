//! Conversions between dtypes: `cast` converts each value, `bitcast` reinterprets its bits.

use tessel_plugin_api::ir::DType;

use super::float::round_all;
use super::value::{Data, Slice, Val, View};

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
