"""JAX's tests of its Mosaic GPU ops, ported: `tests/pallas/mgpu_matmul_test.py`,
`mgpu_ragged_dot_test.py` and `mgpu_attention_test.py`'s flash attention cases (the Hopper ones;
the Blackwell ones need `tcgen05_mma`/TMEM), each op unchanged inside `jax.jit` on tessel's
interpreter.

What differs from JAX's files, and why:
- **Sizes.** JAX runs 4096-sized problems on an H100; the interpreter runs on two cores, so each
  case runs the smallest problem that still gives every grid dimension several blocks and every
  pipeline several steps (the tile settings, which are what the cases vary, are JAX's).
- **Which cases.** Every parameter grid is JAX's. By default a covering subset runs: every pair of
  values of any two parameters appears in some case (`pairwise`); `TESSEL_PORT_FULL=1` runs the
  whole product. JAX's skips for shared-memory size are a Hopper limit, not the op's, and are not
  kept; its skips for what the op itself does not support are.
- **Reference.** JAX's own reference functions (`jnp.dot`, `jax.lax.ragged_dot`,
  `attention_reference`), within JAX's tolerances or two units in the last place of f16.
On the CPU the ops read an SM count and a CUDA version from a device that is not there: the tests
give them (`test_pallas_mosaic_gpu.cores`, `cuda_version`), never the ops."""

import itertools
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import tessel
from tessel import pallas as tp

from pallas_common import needs_mpmd
from test_pallas_mosaic_gpu import am, close, hm, rd, traced, trd

pytestmark = needs_mpmd

FULL = os.environ.get("TESSEL_PORT_FULL") == "1"


def pairwise(grid):
    """The cases of `grid` (name -> values) to run: all of them with TESSEL_PORT_FULL=1, else a
    greedy covering array: cases chosen until every pair of values of any two parameters is in
    one (deterministic: the first best case in product order)."""
    names = list(grid)
    cases = [dict(zip(names, c)) for c in itertools.product(*grid.values())]
    if FULL:
        return cases
    pairs = lambda c: {(a, c[a], b, c[b]) for a, b in itertools.combinations(names, 2)}  # noqa: E731
    uncovered = set().union(*(pairs(c) for c in cases))
    chosen = []
    while uncovered:
        best = max(cases, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def ids(cases):
    return ["-".join(f"{k}={getattr(v, 'name', v)}" for k, v in c.items()) for c in cases]


@pytest.fixture
def cuda_version(monkeypatch):
    """The CUDA runtime version attention reads (12.9.1: causal masking allowed)."""
    import types
    monkeypatch.setattr(am, "cuda_versions", types.SimpleNamespace(cuda_runtime_get_version=lambda: 12091))


def normal(key, shape, dtype=jnp.float16):
    return np.asarray(jax.random.normal(key, shape, dtype))


# --- mgpu_matmul_test.py: MatrixMultiplicationSm100ATest (its Hopper cases) ---

MATMUL = pairwise(dict(
    tile_m=(64, 128), tile_n=(64, 128), tile_k=(64, 128), max_concurrent_steps=(2, 4),
    epi_tile_n=(None, 64), epi_tile_m=(None, 64), wg_dimension=tuple(hm.MatmulDimension)))


def check_hopper_matmul(monkeypatch, m, n, k, tile_m, tile_n, tile_k, max_concurrent_steps, epi_tile_m, epi_tile_n,
                        wg_dimension, **kwargs):
    k1, k2 = jax.random.split(jax.random.key(42), 2)
    a, b = normal(k1, (m, k)), normal(k2, (k, n))
    spec = hm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, max_concurrent_steps=max_concurrent_steps,
                           epi_tile_m=epi_tile_m, epi_tile_n=epi_tile_n, wg_dimension=wg_dimension, **kwargs)
    out = tp.run(traced(monkeypatch, lambda a, b: hm.matmul(a, b, None, spec)), a, b, backend="interpret")
    # JAX's F16_F16_F32 precision (f16 operands, f32 accumulation), which XLA's CPU backend
    # does not take by name.
    out_ref = jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.float16)
    close(out, out_ref, np.float16, "hopper_matmul_mgpu")


def cta_tiles(tile_m, tile_n, wg_dimension):
    return (tile_m * (1 + (wg_dimension == hm.MatmulDimension.M)), tile_n * (1 + (wg_dimension == hm.MatmulDimension.N)))


@pytest.mark.parametrize("case", MATMUL, ids=ids(MATMUL))
def test_hopper_matmul(monkeypatch, case):
    # Two CTA tiles each way, two rounds of the pipeline's stages.
    cta_m, cta_n = cta_tiles(case["tile_m"], case["tile_n"], case["wg_dimension"])
    k = 2 * case["tile_k"] * case["max_concurrent_steps"]
    check_hopper_matmul(monkeypatch, 2 * cta_m, 2 * cta_n, k, **case)


GRID_TILING = [dict(grid_minor_dim=d, grid_tile_width=w) for d in hm.MatmulDimension for w in (1, 3, 4)]


@pytest.mark.parametrize("case", GRID_TILING, ids=ids(GRID_TILING))
def test_hopper_matmul_grid_tiling(monkeypatch, case):
    # 4 x 8 CTA tiles, so that tiles of width 3 and 4 leave a partial one.
    check_hopper_matmul(monkeypatch, 512, 512, 128, tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                        epi_tile_m=64, epi_tile_n=64, wg_dimension=hm.MatmulDimension.M, **case)


CLUSTER = pairwise(dict(tile_m=(64, 128), tile_n=(64, 128), wg_dimension=tuple(hm.MatmulDimension),
                        cluster_dimension=tuple(hm.MatmulDimension)))


@pytest.mark.parametrize("case", CLUSTER, ids=ids(CLUSTER))
def test_hopper_matmul_cluster(monkeypatch, case):
    # A cluster's blocks share their operands through multicast copies and a `ClusterBarrier`,
    # which tessel does not translate: refused by name, with the op's line.
    cta_m, cta_n = cta_tiles(case["tile_m"], case["tile_n"], case["wg_dimension"])
    with pytest.raises(tessel.UnsupportedError, match=r"plgpu\.ClusterBarrier.*has no tessel translation"):
        check_hopper_matmul(monkeypatch, 4 * cta_m, 4 * cta_n, 4 * 64, tile_k=64, max_concurrent_steps=4, epi_tile_m=64,
                            epi_tile_n=64, **case)


# --- mgpu_ragged_dot_test.py: RaggedDotTestCase ---

def sample_inputs(key, m, k, n, num_groups, dtype=jnp.float16, transposed=False):
    """JAX's own: random group boundaries over the ragged dimension."""
    kx, ky, kz = jax.random.split(key, num=3)
    if transposed:
        lhs, rhs, batch_size = jax.random.normal(kx, (k, m), dtype), jax.random.normal(ky, (k, n), dtype), k
    else:
        lhs, rhs, batch_size = jax.random.normal(kx, (m, k), dtype), jax.random.normal(ky, (num_groups, k, n), dtype), m
    bounds = jax.lax.sort(jax.random.randint(kz, (num_groups - 1,), 0, batch_size, jnp.int32))
    starts = jnp.concatenate([jnp.array([0], jnp.int32), bounds])
    ends = jnp.concatenate([bounds, jnp.array([batch_size], jnp.int32)])
    return np.asarray(lhs), np.asarray(rhs), np.asarray(ends - starts)


RAGGED = pairwise(dict(block_m=(64, 128), block_n=(64, 128, 192), block_k=(64, 128), grid_block_n=(2, 4),
                       max_concurrent_steps=(2, 4), num_groups=(1, 3, 16), transpose_rhs=(False, True)))


def ragged_dot(monkeypatch, case, k):
    m, n = 4 * case["block_m"], case["block_n"] * case["grid_block_n"]
    lhs, rhs, group_sizes = sample_inputs(jax.random.key(1234), m, k, n, case["num_groups"])
    kwargs = {key: v for key, v in case.items() if key != "num_groups"}
    op = traced(monkeypatch, lambda l, r, g: rd.ragged_dot(l, r, group_sizes=g, **kwargs))
    out = tp.run(op, lhs, np.transpose(rhs, (0, 2, 1)).copy() if case["transpose_rhs"] else rhs, group_sizes, backend="interpret")
    return out, jax.lax.ragged_dot(lhs, rhs, group_sizes=group_sizes)


@pytest.mark.parametrize("case", RAGGED, ids=ids(RAGGED))
def test_ragged_dot(monkeypatch, case):
    """JAX's `ragged_dot_mgpu` issues each step's `wgmma` without waiting for it (its pipeline's
    operands have `delay_release=1`), and the pipeline refills the previous step's stage after
    the body: while that step's `wgmma` may still read it, since nothing waited for it
    (`hopper_matmul_mgpu`, with the same `delay_release`, calls `plgpu.wgmma_wait(1)`). So where
    the pipeline refills a stage at all (more `k` steps than stages, as in every case of JAX's
    test: k = 2048), tessel's interpreter reports the data race, naming the copy and the product;
    where it does not (as many steps as stages), the op equals `jax.lax.ragged_dot`."""
    steps = case["max_concurrent_steps"]
    out, out_ref = ragged_dot(monkeypatch, case, case["block_k"] * steps)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(out_ref, np.float32), atol=1e-3, rtol=1e-3)
    with pytest.raises(Exception, match="data race") as e:
        ragged_dot(monkeypatch, case, 2 * case["block_k"] * steps)
    assert "copy_async" in str(e.value) and "mma_async" in str(e.value), str(e.value)


RAGGED_T = pairwise(dict(block_m=(64, 128), block_n=(64, 128), block_k=(64, 128), grid_block_n=(2, 4),
                         max_concurrent_steps=(1, 2, 4)))


@pytest.mark.parametrize("case", RAGGED_T, ids=ids(RAGGED_T))
def test_ragged_dot_transposed(monkeypatch, case):
    # JAX skips this case on its CI ("has broken in CI"); tessel runs it.
    k, m, n, num_groups = 4 * case["block_k"], case["block_m"] * 2, case["block_n"] * case["grid_block_n"], 16
    lhs, rhs, group_sizes = sample_inputs(jax.random.key(1234), m, k, n, num_groups, transposed=True)
    op = traced(monkeypatch, lambda l, r, g: trd.transposed_ragged_dot(l, r, group_sizes=g, **case))
    with jax.numpy_dtype_promotion("standard"):
        out = tp.run(op, lhs, rhs, group_sizes, backend="interpret")
    out_ref = jax.lax.ragged_dot_general(
        lhs, rhs, group_sizes, ragged_dot_dimension_numbers=jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]))
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(out_ref, np.float32), atol=1e-3, rtol=1e-3)


# --- mgpu_attention_test.py: FlashAttentionTestCase ---

FLASH = [c for c in pairwise(dict(
    batch_size=(1, 4), num_q_and_kv_heads=((4, 1), (6, 3), (4, 4)), head_dim=(64, 128, 256),
    blocks=((64, 64), (64, 128), (128, 64)), attention_impl=("attention", "attention_with_pipeline_emitter"),
    causal=(True, False)))
    # JAX's own skips: what the op does not support.
    if not (c["causal"] and c["attention_impl"] == "attention_with_pipeline_emitter")
    and not (c["head_dim"] >= 256 and max(c["blocks"]) >= 128)]


@pytest.mark.parametrize("case", FLASH, ids=ids(FLASH))
def test_flash_attention(monkeypatch, cuda_version, case):
    # Two query blocks and two key blocks a head (JAX's 4096-long sequences on the GPU).
    block_q, block_kv = case["blocks"]
    q_seq_len, kv_seq_len = 2 * block_q, 2 * block_kv
    num_q_heads, num_kv_heads = case["num_q_and_kv_heads"]
    batch_size, head_dim, causal = case["batch_size"], case["head_dim"], case["causal"]
    k1, k2, k3 = jax.random.split(jax.random.key(42), 3)
    q = normal(k1, (batch_size, q_seq_len, num_q_heads, head_dim))
    k = normal(k2, (batch_size, kv_seq_len, num_kv_heads, head_dim))
    v = normal(k3, (batch_size, kv_seq_len, num_kv_heads, head_dim))
    impl = getattr(am, case["attention_impl"])
    config = am.TuningConfig(block_q=block_q, block_kv=block_kv, max_concurrent_steps=2, causal=causal)
    out, (lse,) = tp.run(traced(monkeypatch, lambda q, k, v: impl(q, k, v, config, save_residuals=True)), q, k, v,
                         backend="interpret")
    out_ref, (lse_ref,) = am.attention_reference(q, k, v, causal=causal, save_residuals=True)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(out_ref, np.float32), atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(lse, lse_ref, atol=2e-3, rtol=1e-3)


BWD = pairwise(dict(seq_lens=((128, 128), (128, 256)), num_q_and_kv_heads=((4, 4), (4, 1), (6, 3)),
                    bwd_blocks=((64, 64, 64, 64), (64, 128, 128, 64), (128, 128, 128, 128)), head_dim=(64, 128, 256)))


@pytest.mark.parametrize("case", BWD, ids=ids(BWD))
def test_bwd_flash_attention(monkeypatch, cuda_version, case):
    # JAX's seq_lens (512, 512) and (3584, 4096) become (128, 128) and (128, 256), twice that with
    # blocks of 128 (whole blocks for each compute warpgroup): a query length shorter than the
    # keys', as in JAX's second case; batch 1 (JAX's 3: the interpreter's time).
    num_q_heads, num_kv_heads = case["num_q_and_kv_heads"]
    scale = max(case["bwd_blocks"]) // 64
    kv_seq_len, q_seq_len = (n * scale for n in case["seq_lens"])
    block_q_dq, block_kv_dq, block_q_dkv, block_kv_dkv = case["bwd_blocks"]
    head_dim = case["head_dim"]
    compute_wgs = 2 if head_dim <= 128 else 1
    k1, k2, k3 = jax.random.split(jax.random.key(42), 3)
    q = normal(k1, (1, q_seq_len, num_q_heads, head_dim))
    k = normal(k2, (1, kv_seq_len, num_kv_heads, head_dim))
    v = normal(k3, (1, kv_seq_len, num_kv_heads, head_dim))
    config = am.TuningConfig(block_q=block_q_dq, block_kv=block_kv_dq, max_concurrent_steps=2, compute_wgs_bwd=compute_wgs,
                             block_q_dkv=block_q_dkv, block_kv_dkv=block_kv_dkv, block_q_dq=block_q_dq, block_kv_dq=block_kv_dq)

    def f(q, k, v):
        return am.attention(q, k, v, config).astype(jnp.float32).sum()

    def f_ref(q, k, v):
        return am.attention_reference(q, k, v).astype(jnp.float32).sum()

    dq, dk, dv = tp.run(traced(monkeypatch, jax.grad(f, argnums=(0, 1, 2))), q, k, v, backend="interpret")
    dq_ref, dk_ref, dv_ref = jax.grad(f_ref, argnums=(0, 1, 2))(q, k, v)
    for name, got, want, atol in (("dq", dq, dq_ref, 7e-2), ("dk", dk, dk_ref, 7e-2), ("dv", dv, dv_ref, 5e-2)):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol, rtol=0, err_msg=name)
