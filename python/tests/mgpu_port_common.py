"""Helpers of the port of JAX's Mosaic GPU tests (`test_pallas_mosaic_gpu_port*.py`): the shared
memory transforms those tests give by default, the original harness's whole-array staging, and
seeded inputs."""

import numpy as np
import pytest

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from tessel import pallas as tp

plgpu = pytest.importorskip("jax.experimental.pallas.mosaic_gpu")
RNG = np.random.default_rng(267)


def transforms(dtype, swizzle=128):
    """The tiling and swizzle Pallas's Mosaic GPU tests give shared memory by default."""
    elems = swizzle * 8 // jnp.dtype(dtype).itemsize // 8
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def staged(body, out_type, *args, backend, swizzled=True):
    """Runs `body(*in_smem, out_smem)` with each argument staged whole into shared memory (by a
    copy on one barrier) and the output copied back: the original harness's `pallas_call` with
    whole-array blocks."""

    def kernel(*refs):
        ins, out = refs[:-1], refs[-1]

        def scoped(*scratch):
            *smem, out_smem, barrier = scratch
            for g, s in zip(ins, smem):
                plgpu.copy_gmem_to_smem(g, s, barrier)
            plgpu.barrier_wait(barrier)
            body(*smem, out_smem)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, out)
            plgpu.wait_smem_to_gmem(0)

        smem = lambda x: plgpu.SMEM(x.shape, x.dtype, transforms=transforms(x.dtype) if swizzled and x.ndim == 2 else ())  # noqa: E731
        pl.run_scoped(scoped, *map(smem, args), plgpu.SMEM(out_type.shape, out_type.dtype),
                      plgpu.Barrier(num_arrivals=len(args)))

    return tp.run(plgpu.kernel(kernel, out_type=out_type), *args, backend=backend)


def elementwise(f, out_type, *args, backend):
    """`o = f(*inputs)` in a kernel of whole arrays in global memory."""

    def kernel(*refs):
        refs[-1][...] = f(*(r[...] for r in refs[:-1]))

    return tp.run(plgpu.kernel(kernel, out_type=out_type), *args, backend=backend)


def fori_loop(force_while, lb, ub, body, init):
    """The original's `_fori_loop`: array bounds make JAX trace a `while`."""
    if force_while:
        lb, ub = jnp.asarray(lb), jnp.asarray(ub)
    return lax.fori_loop(lb, ub, body, init)


def uniform(shape, dtype=np.float16):
    return RNG.uniform(size=shape).astype(dtype)
