"""JAX Pallas kernels on tessel: `to_tk(fn, *args)` writes every `pl.pallas_call` that `fn` makes
as `.tk` text; `install(backend=...)` (or `with installed(backend=...):`) makes JAX lower every
`pallas_call` (and `pl.kernel`'s `mpmd_map`) for the CPU to a call of tessel's XLA FFI handler,
so unchanged Pallas kernels run on tessel inside `jax.jit`, `grad`, `vmap`, `scan` and
`shard_map` (docs/jax.md); `run(fn, *args, backend=...)` is `jax.jit(fn)` under `installed`.

Each `pallas_call` is read from its equation (a jaxpr's for `to_tk`, the lowering rule's
parameters for `install`): its grid, the block shape and index map of every operand, and its
body. Index maps are proved affine in the program ids from their equations (sums, differences and
constant multiples of program ids), or on a small grid by evaluating them at every point; never
assumed, never judged from samples. Any other index map (a clamp, a division, a block table read
from scalar-prefetch operands) is written as a computed block index (`at (min(i1, i0), x0[i0])`,
docs/language.md §2), which brings an index into the array as Pallas's interpret mode does; one
that has no such expression is computed in the body, the ref declared whole and each access at
the block's offset. Grid axes that no output's index map uses become `seq` (they revisit the
outputs); the others are parallel (all are `seq` where an output's map is computed). What the language
cannot say is a `tessel.UnsupportedError` naming the primitive, the kernel and the Python source
line it came from. docs/pallas.md lists what is supported and where tessel and Pallas's
interpret mode differ by design.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._errors import UnsupportedError
from ._index_maps import _MAX_AXIS, _affine, _index_texts
from ._jax_support import _INLINE, _jax

__all__ = ["to_tk", "run", "translate", "Translated", "install", "uninstall", "installed", "CompilerParams"]

_DTYPES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "uint32": "u32", "bool": "bool",
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
}

_UNARY = {
    "neg": "neg", "exp": "exp", "exp2": "exp2", "log": "log", "tanh": "tanh", "logistic": "logistic",
    "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "abs", "sin": "sin", "cos": "cos", "floor": "floor",
    "ceil": "ceil", "round": "round", "not": "not", "expm1": "expm1", "log1p": "log1p", "erf": "erf",
    "erf_inv": "erf_inv", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
}
_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "max", "min": "min", "pow": "pow",
    "rem": "rem", "atan2": "atan2", "and": "and", "or": "or", "xor": "xor",
}
_SHIFTS = {"shift_left", "shift_right_arithmetic", "shift_right_logical"}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_REDUCE = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod"}
#: The primitives of a Pallas kernel launch: `pl.pallas_call`, and `pl.kernel(mesh=...)`.
_CALLS = {"pallas_call", "mpmd_map"}
#: Primitives written whether or not anything reads their results.
_EFFECTS = {"swap", "masked_swap", "cond", "scan", "while", "run_scoped", "debug_print", "debug_callback"}


def _where(eqn) -> str:
    """The user's source line an equation came from (`file.py:12:8 (body)`), or "" where jax
    recorded none (inside jnp's own functions)."""
    _, _, siu = _jax()
    try:
        return siu.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - source info is best effort
        return ""


def _refuse(what: str, kernel: str, eqn=None, hint: Optional[str] = None, place: str = "") -> UnsupportedError:
    place = (_where(eqn) if eqn is not None else "") or place
    at = f" (at {place})" if place else ""
    return UnsupportedError(f"{what} in Pallas kernel `{kernel}`{at} has no tessel translation", None, hint)


def _ty(aval, kernel: str, eqn=None) -> str:
    name = np.dtype(aval.dtype).name if str(aval.dtype) != "bfloat16" else "bfloat16"
    dt = _DTYPES.get(name)
    if dt is None:
        raise _refuse(f"dtype {name}", kernel, eqn, "tessel has f32, f16, bf16, i32, u32, i16, u16, i8, u8 and bool")
    if not aval.shape:
        return dt
    return f"{dt}[{', '.join(str(d) for d in aval.shape)}]"


def _dot_acc(dtype) -> str:
    """The element type of tessel's `dot` of two operands of `dtype`: floats accumulate in f32,
    signed integers in i32, unsigned ones in u32."""
    if str(dtype) == "bfloat16" or np.dtype(dtype).kind == "f":
        return "f32"
    return "u32" if np.dtype(dtype).kind == "u" else "i32"


def _scratch(arg: str, aval, kernel: str, eqn, what: str = "scratch operand") -> str:
    """The `scratch` line of a Pallas scratch buffer (`pltpu.VMEM(shape, dtype)` and the like);
    a semaphore or other non-array allocation is refused."""
    inner = getattr(aval, "inner_aval", aval)
    if not hasattr(inner, "shape") or not hasattr(inner, "dtype") or "sem" in str(aval).lower():
        raise _refuse(f"the {what} {aval}", kernel, eqn, "tessel's scratch is an array of one dtype")
    return f"  scratch {arg}: {_ty(inner, kernel, eqn)}"


def _literal(v) -> str:
    v = np.asarray(v).item()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(float(v))
    return text if ("." in text or "e" in text) else text + ".0"


@dataclass
class Translated:
    """One `pallas_call` as tessel sees it: the kernel's text and how to launch it."""

    name: str
    text: str
    #: The `.tk` names of the inputs and outputs, in the pallas_call's operand order.
    inputs: List[str]
    outputs: List[str]
    #: The launch's mesh (`pl.kernel(mesh=...)`, as tessel's mesh text), or None for a grid.
    mesh: Optional[str] = None
    #: The meshes around the launch (`external_meshes`), as tessel's mesh text.
    external_meshes: List[str] = field(default_factory=list)
    #: `input_output_aliases` pairs (operand index, output index) whose output starts from the
    #: operand's buffer: the input is not the kernel's (its loads read the output), and the
    #: call passes it last, aliased to the output, which the handler does not zero.
    kept: List[Tuple[int, int]] = field(default_factory=list)


@dataclass
class _Body:
    """The statements of one kernel body being written."""

    kernel: str
    lines: List[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)
    depth: int = 1

    def fresh(self) -> str:
        return f"%v{next(self.counter)}"

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)


class _Writer:
    def __init__(self, kernel: str, grid_axes: List[str]):
        self.kernel = kernel
        self.axes = grid_axes
        #: The axes `pl.program_id(k)` counts: all but those `vmap` added.
        self.body_axes = grid_axes
        #: The starts of the runs the current equation indexes with (`run_start`), by atom `id`.
        self.runs: Dict[int, Optional[str]] = {}
        #: While `gather` writes its load: (the index array, its `%value` as an `i32` vector).
        self.entry: Optional[Tuple[Any, str]] = None
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

    def index(self, eqn, ref, tree, index_atoms) -> str:
        """`[ds(start, size), :, %i]` for a ref indexer, or "" for the whole block."""
        jax, _, _ = _jax()
        try:
            indexers = jax.tree_util.tree_unflatten(tree, index_atoms)
        except Exception:
            raise self.refuse("a reference indexer", eqn)
        return self.indexers(eqn, ref, indexers)

    def indexers(self, eqn, ref, indexers) -> str:
        """The index text of unflattened indexers (`NDIndexer`s whose atoms are jaxpr atoms) on
        the ref `ref`; a block dimension Pallas squeezes away is indexed at 0, which drops it."""
        from jax._src.state import indexing

        name, ref_shape = self.ref(ref, eqn), tuple(ref.aval.shape)
        squeezed = self.squeezed.get(name, [])
        indexers = list(indexers or ())
        if name in self.offsets:
            return self.shifted(eqn, name, ref_shape, squeezed, indexers)
        if not indexers:
            if not squeezed:
                return ""
            kept = iter([":"] * len(ref_shape))
            return "[" + ", ".join("0" if d in squeezed else next(kept) for d in range(len(ref_shape) + len(squeezed))) + "]"
        if len(indexers) != 1 or not isinstance(indexers[0], indexing.NDIndexer):
            raise self.refuse("a transformed reference (bitcast, reshape)", eqn)
        nd = indexers[0]
        outer = self.outer_runs(eqn, nd)
        parts = []
        whole = not squeezed
        for dim, ix in zip(ref_shape, nd.indices):
            if isinstance(ix, indexing.Slice):
                start = ix.start if isinstance(ix.start, int) else self.read(ix.start)
                size = ix.size
                if start == 0 and size == dim and ix.stride == 1:
                    parts.append(":")
                    continue
                whole = False
                parts.append(f"ds({start}, {size})" if ix.stride == 1 else f"ds({start}, {size}, {ix.stride})")
            else:
                whole = False
                shape = tuple(getattr(getattr(ix, "aval", None), "shape", ()))
                if self.entry is not None and ix is self.entry[0]:
                    parts.append(self.entry[1])
                    continue
                scalar = self.broadcast_scalar(ix) if self.entry is not None and shape != () else None
                if scalar is not None:
                    parts.append(scalar)
                    continue
                if id(ix) in outer:
                    parts.append(outer[id(ix)])
                    continue
                if shape != ():
                    parts.append(f"ds({self.contiguous(ix, eqn)}, {shape[0]})")
                    continue
                parts.append(str(ix) if isinstance(ix, (int, np.integer)) else self.read(ix))
        if whole:
            return ""
        for d in sorted(squeezed):
            parts.insert(d, "0")
        return "[" + ", ".join(parts) + "]"

    def shifted(self, eqn, name, ref_shape, squeezed, indexers) -> str:
        """The index text of an access to a block whose index map is computed: the argument is
        declared whole, so every dimension's index is the block's offset (`self.offsets`) plus
        the index within the block (`ds(offset + start, size)`, `offset + i`)."""
        from jax._src.state import indexing

        if indexers and (len(indexers) != 1 or not isinstance(indexers[0], indexing.NDIndexer)):
            raise self.refuse("a transformed reference (bitcast, reshape)", eqn)
        within = []
        for dim, ix in zip(ref_shape, indexers[0].indices if indexers else [None] * len(ref_shape)):
            if ix is None:
                within.append(("ds", "0", dim))
            elif isinstance(ix, indexing.Slice):
                stride = f", {ix.stride}" if ix.stride != 1 else ""
                within.append(("ds", str(ix.start) if isinstance(ix.start, int) else self.read(ix.start), f"{ix.size}{stride}"))
            else:
                shape = tuple(getattr(getattr(ix, "aval", None), "shape", ()))
                if self.entry is not None and ix is self.entry[0]:
                    within.append(("vec", self.entry[1], None))  # a gather's index vector
                    continue
                if shape != ():
                    within.append(("ds", self.contiguous(ix, eqn), shape[0]))
                    continue
                within.append(("at", str(ix) if isinstance(ix, (int, np.integer)) else self.read(ix), None))
        for d in sorted(squeezed):
            within.insert(d, ("at", "0", None))
        parts = []
        for off, (kind, start, size) in zip(self.offsets[name], within):
            if kind == "vec" and off != "0":
                v = self.body.fresh()
                self.body.emit(f"{v} = add {start}, {off}")
                parts.append(v)
                continue
            at = start if kind == "vec" else self.plus(off, start)
            parts.append(f"ds({at}, {size})" if kind == "ds" else at)
        return "[" + ", ".join(parts) + "]"

    def contiguous(self, ix, eqn) -> str:
        """The start of an index array that is `start + jnp.arange(n)` (a contiguous run, as
        Triton-style kernels index a ref: `x_ref[i * B + jnp.arange(B)]`), so that the access is
        `ds(start, n)`; any other index array is a gather (`gather`), refused here."""
        s = self.run_start(ix)
        if s is None or len(ix.aval.shape) != 1:
            raise self.refuse("an array index (gather)", eqn, "index a ref with `start + jnp.arange(n)` (a contiguous run) or pl.ds(start, n)")
        return s

    def run_start(self, ix) -> Optional[str]:
        """The start of `ix` where it is `start + jnp.arange(n)`, else None; written once per
        equation however often its indexing asks (`self.runs`)."""
        if id(ix) not in self.runs:
            self.runs[id(ix)] = self.find_run_start(ix)
        return self.runs[id(ix)]

    def find_run_start(self, ix) -> Optional[str]:
        _, core, _ = _jax()

        def start(v):
            if isinstance(v, core.Literal) or len(getattr(v.aval, "shape", ())) != 1:
                return None
            d = self.defs.get(v)
            if d is None:
                return None
            name = d.primitive.name
            if name == "iota" and d.params.get("dimension", 0) == 0:
                return "0"
            if name == "convert_element_type":
                return start(d.invars[0])
            if name == "add":
                for run, other in ((d.invars[0], d.invars[1]), (d.invars[1], d.invars[0])):
                    s = start(run) if not isinstance(run, core.Literal) else None
                    o = scalar(other)
                    if s is not None and o is not None:
                        return self.plus(s, o)
            return None

        def scalar(v):
            if isinstance(v, core.Literal):
                return str(int(v.val)) if np.ndim(v.val) == 0 else None
            if getattr(v.aval, "shape", None) == ():
                return self.read(v)
            d = self.defs.get(v)
            if d is not None and d.primitive.name == "broadcast_in_dim" and getattr(d.invars[0].aval, "shape", None) == ():
                return scalar(d.invars[0])
            return None

        return start(ix)

    def outer_runs(self, eqn, nd) -> Dict[int, str]:
        """Index arrays of more than one dimension that are runs JAX's indexing broadcasts into
        a block (`x_ref.at[rows[:, None], cols[None]]` of Triton-style kernels): the k-th array
        varies along dimension k of the broadcast shape only, and they index consecutive
        dimensions of the ref, so that each is the `ds` of its dimension. The `ds` text of each
        (by the array's `id`); any other arrangement is refused as a gather."""
        from jax._src.state import indexing

        gathered = self.entry[0] if self.entry is not None else None
        arrays = [
            (d, ix) for d, ix in enumerate(nd.indices) if len(getattr(getattr(ix, "aval", None), "shape", ())) >= 1 and ix is not gathered
        ]
        if not any(len(ix.aval.shape) > 1 for _, ix in arrays):
            return {}
        dims = [d for d, _ in arrays]
        runs = [self.varying(ix) for _, ix in arrays]
        placed = all(r is not None and r[0] == k and len(ix.aval.shape) == len(arrays) for k, (r, (_, ix)) in enumerate(zip(runs, arrays)))
        apart = any(isinstance(nd.indices[d], indexing.Slice) for d in range(dims[0], dims[-1] + 1))
        if not placed or apart or dims != list(range(dims[0], dims[0] + len(arrays))):
            raise self.refuse("an array index (gather)", eqn, "index a ref with runs `start + jnp.arange(n)` broadcast as rows and columns, in the ref's order")
        return {id(ix): f"ds({r[1]}, {ix.aval.shape[r[0]]})" for r, (_, ix) in zip(runs, arrays)}

    def varying(self, v) -> Optional[Tuple[int, str]]:
        """(the one dimension along which index array `v` varies, the start of the run along
        it) where `v` is a run `start + jnp.arange(n)` made a row, a column or a broadcast of one;
        else None."""
        _, core, _ = _jax()
        if isinstance(v, core.Literal):
            return None
        shape = tuple(v.aval.shape)
        if len(shape) == 1:
            s = self.run_start(v)
            return None if s is None else (0, s)
        d = self.defs.get(v)
        if d is None or not d.invars or isinstance(d.invars[0], core.Literal):
            return None
        name, src = d.primitive.name, d.invars[0]
        kinds = ("broadcast_in_dim", "broadcast_to", "reshape", "expand_dims", "convert_element_type")
        inner = self.varying(src) if name in kinds else None
        if inner is None:
            return None
        if name == "broadcast_in_dim":
            return (d.params["broadcast_dimensions"][inner[0]], inner[1])
        if name == "broadcast_to":  # numpy's: the operand's dimensions last
            return (len(shape) - len(src.aval.shape) + inner[0], inner[1])
        if name == "convert_element_type":
            return inner
        varying = [k for k, n in enumerate(shape) if n != 1]
        return (varying[0], inner[1]) if len(varying) == 1 else None

    def gather_index(self, tree, atoms):
        """The one index array of a `get` that is not a contiguous run (a gather: paged
        attention's `k_pages_ref[block_tables]`), or None."""
        from jax._src.state import indexing

        jax, _, _ = _jax()
        try:
            indexers = jax.tree_util.tree_unflatten(tree, atoms)
        except Exception:
            return None
        if len(indexers) != 1 or not isinstance(indexers[0], indexing.NDIndexer):
            return None
        arrays = [
            ix for ix in indexers[0].indices
            if len(getattr(getattr(ix, "aval", None), "shape", ())) >= 1 and self.broadcast_scalar(ix) is None
        ]
        if len(arrays) != 1 or (len(arrays[0].aval.shape) == 1 and self.run_start(arrays[0]) is not None):
            return None
        # An array of several dimensions (a block table's rows, `idx[b, p]`) is flattened; one
        # with a dimension of 1 is a run broadcast into a block (`outer_runs`).
        if len(arrays[0].aval.shape) > 1 and 1 in arrays[0].aval.shape:
            return None
        return arrays[0]

    def broadcast_scalar(self, ix) -> Optional[str]:
        """The scalar's text where index array `ix` is one scalar broadcast (`x_ref[1, :, t]`
        broadcasts the 1 against `t`), else None."""
        _, core, _ = _jax()
        d = None if isinstance(ix, core.Literal) else self.defs.get(ix)
        if d is None or d.primitive.name not in ("broadcast_to", "broadcast_in_dim") or getattr(d.invars[0].aval, "shape", None) != ():
            return None
        return self.read(d.invars[0])

    def vector_index(self, eqn, ref, tree, atoms, vec) -> Tuple[str, List[int], Callable[[Tuple[int, ...]], Tuple[int, ...]]]:
        """The index text of `ref[..., idx, ...]` with an index array `idx` that is not a
        contiguous run (paged attention's `k_pages_ref[block_tables]`), with `idx` as an index
        vector (a gather or scatter, docs/language.md), flattened where it has several
        dimensions; tessel's order of the dimensions as positions in JAX's (JAX stands the
        entries where the array index stands among the integer indices, or first where those are
        apart; tessel after the slices before it); and the map from a JAX shape of the access to
        the same shape with the index array's dimensions as one."""
        from jax._src.state import indexing

        jax, _, _ = _jax()
        (nd,) = jax.tree_util.tree_unflatten(tree, atoms)
        ints = [d for d, ix in enumerate(nd.indices) if not isinstance(ix, indexing.Slice)]
        apart = ints != list(range(ints[0], ints[-1] + 1))
        vec_dim = next(d for d, ix in enumerate(nd.indices) if ix is vec)
        kept = sum(isinstance(ix, indexing.Slice) for ix in nd.indices[:vec_dim])
        at = 0 if apart else sum(isinstance(ix, indexing.Slice) for ix in nd.indices[: ints[0]])
        idx = self.value(vec, eqn)
        dims = tuple(vec.aval.shape)
        n = int(np.prod(dims))
        if str(vec.aval.dtype) != "int32":
            i = self.body.fresh()
            self.body.emit(f"{i} = cast {idx} : i32[{', '.join(map(str, dims))}]")
            idx = i
        if len(dims) != 1:
            i = self.body.fresh()
            self.body.emit(f"{i} = reshape {idx} : i32[{n}]")
            idx = i
        self.entry = (vec, idx)
        try:
            index = self.index(eqn, ref, tree, atoms)
        finally:
            self.entry = None
        order = list(range(sum(isinstance(ix, indexing.Slice) for ix in nd.indices) + 1))
        order.insert(kept, order.pop(at))
        return index, order, lambda shape: tuple(shape[:at]) + (n,) + tuple(shape[at + len(dims):])

    def reorder(self, v: str, aval, order: List[int], eqn, to_jax: bool) -> str:
        """`v` moved between tessel's order of a gather's dimensions and JAX's (`vector_index`)."""
        if order == sorted(order):
            return v
        perm = [order.index(d) for d in range(len(order))] if to_jax else order
        t = self.body.fresh()
        shape = aval.shape if to_jax else tuple(aval.shape[d] for d in order)
        self.body.emit(f"{t} = transpose {v} perm ({', '.join(map(str, perm))}) : {_ty(aval.update(shape=tuple(shape)), self.kernel, eqn)}")
        return t

    def gather(self, eqn, ref, tree, atoms, vec) -> None:
        """`x = ref[..., idx, ...]`: one `load` at an index vector (`vector_index`), moved into
        JAX's order and shape."""
        index, order, flat = self.vector_index(eqn, ref, tree, atoms, vec)
        out = eqn.outvars[0].aval
        jflat = out.update(shape=flat(out.shape))
        v = self.body.fresh()
        self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index} : {_ty(jflat.update(shape=tuple(jflat.shape[d] for d in order)), self.kernel, eqn)}")
        self.define(eqn.outvars[0], self.unflatten(self.reorder(v, jflat, order, eqn, to_jax=True), jflat, out, eqn))

    def unflatten(self, v: str, flat, aval, eqn) -> str:
        """`v` (of `flat`'s shape) reshaped to `aval`'s, where they differ."""
        if tuple(flat.shape) == tuple(aval.shape):
            return v
        t = self.body.fresh()
        self.body.emit(f"{t} = reshape {v} : {_ty(aval, self.kernel, eqn)}")
        return t

    def scatter(self, eqn, ref, val, tree, atoms, vec) -> None:
        """`ref[..., idx, ...] = v`: one `store` at an index vector (`vector_index`), the value
        first moved into tessel's order; the old value where the kernel reads it."""
        index, order, flat = self.vector_index(eqn, ref, tree, atoms, vec)
        old = eqn.outvars[0]
        jflat = old.aval.update(shape=flat(old.aval.shape))
        if old in self.uses:
            v = self.body.fresh()
            shape = tuple(jflat.shape[d] for d in order)
            self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index} : {_ty(jflat.update(shape=shape), self.kernel, eqn)}")
            self.define(old, self.unflatten(self.reorder(v, jflat, order, eqn, to_jax=True), jflat, old.aval, eqn))
        x = self.value(val, eqn)
        if tuple(val.aval.shape) == tuple(old.aval.shape):
            x = self.reorder(self.unflatten(x, val.aval, jflat, eqn), jflat, order, eqn, to_jax=False)
        self.body.emit(f"store {self.ref(ref, eqn)}{index}, {x}")

    def plus(self, a: str, b: str) -> str:
        """`a + b` of two `i32` scalars (values or integer literals), folded where both are known."""
        if not a.startswith("%") and not b.startswith("%"):
            return str(int(a) + int(b))
        if b == "0":
            return a
        if a == "0":
            return b
        v = self.body.fresh()
        self.body.emit(f"{v} = add {a}, {b}")
        return v

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
        if vec is not None:
            ref, *ix = eqn.invars
            self.gather(eqn, ref, p["tree"], ix, vec)
        elif name == "get":
            ref, *ix = eqn.invars
            index = self.index(eqn, ref, p["tree"], ix)
            v = self.body.fresh()
            self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index} : {_ty(eqn.outvars[0].aval, k, eqn)}")
            self.define(eqn.outvars[0], v)
        elif name == "swap" and self.gather_index(p["tree"], eqn.invars[2:]) is not None:
            ref, val, *ix = eqn.invars
            self.scatter(eqn, ref, val, p["tree"], ix, self.gather_index(p["tree"], ix))
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
        elif name in ("masked_load", "masked_swap"):
            self.masked(eqn)
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
        elif name == "integer_pow":
            self.integer_pow(eqn)
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
        elif name in ("broadcast_in_dim", "broadcast_to"):
            self.broadcast(eqn)
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
        elif name in ("sort", "top_k", "rev"):
            self.permuted(eqn, name)
        elif name == "stop_gradient":
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
        elif name == "tile":
            # `jnp.tile` (and `pltpu.repeat`): the value after itself along each repeated axis.
            reps = tuple(p["reps"])
            if len(reps) != len(eqn.invars[0].aval.shape):
                raise self.refuse(f"`tile` with {len(reps)} repetitions of a {len(eqn.invars[0].aval.shape)}-dimensional value", eqn,
                                  "give one repetition count per dimension (reshape first to add dimensions)")
            v = self.value(eqn.invars[0], eqn)
            for d, r in enumerate(reps):
                if r > 1:
                    t = self.body.fresh()
                    self.body.emit(f"{t} = concatenate {', '.join([v] * r)} axis {d}")
                    v = t
            self.define(eqn.outvars[0], v)
        elif name == "dot_general":
            self.dot(eqn)
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
        elif name == "cond":
            self.cond(eqn)
        elif name == "scan":
            self.scan(eqn)
        elif name == "while":
            self.fori_while(eqn)
        elif name in _INLINE:
            self.inline(eqn)
        elif name == "run_scoped":
            self.run_scoped(eqn)
        elif name in ("debug_print", "debug_callback"):
            # No effect on any result; tessel kernels do not print.
            warnings.warn(f"`{name}` in Pallas kernel `{k}`{f' (at {self.place})' if self.place else ''} is dropped: tessel kernels do not print", stacklevel=2)
        else:
            raise self.refuse(f"primitive `{name}`", eqn, "docs/pallas.md lists the primitives tessel translates")

    def masked(self, eqn) -> None:
        """`pl.load`/`pl.store` (the Triton-style primitives) with a mask and `other`."""
        jax, core, _ = _jax()
        parts = jax.tree_util.tree_unflatten(eqn.params["args_tree"], eqn.invars)
        if eqn.primitive.name == "masked_load":
            ref, transforms, mask, other = parts
        else:
            ref, transforms, val, mask = parts
        index = self.indexers(eqn, ref, transforms)
        out = eqn.outvars[0]
        tail = ""
        if mask is not None:
            m = self.value(mask, eqn)
            if tuple(mask.aval.shape) != tuple(out.aval.shape):
                b = self.body.fresh()
                self.body.emit(f"{b} = broadcast {m} : bool[{', '.join(str(d) for d in out.aval.shape)}]")
                m = b
            tail = f" mask {m}"
        if eqn.primitive.name == "masked_load":
            if other is not None:
                if not isinstance(other, core.Literal):
                    raise self.refuse("a masked load whose `other` is not a constant", eqn)
                tail += f" other {_literal(other.val)}"
            v = self.body.fresh()
            self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index}{tail} : {_ty(out.aval, self.kernel, eqn)}")
            self.define(out, v)
            return
        if out in self.uses:
            v = self.body.fresh()
            self.body.emit(f"{v} = load {self.ref(ref, eqn)}{index}{tail} : {_ty(out.aval, self.kernel, eqn)}")
            self.define(out, v)
        self.body.emit(f"store {self.ref(ref, eqn)}{index}, {self.value(val, eqn)}{tail}")

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
        self.body.emit(f"{cur} = cast {self.value(x, eqn)} : i32[{', '.join(map(str, shape))}]")
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
        dims = lambda sh: ", ".join(str(d) for d in sh)  # noqa: E731
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

    def permuted(self, eqn, name: str) -> None:
        """`sort` (`jnp.sort`, `jnp.argsort`: its operands ordered by the first, stably), `top_k`
        (the `k` largest along the last axis and their indices, ties the lower index first) and
        `rev` (`jnp.flip`), along one axis (another moved last by `transpose` and back after). Each
        element's place along the axis is computed, then every operand is moved there: for a
        sort, its rank, the number of elements ordered before it (by JAX's order of floats: -0
        as 0, NaN after everything, so the bits come out as JAX's), counted over a comparison
        of every pair (the block's row length squared per row)."""
        p = eqn.params
        shape = list(eqn.invars[0].aval.shape)
        rank = len(shape)
        axis = {"sort": lambda: p["dimension"], "top_k": lambda: rank - 1, "rev": lambda: None}[name]()
        if name == "rev":
            if len(p["dimensions"]) != 1:
                raise self.refuse(f"`rev` along {len(p['dimensions'])} axes at once", eqn, "flip one axis at a time")
            axis = p["dimensions"][0]
        if name == "sort" and p.get("num_keys", 1) != 1:
            raise self.refuse(f"`sort` by {p['num_keys']} keys", eqn, "sort by one key (jnp.sort, jnp.argsort)")
        emit, fresh = self.body.emit, self.body.fresh
        dims = lambda sh: ", ".join(str(d) for d in sh)  # noqa: E731
        perm = None if axis == rank - 1 else [d for d in range(rank) if d != axis] + [axis]
        moved = shape if perm is None else [shape[d] for d in perm]
        n, lead = moved[-1], moved[:-1]

        def last(v: str, dt: str) -> str:
            if perm is None:
                return v
            t = fresh()
            emit(f"{t} = transpose {v} perm ({dims(perm)}) : {dt}[{dims(moved)}]")
            return t

        def pair(sh_i, sh_j):
            return lead + [sh_i, sh_j]

        # Where each element goes along the axis (`i32`, the moved shape).
        iota_i, iota_j = fresh(), fresh()
        emit(f"{iota_i} = iota {len(lead)} : i32[{dims(pair(n, n))}]")
        emit(f"{iota_j} = iota {len(lead) + 1} : i32[{dims(pair(n, n))}]")
        pos = fresh()
        if name == "rev":
            flat = fresh()
            emit(f"{flat} = iota {len(lead)} : i32[{dims(moved)}]")
            emit(f"{pos} = sub {n - 1}, {flat} : i32[{dims(moved)}]")
            k = n
        else:
            dt0 = _ty(eqn.invars[0].aval, self.kernel, eqn).split("[")[0]
            key, kt = self.sort_key(last(self.value(eqn.invars[0], eqn), dt0), dt0, moved)
            ki, kj = fresh(), fresh()
            emit(f"{ki} = reshape {key} : {kt}[{dims(lead + [n, 1])}]")
            emit(f"{kj} = reshape {key} : {kt}[{dims(lead + [1, n])}]")
            # j before i: ordered before it, or equal and earlier (a stable order).
            order = "gt" if name == "top_k" else "lt"
            o, e, earlier, tie, before, count = (fresh() for _ in range(6))
            emit(f"{o} = {order} {kj}, {ki} : bool[{dims(pair(n, n))}]")
            emit(f"{e} = eq {kj}, {ki} : bool[{dims(pair(n, n))}]")
            emit(f"{earlier} = lt {iota_j}, {iota_i} : bool[{dims(pair(n, n))}]")
            emit(f"{tie} = and {e}, {earlier} : bool[{dims(pair(n, n))}]")
            emit(f"{before} = or {o}, {tie} : bool[{dims(pair(n, n))}]")
            emit(f"{count} = cast {before} : i32[{dims(pair(n, n))}]")
            emit(f"{pos} = sum {count} axis {len(lead) + 1} : i32[{dims(moved)}]")
            k = p["k"] if name == "top_k" else n
        # Output place q takes the element whose place is q: the one hit in each row of
        # `hit[.., q, i]`, picked by a max over i with everything else the max's identity.
        src, slot, hit = fresh(), fresh(), fresh()
        emit(f"{src} = reshape {pos} : i32[{dims(lead + [1, n])}]")
        emit(f"{slot} = iota {len(lead)} : i32[{dims(lead + [k, n])}]")
        emit(f"{hit} = eq {src}, {slot} : bool[{dims(lead + [k, n])}]")
        operands = list(eqn.invars) if name == "sort" else [eqn.invars[0]]
        outs = list(eqn.outvars)
        picked = []
        for v in operands:
            ty = _ty(v.aval, self.kernel, eqn)
            dt = ty.split("[")[0]
            x = last(self.value(v, eqn), dt)
            if dt == "bool":
                c = fresh()
                emit(f"{c} = cast {x} : i32[{dims(moved)}]")
                x, dt = c, "i32"
            picked.append(self.pick(x, dt, hit, lead, k, n))
        if name == "top_k":
            picked.append(self.pick(iota_j, "i32", hit, lead, k, n, row=True))
        out_moved = lead + [k]
        out_shape = out_moved if perm is None else [out_moved[perm.index(d)] for d in range(rank)]
        for out, (v, dt) in zip(outs, picked):
            want = _ty(out.aval, self.kernel, eqn).split("[")[0]
            if perm is not None:
                t = fresh()
                emit(f"{t} = transpose {v} perm ({dims([perm.index(d) for d in range(rank)])}) : {dt}[{dims(out_shape)}]")
                v = t
            if want != dt:
                c = fresh()
                emit(f"{c} = {'ne' if want == 'bool' else 'cast'} {v}{', 0' if want == 'bool' else ''} : {_ty(out.aval, self.kernel, eqn)}")
                v = c
            self.define(out, v)

    def sort_key(self, x: str, dt: str, shape) -> tuple:
        """The value JAX sorts `x` (of `dt[shape]`) by, and its type: a float as the `i32` whose
        order is JAX's (-0 as 0, every NaN as one NaN after everything), an integer as it is."""
        emit, fresh = self.body.emit, self.body.fresh
        if dt not in ("f32", "f16", "bf16"):
            return x, dt
        sh = f"[{', '.join(str(d) for d in shape)}]"
        if dt != "f32":
            c = fresh()
            emit(f"{c} = cast {x} : f32{sh}")
            x = c
        z, x0, nan, xn, si, un, fl, fi, neg, key = (fresh() for _ in range(10))
        emit(f"{z} = eq {x}, 0.0 : bool{sh}")
        emit(f"{x0} = select {z}, 0.0, {x} : f32{sh}")
        emit(f"{nan} = ne {x}, {x} : bool{sh}")
        emit(f"{xn} = select {nan}, nan, {x0} : f32{sh}")
        emit(f"{si} = bitcast {xn} : i32{sh}")
        emit(f"{un} = bitcast {xn} : u32{sh}")
        emit(f"{fl} = sub 2147483647, {un} : u32{sh}")
        emit(f"{fi} = bitcast {fl} : i32{sh}")
        emit(f"{neg} = lt {si}, 0 : bool{sh}")
        emit(f"{key} = select {neg}, {fi}, {si} : i32{sh}")
        return key, "i32"

    def pick(self, x: str, dt: str, hit: str, lead, k: int, n: int, row: bool = False):
        """Element `q` of the result: the element of `x` (the moved shape; with `row`, already
        `[.., n, n]` of which row 0 is used) whose `hit` is set in row `q`."""
        emit, fresh = self.body.emit, self.body.fresh
        dims = lambda sh: ", ".join(str(d) for d in sh)  # noqa: E731
        low = {"f32": "-inf", "f16": "-inf", "bf16": "-inf", "i32": "-2147483648", "u32": "0",
               "i16": "-32768", "u16": "0", "i8": "-128", "u8": "0"}[dt]
        xs = fresh()
        if row:
            emit(f"{xs} = slice {x} start ({dims([0] * (len(lead) + 2))}) : {dt}[{dims(lead + [1, n])}]")
        else:
            emit(f"{xs} = reshape {x} : {dt}[{dims(lead + [1, n])}]")
        sel, out = fresh(), fresh()
        emit(f"{sel} = select {hit}, {xs}, {low} : {dt}[{dims(lead + [k, n])}]")
        emit(f"{out} = max {sel} axis {len(lead) + 1} : {dt}[{dims(lead + [k])}]")
        return out, dt

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
        perm = None if axis == len(shape) - 1 or first else [d for d in range(len(shape)) if d != axis] + [axis]
        dims = lambda sh: ", ".join(str(d) for d in sh)  # noqa: E731
        floats = dt in ("f32", "f16", "bf16")
        acc = "f32" if floats else ("u32" if dt.startswith("u") else "i32")
        emit = self.body.emit
        v = self.value(x, eqn)
        if dt != acc:
            c = self.body.fresh()
            emit(f"{c} = cast {v} : {acc}[{dims(shape)}]")
            v = c
        original = shape
        if perm is not None:
            shape = [original[d] for d in perm]
            t = self.body.fresh()
            emit(f"{t} = transpose {v} perm ({dims(perm)}) : {acc}[{dims(shape)}]")
            v = t
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
        if perm is not None:
            back = self.body.fresh()
            emit(f"{back} = transpose {d} perm ({dims([perm.index(q) for q in range(len(perm))])}) : {acc}[{dims(original)}]")
            d = back
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
        if tuple(lb) == (0,) and tuple(rb) == (0,) and len(a.aval.shape) == 3 and len(b.aval.shape) == 3:
            self.batched_dot(eqn)
            return
        if lb or rb or len(a.aval.shape) != 2 or len(b.aval.shape) != 2:
            raise self.refuse("`dot_general` other than a 2-D matrix product or one batched over a leading dimension", eqn)
        ta, tb = tuple(lc) == (0,), tuple(rc) == (1,)
        # An operand transposed only for this dot is read transposed instead.
        if a in self.transposed:
            a, ta = self.transposed[a], not ta
        if b in self.transposed:
            b, tb = self.transposed[b], not tb
        flags = (" trans_a" if ta else "") + (" trans_b" if tb else "")
        out = eqn.outvars[0]
        v = self.body.fresh()
        acc = _dot_acc(a.aval.dtype)
        m = a.aval.shape[1 if ta else 0]
        n = b.aval.shape[0 if tb else 1]
        self.body.emit(f"{v} = dot {self.value(a, eqn)}, {self.value(b, eqn)}{flags} : {acc}[{m}, {n}]")
        want = _ty(out.aval, self.kernel, eqn)
        if want.split("[")[0] != acc:
            w = self.body.fresh()
            self.body.emit(f"{w} = cast {v} : {want}")
            v = w
        self.define(out, v)

    def batched_dot(self, eqn) -> None:
        """`dot_general` batched over the leading dimension of both operands
        (`einsum('bqd,bkd->bqk')`): for each batch element, its slice of each operand as a matrix,
        their `dot`, and the products concatenated along a new leading dimension."""
        (lc, rc), _ = eqn.params["dimension_numbers"]
        a, b = eqn.invars
        (batch, a1, a2), (_, b1, b2) = a.aval.shape, b.aval.shape
        ta, tb = tuple(lc) == (1,), tuple(rc) == (2,)
        flags = (" trans_a" if ta else "") + (" trans_b" if tb else "")
        acc = _dot_acc(a.aval.dtype)
        m, n = (a2 if ta else a1), (b1 if tb else b2)
        av, bv = self.value(a, eqn), self.value(b, eqn)
        ta_ty, tb_ty = _ty(a.aval, self.kernel, eqn).split("[")[0], _ty(b.aval, self.kernel, eqn).split("[")[0]
        parts = []
        for t in range(batch):
            mats = []
            for v, ty, (d1, d2) in ((av, ta_ty, (a1, a2)), (bv, tb_ty, (b1, b2))):
                s, r = self.body.fresh(), self.body.fresh()
                self.body.emit(f"{s} = slice {v} start ({t}, 0, 0) : {ty}[1, {d1}, {d2}]")
                self.body.emit(f"{r} = reshape {s} : {ty}[{d1}, {d2}]")
                mats.append(r)
            d, e = self.body.fresh(), self.body.fresh()
            self.body.emit(f"{d} = dot {mats[0]}, {mats[1]}{flags} : {acc}[{m}, {n}]")
            self.body.emit(f"{e} = reshape {d} : {acc}[1, {m}, {n}]")
            parts.append(e)
        v = self.body.fresh()
        self.body.emit(f"{v} = concatenate {', '.join(parts)} axis 0")
        want = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        if want.split("[")[0] != acc:
            w = self.body.fresh()
            self.body.emit(f"{w} = cast {v} : {want}")
            v = w
        self.define(eqn.outvars[0], v)

    def sub(self, jaxpr, args, eqn) -> None:
        """Maps a sub-jaxpr's inputs to `args` (values or refs) in this writer's env, each with
        its argument's defining equation (so that a run `start + jnp.arange(n)` made outside a
        loop or branch is still seen as one inside)."""
        _, core, _ = _jax()
        for var, a in zip(jaxpr.invars, args):
            if isinstance(a, core.Literal):
                self.env[var] = _literal(a.val)
            else:
                self.env[var] = self.env[a]
                if a in self.defs:
                    self.defs[var] = self.defs[a]

    def inline(self, eqn) -> None:
        _, core, _ = _jax()
        p = eqn.params
        closed = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
        jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
        if getattr(closed, "consts", None):
            raise self.refuse(f"`{eqn.primitive.name}` with captured constants", eqn)
        self.sub(jaxpr, eqn.invars, eqn)
        self.eqns(jaxpr)
        self.results(eqn, jaxpr)

    def results(self, eqn, jaxpr) -> None:
        """The results of an inlined sub-jaxpr become `eqn`'s."""
        _, core, _ = _jax()
        for out, res in zip(eqn.outvars, jaxpr.outvars):
            self.env[out] = _literal(res.val) if isinstance(res, core.Literal) else self.env[res]

    def run_scoped(self, eqn) -> None:
        """`pl.run_scoped(f, *allocations)`: each allocation is a kernel `scratch` (its contents
        are undefined on entry in Pallas, so memory that persists is as good), then `f` inline."""
        _, core, _ = _jax()
        jaxpr = eqn.params["jaxpr"]
        if any(t for t in eqn.params.get("ref_transforms") or ()):
            raise self.refuse("a `run_scoped` allocation with transforms", eqn)
        # What the scope captures (the kernel's refs, values) comes in as its constants.
        for var, a in zip(jaxpr.constvars, eqn.invars):
            self.env[var] = self.read(a) if isinstance(a, core.Literal) else self.env[a]
        for var in jaxpr.invars:
            arg = f"r{len(self.scoped)}"
            self.scoped.append(_scratch(arg, var.aval, self.kernel, eqn, "`run_scoped` allocation"))
            self.env[var] = ("ref", arg)
        self.eqns(jaxpr)
        self.results(eqn, jaxpr)

    def cond(self, eqn) -> None:
        """`pl.when(c)` (a `cond` whose false branch does nothing), a `lax.cond` or `lax.switch`
        whose branches write refs (each under a `when`), or one returning values (`cond_values`)."""
        branches = eqn.params["branches"]
        index, *ops = eqn.invars
        if eqn.outvars:
            self.cond_values(eqn)
            return
        # Each branch that does something runs under a `when` of its own condition: the
        # predicate (or its negation) of a two-way `cond`, `index == k` of a `switch` (whose
        # index JAX has clamped into range). The conditions are computed before any branch runs.
        cond = self.bools.get(index) if len(branches) == 2 else None
        taken = []
        for k, b in enumerate(branches):
            if b.consts:
                raise self.refuse("`cond` with captured constants", eqn)
            if not b.jaxpr.eqns:
                taken.append(None)
            elif cond is not None and k == 1:
                taken.append(cond)
            else:
                t = self.body.fresh()
                if cond is not None:
                    self.body.emit(f"{t} = not {cond} : bool")
                else:
                    self.body.emit(f"{t} = eq {self.value(index, eqn)}, {k} : bool")
                taken.append(t)
        for b, t in zip(branches, taken):
            if t is None:
                continue
            self.body.emit(f"when {t} {{")
            self.body.depth += 1
            self.sub(b.jaxpr, ops, eqn)
            self.eqns(b.jaxpr)
            self.body.depth -= 1
            self.body.emit("}")

    def cond_values(self, eqn) -> None:
        """`lax.cond` and `lax.switch` returning values (skipping a block's work while keeping the
        carried state): an `if` whose branch taken alone runs, refs it writes included; a
        `switch` a chain of them on `index == k` (JAX has clamped the index into range), the last
        branch the final `else`."""
        branches = eqn.params["branches"]
        index, *ops = eqn.invars
        if any(b.consts for b in branches):
            raise self.refuse("`cond` with captured constants", eqn)
        # A two-way `cond` on a bool takes it as it is (the int JAX makes of it is not written):
        # `lax.cond(p, t, f)` is `cond(p, f, t)`, branch 1 where `p` holds.
        pred = self.bools.get(index) if len(branches) == 2 else None
        if pred is not None:
            results = self.choose(eqn, [branches[1], branches[0]], ops, lambda k: pred)
        else:
            idx = self.value(index, eqn)

            def taken(k: int) -> str:
                t = self.body.fresh()
                self.body.emit(f"{t} = eq {idx}, {k} : bool")
                return t

            results = self.choose(eqn, list(branches), ops, taken)
        for out, v in zip(eqn.outvars, results):
            self.define(out, v)

    def choose(self, eqn, branches, ops, taken) -> List[str]:
        """`RESULTS = if taken(0) { branches[0] } else { the branches after it }`, the last
        branch written alone; returns the result names."""
        b = branches[0]
        if len(branches) == 1:
            self.sub(b.jaxpr, ops, eqn)
            self.eqns(b.jaxpr)
            return [self.value(v, eqn) for v in b.jaxpr.outvars]
        c = taken(0)
        results = [self.body.fresh() for _ in eqn.outvars]
        self.body.emit(f"{', '.join(results)} = if {c} {{")
        self.body.depth += 1
        self.sub(b.jaxpr, ops, eqn)
        self.eqns(b.jaxpr)
        self.body.emit(f"yield {', '.join(self.value(v, eqn) for v in b.jaxpr.outvars)}")
        self.body.depth -= 1
        self.body.emit("} else {")
        self.body.depth += 1
        rest = self.choose(eqn, branches[1:], ops, lambda k: taken(k + 1))
        self.body.emit(f"yield {', '.join(rest)}")
        self.body.depth -= 1
        self.body.emit("}")
        return results

    def fori_while(self, eqn) -> None:
        """`lax.fori_loop` with bounds known only at run time (a `while` whose carry starts with
        the counter and the bound, whose condition is `counter < bound` and whose body adds 1 to
        the counter and keeps the bound): a `for` from the lower to the upper bound."""
        _, core, _ = _jax()
        p = eqn.params
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        consts, carry = eqn.invars[cn:cn + bn], eqn.invars[cn + bn:]
        cj, bj = cond.jaxpr, body.jaxpr
        counter_ok = (
            cn == 0
            and len(carry) >= 2
            and len(cj.eqns) == 1
            and cj.eqns[0].primitive.name == "lt"
            and list(cj.eqns[0].invars) == list(cj.invars[:2])
            and cj.outvars == cj.eqns[0].outvars
        )
        if counter_ok:
            i_in, hi_in = bj.invars[bn], bj.invars[bn + 1]
            i_out, hi_out = bj.outvars[0], bj.outvars[1]
            step = [q for q in bj.eqns if i_out in q.outvars]
            counter_ok = (
                hi_out == hi_in
                and len(step) == 1
                and step[0].primitive.name == "add"
                and step[0].invars[0] == i_in
                and isinstance(step[0].invars[1], core.Literal)
                and int(step[0].invars[1].val) == 1
                and not body.consts
            )
        if not counter_ok:
            return self.while_loop(eqn)
        lo, hi = self.value(carry[0], eqn), self.value(carry[1], eqn)
        rest = carry[2:]
        inits = [self.value(c, eqn) for c in rest]
        names = [self.body.fresh() for _ in rest]
        results = [self.body.fresh() for _ in rest]
        t = self.body.fresh()
        head = f"{', '.join(results)} = " if results else ""
        iters = f" iter ({', '.join(f'{n} = {i}' for n, i in zip(names, inits))})" if rest else ""
        self.body.emit(f"{head}for {t} = {lo} to {hi}{iters} {{")
        self.body.depth += 1
        for var, a in zip(bj.invars[:bn], consts):
            self.env[var] = self.env[a]
        self.env[bj.invars[bn]] = t
        self.env[bj.invars[bn + 1]] = hi
        for var, n in zip(bj.invars[bn + 2:], names):
            self.env[var] = n
        self.eqns(bj)
        if rest:
            self.body.emit(f"yield {', '.join(self.value(o, eqn) for o in bj.outvars[2:])}")
        self.body.depth -= 1
        self.body.emit("}")
        self.env[eqn.outvars[0]] = hi
        self.env[eqn.outvars[1]] = hi
        for out, r in zip(eqn.outvars[2:], results):
            self.env[out] = r

    def while_loop(self, eqn) -> None:
        """`lax.while_loop` with any condition: `for %t = 0 to 2^31 - 1 iter (..., %go = c0)
        while %go`, `c0` the condition on the initial carry and each trip's last value the
        condition on the carry it yields (docs/language.md's `while`)."""
        p = eqn.params
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        if cond.consts or body.consts:
            raise self.refuse("`while` with captured constants", eqn)
        cconsts, bconsts, carry = eqn.invars[:cn], eqn.invars[cn:cn + bn], eqn.invars[cn + bn:]
        cj, bj = cond.jaxpr, body.jaxpr

        def test(values: List[str]) -> str:
            for var, a in zip(cj.invars[:cn], cconsts):
                self.env[var] = self.env[a] if not isinstance(a, _jax()[1].Literal) else self.read(a)
            for var, v in zip(cj.invars[cn:], values):
                self.env[var] = v
            self.eqns(cj)
            return self.value(cj.outvars[0], eqn)

        inits = [self.value(c, eqn) for c in carry]
        go = self.body.fresh()
        self.carried_loop(eqn, bj, bconsts, inits, "0 to 2147483647", (go, test(inits), test))

    def scan(self, eqn) -> None:
        """`lax.fori_loop` (a `scan` with no scanned inputs): a `for` over its length with every
        carried value an `iter`."""
        _, core, _ = _jax()
        p = eqn.params
        nc, ncar = p["num_consts"], p["num_carry"]
        if p["reverse"] or len(eqn.invars) != nc + ncar or len(eqn.outvars) != ncar:
            raise self.refuse("`scan` over arrays (only `fori_loop` and carried values)", eqn)
        body = p["jaxpr"]
        if body.consts:
            raise self.refuse("`scan` with captured constants", eqn)
        consts, carry = eqn.invars[:nc], eqn.invars[nc:]
        self.carried_loop(eqn, body.jaxpr, consts, [self.value(c, eqn) for c in carry], f"0 to {p['length']}")

    def carried_loop(self, eqn, jaxpr, consts, inits: List[str], bounds: str, cond=None) -> None:
        """`RESULTS = for %t = BOUNDS iter (NAMES = INITS) { BODY; yield ... }` for a loop body
        `jaxpr` whose operands are `consts` then the carried values, its results the `eqn`'s.
        `cond` = (name, initial value, condition of the yielded values) carries one more `bool`
        after them and ends the loop where it is false (`while NAME`)."""
        _, core, _ = _jax()
        names = [self.body.fresh() for _ in inits]
        results = [self.body.fresh() for _ in inits]
        extra = [(cond[0], cond[1])] if cond else []
        iters = ", ".join(f"{n} = {i}" for n, i in [*zip(names, inits), *extra])
        heads = results + ([self.body.fresh()] if cond else [])
        until = f" while {cond[0]}" if cond else ""
        self.body.emit(f"{', '.join(heads)} = for {self.body.fresh()} = {bounds} iter ({iters}){until} {{")
        self.body.depth += 1
        self.sub(jaxpr, consts, eqn)
        for var, n in zip(jaxpr.invars[len(consts) :], names):
            self.env[var] = n
        self.eqns(jaxpr)
        outs = [self.value(o, eqn) for o in jaxpr.outvars]
        self.body.emit(f"yield {', '.join(outs + ([cond[2](outs)] if cond else []))}")
        self.body.depth -= 1
        self.body.emit("}")
        for out, r in zip(eqn.outvars, results):
            self.env[out] = r





def _translate(eqn, name: str) -> Translated:
    if eqn.primitive.name == "mpmd_map":
        return _translate_mesh(eqn, name)
    jax, core, _ = _jax()
    p = eqn.params
    gm = p["grid_mapping"]
    if p.get("mesh") is not None:
        raise _refuse("a `pallas_call` with a mesh", name, eqn)
    # A dynamic grid bound (megablox's count of active tiles) is an operand before all others:
    # a scalar input `g{k}` whose value sizes the axis, `dyn(g{k})`. Proofs about index maps
    # take such an axis as too large to check point by point.
    dynamic = [a for a, g in enumerate(gm.grid) if type(g).__name__ == "DynamicGridDim"]
    ndyn = len(dynamic)
    if ndyn and p.get("input_output_aliases"):
        raise _refuse("`input_output_aliases` with a dynamic grid", name, eqn, "drop the alias, or give the grid static sizes")
    grid = [_MAX_AXIS if a in dynamic else int(g) for a, g in enumerate(gm.grid)]
    if 0 in grid:
        raise _refuse(
            f"the grid {tuple(grid)}, which has no program,",
            name,
            eqn,
            "tessel's grid axes have sizes from 1; under tp.run or tp.install a pallas_call with an empty grid runs no "
            "program, as in Pallas, and its outputs are zeros (or the inputs they alias)",
        )
    body = p["jaxpr"]
    # Scalar-prefetch operands come first (`PrefetchScalarGridSpec`): whole inputs the body reads.
    nscalar = getattr(gm, "num_index_operands", 0)
    nin, nout = nscalar + gm.num_inputs, gm.num_outputs
    ins = [f"x{i}" for i in range(nin)]
    outs = [f"o{i}" for i in range(nout)]
    bounds = [f"g{k}" for k in range(ndyn)]
    header = []
    used_by_outputs = set()
    squeezed: Dict[str, List[int]] = {}
    operands = eqn.invars[ndyn:]
    lines_in = [f"  in  {arg}: {_ty(v.aval, name, eqn)}" for arg, v in zip(bounds + ins, eqn.invars[: ndyn + nscalar])]
    lines_out = []
    #: operand -> (its block spec's text, its index map, its array shape, its block shape)
    specs: Dict[str, Any] = {}
    #: operands whose index map the body computes -> (the index map, the block shape)
    computed: Dict[str, Any] = {}
    #: operands with a computed block index in the header
    indexed = set()
    #: the scalar-prefetch operands a computed block index can read (integer arrays)
    tables = [
        arg if np.dtype(v.aval.dtype) in (np.dtype(np.int32), np.dtype(np.uint32)) else None
        for arg, v in zip(ins, operands[:nscalar])
    ]
    for n, (bm, arg) in enumerate(zip(gm.block_mappings, ins[nscalar:] + outs)):
        shape = tuple(bm.array_aval.shape)
        blocks = []
        for d, b in enumerate(bm.block_shape):
            if b is None or type(b).__name__ == "Squeezed":
                squeezed.setdefault(arg, []).append(d)
                blocks.append(1)
                continue
            size = getattr(b, "block_size", b)
            if not isinstance(size, (int, np.integer)) or type(b).__name__ not in ("Blocked", "int"):
                raise _refuse(f"the block dimension {b!r} of `{arg}`", name, eqn, "tessel blocks are Blocked(size) or squeezed")
            blocks.append(int(size))
        ty = _ty(bm.array_aval, name, eqn)
        affine = _affine(bm.index_map_jaxpr, grid, name, f"`{arg}`", nscalar)
        is_out = n >= gm.num_inputs
        if affine is None:
            texts = _index_texts(bm.index_map_jaxpr, grid, tables)
            if texts is not None:
                # A computed block index (docs/language.md §2), clamped as Pallas clamps.
                indexed.add(arg)
                spec = f" block [{', '.join(str(b) for b in blocks)}] at ({', '.join(texts)})"
                specs[arg] = (spec, None, shape, blocks)
                (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}{spec}")
                continue
            # The whole array, each access at the block the body computes.
            computed[arg] = (bm.index_map_jaxpr, blocks)
            specs[arg] = ("computed", None, shape, blocks)
            (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}")
            continue
        index = affine.text()
        if is_out:
            for a in range(len(grid)):
                if any(f"i{a}" in t.replace("*", " ").split() for t in index):
                    used_by_outputs.add(a)
        whole = tuple(blocks) == shape and all(t == "0" for t in index)
        spec = "" if whole else f" block [{', '.join(str(b) for b in blocks)}] at ({', '.join(index)})"
        specs[arg] = (spec, affine, shape, blocks)
        (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}{spec}")
    if any(o in computed or o in indexed for o in outs):
        # Programs whose computed output blocks may coincide run in order, as Pallas runs them.
        used_by_outputs = set()
    if grid:
        sizes = [f"dyn(g{dynamic.index(a)})" if a in dynamic else str(s) for a, s in enumerate(grid)]
        axes = ", ".join(f"i{a}: {s}{'' if a in used_by_outputs else ' seq'}" for a, s in enumerate(sizes))
        header.append(f"  grid ({axes})")
    # `scratch_shapes`: per-program memory that persists across the `seq` steps, as tessel's
    # `scratch` does.
    scratch = [f"s{i}" for i in range(getattr(gm, "num_scratch_operands", 0))]
    lines_scratch = [_scratch(arg, aval, name, eqn) for arg, aval in zip(scratch, gm.scratch_avals)]
    jaxpr = body.jaxpr if hasattr(body, "jaxpr") else body

    def written(refs: List[str]) -> "_Writer":
        w = _Writer(name, [f"i{a}" for a in range(len(grid))])
        vmapped = set(getattr(gm, "vmapped_dims", ()) or ())
        w.body_axes = [f"i{a}" for a in range(len(grid)) if a not in vmapped]
        w.squeezed = squeezed
        for var, arg in zip(jaxpr.invars, refs):
            w.env[var] = ("ref", arg)
        if computed:
            w.computed_blocks(computed, ins[:nscalar])
        w.eqns(jaxpr)
        return w

    refs = ins + outs + scratch
    w = written(refs)
    # `input_output_aliases`: an input and an output of one buffer in Pallas. Where separate
    # arrays give the same results they stay so; elsewhere the output starts from the input's
    # buffer (XLA aliases them; the handler keeps its contents) and every load of the input is a
    # load of the output, before any store to it (`_alias_kept`).
    kept = []
    for i, o in p.get("input_output_aliases") or ():
        x, out = ins[i], outs[o]
        if x not in specs or out not in specs or specs[x][0] != specs[out][0]:
            raise _refuse(
                f"`input_output_aliases` pairing `{x}` with `{out}`", name, eqn,
                "tessel takes an alias whose input and output have the same block spec",
            )
        if _alias_kept(name, eqn, x, out, specs, grid, used_by_outputs, w.body.lines):
            kept.append((i, o))
    if kept:
        for i, o in kept:
            refs[i] = outs[o]
        w = written(refs)
        gone = {ins[i] for i, _ in kept}
        lines_in = [line for line in lines_in if line.split(":")[0].split()[-1] not in gone]
    text = "\n".join([f"kernel {name}"] + header + lines_in + lines_out + lines_scratch + w.scoped + ["{"] + w.body.lines + ["}"]) + "\n"
    return Translated(name, text, bounds + ins, outs, kept=[(len(bounds) + i, o) for i, o in kept])


def _alias_kept(name: str, eqn, x: str, o: str, specs, grid, parallel, lines: List[str]) -> bool:
    """How `input_output_aliases` pairing input `x` with output `o` (of one block spec) runs:
    Pallas reads `x` as it was when the call began and `o` starts as `x`'s values. Where the
    kernel overwrites `o` whole (every element stored unmasked at the body's top level, affine
    blocks covering the array), separate arrays give that (False). Elsewhere `o` starts from
    `x`'s buffer, which XLA aliases to it, and loads of `x` read `o` (True): right while no read
    of `x` could see what the kernel stored into `o`, which is refused."""
    what = f"`input_output_aliases` pairing `{x}` with `{o}`"
    stores = [n for n, line in enumerate(lines) if re.match(rf"^\s*store {o}\b", line)]
    read = [n for n, line in enumerate(lines) if re.search(rf"= load {x}\b", line)]
    revisits = any(size > 1 and a not in parallel for a, size in enumerate(grid))
    # The `for` loops of the body, as line ranges: a store in one, then a read in the next turn.
    loops, open_ = [], []
    for n, line in enumerate(lines):
        # `} else {` closes an `if`'s first branch and opens its second.
        if line.strip().startswith("}") and open_:
            start, is_for = open_.pop()
            if is_for:
                loops.append(range(start, n + 1))
        if line.rstrip().endswith("{"):
            open_.append((n, re.search(r"\bfor %", line) is not None))
    looped = any(any(n in r for n in stores) and any(n in r for n in read) for r in loops)
    if stores and (any(n > stores[0] for n in read) or (read and revisits) or looped):
        raise _refuse(
            f"{what} (the kernel reads `{x}` where it could see what it stored into `{o}`: after the store, in a loop or across `seq` steps)",
            name,
            eqn,
            f"read `{x}` only before storing `{o}`, or drop the alias",
        )
    _, affine, shape, blocks = specs[o]
    whole_store = re.compile(rf"^  store {o}, %\S+$")
    whole = any(whole_store.match(line) for line in lines) and affine is not None and specs[x][1] is not None
    return not (whole and affine.covers(grid, shape, blocks))


def _mesh(mesh, kernel: str, eqn, kind: str = "mesh"):
    """A Pallas mesh as tessel's mesh text and its axis names: a Mosaic GPU mesh (`plgpu.Mesh`)
    as `mosaic_gpu(...)` with its cluster and thread axes, a device mesh (`jax.sharding.Mesh`)
    as `device(...)`, and any other (a TPU core mesh, ...) as the portable `grid(...)` of its
    named axes."""
    cls = type(mesh).__name__
    module = type(mesh).__module__
    if cls == "Mesh" and "mosaic_gpu" in module:
        names = list(mesh.grid_names or [f"i{a}" for a in range(len(mesh.grid))])
        axes = [(n, s, "") for n, s in zip(names, mesh.grid)]
        axes += [(n, s, " cluster") for n, s in zip(mesh.cluster_names or (), mesh.cluster or ())]
        if mesh.num_threads is not None:
            axes.append((mesh.thread_name, mesh.num_threads, " thread"))
        kind_text = "mosaic_gpu"
    else:
        shape = getattr(mesh, "shape", None)
        if not hasattr(shape, "items"):
            raise _refuse(f"the {kind} {mesh!r}", kernel, eqn, "tessel reads a mesh's named axes (its `shape`)")
        axes = [(n, s, "") for n, s in shape.items()]
        kind_text = "device" if "jax._src.mesh" in module or cls == "AbstractMesh" else "grid"
    text = f"{kind_text}({', '.join(f'{n}: {s}{k}' for n, s, k in axes)})"
    return text, [n for n, _, _ in axes]


def _translate_mesh(eqn, name: str) -> Translated:
    """`pl.kernel(body, mesh=...)` (`mpmd_map` with one mesh): the body runs once per point of
    the mesh on whole arrays, each `jax.lax.axis_index` a `program_id` of the mesh's axis; the
    mesh and the external meshes go to the launch, where each backend takes or refuses them."""
    _, core, _ = _jax()
    p = eqn.params
    if len(p["jaxprs"]) != 1:
        raise _refuse("`mpmd_map` of several mesh/function pairs", name, eqn, "pass one body and one mesh to pl.kernel")
    if p.get("input_output_aliases"):
        raise _refuse("`input_output_aliases` of a kernel on a mesh", name, eqn, "pass the refs' values and return new outputs")
    (closed,), (mesh,) = p["jaxprs"], p["meshes"]
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    mesh_text, axes = _mesh(mesh, name, eqn)
    external = [_mesh(m, name, eqn, "external mesh")[0] for m in p.get("external_meshes") or ()]
    nin, nout = len(eqn.invars), len(p["out_avals"])
    ins = [f"x{i}" for i in range(nin)]
    outs = [f"o{i}" for i in range(nout)]
    scratch = [f"s{i}" for i in range(len(jaxpr.invars) - nin - nout)]
    lines = [f"  in  {a}: {_ty(v.aval, name, eqn)}" for a, v in zip(ins, eqn.invars)]
    lines += [f"  out {a}: {_ty(v, name, eqn)}" for a, v in zip(outs, p["out_avals"])]
    lines += [_scratch(a, var.aval, name, eqn) for a, var in zip(scratch, jaxpr.invars[nin + nout:])]
    w = _Writer(name, axes)
    for var, arg in zip(jaxpr.invars, ins + outs + scratch):
        w.env[var] = ("ref", arg)
    w.eqns(jaxpr)
    text = "\n".join([f"kernel {name}"] + lines + w.scoped + ["{"] + w.body.lines + ["}"]) + "\n"
    return Translated(name, text, ins, outs, mesh_text, external)


def _pallas_calls(jaxpr, found: List[Any]) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _CALLS:
            found.append(eqn)
        elif eqn.primitive.name in _INLINE:
            closed = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            if closed is not None:
                _pallas_calls(closed.jaxpr if hasattr(closed, "jaxpr") else closed, found)


def _name(eqn, fn, n: int) -> str:
    """The `pallas_call`'s `name=`, else `fn`'s name; the n-th call of one function gets `_n`."""
    base = eqn.params.get("name") or getattr(fn, "__name__", "kernel")
    base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(base)) or "kernel"
    return base if n == 0 else f"{base}_{n}"


def translate(fn: Callable, *args, **kwargs) -> List[Translated]:
    """Every `pallas_call` `fn` makes on `args`, translated (in the order `fn` makes them)."""
    jax, _, _ = _jax()
    closed = jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
    found: List[Any] = []
    _pallas_calls(closed.jaxpr, found)
    if not found:
        what = getattr(fn, "__name__", fn)
        raise UnsupportedError(f"`{what}` makes no `pallas_call`", None, "pass a function that calls pl.pallas_call")
    return [_translate(eqn, _name(eqn, fn, n)) for n, eqn in enumerate(found)]


def to_tk(fn: Callable, *args, **kwargs) -> str:
    """The `.tk` text of every `pallas_call` that `fn(*args)` makes, one kernel each."""
    return "\n".join(t.text for t in translate(fn, *args, **kwargs))


class _Lowered:
    """A `pallas_call` or `mpmd_map` seen from its lowering rule, shaped as the equation the
    translator reads: its primitive, operands (their avals), parameters and source line."""

    def __init__(self, primitive, ctx, params):
        _, _, siu = _jax()
        self.primitive = primitive
        self.params = params
        self.invars = [_Aval(a) for a in ctx.avals_in]
        self.source_info = siu.current()


@dataclass
class _Aval:
    aval: Any


#: What `run` sets while it lowers `fn`: the kernels' names, `fn`'s as `translate` gives them.
_naming = threading.local()


def _lowered_name(params) -> str:
    """The name a lowered `pallas_call` gets: inside `run`, `fn`'s (`_n` for the n-th call), as
    `translate` names it; else its `name=`, else its body function's."""
    named = getattr(_naming, "fn", None)
    if named is not None:
        fn, counter = named
        return _name(_Named(params), fn, next(counter))
    base = params.get("name")
    if not base:
        jaxprs = params.get("jaxprs") or [params.get("jaxpr")]
        info = getattr(jaxprs[0], "debug_info", None)
        base = getattr(info, "func_name", None) or "kernel"
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(base)) or "kernel"


@dataclass
class _Named:
    params: Dict[str, Any]


def _rules():
    """Pallas's two launch primitives, and JAX's table of lowering rules by platform."""
    from jax._src.interpreters import mlir
    from jax._src.pallas.pallas_call import pallas_call_p

    try:
        from jax._src.pallas.mpmd import mpmd_map_p
    except ImportError:  # a JAX without `pl.kernel`'s mpmd_map
        return mlir, (pallas_call_p,)
    return mlir, (pallas_call_p, mpmd_map_p)


def _rule(primitive, backend: str, explain: bool):
    """The CPU lowering of `primitive` on tessel's `backend`: the call translated to `.tk` and
    emitted as a `tessel_call` custom call. An interpreted call keeps Pallas's own lowering."""
    from . import jax as tj

    mlir, _ = _rules()
    generic = mlir._lowerings[primitive]

    def lower(ctx, *operands, **params):
        if params.get("interpret"):
            return generic.rule(ctx, *operands, **params)
        if _empty_grid(params):
            return _no_programs(ctx, operands, params)
        eqn = _Lowered(primitive, ctx, params)
        t = _translate(eqn, _lowered_name(params))
        return tj.lowering(ctx, *operands, text=t.text, backend=backend, mesh=t.mesh,
                           external_meshes=t.external_meshes, explain=explain,
                           kept=[(i, o, t.outputs[o]) for i, o in t.kept])

    lower.tessel_backend = (backend, explain)
    return lower


def _empty_grid(params) -> bool:
    """Whether a `pallas_call`'s grid has an axis of size 0 (so no program runs)."""
    gm = params.get("grid_mapping")
    return gm is not None and not getattr(gm, "num_dynamic_grid_bounds", 0) and 0 in [int(g) for g in gm.grid]


def _no_programs(ctx, operands, params):
    """The lowering of a `pallas_call` that runs no program (an empty grid), as Pallas runs it:
    nothing is called; each output is the input it aliases (`input_output_aliases`), else zeros
    (Pallas leaves it unwritten; tessel's outputs start as zeros)."""
    import jax.numpy as jnp
    from jax._src.interpreters import mlir

    aliased = {o: i for i, o in (params.get("input_output_aliases") or ())}

    def outputs(*xs):
        return [xs[aliased[o]] if o in aliased else jnp.zeros(a.shape, a.dtype) for o, a in enumerate(ctx.avals_out)]

    return mlir.lower_fun(outputs, multiple_results=True)(ctx, *operands)


#: What `install` replaced: the CPU rules there were before the first install.
_before: Dict[Any, Any] = {}
#: JAX's table of lowering rules is global: installs, restores and `run`'s lowering take turns.
_rules_lock = threading.RLock()


def _current():
    mlir, prims = _rules()
    table = mlir._platform_specific_lowerings["cpu"]
    return {p: table.get(p) for p in prims}


def _restore(saved) -> None:
    import jax

    mlir, _ = _rules()
    table = mlir._platform_specific_lowerings["cpu"]
    changed = False
    for p, entry in saved.items():
        if table.get(p) is not entry:
            changed = True
        if entry is None:
            table.pop(p, None)
        else:
            table[p] = entry
    if changed:
        # Executables JAX compiled under the rules being replaced must not run again.
        jax.clear_caches()


def _locked(f):
    @functools.wraps(f)
    def under_lock(*a, **k):
        with _rules_lock:
            return f(*a, **k)

    return under_lock


@_locked
def install(backend: str = "auto", explain: bool = False) -> None:
    """From now on, a `pl.pallas_call` (and `pl.kernel`'s `mpmd_map`) that JAX lowers for the CPU
    runs on tessel's `backend` ("auto": the first that takes it, chosen when lowered), wherever
    it is: inside `jax.jit`, under `grad`, `vmap`, `lax.scan`, `lax.cond` and `shard_map`. A call
    with `interpret=True` keeps Pallas's interpreter. What tessel cannot translate raises
    `tessel.UnsupportedError` when the function is lowered. `explain` prints the backend's choice
    as each call is lowered. JAX's caches are cleared when the rules change, so no executable
    compiled before runs on the old ones."""
    import jax

    from . import jax as tj

    tj.register("cpu")
    mlir, prims = _rules()
    now = _current()
    if not _before:
        _before.update({p: e for p, e in now.items() if not hasattr(getattr(e, "rule", None), "tessel_backend")})
    if all(getattr(getattr(e, "rule", None), "tessel_backend", None) == (backend, explain) for e in now.values()):
        return
    for p in prims:
        mlir.register_lowering(p, _rule(p, backend, explain), platform="cpu")
    jax.clear_caches()


@_locked
def uninstall() -> None:
    """Puts back the CPU lowerings there were before `install` (Pallas's, which raise `Only
    interpret mode is supported on CPU backend.`)."""
    mlir, prims = _rules()
    _restore({p: _before.get(p) for p in prims})
    _before.clear()


@contextlib.contextmanager
def installed(backend: str = "auto", explain: bool = False):
    """`install(backend)` for a block; the rules there were before come back after it."""
    with _rules_lock:
        saved = _current()
        first = not _before
    try:
        with _rules_lock:
            install(backend, explain)
        yield
    finally:
        with _rules_lock:
            _restore(saved)
            if first:
                _before.clear()


@dataclass(frozen=True)
class CompilerParams:
    """`compiler_params=tp.CompilerParams(backend="mosaic-gpu")` on a `pallas_call`: when JAX
    lowers it for a GPU, tessel lowers it (registered with
    `jax.extend.pallas.register_lowering_rule`); without it Pallas's own GPU lowering stays.
    On the CPU the call runs where `install` sends it, as any other."""

    backend: str = "mosaic-gpu"

    def __post_init__(self):
        _register_gpu_rule()


_gpu_rule_registered = False


def _register_gpu_rule() -> None:
    global _gpu_rule_registered
    if _gpu_rule_registered:
        return
    import jax

    try:
        from jax.extend import pallas as jex_pallas
    except ImportError:
        raise UnsupportedError(
            f"tp.CompilerParams needs jax.extend.pallas.register_lowering_rule, which jax {jax.__version__} lacks",
            None,
            "pip install -U 'jax>=0.10'; on the CPU, tp.install() runs the pallas_call on tessel without CompilerParams",
        ) from None

    def lower(ctx, *operands, compiler_params, **params):
        from . import jax as tj

        if _empty_grid(params):
            return _no_programs(ctx, operands, params)
        eqn = _Lowered(ctx.primitive, ctx, params)
        t = _translate(eqn, _lowered_name(params))
        if t.kept:
            pairs = ", ".join(f"`{t.inputs[i]}` with `{t.outputs[o]}`" for i, o in t.kept)
            raise _refuse(
                f"`input_output_aliases` pairing {pairs}, where the output starts from the input's buffer,",
                t.name, None,
                "store every element of the aliased output (o_ref[...] = ...) without reading the input after it, "
                "or run the kernel on the CPU (tessel.pallas.install), where XLA's aliasing is taken",
            )
        return tj.lowering(ctx, *operands, text=t.text, backend=compiler_params.backend, mesh=t.mesh,
                           external_meshes=t.external_meshes)

    jex_pallas.register_lowering_rule(CompilerParams, lower, "gpu")
    _gpu_rule_registered = True




def run(fn: Callable, *args, backend: str = "auto", explain: bool = False, **kwargs):
    """`fn(*args)` in `jax.jit` with every `pallas_call` on tessel's `backend` (`installed`);
    returns `fn`'s outputs, with its structure, as numpy arrays. `explain` prints why each
    call's backend was chosen. Arguments are taken as `jax.jit` takes them (`float64` becomes
    `float32` where JAX's x64 mode is off), except that a numpy array of the other byte order
    (`>f4`), which `jax.jit` refuses, is converted to native order first."""
    import jax

    from .jax import _native_order

    def traced(*a):
        return fn(*a, **kwargs)

    # tessel's rules are the CPU's: the program is lowered for the CPU whatever JAX's default
    # device is, under the lock (another thread's `run` may want other rules), and runs after.
    args = jax.tree_util.tree_map(_native_order, args)
    cpu = jax.devices("cpu")[0]
    with _rules_lock, installed(backend, explain), jax.default_device(cpu):
        _naming.fn = (fn, itertools.count())
        try:
            compiled = jax.jit(traced).lower(*args).compile()
        finally:
            _naming.fn = None
    out = compiled(*jax.device_put(args, cpu))
    return jax.tree_util.tree_map(np.asarray, out)
