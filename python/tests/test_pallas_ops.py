"""`tessel.pallas` on what production Pallas kernels use beyond the basics (issues 34 and 36):
`lax.cond` / `lax.switch` with values (causal attention's block skipping), sorts and `top_k`,
cumulative operations along any axis, `logsumexp`, `all`/`any`, powers, and
`input_output_aliases` through XLA's aliasing (a KV-cache write), flash attention, and the
matmuls that take Mosaic GPU's Hopper path. Each against Pallas's interpret mode and, where it
can be worked out, numpy or a hand computation."""

import os

import numpy as np
import pytest

if os.environ.get("TESSEL_REQUIRE_PYTHON") == "1":
    import jax  # CI: no jax is a failure, not a skip
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import tessel  # noqa: E402
from tessel import pallas as tp  # noqa: E402
from pallas_common import RNG, backends, call, f32  # noqa: E402
from test_pallas import matmul  # noqa: E402


def cumulative_3d(x, n, interpret=False):
    """Cumulative operations along the middle and first axes of 3-D blocks (moved last by a
    transpose and back): a float sum, an integer sum reversed, a running maximum."""

    def body(x_ref, n_ref, mid_ref, first_ref, hi_ref):
        x, n = x_ref[...], n_ref[...]
        mid_ref[...] = jnp.cumsum(x, axis=1)
        first_ref[...] = jax.lax.cumsum(n, axis=0, reverse=True)
        hi_ref[...] = jax.lax.cummax(x, axis=1)

    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(n.shape, n.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, n)


def test_cumulative_operations_along_any_axis_match_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    n = rng.integers(-50, 50, (4, 3, 2)).astype(np.int32)
    tk = tp.to_tk(cumulative_3d, x, n)
    assert tk.count(" perm (") >= 4, tk
    want = [np.cumsum(x.astype(np.float64), axis=1), np.flip(np.cumsum(np.flip(n, 0), axis=0), 0), np.maximum.accumulate(x, axis=1)]
    for backend in backends():
        got = tp.run(cumulative_3d, x, n, backend=backend)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, err_msg=backend)
        np.testing.assert_array_equal(got[1], want[1], err_msg=backend)
        np.testing.assert_array_equal(got[2], want[2], err_msg=backend)
    for g, w in zip(cumulative_3d(x, n, interpret=True), want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def _aliased(body, x, grid=(2,), interpret=False):
    spec = pl.BlockSpec((8,), lambda i: (i,))
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(body, out_shape=out, grid=grid, in_specs=[spec], out_specs=spec, input_output_aliases={0: 0}, interpret=interpret)(x)


def aliased_partly(x, interpret=False):
    """One program of two: the second block keeps x's values, as Pallas's one buffer does."""

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    return _aliased(body, x, grid=(1,), interpret=interpret)


def aliased_masked(x, interpret=False):
    """Each program stores the first half of its block; the rest keeps x's values."""

    def body(x_ref, o_ref):
        o_ref[pl.ds(0, 4)] = x_ref[pl.ds(0, 4)] * 3.0

    return _aliased(body, x, interpret=interpret)


def kv_cache_update(cache, new, pos, interpret=False):
    """A decode step's KV-cache write: the new row block goes where the scalar-prefetched `pos`
    says, every other row of the (bf16) cache stays as it was: the cache is aliased in place."""
    from jax.experimental.pallas import tpu as pltpu

    def body(pos_ref, new_ref, cache_ref, o_ref):
        o_ref[...] = new_ref[...]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(1,),
        in_specs=[pl.BlockSpec((4, 16), lambda i, p: (0, 0)), pl.BlockSpec((4, 16), lambda i, p: (p[0], 0))],
        out_specs=pl.BlockSpec((4, 16), lambda i, p: (p[0], 0)),
    )
    out = jax.ShapeDtypeStruct(cache.shape, cache.dtype)
    return pl.pallas_call(body, out_shape=out, grid_spec=grid_spec, input_output_aliases={2: 0}, interpret=interpret)(pos, new, cache)


def test_an_aliased_output_left_partly_unwritten_keeps_the_inputs_values_through_xlas_aliasing():
    x = np.arange(16, dtype=np.float32)
    hand = {
        aliased_partly: np.concatenate([x[:8] + 1.0, x[8:]]),
        aliased_masked: np.concatenate([x[:4] * 3, x[4:8], x[8:12] * 3, x[12:]]),
    }
    for fn, want in hand.items():
        tk = tp.to_tk(fn, x)
        # The input is not the kernel's: its loads read the output, which starts as its values.
        assert " in " not in tk and "load o0" in tk, tk
        np.testing.assert_array_equal(np.asarray(fn(x, interpret=True)), want)
        with tp.installed("interpret"):
            hlo = jax.jit(fn).lower(x).as_text()
        call = next(line for line in hlo.splitlines() if "tessel_call" in line)
        assert 'keep = "o0"' in call and "output_operand_alias<output_tuple_indices = [], operand_index = 0" in call, call
        for backend in backends():
            np.testing.assert_array_equal(tp.run(fn, x, backend=backend), want, err_msg=f"{fn.__name__} on {backend}")
        assert np.array_equal(x, np.arange(16, dtype=np.float32)), "the caller's array is untouched"
    # Under `vmap`: each batch element's output starts from its own input.
    xs = np.arange(48, dtype=np.float32).reshape(3, 16)
    with tp.installed("interpret"):
        got = np.asarray(jax.jit(jax.vmap(aliased_masked))(xs))
    np.testing.assert_array_equal(got, np.asarray(jax.vmap(lambda v: aliased_masked(v, interpret=True))(xs)))
    np.testing.assert_array_equal(got[1, 8:], np.concatenate([xs[1, 8:12] * 3, xs[1, 12:]]))


def test_an_aliased_output_lowered_for_cuda_keeps_its_contents_through_xlas_aliasing():
    """The opt-in Mosaic GPU lowering for CUDA takes an aliased output as the CPU one does: the
    call asks XLA to alias the operand to the result and the handler keeps the output's contents
    (it no longer refuses them on CUDA). Lowered here; run on a lent GPU (test_cuda.py)."""
    try:
        from jax.extend import pallas as _  # noqa: F401
    except ImportError:
        pytest.skip("this jax has no jax.extend.pallas.register_lowering_rule")

    def body(x_ref, o_ref):
        o_ref[pl.ds(0, 4)] = x_ref[pl.ds(0, 4)] * 3.0

    def f(x):
        spec = pl.BlockSpec((8,), lambda i: (i,))
        return pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
            input_output_aliases={0: 0}, compiler_params=tp.CompilerParams(backend="mosaic-gpu"),
        )(x)

    x = np.arange(16, dtype=np.float32)
    hlo = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    call = next(line for line in hlo.splitlines() if "tessel_call" in line)
    assert 'backend = "mosaic-gpu"' in call and 'keep = "o0"' in call, call
    assert "output_operand_alias<output_tuple_indices = [], operand_index = 0" in call, call


def test_a_kv_cache_update_writes_one_block_in_place_of_a_bf16_cache():
    rng = np.random.default_rng(11)
    cache = jnp.asarray(rng.standard_normal((32, 16)), jnp.bfloat16)
    new = jnp.asarray(rng.standard_normal((4, 16)), jnp.bfloat16)
    pos = np.array([5], np.int32)
    want = np.asarray(cache).copy()
    want[20:24] = np.asarray(new)
    np.testing.assert_array_equal(np.asarray(kv_cache_update(cache, new, pos, interpret=True)), want)
    for backend in backends():
        got = tp.run(kv_cache_update, cache, new, pos, backend=backend)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=backend)
    # Donated, as a decode loop would: XLA hands the cache's own buffer to the kernel.
    with tp.installed("interpret"):
        step = jax.jit(kv_cache_update, donate_argnums=0)
        got = step(jnp.array(cache), new, pos)
    np.testing.assert_array_equal(np.asarray(got), want)


def reductions_and_powers(x, interpret=False):
    """`jax.nn.logsumexp` (which asks `is_finite` of its max), `jnp.all` / `jnp.any` along an
    axis and of everything, and `x ** n` for n = -2, 0, 4, 5 (by squaring, as JAX computes it)."""

    def body(x_ref, lse_ref, all_ref, any_ref, pow_ref):
        x = x_ref[...]
        lse_ref[...] = jax.nn.logsumexp(x, axis=1, keepdims=True)
        pos = x > 0
        all_ref[...] = jnp.where(jnp.all(pos, axis=1, keepdims=True), 1.0, 0.0) + jnp.where(jnp.any(x > 100), 10.0, 0.0)
        any_ref[...] = jnp.where(jnp.any(pos, axis=0, keepdims=True), 1.0, 0.0)
        for k, n in enumerate((-2, 0, 4, 5)):
            pow_ref[k] = jax.lax.integer_pow(x, n)

    r, c = x.shape
    out = (jax.ShapeDtypeStruct((r, 1), x.dtype), jax.ShapeDtypeStruct((r, 1), x.dtype), jax.ShapeDtypeStruct((1, c), x.dtype), jax.ShapeDtypeStruct((4, r, c), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


def test_logsumexp_all_any_and_integer_powers_run_as_pallas_runs_them():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((6, 16)) * 3).astype(np.float32)
    x[:, 3] = -np.abs(x[:, 3]) - 0.5  # a column with one positive element (row 1's)
    x[1] = np.abs(x[1]) + 0.5  # a row all positive
    x[2] = -np.inf  # a row whose logsumexp is -inf
    want = [np.asarray(w) for w in reductions_and_powers(x, interpret=True)]
    # By hand where exact: the row of -inf gives -inf; row 1 is all positive, no other is (and
    # nothing passes 100); every column has a positive element, column 3 only in row 1.
    assert want[0][2, 0] == -np.inf
    np.testing.assert_array_equal(want[1][:, 0], [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(want[2], np.ones((1, 16)))
    tk = tp.to_tk(reductions_and_powers, x)
    assert "lt %" in tk and ", inf" in tk and "cast %" in tk, tk
    for backend in backends():
        got = tp.run(reductions_and_powers, x, backend=backend)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, err_msg=backend)
        np.testing.assert_array_equal(got[1], want[1], err_msg=backend)
        np.testing.assert_array_equal(got[2], want[2], err_msg=backend)
        # The same products in the same order: bit for bit (each stored alone, so that XLA fuses
        # no add into a multiply in Pallas's result).
        np.testing.assert_array_equal(got[3], want[3], err_msg=backend)
        np.testing.assert_array_equal(got[3][1], np.ones_like(x), err_msg=backend)


def test_a_cond_returning_values_runs_only_the_branch_taken_refs_it_writes_included():
    """A `lax.cond` returning values whose branch also writes a ref: it is an `if`, whose branch
    not taken does not run, so the write happens only in program 0."""

    def body(x_ref, o_ref, p_ref):
        p_ref[...] = jnp.zeros((8, 128), jnp.float32)

        def write_and_return(v):
            p_ref[...] = v + 1.0
            return v * 2.0

        o_ref[...] = jax.lax.cond(pl.program_id(0) == 0, write_and_return, lambda v: v - 1.0, x_ref[...])

    x = f32(16, 128)
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    f = lambda x, interpret=False: pl.pallas_call(body, out_shape=(out, out), grid=(2,), in_specs=[spec], out_specs=(spec, spec), interpret=interpret)(x)  # noqa: E731
    want = [np.asarray(w) for w in f(x, interpret=True)]
    # By hand: program 0 doubles and writes x + 1; program 1 subtracts 1 and writes zeros.
    np.testing.assert_array_equal(want[0], np.concatenate([x[:8] * 2.0, x[8:] - 1.0]))
    np.testing.assert_array_equal(want[1], np.concatenate([x[:8] + 1.0, np.zeros((8, 128), np.float32)]))
    tk = tp.to_tk(f, x)
    assert tk.count(" = if ") == 1 and " = for " not in tk, tk
    for backend in backends():
        for g, w in zip(tp.run(f, x, backend=backend), want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=backend)


def switch_values(x, interpret=False):
    """`lax.switch` returning values on `program_id - 1`, which JAX clamps into [0, 2]."""

    def body(x_ref, o_ref):
        branches = [lambda v: v * 2.0, lambda v: v + 1.0, lambda v: -v]
        o_ref[...] = jax.lax.switch(pl.program_id(0) - 1, branches, x_ref[...])

    spec = pl.BlockSpec((8,), lambda i: (i,))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(5,), in_specs=[spec], out_specs=spec, interpret=interpret)(x)


def test_a_switch_returning_values_is_a_chain_of_ifs_with_the_index_clamped():
    x = f32(40)
    tk = tp.to_tk(switch_values, x)
    assert tk.count(" = if ") == 2 and " = for " not in tk, tk
    # By hand: programs 0 and 1 take branch 0 (-1 clamps to 0), 2 branch 1, 3 and 4 branch 2.
    b = x.reshape(5, 8)
    want = np.concatenate([b[0] * 2, b[1] * 2, b[2] + 1, -b[3], -b[4]])
    np.testing.assert_array_equal(np.asarray(switch_values(x, interpret=True)), want)
    for backend in backends():
        np.testing.assert_array_equal(tp.run(switch_values, x, backend=backend), want, err_msg=backend)


def causal_attention(q, k, v, interpret=False, bq=16, bk=16):
    """Causal attention's online softmax over key blocks, skipping with `lax.cond` the blocks
    wholly after a program's last query row (carrying the state unchanged) and masking the one
    on the diagonal: the kernel shape Pallas users write for causal flash attention."""
    n, d = q.shape

    def body(q_ref, k_ref, v_ref, o_ref):
        i = pl.program_id(0)
        qb = q_ref[...] * (1.0 / np.sqrt(d))
        rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)

        def step(j, carry):
            def run(carry):
                m, l, acc = carry
                kb, vb = k_ref[pl.ds(j * bk, bk), :], v_ref[pl.ds(j * bk, bk), :]
                s = jnp.dot(qb, kb.T)
                cols = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
                s = jnp.where(cols > rows, -jnp.inf, s)
                m2 = jnp.maximum(m, s.max(axis=1, keepdims=True))
                p = jnp.exp(s - m2)
                alpha = jnp.exp(m - m2)
                return m2, l * alpha + p.sum(axis=1, keepdims=True), acc * alpha + jnp.dot(p, vb)

            return jax.lax.cond(j * bk <= i * bq + bq - 1, run, lambda c: c, carry)

        init = (jnp.full((bq, 1), -jnp.inf, jnp.float32), jnp.zeros((bq, 1), jnp.float32), jnp.zeros((bq, d), jnp.float32))
        _, l, acc = jax.lax.fori_loop(0, n // bk, step, init)
        o_ref[...] = acc / l

    qs = pl.BlockSpec((bq, d), lambda i: (i, 0))
    whole = pl.BlockSpec((n, d), lambda i: (0, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=(n // bq,), in_specs=[qs, whole, whole], out_specs=qs, interpret=interpret)(q, k, v)


def test_causal_attention_skipping_blocks_with_cond_matches_numpy():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((64, 32)).astype(np.float32) for _ in range(3))
    tk = tp.to_tk(causal_attention, q, k, v)
    assert " = if " in tk and " = for " in tk, tk
    # numpy, in float64: softmax of the scaled scores with the future masked.
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(32)
    s[np.triu_indices(64, 1)] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    np.testing.assert_allclose(np.asarray(causal_attention(q, k, v, interpret=True)), want, rtol=1e-4, atol=1e-5)
    for backend in backends():
        np.testing.assert_allclose(tp.run(causal_attention, q, k, v, backend=backend), want, rtol=1e-4, atol=1e-5, err_msg=backend)


def test_a_pallas_bf16_matmul_takes_the_mosaic_gpu_hopper_path():
    # Pallas's matmul as people write it (`o_ref[...] += jnp.dot(...)`, zeroed under `pl.when`),
    # on bf16 operands in 128x128 tiles: Mosaic GPU lowers it with TMA, mbarriers and wgmma.
    a = jnp.asarray(RNG.standard_normal((256, 192), dtype=np.float32)).astype(jnp.bfloat16)
    b = jnp.asarray(RNG.standard_normal((192, 256), dtype=np.float32)).astype(jnp.bfloat16)
    (t,) = tp.translate(matmul, a, b, bm=128, bn=128, bk=64)
    ptx = tessel.compile(t.text).lower("mosaic-gpu")
    assert "// hopper: dot of bf16 [128, 64] x [64, 128] on wgmma m64n128k16" in ptx, ptx[:600]
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait.parity" in ptx and "wgmma.mma_async" in ptx
    # And it computes the product on every backend here (against f64, from the bf16 values).
    want = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)
    for backend in backends():
        got = tp.run(matmul, a, b, bm=128, bn=128, bk=64, backend=backend)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def scratch_matmul(a, b, interpret=False, bm=128, bn=128, bk=64):
    """Pallas's other matmul: an f32 scratch accumulator, cast into a bf16 output at the last step."""
    from jax.experimental.pallas import tpu as pltpu

    def body(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    (m, k), n = a.shape, b.shape[1]
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        interpret=interpret,
    )(a, b)


def test_a_pallas_matmul_with_a_scratch_accumulator_takes_the_hopper_path_too():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = jnp.asarray(RNG.standard_normal((256, 192), dtype=np.float32)).astype(jnp.bfloat16)
    b = jnp.asarray(RNG.standard_normal((192, 128), dtype=np.float32)).astype(jnp.bfloat16)
    (t,) = tp.translate(scratch_matmul, a, b)
    ptx = tessel.compile(t.text).lower("mosaic-gpu")
    assert "on wgmma m64n128k16" in ptx and "into o0 (bf16)" in ptx, ptx[:600]
    want = np.asarray(scratch_matmul(a, b, interpret=True)).astype(np.float32)
    for backend in backends():
        got = tp.run(scratch_matmul, a, b, backend=backend)
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def attention(q, k, v, interpret=False, bq=16, bk=16):
    """Flash attention: `fori_loop` over key blocks with a running max and sum carried, `pl.ds`
    slices of whole-array `k` and `v` at the loop's offset, `q @ k.T`."""
    n, d = q.shape

    def body(q_ref, k_ref, v_ref, o_ref):
        qb = q_ref[...]

        def step(j, carry):
            m, s, acc = carry
            kb = k_ref[pl.ds(j * bk, bk), :]
            vb = v_ref[pl.ds(j * bk, bk), :]
            logits = jnp.dot(qb, kb.T, preferred_element_type=jnp.float32)
            m_new = jnp.maximum(m, jnp.max(logits, axis=1, keepdims=True))
            p = jnp.exp(logits - m_new)
            scale = jnp.exp(m - m_new)
            return m_new, s * scale + jnp.sum(p, axis=1, keepdims=True), acc * scale + jnp.dot(p, vb)

        init = (jnp.full((bq, 1), -jnp.inf, jnp.float32), jnp.zeros((bq, 1), jnp.float32), jnp.zeros((bq, d), jnp.float32))
        _, s, acc = jax.lax.fori_loop(0, n // bk, step, init)
        o_ref[...] = acc / s

    whole = pl.BlockSpec((n, d), lambda i: (0, 0))
    spec = pl.BlockSpec((bq, d), lambda i: (i, 0))
    return call(body, jax.ShapeDtypeStruct(q.shape, q.dtype), (n // bq,), [spec, whole, whole], spec, interpret)(q, k, v)


def test_flash_attention_agrees_with_pallas_interpret_mode():
    q, k, v = f32(64, 32), f32(64, 32), f32(64, 32)
    want = np.asarray(attention(q, k, v, interpret=True))
    logits = q @ k.T
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(want, (e / e.sum(1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
    text = tp.to_tk(attention, q, k, v)
    assert "= for %" in text and "trans_b" in text and "yield %" in text, text
    for backend in backends():
        np.testing.assert_allclose(tp.run(attention, q, k, v, backend=backend), want, rtol=1e-4, atol=1e-5, err_msg=backend)


def log_cumsums(x, interpret=False):
    """`lax.cumlogsumexp` along rows, down columns reversed, and of a row starting with -inf."""

    def body(x_ref, rows_ref, cols_ref):
        x = x_ref[...]
        rows_ref[...] = jax.lax.cumlogsumexp(x, axis=1)
        cols_ref[...] = jax.lax.cumlogsumexp(x, axis=0, reverse=True)

    out = (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


def test_cumlogsumexp_matches_numpy_and_pallas():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((5, 24)) * 30).astype(np.float32)  # a spread e^x underflows across
    x[2, :3] = -np.inf
    with np.errstate(divide="ignore"):
        rows = np.logaddexp.accumulate(x.astype(np.float64), axis=1)
        cols = np.flip(np.logaddexp.accumulate(np.flip(x.astype(np.float64), 0), axis=0), 0)
    want = [np.asarray(w) for w in log_cumsums(x, interpret=True)]
    np.testing.assert_allclose(want[0], rows, rtol=1e-5)
    for backend in backends():
        got = tp.run(log_cumsums, x, backend=backend)
        np.testing.assert_allclose(got[0], rows, rtol=2e-6, err_msg=backend)
        np.testing.assert_allclose(got[1], cols, rtol=2e-6, err_msg=backend)
        assert np.all(got[0][2, :3] == -np.inf), got[0][2]


def composed(x, n, interpret=False):
    """Functions tessel composes: `erfc` (and so exact `gelu`), `tan`, `cbrt`, `population_count`,
    `clz`, and `lax.pad` with a constant (`jnp.pad`), cropping too."""

    def body(x_ref, n_ref, erfc_ref, gelu_ref, tan_ref, cbrt_ref, pop_ref, clz_ref, pad_ref):
        x, n = x_ref[...], n_ref[...]
        erfc_ref[...] = jax.lax.erfc(x)
        gelu_ref[...] = jax.nn.gelu(x, approximate=False)
        tan_ref[...] = jnp.tan(x * 0.5)
        cbrt_ref[...] = jnp.cbrt(x * 10.0)
        pop_ref[...] = jax.lax.population_count(n)
        clz_ref[...] = jax.lax.clz(n)
        pad_ref[...] = jax.lax.pad(x[:, 2:], jnp.float32(7.0), ((1, 1, 0), (3, -1, 0)))

    r, c = x.shape
    f = lambda sh: jax.ShapeDtypeStruct(sh, x.dtype)  # noqa: E731
    i = jax.ShapeDtypeStruct(n.shape, jnp.int32)
    out = (f((r, c)), f((r, c)), f((r, c)), f((r, c)), i, i, f((r + 2, c)))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, n)


def test_composed_functions_match_their_definitions():
    import math

    rng = np.random.default_rng(8)
    x = (rng.standard_normal((4, 16)) * 3).astype(np.float32)
    x[0, :6] = [5.0, 8.0, -6.0, 0.0, 0.8, -0.8]  # erfc's tail and both sides of 0
    x[1, :3] = [0.8, -2.7, 2.7]  # cubes of 2 and -3 (after the * 10)
    n = rng.integers(-(2**31), 2**31 - 1, (4, 16), dtype=np.int64).astype(np.int32)
    n[0, :4] = [0, -1, 1, 2**30]
    want = [np.asarray(w) for w in composed(x, n, interpret=True)]
    # By hand: erfc against math.erfc in f64 (relative, the tail included), bits and padding exactly.
    erfc = np.vectorize(math.erfc)(x.astype(np.float64))
    bits = n.astype(np.int64) & 0xFFFFFFFF
    pop = np.vectorize(lambda b: bin(int(b)).count("1"))(bits)
    clz = np.vectorize(lambda b: 32 - int(b).bit_length())(bits)
    pad = np.full((6, 16), 7.0, np.float32)
    pad[1:5, 3:16] = x[:, 2:15]
    for backend in backends():
        got = tp.run(composed, x, n, backend=backend)
        np.testing.assert_allclose(got[0], erfc, rtol=1e-6, err_msg=backend)
        assert got[0][0, 1] > 0, "erfc(8) is 1.1e-29, not 0"
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7, err_msg=backend)
        np.testing.assert_allclose(got[2], want[2], rtol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got[3], want[3], rtol=1e-6, err_msg=backend)
        np.testing.assert_array_equal(got[4], pop, err_msg=backend)
        np.testing.assert_array_equal(got[5], clz, err_msg=backend)
        np.testing.assert_array_equal(got[6], pad, err_msg=backend)
        np.testing.assert_array_equal(got[6], want[6], err_msg=backend)


def double_buffered(x, w, interpret=False):
    """A TPU kernel's manual DMA (`pltpu.make_async_copy(...).start()` / `.wait()`) from an HBM
    ref (`memory_space=pl.ANY`) into a two-slot VMEM buffer (`buf.at[slot]`, an indexer on an
    indexer), prefetching the next step's rows while this step's are used, with DMA semaphores;
    and a `dot_general` of `f32` rows against `bf16` weights."""
    from jax.experimental.pallas import tpu as pltpu

    steps, rows = x.shape[0] // 8, 8

    def body(x_hbm, w_ref, o_ref, buf, sem):
        i = pl.program_id(0)
        slot = i % 2

        def copy(step, into):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(step * rows, rows)], buf.at[into], sem.at[into])

        @pl.when(i == 0)
        def _():
            copy(0, 0).start()

        @pl.when(i + 1 < steps)
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] = jax.lax.dot_general(buf[slot], w_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0,
        grid=(steps,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(w.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, w.shape[0]), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((2, rows, x.shape[1]), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32)
    return pl.pallas_call(body, out_shape=out, grid_spec=spec, interpret=interpret)(x, w)


def test_manual_dma_double_buffering_runs_as_pallas_runs_it():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((24, 16)), jnp.bfloat16)
    tk = tp.to_tk(double_buffered, x, w)
    assert "scratch s0: f32[2, 8, 16]" in tk and "sem" not in tk and "cast %" in tk, tk
    # By hand: each row of x against each row of w, in f32 from w's bf16 values.
    want = x.astype(np.float64) @ np.asarray(w, np.float32).astype(np.float64).T
    np.testing.assert_allclose(np.asarray(double_buffered(x, w, interpret=True)), want, rtol=1e-5, atol=1e-5)
    for backend in backends():
        np.testing.assert_allclose(tp.run(double_buffered, x, w, backend=backend), want, rtol=1e-5, atol=1e-5, err_msg=backend)


def counted(c, x, interpret=False):
    """A TPU kernel keeping state in a scalar-prefetch operand (as JAX's TPU paged attention
    keeps its buffer index): each grid step adds the counter to its block, then counts up."""
    from jax.experimental.pallas import tpu as pltpu

    def body(c_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + c_ref[0].astype(jnp.float32)
        c_ref[0] = c_ref[0] + 1

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,), in_specs=[pl.BlockSpec((8,), lambda i, c: (i,))], out_specs=pl.BlockSpec((8,), lambda i, c: (i,))
    )
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=spec, interpret=interpret)(c, x)


def test_state_in_a_scalar_prefetch_operand_carries_from_step_to_step():
    c, x = np.array([10], np.int32), np.arange(32, dtype=np.float32)
    tk = tp.to_tk(counted, c, x)
    assert "grid (i0: 4 seq)" in tk and "scratch w0: i32[1]" in tk, tk
    # By hand: block i gets 10 + i, the steps running in order as on a TPU core.
    want = x + np.repeat(np.arange(10, 14), 8).astype(np.float32)
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        np.testing.assert_array_equal(np.asarray(jax.jit(counted)(c, x)), want)
    for backend in backends():
        np.testing.assert_array_equal(tp.run(counted, c, x, backend=backend), want, err_msg=backend)


def aliased_increment(x, interpret=False):
    """`o_ref[...] += 1` on an output aliased to the input: the load sees the input's values."""

    def body(x_ref, o_ref):
        o_ref[...] += 1.0

    spec = pl.BlockSpec((8,), lambda i: (i,))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
                          input_output_aliases={0: 0}, interpret=interpret)(x)


def narrow_composed(h, n, interpret=False):
    """`erfc` and `cbrt` of bf16 (computed in f32), `cbrt(-0.0)`, and bit counts of i8 and u16."""

    def body(h_ref, n_ref, u_ref, erfc_ref, cbrt_ref, pop_ref, clz_ref, upop_ref, uclz_ref):
        erfc_ref[...] = jax.lax.erfc(h_ref[...])
        cbrt_ref[...] = jnp.cbrt(h_ref[...])
        pop_ref[...] = jax.lax.population_count(n_ref[...])
        clz_ref[...] = jax.lax.clz(n_ref[...])
        upop_ref[...] = jax.lax.population_count(u_ref[...])
        uclz_ref[...] = jax.lax.clz(u_ref[...])

    u = n.astype(np.uint16) * 257
    s = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
    out = (s(h), s(h), s(n), s(n), s(u), s(u))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(h, n, u)


def test_review_edges_of_aliases_windows_and_composed_functions():
    # An aliased output read before it is written: x + 1, not 0 + 1.
    x = np.arange(16, dtype=np.float32)
    for backend in backends():
        np.testing.assert_array_equal(tp.run(aliased_increment, x, backend=backend), x + 1, err_msg=backend)
    # dynamic_update_slice at literal starts (folded, clamped) and a u32 start past the end.
    def windows(v, k, interpret=False):
        def body(v_ref, k_ref, a_ref, b_ref):
            upd = jnp.full((2, 4), -1.0, jnp.float32)
            a_ref[...] = jax.lax.dynamic_update_slice(v_ref[...], upd, (1, 30))
            b_ref[...] = jax.lax.dynamic_slice(v_ref[...], (k_ref[0], jnp.uint32(0)), (3, 16))

        out = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((3, 16), jnp.float32))
        return pl.pallas_call(body, out_shape=out, interpret=interpret)(v, k)

    v = np.arange(128, dtype=np.float32).reshape(8, 16)
    k = np.array([4_000_000_000], np.uint32)
    a = v.copy()
    a[1:3, 12:16] = -1.0
    for backend in backends():
        got = tp.run(windows, v, k, backend=backend)
        np.testing.assert_array_equal(got[0], a, err_msg=backend)
        np.testing.assert_array_equal(got[1], v[5:8], err_msg=backend)  # clamped to the end, as JAX does
    want = [np.asarray(w) for w in windows(v, k, interpret=True)]
    np.testing.assert_array_equal(want[1], v[5:8])
    # Narrow dtypes of the composed functions.
    h = jnp.asarray([[-0.0, 0.0, 8.0, -27.0, 1.5, -2.5, 3.0, 0.25]], jnp.bfloat16)
    n = np.array([[0, -1, 1, 127, -128, 64, 3, -2]], np.int8)
    want = [np.asarray(w) for w in narrow_composed(h, n, interpret=True)]
    for backend in backends():
        got = tp.run(narrow_composed, h, n, backend=backend)
        np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32), rtol=1e-2, err_msg=backend)
        np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32), rtol=1e-2, err_msg=backend)
        assert np.signbit(np.asarray(got[1], np.float32)[0, 0]), "cbrt(-0.0) is -0.0"
        for g, w in zip(got[2:], want[2:]):
            np.testing.assert_array_equal(g, w, err_msg=backend)


def recurrence(x, a, interpret=False):
    """`lax.scan` over a block's rows, as linear-attention and state-space kernels write their
    recurrences: `h_t = a * h_{t-1} + x_t`, every `h_t` stacked, and the same scanned in reverse."""

    def body(x_ref, a_ref, h_ref, back_ref, last_ref):
        a = a_ref[...]

        def step(h, x_t):
            h = a * h + x_t
            return h, h

        last, hs = jax.lax.scan(step, jnp.zeros(x_ref.shape[1:], jnp.float32), x_ref[...])
        h_ref[...] = hs
        last_ref[...] = last[None]
        _, back = jax.lax.scan(step, jnp.zeros(x_ref.shape[1:], jnp.float32), x_ref[...], reverse=True)
        back_ref[...] = back

    r, c = x.shape
    out = (jax.ShapeDtypeStruct((r, c), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((1, c), jnp.float32),)
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, a)


def test_a_scan_over_rows_is_a_recurrence_as_jax_runs_it():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((12, 16)).astype(np.float32)
    a = (rng.random(16) * 0.9).astype(np.float32)
    # By hand, in f64: the forward and backward recurrences.
    h, fwd = np.zeros(16), []
    for t in range(12):
        h = a * h + x[t]
        fwd.append(h)
    h, bwd = np.zeros(16), [None] * 12
    for t in reversed(range(12)):
        h = a * h + x[t]
        bwd[t] = h
    want = [np.array(fwd), np.array(bwd), np.array(fwd[-1])[None]]
    pallas = [np.asarray(w) for w in recurrence(x, a, interpret=True)]
    for backend in backends():
        got = tp.run(recurrence, x, a, backend=backend)
        for g, w, p in zip(got, want, pallas):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=backend)
            np.testing.assert_allclose(g, p, rtol=1e-6, atol=1e-6, err_msg=backend)


def heads_dot(q, k, interpret=False):
    """`einsum('bhqd,bhkd->bhqk')`: a dot batched over two leading dimensions (batch and heads)."""

    def body(q_ref, k_ref, o_ref):
        o_ref[...] = jnp.einsum("bhqd,bhkd->bhqk", q_ref[...], k_ref[...], preferred_element_type=jnp.float32)

    b, h, s, _ = q.shape
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((b, h, s, k.shape[2]), jnp.float32), interpret=interpret)(q, k)


def test_a_dot_batched_over_batch_and_heads_matches_numpy():
    rng = np.random.default_rng(13)
    q, k = rng.standard_normal((2, 3, 8, 16)).astype(np.float32), rng.standard_normal((2, 3, 12, 16)).astype(np.float32)
    want = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64))
    np.testing.assert_allclose(np.asarray(heads_dot(q, k, interpret=True)), want, rtol=1e-5, atol=1e-5)
    for backend in backends():
        np.testing.assert_allclose(tp.run(heads_dot, q, k, backend=backend), want, rtol=1e-5, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_nextafter_steps_the_bits_as_c_does(dtype):
    """`jnp.nextafter` on every pair of special values (zeros of both signs, ±1, infinities, NaN,
    the smallest subnormals, the largest and smallest normals) against numpy's C `nextafter`, bit
    for bit (NaN as any NaN). numpy's float16 version gives `x` where `x == y` (`0.0` towards
    `-0.0`); C, XLA and tessel give `y`, which is what is expected there."""
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    fin = ml_dtypes.finfo(dt)
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -7.0]
    specials += [float(v) * s for v in (fin.smallest_subnormal, fin.max, fin.tiny) for s in (1, -1)]
    specials = np.array(specials, np.float32).astype(dt)
    x, y = np.repeat(specials, len(specials)), np.tile(specials, len(specials))

    def kernel(x, y, interpret=False):
        def body(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.nextafter(x_ref[...], y_ref[...])

        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x, y)

    with np.errstate(over="ignore"):  # the largest float towards infinity is infinity
        want = np.where(x == y, y, np.nextafter(x, y)).astype(dt)
    bits = np.uint32 if dt.itemsize == 4 else np.uint16
    for backend in backends():
        got = np.asarray(tp.run(kernel, x, y, backend=backend))
        same = (got.view(bits) == want.view(bits)) | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
        assert same.all(), (backend, list(zip(x[~same], y[~same], got[~same], want[~same])))


def rolled(s, x, interpret=False):
    """Pallas TPU's `roll` by a static shift, by a shift from data (SMEM), and strided (each row
    by 3 + 2i), and `jnp.roll` by a negative shift."""
    from jax.experimental.pallas import tpu as pltpu

    def body(s_ref, x_ref, a_ref, b_ref, c_ref, d_ref):
        v = x_ref[...]
        a_ref[...] = pltpu.roll(v, 5, 1)
        b_ref[...] = pltpu.roll(v, s_ref[0], 1)
        c_ref[...] = pltpu.roll(v, 3, 1, stride=2, stride_axis=0)
        d_ref[...] = jnp.roll(v, -9, axis=1)

    out = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for _ in range(4))
    return pl.pallas_call(body, out_shape=out, in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec()],
                          interpret=interpret)(s, x)


@pytest.mark.parametrize("shift", [37, -3, 300], ids=["37", "negative", "past_the_length"])
def test_roll_rotates_as_pallas_on_tpu(shift):
    """Bit for bit as Pallas's interpret mode, and by hand with numpy's `roll`: a shift from data
    is taken modulo the length (so -3 is 125 and 300 is 44 along 128) and rolled by its bits."""
    x, s = f32(8, 128), np.array([shift], np.int32)
    want = [np.asarray(w) for w in rolled(s, x, interpret=True)]
    by_hand = [np.roll(x, 5, 1), np.roll(x, shift, 1), np.stack([np.roll(r, 3 + 2 * i) for i, r in enumerate(x)]), np.roll(x, -9, 1)]
    for w, h in zip(want, by_hand):
        np.testing.assert_array_equal(w, h)
    for backend in backends():
        for n, (g, w) in enumerate(zip(tp.run(rolled, s, x, backend=backend), want)):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"output {n} on {backend}")
