"""What the Pallas translation's modules share: the primitive tables, how a refusal is made and
named, `.tk` types and literals, and `Translated`, one `pallas_call` as tessel sees it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from ._errors import UnsupportedError
from ._jax_support import _jax


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
_EFFECTS = {"swap", "masked_swap", "cond", "scan", "while", "run_scoped", "debug_print", "debug_callback", "dma_start", "dma_wait", "prng_seed", "prng_random_bits", "random_bits"}


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


def _semaphore(aval) -> bool:
    """Whether a scratch allocation is DMA semaphores (`pltpu.SemaphoreType.DMA`)."""
    return "dma_sem" in str(aval).lower()


def _scratch(arg: str, aval, kernel: str, eqn, what: str = "scratch operand") -> str:
    """The `scratch` line of a Pallas scratch buffer (`pltpu.VMEM(shape, dtype)` and the like),
    or "" for DMA semaphores (a copy is made when it starts, so there is nothing to wait for);
    another semaphore or non-array allocation is refused."""
    if _semaphore(aval):
        return ""
    inner = getattr(aval, "inner_aval", aval)
    if not hasattr(inner, "shape") or not hasattr(inner, "dtype") or "sem" in str(aval).lower():
        raise _refuse(f"the {what} {aval}", kernel, eqn, "tessel's scratch is an array of one dtype")
    return f"  scratch {arg}: {_ty(inner, kernel, eqn)}"


def _dims(shape) -> str:
    """A shape's dimensions as `.tk` writes them (`8, 128`)."""
    return ", ".join(str(d) for d in shape)


def _axis_last(axis: int, rank: int) -> Optional[List[int]]:
    """The permutation that moves `axis` last, the others in order, or None where it is last."""
    return None if axis == rank - 1 else [d for d in range(rank) if d != axis] + [axis]


def _inverse(perm: List[int]) -> List[int]:
    """The permutation that undoes `perm`."""
    return [perm.index(d) for d in range(len(perm))]


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
    #: The operands of `kept` pairs that the kernel reads too, as the input they are (it could
    #: see what it stored into the output otherwise): passed twice, once in place and once last
    #: (XLA copies the aliased one, since the call reads the other).
    copied: List[int] = field(default_factory=list)


#: Bodies a kernel nests inside one another at most (`plugin-api/src/ir/limits.rs`, MAX_NESTING).
MAX_NESTING = 64


class _TooDeep(Exception):
    """A body opened past [`MAX_NESTING`]: the writer names the equation that opened it."""


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
        # A line that opens a body at depth d opens the d-th body inside another (the kernel's
        # own is depth 1): past the limit, the writer refuses it at the user's line, not the
        # verifier at a line of the text written.
        if line.endswith("{") and self.depth > MAX_NESTING:
            raise _TooDeep()
        self.lines.append("  " * self.depth + line)

    def let(self, rhs: str, ty: str) -> str:
        """A fresh value defined as `rhs` of type `ty` (`%v7 = add %a, %b : f32[8]`)."""
        v = self.fresh()
        self.emit(f"{v} = {rhs} : {ty}")
        return v
