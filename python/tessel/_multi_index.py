"""Refs read and written at several index arrays of one shape, element by element as numpy
indexes them (`x_ref[rows, cols]`: element `k` is `x[rows[k], cols[k]]`): a gather along the
first array's dimension, the others picked down to their entries (reads), or every update to a
row of the first dimension merged into that row before the rows are scattered (writes)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ._common import _dims, _ty
from ._jax_support import _jax

#: The `max`'s identity by element type: what a pick's unchosen elements are.
_LOW = {"f32": "-inf", "f16": "-inf", "bf16": "-inf", "i32": "-2147483648", "u32": "0",
        "i16": "-32768", "u16": "0", "i8": "-128", "u8": "0"}

#: The most elements a scatter by several arrays compares (its entries squared by the rest of a
#: row): past it the scatter is refused rather than made slow.
_SCATTER_ELEMENTS = 1 << 22


class _MultiIndex:
    """The `_Writer`'s methods for refs indexed by several arrays."""

    def gather_indices(self, tree, atoms) -> Optional[list]:
        """The index arrays of a `get` or `swap` indexed by several arrays of one shape, element
        by element as numpy indexes (`x_ref[rows, cols]`: element `k` is `x[rows[k], cols[k]]`),
        in the ref's order; None for any other access (one array, runs broadcast into a block)."""
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
        if len(arrays) < 2 or len({tuple(a.aval.shape) for a in arrays}) != 1:
            return None
        shape = tuple(arrays[0].aval.shape)
        # Runs broadcast into a block (each varying along its own dimension) are `ds`es.
        runs = [self.varying(a) for a in arrays]
        if len(shape) > 1 and all(r is not None for r in runs) and sorted(r[0] for r in runs) == list(range(len(arrays))):
            return None
        return arrays

    def loaded_rows(self, eqn, ref, tree, atoms, arrays):
        """The rows the first array names (`load x[%rows, ...]`, the other arrays' dimensions
        whole, `vector_index`): (the index text, tessel's order and the flattening map of
        `vector_index`, the rows' shape, where the entries and each other array's dimension
        stand in it, the entries' count)."""
        from jax._src.state import indexing

        jax, _, _ = _jax()
        (nd,) = jax.tree_util.tree_unflatten(tree, atoms)
        self.whole = {id(a) for a in arrays[1:]}
        try:
            index, order, flat = self.vector_index(eqn, ref, tree, atoms, arrays[0])
        finally:
            self.whole = set()
        # tessel's shape of the load: slices, the first array's entries at its place, the other
        # arrays' dimensions whole (scalar indices drop theirs).
        n = int(np.prod(arrays[0].aval.shape))
        shape, at = [], {}
        for dim, ix in zip(ref.aval.shape, nd.indices):
            if isinstance(ix, indexing.Slice):
                shape.append(int(ix.size))
            elif ix is arrays[0]:
                at["n"] = len(shape)
                shape.append(n)
            elif any(ix is a for a in arrays):
                at[id(ix)] = len(shape)
                shape.append(int(dim))
        return index, order, flat, shape, at, n

    def entries(self, a, eqn, n: int) -> str:
        """Index array `a` as an `i32[n]` vector."""
        idx = self.value(a, eqn)
        if str(a.aval.dtype) != "int32":
            idx = self.body.let(f"cast {idx}", f"i32[{_dims(a.aval.shape)}]")
        if len(a.aval.shape) != 1:
            idx = self.body.let(f"reshape {idx}", f"i32[{n}]")
        return idx

    def picked(self, v: str, shape, at, arrays, eqn, work: str, n: int):
        """`v` (the rows, `work[shape]`) with each later array's dimension picked down to its
        entries: a `select` of the named position and a `max` over the dimension (the bits are
        the element's); an entry outside its dimension reads 0, as a read past an array does.
        Returns the value and its shape."""
        shape, at = list(shape), dict(at)
        for a in sorted(arrays[1:], key=lambda a: -at[id(a)]):
            axis, p = at[id(a)], at["n"]
            along = [n if d == p else 1 for d in range(len(shape))]
            idx = self.body.let(f"reshape {self.entries(a, eqn, n)}", f"i32[{_dims(along)}]")
            pos = self.body.let(f"iota {axis}", f"i32[{_dims(shape)}]")
            hit = self.body.let(f"eq {pos}, {idx}", f"bool[{_dims(shape)}]")
            sel = self.body.let(f"select {hit}, {v}, {_LOW[work]}", f"{work}[{_dims(shape)}]")
            hits = self.body.let(f"cast {hit}", f"i32[{_dims(shape)}]")
            shape = shape[:axis] + shape[axis + 1:]
            v = self.body.let(f"max {sel} axis {axis}", f"{work}[{_dims(shape)}]")
            some = self.body.let(f"max {hits} axis {axis}", f"i32[{_dims(shape)}]")
            inside = self.body.let(f"ne {some}, 0", f"bool[{_dims(shape)}]")
            v = self.body.let(f"select {inside}, {v}, 0", f"{work}[{_dims(shape)}]")
            if axis < p:
                at["n"] = p - 1
        return v, shape

    def multi_gather(self, eqn, ref, tree, atoms, arrays) -> None:
        """`x = ref[..., rows, ..., cols, ...]`: the rows the first array names (`loaded_rows`),
        the other arrays' dimensions picked down to their entries (`picked`), moved into JAX's
        order and shape."""
        index, order, flat, shape, at, n = self.loaded_rows(eqn, ref, tree, atoms, arrays)
        out = eqn.outvars[0].aval
        jflat = out.update(shape=flat(out.shape))
        dt = _ty(out, self.kernel, eqn).split("[")[0]
        work = "i32" if dt == "bool" else dt
        v = self.body.let(f"load {self.ref(ref, eqn)}{index}", f"{dt}[{_dims(shape)}]")
        if dt == "bool":
            v = self.body.let(f"cast {v}", f"i32[{_dims(shape)}]")
        v, shape = self.picked(v, shape, at, arrays, eqn, work, n)
        if dt == "bool":
            v = self.body.let(f"ne {v}, 0", f"bool[{_dims(shape)}]")
        self.define(eqn.outvars[0], self.unflatten(self.reorder(v, jflat, order, eqn, to_jax=True), jflat, out, eqn))

    def multi_scatter(self, eqn, ref, val, tree, atoms, arrays) -> None:
        """`ref[..., rows, ..., cols, ...] = v`: the rows the first array names loaded; into row
        `k` every update whose entries name it (whose row entry equals row `k`'s, and each
        other entry the position), chosen by a `select` and a `max` over the updates (two
        updates of one element leave the larger); the rows scattered back, rows named twice
        alike. The old value, where the kernel reads it, is picked from the rows first."""
        index, order, flat, shape, at, n = self.loaded_rows(eqn, ref, tree, atoms, arrays)
        old = eqn.outvars[0]
        jflat = old.aval.update(shape=flat(old.aval.shape))
        dt = _ty(old.aval, self.kernel, eqn).split("[")[0]
        work = "i32" if dt == "bool" else dt
        p = at["n"]
        rest = int(np.prod([d for e, d in enumerate(shape) if e != p]))
        if n * n * rest > _SCATTER_ELEMENTS:
            raise self.refuse(f"a store at {len(arrays)} index arrays of {n} entries (it compares {n * n * rest} elements, "
                              f"more than the {_SCATTER_ELEMENTS} tessel takes)", eqn,
                              "store fewer entries at a time, or index with one array")
        rows = self.body.let(f"load {self.ref(ref, eqn)}{index}", f"{dt}[{_dims(shape)}]")
        if dt == "bool":
            rows = self.body.let(f"cast {rows}", f"i32[{_dims(shape)}]")
        if old in self.uses:
            v, vshape = self.picked(rows, shape, at, arrays, eqn, work, n)
            if dt == "bool":
                v = self.body.let(f"ne {v}, 0", f"bool[{_dims(vshape)}]")
            self.define(old, self.unflatten(self.reorder(v, jflat, order, eqn, to_jax=True), jflat, old.aval, eqn))
        x = self.value(val, eqn)
        whole = tuple(val.aval.shape) == tuple(old.aval.shape)
        if not whole and tuple(val.aval.shape) != ():
            raise self.refuse("a store at several index arrays of a value broadcast to the entries", eqn,
                              "broadcast the value to the indexed shape first (jnp.broadcast_to)")
        if whole:
            x = self.reorder(self.unflatten(x, val.aval, jflat, eqn), jflat, order, eqn, to_jax=False)
        if dt == "bool":
            xshape = [jflat.shape[d] for d in order] if whole else []
            x = self.body.let(f"cast {x}", f"i32[{_dims(xshape)}]" if xshape else "i32")
        # The comparison's shape: the rows' with the updates' axis after the entries' (`k'`).
        big = shape[: p + 1] + [n] + shape[p + 1:]
        ones = [1] * len(big)
        first = self.entries(arrays[0], eqn, n)
        mine = self.body.let(f"reshape {first}", f"i32[{_dims(ones[:p] + [n, 1] + ones[p + 2:])}]")
        theirs = self.body.let(f"reshape {first}", f"i32[{_dims(ones[:p] + [1, n] + ones[p + 2:])}]")
        hit = self.body.let(f"eq {mine}, {theirs}", f"bool[{_dims(ones[:p] + [n, n] + ones[p + 2:])}]")
        hit_shape = ones[:p] + [n, n] + ones[p + 2:]
        for a in arrays[1:]:
            q = at[id(a)] + (1 if at[id(a)] > p else 0)
            named = self.body.let(f"reshape {self.entries(a, eqn, n)}", f"i32[{_dims(ones[:p] + [1, n] + ones[p + 2:])}]")
            pos_shape = [big[q] if e == q else 1 for e in range(len(big))]
            pos = self.body.let(f"iota {q}", f"i32[{_dims(pos_shape)}]")
            here = self.body.let(f"eq {pos}, {named}", f"bool[{_dims([max(u, w) for u, w in zip(pos_shape, ones[:p] + [1, n] + ones[p + 2:])])}]")
            hit_shape = [max(u, w) for u, w in zip(hit_shape, pos_shape)]
            hit = self.body.let(f"and {hit}, {here}", f"bool[{_dims(hit_shape)}]")
        if whole:
            # The updates along `k'`, the same for every row `k`: a 1 inserted before the
            # entries' axis and for each other array's dimension (the order stays).
            others = {at[id(a)] for a in arrays[1:]}
            vshape = []
            for e, d in enumerate(shape):
                vshape += [1, n] if e == p else ([1] if e in others else [d])
            x = self.body.let(f"reshape {x}", f"{work}[{_dims(vshape)}]")
        sel = self.body.let(f"select {hit}, {x}, {_LOW[work]}", f"{work}[{_dims(big)}]")
        merged = self.body.let(f"max {sel} axis {p + 1}", f"{work}[{_dims(shape)}]")
        hits = self.body.let(f"cast {hit}", f"i32[{_dims(hit_shape)}]")
        some_shape = hit_shape[: p + 1] + hit_shape[p + 2:]
        some = self.body.let(f"max {hits} axis {p + 1}", f"i32[{_dims(some_shape)}]")
        named = self.body.let(f"ne {some}, 0", f"bool[{_dims(some_shape)}]")
        new = self.body.let(f"select {named}, {merged}, {rows}", f"{work}[{_dims(shape)}]")
        if dt == "bool":
            new = self.body.let(f"ne {new}, 0", f"bool[{_dims(shape)}]")
        self.body.emit(f"store {self.ref(ref, eqn)}{index}, {new}")
