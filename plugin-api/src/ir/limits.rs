//! How deep a kernel may nest, so that every recursive pass over it (the parser, the verifier,
//! the printer, each backend's writer, the interpreter) stays far inside a thread's stack, in
//! debug builds too; past these the parser and the verifier say so (docs/language.md, Limits).

/// `when` and `for` bodies inside one another.
pub const MAX_NESTING: usize = 64;

/// Operators, parentheses and calls in one size expression (a chain `1 + 1 + ...` nests as
/// deep as it is long).
pub const MAX_SIZE_TERMS: usize = 256;
