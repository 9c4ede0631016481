//! The tessel IR: the kernel language of `docs/language.md` as Rust types.
//!
//! This module is a specification. Every backend must give the results that the reference
//! interpreter (`tessel-interpret`) gives, and the interpreter follows this text.
//!
//! # Stages
//!
//! - [`parse`] turns `.tk` text into a [`Module`] of [`Kernel`]s, reporting every syntax error of a
//!   file with `line:column`, the offending text and what was expected.
//! - [`verify`] checks one kernel once and returns a [`Verified`] kernel; every later stage
//!   (interpreter, lowering to PTX or WGSL) takes `&Verified`, so nothing unverified runs.
//! - [`print`] writes the one canonical text form, `print(parse(print(k))) == print(k)`;
//!   [`builder`] makes the same IR from Rust, for users who write no text.
//!
//! # Programs, evaluation order and side effects
//!
//! A kernel runs once per point of its grid (no grid: one point). The points that differ in a
//! *parallel* axis are independent **programs** and may run in any order or at the same time. The
//! points of the *sequential* (`seq`) axes run in order inside one program, the innermost declared
//! `seq` axis fastest, and see each other's writes to outputs and scratch.
//!
//! Inside a program the statements of a body run top to bottom. Values are immutable SSA values;
//! the only side effects are `store`s to outputs and scratch, which are visible to every later
//! `load` of the same program. Outputs start as zeros before the first program; scratch starts as
//! zeros once per program (not per sequential step).
//!
//! # Scoping
//!
//! Every value name is defined once per kernel (not merely once per block). A value is visible from
//! its definition to the end of the body that defines it, including nested bodies. The bodies of
//! `when`, `for` and `if` define nothing outside themselves, except the results of a `for` (one
//! per `iter` argument) and of an `if` (one per yielded value), defined after it. A `for` loop's induction variable and `iter`
//! arguments are visible in its body only.
//!
//! # Types
//!
//! A [`Type`] is a [`DType`] and a shape. Shape `[]` is a scalar. Every value has a static type.
//! Broadcasting follows numpy: shapes are aligned at the right and a dimension of size 1, or a
//! missing leading dimension, stretches to match the other operand.
//!
//! Literals (`1`, `-2.5`, `inf`, `nan`, `true`) take the element type of the other operand of the
//! operation; an integer literal may stand for a float, a float literal never for an integer.
//!
//! # Operations and their typing rules
//!
//! In each rule `T[S]` is an operand's element type and shape, `B` the (indexed) block shape of a
//! reference, `bcast(S1, S2)` numpy broadcasting (an error where the shapes disagree).
//!
//! | op | typing rule |
//! |---|---|
//! | `load R[idx] mask %m other L` | `R` an `in`, `out` or `scratch`: result `T[B']` where `B'` is `B` with `:` kept, `ds(s, n)` as `n`, a single index dropped; `%m : bool[S]` with `S` broadcastable to `B'`; `L` of type `T`. A scalar argument loads as `T`. |
//! | `store R[idx], v mask %m` | `R` an `out` or `scratch`; `v : T[S]` with `S` broadcastable to `B'`; no result. |
//! | `program_id A`, `num_programs A` | `A` a grid axis name or position: `i32`. |
//! | `iota d : T[S]` | `T` is `i32` or `u32`, `d < rank S`: `T[S]`, element = its index along `d`. |
//! | `full L : T[S]`, `zeros : T[S]` | `T[S]` (`S` may be `[]`). |
//! | unary `neg abs` | numeric `T[S] -> T[S]`. |
//! | unary `exp exp2 log log2 sqrt rsqrt sin cos tanh logistic floor ceil` | float `T[S] -> T[S]`. |
//! | unary `not` | `bool` or integer `T[S] -> T[S]` (bitwise for integers). |
//! | binary `add sub mul div rem max min` | numeric `T[S1], T[S2] -> T[bcast(S1, S2)]`. |
//! | binary `pow` | float only. |
//! | binary `and or xor` | `bool` or integer. |
//! | binary `shl shr` | integer. |
//! | compare `eq ne lt le gt ge` | `T[S1], T[S2] -> bool[bcast(S1, S2)]` (`eq ne` also on `bool`). |
//! | `select c, a, b` | `bool[S0], T[S1], T[S2] -> T[bcast(S0, S1, S2)]`. |
//! | `cast v : U` | `T[S] -> U[S]`, any dtypes. |
//! | `bitcast v : U` | `T[S] -> U[S]` where `T` and `U` have the same width (`bool` excluded). |
//! | `broadcast v : T[S']` | `S` broadcastable to `S'`. |
//! | `reshape v : T[S']` | same element count. |
//! | `transpose v perm (p...)` | `p` a permutation of `0..rank`: dimensions reordered. |
//! | reduce `sum prod max min v axis d keepdims` | numeric `T[S]`, `d < rank S`: `T[S without d]`, or with `d` as 1 under `keepdims`. |
//! | `dot a, b trans_a trans_b` | `a : T[M, K]` (`[K, M]` with `trans_a`), `b : T[K, N]` (`[N, K]` with `trans_b`): `f32[M, N]` for float `T`, `T[M, N]` for integers. |
//! | `when %c { ... }` | `%c : bool` scalar. |
//! | `for %i = lo to hi step s iter (%a = v, ...) { ... yield w, ... }` | `lo hi s : i32` scalars, `%i : i32`; each `%a` has the type of its `v`, each `w` the type of its `%a`; the results have the same types. |
//!
//! # Numerics
//!
//! Integer `add sub mul neg` wrap. Integer `div` and `rem` truncate toward zero; a zero divisor
//! gives 0. Float `rem` is the truncated remainder (C `fmod`). `shr` is arithmetic for `i32` and
//! logical for `u32`; shift counts are taken modulo 32. `max` and `min` (binary and reduce)
//! propagate NaN. `cast` float to integer truncates toward zero and saturates, NaN gives 0; integer
//! to integer wraps (two's complement); to `bool` is `!= 0`; from `bool` gives 0 or 1. Float maths
//! is IEEE-754 in the value's precision: `f16` and `bf16` results are rounded to their type after
//! every operation; reductions and `dot` accumulate floats in `f32`. Transcendentals are computed in
//! `f64` and rounded (backends may be 2 ulp off).
//!
//! # Memory and edges
//!
//! A block is a window of its array: along dimension `d` it starts at element `E_d * B_d`, where
//! `E_d` is the affine index of `at (...)` evaluated at the grid point. Indices inside a load or
//! store are relative to the block's origin; only the bounds of the *array* are checked. A load of an
//! element outside the array gives `other` (or zero), a store outside the array does nothing, and a
//! masked-off lane is neither read nor written. Scratch is its own array.

pub mod analysis;
pub mod batch;
pub mod builder;
pub mod counters;
mod diag;
mod dtype;
pub mod generic;
pub mod index;
pub mod legalize;
mod lexer;
pub mod limits;
mod op_names;
mod sync;
pub mod parse;
pub mod print;
pub mod schedule;
pub mod size;
pub mod synchronous;
mod values;
pub mod verify;
use std::fmt;

pub use diag::{Diagnostic, Diagnostics, SourceMap, Span};
pub use dtype::DType;
pub use index::BlockIndex;
pub use op_names::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
pub use sync::{BarrierAt, BarrierDecl, MmaLhs, RefAt, SyncOp};
pub use parse::{ArgDecl, SizeParam, parse};
pub use print::{print_kernel, print_module};
pub use values::{ValueId, ValueMap, ValueSet, ValueTable};
pub use verify::{Verified, verify, verify_derived};

/// A value's or an argument's type: an element type and a shape (`[]` for a scalar).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
}

impl Type {
    /// A scalar of `dtype`.
    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, shape: Vec::new() }
    }

    /// An array or block of `dtype` with `shape`.
    pub fn array(dtype: DType, shape: impl Into<Vec<usize>>) -> Type {
        Type { dtype, shape: shape.into() }
    }

    /// Whether the shape is `[]`.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dtype.name())?;
        if !self.shape.is_empty() {
            f.write_str("[")?;
            for (n, d) in self.shape.iter().enumerate() {
                if n > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{d}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// A `.tk` file: one or more kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// The kernels in file order.
    pub kernels: Vec<Kernel>,
}

/// One kernel: a header (grid and arguments) and a body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The kernel's name.
    pub name: String,
    /// The grid; `None` means one program (or the grid of a mesh given at launch).
    pub grid: Option<Vec<GridAxis>>,
    /// Arguments: `in`, `out` and `scratch`, in declaration order.
    pub params: Vec<Param>,
    /// Barriers (`barrier NAME[N] arrivals K`), in declaration order: the program's own, shared
    /// by its threads (docs/language.md, "Threads, barriers and asynchronous operations").
    pub barriers: Vec<BarrierDecl>,
    /// The body.
    pub body: Vec<Stmt>,
    /// Where the `kernel` line is.
    pub span: Span,
}

impl Kernel {
    /// The argument called `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// The arguments of one kind, in declaration order.
    pub fn params_of(&self, kind: ParamKind) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(move |p| p.kind == kind)
    }

    /// The barrier array called `name`.
    pub fn barrier(&self, name: &str) -> Option<&BarrierDecl> {
        self.barriers.iter().find(|b| b.name == name)
    }

    /// Whether the kernel uses the concurrent model: a `thread` grid axis, a barrier or an
    /// asynchronous statement (docs/language.md, "Threads, barriers and asynchronous operations").
    pub fn is_concurrent(&self) -> bool {
        let mut found = !self.barriers.is_empty() || self.grid.iter().flatten().any(|a| a.thread);
        analysis::visit(&self.body, &mut |s| found |= matches!(s.op, Op::Sync(_)));
        found
    }
}

/// A grid axis: `i: 8`, `k: 4 seq`, `n: dyn`.
#[derive(Clone, Debug, PartialEq)]
pub struct GridAxis {
    /// The axis name, used by `at (...)`, `program_id` and `num_programs`.
    pub name: String,
    /// Its size.
    pub size: AxisSize,
    /// Whether its points run in order inside one program.
    pub seq: bool,
    /// Whether its points are the **threads** of one program (`wg: 3 thread`): they run at the
    /// same time, share the program's scratch and barriers, and order their accesses only
    /// through barriers and waits (Pallas's `num_threads`, Mosaic GPU's warpgroups).
    pub thread: bool,
    /// For a `dyn` axis written `dyn(n)`: the scalar `in` argument whose value at launch is its
    /// size (a dynamic grid from data, as Pallas's dynamic grid bounds are).
    pub from: Option<String>,
    /// Where it is written.
    pub span: Span,
}

impl GridAxis {
    /// Its size as written: `8`, `dyn`, `dyn(n)`.
    pub fn size_text(&self) -> String {
        match &self.from {
            Some(n) => format!("dyn({n})"),
            None => self.size.to_string(),
        }
    }
}

/// The size of a grid axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisSize {
    /// Fixed in the kernel text.
    Fixed(u64),
    /// Given at launch (a dynamic grid bound).
    Dyn,
}

impl fmt::Display for AxisSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisSize::Fixed(n) => write!(f, "{n}"),
            AxisSize::Dyn => f.write_str("dyn"),
        }
    }
}

/// The kind of a kernel argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamKind {
    /// Read-only input (an array, or a scalar passed by value).
    In,
    /// Output array; starts as zeros.
    Out,
    /// Per-program memory, not visible outside; starts as zeros.
    Scratch,
}

impl ParamKind {
    /// The keyword in `.tk` text.
    pub fn keyword(self) -> &'static str {
        match self {
            ParamKind::In => "in",
            ParamKind::Out => "out",
            ParamKind::Scratch => "scratch",
        }
    }
}

/// A kernel argument.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// `in`, `out` or `scratch`.
    pub kind: ParamKind,
    /// Its name.
    pub name: String,
    /// The whole array's type (a scalar type for scalar arguments).
    pub ty: Type,
    /// The block each program sees; `None` = the whole array at index zero.
    pub block: Option<BlockSpec>,
    /// Where it is written.
    pub span: Span,
}

impl Param {
    /// The shape one program sees: the block shape, or the whole array.
    pub fn block_shape(&self) -> &[usize] {
        match &self.block {
            Some(b) => &b.shape,
            None => &self.ty.shape,
        }
    }
}

/// `block [B0, ...] at (E0, ...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSpec {
    /// Block dimensions, one per array dimension.
    pub shape: Vec<usize>,
    /// Block index per dimension: affine in the grid axes, or computed.
    pub index: Vec<BlockIndex>,
}

/// An integer affine expression of grid axis names: `2*i + 1`, `k - 1`, `0`.
///
/// Kept normalised: one term per axis in order of first appearance, no zero coefficients.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Affine {
    /// `(coefficient, axis name)` pairs.
    pub terms: Vec<(i64, String)>,
    /// The constant term.
    pub constant: i64,
}

impl Affine {
    /// The constant `c`.
    pub fn constant(c: i64) -> Affine {
        Affine { terms: Vec::new(), constant: c }
    }

    /// The axis `name` with coefficient 1.
    pub fn axis(name: &str) -> Affine {
        Affine { terms: vec![(1, name.to_string())], constant: 0 }
    }

    /// Adds `coef * name`, merging with an existing term and dropping zero terms.
    pub fn add_term(&mut self, coef: i64, name: &str) {
        if let Some(t) = self.terms.iter_mut().find(|t| t.1 == name) {
            t.0 = t.0.wrapping_add(coef);
        } else {
            self.terms.push((coef, name.to_string()));
        }
        self.terms.retain(|t| t.0 != 0);
    }

    /// Whether `name` appears with a non-zero coefficient.
    pub fn uses(&self, name: &str) -> bool {
        self.terms.iter().any(|t| t.1 == name)
    }

    /// Evaluates the expression with `value(axis name)`.
    pub fn eval(&self, mut value: impl FnMut(&str) -> i64) -> i64 {
        self.terms.iter().fold(self.constant, |acc, (c, n)| acc.wrapping_add(c.wrapping_mul(value(n))))
    }
}

impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, (c, name)) in self.terms.iter().enumerate() {
            let (neg, mag) = (*c < 0, c.unsigned_abs());
            match (n, neg) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            if mag != 1 {
                write!(f, "{mag}*")?;
            }
            f.write_str(name)?;
        }
        match (self.terms.is_empty(), self.constant) {
            (true, c) => write!(f, "{c}"),
            (false, 0) => Ok(()),
            (false, c) if c < 0 => write!(f, " - {}", c.unsigned_abs()),
            (false, c) => write!(f, " + {c}"),
        }
    }
}

/// One statement of a body: `%r = op ... : T`.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    /// Result names (without `%`): none, one, or one per `iter` argument of a `for`.
    pub results: Vec<String>,
    /// The operation.
    pub op: Op,
    /// The result type: as written (parser) or as inferred (after [`verify`]).
    pub ty: Option<Type>,
    /// Where the statement is.
    pub span: Span,
}

/// An operand: a value or a literal.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// `%name` (stored without `%`).
    Value(String),
    /// A literal.
    Lit(Literal),
}

impl Operand {
    /// `%name`.
    pub fn value(name: &str) -> Operand {
        Operand::Value(name.to_string())
    }
}

/// A literal constant.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    /// An integer (`65535`, `-3`); also valid where a float is expected.
    Int(i64),
    /// A float (`0.5`, `1e-5`, `inf`, `-inf`, `nan`).
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
}

impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        match (self, other) {
            (Literal::Int(a), Literal::Int(b)) => a == b,
            (Literal::Float(a), Literal::Float(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            (Literal::Bool(a), Literal::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Literal {
    /// The literal as an `f64` (`true` is 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Int(v) => v as f64,
            Literal::Float(v) => v,
            Literal::Bool(v) => f64::from(u8::from(v)),
        }
    }

    /// The literal as an `i64` (floats truncate).
    pub fn as_i64(self) -> i64 {
        match self {
            Literal::Int(v) => v,
            Literal::Float(v) => v as i64,
            Literal::Bool(v) => i64::from(v),
        }
    }
}

/// One index of a `load` or `store`: `:`, `ds(start, size)` or a single element.
#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    /// `:` the whole dimension.
    Full,
    /// `ds(START, SIZE)`: `SIZE` elements from `START` (dynamic start, static size);
    /// `ds(START, SIZE, STRIDE)`: every `STRIDE`-th from `START` (this project's, issue 36).
    Slice {
        /// First element, relative to the block origin.
        start: Operand,
        /// Number of elements.
        size: usize,
        /// Elements from one to the next (1: contiguous).
        stride: usize,
    },
    /// A single element; the dimension is dropped.
    At(Operand),
    /// The elements at an index vector (`x[%idx, :]` with `%idx: i32[N]`, this project's, issue
    /// 36): a gather on loads, a scatter on stores; the dimension stays, `N` long. Written as
    /// `At` in the text; the verifier tells them apart by the operand's type.
    Gather {
        /// The index vector (a value: an `i32` or `u32` block of one dimension).
        index: Operand,
        /// Its length.
        len: usize,
    },
}

/// A grid axis named in `program_id` or `num_programs`.
#[derive(Clone, Debug, PartialEq)]
pub enum AxisRef {
    /// By name.
    Name(String),
    /// By position in the grid.
    Pos(usize),
}

/// An operation. See the module documentation for each one's typing rule.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `load REF[IDX] mask %m other LIT`.
    Load {
        /// The argument or scratch read.
        src: String,
        /// `None` = the whole block.
        index: Option<Vec<Index>>,
        /// Lanes to read.
        mask: Option<String>,
        /// Value of lanes outside the array or masked off.
        other: Option<Literal>,
    },
    /// `store REF[IDX], v mask %m`.
    Store {
        /// The output or scratch written.
        dst: String,
        /// `None` = the whole block.
        index: Option<Vec<Index>>,
        /// What is written.
        value: Operand,
        /// Lanes to write.
        mask: Option<String>,
    },
    /// `program_id AXIS`.
    ProgramId(AxisRef),
    /// `num_programs AXIS`.
    NumPrograms(AxisRef),
    /// `iota DIM : T[S]`.
    Iota {
        /// The dimension that counts.
        dim: usize,
    },
    /// `full LIT : T[S]`.
    Full(Literal),
    /// `zeros : T[S]`.
    Zeros,
    /// Elementwise unary op.
    Unary(UnaryOp, Operand),
    /// Elementwise binary op.
    Binary(BinaryOp, Operand, Operand),
    /// Elementwise comparison.
    Compare(CmpOp, Operand, Operand),
    /// `select c, a, b`.
    Select(Operand, Operand, Operand),
    /// `cast v : T`.
    Cast(Operand),
    /// `bitcast v : T`.
    Bitcast(Operand),
    /// `broadcast v : T[S]`.
    Broadcast(Operand),
    /// `reshape v : T[S]`.
    Reshape(Operand),
    /// `slice v start (S0, ...) (stride (K0, ...))? : T[SHAPE]`: the elements of `v` from `S` on,
    /// `SHAPE` of them, every `K`-th along each dimension (this project's stride, issue 36).
    Slice {
        /// The value.
        arg: Operand,
        /// Where the slice starts along each dimension.
        start: Vec<usize>,
        /// Elements from one to the next along each dimension (all 1 where the text has none).
        stride: Vec<usize>,
    },
    /// `concatenate v, w, ... axis N`: the operands one after another along dimension `N`.
    Concatenate {
        /// The values, in order.
        args: Vec<Operand>,
        /// The dimension they are joined along.
        axis: usize,
    },
    /// `tile v reps (R0, ...)`: `v` repeated `R_d` times along each dimension `d`, one whole copy
    /// after another (numpy's `tile`; this project's, issue 36).
    Tile {
        /// The value.
        arg: Operand,
        /// Copies along each dimension (at least 1).
        reps: Vec<usize>,
    },
    /// `repeat v times N axis A`: each element of `v` `N` times in a row along dimension `A`
    /// (numpy's `repeat` with one count; this project's, issue 36).
    Repeat {
        /// The value.
        arg: Operand,
        /// Copies of each element (at least 1).
        times: usize,
        /// The dimension they are made along.
        axis: usize,
    },
    /// `transpose v perm (...)`.
    Transpose {
        /// The value.
        arg: Operand,
        /// Result dimension `n` is argument dimension `perm[n]`.
        perm: Vec<usize>,
    },
    /// `sum|prod|max|min v axis N keepdims`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The value.
        arg: Operand,
        /// The axis reduced.
        axis: usize,
        /// Keep the axis as size 1.
        keepdims: bool,
    },
    /// `dot a, b trans_a trans_b`.
    Dot {
        /// Left matrix.
        a: Operand,
        /// Right matrix.
        b: Operand,
        /// `a` is given as `[K, M]`.
        trans_a: bool,
        /// `b` is given as `[N, K]`.
        trans_b: bool,
    },
    /// `when %c { ... }`.
    When {
        /// Scalar `bool` condition.
        cond: Operand,
        /// Runs where `cond` is true.
        body: Vec<Stmt>,
    },
    /// `for %i = lo to hi step s iter (%a = v, ...) { ... yield ... }`.
    For(ForLoop),
    /// `%r, ... = if %c { ... yield %a, ... } else { ... yield %b, ... }`.
    If(IfElse),
    /// `yield v, ...`: the next values of a `for`'s `iter` arguments, or an `if` branch's results.
    Yield(Vec<Operand>),
    /// A statement of the concurrent model: barriers, asynchronous copies and products, fences
    /// and waits (docs/language.md, "Threads, barriers and asynchronous operations").
    Sync(SyncOp),
}

/// `%r, ... = if %c { ... yield %a, ... } else { ... yield %b, ... }`: one of two bodies runs,
/// and the values its `yield` gives are the statement's results (docs/language.md §3).
#[derive(Clone, Debug, PartialEq)]
pub struct IfElse {
    /// Scalar `bool` condition.
    pub cond: Operand,
    /// Runs where `cond` is true; ends with `yield` when the `if` has results.
    pub then: Vec<Stmt>,
    /// Runs where `cond` is false; ends with `yield` when the `if` has results.
    pub els: Vec<Stmt>,
}

/// `for %i = lo to hi step s iter (%a = v, ...) { ... yield ... }`: a loop of one program, its
/// values carried from step to step (docs/language.md §4).
#[derive(Clone, Debug, PartialEq)]
pub struct ForLoop {
    /// Induction variable name.
    pub var: String,
    /// First value.
    pub lo: Operand,
    /// Exclusive bound.
    pub hi: Operand,
    /// Increment (default 1).
    pub step: Option<Operand>,
    /// Loop-carried values and their initial values.
    pub iters: Vec<(String, Operand)>,
    /// `while %c`: a carried `bool` scalar checked before every trip, the first included; the
    /// loop ends where it is false (a data-dependent trip count, `lax.while_loop`'s).
    pub cond: Option<String>,
    /// The body; ends with `yield` when there are `iters`.
    pub body: Vec<Stmt>,
}

impl Op {
    /// The mnemonic that starts the operation in text.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::ProgramId(_) => "program_id",
            Op::NumPrograms(_) => "num_programs",
            Op::Iota { .. } => "iota",
            Op::Full(_) => "full",
            Op::Zeros => "zeros",
            Op::Unary(op, _) => op.name(),
            Op::Binary(op, _, _) => op.name(),
            Op::Compare(op, _, _) => op.name(),
            Op::Select(..) => "select",
            Op::Cast(_) => "cast",
            Op::Bitcast(_) => "bitcast",
            Op::Broadcast(_) => "broadcast",
            Op::Reshape(_) => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Concatenate { .. } => "concatenate",
            Op::Tile { .. } => "tile",
            Op::Repeat { .. } => "repeat",
            Op::Slice { .. } => "slice",
            Op::Reduce { op, .. } => op.name(),
            Op::Dot { .. } => "dot",
            Op::When { .. } => "when",
            Op::For(ForLoop { .. }) => "for",
            Op::If(_) => "if",
            Op::Yield(_) => "yield",
            Op::Sync(s) => s.mnemonic(),
        }
    }

    /// The bodies nested in the operation, in order: a `when`'s or a `for`'s one, an `if`'s two.
    pub fn bodies(&self) -> impl Iterator<Item = &[Stmt]> {
        let (a, b): (Option<&[Stmt]>, Option<&[Stmt]>) = match self {
            Op::When { body, .. } | Op::For(ForLoop { body, .. }) => (Some(body), None),
            Op::If(IfElse { then, els, .. }) => (Some(then), Some(els)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// [`Op::bodies`], to change.
    pub fn bodies_mut(&mut self) -> impl Iterator<Item = &mut Vec<Stmt>> {
        let (a, b) = match self {
            Op::When { body, .. } | Op::For(ForLoop { body, .. }) => (Some(body), None),
            Op::If(IfElse { then, els, .. }) => (Some(then), Some(els)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// Whether the operation holds bodies of statements (`when`, `for`, `if`).
    pub fn has_body(&self) -> bool {
        matches!(self, Op::When { .. } | Op::For(_) | Op::If(_))
    }

    /// Whether the result type annotation is required in text (it says what to make).
    pub fn needs_annotation(&self) -> bool {
        matches!(
            self,
            Op::Cast(_)
                | Op::Bitcast(_)
                | Op::Iota { .. }
                | Op::Full(_)
                | Op::Zeros
                | Op::Broadcast(_)
                | Op::Reshape(_)
                | Op::Slice { .. }
        )
    }

    /// Whether the operation has exactly one result (all but `store`, `when`, `for`, `if`,
    /// `yield` and the concurrent model's statements).
    pub fn has_single_result(&self) -> bool {
        !matches!(self, Op::Store { .. } | Op::Yield(_) | Op::Sync(_)) && !self.has_body()
    }
}
