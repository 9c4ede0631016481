//! The Hopper asynchronous instructions: tensor-memory-access copies (`cp.async.bulk.tensor`),
//! mbarriers and warpgroup MMA (`wgmma.mma_async`), written from the PTX ISA's text apart from
//! the backend's emitter.
//!
//! Asynchrony is modelled so that a missing wait shows: a tensor copy lands in shared memory only
//! when a thread waits on its mbarrier (until then the destination keeps its NaN pattern), and a
//! `wgmma`'s accumulator reaches the registers only at the `wgmma.wait_group` that retires its
//! group (until then the registers keep their old values; a later `wgmma` of the same group
//! chain reads the pending value, as the hardware's in-order accumulation does). A `wgmma` reads
//! its operands when its warpgroup issues it, but the shared memory it read stays in use until
//! every thread of the warpgroup has retired it: a tensor copy into those bytes before then is
//! refused, as the race it is on the hardware (a stage refilled before its consumers are done).
//! Plain `mbarrier.arrive` (a consumer handing a stage back) counts an arrival without bytes.

use std::collections::HashMap;

/// A tensor map as `cuTensorMapEncodeTiled` describes it, for a tensor of 1 to 5 dimensions:
/// what the runtime encodes into the 128 opaque bytes of a `CUtensorMap`, here given to the
/// emulator directly.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMap {
    /// Global address of element (0, ..., 0).
    pub address: u64,
    /// Elements per dimension, the contiguous one first.
    pub dims: Vec<u64>,
    /// Bytes from one element to the next along each dimension but the first.
    pub strides: Vec<u64>,
    /// Bytes of one element.
    pub elem_bytes: u32,
    /// The box copied, in elements per dimension, the contiguous one first.
    pub boxes: Vec<u32>,
    /// The shared-memory swizzle span in bytes: 0 (none), 32, 64 or 128.
    pub swizzle: u32,
}

/// The shared-memory address a swizzle mode puts byte address `addr` at: bits 4..7 of the
/// address XORed with bits 7..10 (`Swizzle<3,4,3>` for 128 bytes; 2 and 1 bits for 64 and 32).
pub fn swizzle(addr: u64, span: u32) -> u64 {
    let mask = match span {
        128 => 7,
        64 => 3,
        32 => 1,
        _ => 0,
    };
    addr ^ (((addr >> 7) & mask) << 4)
}

/// One tensor copy in flight: the bytes it will write, by shared address.
#[derive(Clone, Debug)]
pub(crate) struct Copy {
    pub bar: u64,
    pub writes: Vec<(u64, u8)>,
}

/// An mbarrier's state (PTX ISA "mbarrier"): the arrivals it expects per phase, those still
/// pending, the transaction bytes still pending, and the phase number.
#[derive(Clone, Debug, Default)]
pub(crate) struct Mbarrier {
    pub expected: u32,
    pub pending: u32,
    pub tx: i64,
    pub phase: u32,
}

impl Mbarrier {
    /// Completes the current phase when no arrivals and no transaction bytes are pending.
    pub fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.expected;
        }
    }
}

/// The places of the box at coordinates `c` (the contiguous dimension first) of a tensor map, as
/// (global address of the element or `None` outside the tensor, shared address of its first
/// byte): the box dense in shared memory (its first dimension a row, the others rows after
/// rows), swizzled as the map says, its shared start `dst` aligned as the swizzle needs.
fn box_places(map: &TensorMap, dst: u64, c: &[i64]) -> Result<Vec<(Option<u64>, u64)>, String> {
    let rank = map.dims.len();
    if c.len() != rank || map.boxes.len() != rank || map.strides.len() + 1 != rank {
        return Err(format!("a tensor copy of {} coordinates through a tensor map of {rank} dimensions", c.len()));
    }
    let elem = u64::from(map.elem_bytes);
    let row = u64::from(map.boxes[0]) * elem;
    if map.swizzle != 0 && row > u64::from(map.swizzle) {
        return Err(format!("a box row of {row} bytes is wider than its {}-byte swizzle", map.swizzle));
    }
    let align = if map.swizzle == 0 { 128 } else { 8 * u64::from(map.swizzle) };
    if !dst.is_multiple_of(align) {
        return Err(format!("tensor copy to shared address {dst:#x}, which is not {align}-byte aligned"));
    }
    let rows: u64 = map.boxes[1..].iter().map(|&b| u64::from(b)).product();
    let mut out = Vec::with_capacity((u64::from(map.boxes[0]) * rows) as usize);
    for r in 0..rows {
        // The row's coordinates along the outer dimensions, the second one fastest.
        let (mut rest, mut outer) = (r, Vec::with_capacity(rank - 1));
        for &b in &map.boxes[1..] {
            outer.push(c[outer.len() + 1] + (rest % u64::from(b)) as i64);
            rest /= u64::from(b);
        }
        let inside_rows = outer.iter().zip(&map.dims[1..]).all(|(&y, &n)| y >= 0 && (y as u64) < n);
        let base: u64 = map.address + outer.iter().zip(&map.strides).map(|(&y, &s)| (y.max(0) as u64) * s).sum::<u64>();
        for e in 0..i64::from(map.boxes[0]) {
            let x = c[0] + e;
            let inside = inside_rows && x >= 0 && (x as u64) < map.dims[0];
            out.push((inside.then(|| base + x as u64 * elem), dst + r * row + e as u64 * elem));
        }
    }
    Ok(out)
}

/// The box a tensor copy into shared memory reads at coordinates `c`: (shared address, byte)
/// pairs, with zeros where the box leaves the tensor (out-of-bounds fill "none": zeros).
pub(crate) fn box_writes(
    map: &TensorMap,
    dst: u64,
    c: &[i64],
    read: impl Fn(u64) -> Result<u8, String>,
) -> Result<Vec<(u64, u8)>, String> {
    let mut out = Vec::new();
    for (global, shared) in box_places(map, dst, c)? {
        for byte in 0..u64::from(map.elem_bytes) {
            let v = match global {
                Some(g) => read(g + byte)?,
                None => 0,
            };
            out.push((swizzle(shared + byte, map.swizzle), v));
        }
    }
    Ok(out)
}

/// The bytes a tensor copy out of shared memory at `src` writes at coordinates `c`: (global
/// address, shared address) pairs, none where the box leaves the tensor.
pub(crate) fn box_stores(map: &TensorMap, src: u64, c: &[i64]) -> Result<Vec<(u64, u64)>, String> {
    let places = box_places(map, src, c)?;
    let bytes = u64::from(map.elem_bytes);
    Ok((places.into_iter())
        .filter_map(|(global, shared)| Some((global?, shared)))
        .flat_map(|(g, s)| (0..bytes).map(move |b| (g + b, swizzle(s + b, map.swizzle))))
        .collect())
}

/// A shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading
/// and stride byte offsets (each stored >> 4 in 14 bits), base offset, swizzle mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Descriptor {
    pub start: u64,
    pub lbo: u64,
    pub sbo: u64,
    /// Swizzle span in bytes (0 for none).
    pub swizzle: u32,
}

impl Descriptor {
    pub fn decode(d: u64) -> Result<Descriptor, String> {
        let field = |at: u32| ((d >> at) & 0x3FFF) << 4;
        if (d >> 49) & 7 != 0 {
            return Err(format!("descriptor {d:#x} has a base offset, which the emulator does not model"));
        }
        let swizzle = match d >> 62 {
            0 => 0,
            1 => 128,
            2 => 64,
            _ => 32,
        };
        Ok(Descriptor { start: field(0), lbo: field(16), sbo: field(32), swizzle })
    }

    /// The shared address of element (`mn`, `k`) of a matrix of 2-byte elements in the canonical
    /// layout of the ISA's "Shared Memory Matrix Layout", K-major or MN-major: swizzle atoms of 8
    /// rows of the swizzle span (16 bytes without swizzle), rows along the strided dimension.
    /// K-major: rows are M/N, 8-row groups `sbo` apart; without swizzle, the two 8-element halves
    /// of K are `lbo` apart. MN-major: rows are K, 8-row groups `sbo` apart (without swizzle
    /// `lbo`), atoms along M/N `lbo` apart (without swizzle `sbo`).
    pub fn address(&self, mn: u64, k: u64, k_major: bool) -> u64 {
        let span = u64::from(self.swizzle);
        let offset = match (k_major, span) {
            (true, 0) => (mn % 8) * 16 + (mn / 8) * self.sbo + (k % 8) * 2 + (k / 8) * self.lbo,
            (true, _) => (mn % 8) * span + (mn / 8) * self.sbo + k * 2,
            (false, 0) => (mn % 8) * 2 + (mn / 8) * self.sbo + (k % 8) * 16 + (k / 8) * self.lbo,
            (false, _) => (mn % (span / 2)) * 2 + (mn / (span / 2)) * self.lbo + (k % 8) * span + (k / 8) * self.sbo,
        };
        swizzle(self.start + offset, self.swizzle)
    }
}

/// The `wgmma.mma_async` shapes and types emulated: `m64nNk16` with `f16`/`bf16` inputs read
/// from shared memory through descriptors and an `f32` accumulator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Wgmma {
    pub n: u32,
    pub bf16: bool,
}

impl Wgmma {
    pub fn parse(op: &str) -> Option<Wgmma> {
        let rest = op.strip_prefix("wgmma.mma_async.sync.aligned.m64n")?;
        let (n, types) = rest.split_once("k16.f32.")?;
        let n: u32 = n.parse().ok()?;
        let bf16 = match types {
            "bf16.bf16" => true,
            "f16.f16" => false,
            _ => return None,
        };
        (n.is_multiple_of(8) && (8..=256).contains(&n)).then_some(Wgmma { n, bf16 })
    }

    /// The accumulator element of register `i` of thread `t` of the warpgroup (PTX ISA "Matrix
    /// Fragments for wgmma.mma_async.m64nNk16", accumulator D): warp `t / 32` owns rows 16w..16w+16;
    /// row `lane / 4` (+8 for the second pair of each four), column `8 (i / 4) + 2 (lane % 4) + i % 2`.
    pub fn fragment(t: usize, i: usize) -> (usize, usize) {
        let (w, lane) = (t / 32, t % 32);
        (16 * w + lane / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2)
    }

    /// D = A B (+ D where `accumulate`): A 64x16 (`left` gives element (m, k)) and B 16xN read
    /// from shared memory through its descriptor (`load` at an address), summed in `f64` and
    /// rounded once, as the `mma.sync` emulation does. `d` holds the warpgroup's 128 threads'
    /// accumulator registers (N/2 each), read and written in place.
    #[allow(clippy::too_many_arguments, reason = "the instruction's operands")]
    pub fn run(
        &self,
        left: &dyn Fn(u64, u64) -> Result<u16, String>,
        b: Descriptor,
        (neg_a, neg_b): (bool, bool),
        trans_b: bool,
        accumulate: bool,
        d: &mut [Vec<u64>],
        load: impl Fn(u64) -> Result<u16, String>,
    ) -> Result<(), String> {
        let n = self.n as usize;
        let value = |bits: u16| {
            if self.bf16 {
                f64::from(half::bf16::from_bits(bits).to_f32())
            } else {
                f64::from(half::f16::from_bits(bits).to_f32())
            }
        };
        let mut am = vec![[0f64; 16]; 64];
        for (m, row) in am.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                let v = value(left(m as u64, k as u64)?);
                *x = if neg_a { -v } else { v };
            }
        }
        let mut bm = vec![vec![0f64; n]; 16];
        for (k, row) in bm.iter_mut().enumerate() {
            for (col, x) in row.iter_mut().enumerate() {
                let v = value(load(b.address(col as u64, k as u64, !trans_b))?);
                *x = if neg_b { -v } else { v };
            }
        }
        for (t, regs) in d.iter_mut().enumerate() {
            for (i, r) in regs.iter_mut().enumerate() {
                let (row, col) = Wgmma::fragment(t, i);
                let c = if accumulate { f64::from(f32::from_bits(*r as u32)) } else { 0.0 };
                let sum: f64 = (0..16).map(|k| am[row][k] * bm[k][col]).sum();
                *r = u64::from(((sum + c) as f32).to_bits());
            }
        }
        Ok(())
    }
}

/// A thread's `wgmma` results not yet retired: by committed group (oldest first), then the
/// uncommitted ones, each a list of (register, value) and the serials of the `wgmma`s (their
/// shared-memory reads, [`Async::reads`]) it holds.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pending {
    pub committed: Vec<Group>,
    pub open: Group,
}

/// One group of a thread's pending `wgmma`s.
#[derive(Clone, Debug, Default)]
pub(crate) struct Group {
    pub writes: Vec<(usize, u64)>,
    pub reads: Vec<u64>,
}

impl Pending {
    /// The value register `r` will have when everything pending retires, if anything pending writes it.
    pub fn latest(&self, r: usize) -> Option<u64> {
        let newest_first = self.open.writes.iter().rev().chain(self.committed.iter().rev().flat_map(|g| g.writes.iter().rev()));
        newest_first.filter(|(x, _)| *x == r).map(|(_, v)| *v).next()
    }

    pub fn commit(&mut self) {
        let open = std::mem::take(&mut self.open);
        self.committed.push(open);
    }

    /// Retires the oldest groups until at most `keep` are pending: what to write to the
    /// registers, and the serials of the reads retired.
    pub fn wait(&mut self, keep: usize) -> (Vec<(usize, u64)>, Vec<u64>) {
        let n = self.committed.len().saturating_sub(keep);
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        for g in self.committed.drain(..n) {
            writes.extend(g.writes);
            reads.extend(g.reads);
        }
        (writes, reads)
    }
}

/// The shared memory a `wgmma` reads, until every thread of its warpgroup has retired it: the
/// hardware reads its operands asynchronously, so a tensor copy into them before then is a race.
#[derive(Clone, Debug)]
pub(crate) struct Read {
    /// The bytes read of each operand: first and one past the last.
    pub bytes: [(u64, u64); 2],
    /// The `wgmma`'s line.
    pub line: usize,
    /// Threads that have not retired it yet.
    pub threads: u32,
}

/// The mbarriers of a CTA, by shared address, and the tensor copies in flight.
#[derive(Default)]
pub(crate) struct Async {
    pub barriers: HashMap<u64, Mbarrier>,
    pub copies: Vec<Copy>,
    /// The shared memory of `wgmma`s in flight, by serial.
    pub reads: HashMap<u64, Read>,
    /// The next `wgmma`'s serial.
    pub serial: u64,
}

impl Async {
    /// A thread retired the reads of `serials`.
    pub fn retire(&mut self, serials: &[u64]) {
        for s in serials {
            if let Some(r) = self.reads.get_mut(s) {
                r.threads -= 1;
                if r.threads == 0 {
                    self.reads.remove(s);
                }
            }
        }
    }

    /// Refuses a tensor copy into `bytes` (first and one past the last) that a `wgmma` in
    /// flight still reads.
    pub fn check_overwrite(&self, bytes: (u64, u64)) -> Result<(), String> {
        let overlap = |r: &Read| r.bytes.into_iter().find(|read| read.0 < bytes.1 && bytes.0 < read.1).map(|read| (r.line, read));
        match self.reads.values().find_map(overlap) {
            Some((line, read)) => Err(format!(
                "a tensor copy into shared memory {:#x}..{:#x} while the wgmma.mma_async of line {line} still reads {:#x}..{:#x} \
                 (retire it with wgmma.wait_group, and hand the stage over, before refilling it)",
                bytes.0, bytes.1, read.0, read.1
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swizzle_128_xors_the_16_byte_chunk_with_the_row_in_its_1024_byte_atom() {
        // Row 3, chunk 5, byte 2 of an atom at 2048: chunk 5 ^ 3 = 6.
        assert_eq!(swizzle(2048 + 3 * 128 + 5 * 16 + 2, 128), 2048 + 3 * 128 + 6 * 16 + 2);
        assert_eq!(swizzle(2048 + 3 * 128 + 5 * 16 + 2, 0), 2048 + 3 * 128 + 5 * 16 + 2);
        // 64 bytes: two bits of the row (row 3 of a 512-byte atom is 3 * 64 = bits 7..9 = 1).
        assert_eq!(swizzle(3 * 64 + 16, 64), (3 * 64 + 16) ^ (1 << 4));
    }

    #[test]
    fn a_descriptor_decodes_its_fields() {
        let d = (0x400u64 >> 4) | ((8192u64 >> 4) << 16) | ((1024u64 >> 4) << 32) | (1 << 62);
        assert_eq!(Descriptor::decode(d).unwrap(), Descriptor { start: 0x400, lbo: 8192, sbo: 1024, swizzle: 128 });
        assert!(Descriptor::decode(d | (1 << 49)).is_err());
    }

    #[test]
    fn canonical_128b_layouts_put_k_major_rows_and_mn_major_atoms_where_the_isa_says() {
        let d = Descriptor { start: 0, lbo: 8192, sbo: 1024, swizzle: 128 };
        // K-major: row mn at mn * 128 within 8 rows, then sbo; k contiguous; then swizzled.
        assert_eq!(d.address(9, 3, true), swizzle(1024 + 128 + 6, 128));
        // MN-major: 64 elements of M/N a row, k rows 128 apart, the next 64 of M/N lbo away.
        assert_eq!(d.address(70, 9, false), swizzle(8192 + 6 * 2 + 1024 + 128, 128));
    }

    #[test]
    fn fragments_cover_the_64xn_tile_once() {
        let n = 24;
        let mut seen = vec![0; 64 * n];
        for t in 0..128 {
            for i in 0..n / 2 {
                let (r, c) = Wgmma::fragment(t, i);
                seen[r * n + c] += 1;
            }
        }
        assert!(seen.iter().all(|&s| s == 1));
        // Thread 37: warp 1, lane 5 (row 1, column pair 1); register 6: the second row half, columns 8..16.
        assert_eq!(Wgmma::fragment(37, 6), (16 + 1 + 8, 8 + 2));
    }

    #[test]
    fn pending_wgmma_results_retire_oldest_first_and_chain_newest_first() {
        let mut p = Pending::default();
        p.open.writes.extend([(3, 10), (3, 11)]);
        p.open.reads.push(7);
        p.commit();
        p.open.writes.push((3, 12));
        p.open.reads.push(8);
        assert_eq!(p.latest(3), Some(12));
        p.commit();
        assert_eq!(p.latest(3), Some(12));
        // Keep the newest group: the first retires, its last write last.
        assert_eq!(p.wait(1), (vec![(3, 10), (3, 11)], vec![7]));
        assert_eq!(p.latest(3), Some(12));
        assert_eq!(p.wait(0), (vec![(3, 12)], vec![8]));
        assert_eq!(p.latest(3), None);
    }

    #[test]
    fn a_copy_into_what_a_wgmma_in_flight_reads_is_refused_until_every_thread_retires_it() {
        let mut a = Async::default();
        a.reads.insert(1, Read { bytes: [(1024, 2048), (8192, 9216)], line: 9, threads: 2 });
        assert!(a.check_overwrite((0, 1024)).is_ok());
        // Between the two operands: read by neither.
        assert!(a.check_overwrite((4096, 8192)).is_ok());
        assert!(a.check_overwrite((9000, 9100)).unwrap_err().contains("line 9"));
        assert!(a.check_overwrite((2047, 4096)).unwrap_err().contains("line 9"));
        a.retire(&[1]);
        assert!(a.check_overwrite((1500, 1600)).is_err());
        a.retire(&[1]);
        assert!(a.check_overwrite((1500, 1600)).is_ok());
    }

    #[test]
    fn boxes_fill_zeros_outside_the_tensor_and_refuse_misaligned_swizzled_copies() {
        let map = TensorMap { address: 0, dims: vec![3, 2], strides: vec![16], elem_bytes: 2, boxes: vec![4, 2], swizzle: 0 };
        let w = box_writes(&map, 0, &[1, 1], |a| Ok(a as u8 + 1)).unwrap();
        // Row 0 of the box is tensor row 1: elements 1, 2 inside, 3, 4 outside; row 1 outside.
        let bytes: Vec<u8> = w.iter().map(|(_, v)| *v).collect();
        assert_eq!(&bytes[..8], &[19, 20, 21, 22, 0, 0, 0, 0]);
        assert!(bytes[8..].iter().all(|&v| v == 0));
        let map = TensorMap { swizzle: 128, boxes: vec![64, 8], ..map };
        assert!(box_writes(&map, 128, &[0, 0], |_| Ok(0)).unwrap_err().contains("not 1024-byte aligned"));
    }

    #[test]
    fn a_box_of_four_dimensions_lands_its_rows_densely_and_reads_zeros_past_each_dimension() {
        // A [1, 3, 2, 4] tensor of 1-byte elements (element (b, s, h, d) = 8 s + 4 h + d + 1):
        // the box [d 4, h 1, s 4, b 1] at (0, 1, 0, 0) is 4 rows of head 1, the last past the
        // sequence.
        let map = TensorMap {
            address: 0,
            dims: vec![4, 2, 3, 1],
            strides: vec![4, 8, 24],
            elem_bytes: 1,
            boxes: vec![4, 1, 4, 1],
            swizzle: 0,
        };
        let w = box_writes(&map, 0, &[0, 1, 0, 0], |a| Ok(a as u8 + 1)).unwrap();
        let bytes: Vec<u8> = w.iter().map(|(_, v)| *v).collect();
        assert_eq!(bytes, [5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 24, 0, 0, 0, 0]);
        assert!(w.iter().enumerate().all(|(i, (at, _))| *at == i as u64));
    }
}
