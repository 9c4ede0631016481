"""JAX's Mosaic GPU ops (`jax.experimental.pallas.ops.gpu.*_mgpu`, written with `plgpu.kernel`) on
a Hopper GPU, each timed two ways in the same run: as JAX compiles it (Pallas's own Mosaic GPU
backend) and as tessel runs it (the op unchanged, inside `jax.jit` under
`tessel.pallas.installed("mosaic-gpu")`: tessel's PTX with its warpgroups at once, mbarriers, TMA
and `wgmma`), with the ratio. Each tessel result is checked against JAX's first. Every figure is
the median of rounds of back-to-back calls timed to `block_until_ready`, after a warm-up.

    python3 benches/mgpu_ops.py            # on a Hopper GPU: scripts/gpu-check runs it
    python3 benches/mgpu_ops.py --lower    # anywhere: each op at the timed size lowers for
                                           # mosaic-gpu (TMA, wgmma, ptxas if found), no device

On a machine without a GPU the ops read an SM count and a CUDA version that is not there:
`--lower` gives them (132 SMs, CUDA 12.9), never the ops."""

import argparse
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import attention_mgpu as am
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd

import tessel
from tessel import pallas as tp

from jax_cuda import per_call  # the same timing as tessel's other JAX figures

F16 = jnp.float16


def ops(rng):
    """Each op at its timed size: (name, function, arguments, FLOPs)."""
    m = n = k = 4096
    a = rng.standard_normal((m, k)).astype(F16)
    b = rng.standard_normal((k, n)).astype(F16)
    matmul = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, epi_tile_m=64, epi_tile_n=64)
    batch, seq, heads, dim = 1, 4096, 4, 128
    q, kk, v = (rng.standard_normal((batch, seq, heads, dim)).astype(F16) for _ in range(3))
    attention = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    groups, rows = 8, 4096
    lhs = rng.standard_normal((rows, k)).astype(F16)
    rhs = rng.standard_normal((groups, k, n)).astype(F16)
    sizes = np.full(groups, rows // groups, np.int32)
    ragged = dict(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, grid_block_n=1)
    return [
        ("hopper_matmul f16 4096^3", lambda a, b: hm.matmul(a, b, None, matmul), (a, b), 2 * m * n * k),
        ("attention f16 4096x4x128", lambda q, k, v: am.attention(q, k, v, attention), (q, kk, v), 4 * batch * heads * seq * seq * dim),
        ("ragged_dot f16 8 groups", lambda l, r, g: rd.ragged_dot(l, r, group_sizes=g, **ragged), (lhs, rhs, sizes), 2 * rows * n * k),
    ]


def time_on_gpu() -> int:
    gpu = jax.devices("gpu")[0]
    print(f"jax {jax.__version__} on {gpu.device_kind}: JAX's Mosaic GPU compile against tessel's mosaic-gpu, in jax.jit")
    print(f"{'op':<28} {'JAX (TFLOP/s)':>14} {'tessel (TFLOP/s)':>17} {'tessel/JAX':>11}")
    failures = 0
    for name, f, args, flops in ops(np.random.default_rng(1)):
        args = [jax.device_put(x, gpu) for x in args]
        theirs = jax.jit(f)
        with tp.installed("mosaic-gpu"):
            ours = jax.jit(f)
            got = np.asarray(ours(*args), np.float32)
        want = np.asarray(theirs(*args), np.float32)
        ok = np.allclose(got, want, atol=2e-2, rtol=2e-2)
        failures += not ok
        t_theirs = per_call(theirs, args, calls=10)
        with tp.installed("mosaic-gpu"):
            t_ours = per_call(ours, args, calls=10)
        x, t = flops / t_theirs / 1e12, flops / t_ours / 1e12
        print(f"{name:<28} {x:>14.1f} {t:>17.1f} {t / x:>11.2f}{'' if ok else '  WRONG'}")
    return 1 if failures else 0


class _Cores:
    """A device as the ops read it off a GPU: with an H100's SM count."""

    core_count = 132

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)


@contextlib.contextmanager
def device_facts():
    """While an op is traced: 132 SMs and CUDA 12.9, as a Hopper machine would say."""
    devices, sms, cuda = jax.devices, hm.get_num_sms, am.cuda_versions
    jax.devices = lambda *a: [_Cores(d) for d in devices(*a)]
    hm.get_num_sms = lambda: 132
    am.cuda_versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 12091)
    try:
        yield
    finally:
        jax.devices, hm.get_num_sms, am.cuda_versions = devices, sms, cuda


def lower_only() -> int:
    """Each op at its timed size translated and lowered for mosaic-gpu: copies by TMA, products on
    `wgmma`, and `ptxas` (from the `nvidia-cuda-nvcc` wheel, if installed) takes it."""
    ptxas = next(iter(sorted(glob.glob(f"{sys.prefix}/lib/python3*/site-packages/nvidia/*/bin/ptxas"))), None)
    failures = 0
    for name, f, args, _ in ops(np.random.default_rng(1)):
        with device_facts():
            translations = tp.translate(f, *args)
        for i, t in enumerate(translations):
            try:
                ptx = tessel.compile(t.text).lower("mosaic-gpu", mesh=t.mesh)
            except tessel.TesselError as e:
                failures += 1
                print(f"{name}[{i}]: refused: {str(e).splitlines()[0]}")
                continue
            info = ""
            if ptxas:
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "k.ptx")
                    with open(path, "w") as out:
                        out.write(ptx)
                    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")], capture_output=True, text=True)
                failures += r.returncode != 0
                info = "; ".join(line.split("info    : ")[-1].strip() for line in r.stderr.splitlines() if "spill" in line or "Used" in line)
            wgmma, tma = ptx.count("wgmma.mma_async"), ptx.count("cp.async.bulk.tensor")
            failures += not (wgmma and tma)
            print(f"{name}[{i}]: {wgmma} wgmma, {tma} tensor copies; {info or 'no ptxas here'}")
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lower", action="store_true", help="lower each op for mosaic-gpu, no device")
    sys.exit(lower_only() if parser.parse_args().lower else time_on_gpu())
