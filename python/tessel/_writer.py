"""The body of a Pallas kernel as `.tk` statements: `_Writer` walks the jaxpr, keeping what each
variable is (a `%value`, a literal, a ref) and writing each equation."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._common import _UNARY, _BINARY, _SHIFTS, _COMPARE, _REDUCE, _EFFECTS, _where, _refuse, _ty, _literal, _Body
from ._control import _Control
from ._errors import UnsupportedError
from ._jax_support import _INLINE, _jax
from ._multi_index import _MultiIndex
from ._order import _Order
from ._prng import _Prng
from ._refs import _Refs
from ._values import _Values


#: Primitives each written by one method of the writer (or its op families), by name.
_RULES = {
    "dma_start": "dma",
    "integer_pow": "integer_pow",
    "pad": "pad",
    "cumlogsumexp": "cumlogsumexp",
    "dynamic_slice": "dynamic_slice",
    "dynamic_update_slice": "dynamic_update_slice",
    "dot_general": "dot",
    "cond": "cond",
    "scan": "scan",
    "while": "fori_while",
    "run_scoped": "run_scoped",
    "masked_load": "masked",
    "masked_swap": "masked",
    "broadcast_in_dim": "broadcast",
    "broadcast_to": "broadcast",
    "gather": "value_gather",
    "prng_seed": "prng_seed",
    "prng_random_bits": "prng_random_bits",
    "random_seed": "random_seed",
    "random_bits": "random_bits",
    "random_fold_in": "random_fold_in",
    "random_split": "random_split",
    "random_wrap": "random_wrap",
    "random_unwrap": "random_unwrap",
}


class _Writer(_Refs, _MultiIndex, _Values, _Order, _Prng, _Control):
    """One kernel body being written: the jaxpr's equations in order, each as `.tk` statements
    (`write` dispatches by primitive; `_refs`, `_values` and `_control` hold the larger rules)."""

    def __init__(self, kernel: str, grid_axes: List[str]):
        self.kernel = kernel
        self.axes = grid_axes
        #: The axes `pl.program_id(k)` counts: all but those `vmap` added.
        self.body_axes = grid_axes
        #: The starts of the runs the current equation indexes with (`run_start`), by atom `id`.
        self.runs: Dict[int, Optional[str]] = {}
        #: While `gather` writes its load: (the index array, its `%value` as an `i32` vector).
        self.entry: Optional[Tuple[Any, str]] = None
        #: Index arrays a multi-array gather picks from after its load (indexed whole, `:`).
        self.whole: set = set()
        #: The scratch holding Pallas TPU's PRNG state, once the kernel seeds or draws (`prng_state`).
        self.prng: Optional[str] = None
        self.body = _Body(kernel)
        #: jaxpr var -> `%value`, a literal's text, or ("ref", name).
        self.env: Dict[Any, Any] = {}
        #: int indices of `cond` made from a bool -> that bool's `%value`.
        self.bools: Dict[Any, str] = {}
        #: jaxpr var -> the primitives that use it.
        self.uses: Dict[Any, set] = {}
        #: argument -> its block dimensions Pallas squeezes away (`None`, `pl.squeezed`).
        self.squeezed: Dict[str, List[int]] = {}
        #: How many equations read each jaxpr var.
        self.count: Dict[Any, int] = {}
        #: A one-axis reduction whose only reader reshapes it: its `%value` -> (the index of its
        #: line, the line with `keepdims`, the kept shape), so the reshape can become `keepdims`
        #: (the interpreter and wgpu fuse `max`/`sum ... keepdims` rows with what follows).
        self.keepable: Dict[str, Any] = {}
        #: a 2-D transpose only a `dot` reads -> the operand it transposes.
        self.transposed: Dict[Any, Any] = {}
        #: The user's line of the equation being written, for errors inside jnp's functions.
        self.place = ""
        #: The `scratch` lines of `run_scoped` allocations (`r0`, `r1`, ...).
        self.scoped: List[str] = []
        #: An argument whose index map is computed (not affine, or reading scalar-prefetch
        #: operands) -> the element offset of its block along each array dimension, made at the
        #: top of the body from the program ids (`computed_blocks`).
        self.offsets: Dict[str, List[str]] = {}
        #: jaxpr var -> the equation that makes it (to recognise `start + jnp.arange(n)`).
        self.defs: Dict[Any, Any] = {}

    # ---- operands ----

    def read(self, atom) -> str:
        _, core, _ = _jax()
        if isinstance(atom, core.Literal):
            return _literal(atom.val)
        v = self.env[atom]
        if isinstance(v, tuple):
            raise self.refuse("a reference used as a value", None)
        return v

    def ref(self, atom, eqn) -> str:
        v = self.env.get(atom)
        if not isinstance(v, tuple):
            raise self.refuse(f"`{eqn.primitive.name}` of something that is not a kernel argument", eqn)
        return v[1]

    def value(self, atom, eqn) -> str:
        """An operand that must be a `%value` (a literal is materialised with `full`)."""
        text = self.read(atom)
        if text.startswith("%"):
            return text
        v = self.body.fresh()
        self.body.emit(f"{v} = full {text} : {_ty(atom.aval, self.kernel, eqn)}")
        return v

    def define(self, var, text: str) -> None:
        self.env[var] = text

    def op(self, eqn, rhs: str) -> None:
        (out,) = eqn.outvars
        v = self.body.fresh()
        self.body.emit(f"{v} = {rhs} : {_ty(out.aval, self.kernel, eqn)}")
        self.define(out, v)

    def computed_blocks(self, computed, scalars: List[str]) -> None:
        """At the top of the body: each computed index map evaluated from the program ids (and
        the scalar-prefetch operands it reads, loaded as the body loads them), and its block
        indices times the block sizes as element offsets."""
        _, core, _ = _jax()
        ids: Dict[int, str] = {}
        for arg, (index_map, blocks) in computed.items():
            jaxpr = index_map.jaxpr
            if index_map.consts:
                raise UnsupportedError(f"the index map of `{arg}` in Pallas kernel `{self.kernel}` captures constants", None, None)
            read = {a for e in jaxpr.eqns for a in e.invars if not isinstance(a, core.Literal)}
            read |= {a for a in jaxpr.outvars if not isinstance(a, core.Literal)}
            # A program id once per axis that some map reads.
            for a, var in enumerate(jaxpr.invars[:len(self.axes)]):
                if var in read and a not in ids:
                    ids[a] = self.body.fresh()
                    self.body.emit(f"{ids[a]} = program_id {self.axes[a]}")
                if a in ids:
                    self.env[var] = ids[a]
            for var, s in zip(jaxpr.invars[len(self.axes):], scalars):
                self.env[var] = ("ref", s)
            self.eqns(jaxpr)
            offsets = []
            for out, b in zip(jaxpr.outvars, blocks):
                index = self.read(out)
                if not index.startswith("%"):
                    offsets.append(str(int(index) * b))
                elif b == 1:
                    offsets.append(index)
                else:
                    v = self.body.fresh()
                    self.body.emit(f"{v} = mul {index}, {b}")
                    offsets.append(v)
            self.offsets[arg] = offsets

    # ---- the body ----

    def eqns(self, jaxpr) -> None:
        _, core, _ = _jax()
        # What each value of this jaxpr is used by: an unused value of a pure operation is not
        # written, nor the old value a store returns, nor the int a `pl.when` makes for `cond`.
        for eqn in jaxpr.eqns:
            for a in eqn.invars:
                if not isinstance(a, core.Literal):
                    self.uses.setdefault(a, set()).add(eqn.primitive.name)
                    self.count[a] = self.count.get(a, 0) + 1
        for a in jaxpr.outvars:
            if not isinstance(a, core.Literal):
                self.uses.setdefault(a, set()).add("yield")
        for eqn in jaxpr.eqns:
            for o in eqn.outvars:
                self.defs[o] = eqn
        for eqn in jaxpr.eqns:
            effects = eqn.primitive.name in _EFFECTS or eqn.primitive.name in _INLINE
            if effects or any(o in self.uses for o in eqn.outvars):
                self.eqn(eqn)

    def eqn(self, eqn) -> None:
        outer = self.place
        self.place = _where(eqn) or outer
        self.runs = {}
        try:
            self.write(eqn)
        finally:
            self.place = outer

    def refuse(self, what: str, eqn, hint: Optional[str] = None) -> UnsupportedError:
        return _refuse(what, self.kernel, eqn, hint, self.place)

    def write(self, eqn) -> None:
        name = eqn.primitive.name
        p = eqn.params
        k = self.kernel
        vec = self.gather_index(p["tree"], eqn.invars[1:]) if name == "get" else None
        if name in _RULES:
            getattr(self, _RULES[name])(eqn)
        elif name == "get" and (arrays := self.gather_indices(p["tree"], eqn.invars[1:])):
            ref, *ix = eqn.invars
            self.multi_gather(eqn, ref, p["tree"], ix, arrays)
        elif vec is not None:
            ref, *ix = eqn.invars
            self.gather(eqn, ref, p["tree"], ix, vec)
        elif name == "get":
            ref, *ix = eqn.invars
            transforms = self.transforms(eqn, p["tree"], ix)
            v = self.reshaped_get(eqn, ref, transforms)
            if v is None:
                v = self.body.let(f"load {self.ref(ref, eqn)}{self.indexers(eqn, ref, transforms)}", _ty(eqn.outvars[0].aval, k, eqn))
            self.define(eqn.outvars[0], v)
        elif name == "swap" and (arrays := self.gather_indices(p["tree"], eqn.invars[2:])):
            ref, val, *ix = eqn.invars
            self.multi_scatter(eqn, ref, val, p["tree"], ix, arrays)
        elif name == "swap" and self.gather_index(p["tree"], eqn.invars[2:]) is not None:
            ref, val, *ix = eqn.invars
            self.scatter(eqn, ref, val, p["tree"], ix, self.gather_index(p["tree"], ix))
        elif name == "swap" and self.is_reshaped(transforms := self.transforms(eqn, p["tree"], eqn.invars[2:])):
            ref, val, old = eqn.invars[0], eqn.invars[1], eqn.outvars[0]
            before = self.reshaped_swap(eqn, ref, self.value(val, eqn), transforms, old in self.uses)
            if before:
                self.define(old, before)
        elif name == "swap":
            ref, val, *ix = eqn.invars
            index = self.index(eqn, ref, p["tree"], ix)
            old = eqn.outvars[0]
            if old in self.uses:
                # The value before the store, where the kernel reads it (`x = o_ref.swap(v)`).
                v = self.body.fresh()
                self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index} : {_ty(old.aval, k, eqn)}")
                self.define(old, v)
            self.body.emit(f"store {self.ref(ref, eqn)}{index}, {self.value(val, eqn)}")
        elif name == "dma_wait":
            pass  # the copy was made when it started
        elif name in ("program_id", "num_programs"):
            # The body's axis numbers skip the axes `vmap` added (Pallas's `vmapped_dims`).
            axis = p["axis"]
            self.op(eqn, f"{name} {self.body_axes[axis]}")
        elif name == "axis_index":
            # A mesh axis's index (`jax.lax.axis_index` under `pl.kernel(mesh=...)`).
            axis = p["axis_name"]
            if not isinstance(axis, str):
                axis = axis[0] if isinstance(axis, tuple) and len(axis) == 1 else None
            if axis is None or axis not in self.axes:
                raise self.refuse(f"`axis_index` of {p['axis_name']!r}, which is not an axis of the kernel's mesh", eqn)
            self.op(eqn, f"program_id {axis}")
        elif name == "round" and int(p.get("rounding_method", 0)) == 0:
            # `lax.round`'s default rounds ties away from zero: tessel's `round` (ties to even)
            # except at a tie, where x + 0.5 with the sign of x is exact.
            x = self.value(eqn.invars[0], eqn)
            ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
            r, d, a, tie, neg, h, away = (self.body.fresh() for _ in range(7))
            self.body.emit(f"{r} = round {x} : {ty}")
            self.body.emit(f"{d} = sub {x}, {r} : {ty}")
            self.body.emit(f"{a} = abs {d} : {ty}")
            self.body.emit(f"{tie} = eq {a}, 0.5")
            self.body.emit(f"{neg} = lt {x}, 0.0")
            self.body.emit(f"{h} = select {neg}, -0.5, 0.5 : {ty}")
            self.body.emit(f"{away} = add {x}, {h} : {ty}")
            self.op(eqn, f"select {tie}, {away}, {r}")
        elif name in _UNARY:
            self.op(eqn, f"{_UNARY[name]} {self.value(eqn.invars[0], eqn)}")
        elif name == "multiple_of":
            # An alignment hint for the compiler; the value is unchanged.
            self.define(eqn.outvars[0], self.read(eqn.invars[0]))
        elif name == "reciprocal":
            self.op(eqn, f"div 1.0, {self.value(eqn.invars[0], eqn)}")
        elif name == "clamp":
            lo, x, hi = eqn.invars
            v = self.body.fresh()
            self.body.emit(f"{v} = max {self.value(x, eqn)}, {self.read(lo)} : {_ty(eqn.outvars[0].aval, self.kernel, eqn)}")
            self.op(eqn, f"min {v}, {self.read(hi)}")
        elif name in ("reduce_and", "reduce_or"):
            self.all_or_any(eqn, "min" if name == "reduce_and" else "max")
        elif name == "is_finite":
            # Neither infinite nor NaN: |x| < inf (false for NaN).
            a = self.body.fresh()
            self.body.emit(f"{a} = abs {self.value(eqn.invars[0], eqn)} : {_ty(eqn.invars[0].aval, self.kernel, eqn)}")
            self.op(eqn, f"lt {a}, inf")
        elif name == "square":
            x = self.value(eqn.invars[0], eqn)
            self.op(eqn, f"mul {x}, {x}")
        elif name in _SHIFTS:
            self.shift(eqn)
        elif name in _BINARY or name in _COMPARE:
            a, b = eqn.invars
            op = _BINARY.get(name) or _COMPARE[name]
            self.op(eqn, f"{op} {self.value(a, eqn)}, {self.read(b)}")
        elif name == "select_n":
            pred, *cases = eqn.invars
            if len(cases) != 2:
                raise self.refuse("`select_n` of more than two cases", eqn)
            if str(pred.aval.dtype) != "bool":
                raise self.refuse("`select_n` on an integer selector", eqn)
            on, off = self.read(cases[1]), self.read(cases[0])
            if not on.startswith("%") and not off.startswith("%"):
                on = self.value(cases[1], eqn)  # a block of one literal gives the type
            self.op(eqn, f"select {self.value(pred, eqn)}, {on}, {off}")
        elif name == "convert_element_type":
            x = eqn.invars[0]
            if str(x.aval.dtype) == "bool":
                # `pl.when(c)` lowers `c` to an int index for `cond`: remember the bool.
                self.bools[eqn.outvars[0]] = self.read(x)
                if self.uses.get(eqn.outvars[0]) == {"cond"}:
                    return
            if x.aval.dtype == eqn.outvars[0].aval.dtype:
                self.define(eqn.outvars[0], self.read(x))
            else:
                self.op(eqn, f"cast {self.value(x, eqn)}")
        elif name in ("reshape", "squeeze", "expand_dims"):
            out = eqn.outvars[0]
            self.define(out, self.reshaped(self.value(eqn.invars[0], eqn), out.aval.shape, _ty(out.aval, self.kernel, eqn)))
        elif name == "transpose":
            if tuple(p["permutation"]) == (1, 0) and self.uses.get(eqn.outvars[0]) == {"dot_general"}:
                # Only a `dot` reads it: the dot reads the operand transposed (`trans_a`/`trans_b`).
                self.transposed[eqn.outvars[0]] = eqn.invars[0]
                return
            perm = ", ".join(str(d) for d in p["permutation"])
            self.op(eqn, f"transpose {self.value(eqn.invars[0], eqn)} perm ({perm})")
        elif name in _REDUCE:
            self.reduce(eqn, _REDUCE[name])
        elif name in ("argmax", "argmin"):
            self.arg_extreme(eqn, "max" if name == "argmax" else "min")
        elif name in ("cumsum", "cumprod", "cummax", "cummin"):
            self.cumulative(eqn, name[3:])
        elif name in ("erfc", "tan", "cbrt", "population_count", "clz"):
            self.composed(eqn, name)
        elif name == "nextafter":
            self.nextafter(eqn)
        elif name == "roll":
            self.roll(eqn)
        elif name == "threefry2x32":
            self.threefry(eqn)
        elif name in ("bitcast", "bitcast_convert_type"):
            self.bitcast_value(eqn)
        elif name in ("sort", "top_k", "rev"):
            self.permuted(eqn, name)
        elif name in ("stop_gradient", "copy"):
            # The identity where the kernel runs (`jax.nn.softmax` stops the max's gradient).
            self.define(eqn.outvars[0], self.read(eqn.invars[0]))
        elif name == "slice":
            # `x[1::2]` of a value: tessel's `slice` with a stride (none where every step is 1).
            start = ", ".join(str(int(s)) for s in p["start_indices"])
            steps = [int(s) for s in p.get("strides") or [1] * len(p["start_indices"])]
            stride = f" stride ({', '.join(map(str, steps))})" if any(k != 1 for k in steps) else ""
            self.op(eqn, f"slice {self.value(eqn.invars[0], eqn)} start ({start}){stride}")
        elif name == "concatenate":
            args = ", ".join(self.value(v, eqn) for v in eqn.invars)
            self.op(eqn, f"concatenate {args} axis {p['dimension']}")
        elif name == "tile" and all(int(r) == 1 for r in p["reps"]):
            # Nothing copied (a 0-d value has no counts at all): the value itself.
            self.define(eqn.outvars[0], self.read(eqn.invars[0]))
        elif name == "tile":
            # `jnp.tile` (and `pltpu.repeat`, which is one): the language's `tile` (JAX gives one
            # count per dimension).
            reps = tuple(int(r) for r in p["reps"])
            if len(reps) != len(eqn.invars[0].aval.shape) or 0 in reps:
                raise self.refuse(f"`tile` with repetitions {reps} of a {len(eqn.invars[0].aval.shape)}-dimensional value", eqn,
                                  "give one repetition count of at least 1 per dimension (reshape first to add dimensions)")
            self.op(eqn, f"tile {self.value(eqn.invars[0], eqn)} reps ({', '.join(map(str, reps))})")
        elif name == "iota":
            if p["dtype"] != np.int32 and str(p["dtype"]) != "int32":
                v = self.body.fresh()
                shape = ", ".join(str(d) for d in p["shape"])
                self.body.emit(f"{v} = iota {p['dimension']} : i32[{shape}]")
                self.op(eqn, f"cast {v}")
            else:
                self.op(eqn, f"iota {p['dimension']}")
        elif name == "sign":
            # -1 below zero, 1 above, and x itself otherwise (0, -0.0, NaN), as `lax.sign`;
            # `//` on integers uses it.
            x = self.value(eqn.invars[0], eqn)
            ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
            one = "1.0" if "f" in ty.split("[")[0] else "1"
            neg, pos, t = self.body.fresh(), self.body.fresh(), self.body.fresh()
            self.body.emit(f"{neg} = lt {x}, 0")
            self.body.emit(f"{t} = select {neg}, -{one}, {x} : {ty}")
            self.body.emit(f"{pos} = gt {x}, 0")
            self.op(eqn, f"select {pos}, {one}, {t}")
        elif name in _INLINE:
            self.inline(eqn)
        elif name in ("debug_print", "debug_callback"):
            # No effect on any result; tessel kernels do not print.
            warnings.warn(f"`{name}` in Pallas kernel `{k}`{f' (at {self.place})' if self.place else ''} is dropped: tessel kernels do not print", stacklevel=2)
        else:
            raise self.refuse(f"primitive `{name}`", eqn, "docs/pallas.md lists the primitives tessel translates")
