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


WARMED = r"""
import os, pathlib, sys, time
import tessel, tessel.jax as tj
tessel.load_plugin(sys.argv[1])
libraries = lambda: [p for p in (pathlib.Path(os.environ["TESSEL_CACHE_DIR"]) / "cpu").glob("*.so") if ".tmp" not in p.name]
text = "kernel warm\n  in  a: f32[512]\n  out o: f32[512]\n{\n  %a = load a\n  %o = mul %a, 2.5\n  store o, %o\n}\n"
assert not libraries()
tj.prepare(text, "cpu")
deadline = time.monotonic() + 300
while not libraries():
    assert time.monotonic() < deadline, "no library five minutes after the call was prepared"
    time.sleep(0.02)
print("compiled before any call")
"""


def test_a_call_prepared_for_xla_is_compiled_while_xla_compiles(tmp_path):
    """The XLA FFI handler prepares a call when XLA lowers it and has the backend warm up then:
    on cpu the C compiler runs off the thread, so the library is on disk before the call runs
    (in a process of its own with a cache folder of its own, so no other test's libraries count)."""
    if not cpu_backend():
        pytest.skip("the cpu backend's plugin is not built (TESSEL_TEST_LIBS) or there is no C compiler")
    import os
    import subprocess
    import sys

    lib = pathlib.Path(os.environ["TESSEL_TEST_LIBS"]) / "libtessel_cpu.so"
    env = dict(os.environ, TESSEL_CACHE_DIR=str(tmp_path))
    env.pop("TESSEL_CACHE", None)
    out = subprocess.run([sys.executable, "-c", WARMED, str(lib)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "compiled before any call" in out.stdout, out.stderr
