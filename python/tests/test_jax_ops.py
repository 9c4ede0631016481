"""JAX's own Pallas ops (`jax.experimental.pallas.ops`), unchanged, inside `jax.jit` and under
`grad` on tessel through `tessel.pallas.installed`: GPU softmax, attention (plain, causal, with
segment ids, and its gradient), layer and RMS norm with their gradients, decode and paged
attention; TPU matmul, example kernel, megablox's grouped matmul, paged and ragged paged attention, splash attention and its
gradient, the threefry PRNG, flash attention and its
gradient. Each against the op's own reference function."""

import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessel.jax as tj  # noqa: E402
from tessel import pallas as tp  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from pallas_common import backends  # noqa: E402

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def launches(backend):
    return tj.stats()["launches"].get(backend, 0)


def _tpu_flash_sizes(fa):
    """Blocks of 128 for every pass of JAX's TPU flash attention (its minimum)."""
    return fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1, block_q_major_dkv=128, block_k_major_dkv=128,
                         block_k_dkv=128, block_q_dkv=128, block_k_major_dq=128, block_k_dq=128, block_q_dq=128)



def _mha_inputs(batch=1, seq=128, heads=2, dim=64):
    return [RNG.standard_normal((batch, seq, heads, dim)).astype(np.float32) * 0.5 for _ in range(3)]


def test_jaxs_softmax_op():
    from jax.experimental.pallas.ops.gpu import softmax

    x = f32(64, 256)
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(softmax.softmax)(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=1e-5, atol=1e-7, err_msg=backend)


@pytest.mark.parametrize("variant", ["plain", "causal", "segment_ids"])
def test_jaxs_attention_op(variant):
    from jax.experimental.pallas.ops.gpu import attention

    q, k, v = _mha_inputs()
    seg = jnp.asarray(np.repeat([0, 1], 64)[None], jnp.int32) if variant == "segment_ids" else None
    causal = variant == "causal"
    want = np.asarray(attention.mha_reference(q, k, v, segment_ids=seg, causal=causal))
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            got = jax.block_until_ready(jax.jit(lambda q, k, v: attention.mha(q, k, v, segment_ids=seg, causal=causal))(q, k, v))
        assert launches(backend) == before + 1, backend
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5, err_msg=f"{variant} on {backend}")


def test_jaxs_attention_op_under_grad():
    from jax.experimental.pallas.ops.gpu import attention

    q, k, v = _mha_inputs()

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v, segment_ids=None, causal=True) ** 2)

    want = jax.grad(loss(attention.mha_reference), argnums=(0, 1, 2))(q, k, v)
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            got = jax.block_until_ready(jax.jit(jax.grad(loss(attention.mha), argnums=(0, 1, 2)))(q, k, v))
        assert launches(backend) >= before + 2, backend  # the forward kernel and the backward's
        for g, w, n in zip(got, want, "qkv"):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-4, err_msg=f"d{n} on {backend}")


def test_jaxs_tpu_matmul_and_example_kernel():
    from jax.experimental.pallas.ops.tpu import example_kernel, matmul

    a, b = f32(512, 256), f32(256, 384)
    x = f32(8, 128)
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda a, b: matmul.matmul(a, b, block_shape=(128, 128)))(a, b)
            doubled_ = jax.jit(example_kernel.double)(x)
        np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4, err_msg=backend)
        np.testing.assert_array_equal(np.asarray(doubled_), x * 2, err_msg=backend)


def test_jaxs_megablox_grouped_matmul_and_its_gradient():
    """JAX's megablox `gmm` (mixture-of-experts' grouped matmul), unchanged, under `jit` and
    `grad`: its grid has a dynamic bound (the count of active tiles, `dyn(g0)`), its index maps
    read the group metadata it prefetches (`at (x2[i1], i2)`), its body accumulates under a
    `lax.cond`, and its backward pass is a second kernel (`tgmm`) of the same kind. The expected
    values are numpy's, in float64, group by group."""
    import importlib

    ops = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.ops")
    m, k, n, sizes = 256, 128, 128, [96, 32, 128]
    lhs, rhs = f32(m, k), f32(len(sizes), k, n)
    group_sizes = jnp.asarray(np.array(sizes, dtype=np.int32))
    starts = np.cumsum([0] + sizes[:-1])
    l64, r64 = lhs.astype(np.float64), rhs.astype(np.float64)
    out = np.concatenate([l64[a:a + s] @ r64[g] for g, (a, s) in enumerate(zip(starts, sizes))])
    # loss = sum(out ** 2): d/dout = 2 out; d/dlhs = 2 out_g rhs_gᵀ; d/drhs_g = lhs_gᵀ 2 out_g.
    dlhs = np.concatenate([2 * out[a:a + s] @ r64[g].T for g, (a, s) in enumerate(zip(starts, sizes))])
    drhs = np.stack([l64[a:a + s].T @ (2 * out[a:a + s]) for a, s in zip(starts, sizes)])

    def loss(a, b):
        return jnp.sum(ops.gmm(a, b, group_sizes, jnp.float32, (64, 64, 64)) ** 2)

    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda a, b: ops.gmm(a, b, group_sizes, jnp.float32, (64, 64, 64)))(lhs, rhs)
            grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
        np.testing.assert_allclose(np.asarray(got), out, rtol=1e-4, atol=1e-4, err_msg=backend)
        for g, w, name in zip(grads, (dlhs, drhs), ("dlhs", "drhs")):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-3 * np.abs(w).max(), err_msg=f"{name} on {backend}")


def test_jaxs_megablox_writes_into_an_existing_output():
    """Megablox with `existing_out` (an MoE layer adding into a buffer): `input_output_aliases`
    on a dynamic grid, the existing output read at a tile's first visit only, after stores of
    other visits; the input stays an input, and the output starts from it. `gmm` against Pallas's
    interpret mode, `tgmm` (which adds into it) against numpy in float64."""
    import importlib

    gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
    m, k, n, sizes = 256, 128, 128, [96, 32, 128]
    lhs, rhs, existing = f32(m, k), f32(len(sizes), k, n), f32(m, n)
    group_sizes = jnp.asarray(np.array(sizes, dtype=np.int32))
    starts = np.cumsum([0] + sizes[:-1])
    fwd = lambda interpret: jax.jit(lambda a, b, e: gmm.gmm(a, b, group_sizes, jnp.float32, (64, 64, 64), existing_out=e,  # noqa: E731
                                                           interpret=interpret))
    want = np.asarray(fwd(True)(lhs, rhs, existing))
    want_t = np.stack([lhs[a:a + s].T.astype(np.float64) @ existing[a:a + s] for a, s in zip(starts, sizes)]) + rhs
    for backend in backends():
        with tp.installed(backend=backend):
            got = fwd(False)(lhs, rhs, existing)
            got_t = jax.jit(lambda a, c, e: gmm.tgmm(a.T, c, group_sizes, jnp.float32, (64, 64, 64), existing_out=e))(lhs, existing, rhs)
        # Sums of 128 products in another order than XLA's on wgpu: a few ulps apart.
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4, err_msg=backend)
        np.testing.assert_allclose(np.asarray(got_t), want_t, rtol=1e-4, atol=1e-4, err_msg=backend)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_jaxs_normalizations_and_their_gradients(op):
    """JAX's GPU layer norm and RMS norm, unchanged, inside `jit` and under `grad`: Triton-style
    kernels whose masked loads index refs by runs broadcast as rows and columns
    (`x_ref.at[rows[:, None], cols[None]]`, made outside the `fori_loop` that reads them), and
    whose backward pass is two more kernels; against the ops' references."""
    import importlib

    mod = importlib.import_module(f"jax.experimental.pallas.ops.gpu.{op}")
    f, ref = getattr(mod, op), getattr(mod, f"{op}_reference")
    x, w, b = (jnp.asarray(a) for a in (f32(4, 16, 256), f32(256), f32(256)))

    def loss(g):
        return lambda x, w, b: jnp.sum(g(x, w, b) ** 2)

    want, want_grads = np.asarray(ref(x, w, b)), jax.grad(loss(ref), argnums=(0, 1, 2))(x, w, b)
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(f)(x, w, b)
            grads = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(x, w, b)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=f"{op} on {backend}")
        for g, w_, name in zip(grads, want_grads, ("dx", "dw", "db")):
            w_ = np.asarray(w_)
            np.testing.assert_allclose(np.asarray(g), w_, rtol=1e-4, atol=1e-5 * np.abs(w_).max(), err_msg=f"{name} of {op} on {backend}")


def test_jaxs_decode_attention_ops():
    """JAX's GPU decode attention, unchanged, inside `jit`: `mqa` (vmapped over the batch, split
    over `k_splits` kernels' programs whose results JAX combines), with ragged `start_idx` and
    `kv_seq_len` (a `lax.cond` returning values skips an empty split, a `fori_loop` runs to a
    bound from the data), and grouped-query `gqa`; against the op's own references."""
    import importlib

    da = importlib.import_module("jax.experimental.pallas.ops.gpu.decode_attention")
    q, k, v = (jnp.asarray(a) for a in (f32(2, 16, 64), f32(2, 512, 64), f32(2, 512, 64)))
    starts, lens = jnp.asarray(np.array([0, 100], np.int32)), jnp.asarray(np.array([512, 300], np.int32))
    qg, kg, vg = (jnp.asarray(a) for a in (f32(2, 16, 64), f32(2, 512, 4, 64), f32(2, 512, 4, 64)))
    cases = [
        ("mqa", lambda: da.mqa(q, k, v, block_h=16, block_k=128, k_splits=4), lambda: da.mqa_reference(q, k, v)),
        ("ragged", lambda: da.mqa(q, k, v, starts, lens, block_h=16, block_k=128, k_splits=4),
         lambda: da.mqa_reference(q, k, v, starts, lens)),
        ("gqa", lambda: da.gqa(qg, kg, vg, block_h=16, block_k=128, k_splits=4), lambda: da.gqa_reference(qg, kg, vg)),
    ]
    for backend in backends():
        for name, fn, ref in cases:
            with tp.installed(backend=backend):
                got = jax.jit(fn)()
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref()), rtol=1e-4, atol=1e-5, err_msg=f"{name} on {backend}")


def test_jaxs_paged_attention_gathers_pages_by_the_block_table():
    """JAX's GPU paged attention, unchanged, inside `jit`: each step gathers the pages its block
    table lists (`k_pages_ref[block_tables]`, a load per entry put together with `concatenate`)
    and masks past each sequence's length; against the op's reference on the pages laid out in
    table order by numpy."""
    import importlib

    pa = importlib.import_module("jax.experimental.pallas.ops.gpu.paged_attention")
    batch, heads, head_dim, kv_heads, pages, page = 2, 16, 32, 2, 8, 8
    q = jnp.asarray(f32(batch, heads, head_dim))
    k_pages, v_pages = (jnp.asarray(f32(kv_heads, pages, page, head_dim)) for _ in range(2))
    table = np.random.default_rng(7).permutation(pages).reshape(batch, pages // batch).astype(np.int32)
    lengths = np.array([32, 19], dtype=np.int32)

    def in_order(p):  # [kv_heads, pages, page, d] -> [batch, seq, kv_heads, d], pages in table order
        return np.moveaxis(np.asarray(p)[:, table].reshape(kv_heads, batch, -1, head_dim), 0, 2)

    want = np.asarray(pa.paged_attention_reference(q, in_order(k_pages), in_order(v_pages), jnp.asarray(lengths)))
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda: pa.paged_attention(q, k_pages, v_pages, jnp.asarray(table), jnp.asarray(lengths), block_h=16,
                                                     pages_per_compute_block=2, k_splits=2))()
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("inline", [True, False], ids=["inline_seq_dim", "seq_axis"])
def test_jaxs_tpu_paged_attention_reads_back_its_padded_running_max(inline):
    """JAX's TPU paged attention, unchanged, inside `jit`: pages copied by DMA into double
    buffers at indices a written scalar-prefetch operand keeps, and its running max and sum kept
    in outputs of width 1 whose blocks are the head dimension wide, read back past the array (as
    Pallas on TPU keeps the whole block in VMEM). Against numpy on the pages in table order; the
    kernel takes its pages to bfloat16 before the products, so the expected values do too."""
    import ml_dtypes
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(3)
    batch, heads, d, page, per_seq, total = 2, 8, 128, 16, 4, 16
    q = f32(batch, heads, d)
    k, v = f32(1, total, page, d), f32(1, total, page, d)
    table = rng.permutation(total)[: batch * per_seq].reshape(batch, per_seq).astype(np.int32)
    lengths = np.array([37, 64], np.int32)
    want = np.zeros_like(q)
    for b in range(batch):
        kk, vv = (np.asarray(p.astype(ml_dtypes.bfloat16), np.float32)[0][table[b]].reshape(-1, d)[: lengths[b]] for p in (k, v))
        s = q[b].astype(np.float64) @ kk.T
        e = np.exp(s - s.max(-1, keepdims=True))
        want[b] = (e / e.sum(-1, keepdims=True)) @ vv
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda *a: paged_attention(*a, pages_per_compute_block=2, inline_seq_dim=inline))(q, k, v, lengths, table)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=2e-5, err_msg=backend)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jaxs_tpu_ragged_paged_attention_mixes_prefill_and_decode(dtype):
    """JAX's TPU ragged paged attention (vLLM's TPU attention), unchanged, inside `jit`: three
    sequences of 3, 5 and 1 queries (a decode step among prefills) over 20, 13 and 7 keys in
    pages of 16, a dynamic sequence count, nested data-dependent `while` loops, pages copied by
    DMA into double buffers, K and V read interleaved from one buffer through a reshaped ref at
    strided rows, and in bfloat16 through a bitcast ref (two rows packed into one u32). float32
    against the op's own reference; bfloat16 against that reference in float32 on the same
    (bfloat16) inputs, within half a bfloat16 ulp of the largest output and a little."""
    import ml_dtypes
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    rng = np.random.default_rng(5)
    heads, kv_heads, d, page, per_seq, total = 8, 2, 128, 16, 4, 16
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    q = f32(9, heads, d).astype(dt)
    kv = f32(total, page, 2 * kv_heads, d).astype(dt)
    kv_lens = np.array([20, 13, 7, 0], np.int32)
    pages = rng.permutation(total).reshape(4, per_seq).astype(np.int32)
    cu = np.array([0, 3, 8, 9, 9], np.int32)
    seqs = np.array([3], np.int32)
    args = (q, kv, kv_lens, pages, cu, seqs)
    want = np.asarray(rpa.ref_ragged_paged_attention(*(a.astype(np.float32) if a.dtype == dt else a for a in args)))
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda *a: rpa.ragged_paged_attention(*a, num_kv_pages_per_block=2, num_queries_per_block=4))(*args)
        got = np.asarray(got).astype(np.float32)
        if dtype == "float32":
            np.testing.assert_allclose(got, np.asarray(rpa.ref_ragged_paged_attention(*args)), rtol=1e-4, atol=2e-5, err_msg=backend)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-8 * np.abs(want).max() + 1e-3, err_msg=backend)


def test_jaxs_tpu_splash_attention_and_its_gradient():
    """JAX's TPU splash attention (MaxText's), unchanged, inside `jit` and under `jax.grad`: a
    causal head and a sliding-window head (block-sparse: the mask's block tables, prefetched as
    int8, skip the empty blocks and pick partial ones), forward and both backward kernels.
    Its running max, sum and accumulator are outputs with a constant index map (TPU scratch kept
    across the grid): every program writes them, so the query-block axis runs in order, as on
    TPU (run in parallel, the programs raced and the result changed from run to run). Against
    the dense masked attention in jnp and its gradient."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    for backend in backends():
        # Shorter on wgpu: one lavapipe invocation stops every loop after 65,535 iterations,
        # and the query blocks running in order put 4 x 4 blocks of work in one (refused).
        heads, seq, d = 2, 512 if backend == "interpret" else 256, 128
        q, k, v, g = (jnp.asarray(f32(heads, seq, d)) for _ in range(4))
        masks = [sm.CausalMask((seq, seq)), sm.LocalMask((seq, seq), window_size=(128, 0), offset=0)]
        dense = np.stack([np.asarray(m[:, :]) for m in masks])
        sizes = sk.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128, block_kv_dkv=128,
                              block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
        splash = sk.make_splash_mha(sm.MultiHeadMask(masks), block_sizes=sizes, head_shards=1, q_seq_shards=1)

        def reference(q, k, v):
            s = jnp.where(dense, jnp.einsum("hqd,hkd->hqk", q, k, precision="highest"), -jnp.inf)
            return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v, precision="highest")

        def loss(f):
            return lambda q, k, v: jnp.sum(f(q, k, v) * g)

        want = [reference(q, k, v), *jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)]
        with tp.installed(backend=backend):
            got = [jax.jit(splash)(q, k, v), *jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)]
        for name, a, b in zip(["out", "dq", "dk", "dv"], got, want):
            # Sums of up to 512 products of values of order 1 (and 10 for the gradients).
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-4, err_msg=f"{name} on {backend}")


@pytest.mark.parametrize("shape", [(512, 256), (300, 200)], ids=["blocks", "padded"])
def test_jaxs_tpu_threefry_kernel_gives_jax_randoms_bits(shape):
    """JAX's Pallas TPU PRNG (`ops.tpu.random.threefry`), unchanged, inside `jit`: a kernel that
    hashes each element's counter with `threefry2x32` (twenty rounds of add, rotate and xor on
    u32 words). Its bits are `jax.random.bits` of the same key, which XLA computes: equal bit for
    bit, on a shape of whole 256x256 blocks and on one the kernel pads."""
    from jax.experimental.pallas.ops.tpu.random import threefry

    key = jax.random.key(20261204, impl="threefry2x32")
    want = np.asarray(jax.random.bits(key, shape, jnp.uint32))
    for backend in backends():
        with tp.installed(backend=backend):
            got = jax.jit(lambda k: threefry.plthreefry_random_bits(k, 32, shape))(jax.random.key_data(key))
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=backend)


@pytest.mark.parametrize("causal,head", [(False, 128), (True, 128), (True, 64)], ids=["plain", "causal", "causal_head_64"])
def test_jaxs_tpu_flash_attention_op(causal, head):
    """JAX's TPU flash attention, unchanged: its causal variant re-points each skipped key block
    at one already fetched with `jnp.minimum` in the index maps (a computed block index), it tiles
    its running max with `jnp.tile` (`concatenate`), and below a head of 128 it slices a value."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    shape = (1, 2, 256, head)
    q, k, v = (jnp.asarray(f32(*shape)) for _ in range(3))
    sizes = _tpu_flash_sizes(fa)
    want = np.asarray(fa.mha_reference(q, k, v, ab=None, causal=causal))
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            got = jax.block_until_ready(jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, block_sizes=sizes))(q, k, v))
        assert launches(backend) == before + 1, backend
        # Each output sums 256 products of values of order 1 in f32: an absolute error of about
        # 256 ulp(1) = 1.5e-5 where the sum cancels to near 0 is f32's, not the kernel's.
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=3e-5, err_msg=f"causal={causal} on {backend}")


def test_the_gradient_of_jaxs_tpu_flash_attention_op():
    """`jax.grad` through JAX's TPU flash attention (causal): its `custom_vjp` backward pass is two
    more Pallas kernels (dK/dV and dQ), unchanged, against the gradient of its reference."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    q, k, v = (jnp.asarray(f32(1, 2, 256, 64)) for _ in range(3))
    sizes = _tpu_flash_sizes(fa)

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v) ** 2)

    want = jax.grad(loss(lambda q, k, v: fa.mha_reference(q, k, v, ab=None, causal=True)), argnums=(0, 1, 2))(q, k, v)
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            grad = jax.jit(jax.grad(loss(lambda q, k, v: fa.flash_attention(q, k, v, causal=True, block_sizes=sizes)), argnums=(0, 1, 2)))
            got = jax.block_until_ready(grad(q, k, v))
        assert launches(backend) >= before + 3, backend  # forward, dK/dV and dQ
        for g, w, name in zip(got, want, ("dq", "dk", "dv")):
            w = np.asarray(w)
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-3, atol=1e-4 * np.abs(w).max(), err_msg=f"{name} on {backend}")
