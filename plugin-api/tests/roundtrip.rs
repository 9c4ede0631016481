//! `print(parse(print(k))) == print(k)` over generated well-typed kernels, and a builder kernel
//! printing like its text twin.

use proptest::prelude::*;
use tessel_plugin_api::ir::builder::{BodyBuilder, KernelBuilder, Value};
use tessel_plugin_api::ir::*;

/// One generated step: which op, two operand picks, a literal, and a nesting choice.
#[derive(Clone, Debug)]
struct StepSpec {
    kind: u8,
    a: usize,
    b: usize,
    lit: Literal,
}

fn literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        (-1000i64..1000).prop_map(Literal::Int),
        (-1.0e6f64..1.0e6).prop_map(Literal::Float),
        prop::num::f64::NORMAL.prop_map(Literal::Float),
        Just(Literal::Float(f64::INFINITY)),
        Just(Literal::Float(f64::NEG_INFINITY)),
        Just(Literal::Float(f64::NAN)),
        Just(Literal::Float(1e-5)),
        Just(Literal::Float(-0.0)),
    ]
}

fn steps() -> impl Strategy<Value = Vec<StepSpec>> {
    prop::collection::vec(
        (0u8..16, any::<usize>(), any::<usize>(), literal()).prop_map(|(kind, a, b, lit)| StepSpec { kind, a, b, lit }),
        1..24,
    )
}

const R: usize = 4;
const C: usize = 8;

/// The pools of values by type that the generator picks operands from.
#[derive(Default)]
struct Pools {
    f: Vec<Value>,
    i: Vec<Value>,
    row: Vec<Value>,
}

fn pick(pool: &[Value], n: usize) -> &Value {
    &pool[n % pool.len()]
}

fn float_lit(l: Literal) -> Literal {
    match l {
        Literal::Bool(b) => Literal::Float(if b { 1.0 } else { 0.0 }),
        other => other,
    }
}

fn emit(b: &mut BodyBuilder, pools: &mut Pools, s: &StepSpec, depth: usize) {
    let f32m = Type::array(DType::F32, [R, C]);
    match s.kind {
        0 => {
            let v = b.load_with("x", None, None, Some(float_lit(s.lit)));
            pools.f.push(v);
        }
        1 => {
            let op = [UnaryOp::Exp, UnaryOp::Neg, UnaryOp::Tanh, UnaryOp::Abs, UnaryOp::Floor][s.b % 5];
            let v = b.unary(op, pick(&pools.f, s.a));
            pools.f.push(v);
        }
        2 => {
            let op = BinaryOp::ALL[s.b % 8];
            let v = b.binary(op, pick(&pools.f, s.a), Operand::Lit(float_lit(s.lit)));
            pools.f.push(v);
        }
        3 => {
            let (x, y) = (pick(&pools.f, s.a).clone(), pick(&pools.f, s.b).clone());
            let v = b.binary(BinaryOp::ALL[s.a % 8], &x, &y);
            pools.f.push(v);
        }
        4 => {
            let v = b.reduce(ReduceOp::ALL[s.b % 4], pick(&pools.f, s.a), 1, s.b.is_multiple_of(2));
            if s.b.is_multiple_of(2) {
                let w = b.add(pick(&pools.f, s.a), &v);
                pools.f.push(w);
            } else {
                pools.row.push(v);
            }
        }
        5 => {
            let c = b.compare(CmpOp::ALL[s.b % 6], pick(&pools.f, s.a), Operand::Lit(float_lit(s.lit)));
            let v = b.select(&c, pick(&pools.f, s.a), pick(&pools.f, s.b));
            pools.f.push(v);
        }
        6 => {
            let v = b.cast(pick(&pools.f, s.a), DType::I32);
            pools.i.push(v);
        }
        7 if !pools.i.is_empty() => {
            let op = [BinaryOp::Shl, BinaryOp::Shr, BinaryOp::And, BinaryOp::Rem, BinaryOp::Div][s.b % 5];
            let v = b.binary(op, pick(&pools.i, s.a), Operand::Lit(Literal::Int(s.lit.as_i64().rem_euclid(1 << 20))));
            pools.i.push(v);
        }
        8 => {
            let t = b.transpose(pick(&pools.f, s.a), &[1, 0]);
            let d = b.dot(pick(&pools.f, s.b), &t, false, false);
            let v = b.reshape(&d, Type::array(DType::F32, [R * R]));
            let w = b.broadcast(&v, Type::array(DType::F32, [2, R * R]));
            let back = b.reduce(ReduceOp::Sum, &w, 0, false);
            pools.row.push(back);
        }
        9 => {
            let v = b.iota(s.b % 2, Type::array(DType::I32, [R, C]));
            pools.i.push(v);
        }
        10 => {
            let v = b.full(float_lit(s.lit), f32m.clone());
            pools.f.push(v);
        }
        11 if depth < 2 => {
            let k = b.program_id("i");
            let c = b.eq(&k, 0i64);
            let src = pick(&pools.f, s.a).clone();
            b.when(&c, |w| {
                let v = w.exp(&src);
                w.store("o", &v);
            });
        }
        12 if depth < 2 => {
            let init = pick(&pools.f, s.a).clone();
            let r = b.for_loop(
                0i64,
                4i64,
                s.b.is_multiple_of(2).then_some(Operand::Lit(Literal::Int(2))),
                &[(&init).into()],
                |body, i, carried| {
                    let start = body.mul(i, 1i64);
                    let _ = body.load_with(
                        "x",
                        Some(vec![Index::Slice { start: (&start).into(), size: R, stride: 1 }, Index::Full]),
                        None,
                        None,
                    );
                    let next = body.add(&carried[0], Operand::Lit(float_lit(s.lit)));
                    vec![(&next).into()]
                },
            );
            pools.f.extend(r);
        }
        13 => {
            let lane = b.iota(1, Type::array(DType::I32, [R, C]));
            let m = b.lt(&lane, 5i64);
            let v = b.load_with("x", None, Some(&m), Some(float_lit(s.lit)));
            b.store_with("o", None, &v, Some(&m));
            pools.f.push(v);
        }
        14 => {
            let v = b.bitcast(pick(&pools.f, s.a), DType::U32);
            let back = b.bitcast(&v, DType::F32);
            pools.f.push(back);
        }
        _ => {
            let v = b.load("x");
            b.store("o", &v);
        }
    }
}

fn generated_kernel(steps: &[StepSpec]) -> Kernel {
    let ty = Type::array(DType::F32, [16, C]);
    KernelBuilder::new("gen")
        .axis("i", 4)
        .seq_axis("k", 2)
        .input_block("x", ty.clone(), &[R, C], &[Affine::axis("i"), Affine::constant(0)])
        .output_block("o", ty, &[R, C], &[Affine::axis("i"), Affine::constant(0)])
        .scratch("acc", Type::array(DType::F32, [R, C]))
        .body(|b| {
            let mut pools = Pools::default();
            pools.f.push(b.load("x"));
            for s in steps {
                emit(b, &mut pools, s, 0);
            }
            let last = pools.f.last().expect("pool starts non-empty").clone();
            b.store("acc", &last);
            b.store("o", &last);
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn print_parse_print_is_stable(steps in steps()) {
        let kernel = generated_kernel(&steps);
        let verified = verify(&kernel).map_err(|d| TestCaseError::fail(format!("generator made an ill-typed kernel:\n{d}")))?;
        let once = print_kernel(verified.kernel());
        let parsed = parse(&once).map_err(|d| TestCaseError::fail(d.render("printed.tk", &once)))?;
        prop_assert_eq!(parsed.kernels.len(), 1);
        let reverified = verify(&parsed.kernels[0]).map_err(|d| TestCaseError::fail(d.render("printed.tk", &once)))?;
        let twice = print_kernel(reverified.kernel());
        prop_assert_eq!(&once, &twice);
        // Unverified printing of the parsed text is the same too: every type was written.
        prop_assert_eq!(print_kernel(&parsed.kernels[0]), once);
    }
}

#[test]
fn builder_makes_what_the_parser_makes() {
    let text = "kernel add\n  grid (i: 8)\n  in  x: f32[1024] block [128] at (i)\n  in  y: f32[1024] block [128] at (i)\n  out o: f32[1024] block [128] at (i)\n{\n  %a = load x\n  %b = load y\n  %c = add %a, %b\n  store o, %c\n}\n";
    let parsed = parse(text).expect("valid");
    let at = [Affine::axis("i")];
    let t = Type::array(DType::F32, [1024]);
    let built = KernelBuilder::new("add")
        .axis("i", 8)
        .input_block("x", t.clone(), &[128], &at)
        .input_block("y", t.clone(), &[128], &at)
        .output_block("o", t, &[128], &at)
        .body(|b| {
            let x = b.name_next("a").load("x");
            let y = b.name_next("b").load("y");
            let c = b.name_next("c").add(&x, &y);
            b.store("o", &c);
        });
    let from_text = print_kernel(verify(&parsed.kernels[0]).expect("verifies").kernel());
    let from_builder = print_kernel(verify(&built).expect("verifies").kernel());
    assert_eq!(from_text, from_builder);
}

#[test]
fn builder_errors_quote_canonical_text() {
    let built =
        KernelBuilder::new("bad").input("x", Type::array(DType::F32, [8])).output("o", Type::array(DType::I32, [8])).body(|b| {
            let x = b.load("x");
            b.store("o", &x);
        });
    let err = verify(&built).expect_err("storing f32 into i32 is an error").to_string();
    assert!(err.contains("cannot store f32[8] into `o`"), "{err}");
    assert!(err.contains("| store o, %v0"), "the snippet quotes the statement: {err}");
}

#[test]
fn affine_prints_canonically() {
    let src = "kernel k\n  grid (i: 4, j: 4)\n  out o: f32[64, 64] block [4, 4] at (2*i + 1 - 1 + j - j + j, -i + 3*i)\n{\n}\n";
    let m = parse(src).expect("valid");
    let text = print_kernel(&m.kernels[0]);
    assert!(text.contains("at (2*i + j, 2*i)"), "{text}");
}

#[test]
fn body_may_open_on_the_last_header_line() {
    let a = parse("kernel k\n  out o: f32[4] {\n  %z = zeros : f32[4]\n  store o, %z\n}\n").expect("`{` ends the header line");
    let b = parse("kernel k\n  out o: f32[4]\n{\n  %z = zeros : f32[4]\n  store o, %z\n}\n").expect("`{` on its own line");
    assert_eq!(print_kernel(&a.kernels[0]), print_kernel(&b.kernels[0]));
}
