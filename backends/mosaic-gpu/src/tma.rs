//! The concurrent model's copies from global memory into shared scratch by TMA (docs/language.md
//! §10, per backend). `copy_async S[...], X[ds(%r, R), ds(%c, C)] arrive B[k]` of a 2-D input
//! array into an `[R, C]` tile of scratch (whole trailing dimensions, single indices before
//! them) is one `cp.async.bulk.tensor` of an `R x C` box at `(%c, %r)`, its bytes counted on the
//! barrier's mbarrier (`mbarrier.arrive.expect_tx`, the copy's one arrival): the box lands
//! row-major, as scratch is laid out (no swizzle), and reads past the array are zeros, as the
//! language reads them. Other copies are made by the issuing warpgroup (`ir::synchronous`).

use tessel_plugin_api::ir::{Index, Kernel, Literal, Operand, ParamKind, RefAt, SyncOp};

use crate::limits::element_bytes;
use crate::wgmma::TensorMapSpec;

/// Bytes a scratch buffer is aligned to, so that each tile a tensor copy lands in is aligned as
/// its shared destination must be.
pub const ALIGN: u64 = 128;
/// The most elements of one box dimension.
const MAX_BOX: usize = 256;

/// One copy by TMA: the box of `array` at column `x` and row `y` into `scratch`, at the tile
/// its leading indices choose.
#[derive(Debug)]
pub struct TmaCopy<'k> {
    /// The `in` array read.
    pub array: &'k str,
    /// The box: columns (contiguous), then rows.
    pub boxes: [u32; 2],
    /// The box's first column and row.
    pub x: Operand,
    pub y: Operand,
    /// The scratch written.
    pub scratch: &'k str,
    /// Each leading index of the scratch and the bytes one step of it moves.
    pub leading: Vec<(&'k Operand, u64)>,
    /// Bytes the copy brings.
    pub bytes: u64,
    /// Bytes of an element.
    pub elem: u64,
    /// The swizzle span of the scratch's layout in bytes (`crate::async_mma`), 0 for row-major.
    pub swizzle: u32,
}

impl TmaCopy<'_> {
    /// The copy into scratch laid out in swizzled slabs of `span` bytes (0: row-major).
    pub fn laid_out(self, span: u32) -> Self {
        TmaCopy { swizzle: span, ..self }
    }

    /// Boxes the copy takes: one per slab of a swizzled layout (each `span` bytes wide, landing
    /// `rows` rows of `span` bytes, one after another), else one.
    pub fn slabs(&self) -> u32 {
        if self.swizzle == 0 { 1 } else { (u64::from(self.boxes[0]) * self.elem / u64::from(self.swizzle)) as u32 }
    }

    /// The box of one tensor copy: a slab's columns, the rows.
    pub fn slab_box(&self) -> [u32; 2] {
        [self.boxes[0] / self.slabs(), self.boxes[1]]
    }

    /// The tensor map this copy reads through (the `n`th of the kernel).
    pub fn map(&self, n: usize) -> TensorMapSpec {
        let param = format!("{}_map{n}", self.array);
        TensorMapSpec { array: self.array.to_string(), boxes: self.slab_box(), param, swizzle: self.swizzle }
    }

    /// Whether `m` is the tensor map of this copy.
    pub fn reads_through(&self, m: &TensorMapSpec) -> bool {
        m.array == self.array && m.boxes == self.slab_box() && m.swizzle == self.swizzle
    }
}

/// The copy `op` of kernel `k` as a TMA copy, where it is one: a copy with a barrier from a 2-D
/// `in` array (no block) into scratch of its dtype, the box at most 256 a side with rows of a
/// multiple of 16 bytes, the array's rows too, and the tile 128-byte aligned.
pub fn copy<'k>(k: &'k Kernel, op: &'k SyncOp) -> Option<TmaCopy<'k>> {
    let SyncOp::Copy { dst, src, arrive: Some(_) } = op else { return None };
    let (a, s) = (k.param(&src.name)?, k.param(&dst.name)?);
    if a.kind != ParamKind::In || a.block.is_some() || a.ty.shape.len() != 2 || s.kind != ParamKind::Scratch {
        return None;
    }
    if a.ty.dtype != s.ty.dtype {
        return None;
    }
    let elem = element_bytes(a.ty.dtype) as u64;
    let [(y, rows), (x, cols)] = window(src, &a.ty.shape)?;
    let fits = |n: usize| (1..=MAX_BOX).contains(&n);
    if !fits(rows) || !fits(cols) || !(cols as u64 * elem).is_multiple_of(16) || !(a.ty.shape[1] as u64 * elem).is_multiple_of(16)
    {
        return None;
    }
    // The destination: the scratch's trailing [rows, cols] whole, single indices before them.
    let shape = &s.ty.shape;
    let lead = shape.len().checked_sub(2)?;
    if shape[lead..] != [rows, cols] {
        return None;
    }
    let bytes = (rows * cols) as u64 * elem;
    let mut leading = Vec::new();
    if let Some(ix) = &dst.index {
        let mut stride = bytes;
        for (d, i) in ix.iter().enumerate().rev() {
            match (d >= lead, i) {
                (true, Index::Full) => {}
                (true, Index::Slice { start: Operand::Lit(Literal::Int(0)), size, stride: 1 }) if *size == shape[d] => {}
                (false, Index::At(at)) => leading.push((at, stride)),
                _ => return None,
            }
            if d < lead {
                stride *= shape[d] as u64;
            }
        }
    } else if lead > 0 {
        return None;
    }
    if !leading.is_empty() && !bytes.is_multiple_of(ALIGN) {
        return None;
    }
    Some(TmaCopy { array: &a.name, boxes: [cols as u32, rows as u32], x, y, scratch: &s.name, leading, bytes, elem, swizzle: 0 })
}

/// The start and length of a region of a 2-D array along each dimension: `:` or `ds(s, n)`.
fn window(r: &RefAt, shape: &[usize]) -> Option<[(Operand, usize); 2]> {
    let zero = Operand::Lit(Literal::Int(0));
    let Some(ix) = &r.index else { return Some([(zero.clone(), shape[0]), (zero, shape[1])]) };
    let dim = |d: usize| match &ix[d] {
        Index::Full => Some((zero.clone(), shape[d])),
        Index::Slice { start, size, stride: 1 } => Some((start.clone(), *size)),
        _ => None,
    };
    Some([dim(0)?, dim(1)?])
}
