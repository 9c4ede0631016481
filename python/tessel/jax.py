"""tessel inside JAX: a `.tk` kernel as a JAX operation, inside `jax.jit`, `vmap`, `lax.scan`,
`lax.cond` and `shard_map`.

    import jax, tessel
    k = tessel.load("examples/add.tk")
    f = jax.jit(lambda x, y: tessel.jax.call(k, x, y) * 2)

`call` specializes the kernel for the traced shapes and dtypes when it is traced (a wrong shape
or dtype is a `tessel.InputError` then, naming the input) and emits a custom call of tessel's
XLA FFI handler, `tessel_call`, whose attributes carry the specialized kernel text and the
backend. XLA runs the handler on its own buffers: on the CPU the interpreter computes in place
on them, a device backend uploads from and downloads into them; on a CUDA GPU mosaic-gpu's
kernel is enqueued on XLA's stream with the buffers' device addresses. `tessel.pallas.install` uses the same
handler for unchanged Pallas kernels. docs/jax.md says what works and what differs from Pallas.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - the tests install jax
    raise ImportError("tessel.jax needs jax: pip install 'jax>=0.8'") from e

from . import _tessel
from ._errors import InputError

__all__ = ["call", "register", "lowering", "stats", "TESTED_JAX"]

#: The JAX versions tessel's JAX tests ran on (docs/jax.md).
TESTED_JAX = ("0.8.1", "0.10.2", "0.11.2")
#: The oldest JAX with everything tessel uses (`jax.ffi`, typed FFI on the CPU, `shard_map`).
_OLDEST = (0, 8)


def _version(text: str):
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version(jax.__version__)[:2] < _OLDEST:
    raise ImportError(
        f"tessel.jax needs jax {'.'.join(map(str, _OLDEST))} or newer; this is jax {jax.__version__}\n"
        f"  pip install -U 'jax>={'.'.join(map(str, _OLDEST))}' (tested: {', '.join(TESTED_JAX)})"
    )

_lock = threading.Lock()
_registered: set = set()


#: XLA's name of each platform tessel has a handler for, and that handler's capsule.
_HANDLERS = {"cpu": ("cpu", "tessel_call"), "host": ("cpu", "tessel_call"),
             "cuda": ("CUDA", "tessel_call_cuda"), "gpu": ("CUDA", "tessel_call_cuda")}


def register(platform: str = "cpu") -> None:
    """Registers tessel's XLA FFI handler `tessel_call` for `platform` ("cpu" or "cuda"), once:
    on the CPU it runs kernels in place on XLA's host buffers; on CUDA it enqueues mosaic-gpu's
    PTX on XLA's stream with the device buffers' addresses (another backend runs through host
    copies there). `call` and `tessel.pallas.install` register both on first use. The CPU also
    gets `tessel_empty`, the empty handler the benchmarks measure against."""
    found = _HANDLERS.get(platform.lower())
    if found is None:
        from ._errors import UnsupportedError

        raise UnsupportedError(
            f"tessel's XLA FFI handler runs on the CPU and CUDA platforms, not {platform!r}",
            None,
            "lower for the CPU (JAX_PLATFORMS=cpu) or for an NVIDIA GPU (CUDA)",
        )
    xla_platform, handler = found
    with _lock:
        if xla_platform in _registered:
            return
        capsules = _tessel._ffi_capsules()
        jax.ffi.register_ffi_target("tessel_call", capsules[handler], platform=xla_platform)
        if xla_platform == "cpu":
            jax.ffi.register_ffi_target("tessel_empty", capsules["tessel_empty"], platform="cpu")
        _registered.add(xla_platform)


def _register_all() -> None:
    register("cpu")
    register("cuda")


def stats() -> Dict[str, Any]:
    """The handler's counters in this process: `calls`, prepared-launch cache `hits` and
    `misses`, `failures`, `staged` (CUDA calls that ran through host copies), and `launches`
    by backend name."""
    return _tessel._ffi_stats()


def _dtype(name: str):
    return jnp.bfloat16 if name == "bfloat16" else np.dtype(name)


def prepare(text: str, backend: str = "auto", mesh: Optional[str] = None, external_meshes: Sequence[str] = ()):
    """The launch of kernel `text` prepared for the handler (parsed, verified, its backend chosen
    or asked): a refusal raises here, when the caller traces or lowers, not when XLA runs it.
    Returns the backend that will run it and why, one line per backend tried."""
    return _tessel._ffi_prepare(text, backend, mesh or "", "\n".join(external_meshes))


def lowering(ctx, *operands, text: str, backend: str = "auto", mesh: Optional[str] = None,
             external_meshes: Sequence[str] = (), explain: bool = False,
             kept: Sequence[Tuple[int, int, str]] = (), copied: Sequence[int] = ()):
    """The MLIR of a `tessel_call` of kernel `text` on `operands` (an XLA lowering rule's body):
    prepares the launch first, so that a refusal is raised while lowering. `kept` lists
    (operand, result, output name) triples whose output starts from the operand's buffer: the
    operand goes last, aliased to the result by XLA (`operand_output_aliases`), and the handler
    keeps the output's contents (`keep`); it is not the kernel's input, except those in
    `copied`, which are passed in their place too (XLA copies the aliased one: the call reads
    the other)."""
    _register_all()
    chosen, decisions = prepare(text, backend, mesh, external_meshes)
    if explain:
        import sys

        sys.stderr.write("".join(f"{d}\n" for d in decisions))
    aliased = [i for i, _, _ in kept]
    order = [j for j in range(len(operands)) if j not in aliased or j in copied] + aliased
    first = len(order) - len(kept)
    rule = jax.ffi.ffi_lowering("tessel_call", operand_output_aliases={first + t: r for t, (_, r, _) in enumerate(kept)} or None)
    if kept:
        ctx = ctx.replace(avals_in=[ctx.avals_in[j] for j in order])
    return rule(ctx, *[operands[j] for j in order], text=text, backend=chosen, mesh=mesh or "",
                externals="\n".join(external_meshes), keep=",".join(name for _, _, name in kept))


def _native_order(x):
    """A numpy array of non-native byte order as a native copy; anything else as it is."""
    if isinstance(x, np.ndarray) and not x.dtype.isnative:
        return x.astype(x.dtype.newbyteorder("="))
    return x


def call(kernel, *arrays, backend: str = "auto", params: Optional[Mapping[str, int]] = None, **named):
    """Kernel `kernel` (a `tessel.Kernel`, or a `.tk` file's path) on `arrays` as a JAX
    operation: positional arrays are its inputs in declared order, named ones by name. Returns a
    `jax.Array`, or a tuple of them in declared order where the kernel has several outputs.

    Specialized when traced (language §9: shape parameters from the arrays, others from `params`,
    then a tuning record of the backend named, then the defaults); a wrong shape or dtype raises
    `tessel.InputError` then. `backend="auto"` is resolved when traced, too. Under `vmap` the
    handler launches the kernel once per batch element on that element's slice of XLA's buffers.
    """
    if isinstance(kernel, (str, os.PathLike)):
        import tessel

        kernel = tessel.load(kernel)
    name = kernel.name
    declared = list(kernel.inputs)
    if len(arrays) > len(declared):
        raise InputError(
            f"kernel `{name}` takes {len(declared)} inputs ({', '.join(declared)}); {len(arrays)} were given by position\n"
            f"  pass at most {len(declared)} arrays, or name them"
        )
    given = dict(zip(declared, arrays))
    for n, x in named.items():
        if n not in declared:
            raise InputError(f"kernel `{name}` has no input `{n}`\n  its inputs are: {', '.join(declared)}")
        if n in given:
            raise InputError(f"input `{n}` of kernel `{name}` is given twice, by position and by name\n  give it once")
        given[n] = x
    # Arrays outside a trace are taken as JAX takes them (`float64` is `float32` where x64 is off);
    # one of the other byte order (`>f4`), which JAX refuses, is converted to native order first.
    given = {n: x if isinstance(x, jax.Array) else jnp.asarray(_native_order(x)) for n, x in given.items()}
    missing = [n for n in declared if n not in given]
    if missing:
        raise InputError(
            f"kernel `{name}` needs input `{missing[0]}`: {kernel.inputs[missing[0]]}\n"
            f"  pass it by position or by name: tessel.jax.call(kernel, ..., {missing[0]}=array)"
        )
    shapes = {n: [int(d) for d in np.shape(x)] for n, x in given.items()}
    text, ins, outs = kernel._specialize(shapes, dict(params or {}), backend)
    for n, dtype, shape in ins:
        got = np.dtype(given[n].dtype)
        if got != np.dtype(_dtype(dtype)):
            raise InputError(
                f"input `{n}` of kernel `{name}` is {got.name}[{', '.join(map(str, shapes[n]))}], "
                f"but the kernel declares {dtype}[{', '.join(map(str, shape))}]\n"
                f"  give an array of {dtype}: x.astype(jnp.{dtype})"
            )
    _register_all()
    chosen, _ = prepare(text, backend)
    results = [jax.ShapeDtypeStruct(tuple(s), _dtype(d)) for _, d, s in outs]
    f = jax.ffi.ffi_call("tessel_call", results, vmap_method="broadcast_all")
    out = f(*[given[n] for n, _, _ in ins], text=text, backend=chosen, mesh="", externals="")
    return out[0] if len(outs) == 1 else tuple(out)
