//! A Rust builder for the IR, for users who write no text. It makes exactly what the parser makes;
//! pass the result to [`verify`](super::verify) like any parsed kernel.
//!
//! ```
//! use tessel_plugin_api::ir::{builder::KernelBuilder, print_kernel, verify, Affine, DType, Type};
//!
//! let at_i = [Affine::axis("i")];
//! let kernel = KernelBuilder::new("add")
//!     .axis("i", 8)
//!     .input_block("x", Type::array(DType::F32, [1024]), &[128], &at_i)
//!     .input_block("y", Type::array(DType::F32, [1024]), &[128], &at_i)
//!     .output_block("o", Type::array(DType::F32, [1024]), &[128], &at_i)
//!     .body(|b| {
//!         let x = b.load("x");
//!         let y = b.load("y");
//!         let s = b.add(&x, &y);
//!         b.store("o", &s);
//!     });
//! let verified = verify(&kernel).expect("a well-typed kernel");
//! assert!(print_kernel(verified.kernel()).contains("%v2 = add %v0, %v1 : f32[128]"));
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use super::generic::Generic;
use super::size::SizeExpr;
use super::*;

/// A value made by a [`BodyBuilder`]; use `&value` wherever an operand is expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value(String);

impl Value {
    /// The value's name, without `%`.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl From<&Value> for Operand {
    fn from(v: &Value) -> Operand {
        Operand::Value(v.0.clone())
    }
}

impl From<Literal> for Operand {
    fn from(l: Literal) -> Operand {
        Operand::Lit(l)
    }
}

impl From<f64> for Operand {
    fn from(v: f64) -> Operand {
        Operand::Lit(Literal::Float(v))
    }
}

impl From<i64> for Operand {
    fn from(v: i64) -> Operand {
        Operand::Lit(Literal::Int(v))
    }
}

impl From<bool> for Operand {
    fn from(v: bool) -> Operand {
        Operand::Lit(Literal::Bool(v))
    }
}

/// Builds a kernel header, then its body with [`KernelBuilder::body`].
#[derive(Debug)]
pub struct KernelBuilder {
    kernel: Kernel,
}

impl KernelBuilder {
    /// A kernel called `name` with no grid (one program) and no arguments yet.
    pub fn new(name: &str) -> KernelBuilder {
        KernelBuilder {
            kernel: Kernel {
                name: name.to_string(),
                grid: None,
                params: Vec::new(),
                barriers: Vec::new(),
                body: Vec::new(),
                span: Span::NONE,
            },
        }
    }

    fn push_axis(mut self, name: &str, size: AxisSize, seq: bool) -> KernelBuilder {
        let axis = GridAxis { name: name.to_string(), size, seq, thread: false, from: None, span: Span::NONE };
        self.kernel.grid.get_or_insert_with(Vec::new).push(axis);
        self
    }

    /// A parallel grid axis.
    pub fn axis(self, name: &str, size: u64) -> KernelBuilder {
        self.push_axis(name, AxisSize::Fixed(size), false)
    }

    /// A sequential (`seq`) grid axis.
    pub fn seq_axis(self, name: &str, size: u64) -> KernelBuilder {
        self.push_axis(name, AxisSize::Fixed(size), true)
    }

    /// A parallel grid axis whose size is given at launch (`dyn`).
    pub fn dyn_axis(self, name: &str) -> KernelBuilder {
        self.push_axis(name, AxisSize::Dyn, false)
    }

    fn param(mut self, kind: ParamKind, name: &str, ty: Type, block: Option<BlockSpec>) -> KernelBuilder {
        self.kernel.params.push(Param { kind, name: name.to_string(), ty, block, span: Span::NONE });
        self
    }

    /// An input seen whole (or a scalar input, with a scalar type).
    pub fn input(self, name: &str, ty: Type) -> KernelBuilder {
        self.param(ParamKind::In, name, ty, None)
    }

    /// An input seen through `block [shape] at (index)`.
    pub fn input_block(self, name: &str, ty: Type, shape: &[usize], index: &[Affine]) -> KernelBuilder {
        self.param(ParamKind::In, name, ty, Some(BlockSpec { shape: shape.to_vec(), index: index.iter().cloned().map(BlockIndex::Affine).collect() }))
    }

    /// An output seen whole.
    pub fn output(self, name: &str, ty: Type) -> KernelBuilder {
        self.param(ParamKind::Out, name, ty, None)
    }

    /// An output seen through `block [shape] at (index)`.
    pub fn output_block(self, name: &str, ty: Type, shape: &[usize], index: &[Affine]) -> KernelBuilder {
        self.param(ParamKind::Out, name, ty, Some(BlockSpec { shape: shape.to_vec(), index: index.iter().cloned().map(BlockIndex::Affine).collect() }))
    }

    /// Per-program scratch memory.
    pub fn scratch(self, name: &str, ty: Type) -> KernelBuilder {
        self.param(ParamKind::Scratch, name, ty, None)
    }

    /// Builds the body and returns the finished (unverified) kernel.
    pub fn body(mut self, f: impl FnOnce(&mut BodyBuilder)) -> Kernel {
        let mut b = BodyBuilder { stmts: Vec::new(), counter: Rc::new(Cell::new(0)), next_name: None };
        f(&mut b);
        self.kernel.body = b.stmts;
        self.kernel
    }
}

/// Appends statements to one body. Values are named `%v0`, `%v1`, ... unless
/// [`BodyBuilder::name_next`] gives the next one a name.
#[derive(Debug)]
pub struct BodyBuilder {
    stmts: Vec<Stmt>,
    counter: Rc<Cell<usize>>,
    next_name: Option<String>,
}

macro_rules! shorthand {
    ($($(#[$m:meta])* $fn:ident => $variant:ident($kind:ident :: $op:ident)),* $(,)?) => {
        $($(#[$m])* pub fn $fn(&mut self, a: impl Into<Operand>, b: impl Into<Operand>) -> Value {
            self.push(Op::$variant($kind::$op, a.into(), b.into()), None)
        })*
    };
}

impl BodyBuilder {
    fn fresh(&mut self) -> String {
        self.next_name.take().unwrap_or_else(|| {
            let n = self.counter.get();
            self.counter.set(n + 1);
            format!("v{n}")
        })
    }

    fn child(&self) -> BodyBuilder {
        BodyBuilder { stmts: Vec::new(), counter: Rc::clone(&self.counter), next_name: None }
    }

    fn push(&mut self, op: Op, ty: Option<Type>) -> Value {
        let name = self.fresh();
        self.stmts.push(Stmt { results: vec![name.clone()], op, ty, span: Span::NONE });
        Value(name)
    }

    fn push_void(&mut self, op: Op) {
        self.stmts.push(Stmt { results: Vec::new(), op, ty: None, span: Span::NONE });
    }

    /// Names the next value `%name` instead of `%vN`.
    pub fn name_next(&mut self, name: &str) -> &mut BodyBuilder {
        self.next_name = Some(name.to_string());
        self
    }

    /// `load src` (the whole block).
    pub fn load(&mut self, src: &str) -> Value {
        self.push(Op::Load { src: src.to_string(), index: None, mask: None, other: None }, None)
    }

    /// `load src[index] mask %m other lit`.
    pub fn load_with(&mut self, src: &str, index: Option<Vec<Index>>, mask: Option<&Value>, other: Option<Literal>) -> Value {
        let mask = mask.map(|m| m.0.clone());
        self.push(Op::Load { src: src.to_string(), index, mask, other }, None)
    }

    /// `store dst, v` (the whole block).
    pub fn store(&mut self, dst: &str, v: impl Into<Operand>) {
        self.push_void(Op::Store { dst: dst.to_string(), index: None, value: v.into(), mask: None });
    }

    /// `store dst[index], v mask %m`.
    pub fn store_with(&mut self, dst: &str, index: Option<Vec<Index>>, v: impl Into<Operand>, mask: Option<&Value>) {
        let mask = mask.map(|m| m.0.clone());
        self.push_void(Op::Store { dst: dst.to_string(), index, value: v.into(), mask });
    }

    /// `program_id axis`.
    pub fn program_id(&mut self, axis: &str) -> Value {
        self.push(Op::ProgramId(AxisRef::Name(axis.to_string())), None)
    }

    /// `num_programs axis`.
    pub fn num_programs(&mut self, axis: &str) -> Value {
        self.push(Op::NumPrograms(AxisRef::Name(axis.to_string())), None)
    }

    /// `iota dim : ty`.
    pub fn iota(&mut self, dim: usize, ty: Type) -> Value {
        self.push(Op::Iota { dim }, Some(ty))
    }

    /// `full lit : ty`.
    pub fn full(&mut self, lit: Literal, ty: Type) -> Value {
        self.push(Op::Full(lit), Some(ty))
    }

    /// `zeros : ty`.
    pub fn zeros(&mut self, ty: Type) -> Value {
        self.push(Op::Zeros, Some(ty))
    }

    /// Any elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, a: impl Into<Operand>) -> Value {
        self.push(Op::Unary(op, a.into()), None)
    }

    /// Any elementwise binary op.
    pub fn binary(&mut self, op: BinaryOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Value {
        self.push(Op::Binary(op, a.into(), b.into()), None)
    }

    /// Any comparison.
    pub fn compare(&mut self, op: CmpOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Value {
        self.push(Op::Compare(op, a.into(), b.into()), None)
    }

    shorthand!(
        /// `add a, b`.
        add => Binary(BinaryOp::Add),
        /// `sub a, b`.
        sub => Binary(BinaryOp::Sub),
        /// `mul a, b`.
        mul => Binary(BinaryOp::Mul),
        /// `div a, b`.
        div => Binary(BinaryOp::Div),
        /// `max a, b`.
        max => Binary(BinaryOp::Max),
        /// `min a, b`.
        min => Binary(BinaryOp::Min),
        /// `lt a, b`.
        lt => Compare(CmpOp::Lt),
        /// `eq a, b`.
        eq => Compare(CmpOp::Eq),
    );

    /// `exp a`.
    pub fn exp(&mut self, a: impl Into<Operand>) -> Value {
        self.unary(UnaryOp::Exp, a)
    }

    /// `select c, a, b`.
    pub fn select(&mut self, c: impl Into<Operand>, a: impl Into<Operand>, b: impl Into<Operand>) -> Value {
        self.push(Op::Select(c.into(), a.into(), b.into()), None)
    }

    /// `cast a : dtype` (same shape).
    pub fn cast(&mut self, a: &Value, dtype: DType) -> Value {
        self.push(Op::Cast(a.into()), Some(Type::scalar(dtype)))
    }

    /// `bitcast a : dtype` (same shape).
    pub fn bitcast(&mut self, a: &Value, dtype: DType) -> Value {
        self.push(Op::Bitcast(a.into()), Some(Type::scalar(dtype)))
    }

    /// `broadcast a : ty`.
    pub fn broadcast(&mut self, a: &Value, ty: Type) -> Value {
        self.push(Op::Broadcast(a.into()), Some(ty))
    }

    /// `reshape a : ty`.
    pub fn reshape(&mut self, a: &Value, ty: Type) -> Value {
        self.push(Op::Reshape(a.into()), Some(ty))
    }

    /// `transpose a perm (...)`.
    pub fn transpose(&mut self, a: &Value, perm: &[usize]) -> Value {
        self.push(Op::Transpose { arg: a.into(), perm: perm.to_vec() }, None)
    }

    /// `OP a axis N (keepdims)`.
    pub fn reduce(&mut self, op: ReduceOp, a: &Value, axis: usize, keepdims: bool) -> Value {
        self.push(Op::Reduce { op, arg: a.into(), axis, keepdims }, None)
    }

    /// `dot a, b (trans_a) (trans_b)`.
    pub fn dot(&mut self, a: &Value, b: &Value, trans_a: bool, trans_b: bool) -> Value {
        self.push(Op::Dot { a: a.into(), b: b.into(), trans_a, trans_b }, None)
    }

    /// `when c { ... }`.
    pub fn when(&mut self, c: &Value, f: impl FnOnce(&mut BodyBuilder)) {
        let mut inner = self.child();
        f(&mut inner);
        self.push_void(Op::When { cond: c.into(), body: inner.stmts });
    }

    /// `%r... = for %i = lo to hi step s iter (%a = init, ...) { ... yield ... }`. The closure gets
    /// the induction variable and the carried values and returns what to yield (one per init).
    pub fn for_loop(
        &mut self,
        lo: impl Into<Operand>,
        hi: impl Into<Operand>,
        step: Option<Operand>,
        inits: &[Operand],
        f: impl FnOnce(&mut BodyBuilder, &Value, &[Value]) -> Vec<Operand>,
    ) -> Vec<Value> {
        let var = Value(self.fresh());
        let carried: Vec<Value> = inits.iter().map(|_| Value(self.fresh())).collect();
        let mut inner = self.child();
        let yields = f(&mut inner, &var, &carried);
        if !inits.is_empty() || !yields.is_empty() {
            inner.push_void(Op::Yield(yields));
        }
        let results: Vec<Value> = inits.iter().map(|_| Value(self.fresh())).collect();
        let iters = carried.iter().zip(inits).map(|(c, i)| (c.0.clone(), i.clone())).collect();
        let op = Op::For(ForLoop { var: var.0, lo: lo.into(), hi: hi.into(), step, iters, cond: None, body: inner.stmts });
        self.stmts.push(Stmt { results: results.iter().map(|r| r.0.clone()).collect(), op, ty: None, span: Span::NONE });
        results
    }
}

/// A dimension of an input of a [`GenericBuilder`]: a parameter that stands alone as it (bound
/// from the input's shape at launch), or a fixed size.
#[derive(Clone, Copy, Debug)]
pub enum Dim<'a> {
    /// A parameter.
    Param(&'a str),
    /// A size.
    Fixed(usize),
}

/// A generic kernel built in Rust (docs/language.md §9): its parameters, declared as a `.tk`
/// header declares them, the inputs whose dimensions they are, and a function that builds the
/// kernel for the values a launch binds. The [`Generic`] it makes binds, tunes and specializes as
/// one parsed from text does.
///
/// ```
/// use tessel_plugin_api::ir::builder::{Dim, GenericBuilder, KernelBuilder};
/// use tessel_plugin_api::ir::{Affine, DType, Type};
/// use std::collections::BTreeMap;
///
/// let scale = GenericBuilder::new("scale")
///     .param("N")
///     .param_default("B", 128, &[64, 128, 256])
///     .input("x", DType::F32, &[Dim::Param("N")])
///     .build(|v| {
///         let (n, b) = (v["N"] as usize, v["B"] as usize);
///         let at_i = [Affine::axis("i")];
///         KernelBuilder::new("scale")
///             .axis("i", n.div_ceil(b) as u64)
///             .input_block("x", Type::array(DType::F32, [n]), &[b], &at_i)
///             .output_block("o", Type::array(DType::F32, [n]), &[b], &at_i)
///             .body(|k| {
///                 let x = k.load("x");
///                 let y = k.mul(&x, 2.0);
///                 k.store("o", &y);
///             })
///     });
/// let shapes = BTreeMap::from([("x".to_string(), vec![1000])]);
/// let binding = scale.bind(&BTreeMap::new(), &BTreeMap::new(), &shapes).expect("binds");
/// assert_eq!(binding.values["N"], 1000);
/// let kernel = scale.specialize(&binding.values).expect("verifies");
/// assert_eq!(kernel.grid()[0].size, tessel_plugin_api::ir::AxisSize::Fixed(8));
/// ```
#[derive(Debug)]
pub struct GenericBuilder {
    name: String,
    params: Vec<SizeParam>,
    args: Vec<ArgDecl>,
}

impl GenericBuilder {
    /// A generic kernel called `name`, with no parameters yet.
    pub fn new(name: &str) -> GenericBuilder {
        GenericBuilder { name: name.to_string(), params: Vec::new(), args: Vec::new() }
    }

    /// A parameter without a default: a launch binds it (from an input's shape, or given).
    pub fn param(mut self, name: &str) -> GenericBuilder {
        self.params.push(SizeParam { name: name.to_string(), default: None, candidates: Vec::new(), span: Span::NONE });
        self
    }

    /// A parameter with a default and the candidates `tessel tune` tries (empty: not tuned).
    pub fn param_default(mut self, name: &str, default: i64, candidates: &[i64]) -> GenericBuilder {
        let candidates = candidates.to_vec();
        self.params.push(SizeParam { name: name.to_string(), default: Some(default), candidates, span: Span::NONE });
        self
    }

    /// An input whose dimensions are `dims`: a parameter that stands alone as one of them is
    /// bound from the input's shape.
    pub fn input(mut self, name: &str, dtype: DType, dims: &[Dim<'_>]) -> GenericBuilder {
        let dims = dims
            .iter()
            .map(|d| match d {
                Dim::Param(p) => SizeExpr::Name((*p).to_string()),
                Dim::Fixed(n) => SizeExpr::Int(*n as i64),
            })
            .collect();
        self.args.push(ArgDecl { name: name.to_string(), kind: ParamKind::In, dtype, dims });
        self
    }

    /// The generic kernel, whose kernel for bound values `build` makes (and the verifier checks).
    pub fn build(self, build: impl Fn(&BTreeMap<String, i64>) -> Kernel + Send + Sync + 'static) -> Generic {
        Generic::built(&self.name, self.params, self.args, Arc::new(build))
    }
}
