//! The concurrent model's products on `wgmma` (docs/language.md §10, per backend): which
//! `mma_async`s a kernel's general-path lowering issues as asynchronous warpgroup products, and the
//! layouts that asks of the scratch they read and accumulate in. Chosen by what the kernel does
//! with each buffer, not by how it is spelled:
//!
//! - an **operand buffer**: `f16`/`bf16` scratch read by such products, whose copies by TMA move
//!   whole 2-D tiles. It is laid out in the swizzled slabs `wgmma` reads through shared-memory
//!   descriptors and TMA writes: its tiles (the trailing two dimensions, `[R, C]`) as slabs of
//!   `span / 2` columns (`span`: 128, 64 or 32 bytes, the widest the tile's rows divide into),
//!   each slab `R` rows of `span` bytes, the 16-byte chunks of a row swizzled with its row in the
//!   atom of 8 rows (PTX ISA "Shared Memory Matrix Layout"). Loads and stores of threads find its
//!   elements there (`emit/memory.rs`), tensor copies copy a box a slab, and a product that reads
//!   what threads wrote follows a proxy fence;
//! - an **accumulator in registers**: `f32` scratch whose every access is by one warpgroup at its
//!   own tile (the leading index is its point of the thread axis, `program_id` of that axis: how
//!   Pallas's `plgpu.ACC` is translated; or a 2-D buffer in a kernel of one thread a program),
//!   whole: zeroed or set by a `store`, accumulated by such
//!   products, read by a `load`. Each warpgroup keeps its tile in the registers of the `wgmma`
//!   accumulator layout across the kernel; the `store` and `load` move it from and to a value.
//!
//! A product's left operand may also be a value (`%a`, Pallas's operand in registers): each
//! thread gathers its elements of the `wgmma` register layout from the value where the product
//! is issued.
//!
//! A product is taken when its accumulator and its operands are such buffers (a fixed point:
//! one product that cannot be taken keeps its buffers, and so every other product on them, on
//! the synchronous path), its operand windows start on the layout's atoms (rows at multiples of
//! 8, columns at multiples of a slab, proved from the index: a literal or a `mul` by one), its
//! shape one `wgmma.m64nNk16` covers (`M` a multiple of 64, `N` of 8 up to 256, `K` of 16).
//! Every other product is made by the issuing warpgroup where it is issued, as before
//! (`ir::synchronous::per_thread`).

use std::collections::{BTreeMap, HashMap, HashSet};

use tessel_plugin_api::ir::*;

use crate::limits::element_bytes;
use crate::tma;

/// Rows of a warpgroup's `wgmma` (and of the swizzle atom's groups, 8 a descriptor's stride).
pub const WG_ROWS: usize = 64;
/// The most accumulator registers a thread keeps for one buffer.
const MAX_ACC_REGISTERS: usize = 128;

/// What the products of a kernel take: the operand buffers' layouts and the accumulators kept
/// in registers. Empty for a kernel without products `wgmma` makes.
#[derive(Clone, Debug, Default)]
pub struct AsyncMma {
    /// Operand buffers, by name: their swizzle span in bytes.
    pub swizzled: HashMap<String, u32>,
    /// Accumulators in registers, in the order their registers are named: the buffer and its
    /// tile `[M, N]`.
    pub accumulators: Vec<(String, [usize; 2])>,
    /// Whether every product of the kernel is taken, so that `mma_wait N` counts them all.
    pub all: bool,
    /// Operand buffers that threads write (with `store`, or copies they make): a product reading
    /// one follows a proxy fence, so that `wgmma` sees those writes.
    pub thread_written: HashSet<String>,
}

impl AsyncMma {
    /// The accumulator `name`'s place among them and its tile, where it is one.
    pub fn accumulator(&self, name: &str) -> Option<(usize, [usize; 2])> {
        self.accumulators.iter().position(|(n, _)| n == name).map(|i| (i, self.accumulators[i].1))
    }

    /// Whether `op` is a product made by `wgmma`, or a wait for them.
    pub fn takes(&self, op: &SyncOp) -> bool {
        match op {
            SyncOp::Mma { acc, .. } => self.accumulator(&acc.name).is_some(),
            SyncOp::MmaWait { .. } => !self.accumulators.is_empty(),
            _ => false,
        }
    }

    /// Whether product `op` reads an operand buffer that threads write.
    pub fn reads_thread_writes(&self, op: &SyncOp) -> bool {
        let SyncOp::Mma { a, b, .. } = op else { return false };
        let a = match a {
            MmaLhs::Ref(a) => Some(&a.name),
            MmaLhs::Value(_) => None,
        };
        a.into_iter().chain([&b.name]).any(|n| self.thread_written.contains(n))
    }

    /// The values of kernel `k` loaded from or stored to an accumulator in registers, or read as
    /// a product's operand in registers: each read and written across the warpgroup's threads.
    pub fn moved_values(&self, k: &Kernel) -> Vec<String> {
        let mut out = Vec::new();
        analysis::visit(&k.body, &mut |s| match &s.op {
            Op::Load { src, .. } if self.accumulator(src).is_some() => out.extend(s.results.iter().cloned()),
            Op::Store { dst, value: Operand::Value(v), .. } if self.accumulator(dst).is_some() => out.push(v.clone()),
            Op::Sync(SyncOp::Mma { acc, a: MmaLhs::Value(Operand::Value(v)), .. }) if self.accumulator(&acc.name).is_some() => {
                out.push(v.clone())
            }
            _ => {}
        });
        out
    }

    /// The copy by TMA `c`, landing as its scratch is laid out.
    pub fn lay_out<'k>(&self, c: tma::TmaCopy<'k>) -> tma::TmaCopy<'k> {
        let span = self.span(c.scratch);
        c.laid_out(span)
    }

    /// The swizzle span of scratch `name` (0: row-major, as scratch is laid out otherwise).
    pub fn span(&self, name: &str) -> u32 {
        self.swizzled.get(name).copied().unwrap_or(0)
    }
}

/// The swizzle span of a tile whose rows are `row_bytes`: the widest of 128, 64 and 32 bytes that
/// a row is a whole number of, or one.
pub fn span_of(row_bytes: usize) -> Option<u32> {
    [128, 64, 32].into_iter().find(|&s| row_bytes.is_multiple_of(s as usize) && (row_bytes >= 128 || row_bytes == s as usize))
}

/// Decides, for kernel `k` whose copies `by_tma` makes by TMA, which products go on `wgmma`.
pub fn analyse(v: &Verified, by_tma: &dyn Fn(&SyncOp) -> bool) -> AsyncMma {
    let k = v.kernel();
    let facts = Facts::of(k);
    // Every access of every scratch buffer, and each product that could be taken.
    let mut accesses: HashMap<&str, Vec<Access<'_>>> = HashMap::new();
    let mut products = Vec::new();
    let mut all_products = 0usize;
    analysis::visit(&k.body, &mut |s| match &s.op {
        Op::Load { src, index, mask, .. } => {
            accesses.entry(src).or_default().push(Access::Load { index: index.as_deref(), masked: mask.is_some() });
        }
        Op::Store { dst, index, mask, .. } => {
            accesses.entry(dst).or_default().push(Access::Store { index: index.as_deref(), masked: mask.is_some() });
        }
        Op::Sync(op @ SyncOp::Copy { dst, src, .. }) => {
            // By TMA, a copy lands (or leaves) as slabs of one 2-D tile (`rows` rows each); made
            // by the thread, it is its loads and stores.
            let tensor = by_tma(op);
            let tile = |r: &RefAt| k.param(&r.name).map(|p| analysis::region_shape(p, r.index.as_deref()).len()) == Some(2);
            for (r, written) in [(dst, true), (src, false)] {
                let access = if tensor { Access::Tensor { tile: tile(r) } } else { Access::Copy { written } };
                accesses.entry(&r.name).or_default().push(access);
            }
        }
        Op::Sync(op @ SyncOp::Mma { acc, a, b, .. }) => {
            all_products += 1;
            let n = products.len();
            accesses.entry(&acc.name).or_default().push(Access::Product(n));
            if let MmaLhs::Ref(a) = a {
                accesses.entry(&a.name).or_default().push(Access::Product(n));
            }
            accesses.entry(&b.name).or_default().push(Access::Product(n));
            products.push((op, shape(v, &facts, op)));
        }
        _ => {}
    });
    let scratch = |name: &str| k.param(name).filter(|p| p.kind == ParamKind::Scratch);
    // Candidates, then a fixed point: a buffer every access of which a taken product (or TMA,
    // or the accumulator's own load and store) makes, and products all of whose buffers are so.
    let mut taken: Vec<bool> = products.iter().map(|(_, s)| s.is_some()).collect();
    loop {
        let fits = |name: &str, role: Role| -> bool {
            let Some(p) = scratch(name) else { return false };
            let list = accesses.get(name).map(Vec::as_slice).unwrap_or_default();
            list.iter().all(|a| match (a, role) {
                (Access::Product(n), _) => taken[*n],
                (Access::Tensor { tile }, Role::Operand) => *tile,
                (Access::Load { .. } | Access::Store { .. } | Access::Copy { .. }, Role::Operand) => true,
                (Access::Load { index, masked: false } | Access::Store { index, masked: false }, Role::Accumulator) => {
                    facts.own_tile(p, *index)
                }
                _ => false,
            })
        };
        let next: Vec<bool> = (products.iter().enumerate())
            .map(|(n, (op, _))| {
                let SyncOp::Mma { acc, a, b, .. } = op else { unreachable!("products are mma_async") };
                taken[n]
                    && fits(&acc.name, Role::Accumulator)
                    && match a {
                        MmaLhs::Ref(a) => fits(&a.name, Role::Operand),
                        MmaLhs::Value(_) => true,
                    }
                    && fits(&b.name, Role::Operand)
            })
            .collect();
        if next == taken {
            break;
        }
        taken = next;
    }
    let mut out = AsyncMma::default();
    let mut accumulators = BTreeMap::new();
    for (n, (op, s)) in products.iter().enumerate() {
        let (SyncOp::Mma { acc, a, b, .. }, true, Some(s)) = (op, taken[n], s) else { continue };
        let a = match a {
            MmaLhs::Ref(a) => Some((&a.name, s.spans[0])),
            MmaLhs::Value(_) => None,
        };
        for (name, span) in a.into_iter().chain([(&b.name, s.spans[1])]) {
            out.swizzled.insert(name.clone(), span);
            let writes = |x: &Access<'_>| matches!(x, Access::Store { .. } | Access::Copy { written: true });
            if accesses.get(name.as_str()).is_some_and(|list| list.iter().any(writes)) {
                out.thread_written.insert(name.clone());
            }
        }
        accumulators.insert(acc.name.clone(), s.acc);
    }
    out.accumulators = accumulators.into_iter().collect();
    out.all = taken.iter().all(|&t| t) && taken.len() == all_products;
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Operand,
    Accumulator,
}

/// One access of a buffer.
enum Access<'k> {
    /// A thread's `load` of a region.
    Load { index: Option<&'k [Index]>, masked: bool },
    /// A thread's `store` to a region.
    Store { index: Option<&'k [Index]>, masked: bool },
    /// A copy by TMA into or out of it: of one whole 2-D tile, or not.
    Tensor { tile: bool },
    /// A copy made by the issuing thread, into it (`written`) or out of it.
    Copy { written: bool },
    /// The `n`th product reads or accumulates in it.
    Product(usize),
}

/// What one takeable product needs: its accumulator tile and its operands' spans.
#[derive(Clone, Debug)]
struct Shape {
    acc: [usize; 2],
    spans: [u32; 2],
}

/// The shape of product `op` where one `wgmma` sequence makes it: `f16`/`bf16` operands, `b` a
/// 2-D tile in swizzled slabs and `a` one too or a value (the operand in registers), windows on
/// atoms, an `f32` accumulator tile of the thread.
fn shape(v: &Verified, facts: &Facts, op: &SyncOp) -> Option<Shape> {
    let k = v.kernel();
    let SyncOp::Mma { acc, a, b, trans_a, trans_b } = op else { return None };
    let (pb, pc) = (k.param(&b.name)?, k.param(&acc.name)?);
    let ((wa, sa), dtype) = match a {
        MmaLhs::Ref(a) => {
            let pa = k.param(&a.name)?;
            (operand(facts, pa, a)?, pa.ty.dtype)
        }
        MmaLhs::Value(Operand::Value(name)) => {
            let ty = v.value_type(name);
            ((ty.shape.clone().try_into().ok()?, 0), ty.dtype)
        }
        MmaLhs::Value(_) => return None,
    };
    if !matches!(dtype, DType::F16 | DType::BF16) || dtype != pb.ty.dtype || pc.ty.dtype != DType::F32 {
        return None;
    }
    if !facts.own_tile(pc, acc.index.as_deref()) {
        return None;
    }
    let tile = |p: &Param| -> Option<[usize; 2]> { p.ty.shape[p.ty.shape.len().checked_sub(2)?..].try_into().ok() };
    let [m, n] = tile(pc)?;
    let (wb, sb) = operand(facts, pb, b)?;
    // A is [M, K] (trans_a: [K, M]); B is [K, N] (trans_b: [N, K]).
    let [am, ak]: [usize; 2] = if *trans_a { [wa[1], wa[0]] } else { wa };
    let (bk, bn) = if *trans_b { (wb[1], wb[0]) } else { (wb[0], wb[1]) };
    let ok = am == m
        && bn == n
        && ak == bk
        && m.is_multiple_of(WG_ROWS)
        && n.is_multiple_of(8)
        && n <= 256
        && ak.is_multiple_of(16)
        && m / WG_ROWS * n / 2 <= MAX_ACC_REGISTERS;
    ok.then_some(Shape { acc: [m, n], spans: [sa, sb] })
}

/// The window `[rows, columns]` of an operand region and its tile's span, where the window
/// starts on the layout's atoms: rows at multiples of 8, columns at multiples of a slab.
fn operand(facts: &Facts, p: &Param, r: &RefAt) -> Option<([usize; 2], u32)> {
    let shape = &p.ty.shape;
    let lead = shape.len().checked_sub(2)?;
    let (rows, cols) = (shape[lead], shape[lead + 1]);
    let span = span_of(cols * element_bytes(p.ty.dtype))?;
    let slab = span as usize / element_bytes(p.ty.dtype);
    if !rows.is_multiple_of(8) {
        return None;
    }
    let whole = [Index::Full, Index::Full];
    let ix = r.index.as_deref().unwrap_or(&whole[..]);
    let (before, tail) = ix.split_at(ix.len().checked_sub(2)?);
    if ix.len() != shape.len() || !before.iter().all(|i| matches!(i, Index::At(_))) {
        return None;
    }
    let dim = |i: &Index, len: usize, atom: usize| match i {
        Index::Full => Some(len),
        Index::Slice { start, size, stride: 1 } if facts.multiple(start, atom) && (size.is_multiple_of(atom) || *size == len) => {
            Some(*size)
        }
        _ => None,
    };
    Some(([dim(&tail[0], rows, 8)?, dim(&tail[1], cols, slab)?], span))
}

/// What the kernel's statements say about its values: which are a point of a thread axis, and
/// which are a literal multiple of what.
struct Facts {
    /// Values defined by `program_id` of a `thread` axis.
    thread_ids: HashSet<String>,
    /// Values defined by `mul` of a value by a literal: the literal.
    multiples: HashMap<String, i64>,
    /// Whether a program has one thread (no `thread` axis of more than one point).
    one_thread: bool,
}

impl Facts {
    fn of(k: &Kernel) -> Facts {
        let grid = k.grid.as_deref().unwrap_or_default();
        let thread = |a: &AxisRef| match a {
            AxisRef::Name(n) => grid.iter().any(|g| g.thread && &g.name == n),
            AxisRef::Pos(p) => grid.get(*p).is_some_and(|g| g.thread),
        };
        let one_thread = !grid.iter().any(|g| g.thread && !matches!(g.size, AxisSize::Fixed(1)));
        let mut facts = Facts { thread_ids: HashSet::new(), multiples: HashMap::new(), one_thread };
        analysis::visit(&k.body, &mut |s| {
            let Some(r) = s.results.first() else { return };
            match &s.op {
                Op::ProgramId(a) if thread(a) => {
                    facts.thread_ids.insert(r.clone());
                }
                Op::Binary(BinaryOp::Mul, Operand::Value(_), Operand::Lit(Literal::Int(c)))
                | Op::Binary(BinaryOp::Mul, Operand::Lit(Literal::Int(c)), Operand::Value(_)) => {
                    facts.multiples.insert(r.clone(), *c);
                }
                _ => {}
            }
        });
        facts
    }

    /// Whether `o` is a multiple of `n`.
    fn multiple(&self, o: &Operand, n: usize) -> bool {
        let n = n as i64;
        match o {
            Operand::Lit(Literal::Int(v)) => v % n == 0,
            Operand::Value(v) => self.multiples.get(v).is_some_and(|c| c % n == 0),
            _ => false,
        }
    }

    /// Whether region `index` of scratch `p` is the thread's own whole tile: its one leading
    /// index a point of the thread axis, its trailing two dimensions whole; or, in a kernel of
    /// one thread a program, the whole of a 2-D buffer.
    fn own_tile(&self, p: &Param, index: Option<&[Index]>) -> bool {
        let shape = &p.ty.shape;
        let whole = |i: &Index, len: usize| match i {
            Index::Full => true,
            Index::Slice { start: Operand::Lit(Literal::Int(0)), size, stride: 1 } => *size == len,
            _ => false,
        };
        match (shape.len(), index) {
            (2, None) => self.one_thread,
            (2, Some(ix)) => self.one_thread && whole(&ix[0], shape[0]) && whole(&ix[1], shape[1]),
            (3, Some(ix)) => {
                matches!(&ix[0], Index::At(Operand::Value(v)) if self.thread_ids.contains(v))
                    && whole(&ix[1], shape[1])
                    && whole(&ix[2], shape[2])
            }
            _ => false,
        }
    }
}

/// Bytes a swizzled buffer's start is aligned to: the 128-byte swizzle's atom, 8 rows of 128
/// bytes (the narrower swizzles' atoms divide it).
pub const SWIZZLED_ALIGN: u64 = 1024;
