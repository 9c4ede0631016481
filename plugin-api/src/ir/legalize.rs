//! Rewrites of a verified kernel into the forms every backend writes, applied by
//! [`crate::backend::verify_with_mesh`] and again (a scan, where there is nothing to rewrite) by
//! each backend's own lowering entry, which tests and benches call without it ([`for_backend`]):
//!
//! - a batched `dot` (operands with the same leading dimensions, docs/language.md §3) becomes one
//!   2-D `dot` per batch element, each on its operands' `slice`s, the products `concatenate`d and
//!   reshaped back to the batch dimensions;
//! - `tile` becomes, along each dimension it copies, a `reshape` that puts a dimension of 1
//!   before it, a `broadcast` of that to the copies, and a `reshape` that merges the two;
//!   `repeat` the same with the new dimension after the one it copies.
//!
//! The result keeps its name, so nothing after it changes.

use std::borrow::Cow;
use std::collections::HashSet;

use super::*;

/// `v` with every batched `dot`, `tile` and `repeat` rewritten; `v` itself where it has none.
/// An error is this module's bug: the rewritten kernel did not verify (the diagnostics say where).
pub fn legalize(v: Verified) -> Result<Verified, Diagnostics> {
    Ok(match legalized(&v)? {
        Cow::Borrowed(_) => v,
        Cow::Owned(w) => w,
    })
}

/// [`legalize`] of a borrowed kernel: borrowed back where it has nothing to rewrite.
pub fn legalized(v: &Verified) -> Result<Cow<'_, Verified>, Diagnostics> {
    let mut any = false;
    analysis::visit(&v.kernel().body, &mut |s| any |= rewritten(s));
    if !any {
        return Ok(Cow::Borrowed(v));
    }
    let mut kernel = v.kernel().clone();
    let mut names = Names::new(v);
    kernel.body = rewrite(std::mem::take(&mut kernel.body), &mut names);
    verify::verify_derived(&kernel).map(Cow::Owned)
}

/// [`legalized`] for a backend's lowering entry, which the verifier has made infallible: a
/// rewrite that does not verify is this module's bug, and panics naming the kernel.
pub fn for_backend(v: &Verified) -> Cow<'_, Verified> {
    legalized(v).unwrap_or_else(|d| panic!("kernel `{}` legalized does not verify:\n{d}", v.name()))
}

/// Whether this module rewrites `s`.
fn rewritten(s: &Stmt) -> bool {
    batched(s).is_some() || matches!(s.op, Op::Tile { .. } | Op::Repeat { .. })
}

/// A batched `dot`'s operands, flags and result type: a `dot` whose result has more than two
/// dimensions.
fn batched(s: &Stmt) -> Option<(&str, &str, (bool, bool), &Type)> {
    match (&s.op, &s.ty) {
        (Op::Dot { a: Operand::Value(a), b: Operand::Value(b), trans_a, trans_b }, Some(ty)) if ty.shape.len() > 2 => {
            Some((a, b, (*trans_a, *trans_b), ty))
        }
        _ => None,
    }
}

/// Fresh value names: none the kernel has, none given before.
pub(super) struct Names<'v> {
    pub(super) v: &'v Verified,
    taken: HashSet<String>,
}

impl<'v> Names<'v> {
    /// Names for rewriting `v`.
    pub(super) fn new(v: &'v Verified) -> Names<'v> {
        Names { v, taken: HashSet::new() }
    }

    pub(super) fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        while self.v.values().get(&name).is_some() || self.taken.contains(&name) {
            name.push('_');
        }
        self.taken.insert(name.clone());
        name
    }
}

fn rewrite(body: Vec<Stmt>, names: &mut Names<'_>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for mut s in body {
        for b in s.op.bodies_mut() {
            *b = rewrite(std::mem::take(b), names);
        }
        match (batched(&s), &s.op) {
            (Some((a, b, trans, ty)), _) => out.extend(unbatched(&s, a, b, trans, ty, names)),
            (None, Op::Tile { arg: Operand::Value(x), reps }) => {
                let copies: Vec<(usize, usize, bool)> = reps.iter().enumerate().map(|(d, &r)| (d, r, true)).collect();
                out.extend(copied(&s, x, &copies, names));
            }
            (None, Op::Repeat { arg: Operand::Value(x), times, axis }) => {
                out.extend(copied(&s, x, &[(*axis, *times, false)], names))
            }
            (None, Op::Tile { .. } | Op::Repeat { .. }) => {
                unreachable!("the verifier gives tile and repeat values, not literals")
            }
            _ => out.push(s),
        }
    }
    out
}

/// The statements of one batched `dot` `s` of `a` and `b` into `ty`.
fn unbatched(s: &Stmt, a: &str, b: &str, trans: (bool, bool), ty: &Type, names: &mut Names<'_>) -> Vec<Stmt> {
    let r = &s.results[0];
    let stmt = |name: String, op: Op, ty: Type| Stmt { results: vec![name], op, ty: Some(ty), span: s.span };
    let value = |n: &str| Operand::Value(n.to_string());
    let rank = ty.shape.len();
    let batch: usize = ty.shape[..rank - 2].iter().product();
    if batch == 0 {
        // No matrices: an empty result.
        return vec![stmt(r.clone(), Op::Zeros, ty.clone())];
    }
    let mut out = Vec::new();
    // Each operand as a stack of matrices, [batch, rows, columns].
    let mut stack = |x: &str, which: &str, out: &mut Vec<Stmt>| -> (String, Type) {
        let t = names.v.value_type(x);
        let three = Type::array(t.dtype, [batch, t.shape[rank - 2], t.shape[rank - 1]]);
        if t.shape.len() == 3 {
            return (x.to_string(), three);
        }
        let n = names.fresh(&format!("{r}_{which}"));
        out.push(stmt(n.clone(), Op::Reshape(value(x)), three.clone()));
        (n, three)
    };
    let (sa, ta) = stack(a, "a", &mut out);
    let (sb, tb) = stack(b, "b", &mut out);
    let (m, n) = (ty.shape[rank - 2], ty.shape[rank - 1]);
    let mut products = Vec::with_capacity(batch);
    for i in 0..batch {
        let mut matrix = |x: &str, t: &Type, which: &str, out: &mut Vec<Stmt>| {
            let (rows, cols) = (t.shape[1], t.shape[2]);
            let sl = names.fresh(&format!("{r}_{which}{i}s"));
            let slice = Op::Slice { arg: value(x), start: vec![i, 0, 0], stride: vec![1, 1, 1] };
            out.push(stmt(sl.clone(), slice, Type::array(t.dtype, [1, rows, cols])));
            let mat = names.fresh(&format!("{r}_{which}{i}"));
            out.push(stmt(mat.clone(), Op::Reshape(value(&sl)), Type::array(t.dtype, [rows, cols])));
            mat
        };
        let (ai, bi) = (matrix(&sa, &ta, "a", &mut out), matrix(&sb, &tb, "b", &mut out));
        let p = names.fresh(&format!("{r}_p{i}"));
        let dot = Op::Dot { a: value(&ai), b: value(&bi), trans_a: trans.0, trans_b: trans.1 };
        out.push(stmt(p.clone(), dot, Type::array(ty.dtype, [m, n])));
        let p3 = names.fresh(&format!("{r}_p{i}s"));
        out.push(stmt(p3.clone(), Op::Reshape(value(&p)), Type::array(ty.dtype, [1, m, n])));
        products.push(value(&p3));
    }
    let joined = if rank == 3 { r.clone() } else { names.fresh(&format!("{r}_all")) };
    let join = if batch == 1 { Op::Reshape(products.remove(0)) } else { Op::Concatenate { args: products, axis: 0 } };
    out.push(stmt(joined.clone(), join, Type::array(ty.dtype, [batch, m, n])));
    if rank > 3 {
        out.push(stmt(r.clone(), Op::Reshape(value(&joined)), ty.clone()));
    }
    out
}

/// The statements of `tile` or `repeat` `s` of `x`: for each `(dimension, copies, whole)` with
/// more than one copy, in order, the value so far reshaped with a dimension of 1 before that one
/// (whole copies, `tile`) or after it (each element in a row, `repeat`), broadcast to the copies
/// and reshaped to merge the two; the last keeps `s`'s name (a `reshape` to itself where nothing
/// is copied).
fn copied(s: &Stmt, x: &str, copies: &[(usize, usize, bool)], names: &mut Names<'_>) -> Vec<Stmt> {
    let r = &s.results[0];
    let stmt = |name: String, op: Op, ty: Type| Stmt { results: vec![name], op, ty: Some(ty), span: s.span };
    let mut t = names.v.value_type(x).clone();
    let mut cur = x.to_string();
    let mut out = Vec::new();
    let steps: Vec<&(usize, usize, bool)> = copies.iter().filter(|(_, n, _)| *n > 1).collect();
    for (i, &&(d, n, whole)) in steps.iter().enumerate() {
        let at = if whole { d } else { d + 1 };
        let mut spread = t.shape.clone();
        spread.insert(at, 1);
        let one = names.fresh(&format!("{r}_{i}u"));
        out.push(stmt(one.clone(), Op::Reshape(Operand::Value(cur.clone())), Type::array(t.dtype, spread.clone())));
        spread[at] = n;
        let wide = names.fresh(&format!("{r}_{i}b"));
        out.push(stmt(wide.clone(), Op::Broadcast(Operand::Value(one)), Type::array(t.dtype, spread)));
        t.shape[d] *= n;
        cur = if i + 1 == steps.len() { r.clone() } else { names.fresh(&format!("{r}_{i}")) };
        out.push(stmt(cur.clone(), Op::Reshape(Operand::Value(wide)), t.clone()));
    }
    if steps.is_empty() {
        out.push(stmt(r.clone(), Op::Reshape(Operand::Value(cur)), t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unbatched_text(src: &str) -> String {
        let v = verify(&parse(src).expect("parses").kernels.remove(0)).expect("verifies");
        print_kernel(legalize(v).expect("the rewrite verifies").kernel())
    }

    #[test]
    fn a_batched_dot_becomes_one_dot_per_leading_index_and_keeps_its_name() {
        let text = unbatched_text(
            "kernel k\n  out o: f32[2, 2, 2]\n{\n  %d_a0 = zeros : f32[2, 2, 3]\n  %b = zeros : f32[2, 3, 2]\n  %d = dot %d_a0, %b\n  store o, %d\n}\n",
        );
        assert_eq!(text.matches(" = dot ").count(), 2, "{text}");
        assert!(text.contains("%d = concatenate"), "the result keeps its name: {text}");
        assert!(!text.contains("%d_a0 = slice"), "a fresh name is not one the kernel has: {text}");
    }

    #[test]
    fn an_empty_batch_is_zeros_and_a_kernel_without_batches_is_unchanged() {
        let text = unbatched_text(
            "kernel k\n  out o: f32[4]\n{\n  %a = zeros : f32[0, 2, 3]\n  %b = zeros : f32[0, 3, 2]\n  %d = dot %a, %b\n  %z = zeros : f32[4]\n  store o, %z\n}\n",
        );
        assert!(text.contains("%d = zeros : f32[0, 2, 2]") && !text.contains(" dot "), "{text}");
        let plain = "kernel k\n  out o: f32[2, 2]\n{\n  %a = zeros : f32[2, 3]\n  %b = zeros : f32[3, 2]\n  %d = dot %a, %b\n  store o, %d\n}\n";
        let v = verify(&parse(plain).expect("parses").kernels.remove(0)).expect("verifies");
        let before = print_kernel(v.kernel());
        assert_eq!(print_kernel(legalize(v).expect("unchanged").kernel()), before);
    }

    #[test]
    fn a_tile_of_a_scalar_is_refused_since_its_text_could_not_be_read_back() {
        // `reps ()` is not text the parser reads: the verifier refuses what would print so.
        let src = "kernel k\n  out o: f32[1]\n{\n  %x = full 1.0 : f32\n  %t = tile %x reps (1)\n  %z = zeros : f32[1]\n  store o, %z\n}\n";
        let mut k = parse(src).expect("parses").kernels.remove(0);
        assert!(verify(&k).is_err(), "one count for no dimension");
        let Op::Tile { reps, .. } = &mut k.body[1].op else { panic!("the tile") };
        reps.clear();
        let err = verify(&k).expect_err("a tile of a scalar").to_string();
        assert!(err.contains("a tile of a scalar is the scalar"), "{err}");
    }

    #[test]
    fn tile_and_repeat_become_reshapes_and_broadcasts_along_the_dimensions_they_copy() {
        let text = unbatched_text(
            "kernel k\n  out o: f32[4, 9]\n  out p: f32[2, 6]\n  out q: f32[2, 3]\n{\n  %x = zeros : f32[2, 3]\n  %t = tile %x reps (2, 3)\n  %r = repeat %x times 2 axis 1\n  %s = tile %x reps (1, 1)\n  store o, %t\n  store p, %r\n  store q, %s\n}\n",
        );
        assert!(!text.contains(" tile ") && !text.contains(" repeat "), "{text}");
        // tile: a 1 before each dimension copied, broadcast, merged; the last keeps the name.
        assert!(
            text.contains("%t_0u = reshape %x : f32[1, 2, 3]") && text.contains("%t_0b = broadcast %t_0u : f32[2, 2, 3]"),
            "{text}"
        );
        assert!(
            text.contains("%t_1u = reshape %t_0 : f32[4, 1, 3]") && text.contains("%t = reshape %t_1b : f32[4, 9]"),
            "{text}"
        );
        // repeat: the 1 after the dimension.
        assert!(
            text.contains("%r_0u = reshape %x : f32[2, 3, 1]") && text.contains("%r_0b = broadcast %r_0u : f32[2, 3, 2]"),
            "{text}"
        );
        assert!(text.contains("%s = reshape %x : f32[2, 3]"), "{text}");
    }
}
