"""What the Pallas test files share: the random inputs, the backends a test runs on (wgpu where an
adapter is, a failure where TESSEL_REQUIRE_ADAPTER=1 and there is none), and `pl.kernel`'s marker."""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

import jax
import tessel
from jax.experimental import pallas as pl

RNG = np.random.default_rng(3)


#: `pl.kernel` makes an `mpmd_map` from jax 0.10; before, a `pallas_call` with a mesh, which tessel
#: does not translate (docs/jax.md, Versions).
needs_mpmd = pytest.mark.skipif(
    importlib.util.find_spec("jax._src.pallas.mpmd") is None,
    reason="this jax's pl.kernel is a pallas_call with a mesh, which tessel does not translate (jax 0.10 makes an mpmd_map)",
)


def cpu_backend():
    """["cpu"] where the cpu backend's plugin is built (TESSEL_TEST_LIBS) and this machine has a
    C compiler for it, loaded once; else [] (TESSEL_REQUIRE_CC=1 makes no compiler a failure)."""
    global _CPU
    if _CPU is None:
        lib = Path(os.environ.get("TESSEL_TEST_LIBS", "")) / "libtessel_cpu.so"
        _CPU = []
        if os.environ.get("TESSEL_TEST_LIBS") and lib.exists():
            tessel.load_plugin(str(lib))
            b = next(b for b in tessel.backends() if b["name"] == "cpu")
            if b["available"]:
                _CPU = ["cpu"]
            elif os.environ.get("TESSEL_REQUIRE_CC") == "1":
                pytest.fail(f"the cpu backend is required here but unavailable: {b['reason']}")
    return _CPU


_CPU = None


def backends():
    b = next(b for b in tessel.backends() if b["name"] == "wgpu")
    if b["available"]:
        return ["interpret", "wgpu"] + cpu_backend()
    if os.environ.get("TESSEL_REQUIRE_ADAPTER") == "1":
        pytest.fail(f"wgpu is required here but unavailable: {b['reason']}")
    return ["interpret"] + cpu_backend()


def concurrent_backends():
    """The backends that run the Mosaic GPU model's kernels (threads, barriers, asynchronous
    copies): every one of `backends()` but cpu, which refuses them (`auto` then takes the
    interpreter; test_tessel.py checks both)."""
    return [b for b in backends() if b != "cpu"]


def call(body, out_shape, grid, in_specs, out_specs, interpret):
    return pl.pallas_call(body, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs, interpret=interpret)


f32 = lambda *shape: RNG.standard_normal(shape).astype(np.float32)  # noqa: E731


def add(x, y, interpret=False):
    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((128,), lambda i: (i,))
    return call(body, jax.ShapeDtypeStruct(x.shape, x.dtype), (x.shape[0] // 128,), [spec, spec], spec, interpret)(x, y)
