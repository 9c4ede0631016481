//! Block values and the operations on whole blocks. Floats of every precision are held as `f32`
//! and rounded to their dtype after each operation, which gives exactly the IEEE result of `f16`
//! and `bf16` arithmetic for the basic operations (f32 has more than twice their precision).
//!
//! The files, each importing only files above it in this list; this one declares them and
//! re-exports what the rest of the crate calls:
//! - `float.rs`: rounding to a dtype, and the maximum and minimum that propagate NaN;
//! - `layout.rs`: row-major strides, numpy broadcasting of shapes and of element slices;
//! - `value.rs`: the block value ([`Val`]), its borrowed forms ([`View`], [`Slice`]), its bit
//!   patterns;
//! - `elementwise.rs`: `unary`, `binary` (also straight into a store's memory), `compare`,
//!   `select`;
//! - `cast.rs`: `cast` and `bitcast`;
//! - `shape.rs`: `broadcast`, `reshape`, `transpose`;
//! - `reduce.rs`: reductions along an axis;
//! - `dot.rs`: `dot`, the `f32` one through the `gemm` crate.

mod cast;
mod dot;
mod elementwise;
mod fastmath;
mod float;
mod layout;
mod reduce;
mod shape;
mod value;

pub(crate) use cast::{bitcast, cast};
pub(crate) use dot::{Matrix, dot, dot_f32, warm_gemm};
pub(crate) use elementwise::{Put, Sink, binary, binary_into, compare, select, unary};
pub(crate) use layout::{expand, strides};
pub(crate) use reduce::reduce;
pub(crate) use shape::{broadcast_to, concatenate, reshape, slice, transpose};
pub(crate) use value::{Data, Slice, Val, View};
