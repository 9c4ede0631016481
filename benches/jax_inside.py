"""tessel inside JAX, each figure beside its baseline in the same run (../shared/JAX.md §Figures):

1. Pallas kernels in `jax.jit` on tessel's interpreter (`tessel.pallas.installed("interpret")`)
   against the same kernels with Pallas's `interpret=True` in `jax.jit`: matmul 512, softmax
   4096 rows, add 4M (benches/pallas_interpret.py's kernels) and JAX's own
   `ops.gpu.attention.mha`;
2. the same against XLA's compiled `jnp` code for the same maths;
3. the per-call overhead of `tessel.jax.call` in `jit` over an empty XLA FFI handler in `jit`;
4. the first call (trace, lower, compile, run) against Pallas interpret's first call;
5. `shard_map` over 1, 2 and 4 host devices (each in its own process);
6. a KV-cache write through `input_output_aliases` (the cache donated) against XLA's own
   `lax.dynamic_update_slice` of the donated cache.

Every call is timed to `block_until_ready`, inputs already on the device, after a warm-up call.
Prints a Markdown section for docs/performance.md. Alone:
`JAX_PLATFORMS=cpu target/venv/bin/python benches/jax_inside.py [--quick]`."""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import pallas_interpret as kernels  # noqa: E402

import tessel  # noqa: E402
import tessel.jax as tj  # noqa: E402
from tessel import pallas as tp  # noqa: E402


def timed(f, args, calls):
    """The median seconds of `calls` calls of `f(*args)` after one warm-up call."""
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def paired(f, g, args, calls):
    """The median seconds of `f(*args)` and of `g(*args)`, each called `calls` times after a
    warm-up call, alternately, so that the machine's drift (other load, frequency) falls on both
    alike."""
    for h in (f, g):
        jax.block_until_ready(h(*args))
    times = ([], [])
    for _ in range(calls):
        for h, ts in zip((f, g), times):
            t = time.perf_counter()
            jax.block_until_ready(h(*args))
            ts.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def first_call(make_f, args):
    """Seconds of the first call of a freshly made jitted function, JAX's caches emptied."""
    jax.clear_caches()
    f = make_f()
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    return time.perf_counter() - t


def attention(interpret=False):
    from jax.experimental.pallas.ops.gpu import attention as att

    return (lambda q, k, v: att.mha(q, k, v, segment_ids=None, interpret=interpret)), [(1, 1024, 4, 64)] * 3


def cases():
    """name -> (Pallas maker(interpret), the same maths in jnp, calls of the slow baseline)."""
    from jax.experimental.pallas.ops.gpu import attention as att

    def softmax(x):
        return jax.nn.softmax(x, axis=1)

    return {
        "matmul_512": (kernels.matmul_512, jnp.matmul, 3),
        "softmax_4096": (kernels.softmax_4096, softmax, 3),
        "add_4m": (kernels.add_4m, jnp.add, 1),
        "attention (mha 1×1024×4×64)": (attention, lambda q, k, v: att.mha_reference(q, k, v, segment_ids=None), 2),
    }


def section_kernels(quick):
    rng = np.random.default_rng(1)
    rows = []
    firsts = []
    for name, (make, maths, slow_calls) in cases().items():
        pallas, shapes = make(interpret=True)
        plain, _ = make(interpret=False)
        args = [jax.device_put(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
        with tp.installed(backend="interpret"):
            first_tessel = first_call(lambda: jax.jit(plain), args)
            f = jax.jit(plain)
            before = tj.stats()["launches"].get("interpret", 0)
            got = np.asarray(f(*args))
            if tj.stats()["launches"].get("interpret", 0) <= before:
                raise SystemExit(f"{name} did not run on tessel's interpreter")
            # Alternately with XLA's: the ratio is what matters, and this machine's speed drifts.
            t_tessel, t_xla = paired(f, jax.jit(maths), args, 11 if quick else 101)
        want = np.asarray(jax.jit(maths)(*args))
        err = float(np.max(np.abs(got - want)))
        if quick and name == "add_4m":
            t_pallas, first_pallas = float("nan"), float("nan")
        else:
            first_pallas = first_call(lambda: jax.jit(pallas), args)
            t_pallas = timed(jax.jit(pallas), args, slow_calls)
        rows.append((name, t_tessel, t_pallas, t_xla, err))
        firsts.append((name, first_tessel, first_pallas))
        print(f"# {name}: tessel {t_tessel * 1e3:.2f} ms, Pallas interpret {t_pallas * 1e3:.1f} ms, XLA {t_xla * 1e3:.2f} ms", file=sys.stderr)
    return rows, firsts


def section_overhead():
    """µs per call: a tessel.jax.call of a kernel that copies 128 floats against the empty
    handler on the same array, and a jitted `x + 1` for scale; best of 7 rounds of 3,000."""
    tj.register()
    k = tessel.compile(
        "kernel copy\n  grid (i: 1)\n  in  x: f32[128]\n  out o: f32[128]\n{\n  %x = load x\n  store o, %x\n}\n"
    )
    x = jax.device_put(np.ones(128, np.float32))
    fs = {
        "tessel": jax.jit(lambda x: tj.call(k, x, backend="interpret")),
        "empty": jax.jit(lambda x: jax.ffi.ffi_call("tessel_empty", jax.ShapeDtypeStruct((128,), jnp.float32))(x)),
        "jnp": jax.jit(lambda x: x + 1),
    }
    best = {n: float("inf") for n in fs}
    for f in fs.values():
        jax.block_until_ready(f(x))
    for _ in range(7):
        for n, f in fs.items():
            t = time.perf_counter()
            for _ in range(3000):
                y = f(x)
            jax.block_until_ready(y)
            best[n] = min(best[n], (time.perf_counter() - t) / 3000)
    return best


def kv_write(cache, new, pos, interpret=False):
    """A decode step's KV-cache write: 16 rows at the scalar-prefetched block `pos`, the rest of
    the cache aliased in place (tests/test_pallas_ops.py's kernel at a production size)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows, width = new.shape

    def body(pos_ref, new_ref, cache_ref, o_ref):
        o_ref[...] = new_ref[...]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(1,),
        in_specs=[pl.BlockSpec((rows, width), lambda i, p: (0, 0)), pl.BlockSpec((rows, width), lambda i, p: (p[0], 0))],
        out_specs=pl.BlockSpec((rows, width), lambda i, p: (p[0], 0)),
    )
    out = jax.ShapeDtypeStruct(cache.shape, cache.dtype)
    return pl.pallas_call(body, out_shape=out, grid_spec=grid_spec, input_output_aliases={2: 0}, interpret=interpret)(pos, new, cache)


def section_kv_cache(calls=30):
    """ms a call of the write into a donated cache of 65,536 × 128: tessel (interpret, the cache
    aliased: XLA's `output_operand_aliases`) and XLA's `dynamic_update_slice` of the same."""
    out = []
    for dtype in (jnp.float32, jnp.bfloat16):
        rng = np.random.default_rng(0)
        cache = jnp.asarray(rng.standard_normal((65536, 128)), dtype)
        new = jnp.asarray(rng.standard_normal((16, 128)), dtype)
        pos = np.array([1000], np.int32)
        with tp.installed(backend="interpret"):
            f = jax.jit(kv_write, donate_argnums=0)
            t_tessel = _donated(f, cache, new, pos, calls)
        g = jax.jit(lambda c, n, p: jax.lax.dynamic_update_slice(c, n, (p[0] * 16, 0)), donate_argnums=0)
        t_xla = _donated(g, cache, new, pos, calls)
        want = np.asarray(cache).copy()
        want[16000:16016] = np.asarray(new)
        with tp.installed(backend="interpret"):
            got = np.asarray(jax.jit(kv_write)(cache, new, pos))
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            raise SystemExit(f"the KV-cache write of {np.dtype(dtype).name} differs from numpy")
        out.append((np.dtype(dtype).name, t_tessel, t_xla))
    return out


def _donated(f, cache, new, pos, calls):
    """The median seconds of `calls` calls of `f(cache, new, pos)`, each on the buffer the last
    returned (donated back in, as a decode loop does)."""
    c = jax.block_until_ready(f(jnp.array(cache), new, pos))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        c = jax.block_until_ready(f(c, new, pos))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


SHARDED = """
import sys, time, statistics, numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, {examples!r})
import shard_map as ex
import tessel, tessel.jax as tj
k = tessel.compile(ex.ROW_SUMS)
mesh = Mesh(np.array(jax.devices()), ("rows",))
x = np.random.default_rng(0).standard_normal((8192, 256)).astype(np.float32)
def per_shard(xs):
    s, m = tj.call(k, xs, backend="interpret")
    return jax.lax.psum(jnp.sum(s), "rows"), jax.lax.pmax(jnp.max(m), "rows")
f = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=P("rows", None), out_specs=(P(), P())))
xd = jax.device_put(x, NamedSharding(mesh, P("rows", None)))
jax.block_until_ready(f(xd))
ts = []
for _ in range(30):
    t = time.perf_counter(); jax.block_until_ready(f(xd)); ts.append(time.perf_counter() - t)
print(statistics.median(ts) * 1e3, tj.stats()["most_in_flight"])
"""


def section_sharded():
    out = []
    examples = str(Path(__file__).resolve().parents[1] / "examples" / "jax")
    for devices in (1, 2, 4):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
        r = subprocess.run([sys.executable, "-c", SHARDED.format(examples=examples)], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            out.append((devices, None, r.stderr.strip().splitlines()[-1:]))
            continue
        ms, most = r.stdout.split()
        out.append((devices, float(ms), int(most)))
    return out


def ratio(r: float) -> str:
    return "n/a" if r != r else (f"{r:.0f}×" if r >= 10 else f"{r:.1f}×")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls, and no Pallas interpret run of add_4m (about 25 s a call)")
    a = ap.parse_args()
    rows, firsts = section_kernels(a.quick)
    over = section_overhead()
    sharded = section_sharded()
    kv = section_kv_cache()
    print("## tessel inside JAX (benches/jax_inside.py)")
    print()
    print(f"jax {jax.__version__}, {os.cpu_count()} cores. Pallas kernels inside `jax.jit` with `tessel.pallas.installed(\"interpret\")`,")
    print("beside the same kernels under Pallas's `interpret=True` in `jax.jit` and XLA's own compiled `jnp` for the same")
    print("maths, all in this run; medians to `block_until_ready` (tessel's and XLA's calls alternating, 101 of each), inputs on the device, after a warm-up call. The goals:")
    print("≥100× Pallas interpret, ≥0.5× XLA (a ratio above 1 is faster than XLA).")
    print()
    print("| kernel | tessel in jit (ms) | Pallas interpret in jit (ms) | Pallas / tessel | XLA jnp in jit (ms) | XLA / tessel | max abs diff from XLA |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, t, p, x, err in rows:
        pallas = "(not run: --quick)" if p != p else f"{p * 1e3:.1f}"
        print(f"| {name} | {t * 1e3:.2f} | {pallas} | **{ratio(p / t)}** | {x * 1e3:.2f} | {x / t:.2f}× | {err:.1e} |")
    print()
    print("Pallas's interpret mode in `jit` is not an element-by-element interpreter: JAX lowers the kernel to an XLA")
    print("loop over the grid whose body is XLA's compiled code, so it costs XLA's time plus a per-step overhead. With")
    print("few, large blocks it is within a small factor of XLA itself, and 100× would mean beating XLA's own code:")
    by_name = {name: (t, p, x) for name, t, p, x, _ in rows}
    if "matmul_512" in by_name and by_name["matmul_512"][1] == by_name["matmul_512"][1]:
        p = by_name["matmul_512"][1]
        print(f"matmul_512 at 100× would take {p * 10:.2f} ms, {2 * 512**3 / (p / 100) / 1e9:.0f} GFLOP/s on {os.cpu_count()} cores, where XLA's")
        print(f"own GEMM takes {by_name['matmul_512'][2] * 1e3:.2f} ms. The many-step grid (add_4m: 4,096 steps of 1,024 elements) is where the")
        print("interpreter's advantage shows.")
    print()
    print("First call of a fresh `jax.jit` (JAX's caches emptied): trace, lower, compile and run.")
    print()
    print("| kernel | tessel (ms) | Pallas interpret (ms) | Pallas / tessel |")
    print("|---|---:|---:|---:|")
    for name, t, p in firsts:
        print(f"| {name} | {t * 1e3:.0f} | {'n/a' if p != p else f'{p * 1e3:.0f}'} | {ratio(p / t)} |")
    print()
    print("Per-call overhead in `jax.jit` (µs a call, best of 7 rounds of 3,000 calls; a kernel copying 128 floats):")
    print()
    print("| `tessel.jax.call` | empty FFI handler (`tessel_empty`) | tessel's overhead | jitted `x + 1` |")
    print("|---:|---:|---:|---:|")
    print(f"| {over['tessel'] * 1e6:.2f} | {over['empty'] * 1e6:.2f} | **{(over['tessel'] - over['empty']) * 1e6:.2f}** | {over['jnp'] * 1e6:.2f} |")
    print()
    print("`shard_map` of examples/jax/shard_map.py's row reduction over 8192×256 f32 rows split over host devices,")
    print("then `psum`/`pmax` (ms a call, median of 30; each device count in its own process):")
    print()
    print("| host devices | ms | most tessel calls at once |")
    print("|---:|---:|---:|")
    for d, ms, most in sharded:
        print(f"| {d} | {'failed: ' + ' '.join(most) if ms is None else f'{ms:.2f}'} | {'' if ms is None else most} |")
    print()
    print_kv(kv)


def print_kv(kv):
    print("A KV-cache write (16 rows of 128 at a scalar-prefetched block of a 65,536 × 128 cache, donated) through")
    print("`input_output_aliases`, beside XLA's own `lax.dynamic_update_slice` of the donated cache (ms a call, median of 30):")
    print()
    print("| cache | tessel in jit (ms) | XLA `dynamic_update_slice` (ms) | XLA / tessel |")
    print("|---|---:|---:|---:|")
    for name, t, x in kv:
        print(f"| {name} | {t * 1e3:.3f} | {x * 1e3:.3f} | {x / t:.2f}× |")


if __name__ == "__main__":
    main()
