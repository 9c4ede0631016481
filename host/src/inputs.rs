//! Seeded random inputs, for `tessel run` without `--input`.

use std::collections::BTreeMap;

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessel_plugin_api::array::{ArrayData, HostArray};
use tessel_plugin_api::ir::{DType, Kernel, ParamKind};

/// One array per `in` argument, in declaration order from one ChaCha8 stream seeded with `seed`:
/// floats uniform in [-1, 1), `i32` in [-100, 100), `u32` in [0, 100), `bool` fair coins.
pub fn random_inputs(kernel: &Kernel, seed: u64) -> BTreeMap<String, HostArray> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    kernel
        .params_of(ParamKind::In)
        .map(|p| {
            let n = p.ty.numel();
            let data = match p.ty.dtype {
                DType::F32 => ArrayData::F32((0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()),
                DType::F16 => ArrayData::F16((0..n).map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0))).collect()),
                DType::BF16 => ArrayData::BF16((0..n).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect()),
                DType::I32 => ArrayData::I32((0..n).map(|_| rng.random_range(-100..100)).collect()),
                DType::U32 => ArrayData::U32((0..n).map(|_| rng.random_range(0..100)).collect()),
                DType::Bool => ArrayData::Bool((0..n).map(|_| rng.random_bool(0.5)).collect()),
            };
            (p.name.clone(), HostArray { shape: p.ty.shape.clone(), data })
        })
        .collect()
}
