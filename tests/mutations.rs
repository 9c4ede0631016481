//! A bounded fuzz test in the normal suite: 10,000 mutations of the example kernels go through
//! parse, verify and every backend's lowering (wgpu's WGSL through naga's validator). None may panic, none may take a second, and every
//! error must carry `line:col`.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessel::{KernelLaunch, Runtime};

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
                let call = [KernelLaunch { kernel: k, mesh: None }];
                for backend in ["interpret", "mosaic-gpu", "wgpu"] {
                    // A refusal is fine; a panic is not (the boundary would report it as one).
                    match rt.lower(backend, &call, &[], &Default::default()) {
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
