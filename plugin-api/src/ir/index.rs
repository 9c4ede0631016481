//! Block indices (docs/language.md §2): affine in the grid axes (`2*i + 1`), or computed — any
//! integer expression of the axes and of integer inputs (`min(i, 3)`, `select(lt(j, i), j, i)`,
//! `tbl[b, p]`), evaluated per program in 32-bit integers and brought into the array's blocks as
//! Pallas's interpret mode brings them: a negative index counts from the end once, then it is
//! clamped.
//!
//! Every backend computes a computed index where it computes an affine one: the interpreter at
//! each grid point, wgpu in the shader, Mosaic GPU in registers. [`IndexEval`] is the one
//! definition of the arithmetic they all follow.

use std::fmt;

use super::size::{SizeExpr, SizeOp};
use super::{Affine, Kernel, Param, ParamKind};

/// The block index of one dimension.
#[derive(Clone, Debug, PartialEq)]
pub enum BlockIndex {
    /// Affine in the grid axes; used as is (a block past the array reads zeros).
    Affine(Affine),
    /// Any other integer expression; names are grid axes, [`SizeExpr::Read`]s read integer inputs.
    /// Its value is brought into `0 ..= blocks - 1` by [`IndexEval::clamp`].
    Computed(SizeExpr),
}

impl BlockIndex {
    /// The affine expression, if this index is one.
    pub fn affine(&self) -> Option<&Affine> {
        match self {
            BlockIndex::Affine(a) => Some(a),
            BlockIndex::Computed(_) => None,
        }
    }

    /// Whether the grid axis `name` appears in the index.
    pub fn uses(&self, name: &str) -> bool {
        match self {
            BlockIndex::Affine(a) => a.uses(name),
            BlockIndex::Computed(e) => e.mentions(name),
        }
    }

    /// The grid axes the index names.
    pub fn axes(&self) -> Vec<&str> {
        match self {
            BlockIndex::Affine(a) => a.terms.iter().map(|t| t.1.as_str()).collect(),
            BlockIndex::Computed(e) => e.names(),
        }
    }

    /// Whether the index is the axis `name` alone (`at (i)`).
    pub fn is_axis(&self, name: &str) -> bool {
        self.affine().is_some_and(|a| *a == Affine::axis(name))
    }
}

impl From<Affine> for BlockIndex {
    fn from(a: Affine) -> BlockIndex {
        BlockIndex::Affine(a)
    }
}

impl fmt::Display for BlockIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockIndex::Affine(a) => a.fmt(f),
            BlockIndex::Computed(e) => e.fmt(f),
        }
    }
}

/// Makes the names of scalar `in` arguments in block indices reads of them (they parse as axis
/// names): an affine index that names one becomes computed. Grid axes keep their names.
pub fn resolve_scalar_reads(k: &mut Kernel) {
    let axes: Vec<String> = k.grid.iter().flatten().map(|a| a.name.clone()).collect();
    let scalars: Vec<String> =
        (k.params.iter()).filter(|p| p.kind == ParamKind::In && p.ty.shape.is_empty() && !axes.contains(&p.name)).map(|p| p.name.clone()).collect();
    if scalars.is_empty() {
        return;
    }
    let read_scalars = |e: SizeExpr| {
        e.rewrite(&|e| match e {
            SizeExpr::Name(n) if scalars.contains(&n) => SizeExpr::Read(n, Vec::new()),
            e => e,
        })
    };
    for b in k.params.iter_mut().filter_map(|p| p.block.as_mut()) {
        for ix in &mut b.index {
            let e = match ix {
                BlockIndex::Affine(a) if a.terms.iter().any(|t| scalars.contains(&t.1)) => affine_expr(a),
                BlockIndex::Computed(e) => e.clone(),
                BlockIndex::Affine(_) => continue,
            };
            *ix = BlockIndex::Computed(read_scalars(e));
        }
    }
}

/// `a` as an expression tree: `c0*x0 + c1*x1 + ... + constant`.
pub fn affine_expr(a: &Affine) -> SizeExpr {
    let term = |c: i64, n: &str| match c {
        1 => SizeExpr::Name(n.to_string()),
        c => SizeExpr::Bin(SizeOp::Mul, Box::new(SizeExpr::Int(c)), Box::new(SizeExpr::Name(n.to_string()))),
    };
    let mut terms = a.terms.iter().map(|(c, n)| term(*c, n));
    let Some(first) = terms.next() else { return SizeExpr::Int(a.constant) };
    let sum = terms.fold(first, |acc, t| SizeExpr::Bin(SizeOp::Add, Box::new(acc), Box::new(t)));
    if a.constant == 0 { sum } else { SizeExpr::Bin(SizeOp::Add, Box::new(sum), Box::new(SizeExpr::Int(a.constant))) }
}

/// The inputs a computed index reads, in order of first appearance.
pub fn reads(e: &SizeExpr) -> Vec<&str> {
    fn walk<'a>(e: &'a SizeExpr, out: &mut Vec<&'a str>) {
        if let SizeExpr::Read(n, _) = e
            && !out.contains(&n.as_str())
        {
            out.push(n);
        }
        e.children().for_each(|c| walk(c, out));
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out
}

/// How many blocks of `p` fit along dimension `d`, the last one ragged: `cdiv(dim, block)`
/// (at least 1).
pub fn blocks(p: &Param, d: usize) -> i64 {
    let (dim, block) = (p.ty.shape[d] as i64, p.block_shape()[d] as i64);
    ((dim + block - 1) / block).max(1)
}

/// The arithmetic of a computed block index, in 32-bit two's complement: `+ - *` wrap; `/` and
/// `%` floor (Python's `//` and `%`), `cdiv` rounds up, and each gives 0 for a divisor of 0; a
/// comparison is 1 or 0; `select(c, a, b)` is `a` where `c` is not 0.
pub struct IndexEval;

impl IndexEval {
    /// `x OP y`.
    pub fn apply(op: SizeOp, x: i32, y: i32) -> i32 {
        match op {
            SizeOp::Add => x.wrapping_add(y),
            SizeOp::Sub => x.wrapping_sub(y),
            SizeOp::Mul => x.wrapping_mul(y),
            SizeOp::Div => Self::floor_div(x, y),
            SizeOp::Rem => Self::floor_rem(x, y),
            SizeOp::Cdiv => Self::floor_div(x, y).wrapping_add(i32::from(Self::floor_rem(x, y) != 0)),
            _ => op.order(i64::from(x), i64::from(y)).expect("an ordering operation") as i32,
        }
    }

    fn floor_div(x: i32, y: i32) -> i32 {
        if y == 0 {
            return 0;
        }
        let q = x.wrapping_div(y);
        if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) { q - 1 } else { q }
    }

    fn floor_rem(x: i32, y: i32) -> i32 {
        if y == 0 {
            return 0;
        }
        let r = x.wrapping_rem(y);
        if r != 0 && ((r < 0) != (y < 0)) { r + y } else { r }
    }

    /// The value of `e` with `axis(name)` for grid axes and `read(name, indices)` for inputs
    /// (which gives 0 outside the array).
    pub fn eval(e: &SizeExpr, axis: &dyn Fn(&str) -> i32, read: &dyn Fn(&str, &[i32]) -> i32) -> i32 {
        let go = |e: &SizeExpr| Self::eval(e, axis, read);
        match e {
            SizeExpr::Int(v) => *v as i32,
            SizeExpr::Name(n) => axis(n),
            SizeExpr::Neg(e) => go(e).wrapping_neg(),
            SizeExpr::Bin(op, a, b) => Self::apply(*op, go(a), go(b)),
            SizeExpr::Select(abc) => {
                if go(&abc[0]) != 0 {
                    go(&abc[1])
                } else {
                    go(&abc[2])
                }
            }
            SizeExpr::Read(n, ix) => {
                let at: Vec<i32> = ix.iter().map(go).collect();
                read(n, &at)
            }
        }
    }

    /// A block index as Pallas's interpret mode takes it: a negative one counts from the end
    /// once (NumPy's negative indexing), then it is clamped to `0 ..= blocks - 1`
    /// (`dynamic_slice`'s clamp).
    pub fn clamp(v: i32, blocks: i64) -> i64 {
        let v = i64::from(v);
        (if v < 0 { v + blocks } else { v }).clamp(0, blocks - 1)
    }
}

/// The flat element of a row-major array of `shape` at `at`, if it lies inside.
pub fn flat_index(shape: &[usize], at: &[i32]) -> Option<usize> {
    let mut flat = 0usize;
    for (&i, &n) in at.iter().zip(shape) {
        let i = usize::try_from(i).ok().filter(|&i| i < n)?;
        flat = flat * n + i;
    }
    Some(flat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_arithmetic_by_hand() {
        let cases = [
            (SizeOp::Div, -7, 2, -4),
            (SizeOp::Rem, -7, 2, 1),
            (SizeOp::Div, 7, -2, -4),
            (SizeOp::Rem, 7, -2, -1),
            (SizeOp::Cdiv, 7, 2, 4),
            (SizeOp::Cdiv, -7, 2, -3),
            (SizeOp::Cdiv, 7, -2, -3),
            (SizeOp::Div, 5, 0, 0),
            (SizeOp::Rem, 5, 0, 0),
            (SizeOp::Div, i32::MIN, -1, i32::MIN),
            (SizeOp::Add, i32::MAX, 1, i32::MIN),
            (SizeOp::Lt, 2, 3, 1),
            (SizeOp::Ge, 2, 3, 0),
        ];
        for (op, x, y, want) in cases {
            assert_eq!(IndexEval::apply(op, x, y), want, "{op:?} {x} {y}");
        }
    }

    #[test]
    fn a_constant_divisor_of_0_in_an_index_is_computed_not_refused() {
        // As `i / 0` would be: the index's arithmetic, where a divisor of 0 gives 0.
        let text = "kernel k\n  grid (i: 4)\n  in x: f32[64] block [16] at ((0 - -2) / min(0, 4) + i)\n  out o: f32[64] block [16] at (i)\n{\n  %x = load x\n  store o, %x\n}\n";
        let k = crate::ir::parse(text).expect("parses").kernels.remove(0);
        let BlockIndex::Computed(e) = &k.params[0].block.as_ref().expect("a block").index[0] else { panic!("computed") };
        assert_eq!(e.to_string(), "2 / 0 + i");
        assert_eq!(IndexEval::eval(e, &|_| 3, &|_, _| 0), 3);
    }

    #[test]
    fn reads_outside_give_what_the_reader_says_and_flat_index_checks_bounds() {
        assert_eq!(flat_index(&[2, 3], &[1, 2]), Some(5));
        assert_eq!(flat_index(&[2, 3], &[2, 0]), None);
        assert_eq!(flat_index(&[2, 3], &[0, -1]), None);
        assert_eq!(flat_index(&[], &[]), Some(0));
        let e = SizeExpr::Read("t".into(), vec![SizeExpr::Name("i".into())]);
        let table = [5, 6, 7];
        let read = |_: &str, at: &[i32]| flat_index(&[3], at).map_or(0, |f| table[f]);
        assert_eq!(IndexEval::eval(&e, &|_| 2, &read), 7);
        assert_eq!(IndexEval::eval(&e, &|_| 3, &read), 0);
    }
}
