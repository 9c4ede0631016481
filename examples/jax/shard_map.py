"""A tessel kernel on every shard of a device mesh, and XLA's `psum` between them.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python examples/jax/shard_map.py

The rows of `x` are split over the mesh's `rows` axis; on each device tessel's row-reduction
kernel (`row_sums` below: each row's sum and maximum) runs on that device's rows, once per shard,
the shards' calls concurrently; then `psum` adds the per-shard totals. The result equals the same
computation on one device, and the compiled program holds tessel's call and gathers no inputs.
Run on one device it still works (a mesh of one). Exits 1 where anything disagrees.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tessel
import tessel.jax as tj

ROW_SUMS = """
kernel row_sums[R, D = 256, BR = 8]
  grid (i: cdiv(R, BR))
  in  x: f32[R, D] block [BR, D] at (i, 0)
  out s: f32[R] block [BR] at (i)
  out m: f32[R] block [BR] at (i)
{
  %x = load x
  %s = sum %x axis 1
  %m = max %x axis 1
  store s, %s
  store m, %m
}
"""


def main() -> int:
    kernel = tessel.compile(ROW_SUMS)
    devices = np.array(jax.devices())
    mesh = Mesh(devices, ("rows",))
    rows = 64 * len(devices)
    x = np.random.default_rng(0).standard_normal((rows, 256)).astype(np.float32)

    def per_shard(xs):
        s, m = tj.call(kernel, xs)  # this shard's rows only
        return jax.lax.psum(jnp.sum(s), "rows"), jax.lax.pmax(jnp.max(m), "rows")

    sharded = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=P("rows", None), out_specs=(P(), P())))
    xd = jax.device_put(x, NamedSharding(mesh, P("rows", None)))
    total, biggest = sharded(xd)

    # The same maths on one device, through the same kernel, and in float64 numpy.
    s1, m1 = jax.jit(lambda x: tj.call(kernel, x))(x)
    want_total, want_max = float(np.sum(x.astype(np.float64))), float(np.max(x))
    print(f"devices: {len(devices)}; sharded total {float(total):.4f}, max {float(biggest):.4f}")
    print(f"one device: total {float(jnp.sum(s1)):.4f}, max {float(jnp.max(m1)):.4f}; numpy {want_total:.4f}, {want_max:.4f}")

    hlo = sharded.lower(xd).compile().as_text()
    ok = True
    if "tessel_call" not in hlo:
        print("the compiled program has no tessel_call"); ok = False
    if "all-gather" in hlo:
        print("the compiled program gathers inputs (all-gather)"); ok = False
    if not np.isclose(float(total), want_total, rtol=1e-5, atol=1e-3) or float(biggest) != want_max:
        print("the sharded result differs from numpy"); ok = False
    if not np.isclose(float(total), float(jnp.sum(s1)), rtol=1e-5, atol=1e-3) or float(biggest) != float(jnp.max(m1)):
        print("the sharded result differs from one device"); ok = False
    stats = tj.stats()
    print(f"tessel_call: {stats['calls']} calls, at most {stats['most_in_flight']} at once, launches {stats['launches']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
