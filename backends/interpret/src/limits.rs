//! The sizes the interpreter runs at most. Imports nothing of this crate: `lib.rs` checks kernels
//! against them and `error.rs` names them in its refusals. Public as `tessel_interpret::MAX_*`.

/// The largest block value the interpreter runs, in elements (64 MiB of f32).
pub const MAX_BLOCK_ELEMENTS: usize = 1 << 24;

/// The largest argument array, in elements (indices are 32-bit on every backend).
pub const MAX_ARRAY_ELEMENTS: usize = 1 << 32;
