//! How deep a kernel may nest, so that every recursive pass over it (the parser, the verifier,
//! the printer, each backend's writer, the interpreter) stays far inside a thread's stack, in
//! debug builds too, and so that no element count or byte size overflows 64 bits; past these
//! the parser and the verifier say so (docs/language.md, Limits). Each backend has its own,
//! smaller limits besides, which it names when it refuses.

/// `when`, `for` and `if` bodies inside one another.
pub const MAX_NESTING: usize = 64;

/// Operators, parentheses and calls in one size expression (a chain `1 + 1 + ...` nests as
/// deep as it is long).
pub const MAX_SIZE_TERMS: usize = 256;

/// Elements of one array or block value: 2^48 (a petabyte of `f32`), so that element counts,
/// byte sizes and offsets computed from them never overflow 64 bits.
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 48;

/// The element count of `shape` where it is at most [`MAX_ARRAY_ELEMENTS`].
pub fn elements_within_limit(shape: &[usize]) -> Option<u64> {
    shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64)).filter(|&n| n <= MAX_ARRAY_ELEMENTS)
}

/// Matrices in one batched `dot` (the product of its leading dimensions): each is written as a
/// `dot` of its own (`legalize::legalize`), so the count bounds the code a kernel expands to.
pub const MAX_DOT_BATCH: usize = 256;
