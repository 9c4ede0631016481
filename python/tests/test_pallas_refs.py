"""`tessel.pallas` on how kernels reach memory: index maps (affine however written, computed,
reading scalar-prefetch data, off affine at one program), gathers and scatters by index arrays,
strided reads, Triton-style 2-D tiles, refs written under `cond`/`switch`, a data-dependent
`while`, and the edges of issue 38 (empty grids, float64 and byte order, huge outputs). Each
against Pallas's interpret mode."""

import numpy as np
import pytest

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import tessel  # noqa: E402
from tessel import pallas as tp  # noqa: E402
from pallas_common import RNG, add, backends, f32  # noqa: E402


def _blocks(index_map, grid, n, interpret=False, alias=False):
    """A copy kernel of `n`-element blocks of 8 read through `index_map` on `grid`."""

    def blocks(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0

        spec = pl.BlockSpec((8,), index_map)
        out = pl.BlockSpec((8,), lambda *ids: (ids[0],))
        kw = {"input_output_aliases": {0: 0}} if alias else {}
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((n,), x.dtype), grid=grid, in_specs=[spec],
                              out_specs=out, interpret=interpret, **kw)(x)

    return blocks


def test_an_index_map_off_affine_at_one_program_runs_as_pallas_runs_it():
    """`jnp.where(i == 537, 0, i)` agrees with `i` at every point but one: sampling it at ten
    points once took it for affine and ran it with another result than Pallas's. Its equations
    do not prove it affine, nor do the grid's points, so it is a computed block index."""
    odd = _blocks(lambda i: (jnp.where(i == 537, 0, i),), (1000,), 8000)
    x = f32(8000)
    want = np.asarray(_blocks(lambda i: (jnp.where(i == 537, 0, i),), (1000,), 8000, interpret=True)(x))
    for backend in backends():
        np.testing.assert_array_equal(tp.run(odd, x, backend=backend), want, err_msg=backend)
    text = tp.to_tk(odd, x)
    assert "in  x0: f32[8000] block [8] at (select(eq(i0, 537), 0, i0))\n" in text, text
    # A grid too large to check point by point: computed too.
    big = _blocks(lambda i: (jnp.where(i == 53711, 0, i),), (100000,), 800000)
    assert "at (select(eq(i0, 53711), 0, i0))" in tp.to_tk(big, jax.ShapeDtypeStruct((800000,), jnp.float32))


def branches_writing_refs(x, interpret=False):
    """`lax.cond` and `lax.switch` whose branches store (megablox's `gmm` stores its accumulator
    in one branch of a `lax.cond` on the last k tile)."""

    def body(x_ref, o_ref, p_ref):
        i = pl.program_id(0)
        v = x_ref[...]

        def even():
            o_ref[...] = v + 1.0

        def odd():
            o_ref[...] = v * 2.0

        jax.lax.cond(i % 2 == 0, even, odd)

        def store(c):
            def write():
                p_ref[...] = v * 0.0 + c

            return write

        p_ref[...] = v  # what the branch that does nothing leaves
        jax.lax.switch(i, [store(10.0), store(20.0), lambda: None, store(40.0)])

    spec = pl.BlockSpec((8,), lambda i: (i,))
    out = jax.ShapeDtypeStruct((32,), x.dtype)
    return pl.pallas_call(body, out_shape=(out, out), grid=(4,), in_specs=[spec], out_specs=(spec, spec), interpret=interpret)(x)


def test_program_ids_under_vmap_count_the_kernels_own_axes():
    """`vmap` of a `pallas_call` puts the batch on a new grid axis in front (Pallas's
    `vmapped_dims`); `pl.program_id(0)` in the body is still the kernel's own first axis. Read as
    the new axis, every program of the batch computed with the batch index (decode attention's
    head blocks came out wrong so)."""

    def kernel(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32) * 100.0 + jnp.float32(pl.num_programs(0))

        spec = pl.BlockSpec((8,), lambda i: (i,))
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((32,), x.dtype), grid=(4,), in_specs=[spec], out_specs=spec)(x)

    x = f32(3, 32)
    # By hand: element e of row b is x[b, e] + 100 * (e // 8) + 4.
    want = x + 100.0 * (np.arange(32) // 8) + 4.0
    text = tp.to_tk(jax.vmap(kernel), x)
    assert "program_id i1" in text and "program_id i0" not in text, text
    for backend in backends():
        np.testing.assert_allclose(np.asarray(tp.run(jax.vmap(kernel), x, backend=backend)), want, rtol=1e-6, err_msg=backend)


def gathers(t, x, interpret=False):
    """Index arrays that are not a contiguous run: rows by a table (`x_ref[t]`), and columns by it
    beside a scalar index apart from it (`x_ref[1, :, t]`, whose gathered dimension JAX puts
    first)."""

    def body(t_ref, x_ref, o_ref, p_ref):
        t = t_ref[...]
        o_ref[...] = x_ref[t] * 2.0
        p_ref[...] = x_ref[1, :, t]

    out = (jax.ShapeDtypeStruct((3, 4, 5), x.dtype), jax.ShapeDtypeStruct((3, 4), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(t, x)


def test_a_gather_of_many_entries_runs_as_pallas_runs_it():
    """An embedding lookup of 300 rows by a table (past the 64 entries the import once unrolled)."""

    def lookup(t, e, interpret=False):
        def body(t_ref, e_ref, o_ref):
            o_ref[...] = e_ref[t_ref[...], :] * 3.0

        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((t.shape[0], e.shape[1]), e.dtype), interpret=interpret)(t, e)

    t, e = RNG.integers(0, 50, 300).astype(np.int32), f32(50, 16)
    want = np.asarray(lookup(t, e, interpret=True))
    np.testing.assert_array_equal(want, e[t] * 3.0)
    for backend in backends():
        np.testing.assert_array_equal(np.asarray(tp.run(lookup, t, e, backend=backend)), want, err_msg=backend)


def scatters(t, x, interpret=False):
    """Stores at an index array: rows of `o` in the order of a permutation (`o_ref[t] = ...`), and
    columns of row 1 of `p` beside a scalar index apart from them (`p_ref[1, :, t] = ...`, whose
    value has the table's axis first, as JAX's indexing gives it)."""

    def body(t_ref, x_ref, o_ref, p_ref):
        t = t_ref[...]
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[t] = x_ref[...] * 2.0
        p_ref[...] = jnp.zeros_like(p_ref)
        p_ref[1, :, t] = x_ref[:, 0, :4]

    out = (jax.ShapeDtypeStruct((4, 4, 5), x.dtype), jax.ShapeDtypeStruct((2, 4, 6), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(t, x)


def test_scatters_by_an_index_array_run_as_pallas_runs_them():
    t_rows, x = np.array([3, 0, 1], dtype=np.int32), f32(3, 4, 5)
    want = [np.asarray(w) for w in scatters(t_rows, x, interpret=True)]
    # By hand: rows 3, 0, 1 of o are x's rows 0, 1, 2 (row 2 stays 0); p[1, :, t[j]] = x[j, 0, :4].
    o = np.zeros((4, 4, 5), np.float32)
    o[[3, 0, 1]] = x * 2.0
    q = np.zeros((2, 4, 6), np.float32)
    q[1][:, [3, 0, 1]] = x[:, 0, :4].T
    np.testing.assert_array_equal(want[0], o)
    np.testing.assert_array_equal(want[1], q)
    text = tp.to_tk(scatters, t_rows, x)
    assert "store o0[%v0, :, :]" in text and "store o1[1, :, %v0]" in text and "transpose" in text, text
    for backend in backends():
        for g, w in zip(tp.run(scatters, t_rows, x, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def test_gathers_and_scatters_by_a_2d_index_array_run_as_pallas_runs_them():
    """A table of several dimensions (a block table's [batch, pages]) indexes as numpy does: the
    result has the table's dimensions where the index stands; it is flattened into one index
    vector and the result reshaped."""

    def table(t, x, interpret=False):
        def body(t_ref, x_ref, o_ref, p_ref, q_ref):
            t = t_ref[...]
            o_ref[...] = x_ref[t] * 2.0
            p_ref[...] = x_ref[:, t]
            q_ref[...] = jnp.zeros_like(q_ref)
            q_ref[t] = x_ref[t] + 1.0

        out = (jax.ShapeDtypeStruct((2, 3, 8), x.dtype), jax.ShapeDtypeStruct((8, 2, 3), x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
        return pl.pallas_call(body, out_shape=out, interpret=interpret)(t, x)

    t, x = np.array([[5, 0, 2], [7, 1, 6]], dtype=np.int32), f32(8, 8)
    want = [np.asarray(w) for w in table(t, x, interpret=True)]
    q = np.zeros_like(x)
    q[t.ravel()] = x[t.ravel()] + 1.0
    for w, by_hand in zip(want, (x[t] * 2.0, x[:, t], q)):
        np.testing.assert_array_equal(w, by_hand)
    for backend in backends():
        for g, w in zip(tp.run(table, t, x, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def pointwise(r, c, r2, c2, x, interpret=False):
    """Refs indexed by several arrays, element by element as numpy indexes: `x_ref[r, c, :]`
    (row k is x[r[k], c[k], :]), the same with a slice between them (`x_ref[r, :, c]`, whose
    entries JAX puts first), a pair of 2-D tables, and a bool ref."""

    def body(r_ref, c_ref, r2_ref, c2_ref, x_ref, o_ref, p_ref, q_ref, m_ref):
        r, c = r_ref[...], c_ref[...]
        o_ref[...] = x_ref[r, c, :] * 2.0
        p_ref[...] = x_ref[r, :, c]
        q_ref[...] = x_ref[r2_ref[...], c2_ref[...], 3]
        m_ref[...] = x_ref[r, c, 1] > 0.0

    out = (jax.ShapeDtypeStruct((5, 6), x.dtype), jax.ShapeDtypeStruct((5, 4), x.dtype),
           jax.ShapeDtypeStruct((2, 3), x.dtype), jax.ShapeDtypeStruct((5,), jnp.bool_))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(r, c, r2, c2, x)


def test_gathers_by_several_index_arrays_pick_element_by_element_as_numpy():
    r, c = np.array([2, 0, 2, 1, 0], np.int32), np.array([3, 3, 0, 1, 2], np.int32)
    r2, c2 = np.array([[0, 2, 1], [2, 2, 0]], np.int32), np.array([[3, 0, 1], [1, 3, 2]], np.int32)
    x = f32(3, 4, 6)
    x[1, 1, 1] = -0.0  # a signed zero keeps its sign through the pick
    x[0, 3, 4] = np.nan
    hand = [x[r, c, :] * 2.0, x[r, :, c], x[r2, c2, 3], x[r, c, 1] > 0.0]
    want = [np.asarray(w) for w in pointwise(r, c, r2, c2, x, interpret=True)]
    for w, h in zip(want, hand):
        np.testing.assert_array_equal(w, h)
    text = tp.to_tk(pointwise, r, c, r2, c2, x)
    assert "load x4[%v0, :, :]" in text, text
    for backend in backends():
        for n, (g, h) in enumerate(zip(tp.run(pointwise, r, c, r2, c2, x, backend=backend), hand)):
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(h).view(np.uint8), err_msg=f"output {n} on {backend}")
    # An entry past its dimension reads 0 (tessel's rule for reads past an array), not -inf.
    far = c.copy()
    far[1] = 9
    got = np.asarray(tp.run(pointwise, r, far, r2, c2, x, backend="interpret")[0])
    np.testing.assert_array_equal(got[1], np.zeros(6, np.float32))
    np.testing.assert_array_equal(np.delete(got, 1, 0), np.delete(hand[0], 1, 0))


def pointwise_stores(r, c, x, v, interpret=False):
    """Stores at several index arrays, element by element: `o_ref[r, c] = v` with a row named
    twice at different columns (both updates land), rows of a 3-D ref beside a slice, arrays
    apart around a scalar index, and a bool ref."""

    def body(r_ref, c_ref, x_ref, v_ref, o_ref, p_ref, m_ref):
        r, c = r_ref[...], c_ref[...]
        o_ref[...] = x_ref[...]
        o_ref[r, c] = v_ref[...] * 2.0
        p_ref[...] = jnp.zeros_like(p_ref)
        p_ref[r, :, c] = jnp.broadcast_to(v_ref[...][:, None], (r.shape[0], 3))
        p_ref[c, 1, r] = jnp.full(r.shape, 7.0, x_ref.dtype)
        m_ref[...] = jnp.zeros_like(m_ref)
        m_ref[r, c] = v_ref[...] > 0.0

    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((4, 3, 4), x.dtype), jax.ShapeDtypeStruct(x.shape, jnp.bool_))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(r, c, x, v)


def test_stores_at_several_index_arrays_land_element_by_element_as_numpy():
    r, c = np.array([2, 0, 2, 1], np.int32), np.array([3, 1, 0, 3], np.int32)
    x, v = f32(4, 4), f32(4)
    o = x.copy()
    o[r, c] = v * 2.0
    q = np.zeros((4, 3, 4), np.float32)
    q[r, :, c] = v[:, None]
    q[c, 1, r] = 7.0
    m = np.zeros((4, 4), bool)
    m[r, c] = v > 0.0
    hand = [o, q, m]
    want = [np.asarray(w) for w in pointwise_stores(r, c, x, v, interpret=True)]
    for w, h in zip(want, hand):
        np.testing.assert_array_equal(w, h)
    for backend in backends():
        for n, (g, h) in enumerate(zip(tp.run(pointwise_stores, r, c, x, v, backend=backend), hand)):
            np.testing.assert_array_equal(np.asarray(g), h, err_msg=f"output {n} on {backend}")
    # Each entry is compared with every other: past 2^22 elements the store is refused, by name.
    big_r = np.arange(2048, dtype=np.int32)
    with pytest.raises(tessel.UnsupportedError, match="a store at 2 index arrays of 2048 entries"):
        tp.to_tk(pointwise_stores, big_r, big_r, f32(2048, 2048), f32(2048))


def test_gathers_by_an_index_array_run_as_pallas_runs_them():
    t, x = np.array([2, 0, 2], dtype=np.int32), f32(3, 4, 5)
    text = tp.to_tk(gathers, t, x)
    # One load with the table as an index vector each; the second's gathered dimension moved first.
    assert "load x1[%v0, :, :]" in text and "load x1[1, :, %v0]" in text and "transpose" in text, text
    want = [np.asarray(w) for w in gathers(t, x, interpret=True)]
    # By hand too: rows 2, 0, 2; then x[1, :, t] with the table's axis first.
    np.testing.assert_array_equal(want[0], x[[2, 0, 2]] * 2.0)
    np.testing.assert_array_equal(want[1], x[1][:, [2, 0, 2]].T)
    for backend in backends():
        for g, w in zip(tp.run(gathers, t, x, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def strided_reads(x, interpret=False):
    """Strided slices (`pl.ds(start, n, stride=s)`): every other row from row 1, every third
    column; a stride that ends at the row's last element; and the even places of a row written
    with the odd ones (RoPE's interleaving)."""

    def body(x_ref, o_ref, p_ref, q_ref):
        o_ref[...] = x_ref[pl.ds(1, 3, stride=2), pl.ds(0, 4, stride=3)]
        p_ref[...] = x_ref[pl.ds(7, 1), pl.ds(2, 4, stride=3)]
        q_ref[...] = jnp.zeros((1, 12), x.dtype)
        q_ref[:, pl.ds(0, 6, stride=2)] = x_ref[pl.ds(0, 1), pl.ds(1, 6, stride=2)]

    out = (jax.ShapeDtypeStruct((3, 4), x.dtype), jax.ShapeDtypeStruct((1, 4), x.dtype), jax.ShapeDtypeStruct((1, 12), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


def test_strided_reads_run_as_pallas_runs_them():
    x = f32(8, 12)
    want = [np.asarray(w) for w in strided_reads(x, interpret=True)]
    np.testing.assert_array_equal(want[0], x[1:7:2, 0:12:3])  # by hand, numpy's slicing
    np.testing.assert_array_equal(want[1], x[7:8, 2:12:3])
    np.testing.assert_array_equal(want[2][0, 0::2], x[0, 1::2])
    np.testing.assert_array_equal(want[2][0, 1::2], 0)
    text = tp.to_tk(strided_reads, x)
    assert "load x0[ds(1, 3, 2), ds(0, 4, 3)]" in text and "store o2[:, ds(0, 6, 2)]" in text, text
    for backend in backends():
        for g, w in zip(tp.run(strided_reads, x, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def doubling(x, lim, interpret=False):
    """`lax.while_loop` whose trip count depends on the data: each program doubles its block
    until the block's largest element reaches `lim`, counting the trips."""

    def body(x_ref, lim_ref, o_ref, n_ref):
        limit = lim_ref[0]

        def more(c):
            v, n = c
            return jnp.max(v) < limit

        def step(c):
            v, n = c
            return v * 2.0, n + 1

        v, n = jax.lax.while_loop(more, step, (x_ref[...], jnp.int32(0)))
        o_ref[...] = v
        n_ref[...] = jnp.full((1,), n, jnp.int32)

    spec = pl.BlockSpec((8,), lambda i: (i,))
    whole = pl.BlockSpec((1,), lambda i: (0,))
    out = (jax.ShapeDtypeStruct((32,), x.dtype), jax.ShapeDtypeStruct((4,), jnp.int32))
    return pl.pallas_call(body, out_shape=out, grid=(4,), in_specs=[spec, whole],
                          out_specs=(spec, pl.BlockSpec((1,), lambda i: (i,))), interpret=interpret)(x, lim)


def test_a_while_loop_with_a_data_dependent_condition_runs_as_pallas_runs_it():
    # Blocks whose largest elements are 1.5, 3, 0.25 and 100: to reach 40 they double 5, 4, 8 and 0 times.
    x = np.zeros(32, np.float32)
    x[[7, 15, 23, 31]] = [1.0, 3.0, 0.25, 100.0]
    x[:8] += np.linspace(0, 0.5, 8, dtype=np.float32)
    lim = np.array([40.0], np.float32)
    text = tp.to_tk(doubling, x, lim)
    assert "while %" in text, text
    want = [np.asarray(w) for w in doubling(x, lim, interpret=True)]
    np.testing.assert_array_equal(want[1], [5, 4, 8, 0])
    for backend in backends():
        for g, w in zip(tp.run(doubling, x, lim, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def triton_tiles(x, transposed=False, interpret=False):
    """A Triton-style 2-D tile: runs of rows and columns broadcast into a block
    (`x_ref.at[rows[:, None], cols[None]]`), masked at the ragged edges; `transposed` indexes with
    the runs the other way round (`rows[None], cols[:, None]`), a gather tessel refuses."""
    from jax.experimental.pallas import triton as plgpu

    m, n = x.shape

    def body(x_ref, o_ref):
        rows = pl.program_id(0) * 8 + jnp.arange(8)
        cols = pl.program_id(1) * 16 + jnp.arange(16)
        mask = (rows[:, None] < m) & (cols[None] < n)
        at = (rows[None], cols[:, None]) if transposed else (rows[:, None], cols[None])
        v = plgpu.load(x_ref.at[at], mask=mask.T if transposed else mask, other=0.0)
        plgpu.store(o_ref.at[at], v * 3.0, mask=mask.T if transposed else mask)

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(m, 8), pl.cdiv(n, 16)), interpret=interpret)(x)


def test_2d_tiles_of_broadcast_runs_run_as_pallas_runs_them_and_other_arrangements_are_refused():
    x = f32(20, 40)
    text = tp.to_tk(triton_tiles, x)
    assert "ds(" in text and "concatenate" not in text, text
    want = np.asarray(triton_tiles(x, interpret=True))
    np.testing.assert_array_equal(want, x * 3.0)  # by hand
    for backend in backends():
        np.testing.assert_array_equal(np.asarray(tp.run(triton_tiles, x, backend=backend)), want, err_msg=backend)
    with pytest.raises(tessel.UnsupportedError, match="an array index .gather.") as e:
        tp.to_tk(lambda x: triton_tiles(x, transposed=True), x)
    assert "broadcast as rows and columns" in (str(e.value) + (e.value.hint or ""))


def test_cond_and_switch_branches_that_write_refs_run_as_pallas_runs_them():
    x = f32(32)
    text = tp.to_tk(branches_writing_refs, x)
    assert text.count("when ") == 5, text
    want = [np.asarray(w) for w in branches_writing_refs(x, interpret=True)]
    for backend in backends():
        got = tp.run(branches_writing_refs, x, backend=backend)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def test_an_index_map_without_a_computed_index_is_computed_in_the_body():
    """A bitwise `and` of the program id has no `.tk` block-index expression: the body computes
    the block's offset and reads the whole ref there, with Pallas's result."""
    fn = _blocks(lambda i: (jnp.bitwise_and(i, 2),), (8,), 64)
    x = f32(64)
    text = tp.to_tk(fn, x)
    assert "in  x0: f32[64]\n" in text and "load x0[ds(" in text and "and %" in text, text
    want = np.asarray(_blocks(lambda i: (jnp.bitwise_and(i, 2),), (8,), 64, interpret=True)(x))
    for backend in backends():
        np.testing.assert_array_equal(tp.run(fn, x, backend=backend), want, err_msg=backend)


def computed_maps(x, interpret=False):
    """Index maps that are not affine: causal attention's clamp (`jnp.minimum`), floor division
    and remainder, a `select`, and output blocks permuted by `3 i % 4`."""

    def body(a_ref, b_ref, o_ref, p_ref):
        o_ref[...] = a_ref[...] + b_ref[...] * 2.0
        p_ref[...] = a_ref[...] - 1.0

    grid = (4, 3)
    a = pl.BlockSpec((8, 16), lambda i, j: (jnp.minimum(j, i), i % 2))
    b = pl.BlockSpec((8, 16), lambda i, j: (jax.lax.select(j > i, i, j) , (i * 3 + j) // 5))
    o = pl.BlockSpec((8, 16), lambda i, j: (i, j))
    p = pl.BlockSpec((8, 16), lambda i, j: (i * 3 % 4, j))  # a permutation of the row blocks
    shape = jax.ShapeDtypeStruct((32, 48), x.dtype)
    return pl.pallas_call(body, out_shape=(shape, shape), grid=grid, in_specs=[a, b], out_specs=(o, p), interpret=interpret)(x, x)


def prefetched_map(s, x, interpret=False):
    """A block table read by the index map (paged attention's kind): the block of `x` a program
    reads is `s[i]`, data the kernel is given."""
    from jax.experimental.pallas import tpu as pltpu

    def body(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * 10.0 + s_ref[pl.program_id(0)].astype(jnp.float32)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,), in_specs=[pl.BlockSpec((8,), lambda i, s: (s[i],))], out_specs=pl.BlockSpec((8,), lambda i, s: (i,))
    )
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((32,), x.dtype), grid_spec=grid_spec, interpret=interpret)(s, x)


@pytest.mark.parametrize("fn,make", [
    (computed_maps, lambda: (f32(32, 48),)),
    (prefetched_map, lambda: (np.array([3, 0, 3, 1], dtype=np.int32), f32(32))),
    # Entries past the table's blocks: Pallas's interpret mode clamps them, and so does tessel.
    (prefetched_map, lambda: (np.array([7, -2, 3, 100], dtype=np.int32), f32(32))),
], ids=["computed", "prefetched", "prefetched_out_of_range"])
def test_computed_and_data_dependent_index_maps_run_as_pallas_runs_them(fn, make):
    """Written as computed block indices (docs/language.md §2), blocks in the header."""
    args = make()
    text = tp.to_tk(fn, *args)
    assert "load x" in text and "[ds(" not in text, text
    if fn is prefetched_map:
        assert "in  x1: f32[32] block [8] at (x0[i0])" in text, text
    else:
        assert "at (min(i1, i0), i0 % 2)" in text, text
    want = jax.tree_util.tree_map(np.asarray, fn(*args, interpret=True))
    for backend in backends():
        got = tp.run(fn, *args, backend=backend)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            # `x * 10 + s`: XLA's CPU code may fuse it into one rounding; near 0 that leaves an
            # ulp of `x * 10` (up to about 4e-6 here), not of the result.
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("name,index_map", [
    ("reversed", lambda i: (7 - i,)),
    ("scaled", lambda i: ((2 * i + 3) // 1 - 3 - i,)),  # i, through mul, add, floor division by 1
    ("cast", lambda i: (jnp.int32(jnp.uint32(i)) * 1,)),
    ("clamped", lambda i: (jnp.minimum(i, 7),)),  # not affine in general; affine on this grid
    ("constant_where", lambda i: (jnp.where(True, i, 0),)),
])
def test_affine_index_maps_however_written_run_as_pallas_runs_them(name, index_map):
    fn = _blocks(index_map, (8,), 64)
    x = f32(64)
    want = np.asarray(_blocks(index_map, (8,), 64, interpret=True)(x))
    for backend in backends():
        np.testing.assert_array_equal(tp.run(fn, x, backend=backend), want, err_msg=f"{name} on {backend}")


def test_an_empty_grid_runs_no_program_as_pallas_does():
    """`grid=(0,)`: Pallas runs no program (its outputs are left unwritten; aliased ones keep the
    input). tessel's outputs are zeros, or the aliased input; `to_tk`, which must write a grid,
    refuses it naming the kernel. It used to fail inside the translation with a bare ValueError."""
    x = f32(64)
    empty = _blocks(lambda i: (i,), (0,), 64)
    pallas = np.asarray(_blocks(lambda i: (i,), (0,), 64, interpret=True)(x))
    for backend in backends():
        got = tp.run(empty, x, backend=backend)
        assert got.shape == pallas.shape and got.dtype == pallas.dtype
        np.testing.assert_array_equal(got, np.zeros(64, np.float32))
        aliased = tp.run(_blocks(lambda i: (i,), (0,), 64, alias=True), x, backend=backend)
        np.testing.assert_array_equal(aliased, np.asarray(_blocks(lambda i: (i,), (0,), 64, interpret=True, alias=True)(x)))
        np.testing.assert_array_equal(aliased, x)
    with pytest.raises(tessel.UnsupportedError, match=r"the grid \(0,\), which has no program, in Pallas kernel `blocks`"):
        tp.to_tk(empty, x)


def test_float64_inputs_become_float32_as_jax_makes_them():
    """With JAX's x64 mode off (its default) `jax.jit` takes float64 arrays as float32: so does
    `tp.run`, whose results are then those of the float32 kernel."""
    assert not jax.config.jax_enable_x64
    a, b = f32(1024).astype(np.float64), f32(1024).astype(np.float64)
    want = np.asarray(jax.jit(lambda x, y: add(x, y, interpret=True))(a, b))
    assert want.dtype == np.float32
    for backend in backends():
        got = tp.run(add, a, b, backend=backend)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, a.astype(np.float32) + b.astype(np.float32))


def test_arrays_of_the_other_byte_order_are_taken_in_native_order():
    """`jax.jit` refuses a `>f4` numpy array; `tp.run` converts it first (never reads its bytes as
    native)."""
    a, b = f32(1024), f32(1024)
    for backend in backends():
        got = tp.run(add, a.astype(">f4"), b.astype(">f4"), backend=backend)
        np.testing.assert_array_equal(got, a + b)


def test_outputs_larger_than_memory_are_refused_before_xla_makes_them():
    """Three 4 TB outputs: refused when `tp.run` lowers the call, before XLA allocates them."""

    def huge():
        def body(o0, o1, o2):
            for o in (o0, o1, o2):
                o[...] = jnp.zeros((1024,), jnp.float32)

        spec = pl.BlockSpec((1024,), lambda i: (i,))
        out = [jax.ShapeDtypeStruct((1 << 40,), jnp.float32)] * 3
        return pl.pallas_call(body, out_shape=out, grid=(1 << 30,), in_specs=[], out_specs=[spec] * 3)()

    with pytest.raises(tessel.TesselError, match=r"making the outputs of `huge` needs 12288.0 GB of memory \(outputs 12288.0 GB\)"):
        tp.run(huge, backend="interpret")


def padded_state(x, interpret=False):
    """Running state in an output of width 1 whose block is 128 wide (JAX's TPU paged attention
    keeps its running max and sum so): the first step stores a whole block, the second reads it
    back, past the array included, and sums each row."""

    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

        @pl.when(pl.program_id(0) == 1)
        def _():
            o_ref[...] = jnp.broadcast_to(o_ref[...].sum(axis=1, keepdims=True), o_ref.shape)

    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 1), x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
                          interpret=interpret)(x)


def test_an_output_block_past_the_array_reads_back_what_was_stored():
    """What a kernel stores past the array in an output's block it reads back, as Pallas on TPU
    (and its interpret mode) keeps the whole block: a scratch block stands in for it. Reading
    zeros there instead would give `x[:, :1]`; the row sums need every column."""
    x = f32(8, 128)
    text = tp.to_tk(padded_state, x)
    assert "scratch vo0: f32[8, 128]" in text and "load vo0" in text and "load o0" not in text, text
    # Sums of 128 terms of order 1, in different orders: a few ulps of the terms apart.
    want = np.asarray(padded_state(x, interpret=True))
    np.testing.assert_allclose(want, x.astype(np.float64).sum(axis=1, keepdims=True), rtol=0, atol=3e-5)
    for backend in backends():
        got = np.asarray(tp.run(padded_state, x, backend=backend))
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-5, err_msg=backend)


def packed(x, interpret=False):
    """A reshaped ref read at strided rows, Pallas TPU's `bitcast` of a value both ways (two
    bf16 rows packed into one u32 row), and a reshaped ref bitcast and then indexed: what JAX's
    TPU ragged paged attention does to read K and V pages interleaved in one buffer."""
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref, p_ref, b_ref, c_ref):
        o_ref[...] = x_ref.at[1].reshape(4, 256)[1::2, :]
        u = pltpu.bitcast(x_ref[2], jnp.uint32)
        p_ref[...] = u
        b_ref[...] = pltpu.bitcast(u, jnp.bfloat16)
        c_ref[...] = x_ref.at[3].reshape(4, 256).bitcast(jnp.uint32)[0::2, :]

    out = (jax.ShapeDtypeStruct((2, 256), x.dtype), jax.ShapeDtypeStruct((4, 128), jnp.uint32),
           jax.ShapeDtypeStruct((8, 128), x.dtype), jax.ShapeDtypeStruct((1, 256), jnp.uint32))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


def test_reshaped_and_bitcast_refs_read_as_pallas_on_tpu_packs_them():
    """Bit for bit as Pallas's interpret mode: a reshape of a ref is the row-major reshape of
    what it holds; a bitcast to a wider type packs consecutive rows of the second-minor
    dimension, the first in the low bits, and back. Checked by hand too: the packed row's low
    half is the bf16 row above."""
    import ml_dtypes

    x = RNG.standard_normal((4, 8, 128)).astype(ml_dtypes.bfloat16)
    want = [np.asarray(w) for w in packed(x, interpret=True)]
    bits = x.view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(want[1], bits[2, 0::2] | (bits[2, 1::2] << 16))
    np.testing.assert_array_equal(want[0].view(np.uint16), x[1].reshape(4, 256)[1::2].view(np.uint16))
    for backend in backends():
        got = [np.asarray(g) for g in tp.run(packed, x, backend=backend)]
        for n, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=f"output {n} on {backend}")


def reshaped_stores(x, interpret=False):
    """Stores to reshaped refs: a row of a page viewed as rows (`o_ref.at[1].reshape(4, 8)[2] =`),
    a window of rows and columns, a whole reshaped view, a `swap` whose old value is read, and a
    DMA from a buffer into a reshaped page (as a TPU kernel writes a KV page)."""
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref, w_ref, s_ref, d_ref, buf, sem):
        o_ref[...] = x_ref[...]
        o_ref.at[1].reshape(4, 8)[2] = x_ref.at[0].reshape(4, 8)[3] * 2.0
        o_ref.at[0].reshape(2, 16)[pl.ds(1, 1), pl.ds(4, 8)] = jnp.full((1, 8), -1.0, x_ref.dtype)
        w_ref[...] = jnp.zeros_like(w_ref)
        w_ref.reshape(8, 8)[...] = x_ref.reshape(8, 8)[...] + 1.0
        s_ref[...] = jnp.zeros_like(s_ref)
        old = s_ref.reshape(4, 16).swap(x_ref.reshape(4, 16)[...])
        s_ref.reshape(4, 16)[0] = old[1] + 5.0
        d_ref[...] = jnp.zeros_like(d_ref)
        buf[...] = x_ref.at[1].reshape(4, 8)[pl.ds(0, 2), :] * 3.0
        copy = pltpu.make_async_copy(buf, d_ref.at[0].reshape(4, 8).at[pl.ds(2, 2)], sem)
        copy.start()
        copy.wait()

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(
        body, out_shape=(shape, shape, shape, shape),
        scratch_shapes=[pltpu.VMEM((2, 8), x.dtype), pltpu.SemaphoreType.DMA(())], interpret=interpret,
    )(x)


def test_stores_to_reshaped_refs_write_the_row_major_view_of_the_region():
    """A reshaped ref is the row-major view of what it holds, stored to as read: each output
    worked out with numpy on the same views. (Pallas's interpret modes cannot run this kernel
    in jax 0.10.2: the generic one raises `Unsupported transform: ReshapeTransform` and mis-slices
    `o_ref.at[1].reshape(4, 8)[2]`, the TPU one fails in `to_range`; Mosaic compiles it for TPU.)"""
    x = RNG.standard_normal((2, 32)).astype(np.float32)
    o = x.copy()
    o[1].reshape(4, 8)[2] = x[0].reshape(4, 8)[3] * 2.0
    o[0].reshape(2, 16)[1, 4:12] = -1.0
    w = x.reshape(8, 8) + 1.0
    s = x.reshape(4, 16).copy()
    s[0] = 0.0 + 5.0  # the old value of row 1: zeros
    d = np.zeros_like(x)
    d[0].reshape(4, 8)[2:4] = x[1].reshape(4, 8)[0:2] * 3.0
    hand = [o, w.reshape(2, 32), s.reshape(2, 32), d]
    for backend in backends():
        got = tp.run(reshaped_stores, x, backend=backend)
        for n, (g, h) in enumerate(zip(got, hand)):
            np.testing.assert_array_equal(np.asarray(g), h, err_msg=f"output {n} on {backend}")


def reshaped_at_data(x, idx, interpret=False):
    """A reshaped ref read and written at an index that is data (a KV page's slot): a row, and a
    window of two rows whose start is past the end and is clamped as JAX clamps a slice."""

    def body(x_ref, i_ref, o_ref, w_ref):
        i = i_ref[0]
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref.reshape(4, 16)[i] = x_ref.reshape(4, 16)[i + 1] * 2.0
        w_ref[...] = x_ref[...]
        w_ref.at[1].reshape(4, 8)[pl.ds(i + 2, 2), :] = jnp.full((2, 8), -1.0, x_ref.dtype)

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(body, out_shape=(shape, shape), interpret=interpret)(x, idx)


def test_reshaped_refs_at_an_index_that_is_data():
    x = RNG.standard_normal((2, 32)).astype(np.float32)
    for i in (0, 2):
        o = np.zeros_like(x)
        o.reshape(4, 16)[i] = x.reshape(4, 16)[i + 1] * 2.0
        w = x.copy()
        start = min(i + 2, 2)  # 4 rows, a window of 2: a start past 2 is clamped to 2
        w[1].reshape(4, 8)[start:start + 2] = -1.0
        for backend in backends():
            got = tp.run(reshaped_at_data, x, np.array([i], np.int32), backend=backend)
            np.testing.assert_array_equal(np.asarray(got[0]), o, err_msg=f"row at {i} on {backend}")
            np.testing.assert_array_equal(np.asarray(got[1]), w, err_msg=f"window at {i} on {backend}")


def _aliased(body, grid, spec, x, interpret=False):
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid, in_specs=[spec], out_specs=spec,
                          input_output_aliases={0: 0}, interpret=interpret)(x)


def read_after_store(x, interpret=False):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0
        o_ref[...] = o_ref[...] + x_ref[...]  # x as the call began: 2x + 1 (2x + 2 had it been o)

    return _aliased(body, (2,), pl.BlockSpec((8,), lambda i: (i,)), x, interpret)


def read_across_steps(x, interpret=False):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0  # at both steps of k: 2x (4x had the second read o)

    return _aliased(body, (2, 2), pl.BlockSpec((8,), lambda i, k: (i,)), x, interpret)


@pytest.mark.parametrize("fn", [read_after_store, read_across_steps], ids=["after_store", "across_steps"])
def test_an_aliased_input_read_after_its_output_is_stored_reads_the_call_start_values(fn):
    """`input_output_aliases` where the kernel reads the input after storing the output (later
    in the body, or at a later `seq` step): Pallas reads the input as the call began. The input
    stays an input of its own, passed a second time aliased to the output, which starts from it
    (XLA copies one of them); the values the input would have had as the output tell the two
    apart. Was refused."""
    x = f32(16)
    want = np.asarray(fn(x, interpret=True))
    np.testing.assert_array_equal(want, (x + np.float32(1)) + x if fn is read_after_store else x * np.float32(2))
    for backend in backends():
        np.testing.assert_array_equal(np.asarray(tp.run(fn, x, backend=backend)), want, err_msg=backend)


def accumulate(acc, g, interpret=False):
    """Adds four gradient slices into an existing accumulator: the output aliases it and is read
    and written at every step of a `seq` axis (`o_ref[...] += g_ref[...]`)."""

    def body(acc_ref, g_ref, o_ref):
        o_ref[...] += g_ref[...]

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype), grid=(2, 4),
                          in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, 0)), pl.BlockSpec((None, 8, 128), lambda i, k: (k, i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)), input_output_aliases={0: 0}, interpret=interpret)(acc, g)


def test_an_aliased_accumulator_read_and_written_across_seq_steps_starts_from_the_input():
    """The output starts from the input's buffer and is read back at every `seq` step: wgpu,
    which holds such a block in registers starting from zeros, lowers this launch with the block
    in memory (it was refused). Against Pallas's interpret mode, and numpy (the same sums in the
    same order: acc + g0 + g1 + g2 + g3)."""
    acc, g = f32(16, 128), f32(4, 16, 128)
    want = np.asarray(accumulate(acc, g, interpret=True))
    np.testing.assert_array_equal(want, acc + g[0] + g[1] + g[2] + g[3])
    for backend in backends():
        np.testing.assert_array_equal(np.asarray(tp.run(accumulate, acc, g, backend=backend)), want, err_msg=backend)
