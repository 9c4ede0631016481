"""JAX Pallas interpret mode's steady state on benches/kernels/{matmul_512,softmax_4096,add_4m}.tk:
the same grids, blocks and bodies written with `pl.pallas_call(..., interpret=True)`, each call
jitted, warmed up, then timed to `block_until_ready` (inputs already on the device, no file I/O).
This is issue 14's baseline for whole `tessel run` processes, measured in the same run as they
are rather than remembered. Two variants in 64 grid steps (`matmul_512_fullk`: 64-row and
64-column blocks over the whole of K; `softmax_4096_rows64`: 64-row blocks) show where the
issue's own figures for matmul and softmax come from.

Prints one line per kernel, `name median_ms`, for scripts/bench. Alone:
`JAX_PLATFORMS=cpu target/venv/bin/python benches/pallas_interpret.py [--calls N]`."""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def matmul_512(interpret=True):
    """c = a @ b in 64×64 blocks, the contraction (`k`, the last grid axis) accumulated into c."""

    def body(a_ref, b_ref, c_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            c_ref[...] = jnp.zeros_like(c_ref)

        c_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32),
        grid=(8, 8, 8),
        in_specs=[pl.BlockSpec((64, 64), lambda i, j, k: (i, k)), pl.BlockSpec((64, 64), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((64, 64), lambda i, j, k: (i, j)),
        interpret=interpret,
    )
    return f, [(512, 512), (512, 512)]


def softmax_4096(rows=16, interpret=True):
    """Row softmax of 4096×256 in blocks of 16 rows."""

    def body(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - x.max(axis=1, keepdims=True))
        o_ref[...] = e / e.sum(axis=1, keepdims=True)

    spec = pl.BlockSpec((rows, 256), lambda i: (i, 0))
    f = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((4096, 256), jnp.float32), grid=(4096 // rows,), in_specs=[spec], out_specs=spec, interpret=interpret
    )
    return f, [(4096, 256)]


def matmul_512_fullk(interpret=True):
    """The same product in 64 grid steps: 64-row and 64-column blocks over the whole of K."""

    def body(a_ref, b_ref, c_ref):
        c_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32),
        grid=(8, 8),
        in_specs=[pl.BlockSpec((64, 512), lambda i, j: (i, 0)), pl.BlockSpec((512, 64), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((64, 64), lambda i, j: (i, j)),
        interpret=interpret,
    )
    return f, [(512, 512), (512, 512)]


def softmax_4096_rows64():
    """The same softmax in 64 grid steps: blocks of 64 rows."""
    return softmax_4096(rows=64)


def add_4m(interpret=True):
    """o = x + y over 4M in blocks of 1024."""

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((1024,), lambda i: (i,))
    f = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((4194304,), jnp.float32), grid=(4096,), in_specs=[spec, spec], out_specs=spec, interpret=interpret
    )
    return f, [(4194304,), (4194304,)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5, help="timed calls per kernel (add_4m takes at most 2: ~20 s each)")
    ap.add_argument("--check", action="store_true", help="also compare each result with numpy")
    ap.add_argument("--only", nargs="*", help="the kernels to time (default: all)")
    args = ap.parse_args()
    rng = np.random.default_rng(1)

    def softmax(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    expected = {
        "matmul_512": np.matmul,
        "softmax_4096": softmax,
        "add_4m": np.add,
        "matmul_512_fullk": np.matmul,
        "softmax_4096_rows64": softmax,
    }
    for make in (matmul_512, softmax_4096, add_4m, matmul_512_fullk, softmax_4096_rows64):
        name = make.__name__
        if args.only and name not in args.only:
            continue
        f, shapes = make()
        f = jax.jit(f)
        host = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        args_dev = [jax.device_put(h) for h in host]
        out = f(*args_dev).block_until_ready()  # compile and warm up
        if args.check:
            np.testing.assert_allclose(np.asarray(out), expected[name](*host), rtol=1e-4, atol=1e-4)
        times = []
        for _ in range(min(args.calls, 2) if name == "add_4m" else args.calls):
            t = time.perf_counter()
            f(*args_dev).block_until_ready()
            times.append(time.perf_counter() - t)
        print(f"{name} {statistics.median(times) * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
