//! Every elementwise operation at its edges, on every executor: ±0, ±inf, NaN, the largest and
//! smallest normals and subnormals, arguments near `exp`'s overflow and underflow, large
//! trigonometric arguments, integer MIN, MAX, -1 and 0, shift counts of 32 and more. Each
//! operation runs for every dtype it takes, with its operands loaded from memory, written as
//! literals (on either side), and made by `full`, on the interpreter, on wgpu, as Mosaic GPU
//! PTX on the emulator, and on a Hopper GPU where there is one (`scripts/gpu-check` runs this
//! test's binary there). Every result is checked against a reference computed here in `f64` with
//! the language's rounding and edge rules written out (never the interpreter), within the
//! accuracy `docs/language.md` §8 gives the operation on that backend.

mod common;

use common::*;
use half::{bf16, f16};
use tessel::{HostArray, LaunchArgs};
use tessel_plugin_api::ir::DType;

const FLOAT_UNARY: &[&str] =
    &["neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "logistic", "expm1", "log1p", "erf", "erf_inv", "asin", "acos", "atan", "sinh", "cosh", "floor", "ceil", "round"];
const INT_UNARY: &[&str] = &["neg", "abs", "not"];
const FLOAT_BINARY: &[&str] = &["add", "sub", "mul", "div", "rem", "pow", "atan2", "max", "min"];
const INT_BINARY: &[&str] = &["add", "sub", "mul", "div", "rem", "max", "min", "and", "or", "xor", "shl", "shr"];
const COMPARE: &[&str] = &["eq", "ne", "lt", "le", "gt", "ge"];

/// The values where implementations go wrong, as `f64` (rounded to each float dtype).
fn float_values(d: DType) -> Vec<f64> {
    let common = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        -3.0,
        5.5,
        7.0,
        -0.75,
        0.999,
        f64::from(std::f32::consts::PI),
        f64::from(std::f32::consts::FRAC_PI_2),
        100.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let wide: &[f64] = match d {
        DType::F16 => &[65504.0, -65504.0, 6.103_515_6e-5, 5.960_464_5e-8, -5.960_464_5e-8, 11.0, 11.1, -17.0, 1e4, -1e4],
        _ => &[
            f64::from(f32::MAX),
            f64::from(-f32::MAX),
            f64::from(f32::MIN_POSITIVE),
            -f64::from(f32::MIN_POSITIVE),
            1e-45,
            -1e-40,
            88.7,
            88.722_84,
            -87.3,
            -103.9,
            1e4,
            -1e4,
            1e30,
            -1e30,
            -25.800_61,
            0.211_489_11,
            1e-30,
            16_777_216.0,
        ],
    };
    common.iter().chain(wide).map(|&v| round_to(d, v)).collect()
}

fn int_values(d: DType) -> Vec<f64> {
    let v: Vec<i64> = match d {
        DType::I32 => vec![
            0,
            1,
            -1,
            2,
            -2,
            7,
            -7,
            31,
            32,
            33,
            64,
            -32,
            100_000,
            -100_000,
            i64::from(i32::MIN),
            i64::from(i32::MAX),
            i64::from(i32::MIN) + 1,
        ],
        DType::U32 => vec![0, 1, 2, 7, 31, 32, 33, 64, 100_000, 0x8000_0000, i64::from(u32::MAX), i64::from(u32::MAX) - 1],
        DType::I8 => vec![0, 1, -1, 2, -2, 7, -7, 8, 9, 31, 32, 33, 100, -100, -128, 127, -127],
        DType::I16 => vec![0, 1, -1, 2, -7, 15, 16, 17, 31, 33, 300, -300, 1000, -32768, 32767, -32767],
        DType::U8 => vec![0, 1, 2, 7, 8, 9, 31, 32, 33, 100, 128, 200, 254, 255],
        _ => vec![0, 1, 2, 7, 15, 16, 17, 32, 33, 300, 1000, 32768, 65534, 65535],
    };
    v.into_iter().map(|x| x as f64).collect()
}

/// `v` rounded to the dtype (floats: to f32 first, as the language computes 16-bit floats).
fn round_to(d: DType, v: f64) -> f64 {
    match d {
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16::from_f32(v as f32).to_f64(),
        DType::BF16 => bf16::from_f32(v as f32).to_f64(),
        _ => v,
    }
}

/// The storage bits of a value of `d`.
fn bits_of(d: DType, v: f64) -> u32 {
    match d {
        DType::F32 => (v as f32).to_bits(),
        DType::F16 => u32::from(f16::from_f64(v).to_bits()),
        DType::BF16 => u32::from(bf16::from_f64(v).to_bits()),
        DType::I32 => v as i64 as i32 as u32,
        DType::U32 => v as i64 as u32,
        DType::Bool => u32::from(v != 0.0),
        // 8- and 16-bit integers: their low bits, as an array holds them.
        d => (v as i64 as u32) & ((1u64 << d.bits()) - 1) as u32,
    }
}

/// The value of an 8- or 16-bit integer whose computation in 32 bits gave `v`: its low bits,
/// read as the type reads them (the language computes narrow integers as `i32` or `u32` and
/// wraps them after every operation).
fn wrap_ref(d: DType, v: f64) -> f64 {
    let v = v as i64;
    f64::from(match d {
        DType::I8 => i32::from(v as i8),
        DType::I16 => i32::from(v as i16),
        DType::U8 => i32::from(v as u8),
        DType::U16 => i32::from(v as u16),
        _ => unreachable!("a narrow integer"),
    })
}

/// The 32-bit type an integer of `d` is computed in.
fn wide(d: DType) -> DType {
    match d {
        DType::I8 | DType::I16 => DType::I32,
        DType::U8 | DType::U16 => DType::U32,
        d => d,
    }
}

fn literal(d: DType, v: f64) -> String {
    if !d.is_float() {
        return format!("{}", v as i64);
    }
    match v {
        v if v.is_nan() => "nan".into(),
        f64::INFINITY => "inf".into(),
        f64::NEG_INFINITY => "-inf".into(),
        v if v == 0.0 && v.is_sign_negative() => "-0.0".into(),
        v => format!("{v:e}"),
    }
}

// ---- the reference ----

/// A unary operation in f64, with the language's rules.
fn unary_ref(op: &str, d: DType, x: f64) -> f64 {
    if wide(d) != d {
        return wrap_ref(d, unary_ref(op, wide(d), x));
    }
    if !d.is_float() {
        let r = match (op, d) {
            ("neg", DType::I32) => i64::from((x as i32).wrapping_neg()),
            ("abs", DType::I32) => i64::from((x as i32).wrapping_abs()),
            ("not", DType::I32) => i64::from(!(x as i32)),
            ("neg", _) => i64::from((x as u32).wrapping_neg()),
            ("abs", _) => x as i64,
            ("not", _) => i64::from(!(x as u32)),
            _ => unreachable!("{op}"),
        };
        return r as f64;
    }
    let r = match op {
        "neg" => -x,
        "abs" => x.abs(),
        "exp" => x.exp(),
        "exp2" => x.exp2(),
        "log" => x.ln(),
        "log2" => x.log2(),
        "sqrt" => x.sqrt(),
        "rsqrt" => 1.0 / x.sqrt(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tanh" => x.tanh(),
        "logistic" => 1.0 / (1.0 + (-x).exp()),
        "expm1" => x.exp_m1(),
        "log1p" => x.ln_1p(),
        "erf" => erf_ref(x),
        "erf_inv" => erf_inv_ref(x),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "atan" => x.atan(),
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        // Ties to even, written out: the nearer integer, or the even one of two equally near.
        "round" => {
            let (lo, hi) = (x.floor(), x.ceil());
            match (x - lo).partial_cmp(&(hi - x)) {
                Some(std::cmp::Ordering::Less) => lo,
                Some(std::cmp::Ordering::Greater) => hi,
                _ if !x.is_finite() || lo == hi => x,
                _ => if lo % 2.0 == 0.0 { lo } else { hi },
            }
        }
        _ => unreachable!("{op}"),
    };
    round_to(d, r)
}

/// The error function in `f64`, independent of the `libm` crate the interpreter calls: below 3,
/// `2/sqrt(pi) e^(-x^2) (x + sum of (2x^2)^n x / (3 5 ... (2n+1)))` (positive terms, no
/// cancellation); from 3 to 6, `1 - erfc` with `erfc` by Laplace's continued fraction; 1 beyond.
fn erf_ref(x: f64) -> f64 {
    let a = x.abs();
    let r = if a.is_nan() {
        return x;
    } else if a < 3.0 {
        let (mut t, mut sum, mut n) = (a, a, 1.0);
        while t > sum * 1e-18 {
            t *= 2.0 * a * a / (2.0 * n + 1.0);
            sum += t;
            n += 1.0;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum
    } else if a < 6.0 {
        let mut k = a;
        for n in (1..=80).rev() {
            k = a + f64::from(n) / 2.0 / k;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * k)
    } else {
        1.0
    };
    r.copysign(x)
}

/// `erf_inv` by bisection on [`erf_ref`] (independent of the interpreter's Newton steps on the
/// `libm` crate's `erf`).
fn erf_inv_ref(x: f64) -> f64 {
    if x.is_nan() || x.abs() > 1.0 {
        return f64::NAN;
    }
    if x.abs() == 1.0 {
        return f64::INFINITY.copysign(x);
    }
    let (mut lo, mut hi) = (-10.0f64, 10.0f64);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if mid == lo || mid == hi {
            break;
        }
        if erf_ref(mid) < x { lo = mid } else { hi = mid }
    }
    (lo + hi) / 2.0
}

/// C's `atan2(y, x)` from `atan` of a ratio at most 1 and the quadrant written out (C99 F.9.1.4).
fn atan2_ref(y: f64, x: f64) -> f64 {
    use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, PI};
    if x.is_nan() || y.is_nan() {
        return f64::NAN;
    }
    let (ax, ay) = (x.abs(), y.abs());
    let a = if ax == 0.0 && ay == 0.0 {
        0.0
    } else if ax.is_infinite() && ay.is_infinite() {
        FRAC_PI_4
    } else if ay > ax {
        FRAC_PI_2 - (ax / ay).atan()
    } else {
        (ay / ax).atan()
    };
    let a = if x.is_sign_negative() { PI - a } else { a };
    a.copysign(y)
}

/// C's `pow`, its special cases written out (C99 F.9.4.4).
fn pow_ref(x: f64, y: f64) -> f64 {
    let odd_int = y.is_finite() && y.trunc() == y && (y / 2.0).trunc() != y / 2.0;
    if y == 0.0 || x == 1.0 {
        1.0
    } else if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x == 0.0 {
        match (y < 0.0, odd_int) {
            (true, true) => f64::INFINITY.copysign(x),
            (true, false) => f64::INFINITY,
            (false, true) => x,
            (false, false) => 0.0,
        }
    } else if y.is_infinite() {
        match (x.abs() == 1.0, x.abs() < 1.0, y > 0.0) {
            (true, _, _) => 1.0,
            (_, true, true) | (_, false, false) => 0.0,
            _ => f64::INFINITY,
        }
    } else if x.is_infinite() {
        let mag = if y < 0.0 { 0.0 } else { f64::INFINITY };
        if x < 0.0 && odd_int { -mag } else { mag }
    } else if x < 0.0 && y.trunc() != y {
        f64::NAN
    } else {
        let mag = x.abs().powf(y);
        if x < 0.0 && odd_int { -mag } else { mag }
    }
}

/// A binary operation in f64, with the language's rules.
fn binary_ref(op: &str, d: DType, x: f64, y: f64) -> f64 {
    if wide(d) != d {
        return wrap_ref(d, binary_ref(op, wide(d), x, y));
    }
    match d {
        DType::I32 => {
            let (a, b) = (x as i32, y as i32);
            let r = match op {
                "add" => a.wrapping_add(b),
                "sub" => a.wrapping_sub(b),
                "mul" => a.wrapping_mul(b),
                // Zero divisors give 0; MIN / -1 wraps to MIN.
                "div" => {
                    if b == 0 {
                        0
                    } else {
                        a.wrapping_div(b)
                    }
                }
                "rem" => {
                    if b == 0 {
                        0
                    } else {
                        a.wrapping_rem(b)
                    }
                }
                "max" => a.max(b),
                "min" => a.min(b),
                "and" => a & b,
                "or" => a | b,
                "xor" => a ^ b,
                // Shift counts modulo 32; shr arithmetic.
                "shl" => a.wrapping_shl(b as u32 % 32),
                "shr" => a >> (b as u32 % 32),
                _ => unreachable!("{op}"),
            };
            f64::from(r)
        }
        DType::U32 => {
            let (a, b) = (x as i64 as u32, y as i64 as u32);
            let r = match op {
                "add" => a.wrapping_add(b),
                "sub" => a.wrapping_sub(b),
                "mul" => a.wrapping_mul(b),
                "div" => a.checked_div(b).unwrap_or(0),
                "rem" => a.checked_rem(b).unwrap_or(0),
                "max" => a.max(b),
                "min" => a.min(b),
                "and" => a & b,
                "or" => a | b,
                "xor" => a ^ b,
                "shl" => a << (b % 32),
                "shr" => a >> (b % 32),
                _ => unreachable!("{op}"),
            };
            f64::from(r)
        }
        _ => {
            let r = match op {
                "add" => x + y,
                "sub" => x - y,
                "mul" => x * y,
                "div" => x / y,
                // C's fmod: exact, the sign of x.
                "rem" => x % y,
                "pow" => pow_ref(x, y),
                "atan2" => atan2_ref(x, y),
                // NaN propagates.
                "max" if x.is_nan() || y.is_nan() => f64::NAN,
                "min" if x.is_nan() || y.is_nan() => f64::NAN,
                "max" => x.max(y),
                "min" => x.min(y),
                _ => unreachable!("{op}"),
            };
            // Products and quotients of two f32 are exact in f64 only for + - *; / and rem are
            // correctly rounded through f64 (a double rounding, harmless at these widths).
            round_to(d, r)
        }
    }
}

fn compare_ref(op: &str, x: f64, y: f64) -> f64 {
    let r = match op {
        "eq" => x == y,
        // Unordered: true where either is NaN.
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        "ge" => x >= y,
        _ => unreachable!("{op}"),
    };
    f64::from(u8::from(r))
}

// ---- accuracy, per docs/language.md §8 ----

/// The ulp a backend may be from the correctly rounded result of `op` on `d`.
fn allowed_ulps(exec: &str, op: &str, d: DType) -> u64 {
    let transcendental = matches!(
        op,
        "exp" | "exp2" | "log" | "log2" | "sin" | "cos" | "tanh" | "logistic" | "expm1" | "log1p" | "erf" | "erf_inv" | "pow"
            | "atan2" | "rsqrt" | "asin" | "acos" | "atan" | "sinh" | "cosh"
    );
    if !transcendental || exec == "interpret" {
        return 0;
    }
    match (d, op) {
        // A 16-bit result of an f32 within 2 ulp may round to the neighbour of the correctly
        // rounded one.
        (DType::F16 | DType::BF16, _) => 1,
        (_, "exp" | "exp2" | "log" | "log2") => 1,
        (_, "erf_inv" | "asin" | "acos" | "sinh" | "cosh") => 3,
        _ => 2,
    }
}

/// Distance in ulp of the dtype between two storage words; NaN equals NaN.
fn ulps(d: DType, a: u32, b: u32) -> u64 {
    let (bits, sign) = match d {
        DType::F32 => (32, 1u64 << 31),
        DType::F16 | DType::BF16 => (16, 1 << 15),
        _ => return if a == b { 0 } else { u64::MAX },
    };
    let nan = |w: u32| {
        let w = u64::from(w);
        let exp_mask = if bits == 32 {
            0x7f80_0000
        } else if d == DType::F16 {
            0x7c00
        } else {
            0x7f80
        };
        let man_mask = if bits == 32 {
            0x007f_ffff
        } else if d == DType::F16 {
            0x03ff
        } else {
            0x007f
        };
        w & exp_mask == exp_mask && w & man_mask != 0
    };
    match (nan(a), nan(b)) {
        (true, true) => return 0,
        (false, false) => {}
        _ => return u64::MAX,
    }
    let key = |w: u32| {
        let w = i64::from(w);
        if (w as u64) & sign == 0 { w } else { sign as i64 - w }
    };
    key(a).abs_diff(key(b))
}

// ---- the kernels ----

struct Case {
    what: String,
    src: String,
    inputs: Vec<(&'static str, HostArray)>,
    /// Expected storage words of `o`, and the dtype they are in.
    want: Vec<u32>,
    out: DType,
    op: &'static str,
    dtype: DType,
}

fn array(d: DType, vals: &[f64]) -> HostArray {
    HostArray::from_bits(d, &[vals.len()], vals.iter().map(|&v| bits_of(d, v)).collect())
}

/// The cases of one operation on one dtype.
fn cases(kind: &str, op: &'static str, d: DType) -> Vec<Case> {
    let vals = if d.is_float() { float_values(d) } else { int_values(d) };
    let n = vals.len();
    let out = if kind == "compare" { DType::Bool } else { d };
    let eval = |x: f64, y: f64| match kind {
        "unary" => unary_ref(op, d, x),
        "binary" => binary_ref(op, d, x, y),
        _ => compare_ref(op, x, y),
    };
    let mut cases = Vec::new();
    let header = |ins: &str, shape: &str| format!("kernel k\n{ins}  out o: {out}[{shape}]\n{{\n");
    if kind == "unary" {
        let src = header(&format!("  in  x: {d}[{n}]\n"), &n.to_string())
            + &format!("  %x = load x\n  %y = {op} %x\n  store o, %y\n}}\n");
        let want = vals.iter().map(|&x| bits_of(out, eval(x, 0.0))).collect();
        cases.push(Case { what: "loaded".into(), src, inputs: vec![("x", array(d, &vals))], want, out, op, dtype: d });
        let mut body = String::new();
        for (j, &v) in vals.iter().enumerate() {
            body += &format!("  %c{j} = full {} : {d}[1]\n  %y{j} = {op} %c{j}\n  store o[ds({j}, 1)], %y{j}\n", literal(d, v));
        }
        let src = header("", &n.to_string()) + &body + "}\n";
        let want = vals.iter().map(|&x| bits_of(out, eval(x, 0.0))).collect();
        cases.push(Case { what: "full".into(), src, inputs: vec![], want, out, op, dtype: d });
        return cases;
    }
    // Binary and compare: every pair. Loaded: o[i * n + j] = op(v[i], v[j]).
    let xs: Vec<f64> = (0..n * n).map(|k| vals[k / n]).collect();
    let ys: Vec<f64> = (0..n * n).map(|k| vals[k % n]).collect();
    let src = header(&format!("  in  a: {d}[{}]\n  in  b: {d}[{}]\n", n * n, n * n), &(n * n).to_string())
        + &format!("  %a = load a\n  %b = load b\n  %y = {op} %a, %b\n  store o, %y\n}}\n");
    let want: Vec<u32> = xs.iter().zip(&ys).map(|(&x, &y)| bits_of(out, eval(x, y))).collect();
    cases.push(Case {
        what: "loaded".into(),
        src,
        inputs: vec![("a", array(d, &xs)), ("b", array(d, &ys))],
        want: want.clone(),
        out,
        op,
        dtype: d,
    });
    // Constant operands: row i of o is op(v[i], v[j]) over j, with v[i] a literal on the left
    // or v[j] the loaded one; the transposed forms put the literal on the right.
    // Narrow integers take the literal forms the 32-bit ones share code with once each.
    let forms: &[&str] = if wide(d) == d { &["literal left", "literal right", "full right"] } else { &["literal left", "full right"] };
    for &form in forms {
        let mut body = String::from("  %a = load a\n");
        for (i, &v) in vals.iter().enumerate() {
            let lit = literal(d, v);
            body += &match form {
                "literal left" => format!("  %y{i} = {op} {lit}, %a\n"),
                "literal right" => format!("  %y{i} = {op} %a, {lit}\n"),
                _ => format!("  %c{i} = full {lit} : {d}[{n}]\n  %y{i} = {op} %a, %c{i}\n"),
            };
            body += &format!("  store o[{i}, :], %y{i}\n");
        }
        let src = format!("kernel k\n  in  a: {d}[{n}]\n  out o: {out}[{n}, {n}]\n{{\n{body}}}\n");
        let want: Vec<u32> = (0..n * n)
            .map(|k| {
                let (i, j) = (k / n, k % n);
                let (x, y) = if form == "literal left" { (vals[i], vals[j]) } else { (vals[j], vals[i]) };
                bits_of(out, eval(x, y))
            })
            .collect();
        cases.push(Case { what: form.into(), src, inputs: vec![("a", array(d, &vals))], want, out, op, dtype: d });
    }
    cases
}

fn all_cases() -> Vec<Case> {
    let float = [DType::F32, DType::F16, DType::BF16].map(|d| (d, FLOAT_UNARY, FLOAT_BINARY));
    let int = [DType::I32, DType::U32, DType::I8, DType::U8, DType::I16, DType::U16].map(|d| (d, INT_UNARY, INT_BINARY));
    let mut all = Vec::new();
    for (d, unary, binary) in float.into_iter().chain(int) {
        let ops = unary.iter().map(|op| ("unary", op)).chain(binary.iter().map(|op| ("binary", op)));
        for (kind, op) in ops.chain(COMPARE.iter().map(|op| ("compare", op))) {
            all.extend(cases(kind, op, d));
        }
    }
    all
}

// ---- the executors ----

/// Every output of `kernel` on `exec`: a backend, or `mosaic-emu` (its PTX in the emulator).
fn outputs_on(
    rt: &tessel::Runtime,
    exec: &str,
    kernel: &tessel_plugin_api::ir::Verified,
    args: &LaunchArgs,
) -> Result<Vec<(String, HostArray)>, String> {
    let call = [tessel::Call::new(kernel.clone())];
    let backend = if exec == "mosaic-emu" { "mosaic-gpu" } else { exec };
    let launch = tessel::Launch::new(call.clone(), [], args.grid.clone());
    let planned = rt.plan(tessel::Choice::Named(backend), &launch).map_err(|e| e.to_string())?;
    if exec != "mosaic-emu" {
        return planned.launch(args).map_err(|e| e.to_string());
    }
    emulate(&planned.lower().map_err(|e| e.to_string())?.remove(0).1, kernel, args, false)
}

fn run_on(
    rt: &tessel::Runtime,
    exec: &str,
    kernel: &tessel_plugin_api::ir::Verified,
    args: &LaunchArgs,
) -> Result<HostArray, String> {
    let outputs = outputs_on(rt, exec, kernel, args)?;
    outputs.into_iter().find(|(n, _)| n == "o").map(|(_, a)| a).ok_or_else(|| "no output o".to_string())
}

fn check(exec: &str) {
    check_with(exec, &[]);
}

fn check_with(exec: &str, plugins: &[std::path::PathBuf]) {
    let rt = tessel::Runtime::new(plugins).expect("runtime");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in all_cases() {
        let what = format!("{} {} ({})", case.op, case.dtype, case.what);
        let kernel = tessel::load_source("edge.tk", &case.src).unwrap_or_else(|e| panic!("{what}: {e}\n{}", case.src)).remove(0);
        let args = LaunchArgs {
            inputs: case.inputs.iter().map(|(n, a)| (n.to_string(), a.clone())).collect(),
            grid: Default::default(),
        };
        let got = match run_on(&rt, exec, &kernel, &args) {
            Ok(a) => a.to_bits(),
            Err(e) => {
                failures.push(format!("{what}: {}", e.lines().next().unwrap_or_default()));
                continue;
            }
        };
        let tol = allowed_ulps(exec, case.op, case.dtype);
        let wrong: Vec<String> = got
            .iter()
            .zip(&case.want)
            .enumerate()
            .filter(|(_, (g, w))| ulps(case.out, **g, **w) > tol)
            .take(4)
            .map(|(k, (g, w))| {
                let show = |b: u32| HostArray::from_bits(case.out, &[1], vec![b]).to_f64()[0];
                format!("[{k}] got {:e} want {:e}", show(*g), show(*w))
            })
            .collect();
        if !wrong.is_empty() {
            failures.push(format!("{what}, {tol} ulp allowed: {}", wrong.join("; ")));
        }
        checked += 1;
    }
    eprintln!("{exec}: {checked} kernels checked, {} failures", failures.len());
    assert!(failures.is_empty(), "{exec}: {} cases off the reference:\n{}", failures.len(), failures.join("\n"));
    assert!(checked > 300, "{checked} kernels");
}

#[test]
fn the_interpreter_meets_the_reference_at_every_edge() {
    check("interpret");
}

#[test]
fn wgpu_meets_the_reference_at_every_edge() {
    if wgpu_adapter("wgpu edge values").is_some() {
        check("wgpu");
    }
}

/// The cpu backend's C: held to the GPU backends' bounds (the same maths, `plugin-api/src/libm/`).
#[test]
fn cpu_meets_the_reference_at_every_edge() {
    if let Some(plugin) = cpu_plugin("edge values on cpu") {
        check_with("cpu", &[plugin]);
    }
}

#[test]
fn emulated_mosaic_ptx_meets_the_reference_at_every_edge() {
    check("mosaic-emu");
}

#[test]
fn mosaic_gpu_meets_the_reference_at_every_edge() {
    let r = tessel(&["backends", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("backends --json");
    let b = v["backends"].as_array().expect("backends").iter().find(|b| b["name"] == "mosaic-gpu").expect("built in").clone();
    if b["available"].as_bool() == Some(true) {
        check("mosaic-gpu");
    } else {
        let why = b["reason"].as_str().unwrap_or_default().to_string();
        skip("edge values on mosaic-gpu", &format!("mosaic-gpu: {why}"), "TESSEL_REQUIRE_GPU");
    }
}

/// The outputs of `kernel` on `args` from the interpreter, Mosaic GPU's PTX on the emulator and
/// wgpu where there is an adapter (a recorded skip named `test` where there is none).
fn on_every_executor(
    kernel: &tessel_plugin_api::ir::Verified,
    args: &LaunchArgs,
    test: &str,
) -> Vec<(&'static str, Vec<(String, HostArray)>)> {
    let plugins: Vec<std::path::PathBuf> = cpu_plugin(test).into_iter().collect();
    let rt = tessel::Runtime::new(&plugins).expect("runtime");
    let mut execs = vec!["interpret", "mosaic-emu"];
    if wgpu_adapter(test).is_some() {
        execs.push("wgpu");
    }
    if !plugins.is_empty() {
        execs.push("cpu");
    }
    execs.into_iter().map(|exec| (exec, outputs_on(&rt, exec, kernel, args).unwrap_or_else(|e| panic!("{exec}: {e}")))).collect()
}

/// Row reductions at the edges, on every executor: a NaN anywhere in a row (first, middle, last
/// element) makes its `max` and `min` NaN; infinities win or lose as they should; rows of signed
/// zeros give a zero. The rows are long enough (8 × 64) that wgpu reduces them in its row layout,
/// a `vec4` at a time.
#[test]
fn row_reductions_propagate_nan_on_every_executor() {
    let src = "kernel rows\n  in  x: f32[8, 64]\n  out mx: f32[8, 1]\n  out mn: f32[8, 1]\n{\n  %x = load x\n  %a = max %x axis 1 keepdims\n  %b = min %x axis 1 keepdims\n  store mx, %a\n  store mn, %b\n}\n";
    let mut x: Vec<f64> = (0..8 * 64).map(|i| f64::from(((i * 37) % 101) as f32 / 7.0 - 6.0)).collect();
    x[37] = f64::NAN; // row 0, inside
    x[64] = f64::INFINITY; // row 1
    x[2 * 64 + 5] = f64::NEG_INFINITY; // row 2
    x[3 * 64] = f64::NAN; // row 3, first
    x[3 * 64 + 1] = f64::INFINITY;
    for (j, v) in x[4 * 64..5 * 64].iter_mut().enumerate() {
        *v = if j % 2 == 0 { 0.0 } else { -0.0 }; // row 4
    }
    x[6 * 64 - 1] = f64::NAN; // row 5, last
    let fold = |row: &[f64], f: fn(f64, f64) -> f64| {
        row.iter().fold(row[0], |a, &v| if a.is_nan() || v.is_nan() { f64::NAN } else { f(a, v) })
    };
    let want_max: Vec<f64> = x.chunks(64).map(|r| fold(r, f64::max)).collect();
    let want_min: Vec<f64> = x.chunks(64).map(|r| fold(r, f64::min)).collect();
    let kernel = tessel::load_source("rows.tk", src).unwrap_or_else(|e| panic!("{e}")).remove(0);
    let x_array = HostArray::from_bits(DType::F32, &[8, 64], x.iter().map(|&v| bits_of(DType::F32, v)).collect());
    let args = LaunchArgs { inputs: [("x".to_string(), x_array)].into(), grid: Default::default() };
    let same = |g: f64, w: f64| (g.is_nan() && w.is_nan()) || g == w;
    for (exec, outputs) in on_every_executor(&kernel, &args, "wgpu row reductions") {
        for (name, want) in [("mx", &want_max), ("mn", &want_min)] {
            let got = outputs.iter().find(|(n, _)| n == name).expect("output").1.to_f64();
            for (r, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                assert!(same(*g, *w), "{exec}: {name} of row {r} is {g}, want {w}");
            }
        }
    }
}

/// The operations that move elements (`tile`, `repeat`, `concatenate`, strided `slice`,
/// `transpose`) compute nothing, so on every executor they keep every bit of the values at the
/// edges: NaN with its payload and sign, infinities, signed zeros, subnormals, the extremes.
/// The expected bits are the input's, moved by index arithmetic written out here.
#[test]
fn shape_operations_keep_every_bit_on_every_executor() {
    let src = "kernel moves\n  in  x: f32[2, 8]\n  in  y: f32[2, 8]\n  out t: f32[4, 16]\n  out r: f32[2, 24]\n  out q: f32[6, 8]\n  out c: f32[4, 8]\n  out s: f32[2, 4]\n  out p: f32[8, 2]\n{\n  %x = load x\n  %y = load y\n  %t = tile %x reps (2, 2)\n  store t, %t\n  %r = repeat %x times 3 axis 1\n  store r, %r\n  %q = repeat %x times 3 axis 0\n  store q, %q\n  %c = concatenate %x, %y axis 0\n  store c, %c\n  %s = slice %x start (0, 1) stride (1, 2) : f32[2, 4]\n  store s, %s\n  %p = transpose %x perm (1, 0)\n  store p, %p\n}\n";
    let x: Vec<u32> = vec![
        0x7FC0_1234, // a quiet NaN with a payload
        0xFFC0_0001, // a negative one
        0x7F80_0000,
        0xFF80_0000,
        0x0000_0000,
        0x8000_0000,
        0x0000_0001, // the smallest subnormal
        0x807F_FFFF, // the largest negative subnormal
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x0080_0000,
        0x3F80_0000,
        0xBF80_0001,
        0x7FBF_FFFF, // a signalling NaN's bits (quiet or not, a move keeps them here)
        0x4049_0FDB,
        0xC2F6_E979,
    ];
    let at = |i: usize, j: usize| x[i * 8 + j];
    // `y` is `x` backwards, so that `concatenate` shows which operand went first.
    let y: Vec<u32> = x.iter().rev().copied().collect();
    let want: Vec<(&str, Vec<u32>)> = vec![
        ("t", (0..4 * 16).map(|e| at((e / 16) % 2, (e % 16) % 8)).collect()),
        ("r", (0..2 * 24).map(|e| at(e / 24, (e % 24) / 3)).collect()),
        ("q", (0..6 * 8).map(|e| at(e / 8 / 3, e % 8)).collect()),
        ("c", (0..4 * 8).map(|e| if e < 16 { x[e] } else { y[e - 16] }).collect()),
        ("s", (0..2 * 4).map(|e| at(e / 4, 1 + 2 * (e % 4))).collect()),
        ("p", (0..8 * 2).map(|e| at(e % 2, e / 2)).collect()),
    ];
    let kernel = tessel::load_source("moves.tk", src).unwrap_or_else(|e| panic!("{e}")).remove(0);
    let args = LaunchArgs {
        inputs: [
            ("x".to_string(), HostArray::from_bits(DType::F32, &[2, 8], x.clone())),
            ("y".to_string(), HostArray::from_bits(DType::F32, &[2, 8], y.clone())),
        ]
        .into(),
        grid: Default::default(),
    };
    for (exec, outputs) in on_every_executor(&kernel, &args, "wgpu shape operations") {
        for (name, bits) in &want {
            let got = outputs.iter().find(|(n, _)| n == name).expect("output").1.to_bits();
            let bad: Vec<String> = got
                .iter()
                .zip(bits)
                .enumerate()
                .filter(|(_, (g, w))| g != w)
                .take(3)
                .map(|(i, (g, w))| format!("[{i}] {g:#010x} want {w:#010x}"))
                .collect();
            assert!(bad.is_empty(), "{exec}: `{name}` changed bits: {}", bad.join(", "));
        }
    }
}
