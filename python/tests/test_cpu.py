"""The cpu backend (tessel-cpu, a compiling plugin) from Python: loaded from TESSEL_TEST_LIBS as
scripts/test builds it. The Pallas and JAX suites run on it too (pallas_common.backends)."""

import pathlib

import numpy as np
import pytest
import tessel
from pallas_common import cpu_backend

ROOT = pathlib.Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


def example(name):
    return tessel.load(ROOT / "examples" / f"{name}.tk")


def test_the_cpu_plugin_runs_kernels_refuses_the_concurrent_model_and_auto_falls_back():
    """The compiling CPU backend, loaded as a plugin: it runs a kernel as the interpreter does,
    `auto` chooses it before the interpreter, and a kernel of the concurrent model is refused by
    name and run by the interpreter under `auto`."""
    if not cpu_backend():
        pytest.skip("the cpu backend's plugin is not built (TESSEL_TEST_LIBS) or there is no C compiler")
    k = example("fused")
    inputs = {name: RNG.standard_normal(shape).astype(np.float32) for name, (_, shape) in k.inputs.items()}
    want = k.run(backend="interpret", **inputs).outputs["o"]
    got = k.run(backend="cpu", **inputs)
    np.testing.assert_allclose(got.outputs["o"], want, rtol=1e-6, atol=1e-6)
    assert k.run(backend="auto", **inputs).backend == "cpu"
    handoff = tessel.compile((ROOT / "tests/concurrent/handoff.tk").read_text())
    args = {name: RNG.standard_normal(shape).astype(np.float32) for name, (_, shape) in handoff.inputs.items()}
    with pytest.raises(tessel.UnsupportedError, match="uses the concurrent model .* which the cpu backend does not compile"):
        handoff.run(backend="cpu", **args)
    assert handoff.run(backend="auto", **args).backend == "interpret"
