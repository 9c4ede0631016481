"""tessel inside JAX on an NVIDIA GPU, each figure beside XLA's own code for the same maths in the
same run: `tessel.jax.call(..., backend="mosaic-gpu")` in `jax.jit`, enqueued on XLA's stream
with device pointers, against the `jnp` XLA compiles (a bf16 matmul: cuBLAS through XLA; an add
and a softmax: XLA's fused kernels), and the per-call overhead against a jitted `x + 1`.

Every figure is the median of rounds of `calls` back-to-back calls, timed to
`block_until_ready`, inputs already on the device, after a warm-up. Run by `scripts/gpu-check`
on a lent Hopper: `python3 benches/jax_cuda.py`."""

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import tessel
import tessel.jax as tj

ROOT = Path(__file__).resolve().parents[1]


def per_call(f, args, calls=20, rounds=5):
    """Median seconds a call over `rounds` rounds of `calls` back-to-back calls."""
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def main() -> int:
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(1)
    put = lambda x: jax.device_put(x, gpu)  # noqa: E731
    kernel = lambda name: tessel.load(ROOT / "benches" / "kernels" / f"{name}.tk")  # noqa: E731
    print(f"jax {jax.__version__} on {gpu.device_kind}; tessel.jax.call(backend='mosaic-gpu') in jax.jit against XLA's jnp")
    print(f"{'workload':<30} {'tessel':>12} {'XLA':>12} {'tessel/XLA':>11}")
    failures = 0

    def row(name, unit, work, ours, theirs, check):
        nonlocal failures
        ok = check()
        failures += not ok
        t, x = work / ours, work / theirs
        print(f"{name:<30} {t:>9.1f} {unit:<2} {x:>9.1f} {unit:<2} {t / x:>10.2f}{'' if ok else '  WRONG'}")

    a = rng.standard_normal((4096, 4096)).astype(jnp.bfloat16)
    b = rng.standard_normal((4096, 4096)).astype(jnp.bfloat16)
    ga, gb = put(a), put(b)
    mm = kernel("matmul_bf16_4096")
    ours = jax.jit(lambda a, b: tj.call(mm, a, b, backend="mosaic-gpu"))
    theirs = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))

    def same_matmul():
        got, want = np.asarray(ours(ga, gb)), np.asarray(theirs(ga, gb))
        return bool(np.allclose(got, want, rtol=1e-2, atol=1e-1))

    row("matmul bf16 4096^3 (TFLOP/s)", "", 2 * 4096**3 / 1e12, per_call(ours, (ga, gb)), per_call(theirs, (ga, gb)), same_matmul)

    n = 1 << 24
    x, y = put(rng.standard_normal(n).astype(np.float32)), put(rng.standard_normal(n).astype(np.float32))
    add = kernel("add_16m")
    ours = jax.jit(lambda x, y: tj.call(add, x, y, backend="mosaic-gpu"))
    theirs = jax.jit(lambda x, y: x + y)
    row("add 16M f32 (GB/s)", "", 12 * n / 1e9, per_call(ours, (x, y)), per_call(theirs, (x, y)),
        lambda: bool(np.array_equal(np.asarray(ours(x, y)), np.asarray(theirs(x, y)))))

    s = put(rng.standard_normal((16384, 512)).astype(np.float32))
    soft = kernel("softmax_16384")
    ours = jax.jit(lambda s: tj.call(soft, s, backend="mosaic-gpu"))
    theirs = jax.jit(lambda s: jax.nn.softmax(s, axis=1))
    row("softmax 16384x512 f32 (GB/s)", "", 8 * 16384 * 512 / 1e9, per_call(ours, (s,)), per_call(theirs, (s,)),
        lambda: bool(np.allclose(np.asarray(ours(s)), np.asarray(theirs(s)), rtol=1e-5, atol=1e-7)))

    small = tessel.load(ROOT / "examples" / "add.tk")
    v = put(np.ones(128, np.float32))
    ours = jax.jit(lambda v: tj.call(small, v, v, backend="mosaic-gpu", params={"B": 128}))
    theirs = jax.jit(lambda v: v + 1.0)
    t, x = per_call(ours, (v,), calls=500), per_call(theirs, (v,), calls=500)
    print(f"{'per call, 128 floats (us)':<30} {t * 1e6:>12.1f} {x * 1e6:>12.1f} {t / x:>10.2f}  (XLA: a jitted v + 1)")
    stats = tj.stats()
    print(f"handler: {stats['calls']} calls, {stats['staged']} through host copies, launches {stats['launches']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
