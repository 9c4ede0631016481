//! Launches on memory the caller owns (`Planned::launch_in_place`, what the Python module uses):
//! the same outputs, bit for bit, as the launch on host arrays, on the interpreter (which reads
//! the inputs in place and writes each output once) and on wgpu (buffers: one upload from the
//! caller's memory, one download into it), for f32, f16 and bf16, a launch of two kernels (which
//! goes through buffers), and inputs whose bytes are not aligned for their dtype.

mod common;

use std::collections::BTreeMap;

use common::*;
use tessel::{BytesMut, BytesRef, HostArray, InPlace, LaunchArgs, Runtime};
use tessel_plugin_api::ir::Verified;

fn kernels(path: &str) -> Vec<Verified> {
    tessel::load_file(&root().join(path)).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `kernels` both ways on `backend`; `shift` moves every input's bytes one byte off
/// alignment first.
fn both_ways(rt: &Runtime, backend: &str, kernels: &[Verified], shift: bool) {
    let calls: Vec<tessel::Call> = kernels.iter().map(|kernel| tessel::Call::new(kernel.clone())).collect();
    let mut inputs = BTreeMap::new();
    for k in kernels {
        inputs.extend(tessel::inputs::random_inputs(k.kernel(), 11));
    }
    let args = LaunchArgs { inputs, grid: Default::default() };
    let want = launched(&rt, backend, &calls, &args).unwrap_or_else(|e| panic!("{backend}: {e}"));
    let bytes: BTreeMap<String, Vec<u8>> = args
        .inputs
        .iter()
        .map(|(n, a)| {
            let b = a.le_bytes().into_owned();
            (n.clone(), if shift { [vec![0u8], b].concat() } else { b })
        })
        .collect();
    let mut memory: BTreeMap<String, Vec<u8>> = want.iter().map(|(n, a)| (n.clone(), vec![0xa5u8; a.le_bytes().len()])).collect();
    let mut place = InPlace::default();
    for (n, a) in &args.inputs {
        let b = &bytes[n];
        place.inputs.insert(n.clone(), BytesRef { ty: a.ty(), bytes: if shift { &b[1..] } else { b } });
    }
    for ((n, m), (_, w)) in memory.iter_mut().zip(&want) {
        place.outputs.insert(n.clone(), BytesMut { ty: w.ty(), bytes: m, keep: false });
    }
    let report = rt
        .plan(tessel::Choice::of(backend), &tessel::Launch::new(calls.clone(), [], place.grid.clone()))
        .and_then(|p| p.run_in_place(&mut place))
        .unwrap_or_else(|e| panic!("{backend}: {e}"));
    assert_eq!(report.backend, backend);
    drop(place);
    for (name, w) in &want {
        let got = HostArray::from_le_bytes(w.dtype(), &w.shape, &memory[name]).expect("bytes of the output's type");
        assert_eq!(got.to_bits(), w.to_bits(), "{backend}: output {name} of {:?} (shifted: {shift})", kernels[0].name());
    }
}

#[test]
fn in_place_launches_give_the_outputs_of_host_array_launches() {
    let rt = Runtime::new(&[]).expect("runtime");
    let mut backends = vec!["interpret"];
    if wgpu_adapter("in_place_launches_give_the_outputs_of_host_array_launches").is_some() {
        backends.push("wgpu");
    }
    for backend in backends {
        // Output memory starts as 0xa5 bytes: kernels that overwrite their outputs whole (softmax,
        // ragged) and kernels that must see zeros first (a masked store, a matmul accumulating
        // into its output) both give the host-array launch's zeros-first outputs.
        let files = ["examples/softmax.tk", "examples/ragged.tk", "examples/masked.tk", "examples/matmul.tk"];
        for file in files.into_iter().chain(["tests/in/half.tk", "tests/in/dot_half.tk"]) {
            for shift in [false, true] {
                both_ways(&rt, backend, &kernels(file)[..1], shift);
            }
        }
        // Two kernels in one launch: the interpreter runs them through buffers too.
        let two = kernels("tests/in/two_kernels.tk");
        if backend == "interpret" {
            both_ways(&rt, backend, &two, false);
        }
    }
}

#[test]
fn an_output_without_memory_of_its_type_is_refused() {
    let rt = Runtime::new(&[]).expect("runtime");
    let k = &kernels("examples/add.tk")[0];
    let calls = [tessel::Call::new(k.clone())];
    let x = vec![0u8; 4096];
    let mut small = vec![0u8; 16];
    let mut place = InPlace::default();
    for n in ["x", "y"] {
        place.inputs.insert(n.into(), BytesRef { ty: k.kernel().param(n).unwrap().ty.clone(), bytes: &x });
    }
    let ty = tessel_plugin_api::ir::Type::array(tessel_plugin_api::ir::DType::F32, [4usize]);
    place.outputs.insert("o".into(), BytesMut { ty, bytes: &mut small, keep: false });
    let err = rt
        .plan(tessel::Choice::of("interpret"), &tessel::Launch::new(calls.clone(), [], place.grid.clone()))
        .and_then(|p| p.run_in_place(&mut place))
        .unwrap_err()
        .to_string();
    assert!(err.contains("output `o` has no array of its type f32[1024] to be written into"), "{err}");
}

/// An output launched with `keep` (XLA's buffer of the input it aliases: Pallas's
/// `input_output_aliases`) starts from what its memory holds: the elements no program stores
/// keep it, a load sees it before the store, and the others start as zeros as always. For an f32
/// output (the interpreter writes it in place), a bf16 one (copied in and out), on the interpreter
/// and on wgpu (uploaded, not cleared at the launch).
#[test]
fn an_output_kept_starts_from_its_memory_and_keeps_what_no_program_stores() {
    let rt = Runtime::new(&[]).expect("runtime");
    let mut backends = vec!["interpret"];
    if wgpu_adapter("an_output_kept_starts_from_its_memory_and_keeps_what_no_program_stores").is_some() {
        backends.push("wgpu");
    }
    for dtype in ["f32", "bf16"] {
        // Program i doubles the first half of block i of `o` in place; `p`, not kept, gets the same
        // stores and so zeros elsewhere.
        let text = format!(
            "kernel k\n  grid (i: 2)\n  out o: {dtype}[16] block [8] at (i)\n  out p: {dtype}[16] block [8] at (i)\n{{\n  %a = load o[ds(0, 4)]\n  %b = mul %a, 2.0\n  store o[ds(0, 4)], %b\n  store p[ds(0, 4)], %b\n}}\n"
        );
        let k = &tessel::load_source("kept.tk", &text).unwrap_or_else(|e| panic!("{e}"))[0];
        let calls = [tessel::Call::new(k.clone())];
        let ty = k.kernel().param("o").unwrap().ty.clone();
        // Small integers, exact in bf16 too (whose bits are an f32's upper half).
        let bits = (0..16).map(|v| (v as f32 + 1.0).to_bits()).map(|b| if dtype == "bf16" { b >> 16 } else { b });
        let start = HostArray::from_bits(ty.dtype, &ty.shape, bits.collect());
        // By hand: doubled in elements 0..4 and 8..12, the starting values elsewhere; `p` the
        // same doubled values, zeros elsewhere.
        let want_o: Vec<f32> = (0..16).map(|e| (e as f32 + 1.0) * if e % 8 < 4 { 2.0 } else { 1.0 }).collect();
        let want_p: Vec<f32> = (0..16).map(|e| if e % 8 < 4 { (e as f32 + 1.0) * 2.0 } else { 0.0 }).collect();
        for backend in &backends {
            let mut o = start.le_bytes().into_owned();
            let mut p = start.le_bytes().into_owned();
            let mut place = InPlace::default();
            place.outputs.insert("o".into(), BytesMut { ty: ty.clone(), bytes: &mut o, keep: true });
            place.outputs.insert("p".into(), BytesMut { ty: ty.clone(), bytes: &mut p, keep: false });
            rt.plan(tessel::Choice::of(backend), &tessel::Launch::new(calls.clone(), [], place.grid.clone()))
                .and_then(|p| p.run_in_place(&mut place))
                .unwrap_or_else(|e| panic!("{backend}: {e}"));
            drop(place);
            let got = |b: &[u8]| HostArray::from_le_bytes(ty.dtype, &ty.shape, b).expect("bytes").to_f64();
            let as64 = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            assert_eq!(got(&o), as64(&want_o), "{backend} {dtype}: the kept output");
            assert_eq!(got(&p), as64(&want_p), "{backend} {dtype}: the output not kept starts as zeros");
        }
    }
}

/// A kept output that a backend would hold across `seq` steps (wgpu keeps such a block in
/// registers, starting from zeros, and writes it back whole) starts from its memory all the
/// same: each element its starting value plus one per step, on the interpreter (which holds the
/// block from the output's memory) and on wgpu (which lowers that launch again with the block in
/// memory, and still holds it in registers where it is not kept: there it starts as zeros). The
/// kept outputs are part of the compiled launch's key: kept and not kept are compiled once each,
/// and the second kept launch comes from the compile cache.
#[test]
fn a_kept_output_held_across_seq_steps_starts_from_its_memory_on_every_backend() {
    let rt = Runtime::new(&[]).expect("runtime");
    let text = "kernel k\n  grid (i: 2, s: 3 seq)\n  out o: f32[16] block [8] at (i)\n{\n  %a = load o\n  %b = add %a, 1.0\n  store o, %b\n}\n";
    let k = &tessel::load_source("held.tk", text).unwrap_or_else(|e| panic!("{e}"))[0];
    let calls = [tessel::Call::new(k.clone())];
    let ty = k.kernel().param("o").unwrap().ty.clone();
    let start: Vec<u8> = (0..16).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let run = |backend: &str, keep: bool| {
        let mut o = start.clone();
        let mut place = InPlace::default();
        place.outputs.insert("o".into(), BytesMut { ty: ty.clone(), bytes: &mut o, keep });
        let report = rt
            .plan(tessel::Choice::of(backend), &tessel::Launch::new(calls.clone(), [], place.grid.clone()))
            .and_then(|p| p.run_in_place(&mut place))
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        drop(place);
        (o.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>(), report.cache_hit)
    };
    let mut backends = vec!["interpret"];
    if wgpu_adapter("a_kept_output_held_across_seq_steps_starts_from_its_memory_on_every_backend").is_some() {
        backends.push("wgpu");
        let wgsl = lowered(&rt, "wgpu", &calls).expect("lowers").remove(0).1;
        assert!(wgsl.contains("in registers across the seq steps"), "not kept, the block is a register block:\n{wgsl}");
    }
    for backend in backends {
        // Kept, then not kept, then kept again: compiled, compiled, from the compile cache. (On
        // wgpu the launch not kept may have been compiled for the lowering above, unless the disk
        // cache of lowered text had it: its second run's hit is not asserted.)
        let kept = ((0..16).map(|v| v as f32 + 3.0).collect::<Vec<_>>(), false);
        assert_eq!(run(backend, true), kept, "{backend}: kept");
        let (values, hit) = run(backend, false);
        assert_eq!(values, vec![3.0; 16], "{backend}: not kept, from zeros");
        assert!(backend == "wgpu" || !hit, "{backend}: not kept is compiled apart from kept");
        assert_eq!(run(backend, true), (kept.0, true), "{backend}: kept again");
    }
}
