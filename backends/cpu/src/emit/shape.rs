//! Statements that are not elementwise, each a loop of its own over arena memory: reductions
//! (eight partial results per row along the last axis, so the C compiler vectorizes them), `dot`
//! (the `gemm` crate's kernels for floats, called back through the context; a plain loop for
//! integers) and the shape changes (`transpose`, `slice`, `concatenate`, `tile`, `repeat`;
//! `reshape` aliases its operand).

use tessel_plugin_api::ir::{DType, Literal, Op, Operand, ReduceOp, Stmt, ValueId};

use super::{Place, Writer, c};

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

impl<'v> Writer<'v, '_> {
    pub(super) fn shape_op(&mut self, s: &'v Stmt) {
        if let Op::Store { .. } = s.op {
            return self.scalar_store(s);
        }
        let id = self.id(&s.results[0]);
        let ty = self.ty(id);
        let ct = c::compute(ty.dtype);
        if let Op::Reshape(a) = &s.op {
            return self.reshape(id, a);
        }
        // A scalar result is computed into a one-element array, then read into its local.
        let scalar = ty.is_scalar();
        let dst = if scalar {
            let t = format!("v{}_s", id.index());
            self.line(format!("{ct} {t}[1];"));
            t
        } else {
            self.buffer(id);
            format!("v{}", id.index())
        };
        match &s.op {
            Op::Reduce { op, arg, axis, .. } => self.reduce(&dst, *op, arg, *axis, ty.dtype),
            Op::Dot { a, b, trans_a, trans_b } => {
                let n = ty.shape[1].to_string();
                self.dot(&Product { c: &dst, ldc: &n, accumulate: false }, id, a, b, *trans_a, *trans_b)
            }
            Op::Transpose { arg, perm } => {
                let src = self.ty(self.id(name(arg))).shape.clone();
                let ss = strides(&src);
                let terms: Vec<String> = perm.iter().enumerate().map(|(k, &p)| format!("i{k} * {}", ss[p])).collect();
                self.copy(&dst, &ty.shape, arg, &terms);
            }
            Op::Slice { arg, start, stride } => {
                let ss = strides(&self.ty(self.id(name(arg))).shape);
                let terms: Vec<String> =
                    (0..start.len()).map(|k| format!("({} + i{k} * {}) * {}", start[k], stride[k], ss[k])).collect();
                self.copy(&dst, &ty.shape, arg, &terms);
            }
            Op::Tile { arg, .. } => {
                let src = self.ty(self.id(name(arg))).shape.clone();
                let ss = strides(&src);
                let terms: Vec<String> = (0..src.len()).map(|k| format!("(i{k} % {}) * {}", src[k], ss[k])).collect();
                self.copy(&dst, &ty.shape, arg, &terms);
            }
            Op::Repeat { arg, times, axis } => {
                let ss = strides(&self.ty(self.id(name(arg))).shape);
                let terms: Vec<String> = (0..ss.len())
                    .map(|k| if k == *axis { format!("(i{k} / {times}) * {}", ss[k]) } else { format!("i{k} * {}", ss[k]) })
                    .collect();
                self.copy(&dst, &ty.shape, arg, &terms);
            }
            Op::Concatenate { args, axis } => {
                let ds = strides(&ty.shape);
                let mut at = 0;
                for a in args {
                    let shape = self.ty(self.id(name(a))).shape.clone();
                    let r = shape.len();
                    self.open(&shape);
                    let to: Vec<String> = (0..r)
                        .map(|k| if k == *axis { format!("(i{k} + {at}) * {}", ds[k]) } else { format!("i{k} * {}", ds[k]) })
                        .collect();
                    let flat = flat(&shape);
                    self.line(format!("{dst}[{}] = {}[{flat}];", to.join(" + "), self.pointer(a)));
                    self.close(r);
                    at += shape[*axis];
                }
            }
            other => unreachable!("plan: `{}` is refused or elementwise", other.mnemonic()),
        }
        if scalar {
            self.line(format!("const {ct} v{} = {dst}[0];", id.index()));
            self.places.insert(id, Place::Local);
        }
    }

    fn open(&mut self, shape: &[usize]) {
        for (k, d) in shape.iter().enumerate() {
            self.line(format!("for (int64_t i{k} = 0; i{k} < {d}; i{k}++) {{"));
            self.depth += 1;
        }
    }

    fn close(&mut self, rank: usize) {
        for _ in 0..rank {
            self.depth -= 1;
            self.line("}");
        }
    }

    /// `dst[i] = src[sum of terms]` over the result's shape.
    fn copy(&mut self, dst: &str, shape: &[usize], src: &Operand, terms: &[String]) {
        self.open(shape);
        let from = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
        self.line(format!("{dst}[{}] = {}[{from}];", flat(shape), self.pointer(src)));
        self.close(shape.len());
    }

    fn reshape(&mut self, id: ValueId, a: &Operand) {
        let ty = self.ty(id);
        let ct = c::compute(ty.dtype);
        let src = self.id(name(a));
        match (ty.is_scalar(), self.is_scalar(src)) {
            (true, true) => {
                self.line(format!("const {ct} v{} = v{};", id.index(), src.index()));
                self.places.insert(id, Place::Local);
            }
            (true, false) => {
                self.line(format!("const {ct} v{} = v{}[0];", id.index(), src.index()));
                self.places.insert(id, Place::Local);
            }
            (false, true) => {
                self.buffer(id);
                self.line(format!("v{}[0] = v{};", id.index(), src.index()));
            }
            (false, false) => {
                self.line(format!("{ct} *const v{} = v{};", id.index(), src.index()));
                self.places.insert(id, Place::Buffer);
                let root = self.root_of(src);
                self.root.insert(id, root);
            }
        }
    }

    /// `sum|prod|max|min` along `axis`: floats accumulate in `f32` and are rounded to the
    /// result's type once; integers wrap.
    fn reduce(&mut self, dst: &str, op: ReduceOp, arg: &Operand, axis: usize, d: DType) {
        let shape = self.ty(self.id(name(arg))).shape.clone();
        let outer: usize = shape[..axis].iter().product();
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let x = self.pointer(arg);
        let ct = c::compute(d);
        let float = d.is_float();
        let init = match op {
            ReduceOp::Sum => c::literal(Literal::Int(0), if float { DType::F32 } else { d }),
            ReduceOp::Prod => c::literal(Literal::Int(1), if float { DType::F32 } else { d }),
            ReduceOp::Max if float => "tk_bitsf(0xff800000u)".into(),
            ReduceOp::Min if float => "tk_bitsf(0x7f800000u)".into(),
            ReduceOp::Max => c::literal(Literal::Int(d.int_range().expect("numeric").0), d),
            ReduceOp::Min => c::literal(Literal::Int(d.int_range().expect("numeric").1), d),
        };
        let combine = |a: &str, b: &str| -> String {
            match (op, float) {
                (ReduceOp::Sum, true) => format!("{a} + {b}"),
                (ReduceOp::Prod, true) => format!("{a} * {b}"),
                (ReduceOp::Max, true) => format!("tk_max({a}, {b})"),
                (ReduceOp::Min, true) => format!("tk_min({a}, {b})"),
                (ReduceOp::Sum, false) => format!("({ct})(({a}) + ({b}))"),
                (ReduceOp::Prod, false) => format!("({ct})((uint32_t)({a}) * (uint32_t)({b}))"),
                (ReduceOp::Max, false) => format!("(({a}) > ({b}) ? ({a}) : ({b}))"),
                (ReduceOp::Min, false) => format!("(({a}) < ({b}) ? ({a}) : ({b}))"),
            }
        };
        let acc_t = if float { "float" } else { ct };
        // Integer sums wrap in `uint32_t` (C's signed overflow is undefined).
        let acc_t = if !float && op == ReduceOp::Sum { "uint32_t" } else { acc_t };
        let done = |v: &str| c::narrow(d, &format!("({ct})({v})"));
        self.line(format!("for (int64_t o = 0; o < {outer}; o++) {{"));
        self.depth += 1;
        if inner == 1 {
            // Eight partial results, one lane each, combined pairwise at the end.
            // The lanes as one vector while whole groups of eight remain.
            let (vt, vop) = match (op, acc_t) {
                (ReduceOp::Sum, "float") => ("tk_v8f", "{a} + {b}"),
                (ReduceOp::Prod, "float") => ("tk_v8f", "{a} * {b}"),
                (ReduceOp::Max, "float") => ("tk_v8f", "tk_v8max({a}, {b})"),
                (ReduceOp::Min, "float") => ("tk_v8f", "tk_v8min({a}, {b})"),
                (ReduceOp::Sum | ReduceOp::Prod, _) => ("tk_v8u", if op == ReduceOp::Sum { "{a} + {b}" } else { "{a} * {b}" }),
                (ReduceOp::Max, "int32_t") => ("tk_v8i", "tk_v8imax({a}, {b})"),
                (ReduceOp::Min, "int32_t") => ("tk_v8i", "tk_v8imin({a}, {b})"),
                (ReduceOp::Max, _) => ("tk_v8u", "tk_v8umax({a}, {b})"),
                (ReduceOp::Min, _) => ("tk_v8u", "tk_v8umin({a}, {b})"),
            };
            self.line(format!("{acc_t} l[8] = {{{}}};", vec![init.as_str(); 8].join(", ")));
            self.line(format!("const {ct} *const row = {x} + o * {n};"));
            self.line("int64_t k = 0;");
            self.line(format!("{vt} lv; memcpy(&lv, l, 32);"));
            let step = vop.replace("{a}", "lv").replace("{b}", "xv");
            self.line(format!("for (; k + 8 <= {n}; k += 8) {{ {vt} xv; memcpy(&xv, row + k, 32); lv = {step}; }}"));
            self.line("memcpy(l, &lv, 32);");
            self.line(format!("for (; k < {n}; k++) l[0] = {};", combine("l[0]", "row[k]")));
            for (a, b) in [(0, 4), (1, 5), (2, 6), (3, 7), (0, 2), (1, 3), (0, 1)] {
                self.line(format!("l[{a}] = {};", combine(&format!("l[{a}]"), &format!("l[{b}]"))));
            }
            self.line(format!("{dst}[o] = {};", done("l[0]")));
        } else {
            // In the arena: `inner` may be millions (a column sum), past a worker's stack.
            let acc = self.fresh("acc");
            self.alloc(&acc, acc_t, inner);
            self.line(format!("{acc_t} *const acc = {acc};"));
            self.line(format!("for (int64_t j = 0; j < {inner}; j++) acc[j] = {init};"));
            self.line(format!(
                "for (int64_t k = 0; k < {n}; k++) for (int64_t j = 0; j < {inner}; j++) acc[j] = {};",
                combine("acc[j]", &format!("{x}[(o * {n} + k) * {inner} + j]"))
            ));
            self.line(format!("for (int64_t j = 0; j < {inner}; j++) {dst}[o * {inner} + j] = {};", done("acc[j]")));
        }
        self.depth -= 1;
        self.line("}");
    }

    /// `dot a, b` into `to.c`: from floats by `gemm.h`'s `tk_sgemm` through `tk_ctx.gemm` (the
    /// product library, compiled once: `emit::gemm_source`; a transposed `b` copied to
    /// rows first; its rows split over the pool where the kernel has fewer programs than
    /// workers), or through `sgemm` (the `gemm` crate) where the product is large; integers in a
    /// loop, wrapping.
    pub(super) fn dot(&mut self, to: &Product<'_>, id: ValueId, a: &Operand, b: &Operand, ta: bool, tb: bool) {
        let (sa, sb) = (self.ty(self.id(name(a))).shape.clone(), self.ty(self.id(name(b))).shape.clone());
        let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
        let n = if tb { sb[0] } else { sb[1] };
        // (row, column) strides of each operand as stored (a strided view's rows at its input's).
        let ld = |w: &Self, op: &Operand, own: usize| w.row_stride.get(&w.id(name(op))).cloned().unwrap_or(own.to_string());
        let (lda, ldb) = (ld(self, a, sa[1]), ld(self, b, sb[1]));
        let (ars, acs) = if ta { ("1".to_string(), lda) } else { (lda, "1".to_string()) };
        let (brs, bcs) = if tb { ("1".to_string(), ldb.clone()) } else { (ldb.clone(), "1".to_string()) };
        let (pa, pb) = (self.pointer(a), self.pointer(b));
        let (dst, ldc, acc) = (to.c, to.ldc, i32::from(to.accumulate));
        let d = self.ty(id).dtype;
        if d.is_float() {
            let call = format!(
                "cx->sgemm({m}, {n}, {k}, {dst}, {ldc}, 1, {pa}, {ars}, {acs}, {pb}, {brs}, {bcs}, cx->parallel_dot, {acc});"
            );
            if m * n * k > INLINE_GEMM_WORK {
                self.line(call);
                return;
            }
            self.gemm = true;
            let (rows, ld_rows) = if tb {
                let t = self.fresh("bt");
                self.alloc(&t, "float", k * n);
                self.line(format!(
                    "for (int64_t q = 0; q < {k}; q++) for (int64_t j = 0; j < {n}; j++) {t}[q * {n} + j] = {pb}[j * {ldb} + q];"
                ));
                (t, n.to_string())
            } else {
                (pb, ldb)
            };
            self.line(format!("cx->gemm(cx, {m}, {n}, {k}, {dst}, {ldc}, {pa}, {ars}, {acs}, {rows}, {ld_rows}, {acc});"));
            return;
        }
        assert!(!to.accumulate, "accumulate.rs: float products only");
        let ct = c::compute(d);
        self.line(format!("for (int64_t i = 0; i < {m}; i++) for (int64_t j = 0; j < {n}; j++) {{"));
        self.line(format!("    uint32_t s = 0;"));
        self.line(format!(
            "    for (int64_t q = 0; q < {k}; q++) s += (uint32_t){pa}[i * {ars} + q * {acs}] * (uint32_t){pb}[q * {brs} + j * {bcs}];"
        ));
        self.line(format!("    {dst}[i * {ldc} + j] = {};", c::narrow(d, &format!("({ct})s"))));
        self.line("}");
    }
}

/// Where a product's `c` is: its pointer, the distance between its rows, and whether the product
/// is added to what is there (`accumulate.rs`) rather than written.
pub(super) struct Product<'a> {
    pub(super) c: &'a str,
    pub(super) ldc: &'a str,
    pub(super) accumulate: bool,
}

/// The most multiply-adds of a product made by the product library (`gemm.h`): past 128^3 the
/// `gemm` crate's packed operands win (a 2048^3 matmul in 256^3 tiles: 264-293 GFLOP/s through
/// it, 230-260 by `gemm.h`, on two cores here; at 128^3 both about 248, at 64^3 `gemm.h` 252
/// against 155).
const INLINE_GEMM_WORK: usize = 1 << 21;

/// The row-major flat index of `i0, i1, ...` in `shape`.
fn flat(shape: &[usize]) -> String {
    let s = strides(shape);
    let terms: Vec<String> =
        (0..shape.len()).map(|k| if s[k] == 1 { format!("i{k}") } else { format!("i{k} * {}", s[k]) }).collect();
    if terms.is_empty() { "0".into() } else { terms.join(" + ") }
}

fn name(op: &Operand) -> &str {
    match op {
        Operand::Value(n) => n,
        Operand::Lit(_) => unreachable!("verifier: blocks are values"),
    }
}
