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
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import numpy as np

from ._common import _CALLS, Translated
from ._errors import UnsupportedError
from ._jax_support import _INLINE, _jax
from ._translate import _translate


__all__ = ["to_tk", "run", "translate", "Translated", "install", "uninstall", "installed", "CompilerParams"]


def _pallas_calls(jaxpr, found: List[Any]) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _CALLS:
            found.append(eqn)
        elif eqn.primitive.name in _INLINE or eqn.primitive.name == "custom_vmap_call":
            # A call read in place; `custom_vmap_call` wraps `plgpu.kernel`'s launch.
            closed = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr") or eqn.params.get("call")
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
                           kept=[(i, o, t.outputs[o]) for i, o in t.kept], copied=t.copied)

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
    """`install(backend)` for a block; the rules there were before come back after it.

    The block holds tessel's lock on JAX's lowering rules from start to end: JAX's table of rules
    and its caches of compiled code are global to the process, so two blocks with different rules
    at once would each lower with the other's. A block opened in another thread waits until this
    one ends (blocks nest freely in one thread); do not wait inside a block for a thread that
    opens one."""
    with _rules_lock:
        saved = _current()
        first = not _before
        try:
            install(backend, explain)
            yield
        finally:
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
        # An output that starts from its aliased input's buffer: XLA aliases the two on the
        # device as on the host, and the CUDA handler keeps the output's contents.
        return tj.lowering(ctx, *operands, text=t.text, backend=compiler_params.backend, mesh=t.mesh,
                           external_meshes=t.external_meshes,
                           kept=[(i, o, t.outputs[o]) for i, o in t.kept], copied=t.copied)

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
