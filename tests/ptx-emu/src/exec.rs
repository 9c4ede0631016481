//! Executing instructions: one thread's plain instructions ([`exec`]), a warp's `mma.sync`
//! ([`mma`]) and a warpgroup's `wgmma.mma_async` ([`wgmma`]) once all their threads have reached
//! it.

use crate::cta::{Cta, TENSOR_MAP_TAG, Thread};
use crate::hopper::{self, Async, Descriptor, Mbarrier, Read};
use crate::memory::Memory;
use crate::parse::{Arg, Instr, Kind, Mma};

/// The tensor copies from shared to global memory, of 1 to 5 dimensions.
const TENSOR_STORES: [&str; 5] = [
    "cp.async.bulk.tensor.1d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group",
];

/// The tensor copies from global to shared memory, of 1 to 5 dimensions.
const TENSOR_COPIES: [&str; 5] = [
    "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes",
];

fn f(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

fn b(v: f32) -> u64 {
    u64::from(v.to_bits())
}

/// Rounds an `f32` to `tf32` (10 fraction bits), to nearest with ties away from zero.
fn tf32_rna(bits: u32) -> u32 {
    if bits & 0x7F80_0000 == 0x7F80_0000 {
        return if bits & 0x007F_FFFF != 0 { 0x7FFF_FFFF } else { bits };
    }
    bits.wrapping_add(0x1000) & 0xFFFF_E000
}

/// One warp's `mma.sync`: D = A B + C for a 16x8 tile, with the fragments of the PTX ISA's tables
/// (`g` = lane >> 2, `t` = lane % 4).
pub(crate) fn mma(kind: Mma, args: &[Arg], warp: &mut [Thread]) {
    let regs = |i: usize| match &args[i] {
        Arg::Vec(v) => v.clone(),
        _ => unreachable!("parse checks the vectors"),
    };
    let (d, ra, rb, rc) = (regs(0), regs(1), regs(2), regs(3));
    let k = if kind == Mma::Tf32 { 8 } else { 16 };
    let mut a = [[0f64; 16]; 16];
    let mut bm = [[0f64; 8]; 16];
    let mut c = [[0f64; 8]; 16];
    let half = |bits: u64| match kind {
        Mma::Bf16 => f64::from(half::bf16::from_bits(bits as u16).to_f32()),
        _ => f64::from(half::f16::from_bits(bits as u16).to_f32()),
    };
    for (lane, th) in warp.iter().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        match kind {
            Mma::Tf32 => {
                // A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (t, g), b1 (t+4, g).
                for i in 0..4 {
                    let v = f64::from(f32::from_bits(th.regs[ra[i]] as u32 & 0xFFFF_E000));
                    a[g + 8 * (i % 2)][t + 4 * (i / 2)] = v;
                }
                for i in 0..2 {
                    bm[t + 4 * i][g] = f64::from(f32::from_bits(th.regs[rb[i]] as u32 & 0xFFFF_E000));
                }
            }
            Mma::F16 | Mma::Bf16 => {
                // A: a_i, two to a register (low half first): row g (+8 for i = 2, 3, 6, 7),
                // column 2t + i%2 (+8 for i >= 4). B: b_i at row 2t + i%2 (+8 for i >= 2), column g.
                for i in 0..8 {
                    let v = half(th.regs[ra[i / 2]] >> (16 * (i % 2)));
                    a[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] = v;
                }
                for i in 0..4 {
                    bm[2 * t + i % 2 + 8 * (i / 2)][g] = half(th.regs[rb[i / 2]] >> (16 * (i % 2)));
                }
            }
        }
        // C and D: c_i at row g (+8 for i >= 2), column 2t + i%2.
        for i in 0..4 {
            c[g + 8 * (i / 2)][2 * t + i % 2] = f64::from(f(th.regs[rc[i]]));
        }
    }
    let mut out = [[0f32; 8]; 16];
    for (r, row) in out.iter_mut().enumerate() {
        for (col, o) in row.iter_mut().enumerate() {
            *o = ((0..k).map(|p| a[r][p] * bm[p][col]).sum::<f64>() + c[r][col]) as f32;
        }
    }
    for (lane, th) in warp.iter_mut().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        for i in 0..4 {
            th.regs[d[i]] = b(out[g + 8 * (i / 2)][2 * t + i % 2]);
        }
    }
}

/// One warpgroup's `wgmma.mma_async`: descriptors, scale-d and immediates are the same in every
/// thread (the instruction is `.aligned`); the left operand is a descriptor, or four registers
/// of each thread (the `mma.m16n8k16` A layout per warp, read where the instruction is issued).
/// The accumulator it reads is what the registers will hold once the `wgmma`s before it retire;
/// what it writes waits in each thread's [`Pending`](crate::hopper::Pending).
pub(crate) fn wgmma(ins: &Instr, group: &mut [Thread], shared: &Memory, asynchronous: &mut Async) -> Result<(), String> {
    let Kind::Wgmma(w) = ins.kind else { unreachable!("waits at a wgmma") };
    let (d, left, db, scale, sa, sb, ta, tb) = match &ins.args[..] {
        [Arg::Vec(d), Arg::Reg(da), Arg::Reg(db), Arg::Reg(scale), Arg::Imm(sa), Arg::Imm(sb), Arg::Imm(ta), Arg::Imm(tb)] => {
            (d, Err(*da), db, scale, sa, sb, *ta, tb)
        }
        [Arg::Vec(d), Arg::Vec(ra), Arg::Reg(db), Arg::Reg(scale), Arg::Imm(sa), Arg::Imm(sb), Arg::Imm(tb)] => {
            (d, Ok(ra), db, scale, sa, sb, 0, tb)
        }
        _ => unreachable!("parse checks the operands"),
    };
    let uniform = |r: usize| {
        let v = group[0].regs[r];
        if group.iter().all(|t| t.regs[r] == v) {
            Ok(v)
        } else {
            Err("the warpgroup's threads give different operands".to_string())
        }
    };
    let b = Descriptor::decode(uniform(*db)?)?;
    // Element (m, k) of A: from its descriptor, or from the register of the thread that holds it.
    let a: Result<Descriptor, Vec<Vec<u64>>> = match left {
        Err(da) => Ok(Descriptor::decode(uniform(da)?)?),
        Ok(ra) => Err(group.iter().map(|t| ra.iter().map(|&r| t.regs[r]).collect()).collect()),
    };
    let accumulate = uniform(*scale)? != 0;
    let negate = |v: u64| match v as i64 {
        1 => Ok(false),
        -1 => Ok(true),
        _ => Err(format!("scale {} is not 1 or -1", v as i64)),
    };
    let mut acc: Vec<Vec<u64>> =
        group.iter().map(|t| d.iter().map(|&r| t.pending.latest(r).unwrap_or(t.regs[r])).collect()).collect();
    let bytes = std::cell::Cell::new([(u64::MAX, 0); 2]);
    let load = |operand: usize, at: u64| {
        let mut seen = bytes.get();
        seen[operand] = (seen[operand].0.min(at), seen[operand].1.max(at + 2));
        bytes.set(seen);
        shared.load_n(at, 2).map(|v| v as u16)
    };
    let left = |m: u64, k: u64| match &a {
        Ok(desc) => load(0, desc.address(m, k, ta == 0)),
        Err(regs) => {
            let (warp, row, col) = (m / 16, m % 16, k % 8);
            let thread = (warp * 32 + (row % 8) * 4 + col / 2) as usize;
            let reg = (row / 8 + 2 * (k / 8)) as usize;
            Ok((regs[thread][reg] >> (16 * (col % 2))) as u16)
        }
    };
    w.run(&left, b, (negate(*sa)?, negate(*sb)?), *tb != 0, accumulate, &mut acc, |at| load(1, at))?;
    // Its operands stay read until every thread retires it.
    let serial = asynchronous.serial;
    asynchronous.serial += 1;
    asynchronous.reads.insert(serial, Read { bytes: bytes.get(), line: ins.line, threads: group.len() as u32 });
    for (t, values) in group.iter_mut().zip(acc) {
        t.pending.open.writes.extend(d.iter().copied().zip(values));
        t.pending.open.reads.push(serial);
    }
    Ok(())
}

/// The tensor map whose parameter's address is `handle`.
fn tensor_map<'c>(cta: &'c Cta<'_>, handle: u64) -> Result<&'c crate::hopper::TensorMap, String> {
    (handle & !0xFFFF == TENSOR_MAP_TAG)
        .then(|| cta.tensor_maps.get((handle & 0xFFFF) as usize))
        .flatten()
        .ok_or(format!("{handle:#x} is not the address of a tensor-map parameter"))
}

pub(crate) fn exec(ins: &Instr, th: &mut Thread, cta: &mut Cta<'_>, tid: u32) -> Result<(), String> {
    let (params, id, grid) = (cta.params, cta.id, cta.grid);
    let val = |a: &Arg, th: &Thread| -> u64 {
        match a {
            Arg::Reg(r) => th.regs[*r],
            Arg::Imm(v) => *v,
            Arg::Tid => u64::from(tid),
            Arg::Ctaid => u64::from(id),
            Arg::Nctaid => u64::from(grid),
            Arg::Param(p) => params[*p],
            Arg::Mem(r) => th.regs[*r],
            Arg::Label(l) => *l as u64,
            // The shared window's first byte.
            Arg::Shared => 0,
            // `{lo, hi}`: 16-bit halves packed into 32 bits, the first in the low half.
            Arg::Vec(v) => v.iter().rev().fold(0, |acc, r| (acc << 16) | (th.regs[*r] & 0xFFFF)),
            Arg::TensorMap(i) => TENSOR_MAP_TAG | *i as u64,
            Arg::Tensor(r, _) => th.regs[*r],
        }
    };
    let a = &ins.args;
    let dst = match a.first() {
        Some(Arg::Reg(r)) => Some(*r),
        _ => None,
    };
    let x = |i: usize, th: &Thread| val(&a[i], th);
    let (u, s) = (|v: u64| v as u32, |v: u64| v as u32 as i32);
    let op = ins.op.as_str();
    let out: u64 = match op {
        "mov.u32" | "mov.b32" => x(1, th) & 0xFFFF_FFFF,
        "ld.param.u64" | "cvta.to.global.u64" | "mov.u64" => x(1, th),
        "ld.shared.b32" => u64::from(cta.shared.load(x(1, th))?),
        "st.shared.b32" => {
            cta.shared.store(x(0, th), u(x(1, th)))?;
            return Ok(());
        }
        "cvt.rna.tf32.f32" => u64::from(tf32_rna(u(x(1, th)))),
        "bra" | "bra.uni" => {
            th.pc = x(0, th) as usize;
            return Ok(());
        }
        "ld.global.b32" => u64::from(cta.mem.load(x(1, th))?),
        // Arrays, and scratch, of 16-bit and 8-bit elements: narrow loads into a 32-bit register
        // (zero- or sign-extended), narrow stores of its low bits.
        "ld.global.u16" | "ld.shared.u16" => u64::from(cta.space(op).load_n(x(1, th), 2)?),
        "ld.global.u8" | "ld.shared.u8" => u64::from(cta.space(op).load_n(x(1, th), 1)?),
        "ld.global.s16" | "ld.shared.s16" => u64::from(cta.space(op).load_n(x(1, th), 2)? as u16 as i16 as i32 as u32),
        "ld.global.s8" | "ld.shared.s8" => u64::from(cta.space(op).load_n(x(1, th), 1)? as u8 as i8 as i32 as u32),
        "st.global.b8" | "st.global.u8" | "st.shared.b8" | "st.shared.u8" => {
            cta.space(op).store_n(x(0, th), 1, u(x(1, th)) & 0xFF)?;
            return Ok(());
        }
        // Two 32-bit registers at an 8-byte-aligned address.
        "st.global.v2.b32" => {
            let Arg::Vec(v) = &a[1] else { return Err("takes [address], {a, b}".into()) };
            for (at, r) in vector(x(0, th), v)? {
                cta.mem.store(at, th.regs[*r] as u32)?;
            }
            return Ok(());
        }
        "ld.global.v2.b32" => {
            let Arg::Vec(v) = &a[0] else { return Err("takes {a, b}, [address]".into()) };
            for (at, r) in vector(x(1, th), v)? {
                th.regs[*r] = u64::from(cta.mem.load(at)?);
            }
            return Ok(());
        }
        "st.global.u16" | "st.global.b16" | "st.shared.u16" | "st.shared.b16" => {
            cta.space(op).store_n(x(0, th), 2, u(x(1, th)) & 0xFFFF)?;
            return Ok(());
        }
        "cvt.u64.u32" | "cvt.u32.u64" => x(1, th) & 0xFFFF_FFFF,
        "or.b64" => x(1, th) | x(2, th),
        "mov.b64" | "cvta.param.u64" => x(1, th),
        "fence.mbarrier_init.release.cluster" | "fence.proxy.async.shared::cta" | "wgmma.fence.sync.aligned" => return Ok(()),
        "mbarrier.init.shared::cta.b64" => {
            let n = u(x(1, th));
            let bar = Mbarrier { expected: n, pending: n, tx: 0, phase: 0 };
            cta.asynchronous.barriers.insert(x(0, th) & 0xFFFF_FFFF, bar);
            return Ok(());
        }
        "mbarrier.arrive.expect_tx.shared::cta.b64" | "mbarrier.arrive.shared::cta.b64" => {
            let addr = x(1, th) & 0xFFFF_FFFF;
            let bar = cta.asynchronous.barriers.get_mut(&addr).ok_or(format!("arrive on {addr:#x}, which holds no mbarrier"))?;
            if op == "mbarrier.arrive.expect_tx.shared::cta.b64" {
                bar.tx += i64::from(u(x(2, th)));
            }
            bar.pending = bar.pending.checked_sub(1).ok_or("more arrivals than the mbarrier expects")?;
            bar.settle();
            // The state operand: the phase arrived on.
            u64::from(bar.phase)
        }
        // Made at once: its reads and writes are done where it is issued, so that
        // `cp.async.bulk.wait_group` has nothing left to wait for.
        _ if TENSOR_STORES.contains(&op) => {
            let (Arg::Tensor(map, coords), Arg::Mem(src)) = (&a[0], &a[1]) else {
                return Err("takes [tensor map, {x, y, ...}], [src]".into());
            };
            let map = tensor_map(cta, th.regs[*map])?;
            let c: Vec<i64> = coords.iter().map(|&r| s(th.regs[r]).into()).collect();
            for (global, shared) in hopper::box_stores(map, th.regs[*src] & 0xFFFF_FFFF, &c)? {
                let v = cta.shared.load_n(shared, 1)?;
                cta.mem.store_n(global, 1, v)?;
            }
            return Ok(());
        }
        "cp.async.bulk.commit_group" | "cp.async.bulk.wait_group" | "cp.async.bulk.wait_group.read" => return Ok(()),
        _ if TENSOR_COPIES.contains(&op) => {
            let (Arg::Tensor(map, coords), Arg::Mem(bar)) = (&a[1], &a[2]) else {
                return Err("takes [dst], [tensor map, {x, y, ...}], [mbarrier]".into());
            };
            let map = tensor_map(cta, th.regs[*map])?;
            let c: Vec<i64> = coords.iter().map(|&r| s(th.regs[r]).into()).collect();
            let dst = x(0, th) & 0xFFFF_FFFF;
            let mem = &*cta.mem;
            let writes = hopper::box_writes(map, dst, &c, |at| mem.load_n(at, 1).map(|b| b as u8))?;
            let lo = writes.iter().map(|(at, _)| *at).min().unwrap_or(dst);
            let hi = writes.iter().map(|(at, _)| at + 1).max().unwrap_or(dst);
            cta.asynchronous.check_overwrite((lo, hi))?;
            cta.counts.tensor_bytes += writes.len() as u64;
            cta.asynchronous.copies.push(hopper::Copy { bar: th.regs[*bar] & 0xFFFF_FFFF, writes });
            return Ok(());
        }
        "wgmma.commit_group.sync.aligned" => {
            th.pending.commit();
            return Ok(());
        }
        "wgmma.wait_group.sync.aligned" => {
            let (writes, reads) = th.pending.wait(x(0, th) as usize);
            for (r, v) in writes {
                th.regs[r] = v;
            }
            cta.asynchronous.retire(&reads);
            return Ok(());
        }
        "st.global.b32" => {
            cta.mem.store(x(0, th), u(x(1, th)))?;
            return Ok(());
        }
        "mul.wide.u32" => u64::from(u(x(1, th))) * u64::from(u(x(2, th))),
        "add.u64" => x(1, th).wrapping_add(x(2, th)),
        "add.u32" | "add.s32" => u64::from(u(x(1, th)).wrapping_add(u(x(2, th)))),
        "sub.u32" | "sub.s32" => u64::from(u(x(1, th)).wrapping_sub(u(x(2, th)))),
        "mul.lo.u32" | "mul.lo.s32" => u64::from(u(x(1, th)).wrapping_mul(u(x(2, th)))),
        "mad.lo.u32" | "mad.lo.s32" => u64::from(u(x(1, th)).wrapping_mul(u(x(2, th))).wrapping_add(u(x(3, th)))),
        "div.u32" => u64::from(u(x(1, th)).checked_div(u(x(2, th))).unwrap_or(u32::MAX)),
        "rem.u32" => u64::from(u(x(1, th)).checked_rem(u(x(2, th))).unwrap_or(u32::MAX)),
        "div.s32" => u64::from(s(x(1, th)).checked_div(s(x(2, th))).unwrap_or(-1) as u32),
        "rem.s32" => u64::from(s(x(1, th)).checked_rem(s(x(2, th))).unwrap_or(-1) as u32),
        "max.u32" => u64::from(u(x(1, th)).max(u(x(2, th)))),
        "min.u32" => u64::from(u(x(1, th)).min(u(x(2, th)))),
        "max.s32" => u64::from(s(x(1, th)).max(s(x(2, th))) as u32),
        "min.s32" => u64::from(s(x(1, th)).min(s(x(2, th))) as u32),
        "neg.s32" => u64::from(s(x(1, th)).wrapping_neg() as u32),
        "abs.s32" => u64::from(s(x(1, th)).wrapping_abs() as u32),
        "not.b32" => u64::from(!u(x(1, th))),
        "and.b32" => u64::from(u(x(1, th)) & u(x(2, th))),
        "or.b32" => u64::from(u(x(1, th)) | u(x(2, th))),
        "xor.b32" => u64::from(u(x(1, th)) ^ u(x(2, th))),
        "shl.b32" => u64::from(u(x(1, th)).checked_shl(u(x(2, th))).unwrap_or(0)),
        "shr.u32" => u64::from(u(x(1, th)).checked_shr(u(x(2, th))).unwrap_or(0)),
        "shr.s32" => u64::from((s(x(1, th)) >> u(x(2, th)).min(31)) as u32),
        "mov.pred" => x(1, th),
        "and.pred" => x(1, th) & x(2, th),
        "or.pred" => x(1, th) | x(2, th),
        "not.pred" => u64::from(x(1, th) == 0),
        "selp.b32" | "selp.u32" => {
            if x(3, th) != 0 {
                x(1, th) & 0xFFFF_FFFF
            } else {
                x(2, th) & 0xFFFF_FFFF
            }
        }
        "add.rn.f32" => b(f(x(1, th)) + f(x(2, th))),
        "sub.rn.f32" => b(f(x(1, th)) - f(x(2, th))),
        "mul.rn.f32" => b(f(x(1, th)) * f(x(2, th))),
        "div.rn.f32" => b(f(x(1, th)) / f(x(2, th))),
        "max.NaN.f32" | "min.NaN.f32" => {
            let (p, q) = (f(x(1, th)), f(x(2, th)));
            b(if p.is_nan() || q.is_nan() {
                f32::NAN
            } else if op == "max.NaN.f32" {
                p.max(q)
            } else {
                p.min(q)
            })
        }
        "neg.f32" => b(-f(x(1, th))),
        "abs.f32" => b(f(x(1, th)).abs()),
        "sqrt.rn.f32" => b(f(x(1, th)).sqrt()),
        "rcp.rn.f32" => b(1.0 / f(x(1, th))),
        "fma.rn.f32" => b(f(x(1, th)).mul_add(f(x(2, th)), f(x(3, th)))),
        "cvt.rni.f32.f32" => b(f(x(1, th)).round_ties_even()),
        "mul.hi.u32" => (u64::from(u(x(1, th))) * u64::from(u(x(2, th)))) >> 32,
        "clz.b32" => u64::from(u(x(1, th)).leading_zeros()),
        "xor.pred" => x(1, th) ^ x(2, th),
        "copysign.f32" => b(f(x(2, th)).copysign(f(x(1, th)))),
        "cvt.rmi.f32.f32" => b(f(x(1, th)).floor()),
        "cvt.rpi.f32.f32" => b(f(x(1, th)).ceil()),
        "cvt.rzi.f32.f32" => b(f(x(1, th)).trunc()),
        "cvt.rzi.s32.f32" => u64::from(f(x(1, th)) as i32 as u32),
        "cvt.rzi.u32.f32" => u64::from(f(x(1, th)) as u32),
        "cvt.rn.f32.s32" => b(s(x(1, th)) as f32),
        "cvt.rn.f32.u32" => b(u(x(1, th)) as f32),
        "cvt.u16.u32" => x(1, th) & 0xFFFF,
        "cvt.u32.u16" => x(1, th) & 0xFFFF,
        // The low 8 or 16 bits of a 32-bit register, sign-extended.
        "cvt.s32.s8" => u64::from(x(1, th) as u8 as i8 as i32 as u32),
        "cvt.s32.s16" => u64::from(x(1, th) as u16 as i16 as i32 as u32),
        "cvt.f32.f16" => b(half::f16::from_bits(x(1, th) as u16).to_f32()),
        "cvt.f32.bf16" => b(half::bf16::from_bits(x(1, th) as u16).to_f32()),
        "cvt.rn.f16.f32" => u64::from(half::f16::from_f32(f(x(1, th))).to_bits()),
        "cvt.rn.bf16.f32" => u64::from(half::bf16::from_f32(f(x(1, th))).to_bits()),
        _ if op.starts_with("setp.") => {
            let parts: Vec<&str> = op.split('.').collect();
            let (cmp, ty) = (parts[1], parts[2]);
            let (p, q) = (x(1, th), x(2, th));
            let r = match ty {
                "f32" => {
                    let (p, q) = (f(p), f(q));
                    match cmp {
                        "eq" => p == q,
                        "neu" => p != q,
                        "lt" => p < q,
                        "le" => p <= q,
                        "gt" => p > q,
                        "ge" => p >= q,
                        _ => return Err(format!("comparison {cmp}")),
                    }
                }
                "s32" => cmp_int(cmp, s(p), s(q))?,
                _ => cmp_int(cmp, u(p), u(q))?,
            };
            u64::from(r)
        }
        _ => return Err("not in the emulated subset".into()),
    };
    let d = dst.ok_or("no destination register")?;
    th.regs[d] = out;
    Ok(())
}

/// The addresses of a vector access's 32-bit elements, each with its register; the access is
/// aligned to its whole size.
fn vector(addr: u64, regs: &[usize]) -> Result<impl Iterator<Item = (u64, &usize)>, String> {
    let size = 4 * regs.len() as u64;
    if !addr.is_multiple_of(size) {
        return Err(format!("misaligned {size}-byte access at {addr:#x}"));
    }
    Ok(regs.iter().enumerate().map(move |(i, r)| (addr + 4 * i as u64, r)))
}

fn cmp_int<T: PartialOrd>(cmp: &str, p: T, q: T) -> Result<bool, String> {
    Ok(match cmp {
        "eq" => p == q,
        "ne" => p != q,
        "lt" => p < q,
        "le" => p <= q,
        "gt" => p > q,
        "ge" => p >= q,
        _ => return Err(format!("comparison {cmp}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cta::Wait;
    use crate::hopper::Pending;

    /// A warp whose lane registers hold A, B and C of an `m16n8k8` tf32 `mma` as the PTX ISA lays
    /// them out, written here from the ISA's formulas.
    #[test]
    fn mma_tf32_computes_a_16x8_tile() {
        let a = |r: usize, c: usize| (r * 8 + c) as f32 / 16.0 - 3.0;
        let bm = |r: usize, c: usize| (r as f32 - c as f32) / 4.0;
        let cm = |r: usize, c: usize| (r + c) as f32;
        let (d, ra, rb, rc) = ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13]);
        let mut warp: Vec<Thread> = (0..32)
            .map(|lane| {
                let (g, t) = (lane / 4, lane % 4);
                let mut regs = vec![0u64; 14];
                // a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
                for (i, (r, c)) in [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)].into_iter().enumerate() {
                    regs[ra[i]] = b(a(r, c));
                }
                // b0 (t, g), b1 (t+4, g)
                regs[rb[0]] = b(bm(t, g));
                regs[rb[1]] = b(bm(t + 4, g));
                // c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
                for (i, (r, c)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                    regs[rc[i]] = b(cm(r, c));
                }
                Thread { regs, pc: 0, wait: Wait::No, pending: Pending::default(), met: false }
            })
            .collect();
        let args = [Arg::Vec(d.to_vec()), Arg::Vec(ra.to_vec()), Arg::Vec(rb.to_vec()), Arg::Vec(rc.to_vec())];
        mma(Mma::Tf32, &args, &mut warp);
        for (lane, th) in warp.iter().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            for (i, (r, c)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                // The inputs are exact in tf32 (few significant bits), so the tile is exact.
                let want: f32 = (0..8).map(|p| a(r, p) * bm(p, c)).sum::<f32>() + cm(r, c);
                assert_eq!(f(th.regs[d[i]]), want, "D[{r}, {c}]");
            }
        }
    }

    #[test]
    fn tf32_rounding_is_to_nearest_ties_away() {
        // 1 + 2^-11 is halfway between two tf32 values (10 fraction bits): away from zero.
        assert_eq!(f32::from_bits(tf32_rna((1.0f32 + 2f32.powi(-11)).to_bits())), 1.0 + 2f32.powi(-10));
        assert_eq!(f32::from_bits(tf32_rna((1.0f32 + 2f32.powi(-12)).to_bits())), 1.0);
        assert_eq!(f32::from_bits(tf32_rna((-1.0f32 - 2f32.powi(-11)).to_bits())), -1.0 - 2f32.powi(-10));
        assert!(f32::from_bits(tf32_rna(f32::NAN.to_bits())).is_nan());
        assert_eq!(f32::from_bits(tf32_rna(f32::INFINITY.to_bits())), f32::INFINITY);
    }
}
