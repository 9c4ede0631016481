"""tessel inside JAX on an NVIDIA GPU: `tessel_call`'s CUDA handler under `jax.jit`, on XLA's
device buffers and stream. These run where JAX has a CUDA device (`scripts/gpu-check` runs them
on a lent Hopper); elsewhere each is a visible skip, and TESSEL_REQUIRE_GPU=1 makes it a failure.
Expected values come from numpy on the host, never from tessel."""

import os
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessel  # noqa: E402
import tessel.jax as tj  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RNG = np.random.default_rng(11)


def _gpu():
    for platform in ("cuda", "gpu"):
        try:
            return jax.devices(platform)[0]
        except RuntimeError:
            pass
    return None


GPU = _gpu()
if GPU is None:
    why = f"no CUDA device in jax {jax.__version__} (jax.devices('cuda') is empty)"
    if os.environ.get("TESSEL_REQUIRE_GPU") == "1":
        raise RuntimeError(f"TESSEL_REQUIRE_GPU=1, but {why}")
    pytest.skip(why, allow_module_level=True)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def on_gpu(x):
    return jax.device_put(x, GPU)


def counts():
    s = tj.stats()
    return s["launches"].get("mosaic-gpu", 0), s["staged"]


def test_a_kernel_runs_on_xlas_device_buffers_without_copies():
    k = tessel.load(EXAMPLES / "add.tk")
    x, y = f32(1 << 20), f32(1 << 20)
    before = counts()
    f = jax.jit(lambda x, y: tj.call(k, x, y, backend="mosaic-gpu") * 2.0)
    out = f(on_gpu(x), on_gpu(y))
    assert out.devices() == {GPU}
    np.testing.assert_allclose(np.asarray(out), (x + y) * 2.0, rtol=1e-6)
    launched, staged = counts()
    assert launched == before[0] + 1 and staged == before[1], (before, counts())


def test_calls_in_one_program_keep_xlas_order():
    """Kernels enqueued on XLA's stream, between XLA's own operations, with no wait: each reads
    what the one before wrote."""
    add = tessel.load(EXAMPLES / "add.tk")
    soft = tessel.load(EXAMPLES / "softmax.tk")
    x, y = f32(1024, 256), f32(1024, 256)

    def step(x, y):
        s = tj.call(add, x.reshape(-1), y.reshape(-1), backend="mosaic-gpu").reshape(x.shape)
        s = jnp.tanh(s)
        return tj.call(soft, s, backend="mosaic-gpu") + tj.call(add, x.reshape(-1), s.reshape(-1), backend="mosaic-gpu").reshape(x.shape)

    got = np.asarray(jax.jit(step)(on_gpu(x), on_gpu(y)))
    s = np.tanh(x + y)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True) + (x + s)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_bf16_matmul_on_the_hopper_path_inside_jit():
    import ml_dtypes

    k = tessel.load(EXAMPLES / "matmul_bf16.tk")
    a = RNG.standard_normal((512, 256)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((256, 384)).astype(ml_dtypes.bfloat16)
    got = np.asarray(jax.jit(lambda a, b: tj.call(k, a, b, backend="mosaic-gpu"))(on_gpu(a), on_gpu(b))).astype(np.float32)
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-1)


def test_vmap_batches_on_the_device():
    k = tessel.load(EXAMPLES / "add.tk")
    x, y = f32(6, 4096), f32(6, 4096)
    got = jax.jit(jax.vmap(lambda x, y: tj.call(k, x, y, backend="mosaic-gpu")))(on_gpu(x), on_gpu(y))
    np.testing.assert_allclose(np.asarray(got), x + y, rtol=1e-6)


def test_another_backend_runs_through_host_copies_and_is_counted():
    k = tessel.load(EXAMPLES / "add.tk")
    x, y = f32(4096), f32(4096)
    before = counts()
    out = jax.jit(lambda x, y: tj.call(k, x, y, backend="interpret") + 1.0)(on_gpu(x), on_gpu(y))
    np.testing.assert_allclose(np.asarray(out), x + y + 1.0, rtol=1e-6)
    assert counts()[1] == before[1] + 1


def test_a_kernel_mosaic_gpu_refuses_is_refused_when_traced():
    k = tessel.load(ROOT / "tests" / "in" / "dyn_grid.tk")
    x = f32(64, 32)
    with pytest.raises(tessel.UnsupportedError, match="dynamic grid bounds not supported in the Mosaic GPU backend"):
        jax.jit(lambda x: tj.call(k, x, backend="mosaic-gpu"))(on_gpu(x))


def test_an_unchanged_pallas_call_runs_on_tessel_when_its_compiler_params_say_so():
    """`compiler_params=tp.CompilerParams(backend="mosaic-gpu")` sends a `pallas_call` that JAX
    lowers for the GPU to tessel's CUDA handler (`jax.extend.pallas.register_lowering_rule`)."""
    from jax.experimental import pallas as pl

    from tessel import pallas as tp

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    def f(x):
        spec = pl.BlockSpec((256,), lambda i: (i,))
        return pl.pallas_call(
            double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 256,), in_specs=[spec],
            out_specs=spec, compiler_params=tp.CompilerParams(backend="mosaic-gpu"),
        )(x)

    x = f32(4096)
    before = counts()
    got = jax.jit(lambda x: f(x) + 1.0)(on_gpu(x))
    np.testing.assert_allclose(np.asarray(got), x * 2.0 + 2.0, rtol=1e-6)
    assert counts()[0] == before[0] + 1


def test_an_aliased_output_left_partly_unwritten_keeps_the_inputs_values_on_the_device():
    """`input_output_aliases` with a masked store, on XLA's device buffers: the elements the
    kernel does not store keep the input's values (the handler does not zero a kept output), on
    the direct path and on the host-copy path (a `bool` operand sends a call there)."""
    from jax.experimental import pallas as pl

    from tessel import pallas as tp

    def body(x_ref, o_ref):
        o_ref[pl.ds(0, 4)] = x_ref[pl.ds(0, 4)] * 3.0

    def f(x):
        spec = pl.BlockSpec((8,), lambda i: (i,))
        return pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
            input_output_aliases={0: 0}, compiler_params=tp.CompilerParams(backend="mosaic-gpu"),
        )(x)

    x = np.arange(16, dtype=np.float32)
    want = np.concatenate([x[:4] * 3, x[4:8], x[8:12] * 3, x[12:]])
    before = counts()
    got = jax.jit(f)(on_gpu(x))
    np.testing.assert_array_equal(np.asarray(got), want)
    assert counts()[0] == before[0] + 1


def test_ctrl_c_stops_waiting_for_a_long_mosaic_gpu_kernel():
    """Under the Python module's cancellation token Mosaic GPU waits for its kernel by asking an
    event recorded after it, and gives up once Ctrl-C cancels the token: KeyboardInterrupt comes
    within seconds of SIGINT, not after the kernel (64 programs of 10^9 dependent steps), and
    the module runs kernels as before."""
    from test_tessel import SPIN, interrupted_launch

    rest, err, latency, code = interrupted_launch(SPIN, (64, 16), "mosaic-gpu")
    assert latency < 5, f"KeyboardInterrupt came {latency:.1f} s after SIGINT"
    assert rest == ["usable"] and code == 0, (rest, err)


def test_a_kernel_with_bool_arrays_is_staged_and_the_launch_is_planned_once():
    """mosaic-gpu's PTX holds a `bool` in 4 bytes and XLA's buffers in 1: the backend refuses to
    launch on XLA's memory (`launch_external`: `Unsupported`) and the handler stages the call
    through host memory, remembering it; the launch is parsed, verified and planned once."""
    from tessel import _tessel

    name = f"flags_{RNG.integers(1 << 40):x}"
    k = tessel.compile(
        f"kernel {name}\n  grid (i: 4)\n  in x: f32[4096] block [1024] at (i)\n  out o: bool[4096] block [1024] at (i)\n"
        "{\n  %x = load x\n  %z = lt %x, 0.0\n  store o, %z\n}\n"
    )
    x = f32(4096)
    f = jax.jit(lambda x: tj.call(k, x, backend="mosaic-gpu"))
    before, c0 = counts(), _tessel._counts()
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(f(on_gpu(x))), x < 0.0)
    c1 = _tessel._counts()
    assert counts()[1] == before[1] + 2, (before, counts())
    assert c1["plans"] - c0["plans"] == 1, (c0, c1)
