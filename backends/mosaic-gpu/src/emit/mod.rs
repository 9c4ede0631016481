//! A [`KernelPlan`] to PTX text (`.version 8.0`, `.target sm_90a`). See `lower.rs` for the model.
//!
//! One `Writer` (`writer.rs`) writes a kernel's body in one pass, then its header. Its files,
//! each built only on those before it:
//! - `conv.rs`: pure mappings (PTX type names, literal bits, strides);
//! - `writer.rs`: the writer's state, registers, labels, element loops and the barriers the plan
//!   places (`lower/meetings.rs`);
//! - `header.rs`: the PTX header, entry parameters and register declarations;
//! - `grid.rs`: thread, warpgroup and CTA ids, grid coordinates, argument block origins;
//! - `ops.rs`: element operations and the inline maths functions;
//! - `memory.rs`: workspace slots, operands, `load` and `store`;
//! - `reduce.rs`, `dot.rs`: `reduce` and `dot` (`mma.sync`) on the general path;
//! - `barriers.rs`: the concurrent model's barriers as mbarriers, on the general path;
//! - `tma.rs`: the concurrent model's copies by TMA (`crate::tma`), on the general path;
//! - `products.rs`: the concurrent model's products on `wgmma` (`crate::async_mma`), on the
//!   general path, with `wgmma.rs`'s descriptors;
//! - `kernel.rs`: the general path's kernel frame and statements;
//! - `wgmma.rs`: the Hopper path (`crate::wgmma`): TMA, mbarriers, `wgmma.mma_async`;
//! - `attention.rs`: the Hopper attention path (`crate::attention`), on `wgmma.rs`'s pieces.
//!
//! Registers are PTX virtual registers (`%r` 32-bit, `%rd` 64-bit, `%p` predicates) numbered in
//! emission order, as nvcc numbers its own; every 32-bit value uses a `.b32` register, which PTX
//! accepts for `.f32`, `.s32` and `.u32` instructions alike.

mod attention;
mod barriers;
mod conv;
mod dot;
mod elements;
mod grid;
mod header;
mod kernel;
mod memory;
mod ops;
mod products;
mod reduce;
mod tma;
mod wgmma;
mod writer;

pub use conv::{element_bytes, half_bits};

use crate::lower::KernelPlan;
use writer::Writer;

/// The PTX module of one planned kernel.
pub fn emit(plan: &KernelPlan) -> String {
    let mut w = Writer::new(plan);
    match (&plan.gemm, &plan.attention) {
        (Some(g), _) => w.write_gemm(g),
        (_, Some(a)) => w.write_attention(a),
        _ => w.write_kernel(),
    }
    w.finish()
}
