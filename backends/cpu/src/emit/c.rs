//! C spellings of the language's element types, literals and elementwise operations, on the
//! 32-bit compute types every value is held in (`prelude.h`): the same rules as the interpreter's
//! `eval/` and wgpu's `emit/ops.rs`, written as C expressions.

use tessel_plugin_api::ir::{BinaryOp, CmpOp, DType, Literal, UnaryOp};
use tessel_plugin_api::libm;

/// The C type a value of `d` is computed in.
pub fn compute(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        d if d.is_unsigned() => "uint32_t",
        _ => "int32_t",
    }
}

/// The C type an array of `d` holds.
pub fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 | DType::U16 => "uint16_t",
        DType::I32 => "int32_t",
        DType::U32 => "uint32_t",
        DType::Bool | DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
    }
}

/// An array element (`storage`) as its compute value.
pub fn from_storage(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("tk_h2f({x})"),
        DType::BF16 => format!("tk_b2f({x})"),
        DType::Bool => format!("(int32_t)({x} != 0)"),
        DType::F32 => x.to_string(),
        _ => format!("({}){x}", compute(d)),
    }
}

/// A compute value as the array element it is stored as.
pub fn to_storage(d: DType, x: &str) -> String {
    match d {
        DType::F16 => format!("tk_f2h({x})"),
        DType::BF16 => format!("tk_f2b({x})"),
        DType::Bool => format!("(uint8_t)({x} != 0)"),
        DType::F32 => x.to_string(),
        _ => format!("({}){x}", storage(d)),
    }
}

/// A float as a C expression of exactly its bits.
pub fn float_lit(v: f32) -> String {
    if v.is_finite() { format!("{v:?}f") } else { format!("tk_bitsf({}u)", v.to_bits()) }
}

/// `lit` as a value of `d`, rounded to it as the interpreter rounds literals.
pub fn literal(lit: Literal, d: DType) -> String {
    match d {
        DType::F32 => float_lit(lit.as_f64() as f32),
        DType::F16 => float_lit(half::f16::from_f64(lit.as_f64()).to_f32()),
        DType::BF16 => float_lit(half::bf16::from_f64(lit.as_f64()).to_f32()),
        DType::Bool => format!("{}", i32::from(lit.as_i64() != 0)),
        d if d.is_unsigned() => format!("{}u", narrow_int(d, lit.as_i64()) as u32),
        d => format!("(int32_t){}", narrow_int(d, lit.as_i64())),
    }
}

fn narrow_int(d: DType, v: i64) -> i64 {
    match d {
        DType::I8 => i64::from(v as i8),
        DType::I16 => i64::from(v as i16),
        DType::U8 => i64::from(v as u8),
        DType::U16 => i64::from(v as u16),
        DType::U32 => i64::from(v as u32),
        _ => i64::from(v as i32),
    }
}

/// Rounds a float to a 16-bit float type, or wraps an integer to an 8- or 16-bit one.
pub fn narrow(d: DType, x: &str) -> String {
    match d {
        DType::I8 => format!("(int32_t)(int8_t)({x})"),
        DType::I16 => format!("(int32_t)(int16_t)({x})"),
        DType::U8 => format!("(({x}) & 0xffu)"),
        DType::U16 => format!("(({x}) & 0xffffu)"),
        DType::F16 => format!("tk_rf16({x})"),
        DType::BF16 => format!("tk_rbf16({x})"),
        _ => x.to_string(),
    }
}

/// The libm functions a kernel calls, collected so each is written once.
pub type Calls = std::collections::BTreeMap<&'static str, &'static libm::Func>;

fn call(calls: &mut Calls, f: fn() -> &'static libm::Func, args: &[&str]) -> String {
    let func = f();
    calls.insert(func.name, func);
    format!("{}({})", func.name, args.join(", "))
}

/// Signed integer arithmetic that wraps (through `uint32_t`).
fn wrap(op: &str, x: &str, y: &str) -> String {
    format!("(int32_t)((uint32_t)({x}) {op} (uint32_t)({y}))")
}

pub fn unary(calls: &mut Calls, op: UnaryOp, d: DType, x: &str) -> String {
    let v = match (op, d) {
        (UnaryOp::Neg, d) if d.is_unsigned() => format!("(0u - {x})"),
        (UnaryOp::Neg, d) if d.is_int() => wrap("-", "0", x),
        (UnaryOp::Neg, _) => format!("(-{x})"),
        (UnaryOp::Abs, d) if d.is_unsigned() => x.to_string(),
        (UnaryOp::Abs, d) if d.is_int() => format!("(({x}) < 0 ? {} : ({x}))", wrap("-", "0", x)),
        (UnaryOp::Abs, _) => format!("fabsf({x})"),
        (UnaryOp::Not, DType::Bool) => format!("(int32_t)!({x})"),
        (UnaryOp::Not, _) => format!("(~{x})"),
        (UnaryOp::Exp, _) => format!("tk_exp_cpu({x})"),
        (UnaryOp::Exp2, _) => call(calls, libm::exp2, &[x]),
        (UnaryOp::Log, _) => call(calls, libm::log, &[x]),
        (UnaryOp::Log2, _) => call(calls, libm::log2, &[x]),
        (UnaryOp::Sqrt, _) => format!("sqrtf({x})"),
        (UnaryOp::Rsqrt, _) => format!("(1.0f / sqrtf({x}))"),
        (UnaryOp::Sin, _) => call(calls, libm::sin, &[x]),
        (UnaryOp::Cos, _) => call(calls, libm::cos, &[x]),
        (UnaryOp::Tanh, _) => format!("tk_tanh_cpu({x})"),
        (UnaryOp::Logistic, _) => call(calls, libm::logistic, &[x]),
        (UnaryOp::Expm1, _) => call(calls, libm::expm1, &[x]),
        (UnaryOp::Log1p, _) => call(calls, libm::log1p, &[x]),
        (UnaryOp::Erf, _) => call(calls, libm::erf, &[x]),
        (UnaryOp::ErfInv, _) => call(calls, libm::erf_inv, &[x]),
        (UnaryOp::Asin, _) => call(calls, libm::asin, &[x]),
        (UnaryOp::Acos, _) => call(calls, libm::acos, &[x]),
        (UnaryOp::Atan, _) => call(calls, libm::atan, &[x]),
        (UnaryOp::Sinh, _) => call(calls, libm::sinh, &[x]),
        (UnaryOp::Cosh, _) => call(calls, libm::cosh, &[x]),
        (UnaryOp::Floor, _) => format!("floorf({x})"),
        (UnaryOp::Ceil, _) => format!("ceilf({x})"),
        (UnaryOp::Round, _) => format!("rintf({x})"),
    };
    narrow(d, &v)
}

pub fn binary(calls: &mut Calls, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
    let float = d.is_float();
    let signed = d.is_signed() || d == DType::Bool;
    let v = match op {
        BinaryOp::Add if signed && !float => wrap("+", x, y),
        BinaryOp::Sub if signed && !float => wrap("-", x, y),
        BinaryOp::Mul if signed && !float => wrap("*", x, y),
        BinaryOp::Add => format!("({x} + {y})"),
        BinaryOp::Sub => format!("({x} - {y})"),
        BinaryOp::Mul => format!("({x} * {y})"),
        BinaryOp::Div if float => format!("({x} / {y})"),
        BinaryOp::Rem if float => format!("fmodf({x}, {y})"),
        BinaryOp::Div if signed => format!("tk_div_i32({x}, {y})"),
        BinaryOp::Rem if signed => format!("tk_rem_i32({x}, {y})"),
        BinaryOp::Div => format!("tk_div_u32({x}, {y})"),
        BinaryOp::Rem => format!("tk_rem_u32({x}, {y})"),
        BinaryOp::Max if float => format!("tk_max({x}, {y})"),
        BinaryOp::Min if float => format!("tk_min({x}, {y})"),
        BinaryOp::Max => format!("(({x}) > ({y}) ? ({x}) : ({y}))"),
        BinaryOp::Min => format!("(({x}) < ({y}) ? ({x}) : ({y}))"),
        BinaryOp::And => format!("({x} & {y})"),
        BinaryOp::Or => format!("({x} | {y})"),
        BinaryOp::Xor => format!("({x} ^ {y})"),
        BinaryOp::Shl if signed => format!("(int32_t)((uint32_t)({x}) << ((uint32_t)({y}) & 31u))"),
        BinaryOp::Shl => format!("({x} << ((uint32_t)({y}) & 31u))"),
        BinaryOp::Shr => format!("({x} >> ((uint32_t)({y}) & 31u))"),
        BinaryOp::Pow => call(calls, libm::pow, &[x, y]),
        BinaryOp::Atan2 => call(calls, libm::atan2, &[x, y]),
    };
    narrow(d, &v)
}

/// A comparison: 1 or 0. Float `ne` is unordered (true for NaN), the others ordered.
pub fn compare(op: CmpOp, x: &str, y: &str) -> String {
    let c = match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    format!("(int32_t)({x} {c} {y})")
}

pub fn cast(from: DType, to: DType, x: &str) -> String {
    match (from, to) {
        (a, b) if a == b => x.to_string(),
        (a, b) if a.is_float() && b.is_float() => narrow(b, x),
        (a, DType::Bool) if a.is_float() => format!("(int32_t)((tk_fbits({x}) & 0x7fffffffu) != 0u)"),
        (a, DType::I32) if a.is_float() => format!("tk_f2i({x})"),
        (a, DType::U32) if a.is_float() => format!("tk_f2u({x})"),
        (DType::Bool, b) if b.is_float() => format!("(({x}) ? 1.0f : 0.0f)"),
        (_, b) if b.is_float() => narrow(b, &format!("(float)({x})")),
        // Saturated in 32 bits, then at the narrow type's limits.
        (a, b) if a.is_float() => {
            let (lo, hi) = b.int_range().expect("verifier: a cast to a number");
            let wide = cast(a, b.widened(), x);
            let (lo, hi) = (literal(Literal::Int(lo), b), literal(Literal::Int(hi), b));
            format!("({wide} < {lo} ? {lo} : ({wide} > {hi} ? {hi} : {wide}))")
        }
        (DType::Bool, b) => format!("(({x}) ? {} : {})", literal(Literal::Int(1), b), literal(Literal::Int(0), b)),
        (a, DType::Bool) => format!("(int32_t)(({x}) != {})", literal(Literal::Int(0), a)),
        // Integer to integer: the bits, wrapped to the new width.
        (_, b) => narrow(b, &format!("({})({x})", compute(b))),
    }
}

pub fn bitcast(from: DType, to: DType, x: &str) -> String {
    match (from, to) {
        (a, b) if a == b => x.to_string(),
        (DType::F16, DType::BF16) => format!("tk_b2f(tk_f2h({x}))"),
        (DType::BF16, DType::F16) => format!("tk_h2f(tk_f2b({x}))"),
        (DType::F16, b) => narrow(b, &format!("({})tk_f2h({x})", compute(b))),
        (DType::BF16, b) => narrow(b, &format!("({})tk_f2b({x})", compute(b))),
        (_, DType::F16) => format!("tk_h2f((uint16_t)({x}))"),
        (_, DType::BF16) => format!("tk_b2f((uint16_t)({x}))"),
        (DType::F32, b) => format!("({})tk_fbits({x})", compute(b)),
        (_, DType::F32) => format!("tk_bitsf((uint32_t)({x}))"),
        (_, b) => narrow(b, &format!("({})({x})", compute(b))),
    }
}
