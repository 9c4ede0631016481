"""Operations on values in a Pallas kernel's body beyond one `.tk` operation each: shifts with
XLA's meaning, powers, `all`/`any`, broadcasts, reductions, `argmax`/`argmin`, composed
functions (`erfc`, `tan`, `cbrt`, bit counts), `pad`, cumulative operations, `dot_general`
(sorts and windows are `_order.py`'s, random numbers `_prng.py`'s)."""

from __future__ import annotations

import numpy as np

from ._common import _axis_last, _dims, _dot_acc, _inverse, _ty
from ._rules import rule


def _bits(dt: str) -> int:
    """The width of a tessel element type (`bf16` -> 16)."""
    return 32 if dt == "bool" else int(dt.lstrip("bfiu"))


class _Values:
    """The `_Writer`'s methods for values."""

    def shift(self, eqn) -> None:
        """`shift_left` and the two right shifts with XLA's meaning: a logical shift of a signed
        value (and an arithmetic one of an unsigned value) goes through the other signedness by
        `bitcast`; a count outside [0, bits) gives 0 (the arithmetic right shift: the sign, a
        shift by bits - 1), where tessel would take the count modulo 32."""
        a, b = eqn.invars
        name = eqn.primitive.name
        ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        base, _, dims = ty.partition("[")
        signed, bits = base.startswith("i"), int(base[1:])
        via = ("i" if {"shift_left": signed, "shift_right_arithmetic": True}.get(name, False) else "u") + str(bits)

        def emit(rhs: str, elem: str) -> str:
            v = self.body.fresh()
            self.body.emit(f"{v} = {rhs} : {elem}{'[' + dims if dims else ''}")
            return v

        x, n = self.value(a, eqn), self.read(b)
        if via != base:
            x = emit(f"bitcast {x}", via)
            n = emit(f"bitcast {n}", via) if n.startswith("%") else n
        op = "shl" if name == "shift_left" else "shr"
        if not n.startswith("%") and 0 <= int(float(n)) < bits:
            r = emit(f"{op} {x}, {n}", via)  # a literal count in range: the plain shift
        else:
            beyond = emit(f"shr {x}, {bits - 1}", via) if name == "shift_right_arithmetic" else emit("full 0", via)
            if n.startswith("%"):
                count = emit(f"bitcast {n}", "u" + str(bits)) if via.startswith("i") else n
                ok = emit(f"lt {count}, {bits}", "bool")
                r = emit(f"select {ok}, {emit(f'{op} {x}, {n}', via)}, {beyond}", via)
            else:
                r = beyond  # a literal count out of range
        if via != base:
            r = emit(f"bitcast {r}", base)
        self.define(eqn.outvars[0], r)

    # ---- indexing ----

    def integer_pow(self, eqn) -> None:
        """`x ** n` for an integer `n` as JAX computes it: by squaring (x^4 is (x x)(x x), not
        ((x x) x) x, which rounds otherwise), 1 for n = 0, and 1 / x^-n for n < 0."""
        y = eqn.params["y"]
        ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        one = "1.0" if ty.split("[")[0] in ("f32", "f16", "bf16") else "1"
        if y == 0:
            self.op(eqn, f"full {one}")
            return
        x, n, acc = self.value(eqn.invars[0], eqn), abs(y), None

        def mul(a: str, b: str) -> str:
            v = self.body.fresh()
            self.body.emit(f"{v} = mul {a}, {b} : {ty}")
            return v

        while n > 0:
            if n & 1:
                acc = x if acc is None else mul(acc, x)
            n >>= 1
            if n > 0:
                x = mul(x, x)
        if y < 0:
            self.op(eqn, f"div {one}, {acc}")
        else:
            self.define(eqn.outvars[0], acc)

    def all_or_any(self, eqn, op: str) -> None:
        """`reduce_and` / `reduce_or` (`jnp.all`, `jnp.any`): the bools as `i32` 0 and 1, their
        `min` / `max` along the axes, and whether that is not 0."""
        (x,) = eqn.invars
        shape = list(x.aval.shape)
        cur = self.body.fresh()
        ty = f"i32[{', '.join(map(str, shape))}]" if shape else "i32"
        self.body.emit(f"{cur} = cast {self.value(x, eqn)} : {ty}")
        for a in sorted(eqn.params["axes"], reverse=True):
            shape.pop(a)
            v = self.body.fresh()
            rest = f"[{', '.join(map(str, shape))}]" if shape else ""
            self.body.emit(f"{v} = {op} {cur} axis {a} : i32{rest}")
            cur = v
        self.op(eqn, f"ne {cur}, 0")

    def broadcast(self, eqn) -> None:
        """`broadcast_in_dim`, or `broadcast_to` (numpy's: the operand's dimensions last)."""
        (x,) = eqn.invars
        out = eqn.outvars[0]
        rank, out_rank = len(x.aval.shape), len(out.aval.shape)
        dims = eqn.params.get("broadcast_dimensions", tuple(range(out_rank - rank, out_rank)))
        ty = _ty(out.aval, self.kernel, eqn)
        src = self.read(x)
        if not x.aval.shape:
            if not src.startswith("%"):
                v = self.body.fresh()
                self.body.emit(f"{v} = full {src} : {ty}")
                self.define(out, v)
                return
            self.op(eqn, f"broadcast {src}")
            return
        # Dimensions the operand does not have become 1 (a reshape), then stretch (a broadcast).
        middle = [1] * len(out.aval.shape)
        for src_dim, out_dim in enumerate(dims):
            middle[out_dim] = x.aval.shape[src_dim]
        cur = self.value(x, eqn)
        dt = ty.split("[")[0]
        if tuple(middle) != tuple(x.aval.shape):
            cur = self.reshaped(cur, middle, f"{dt}[{', '.join(str(d) for d in middle)}]")
        if tuple(middle) != tuple(out.aval.shape):
            v = self.body.fresh()
            self.body.emit(f"{v} = broadcast {cur} : {ty}")
            cur = v
        self.define(out, cur)

    def reduce(self, eqn, op: str) -> None:
        (x,) = eqn.invars
        axes = sorted(eqn.params["axes"], reverse=True)
        cur = self.value(x, eqn)
        shape = list(x.aval.shape)
        dt = _ty(eqn.outvars[0].aval, self.kernel, eqn).split("[")[0]
        out = eqn.outvars[0]
        for a in axes:
            kept = shape.copy()
            kept[a] = 1
            shape.pop(a)
            v = self.body.fresh()
            rest = f"[{', '.join(str(d) for d in shape)}]" if shape else ""
            if len(axes) == 1 and self.count.get(out) == 1 and self.uses.get(out, set()) <= {"broadcast_in_dim", "reshape", "expand_dims"}:
                keep = f"{v} = {op} {cur} axis {a} keepdims : {dt}[{', '.join(str(d) for d in kept)}]"
                self.keepable[v] = (len(self.body.lines), "  " * self.body.depth + keep, tuple(kept))
            self.body.emit(f"{v} = {op} {cur} axis {a} : {dt}{rest}")
            cur = v
        self.define(out, cur)

    def arg_extreme(self, eqn, op: str) -> None:
        """`argmax`/`argmin` along one axis, as JAX defines them: the first index of the extreme,
        or of the first NaN where there is one (`max`/`min` propagate NaN, so a NaN is the
        extreme): the least of the indices where the element equals the extreme (or is NaN),
        the others made past the end."""
        (x,) = eqn.invars
        (axis,) = eqn.params["axes"]
        shape = list(x.aval.shape)
        dims = _dims
        kept = shape.copy()
        kept[axis] = 1
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        v = self.value(x, eqn)
        m, at, io, idx, r = (self.body.fresh() for _ in range(5))
        self.body.emit(f"{m} = {op} {v} axis {axis} keepdims : {dt}[{dims(kept)}]")
        self.body.emit(f"{at} = eq {v}, {m} : bool[{dims(shape)}]")
        if dt in ("f32", "f16", "bf16"):
            nan, either = self.body.fresh(), self.body.fresh()
            self.body.emit(f"{nan} = ne {v}, {v} : bool[{dims(shape)}]")
            self.body.emit(f"{either} = or {at}, {nan} : bool[{dims(shape)}]")
            at = either
        self.body.emit(f"{io} = iota {axis} : i32[{dims(shape)}]")
        self.body.emit(f"{idx} = select {at}, {io}, {shape[axis]} : i32[{dims(shape)}]")
        out = shape[:axis] + shape[axis + 1:]
        self.body.emit(f"{r} = min {idx} axis {axis} : i32{'[' + dims(out) + ']' if out else ''}")
        if np.dtype(eqn.params.get("index_dtype", np.int32)) != np.dtype(np.int32):
            self.op(eqn, f"cast {r}")
        else:
            self.define(eqn.outvars[0], r)

    def composed(self, eqn, name: str) -> None:
        """Elementwise functions tessel has no operation for, composed of its operations:
        `erfc` by the rational Chebyshev fit of Numerical Recipes' `erfcc` (`t e^(-z^2 + P(t))`,
        `t = 1 / (1 + z/2)`, relative error below 1.2e-7 for every `z`, `e^(-z^2)` taken without
        rounding `z^2`; so `gelu(approximate=False)` keeps its tail where `1 - erf` would cancel
        to 0), `tan` as `sin / cos`, `cbrt` as `|x|^(1/3)` with the sign (and zeros as they are),
        each in `f32` for `f16`/`bf16`; `population_count` by adding bit fields (SWAR) and `clz`
        by halving the search, both exact, on the integer's own bits (narrow ones zero-extended)."""
        x = self.value(eqn.invars[0], eqn)
        ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        dt, _, rest = ty.partition("[")
        sh = "[" + rest if rest else ""

        def e(rhs: str, d: str) -> str:
            return self.body.let(rhs, d + sh)

        if name in ("tan", "cbrt", "erfc"):
            w = "f32"
            if dt != w:
                x = e(f"cast {x}", w)
            v = {"tan": self._tan, "cbrt": self._cbrt, "erfc": self._erfc}[name](x, lambda rhs, d=w: e(rhs, d))
        else:
            bits = int(dt[1:])
            u = x
            if dt.startswith("i"):
                u = e(f"bitcast {x}", f"u{bits}")
            if bits != 32:
                u = e(f"cast {u}", "u32")
            v = self._popcount(u, lambda rhs, d="u32": e(rhs, d)) if name == "population_count" else self._clz(u, bits, lambda rhs, d="u32": e(rhs, d))
            w = "u32"
        if w == dt:
            self.define(eqn.outvars[0], v)
        elif dt.startswith("i") and int(dt[1:]) == 32:
            self.op(eqn, f"bitcast {v}")
        else:
            self.op(eqn, f"cast {v}")

    def bitcast_value(self, eqn) -> None:
        """`lax.bitcast_convert_type` between types of one width, and Pallas TPU's `bitcast`
        (`pltpu.bitcast`), whose change of width packs along the second-minor dimension."""
        x = eqn.invars[0]
        src = _ty(x.aval, self.kernel, eqn).split("[")[0]
        dst = _ty(eqn.outvars[0].aval, self.kernel, eqn).split("[")[0]
        if eqn.primitive.name == "bitcast_convert_type" and _bits(src) != _bits(dst):
            raise self.refuse("`bitcast_convert_type` between types of different widths", eqn)
        v, _ = self.packed(self.value(x, eqn), src, list(x.aval.shape), dst, eqn)
        self.define(eqn.outvars[0], v)

    def packed(self, v: str, src: str, shape, dst: str, eqn):
        """`v` (`src[shape]`) reinterpreted as `dst` as Pallas on TPU does it: of one width,
        element by element; to a type `r` times wider, `r` consecutive rows of the second-minor
        dimension packed into one, the first in the low bits (`bf16[2m, n]` -> `u32[m, n]`); to
        a narrower one, each row unpacked into `r`. Returns the value and its shape."""
        e = self.body.let
        a, b = _bits(src), _bits(dst)
        if a == b:
            return (v if src == dst else e(f"bitcast {v}", f"{dst}[{_dims(shape)}]")), shape
        if len(shape) < 2 or "bool" in (src, dst):
            raise self.refuse(f"a bitcast from {src} to {dst} of a value of {len(shape)} dimensions", eqn)
        *lead, m, n = shape
        k = max(a, b) // min(a, b)
        if a < b:
            out = lead + [m // k, n]
            split = e(f"reshape {v}", f"{src}[{_dims(lead + [m // k, k, n])}]")
            acc = None
            for j in range(k):
                start = _dims([0] * len(lead) + [0, j, 0])
                row = e(f"slice {split} start ({start})", f"{src}[{_dims(lead + [m // k, 1, n])}]")
                row = e(f"reshape {row}", f"{src}[{_dims(out)}]")
                if not src.startswith("u"):
                    row = e(f"bitcast {row}", f"u{a}[{_dims(out)}]")
                row = e(f"cast {row}", f"u{b}[{_dims(out)}]")
                if j:
                    row = e(f"shl {row}, {j * a}", f"u{b}[{_dims(out)}]")
                acc = row if acc is None else e(f"or {acc}, {row}", f"u{b}[{_dims(out)}]")
            return (acc if dst == f"u{b}" else e(f"bitcast {acc}", f"{dst}[{_dims(out)}]")), out
        out = lead + [m * k, n]
        bits = v if src.startswith("u") else e(f"bitcast {v}", f"u{a}[{_dims(shape)}]")
        parts = []
        for j in range(k):
            part = e(f"shr {bits}, {j * b}", f"u{a}[{_dims(shape)}]") if j else bits
            part = e(f"cast {part}", f"u{b}[{_dims(shape)}]")
            if dst != f"u{b}":
                part = e(f"bitcast {part}", f"{dst}[{_dims(shape)}]")
            parts.append(e(f"reshape {part}", f"{dst}[{_dims(lead + [m, 1, n])}]"))
        joined = e(f"concatenate {', '.join(parts)} axis {len(lead) + 1}", f"{dst}[{_dims(lead + [m, k, n])}]")
        return e(f"reshape {joined}", f"{dst}[{_dims(out)}]"), out

    def nextafter(self, eqn) -> None:
        """`nextafter(x, y)`, the float after `x` towards `y`, on the bits as C defines it and XLA
        computes it: NaN where either is NaN, `y` where they are equal, the smallest subnormal
        with `y`'s sign where `x` is a zero, else `x`'s bits one down where the result is
        smaller in magnitude (`|x| > |y|`, or the signs differ), one up otherwise. Zeros and
        equality are judged on the bits, so a caller whose CPU treats subnormals as zero (XLA's
        threads do) gets the same result."""
        x, y = (self.value(a, eqn) for a in eqn.invars)
        ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        dt, _, rest = ty.partition("[")
        sh = "[" + rest if rest else ""
        bits = "u32" if dt == "f32" else "u16"
        sign = 1 << (31 if dt == "f32" else 15)

        def e(rhs: str, d: str = bits) -> str:
            return self.body.let(rhs, d + sh)

        ux, uy = e(f"bitcast {x}"), e(f"bitcast {y}")
        ax, ay = e(f"and {ux}, {sign - 1}"), e(f"and {uy}, {sign - 1}")
        sx, sy = e(f"and {ux}, {sign}"), e(f"and {uy}, {sign}")
        smaller = e(f"or {e(f'gt {ax}, {ay}', 'bool')}, {e(f'ne {sx}, {sy}', 'bool')}", "bool")
        stepped = e(f"select {smaller}, {e(f'sub {ux}, 1')}, {e(f'add {ux}, 1')}")
        x_zero = e(f"eq {ax}, 0", "bool")
        moved = e(f"select {x_zero}, {e(f'or {sy}, 1')}, {stepped}")
        zeros = e(f"and {x_zero}, {e(f'eq {ay}, 0', 'bool')}", "bool")
        equal = e(f"or {e(f'eq {ux}, {uy}', 'bool')}, {zeros}", "bool")
        r = e(f"bitcast {e(f'select {equal}, {uy}, {moved}')}", dt)
        nan = e(f"or {e(f'ne {x}, {x}', 'bool')}, {e(f'ne {y}, {y}', 'bool')}", "bool")
        self.op(eqn, f"select {nan}, {e(f'add {x}, {y}', dt)}, {r}")

    @staticmethod
    def _tan(x, e):
        return e(f"div {e(f'sin {x}')}, {e(f'cos {x}')}")

    @staticmethod
    def _cbrt(x, e):
        r = e(f"pow {e(f'abs {x}')}, 0.3333333333333333")
        neg, minus = e(f"lt {x}, 0.0", "bool"), e(f"neg {r}")
        signed = e(f"select {neg}, {minus}, {r}")
        return e(f"select {e(f'eq {x}, 0.0', 'bool')}, {x}, {signed}")

    @staticmethod
    def _erfc(x, e):
        z = e(f"abs {x}")
        half = e(f"mul {z}, 0.5")
        t = e(f"div 1.0, {e(f'add {half}, 1.0')}")
        coef = [-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368]
        p = e("full 0.17087277")
        for c in coef:
            tp_ = e(f"mul {t}, {p}")
            p = e(f"add {tp_}, {c!r}")
        tp_ = e(f"mul {t}, {p}")
        poly = e(f"add {tp_}, -1.26551223")
        # e^(-z^2) without the rounding of z^2 (which e^ would magnify by z^2, up to 100):
        # z = r + (z - r) with r's low 12 bits cleared, so r^2 is exact and
        # -z^2 = -r^2 + (r - z)(r + z), the second term small.
        zbits = e(f"bitcast {z}", "u32")
        r = e(f"bitcast {e(f'and {zbits}, 4294963200', 'u32')}")
        rr = e(f"mul {r}, {r}")
        big = e(f"exp {e(f'neg {rr}')}")
        d, m = e(f"sub {r}, {z}"), e(f"add {r}, {z}")
        small = e(f"add {e(f'mul {d}, {m}')}, {poly}")
        ans = e(f"mul {e(f'mul {t}, {big}')}, {e(f'exp {small}')}")
        pos, other = e(f"ge {x}, 0.0", "bool"), e(f"sub 2.0, {ans}")
        return e(f"select {pos}, {ans}, {other}")

    @staticmethod
    def _popcount(u, e):
        pairs = e(f"and {e(f'shr {u}, 1')}, 1431655765")
        a = e(f"sub {u}, {pairs}")
        lo = e(f"and {a}, 858993459")
        hi = e(f"and {e(f'shr {a}, 2')}, 858993459")
        b = e(f"add {lo}, {hi}")
        quads = e(f"shr {b}, 4")
        c = e(f"and {e(f'add {b}, {quads}')}, 252645135")
        return e(f"shr {e(f'mul {c}, 16843009')}, 24")

    @staticmethod
    def _clz(u, bits, e):
        n = e("full 0")
        for k in (16, 8, 4, 2, 1):
            # Where the top k bits are zero: k more leading zeros, and the value shifted up.
            top = e(f"eq {e(f'shr {u}, {32 - k}')}, 0", "bool")
            more, up = e(f"add {n}, {k}"), e(f"shl {u}, {k}")
            n = e(f"select {top}, {more}, {n}")
            u = e(f"select {top}, {up}, {u}")
        # 32 for zero: the last step leaves the top bit 0 only then.
        zero, one_more = e(f"eq {u}, 0", "bool"), e(f"add {n}, 1")
        n = e(f"select {zero}, {one_more}, {n}")
        # A narrow integer, zero-extended, has 32 - bits more leading zeros than its own.
        return n if bits == 32 else e(f"sub {n}, {32 - bits}")

    def pad(self, eqn) -> None:
        """`lax.pad` (`jnp.pad` with a constant) without interior padding: along each axis a
        `slice` where the padding is negative (cropping), then blocks of the padding value
        concatenated before and after."""
        emit, fresh = self.body.emit, self.body.fresh
        x, value = eqn.invars
        config = eqn.params["padding_config"]
        if any(interior for _, _, interior in config):
            raise self.refuse("`pad` with interior padding", eqn, "pad the edges only (jnp.pad)")
        shape = list(x.aval.shape)
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        dims = _dims
        v = self.value(x, eqn)
        fill = self.read(value)
        for d, (lo, hi, _) in enumerate(config):
            if lo < 0 or hi < 0:
                start = [max(-lo, 0) if a == d else 0 for a in range(len(shape))]
                cut = shape.copy()
                cut[d] = shape[d] - max(-lo, 0) - max(-hi, 0)
                t = fresh()
                emit(f"{t} = slice {v} start ({dims(start)}) : {dt}[{dims(cut)}]")
                v, shape = t, cut
            parts = []
            for width in (max(lo, 0), None, max(hi, 0)):
                if width is None:
                    parts.append(v)
                elif width:
                    block = shape.copy()
                    block[d] = width
                    f = fresh()
                    fv = fill if fill.startswith("%") else fill
                    if fv.startswith("%"):
                        emit(f"{f} = broadcast {fv} : {dt}[{dims(block)}]")
                    else:
                        emit(f"{f} = full {fv} : {dt}[{dims(block)}]")
                    parts.append(f)
            if len(parts) > 1:
                shape[d] += max(lo, 0) + max(hi, 0)
                t = fresh()
                emit(f"{t} = concatenate {', '.join(parts)} axis {d} : {dt}[{dims(shape)}]")
                v = t
        self.define(eqn.outvars[0], v)

    def cumlogsumexp(self, eqn) -> None:
        """`lax.cumlogsumexp`: element `i` is `log(sum_{j <= i} e^x_j)` (reversed: `j >= i`),
        computed over every pair as `m_i + log(sum_j e^(x_j - m_i))` with `m_i` the running max
        (0 where it is infinite), so that no prefix underflows; in `f32`."""
        emit, fresh = self.body.emit, self.body.fresh
        (x,) = eqn.invars
        axis, reverse = eqn.params["axis"], eqn.params.get("reverse", False)
        shape = list(x.aval.shape)
        rank = len(shape)
        dims = _dims
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        v = self.value(x, eqn)
        if dt != "f32":
            c = fresh()
            emit(f"{c} = cast {v} : f32[{dims(shape)}]")
            v = c
        perm = _axis_last(axis, rank)
        moved = shape if perm is None else [shape[d] for d in perm]
        v = self.permute(v, "f32", shape, perm)
        lead, n = moved[:-1], moved[-1]
        sq = lead + [n, n]
        ri, cj, tri, xj, sel, m, fin, ms, mb, d, e, s, lg, out = (fresh() for _ in range(14))
        emit(f"{ri} = iota {len(lead)} : i32[{dims(sq)}]")
        emit(f"{cj} = iota {len(lead) + 1} : i32[{dims(sq)}]")
        emit(f"{tri} = {'ge' if reverse else 'le'} {cj}, {ri} : bool[{dims(sq)}]")
        emit(f"{xj} = reshape {v} : f32[{dims(lead + [1, n])}]")
        emit(f"{sel} = select {tri}, {xj}, -inf : f32[{dims(sq)}]")
        emit(f"{m} = max {sel} axis {len(lead) + 1} keepdims : f32[{dims(lead + [n, 1])}]")
        emit(f"{fin} = abs {m} : f32[{dims(lead + [n, 1])}]")
        emit(f"{mb} = lt {fin}, inf : bool[{dims(lead + [n, 1])}]")
        emit(f"{ms} = select {mb}, {m}, 0.0 : f32[{dims(lead + [n, 1])}]")
        emit(f"{d} = sub {sel}, {ms} : f32[{dims(sq)}]")
        emit(f"{e} = exp {d} : f32[{dims(sq)}]")
        emit(f"{s} = sum {e} axis {len(lead) + 1} keepdims : f32[{dims(lead + [n, 1])}]")
        emit(f"{lg} = log {s} : f32[{dims(lead + [n, 1])}]")
        emit(f"{out} = add {ms}, {lg} : f32[{dims(lead + [n, 1])}]")
        flat = fresh()
        emit(f"{flat} = reshape {out} : f32[{dims(moved)}]")
        v = self.permute(flat, "f32", moved, None if perm is None else _inverse(perm))
        if dt != "f32":
            self.op(eqn, f"cast {v}")
        else:
            self.define(eqn.outvars[0], v)

    def cumulative(self, eqn, op: str) -> None:
        """`cumsum`, `cumprod`, `cummax`, `cummin` (`jnp.cumsum`, `lax.cummax`, ...) along the last
        axis, or the first of a matrix, or another axis moved last by `transpose` and back after,
        by a triangular matrix (`iota`s compared): an integer sum
        is a `dot` with it (exact, wrapping); otherwise the elements it selects (the others the
        operation's identity) reduced in order (a product with its zeros would spread an
        infinity or NaN to the sums before it)."""
        (x,) = eqn.invars
        axis, reverse = eqn.params["axis"], eqn.params.get("reverse", False)
        shape = list(x.aval.shape)
        ty = _ty(x.aval, self.kernel, eqn)
        dt = ty.split("[")[0]
        first = axis == 0 and len(shape) == 2
        if dt == "bool":
            raise self.refuse(f"`cum{op}` of {ty}", eqn, "cast it to an integer first")
        # Along another axis: moved last by a `transpose`, and back after.
        perm = None if first else _axis_last(axis, len(shape))
        dims = _dims
        floats = dt in ("f32", "f16", "bf16")
        acc = "f32" if floats else ("u32" if dt.startswith("u") else "i32")
        emit = self.body.emit
        v = self.value(x, eqn)
        if dt != acc:
            c = self.body.fresh()
            emit(f"{c} = cast {v} : {acc}[{dims(shape)}]")
            v = c
        original = shape
        v = self.permute(v, acc, original, perm)
        if perm is not None:
            shape = [original[d] for d in perm]
        n = shape[-1] if perm is not None else shape[axis]
        # tri[p, q]: whether the element at q along the axis adds into the sum at p.
        rows, cols, tri = (self.body.fresh() for _ in range(3))
        emit(f"{rows} = iota 0 : i32[{n}, {n}]")
        emit(f"{cols} = iota 1 : i32[{n}, {n}]")
        emit(f"{tri} = {'le' if reverse else 'ge'} {rows}, {cols} : bool[{n}, {n}]")
        lead = int(np.prod(shape[:-1])) if not first else shape[1]
        d = self.body.fresh()
        identity = {
            "sum": "0", "prod": "1",
            "max": "-inf" if floats else str(-(2**31) if acc == "i32" else 0),
            "min": "inf" if floats else str(2**31 - 1 if acc == "i32" else 2**32 - 1),
        }[op]
        if floats and op in ("sum", "prod"):
            identity += ".0"
        if not floats and op == "sum":
            ones, t = self.body.fresh(), self.body.fresh()
            emit(f"{ones} = cast {tri} : {acc}[{n}, {n}]")
            if first:
                emit(f"{d} = dot {ones}, {v} : {acc}[{n}, {lead}]")
            else:
                m = self.body.fresh()
                emit(f"{m} = reshape {v} : {acc}[{lead}, {n}]")
                emit(f"{t} = dot {m}, {ones} trans_b : {acc}[{lead}, {n}]")
                emit(f"{d} = reshape {t} : {acc}[{dims(shape)}]")
        else:
            # [p, q, lead] (first axis) or [lead, p, q] (last): x at q where tri[p, q], reduced over q.
            xs, ts, sel, summed = (self.body.fresh() for _ in range(4))
            if first:
                emit(f"{xs} = reshape {v} : {acc}[1, {n}, {lead}]")
                emit(f"{ts} = reshape {tri} : bool[{n}, {n}, 1]")
                emit(f"{sel} = select {ts}, {xs}, {identity} : {acc}[{n}, {n}, {lead}]")
                emit(f"{d} = {op} {sel} axis 1 : {acc}[{n}, {lead}]")
            else:
                emit(f"{xs} = reshape {v} : {acc}[{lead}, 1, {n}]")
                emit(f"{ts} = reshape {tri} : bool[1, {n}, {n}]")
                emit(f"{sel} = select {ts}, {xs}, {identity} : {acc}[{lead}, {n}, {n}]")
                emit(f"{summed} = {op} {sel} axis 2 : {acc}[{lead}, {n}]")
                emit(f"{d} = reshape {summed} : {acc}[{dims(shape)}]")
        d = self.permute(d, acc, shape, None if perm is None else _inverse(perm))
        if acc != dt:
            self.op(eqn, f"cast {d}")
        else:
            self.define(eqn.outvars[0], d)

    def reshaped(self, value: str, shape, ty: str) -> str:
        """`value` reshaped to `shape` (of type `ty`): a reduction that only this reshape reads,
        restoring its axis as 1, is rewritten with `keepdims` instead."""
        kept = self.keepable.pop(value, None)
        if kept is not None and kept[2] == tuple(shape):
            self.body.lines[kept[0]] = kept[1]
            return value
        v = self.body.fresh()
        self.body.emit(f"{v} = reshape {value} : {ty}")
        return v

    def dot(self, eqn) -> None:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        a, b = eqn.invars
        nb = len(lb)
        if nb and tuple(lb) == tuple(rb) == tuple(range(nb)) and len(a.aval.shape) == len(b.aval.shape) == nb + 2:
            self.batched_dot(eqn)
            return
        if lb or rb or len(a.aval.shape) != 2 or len(b.aval.shape) != 2:
            raise self.refuse("`dot_general` other than a 2-D matrix product or one batched over the same leading dimensions", eqn)
        ta, tb = tuple(lc) == (0,), tuple(rc) == (1,)
        # An operand transposed only for this dot is read transposed instead.
        if a in self.transposed:
            a, ta = self.transposed[a], not ta
        if b in self.transposed:
            b, tb = self.transposed[b], not tb
        flags = (" trans_a" if ta else "") + (" trans_b" if tb else "")
        v = self.body.fresh()
        va, vb = self.value(a, eqn), self.value(b, eqn)
        # Operands of two dtypes (`f32` queries against `bf16` keys): both in the wider, as XLA
        # converts them before the product.
        da, db = (_ty(x.aval, self.kernel, eqn).split("[")[0] for x in (a, b))
        operand = a.aval.dtype
        if da != db:
            wider = a if np.dtype(a.aval.dtype).itemsize >= np.dtype(b.aval.dtype).itemsize else b
            operand = wider.aval.dtype
            wide = _ty(wider.aval, self.kernel, eqn).split("[")[0]
            narrow, shape = (vb, b.aval.shape) if wider is a else (va, a.aval.shape)
            c = self.body.fresh()
            self.body.emit(f"{c} = cast {narrow} : {wide}[{', '.join(map(str, shape))}]")
            va, vb = (va, c) if wider is a else (c, vb)
        acc = _dot_acc(operand)
        m = a.aval.shape[1 if ta else 0]
        n = b.aval.shape[0 if tb else 1]
        self.body.emit(f"{v} = dot {va}, {vb}{flags} : {acc}[{m}, {n}]")
        self.define_product(eqn, v, acc)

    def define_product(self, eqn, v: str, acc: str) -> None:
        """A `dot`'s result `v` (accumulated in `acc`) as the equation's output, `cast` to its
        `preferred_element_type` where that differs."""
        want = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        if want.split("[")[0] != acc:
            v = self.body.let(f"cast {v}", want)
        self.define(eqn.outvars[0], v)

    def batched_dot(self, eqn) -> None:
        """`dot_general` batched over the leading dimensions of both operands
        (`einsum('bqd,bkd->bqk')`, `einsum('bhqd,bhkd->bhqk')`): the language's batched `dot`
        (docs/language.md §3), one product of matrices per leading index."""
        (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
        a, b = eqn.invars
        nb = len(lb)
        lead = list(a.aval.shape[:nb])
        (a1, a2), (b1, b2) = a.aval.shape[nb:], b.aval.shape[nb:]
        ta, tb = tuple(lc) == (nb,), tuple(rc) == (nb + 1,)
        flags = (" trans_a" if ta else "") + (" trans_b" if tb else "")
        acc = _dot_acc(a.aval.dtype)
        m, n = (a2 if ta else a1), (b1 if tb else b2)
        if int(np.prod(lead)) > 256:
            raise self.refuse(f"`dot_general` batched over {lead} ({int(np.prod(lead))} products of matrices)", eqn,
                              "tessel's batched dot takes at most 256; batch over the grid instead (a grid axis per batch dimension)")
        v = self.body.fresh()
        self.body.emit(f"{v} = dot {self.value(a, eqn)}, {self.value(b, eqn)}{flags} : {acc}[{', '.join(map(str, lead + [m, n]))}]")
        self.define_product(eqn, v, acc)


# The rules this family gives the writer (`_rules.RULES`): its methods of (writer, equation).
rule("integer_pow")(_Values.integer_pow)
rule("pad")(_Values.pad)
rule("cumlogsumexp")(_Values.cumlogsumexp)
rule("dot_general")(_Values.dot)
rule("broadcast_in_dim", "broadcast_to")(_Values.broadcast)
