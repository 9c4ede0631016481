"""JAX's Mosaic GPU Pallas tests (`tests/pallas/mosaic_gpu_test.py` in the jax repository, jax
0.10.2), ported in part (here, and their pipelines and products in
`test_pallas_mosaic_gpu_port_pipelines.py`): the same `plgpu.kernel`s, rewritten, run by tessel
inside `jax.jit` (`tp.run`) on the interpreter and on wgpu, each equal to the value the original
test expects (computed with numpy or `jnp` outside the kernel).

What the port changes, and why:
- The original runs its kernels through `self.kernel` (the real `plgpu.kernel` with a lowering
  semantics) and `self.pallas_call` (a `plgpu.kernel` whose whole-array blocks are staged into
  shared memory by a pipeline). Here `plgpu.kernel` is called directly, and `staged`
  (`mgpu_port_common.py`) stages whole arrays into shared memory with `copy_gmem_to_smem` and a
  barrier, as that pipeline does for a grid of one step. Lane and Warpgroup semantics lower
  alike in tessel: each case runs once.
- `jax.random` inputs become seeded numpy ones; the original's tolerances are kept.
- Kernels with `wgmma` and the larger pipelines run on the interpreter only: on wgpu their
  shaders take minutes to compile in Mesa's software Vulkan (`test_pallas_mosaic_gpu.py` runs
  JAX's Hopper ops on wgpu).

Not ported (docs/pallas.md lists the families): Blackwell's TMEM and `tcgen05`, clusters and
multicast, `RefUnion` aliasing, `inline_mgpu`, device printing and profiling, out-of-bounds TMA
fill modes, sub-byte and fp8 types, semaphores and atomics across devices, and the tests that
check Mosaic GPU's own PTX, SASS or error messages.
"""

import functools
import operator

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from tessel import pallas as tp

from pallas_common import concurrent_backends, needs_mpmd
from mgpu_port_common import RNG, elementwise, fori_loop

pytestmark = needs_mpmd
plgpu = pytest.importorskip("jax.experimental.pallas.mosaic_gpu")


# 1. Elementwise operations, dtypes.

UNARY = {
    "neg": lax.neg, "logistic": lax.logistic, "exp": lax.exp, "square": lambda x: x ** 2,
    "pow5": lambda x: x ** 5, "rsqrt": lax.rsqrt, "tanh": lax.tanh, "log": lax.log,
    "gelu": jax.nn.gelu, "abs": lax.abs, "round": lax.round,
    "round_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
}


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_op(op, backend):
    x = np.arange(256, dtype=np.float32)
    got = elementwise(UNARY[op], jax.ShapeDtypeStruct((256,), jnp.float32), x, backend=backend)
    np.testing.assert_allclose(got, np.asarray(jax.jit(UNARY[op])(x)), rtol=1e-5)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("op", ["bitwise_not", "clz"])
def test_unary_integer_op(op, backend):
    f = {"bitwise_not": lax.bitwise_not, "clz": lax.clz}[op]
    x = np.arange(256, dtype=np.int32)
    got = elementwise(f, jax.ShapeDtypeStruct((256,), jnp.int32), x, backend=backend)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(f)(x)))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
def test_sign(dtype, backend):
    x = (np.arange(256) - 128).astype(dtype)
    got = elementwise(lax.sign, jax.ShapeDtypeStruct((256,), dtype), x, backend=backend)
    np.testing.assert_array_equal(got, np.sign(x) if dtype != np.uint32 else (x > 0).astype(dtype))


BINARY = {
    "add": operator.add, "add_one": lambda x, _: x + 1, "sub": operator.sub, "mul": operator.mul,
    "div": lax.div, "min": jnp.minimum, "max": jnp.maximum, "shl": lax.shift_left,
    "shr_logical": lax.shift_right_logical, "shr_arithmetic": lax.shift_right_arithmetic,
}


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("op,dtype", [(op, d) for op in BINARY for d in (np.float32, np.int32, np.uint32)
                                      if not (op.startswith("sh") and d == np.float32)])  # no shifts of floats
def test_binary_op(op, dtype, backend):
    if op.startswith("sh"):
        info = np.iinfo(dtype)
        x = np.linspace(info.min, info.max, 256).astype(dtype)
        y = np.linspace(0, info.bits - 1, 256).astype(dtype)
    else:
        x = (RNG.uniform(size=256) * 42 - 21).astype(dtype)
        y = (RNG.uniform(size=256) * 42 - 21 + 0.5).astype(dtype)
        if op == "div":
            y = np.where(y == 0, dtype(1), y)
    got = elementwise(BINARY[op], jax.ShapeDtypeStruct((256,), dtype), x, y, backend=backend)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(BINARY[op])(x, y)))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_lax_div_int_rounding(backend):
    x = RNG.integers(-100, 100, 256).astype(np.int32)
    y = (RNG.integers(1, 10, 256) * RNG.choice([-1, 1], 256)).astype(np.int32)
    got = elementwise(lax.div, jax.ShapeDtypeStruct((256,), jnp.int32), x, y, backend=backend)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(lax.div)(x, y)))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparison_op(op, dtype, backend):
    f = getattr(lax, op)

    def kernel(o_ref):
        o_ref[...] = jnp.broadcast_to(f(dtype(42), dtype(24)).astype(dtype), (256,))

    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), dtype)), backend=backend)
    np.testing.assert_array_equal(got, np.full(256, getattr(operator, op)(42, 24), dtype))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
def test_iota(dtype, backend):
    def kernel(o_ref):
        o_ref[...] = plgpu.broadcasted_iota(dtype, (128, 128), 1, layout=plgpu.Layout.WGMMA)

    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), dtype)), backend=backend)
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(128, dtype=dtype), (128, 128)))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("pair", [(np.float16, np.float16), (np.int16, jnp.bfloat16), (np.int16, np.float16),
                                  (np.uint16, np.float16), (np.float32, np.int32), (np.float32, np.uint32),
                                  (np.uint32, np.int32), (np.int32, np.uint32)], ids=str)
def test_bitcast_convert_type(pair, backend):
    src, dst = pair
    x = np.arange(16 * 8).reshape(16, 8).astype(src)
    f = functools.partial(lax.bitcast_convert_type, new_dtype=dst)
    got = elementwise(f, jax.ShapeDtypeStruct((16, 8), dst), x, backend=backend)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(f)(x)))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_optimization_barrier(backend):
    x = np.arange(128, dtype=np.float32)
    got = elementwise(lax.optimization_barrier, jax.ShapeDtypeStruct((128,), jnp.float32), x, backend=backend)
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_optimization_barrier_multiple_inputs(backend):
    x = np.arange(128, dtype=np.float32)
    got = elementwise(lambda a, b: operator.add(*lax.optimization_barrier([a, b])),
                      jax.ShapeDtypeStruct((128,), jnp.float32), x, x + 1, backend=backend)
    np.testing.assert_array_equal(got, 2 * x + 1)


# 2. Control flow, grids and indices.

@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("force_while", [False, True])
def test_fori_loop_array(force_while, backend):
    x = np.arange(256, dtype=np.int32)
    got = elementwise(lambda v: fori_loop(force_while, 2, 4, lambda i, a: a + i, v),
                      jax.ShapeDtypeStruct((256,), jnp.int32), x, backend=backend)
    np.testing.assert_array_equal(got, x + 2 + 3)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_fori_loop_array_unrolled(unroll, backend):
    x = np.arange(256, dtype=np.int32)
    got = elementwise(lambda v: lax.fori_loop(2, 6, lambda i, a: a + i, v, unroll=unroll),
                      jax.ShapeDtypeStruct((256,), jnp.int32), x, backend=backend)
    np.testing.assert_array_equal(got, x + 2 + 3 + 4 + 5)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("force_while", [False, True])
def test_fori_loop_tuple(force_while, backend):
    def kernel(o_ref):
        def body(step, xs):
            return tuple(lax.cond(step % 2 == 0, lambda v: v + 1, lambda v: v, x) for x in xs)

        o_ref[...] = lax.broadcast(sum(fori_loop(force_while, 2, 4, body, (jnp.int32(0),) * 3)), o_ref.shape)

    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.int32)), backend=backend)
    np.testing.assert_array_equal(got, np.full(256, 3, np.int32))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("force_while", [False, True])
def test_fori_loop_indexed_store(force_while, backend):
    def kernel(x_ref, y_ref, o_ref):
        def body(idx, _):
            o_ref[idx] = x_ref[idx] + y_ref[idx]
            return ()

        fori_loop(force_while, 0, x_ref.shape[0], body, ())

    x, y = (np.arange(4 * 128, dtype=np.float32).reshape(4, 128) * k for k in (1, 3))
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((4, 128), jnp.float32)), x, y, backend=backend)
    np.testing.assert_array_equal(got, x + y)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_while_loop(backend):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, dtype=jnp.int32)

        def body(i):
            o_ref[...] += x_ref[i]
            return i + 1

        lax.while_loop(lambda i: jnp.sum(o_ref[...], dtype=jnp.int32) < 1280, body, 0)

    x = np.ones((128, 128), np.int32)
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128,), jnp.int32)), x, backend=backend)
    np.testing.assert_array_equal(got, np.full(128, 10, np.int32))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_run_scoped(backend):
    def kernel(x_ref, o_ref):
        def body(tmp_ref):
            tmp_ref[...] = x_ref[...] + 1.0
            return tmp_ref[...]

        o_ref[...] = pl.run_scoped(body, plgpu.SMEM((8, 128), jnp.float32))

    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32)), x, backend=backend)
    np.testing.assert_array_equal(got, x + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_program_id(backend):
    def kernel(o_ref):
        i = lax.axis_index("g")
        o_ref[pl.ds(i * 128, 128)] = jnp.full((128,), i, jnp.int32)

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.int32), grid=(2,), grid_names=("g",))
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), np.repeat(np.arange(2, dtype=np.int32), 128))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_program_id_in_squashed_grid(backend):
    grid, names = (2, 3, 4, 5), ("a", "b", "c", "d")

    def kernel(o_ref):
        idx = [lax.axis_index(n) for n in names]
        linear = ((idx[0] * grid[1] + idx[1]) * grid[2] + idx[2]) * grid[3] + idx[3]
        o_ref[idx[0], idx[1], idx[2], idx[3]] = jnp.full((128,), linear, jnp.int32)

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((*grid, 128), jnp.int32), grid=grid, grid_names=names)
    want = np.broadcast_to(np.arange(120, dtype=np.int32).reshape(*grid, 1), (*grid, 128))
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), want)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_multiple_wg(backend):
    def kernel(o_ref):
        wg = lax.axis_index("wg")
        o_ref[wg] = jnp.broadcast_to(wg, (128,))

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((2, 128), jnp.int32), num_threads=2, thread_name="wg")
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), np.repeat(np.arange(2), 128).reshape(2, 128))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_multiple_wg_with_grid(backend):
    def kernel(o_ref):
        xi, yi, wg = lax.axis_index("x"), lax.axis_index("y"), lax.axis_index("wg")
        value = (yi * 2 + xi) * 2 + wg
        o_ref[xi * 2 + yi, wg] = jnp.broadcast_to(value, (128,))

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((4, 2, 128), jnp.int32), grid=(2, 2),
                          grid_names=("x", "y"), num_threads=2, thread_name="wg")
    want = np.repeat(np.array([0, 1, 4, 5, 2, 3, 6, 7], np.int32), 128).reshape(4, 2, 128)
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), want)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_cond_returning_array(backend):
    def kernel(x_ref, o_ref):
        total = jnp.sum(x_ref[...], dtype=jnp.int32)
        twice, acc = lax.cond(total % 2 == 0, lambda: (total * 2, x_ref[...]), lambda: (total, x_ref[...]))
        o_ref[...] = jnp.broadcast_to(jnp.sum(acc, dtype=jnp.int32) + twice, o_ref.shape)

    x = np.arange(256, dtype=np.int32)
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.int32)), x, backend=backend)
    np.testing.assert_array_equal(got, np.full(256, x.sum() * 3, np.int32))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_cross_wg_barrier(backend):
    def kernel(o_ref, barrier):
        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)
        wg = lax.axis_index("wg")
        o_ref[wg] = jnp.broadcast_to(wg, (128,))

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((2, 128), jnp.int32),
                          scratch_types=[plgpu.Barrier(num_arrivals=2)], num_threads=2, thread_name="wg")
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), np.repeat([0, 1], 128).reshape(2, 128))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_tile_slicing(backend):
    def kernel(x_ref, o_ref):
        def sum_tiles(row, acc):
            for col in range(2):
                acc += x_ref[pl.ds(row * 64, 64), pl.ds(col * 64, 64)]
            return acc

        acc = plgpu.layout_cast(jnp.zeros((64, 64), jnp.uint16), plgpu.Layout.WGMMA)
        o_ref[...] = lax.fori_loop(0, 4, sum_tiles, acc)

    x = np.arange(256 * 128, dtype=np.uint16).reshape(256, 128)
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 64), jnp.uint16)), x, backend=backend)
    np.testing.assert_array_equal(got, x.reshape(4, 64, 2, 64).sum(axis=(0, 2), dtype=np.uint16))


# 3. Copies between global and shared memory, barriers.

@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("indexer", [..., slice(128), slice(None, 128)], ids=["all", "first", "first_none"])
def test_copy_smem_to_gmem(indexer, backend):
    def kernel(x_ref, o_ref, scratch_ref):
        scratch_ref[...] = x_ref[...] + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(scratch_ref.at[indexer], o_ref.at[indexer])
        plgpu.wait_smem_to_gmem(0)

    x = np.arange(256, dtype=np.float32)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                          scratch_types=[plgpu.SMEM((256,), jnp.float32)])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend)[indexer], x[indexer] + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_copy_smem_to_gmem_explicit_commit_group(backend):
    def kernel(x_ref, o_ref, scratch_ref):
        scratch_ref[...] = x_ref[...] + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(scratch_ref, o_ref, commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        plgpu.wait_smem_to_gmem(0)

    x = np.arange(256, dtype=np.float32)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                          scratch_types=[plgpu.SMEM((256,), jnp.float32)])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend), x + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("indexer", [..., slice(128), slice(None, 128)], ids=["all", "first", "first_none"])
def test_copy_gmem_to_smem(indexer, backend):
    def kernel(x_ref, o_ref, scratch_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(x_ref.at[indexer], scratch_ref.at[indexer], barrier_ref)
        plgpu.barrier_wait(barrier_ref)
        o_ref[...] = scratch_ref[...] + 1

    x = np.arange(256, dtype=np.float32)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                          scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend)[indexer], x[indexer] + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("at", [0, 1, 2, 3])
def test_copy_gmem_to_smem_with_indexed_barrier(at, backend):
    def kernel(x_ref, o_ref, scratch_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(x_ref, scratch_ref, barrier_ref.at[at])
        plgpu.barrier_wait(barrier_ref.at[at])
        o_ref[...] = scratch_ref[...] + 1

    x = np.arange(128, dtype=np.float32)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                          scratch_types=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier(num_barriers=4)])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend), x + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_copy_gmem_to_smem_in_run_scoped(backend):
    def kernel(x_ref, o_ref):
        def outer(barrier):
            def inner(s):
                plgpu.copy_gmem_to_smem(x_ref, s, barrier)
                plgpu.barrier_wait(barrier)
                o_ref[...] = s[...] + 1

            pl.run_scoped(inner, plgpu.SMEM((256,), jnp.float32))

        pl.run_scoped(outer, plgpu.Barrier())

    x = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256,), jnp.float32)),
                                         x, backend=backend), x + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("tiles", [((1, 32), 128), ((8, 32), 128), None], ids=["tile1x32", "tile8x32", "none"])
def test_get_swap_with_transforms(tiles, backend):
    ts = (plgpu.TilingTransform(tiles[0]), plgpu.SwizzleTransform(tiles[1])) if tiles else ()

    def kernel(x_ref, o_ref, scratch_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(x_ref, scratch_ref, barrier_ref)
        plgpu.barrier_wait(barrier_ref)
        scratch_ref[...] = scratch_ref[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(scratch_ref, o_ref)
        plgpu.wait_smem_to_gmem(0)

    x = np.arange(128 * 128, dtype=np.int32).reshape(128, 128)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), jnp.int32),
                          scratch_types=[plgpu.SMEM((128, 128), jnp.int32, transforms=ts), plgpu.Barrier()])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend), x * 2)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_stage3(backend):
    rows, cols = 64, 128

    def kernel(l_ref, r_ref, o_ref, l_smem, r_smem, o_smem, barrier):
        mine = pl.ds(lax.axis_index("rows") * rows, rows)
        plgpu.copy_gmem_to_smem(l_ref.at[mine], l_smem, barrier)
        plgpu.copy_gmem_to_smem(r_ref.at[mine], r_smem, barrier)
        plgpu.barrier_wait(barrier)
        o_smem[...] = l_smem[...] + r_smem[...]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_ref.at[mine])
        plgpu.wait_smem_to_gmem(0)

    x = np.arange(128 * 128, dtype=np.float16).reshape(128, 128)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float16),
                          scratch_types=[*([plgpu.SMEM((rows, cols), jnp.float16)] * 3), plgpu.Barrier(num_arrivals=2)],
                          grid=(2,), grid_names=("rows",))
    np.testing.assert_allclose(tp.run(kernel, x, x, backend=backend), x + x)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_manual_double_buffer(backend):
    """The original's `PipelineTest.test_manual`: two stages refilled by hand."""
    stages, steps = 2, 4

    def kernel(x_gmem, o_gmem):
        def scoped(x_smem, o_smem, barrier):
            rows = pl.ds(lax.axis_index("x") * 32, 32)

            def body(step, _):
                slot = step % stages
                plgpu.barrier_wait(barrier.at[slot])
                plgpu.wait_smem_to_gmem(stages - 1)
                o_smem.at[slot][...] = x_smem.at[slot][...] + 1.0
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem.at[slot], o_gmem.at[rows, pl.ds(step * 16, 16)])
                fetch = step + stages
                lax.cond(fetch < steps,
                         lambda: plgpu.copy_gmem_to_smem(x_gmem.at[rows, pl.ds(fetch * 16, 16)], x_smem.at[slot],
                                                         barrier.at[slot]),
                         lambda: None)
                return ()

            for slot in range(stages):
                plgpu.copy_gmem_to_smem(x_gmem.at[rows, pl.ds(slot * 16, 16)], x_smem.at[slot], barrier.at[slot])
            lax.fori_loop(0, steps, body, ())
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped, plgpu.SMEM((stages, 32, 16), jnp.float32), plgpu.SMEM((stages, 32, 16), jnp.float32),
                      plgpu.Barrier(num_barriers=stages))

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 64), jnp.float32), grid=(4, 1),
                          grid_names=("x", "y"))
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend), x + 1)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_barrier_repeated_indexing(backend):
    def kernel(o_ref, barrier_ref):
        plgpu.barrier_arrive(barrier_ref.at[2:4].at[1:2])
        plgpu.barrier_wait(barrier_ref.at[3])
        o_ref[...] = jnp.ones_like(o_ref)

    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                          scratch_types=[plgpu.Barrier(num_barriers=4)])
    np.testing.assert_array_equal(tp.run(kernel, backend=backend), np.ones(128, np.float32))


GMEM_INDEXERS = {
    "1d_none": ((256,), (slice(0, 128), slice(None, 32))),
    "1d_offset": ((256,), (slice(32, 96), slice(0, 32))),
    "2d_extract": ((64, 64), (4, slice(0, 64))),
}


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("case", list(GMEM_INDEXERS))
def test_copy_smem_to_gmem_with_multiple_gmem_indexers(case, backend):
    shape, indexers = GMEM_INDEXERS[case]

    def kernel(x_ref, o_ref, scratch_ref):
        scratch_ref[...] = x_ref[...] + 1
        plgpu.commit_smem()
        src, dst = scratch_ref, o_ref
        for ix in indexers:
            src, dst = src.at[ix], dst.at[ix]
        plgpu.copy_smem_to_gmem(src, dst)
        plgpu.wait_smem_to_gmem(0)

    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(shape, jnp.float32),
                          scratch_types=[plgpu.SMEM(shape, jnp.float32)])
    got, want = tp.run(kernel, x, backend=backend), x + 1
    for ix in indexers:
        got, want = got[ix], want[ix]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("case", list(GMEM_INDEXERS))
def test_copy_gmem_to_smem_with_multiple_gmem_indexers(case, backend):
    shape, indexers = GMEM_INDEXERS[case]

    def kernel(x_ref, o_ref, scratch_ref, barrier_ref):
        src, dst = x_ref, scratch_ref
        for ix in indexers:
            src, dst = src.at[ix], dst.at[ix]
        plgpu.copy_gmem_to_smem(src, dst, barrier_ref)
        plgpu.barrier_wait(barrier_ref)
        o_ref[...] = scratch_ref[...] + 1

    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(shape, jnp.float32),
                          scratch_types=[plgpu.SMEM(shape, jnp.float32), plgpu.Barrier()])
    got, want = tp.run(kernel, x, backend=backend), x + 1
    for ix in indexers:
        got, want = got[ix], want[ix]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_gmem_to_smem_with_multiple_smem_indexers(backend):
    def kernel(x_ref, o_ref, scratch_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(x_ref, scratch_ref, barrier_ref)
        plgpu.barrier_wait(barrier_ref)
        o_ref[pl.ds(0, 32)] = scratch_ref.at[0, :, :][pl.ds(0, 32)]
        o_ref[pl.ds(32, 32)] = scratch_ref.at[0, :, :][pl.ds(32, 32)]

    x = np.arange(2 * 64 * 64, dtype=np.float32).reshape(2, 64, 64)
    kernel = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                          scratch_types=[plgpu.SMEM((2, 64, 64), jnp.float32), plgpu.Barrier()])
    np.testing.assert_array_equal(tp.run(kernel, x, backend=backend), x[0])


# 6. Reductions and layouts.

@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
@pytest.mark.parametrize("shape", [(128,), (128, 64)], ids=str)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_scalar_reduce(op, shape, dtype, backend):
    f = getattr(jnp, op)
    x = np.arange(np.prod(shape)).reshape(shape)
    if dtype != np.uint32:
        x = x - x.size // 2
    x = x.astype(dtype)

    def kernel(x_ref, o_ref):
        o_ref[...] = f(x_ref[...])

    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((), dtype)), x, backend=backend)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(f)(x)))


@pytest.mark.parametrize("backend", concurrent_backends())
def test_add_doubled_sum(backend):
    x = np.arange(128, dtype=np.float32)
    got = elementwise(lambda v: v + jnp.sum(v) + jnp.sum(v), jax.ShapeDtypeStruct((128,), jnp.float32), x,
                      backend=backend)
    np.testing.assert_array_equal(got, x + 2 * x.sum())


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("factor", [0.001, 1, 10, 100])
def test_layer_norm(factor, backend):
    def norm(x):
        mean = jnp.mean(x)
        centered = x - mean
        return centered * lax.rsqrt(jnp.mean(centered * centered) + 1e-5)

    x = (RNG.uniform(size=256) * factor).astype(np.float32)
    got = elementwise(norm, jax.ShapeDtypeStruct((256,), jnp.float32), x, backend=backend)
    centered = x.astype(np.float64) - x.mean(dtype=np.float64)
    np.testing.assert_allclose(got, centered / np.sqrt((centered ** 2).mean() + 1e-5), rtol=6e-5, atol=1e-6)


@pytest.mark.parametrize("backend", concurrent_backends())
def test_layout_cast(backend):
    def kernel(o_ref):
        o_ref[...] = plgpu.layout_cast(jnp.full(o_ref.shape, 42.0, jnp.float32), plgpu.Layout.WGMMA)

    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((256, 64), jnp.float32)), backend=backend)
    np.testing.assert_array_equal(got, np.full((256, 64), 42.0, np.float32))


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("axis", [0, 1])
def test_broadcast_in_dim(axis, backend):
    def kernel(x_ref, o_ref):
        x = plgpu.load(x_ref, (), layout=plgpu.Layout.WGMMA.reduce(axis))
        o_ref[...] = lax.broadcast_in_dim(x, (128, 128), (1 - axis,))

    x = np.arange(128, dtype=np.float32)
    got = tp.run(plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32)), x, backend=backend)
    np.testing.assert_array_equal(got, np.broadcast_to(x[None, :] if axis == 0 else x[:, None], (128, 128)))
