"""Block index maps of the Pallas import (`tessel.pallas`): proved affine in the program ids
from their equations, or on a small grid at every point (`_affine`); or written as `.tk`
computed block indices (`_index_texts`, docs/language.md §2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ._errors import UnsupportedError
from ._jax_support import _INLINE, _jax


@dataclass
class _Affine:
    """A block index map proved affine: block index `d` is `origin[d] + sum_a coeffs[a][d] * i_a`."""

    origin: List[int]
    coeffs: List[List[int]]

    def text(self) -> List[str]:
        """Each dimension's block index as `.tk` text of the grid axes (`i0`, `i1`, ...)."""
        texts = []
        for d, o in enumerate(self.origin):
            terms = []
            for a, c in enumerate(self.coeffs):
                if c[d] == 1:
                    terms.append(f"i{a}")
                elif c[d] != 0:
                    terms.append(f"{c[d]}*i{a}")
            expr = " + ".join(terms)
            if o or not terms:
                expr = f"{expr} + {o}" if terms and o > 0 else (f"{expr} - {-o}" if terms else str(o))
            texts.append(expr.replace("+ -", "- "))
        return texts

    def covers(self, grid: Sequence[int], shape: Sequence[int], block: Sequence[int]) -> bool:
        """Whether the blocks of all grid points together cover the array (counted on grids of
        up to 2**22 points; a larger one is not proved)."""
        if math.prod(grid) > 1 << 22:
            return False
        points = np.indices(tuple(grid)).reshape(len(grid), -1) if grid else np.zeros((0, 1), dtype=np.int64)
        counts = [-(-s // b) for s, b in zip(shape, block)]
        index = [
            np.full(points.shape[1], o) + sum((c[d] * points[a] for a, c in enumerate(self.coeffs)), np.int64(0))
            for d, o in enumerate(self.origin)
        ]
        inside = np.ones(points.shape[1], dtype=bool)
        for i, n in zip(index, counts):
            inside &= (i >= 0) & (i < n)
        seen = np.zeros(counts, dtype=bool)
        seen[tuple(i[inside] for i in index)] = True
        return bool(seen.all())


#: The largest grid axis (`program_id` is `i32`): a dynamic axis's size in proofs about index maps.
_MAX_AXIS = (1 << 31) - 1
#: Grids of up to this many points are checked point by point where the index map's equations
#: do not prove it affine (`jnp.minimum(i, 7)` on a grid of 8 is affine there).
_EVERY_POINT = 1 << 16
#: Equations that pass an affine value through unchanged.
_SAME = {"copy", "copy_p", "multiple_of", "optimization_barrier"}


@dataclass
class _Form:
    """A value of an index map: `c + sum_a coeffs[a] * i_a` (an affine form of the program ids),
    or `known`, a value that does not depend on them."""

    c: int = 0
    coeffs: tuple = ()
    known: Any = None


class _NotAffine(Exception):
    """An equation of an index map that is not affine in the program ids."""

    def __init__(self, eqn):
        super().__init__(eqn.primitive.name)
        self.eqn = eqn


def _forms(jaxpr, consts, ins: List[_Form], axes: int) -> List[_Form]:
    """Each output of `jaxpr` as a `_Form` of its inputs' forms: sums, differences, negations and
    constant multiples of program ids are affine; an equation whose operands are all known is
    evaluated; any other equation that reads a program id raises `_NotAffine`."""
    _, core, _ = _jax()
    env: Dict[Any, _Form] = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = _Form(known=np.asarray(c))
    for v, f in zip(jaxpr.invars, ins):
        env[v] = f

    def read(atom) -> _Form:
        if isinstance(atom, core.Literal):
            return _Form(known=np.asarray(atom.val))
        return env[atom]

    def scalar_int(f: _Form) -> Optional[int]:
        """A known integer scalar's value (None for anything else)."""
        k = f.known
        if k is None or np.shape(k) != () or not np.issubdtype(np.asarray(k).dtype, np.integer):
            return None
        return int(k)

    def affine(f: _Form) -> Optional[_Form]:
        if f.known is None:
            return f
        v = scalar_int(f)
        return None if v is None else _Form(v, (0,) * axes)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        args = [read(a) for a in eqn.invars]
        if name in _INLINE:
            closed = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = closed.jaxpr if hasattr(closed, "jaxpr") else closed
            outs = _forms(inner, getattr(closed, "consts", ()), args, axes)
        elif all(a.known is not None for a in args):
            vals = eqn.primitive.bind(*[a.known for a in args], **eqn.params)
            vals = vals if eqn.primitive.multiple_results else [vals]
            outs = [_Form(known=np.asarray(v)) for v in vals]
        else:
            forms = [affine(a) for a in args]
            out_aval = eqn.outvars[0].aval
            integer = np.issubdtype(np.dtype(out_aval.dtype), np.integer) and tuple(out_aval.shape) == ()
            if not integer or any(f is None for f in forms):
                raise _NotAffine(eqn)
            if name in ("add", "sub"):
                a, b = forms
                sign = 1 if name == "add" else -1
                out = _Form(a.c + sign * b.c, tuple(x + sign * y for x, y in zip(a.coeffs, b.coeffs)))
            elif name == "neg":
                (a,) = forms
                out = _Form(-a.c, tuple(-x for x in a.coeffs))
            elif name == "mul" and any(not any(f.coeffs) for f in forms):
                a, b = forms
                k, f = (a.c, b) if not any(a.coeffs) else (b.c, a)
                out = _Form(k * f.c, tuple(k * x for x in f.coeffs))
            elif name in _SAME or name in ("convert_element_type", "reshape", "squeeze", "broadcast_in_dim"):
                # A cast between integer types or a reshape of a scalar (the output is an integer
                # scalar, checked above) keeps the value.
                out = forms[0]
            elif name == "integer_pow" and eqn.params.get("y") == 1:
                out = forms[0]
            else:
                raise _NotAffine(eqn)
            outs = [out]
        for v, f in zip(eqn.outvars, outs):
            env[v] = f
    return [read(a) for a in jaxpr.outvars]


def _affine(index_map, grid: Sequence[int], kernel: str, operand: str, scalars: int = 0) -> Optional[_Affine]:
    """The index map's block indices as an affine map of the grid axes, proved from its
    equations (`_forms`), or where they do not prove it and the grid has at most `_EVERY_POINT`
    points, by evaluating it at every point of the grid; never from samples. A program id of an
    axis of size 1 is the constant 0. None where it is not affine, or reads the `scalars`
    scalar-prefetch operands it may take after the program ids: then the body computes it
    (`_Writer.computed_blocks`)."""
    jax, core, _ = _jax()
    jaxpr = index_map.jaxpr
    if len(jaxpr.invars) != len(grid) + scalars:
        raise UnsupportedError(f"the index map of {operand} in Pallas kernel `{kernel}` takes operands other than the program ids", None, None)
    prefetched = jaxpr.invars[len(grid):]
    read = {a for e in jaxpr.eqns for a in list(e.invars) if not isinstance(a, core.Literal)}
    read |= {a for a in jaxpr.outvars if not isinstance(a, core.Literal)}
    if any(v in read for v in prefetched):
        return None
    n = len(grid)
    unit = lambda a: tuple(int(b == a) for b in range(n))  # noqa: E731
    ids = [_Form(known=np.int32(0)) if size == 1 else _Form(0, unit(a)) for a, size in enumerate(grid)]
    ids += [_Form(known=np.zeros(v.aval.shape, v.aval.dtype)) for v in prefetched]
    try:
        forms = _forms(jaxpr, index_map.consts, ids, n)
        outs = []
        for f in forms:
            if f.known is not None:
                if np.shape(f.known) != () or not np.issubdtype(np.asarray(f.known).dtype, np.integer):
                    raise _NotAffine(None)
                f = _Form(int(f.known), (0,) * n)
            outs.append(f)
        return _Affine([f.c for f in outs], [[f.coeffs[a] for f in outs] for a in range(n)])
    except _NotAffine:
        pass
    # Not affine anywhere (or on a grid too large to check): computed in the body.
    return _every_point(index_map, grid, prefetched)


#: The most nodes a computed block index may have (the `.tk` parser's limit on one expression's
#: operators, parentheses and calls is 256); a larger one is computed in the body instead.
_INDEX_NODES = 200


class _NotExpressible(Exception):
    """An index map that `.tk`'s computed block indices cannot write."""


@dataclass(frozen=True)
class _IVal:
    """A value of an index map as `.tk` text: its text, whether it is known to be >= 0, and its
    value where it is a known integer."""

    text: str
    nonneg: bool = False
    const: Optional[int] = None


def _lit(v: int) -> _IVal:
    return _IVal(str(int(v)), int(v) >= 0, int(v))


def _paren(t: str) -> str:
    """`t`, parenthesised unless it is one token, or one call or read closed by its last
    character."""
    if re.fullmatch(r"-?\w+", t):
        return t
    m = re.match(r"\w+[(\[]", t)
    if m:
        depth = 0
        for n, ch in enumerate(t[m.end() - 1 :], start=m.end() - 1):
            depth += ch in "(["
            depth -= ch in ")]"
            if depth == 0:
                if n == len(t) - 1:
                    return t
                break
    return f"({t})"


def _index_texts(index_map, grid: Sequence[int], tables: Sequence[Optional[str]]) -> Optional[List[str]]:
    """The index map as computed block indices (docs/language.md §2): `.tk` integer expressions
    of the grid axes (`i0`, `i1`, ...) and of reads of the scalar-prefetch operands it takes
    after the program ids (`tables`: each one's argument name, or None where it is not an integer
    array `.tk` can read there). Equations of known values are evaluated, comparisons of values
    known to be >= 0 with 0 are folded, and truncating `div` and `rem` are written with the
    floored `/` and `%` (plainly where the dividend is >= 0 and the divisor a positive integer).
    None where a primitive has no such expression, or the expression grows past `_INDEX_NODES`."""
    jax, core, _ = _jax()
    jaxpr = index_map.jaxpr
    env: Dict[Any, Any] = {}
    nodes = [0]

    def node(text: str, nonneg: bool = False) -> _IVal:
        nodes[0] += 1
        if nodes[0] > _INDEX_NODES:
            raise _NotExpressible()
        return _IVal(text, nonneg)

    for v, c in zip(jaxpr.constvars, index_map.consts):
        if np.ndim(c) != 0 or not np.issubdtype(np.asarray(c).dtype, np.integer):
            return None
        env[v] = _lit(int(c))
    for a, v in enumerate(jaxpr.invars[: len(grid)]):
        env[v] = _lit(0) if grid[a] == 1 else _IVal(f"i{a}", True)
    for v, t in zip(jaxpr.invars[len(grid) :], tables):
        env[v] = ("ref", t)

    def read(atom) -> _IVal:
        if isinstance(atom, core.Literal):
            val = np.asarray(atom.val)
            if np.ndim(val) != 0 or not (np.issubdtype(val.dtype, np.integer) or val.dtype == np.bool_):
                raise _NotExpressible()
            return _lit(int(val))
        got = env.get(atom)
        if not isinstance(got, _IVal):
            raise _NotExpressible()
        return got

    def call(f: str, *xs: _IVal, nonneg: bool = False) -> _IVal:
        return node(f"{f}({', '.join(x.text for x in xs)})", nonneg)

    def compare(name: str, a: _IVal, b: _IVal) -> _IVal:
        # Against 0, a value known to be >= 0 decides `lt` and `ge`.
        if a.nonneg and b.const == 0 and name in ("lt", "ge"):
            return _lit(int(name == "ge"))
        return call(name, a, b, nonneg=True)

    def select(c: _IVal, a: _IVal, b: _IVal) -> _IVal:
        if c.const is not None:
            return a if c.const != 0 else b
        if a.text == b.text:
            return a
        return node(f"select({c.text}, {a.text}, {b.text})", a.nonneg and b.nonneg)

    def minimum(a: _IVal, b: _IVal) -> _IVal:
        if a.const == 0 and b.nonneg or b.const == 0 and a.nonneg:
            return _lit(0)
        return call("min", a, b, nonneg=a.nonneg and b.nonneg)

    def trunc(name: str, a: _IVal, b: _IVal) -> _IVal:
        """Truncating `div`/`rem` with floored operations: plain where `a >= 0` and `b` is a
        positive integer, else corrected where the signs differ."""
        sym = "/" if name == "div" else "%"
        if a.nonneg and b.const is not None and b.const > 0:
            return node(f"{_paren(a.text)} {sym} {_paren(b.text)}", True)
        differ = call("ne", compare("lt", a, _lit(0)), compare("lt", b, _lit(0)))
        fix = minimum(call("ne", node(f"{_paren(a.text)} % {_paren(b.text)}"), _lit(0)), differ)
        q = node(f"{_paren(a.text)} / {_paren(b.text)} + {fix.text}")
        return q if name == "div" else node(f"{a.text} - {_paren(b.text)}*{_paren(q.text)}")

    def get(eqn) -> _IVal:
        from jax._src.state import indexing

        ref, *ix = eqn.invars
        table = env.get(ref)
        if not isinstance(table, tuple) or table[1] is None:
            raise _NotExpressible()
        indexers = jax.tree_util.tree_unflatten(eqn.params["tree"], ix)
        if len(indexers) != 1 or not isinstance(indexers[0], indexing.NDIndexer):
            raise _NotExpressible()
        at = []
        for i in indexers[0].indices:
            if isinstance(i, (int, np.integer)):
                at.append(str(int(i)))
            elif isinstance(i, indexing.Slice) or tuple(getattr(getattr(i, "aval", None), "shape", (1,))) != ():
                raise _NotExpressible()
            else:
                at.append(read(i).text)
        if len(at) != len(ref.aval.shape):
            raise _NotExpressible()
        return node(f"{table[1]}[{', '.join(at)}]")

    def one(eqn) -> _IVal:
        name = eqn.primitive.name
        out = eqn.outvars[0].aval
        dtype = np.dtype(out.dtype)
        if len(eqn.outvars) != 1 or tuple(out.shape) != () or not (np.issubdtype(dtype, np.integer) or dtype == np.bool_):
            raise _NotExpressible()
        args = [read(a) for a in eqn.invars]
        if all(a.const is not None for a in args):
            val = eqn.primitive.bind(*[np.asarray(a.const, dtype=a_.aval.dtype) if not isinstance(a_, core.Literal) else a_.val
                                       for a, a_ in zip(args, eqn.invars)], **eqn.params)
            return _lit(int(np.asarray(val)))
        if name == "add":
            a, b = args
            return a if b.const == 0 else b if a.const == 0 else node(f"{a.text} + {b.text}", a.nonneg and b.nonneg)
        if name == "sub":
            a, b = args
            return a if b.const == 0 else node(f"{a.text} - {_paren(b.text)}")
        if name == "mul":
            a, b = args
            if a.const == 1 or b.const == 1:
                return b if a.const == 1 else a
            return node(f"{_paren(a.text)}*{_paren(b.text)}", a.nonneg and b.nonneg)
        if name == "neg":
            return node(f"-{_paren(args[0].text)}")
        if name == "max":
            a, b = args
            return call("max", a, b, nonneg=a.nonneg or b.nonneg)
        if name == "min":
            return minimum(*args)
        if name in ("eq", "ne", "lt", "le", "gt", "ge"):
            return compare(name, *args)
        if name in ("div", "rem"):
            return trunc(name, *args)
        if name == "select_n":
            which, *cases = args
            r = cases[0]
            for k, c in enumerate(cases[1:], start=1):
                cond = which if len(cases) == 2 else call("eq", which, _lit(k))
                r = select(cond, c, r)
            return r
        if dtype == np.bool_ and name in ("and", "or"):
            return minimum(*args) if name == "and" else call("max", *args, nonneg=True)
        if dtype == np.bool_ and name == "not":
            return node(f"1 - {_paren(args[0].text)}", True)
        if name == "sign":
            (a,) = args
            return compare("gt", a, _lit(0)) if a.nonneg else node(f"gt({a.text}, 0) - lt({a.text}, 0)")
        if name == "abs":
            (a,) = args
            return a if a.nonneg else node(f"max({a.text}, -{_paren(a.text)})", True)
        if name == "clamp":
            lo, x, hi = args
            return call("min", call("max", x, lo, nonneg=lo.nonneg or x.nonneg), hi, nonneg=lo.nonneg)
        if name in _SAME or name in ("convert_element_type", "reshape", "squeeze", "broadcast_in_dim"):
            return args[0]
        if name == "integer_pow" and eqn.params.get("y") in (1, 2):
            (a,) = args
            return a if eqn.params["y"] == 1 else node(f"{_paren(a.text)}*{_paren(a.text)}", True)
        raise _NotExpressible()

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in _INLINE:
                closed = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
                inner = closed.jaxpr if hasattr(closed, "jaxpr") else closed
                if getattr(closed, "consts", ()):
                    raise _NotExpressible()
                for v, a in zip(inner.invars, eqn.invars):
                    env[v] = env.get(a) if not isinstance(a, core.Literal) else read(a)
                walk(inner)
                for o, i in zip(eqn.outvars, inner.outvars):
                    env[o] = read(i)
            elif eqn.primitive.name == "get":
                env[eqn.outvars[0]] = get(eqn)
            else:
                env[eqn.outvars[0]] = one(eqn)

    try:
        walk(jaxpr)
        return [read(o).text for o in jaxpr.outvars]
    except _NotExpressible:
        return None


def _every_point(index_map, grid: Sequence[int], prefetched) -> Optional[_Affine]:
    """The index map as an affine map of the grid axes where, evaluated at every point of a grid
    of at most `_EVERY_POINT` points, it is one; else None."""
    jax, core, _ = _jax()
    points = math.prod(grid)
    if points > _EVERY_POINT or points == 0:
        return None
    jaxpr = index_map.jaxpr
    dummies = [np.zeros(v.aval.shape, dtype=v.aval.dtype) for v in prefetched]
    ids = np.indices(tuple(grid)).reshape(len(grid), -1).astype(np.int32) if grid else np.zeros((0, 1), np.int32)
    try:
        outs = jax.vmap(lambda *p: core.eval_jaxpr(jaxpr, index_map.consts, *p, *dummies))(*ids) if grid else [
            np.reshape(o, (1,)) for o in core.eval_jaxpr(jaxpr, index_map.consts, *dummies)
        ]
        got = np.stack([np.broadcast_to(np.asarray(o), (ids.shape[1],)) for o in outs]).astype(np.int64)
    except Exception:
        return None
    origin = got[:, 0]
    # The point that is one step along axis a, the others 0, has flat index prod(grid[a+1:]).
    coeffs = []
    for a, size in enumerate(grid):
        step = math.prod(grid[a + 1:])
        coeffs.append(got[:, step] - origin if size > 1 else np.zeros_like(origin))
    want = origin[:, None] + sum((np.asarray(c)[:, None] * ids[a][None, :] for a, c in enumerate(coeffs)), np.int64(0))
    if not np.array_equal(got, want):
        return None
    return _Affine([int(o) for o in origin], [[int(v) for v in c] for c in coeffs])
