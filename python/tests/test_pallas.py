"""`tessel.pallas`: Pallas kernels written here, each run by tessel (interpreter and wgpu) and
compared with the same function under Pallas's interpret mode; the text they translate to; and
every refusal with its message. Needs jax (scripts/test installs it into target/venv)."""

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
from pallas_common import RNG, add, backends, call, f32, needs_mpmd  # noqa: E402

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
    # `jnp.tile` (what `pltpu.repeat` is) is the language's `tile`, not copies concatenated.
    j = tp.to_tk(joined, f32(32, 128), f32(32, 64))
    assert "= tile %v1 reps (1, 3) : f32[8, 192]" in j and j.count("concatenate") == 2, j
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
    def stepped(x, interpret=False):
        def body(x_ref, o_ref):
            o_ref[...] = jax.lax.lgamma(x_ref[...])

        spec = pl.BlockSpec((128,), lambda i: (i,))
        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (2,), [spec], spec, interpret)(x)

    with pytest.raises(tessel.UnsupportedError) as e:
        tp.to_tk(stepped, f32(256))
    msg = str(e.value)
    assert isinstance(e.value, NotImplementedError)
    assert "primitive `lgamma` in Pallas kernel `stepped`" in msg and "test_pallas.py:" in msg, msg

    def squares(x, interpret=False):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        spec = pl.BlockSpec((8,), lambda i: (i * i,))
        return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (4,), [spec], spec, interpret)(x)

    with pytest.raises(tessel.UnsupportedError, match="makes no `pallas_call`"):
        tp.to_tk(lambda x: x + 1, f32(4))


def _refusal_cases():
    def single(body, x, grid=(2,), spec=None, out_dtype=None, **kw):
        spec = spec or pl.BlockSpec((x.shape[0] // 2,) + x.shape[1:], lambda i: (i,) + (0,) * (x.ndim - 1))
        out = jax.ShapeDtypeStruct(x.shape, out_dtype or x.dtype)
        return pl.pallas_call(body, out_shape=out, grid=grid, in_specs=[spec], out_specs=spec, **kw)(x)

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
            # The batch dimensions in another order in the second operand.
            o_ref[...] = jnp.einsum("abij,bajk->abik", v, v)

        return single(body, x)

    def float8(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        return single(body, x)

    def padded_aliased(x):
        # The output's block (8, 128) is wider than the array (8, 1), the kernel reads it back,
        # and the output aliases the input.
        def body(x_ref, o_ref):
            o_ref[...] = o_ref[...] * 2.0

        spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 1), x.dtype), grid=(1,), in_specs=[spec], out_specs=spec,
                              input_output_aliases={0: 0})(x)

    def lgamma(x):
        def body(x_ref, o_ref):
            o_ref[...] = jax.lax.lgamma(x_ref[...]) + x_ref[...]

        return single(body, x)

    def element(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        spec = pl.BlockSpec((pl.Element(2), 8), lambda i: (i, 0))
        return single(body, x, spec=spec)

    return [
        ("aliased_blocks", aliased_blocks, f32(16), "`input_output_aliases` pairing `x0` with `o0` in Pallas kernel `aliased_blocks`"),
        ("batched", batched, f32(4, 2, 8, 8), "`dot_general` other than a 2-D matrix product or one batched over the same leading dimensions in Pallas kernel `batched`"),
        ("float8", float8, np.arange(16).astype(ml_dtypes.float8_e4m3fn), "dtype float8_e4m3fn in Pallas kernel `float8`"),
        ("padded_aliased", padded_aliased, f32(8, 1), "reading back the output `o0`, whose block is larger than the array,"),
        ("lgamma", lgamma, f32(8, 8), "primitive `lgamma` in Pallas kernel `lgamma` (at "),
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


from test_pallas_refs import branches_writing_refs, computed_maps, doubling, gathers, prefetched_map, strided_reads  # noqa: E402

# The kernels of issue 36's language features, also run under `tp.install` by test_jax.py.
CASES += [
    ("branches_writing_refs", branches_writing_refs, lambda: (f32(32),), 0),
    ("gathers", gathers, lambda: (np.array([2, 0, 2], dtype=np.int32), f32(3, 4, 5)), 0),
    ("strided_reads", strided_reads, lambda: (f32(8, 12),), 0),
    ("doubling", doubling, lambda: (f32(32), np.array([40.0], np.float32)), 0),
    ("computed_maps", computed_maps, lambda: (f32(32, 48),), 1e-6),
    ("prefetched_map", prefetched_map, lambda: (np.array([7, -2, 3, 1], dtype=np.int32), f32(32)), 1e-6),
]
