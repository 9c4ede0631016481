//! Rewrites of a verified kernel into the forms every backend writes, applied once by
//! [`crate::backend::verify_with_mesh`] before a backend plans: a batched `dot` (operands with
//! the same leading dimensions, docs/language.md §3) becomes one 2-D `dot` per batch element,
//! each on its operands' `slice`s, the products `concatenate`d and reshaped back to the batch
//! dimensions. The result keeps its name, so nothing after it changes.

use std::collections::HashSet;

use super::*;

/// `v` with every batched `dot` written as 2-D ones; `v` itself where it has none.
pub fn unbatch_dots(v: Verified) -> Verified {
    let mut batched = false;
    analysis::visit(&v.kernel().body, &mut |s| {
        batched |= matches!(s.op, Op::Dot { .. }) && s.ty.as_ref().is_some_and(|t| t.shape.len() > 2);
    });
    if !batched {
        return v;
    }
    let mut kernel = v.kernel().clone();
    let mut names = Names { v: &v, taken: HashSet::new() };
    kernel.body = rewrite(std::mem::take(&mut kernel.body), &mut names);
    verify::verify_derived(&kernel).unwrap_or_else(|d| panic!("a kernel with its batched dots unbatched verifies: {d}"))
}

/// Fresh value names: none the kernel has, none given before.
struct Names<'v> {
    v: &'v Verified,
    taken: HashSet<String>,
}

impl Names<'_> {
    fn fresh(&mut self, base: &str) -> String {
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
        match (&s.op, &s.ty) {
            (Op::Dot { a: Operand::Value(a), b: Operand::Value(b), trans_a, trans_b }, Some(ty)) if ty.shape.len() > 2 => {
                out.extend(unbatched(&s, a, b, (*trans_a, *trans_b), ty, names));
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
