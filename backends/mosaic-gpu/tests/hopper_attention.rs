//! The Hopper attention path (`tessel_mosaic_gpu::attention`): which kernels take it and the
//! plan they get, and its PTX on the emulator (TMA, mbarriers, two `wgmma`s a trip, the softmax's
//! row reductions by `shfl.sync`) against attention computed here in `f64`, in both thread
//! orders. A wrong swizzle of the probabilities, a missing wait or a row reduction over the
//! wrong lanes makes it disagree.

use tessel_mosaic_gpu::lower::{KernelPlan, plan};
use tessel_plugin_api::ir::{DType, parse::parse, verify::verify};
use tessel_ptx_emu::{Memory, TensorMap};

fn kernel_file(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../tests/in/{name}.tk", env!("CARGO_MANIFEST_DIR"))).expect("kernel file")
}

fn planned(text: &str) -> KernelPlan {
    let m = parse(text).unwrap_or_else(|e| panic!("{e:?}"));
    let v = verify(&m.kernels[0]).unwrap_or_else(|e| panic!("{e:?}"));
    plan(&v, None, Default::default()).expect("plans")
}

#[test]
fn flash_attention_in_16_bit_floats_takes_the_hopper_path() {
    let p = planned(&kernel_file("attention_f16"));
    let a = p.attention.as_ref().expect("the Hopper attention path");
    assert!(p.gemm.is_none());
    assert_eq!((a.bq, a.d, a.bkv, a.dv, a.stages, a.dtype), (64, 64, 64, 128, 3, DType::F16));
    // `add %ascaled, %pv`: the product accumulates into the scaled output's registers.
    assert_eq!(a.folded.as_deref(), Some("an"));
    assert_eq!((p.warpgroups, p.ctas), (1, 3));
    // The query block, the probabilities, three stages of a key and a value block, four mbarriers.
    assert_eq!(p.shared_bytes(), 64 * 64 * 2 + 64 * 64 * 2 + 3 * (64 * 64 * 2 + 64 * 128 * 2) + 32);
    assert_eq!(p.tensor_maps().iter().map(|m| m.boxes.clone()).collect::<Vec<_>>(), [[64, 64], [64, 64], [64, 64]]);

    let p = planned(&kernel_file("attention_causal_bf16"));
    let a = p.attention.as_ref().expect("the Hopper attention path");
    assert_eq!((a.bq, a.dtype, p.warpgroups, p.threads()), (128, DType::BF16, 2, 256));
    assert_eq!(a.folded.as_deref(), Some("an"));

    // 128-row blocks of head dimension 128: three stages would pass the 227 KiB of shared
    // memory, two fit.
    let text = std::fs::read_to_string(format!("{}/../../benches/kernels/attention_bf16_16384.tk", env!("CARGO_MANIFEST_DIR")))
        .expect("kernel file");
    let p = planned(&text);
    let a = p.attention.as_ref().expect("the Hopper attention path");
    assert_eq!((a.bq, a.d, a.bkv, a.dv, a.stages, p.ctas), (128, 128, 128, 128, 2, 128));
    assert!(p.shared_bytes() <= 227 * 1024 && p.shared_bytes() + a.stage_bytes() > 227 * 1024);
}

#[test]
fn other_kernels_keep_the_general_path() {
    let f16 = kernel_file("attention_f16");
    let general = |text: &str, why: &str| {
        let p = planned(text);
        assert!(p.attention.is_none() && p.gemm.is_none(), "{why}: took a Hopper path");
    };
    // f32 operands: no 16-bit wgmma.
    general(&f16.replace("f16[", "f32[").replace("cast %p : f32[64, 64]", "mul %p, 1.0"), "f32 operands");
    // The scores read once more, outside the dots: a row vector `[64]` broadcast along the
    // columns of a block is not a row of the accumulator layout.
    general(
        &f16.replace(
            "    %bm = max %ss axis 1 keepdims\n",
            "    %bv = max %ss axis 1\n    %bw = broadcast %bv : f32[64, 64]\n    %bm = max %bw axis 1 keepdims\n",
        ),
        "a column broadcast",
    );
    // A store inside the loop.
    general(
        &f16.replace("    yield %mn, %ln, %an\n", "    %t = cast %an : f16[64, 128]\n    store o, %t\n    yield %mn, %ln, %an\n"),
        "a store in the loop",
    );
    // An `if` without results (it would only guard statements).
    general(
        &f16.replace(
            "    %ss = mul %s, 0.125\n",
            "    %ss = mul %s, 0.125\n    %c = gt %j, 0\n    if %c {\n      %u = add %j, 1\n    } else {\n    }\n",
        ),
        "an if without results",
    );
    // Key rows from a carried value: a later trip's start is not known before the trip.
    general(
        &f16.replace("iter (%mi = %m0", "iter (%row = %z0, %mi = %m0")
            .replace("  %q = load q\n", "  %q = load q\n  %z0 = program_id i\n")
            .replace("ds(%j, 64)", "ds(%row, 64)")
            .replace("%m, %l, %acc = for", "%rr, %m, %l, %acc = for")
            .replace("    yield %mn, %ln, %an\n", "    %row2 = add %row, 64\n    yield %row2, %mn, %ln, %an\n"),
        "a carried start",
    );
    // Keys and values from one array.
    general(
        &f16.replace("load v[ds(%j, 64), :]", "load k[ds(%j, 64), :]")
            .replace("v: f16[320, 128]", "v: f16[320, 64]")
            .replace("[64, 128]", "[64, 64]")
            .replace("[192, 128]", "[192, 64]"),
        "one array for both",
    );
    // Key blocks of 32 rows: not a 64-element swizzle row of the probabilities.
    general(
        &f16.replace("ds(%j, 64)", "ds(%j, 32)").replace("step 64", "step 32").replace("%p : f16[64, 64]", "%p : f16[64, 32]"),
        "32-row key blocks",
    );
}

/// A deterministic operand of `n` 16-bit floats in about [-1, 1): its bits, and its values.
fn operand(n: usize, seed: u64, dtype: DType) -> (Vec<u16>, Vec<f64>) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            match dtype {
                DType::BF16 => {
                    let h = half::bf16::from_f32(v);
                    (h.to_bits(), f64::from(h.to_f32()))
                }
                _ => {
                    let h = half::f16::from_f32(v);
                    (h.to_bits(), f64::from(h.to_f32()))
                }
            }
        })
        .unzip()
}

/// softmax(q kᵀ / √d, masked where `causal` and the key is after the query) v, in `f64`.
fn attention(q: &[f64], k: &[f64], v: &[f64], (sq, sk, d, dv): (usize, usize, usize, usize), causal: bool) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0.0; sq * dv];
    for i in 0..sq {
        let keys = if causal { (i + 1).min(sk) } else { sk };
        let s: Vec<f64> = (0..keys).map(|j| (0..d).map(|p| q[i * d + p] * k[j * d + p]).sum::<f64>() * scale).collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        for c in 0..dv {
            o[i * dv + c] = (0..keys).map(|j| e[j] * v[j * dv + c]).sum::<f64>() / l;
        }
    }
    o
}

/// The kernel's PTX run on the emulator: its output as `f32`.
fn emulate(p: &KernelPlan, ptx: &str, inputs: [&[u16]; 3], reverse: bool) -> Result<Vec<f32>, String> {
    let k = p.kernel.kernel();
    let module = tessel_ptx_emu::parse(ptx)?;
    let mut mem = Memory::default();
    let mut args = Vec::new();
    let mut maps = Vec::new();
    for (name, data) in ["q", "k", "v"].into_iter().zip(inputs) {
        let s = k.param(name).expect("argument").ty.shape.clone();
        let at = mem.alloc(data.len() * 2);
        mem.write_halves(at, data);
        args.push(at);
        let spec = p.tensor_maps().iter().find(|m| m.array == name).expect("a tensor map");
        maps.push(TensorMap {
            address: at,
            dims: vec![s[1] as u64, s[0] as u64],
            strides: vec![s[1] as u64 * 2],
            elem_bytes: 2,
            boxes: spec.boxes.clone(),
            swizzle: 128,
        });
    }
    let out = k.param("o").expect("output").ty.clone();
    let n = out.numel();
    let half = out.dtype != DType::F32;
    let at = mem.alloc(n * if half { 2 } else { 4 });
    args.push(at);
    module.launch_with_maps(&mut mem, &args, &maps, p.ctas as u32, p.threads(), p.shared_bytes() as usize, reverse)?;
    Ok(match out.dtype {
        DType::BF16 => mem.read_halves(at, n).into_iter().map(|h| half::bf16::from_bits(h).to_f32()).collect(),
        DType::F16 => mem.read_halves(at, n).into_iter().map(|h| half::f16::from_bits(h).to_f32()).collect(),
        _ => mem.read_words(at, n).into_iter().map(f32::from_bits).collect(),
    })
}

#[test]
fn the_hopper_attention_agrees_with_attention_in_f64_in_both_thread_orders() {
    // The benchmark's kernel (128-row key blocks, head dimension 128, two stages) at 384
    // positions, so that the emulator runs it in a moment.
    let bench = std::fs::read_to_string(format!("{}/../../benches/kernels/attention_bf16_16384.tk", env!("CARGO_MANIFEST_DIR")))
        .expect("kernel file")
        .replace("16384", "384")
        .replace("grid (i: 128)", "grid (i: 3)");
    let cases = [
        ("attention_f16", kernel_file("attention_f16"), false),
        ("attention_causal_bf16", kernel_file("attention_causal_bf16"), true),
        ("attention_bf16_384", bench, false),
    ];
    for (file, text, causal) in cases {
        let p = planned(&text);
        assert!(p.attention.is_some(), "{file}: the Hopper attention path");
        let k = p.kernel.kernel();
        let shape = |n: &str| k.param(n).expect("argument").ty.shape.clone();
        let (sq, sk, dv) = (shape("q"), shape("k"), shape("v")[1]);
        let dtype = k.param("q").expect("q").ty.dtype;
        let (q, qv) = operand(sq[0] * sq[1], 1, dtype);
        let (kk, kv) = operand(sk[0] * sk[1], 2, dtype);
        let (v, vv) = operand(sk[0] * dv, 3, dtype);
        let want = attention(&qv, &kv, &vv, (sq[0], sk[0], sq[1], dv), causal);
        let ptx = tessel_mosaic_gpu::emit::emit(&p);
        for reverse in [false, true] {
            let got = emulate(&p, &ptx, [&q, &kk, &v], reverse).unwrap_or_else(|e| panic!("{file}: {e}"));
            // The probabilities are rounded to the operands' 16-bit type before `P V`, and an
            // f16/bf16 output once more: a few units of that type's last place.
            let rel = if dtype == DType::BF16 { 2e-2 } else { 4e-3 };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= rel * (1.0 + w.abs()) && !g.is_nan(),
                    "{file} (reverse={reverse}) element {i}: {g} against {w}"
                );
            }
        }
    }
}
