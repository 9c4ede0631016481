//! The accurate maths of `tessel_plugin_api::libm` as WGSL functions.

use std::fmt::Write as _;

use tessel_plugin_api::libm::{Func, Op, Stmt, Ty, Var};

use crate::conv::float_lit;

/// The WGSL function of `f` (`fn tk_exp(v0: f32) -> f32 { ... }`).
pub fn function(f: &Func) -> String {
    let mut out = String::new();
    let params: Vec<String> = f.params.iter().map(|p| format!("v{}: f32", p.0)).collect();
    let _ = writeln!(out, "fn {}({}) -> f32 {{", f.name, params.join(", "));
    for (i, t) in f.types.iter().enumerate().skip(f.params.len()) {
        let _ = writeln!(out, "    var v{i}: {};", ty(*t));
    }
    body(f, &f.body, 1, &mut out);
    let _ = writeln!(out, "    return v{};\n}}", f.result.0);
    out
}

fn ty(t: Ty) -> &'static str {
    match t {
        Ty::F32 => "f32",
        Ty::I32 => "i32",
        Ty::U32 => "u32",
        Ty::Bool => "bool",
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
                let _ = writeln!(out, "{pad}loop {{");
                let _ = writeln!(out, "{pad}    if (!v{}) {{ break; }}", c.0);
                body(f, inner, level + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
        }
    }
}

fn expr(f: &Func, dst: Var, op: Op) -> String {
    let v = |a: Var| format!("v{}", a.0);
    let t = f.types[dst.0];
    match op {
        Op::Const(bits) => match t {
            Ty::F32 => float_lit(f32::from_bits(bits)),
            Ty::I32 => format!("i32({})", bits as i32),
            _ => format!("{bits}u"),
        },
        Op::Copy(a) => v(a),
        Op::Add(a, b) => format!("{} + {}", v(a), v(b)),
        Op::Sub(a, b) => format!("{} - {}", v(a), v(b)),
        Op::Mul(a, b) => format!("{} * {}", v(a), v(b)),
        Op::Div(a, b) => format!("{} / {}", v(a), v(b)),
        Op::Fma(a, b, c) => format!("fma({}, {}, {})", v(a), v(b), v(c)),
        Op::Neg(a) => format!("-{}", v(a)),
        Op::Abs(a) => format!("abs({})", v(a)),
        // WGSL's `round` rounds half to even.
        Op::Rint(a) => format!("round({})", v(a)),
        Op::Trunc(a) => format!("trunc({})", v(a)),
        Op::Lt(a, b) => format!("{} < {}", v(a), v(b)),
        Op::Eq(a, b) => format!("{} == {}", v(a), v(b)),
        Op::Bits(a) => format!("bitcast<{}>({})", ty(t), v(a)),
        Op::Convert(a) => format!("{}({})", ty(t), v(a)),
        // `tk_mulhi`: a helper of the writer's (`emit/helpers/tk_mulhi.wgsl`).
        Op::MulHi(a, b) => format!("tk_mulhi({}, {})", v(a), v(b)),
        Op::Shl(a, b) => format!("{} << {}", v(a), v(b)),
        Op::Shr(a, b) => format!("{} >> {}", v(a), v(b)),
        Op::And(a, b) => format!("{} & {}", v(a), v(b)),
        Op::Or(a, b) => format!("{} | {}", v(a), v(b)),
        Op::Xor(a, b) => format!("{} ^ {}", v(a), v(b)),
        Op::Rem(a, b) => format!("{} % {}", v(a), v(b)),
        Op::Clz(a) => format!("countLeadingZeros({})", v(a)),
        Op::Not(a) => format!("!{}", v(a)),
        Op::Select(c, a, b) => format!("select({}, {}, {c})", v(b), v(a), c = v(c)),
    }
}
