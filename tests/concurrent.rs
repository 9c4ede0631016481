//! The concurrent model (docs/language.md, "Threads, barriers and asynchronous operations"):
//! kernels of `tests/concurrent/` run on the interpreter equal to products computed here in
//! `f64`; mutations of them (a wait removed, a stage handed back before its product is waited
//! for, a barrier that can never complete, a store not fenced before a copy reads it, two
//! threads writing one element) are each refused with the statements named; wgpu runs them made
//! synchronous, several threads per program scheduled as one (`ir::schedule`, whose kernel the
//! interpreter runs too, to the same results), and refuses threads through `seq` steps; Mosaic
//! GPU refuses the model by name.

mod common;

use common::{root, wgpu_adapter};
use tessel::{HostArray, LaunchArgs};
use tessel_plugin_api::array::ArrayData;

fn source(name: &str) -> String {
    std::fs::read_to_string(root().join("tests/concurrent").join(name)).expect("a kernel of tests/concurrent")
}

/// Inputs whose products are exact in `f32`: small integers over 8.
fn matrix(rows: usize, cols: usize, seed: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| ((i * 7 + seed * 13) % 11) as f32 / 8.0 - 0.5).collect()
}

fn product(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
    (0..m * n).map(|e| (0..k).map(|l| f64::from(a[e / n * k + l]) * f64::from(b[l * n + e % n])).sum()).collect()
}

fn array(shape: &[usize], v: Vec<f32>) -> HostArray {
    HostArray { shape: shape.to_vec(), data: ArrayData::F32(v) }
}

/// Runs the kernel `text` on `backend` with `inputs`; its first output, or the error's text.
fn run(backend: &str, text: &str, inputs: Vec<(&str, HostArray)>) -> Result<Vec<f32>, String> {
    Ok(run_all(backend, text, inputs)?.remove(0))
}

/// Runs the kernel `text` on `backend` with `inputs`; its outputs in order, or the error's text.
fn run_all(backend: &str, text: &str, inputs: Vec<(&str, HostArray)>) -> Result<Vec<Vec<f32>>, String> {
    let kernels = tessel::load_source("concurrent.tk", text).map_err(|e| e.to_string())?;
    let args = LaunchArgs { inputs: inputs.into_iter().map(|(n, a)| (n.to_string(), a)).collect(), grid: Default::default() };
    let outs = tessel::run_kernel(backend, &kernels[0], &args).map_err(|e| e.to_string())?;
    Ok(outs
        .into_iter()
        .map(|(_, a)| match a.data {
            ArrayData::F32(v) => v,
            other => panic!("an f32 output, not {other:?}"),
        })
        .collect())
}

/// The kernel `text` as wgpu runs it: its threads scheduled as one, its asynchronous
/// statements made synchronous (`ir::synchronous`), printed.
fn as_one_thread(text: &str) -> String {
    use tessel_plugin_api::ir;
    let module = ir::parse(text).unwrap_or_else(|d| panic!("{d}"));
    let v = ir::verify(&module.kernels[0]).unwrap_or_else(|d| panic!("{d}"));
    let one = ir::synchronous::synchronous(&v).unwrap_or_else(|u| panic!("not scheduled: {u:?}"));
    let k = one.kernel();
    assert!(!k.is_concurrent() || k.grid.iter().flatten().all(|a| !a.thread || a.size == ir::AxisSize::Fixed(1)), "{k:?}");
    ir::print_kernel(k)
}

fn assert_equal(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}: element {i} is {g}, numpy-style product says {w}");
    }
}

fn pipeline_inputs() -> (Vec<(&'static str, HostArray)>, Vec<f64>) {
    let (a, b) = (matrix(64, 32, 1), matrix(32, 48, 2));
    let want = product(&a, &b, (64, 32, 48));
    (vec![("a", array(&[64, 32], a)), ("b", array(&[32, 48], b))], want)
}

#[test]
fn a_warp_specialized_pipeline_of_three_threads_multiplies_on_the_interpreter() {
    let (inputs, want) = pipeline_inputs();
    let got = run("interpret", &source("pipeline_matmul.tk"), inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_equal("pipeline_matmul on interpret", &got, &want);
}

fn epilogue_inputs() -> (Vec<(&'static str, HostArray)>, Vec<f64>) {
    let (x, w) = (matrix(32, 16, 3), matrix(16, 8, 4));
    let want = product(&x, &w, (32, 16, 8)).into_iter().map(|v| v.max(0.0) + 1.0).collect();
    (vec![("x", array(&[32, 16], x)), ("w", array(&[16, 8], w))], want)
}

#[test]
fn a_staged_epilogue_of_one_thread_runs_on_the_interpreter_and_on_wgpu_made_synchronous() {
    let text = source("staged_epilogue.tk");
    let (inputs, want) = epilogue_inputs();
    let got = run("interpret", &text, inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_equal("staged_epilogue on interpret", &got, &want);
    if wgpu_adapter("staged_epilogue on wgpu").is_some() {
        let (inputs, _) = epilogue_inputs();
        let got = run("wgpu", &text, inputs).unwrap_or_else(|e| panic!("{e}"));
        assert_equal("staged_epilogue on wgpu", &got, &want);
    }
}

#[test]
fn the_pipeline_scheduled_as_one_thread_multiplies_on_the_interpreter_and_on_wgpu() {
    let one = as_one_thread(&source("pipeline_matmul.tk"));
    assert!(one.contains("  grid (wg: 1 thread)\n"), "the thread axis keeps its name with one point:\n{one}");
    for line in one.lines().map(str::trim_start) {
        for absent in ["barrier ", "wait ", "arrive ", "copy_async ", "mma_async "] {
            assert!(!line.starts_with(absent), "`{line}` is left in the scheduled kernel:\n{one}");
        }
    }
    let (inputs, want) = pipeline_inputs();
    assert_equal(
        "pipeline_matmul scheduled, on interpret",
        &run("interpret", &one, inputs).unwrap_or_else(|e| panic!("{e}\n{one}")),
        &want,
    );
    if wgpu_adapter("pipeline_matmul on wgpu").is_some() {
        let (inputs, _) = pipeline_inputs();
        let got = run("wgpu", &source("pipeline_matmul.tk"), inputs).unwrap_or_else(|e| panic!("{e}"));
        assert_equal("pipeline_matmul on wgpu", &got, &want);
    }
}

#[test]
fn a_handoff_through_if_results_and_a_while_loop_keeps_its_values_across_waits_on_every_backend() {
    let x = matrix(4, 16, 5);
    let twice: Vec<f64> = x.iter().map(|v| 2.0 * f64::from(*v)).collect();
    let total: Vec<f64> = (0..16).map(|c| (0..4).map(|r| twice[r * 16 + c]).sum()).collect();
    let text = source("handoff.tk");
    // The consumer's loop stepping by a value (`%wg` is 1 there): the schedule's loop head
    // tests the step as the language does (a step that is not positive runs no trip).
    let stepped = mutated("handoff.tk", "for %j = 0 to 4 iter", "for %j = 0 to 4 step %wg iter");
    let mut runs = vec![
        ("interpret", text.clone()),
        ("interpret, scheduled", as_one_thread(&text)),
        ("interpret, scheduled, stepped by a value", as_one_thread(&stepped)),
    ];
    if wgpu_adapter("handoff on wgpu").is_some() {
        runs.push(("wgpu", text.clone()));
    }
    for (what, text) in runs {
        let backend = what.split(',').next().expect("a backend");
        let got =
            run_all(backend, &text, vec![("x", array(&[4, 16], x.clone()))]).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
        assert_equal(&format!("o of handoff on {what}"), &got[0], &twice);
        assert_equal(&format!("total of handoff on {what}"), &got[1], &total);
    }
}

#[test]
fn wgpu_refuses_threads_through_seq_steps() {
    let text = mutated("pipeline_matmul.tk", "grid (wg: 3 thread)", "grid (s: 2 seq, wg: 3 thread)");
    let (inputs, _) = pipeline_inputs();
    let e = run("wgpu", &text, inputs).expect_err("wgpu does not schedule threads through seq steps");
    assert!(e.contains("runs 3 threads per program each through the steps of `seq` axis `s` at its own pace"), "{e}");
}

/// `file` with `from` replaced by `to` (once), which must be there.
fn mutated(file: &str, from: &str, to: &str) -> String {
    let text = source(file);
    assert!(text.contains(from), "{file} has `{from}`");
    text.replacen(from, to, 1)
}

#[test]
fn mutations_of_the_pipeline_are_each_refused_naming_the_statements() {
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "the consumers' wait for a stage removed",
            "      wait full[%stage]\n",
            "",
            &["has a data race on `as`", "mma_async acc[%wg, :, :], as[%stage", "copy_async as[%slot, :, :]"],
        ),
        (
            "a stage handed back before its product is waited for",
            "      mma_wait 0\n      arrive empty[%stage]",
            "      arrive empty[%stage]\n      mma_wait 0",
            &["has a data race on `as`", "the asynchronous mma issued by thread wg=", "wait for the mma (`mma_wait N`)"],
        ),
        (
            "the producer's wait for a handed-back stage removed",
            "        wait empty[%slot]\n",
            "",
            &["has a data race on `as`", "the asynchronous copy issued by thread wg=2 at `copy_async as[%slot, :, :]"],
        ),
        (
            "a barrier that needs an arrival no thread makes",
            "barrier empty[2] arrivals 2",
            "barrier empty[2] arrivals 3",
            &[
                "deadlocks",
                "thread wg=2 waits at `wait empty[%slot]`",
                "phase 1 of empty[0], which has completed 0 (2 of 3 arrivals",
            ],
        ),
        (
            "a store into a stage with no fence before a copy writes it",
            "      %col = mul %k, 8\n",
            "      %col = mul %k, 8\n      %zz = zeros : f32[64, 8]\n      store as[%slot, :, :], %zz\n",
            &[
                "writes `as` [0, 0, 0] asynchronously at `copy_async as[%slot, :, :]",
                "after thread wg=2 stored it with no `fence` between",
            ],
        ),
        (
            "two consumers writing the same rows of the output",
            "    store o[ds(%row, 32), :], %r",
            "    store o[ds(0, 32), :], %r",
            &["has a data race on `o` [0, 0]", "store o[ds(0, 32), :], %r", "order the two accesses through a barrier"],
        ),
    ];
    for (what, from, to, says) in cases {
        let (inputs, _) = pipeline_inputs();
        let e = run("interpret", &mutated("pipeline_matmul.tk", from, to), inputs).expect_err(what);
        for s in says {
            assert!(e.contains(s), "{what}: the error should say `{s}`:\n{e}");
        }
        assert_eq!(e.lines().count(), 2, "{what}: one line of fact, one of what would work:\n{e}");
    }
}

#[test]
fn a_store_copied_out_without_a_fence_is_refused_and_with_one_runs() {
    let (inputs, _) = epilogue_inputs();
    let e = run("interpret", &mutated("staged_epilogue.tk", "  fence\n", ""), inputs).expect_err("no fence");
    assert!(e.contains("reads `ys` [0, 0] asynchronously at `copy_async o[ds(%row, 16), :], ys`"), "{e}");
    assert!(e.contains("with no `fence` between: the asynchronous read may not see the store"), "{e}");
    let (inputs, _) = epilogue_inputs();
    let e = run("interpret", &mutated("staged_epilogue.tk", "  wait landed[0]\n", ""), inputs).expect_err("no wait");
    assert!(e.contains("has a data race on `xs`") && e.contains("wait landed[0]"), "{e}");
    let (inputs, _) = epilogue_inputs();
    let e = run("interpret", &mutated("staged_epilogue.tk", "  mma_wait 0\n", ""), inputs).expect_err("no mma_wait");
    assert!(e.contains("has a data race on `acc`") && e.contains("`%acc = load acc"), "{e}");
}

#[test]
fn a_barrier_completed_twice_ahead_of_a_thread_that_waits_on_it_is_refused() {
    // Thread 1 arrives twice on a barrier of one arrival before thread 0, which waited for its
    // first phase, waits for the second: a hardware barrier's phase parity would hide one.
    let text = "kernel k\n  grid (t: 2 thread)\n  out o: f32[4]\n  barrier b[1] arrivals 1\n  barrier go[1] arrivals 1\n  barrier done[1] arrivals 1\n{\n  %t = program_id t\n  %first = eq %t, 0\n  if %first {\n    wait b[0]\n    arrive go[0]\n    wait done[0]\n    wait b[0]\n  } else {\n    arrive b[0]\n    wait go[0]\n    arrive b[0]\n    arrive b[0]\n    arrive done[0]\n  }\n}\n";
    let e = run("interpret", text, Vec::new()).expect_err("a phase overrun");
    assert!(e.contains("lets b[0] complete phase 3 at `wait b[0]`") && e.contains("while thread t=0 waits for phase 2"), "{e}");
}

#[test]
fn a_barrier_index_past_its_array_is_refused_not_taken_from_the_next_array() {
    // `full[2]` of an array of 2 would be `empty[0]` if barriers were one flat array.
    let (inputs, _) = pipeline_inputs();
    let text =
        mutated("pipeline_matmul.tk", "      arrive empty[%stage]", "      %past = add %stage, 2\n      arrive empty[%past]");
    let e = run("interpret", &text, inputs).expect_err("an index past the array");
    assert!(e.contains("indexes barrier 2 of an array of 2 at `arrive empty[%past]`"), "{e}");
    let e = tessel::load_source("k.tk", &mutated("staged_epilogue.tk", "  wait landed[0]", "  wait landed[1]"))
        .expect_err("a literal past the array");
    assert!(e.to_string().contains("barrier 1 of `landed`, which has 1 barriers"), "{e}");
}

#[test]
fn two_copies_of_one_statement_in_a_loop_are_not_taken_for_one() {
    // Each trip copies the previous trip's destination: the copy of trip k + 1 reads what the
    // copy of trip k may still be writing, with no wait between.
    let text = "kernel k\n  in  x: f32[8]\n  out o: f32[8]\n  scratch s: f32[4, 8]\n  barrier b[1] arrivals 3\n{\n  copy_async s[0, :], x arrive b[0]\n  for %k = 0 to 2 {\n    %n = add %k, 1\n    copy_async s[%n, :], s[%k, :] arrive b[0]\n  }\n  wait b[0]\n  %v = load s[2, :]\n  store o, %v\n}\n";
    let x = array(&[8], (0..8).map(|i| i as f32).collect());
    let e = run("interpret", text, vec![("x", x)]).expect_err("a copy reading a copy in flight");
    assert!(e.contains("has a data race on `s`"), "{e}");
}

#[test]
fn a_product_with_its_left_operand_in_registers_runs_on_the_interpreter_and_on_wgpu() {
    // `mma_async acc, %x, ws`: the left operand a value, read where the product is issued.
    let text = mutated("staged_epilogue.tk", "  mma_async acc, xs, ws\n", "  %x = load xs\n  mma_async acc, %x, ws\n");
    let (inputs, want) = epilogue_inputs();
    assert_equal("a register operand on interpret", &run("interpret", &text, inputs).unwrap_or_else(|e| panic!("{e}")), &want);
    if wgpu_adapter("a register operand on wgpu").is_some() {
        let (inputs, _) = epilogue_inputs();
        assert_equal("a register operand on wgpu", &run("wgpu", &text, inputs).unwrap_or_else(|e| panic!("{e}")), &want);
    }
    let printed = tessel::load_source("k.tk", &text).unwrap_or_else(|e| panic!("{e}"))[0].text().to_string();
    assert!(printed.contains("mma_async acc, %x, ws\n"), "{printed}");
}

#[test]
fn the_concurrent_statements_print_as_they_parse() {
    for file in ["pipeline_matmul.tk", "staged_epilogue.tk"] {
        let k = &tessel::load_source(file, &source(file)).unwrap_or_else(|e| panic!("{e}"))[0];
        let text = k.text().to_string();
        let again = &tessel::load_source(file, &text).unwrap_or_else(|e| panic!("{file} printed:\n{text}\n{e}"))[0];
        assert_eq!(again.text(), text, "{file}: print(parse(print(k))) == print(k)");
        assert!(text.contains("barrier full[2] arrivals 2") || text.contains("barrier landed[1] arrivals 2"), "{text}");
    }
}

#[test]
fn the_verifier_names_what_is_wrong_with_a_concurrent_statement() {
    let base = source("staged_epilogue.tk");
    let cases = [
        ("  wait landed[0]\n", "  wait gone[0]\n", "unknown barrier `gone`"),
        (
            "  copy_async ws, w arrive landed[0]\n",
            "  copy_async ws, x arrive landed[0]\n",
            "`copy_async` copies f32[32, 16] of `x` into f32[16, 8] of `ws`",
        ),
        ("  mma_async acc, xs, ws\n", "  mma_async acc, ws, xs\n", "`mma_async` of f32[16, 8] and f32[16, 16] into f32[16, 8]"),
        (
            "  copy_async xs, x[ds(%row, 16), :] arrive landed[0]\n",
            "  copy_async x, xs arrive landed[0]\n",
            "cannot write input `x`",
        ),
        (
            "  grid (i: 2)\n",
            "  grid (i: 2, t: 2 thread)\n  in  y: f32[4] block [2] at (t)\n",
            "`at (...)` of `y` uses thread axis `t`",
        ),
        ("  barrier landed[1] arrivals 2\n", "  barrier landed[0] arrivals 2\n", "barrier `landed` has 0 barriers of 2 arrivals"),
        ("  mma_async acc, xs, ws\n", "  max_registers 250 increase\n  mma_async acc, xs, ws\n", "`max_registers 250`"),
        ("  mma_async acc, xs, ws\n", "  max_registers 40 more\n  mma_async acc, xs, ws\n", "`increase` or `decrease`"),
    ];
    for (from, to, says) in cases {
        assert!(base.contains(from), "the kernel has `{from}`");
        let e = tessel::load_source("k.tk", &base.replacen(from, to, 1)).expect_err(says).to_string();
        assert!(e.contains(says), "should say `{says}`:\n{e}");
    }
}
