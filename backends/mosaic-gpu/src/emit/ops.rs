//! Element operations: `unary`, `binary`, `compare`, `cast` and `bitcast` on one element in
//! registers, 16-bit floats computed in `f32` and rounded once; the accurate maths functions of
//! `tessel_plugin_api::libm` written inline.

use std::fmt::Write as _;

use tessel_plugin_api::ir::{BinaryOp, CmpOp, DType, UnaryOp};
use tessel_plugin_api::libm;

use super::conv::{f32_imm, half_bits, half_ty, int_ty};
use super::writer::Writer;

/// One instruction of an accurate maths function, written to `out` (without its tab and `;`).
fn libm_ins(out: &mut String, f: &libm::Func, dst: libm::Var, op: libm::Op, regs: &[String]) {
    use libm::{Op, Ty};
    let t = f.types[dst.0];
    let d = &regs[dst.0];
    let r = |v: libm::Var| regs[v.0].as_str();
    let ty = |v: libm::Var| f.types[v.0];
    // Integer instruction suffixes by the operand's type.
    let int = |v: libm::Var| if ty(v) == Ty::I32 { "s32" } else { "u32" };
    let _ = match op {
        Op::Const(bits) if t == Ty::F32 => write!(out, "mov.b32 {d}, {}", f32_imm(f32::from_bits(bits))),
        Op::Const(bits) => write!(out, "mov.b32 {d}, {bits}"),
        Op::Copy(a) if t == Ty::Bool => write!(out, "mov.pred {d}, {}", r(a)),
        Op::Copy(a) | Op::Bits(a) => write!(out, "mov.b32 {d}, {}", r(a)),
        Op::Add(a, b) if t == Ty::F32 => write!(out, "add.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Sub(a, b) if t == Ty::F32 => write!(out, "sub.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Mul(a, b) if t == Ty::F32 => write!(out, "mul.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Add(a, b) => write!(out, "add.u32 {d}, {}, {}", r(a), r(b)),
        Op::Sub(a, b) => write!(out, "sub.u32 {d}, {}, {}", r(a), r(b)),
        Op::Mul(a, b) => write!(out, "mul.lo.u32 {d}, {}, {}", r(a), r(b)),
        Op::Div(a, b) => write!(out, "div.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Fma(a, b, c) => write!(out, "fma.rn.f32 {d}, {}, {}, {}", r(a), r(b), r(c)),
        Op::Neg(a) => write!(out, "neg.f32 {d}, {}", r(a)),
        Op::Abs(a) => write!(out, "abs.f32 {d}, {}", r(a)),
        Op::Rint(a) => write!(out, "cvt.rni.f32.f32 {d}, {}", r(a)),
        Op::Trunc(a) => write!(out, "cvt.rzi.f32.f32 {d}, {}", r(a)),
        Op::Lt(a, b) if ty(a) == Ty::F32 => write!(out, "setp.lt.f32 {d}, {}, {}", r(a), r(b)),
        Op::Eq(a, b) if ty(a) == Ty::F32 => write!(out, "setp.eq.f32 {d}, {}, {}", r(a), r(b)),
        Op::Lt(a, b) => write!(out, "setp.lt.{} {d}, {}, {}", int(a), r(a), r(b)),
        Op::Eq(a, b) => write!(out, "setp.eq.u32 {d}, {}, {}", r(a), r(b)),
        Op::Convert(a) if t == Ty::F32 => write!(out, "cvt.rn.f32.{} {d}, {}", int(a), r(a)),
        Op::Convert(a) => write!(out, "cvt.rzi.{}.f32 {d}, {}", int(dst), r(a)),
        Op::MulHi(a, b) => write!(out, "mul.hi.u32 {d}, {}, {}", r(a), r(b)),
        Op::Shl(a, b) => write!(out, "shl.b32 {d}, {}, {}", r(a), r(b)),
        Op::Shr(a, b) => write!(out, "shr.{} {d}, {}, {}", int(a), r(a), r(b)),
        Op::And(a, b) if t == Ty::Bool => write!(out, "and.pred {d}, {}, {}", r(a), r(b)),
        Op::Or(a, b) if t == Ty::Bool => write!(out, "or.pred {d}, {}, {}", r(a), r(b)),
        Op::Xor(a, b) if t == Ty::Bool => write!(out, "xor.pred {d}, {}, {}", r(a), r(b)),
        Op::And(a, b) => write!(out, "and.b32 {d}, {}, {}", r(a), r(b)),
        Op::Or(a, b) => write!(out, "or.b32 {d}, {}, {}", r(a), r(b)),
        Op::Xor(a, b) => write!(out, "xor.b32 {d}, {}, {}", r(a), r(b)),
        Op::Rem(a, b) => write!(out, "rem.u32 {d}, {}, {}", r(a), r(b)),
        Op::Clz(a) => write!(out, "clz.b32 {d}, {}", r(a)),
        Op::Not(a) => write!(out, "not.pred {d}, {}", r(a)),
        Op::Select(c, a, b) => write!(out, "selp.b32 {d}, {}, {}, {}", r(a), r(b), r(c)),
    };
}

impl Writer<'_> {
    /// Rounds an `f32` held in `v` to the 16-bit float `d`, or wraps an integer to the 8- or
    /// 16-bit integer `d` (sign-extended where signed), in place; a no-op for other dtypes.
    pub(super) fn narrow(&mut self, d: DType, v: &str) {
        match d {
            DType::F16 | DType::BF16 => {
                let (h, t) = (self.h(), half_ty(d));
                self.insf(format_args!("cvt.rn.{t}.f32 {h}, {v}"));
                self.insf(format_args!("cvt.f32.{t} {v}, {h}"));
            }
            DType::I8 | DType::I16 => self.insf(format_args!("cvt.s32.s{} {v}, {v}", d.bits())),
            DType::U8 => self.insf(format_args!("and.b32 {v}, {v}, 255")),
            DType::U16 => self.insf(format_args!("and.b32 {v}, {v}, 65535")),
            _ => {}
        }
    }

    /// `v = f(args)`, the accurate maths function `f` (`tessel_plugin_api::libm`) written
    /// inline: a register per variable, branches for its `if` and `while`.
    fn maths(&mut self, v: &str, f: fn() -> &'static libm::Func, args: &[&str]) {
        let func = f();
        let mut regs: Vec<String> = Vec::with_capacity(func.types.len());
        for (i, &t) in func.types.iter().enumerate() {
            regs.push(match func.params.iter().position(|p| p.0 == i) {
                Some(a) => args[a].to_string(),
                None if t == libm::Ty::Bool => self.p(),
                None => self.r(),
            });
        }
        self.comment(func.name);
        self.libm_body(func, &func.body, &regs);
        self.insf(format_args!("mov.b32 {v}, {}", regs[func.result.0]));
    }

    fn libm_body(&mut self, f: &libm::Func, body: &[libm::Stmt], regs: &[String]) {
        for s in body {
            match s {
                libm::Stmt::Set(v, op) => {
                    self.out.push('\t');
                    libm_ins(&mut self.out, f, *v, *op, regs);
                    self.out.push_str(";\n");
                }
                libm::Stmt::If(c, inner) => {
                    let end = self.label("fi");
                    self.insf(format_args!("@!{} bra {end}", regs[c.0]));
                    self.libm_body(f, inner, regs);
                    self.place_label(&end);
                }
                libm::Stmt::While(c, inner) => {
                    let (top, end) = (self.label("while"), self.label("wend"));
                    self.place_label(&top);
                    self.insf(format_args!("@!{} bra {end}", regs[c.0]));
                    self.libm_body(f, inner, regs);
                    self.insf(format_args!("bra {top}"));
                    self.place_label(&end);
                }
            }
        }
    }

    pub(super) fn unary(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let v = self.unary32(op, d, x);
        self.narrow(d, &v);
        v
    }

    fn unary32(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let d = if d.is_float() { DType::F32 } else { d.widened() };
        let v = self.r();
        match (op, d) {
            (UnaryOp::Neg, DType::F32) => self.insf(format_args!("neg.f32 {v}, {x}")),
            (UnaryOp::Neg, _) => self.insf(format_args!("neg.s32 {v}, {x}")),
            (UnaryOp::Abs, DType::F32) => self.insf(format_args!("abs.f32 {v}, {x}")),
            (UnaryOp::Abs, DType::I32) => self.insf(format_args!("abs.s32 {v}, {x}")),
            (UnaryOp::Abs, _) => self.insf(format_args!("mov.b32 {v}, {x}")),
            (UnaryOp::Not, DType::Bool) => self.insf(format_args!("xor.b32 {v}, {x}, 1")),
            (UnaryOp::Not, _) => self.insf(format_args!("not.b32 {v}, {x}")),
            (UnaryOp::Exp, _) => self.maths(&v, libm::exp, &[x]),
            (UnaryOp::Exp2, _) => self.maths(&v, libm::exp2, &[x]),
            (UnaryOp::Log, _) => self.maths(&v, libm::log, &[x]),
            (UnaryOp::Log2, _) => self.maths(&v, libm::log2, &[x]),
            (UnaryOp::Sqrt, _) => self.insf(format_args!("sqrt.rn.f32 {v}, {x}")),
            (UnaryOp::Rsqrt, _) => {
                self.insf(format_args!("sqrt.rn.f32 {v}, {x}"));
                self.insf(format_args!("rcp.rn.f32 {v}, {v}"));
            }
            (UnaryOp::Sin, _) => self.maths(&v, libm::sin, &[x]),
            (UnaryOp::Cos, _) => self.maths(&v, libm::cos, &[x]),
            (UnaryOp::Tanh, _) => self.maths(&v, libm::tanh, &[x]),
            (UnaryOp::Logistic, _) => self.maths(&v, libm::logistic, &[x]),
            (UnaryOp::Expm1, _) => self.maths(&v, libm::expm1, &[x]),
            (UnaryOp::Log1p, _) => self.maths(&v, libm::log1p, &[x]),
            (UnaryOp::Erf, _) => self.maths(&v, libm::erf, &[x]),
            (UnaryOp::ErfInv, _) => self.maths(&v, libm::erf_inv, &[x]),
            (UnaryOp::Asin, _) => self.maths(&v, libm::asin, &[x]),
            (UnaryOp::Acos, _) => self.maths(&v, libm::acos, &[x]),
            (UnaryOp::Atan, _) => self.maths(&v, libm::atan, &[x]),
            (UnaryOp::Sinh, _) => self.maths(&v, libm::sinh, &[x]),
            (UnaryOp::Cosh, _) => self.maths(&v, libm::cosh, &[x]),
            (UnaryOp::Floor, _) => self.insf(format_args!("cvt.rmi.f32.f32 {v}, {x}")),
            (UnaryOp::Ceil, _) => self.insf(format_args!("cvt.rpi.f32.f32 {v}, {x}")),
            (UnaryOp::Round, _) => self.insf(format_args!("cvt.rni.f32.f32 {v}, {x}")),
        }
        v
    }

    pub(super) fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let v = self.binary32(op, d, x, y);
        self.narrow(d, &v);
        v
    }

    pub(super) fn binary32(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let v = self.r();
        let it = int_ty(d);
        let float = d.is_float();
        match op {
            BinaryOp::Add if float => self.insf(format_args!("add.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Sub if float => self.insf(format_args!("sub.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Mul if float => self.insf(format_args!("mul.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Div if float => self.insf(format_args!("div.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Rem if float => self.maths(&v, libm::fmod, &[x, y]),
            BinaryOp::Max if float => self.insf(format_args!("max.NaN.f32 {v}, {x}, {y}")),
            BinaryOp::Min if float => self.insf(format_args!("min.NaN.f32 {v}, {x}, {y}")),
            BinaryOp::Add => self.insf(format_args!("add.u32 {v}, {x}, {y}")),
            BinaryOp::Sub => self.insf(format_args!("sub.u32 {v}, {x}, {y}")),
            BinaryOp::Mul => self.insf(format_args!("mul.lo.u32 {v}, {x}, {y}")),
            BinaryOp::Div | BinaryOp::Rem => {
                // Zero divisors give 0; for i32, x / -1 is -x (wrapping) and x rem -1 is 0.
                let name = if op == BinaryOp::Div { "div" } else { "rem" };
                let (zero, z) = (self.p(), self.imm(0));
                self.insf(format_args!("{name}.{it} {v}, {x}, {y}"));
                if d == DType::I32 {
                    let minus = self.p();
                    self.insf(format_args!("setp.eq.s32 {minus}, {y}, -1"));
                    let alt = self.r();
                    if op == BinaryOp::Div {
                        self.insf(format_args!("neg.s32 {alt}, {x}"))
                    } else {
                        self.insf(format_args!("mov.b32 {alt}, 0"))
                    }
                    self.insf(format_args!("selp.b32 {v}, {alt}, {v}, {minus}"));
                }
                self.insf(format_args!("setp.eq.u32 {zero}, {y}, 0"));
                self.insf(format_args!("selp.b32 {v}, {z}, {v}, {zero}"));
            }
            BinaryOp::Max => self.insf(format_args!("max.{it} {v}, {x}, {y}")),
            BinaryOp::Min => self.insf(format_args!("min.{it} {v}, {x}, {y}")),
            BinaryOp::And => self.insf(format_args!("and.b32 {v}, {x}, {y}")),
            BinaryOp::Or => self.insf(format_args!("or.b32 {v}, {x}, {y}")),
            BinaryOp::Xor => self.insf(format_args!("xor.b32 {v}, {x}, {y}")),
            BinaryOp::Shl | BinaryOp::Shr => {
                let s = self.r();
                self.insf(format_args!("and.b32 {s}, {y}, 31"));
                if op == BinaryOp::Shl {
                    self.insf(format_args!("shl.b32 {v}, {x}, {s}"))
                } else {
                    self.insf(format_args!("shr.{it} {v}, {x}, {s}"))
                }
            }
            BinaryOp::Pow => self.maths(&v, libm::pow, &[x, y]),
            BinaryOp::Atan2 => self.maths(&v, libm::atan2, &[x, y]),
        }
        v
    }

    pub(super) fn compare(&mut self, op: CmpOp, d: DType, x: &str, y: &str) -> String {
        let (p, v) = (self.p(), self.r());
        let ty = match d {
            d if d.is_float() => "f32",
            d if d.is_signed() => "s32",
            _ => "u32",
        };
        // Float `ne` is unordered (true for NaN), the others ordered, as in IEEE and Rust.
        let cmp = match (op, d.is_float()) {
            (CmpOp::Ne, true) => "neu",
            (CmpOp::Eq, _) => "eq",
            (CmpOp::Ne, _) => "ne",
            (CmpOp::Lt, _) => "lt",
            (CmpOp::Le, _) => "le",
            (CmpOp::Gt, _) => "gt",
            (CmpOp::Ge, _) => "ge",
        };
        self.insf(format_args!("setp.{cmp}.{ty} {p}, {x}, {y}"));
        self.insf(format_args!("selp.u32 {v}, 1, 0, {p}"));
        v
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, x: &str) -> String {
        let wide = |d: DType| if d.is_float() { DType::F32 } else { d.widened() };
        let v = self.cast32(wide(from), wide(to), x);
        if from.is_float() && to.is_narrow_int() {
            // Saturated in 32 bits by `cvt`, then at the narrow type's limits.
            let (lo, hi) = to.int_range().expect("an integer type");
            let it = int_ty(to);
            self.insf(format_args!("max.{it} {v}, {v}, {lo}"));
            self.insf(format_args!("min.{it} {v}, {v}, {hi}"));
        } else {
            self.narrow(to, &v);
        }
        v
    }

    /// `bitcast` between element types of 8 or 16 bits: through their bits (16-bit floats are
    /// held as the `f32` of their value, integers as 32 bits wrapped to their type).
    pub(super) fn bitcast_narrow(&mut self, from: DType, to: DType, x: &str) -> String {
        let v = self.r();
        match (half_bits(from), half_bits(to)) {
            (true, true) => {
                let h = self.h();
                self.insf(format_args!("cvt.rn.{}.f32 {h}, {x}", half_ty(from)));
                self.insf(format_args!("cvt.f32.{} {v}, {h}", half_ty(to)));
            }
            (true, false) => {
                let h = self.h();
                self.insf(format_args!("cvt.rn.{}.f32 {h}, {x}", half_ty(from)));
                self.insf(format_args!("cvt.u32.u16 {v}, {h}"));
            }
            (false, true) => {
                let h = self.h();
                self.insf(format_args!("cvt.u16.u32 {h}, {x}"));
                self.insf(format_args!("cvt.f32.{} {v}, {h}", half_ty(to)));
            }
            (false, false) => self.insf(format_args!("mov.b32 {v}, {x}")),
        }
        if !to.is_float() {
            self.narrow(to, &v);
        }
        v
    }

    fn cast32(&mut self, from: DType, to: DType, x: &str) -> String {
        let v = self.r();
        match (from, to) {
            (a, b) if a == b => self.insf(format_args!("mov.b32 {v}, {x}")),
            (DType::F32, DType::I32) => self.insf(format_args!("cvt.rzi.s32.f32 {v}, {x}")),
            (DType::F32, DType::U32) => self.insf(format_args!("cvt.rzi.u32.f32 {v}, {x}")),
            (DType::F32, DType::Bool) => {
                let p = self.p();
                self.insf(format_args!("setp.neu.f32 {p}, {x}, {}", f32_imm(0.0)));
                self.insf(format_args!("selp.u32 {v}, 1, 0, {p}"));
            }
            (DType::I32, DType::F32) => self.insf(format_args!("cvt.rn.f32.s32 {v}, {x}")),
            (DType::U32 | DType::Bool, DType::F32) => self.insf(format_args!("cvt.rn.f32.u32 {v}, {x}")),
            (_, DType::Bool) => {
                let p = self.p();
                self.insf(format_args!("setp.ne.u32 {p}, {x}, 0"));
                self.insf(format_args!("selp.u32 {v}, 1, 0, {p}"));
            }
            _ => self.insf(format_args!("mov.b32 {v}, {x}")),
        }
        v
    }
}
