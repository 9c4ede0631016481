//! The concurrent model's copies between global memory and shared scratch by TMA (docs/language.md
//! §10, per backend). `copy_async S[...], X[...] arrive B[k]` of an input array of 1 to 5
//! dimensions (its window single indices, `:` and `ds(%s, N)` of stride 1) into a tile of scratch
//! (whole trailing dimensions, single indices before them) is one `cp.async.bulk.tensor` of the
//! window's box (1 along a single index) at the window's start, its bytes counted on the
//! barrier's mbarrier (`mbarrier.arrive.expect_tx`, the copy's one arrival): the box lands
//! densely, row-major, as scratch is laid out (or, in a buffer `crate::async_mma` swizzles, one
//! box a slab), and reads past the array are zeros, as the language reads them. A copy without a
//! barrier from a scratch tile out to an `out` array is the reverse (`cp.async.bulk.tensor` to
//! global memory, elements past the array dropped, as stores drop them), in the issuing thread's
//! bulk group: `commit_copies` closes the group, `wait_copies N (reads)` waits for its writes (or
//! its reads). Other copies are made by the issuing warpgroup (`ir::synchronous`).

use tessel_plugin_api::ir::{Index, Kernel, Literal, Operand, ParamKind, RefAt, SyncOp, analysis};

use crate::limits::element_bytes;
use crate::wgmma::TensorMapSpec;

/// Bytes a scratch buffer is aligned to, so that each tile a tensor copy lands in is aligned as
/// its shared destination must be.
pub const ALIGN: u64 = 128;
/// The most elements of one box dimension.
const MAX_BOX: usize = 256;

/// One copy by TMA: the box of `array` at `coords` into `scratch`, at the tile its leading
/// indices choose.
#[derive(Debug)]
pub struct TmaCopy<'k> {
    /// The `in` array read.
    pub array: &'k str,
    /// The box per dimension of the array, the contiguous one first.
    pub boxes: Vec<u32>,
    /// The box's first element per dimension, the contiguous one first.
    pub coords: Vec<Operand>,
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
    /// From the scratch out to the array (an `out` array's copy without a barrier, which joins
    /// the issuing thread's bulk group), rather than into the scratch.
    pub store: bool,
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

    /// The box of one tensor copy: a slab's columns, the other dimensions whole.
    pub fn slab_box(&self) -> Vec<u32> {
        let mut boxes = self.boxes.clone();
        boxes[0] /= self.slabs();
        boxes
    }

    /// Rows of the box: its elements past the contiguous dimension.
    pub fn rows(&self) -> u64 {
        self.boxes[1..].iter().map(|&b| u64::from(b)).product()
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

/// The copy `op` of kernel `k` as a TMA copy, where it is one: a copy with a barrier from an
/// `in` array into scratch, or one without from scratch out to an `out` array (which joins the
/// thread's group of copies, `commit_copies`), of 1 to 5 dimensions (no block), of one dtype,
/// each box dimension at most 256 with rows of a multiple of 16 bytes, the array's rows too, and
/// the tile 128-byte aligned.
pub fn copy<'k>(k: &'k Kernel, op: &'k SyncOp) -> Option<TmaCopy<'k>> {
    match op {
        SyncOp::Copy { dst, src, arrive: Some(_) } => tensor_copy(k, src, dst, ParamKind::In),
        SyncOp::Copy { dst, src, arrive: None } => tensor_copy(k, dst, src, ParamKind::Out),
        _ => None,
    }
}

/// The copy between region `global` of an array of `kind` and region `shared` of scratch.
fn tensor_copy<'k>(k: &'k Kernel, global: &'k RefAt, shared: &'k RefAt, kind: ParamKind) -> Option<TmaCopy<'k>> {
    let (a, s) = (k.param(&global.name)?, k.param(&shared.name)?);
    let rank = a.ty.shape.len();
    if a.kind != kind || a.block.is_some() || !(1..=5).contains(&rank) || s.kind != ParamKind::Scratch {
        return None;
    }
    if a.ty.dtype != s.ty.dtype {
        return None;
    }
    let elem = element_bytes(a.ty.dtype) as u64;
    // The window, the contiguous dimension first.
    let mut window = window(global, &a.ty.shape)?;
    window.reverse();
    let fits = |n: usize| (1..=MAX_BOX).contains(&n);
    if !window.iter().all(|(_, n)| fits(*n))
        || !(window[0].1 as u64 * elem).is_multiple_of(16)
        || !(a.ty.shape[rank - 1] as u64 * elem).is_multiple_of(16)
    {
        return None;
    }
    // The scratch's side: its trailing dimensions (the window's, single indices dropped) whole,
    // single indices before them.
    let tile = analysis::region_shape(a, global.index.as_deref());
    let shape = &s.ty.shape;
    let lead = shape.len().checked_sub(tile.len())?;
    if shape[lead..] != tile[..] {
        return None;
    }
    let bytes = tile.iter().product::<usize>() as u64 * elem;
    let mut leading = Vec::new();
    if let Some(ix) = &shared.index {
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
    let (coords, boxes) = window.into_iter().map(|(start, n)| (start, n as u32)).unzip();
    let store = kind == ParamKind::Out;
    Some(TmaCopy { array: &a.name, boxes, coords, scratch: &s.name, leading, bytes, elem, swizzle: 0, store })
}

/// The start and length of a region of an array along each dimension: `:`, `ds(s, n)`, or a
/// single index (length 1).
fn window(r: &RefAt, shape: &[usize]) -> Option<Vec<(Operand, usize)>> {
    let zero = Operand::Lit(Literal::Int(0));
    let Some(ix) = &r.index else { return Some(shape.iter().map(|&n| (zero.clone(), n)).collect()) };
    (ix.iter().zip(shape))
        .map(|(i, &n)| match i {
            Index::Full => Some((zero.clone(), n)),
            Index::Slice { start, size, stride: 1 } => Some((start.clone(), *size)),
            Index::At(at @ (Operand::Value(_) | Operand::Lit(Literal::Int(_)))) => Some((at.clone(), 1)),
            _ => None,
        })
        .collect()
}
