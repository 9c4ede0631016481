//! Elementwise operations: the element expression of each unary, binary, comparison, cast and
//! bitcast, 16-bit floats rounded after each, and the loop that makes an elementwise result
//! (or defers it to where its one reader reads it).

use tessel_plugin_api::ir::*;
use tessel_plugin_api::libm;

use super::{Deferred, Read, Writer};
use crate::conv::{literal, reg_ty};
use crate::lower::meetings::Site;

impl<'k> Writer<'k> {
    /// An elementwise result: scalar registers when every operand is one, else a block.
    pub(super) fn elementwise(
        &mut self,
        dst: &str,
        ops: &[&Operand],
        linear: bool,
        f: impl Fn(&mut Self, &[String]) -> String + 'static,
    ) {
        let ty = self.ty(dst);
        let res = ty.shape.clone();
        let reads: Vec<Read> = ops.iter().map(|o| self.classify(o, &res, linear)).collect();
        let dtypes: Vec<DType> = ops.iter().map(|o| self.dtype_of(&[o])).collect();
        let other = self.dtype_of(ops);
        // A literal takes the type of the other operand (a `select` condition is bool).
        let lit_ty = |i: usize, w: &Self| match ops[i] {
            Operand::Lit(_) => {
                if ops.len() == 3 && i == 0 {
                    DType::Bool
                } else if ops.len() == 3 {
                    w.dtype_of(&[ops[1], ops[2]])
                } else {
                    other
                }
            }
            Operand::Value(_) => dtypes[i],
        };
        if res.is_empty() {
            if reads.iter().any(|r| matches!(r, Read::Shared { .. })) {
                self.meet(Site::Reads);
                self.broadcast_scalar(dst, ty.dtype, |w| {
                    let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| w.read(r, lit_ty(i, w), &res)).collect();
                    f(w, &xs)
                });
            } else {
                let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| self.read(r, lit_ty(i, self), &res)).collect();
                let v = f(self, &xs);
                let id = self.ident(dst);
                self.line(format!("let {id}: {} = {v};", reg_ty(ty.dtype)));
            }
            return;
        }
        if self.plan.inlined.contains(self.plan.id(dst))
            && !self.plan.publish.contains(self.plan.id(dst))
            && !reads.iter().any(|r| matches!(r, Read::Shared { .. }))
        {
            // Computed where its one reader reads it, element by element, never stored.
            self.line("// computed where it is read");
            let tys: Vec<DType> = (0..ops.len()).map(|i| lit_ty(i, self)).collect();
            self.deferred.insert(dst.to_string(), Deferred { reads, tys, f: std::rc::Rc::new(f) });
            return;
        }
        self.meet(Site::Reads);
        let fused = self.open_fused(dst);
        let (d, c) = (ty.dtype, self.plan.row_len().unwrap_or(1));
        let value = |w: &mut Self| {
            let xs: Vec<String> = reads.iter().enumerate().map(|(i, r)| w.read(r, lit_ty(i, w), &res)).collect();
            let v = f(w, &xs);
            if fused.is_empty() {
                return v;
            }
            let x = w.t();
            w.line(format!("let {x} = {v};"));
            let row = w.row_of_slot(&res, c);
            for (rid, op, _) in &fused {
                let cell = format!("{rid}[{row}]");
                let y = w.reduce_combine(*op, d, &cell, &x);
                w.line(format!("{cell} = {y};"));
            }
            x
        };
        self.hoist = self.rows_read(&reads);
        if self.plan.fused_only.contains(self.plan.id(dst)) {
            // Only its reductions read it: made element by element into them, never kept.
            self.each(&res, |w| {
                value(w);
            });
        } else {
            let id = self.declare_block(dst);
            self.each_into(&res, &id, d, value);
        }
        // 16-bit floats accumulate in `f32` and round once; narrow integers wrap once.
        for (rid, _, rows) in fused.iter().filter(|_| (d.is_float() && d != DType::F32) || d.is_narrow_int()) {
            self.open(format!("for (var r = 0u; r < {rows}u; r++)"));
            let v = self.narrow(d, &format!("{rid}[r]"));
            self.line(format!("{rid}[r] = {v};"));
            self.close();
        }
        self.defined(dst);
    }

    /// Rounds a float register expression to a 16-bit float type, or wraps an integer one to an
    /// 8- or 16-bit integer type (sign-extended where signed); a no-op for other types.
    pub(super) fn narrow(&mut self, d: DType, x: &str) -> String {
        match d {
            DType::I8 | DType::I16 => format!("extractBits({x}, 0u, {}u)", d.bits()),
            DType::U8 => format!("({x} & 0xffu)"),
            DType::U16 => format!("({x} & 0xffffu)"),
            DType::F16 => {
                self.helper("tk_round_f16");
                format!("tk_round_f16({x})")
            }
            DType::BF16 => {
                self.helper("tk_round_bf16");
                format!("tk_round_bf16({x})")
            }
            _ => x.to_string(),
        }
    }

    pub(super) fn unary(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let v = match (op, d) {
            (UnaryOp::Neg, d) if d.is_unsigned() => format!("(0u - {x})"),
            (UnaryOp::Neg, _) => format!("(-{x})"),
            (UnaryOp::Abs, d) if d.is_unsigned() => x.to_string(),
            (UnaryOp::Abs, _) => format!("abs({x})"),
            (UnaryOp::Not, DType::Bool) => format!("(!{x})"),
            (UnaryOp::Not, _) => format!("(~{x})"),
            (UnaryOp::Exp, _) => self.call(libm::exp, &[x]),
            (UnaryOp::Exp2, _) => self.call(libm::exp2, &[x]),
            (UnaryOp::Log, _) => self.call(libm::log, &[x]),
            (UnaryOp::Log2, _) => self.call(libm::log2, &[x]),
            (UnaryOp::Sqrt, _) => format!("sqrt({x})"),
            (UnaryOp::Rsqrt, _) => format!("inverseSqrt({x})"),
            (UnaryOp::Sin, _) => self.call(libm::sin, &[x]),
            (UnaryOp::Cos, _) => self.call(libm::cos, &[x]),
            (UnaryOp::Tanh, _) => self.call(libm::tanh, &[x]),
            (UnaryOp::Logistic, _) => self.call(libm::logistic, &[x]),
            (UnaryOp::Expm1, _) => self.call(libm::expm1, &[x]),
            (UnaryOp::Log1p, _) => self.call(libm::log1p, &[x]),
            (UnaryOp::Erf, _) => self.call(libm::erf, &[x]),
            (UnaryOp::ErfInv, _) => self.call(libm::erf_inv, &[x]),
            (UnaryOp::Asin, _) => self.call(libm::asin, &[x]),
            (UnaryOp::Acos, _) => self.call(libm::acos, &[x]),
            (UnaryOp::Atan, _) => self.call(libm::atan, &[x]),
            (UnaryOp::Sinh, _) => self.call(libm::sinh, &[x]),
            (UnaryOp::Cosh, _) => self.call(libm::cosh, &[x]),
            (UnaryOp::Floor, _) => format!("floor({x})"),
            (UnaryOp::Ceil, _) => format!("ceil({x})"),
            // WGSL's `round` rounds ties to even.
            (UnaryOp::Round, _) => format!("round({x})"),
        };
        self.narrow(d, &v)
    }

    pub(super) fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let float = d.is_float();
        let sfx = if d.is_signed() { "i32" } else { "u32" };
        let v = match op {
            BinaryOp::Add => format!("({x} + {y})"),
            BinaryOp::Sub => format!("({x} - {y})"),
            BinaryOp::Mul => format!("({x} * {y})"),
            BinaryOp::Div if float => format!("({x} / {y})"),
            // WGSL's `%` is x - y trunc(x / y), not C's fmod.
            BinaryOp::Rem if float => self.call(libm::fmod, &[x, y]),
            BinaryOp::Div | BinaryOp::Rem => {
                let name = if op == BinaryOp::Div { "div" } else { "rem" };
                let h = match (name, sfx) {
                    ("div", "i32") => "tk_div_i32",
                    ("div", _) => "tk_div_u32",
                    (_, "i32") => "tk_rem_i32",
                    _ => "tk_rem_u32",
                };
                self.helper(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max | BinaryOp::Min if float => {
                let h = if op == BinaryOp::Max { "tk_max" } else { "tk_min" };
                self.helper(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max => format!("max({x}, {y})"),
            BinaryOp::Min => format!("min({x}, {y})"),
            BinaryOp::And => format!("({x} & {y})"),
            BinaryOp::Or => format!("({x} | {y})"),
            BinaryOp::Xor if d == DType::Bool => format!("({x} != {y})"),
            BinaryOp::Xor => format!("({x} ^ {y})"),
            BinaryOp::Shl => format!("({x} << (u32({y}) & 31u))"),
            BinaryOp::Shr => format!("({x} >> (u32({y}) & 31u))"),
            BinaryOp::Pow => self.call(libm::pow, &[x, y]),
            BinaryOp::Atan2 => self.call(libm::atan2, &[x, y]),
        };
        self.narrow(d, &v)
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, x: &str) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            (a, b) if a.is_float() && b.is_float() => self.narrow(b, x),
            (a, DType::Bool) if a.is_float() => format!("((bitcast<u32>({x}) & 0x7fffffffu) != 0u)"),
            (a, DType::I32) if a.is_float() => {
                self.helper("tk_f2i");
                format!("tk_f2i({x})")
            }
            (a, DType::U32) if a.is_float() => {
                self.helper("tk_f2u");
                format!("tk_f2u({x})")
            }
            // Floats made from integers pass through `tk_f32_bits` too: an integer the driver
            // can compute (`xor %n, %n`) would otherwise be a float constant it folds with.
            (DType::Bool, b) if b.is_float() => {
                self.helper("tk_f32_bits");
                format!("tk_f32_bits(select(0u, 1065353216u, {x}))")
            }
            (_, b) if b.is_float() => {
                self.helper("tk_f32_bits");
                let v = format!("tk_f32_bits(bitcast<u32>(f32({x})))");
                self.narrow(b, &v)
            }
            // Saturated in 32 bits, then at the narrow type's limits.
            (a, b) if a.is_float() => {
                let (lo, hi) = b.int_range().expect("verifier: a cast to a number");
                let wide = self.cast(a, b.widened(), x);
                format!("clamp({wide}, {}, {})", literal(Literal::Int(lo), b), literal(Literal::Int(hi), b))
            }
            (DType::Bool, b) => format!("select({}, {}, {x})", literal(Literal::Int(0), b), literal(Literal::Int(1), b)),
            (a, DType::Bool) => format!("({x} != {})", literal(Literal::Int(0), a)),
            // Integer to integer: the bits, wrapped to the new width.
            (a, b) if reg_ty(a) == reg_ty(b) => self.narrow(b, x),
            (_, b) => self.narrow(b, &format!("bitcast<{}>({x})", reg_ty(b))),
        }
    }

    pub(super) fn bitcast(&mut self, from: DType, to: DType, x: &str) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            (DType::F16, DType::BF16) => {
                self.helper("tk_f16_bits");
                format!("bitcast<f32>(tk_f16_bits({x}) << 16u)")
            }
            (DType::BF16, DType::F16) => format!("unpack2x16float(bitcast<u32>({x}) >> 16u).x"),
            // 16-bit floats and integers: the float's 16 bits, as the integer type holds them.
            (DType::F16, b) => {
                self.helper("tk_f16_bits");
                self.narrow(b, &format!("{}(tk_f16_bits({x}))", reg_ty(b)))
            }
            (DType::BF16, b) => self.narrow(b, &format!("{}(bitcast<u32>({x}) >> 16u)", reg_ty(b))),
            (a, DType::F16) if a.is_int() => format!("unpack2x16float(bitcast<u32>({x}) & 0xffffu).x"),
            (a, DType::BF16) if a.is_int() => format!("bitcast<f32>(bitcast<u32>({x}) << 16u)"),
            // Opaque, as a cast to a float is (`cast`).
            (DType::I32 | DType::U32, DType::F32) => format!("tk_f32_bits(bitcast<u32>({x}))"),
            (_, b) => self.narrow(b, &format!("bitcast<{}>({x})", reg_ty(b))),
        }
    }
}

pub(super) fn compare(op: CmpOp, d: DType, x: &str, y: &str) -> String {
    // Float `ne` is unordered (true for NaN), as in IEEE and Rust; WGSL's `!=` is ordered.
    match op {
        CmpOp::Eq => format!("({x} == {y})"),
        CmpOp::Ne if d.is_float() => format!("(!({x} == {y}))"),
        CmpOp::Ne => format!("({x} != {y})"),
        CmpOp::Lt => format!("({x} < {y})"),
        CmpOp::Le => format!("({x} <= {y})"),
        CmpOp::Gt => format!("({x} > {y})"),
        CmpOp::Ge => format!("({x} >= {y})"),
    }
}
