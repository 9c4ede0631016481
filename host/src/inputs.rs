//! Seeded random inputs, for `tessel run` without `--input`.

use std::collections::BTreeMap;

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tessel_plugin_api::array::{ArrayData, HostArray};
use tessel_plugin_api::ir::{DType, Kernel, ParamKind};

/// Elements per chunk of a random array: each chunk has its own generator, so chunks fill in
/// parallel and the values do not depend on the number of threads.
const CHUNK: usize = 1 << 16;

/// One array per `in` argument, in declaration order: floats uniform in [-1, 1), signed integers
/// in [-100, 100), unsigned ones in [0, 100), `bool` fair coins. Chunk `c` of the `a`-th argument comes
/// from its own Xoshiro256++ (see [`stream`]): the same values for the same seed on every
/// machine, filled on every core.
pub fn random_inputs(kernel: &Kernel, seed: u64) -> BTreeMap<String, HostArray> {
    kernel
        .params_of(ParamKind::In)
        .enumerate()
        .map(|(a, p)| {
            let n = p.ty.numel();
            let data = match p.ty.dtype {
                DType::F32 => ArrayData::F32(uniform(n, seed, a)),
                DType::F16 => ArrayData::F16(uniform(n, seed, a).into_iter().map(f16::from_f32).collect()),
                DType::BF16 => ArrayData::BF16(uniform(n, seed, a).into_iter().map(bf16::from_f32).collect()),
                DType::I32 => ArrayData::I32(fill(n, seed, a, |r| r.random_range(-100..100))),
                DType::U32 => ArrayData::U32(fill(n, seed, a, |r| r.random_range(0..100))),
                DType::Bool => ArrayData::Bool(fill(n, seed, a, |r| r.random_bool(0.5))),
                DType::I8 => ArrayData::I8(fill(n, seed, a, |r| r.random_range(-100..100))),
                DType::U8 => ArrayData::U8(fill(n, seed, a, |r| r.random_range(0..100))),
                DType::I16 => ArrayData::I16(fill(n, seed, a, |r| r.random_range(-100..100))),
                DType::U16 => ArrayData::U16(fill(n, seed, a, |r| r.random_range(0..100))),
            };
            (p.name.clone(), HostArray { shape: p.ty.shape.clone(), data })
        })
        .collect()
}

/// The generator of chunk `chunk` of argument `array`: Xoshiro256++ whose 256-bit state is the
/// BLAKE3 hash of `seed`, `array` and `chunk` (each a little-endian `u64`), so every chunk's
/// stream is its own. Xoshiro256++ makes 4 MB of words in about half ChaCha8's time.
fn stream(seed: u64, array: usize, chunk: usize) -> Xoshiro256PlusPlus {
    let mut key = blake3::Hasher::new();
    for part in [seed, array as u64, chunk as u64] {
        key.update(&part.to_le_bytes());
    }
    Xoshiro256PlusPlus::from_seed(*key.finalize().as_bytes())
}

/// `n` floats uniform in [-1, 1), a chunk of [`CHUNK`] per task: one float per 32-bit word of the
/// stream's bytes (each 64-bit output gives two, its low half first; an odd last one is the
/// high half of one more), mapped as rand's `UniformFloat` maps a word, in bulk (the words as
/// one fill, then one vectorised loop from words to floats: faster here than one loop doing
/// both).
fn uniform(n: usize, seed: u64, array: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut v = vec![0u32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        stream(seed, array, c).fill(chunk);
        // rand's `UniformFloat`: 23 random bits as a float in [1, 2), less 1, scaled by the
        // range's width (2) and moved to its start (-1).
        chunk.iter_mut().for_each(|w| *w = ((f32::from_bits(*w >> 9 | 0x3F80_0000) - 1.0) * 2.0 - 1.0).to_bits());
    });
    v.into_iter().map(f32::from_bits).collect()
}

/// `n` values of `draw`, a chunk of [`CHUNK`] per task.
fn fill<T: Send + Default + Clone>(
    n: usize,
    seed: u64,
    array: usize,
    draw: impl Fn(&mut Xoshiro256PlusPlus) -> T + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let mut v = vec![T::default(); n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let mut rng = stream(seed, array, c);
        chunk.iter_mut().for_each(|x| *x = draw(&mut rng));
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    /// The values depend on the seed alone: not on how many threads fill the chunks, and chunk
    /// `c` of argument `a` comes from Xoshiro256++ keyed by BLAKE3 of the seed, `a` and `c`, as
    /// documented.
    #[test]
    fn random_inputs_do_not_depend_on_the_threads() {
        let k = tessel_plugin_api::ir::parse(
            "kernel k\n  in x: f32[200000]\n  in y: i32[70000]\n  in z: f32[3]\n  out o: f32[200000]\n{\n  %x = load x\n  store o, %x\n}\n",
        )
        .expect("parses")
        .kernels
        .remove(0);
        let on = |threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| random_inputs(&k, 9));
        let (one, four) = (on(1), on(4));
        assert_eq!(one, four);
        assert_ne!(one, random_inputs(&k, 10));
        let ArrayData::F32(x) = &one["x"].data else { panic!("f32") };
        // Chunk `c` of argument `a`: the generator keyed by BLAKE3 of (9, a, c) as little-endian u64s.
        let keyed = |a: u64, c: u64| {
            let key: Vec<u8> = [9u64, a, c].iter().flat_map(|p| p.to_le_bytes()).collect();
            Xoshiro256PlusPlus::from_seed(*blake3::hash(&key).as_bytes())
        };
        let word = keyed(0, 1).next_u64();
        // The low word first, as a float in [-1, 1): 23 bits, an exponent of 0, less 1, times 2,
        // less 1 (what rand's `UniformFloat` makes of a `u32`).
        let float = |w: u64| (f32::from_bits((w as u32) >> 9 | 0x3F80_0000) - 1.0) * 2.0 - 1.0;
        assert_eq!(x[CHUNK..CHUNK + 2], [float(word), float(word >> 32)], "chunk 1 of argument 0");
        let ArrayData::I32(y) = &one["y"].data else { panic!("i32") };
        assert_eq!(y[0], keyed(1, 0).random_range(-100..100), "chunk 0 of argument 1");
        // An odd count: the last float is the stream's next `u32` (in Xoshiro256++ the high half
        // of one more word), as rand's `fill` makes it.
        let ArrayData::F32(z) = &one["z"].data else { panic!("f32") };
        let mut rng = keyed(2, 0);
        let (w0, w1) = (rng.next_u64(), rng.next_u32());
        assert_eq!(z[..], [float(w0), float(w0 >> 32), float(w1.into())], "argument 2, three floats");
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
