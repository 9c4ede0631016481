"""tessel's cpu backend (the compiling plugin) inside `jax.jit`, beside XLA's own compiled code for
the same maths and beside tessel's interpreter, in one run (issue 56's table):

- Pallas kernels under `tessel.pallas.installed(backend=...)` in `jax.jit`, on `cpu` and on
  `interpret`, each timed alternately with XLA's `jnp` for the same maths (`paired`: the ratio is
  what matters, this machine's speed drifts);
- the first call of each (trace, lower, C compiled or read from the disk cache, run) beside
  XLA's first call of the `jnp`.

Needs the plugin on the path: `TESSEL_PLUGIN_PATH=target/release/libtessel_cpu.so
JAX_PLATFORMS=cpu target/venv/bin/python benches/cpu_jax.py [--quick]`. Prints a Markdown table
for docs/performance.md."""

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

sys.path.insert(0, str(Path(__file__).parent))
import pallas_interpret as kernels  # noqa: E402

import tessel.jax as tj  # noqa: E402
from tessel import pallas as tp  # noqa: E402


def paired(fs, args, calls, rounds=6, warm_s=0.05):
    """The median seconds of each of `fs` on `args`: rounds of `calls // rounds` timed calls each,
    in turn, so that the machine's drift reaches all alike. Each round starts after a pause and
    `warm_s` of untimed calls: the other side's threads (XLA's pool, rayon's) spin for a while
    after their last call and would otherwise be timed as this side's cost (as
    benches/cpu_numpy.py does)."""
    times = [[] for _ in fs]
    for _ in range(rounds):
        for f, ts in zip(fs, times):
            time.sleep(0.2)
            start = time.perf_counter()
            while time.perf_counter() - start < warm_s:
                jax.block_until_ready(f(*args))
            for _ in range(max(1, calls // rounds)):
                t = time.perf_counter()
                jax.block_until_ready(f(*args))
                ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def first_call(f, args):
    jax.clear_caches()
    t = time.perf_counter()
    jax.block_until_ready(jax.jit(f)(*args))
    return time.perf_counter() - t


def matmul(n, block):
    """c = a @ b in `block`-square tiles, the contraction a `seq` grid axis accumulated into c."""
    steps = n // block

    def body(a_ref, b_ref, c_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            c_ref[...] = jnp.zeros_like(c_ref)

        c_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
        grid=(steps, steps, steps),
        in_specs=[pl.BlockSpec((block, block), lambda i, j, k: (i, k)), pl.BlockSpec((block, block), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
    )
    return f, [(n, n), (n, n)], jnp.matmul


def bias_gelu(rows=4096, cols=1024, block=64):
    """gelu(x + b), `jax.nn.gelu`'s tanh form, in row blocks."""

    def body(x_ref, b_ref, o_ref):
        o_ref[...] = jax.nn.gelu(x_ref[...] + b_ref[...], approximate=True)

    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
        grid=(rows // block,),
        in_specs=[pl.BlockSpec((block, cols), lambda i: (i, 0)), pl.BlockSpec((1, cols), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block, cols), lambda i: (i, 0)),
    )
    return f, [(rows, cols), (1, cols)], lambda x, b: jax.nn.gelu(x + b, approximate=True)


def layer_norm(rows=4096, cols=1024, block=64):
    """(x - mean) / sqrt(var + 1e-5) * g + b over rows, in row blocks."""

    def ln(x, g, b):
        m = x.mean(axis=1, keepdims=True)
        v = ((x - m) ** 2).mean(axis=1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

    def body(x_ref, g_ref, b_ref, o_ref):
        o_ref[...] = ln(x_ref[...], g_ref[...], b_ref[...])

    row = pl.BlockSpec((1, cols), lambda i: (0, 0))
    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
        grid=(rows // block,),
        in_specs=[pl.BlockSpec((block, cols), lambda i: (i, 0)), row, row],
        out_specs=pl.BlockSpec((block, cols), lambda i: (i, 0)),
    )
    return f, [(rows, cols), (1, cols), (1, cols)], ln


def softmax():
    f, shapes = kernels.softmax_4096(interpret=False)
    return f, shapes, lambda x: jax.nn.softmax(x, axis=1)


def mha():
    from jax.experimental.pallas.ops.gpu import attention as att

    f = lambda q, k, v: att.mha(q, k, v, segment_ids=None)  # noqa: E731
    return f, [(1, 1024, 4, 64)] * 3, lambda q, k, v: att.mha_reference(q, k, v, segment_ids=None)


def tpu_flash():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    f = lambda q, k, v: fa.flash_attention(q, k, v)  # noqa: E731
    return f, [(1, 4, 1024, 64)] * 3, lambda q, k, v: fa.mha_reference(q, k, v, ab=None)


def megablox_gmm(m=2048, k=512, n=512, groups=8):
    """JAX's megablox grouped matmul (a mixture of experts' layer: rows of `lhs` in groups, each
    group times its own `rhs`), groups of uneven sizes, 128-cubed tiles. XLA's side is the best
    `jnp` for sizes known when tracing: one product per group of static rows (`lax.ragged_dot`,
    which takes the sizes as data, makes every group's product over all rows on the CPU)."""
    import importlib

    ops = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.ops")
    sizes = [m // groups + (m // (4 * groups)) * (1 if g % 2 else -1) for g in range(groups)]
    starts = np.cumsum([0] + sizes[:-1])
    group_sizes = jnp.asarray(np.array(sizes, dtype=np.int32))
    f = lambda lhs, rhs: ops.gmm(lhs, rhs, group_sizes, jnp.float32, (128, 128, 128))  # noqa: E731

    def maths(lhs, rhs):
        return jnp.concatenate([lhs[a:a + s] @ rhs[g] for g, (a, s) in enumerate(zip(starts, sizes))])

    return f, [(m, k), (groups, k, n)], maths


CASES = {
    "matmul 512 (64² tiles)": lambda: matmul(512, 64),
    "matmul 2048 (256² tiles)": lambda: matmul(2048, 256),
    "softmax 4096×256": softmax,
    "bias + gelu (tanh) 4096×1024": bias_gelu,
    "layer norm 4096×1024": layer_norm,
    "`ops.gpu.attention.mha` 1×1024×4×64": mha,
    "`ops.tpu.flash_attention` 1×4×1024×64": tpu_flash,
    "`ops.tpu.megablox.gmm` 2048×512×512, 8 groups": megablox_gmm,
}


def first_calls(only):
    """The first call of each case in a fresh process (trace, lower, compile, run): on cpu with a
    disk cache holding only the product library (the C compiled; the library is built by the
    machine's first kernel with a `dot`, timed here once), again in another process with the same
    cache (the library read back), and XLA's own first call of the `jnp`."""
    import os
    import subprocess
    import tempfile

    print("| kernel | cpu, cold (C compiled) | cpu, from the disk cache | XLA `jnp` |")
    print("|---|---:|---:|---:|")
    for name in CASES:
        if only and only not in name:
            continue
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TESSEL_CACHE_DIR=cache)
            t = []
            prime = subprocess.run([sys.executable, __file__, "--first-call", "prime", "--only", name], env=env,
                                   capture_output=True, text=True, check=True).stdout
            if name == next(iter(CASES)):
                print(f"# the product library, cold, with a 64² matmul: {float(prime.split()[-1]) * 1e3:.0f} ms", file=sys.stderr)
            for what in ("cpu", "cpu", "xla"):
                out = subprocess.run([sys.executable, __file__, "--first-call", what, "--only", name], env=env,
                                     capture_output=True, text=True, check=True).stdout
                t.append(float(out.split()[-1]))
        print(f"| {name} | {t[0] * 1e3:.0f} ms | {t[1] * 1e3:.0f} ms | {t[2] * 1e3:.0f} ms |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="11 calls a kernel instead of 51")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--first-calls", action="store_true", help="only the first calls, cold and from the disk cache")
    ap.add_argument("--first-call", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.first_calls:
        return first_calls(a.only)
    if a.first_call == "prime":
        f, shapes, maths = matmul(64, 64)
        args = [jax.device_put(np.ones(s, np.float32)) for s in shapes]
        with tp.installed(backend="cpu"):
            print(first_call(f, args))
        return
    if a.first_call:
        f, shapes, maths = CASES[a.only]()
        args = [jax.device_put(np.random.default_rng(1).uniform(-1, 1, s).astype(np.float32)) for s in shapes]
        if a.first_call == "xla":
            print(first_call(maths, args))
        else:
            with tp.installed(backend=a.first_call):
                print(first_call(f, args))
        return
    calls = 11 if a.quick else 51
    rng = np.random.default_rng(1)
    rows = []
    for name, make in CASES.items():
        if a.only and a.only not in name:
            continue
        f, shapes, maths = make()
        args = [jax.device_put(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
        want = np.asarray(jax.jit(maths)(*args))
        fns = {}
        firsts = {}
        for backend in ("cpu", "interpret"):
            with tp.installed(backend=backend):
                firsts[backend] = first_call(f, args)
                g = jax.jit(f)
                before = tj.stats()["launches"].get(backend, 0)
                got = np.asarray(g(*args))
                if tj.stats()["launches"].get(backend, 0) <= before:
                    raise SystemExit(f"{name} did not run on tessel's {backend} backend")
                err = float(np.max(np.abs(got - want)))
                if err > 1e-3 * max(1.0, float(np.max(np.abs(want)))):
                    raise SystemExit(f"{name} on {backend}: max abs error {err} against XLA")
                fns[backend] = g
        firsts["xla"] = first_call(maths, args)
        xla = jax.jit(maths)
        with tp.installed(backend="cpu"):
            t_cpu, t_xla = paired([fns["cpu"], xla], args, calls)
        with tp.installed(backend="interpret"):
            t_int, t_xla2 = paired([fns["interpret"], xla], args, max(5, calls // 5))
        rows.append((name, t_cpu, t_xla, t_int, t_xla2, firsts))
        print(f"# {name}: cpu {t_cpu * 1e3:.2f} ms, XLA {t_xla * 1e3:.2f} ms, interpret {t_int * 1e3:.2f} ms", file=sys.stderr)
    print("| kernel (in `jit`) | tessel cpu | XLA `jnp` | XLA / cpu | tessel interpret | XLA / interpret | first call: cpu / interpret / XLA |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, t_cpu, t_xla, t_int, t_xla2, fi in rows:
        print(
            f"| {name} | {t_cpu * 1e3:.2f} ms | {t_xla * 1e3:.2f} ms | **{t_xla / t_cpu:.2f}** | {t_int * 1e3:.2f} ms | {t_xla2 / t_int:.2f} | "
            f"{fi['cpu'] * 1e3:.0f} / {fi['interpret'] * 1e3:.0f} / {fi['xla'] * 1e3:.0f} ms |"
        )


if __name__ == "__main__":
    main()
