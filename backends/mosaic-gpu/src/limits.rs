//! The numbers of the model that more than one stage reads: the warpgroup's size and the hardware
//! and language limits that planning checks and emission and the runtime rely on. This file
//! imports no other file of the crate, so every file may import it.

/// CUDA threads per warpgroup.
pub const THREADS: u32 = 128;
/// The most warpgroups of one CTA: CUDA launches at most 1,024 threads per block. A mesh's
/// thread axis may have up to 16 points (as Pallas allows); past 8, each warpgroup runs several
/// points in turn.
pub const MAX_WARPGROUPS: u32 = 8;
/// The most Mosaic threads (warpgroups) a mesh's thread axis may have, as Pallas allows.
pub const MAX_NUM_THREADS: u64 = 16;
/// The most registers one value may take in a thread (a 64x64 block over 128 threads).
pub const MAX_REGISTERS_PER_VALUE: usize = 32;
/// The largest block value lowered, in elements (docs/language.md §5).
pub const MAX_BLOCK_ELEMENTS: usize = 16_384;
/// The most dynamic shared memory one CTA may have on sm_90 (227 KiB, opted into per function
/// above 48 KiB). A CTA whose workspace is larger keeps it in global memory.
pub const MAX_SHARED_BYTES: u64 = 227 * 1024;
/// The dynamic shared memory a function may use without opting in.
pub const DEFAULT_SHARED_BYTES: u64 = 48 * 1024;
/// The most elements of one argument: element indices are 32-bit signed integers.
pub const MAX_ARRAY_ELEMENTS: usize = i32::MAX as usize;
/// The most CTAs one launch may have (`gridDim.x`).
pub const MAX_CTAS: u64 = i32::MAX as u64;
/// The most barriers of one `barrier` array of the concurrent model: each thread keeps the
/// parity of the next phase it waits for of each in a bit of one 32-bit register.
pub const MAX_BARRIERS_PER_ARRAY: usize = 32;
/// The most arrivals one mbarrier phase may count (`mbarrier.init`'s range).
pub const MAX_ARRIVALS: usize = (1 << 20) - 1;

/// Bytes of one element of `d` in an array or a scratch buffer: 16-bit floats and integers 2,
/// 8-bit integers 1, the rest (`bool` included) 4 (as numpy and TMA have them). A value's
/// workspace slot holds every element as 4.
pub fn element_bytes(d: tessel_plugin_api::ir::DType) -> usize {
    match d {
        tessel_plugin_api::ir::DType::Bool => 4,
        d => d.bits() as usize / 8,
    }
}
