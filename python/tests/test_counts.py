"""One plan per launch through Python and the XLA FFI handler: a cold call parses the kernel text
once in the host and once in each backend asked, verifies once in each, and plans once on each
backend asked; a repeated call parses, verifies and plans nothing. Counted by
`tessel._tessel._counts()` (tessel_plugin_api::ir::counters, shared by the built-in backends).
"""

import pathlib
import uuid

import numpy as np
import pytest

import tessel
from tessel import _tessel

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Not generic: a generic kernel is parsed twice in the host (its template, then bound).
FUSED = ROOT / "examples" / "fused.tk"


def fresh_fused():
    """`fused` under a name no other test uses: a launch no cache of this process has seen."""
    return FUSED.read_text().replace("kernel fused", f"kernel fused_{uuid.uuid4().hex[:12]}")


def counted(f):
    before = _tessel._counts()
    out = f()
    after = _tessel._counts()
    return out, {k: after[k] - before[k] for k in before}


def fused_inputs(kernel):
    rng = np.random.default_rng(3)
    # Every input of `fused` is f32.
    return {name: rng.standard_normal(shape).astype(np.float32) for name, (_, shape) in kernel.inputs.items()}


def test_a_cold_call_parses_once_per_side_verifies_once_per_backend_and_plans_once():
    text = fresh_fused()
    k, c = counted(lambda: tessel.compile(text))
    assert (c["parses"], c["verifies"], c["plans"]) == (1, 1, 0), c
    inputs = fused_inputs(k)
    result, c = counted(lambda: k.run(backend="interpret", **inputs))
    assert result.backend == "interpret"
    assert (c["parses"], c["verifies"], c["plans"]) == (1, 1, 1), c
    # The same launch again: planned before, so no backend is asked.
    _, c = counted(lambda: k.run(backend="interpret", **inputs))
    assert (c["parses"], c["verifies"], c["plans"]) == (0, 0, 0), c
    # Under auto, each backend asked once (the explanation names them), the chosen one not again;
    # one that saw the same launch before (the interpreter, above) neither parses nor verifies
    # nor plans it again: its adapter keeps plans by launch.
    result, c = counted(lambda: k.run(backend="auto", **inputs))
    asked = [line.split(":")[0] for line in result.decisions if ": chosen (" in line or "refuses the launch" in line]
    assert asked, result.decisions
    # A plugin counts in its own copy of the plugin API (its shared library), not the host's.
    plugins = {b["name"] for b in tessel.backends() if b["source"] != "built-in"}
    fresh = len([b for b in asked if b != "interpret" and b not in plugins])
    assert (c["verifies"], c["plans"]) == (fresh, fresh) and c["parses"] <= fresh, (c, result.decisions)


def test_the_ffi_handler_prepares_once_and_then_parses_verifies_and_plans_nothing():
    jax = pytest.importorskip("jax")
    import tessel.jax as tj

    k = tessel.compile(fresh_fused())
    inputs = fused_inputs(k)
    f = jax.jit(lambda *xs: tj.call(k, *xs, backend="interpret"))
    args = [inputs[name] for name in k.inputs]
    # Tracing specializes (its kernel is kept) and prepares the handler's launch: one parse of
    # the call's text in the host, one in the interpreter; one verify each; one plan.
    _, c = counted(lambda: jax.block_until_ready(f(*args)))
    assert c["plans"] == 1 and c["parses"] <= 2 and c["verifies"] <= 2, c
    _, c = counted(lambda: jax.block_until_ready(f(*args)))
    assert (c["parses"], c["verifies"], c["plans"]) == (0, 0, 0), c



def test_a_call_lowered_for_cuda_plans_once_on_mosaic_gpu_and_the_launch_reuses_that_plan():
    """The CUDA handler's path as far as a machine without a GPU goes: lowered for CUDA, the call
    is prepared for mosaic-gpu (parsed once in the host and once in the backend, verified once in
    each, planned once), and lowered again it is prepared from the cache. On a GPU the handler's
    launches then take that plan and compile from the backend's caches (`launch_external`;
    `tests/launch_counts.rs` counts that part on any machine, `test_cuda.py` on a Hopper)."""
    jax = pytest.importorskip("jax")
    import tessel.jax as tj

    k = tessel.compile(fresh_fused())
    inputs = fused_inputs(k)
    args = [inputs[name] for name in k.inputs]
    f = jax.jit(lambda *xs: tj.call(k, *xs, backend="mosaic-gpu"))
    lowered, c = counted(lambda: f.trace(*args).lower(lowering_platforms=("cuda",)))
    assert 'backend = "mosaic-gpu"' in lowered.as_text()
    assert c["plans"] == 1 and c["parses"] <= 2 and c["verifies"] <= 2, c
    _, c = counted(lambda: f.trace(*args).lower(lowering_platforms=("cuda",)))
    assert (c["parses"], c["verifies"], c["plans"]) == (0, 0, 0), c
