//! Loop iterations per invocation, for adapters that bound them.
//!
//! Mesa's llvmpipe (lavapipe on Vulkan, llvmpipe on GL) gives each shader invocation one budget
//! of 65,535 loop iterations, shared by every loop it runs; once spent, every loop leaves after
//! its current iteration, silently. A kernel that needs more would return a wrong answer, so the
//! plan refuses what it can count before the launch (this file) and the module carries a check
//! for the rest (`emit/`: a loop that must run twice, run last; `runtime.rs` reads its verdict).
//!
//! A loop of `n` trips enters its body `n + 1` times (the last entry finds the condition false
//! and leaves), and each entry after the first spends one of the budget: measured on lavapipe,
//! a `for` of 65,532 trips (65,533 entries) passes the module's check and one of 65,533 trips
//! fails it.

use tessel_plugin_api::ir::analysis::visit;
use tessel_plugin_api::ir::{ForLoop, Literal, Op, Operand, Stmt};

/// Loop entries that one pass through `body` makes, counting only `for` loops whose bounds are
/// literals (the others are left to the check in the module): a `when` body counts as if it ran.
/// Saturates at `u64::MAX`.
pub(super) fn body_iterations(body: &[Stmt]) -> u64 {
    body.iter().fold(0u64, |n, s| {
        n.saturating_add(match &s.op {
            Op::When { body, .. } => body_iterations(body),
            Op::For(f) => trips(f).map_or(0, |t| looped(t, body_iterations(&f.body))),
            // One branch runs: the dearer.
            Op::If(i) => body_iterations(&i.then).max(body_iterations(&i.els)),
            _ => 0,
        })
    })
}

/// Whether a module cannot spend `room` loop entries, so that it needs no check: the kernel has
/// no loop of its own (no `for`; the caller knows it has one `seq` step and walks no programs)
/// and no `dot` or reduction (whose loops the writer makes), and each statement's loop over the
/// invocation's `slots` elements, entered at most `slots + 1` times, keeps the sum within it.
/// Elementwise kernels (`add`, a fused chain) are so, and skip the check's cost.
pub(super) fn straight(body: &[Stmt], slots: u64, room: u64) -> bool {
    let mut statements = 0u64;
    let mut looped = false;
    visit(body, &mut |s| {
        statements += 1;
        looped |= matches!(s.op, Op::For(_) | Op::Dot { .. } | Op::Reduce { .. });
    });
    !looped && statements.saturating_mul(slots.saturating_add(1)) <= room
}

/// The trip count of a `for` with literal bounds.
fn trips(f: &ForLoop) -> Option<u64> {
    // `while %c` may stop early: what it spends is the module's check's to see.
    if f.cond.is_some() {
        return None;
    }
    let int = |o: &Operand| match o {
        Operand::Lit(Literal::Int(v)) => Some(*v),
        _ => None,
    };
    let (lo, hi) = (int(&f.lo)?, int(&f.hi)?);
    let step = f.step.as_ref().map_or(Some(1), int)?;
    (step > 0).then(|| if hi > lo { (hi.abs_diff(lo)).div_ceil(step as u64) } else { 0 })
}

/// The loop entries a kernel may make in one invocation under a driver's `budget`: the last
/// two are the module's own check's (measured: 65,533 under llvmpipe's 65,535).
pub(crate) fn room(budget: u64) -> u64 {
    budget.saturating_sub(2)
}

/// The entries of a loop of `trips` whose body makes `inner` entries each time.
fn looped(trips: u64, inner: u64) -> u64 {
    trips.saturating_mul(inner).saturating_add(trips).saturating_add(1)
}

/// Loop entries one invocation makes: `walked` programs in turn where it walks them (a loop),
/// else one; each of `steps` `seq` steps (a loop where more than one), each running the body once.
pub(super) fn per_invocation(body: &[Stmt], walked: Option<u64>, steps: u64) -> u64 {
    let body = body_iterations(body);
    let program = if steps > 1 { looped(steps, body) } else { body };
    walked.map_or(program, |p| looped(p, program))
}

#[cfg(test)]
mod tests {
    use tessel_plugin_api::ir::parse::parse;

    use super::*;

    fn body(text: &str) -> Vec<Stmt> {
        parse(text).expect("parses").kernels.remove(0).body
    }

    #[test]
    fn nested_literal_loops_multiply_and_dynamic_ones_count_nothing() {
        // A loop of n trips: n + 1 entries; nested, each trip of the outer adds the inner's.
        let b = body(
            "kernel k
  grid (i: 4)
  out o: f32[4] block [1] at (i)
{
  %z = zeros : f32[1]
  %r = for %j = 0 to 300 iter (%a = %z) {
    %s = for %k = 0 to 300 step 2 iter (%c = %a) {
      yield %c
    }
    yield %s
  }
  %p = program_id i
  %t = for %j = 0 to %p iter (%a = %r) {
    yield %a
  }
  store o, %t
}
",
        );
        let inner = 150 + 1;
        let outer = 300 * (1 + inner) + 1;
        assert_eq!(body_iterations(&b), outer);
        assert_eq!(per_invocation(&b, None, 1), outer);
        assert_eq!(per_invocation(&b, None, 70_000), 70_000 * (1 + outer) + 1);
        assert_eq!(per_invocation(&b, Some(3), 1), 3 * (1 + outer) + 1);
        assert_eq!(per_invocation(&[], None, 70_000), 70_001);
        assert!(!straight(&b, 1, 65_533), "a kernel with loops is checked");
        let add = body(
            "kernel add\n  grid (i: 4)\n  in  x: f32[4096] block [1024] at (i)\n  out o: f32[4096] block [1024] at (i)\n{\n  %x = load x\n  %y = add %x, 1.0\n  store o, %y\n}\n",
        );
        assert!(straight(&add, 16, 65_533));
        assert!(!straight(&add, 30_000, 65_533), "3 statements of 30,001 entries each");
    }
}
