"""The interpreter against numpy, in one process and one run: benches/kernels/matmul_512.tk,
softmax_4096.tk and add_4m.tk through the Python module (inputs read in place, outputs written
once) beside the numpy expression a CPU user would write instead (`a @ b` on numpy's BLAS, the
row softmax, `x + y`). Each figure is the median of many timed calls after a warm-up, tessel's and
numpy's in alternating rounds; both sides allocate their outputs every call. Prints markdown table rows, and the tessel/numpy speed ratio
(above 1: tessel faster) against issue 14's goal.

Run by scripts/bench with the module built in release; alone:
`target/venv/bin/python benches/cpu_numpy.py`. `TESSEL_BENCH_THREADS=1` runs both sides on one
core (rayon's pool, the cpu plugin's included, and numpy's BLAS each of one thread)."""

import os
import pathlib
import statistics
import time

# numpy's BLAS at its best on this machine: the tuning variables some images set for other
# programs are dropped before numpy loads it.
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(var, None)
if os.environ.get("TESSEL_BENCH_THREADS") == "1":
    for var in ("RAYON_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = "1"

import numpy as np  # noqa: E402

import tessel  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def alternating_ms(f, g, rounds=6, calls=10, warm_s=0.05):
    """Medians (ms) of timed calls of `f` and of `g` in alternating rounds of `calls` each, so that
    the machine's drift over seconds reaches both alike. Each round starts after a pause and
    `warm_s` of untimed calls: the other side's threads (OpenBLAS's, rayon's) spin for a while
    after their last call and would otherwise be timed as this side's cost, and the cores (a
    virtual machine's above all) take a few milliseconds of work to come back from idle."""
    tf, tg = [], []
    for _ in range(rounds):
        for fn, times in ((f, tf), (g, tg)):
            time.sleep(0.5)
            start = time.perf_counter()
            while time.perf_counter() - start < warm_s:
                fn()
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
    return statistics.median(tf) * 1e3, statistics.median(tg) * 1e3


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# `TESSEL_BENCH_BACKEND=cpu` (with the plugin on TESSEL_PLUGIN_PATH) times the compiling CPU
# backend instead of the interpreter; each row then also has the bias + gelu kernel.
backend = os.environ.get("TESSEL_BENCH_BACKEND", "interpret")
rng = np.random.default_rng(1)


def gelu(x, b):
    h = x + b
    return 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


cases = [
    ("matmul 512³ f32", "matmul_512", lambda a, b: a @ b, 0.5),
    ("softmax 4096×256 f32", "softmax_4096", softmax, 1.0),
    ("add 4M f32", "add_4m", lambda x, y: x + y, 0.9),
] + ([("bias + gelu 4096×1024 f32", "bias_gelu_4096", gelu, 1.0)] if backend != "interpret" else [])
for label, name, numpy_fn, goal in cases:
    k = tessel.load(ROOT / f"benches/kernels/{name}.tk")
    arrays = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, (_, s) in k.inputs.items()}
    # The kernels' outputs agree with numpy's before anything is timed.
    got = next(iter(k(backend=backend, **arrays).values()))
    want = numpy_fn(*arrays.values())
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), f"{name} disagrees with numpy"
    t, n = alternating_ms(lambda: k(backend=backend, **arrays), lambda: numpy_fn(*arrays.values()))
    ratio = n / t
    print(f"| {label} | {t:.2f} | {n:.2f} | {ratio:.2f}× | {goal}× {'met' if ratio >= goal else 'missed'} |")
