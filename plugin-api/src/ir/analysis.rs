//! Facts about a kernel's body that lowerings share: which statements read a value, how each
//! statement reads its operands, which statements touch an argument, and the shape of a load's
//! or store's region. What "its own element" means is each backend's layout: these functions say
//! which element of an operand each result element reads, and a backend decides from that which
//! thread holds it.

use std::collections::HashMap;

use super::{ForLoop, IfElse, Index, Kernel, Op, Operand, Param, ParamKind, Stmt};
use crate::launch::LaunchAxis;

/// Every statement of a body, those of nested `when`, `for` and `if` bodies included, in order.
pub fn visit<'b>(body: &'b [Stmt], f: &mut impl FnMut(&'b Stmt)) {
    for s in body {
        f(s);
        for body in s.op.bodies() {
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
            Index::At(at) | Index::Gather { index: at, .. } => Some(at),
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
        | Op::Tile { arg: a, .. }
        | Op::Repeat { arg: a, .. }
        | Op::Slice { arg: a, .. }
        | Op::Reduce { arg: a, .. } => vec![a],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) | Op::Dot { a, b, .. } => vec![a, b],
        Op::Select(c, a, b) => vec![c, a, b],
        Op::Concatenate { args, .. } => args.iter().collect(),
        Op::When { cond, .. } | Op::If(IfElse { cond, .. }) => vec![cond],
        Op::For(ForLoop { lo, hi, step, iters, .. }) => {
            [lo, hi].into_iter().chain(step).chain(iters.iter().map(|(_, v)| v)).collect()
        }
        Op::Yield(vs) => vs.iter().collect(),
        Op::Sync(s) => s.operands(),
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

/// [`readers`] of every value at once, from one walk of the body: asking [`readers`] for each
/// value of a kernel costs the kernel's length squared (minutes at 100,000 statements).
pub struct Readers<'b>(HashMap<&'b str, Vec<&'b Stmt>>);

impl<'b> Readers<'b> {
    /// The index of `body`, nested bodies included.
    pub fn of(body: &'b [Stmt]) -> Readers<'b> {
        let mut by_value: HashMap<&'b str, Vec<&'b Stmt>> = HashMap::new();
        visit(body, &mut |s| {
            for v in reads(&s.op) {
                let list = by_value.entry(v).or_default();
                // A statement that reads a value twice (`add %x, %x`) is one reader.
                if !list.last().is_some_and(|last| std::ptr::eq(*last, s)) {
                    list.push(s);
                }
            }
        });
        Readers(by_value)
    }

    /// The statements that read `value`, in order.
    pub fn of_value(&self, value: &str) -> &[&'b Stmt] {
        self.0.get(value).map_or(&[], Vec::as_slice)
    }
}

/// Every `load` and `store` of argument or scratch `name` in `body`, nested bodies included,
/// and every asynchronous copy or product that reads or writes it.
pub fn accesses<'b>(body: &'b [Stmt], name: &str) -> Vec<&'b Stmt> {
    let mut out = Vec::new();
    visit(body, &mut |s| match &s.op {
        Op::Load { src: r, .. } | Op::Store { dst: r, .. } if r == name => out.push(s),
        Op::Sync(sync) if sync.regions().iter().any(|(r, _)| r.name == name) => out.push(s),
        _ => {}
    });
    out
}

/// `c += a b` as a body writes it: `%acc = load c`, `%p = dot ..`, `%s = add %acc, %p` (or
/// `add %p, %acc`), `store c, %s`, the four statements in one body, each value read by the next
/// of the four only, and nothing else from the first of them to the store touching `c`
/// ([`accesses`]). A backend may then add the product into `c` where it lies (wgpu into an output
/// held in registers, the cpu plugin into the block's memory): no statement between can tell.
/// Positions in the body; which `c` a backend takes (its indexes, masks, types) is its own choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accumulation {
    /// The `load` of `c`.
    pub load: usize,
    /// The `dot`.
    pub dot: usize,
    /// The `add` of the two.
    pub add: usize,
    /// The `store` of the sum into `c`.
    pub store: usize,
}

/// Every [`Accumulation`] of `body` itself (those of its nested bodies are found by asking for
/// each of them), `read_once(value)` saying whether one statement of the whole kernel reads it.
pub fn accumulations(body: &[Stmt], read_once: impl Fn(&str) -> bool) -> Vec<Accumulation> {
    let def = |name: &str| body.iter().position(|t| t.results.iter().any(|r| r == name));
    let mut found = Vec::new();
    for (store, s) in body.iter().enumerate() {
        let Op::Store { dst, value: Operand::Value(sum), .. } = &s.op else { continue };
        let Some(add) = def(sum) else { continue };
        let Op::Binary(super::BinaryOp::Add, Operand::Value(x), Operand::Value(y)) = &body[add].op else { continue };
        let (Some(xi), Some(yi)) = (def(x), def(y)) else { continue };
        let (load, dot) = if matches!(body[xi].op, Op::Dot { .. }) { (yi, xi) } else { (xi, yi) };
        let (Op::Dot { .. }, Op::Load { src, .. }) = (&body[dot].op, &body[load].op) else { continue };
        if src != dst || x == y || ![sum, x, y].into_iter().all(|v| read_once(v)) {
            continue;
        }
        let apart =
            (load.min(dot)..=store).all(|k| k == load || k == store || accesses(std::slice::from_ref(&body[k]), dst).is_empty());
        if apart {
            found.push(Accumulation { load, dot, add, store });
        }
    }
    found
}

/// Whether output `p` is overwritten whole before anything could read it, so that zeroing it
/// first cannot be observed: the kernel never loads `p`, its body stores the whole block
/// unconditionally (at top level, no index, no mask) at every grid point, and the blocks cover the
/// array ([`covers`]).
pub fn overwritten(k: &Kernel, grid: &[LaunchAxis], p: &Param) -> bool {
    let loaded = accesses(&k.body, &p.name).iter().any(|s| matches!(s.op, Op::Load { .. }));
    let whole_store = k.body.iter().any(|s| matches!(&s.op, Op::Store { dst, index: None, mask: None, .. } if dst == &p.name));
    !loaded && whole_store && covers(grid, p)
}

/// Whether every element of output `p` is stored at some grid point before anything could read
/// it, so that zeroing it first cannot be observed: the kernel overwrites it whole
/// ([`overwritten`]), or `p` is [`resident`] (written back whole at each program's last step)
/// and its blocks cover the array ([`covers`]).
pub fn fully_written(k: &Kernel, grid: &[LaunchAxis], p: &Param) -> bool {
    overwritten(k, grid, p) || (resident(k, grid, p) && covers(grid, p))
}

/// Whether the blocks of `p` over the grid cover its array: an index map that sends each
/// dimension to its own grid axis (`at (i, j)`), whose size times the block reaches the end, or
/// to 0 where the block spans the dimension.
pub fn covers(grid: &[LaunchAxis], p: &Param) -> bool {
    let Some(b) = &p.block else { return true };
    let mut used = Vec::new();
    b.index.iter().zip(&b.shape).zip(&p.ty.shape).all(|((e, &bs), &dim)| {
        let Some(e) = e.affine() else { return false };
        match e.terms.as_slice() {
        [] => e.constant == 0 && bs >= dim,
        [(1, axis)] if e.constant == 0 && !used.contains(axis) => {
            used.push(axis.clone());
            grid.iter().find(|a| &a.name == axis).is_some_and(|a| a.size as usize * bs >= dim)
        }
        _ => false,
        }
    })
}

/// Whether output `p`'s block can stay with its program across the `seq` steps (in registers,
/// in a program's own buffer), read once before the first step and written back once after the
/// last: there are several steps; the block is the same at every step (no `seq` axis in its index
/// map), its own to each program (every parallel axis in the map, one per dimension) and inside
/// the array; and the kernel only loads and stores it whole (no index, no mask), so that no
/// program touches another's elements of it.
pub fn resident(k: &Kernel, grid: &[LaunchAxis], p: &Param) -> bool {
    let Some(b) = &p.block else { return false };
    if p.kind != ParamKind::Out || grid.iter().filter(|a| a.seq).map(|a| a.size).product::<u64>() < 2 {
        return false;
    }
    let axis = |name: &str| grid.iter().find(|a| a.name == name);
    let mut used: Vec<&str> = Vec::new();
    for e in &b.index {
        let Some(e) = e.affine() else { return false };
        match e.terms.as_slice() {
            [] => {}
            [(c, name)] if *c != 0 && !used.contains(&name.as_str()) && axis(name).is_some_and(|a| !a.seq) => used.push(name),
            _ => return false,
        }
    }
    let own = grid.iter().filter(|a| !a.seq).all(|a| a.size == 1 || used.contains(&a.name.as_str()));
    let inside = (0..b.shape.len()).all(|d| inside(grid, p, d));
    let whole = accesses(&k.body, &p.name)
        .iter()
        .all(|s| matches!(&s.op, Op::Load { index: None, mask: None, .. } | Op::Store { index: None, mask: None, .. }));
    own && inside && whole
}

/// Whether each parallel program touches only its own elements of `p`, elements no other program
/// reads or writes: the kernel loads and stores `p` only whole (no index: a program stays in its
/// block), and the block index tells the programs apart whatever the `seq` steps, because every
/// parallel axis of more than one point is the only term of some dimension of the index map (blocks
/// at different block indices do not overlap). Without a block, there is one program.
pub fn own_blocks(k: &Kernel, grid: &[LaunchAxis], p: &Param) -> bool {
    let whole =
        accesses(&k.body, &p.name).iter().all(|s| matches!(&s.op, Op::Load { index: None, .. } | Op::Store { index: None, .. }));
    let mut parallel = grid.iter().filter(|a| !a.seq && a.size > 1);
    let told_apart = match &p.block {
        None => parallel.next().is_none(),
        Some(b) => {
            parallel.all(|a| b.index.iter().any(|e| matches!(e.affine().map(|e| e.terms.as_slice()), Some([(c, name)]) if *c != 0 && name == &a.name)))
        }
    };
    whole && told_apart
}

/// Whether every block of `p` lies inside its array in dimension `d`, at every point of the grid.
pub fn inside(grid: &[LaunchAxis], p: &Param, d: usize) -> bool {
    let (lo, hi) = origin_range(grid, p, d);
    lo >= 0 && hi.saturating_add(p.block_shape()[d] as i64) <= p.ty.shape[d] as i64
}

/// The range over the grid of the first element of `p`'s block in dimension `d`
/// (`E_d * B_d`; 0 without a block; a computed index's clamped range).
pub fn origin_range(grid: &[LaunchAxis], p: &Param, d: usize) -> (i64, i64) {
    let Some(b) = &p.block else { return (0, 0) };
    let Some(e) = b.index[d].affine() else { return (0, (super::index::blocks(p, d) - 1) * b.shape[d] as i64) };
    let (mut lo, mut hi) = (e.constant, e.constant);
    for (c, name) in &e.terms {
        let size = grid.iter().find(|a| &a.name == name).map_or(1, |a| a.size as i64);
        let y = c.saturating_mul(size - 1);
        lo = lo.saturating_add(y.min(0));
        hi = hi.saturating_add(y.max(0));
    }
    let bs = b.shape[d] as i64;
    (lo.saturating_mul(bs), hi.saturating_mul(bs))
}

/// The shape of the region of argument `p` that a `load` or `store` with `index` touches: its
/// block, sliced, without the dimensions a single index selects (a gathered one as long as its
/// index vector).
pub fn region_shape(p: &Param, index: Option<&[Index]>) -> Vec<usize> {
    let block = p.block_shape();
    (0..block.len())
        .filter_map(|d| match index.map(|ix| &ix[d]) {
            None | Some(Index::Full) => Some(block[d]),
            Some(Index::Slice { size, .. }) => Some(*size),
            Some(Index::At(_)) => None,
            Some(Index::Gather { len, .. }) => Some(*len),
        })
        .collect()
}

/// Which elements of an operand a statement reads for each element it makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum How {
    /// Element by element over a result (or load/store region) of this shape: the operand's
    /// element at the same index where the shapes agree, broadcast (numpy's rules) where not.
    Elementwise(Vec<usize>),
    /// The element at the same flat (row-major) index (`reshape`).
    Linear,
    /// Any element for any result element: reductions, transposes, `dot` operands, dynamic
    /// indices, a `when`'s condition and a `for`'s bounds.
    Whole,
}

/// One operand a statement reads, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use<'s> {
    /// The value read.
    pub name: &'s str,
    /// Which of its elements each result element reads.
    pub how: How,
}

/// The values statement `s` of kernel `k` reads itself (not its nested body's), in operand order,
/// with how each is read; `result` is the shape of what it makes. A `for` reads only its bounds
/// here: its carried values are copied element by element into their slots.
pub fn uses<'s>(k: &Kernel, s: &'s Stmt, result: &[usize]) -> Vec<Use<'s>> {
    let value = |o: &'s Operand, how: How| match o {
        Operand::Value(v) => Some(Use { name: v.as_str(), how }),
        Operand::Lit(_) => None,
    };
    let at = |o: &'s Operand| value(o, How::Elementwise(result.to_vec()));
    let starts = |index: &'s Option<Vec<Index>>| -> Vec<Use<'s>> {
        (index.iter().flatten())
            .filter_map(|ix| match ix {
                Index::Full => None,
                Index::Slice { start, .. } => value(start, How::Whole),
                Index::At(at) | Index::Gather { index: at, .. } => value(at, How::Whole),
            })
            .collect()
    };
    let region =
        |name: &str, index: &Option<Vec<Index>>| region_shape(k.param(name).expect("verified argument"), index.as_deref());
    let mask = |m: &'s Option<String>, region: Vec<usize>| m.as_deref().map(|m| Use { name: m, how: How::Elementwise(region) });
    match &s.op {
        Op::Load { src, index, mask: m, .. } => starts(index).into_iter().chain(mask(m, region(src, index))).collect(),
        Op::Store { dst, index, value: v, mask: m } => {
            let r = region(dst, index);
            let mut out = starts(index);
            out.extend(value(v, How::Elementwise(r.clone())));
            out.extend(mask(m, r));
            out
        }
        Op::ProgramId(_) | Op::NumPrograms(_) | Op::Iota { .. } | Op::Full(_) | Op::Zeros | Op::Yield(_) => Vec::new(),
        Op::Sync(sync) => sync.operands().into_iter().filter_map(|o| value(o, How::Whole)).collect(),
        Op::Unary(_, a) | Op::Cast(a) | Op::Bitcast(a) | Op::Broadcast(a) => at(a).into_iter().collect(),
        Op::Binary(_, a, b) | Op::Compare(_, a, b) => [a, b].into_iter().filter_map(at).collect(),
        Op::Select(c, a, b) => [c, a, b].into_iter().filter_map(at).collect(),
        Op::Reshape(a) => value(a, How::Linear).into_iter().collect(),
        Op::Transpose { arg, .. } | Op::Tile { arg, .. } | Op::Repeat { arg, .. } | Op::Slice { arg, .. } | Op::Reduce { arg, .. } => {
            value(arg, How::Whole).into_iter().collect()
        }
        Op::Concatenate { args, .. } => args.iter().filter_map(|a| value(a, How::Whole)).collect(),
        Op::Dot { a, b, .. } => [a, b].into_iter().filter_map(|o| value(o, How::Whole)).collect(),
        Op::When { cond, .. } | Op::If(IfElse { cond, .. }) => value(cond, How::Whole).into_iter().collect(),
        Op::For(ForLoop { lo, hi, step, .. }) => {
            [Some(lo), Some(hi), step.as_ref()].into_iter().flatten().filter_map(|o| value(o, How::Whole)).collect()
        }
    }
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
        // The index of every value at once gives the same statements, a `select %f2, %a, %a`
        // once.
        let index = Readers::of(body);
        for v in ["f", "z", "a", "f2", "k", "acc", "s", "m", "nothing"] {
            let one: Vec<*const Stmt> = readers(body, v).into_iter().map(|s| s as *const Stmt).collect();
            let all: Vec<*const Stmt> = index.of_value(v).iter().map(|s| *s as *const Stmt).collect();
            assert_eq!(one, all, "readers of %{v}");
        }
        assert_eq!(names(accesses(body, "c")), ["store", "load", "store"]);
        assert_eq!(names(accesses(body, "a")), ["load"]);
    }

    #[test]
    fn uses_say_which_elements_each_statement_reads() {
        let src = "kernel k\n  in a: f32[4, 8] block [2, 8] at (0, 0)\n  out c: f32[4, 8] block [2, 8] at (0, 0)\n{\n  %a = load a\n  %s = sum %a axis 1 keepdims\n  %d = sub %a, %s\n  %r = reshape %d : f32[16]\n  %q = reshape %r : f32[2, 8]\n  %i = program_id 0\n  %m = gt %q, 0.0\n  %row = load a[%i, :] mask %m2\n  store c, %q mask %m\n}\n";
        let src = src.replace("  %row = load a[%i, :] mask %m2\n", "  %m1 = gt %a, 1.0\n  %row = load a[%i, :]\n");
        let m = parse(&src).unwrap_or_else(|e| panic!("{e:?}"));
        let k = &m.kernels[0];
        let at = |n: usize| How::Elementwise(vec![2, n]);
        let of = |i: usize, result: &[usize]| -> Vec<(String, How)> {
            uses(k, &k.body[i], result).into_iter().map(|u| (u.name.to_string(), u.how)).collect()
        };
        let u = |n: &str, h: How| (n.to_string(), h);
        assert_eq!(of(0, &[2, 8]), []);
        assert_eq!(of(1, &[2, 1]), [u("a", How::Whole)]);
        assert_eq!(of(2, &[2, 8]), [u("a", at(8)), u("s", at(8))]);
        assert_eq!(of(3, &[16]), [u("d", How::Linear)]);
        // The region of `a[%i, :]` is a row of 8; its index is read whole.
        assert_eq!(of(8, &[8]), [u("i", How::Whole)]);
        assert_eq!(of(9, &[]), [u("q", at(8)), u("m", at(8))]);
        assert_eq!(region_shape(k.param("a").unwrap(), Some(&[Index::At(Operand::Value("i".into())), Index::Full])), [8]);
    }

    #[test]
    fn own_blocks_are_told_apart_by_a_parallel_axis_of_their_own() {
        let grid = |axes: &[(&str, u64, bool)]| -> Vec<LaunchAxis> {
            axes.iter().map(|&(n, size, seq)| LaunchAxis { name: n.into(), size, seq }).collect()
        };
        let own = |out: &str, body: &str, g: &[LaunchAxis]| {
            let src = format!(
                "kernel k\n  grid (i: 2, j: 2, k: 2 seq)\n  in a: f32[8, 8] block [2, 2] at (i, j)\n  {out}\n{{\n  %a = load a\n{body}}}\n"
            );
            let m = parse(&src).unwrap_or_else(|e| panic!("{src}: {e:?}"));
            own_blocks(&m.kernels[0], g, m.kernels[0].param("c").expect("c"))
        };
        let ijk = grid(&[("i", 2, false), ("j", 2, false), ("k", 2, true)]);
        let store = "  store c, %a\n";
        // Each (i, j) its own block, whatever the seq step.
        assert!(own("out c: f32[8, 8] block [2, 2] at (i, j)", store, &ijk));
        let ik = grid(&[("i", 2, false), ("j", 1, false), ("k", 2, true)]);
        assert!(own("out c: f32[8, 8] block [2, 2] at (i, k)", store, &ik), "i alone in a dimension, k in the other");
        // Programs i = 0 at step k = 1 and i = 1 at k = 0 share block (j, 1).
        assert!(!own("out c: f32[8, 8] block [2, 2] at (j, i + k)", store, &ijk));
        // `j` is not told apart: programs (i, 0) and (i, 1) share blocks.
        assert!(!own("out c: f32[8, 8] block [2, 2] at (i, 0)", store, &ijk));
        assert!(!own("out c: f32[8, 8] block [2, 2] at (i, i + j)", store, &ijk), "j never alone in a dimension");
        assert!(!own("out c: f32[8, 8] block [2, 2] at (i, j * 0)", store, &ijk));
        // ...unless `j` has one point.
        assert!(own(
            "out c: f32[8, 8] block [2, 2] at (i, 0)",
            store,
            &grid(&[("i", 2, false), ("j", 1, false), ("k", 2, true)])
        ));
        // A store with an index may reach past the block, into another program's.
        let indexed = "  %z = zeros : f32[2]\n  store c[0, ds(2, 2)], %z\n";
        assert!(!own("out c: f32[8, 8] block [2, 2] at (i, j)", indexed, &ijk));
        assert!(
            own("out c: f32[8, 8] block [2, 2] at (i, j)", "  %m = gt %a, 0.0\n  store c, %a mask %m\n", &ijk),
            "a mask stays in the block"
        );
        // The whole array: its own only to a single program.
        let whole = "  %w = zeros : f32[8, 8]\n  store c, %w\n";
        assert!(!own("out c: f32[8, 8]", whole, &ijk));
        assert!(own("out c: f32[8, 8]", whole, &grid(&[("i", 1, false), ("j", 1, false), ("k", 2, true)])));
    }
}
