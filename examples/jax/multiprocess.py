"""A tessel kernel per shard across processes: JAX's multi-process runtime on the CPU (gloo
collectives, the processes on 127.0.0.1), `shard_map` over one global mesh of every process's
devices, a tessel kernel on each process's shard, and XLA's collectives between them: `psum`,
`all_gather` and `ppermute`.

    JAX_PLATFORMS=cpu python examples/jax/multiprocess.py [N]    # N processes (default 2)

It starts N copies of itself (`--worker I N PORT`); each joins the runtime, takes its rows of a
shared `x` (every process makes the same `x` from one seed: weak scaling, each shard the same
size whatever N), runs the row-reduction kernel below on them under `shard_map` (the backend
`auto` chooses: the cpu plugin where TESSEL_PLUGIN_PATH names it, else the interpreter), and
checks the three collectives' results against numpy on the whole `x`. The launcher prints each
worker's line (the backend, the kernel's time per call) and exits 1 where any worker disagrees.
"""

import os
import socket
import subprocess
import sys
import time

import numpy as np

ROWS_PER_SHARD, D = 4096, 256

ROW_SUMS = """
kernel row_sums[R, D = 256, BR = 64]
  grid (i: cdiv(R, BR))
  in  x: f32[R, D] block [BR, D] at (i, 0)
  out s: f32[R] block [BR] at (i)
{
  %x = load x
  %e = exp %x
  %s = sum %e axis 1
  store s, %s
}
"""


def worker(index: int, count: int, port: int) -> int:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=index)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import tessel
    import tessel.jax as tj

    kernel = tessel.compile(ROW_SUMS)
    mesh = Mesh(np.array(jax.devices()), ("p",))
    shards = len(jax.devices())
    x = np.random.default_rng(0).standard_normal((ROWS_PER_SHARD * shards, D)).astype(np.float32) / 4
    local = [d for d in jax.local_devices()]
    rows = ROWS_PER_SHARD * len(local)
    first = index * rows
    xs = jax.make_array_from_single_device_arrays(
        x.shape,
        NamedSharding(mesh, P("p")),
        [jax.device_put(x[first + n * ROWS_PER_SHARD:first + (n + 1) * ROWS_PER_SHARD], d) for n, d in enumerate(local)],
    )

    def per_shard(xb):
        s = tj.call(kernel, x=xb)
        total = jax.lax.psum(jnp.sum(s), "p")
        gathered = jax.lax.all_gather(jnp.sum(s), "p")
        shifted = jax.lax.ppermute(s, "p", [(i, (i + 1) % shards) for i in range(shards)])
        return total, gathered, shifted

    f = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=P("p"), out_specs=(P(), P(), P("p")), check_vma=False))
    total, gathered, shifted = jax.block_until_ready(f(xs))
    calls = 20
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(f(xs))
    per_call = (time.perf_counter() - start) / calls

    want_rows = np.exp(x.astype(np.float64)).sum(axis=1)
    want_shard = want_rows.reshape(shards, ROWS_PER_SHARD).sum(axis=1)
    got_total = float(np.asarray(total.addressable_data(0)))
    got_gathered = np.asarray(gathered.addressable_data(0))
    ok = np.isclose(got_total, want_rows.sum(), rtol=1e-4) and np.allclose(got_gathered, want_shard, rtol=1e-4)
    # ppermute sends shard i's rows to shard i + 1: this process's shard holds its left neighbour's.
    for n, piece in enumerate(shifted.addressable_shards):
        src = (first // ROWS_PER_SHARD + n - 1) % shards
        ok &= np.allclose(np.asarray(piece.data), want_rows[src * ROWS_PER_SHARD:(src + 1) * ROWS_PER_SHARD], rtol=1e-4)
    backend = tj.stats()["launches"]
    print(f"process {index}/{count}: {'ok' if ok else 'DIFFERS'}; launches {backend}; {per_call * 1e3:.2f} ms a call")
    jax.distributed.shutdown()
    return 0 if ok else 1


def launch(count: int) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(i), str(count), str(port)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(count)
    ]
    bad = 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        sys.stdout.write(out)
        if p.returncode != 0:
            bad += 1
            sys.stderr.write(err[-3000:])
    print(f"{count} processes: {'all agree with numpy' if bad == 0 else f'{bad} failed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    sys.exit(launch(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
