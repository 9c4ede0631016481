//! The Hopper path (`tessel_mosaic_gpu::wgmma`): which kernels take it and the plan they get, and
//! its PTX on the emulator (TMA, mbarriers, wgmma) against a product computed here in `f64`, in
//! both thread orders; a wrong swizzle, a missing wait or a swapped fragment makes it disagree.

use tessel_mosaic_gpu::lower::{KernelPlan, plan};
use tessel_mosaic_gpu::wgmma::Init;
use tessel_plugin_api::ir::{DType, parse::parse, verify::verify};
use tessel_ptx_emu::{Memory, TensorMap};

fn planned(text: &str) -> tessel_mosaic_gpu::lower::KernelPlan {
    let m = parse(text).unwrap_or_else(|e| panic!("{e:?}"));
    let v = verify(&m.kernels[0]).unwrap_or_else(|e| panic!("{e:?}"));
    plan(&v, None, Default::default()).expect("plans")
}

fn matmul(dtype: &str, blocks: (usize, usize, usize), body: &str) -> String {
    // Two blocks of rows and of columns, four steps: the grid covers the arrays.
    let (bm, bn, bk) = blocks;
    let (m, n, k) = (2 * bm, 2 * bn, 4 * bk);
    format!(
        "kernel mm\n  grid (i: 2, j: 2, k: 4 seq)\n  in a: {dtype}[{m}, {k}] block [{bm}, {bk}] at (i, k)\n  in b: {dtype}[{k}, {n}] block [{bk}, {bn}] at (k, j)\n  out c: f32[{m}, {n}] block [{bm}, {bn}] at (i, j)\n{{\n{body}}}\n"
    )
}

const ACCUMULATE: &str = "  %k = program_id k\n  %first = eq %k, 0\n  when %first {\n    %z = zeros : f32[BM, BN]\n    store c, %z\n  }\n  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  %acc = load c\n  %sum = add %acc, %p\n  store c, %sum\n";

fn accumulate(bm: usize, bn: usize) -> String {
    ACCUMULATE.replace("BM", &bm.to_string()).replace("BN", &bn.to_string())
}

#[test]
fn a_bf16_matmul_accumulated_over_seq_steps_takes_the_hopper_path() {
    let p = planned(&matmul("bf16", (128, 256, 64), &accumulate(128, 256)));
    let g = p.gemm.clone().expect("the Hopper path");
    assert_eq!((g.bm, g.bn, g.bk, g.steps, g.stages, g.init), (128, 256, 64, 4, 4, Init::Zero));
    assert_eq!((p.warpgroups, p.threads(), p.ctas), (2, 256, 4));
    // Four stages of (128x64 + 64x256) bf16, then four mbarriers.
    assert_eq!(p.shared_bytes(), 4 * 49152 + 32);
    assert_eq!(g.maps[0].boxes, [64, 128]);
    assert_eq!(g.maps[1].boxes, [64, 64]);
}

#[test]
fn without_the_zeroing_the_accumulator_starts_from_the_output() {
    let body = accumulate(128, 128).lines().skip(6).map(|l| format!("{l}\n")).collect::<String>();
    let g = planned(&matmul("f16", (128, 128, 64), &body)).gemm.expect("the Hopper path");
    assert_eq!(g.init, Init::Output);
}

#[test]
fn a_full_of_zeros_zeroes_the_accumulator_as_zeros_does() {
    let body = accumulate(128, 128).replace("zeros : f32[128, 128]", "full 0.0 : f32[128, 128]");
    assert_eq!(planned(&matmul("bf16", (128, 128, 64), &body)).gemm.expect("the Hopper path").init, Init::Zero);
    // Negative zero is not the accumulator's +0.0 (-0 + -0 stays -0): not a zeroing.
    let body = accumulate(128, 128).replace("zeros : f32[128, 128]", "full -0.0 : f32[128, 128]");
    assert!(planned(&matmul("bf16", (128, 128, 64), &body)).gemm.is_none());
}

#[test]
fn other_kernels_take_the_general_path() {
    // f32 operands: the accurate mma.sync path.
    assert!(planned(&matmul("f32", (64, 64, 64), &accumulate(64, 64))).gemm.is_none());
    // A block of 32 rows is not a warpgroup's 64; 32 of the contraction is not a swizzle row.
    assert!(planned(&matmul("bf16", (32, 64, 64), &accumulate(32, 64))).gemm.is_none());
    assert!(planned(&matmul("bf16", (64, 64, 32), &accumulate(64, 64))).gemm.is_none());
    // Something else in the body: an elementwise op on the product.
    let scaled = accumulate(64, 64).replace("%p = dot %a, %b\n", "%q = dot %a, %b\n  %p = mul %q, 2.0\n");
    assert!(planned(&matmul("bf16", (64, 64, 64), &scaled)).gemm.is_none());
    // The product stored at every step (not accumulated) keeps the last step's.
    let stored = "  %a = load a\n  %b = load b\n  %p = dot %a, %b\n  store c, %p\n";
    assert!(planned(&matmul("bf16", (64, 64, 64), stored)).gemm.is_none());
}

/// Deterministic small values as the bits of `dtype` (16-bit), and their values.
fn operand(n: usize, seed: u64, dtype: DType) -> (Vec<u16>, Vec<f64>) {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((x >> 40) % 2001) as f32 / 1000.0 - 1.0;
            if dtype == DType::BF16 {
                let h = half::bf16::from_f32(v);
                (h.to_bits(), h.to_f64())
            } else {
                let h = half::f16::from_f32(v);
                (h.to_bits(), h.to_f64())
            }
        })
        .unzip()
}

/// Runs the plan's PTX (or `ptx`) on the emulator: the outputs of `c`, or the emulator's error.
fn emulate(p: &KernelPlan, ptx: &str, a: &[u16], b: &[u16], reverse: bool) -> Result<Vec<f32>, String> {
    let k = p.kernel.kernel();
    let g = p.gemm.as_ref().expect("the Hopper path");
    let module = tessel_ptx_emu::parse(ptx)?;
    let mut mem = Memory::default();
    let shape = |n: &str| k.param(n).expect("argument").ty.shape.clone();
    let (sa, sb) = (shape(&g.a), shape(&g.b));
    let (pa, pb) = (mem.alloc(a.len() * 2), mem.alloc(b.len() * 2));
    mem.write_halves(pa, a);
    mem.write_halves(pb, b);
    let so = shape(&g.out);
    let half = g.out_dtype != DType::F32;
    let pc = mem.alloc(so[0] * so[1] * if half { 2 } else { 4 });
    let map = |address: u64, s: &[usize], i: usize| TensorMap {
        address,
        dims: vec![s[1] as u64, s[0] as u64],
        strides: vec![s[1] as u64 * 2],
        elem_bytes: 2,
        boxes: g.maps[i].boxes.clone(),
        swizzle: 128,
    };
    let maps = [map(pa, &sa, 0), map(pb, &sb, 1)];
    module.launch_with_maps(&mut mem, &[pa, pb, pc], &maps, p.ctas as u32, p.threads(), p.shared_bytes() as usize, reverse)?;
    let n = so[0] * so[1];
    Ok(match g.out_dtype {
        DType::BF16 => mem.read_halves(pc, n).into_iter().map(|h| half::bf16::from_bits(h).to_f32()).collect(),
        DType::F16 => mem.read_halves(pc, n).into_iter().map(|h| half::f16::from_bits(h).to_f32()).collect(),
        _ => mem.read_words(pc, n).into_iter().map(f32::from_bits).collect(),
    })
}

/// c = a b (b given [N, K] when `trans_b`) in `f64`.
fn product(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize), trans_b: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * if trans_b { b[j * k + p] } else { b[p * n + j] }).sum();
        }
    }
    c
}

/// Within `f32`'s tolerance, or a `bf16` output's (8 bits: one rounding of the sum).
fn agrees(got: &[f32], want: &[f64]) -> Result<(), String> {
    agrees_within(got, want, 1e-4)
}

fn agrees_within(got: &[f32], want: &[f64], rel: f64) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (f64::from(*g) - w).abs() > 1e-4 + rel * w.abs() || g.is_nan() {
            return Err(format!("element {i}: {g} against {w}"));
        }
    }
    Ok(())
}

struct Case {
    plan: KernelPlan,
    ptx: String,
    a: Vec<u16>,
    b: Vec<u16>,
    want: Vec<f64>,
}

/// A kernel file of tests/in, its plan and PTX, operands and the product they should give.
fn case(file: &str, trans_b: bool) -> Case {
    let text = std::fs::read_to_string(format!("{}/../../tests/in/{file}.tk", env!("CARGO_MANIFEST_DIR"))).expect("kernel file");
    case_of(&text, trans_b)
}

fn case_of(text: &str, trans_b: bool) -> Case {
    let plan = planned(text);
    let k = plan.kernel.kernel();
    let (sa, sb) = (k.param("a").unwrap().ty.clone(), k.param("b").unwrap().ty.clone());
    let (a, av) = operand(sa.numel(), 1, sa.dtype);
    let (b, bv) = operand(sb.numel(), 2, sb.dtype);
    let n = if trans_b { sb.shape[0] } else { sb.shape[1] };
    let want = product(&av, &bv, (sa.shape[0], n, sa.shape[1]), trans_b);
    let ptx = tessel_mosaic_gpu::emit::emit(&plan);
    Case { plan, ptx, a, b, want }
}

#[test]
fn the_hopper_path_agrees_with_an_f64_product_in_both_thread_orders() {
    for (file, trans_b) in [("wgmma_bf16", false), ("wgmma_f16_wide", true), ("wgmma_steps", false)] {
        let c = case(file, trans_b);
        let g = c.plan.gemm.as_ref().expect("the Hopper path");
        assert!(file != "wgmma_steps" || g.steps > g.stages, "{file}: refills its stages");
        assert!(c.ptx.contains("cp.async.bulk.tensor.2d") && c.ptx.contains("wgmma.mma_async"), "{file}");
        for reverse in [false, true] {
            let got = emulate(&c.plan, &c.ptx, &c.a, &c.b, reverse).unwrap_or_else(|e| panic!("{file}: {e}"));
            agrees(&got, &c.want).unwrap_or_else(|e| panic!("{file} (reverse: {reverse}): {e}"));
        }
    }
}

#[test]
fn a_scratch_accumulator_written_at_the_last_step_takes_the_path_and_agrees() {
    let c = case("wgmma_scratch", false);
    let g = c.plan.gemm.as_ref().expect("the Hopper path");
    assert_eq!((g.c.as_str(), g.out.as_str(), g.out_dtype, g.init), ("acc", "o", DType::BF16, Init::Zero));
    for reverse in [false, true] {
        let got = emulate(&c.plan, &c.ptx, &c.a, &c.b, reverse).expect("emulates");
        // The f32 sum rounded once to bf16: within 2^-8 of the product.
        agrees_within(&got, &c.want, 1.0 / 256.0).unwrap_or_else(|e| panic!("reverse: {reverse}: {e}"));
    }
    // Without the `when` at the last step the scratch goes nowhere: the general path.
    let text = std::fs::read_to_string(format!("{}/../../tests/in/wgmma_scratch.tk", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let cut = text.replace("%last = eq %k, 2", "%last = eq %k, 1");
    assert!(planned(&cut).gemm.is_none());
}

#[test]
fn f16_and_bf16_in_128x128_and_128x256_tiles_agree() {
    for dtype in ["f16", "bf16"] {
        for bn in [128, 256] {
            let c = case_of(&matmul(dtype, (128, bn, 64), &accumulate(128, bn)), false);
            let g = c.plan.gemm.as_ref().expect("the Hopper path");
            assert_eq!((g.bm, g.bn, g.warpgroups()), (128, bn, 2));
            let got = emulate(&c.plan, &c.ptx, &c.a, &c.b, bn == 256).unwrap_or_else(|e| panic!("{dtype} 128x{bn}: {e}"));
            agrees(&got, &c.want).unwrap_or_else(|e| panic!("{dtype} 128x{bn}: {e}"));
        }
    }
}

/// What a mutated PTX gives: disagreement or an emulator error, never agreement.
fn bites(c: &Case, what: &str, ptx: &str) {
    assert_ne!(ptx, c.ptx, "{what}: the mutation changed nothing");
    for reverse in [false, true] {
        if let Ok(got) = emulate(&c.plan, ptx, &c.a, &c.b, reverse) {
            assert!(agrees(&got, &c.want).is_err(), "{what} (reverse: {reverse}) still agrees");
        }
    }
}

#[test]
fn a_wrong_swizzle_a_missing_wait_or_a_swapped_fragment_disagrees() {
    let c = case("wgmma_bf16", false);
    let lines = |keep: &dyn Fn(&str) -> bool| c.ptx.lines().filter(|l| keep(l)).map(|l| format!("{l}\n")).collect::<String>();
    // Descriptors that say 64-byte swizzle over data the copies swizzled by 128.
    let swizzle =
        c.ptx.lines().map(|l| if l.starts_with("\tor.b64") { l.replace(", 0x4", ", 0x8") } else { l.to_string() } + "\n");
    bites(&c, "a 64-byte swizzle", &swizzle.collect::<String>());
    // No wait for the copies: the wgmmas read shared memory before they land.
    bites(&c, "no mbarrier wait", &lines(&|l| !l.contains("mbarrier.try_wait") && !l.contains("bra $L_wait")));
    // No wait for the wgmmas: the epilogue stores the accumulator before it is written.
    bites(&c, "no wgmma wait", &lines(&|l| !l.contains("wgmma.wait_group")));
    // Two accumulator registers swapped in the fragment.
    bites(&c, "a swapped fragment", &c.ptx.replace("{%f1, %f2,", "{%f2, %f1,"));
}
