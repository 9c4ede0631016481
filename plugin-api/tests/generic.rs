//! Generic kernels (language §9): binding, specialization, canonical text and their errors.

use std::collections::BTreeMap;

use tessel_plugin_api::ir::generic::{BindError, Source, ValueFrom};
use tessel_plugin_api::ir::print_kernel;

const SOFTMAX: &str = "\
# one kernel for every row count
kernel softmax[N, D, BM = 16 in (8, 16, 32, 64)]
  grid (i: cdiv(N, BM))
  in  x: f32[N, D] block [BM, D] at (i, 0)
  out o: f32[N, D] block [BM, D] at (i, 0)
{
  %x = load x
  %m = max %x axis 1 keepdims
  %d = sub %x, %m
  %e = exp %d
  %s = sum %e axis 1 keepdims
  %r = div %e, %s
  store o, %r
}
";

fn shapes(list: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
    list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
}

fn values(list: &[(&str, i64)]) -> BTreeMap<String, i64> {
    list.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

#[test]
fn shape_parameters_bind_from_inputs_and_specialize() {
    let src = Source::parse(SOFTMAX).unwrap_or_else(|e| panic!("{}", e.render("softmax.tk", SOFTMAX)));
    let k = &src.kernels()[0];
    assert!(k.is_generic());
    let b = k.bind(&BTreeMap::new(), &BTreeMap::new(), &shapes(&[("x", &[1000, 256])])).expect("binds");
    assert_eq!(b.values, values(&[("N", 1000), ("D", 256), ("BM", 16)]));
    assert_eq!(b.from["N"], ValueFrom::Input { array: "x".into(), dim: 0 });
    assert_eq!(b.from["BM"], ValueFrom::Default);
    let v = src.specialize(k, &b.values).unwrap_or_else(|e| panic!("{}", e.render("softmax.tk", SOFTMAX)));
    let text = print_kernel(v.kernel());
    // cdiv(1000, 16) = 63 programs, computed by hand.
    assert!(text.contains("grid (i: 63)"), "{text}");
    assert!(text.contains("in  x: f32[1000, 256] block [16, 256] at (i, 0)"), "{text}");
    assert!(text.contains("%m = max %x axis 1 keepdims : f32[16, 1]"), "{text}");
}

#[test]
fn canonical_generic_text_keeps_parameters_and_is_a_fixed_point() {
    let src = Source::parse(SOFTMAX).unwrap();
    let text = src.kernels()[0].template_text().to_string();
    assert!(text.starts_with("kernel softmax[N, D, BM = 16 in (8, 16, 32, 64)]\n  grid (i: cdiv(N, BM))\n"), "{text}");
    assert!(text.contains("  in  x: f32[N, D] block [BM, D] at (i, 0)\n"), "{text}");
    let again = Source::parse(&text).unwrap();
    assert_eq!(again.kernels()[0].template_text(), text);
}

fn bind_err(src: &str, given: &[(&str, i64)], inputs: &[(&str, &[usize])]) -> BindError {
    let s = Source::parse(src).unwrap_or_else(|e| panic!("{}", e.render("k.tk", src)));
    s.kernels()[0].bind(&values(given), &BTreeMap::new(), &shapes(inputs)).expect_err("should not bind")
}

const ADD2: &str = "\
kernel add2[N, B = 128]
  grid (i: cdiv(N, B))
  in  x: f32[N] block [B] at (i)
  in  y: f32[N] block [B] at (i)
  out o: f32[N] block [B] at (i)
{
  %a = load x
  %b = load y
  %c = add %a, %b
  store o, %c
}
";

#[test]
fn binding_errors_name_the_parameter_and_the_values() {
    let e = bind_err(ADD2, &[], &[("x", &[4096]), ("y", &[1000])]).to_string();
    assert_eq!(
        e,
        "inputs of kernel `add2` disagree on parameter `N`: `x` says N = 4096 (its dimension 0), `y` says N = 1000 (its dimension 0)\n  give arrays whose shapes agree on N"
    );
    let e = bind_err(ADD2, &[("N", 10)], &[("x", &[12])]).to_string();
    assert!(e.starts_with("parameter `N` of kernel `add2` is given as 10, but input `x` says N = 12"), "{e}");
    let e = bind_err(ADD2, &[("Q", 1)], &[]).to_string();
    assert_eq!(e, "kernel `add2` has no parameter `Q`\n  its parameters are: N, B");
    let e = bind_err(ADD2, &[], &[]).to_string();
    assert_eq!(
        e,
        "kernel `add2` needs a value for parameter `N`\n  give an input `x` (dimension 0) or `y` (dimension 0) or `--param N=V`"
    );
    // An input of another rank gives nothing; the launch's type check reports it.
    assert!(matches!(bind_err(ADD2, &[], &[("x", &[4, 4])]), BindError::Unbound { .. }));
}

fn specialize_err(src: &str, given: &[(&str, i64)]) -> String {
    let s = Source::parse(src).unwrap_or_else(|e| panic!("{}", e.render("k.tk", src)));
    let k = &s.kernels()[0];
    let b = k.bind(&values(given), &BTreeMap::new(), &BTreeMap::new()).expect("binds");
    s.specialize(k, &b.values).expect_err("should not specialize").render("k.tk", src)
}

#[test]
fn sizes_that_come_out_wrong_point_at_the_generic_line() {
    let e = specialize_err(ADD2, &[("N", 1000), ("B", 0)]);
    assert!(e.contains("k.tk:2:12: error: `cdiv(N, B)`: divides by `B`, which is 0 (kernel `add2` with N = 1000, B = 0)"), "{e}");
    let e = specialize_err(ADD2, &[("N", -3)]);
    assert!(
        e.contains("k.tk:3:14: error: `N` is -3, but a dimension must be at least 1 (kernel `add2` with N = -3, B = 128)"),
        "{e}"
    );
    // The verifier's own errors carry the values too: a block past the backends' limit is fine
    // for the verifier, a rank mismatch is not.
    let bad = ADD2.replace("block [B] at (i)\n  out", "block [B, B] at (i, 0)\n  out");
    let e = specialize_err(&bad, &[("N", 64)]);
    assert!(e.contains("(kernel `add2` with N = 64, B = 128)"), "{e}");
}

#[test]
fn malformed_parameters_are_syntax_errors() {
    let cases = [
        ("kernel k[N, N]\n{\n}\n", "parameter `N` is declared twice"),
        ("kernel k[min]\n{\n}\n", "`min` cannot name a parameter"),
        ("kernel k[N = M]\n{\n}\n", "unexpected `M` in a default value"),
        ("kernel k[x]\n  in x: f32[4]\n{\n}\n", "parameter `x` has the name of an argument"),
        ("kernel k[i = 2]\n  grid (i: 4)\n{\n}\n", "parameter `i` has the name of a grid axis"),
        ("kernel k\n  in x: f32[N]\n{\n}\n", "unknown size `N`"),
        ("kernel k[N = 8]\n  grid (i: 2)\n  in x: f32[N] block [4] at (t[i] / 2)\n{\n}\n", "reads `t`, which is not an argument"),
    ];
    for (src, want) in cases {
        let e = Source::parse(src).err().map(|d| d.render("k.tk", src)).unwrap_or_else(|| {
            let s = Source::parse(src).unwrap();
            s.specialize(&s.kernels()[0], &values(&[("N", 8)])).expect_err(src).render("k.tk", src)
        });
        assert!(e.contains(want), "{src}\n{e}");
    }
}

#[test]
fn a_kernel_without_parameters_may_still_compute_its_sizes() {
    let src = "kernel k\n  grid (i: cdiv(1000, 128))\n  in x: f32[1000] block [128] at (i)\n  out o: f32[1000] block [128] at (i)\n{\n  %x = load x\n  %y = mul %x, 2*3\n  store o, %y\n}\n";
    let m = tessel_plugin_api::ir::parse(src).expect("parses");
    let text = print_kernel(&m.kernels[0]);
    assert!(text.contains("grid (i: 8)") && text.contains("mul %x, 6"), "{text}");
}

mod roundtrip {
    use proptest::prelude::*;

    use super::*;

    /// A size expression over `N`, `B` and small integers, written with arbitrary spacing and
    /// parentheses.
    fn expr() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![(0i64..20).prop_map(|v| v.to_string()), Just("N".to_string()), Just("B".to_string())];
        leaf.prop_recursive(3, 12, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone(), 0..5usize, any::<bool>()).prop_map(|(a, b, op, paren)| {
                    let s = format!("{a}{}{b}", [" + ", "-", "*", " / ", " % "][op]);
                    if paren { format!("({s})") } else { s }
                }),
                (inner.clone(), inner.clone(), 0..9usize)
                    .prop_map(|(a, b, f)| format!("{}({a},{b})", ["cdiv", "min", "max", "eq", "ne", "lt", "le", "gt", "ge"][f])),
                (inner.clone(), inner.clone(), inner).prop_map(|(c, a, b)| format!("select({c}, {a},{b})")),
            ]
        })
    }

    fn kernel(e: &[String]) -> String {
        format!(
            "kernel g[N = 40, B = 8 in (2, 4, 8)]\n  grid (i: {})\n  in x: f32[{}] block [{}] at (({})*i + {})\n  in y: f32[{}] block [{}] at (select(lt(i, {}), i, {}) / {})\n  out o: f32[{}] block [{}] at (i)\n{{\n  %x = load x[ds({}, {})]\n  %y = add %x, {}\n  store o[ds(0, {})], %y\n}}\n",
            e[0], e[1], e[2], e[3], e[4], e[1], e[2], e[5], e[4], e[3], e[1], e[2], e[5], e[6], e[7], e[6]
        )
    }

    /// The outcome of specializing: the canonical text, or how many errors (their messages
    /// quote the expressions as each text writes them).
    fn outcome(text: &str, vals: &BTreeMap<String, i64>) -> Result<String, usize> {
        let s = Source::parse(text).map_err(|d| d.0.len())?;
        s.specialize(&s.kernels()[0], vals).map(|v| print_kernel(v.kernel())).map_err(|d| d.0.len())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The canonical text of a generic kernel is a fixed point, and it means what the text
        /// it came from means: both specialize to the same kernel (or the same errors).
        #[test]
        fn generic_canonical_text_is_stable_and_means_the_same(e in prop::collection::vec(expr(), 8), n in 1i64..100, b in 0i64..9) {
            let text = kernel(&e);
            // A size without parameters is computed while parsing: one that is 0 is an error then.
            let src = Source::parse(&text);
            prop_assume!(src.is_ok());
            let src = src.expect("assumed");
            let printed = src.kernels()[0].template_text().to_string();
            let again = Source::parse(&printed).unwrap_or_else(|d| panic!("{}\n{printed}", d.render("g.tk", &printed)));
            prop_assert_eq!(again.kernels()[0].template_text(), printed.as_str());
            for vals in [values(&[("N", 40), ("B", 8)]), values(&[("N", n), ("B", b)])] {
                prop_assert_eq!(outcome(&text, &vals), outcome(&printed, &vals), "{}\n{}", text, printed);
            }
        }
    }
}
