"""JAX's Mosaic GPU ops on the CPU: tessel's interpreter (the ops unchanged, inside `jax.jit`
under `tp.installed("interpret")`) beside Pallas's own GPU interpret mode (`plgpu.kernel(...,
interpret=InterpretGPUParams())`, the only other way to run them without a Hopper GPU), on the
kernels the latter runs (jax 0.10.2: the Hopper matmul and the ragged dot). Each is jitted,
warmed up and checked against the other, then timed in alternating rounds; prints a markdown
section for docs/performance.md.

    JAX_PLATFORMS=cpu target/venv/bin/python benches/mosaic_gpu_interpret.py
"""

import functools
import statistics
import sys
import time
import types

import numpy as np

import jax
import jax.numpy as jnp
from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd
from tessel import pallas as tp

ROUNDS = 5


class _Cores:
    core_count = 2


def with_pallas_interpret(module, fn):
    """`fn` with `module`'s `plgpu.kernel` given Pallas's GPU interpret mode."""
    real = module.plgpu

    def kernel(*a, **k):
        k["interpret"] = InterpretGPUParams()
        return real.kernel(*a, **k)

    def run(*args):
        module.plgpu = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
        module.plgpu.kernel = kernel
        try:
            return fn(*args)
        finally:
            module.plgpu = real

    return run


def timed(f, args):
    out = jax.block_until_ready(f(*args))
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    return out, time.perf_counter() - start


def measure(name, module, op, args):
    ours = jax.jit(op)
    pallas = jax.jit(with_pallas_interpret(module, op))
    with tp.installed(backend="interpret"):
        a, _ = timed(ours, args)
    b, _ = timed(pallas, args)
    err = float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
    t_ours, t_pallas = [], []
    for _ in range(ROUNDS):
        with tp.installed(backend="interpret"):
            t_ours.append(timed(ours, args)[1])
        t_pallas.append(timed(pallas, args)[1])
    ms_ours, ms_pallas = statistics.median(t_ours) * 1e3, statistics.median(t_pallas) * 1e3
    return f"| {name} | {ms_ours:.1f} | {ms_pallas:.1f} | **{ms_pallas / ms_ours:.0f}×** | {err:.3g} |"


def main() -> int:
    hm.get_num_sms = lambda: 2
    rng = np.random.default_rng(0)
    rows = []
    cfg = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_m=64, epi_tile_n=64)
    a = rng.standard_normal((256, 256)).astype(np.float16)
    b = rng.standard_normal((256, 256)).astype(np.float16)
    rows.append(measure("`hopper_matmul_mgpu` f16 256×256×256 (tiles 64, 3 warpgroups)", hm, lambda a, b: hm.matmul(a, b, None, cfg), (a, b)))
    lhs = rng.standard_normal((256, 128)).astype(np.float16)
    rhs = rng.standard_normal((4, 128, 128)).astype(np.float16)
    sizes = np.array([64, 0, 128, 64], np.int32)
    ragged = functools.partial(rd.ragged_dot, block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, grid_block_n=1)
    devices = jax.devices

    def op(l, r, g):
        jax.devices = lambda *x: [types.SimpleNamespace(core_count=2, **{"platform": d.platform}) for d in devices(*x)]
        try:
            return ragged(l, r, group_sizes=g)
        finally:
            jax.devices = devices

    rows.append(measure("`ragged_dot_mgpu` f16 256×128 by 4 groups of 128×128", rd, op, (lhs, rhs, sizes)))
    print("## JAX's Mosaic GPU ops on the CPU: tessel's interpreter beside Pallas's GPU interpret mode")
    print()
    print("The ops unchanged inside `jax.jit` (`benches/mosaic_gpu_interpret.py`; medians of 5 calls after a")
    print("warm-up, alternating). tessel runs them through its concurrent model with every race check on;")
    print("Pallas's GPU interpret mode (jax 0.10.2, `InterpretGPUParams()`) runs each warpgroup as a Python")
    print("thread. Both results agree to the last column's largest difference. The only other way to run")
    print("these kernels is a Hopper GPU.")
    print()
    print("| kernel | tessel interpret (ms) | Pallas GPU interpret (ms) | Pallas / tessel | max difference |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
