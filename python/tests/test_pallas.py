"""`tessel.pallas`: Pallas kernels written here, each run by tessel (interpreter and wgpu) and
compared with the same function under Pallas's interpret mode; the text they translate to; and
every refusal with its message. Needs jax (scripts/test installs it into target/venv)."""

import importlib.util
import os

import ml_dtypes
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

RNG = np.random.default_rng(3)


#: `pl.kernel` makes an `mpmd_map` from jax 0.10; before, a `pallas_call` with a mesh, which tessel
#: does not translate (docs/jax.md, Versions).
needs_mpmd = pytest.mark.skipif(
    importlib.util.find_spec("jax._src.pallas.mpmd") is None,
    reason="this jax's pl.kernel is a pallas_call with a mesh, which tessel does not translate (jax 0.10 makes an mpmd_map)",
)


def backends():
    b = next(b for b in tessel.backends() if b["name"] == "wgpu")
    if b["available"]:
        return ["interpret", "wgpu"]
    if os.environ.get("TESSEL_REQUIRE_ADAPTER") == "1":
        pytest.fail(f"wgpu is required here but unavailable: {b['reason']}")
    return ["interpret"]


def call(body, out_shape, grid, in_specs, out_specs, interpret):
    return pl.pallas_call(body, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs, interpret=interpret)


def add(x, y, interpret=False):
    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((128,), lambda i: (i,))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 128,), [spec, spec], spec, interpret)(x, y)


def transpose(x, interpret=False):
    """A 2-D grid whose output index map swaps the program ids."""

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...].T * 2.0 + 1.0

    n, m = x.shape
    return call(
        body,
        jax.ShapeDtypeStruct((m, n), x.dtype),
        (n // 32, m // 16),
        [pl.BlockSpec((32, 16), lambda i, j: (i, j))],
        pl.BlockSpec((16, 32), lambda i, j: (j, i)),
        interpret,
    )(x)


def matmul(a, b, interpret=False, bm=32, bn=32, bk=16):
    """Accumulates over the `k` program id, zeroing the output tile with `pl.when` at k = 0."""

    def body(a_ref, b_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    (m, k), n = a.shape, b.shape[1]
    return call(
        body,
        jax.ShapeDtypeStruct((m, n), jnp.float32),
        (m // bm, n // bn, k // bk),
        [pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        interpret,
    )(a, b)


def softmax(x, interpret=False):
    def body(x_ref, o_ref):
        v = x_ref[...]
        e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)

    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 8,), [spec], spec, interpret)(x)


def layernorm(x, w, interpret=False):
    def body(x_ref, w_ref, o_ref):
        v = x_ref[...]
        mean = jnp.mean(v, axis=1, keepdims=True)
        var = jnp.mean((v - mean) ** 2, axis=1, keepdims=True)
        o_ref[...] = (v - mean) * jax.lax.rsqrt(var + 1e-5) * w_ref[...]

    spec = pl.BlockSpec((4, x.shape[1]), lambda i: (i, 0))
    wspec = pl.BlockSpec((1, x.shape[1]), lambda i: (0, 0))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 4,), [spec, wspec], spec, interpret)(x, w)


def row_sums(x, interpret=False):
    """`lax.fori_loop` over the rows of a block, `pl.ds` slices, `iota` and `where`."""

    def body(x_ref, o_ref):
        def step(r, acc):
            return acc + x_ref[pl.ds(r, 1), :]

        acc = jax.lax.fori_loop(0, 8, step, jnp.zeros((1, 128), jnp.float32))
        col = jnp.arange(128, dtype=jnp.int32)[None, :]
        o_ref[...] = jnp.where(col % 2 == 0, acc, -acc)

    return call(
        body,
        jax.ShapeDtypeStruct((x.shape[0] // 8, 128), x.dtype),
        (x.shape[0] // 8,),
        [pl.BlockSpec((8, 128), lambda i: (i, 0))],
        pl.BlockSpec((1, 128), lambda i: (i, 0)),
        interpret,
    )(x)


def int_mix(x, interpret=False):
    def body(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = (v * 3 + 7) ^ (v >> 2) + pl.program_id(0)

    spec = pl.BlockSpec((64,), lambda i: (i,))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 64,), [spec], spec, interpret)(x)


def scaled(x, interpret=False):
    """bf16 in, f32 arithmetic, bf16 out."""

    def body(x_ref, o_ref):
        o_ref[...] = (x_ref[...].astype(jnp.float32) * 0.5 + 2.0).astype(jnp.bfloat16)

    spec = pl.BlockSpec((128,), lambda i: (i,))
    return call(body, jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), (x.shape[0] // 128,), [spec], spec, interpret)(x)


def masked_tail(x, interpret=False):
    """Whole-array refs, `pl.ds` at a program's offset, and a masked load and store for the
    ragged tail (N = 1000 in blocks of 128), as examples/masked.tk."""
    from jax.experimental.pallas import triton as plt

    n = x.shape[0]

    def body(x_ref, o_ref):
        i = pl.program_id(0)
        m = i * 128 + jnp.arange(128) < n
        v = plt.load(x_ref.at[pl.ds(i * 128, 128)], mask=m, other=1.0)
        plt.store(o_ref.at[pl.ds(i * 128, 128)], jnp.sqrt(jnp.abs(v)) + 1.0, mask=m)

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(n, 128),), interpret=interpret)(x)


def prefix_sums(x, interpret=False):
    """`fori_loop` up to a bound known only at run time (the program id): a `while`."""

    def body(x_ref, o_ref):
        i = pl.program_id(0)

        def step(j, acc):
            return acc + x_ref[pl.ds(j, 1), :]

        o_ref[...] = jax.lax.fori_loop(0, i + 1, step, jnp.zeros((1, 128), jnp.float32))

    n = x.shape[0]
    return call(
        body,
        jax.ShapeDtypeStruct((n, 128), x.dtype),
        (n,),
        [pl.BlockSpec((n, 128), lambda i: (0, 0))],
        pl.BlockSpec((1, 128), lambda i: (i, 0)),
        interpret,
    )(x)


def accumulate(x, interpret=False):
    """A scratch accumulator over the `seq` axis, written out at the last step (the TPU idiom)."""
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref, acc_ref):
        k = pl.program_id(1)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]

        @pl.when(k == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...] * 2.0

    n = x.shape[0]
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
        grid=(2, n // 16),
        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (2 * k + i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=interpret,
    )(x)


def batched_rows(x, interpret=False):
    """A batch dimension squeezed out of the block (`None` in the block shape)."""

    def body(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = v - jnp.mean(v, axis=1, keepdims=True) + x_ref[pl.ds(0, 1), :]

    spec = pl.BlockSpec((None, 8, x.shape[2]), lambda b, i: (b, i, 0))
    grid = (x.shape[0], x.shape[1] // 8)
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), grid, [spec], spec, interpret)(x)


def hints(x, interpret=False):
    """`pl.multiple_of`, `pl.reciprocal`, `jnp.clip`, `pl.num_programs` and scalars broadcast."""

    def body(x_ref, o_ref):
        i = pl.multiple_of(pl.program_id(0) * 64, 64)
        v = x_ref[...]
        o_ref[...] = pl.reciprocal(jnp.clip(v, -1.0, 1.0) + 3.0) + pl.num_programs(0) + i.astype(jnp.float32)

    spec = pl.BlockSpec((64,), lambda i: (i,))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 64,), [spec], spec, interpret)(x)


def around(x, y, interpret=False):
    """jnp code before and after a pallas_call, and a structured result."""
    z = add(jnp.sin(x), y, interpret=interpret)
    return {"z": z * 2.0, "pair": (z, x.sum())}


def in_place(x, y, interpret=False):
    """An in-place update (`input_output_aliases`): the kernel overwrites the aliased output whole."""

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 0.9 + y_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // 8,),
        in_specs=[spec, spec],
        out_specs=spec,
        input_output_aliases={0: 0},
        interpret=interpret,
    )(x, y)


def prefetched(scale, x, interpret=False):
    """Scalar prefetch (`PrefetchScalarGridSpec`): the body reads one scalar per program."""
    from jax.experimental.pallas import tpu as pltpu

    def body(s_ref, x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[...] * s_ref[i].astype(jnp.float32) + s_ref[0].astype(jnp.float32)

    spec = pl.BlockSpec((64,), lambda i, s: (i,))
    grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(x.shape[0] // 64,), in_specs=[spec], out_specs=spec)
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=grid_spec, interpret=interpret)(scale, x)


def scoped(x, interpret=False):
    """`pl.run_scoped` memory: a block staged in scoped scratch, then read back in halves."""
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref):
        def stage(tmp_ref):
            tmp_ref[...] = jnp.exp(x_ref[...])
            o_ref[pl.ds(0, 4), :] = tmp_ref[pl.ds(4, 4), :] - 1.0
            o_ref[pl.ds(4, 4), :] = tmp_ref[pl.ds(0, 4), :] * 2.0

        pl.run_scoped(stage, pltpu.VMEM((8, 128), jnp.float32))

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 8,), [spec], spec, interpret)(x)


def special(x, interpret=False):
    """The exact (erf) gelu of normalization and MLP kernels, with `expm1`, `log1p`, `atan2`,
    `erf_inv`, `arcsin`, `arccos`, `arctan`, `sinh` and `cosh` beside it."""

    def body(x_ref, o_ref):
        x = x_ref[...]
        gelu = 0.5 * x * (1.0 + jax.lax.erf(x * 0.70710677))
        angle = jnp.arctan2(x, x * x - 1.0) + jax.lax.erf_inv(jnp.tanh(x) * 0.999)
        t = jnp.tanh(x)
        inverse = jnp.arcsin(t * 0.9) - jnp.arccos(t * 0.5) + jnp.arctan(x * 3.0)
        hyperbolic = jnp.sinh(x * 0.5) + jnp.cosh(x * 0.25)
        o_ref[...] = gelu + jnp.expm1(x * 0.25) - jnp.log1p(jnp.abs(x)) + angle + inverse + hyperbolic

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 8,), [spec], spec, interpret)(x)


def joined(x, y, interpret=False):
    """`jnp.concatenate` along both axes and `jnp.tile` (what `pltpu.repeat` is): blocks side by
    side, a block over its own square, and a row block tiled."""

    def body(x_ref, y_ref, wide_ref, tall_ref, tiled_ref):
        x, y = x_ref[...], y_ref[...]
        wide_ref[...] = jnp.concatenate([x, y, x * 2.0], axis=1)
        tall_ref[...] = jnp.concatenate([x, x * x], axis=0)
        tiled_ref[...] = jnp.tile(y, (1, 3))

    grid = (x.shape[0] // 8,)
    outs = (
        jax.ShapeDtypeStruct((x.shape[0], 2 * x.shape[1] + y.shape[1]), x.dtype),
        jax.ShapeDtypeStruct((2 * x.shape[0], x.shape[1]), x.dtype),
        jax.ShapeDtypeStruct((x.shape[0], 3 * y.shape[1]), x.dtype),
    )
    specs = [pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0)), pl.BlockSpec((8, y.shape[1]), lambda i: (i, 0))]
    out_specs = (
        pl.BlockSpec((8, outs[0].shape[1]), lambda i: (i, 0)),
        pl.BlockSpec((16, x.shape[1]), lambda i: (i, 0)),
        pl.BlockSpec((8, outs[2].shape[1]), lambda i: (i, 0)),
    )
    return pl.pallas_call(body, out_shape=outs, grid=grid, in_specs=specs, out_specs=out_specs, interpret=interpret)(x, y)


def branches(x, interpret=False):
    """`lax.cond` and `lax.switch` returning values, chosen per program (skip a block's work,
    keep a carried state)."""

    def body(x_ref, o_ref):
        i = pl.program_id(0)
        x = x_ref[...]
        y = jax.lax.cond(i % 2 == 0, lambda v: jnp.exp(v) - 1.0, lambda v: v * 3.0, x)
        z = jax.lax.switch(i % 3, [lambda v: v, lambda v: jnp.sin(v), lambda v: v.max(axis=1, keepdims=True) + v], y)
        o_ref[...] = z

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 8,), [spec], spec, interpret)(x)


def batched_dots(q, k, interpret=False):
    """Attention's batched products, `einsum('bqd,bkd->bqk')` and `einsum('bqk,bkd->bqd')`, on
    blocks of 2 heads."""

    def body(q_ref, k_ref, o_ref):
        q, k = q_ref[...], k_ref[...]
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        o_ref[...] = jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), k)

    spec = pl.BlockSpec((2, 16, 32), lambda i: (i, 0, 0))
    return call(body, jax.ShapeDtypeStruct(q.shape, q.dtype), (q.shape[0] // 2,), [spec, spec], spec, interpret)(q, k)


def triton_style(x, y, interpret=False):
    """A Triton-style kernel on whole refs: each program's run `pid * 128 + jnp.arange(128)`,
    loaded with a mask and `other` for the ragged tail (`plgpu.load`), and stored under the mask."""
    from jax.experimental.pallas import triton as plgpu

    n = x.shape[0]

    def body(x_ref, y_ref, o_ref):
        idx = pl.program_id(0) * 128 + jnp.arange(128)
        mask = idx < n
        a = plgpu.load(x_ref.at[idx], mask=mask, other=0.0)
        b = y_ref[idx]
        plgpu.store(o_ref.at[idx], a * 2.0 + b, mask=mask)

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((n,), x.dtype), grid=(pl.cdiv(n, 128),), interpret=interpret)(x, y)


def int8_matmul(x, w, scale, interpret=False, bm=16, bn=16, bk=32):
    """A quantized matmul as Pallas users write one: int8 blocks, `preferred_element_type=int32`
    into an int32 scratch accumulator, the per-column scale applied and the result requantized to
    int8 (saturating) on the last step."""
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = w.shape[1]

    def body(x_ref, w_ref, s_ref, o_ref, q_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            y = acc_ref[...].astype(jnp.float32) * s_ref[...]
            o_ref[...] = y
            q_ref[...] = jnp.clip(jnp.round(y), -128, 127).astype(jnp.int8)

    return pl.pallas_call(
        body,
        out_shape=(jax.ShapeDtypeStruct((m, n), jnp.float32), jax.ShapeDtypeStruct((m, n), jnp.int8)),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))] * 2,
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        interpret=interpret,
    )(x, w, scale)


def narrow_bits(x, c, u, interpret=False):
    """8- and 16-bit integer arithmetic as XLA defines it: wrapping adds and products, logical and
    arithmetic right shifts of negative int8 values, shift counts from data (some past the width),
    casts between widths and from floats."""

    def body(x_ref, c_ref, u_ref, o_ref):
        x, c, u = x_ref[...], c_ref[...], u_ref[...]
        wide = x.astype(jnp.int16) * 300 + u.astype(jnp.int16)
        o_ref[0] = (x + x).astype(jnp.int32)
        o_ref[1] = (x * jnp.int8(3)).astype(jnp.int32)
        o_ref[2] = jax.lax.shift_right_logical(x, c).astype(jnp.int32)
        o_ref[3] = jax.lax.shift_right_arithmetic(x, c).astype(jnp.int32)
        o_ref[4] = jax.lax.shift_left(x, c).astype(jnp.int32)
        o_ref[5] = jax.lax.shift_right_logical(x, jnp.int8(2)).astype(jnp.int32)
        o_ref[6] = wide.astype(jnp.int32)
        o_ref[7] = wide.astype(jnp.int8).astype(jnp.int32)
        o_ref[8] = (u // jnp.uint8(7) + u % jnp.uint8(5)).astype(jnp.int32)
        o_ref[9] = jax.lax.shift_right_arithmetic(u, jnp.uint8(1)).astype(jnp.int32)

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((10,) + x.shape, jnp.int32), interpret=interpret)(x, c, u)


def routing(x, n, interpret=False):
    """What mixture-of-experts routing does in a kernel: each token's top expert (`argmax`, a
    NaN row choosing its first NaN, ties the first), its least (`argmin` down the columns), and
    running counts (`cumsum` along rows, reversed, down the columns, of integers), running
    maxima and minima (`cummax`, `cummin` reversed) and products (`cumprod` of integers)."""

    def body(x_ref, n_ref, top_ref, low_ref, run_ref, back_ref, count_ref, hi_ref, lo_ref, prod_ref):
        x, n = x_ref[...], n_ref[...]
        top_ref[...] = jnp.argmax(x, axis=1, keepdims=True)
        low_ref[...] = jnp.argmin(x, axis=0)
        run_ref[...] = jnp.cumsum(x, axis=1)
        back_ref[...] = jax.lax.cumsum(x, axis=0, reverse=True)
        count_ref[...] = jnp.cumsum(n, axis=-1)
        hi_ref[...] = jax.lax.cummax(x, axis=1)
        lo_ref[...] = jax.lax.cummin(x, axis=0, reverse=True)
        prod_ref[...] = jnp.cumprod(n, axis=-1)

    r, e = x.shape
    out = (
        jax.ShapeDtypeStruct((r, 1), jnp.int32),
        jax.ShapeDtypeStruct((e,), jnp.int32),
        jax.ShapeDtypeStruct((r, e), x.dtype),
        jax.ShapeDtypeStruct((r, e), x.dtype),
        jax.ShapeDtypeStruct(n.shape, n.dtype),
        jax.ShapeDtypeStruct((r, e), x.dtype),
        jax.ShapeDtypeStruct((r, e), x.dtype),
        jax.ShapeDtypeStruct(n.shape, n.dtype),
    )
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x, n)


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


def routing_inputs():
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    x[3, 5] = np.nan  # the first NaN of its row is its argmax
    x[3, 6] = np.nan
    x[7, 2] = x[7, 6] = 9.0  # a tie: the first
    n = RNG.integers(-3, 4, (4, 16)).astype(np.int32)
    return x, n


def value_strides(x, interpret=False):
    """Strided slices of values (not refs): every other element from the second, every second row
    and third column (RoPE's even and odd halves are such slices)."""

    def body(x_ref, o_ref, p_ref):
        x = x_ref[...]
        o_ref[...] = x[:, 1::2] * 2.0 - x[:, ::2]
        p_ref[...] = x[::2, 1::3]

    r, c = x.shape
    out = (jax.ShapeDtypeStruct((r, c // 2), x.dtype), jax.ShapeDtypeStruct((r // 2, (c - 1 + 2) // 3), x.dtype))
    return pl.pallas_call(body, out_shape=out, interpret=interpret)(x)


f32 = lambda *shape: RNG.standard_normal(shape).astype(np.float32)  # noqa: E731

CASES = [
    ("add", add, lambda: (f32(1024), f32(1024)), 0),
    ("transpose", transpose, lambda: (f32(64, 48),), 0),
    ("matmul", matmul, lambda: (f32(64, 48), f32(48, 96)), 1e-4),
    ("softmax", softmax, lambda: (f32(32, 256),), 1e-6),
    ("layernorm", layernorm, lambda: (f32(16, 128), f32(1, 128)), 1e-5),
    ("row_sums", row_sums, lambda: (f32(32, 128),), 1e-6),
    ("int_mix", int_mix, lambda: (RNG.integers(-1000, 1000, 256).astype(np.int32),), 0),
    ("masked_tail", masked_tail, lambda: (f32(1000),), 1e-6),
    ("hints", hints, lambda: (f32(256) * 3,), 1e-6),
    ("prefix_sums", prefix_sums, lambda: (f32(12, 128),), 1e-5),
    ("accumulate", accumulate, lambda: (f32(64, 128),), 1e-5),
    ("batched_rows", batched_rows, lambda: (f32(3, 16, 32),), 1e-6),
    ("around", around, lambda: (f32(512), f32(512)), 1e-5),
    ("scoped", scoped, lambda: (f32(24, 128),), 1e-6),
    ("in_place", in_place, lambda: (f32(32, 128), f32(32, 128)), 1e-6),
    ("prefetched", prefetched, lambda: (RNG.integers(-5, 5, 4).astype(np.int32), f32(256)), 1e-6),
    ("special", special, lambda: (f32(32, 128) * 3,), 1e-5),
    ("joined", joined, lambda: (f32(32, 128), f32(32, 64)), 1e-6),
    ("branches", branches, lambda: (f32(48, 128),), 1e-5),
    ("batched_dots", batched_dots, lambda: (f32(4, 16, 32), f32(4, 16, 32)), 1e-4),
    ("triton_style", triton_style, lambda: (f32(1000), f32(1024)), 1e-6),
    ("int8_matmul", int8_matmul, lambda: (
        RNG.integers(-128, 128, (32, 64)).astype(np.int8),
        RNG.integers(-128, 128, (64, 32)).astype(np.int8),
        (RNG.random((1, 32)) / 2000).astype(np.float32),
    ), 1e-6),
    ("routing", routing, routing_inputs, 1e-5),
    ("value_strides", value_strides, lambda: (f32(8, 16),), 1e-6),
    ("narrow_bits", narrow_bits, lambda: (
        np.array([[-128, 127, -1, 100, 50, 3, -7, 64]] * 2, np.int8),
        np.array([[0, 1, 2, 7, 8, 9, -1, 3], [3, 2, 1, 0, 100, 5, 6, 7]], np.int8),
        np.array([[0, 1, 128, 255, 200, 7, 64, 99]] * 2, np.uint8),
    ), 0),
]


@pytest.mark.parametrize("name,fn,make,tol", CASES[:], ids=[c[0] for c in CASES])
def test_pallas_kernels_agree_with_pallas_interpret_mode(name, fn, make, tol):
    args = make()
    want = jax.tree_util.tree_map(np.asarray, fn(*args, interpret=True))
    for backend in backends():
        got = tp.run(fn, *args, backend=backend)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape, (name, backend)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{name} on {backend}")


def test_bf16_kernels_cross_as_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = jnp.asarray(f32(256)).astype(jnp.bfloat16)
    want = np.asarray(scaled(x, interpret=True))
    for backend in backends():
        got = tp.run(scaled, x, backend=backend)
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


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


def test_the_text_is_tessel_kernel_language():
    text = tp.to_tk(matmul, f32(64, 48), f32(48, 96))
    assert text.startswith("kernel matmul\n  grid (i0: 2, i1: 3, i2: 3 seq)\n"), text
    assert "  in  x0: f32[64, 48] block [32, 16] at (i0, i2)\n" in text
    assert "  out o0: f32[64, 96] block [32, 32] at (i0, i1)\n" in text
    assert "when %" in text and "dot %" in text
    # It is canonical up to value names: check gives it back with the same lines.
    assert tessel.check(text).splitlines()[:5] == text.splitlines()[:5]
    # Scalar prefetch: the scalars are the first, whole inputs; the body indexes them.
    p = tp.to_tk(prefetched, np.arange(4, dtype=np.int32), f32(256))
    assert "  in  x0: i32[4]\n  in  x1: f32[256] block [64] at (i0)\n" in p and "= load x0[%" in p, p
    assert tessel.check(p).splitlines()[:4] == p.splitlines()[:4]
    t = tp.to_tk(transpose, f32(64, 48))
    assert "out o0: f32[48, 64] block [16, 32] at (i1, i0)" in t and "seq" not in t
    # A row reduction whose axis jnp's keepdims restores is one `keepdims` reduction (what the
    # interpreter and wgpu fuse with the row's other operations), not a reduction and a reshape.
    s = tp.to_tk(softmax, f32(32, 256))
    assert "= max %v0 axis 1 keepdims : f32[8, 1]" in s and "axis 1 keepdims : f32[8, 1]\n  %v5 = div" in s, s
    assert "reshape" not in s, s
    # One whose reduced value is read elsewhere too keeps its reshape, and its value.
    def twice(x, interpret=False):
        def body(x_ref, o_ref):
            v = x_ref[...]
            m = jnp.max(v, axis=1)
            o_ref[...] = v - m[:, None] + jnp.sum(m)

        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (1,), [pl.BlockSpec(x.shape, lambda i: (0, 0))], pl.BlockSpec(x.shape, lambda i: (0, 0)), interpret)(x)

    x = f32(8, 128)
    t2 = tp.to_tk(twice, x)
    assert "keepdims" not in t2 and "reshape" in t2, t2
    np.testing.assert_allclose(tp.run(twice, x, backend="interpret"), np.asarray(twice(x, interpret=True)), rtol=1e-6)


def test_what_cannot_be_translated_names_the_primitive_the_kernel_and_the_line():
    def cumlogsumexp(x, interpret=False):
        def body(x_ref, o_ref):
            o_ref[...] = jax.lax.cumlogsumexp(x_ref[...], axis=0)

        spec = pl.BlockSpec((128,), lambda i: (i,))
        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (2,), [spec], spec, interpret)(x)

    with pytest.raises(tessel.UnsupportedError) as e:
        tp.to_tk(cumlogsumexp, f32(256))
    msg = str(e.value)
    assert isinstance(e.value, NotImplementedError)
    assert "primitive `cumlogsumexp` in Pallas kernel `cumlogsumexp`" in msg and "test_pallas.py:" in msg, msg

    def squares(x, interpret=False):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        spec = pl.BlockSpec((8,), lambda i: (i * i,))
        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (4,), [spec], spec, interpret)(x)

    with pytest.raises(tessel.UnsupportedError, match="makes no `pallas_call`"):
        tp.to_tk(lambda x: x + 1, f32(4))


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


def _refusal_cases():
    def single(body, x, grid=(2,), spec=None, out_dtype=None, **kw):
        spec = spec or pl.BlockSpec((x.shape[0] // 2,) + x.shape[1:], lambda i: (i,) + (0,) * (x.ndim - 1))
        out = jax.ShapeDtypeStruct(x.shape, out_dtype or x.dtype)
        return pl.pallas_call(body, out_shape=out, grid=grid, in_specs=[spec], out_specs=spec, **kw)(x)

    def aliased_read_after(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0
            o_ref[...] = o_ref[...] + x_ref[...]

        return single(body, x, input_output_aliases={0: 0})

    def aliased_seq(x):
        # Along the `seq` axis the second step would read what the first stored.
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        spec = pl.BlockSpec((8,), lambda i, k: (i,))
        return single(body, x, grid=(2, 2), spec=spec, input_output_aliases={0: 0})

    def aliased_blocks(x):
        def body(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]

        specs = [pl.BlockSpec((8,), lambda i: (1 - i,)), pl.BlockSpec((8,), lambda i: (i,))]
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(body, out_shape=out, grid=(2,), in_specs=specs, out_specs=specs[1], input_output_aliases={0: 0})(x, x)

    def prefetch_map(x):
        from jax.experimental.pallas import tpu as pltpu

        def body(s_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...]

        s = jnp.array([1, 0], dtype=jnp.int32)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(2,), in_specs=[pl.BlockSpec((8,), lambda i, s: (s[i],))], out_specs=pl.BlockSpec((8,), lambda i, s: (i,))
        )
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=grid_spec)(s, x)

    def batched(x):
        def body(x_ref, o_ref):
            v = x_ref[...]
            o_ref[...] = jnp.einsum("abij,abjk->abik", v, v)

        return single(body, x)

    def float8(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        return single(body, x)

    def nextafter(x):
        def body(x_ref, o_ref):
            o_ref[...] = jnp.nextafter(x_ref[...], 0.0) + x_ref[...]

        return single(body, x)

    def element(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        spec = pl.BlockSpec((pl.Element(2), 8), lambda i: (i, 0))
        return single(body, x, spec=spec)

    return [
        ("aliased_read_after", aliased_read_after, f32(16), "(the kernel reads `x0` where it could see what it stored into `o0`"),
        ("aliased_seq", aliased_seq, f32(16), "(the kernel reads `x0` where it could see what it stored into `o0`"),
        ("aliased_blocks", aliased_blocks, f32(16), "`input_output_aliases` pairing `x0` with `o0` in Pallas kernel `aliased_blocks`"),
        ("batched", batched, f32(2, 2, 8, 8), "`dot_general` other than a 2-D matrix product or one batched over a leading dimension in Pallas kernel `batched`"),
        ("float8", float8, np.arange(16).astype(ml_dtypes.float8_e4m3fn), "dtype float8_e4m3fn in Pallas kernel `float8`"),
        ("nextafter", nextafter, f32(8, 8), "primitive `nextafter` in Pallas kernel `nextafter` (at "),
        ("element", element, f32(4, 8), "the block dimension Element"),
    ]


@pytest.mark.parametrize("name,fn,arg,message", _refusal_cases(), ids=[c[0] for c in _refusal_cases()])
def test_every_refusal_says_what_and_where(name, fn, arg, message):
    with pytest.raises(tessel.UnsupportedError) as e:
        tp.run(fn, arg, backend="interpret")
    assert message in str(e.value), str(e.value)
    assert "has no tessel translation" in str(e.value), str(e.value)


@needs_mpmd
def test_a_kernel_on_a_mosaic_gpu_mesh_runs_on_every_backend():
    """`pl.kernel` on a `plgpu.Mesh` (grid and warpgroup axes): `axis_index` is the mesh axis's
    program id, the mesh goes to the launch, and Mosaic GPU lowers it (no GPU needed)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def shifted(x):
        mesh = plgpu.Mesh(grid=(2,), grid_names=("i",), num_threads=2, thread_name="wg")

        @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)
        def k(x_ref, o_ref):
            s = (jax.lax.axis_index("i") * 2 + jax.lax.axis_index("wg")) * 128
            o_ref[pl.ds(s, 128)] = x_ref[pl.ds(s, 128)] * 3.0 + jax.lax.axis_index("wg").astype(jnp.float32)

        return k(x)

    x = f32(512)
    # Pallas's interpret mode cannot run a Mosaic GPU mesh on the CPU: the expected values come from numpy.
    want = x * 3.0 + np.repeat(np.tile([0.0, 1.0], 2), 128).astype(np.float32)
    (t,) = tp.translate(shifted, x)
    assert t.mesh == "mosaic_gpu(i: 2, wg: 2 thread)" and t.external_meshes == [], t
    assert "program_id wg" in t.text and "grid" not in t.text, t.text
    assert ".target sm_90a" in tessel.compile(t.text).lower("mosaic-gpu", mesh=t.mesh)
    for backend in backends():
        np.testing.assert_allclose(tp.run(shifted, x, backend=backend), want, rtol=1e-6, err_msg=backend)


def doubled_on_cores(x):
    """x * 2 by a `pl.kernel` on a TPU core mesh of two cores, each doubling its half of 512."""
    from jax.experimental.pallas import tpu as pltpu

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=pltpu.create_tensorcore_mesh("core", num_cores=2))
    def k(x_ref, o_ref):
        c = jax.lax.axis_index("core")
        o_ref[pl.ds(c * 256, 256)] = x_ref[pl.ds(c * 256, 256)] * 2.0

    return k(x)


@needs_mpmd
def test_a_tpu_core_mesh_is_refused_by_mosaic_gpu_in_pallas_words_and_runs_elsewhere():
    """The seed problem, from Pallas: a kernel written for a TPU core mesh. Mosaic GPU refuses the
    mesh with Pallas's sentence; the interpreter and wgpu run it."""
    doubled = doubled_on_cores
    x = f32(512)
    (t,) = tp.translate(doubled, x)
    assert t.mesh == "grid(core: 2)", t.mesh
    with pytest.raises(tessel.UnsupportedError) as e:
        tessel.compile(t.text).lower("mosaic-gpu", mesh=t.mesh)
    assert str(e.value).splitlines()[0] == "Mesh grid(core: 2) is not supported by the Mosaic GPU backend", str(e.value)
    assert e.value.backend == "mosaic-gpu" and "mosaic_gpu(" in (e.value.hint or ""), e.value.hint
    for backend in backends():
        np.testing.assert_array_equal(tp.run(doubled, x, backend=backend), x * 2.0, err_msg=backend)


def test_a_debug_print_is_dropped_with_a_warning():
    def printed(x, interpret=False):
        def body(x_ref, o_ref):
            pl.debug_print("program {}", pl.program_id(0))
            o_ref[...] = x_ref[...] + 1.0

        spec = pl.BlockSpec((8,), lambda i: (i,))
        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (2,), [spec], spec, interpret)(x)

    x = f32(16)
    with pytest.warns(UserWarning, match=r"`debug_print` in Pallas kernel `printed` \(at .*\) is dropped"):
        got = tp.run(printed, x, backend="interpret")
    np.testing.assert_array_equal(got, x + 1.0)


def test_explain_shows_the_backend_choice(capfd):
    x = f32(256)
    tp.run(add, x, x, explain=True)
    err = capfd.readouterr().err
    assert ": chosen" in err and "mosaic-gpu: " in err, err


# ---- issue 38: no silent wrong result ----


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

    with pytest.raises(tessel.TesselError, match=r"the outputs of `huge` needs 12288.0 GB of memory \(outputs 12288.0 GB\)"):
        tp.run(huge, backend="interpret")


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


# The kernels of issue 36's language features, also run under `tp.install` by test_jax.py.
CASES += [
    ("branches_writing_refs", branches_writing_refs, lambda: (f32(32),), 0),
    ("gathers", gathers, lambda: (np.array([2, 0, 2], dtype=np.int32), f32(3, 4, 5)), 0),
    ("strided_reads", strided_reads, lambda: (f32(8, 12),), 0),
    ("doubling", doubling, lambda: (f32(32), np.array([40.0], np.float32)), 0),
    ("computed_maps", computed_maps, lambda: (f32(32, 48),), 1e-6),
    ("prefetched_map", prefetched_map, lambda: (np.array([7, -2, 3, 1], dtype=np.int32), f32(32)), 1e-6),
]
