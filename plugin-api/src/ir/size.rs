//! Size expressions (docs/language.md §9): the integers of a generic kernel, computed from its
//! parameters when a launch binds them.
//!
//! `E := INT | NAME | -E | E + E | E - E | E * E | E / E | E % E | cdiv(E, E) | min(E, E) | max(E, E)
//!      | eq(E, E) | ne(E, E) | lt(E, E) | le(E, E) | gt(E, E) | ge(E, E) | select(E, E, E) | (E)`,
//! evaluated in 64-bit integers; `/` and `%` floor, a divisor that is not positive is an error, and
//! a comparison is 1 or 0. Inside `at (...)` a name that is not a parameter is a grid axis, and
//! `NAME[E, ...]` reads an input array: an expression affine in the axes is a plain block index,
//! any other a computed one (`index.rs`).

use std::fmt;

use super::Affine;

/// A binary operation of a size expression; `cdiv`, `min` and `max` are written as calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a*b`
    Mul,
    /// `a / b`, floored
    Div,
    /// `a % b`, floored (the sign of `b`)
    Rem,
    /// `cdiv(a, b)`: `a / b` rounded up
    Cdiv,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
    /// `eq(a, b)`: 1 where equal, else 0
    Eq,
    /// `ne(a, b)`
    Ne,
    /// `lt(a, b)`
    Lt,
    /// `le(a, b)`
    Le,
    /// `gt(a, b)`
    Gt,
    /// `ge(a, b)`
    Ge,
}

/// The call-like operations and their names.
const CALLS: [(SizeOp, &str); 9] = [
    (SizeOp::Cdiv, "cdiv"),
    (SizeOp::Min, "min"),
    (SizeOp::Max, "max"),
    (SizeOp::Eq, "eq"),
    (SizeOp::Ne, "ne"),
    (SizeOp::Lt, "lt"),
    (SizeOp::Le, "le"),
    (SizeOp::Gt, "gt"),
    (SizeOp::Ge, "ge"),
];

impl SizeOp {
    /// The function name of a call-like operation.
    pub fn call_name(self) -> Option<&'static str> {
        CALLS.iter().find(|c| c.0 == self).map(|c| c.1)
    }

    /// The operation called `name` (`cdiv`, `min`, `max`, `eq`, `lt`, ...).
    pub fn from_call(name: &str) -> Option<SizeOp> {
        CALLS.iter().find(|c| c.1 == name).map(|c| c.0)
    }

    /// `x OP y` for a comparison, `min` or `max`: the operations whose 64-bit and 32-bit
    /// meanings agree.
    pub fn order(self, x: i64, y: i64) -> Option<i64> {
        Some(match self {
            SizeOp::Min => x.min(y),
            SizeOp::Max => x.max(y),
            SizeOp::Eq => i64::from(x == y),
            SizeOp::Ne => i64::from(x != y),
            SizeOp::Lt => i64::from(x < y),
            SizeOp::Le => i64::from(x <= y),
            SizeOp::Gt => i64::from(x > y),
            SizeOp::Ge => i64::from(x >= y),
            _ => return None,
        })
    }

    fn infix(self) -> Option<(&'static str, u8)> {
        match self {
            SizeOp::Add => Some((" + ", 1)),
            SizeOp::Sub => Some((" - ", 1)),
            SizeOp::Mul => Some(("*", 2)),
            SizeOp::Div => Some((" / ", 2)),
            SizeOp::Rem => Some((" % ", 2)),
            _ => None,
        }
    }
}

/// A size expression as written (after [`SizeExpr::fold`], as printed in canonical text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeExpr {
    /// An integer.
    Int(i64),
    /// A parameter (or, inside `at (...)`, a grid axis).
    Name(String),
    /// `-e`
    Neg(Box<SizeExpr>),
    /// `a OP b`
    Bin(SizeOp, Box<SizeExpr>, Box<SizeExpr>),
    /// `select(c, a, b)`: `a` where `c` is not 0, else `b`
    Select(Box<[SizeExpr; 3]>),
    /// `NAME[E, ...]` (only inside `at (...)`): an element of an integer input array, or a scalar
    /// input (no indices; written as a bare name, told apart from an axis once the header is read)
    Read(String, Vec<SizeExpr>),
}

/// Why a size expression has no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// A name with no value.
    Unbound(String),
    /// `/`, `%` or `cdiv` by a divisor that is not positive.
    Divisor {
        /// The divisor as written.
        divisor: String,
        /// Its value.
        value: i64,
    },
    /// A result beyond 64 bits.
    Overflow,
    /// Inside `at (...)`: an axis multiplied by an axis, or under `/`, `%`, `cdiv`, `min`, `max`.
    NotAffine(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Unbound(n) => write!(f, "`{n}` has no value"),
            SizeError::Divisor { divisor, value } => write!(f, "divides by `{divisor}`, which is {value}"),
            SizeError::Overflow => f.write_str("the value does not fit in 64 bits"),
            SizeError::NotAffine(e) => write!(f, "`{e}` is not affine in the grid axes"),
        }
    }
}

impl SizeExpr {
    fn level(&self) -> u8 {
        match self {
            SizeExpr::Bin(op, ..) => op.infix().map_or(4, |(_, l)| l),
            SizeExpr::Neg(_) => 3,
            SizeExpr::Int(v) if *v < 0 => 3,
            _ => 4,
        }
    }

    /// Whether the expression names `name`.
    pub fn mentions(&self, name: &str) -> bool {
        match self {
            SizeExpr::Name(n) => n == name,
            e => e.children().any(|c| c.mentions(name)),
        }
    }

    /// The expressions directly inside this one.
    pub fn children(&self) -> impl Iterator<Item = &SizeExpr> {
        let (pair, list): ([Option<&SizeExpr>; 2], &[SizeExpr]) = match self {
            SizeExpr::Int(_) | SizeExpr::Name(_) => ([None, None], &[]),
            SizeExpr::Neg(e) => ([Some(e), None], &[]),
            SizeExpr::Bin(_, a, b) => ([Some(a), Some(b)], &[]),
            SizeExpr::Select(abc) => ([None, None], abc.as_slice()),
            SizeExpr::Read(_, ix) => ([None, None], ix),
        };
        pair.into_iter().flatten().chain(list)
    }

    /// Every name in the expression, in order of first appearance.
    pub fn names(&self) -> Vec<&str> {
        fn walk<'a>(e: &'a SizeExpr, out: &mut Vec<&'a str>) {
            match e {
                SizeExpr::Name(n) => {
                    if !out.contains(&n.as_str()) {
                        out.push(n);
                    }
                }
                e => e.children().for_each(|c| walk(c, out)),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    /// The expression with every name-free part computed (`N*(2 + 2)` is `N*4`); parts whose
    /// computation fails are kept, so that evaluation reports the failure.
    pub fn fold(self) -> SizeExpr {
        match self {
            SizeExpr::Neg(e) => match e.fold() {
                SizeExpr::Int(v) if v != i64::MIN => SizeExpr::Int(-v),
                e => SizeExpr::Neg(Box::new(e)),
            },
            SizeExpr::Bin(op, a, b) => match (a.fold(), b.fold()) {
                (SizeExpr::Int(x), SizeExpr::Int(y)) if apply(op, x, y, &|| String::new()).is_ok() => {
                    SizeExpr::Int(apply(op, x, y, &|| String::new()).expect("checked"))
                }
                (a, b) => SizeExpr::Bin(op, Box::new(a), Box::new(b)),
            },
            SizeExpr::Select(abc) => match abc.map(SizeExpr::fold) {
                [SizeExpr::Int(c), SizeExpr::Int(a), SizeExpr::Int(b)] => SizeExpr::Int(if c != 0 { a } else { b }),
                folded => SizeExpr::Select(Box::new(folded)),
            },
            SizeExpr::Read(n, ix) => SizeExpr::Read(n, ix.into_iter().map(SizeExpr::fold).collect()),
            e => e,
        }
    }

    /// The expression with each name that `param` gives a value replaced by it.
    pub fn bind(&self, param: &dyn Fn(&str) -> Option<i64>) -> SizeExpr {
        self.clone().rewrite(&|e| match e {
            SizeExpr::Name(n) => param(&n).map_or(SizeExpr::Name(n), SizeExpr::Int),
            e => e,
        })
    }

    /// The expression with `f` applied to every node, operands first.
    pub fn rewrite(self, f: &dyn Fn(SizeExpr) -> SizeExpr) -> SizeExpr {
        let go = |e: Box<SizeExpr>| Box::new(e.rewrite(f));
        f(match self {
            SizeExpr::Neg(e) => SizeExpr::Neg(go(e)),
            SizeExpr::Bin(op, a, b) => SizeExpr::Bin(op, go(a), go(b)),
            SizeExpr::Select(abc) => SizeExpr::Select(Box::new(abc.map(|e| e.rewrite(f)))),
            SizeExpr::Read(n, ix) => SizeExpr::Read(n, ix.into_iter().map(|e| e.rewrite(f)).collect()),
            e => e,
        })
    }

    /// The value with `value(name)` for every name.
    pub fn eval(&self, value: &dyn Fn(&str) -> Option<i64>) -> Result<i64, SizeError> {
        match self {
            SizeExpr::Int(v) => Ok(*v),
            SizeExpr::Name(n) => value(n).ok_or_else(|| SizeError::Unbound(n.clone())),
            SizeExpr::Neg(e) => e.eval(value)?.checked_neg().ok_or(SizeError::Overflow),
            SizeExpr::Bin(op, a, b) => apply(*op, a.eval(value)?, b.eval(value)?, &|| b.to_string()),
            SizeExpr::Select(abc) => {
                let [c, a, b] = abc.as_ref();
                if c.eval(value)? != 0 { a.eval(value) } else { b.eval(value) }
            }
            SizeExpr::Read(n, _) => Err(SizeError::Unbound(n.clone())),
        }
    }

    /// The expression as an affine function of the grid axes: names that `param` gives a value
    /// are parameters, the others axes.
    pub fn affine(&self, param: &dyn Fn(&str) -> Option<i64>) -> Result<Affine, SizeError> {
        let constant = |a: &Affine| a.terms.is_empty();
        Ok(match self {
            SizeExpr::Int(v) => Affine::constant(*v),
            SizeExpr::Name(n) => match param(n) {
                Some(v) => Affine::constant(v),
                None => Affine::axis(n),
            },
            SizeExpr::Neg(e) => scale(&e.affine(param)?, -1)?,
            SizeExpr::Bin(op, a, b) => {
                let (x, y) = (a.affine(param)?, b.affine(param)?);
                match op {
                    SizeOp::Add | SizeOp::Sub => {
                        let y = if *op == SizeOp::Sub { scale(&y, -1)? } else { y };
                        let mut out = x;
                        out.constant = out.constant.checked_add(y.constant).ok_or(SizeError::Overflow)?;
                        for (c, n) in &y.terms {
                            out.add_term(*c, n);
                        }
                        out
                    }
                    SizeOp::Mul if constant(&x) => scale(&y, x.constant)?,
                    SizeOp::Mul if constant(&y) => scale(&x, y.constant)?,
                    _ if constant(&x) && constant(&y) => Affine::constant(apply(*op, x.constant, y.constant, &|| b.to_string())?),
                    _ => return Err(SizeError::NotAffine(self.to_string())),
                }
            }
            // A `select` of constants is a constant (so that a computed index's canonical text,
            // parsed again, is the same index).
            SizeExpr::Select(abc) => {
                let [c, a, b] = abc.as_ref().each_ref().map(|e| e.affine(param));
                match (c?, a?, b?) {
                    (c, a, b) if constant(&c) && constant(&a) && constant(&b) => {
                        if c.constant != 0 { a } else { b }
                    }
                    _ => return Err(SizeError::NotAffine(self.to_string())),
                }
            }
            SizeExpr::Read(..) => return Err(SizeError::NotAffine(self.to_string())),
        })
    }
}

fn scale(a: &Affine, by: i64) -> Result<Affine, SizeError> {
    let mut out = Affine::constant(a.constant.checked_mul(by).ok_or(SizeError::Overflow)?);
    for (c, n) in &a.terms {
        out.add_term(c.checked_mul(by).ok_or(SizeError::Overflow)?, n);
    }
    Ok(out)
}

/// `x OP y` in 64 bits; `divisor` writes `y` for the error of a divisor that is not positive.
fn apply(op: SizeOp, x: i64, y: i64, divisor: &dyn Fn() -> String) -> Result<i64, SizeError> {
    let positive = || if y > 0 { Ok(()) } else { Err(SizeError::Divisor { divisor: divisor(), value: y }) };
    match op {
        SizeOp::Add => x.checked_add(y).ok_or(SizeError::Overflow),
        SizeOp::Sub => x.checked_sub(y).ok_or(SizeError::Overflow),
        SizeOp::Mul => x.checked_mul(y).ok_or(SizeError::Overflow),
        SizeOp::Div => positive().map(|()| x.div_euclid(y)),
        SizeOp::Rem => positive().map(|()| x.rem_euclid(y)),
        SizeOp::Cdiv => {
            positive()?;
            let q = x.div_euclid(y);
            Ok(if x.rem_euclid(y) == 0 { q } else { q + 1 })
        }
        _ => Ok(op.order(x, y).expect("an ordering operation")),
    }
}

impl fmt::Display for SizeExpr {
    /// Canonical text: fewest parentheses, `a + b`, `a - b`, `a*b`, `a / b`, `a % b`, `cdiv(a, b)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wrap = |f: &mut fmt::Formatter<'_>, e: &SizeExpr, paren: bool| {
            if paren { write!(f, "({e})") } else { write!(f, "{e}") }
        };
        match self {
            SizeExpr::Int(v) => write!(f, "{v}"),
            SizeExpr::Name(n) => f.write_str(n),
            SizeExpr::Neg(e) => {
                f.write_str("-")?;
                wrap(f, e, e.level() < 3)
            }
            SizeExpr::Bin(op, a, b) => match op.infix() {
                Some((sym, level)) => {
                    // Left-associative: a left operand of the same level needs no parentheses.
                    wrap(f, a, a.level() < level)?;
                    f.write_str(sym)?;
                    wrap(f, b, b.level() <= level)
                }
                None => write!(f, "{}({a}, {b})", op.call_name().expect("a call")),
            },
            SizeExpr::Select(abc) => write!(f, "select({}, {}, {})", abc[0], abc[1], abc[2]),
            SizeExpr::Read(n, ix) if ix.is_empty() => f.write_str(n),
            SizeExpr::Read(n, ix) => {
                write!(f, "{n}[")?;
                for (k, e) in ix.iter().enumerate() {
                    if k > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Box<SizeExpr> {
        Box::new(SizeExpr::Name(s.into()))
    }
    fn i(v: i64) -> Box<SizeExpr> {
        Box::new(SizeExpr::Int(v))
    }
    fn bin(op: SizeOp, a: Box<SizeExpr>, b: Box<SizeExpr>) -> Box<SizeExpr> {
        Box::new(SizeExpr::Bin(op, a, b))
    }

    #[test]
    fn floor_division_and_cdiv_by_hand() {
        let none = |_: &str| None;
        let cases =
            [(SizeOp::Div, -7, 2, -4), (SizeOp::Rem, -7, 2, 1), (SizeOp::Cdiv, 1000, 128, 8), (SizeOp::Cdiv, 1024, 128, 8)];
        for (op, x, y, want) in cases {
            assert_eq!(bin(op, i(x), i(y)).eval(&none), Ok(want), "{op:?} {x} {y}");
        }
        assert_eq!(
            bin(SizeOp::Div, n("N"), n("B")).eval(&|s| Some(if s == "N" { 8 } else { 0 })),
            Err(SizeError::Divisor { divisor: "B".into(), value: 0 })
        );
        assert_eq!(bin(SizeOp::Mul, i(i64::MAX), i(2)).eval(&none), Err(SizeError::Overflow));
    }

    #[test]
    fn printing_keeps_the_tree() {
        let e = bin(SizeOp::Mul, bin(SizeOp::Add, n("N"), i(1)), n("BM"));
        assert_eq!(e.to_string(), "(N + 1)*BM");
        let e = bin(SizeOp::Sub, n("a"), bin(SizeOp::Sub, n("b"), n("c")));
        assert_eq!(e.to_string(), "a - (b - c)");
        let e = bin(SizeOp::Cdiv, n("N"), bin(SizeOp::Mul, i(2), n("B")));
        assert_eq!(e.to_string(), "cdiv(N, 2*B)");
        assert_eq!(bin(SizeOp::Mul, n("N"), bin(SizeOp::Add, i(2), i(2))).fold().to_string(), "N*4");
    }

    #[test]
    fn affine_in_axes_with_parameter_coefficients() {
        let e = bin(SizeOp::Add, bin(SizeOp::Mul, n("i"), n("N")), i(1));
        let a = e.affine(&|s| (s == "N").then_some(3)).unwrap();
        assert_eq!(a.to_string(), "3*i + 1");
        let e = bin(SizeOp::Div, n("i"), i(2));
        assert!(matches!(e.affine(&|_| None), Err(SizeError::NotAffine(_))));
    }
}
