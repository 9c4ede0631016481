"""The body of a Pallas kernel as `.tk` statements: `_Writer` walks the jaxpr, keeping what each
variable is (a `%value`, a literal, a ref) and writing each equation."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple


from ._common import _EFFECTS, MAX_NESTING, _where, _refuse, _ty, _literal, _Body, _TooDeep
from ._control import _Control
from ._errors import UnsupportedError
from ._jax_support import _INLINE, _jax
from ._multi_index import _MultiIndex
from ._order import _Order
from ._prng import _Prng
from ._refs import _Refs
from ._mosaic_gpu import MosaicState
from ._rules import EFFECTFUL, RULES
from ._values import _Values

# The rule modules register themselves when imported.
from . import _lax_rules, _ref_rules, _mosaic_gpu  # noqa: F401  (imported for the rules they register)


class _Writer(_Refs, _MultiIndex, _Values, _Order, _Prng, _Control):
    """One kernel body being written: the jaxpr's equations in order, each as `.tk` statements
    (`write` calls the rule registered for its primitive, `_rules.RULES`)."""

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
        #: What a body of the Mosaic GPU model has made (`_mosaic_gpu`).
        self.mgpu = MosaicState()
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
            effects = eqn.primitive.name in _EFFECTS or eqn.primitive.name in EFFECTFUL or eqn.primitive.name in _INLINE
            # An equation that makes nothing is there for what it does: written (or refused by
            # name), never dropped as unused.
            effects = effects or not eqn.outvars
            if effects or any(o in self.uses for o in eqn.outvars):
                self.eqn(eqn)

    def eqn(self, eqn) -> None:
        outer = self.place
        self.place = _where(eqn) or outer
        self.runs = {}
        try:
            self.write(eqn)
        except _TooDeep:
            raise self.refuse(
                f"a body nested {MAX_NESTING + 1} deep (`pl.when`, `lax.cond`, `fori_loop`, `while_loop` inside one another)", eqn,
                f"tessel's kernels nest at most {MAX_NESTING} bodies (docs/language.md, Limits): merge conditions with `&`, or loops into one",
            ) from None
        finally:
            self.place = outer

    def refuse(self, what: str, eqn, hint: Optional[str] = None) -> UnsupportedError:
        return _refuse(what, self.kernel, eqn, hint, self.place)

    def write(self, eqn) -> None:
        """Writes one equation by its primitive's rule (`_rules.RULES`)."""
        name = eqn.primitive.name
        r = RULES.get(name)
        if r is None:
            raise self.refuse(f"primitive `{name}`", eqn, "docs/pallas.md lists the primitives tessel translates")
        r(self, eqn)
