//! The arrays' memory: inputs borrowed from the host, outputs and scratch as cells of bit
//! patterns (the caller's own memory where it fits), a stretch of cells as a program reads and
//! writes it (plain memory where it is the program's own), and the rows of a region clipped to
//! its array.

use std::sync::atomic::{AtomicU32, Ordering};

use tessel_plugin_api::array::DataRef;
use tessel_plugin_api::ir::DType;

use crate::eval::{self, Data, View};

/// Element storage of one array. Inputs are borrowed, typed and read-only; outputs and scratch
/// are bit patterns in relaxed atomics, because programs run concurrently and may (by the
/// author's choice) overlap; where they provably do not (`Machine::own`), a program reads and
/// writes its cells as plain memory ([`Cells::Own`]).
pub(super) enum Storage<'i> {
    Input(DataRef<'i>),
    Shared(Vec<AtomicU32>),
    /// The caller's output memory itself (4-byte elements, aligned): written once, in place.
    Lent(&'i [AtomicU32]),
}

impl Storage<'_> {
    pub(super) fn zeros(n: usize) -> Storage<'static> {
        Storage::Shared((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    /// The cells of an output or scratch array.
    pub(super) fn cells(&self) -> Option<&[AtomicU32]> {
        match self {
            Storage::Input(_) => None,
            Storage::Shared(c) => Some(c),
            Storage::Lent(c) => Some(c),
        }
    }
}

/// Whether `bytes` can be an output's cells: whole, aligned 32-bit words on a little-endian
/// machine.
pub(super) fn cells_fit(bytes: &[u8]) -> bool {
    cfg!(target_endian = "little") && bytes.len().is_multiple_of(4) && bytes.as_ptr().align_offset(align_of::<AtomicU32>()) == 0
}

/// `bytes` (which [`cells_fit`]) as cells that programs write concurrently; zeroed first unless
/// they are zeros already (`zero`), since outputs start as zeros.
#[allow(unsafe_code)]
pub(super) fn as_cells(bytes: &mut [u8], zero: bool) -> &[AtomicU32] {
    assert!(cells_fit(bytes), "output memory is aligned 32-bit words");
    if zero {
        bytes.fill(0);
    }
    // SAFETY: `AtomicU32` has the size and bit validity of `u32`, and every bit pattern is a
    // `u32`; the pointer is aligned for it (checked above) and spans `len / 4` whole words of
    // `bytes`; the exclusive borrow of `bytes` lasts as long as the cells, so nothing else reads
    // or writes that memory meanwhile.
    unsafe { std::slice::from_raw_parts(bytes.as_mut_ptr().cast::<AtomicU32>(), bytes.len() / 4) }
}

/// One argument's memory and how programs see it.
pub(super) struct Array<'i> {
    pub(super) storage: Storage<'i>,
    pub(super) shape: Vec<usize>,
    pub(super) dtype: DType,
}

/// The flat index of the first element of the box `starts`, `lens` in a row-major array of
/// `shape`, where the box is one stretch of the array's elements and lies inside it: every
/// dimension after the first one longer than 1 is whole.
pub(super) fn contiguous(shape: &[usize], starts: &[i64], lens: &[usize]) -> Option<usize> {
    let first = lens.iter().position(|&n| n > 1).unwrap_or(lens.len());
    let whole = (first + 1..shape.len()).all(|d| starts[d] == 0 && lens[d] == shape[d]);
    let inside = starts.iter().zip(lens).zip(shape).all(|((&s, &n), &dim)| s >= 0 && s as usize + n <= dim);
    // Row-major, in Horner form: ((s0 * n1 + s1) * n2 + s2) ...
    (whole && inside).then(|| starts.iter().zip(shape).fold(0, |flat, (&s, &n)| flat * n + s as usize))
}

/// Stores the bit patterns of `v`'s elements from `first` on into `cells`.
pub(super) fn store_elements(v: View<'_>, first: usize, cells: Cells<'_>) {
    let range = first..first + cells.len();
    match cells {
        Cells::Own(out) => v.write_bits(range, out),
        Cells::Shared(cells) => {
            let mut cells = cells.iter();
            v.for_each_bits(range, |b| cells.next().expect("one cell per element").store(b, Ordering::Relaxed));
        }
    }
}

/// A stretch of an output's or scratch's cells, as one program reads or writes it.
pub(super) enum Cells<'c> {
    /// Cells that no other program reads or writes while this one runs: plain memory.
    Own(&'c mut [u32]),
    /// Cells that other programs may write too: one relaxed atomic access each.
    Shared(&'c [AtomicU32]),
}

/// Cells of the program's own (`Machine::own`) as plain memory. Callers pass only cells
/// that no other thread reads or writes while this program runs, and use the slice before
/// making another of the same cells.
#[allow(unsafe_code)]
#[allow(clippy::mut_from_ref, reason = "exclusive by `Machine::own`, not by the borrow: see the SAFETY note")]
pub(super) fn plain(cells: &[AtomicU32]) -> &mut [u32] {
    // SAFETY: `AtomicU32` has the size, alignment and bit validity of `u32` and keeps its value
    // in an `UnsafeCell`, so the memory behind a shared slice of them may be written through a
    // pointer derived from it. The caller's cells are the program's own: no other thread reads or
    // writes them while it runs (`analysis::own_blocks`: its accesses stay in blocks no other
    // program touches; or the program's own scratch), and within the program the slice made here
    // is the only access to them while it lives (each is used and dropped before the next is
    // made), so it aliases nothing.
    unsafe { std::slice::from_raw_parts_mut(cells.as_ptr().cast::<u32>().cast_mut(), cells.len()) }
}

impl<'c> Cells<'c> {
    /// `cells`, as plain memory where they are the program's `own` (`Machine::own`).
    pub(super) fn of(cells: &'c [AtomicU32], own: bool) -> Cells<'c> {
        if own { Cells::Own(plain(cells)) } else { Cells::Shared(cells) }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Cells::Own(c) => c.len(),
            Cells::Shared(c) => c.len(),
        }
    }

    pub(super) fn set(&mut self, i: usize, bits: u32) {
        match self {
            Cells::Own(c) => c[i] = bits,
            Cells::Shared(c) => c[i].store(bits, Ordering::Relaxed),
        }
    }

    /// Stores `bits`, one per cell.
    pub(super) fn put(&mut self, bits: &[u32]) {
        match self {
            Cells::Own(c) => c.copy_from_slice(bits),
            Cells::Shared(c) => c.iter().zip(bits).for_each(|(c, &b)| c.store(b, Ordering::Relaxed)),
        }
    }

    /// Appends the cells' bit patterns to `out`.
    pub(super) fn read_into(&self, out: &mut Vec<u32>) {
        match self {
            Cells::Own(c) => out.extend_from_slice(c),
            Cells::Shared(c) => out.extend(c.iter().map(|c| c.load(Ordering::Relaxed))),
        }
    }
}

/// Sets the lanes where `lanes` is false to `other` (a one-element value of the same kind).
pub(super) fn apply_mask(data: &mut Data, lanes: &[bool], other: &Data) {
    fn fill<T: Copy>(v: &mut [T], lanes: &[bool], o: T) {
        v.iter_mut().zip(lanes).filter(|(_, on)| !**on).for_each(|(x, _)| *x = o);
    }
    match (data, other) {
        (Data::F(v), Data::F(o)) => fill(v, lanes, o[0]),
        (Data::I(v), Data::I(o)) => fill(v, lanes, o[0]),
        (Data::U(v), Data::U(o)) => fill(v, lanes, o[0]),
        (Data::B(v), Data::B(o)) => fill(v, lanes, o[0]),
        _ => unreachable!("other has the loaded dtype"),
    }
}

/// The part of one innermost row of a region that lies inside the array.
pub(super) struct RowSpan {
    /// Lanes before the first inside lane.
    pub(super) before: usize,
    /// Flat array index of the first inside lane.
    pub(super) flat: usize,
    /// Inside lanes.
    pub(super) count: usize,
}

/// Appends a region to `out` in row-major order: `copy(flat, n, out)` appends `n` elements from
/// flat index `flat`; lanes outside the array get `other`.
pub(super) fn gather<T: Copy>(
    shape: &[usize],
    starts: &[i64],
    lens: &[usize],
    other: T,
    copy: &mut dyn FnMut(usize, usize, &mut Vec<T>),
    out: &mut Vec<T>,
) {
    for_each_row(shape, starts, lens, |len, span| {
        let start = out.len();
        if let Some(r) = span {
            out.resize(start + r.before, other);
            copy(r.flat, r.count, out);
        }
        out.resize(start + len, other);
    });
}

/// Visits the innermost rows of a region in row-major order: `f(row length, inside part)`.
/// A scalar (rank 0) array is one row of one lane.
pub(super) fn for_each_row(shape: &[usize], starts: &[i64], lens: &[usize], mut f: impl FnMut(usize, Option<RowSpan>)) {
    let rank = shape.len();
    if rank == 0 {
        f(1, Some(RowSpan { before: 0, flat: 0, count: 1 }));
        return;
    }
    let st = eval::strides(shape);
    let n: usize = lens.iter().product();
    let last = rank - 1;
    let row = lens[last];
    if n == 0 {
        return;
    }
    // The inside part of the innermost dimension is the same for every row.
    let lo = starts[last].clamp(0, shape[last] as i64);
    let hi = (starts[last] + row as i64).clamp(0, shape[last] as i64);
    let (before, count) = ((lo - starts[last]) as usize, (hi - lo).max(0) as usize);
    let mut idx = vec![0usize; last];
    for _ in 0..n / row {
        let mut base = Some(0usize);
        for d in 0..last {
            let g = starts[d] + idx[d] as i64;
            base = match base {
                Some(b) if g >= 0 && (g as usize) < shape[d] => Some(b + g as usize * st[d]),
                _ => None,
            };
        }
        let span = base.filter(|_| count > 0).map(|b| RowSpan { before, flat: b + lo as usize, count });
        f(row, span);
        for d in (0..last).rev() {
            idx[d] += 1;
            if idx[d] < lens[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
