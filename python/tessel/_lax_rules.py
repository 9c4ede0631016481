"""Rules for values: elementwise maths, comparisons, casts, shapes, reductions and the other
`lax` primitives of a kernel body, grid and mesh indices, calls read inline (jnp's own
functions), and what has no effect where a kernel runs."""

from __future__ import annotations

import warnings

import numpy as np

from ._common import _BINARY, _COMPARE, _REDUCE, _SHIFTS, _UNARY, _ty
from ._jax_support import _INLINE
from ._rules import rule

@rule("program_id", "num_programs")
def _program_id(w, eqn) -> None:
    p = eqn.params
    name = eqn.primitive.name
    # The body's axis numbers skip the axes `vmap` added (Pallas's `vmapped_dims`).
    axis = p["axis"]
    w.op(eqn, f"{name} {w.body_axes[axis]}")


@rule("axis_index")
def _axis_index(w, eqn) -> None:
    p = eqn.params
    # A mesh axis's index (`jax.lax.axis_index` under `pl.kernel(mesh=...)`).
    axis = p["axis_name"]
    if not isinstance(axis, str):
        axis = axis[0] if isinstance(axis, tuple) and len(axis) == 1 else None
    if axis is None or axis not in w.axes:
        raise w.refuse(f"`axis_index` of {p['axis_name']!r}, which is not an axis of the kernel's mesh", eqn)
    w.op(eqn, f"program_id {axis}")


@rule(*(n for n in _UNARY if n != "round"))
def _unary(w, eqn) -> None:
    name = eqn.primitive.name
    w.op(eqn, f"{_UNARY[name]} {w.value(eqn.invars[0], eqn)}")


@rule("multiple_of")
def _multiple_of(w, eqn) -> None:
    # An alignment hint for the compiler; the value is unchanged.
    w.define(eqn.outvars[0], w.read(eqn.invars[0]))


@rule("reciprocal")
def _reciprocal(w, eqn) -> None:
    w.op(eqn, f"div 1.0, {w.value(eqn.invars[0], eqn)}")


@rule("clamp")
def _clamp(w, eqn) -> None:
    lo, x, hi = eqn.invars
    v = w.body.fresh()
    w.body.emit(f"{v} = max {w.value(x, eqn)}, {w.read(lo)} : {_ty(eqn.outvars[0].aval, w.kernel, eqn)}")
    w.op(eqn, f"min {v}, {w.read(hi)}")


@rule("reduce_and", "reduce_or")
def _all_or_any(w, eqn) -> None:
    name = eqn.primitive.name
    w.all_or_any(eqn, "min" if name == "reduce_and" else "max")


@rule("is_finite")
def _is_finite(w, eqn) -> None:
    # Neither infinite nor NaN: |x| < inf (false for NaN).
    a = w.body.fresh()
    w.body.emit(f"{a} = abs {w.value(eqn.invars[0], eqn)} : {_ty(eqn.invars[0].aval, w.kernel, eqn)}")
    w.op(eqn, f"lt {a}, inf")


@rule("square")
def _square(w, eqn) -> None:
    x = w.value(eqn.invars[0], eqn)
    w.op(eqn, f"mul {x}, {x}")


@rule(*_SHIFTS)
def _shift(w, eqn) -> None:
    w.shift(eqn)


@rule(*_BINARY, *_COMPARE)
def _binary(w, eqn) -> None:
    name = eqn.primitive.name
    a, b = eqn.invars
    op = _BINARY.get(name) or _COMPARE[name]
    w.op(eqn, f"{op} {w.value(a, eqn)}, {w.read(b)}")


@rule("select_n")
def _select_n(w, eqn) -> None:
    pred, *cases = eqn.invars
    if len(cases) != 2:
        raise w.refuse("`select_n` of more than two cases", eqn)
    if str(pred.aval.dtype) != "bool":
        raise w.refuse("`select_n` on an integer selector", eqn)
    on, off = w.read(cases[1]), w.read(cases[0])
    if not on.startswith("%") and not off.startswith("%"):
        on = w.value(cases[1], eqn)  # a block of one literal gives the type
    w.op(eqn, f"select {w.value(pred, eqn)}, {on}, {off}")


@rule("convert_element_type")
def _convert_element_type(w, eqn) -> None:
    x = eqn.invars[0]
    if str(x.aval.dtype) == "bool":
        # `pl.when(c)` lowers `c` to an int index for `cond`: remember the bool.
        w.bools[eqn.outvars[0]] = w.read(x)
        if w.uses.get(eqn.outvars[0]) == {"cond"}:
            return
    if x.aval.dtype == eqn.outvars[0].aval.dtype:
        w.define(eqn.outvars[0], w.read(x))
    else:
        w.op(eqn, f"cast {w.value(x, eqn)}")


@rule("reshape", "squeeze", "expand_dims")
def _reshape(w, eqn) -> None:
    out = eqn.outvars[0]
    w.define(out, w.reshaped(w.value(eqn.invars[0], eqn), out.aval.shape, _ty(out.aval, w.kernel, eqn)))


@rule("transpose")
def _transpose(w, eqn) -> None:
    p = eqn.params
    if tuple(p["permutation"]) == (1, 0) and w.uses.get(eqn.outvars[0]) == {"dot_general"}:
        # Only a `dot` reads it: the dot reads the operand transposed (`trans_a`/`trans_b`).
        w.transposed[eqn.outvars[0]] = eqn.invars[0]
        return
    perm = ", ".join(str(d) for d in p["permutation"])
    w.op(eqn, f"transpose {w.value(eqn.invars[0], eqn)} perm ({perm})")


@rule(*_REDUCE)
def _reduce(w, eqn) -> None:
    name = eqn.primitive.name
    w.reduce(eqn, _REDUCE[name])


@rule("argmax", "argmin")
def _arg_extreme(w, eqn) -> None:
    name = eqn.primitive.name
    w.arg_extreme(eqn, "max" if name == "argmax" else "min")


@rule("cumsum", "cumprod", "cummax", "cummin")
def _cumulative(w, eqn) -> None:
    name = eqn.primitive.name
    w.cumulative(eqn, name[3:])


@rule("erfc", "tan", "cbrt", "population_count", "clz")
def _composed(w, eqn) -> None:
    name = eqn.primitive.name
    w.composed(eqn, name)


@rule("nextafter")
def _nextafter(w, eqn) -> None:
    w.nextafter(eqn)


@rule("roll")
def _roll(w, eqn) -> None:
    w.roll(eqn)


@rule("threefry2x32")
def _threefry(w, eqn) -> None:
    w.threefry(eqn)


@rule("bitcast", "bitcast_convert_type")
def _bitcast(w, eqn) -> None:
    w.bitcast_value(eqn)


@rule("sort", "top_k", "rev")
def _permuted(w, eqn) -> None:
    name = eqn.primitive.name
    w.permuted(eqn, name)


@rule("stop_gradient", "copy")
def _identity(w, eqn) -> None:
    # The identity where the kernel runs (`jax.nn.softmax` stops the max's gradient).
    w.define(eqn.outvars[0], w.read(eqn.invars[0]))


@rule("slice")
def _slice(w, eqn) -> None:
    p = eqn.params
    # `x[1::2]` of a value: tessel's `slice` with a stride (none where every step is 1).
    start = ", ".join(str(int(s)) for s in p["start_indices"])
    steps = [int(s) for s in p.get("strides") or [1] * len(p["start_indices"])]
    stride = f" stride ({', '.join(map(str, steps))})" if any(k != 1 for k in steps) else ""
    w.op(eqn, f"slice {w.value(eqn.invars[0], eqn)} start ({start}){stride}")


@rule("concatenate")
def _concatenate(w, eqn) -> None:
    p = eqn.params
    args = ", ".join(w.value(v, eqn) for v in eqn.invars)
    w.op(eqn, f"concatenate {args} axis {p['dimension']}")


@rule("iota")
def _iota(w, eqn) -> None:
    p = eqn.params
    if p["dtype"] != np.int32 and str(p["dtype"]) != "int32":
        v = w.body.fresh()
        shape = ", ".join(str(d) for d in p["shape"])
        w.body.emit(f"{v} = iota {p['dimension']} : i32[{shape}]")
        w.op(eqn, f"cast {v}")
    else:
        w.op(eqn, f"iota {p['dimension']}")


@rule("sign")
def _sign(w, eqn) -> None:
    # -1 below zero, 1 above, and x itself otherwise (0, -0.0, NaN), as `lax.sign`;
    # `//` on integers uses it.
    x = w.value(eqn.invars[0], eqn)
    ty = _ty(eqn.outvars[0].aval, w.kernel, eqn)
    dtype = ty.split("[")[0]
    one = "1.0" if "f" in dtype else "1"
    neg, pos, t = w.body.fresh(), w.body.fresh(), w.body.fresh()
    if dtype.startswith("u"):
        # Unsigned: nothing is below zero.
        w.body.emit(f"{pos} = gt {x}, 0")
        w.op(eqn, f"select {pos}, {one}, {x}")
        return
    w.body.emit(f"{neg} = lt {x}, 0")
    w.body.emit(f"{t} = select {neg}, -{one}, {x} : {ty}")
    w.body.emit(f"{pos} = gt {x}, 0")
    w.op(eqn, f"select {pos}, {one}, {t}")


@rule(*_INLINE)
def _inline(w, eqn) -> None:
    w.inline(eqn)


@rule("debug_print", "debug_callback")
def _debug_print(w, eqn) -> None:
    k = w.kernel
    name = eqn.primitive.name
    # No effect on any result; tessel kernels do not print.
    warnings.warn(f"`{name}` in Pallas kernel `{k}`{f' (at {w.place})' if w.place else ''} is dropped: tessel kernels do not print", stacklevel=2)


@rule("round")
def _round(w, eqn) -> None:
    if int(eqn.params.get("rounding_method", 0)) != 0:
        _unary(w, eqn)
        return
    # `lax.round`'s default rounds ties away from zero: tessel's `round` (ties to even)
    # except at a tie, where x + 0.5 with the sign of x is exact.
    x = w.value(eqn.invars[0], eqn)
    ty = _ty(eqn.outvars[0].aval, w.kernel, eqn)
    r, d, a, tie, neg, half, h, away = (w.body.fresh() for _ in range(8))
    w.body.emit(f"{r} = round {x} : {ty}")
    w.body.emit(f"{d} = sub {x}, {r} : {ty}")
    w.body.emit(f"{a} = abs {d} : {ty}")
    w.body.emit(f"{tie} = eq {a}, 0.5")
    w.body.emit(f"{neg} = lt {x}, 0.0")
    w.body.emit(f"{half} = full 0.5 : {ty}")
    w.body.emit(f"{h} = select {neg}, -0.5, {half} : {ty}")
    w.body.emit(f"{away} = add {x}, {h} : {ty}")
    w.op(eqn, f"select {tie}, {away}, {r}")


@rule("tile")
def _tile(w, eqn) -> None:
    p = eqn.params
    if all(int(r) == 1 for r in p["reps"]):
        # Nothing copied (a 0-d value has no counts at all): the value itw.
        w.define(eqn.outvars[0], w.read(eqn.invars[0]))
        return
    # `jnp.tile` (and `pltpu.repeat`, which is one): the language's `tile` (JAX gives one
    # count per dimension).
    reps = tuple(int(r) for r in p["reps"])
    if len(reps) != len(eqn.invars[0].aval.shape) or 0 in reps:
        raise w.refuse(f"`tile` with repetitions {reps} of a {len(eqn.invars[0].aval.shape)}-dimensional value", eqn,
                          "give one repetition count of at least 1 per dimension (reshape first to add dimensions)")
    w.op(eqn, f"tile {w.value(eqn.invars[0], eqn)} reps ({', '.join(map(str, reps))})")


@rule("delay", "trace_value", "add_dependency", effect=True)
def _no_effect_here(w, eqn) -> None:
    """Nothing: a delay, a value traced for a profiler or `pltpu.touch` changes no result where a
    kernel runs."""
