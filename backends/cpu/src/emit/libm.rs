//! The accurate maths of `tessel_plugin_api::libm` as C functions: the same programs the GPU
//! backends write (WGSL functions, inline PTX), so the CPU backend computes their bits and holds
//! their accuracy (docs/language.md §8). Each is `static inline`, so the C compiler inlines it
//! into the loop that calls it and vectorizes it there where its control flow allows.

use std::fmt::Write as _;

use tessel_plugin_api::libm::{Func, Op, Stmt, Ty, Var};

use super::c::float_lit;

/// The C function of `f` (`static inline float tk_exp(float v0) { ... }`).
pub fn function(f: &Func) -> String {
    let mut out = String::new();
    let params: Vec<String> = f.params.iter().map(|p| format!("float v{}", p.0)).collect();
    let _ = writeln!(out, "static inline float {}({}) {{", f.name, params.join(", "));
    for (i, t) in f.types.iter().enumerate().skip(f.params.len()) {
        let _ = writeln!(out, "    {} v{i} = 0;", ty(*t));
    }
    body(f, &f.body, 1, &mut out);
    let _ = writeln!(out, "    return v{};\n}}", f.result.0);
    out
}

fn ty(t: Ty) -> &'static str {
    match t {
        Ty::F32 => "float",
        Ty::I32 => "int32_t",
        Ty::U32 => "uint32_t",
        Ty::Bool => "int32_t",
    }
}

fn body(f: &Func, stmts: &[Stmt], level: usize, out: &mut String) {
    let pad = "    ".repeat(level);
    for s in stmts {
        match s {
            Stmt::Set(v, op) => {
                let _ = writeln!(out, "{pad}v{} = {};", v.0, expr(f, *v, *op));
            }
            Stmt::If(c, inner) => {
                let _ = writeln!(out, "{pad}if (v{}) {{", c.0);
                body(f, inner, level + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::While(c, inner) => {
                let _ = writeln!(out, "{pad}while (v{}) {{", c.0);
                body(f, inner, level + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
        }
    }
}

fn expr(f: &Func, dst: Var, op: Op) -> String {
    let v = |a: Var| format!("v{}", a.0);
    let t = f.types[dst.0];
    let src = |a: Var| f.types[a.0];
    match op {
        Op::Const(bits) => match t {
            Ty::F32 => float_lit(f32::from_bits(bits)),
            Ty::I32 => format!("(int32_t){bits}u"),
            _ => format!("{bits}u"),
        },
        Op::Copy(a) => v(a),
        // Integers wrap: through unsigned arithmetic, where C's signed overflow is undefined.
        Op::Add(a, b) if t == Ty::I32 => format!("(int32_t)((uint32_t){} + (uint32_t){})", v(a), v(b)),
        Op::Sub(a, b) if t == Ty::I32 => format!("(int32_t)((uint32_t){} - (uint32_t){})", v(a), v(b)),
        Op::Mul(a, b) if t == Ty::I32 => format!("(int32_t)((uint32_t){} * (uint32_t){})", v(a), v(b)),
        Op::Add(a, b) => format!("{} + {}", v(a), v(b)),
        Op::Sub(a, b) => format!("{} - {}", v(a), v(b)),
        Op::Mul(a, b) => format!("{} * {}", v(a), v(b)),
        Op::Div(a, b) => format!("{} / {}", v(a), v(b)),
        // Fused where the machine fuses (the functions need it neither way).
        Op::Fma(a, b, c) => format!("TK_FMA({}, {}, {})", v(a), v(b), v(c)),
        Op::Neg(a) => format!("-{}", v(a)),
        Op::Abs(a) => format!("fabsf({})", v(a)),
        // Ties to even in the default rounding mode.
        Op::Rint(a) => format!("rintf({})", v(a)),
        Op::Trunc(a) => format!("truncf({})", v(a)),
        Op::Lt(a, b) => format!("{} < {}", v(a), v(b)),
        Op::Eq(a, b) => format!("{} == {}", v(a), v(b)),
        Op::Bits(a) => match (src(a), t) {
            (Ty::F32, Ty::I32) => format!("(int32_t)tk_fbits({})", v(a)),
            (Ty::F32, _) => format!("tk_fbits({})", v(a)),
            (_, Ty::F32) => format!("tk_bitsf((uint32_t){})", v(a)),
            (_, t) => format!("({}){}", ty(t), v(a)),
        },
        Op::Convert(a) => format!("({}){}", ty(t), v(a)),
        Op::MulHi(a, b) => format!("tk_mulhi({}, {})", v(a), v(b)),
        Op::Shl(a, b) if t == Ty::I32 => format!("(int32_t)((uint32_t){} << {})", v(a), v(b)),
        Op::Shl(a, b) => format!("{} << {}", v(a), v(b)),
        Op::Shr(a, b) => format!("{} >> {}", v(a), v(b)),
        Op::And(a, b) if t == Ty::Bool => format!("{} && {}", v(a), v(b)),
        Op::Or(a, b) if t == Ty::Bool => format!("{} || {}", v(a), v(b)),
        Op::And(a, b) => format!("{} & {}", v(a), v(b)),
        Op::Or(a, b) => format!("{} | {}", v(a), v(b)),
        Op::Xor(a, b) => format!("{} ^ {}", v(a), v(b)),
        Op::Rem(a, b) => format!("{} % {}", v(a), v(b)),
        Op::Clz(a) => format!("tk_clz({})", v(a)),
        Op::Not(a) => format!("!{}", v(a)),
        Op::Select(c, a, b) => format!("{} ? {} : {}", v(c), v(a), v(b)),
    }
}
