//! Facts about a kernel's body that lowerings share: which statements read a value, and which
//! statements touch an argument.

use super::{Index, Op, Operand, Stmt};

/// Every statement of a body, those of nested `when` and `for` bodies included, in order.
pub fn visit<'b>(body: &'b [Stmt], f: &mut impl FnMut(&'b Stmt)) {
    for s in body {
        f(s);
        if let Op::When { body, .. } | Op::For { body, .. } = &s.op {
            visit(body, f);
        }
    }
}

/// The values a statement reads itself: operands, masks, dynamic starts, a `when`'s condition, a
/// `for`'s bounds and initial values (not what its nested body reads).
pub fn reads(op: &Op) -> Vec<&str> {
    fn starts(ix: &Option<Vec<Index>>) -> impl Iterator<Item = &Operand> {
        ix.iter().flatten().filter_map(|i| match i {
            Index::Full => None,
            Index::Slice { start, .. } => Some(start),
            Index::At(at) => Some(at),
        })
    }
    let operands: Vec<&Operand> = match op {
        Op::Load { index, .. } => starts(index).collect(),
        Op::Store { index, value, .. } => starts(index).chain([value]).collect(),
        Op::ProgramId(_) | Op::NumPrograms(_) | Op::Iota { .. } | Op::Full(_) | Op::Zeros => Vec::new(),
        Op::Unary(_, a)
        | Op::Cast(a)
        | Op::Bitcast(a)
        | Op::Broadcast(a)
        | Op::Reshape(a)
        | Op::Transpose { arg: a, .. }
        | Op::Reduce { arg: a, .. } => vec![a],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) | Op::Dot { a, b, .. } => vec![a, b],
        Op::Select(c, a, b) => vec![c, a, b],
        Op::When { cond, .. } => vec![cond],
        Op::For { lo, hi, step, iters, .. } => [lo, hi].into_iter().chain(step).chain(iters.iter().map(|(_, v)| v)).collect(),
        Op::Yield(vs) => vs.iter().collect(),
    };
    let mask = match op {
        Op::Load { mask, .. } | Op::Store { mask, .. } => mask.as_deref(),
        _ => None,
    };
    operands
        .into_iter()
        .filter_map(|o| match o {
            Operand::Value(v) => Some(v.as_str()),
            Operand::Lit(_) => None,
        })
        .chain(mask)
        .collect()
}

/// Every statement of `body` (nested bodies included) that reads `value`.
pub fn readers<'b>(body: &'b [Stmt], value: &str) -> Vec<&'b Stmt> {
    let mut out = Vec::new();
    visit(body, &mut |s| {
        if reads(&s.op).contains(&value) {
            out.push(s);
        }
    });
    out
}

/// Every `load` and `store` of argument or scratch `name` in `body`, nested bodies included.
pub fn accesses<'b>(body: &'b [Stmt], name: &str) -> Vec<&'b Stmt> {
    let mut out = Vec::new();
    visit(body, &mut |s| match &s.op {
        Op::Load { src: r, .. } | Op::Store { dst: r, .. } if r == name => out.push(s),
        _ => {}
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::parse::parse;

    const K: &str = "kernel k\n  grid (i: 2, k: 2 seq)\n  in a: f32[4, 4] block [2, 4] at (i, 0)\n  out c: f32[4, 4] block [2, 4] at (i, 0)\n{\n  %k = program_id k\n  %f = eq %k, 0\n  when %f {\n    %z = zeros : f32[2, 4]\n    store c, %z\n  }\n  %a = load a\n  %m = load a mask %f2\n  %acc = load c\n  %s = add %acc, %a\n  store c, %s\n}\n";

    #[test]
    fn readers_and_accesses_see_nested_bodies_and_masks() {
        let src = K.replace("  %m = load a mask %f2\n", "  %f2 = gt %a, 0.0\n  %m = select %f2, %a, %a\n");
        let m = parse(&src).expect("parses");
        let body = &m.kernels[0].body;
        let names = |ss: Vec<&Stmt>| ss.iter().map(|s| s.op.mnemonic()).collect::<Vec<_>>();
        assert_eq!(names(readers(body, "f")), ["when"]);
        assert_eq!(names(readers(body, "z")), ["store"]);
        assert_eq!(names(readers(body, "a")), ["gt", "select", "add"]);
        assert_eq!(names(readers(body, "f2")), ["select"]);
        assert_eq!(names(accesses(body, "c")), ["store", "load", "store"]);
        assert_eq!(names(accesses(body, "a")), ["load"]);
    }
}
