"""`tessel.pallas` on what moves elements along an axis: `jnp.sort`, `jnp.argsort`, `lax.sort`
by several keys, `lax.top_k` (XLA's order of zeros and NaN), `jnp.flip`, and `dynamic_slice` /
`dynamic_update_slice` of values. Each against Pallas's interpret mode and numpy or values worked
by hand, bit for bit where elements only move."""

import os

import numpy as np
import pytest

if os.environ.get("TESSEL_REQUIRE_PYTHON") == "1":
    import jax  # CI: no jax is a failure, not a skip
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

from tessel import pallas as tp  # noqa: E402
from pallas_common import backends  # noqa: E402


def ordered(x, n, interpret=False):
    """`jnp.sort` along each axis (and descending: a `rev` after), `jnp.argsort`, `jnp.flip`,
    `lax.top_k` (mixture-of-experts routing's: the top 2 experts of softmax scores and their
    indices) and an integer sort."""

    def body(x_ref, n_ref, rows_ref, cols_ref, desc_ref, arg_ref, flip_ref, top_ref, top_i_ref, ints_ref):
        x = x_ref[...]
        rows_ref[...] = jnp.sort(x, axis=1)
        cols_ref[...] = jnp.sort(x, axis=0)
        desc_ref[...] = jnp.sort(x, axis=1, descending=True)
        arg_ref[...] = jnp.argsort(x, axis=1)
        flip_ref[...] = jnp.flip(x, axis=0)
        scores, experts = jax.lax.top_k(jax.nn.softmax(x, axis=1), 2)
        top_ref[...] = scores
        top_i_ref[...] = experts
        ints_ref[...] = jnp.sort(n_ref[...], axis=1)

    r, c = x.shape
    f, i = (lambda sh: jax.ShapeDtypeStruct(sh, x.dtype)), (lambda sh: jax.ShapeDtypeStruct(sh, jnp.int32))
    out = (f((r, c)), f((r, c)), f((r, c)), i((r, c)), f((r, c)), f((r, 2)), i((r, 2)), i(n.shape))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, n)


def test_sort_argsort_top_k_and_flip_run_as_pallas_runs_them():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    x[0, :5] = [np.nan, -0.0, 0.0, np.inf, -np.inf]  # JAX's order: -0 as 0, NaN last
    x[1, 3] = x[1, 9]  # a tie: the lower index first
    n = rng.integers(-1000, 1000, (6, 16)).astype(np.int32)
    want = [np.asarray(w) for w in ordered(x, n, interpret=True)]
    # By hand: a row sorted as numpy sorts it (NaN last), the tie's indices in order, the
    # integers as numpy sorts them.
    np.testing.assert_array_equal(want[0][3], np.sort(x[3]))
    arg = list(want[3][1])
    assert arg.index(3) + 1 == arg.index(9), arg
    np.testing.assert_array_equal(want[7], np.sort(n, axis=1))
    tk = tp.to_tk(ordered, x, n)
    assert " = sum %" in tk and "bitcast" in tk, tk
    for backend in backends():
        got = tp.run(ordered, x, n, backend=backend)
        for k, (g, w) in enumerate(zip(got, want)):
            # Bit for bit: the elements themselves are moved, -0.0 and NaN included.
            same = np.array_equal(g.view(np.uint32), w.view(np.uint32)) if w.dtype == np.float32 and k != 5 else None
            if k == 5:
                np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"{backend}: top_k scores")
            elif same is not None:
                assert same, (backend, k, g, w)
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{backend}: output {k}")


def dynamic_windows(x, interpret=False):
    """`lax.dynamic_slice` and `lax.dynamic_update_slice` of a loaded block at starts from the
    program id, some past the end (JAX clamps them into the block)."""

    def body(x_ref, a_ref, b_ref, c_ref):
        v = x_ref[...]
        i = pl.program_id(0)
        a_ref[...] = jax.lax.dynamic_slice(v, (i * 3 + 1, 0), (4, 16))
        b_ref[...] = jax.lax.dynamic_slice(v, (i * 20, i * 5), (3, 8))
        c_ref[...] = jax.lax.dynamic_update_slice(v, jnp.full((2, 4), -1.0, v.dtype), (i + 2, i * 7 + 20))

    out = (jax.ShapeDtypeStruct((2, 4, 16), x.dtype), jax.ShapeDtypeStruct((2, 3, 8), x.dtype), jax.ShapeDtypeStruct((2, 8, 16), x.dtype))
    spec = lambda sh: pl.BlockSpec((None,) + sh, lambda i: (i, 0, 0))  # noqa: E731
    return pl.pallas_call(body, out_shape=out, grid=(2,), in_specs=[pl.BlockSpec((8, 16), lambda i: (0, 0))],
                          out_specs=(spec((4, 16)), spec((3, 8)), spec((8, 16))), interpret=interpret)(x)


def test_dynamic_slices_and_updates_of_values_clamp_as_jax_does():
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    # By hand: program i's windows, starts clamped into [0, size - window].
    a = np.stack([x[1:5], x[4:8]])
    b = np.stack([x[0:3, 0:8], x[5:8, 5:13]])
    c = np.stack([x.copy(), x.copy()])
    c[0, 2:4, 12:16] = -1.0  # column start 20 clamped to 12
    c[1, 3:5, 12:16] = -1.0
    want = [np.asarray(w) for w in dynamic_windows(x, interpret=True)]
    for w, h in zip(want, (a, b, c)):
        np.testing.assert_array_equal(w, h)
    for backend in backends():
        for g, h in zip(tp.run(dynamic_windows, x, backend=backend), (a, b, c)):
            np.testing.assert_array_equal(g, h, err_msg=backend)


def top3(x, interpret=False):
    def body(x_ref, v_ref, i_ref):
        v, i = jax.lax.top_k(x_ref[...], 5)
        v_ref[...] = v
        i_ref[...] = i

    out = (jax.ShapeDtypeStruct((x.shape[0], 5), jnp.float32), jax.ShapeDtypeStruct((x.shape[0], 5), jnp.int32))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


def test_top_k_orders_zeros_and_nan_as_xla_does():
    """XLA's `top_k` takes -0 below +0 (a sort takes them as equal) and NaN above everything."""
    x = np.array([[-0.0, 0.0, 0.0, -0.0, 1.0, 1.0, -1.0, 2.0], [1.0, np.nan, -0.0, 0.0, 3.0, -np.inf, np.inf, 3.0]], np.float32)
    want = [np.asarray(w) for w in top3(x, interpret=True)]
    np.testing.assert_array_equal(want[1], [[7, 4, 5, 1, 2], [1, 6, 4, 7, 0]])  # by hand, as XLA gives them
    for backend in backends():
        got = tp.run(top3, x, backend=backend)
        np.testing.assert_array_equal(got[1], want[1], err_msg=backend)
        assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32)), (backend, got[0], want[0])


def by_two_keys(e, t, interpret=False):
    """`lax.sort` by two keys (a mixture-of-experts permutation: by expert, then by score
    descending as a negated key), carrying the token ids along."""

    def body(e_ref, t_ref, se_ref, st_ref, ids_ref):
        ids = jax.lax.broadcasted_iota(jnp.int32, e_ref.shape, 1)
        se, st, si = jax.lax.sort((e_ref[...], -t_ref[...], ids), dimension=1, num_keys=2)
        se_ref[...] = se
        st_ref[...] = -st
        ids_ref[...] = si

    s = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
    out = (s(e), s(t), jax.ShapeDtypeStruct(e.shape, jnp.int32))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(e, t)


def test_a_sort_by_two_keys_orders_by_the_first_then_the_second():
    rng = np.random.default_rng(14)
    e = rng.integers(0, 4, (3, 16)).astype(np.int32)
    t = np.round(rng.random((3, 16)), 1).astype(np.float32)  # ties in both keys
    # By hand: numpy's lexsort (last key first), stable, as lax.sort is.
    order = np.stack([np.lexsort((np.arange(16), -t[r], e[r])) for r in range(3)])
    want = [np.take_along_axis(e, order, 1), np.take_along_axis(t, order, 1), order.astype(np.int32)]
    for w, p in zip(want, by_two_keys(e, t, interpret=True)):
        np.testing.assert_array_equal(np.asarray(p), w)
    for backend in backends():
        for g, w in zip(tp.run(by_two_keys, e, t, backend=backend), want):
            np.testing.assert_array_equal(g, w, err_msg=backend)


def value_gathers(x, idx, rows, interpret=False):
    """Gathers of a loaded value by an index array: `jnp.take_along_axis` along rows (an entry
    past the end gives NaN, JAX's fill; a negative one counts from the end) and rows `x[rows]`."""

    def body(x_ref, i_ref, r_ref, a_ref, b_ref):
        x = x_ref[...]
        a_ref[...] = jnp.take_along_axis(x, i_ref[...], axis=1)
        b_ref[...] = x[r_ref[...], :]

    out = (jax.ShapeDtypeStruct(idx.shape, x.dtype), jax.ShapeDtypeStruct((rows.shape[0], x.shape[1]), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, idx, rows)


def test_gathers_of_values_by_index_arrays_run_as_jax_runs_them():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    idx = np.array([[8, 5, 4, 1, 1, -2]] * 4, np.int32)
    rows = np.array([3, 0, 2], np.int32)
    # By hand: 8 is past the end (NaN), -2 is 6.
    a = np.take_along_axis(x, np.where(idx < 0, idx + 8, np.minimum(idx, 7)), 1)
    a[:, 0] = np.nan
    want = [a, x[rows]]
    for w, p in zip(want, value_gathers(x, idx, rows, interpret=True)):
        np.testing.assert_array_equal(np.asarray(p), w)
    for backend in backends():
        for g, w in zip(tp.run(value_gathers, x, idx, rows, backend=backend), want):
            np.testing.assert_array_equal(g, w, err_msg=backend)
