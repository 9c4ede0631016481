"""JAX's race-detection suite for Pallas's GPU interpret mode
(`tests/pallas/gpu_pallas_interpret_race_detection_test.py` in the jax repository), ported: the
same `plgpu.kernel`s, each run by tessel's interpreter inside `jax.jit` (`tp.run`), where a kernel
Pallas's suite expects a race in must be refused by tessel's race check (a `TesselError` naming
the statements) and every race-free kernel must run and give its value.

What the port changes, and why:
- 0-d arrays (`jax.ShapeDtypeStruct((), ...)`, `plgpu.SMEM((), ...)`, `jnp.int32(42)`) are 1-element
  arrays: tessel's outputs and scratch are arrays (docs/language.md §2).
- `interpret=InterpretGPUParams(detect_races=True)` is dropped: tessel's interpreter always checks.
- The warp-specialized variants (`plgpu.warp_map`) are refused by name (tessel's threads are
  warpgroups); each asserts that refusal.
- Where Pallas's suite skips a case it cannot detect yet (a read of global memory that an
  asynchronous copy is still writing), tessel finds the race, and the test says so.
- Races between the blocks of a cluster (two programs writing one output element) are not
  checked by tessel, which checks the threads of one program (docs/language.md §10): those cases
  are `xfail(strict=True)`, so that the day they pass the test says so.
"""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import tessel
from jax.experimental import pallas as pl
from tessel import pallas as tp

from pallas_common import needs_mpmd

pytestmark = needs_mpmd
plgpu = pytest.importorskip("jax.experimental.pallas.mosaic_gpu")

ONE = (1,)
i32 = functools.partial(jax.ShapeDtypeStruct, ONE, jnp.int32)
#: What a refusal by the race check says (a data race, a store not fenced, a copy not read).
RACE = ("has a data race", "with no `fence` between", "still reading its source")


def run(kernel, *args):
    """The kernel on tessel's interpreter inside `jax.jit`: its output, or the race check's error."""
    return tp.run(kernel, *args, backend="interpret")


def assert_race(kernel, *args):
    # Found as the kernel runs: inside `jax.jit`, XLA raises it with tessel's message.
    with pytest.raises((tessel.TesselError, jax.errors.JaxRuntimeError)) as e:
        run(kernel, *args)
    assert any(s in str(e.value) for s in RACE), str(e.value)


def check(correct, value, kernel, *args):
    """Race-free kernels give `value`; the others are refused by the race check."""
    if correct:
        np.testing.assert_array_equal(np.asarray(run(kernel, *args)).reshape(-1)[:1], [value])
    else:
        assert_race(kernel, *args)


class Threads:
    """Two warpgroups (`num_threads=2`), or two warps of one (`plgpu.warp_map`)."""

    def __init__(self, warps: bool):
        self.warps = warps

    def __repr__(self):
        return "warp_map" if self.warps else "warpgroups"

    def count(self, n):
        return 1 if self.warps else n

    def specialize(self, thread_name):
        if self.warps:
            return plgpu.warp_map

        def decorator(f):
            f(jax.lax.axis_index(thread_name))

        return decorator


def refused_warp_map(kernel, *args):
    with pytest.raises(tessel.UnsupportedError) as e:
        run(kernel, *args)
    assert "has no tessel translation" in str(e.value), str(e.value)


@pytest.mark.parametrize("wait_barrier", [True, False])
def test_async_gmem_ops_not_visible_unless_synchronized(wait_barrier):
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), barrier_ref=plgpu.Barrier(num_arrivals=1)))
    def _kernel(out_ref, smem_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(out_ref, smem_ref, barrier_ref)
        if wait_barrier:
            plgpu.barrier_wait(barrier_ref)
        plgpu.commit_smem()
        out_ref[...] = jnp.full(ONE, 42, jnp.int32)

    # Pallas skips the unsynchronized case (it cannot see it yet); tessel finds the store into
    # `out_ref` while the copy may still read it.
    check(wait_barrier, 42, _kernel)


@pytest.mark.parametrize("a", [False, True])
@pytest.mark.parametrize("b", [False, True])
@pytest.mark.parametrize("c", [False, True])
@pytest.mark.parametrize("d", [False, True])
def test_finds_races_in_single_thread_later_gmem_to_smem_copy(a, b, c, d):
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), barrier_ref=plgpu.Barrier(num_arrivals=1)))
    def _kernel(in_ref, out_ref, smem_ref, barrier_ref):
        if a:
            plgpu.commit_smem()
        smem_ref[...] = jnp.full(ONE, 100, jnp.int32)
        if b:
            plgpu.commit_smem()
        plgpu.copy_gmem_to_smem(in_ref, smem_ref, barrier_ref)
        if c:
            plgpu.commit_smem()
        plgpu.barrier_wait(barrier_ref)
        if d:
            plgpu.commit_smem()
        out_ref[...] = smem_ref[...]

    check(b, 42, _kernel, jnp.full(ONE, 42, jnp.int32))


@pytest.mark.parametrize("wait_barrier", [False, True])
def test_finds_races_in_single_thread_earlier_gmem_to_smem_copy(wait_barrier):
    @functools.partial(plgpu.kernel, out_type=i32(),
                       scratch_types=dict(gmem_ref=plgpu.GMEM(ONE, jnp.int32), smem_ref=plgpu.SMEM(ONE, jnp.int32), barrier_ref=plgpu.Barrier(num_arrivals=1)))
    def _kernel(out_ref, gmem_ref, smem_ref, barrier_ref):
        plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, barrier_ref)
        if wait_barrier:
            plgpu.barrier_wait(barrier_ref)
        smem_ref[...] = jnp.full(ONE, 42, jnp.int32)
        out_ref[...] = smem_ref[...]

    check(wait_barrier, 42, _kernel)


FLAGS6 = [pytest.param(*(bool(n >> k & 1) for k in range(6)), id=f"{n:06b}") for n in range(64)]


@pytest.mark.parametrize("threads", [Threads(False), Threads(True)], ids=repr)
@pytest.mark.parametrize("a, b, c, d, e, f", FLAGS6)
def test_finds_races_in_multi_thread_gmem_to_smem_copy(threads, a, b, c, d, e, f):
    @functools.partial(plgpu.kernel, out_type=i32(), num_threads=threads.count(2), thread_name="t",
                       scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), thread_barrier=plgpu.Barrier(num_arrivals=1),
                                          copy_barrier=plgpu.Barrier(num_arrivals=1)))
    def _kernel(in_ref, out_ref, smem_ref, thread_barrier, copy_barrier):
        @threads.specialize(thread_name="t")
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                if a:
                    plgpu.commit_smem()
                smem_ref[...] = jnp.full(ONE, 100, jnp.int32)
                if b:
                    plgpu.commit_smem()
                plgpu.copy_gmem_to_smem(in_ref, smem_ref, copy_barrier)
                if c:
                    plgpu.commit_smem()
                plgpu.barrier_arrive(thread_barrier)

            @pl.when(warp_id == 1)
            def _():
                if d:
                    plgpu.commit_smem()
                plgpu.barrier_wait(thread_barrier)
                if e:
                    plgpu.commit_smem()
                plgpu.barrier_wait(copy_barrier)
                if f:
                    plgpu.commit_smem()
                out_ref[...] = smem_ref[...]

    x = jnp.full(ONE, 42, jnp.int32)
    if threads.warps:
        refused_warp_map(_kernel, x)
    else:
        check(b, 42, _kernel, x)


@pytest.mark.parametrize("threads", [Threads(False), Threads(True)], ids=repr)
@pytest.mark.parametrize("a, b, c, d, e, f", FLAGS6)
def test_finds_races_in_cross_thread_gmem_to_smem_copy(threads, a, b, c, d, e, f):
    @functools.partial(plgpu.kernel, out_type=i32(), num_threads=threads.count(2), thread_name="t",
                       scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), thread_barrier=plgpu.Barrier(num_arrivals=1),
                                          copy_barrier=plgpu.Barrier(num_arrivals=1)))
    def _kernel(in_ref, out_ref, smem_ref, thread_barrier, copy_barrier):
        @threads.specialize(thread_name="t")
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                if a:
                    plgpu.commit_smem()
                smem_ref[...] = jnp.full(ONE, 100, jnp.int32)
                if b:
                    plgpu.commit_smem()
                plgpu.barrier_arrive(thread_barrier)

            @pl.when(warp_id == 1)
            def _():
                if c:
                    plgpu.commit_smem()
                plgpu.barrier_wait(thread_barrier)
                if d:
                    plgpu.commit_smem()
                plgpu.copy_gmem_to_smem(in_ref, smem_ref, copy_barrier)
                if e:
                    plgpu.commit_smem()
                plgpu.barrier_wait(copy_barrier)
                if f:
                    plgpu.commit_smem()
                out_ref[...] = smem_ref[...]

    x = jnp.full(ONE, 42, jnp.int32)
    if threads.warps:
        refused_warp_map(_kernel, x)
    else:
        check(b or d, 42, _kernel, x)


@pytest.mark.parametrize("a", [False, True])
@pytest.mark.parametrize("b", [False, True])
@pytest.mark.parametrize("c", [False, True])
def test_finds_races_in_single_thread_smem_to_gmem_copy(a, b, c):
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(gmem_ref=plgpu.GMEM(ONE, jnp.int32), smem_ref=plgpu.SMEM(ONE, jnp.int32)))
    def _kernel(out_ref, gmem_ref, smem_ref):
        if a:
            plgpu.commit_smem()
        smem_ref[...] = jnp.full(ONE, 42, jnp.int32)
        if b:
            plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
        if c:
            plgpu.commit_smem()
        plgpu.wait_smem_to_gmem(0)
        out_ref[...] = gmem_ref[...]

    check(b, 42, _kernel)


def test_finds_races_in_non_fully_waited_smem_to_gmem_copy():
    @functools.partial(plgpu.kernel, out_type=i32(),
                       scratch_types=dict(smem1=plgpu.SMEM(ONE, jnp.int32), smem2=plgpu.SMEM(ONE, jnp.int32),
                                          gmem1=plgpu.GMEM(ONE, jnp.int32), gmem2=plgpu.GMEM(ONE, jnp.int32)))
    def _kernel(out_ref, smem1, smem2, gmem1, gmem2):
        smem1[...] = jnp.full(ONE, 1, jnp.int32)
        smem2[...] = jnp.full(ONE, 2, jnp.int32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem1, gmem1)
        plgpu.copy_smem_to_gmem(smem2, gmem2)
        plgpu.wait_smem_to_gmem(1)
        out_ref[...] = gmem1[...] + gmem2[...]
        plgpu.wait_smem_to_gmem(0)

    assert_race(_kernel)


def test_allows_rewaiting_smem_to_gmem_copies():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM((3,), jnp.int32), gmem_ref=plgpu.GMEM((3,), jnp.int32)))
    def _kernel(in_ref, out_ref, smem_ref, gmem_ref):
        smem_ref[...] = in_ref[...]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_ref.at[pl.ds(0, 1)], gmem_ref.at[pl.ds(0, 1)])
        plgpu.copy_smem_to_gmem(smem_ref.at[pl.ds(1, 1)], gmem_ref.at[pl.ds(1, 1)])
        plgpu.copy_smem_to_gmem(smem_ref.at[pl.ds(2, 1)], gmem_ref.at[pl.ds(2, 1)])
        plgpu.wait_smem_to_gmem(1)
        plgpu.wait_smem_to_gmem(2)
        out_ref[...] = gmem_ref[pl.ds(0, 1)] + gmem_ref[pl.ds(1, 1)]
        plgpu.wait_smem_to_gmem(0)
        out_ref[...] = gmem_ref[pl.ds(0, 1)] + gmem_ref[pl.ds(1, 1)] + gmem_ref[pl.ds(2, 1)]

    check(True, 6, _kernel, jnp.array([1, 2, 3], jnp.int32))


@pytest.mark.parametrize("wait_only_once", [False, True])
@pytest.mark.parametrize("check_location", range(4))
def test_finds_races_when_smem_to_gmem_copy_waits_read_only(wait_only_once, check_location):
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((2,), jnp.int32), scratch_types=dict(smem_ref=plgpu.SMEM((2,), jnp.int32)))
    def _kernel(in_ref, out_ref, smem_ref):
        smem_ref[...] = in_ref[...]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_ref.at[pl.ds(0, 1)], out_ref.at[pl.ds(0, 1)])
        plgpu.copy_smem_to_gmem(smem_ref.at[pl.ds(1, 1)], out_ref.at[pl.ds(1, 1)])
        # Four places to write: some race with the copies still in flight, some do not.
        places = [smem_ref.at[pl.ds(0, 1)], out_ref.at[pl.ds(0, 1)], smem_ref.at[pl.ds(1, 1)], out_ref.at[pl.ds(1, 1)]]
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        if not wait_only_once:
            plgpu.wait_smem_to_gmem(1)
        places[check_location][...] = jnp.full(ONE, 3, jnp.int32)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    # Pallas skips (wait_only_once, 1): the copy's write into out_ref[0] may not have landed
    # after a wait for its read only. tessel finds that race.
    correct = (wait_only_once and check_location == 0) or (not wait_only_once and check_location in (0, 1))
    x = jnp.array([1, 2], jnp.int32)
    if correct:
        run(_kernel, x)
    else:
        assert_race(_kernel, x)


@pytest.mark.parametrize("threads", [Threads(False), Threads(True)], ids=repr)
@pytest.mark.parametrize("check_read", [False, True])
def test_wait_smem_to_gmem_isolated_per_thread(threads, check_read):
    @functools.partial(plgpu.kernel, out_type=i32(), num_threads=threads.count(2), thread_name="t",
                       scratch_types=dict(smem=plgpu.SMEM(ONE, jnp.int32), barrier=plgpu.Barrier(num_arrivals=1),
                                          cleanup_barrier=plgpu.Barrier(num_arrivals=1)))
    def _kernel(out_ref, smem, barrier, cleanup_barrier):
        @threads.specialize(thread_name="t")
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                plgpu.copy_smem_to_gmem(smem, out_ref)
                plgpu.barrier_arrive(barrier)
                plgpu.barrier_wait(cleanup_barrier)
                plgpu.wait_smem_to_gmem(0)

            @pl.when(warp_id == 1)
            def _():
                plgpu.barrier_wait(barrier)
                plgpu.wait_smem_to_gmem(0)
                if check_read:
                    smem[...] = jnp.full(ONE, 43, jnp.int32)
                else:
                    out_ref[...] = jnp.full(ONE, 43, jnp.int32)
                plgpu.barrier_arrive(cleanup_barrier)

    if threads.warps:
        refused_warp_map(_kernel)
    else:
        assert_race(_kernel)


@pytest.mark.parametrize("threads", [Threads(False), Threads(True)], ids=repr)
def test_properly_waited_smem_to_gmem_visible_across_threads(threads):
    # Not collected in Pallas's suite (its name has no `test_` prefix); ported as a test.
    @functools.partial(plgpu.kernel, out_type=i32(), num_threads=threads.count(2), thread_name="t",
                       scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), gmem_ref=plgpu.GMEM(ONE, jnp.int32), barrier=plgpu.Barrier(num_arrivals=1)))
    def _kernel(out_ref, smem_ref, gmem_ref, barrier):
        @threads.specialize(thread_name="t")
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                smem_ref[...] = jnp.full(ONE, 42, jnp.int32)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
                plgpu.wait_smem_to_gmem(0)
                plgpu.barrier_arrive(barrier)

            @pl.when(warp_id == 1)
            def _():
                plgpu.barrier_wait(barrier)
                out_ref[...] = gmem_ref[...]

    if threads.warps:
        refused_warp_map(_kernel)
    else:
        check(True, 42, _kernel)


@pytest.mark.parametrize("do_wait", [False, True])
def test_gmem_to_smem_visible_in_async_if_awaited(do_wait):
    @functools.partial(plgpu.kernel, out_type=i32(),
                       scratch_types=dict(smem_ref=plgpu.SMEM((2,), jnp.int32), gmem_ref=plgpu.GMEM((2,), jnp.int32),
                                          barrier=plgpu.Barrier(num_arrivals=1 if do_wait else 2)))
    def _kernel(_out_ref, smem_ref, gmem_ref, barrier):
        plgpu.commit_smem()
        plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, barrier)
        if do_wait:
            plgpu.barrier_wait(barrier)
        plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, barrier)
        plgpu.barrier_wait(barrier)

    if do_wait:
        run(_kernel)
    else:
        assert_race(_kernel)


def test_finds_race_in_double_smem_to_gmem():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM((2,), jnp.int32), gmem_ref=plgpu.GMEM((2,), jnp.int32)))
    def _kernel(_out_ref, smem_ref, gmem_ref):
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
        plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
        plgpu.wait_smem_to_gmem(0)

    assert_race(_kernel)


def test_finds_exception_in_unawaited_smem_to_gmem():
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((2,), jnp.int32), scratch_types=dict(smem_ref=plgpu.SMEM((2,), jnp.int32)))
    def _kernel(_out_ref, smem_ref):
        plgpu.copy_smem_to_gmem(smem_ref, _out_ref)

    with pytest.raises((tessel.TesselError, jax.errors.JaxRuntimeError)) as e:
        run(_kernel)
    assert "still reading its source" in str(e.value), str(e.value)


def test_unawaited_smem_to_gmem_write_side_ok():
    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((2,), jnp.int32), scratch_types=dict(smem_ref=plgpu.SMEM((2,), jnp.int32)))
    def _kernel(_out_ref, smem_ref):
        plgpu.copy_smem_to_gmem(smem_ref, _out_ref)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    run(_kernel)


ACROSS_BLOCKS = pytest.mark.xfail(strict=True, reason="tessel checks the threads of one program, not two programs of a cluster writing one output")


@ACROSS_BLOCKS
def test_race_in_async_copy_smem_to_gmem_in_cluster():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32)), cluster=(2,), cluster_names=("c0",))
    def _kernel(out_ref, smem_ref):
        plgpu.copy_smem_to_gmem(smem_ref, out_ref)
        plgpu.wait_smem_to_gmem(0)

    assert_race(_kernel)


def test_no_race_in_async_copy_gmem_to_smem_in_cluster():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32), barrier=plgpu.Barrier(num_arrivals=1)),
                       cluster=(2,), cluster_names=("c0",))
    def _kernel(out_ref, smem_ref, barrier):
        plgpu.copy_gmem_to_smem(out_ref, smem_ref, barrier)
        plgpu.barrier_wait(barrier)

    run(_kernel)


@ACROSS_BLOCKS
def test_race_in_sync_copy_smem_to_gmem_in_cluster():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32)), cluster=(2,), cluster_names=("c0",))
    def _kernel(out_ref, smem_ref):
        out_ref[...] = smem_ref[...]

    assert_race(_kernel)


def test_no_race_in_sync_copy_gmem_to_smem_in_cluster():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32)), cluster=(2,), cluster_names=("c0",))
    def _kernel(in_ref, _out_ref, smem_ref):
        smem_ref[...] = in_ref[...]

    run(_kernel, jnp.full(ONE, 42, jnp.int32))


def test_no_race_in_smem_across_clusters():
    @functools.partial(plgpu.kernel, out_type=i32(), scratch_types=dict(smem_ref=plgpu.SMEM(ONE, jnp.int32)), cluster=(2,), cluster_names=("c0",),
                       num_threads=2, thread_name="t")
    def _kernel(_out_ref, smem_ref):
        @pl.when(jax.lax.axis_index("c0") == 0)
        def _():
            @pl.when(jax.lax.axis_index("t") == 0)
            def _():
                smem_ref[...] = jnp.full(ONE, 42, jnp.int32)

        @pl.when(jax.lax.axis_index("c0") == 1)
        def _():
            @pl.when(jax.lax.axis_index("t") == 1)
            def _():
                smem_ref[...] = jnp.full(ONE, 43, jnp.int32)

    run(_kernel)
