//! A bounded fuzz test in the normal suite: 10,000 mutations of the example kernels go through
//! parse, verify and every backend's lowering (wgpu's WGSL through naga's validator). None may panic, none may take a second, and every
//! error must carry `line:col`.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessel::Runtime;

const FRAGMENTS: &[&str] = &[
    "%a",
    "%zz",
    "0",
    "-1",
    "1e40",
    "nan",
    "-inf",
    "true",
    "f32",
    "i32[4]",
    "bool",
    "f16[2, 2]",
    ":",
    ",",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "=",
    "*",
    "+",
    "-",
    "\n",
    " ",
    "load",
    "store",
    "add",
    "dot",
    "sum",
    "axis",
    "0",
    "keepdims",
    "when",
    "for",
    "iter",
    "yield",
    "step",
    "to",
    "block",
    "at",
    "grid",
    "seq",
    "dyn",
    "scratch",
    "in",
    "out",
    "ds(",
    "mask",
    "other",
    "transpose",
    "perm",
    "reshape",
    "broadcast",
    "cast",
    "bitcast",
    "iota",
    "full",
    "zeros",
    "select",
    "program_id",
    "num_programs",
    "kernel",
    "#",
    "trans_a",
    "99999999999999999999",
    "%",
    "@",
    "é",
];

fn mutate(rng: &mut ChaCha8Rng, text: &str) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for _ in 0..rng.random_range(1..4) {
        let at = rng.random_range(0..=s.len());
        match rng.random_range(0..6) {
            0 if !s.is_empty() => {
                let end = (at + rng.random_range(1..8)).min(s.len());
                s.drain(at.min(end)..end);
            }
            1 | 2 => {
                let frag = FRAGMENTS.choose(rng).expect("fragments");
                s.splice(at..at, frag.chars());
            }
            3 => {
                // Duplicate or drop a whole line.
                let lines: Vec<String> = s.iter().collect::<String>().lines().map(String::from).collect();
                if lines.len() > 2 {
                    let i = rng.random_range(0..lines.len());
                    let mut l2 = lines.clone();
                    if rng.random_bool(0.5) {
                        l2.insert(i, lines[i].clone());
                    } else {
                        l2.remove(i);
                    }
                    s = l2.join("\n").chars().collect();
                }
            }
            4 => {
                // Change a digit.
                let digits: Vec<usize> = s.iter().enumerate().filter(|(_, c)| c.is_ascii_digit()).map(|(i, _)| i).collect();
                if let Some(&i) = digits.choose(rng) {
                    s[i] = char::from(b'0' + rng.random_range(0..10u8));
                }
            }
            _ => {
                // Swap two characters.
                if s.len() > 1 {
                    let j = rng.random_range(0..s.len());
                    let i = at.min(s.len() - 1);
                    s.swap(i, j);
                }
            }
        }
    }
    s.into_iter().collect()
}

#[test]
fn ten_thousand_mutated_kernels_never_panic() {
    let rt = Runtime::new(&[]).expect("runtime");
    let mut sources = Vec::new();
    for dir in ["examples", "tests/in"] {
        for e in std::fs::read_dir(common::root().join(dir)).expect("dir") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "tk") {
                sources.push(std::fs::read_to_string(p).expect("read"));
            }
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0x7e55e1);
    let (mut parsed, mut verified, mut lowered) = (0, 0, 0);
    let mut slowest = Duration::ZERO;
    for case in 0..10_000 {
        let base = sources.choose(&mut rng).expect("sources");
        let text = mutate(&mut rng, base);
        // FUZZ_TRACE=1 prints each case before it runs: the last one printed is the one that hangs
        // or aborts (an abort cannot be caught, so it would otherwise go unnamed).
        if std::env::var("FUZZ_TRACE").is_ok() {
            eprintln!("CASE {case}\n{text}\nEND");
        }
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // Generic kernels: the template parse, the canonical text, and a specialization with
            // values that make sizes 0, negative, small or large.
            if let Ok(src) = tessel_plugin_api::ir::generic::Source::parse(&text) {
                for k in src.kernels() {
                    assert!(k.template_text().starts_with("kernel "), "case {case}: {}", k.template_text());
                    let pick = [1i64, 7, 64, 0, -1];
                    let values =
                        k.params().iter().enumerate().map(|(n, p)| (p.name.clone(), pick[(case + n) % pick.len()])).collect();
                    if let Err(d) = k.specialize(&values) {
                        let rendered = d.render("fuzz.tk", &text);
                        assert!(rendered.contains("fuzz.tk:"), "case {case}: an error without a position:\n{rendered}");
                    }
                }
            }
            let module = match tessel_plugin_api::ir::parse(&text) {
                Ok(m) => m,
                Err(d) => return Err(d.render("fuzz.tk", &text)),
            };
            parsed += 1;
            let kernels = tessel_plugin_api::ir::verify::verify_module(&module).map_err(|d| d.render("fuzz.tk", &text))?;
            verified += 1;
            for k in &kernels {
                let call = [tessel::Call::new(k.clone())];
                for backend in ["interpret", "mosaic-gpu", "wgpu"] {
                    // A refusal is fine; a panic is not (the boundary would report it as one).
                    match common::lowered(&rt, backend, &call) {
                        Err(e) => assert!(!e.to_string().contains("panicked"), "case {case}: {backend} panicked on\n{text}\n{e}"),
                        Ok(stages) => {
                            lowered += 1;
                            // Whatever wgpu lowers, naga accepts.
                            for (name, wgsl) in stages.iter().filter(|_| backend == "wgpu") {
                                let module = naga::front::wgsl::parse_str(wgsl).unwrap_or_else(|e| {
                                    panic!("case {case}: {name} does not parse:\n{}\n{text}", e.emit_to_string(wgsl))
                                });
                                naga::valid::Validator::new(
                                    naga::valid::ValidationFlags::all(),
                                    naga::valid::Capabilities::default(),
                                )
                                .validate(&module)
                                .unwrap_or_else(|e| {
                                    panic!("case {case}: naga rejects {name}:\n{}\n{text}", e.emit_to_string(wgsl))
                                });
                            }
                        }
                    }
                }
            }
            Ok(())
        }));
        let took = start.elapsed();
        slowest = slowest.max(took);
        match outcome {
            Err(_) => panic!("case {case} panicked on:\n{text}"),
            Ok(Err(rendered)) => {
                assert!(rendered.contains("fuzz.tk:"), "case {case}: an error without a position:\n{rendered}");
                let has_line_col = rendered.lines().filter(|l| l.contains(": error:")).all(|l| {
                    let pos = l.trim_start_matches("fuzz.tk:").split(':').take(2).collect::<Vec<_>>();
                    pos.len() == 2 && pos.iter().all(|p| p.parse::<usize>().is_ok())
                });
                assert!(has_line_col, "case {case}: errors carry line:col:\n{rendered}");
            }
            Ok(Ok(())) => {}
        }
        assert!(took < Duration::from_secs(1), "case {case} took {took:?}:\n{text}");
    }
    eprintln!("10000 mutants: {parsed} parsed, {verified} verified, {lowered} lowerings; slowest {slowest:?}");
    assert!(
        parsed > 500 && verified > 100,
        "the mutations should reach the verifier and the backends: {parsed} parsed, {verified} verified"
    );
}

/// A kernel whose store sits under `whens` nested `when`s inside `fors` nested one-trip `for`s,
/// each `for` adding 1 to what the one around it carries: program 0 stores `fors`, the others
/// nothing.
fn nested(fors: usize, whens: usize) -> String {
    let mut t = String::from("kernel deep\n  grid (i: 4)\n  out o: f32[4] block [1] at (i)\n{\n  %z = zeros : f32[1]\n");
    t += "  %p = program_id i\n  %c = eq %p, 0\n  %b = add %z, 0.0\n";
    let mut last = "%b".to_string();
    for d in 0..fors {
        t += &format!("  %r{d} = for %j{d} = 0 to 1 iter (%a{d} = {last}) {{\n  %b{d} = add %a{d}, 1.0\n");
        last = format!("%b{d}");
    }
    t += &"  when %c {\n".repeat(whens);
    t += &format!("  store o, {last}\n");
    t += &"  }\n".repeat(whens);
    for d in (0..fors).rev() {
        t += &format!("  yield %b{d}\n  }}\n");
    }
    t + "}\n"
}

/// A kernel whose grid size is `expr`.
fn sized(expr: &str) -> String {
    format!("kernel sized\n  grid (i: {expr})\n  out o: f32[4] block [1] at (i)\n{{\n  %z = zeros : f32[1]\n  store o, %z\n}}\n")
}

/// Deep nesting overflowed the stack (issue 38: 10,000 parentheses, 10,000 nested `when`, a
/// chain `1+1+...` of 100,000 terms and 3,000 nested `for` aborted the CLI and crashed Python):
/// the parser now stops at the limits (docs/language.md) with an error naming them, and a kernel
/// at the limits checks, lowers on every backend and runs right on those with a device.
#[test]
fn nesting_past_the_limits_is_an_error_and_at_the_limits_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(format!("{name}.tk"));
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let too_deep = [
        ("parentheses", sized(&format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000))), "more than 256 operators"),
        ("a chain", sized(&vec!["1"; 100_000].join("+")), "more than 256 operators"),
        ("whens", nested(0, 10_000), "this `when` is nested 65 deep, past the limit of 64"),
        ("fors", nested(3_000, 0), "this `for` is nested 65 deep, past the limit of 64"),
        ("both", nested(40, 40), "this `when` is nested 65 deep, past the limit of 64"),
        ("whens in fors", nested(64, 1), "this `when` is nested 65 deep, past the limit of 64"),
    ];
    for (what, text, says) in too_deep {
        let r = common::tessel(&["check", &file("deep", &text)]);
        assert_eq!(r.code, 1, "{what}: {}", r.stderr);
        assert!(r.stderr.contains(says) && r.stderr.contains("deep.tk:"), "{what}: {}", r.stderr);
    }
    // At the limits: 64 bodies deep (32 `for` around 32 `when`); 256 terms (100 parentheses,
    // 99 `+`, a `-`, 56 `*`).
    let at = file("at", &nested(32, 32));
    assert_eq!(common::tessel(&["check", &at]).code, 0);
    let chain = format!("{}{}{} - 96", "(".repeat(100), vec!["1"; 100].join("+"), ")".repeat(100));
    let r = common::tessel(&["check", &file("chain", &sized(&format!("{chain}{}", " * 1".repeat(56))))]);
    assert_eq!(r.code, 0, "256 terms: {}", r.stderr);
    let r = common::tessel(&["check", &file("chain", &sized(&format!("{chain}{}", " * 1".repeat(57))))]);
    assert!(r.code == 1 && r.stderr.contains("more than 256 operators"), "257 terms: {}", r.stderr);
    for backend in ["interpret", "wgpu", "mosaic-gpu"] {
        let r = common::tessel(&["lower", &at, "--backend", backend]);
        assert_eq!(r.code, 0, "{backend} lowers the kernel at the limits: {}", r.stderr);
    }
    for backend in ["interpret", "wgpu"] {
        if backend == "wgpu" && common::wgpu_adapter("nesting at the limits").is_none() {
            continue;
        }
        let out = dir.path().join(backend);
        let r = common::tessel(&["run", &at, "--backend", backend, "--out-dir", out.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{backend}: {}", r.stderr);
        assert_eq!(common::read_output(&out, "o").to_f64(), [32.0, 0.0, 0.0, 0.0], "{backend}");
    }
}
