"""Reading and writing refs in a Pallas kernel's body: indexers (`pl.ds`, runs `start +
jnp.arange(n)`, squeezed dimensions), gathers and scatters by index vectors, masked loads and
stores."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ._common import _dims, _ty, _literal
from ._jax_support import _jax
from ._rules import rule


class _Refs:
    """The `_Writer`'s methods for loads and stores of refs."""

    def transforms(self, eqn, tree, index_atoms) -> list:
        """A ref access's transforms (indexers, reshapes) with their jaxpr atoms."""
        jax, _, _ = _jax()
        try:
            return list(jax.tree_util.tree_unflatten(tree, index_atoms) or ())
        except Exception:
            raise self.refuse("a reference indexer", eqn)

    def index(self, eqn, ref, tree, index_atoms) -> str:
        """`[ds(start, size), :, %i]` for a ref indexer, or "" for the whole block."""
        return self.indexers(eqn, ref, self.transforms(eqn, tree, index_atoms))

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
        if not all(isinstance(nd, indexing.NDIndexer) for nd in indexers):
            raise self.refuse("a transformed reference (bitcast, reshape)", eqn)
        if len(indexers) > 1 and not squeezed:
            return self.chained(eqn, ref_shape, indexers)
        if len(indexers) != 1:
            raise self.refuse("a chain of ref indexers on a block with squeezed dimensions", eqn)
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
                shape = tuple(getattr(getattr(ix, "aval", None), "shape", ()))
                if id(ix) in self.whole:
                    parts.append(":")  # an index array `multi_gather` picks from after the load
                    continue
                whole = False
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
            (d, ix) for d, ix in enumerate(nd.indices)
            if len(getattr(getattr(ix, "aval", None), "shape", ())) >= 1 and ix is not gathered and id(ix) not in self.whole
            and not (gathered is not None and self.broadcast_scalar(ix) is not None)
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

    def chained(self, eqn, shape, indexers) -> str:
        """The index text of a chain of indexers (`ref.at[h].at[page]`, `.at[i][pl.ds(j, 8)]`),
        each of scalars and slices on the view the ones before leave: every dimension of the ref
        fixed at an index or sliced, its start and step composed along the chain."""
        from jax._src.state import indexing

        # The view's dimensions: the ref's dimension, the view's start in it, step and length.
        view = [(d, "0", 1, n) for d, n in enumerate(shape)]
        fixed: Dict[int, str] = {}
        for nd in indexers:
            narrowed = []
            for (d, start, step, _), ix in zip(view, nd.indices):
                if isinstance(ix, indexing.Slice):
                    s = str(ix.start) if isinstance(ix.start, int) else self.read(ix.start)
                    narrowed.append((d, self.plus(start, self.times(s, step)), step * ix.stride, ix.size))
                elif tuple(getattr(getattr(ix, "aval", None), "shape", ())) == ():
                    i = str(ix) if isinstance(ix, int) else self.read(ix)
                    fixed[d] = self.plus(start, self.times(i, step))
                else:
                    raise self.refuse("an index array in a chain of ref indexers", eqn, "index the ref once with the array")
            view = narrowed
        slices = {d: (start, step, size) for d, start, step, size in view}
        parts = []
        for d, n in enumerate(shape):
            if d in fixed:
                parts.append(fixed[d])
                continue
            start, step, size = slices[d]
            if (start, step, size) == ("0", 1, n):
                parts.append(":")
            else:
                parts.append(f"ds({start}, {size})" if step == 1 else f"ds({start}, {size}, {step})")
        return "[" + ", ".join(parts) + "]"

    def times(self, a: str, k: int) -> str:
        """`a * k` of an `i32` scalar (a value or an integer literal) and a step."""
        if k == 1:
            return a
        if not a.startswith("%"):
            return str(int(a) * k)
        v = self.body.fresh()
        self.body.emit(f"{v} = mul {a}, {k}")
        return v

    def reshaped_get(self, eqn, ref, transforms) -> Optional[str]:
        """A load from a reshaped or bitcast ref (`buf.at[slot].reshape(n, d)[start::step, :]`,
        `.bitcast(jnp.uint32)`, as JAX's TPU ragged paged attention reads its K and V pages):
        the region before them loaded, the value reshaped (a ref is row-major, so its reshape is
        the value's) and bitcast as Pallas on TPU packs (`packed`), then the indexers after them
        applied to the value, static starts and strides as a `slice`, static indices dropping
        their dimension. None where the ref is neither reshaped nor bitcast."""
        from jax._src.state import indexing
        from jax._src.state.types import BitcastTransform, ReshapeTransform

        kinds = (ReshapeTransform, BitcastTransform)
        at = [k for k, t in enumerate(transforms) if isinstance(t, kinds)]
        if not at:
            return None
        before, middle, after = list(transforms[: at[0]]), transforms[at[0]: at[-1] + 1], list(transforms[at[-1] + 1:])
        if not all(isinstance(t, kinds) for t in middle) or not all(isinstance(t, indexing.NDIndexer) for t in before + after) or len(after) > 1:
            raise self.refuse("a reshaped or bitcast ref indexed between its reshapes", eqn)
        shape = list(before[-1].get_indexer_shape()) if before else list(ref.aval.shape)
        dt = _ty(ref.aval, self.kernel, eqn).split("[")[0]
        r = self.body.let(f"load {self.ref(ref, eqn)}{self.indexers(eqn, ref, before)}", f"{dt}[{_dims(shape)}]")
        for t in middle:
            if isinstance(t, ReshapeTransform):
                shape = list(t.shape)
                r = self.body.let(f"reshape {r}", f"{dt}[{_dims(shape)}]")
            else:
                to = _ty(SimpleNamespace(shape=(), dtype=t.dtype), self.kernel, eqn)
                r, shape = self.packed(r, dt, shape, to, eqn)
                dt = to
        if not after:
            return r
        window = self.view_window(eqn, shape, after[0], strided=True)
        starts, sizes = [s for s, _, _, _ in window], [k for _, k, _, _ in window]
        strides, kept = [t for _, _, t, _ in window], [k for _, k, _, keep in window if keep]
        if sizes == list(shape):
            return r
        if any(s.startswith("%") for s in starts):
            if any(t != 1 for t in strides):
                raise self.refuse("a strided window at a dynamic index of a reshaped ref", eqn,
                                  "index the ref before reshaping it, or load and reshape the value")
            c = self.take_window(r, shape, dt, starts, sizes)
        else:
            stride = f" stride ({_dims(strides)})" if any(k != 1 for k in strides) else ""
            c = self.body.let(f"slice {r} start ({_dims(starts)}){stride}", f"{dt}[{_dims(sizes)}]")
        if kept == sizes:
            return c
        return self.body.let(f"reshape {c}", f"{dt}[{_dims(kept)}]" if kept else dt)

    @staticmethod
    def is_reshaped(transforms) -> bool:
        """Whether a ref's transforms reshape or bitcast it."""
        from jax._src.state.types import BitcastTransform, ReshapeTransform

        return any(isinstance(t, (ReshapeTransform, BitcastTransform)) for t in transforms)

    def reshaped_swap(self, eqn, ref, v: str, transforms, want_old: bool) -> Optional[str]:
        """A store to a reshaped ref (`buf.at[slot].reshape(n, d)[k] = row`, as TPU kernels write
        a page viewed as rows): the value put in the window its indexers after the reshapes
        choose (static, contiguous) of the region before them, loaded and reshaped where the
        window does not cover it; the result reshaped back (a ref is row-major, so its reshape
        is the value's) and stored to the region. Returns the window's value before the store
        (what `swap` returns) where `want_old`, else "", or None where the ref is not reshaped."""
        from jax._src.state import indexing
        from jax._src.state.types import BitcastTransform, ReshapeTransform

        at = [k for k, t in enumerate(transforms) if isinstance(t, (ReshapeTransform, BitcastTransform))]
        if not at:
            return None
        before, middle, after = list(transforms[: at[0]]), transforms[at[0]: at[-1] + 1], list(transforms[at[-1] + 1:])
        if any(isinstance(t, BitcastTransform) for t in middle):
            raise self.refuse("a store to a bitcast ref", eqn, "bitcast the value (`pltpu.bitcast`) and store it to the ref as it is")
        if not all(isinstance(t, ReshapeTransform) for t in middle) or not all(isinstance(t, indexing.NDIndexer) for t in before + after) or len(after) > 1:
            raise self.refuse("a reshaped ref indexed between its reshapes", eqn)
        dt = _ty(ref.aval, self.kernel, eqn).split("[")[0]
        region = list(before[-1].get_indexer_shape()) if before else list(ref.aval.shape)
        shapes = [region] + [list(t.shape) for t in middle]
        view = shapes[-1]
        window = self.view_window(eqn, view, after[0] if after else None, strided=False)
        starts, sizes = [s for s, _, _, _ in window], [k for _, k, _, _ in window]
        if [k for _, k, _, kept in window if kept] != sizes:
            v = self.body.let(f"reshape {v}", f"{dt}[{_dims(sizes)}]")
        whole = sizes == view
        old = ""
        if not whole or want_old:
            cur = self.body.let(f"load {self.ref(ref, eqn)}{self.indexers(eqn, ref, before)}", f"{dt}[{_dims(region)}]")
            for shape in shapes[1:]:
                cur = self.body.let(f"reshape {cur}", f"{dt}[{_dims(shape)}]")
            if want_old:
                old = cur if whole else self.take_window(cur, view, dt, starts, sizes)
                kept = [k for _, k, _, keep in window if keep]
                if kept != sizes:
                    old = self.body.let(f"reshape {old}", f"{dt}[{_dims(kept)}]" if kept else dt)
            if not whole and any(s.startswith("%") for s in starts):
                v = self.put_window(cur, view, dt, v, sizes, starts)
            elif not whole:
                v = self.placed(cur, list(view), v, [(int(s), k) for s, k in zip(starts, sizes)], 0, dt)
        for shape in reversed(shapes[:-1]):
            v = self.body.let(f"reshape {v}", f"{dt}[{_dims(shape)}]")
        self.body.emit(f"store {self.ref(ref, eqn)}{self.indexers(eqn, ref, before)}, {v}")
        return old

    def view_window(self, eqn, view, nd, strided: bool) -> list:
        """The window an indexer `nd` (or None: all of it) chooses in a reshaped ref's `view`:
        per dimension (start, size, stride, kept), the start an `i32` literal or scalar (a
        dynamic one clamped into the view as JAX clamps a slice), `kept` false where an index
        drops the dimension. A stride other than 1 is refused unless `strided`."""
        from jax._src.state import indexing

        window = []
        for n, ix in zip(view, nd.indices if nd is not None else [None] * len(view)):
            if ix is None:
                window.append(("0", n, 1, True))
                continue
            size, stride, keep, at = (int(ix.size), int(ix.stride), True, ix.start) if isinstance(ix, indexing.Slice) else (1, 1, False, ix)
            if stride != 1 and not strided:
                raise self.refuse("a strided window of a reshaped ref, stored to", eqn, "store the whole window and mask it")
            if getattr(getattr(at, "aval", None), "shape", ()) != ():
                raise self.refuse("an index vector into a reshaped ref", eqn, "index the ref before reshaping it")
            static = _static_int(at)
            start = str(static) if static is not None else self.start(at, n, (size - 1) * stride + 1, eqn)
            window.append((start, size, stride, keep))
        return window

    def placed(self, cur: str, shape, v: str, window, d: int, dt: str) -> str:
        """`cur` (of `shape`) with `v` in the static `window` from dimension `d` on: along each
        dimension the part of `cur` before the window, the window (placed the same way along the
        next dimensions), and the part after, concatenated."""
        start, size = window[d]
        n = shape[d]
        at = lambda s: _dims([s if e == d else 0 for e in range(len(shape))])  # noqa: E731
        part = lambda s, k: self.body.let(  # noqa: E731
            f"slice {cur} start ({at(s)})", f"{dt}[{_dims([k if e == d else m for e, m in enumerate(shape)])}]")
        # Where the window covers every later dimension, `v` is the window's part whole.
        if all(s == 0 and k == shape[e] for e, (s, k) in enumerate(window) if e > d):
            middle = v
        else:
            inner_shape = [size if e == d else m for e, m in enumerate(shape)]
            middle = self.placed(cur if size == n else part(start, size), inner_shape, v, window, d + 1, dt)
        parts = ([part(0, start)] if start > 0 else []) + [middle]
        if start + size < n:
            parts.append(part(start + size, n - start - size))
        if len(parts) == 1:
            return parts[0]
        return self.body.let(f"concatenate {', '.join(parts)} axis {d}", f"{dt}[{_dims(shape)}]")

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

    def dma(self, eqn) -> None:
        """`pltpu.make_async_copy(src, dst, sem).start()`: the copy made there and then, a load
        of the source region and a store into the destination (one program's loads and stores
        happen in order, so its `.wait()` has nothing left to wait for, and a copy started for a
        later grid step is only made earlier). Copies to another device, and accumulating ones,
        are refused."""
        p = eqn.params
        try:
            src, dst, _dst_sem, src_sem, device_id = p["tree"].unflatten(list(eqn.invars))
        except Exception:
            raise self.refuse("a `dma_start` of this form", eqn)
        if src_sem is not None or device_id is not None:
            raise self.refuse("a copy to another device (`make_async_remote_copy`)", eqn, "copy within the device")
        if p.get("add"):
            raise self.refuse("an accumulating copy (`add=True`)", eqn, "copy, then add with jnp")
        (src_ref, src_ix), (dst_ref, dst_ix) = (self.transformed(r) for r in (src, dst))
        # A reshaped (or bitcast) source is loaded, and a reshaped destination stored, as `get`
        # and `swap` of such refs are.
        v = self.reshaped_get(eqn, src_ref, src_ix)
        if v is None:
            # The region's shape: the last indexer's (an index drops its dimension), else the ref's.
            shape = tuple(src_ix[-1].get_indexer_shape()) if src_ix else tuple(src_ref.aval.shape)
            ty = _ty(SimpleNamespace(shape=shape, dtype=src_ref.aval.dtype), self.kernel, eqn)
            v = self.body.let(f"load {self.ref(src_ref, eqn)}{self.indexers(eqn, src_ref, src_ix)}", ty)
        if self.reshaped_swap(eqn, dst_ref, v, dst_ix, False) is None:
            self.body.emit(f"store {self.ref(dst_ref, eqn)}{self.indexers(eqn, dst_ref, dst_ix)}, {v}")

    @staticmethod
    def transformed(r):
        """A DMA's source or destination: the ref atom and its transforms (`x_hbm.at[pl.ds(i, 8)]`)."""
        if not hasattr(r, "transforms"):
            return r, []
        return r.ref, list(r.transforms)


def _static_int(ix) -> Optional[int]:
    """An index known when translating (a Python or numpy integer, or a jaxpr literal of one)."""
    from jax._src import core

    if isinstance(ix, core.Literal):
        ix = ix.val
    if isinstance(ix, (int, np.integer)) or (isinstance(ix, np.ndarray) and ix.shape == () and ix.dtype.kind in "iu"):
        return int(ix)
    return None


# The rules this family gives the writer (`_rules.RULES`): its methods of (writer, equation).
rule("dma_start")(_Refs.dma)
rule("masked_load", "masked_swap")(_Refs.masked)
