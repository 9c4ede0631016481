//! The builder the functions are written with: variables and their types, statements, nested
//! `if`s and loops, constants, and the exact products and sums (Veltkamp, Dekker) the algorithms
//! need.

use super::{Func, Op, Stmt, Ty, Var};

/// Builds a [`Func`] statement by statement.
pub(super) struct Builder {
    types: Vec<Ty>,
    /// The open bodies, innermost last.
    bodies: Vec<Vec<Stmt>>,
}

impl Builder {
    pub(super) fn func(name: &'static str, params: usize, body: impl FnOnce(&mut Builder, &[Var]) -> Var) -> Func {
        let mut b = Builder { types: vec![Ty::F32; params], bodies: vec![Vec::new()] };
        let params: Vec<Var> = (0..params).map(Var).collect();
        let result = body(&mut b, &params);
        let body = b.bodies.pop().expect("the function body");
        Func { name, types: b.types, params, body, result }
    }

    pub(super) fn var(&mut self, t: Ty) -> Var {
        self.types.push(t);
        Var(self.types.len() - 1)
    }

    fn ty(&self, v: Var) -> Ty {
        self.types[v.0]
    }

    pub(super) fn set(&mut self, v: Var, op: Op) {
        self.bodies.last_mut().expect("an open body").push(Stmt::Set(v, op));
    }

    pub(super) fn op(&mut self, t: Ty, op: Op) -> Var {
        let v = self.var(t);
        self.set(v, op);
        v
    }

    pub(super) fn when(&mut self, c: Var, body: impl FnOnce(&mut Builder)) {
        self.bodies.push(Vec::new());
        body(self);
        let inner = self.bodies.pop().expect("the if body");
        self.bodies.last_mut().expect("an open body").push(Stmt::If(c, inner));
    }

    pub(super) fn repeat(&mut self, c: Var, body: impl FnOnce(&mut Builder)) {
        self.bodies.push(Vec::new());
        body(self);
        let inner = self.bodies.pop().expect("the loop body");
        self.bodies.last_mut().expect("an open body").push(Stmt::While(c, inner));
    }

    pub(super) fn f(&mut self, v: f32) -> Var {
        self.op(Ty::F32, Op::Const(v.to_bits()))
    }

    pub(super) fn u(&mut self, v: u32) -> Var {
        self.op(Ty::U32, Op::Const(v))
    }

    pub(super) fn i(&mut self, v: i32) -> Var {
        self.op(Ty::I32, Op::Const(v as u32))
    }

    pub(super) fn add(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Add(a, c))
    }

    pub(super) fn sub(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Sub(a, c))
    }

    pub(super) fn mul(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::Mul(a, c))
    }

    pub(super) fn fma(&mut self, a: Var, c: Var, d: Var) -> Var {
        self.op(Ty::F32, Op::Fma(a, c, d))
    }

    pub(super) fn and(&mut self, a: Var, c: Var) -> Var {
        let t = self.ty(a);
        self.op(t, Op::And(a, c))
    }

    pub(super) fn bits(&mut self, a: Var) -> Var {
        self.op(Ty::U32, Op::Bits(a))
    }

    /// `x` limited to `[lo, hi]` (NaN stays NaN).
    pub(super) fn clamp(&mut self, x: Var, lo: f32, hi: f32) -> Var {
        let (l, h) = (self.f(lo), self.f(hi));
        let below = self.op(Ty::Bool, Op::Lt(x, l));
        let x = self.op(Ty::F32, Op::Select(below, l, x));
        let above = self.op(Ty::Bool, Op::Lt(h, x));
        self.op(Ty::F32, Op::Select(above, h, x))
    }

    /// The bits of `|x|`, and those of inf: NaN's are above, finite ones below.
    fn magnitude(&mut self, x: Var) -> (Var, Var) {
        let bx = self.bits(x);
        let m = self.u(0x7fff_ffff);
        let a = self.and(bx, m);
        (a, self.u(0x7f80_0000))
    }

    pub(super) fn is_nan(&mut self, x: Var) -> Var {
        let (a, inf) = self.magnitude(x);
        self.op(Ty::Bool, Op::Lt(inf, a))
    }

    pub(super) fn finite(&mut self, x: Var) -> Var {
        let (a, inf) = self.magnitude(x);
        self.op(Ty::Bool, Op::Lt(a, inf))
    }

    /// `y`, or `x` where `x` is NaN.
    pub(super) fn nan_passes(&mut self, x: Var, y: Var) -> Var {
        let n = self.is_nan(x);
        self.op(Ty::F32, Op::Select(n, x, y))
    }

    /// `|y|` with the sign of `x`.
    pub(super) fn copy_sign(&mut self, y: Var, x: Var) -> Var {
        let (by, bx) = (self.bits(y), self.bits(x));
        let m = self.u(0x7fff_ffff);
        let s = self.u(0x8000_0000);
        let a = self.and(by, m);
        let sx = self.and(bx, s);
        let r = self.op(Ty::U32, Op::Or(a, sx));
        self.op(Ty::F32, Op::Bits(r))
    }

    /// `(p, e)` with `p = a c` rounded and `p + e = a c` exactly (Dekker's product of
    /// Veltkamp's 12-bit halves; no fused multiply-add needed). `a c` must not overflow.
    pub(super) fn two_prod(&mut self, a: Var, c: Var) -> (Var, Var) {
        let p = self.mul(a, c);
        let (ah, al) = self.split(a);
        let (ch, cl) = self.split(c);
        let hh = self.mul(ah, ch);
        let e = self.sub(hh, p);
        let hl = self.mul(ah, cl);
        let e = self.add(e, hl);
        let lh = self.mul(al, ch);
        let e = self.add(e, lh);
        let ll = self.mul(al, cl);
        let e = self.add(e, ll);
        (p, e)
    }

    /// Veltkamp's split of `a` into 12-bit `hi` and `lo` with `hi + lo = a`.
    fn split(&mut self, a: Var) -> (Var, Var) {
        let k = self.f(4097.0);
        let t = self.mul(a, k);
        let d = self.sub(t, a);
        let hi = self.sub(t, d);
        let lo = self.sub(a, hi);
        (hi, lo)
    }

    /// `(s, e)` with `s = a + c` rounded and `s + e = a + c` exactly (Knuth's two-sum).
    pub(super) fn two_sum(&mut self, a: Var, c: Var) -> (Var, Var) {
        let s = self.add(a, c);
        let av = self.sub(s, c);
        let cv = self.sub(s, av);
        let ae = self.sub(a, av);
        let ce = self.sub(c, cv);
        let e = self.add(ae, ce);
        (s, e)
    }
}
