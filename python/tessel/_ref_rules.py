"""Rules for reading and writing refs: `get` and `swap` (`x_ref[...]`, `x_ref[...] = v`), each as
a load or store of an index, a gather or scatter by index arrays, or through a reshaped ref; and
`dma_wait`, whose copy was made where it started."""

from __future__ import annotations

from . import _mosaic_gpu
from ._common import _ty
from ._rules import rule


@rule("get")
def _get(w, eqn) -> None:
    if _mosaic_gpu.is_view(w, eqn.invars[0]):
        _mosaic_gpu.get(w, eqn)
        return
    p = eqn.params
    vec = w.gather_index(p["tree"], eqn.invars[1:])
    if arrays := w.gather_indices(p["tree"], eqn.invars[1:]):
        ref, *ix = eqn.invars
        w.multi_gather(eqn, ref, p["tree"], ix, arrays)
    elif vec is not None:
        ref, *ix = eqn.invars
        w.gather(eqn, ref, p["tree"], ix, vec)
    else:
        ref, *ix = eqn.invars
        transforms = w.transforms(eqn, p["tree"], ix)
        v = w.reshaped_get(eqn, ref, transforms)
        if v is None:
            v = w.body.let(f"load {w.ref(ref, eqn)}{w.indexers(eqn, ref, transforms)}", _ty(eqn.outvars[0].aval, w.kernel, eqn))
        w.define(eqn.outvars[0], v)


@rule("swap")
def _swap(w, eqn) -> None:
    if _mosaic_gpu.is_view(w, eqn.invars[0]):
        _mosaic_gpu.swap(w, eqn)
        return
    p = eqn.params
    if arrays := w.gather_indices(p["tree"], eqn.invars[2:]):
        ref, val, *ix = eqn.invars
        w.multi_scatter(eqn, ref, val, p["tree"], ix, arrays)
    elif w.gather_index(p["tree"], eqn.invars[2:]) is not None:
        ref, val, *ix = eqn.invars
        w.scatter(eqn, ref, val, p["tree"], ix, w.gather_index(p["tree"], ix))
    elif w.is_reshaped(transforms := w.transforms(eqn, p["tree"], eqn.invars[2:])):
        ref, val, old = eqn.invars[0], eqn.invars[1], eqn.outvars[0]
        before = w.reshaped_swap(eqn, ref, w.value(val, eqn), transforms, old in w.uses)
        if before:
            w.define(old, before)
    else:
        ref, val, *ix = eqn.invars
        index = w.index(eqn, ref, p["tree"], ix)
        old = eqn.outvars[0]
        if old in w.uses:
            # The value before the store, where the kernel reads it (`x = o_ref.swap(v)`).
            v = w.body.fresh()
            w.body.emit(f"{v} = load {w.ref(ref, eqn)}{index} : {_ty(old.aval, w.kernel, eqn)}")
            w.define(old, v)
        w.body.emit(f"store {w.ref(ref, eqn)}{index}, {w.value(val, eqn)}")


@rule("dma_wait")
def _dma_wait(w, eqn) -> None:
    """Nothing: the copy was made when it started."""
