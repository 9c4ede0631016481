//! A program's loads and stores: the region an index selects, masks, lanes outside the array
//! (`other` on loads, skipped by stores), the held blocks of resident outputs, and whether a
//! block lies inside its array.

use tessel_plugin_api::array::DataRef;
use tessel_plugin_api::ir::{DType, Literal};

use super::ProgramState;
use super::memory::{Cells, Storage, apply_mask, contiguous, for_each_row, gather, plain, store_elements};
use crate::eval::{self, Data, Val, expand};
use crate::program::{Ix, MemRef, Src};

impl ProgramState<'_, '_> {
    /// The region an index list selects: per dimension a start relative to the block origin, a
    /// length, and whether the dimension is kept in the value's shape; with strided slices, the
    /// region they span and, per element of the value, its place in that region. A gathered
    /// dimension is the one element at `entry` (kept, of length 1).
    fn region(
        &self,
        mem: MemRef,
        index: Option<&[Ix]>,
        entry: Option<i64>,
    ) -> (Vec<i64>, Vec<usize>, Vec<usize>, Option<Vec<usize>>) {
        let p = &self.m.kernel.kernel().params[mem.0];
        let block = p.block_shape();
        let origin = &self.origins[mem.0];
        let Some(index) = index else {
            return (origin.clone(), block.to_vec(), block.to_vec(), None);
        };
        let (mut starts, mut lens, mut shape, mut strides) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (d, ix) in index.iter().enumerate() {
            let (s, n, keep, k) = match ix {
                Ix::Full => (0, block[d], true, 1),
                Ix::Slice(s, n, k) => (self.get(s).as_i64(), *n, true, *k),
                Ix::At(s) => (self.get(s).as_i64(), 1, false, 1),
                Ix::Gather(_) => (entry.expect("an entry of the gather"), 1, true, 1),
            };
            starts.push(origin[d].wrapping_add(s));
            lens.push(n);
            strides.push(k);
            if keep {
                shape.push(n);
            }
        }
        if strides.iter().all(|&k| k == 1) {
            return (starts, lens, shape, None);
        }
        let spans: Vec<usize> = lens.iter().zip(&strides).map(|(&n, &k)| (n - 1) * k + 1).collect();
        (starts, spans.clone(), shape, Some(strided_places(&lens, &strides, &spans)))
    }

    /// The flat indices of the elements of `mem`'s array a `load` or `store` with `index` and
    /// `mask` touches, in row-major order of the region (those outside the array left out; a
    /// gather's mask is not read: every entry counts as touched).
    pub(super) fn touched(&self, mem: MemRef, index: Option<&[Ix]>, mask: Option<usize>) -> Vec<usize> {
        let shape = &self.array(mem).shape;
        let entries: Vec<Option<i64>> = match self.gather(index) {
            Some((_, e)) => e.into_iter().map(Some).collect(),
            None => vec![None],
        };
        let strides = eval::strides(shape);
        let mut out = Vec::new();
        for &entry in &entries {
            let (starts, lens, value, places) = self.region(mem, index, entry);
            let lanes = if entry.is_none() { self.mask_lanes(mask, &value) } else { None };
            let n: usize = lens.iter().product();
            let mut on = vec![places.is_none() && lanes.is_none(); n];
            match (&places, &lanes) {
                (None, None) => {}
                (None, Some(l)) => on.copy_from_slice(l),
                (Some(p), l) => p.iter().enumerate().for_each(|(i, &f)| on[f] = l.as_ref().is_none_or(|l| l[i])),
            }
            let mut at = vec![0usize; lens.len()];
            for lane in 0..n {
                let inside = at.iter().zip(&starts).zip(shape).all(|((&i, &s), &d)| (0..d as i64).contains(&(s + i as i64)));
                if on[lane] && inside {
                    out.push(at.iter().zip(&starts).zip(&strides).map(|((&i, &s), &st)| (s as usize + i) * st).sum());
                }
                for d in (0..lens.len()).rev() {
                    at[d] += 1;
                    if at[d] < lens[d] {
                        break;
                    }
                    at[d] = 0;
                }
            }
        }
        out
    }

    fn mask_lanes(&self, mask: Option<usize>, shape: &[usize]) -> Option<Vec<bool>> {
        let m = self.slots[mask?].as_ref().expect("verifier: mask defined");
        let eval::Data::B(v) = &m.data else { unreachable!("verifier: bool mask") };
        Some(expand(v, &m.shape, shape).into_owned())
    }

    /// The gathered dimension of an index list (its place among the kept dimensions) and the
    /// indices of its vector.
    fn gather(&self, index: Option<&[Ix]>) -> Option<(usize, Vec<i64>)> {
        let index = index?;
        let d = index.iter().position(|ix| matches!(ix, Ix::Gather(_)))?;
        let Ix::Gather(s) = &index[d] else { unreachable!("found above") };
        let kept = index[..d].iter().filter(|ix| !matches!(ix, Ix::At(_))).count();
        let entries = match &self.get(s).data {
            Data::I(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::U(v) => v.iter().map(|&x| i64::from(x)).collect(),
            _ => unreachable!("verifier: integer index vectors"),
        };
        Some((kept, entries))
    }

    pub(super) fn load(&self, mem: MemRef, index: Option<&[Ix]>, mask: Option<usize>, other: Literal, dtype: DType) -> Val {
        if let Some(v) = &self.held[mem.0] {
            return v.clone(); // resident: loaded whole, inside its array
        }
        if let Some((g, entries)) = self.gather(index) {
            let (mut starts, lens, mut shape, places) = self.region(mem, index, Some(0));
            if g == 0 && places.is_none() {
                // The gathered dimension outermost: each entry's part is the region with that
                // dimension's start moved, read straight after the last.
                let d = index.and_then(|ix| ix.iter().position(|i| matches!(i, Ix::Gather(_)))).expect("a gather");
                let base = starts[d];
                let other = Val::scalar_literal(dtype, other);
                let mut data = other.data.empty_with_capacity(lens.iter().product::<usize>() * entries.len());
                for &e in &entries {
                    starts[d] = base.wrapping_add(e);
                    self.read_region_into(mem, &starts, &lens, &shape, &other, dtype, &mut data);
                }
                shape[0] = entries.len();
                let mut v = Val { dtype, shape, data };
                if let Some(lanes) = self.mask_lanes(mask, &v.shape) {
                    apply_mask(&mut v.data, &lanes, &other.data);
                }
                return v;
            }
            // Elsewhere each entry's part (of length 1 along the gathered dimension) is read as a
            // slice is, then the parts are laid side by side along it; the mask applies to the whole.
            let parts: Vec<Val> = entries.iter().map(|&e| self.load_part(mem, index, None, other, dtype, Some(e))).collect();
            let mut shape = parts[0].shape.clone();
            shape[g] = entries.len();
            let inner: usize = shape[g + 1..].iter().product();
            let outer: usize = shape[..g].iter().product();
            let mut data = parts[0].data.empty_with_capacity(outer * entries.len() * inner);
            for o in 0..outer {
                for p in &parts {
                    data.extend_from(p.view().data.range(o * inner..(o + 1) * inner));
                }
            }
            let mut v = Val { dtype, shape, data };
            if let Some(lanes) = self.mask_lanes(mask, &v.shape) {
                apply_mask(&mut v.data, &lanes, &Val::scalar_literal(dtype, other).data);
            }
            return v;
        }
        self.load_part(mem, index, mask, other, dtype, None)
    }

    /// [`Self::load`] of a region without a gather, or of one entry of a gather.
    fn load_part(
        &self,
        mem: MemRef,
        index: Option<&[Ix]>,
        mask: Option<usize>,
        other: Literal,
        dtype: DType,
        entry: Option<i64>,
    ) -> Val {
        let (starts, lens, shape, places) = self.region(mem, index, entry);
        let other = Val::scalar_literal(dtype, other);
        let mut data = match &places {
            None => self.read_region(mem, &starts, &lens, &shape, &other, dtype),
            // Strided: the span read, then the elements at the strides taken from it.
            Some(places) => {
                let all = Val { dtype, shape: lens.clone(), data: self.read_region(mem, &starts, &lens, &lens, &other, dtype) };
                let bits = all.to_bits();
                Val::from_bits(dtype, shape.clone(), places.iter().map(|&f| bits[f]).collect()).data
            }
        };
        if let Some(lanes) = self.mask_lanes(mask, &shape) {
            apply_mask(&mut data, &lanes, &other.data);
        }
        Val { dtype, shape, data }
    }

    /// The elements of a region of `mem` in row-major order, `other` (a scalar) outside the array.
    pub(super) fn read_region(
        &self,
        mem: MemRef,
        starts: &[i64],
        lens: &[usize],
        shape: &[usize],
        other: &Val,
        dtype: DType,
    ) -> Data {
        let mut out = other.data.empty_with_capacity(lens.iter().product::<usize>().max(1));
        self.read_region_into(mem, starts, lens, shape, other, dtype, &mut out);
        out
    }

    /// [`Self::read_region`] appended to `out` (of `other`'s kind).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_region_into(
        &self,
        mem: MemRef,
        starts: &[i64],
        lens: &[usize],
        shape: &[usize],
        other: &Val,
        dtype: DType,
        out: &mut Data,
    ) {
        let arr = self.array(mem);
        let s = &arr.shape;
        match (&arr.storage, &other.data, out) {
            (Storage::Input(DataRef::F32(v)), Data::F(o), Data::F(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n]), out)
            }
            (Storage::Input(DataRef::F16(v)), Data::F(o), Data::F(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|x| x.to_f32())), out)
            }
            (Storage::Input(DataRef::BF16(v)), Data::F(o), Data::F(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|x| x.to_f32())), out)
            }
            (Storage::Input(DataRef::I32(v)), Data::I(o), Data::I(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n]), out)
            }
            (Storage::Input(DataRef::U32(v)), Data::U(o), Data::U(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n]), out)
            }
            (Storage::Input(DataRef::Bool(v)), Data::B(o), Data::B(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend_from_slice(&v[f..f + n]), out)
            }
            (Storage::Input(DataRef::I8(v)), Data::I(o), Data::I(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|&x| i32::from(x))), out)
            }
            (Storage::Input(DataRef::I16(v)), Data::I(o), Data::I(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|&x| i32::from(x))), out)
            }
            (Storage::Input(DataRef::U8(v)), Data::U(o), Data::U(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|&x| u32::from(x))), out)
            }
            (Storage::Input(DataRef::U16(v)), Data::U(o), Data::U(out)) => {
                gather(s, starts, lens, o[0], &mut |f, n, out| out.extend(v[f..f + n].iter().map(|&x| u32::from(x))), out)
            }
            (Storage::Shared(_) | Storage::Lent(_), _, out) => {
                let bits = self.read_cells(mem, starts, lens, other.to_bits()[0]);
                out.extend_from(Val::from_bits(dtype, shape.to_vec(), bits).view().data);
            }
            _ => unreachable!("launch::bind: inputs have their declared dtype"),
        }
    }

    /// The bit patterns of a region of output or scratch `mem`, `other` outside the array.
    pub(super) fn read_cells(&self, mem: MemRef, starts: &[i64], lens: &[usize], other: u32) -> Vec<u32> {
        let arr = self.array(mem);
        let cells = arr.storage.cells().expect("an output or scratch");
        let own = self.m.own[mem.0];
        let mut out = Vec::with_capacity(lens.iter().product::<usize>().max(1));
        gather(&arr.shape, starts, lens, other, &mut |f, n, out| Cells::of(&cells[f..f + n], own).read_into(out), &mut out);
        out
    }

    pub(super) fn store(&mut self, mem: MemRef, index: Option<&[Ix]>, value: &Src, mask: Option<usize>) {
        if let Some((g, entries)) = self.gather(index) {
            // A scatter: each entry's part of the value (and of the mask) stored as a slice is,
            // in the order of the entries (a later one wins where two are equal).
            let v = self.get(value).clone();
            let (_, _, full, _) = self.region(mem, index, Some(0));
            let mut shape = full.clone();
            shape[g] = entries.len();
            let bits = expand(&v.to_bits(), &v.shape, &shape).into_owned();
            let lanes = self.mask_lanes(mask, &shape);
            let inner: usize = shape[g + 1..].iter().product();
            let outer: usize = shape[..g].iter().product();
            for (j, &e) in entries.iter().enumerate() {
                let pick = |o: usize, i: usize| (o * entries.len() + j) * inner + i;
                let part: Vec<u32> = (0..outer).flat_map(|o| (0..inner).map(move |i| pick(o, i))).map(|f| bits[f]).collect();
                let on: Option<Vec<bool>> =
                    lanes.as_ref().map(|l| (0..outer).flat_map(|o| (0..inner).map(move |i| pick(o, i))).map(|f| l[f]).collect());
                let held = self.store_part(mem, index, &Val::from_bits(v.dtype, full.clone(), part), None, on, Some(e));
                if let Some(h) = held {
                    self.held[mem.0] = Some(h);
                }
            }
            return;
        }
        if let Some(h) = self.store_part(mem, index, self.get(value), mask, None, None) {
            self.held[mem.0] = Some(h);
        }
    }

    /// [`Self::store`] of value `v` to a region without a gather, or to one entry of a gather,
    /// where the lanes of `mask` (or `lanes`, of the region's shape) allow. A resident output's
    /// block is not written here: the block it now holds is returned.
    pub(super) fn store_part(
        &self,
        mem: MemRef,
        index: Option<&[Ix]>,
        v: &Val,
        mask: Option<usize>,
        lanes: Option<Vec<bool>>,
        entry: Option<i64>,
    ) -> Option<Val> {
        let (starts, lens, shape, places) = self.region(mem, index, entry);
        let lanes = lanes.or_else(|| self.mask_lanes(mask, &shape));
        if let Some(places) = places {
            // Strided: the span written where a place of the value falls (and its lane is on).
            let bits = expand(&v.to_bits(), &v.shape, &shape).into_owned();
            let n: usize = lens.iter().product();
            let (mut spanned, mut on) = (vec![0u32; n], vec![false; n]);
            for (i, &f) in places.iter().enumerate() {
                spanned[f] = bits[i];
                on[f] = lanes.as_ref().is_none_or(|l| l[i]);
            }
            self.write_region(mem, &starts, &lens, |mut cells, first| {
                (0..cells.len()).filter(|&i| on[first + i]).for_each(|i| cells.set(i, spanned[first + i]));
            });
            return None;
        }
        if self.held[mem.0].is_some() {
            // Resident: stored whole.
            return Some(if v.shape == shape { v.clone() } else { eval::broadcast_to(v, &shape) });
        }
        if v.shape == shape && lanes.is_none() {
            self.write_region(mem, &starts, &lens, |cells, first| store_elements(v.view(), first, cells));
            return None;
        }
        let bits = v.to_bits();
        let bits = expand(&bits, &v.shape, &shape);
        self.write_region(mem, &starts, &lens, |mut cells, first| {
            let bits = &bits[first..first + cells.len()];
            match &lanes {
                None => cells.put(bits),
                Some(l) => (0..bits.len()).filter(|&i| l[first + i]).for_each(|i| cells.set(i, bits[i])),
            }
        });
        None
    }

    /// Writes the part of a region of `mem` inside the array: `write(cells, first)` for each
    /// innermost row's inside part, `first` being the row-major lane of the region its first
    /// cell is.
    pub(super) fn write_region(&self, mem: MemRef, starts: &[i64], lens: &[usize], mut write: impl FnMut(Cells<'_>, usize)) {
        let arr = self.array(mem);
        let cells = arr.storage.cells().expect("verifier: no store to an input");
        let own = self.m.own[mem.0];
        let mut lane = 0;
        for_each_row(&arr.shape, starts, lens, |len, span| {
            if let Some(r) = span {
                write(Cells::of(&cells[r.flat..r.flat + r.count], own), lane + r.before);
            }
            lane += len;
        });
    }

    /// The cells of the region `starts`, `lens` of `mem` as plain memory the program writes
    /// directly, where that region is one stretch inside the array, of the program's own
    /// elements (`Machine::own`), and not a held block.
    pub(super) fn own_stretch(&self, mem: MemRef, starts: &[i64], lens: &[usize]) -> Option<&mut [u32]> {
        if self.held[mem.0].is_some() || !self.m.own[mem.0] {
            return None;
        }
        let arr = self.array(mem);
        let flat = contiguous(&arr.shape, starts, lens)?;
        Some(plain(&arr.storage.cells()?[flat..flat + lens.iter().product::<usize>()]))
    }

    /// Whether the whole block of `mem` lies inside its array at this grid point.
    pub(super) fn inside(&self, mem: MemRef) -> bool {
        let arr = self.array(mem);
        let block = self.m.kernel.kernel().params[mem.0].block_shape();
        self.origins[mem.0].iter().zip(block).zip(&arr.shape).all(|((&o, &b), &n)| o >= 0 && o as usize + b <= n)
    }
}

/// For each element of a region of `lens` taken every `strides` (row-major), its flat place in
/// the region of `spans` it spans.
fn strided_places(lens: &[usize], strides: &[usize], spans: &[usize]) -> Vec<usize> {
    let mut places = vec![0usize];
    for d in 0..lens.len() {
        let inner: usize = spans[d + 1..].iter().product();
        places = places.iter().flat_map(|&p| (0..lens[d]).map(move |i| p + i * strides[d] * inner)).collect();
    }
    places
}
