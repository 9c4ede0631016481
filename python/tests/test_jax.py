"""tessel inside JAX: the XLA FFI handler's ABI, `tessel.jax.call` and `tessel.pallas.install`
inside `jax.jit`, `grad`, `vmap`, `scan`, `cond` and `shard_map`, and their errors. Expected
values come from numpy, `jnp` on XLA, or Pallas's own interpret mode, never from tessel."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import tessel  # noqa: E402
import tessel.jax as tj  # noqa: E402
from tessel import pallas as tp  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_pallas  # noqa: E402
from test_pallas import backends  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def launches(backend):
    return tj.stats()["launches"].get(backend, 0)


# ---- the ABI ----


def test_the_ffi_structs_match_jaxlibs_header(tmp_path):
    """Every struct the handler declares by hand has the size and field offsets a C compiler
    gives jaxlib's own `xla/ffi/api/c_api.h`."""
    layout = tessel._tessel._ffi_layout()
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "xla/ffi/api/c_api.h"', "int main(void) {"]
    for struct, size, fields in layout:
        if size:
            lines.append(f'  printf("{struct} size %zu\\n", sizeof({struct}));')
        for field, _ in fields:
            lines.append(f'  printf("{struct}.{field} %zu\\n", offsetof({struct}, {field}));')
    lines.append("  return 0;\n}")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        if os.environ.get("TESSEL_REQUIRE_PYTHON") == "1":
            pytest.fail(f"no C compiler ({cc}) to compile jaxlib's c_api.h")
        pytest.skip(f"no C compiler ({cc}) to compile jaxlib's c_api.h")
    subprocess.run([cc, "-std=c11", "-I", jax.ffi.include_dir(), str(src), "-o", str(exe)], check=True)
    got = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    want = {}
    for struct, size, fields in layout:
        if size:
            want[f"{struct} size"] = str(size)
        for field, offset in fields:
            want[f"{struct}.{field}"] = str(offset)
    assert len(want) > 40
    assert got == want


def test_the_handler_declares_its_api_version_and_is_registered_once():
    tj.register("cpu")
    tj.register("cpu")  # a second registration is a no-op, not an error
    tj.register("cuda")  # the CUDA handler: registered without a GPU, used only by XLA's CUDA programs
    with pytest.raises(tessel.UnsupportedError, match="CPU and CUDA platforms, not 'rocm'"):
        tj.register("rocm")
    x = f32(300)
    out = jax.jit(lambda x: tj.call(EXAMPLES / "ragged.tk", x))(x)
    np.testing.assert_allclose(np.asarray(out), np.sqrt(np.abs(x)) + 1.0, rtol=1e-6)


# ---- tessel.jax.call ----


def _bf16(shape):
    import ml_dtypes

    return RNG.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


#: Every example kernel: its inputs (generic kernels at shapes other than their defaults) and
#: the outputs numpy computes from them, in float64 where it sums.
EXAMPLE_CASES = {
    "add": (lambda: (f32(5000), f32(5000)), lambda x, y: [x + y], 0),
    "fused": (lambda: (f32(4096), f32(4096)), lambda x, y: [np.maximum(x * y + np.exp(-x), 0.0)], 1e-6),
    "masked": (lambda: (f32(1000),), lambda x: [x * 2.0 + 1.0], 0),
    "ragged": (lambda: (f32(777),), lambda x: [np.sqrt(np.abs(x)) + 1.0], 1e-6),
    "softmax": (lambda: (f32(96, 384),), lambda x: [_softmax(x.astype(np.float64))], 1e-6),
    "matmul": (lambda: (f32(128, 320), f32(320, 192)), lambda a, b: [a.astype(np.float64) @ b], 1e-4),
    "matmul_bf16": (
        lambda: (_bf16((256, 128)), _bf16((128, 256))),
        lambda a, b: [a.astype(np.float64) @ b.astype(np.float64)],
        1e-4,
    ),
    # Sums of 1024 terms near zero: an absolute tolerance of the terms' size.
    "row_reduce": (lambda: (f32(64, 1024),), lambda x: [x.astype(np.float64).sum(1), x.max(1)], 1e-4),
    "transpose_bias": (lambda: (f32(256, 128), f32(256)), lambda x, b: [x.T + b[None, :]], 0),
    "flash_attention": (
        lambda: (f32(256, 64), f32(256, 64), f32(256, 64)),
        lambda q, k, v: [_softmax(q.astype(np.float64) @ k.T * 0.125) @ v],
        1e-5,
    ),
}


def test_every_example_kernel_has_a_case():
    assert sorted(EXAMPLE_CASES) == sorted(p.stem for p in EXAMPLES.glob("*.tk"))


@pytest.mark.parametrize("name", sorted(EXAMPLE_CASES))
def test_call_runs_every_example_kernel_inside_jit(name):
    make, reference, tol = EXAMPLE_CASES[name]
    args = make()
    kernel = tessel.load(EXAMPLES / f"{name}.tk")
    want = reference(*args)
    for backend in backends():
        before = launches(backend)
        # The kernel between jnp operations, all in one jitted program.
        f = jax.jit(lambda *a: [o + 0 for o in jax.tree_util.tree_leaves(tj.call(kernel, *[x * 1 for x in a], backend=backend))])
        got = jax.block_until_ready(f(*args))
        assert launches(backend) == before + 1, backend
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (name, backend)
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol, atol=tol, err_msg=f"{name} on {backend}")


@pytest.mark.parametrize("name", sorted(EXAMPLE_CASES))
def test_vmap_of_every_example_kernel_is_one_launch_equal_to_numpy_per_element(name):
    make, reference, tol = EXAMPLE_CASES[name]
    batch = [make() for _ in range(3)]
    stacked = [np.stack(xs) for xs in zip(*batch)]
    kernel = tessel.load(EXAMPLES / f"{name}.tk")
    for backend in backends():
        before = launches(backend)
        got = jax.block_until_ready(jax.jit(jax.vmap(lambda *a: tj.call(kernel, *a, backend=backend)))(*stacked))
        # One launch of the kernel batched over a new grid axis, not one per element.
        assert launches(backend) == before + 1, (name, backend)
        got = jax.tree_util.tree_leaves(got)
        for i, args in enumerate(batch):
            for g, w in zip(got, reference(*args)):
                np.testing.assert_allclose(
                    np.asarray(g[i], np.float64), w, rtol=tol, atol=tol, err_msg=f"{name} on {backend}, element {i}"
                )


def test_every_dtype_crosses_the_handler_in_declared_output_order():
    import ml_dtypes

    names = "abcdefghi"
    types = ("f16", "bf16", "i32", "u32", "bool", "i8", "u8", "i16", "u16")
    k = tessel.compile(
        "kernel dtypes\n"
        + "".join(f"  in  {n}: {t}[64]\n" for n, t in zip(names, types))
        + "".join(f"  out o{n}: {t}[64]\n" for n, t in zip(names, types))
        + "{\n  %a = load a\n  %a2 = add %a, %a\n  store oa, %a2\n  %b = load b\n  %b2 = mul %b, %b\n  store ob, %b2\n"
        + "  %c = load c\n  %c2 = sub %c, 7\n  store oc, %c2\n  %d = load d\n  %d2 = mul %d, 3\n  store od, %d2\n"
        + "  %e = load e\n  %e2 = not %e\n  store oe, %e2\n"
        + "  %f = load f\n  %f2 = mul %f, 3\n  store of, %f2\n  %g = load g\n  %g2 = add %g, 200\n  store og, %g2\n"
        + "  %h = load h\n  %h2 = mul %h, 300\n  store oh, %h2\n  %i = load i\n  %i2 = sub %i, 1000\n  store oi, %i2\n}\n"
    )
    a = RNG.standard_normal(64).astype(np.float16)
    b = RNG.standard_normal(64).astype(ml_dtypes.bfloat16)
    c = RNG.integers(-1000, 1000, 64).astype(np.int32)
    d = RNG.integers(0, 1000, 64).astype(np.uint32)
    e = RNG.integers(0, 2, 64).astype(bool)
    f = RNG.integers(-128, 128, 64).astype(np.int8)
    g = RNG.integers(0, 256, 64).astype(np.uint8)
    h = RNG.integers(-32768, 32768, 64).astype(np.int16)
    i = RNG.integers(0, 65536, 64).astype(np.uint16)
    dtypes = ["float16", "bfloat16", "int32", "uint32", "bool", "int8", "uint8", "int16", "uint16"]
    with np.errstate(over="ignore"):
        # numpy wraps 8- and 16-bit integers as the language does.
        narrow = [f * np.int8(3), g + np.uint8(200), h * np.int16(300), i - np.uint16(1000)]
    for backend in backends():
        got = jax.jit(lambda *xs: tj.call(k, *xs, backend=backend))(a, b, c, d, e, f, g, h, i)
        assert [np.asarray(x).dtype.name for x in got] == dtypes, backend
        np.testing.assert_array_equal(np.asarray(got[0]), a + a, err_msg=backend)
        np.testing.assert_array_equal(np.asarray(got[1]).astype(np.float32), (b * b).astype(np.float32), err_msg=backend)
        np.testing.assert_array_equal(np.asarray(got[2]), c - 7, err_msg=backend)
        np.testing.assert_array_equal(np.asarray(got[3]), d * np.uint32(3), err_msg=backend)
        np.testing.assert_array_equal(np.asarray(got[4]), ~e, err_msg=backend)
        for x, want in zip(got[5:], narrow):
            np.testing.assert_array_equal(np.asarray(x), want, err_msg=backend)


def test_call_takes_inputs_by_name_and_params():
    k = tessel.load(EXAMPLES / "add.tk")
    x, y = f32(2048), f32(2048)
    out = jax.jit(lambda x, y: tj.call(k, y=y, x=x, params={"B": 256}))(x, y)
    np.testing.assert_array_equal(np.asarray(out), x + y)
    assert "block [256]" in jax.jit(lambda x, y: tj.call(k, x, y, params={"B": 256})).lower(x, y).as_text()


def test_wrong_shapes_and_dtypes_fail_at_trace_time_naming_the_input():
    k = tessel.load(EXAMPLES / "transpose_bias.tk")
    calls = tj.stats()["calls"]
    with pytest.raises(tessel.InputError) as e:
        jax.jit(lambda x, b: tj.call(k, x, b)).trace(f32(256, 128), f32(128))
    assert "`bias`" in str(e.value) and "f32[256]" in str(e.value), str(e.value)
    with pytest.raises(tessel.InputError) as e:
        jax.jit(lambda x, b: tj.call(k, x, b)).trace(f32(256, 128).astype(np.float16), f32(256))
    assert "input `x`" in str(e.value) and "float16" in str(e.value), str(e.value)
    with pytest.raises(tessel.InputError, match="has no input `z`"):
        tj.call(k, f32(256, 128), z=f32(256))
    with pytest.raises(tessel.InputError, match="needs input `bias`"):
        tj.call(k, f32(256, 128))
    assert tj.stats()["calls"] == calls, "nothing ran"


def test_arrays_outside_a_trace_are_taken_as_jax_takes_them():
    """Outside `jit`, a float64 array is float32 to JAX (x64 off) and a `>f4` array is converted
    to native order: `call` takes both so (it refused the first, and named the second
    `float32[4096]` when refusing it as not `float32[4096]`)."""
    k = tessel.load(EXAMPLES / "fused.tk")
    x, y = f32(4096), f32(4096)
    want = np.maximum(x.astype(np.float64) * y + np.exp(-x.astype(np.float64)), 0.0)
    for xs, ys in ((x.astype(np.float64), y.astype(np.float64)), (x.astype(">f4"), y.astype(">f4"))):
        out = tj.call(k, xs, ys, backend="interpret")
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)


def test_outputs_larger_than_memory_are_refused_when_lowered():
    """XLA makes a call's results before the handler runs: a kernel whose outputs cannot fit is
    refused while the call is traced, with `tessel run`'s message."""
    outs = "".join(f"  out o{n}: f32[1099511627776] block [1024] at (i)\n" for n in range(3))
    body = "".join(f"  store o{n}, %z\n" for n in range(3))
    k = tessel.compile(f"kernel big\n  grid (i: 1073741824)\n{outs}{{\n  %z = zeros : f32[1024]\n{body}}}\n")
    calls = tj.stats()["calls"]
    with pytest.raises(tessel.TesselError, match=r"making the outputs of `big` needs 12288.0 GB of memory \(outputs 12288.0 GB\), more than the "):
        jax.jit(lambda: tj.call(k, backend="interpret")).lower()
    assert tj.stats()["calls"] == calls, "nothing ran"


def test_an_unknown_backend_is_an_input_error_when_traced():
    k = tessel.load(EXAMPLES / "add.tk")
    with pytest.raises(tessel.InputError, match="unknown backend `no-such-backend`"):
        jax.jit(lambda x, y: tj.call(k, x, y, backend="no-such-backend")).trace(f32(1024), f32(1024))


@test_pallas.needs_mpmd
def test_the_seed_refusal_inside_jit_in_pallas_words():
    """A kernel on a TPU core mesh sent to Mosaic GPU inside `jax.jit`: refused when lowered,
    with Pallas's sentence and what would work; `auto` runs it elsewhere."""
    doubled_on_cores = test_pallas.doubled_on_cores
    x = f32(512)
    with tp.installed(backend="mosaic-gpu"):
        with pytest.raises(tessel.UnsupportedError) as e:
            jax.jit(doubled_on_cores).lower(x)
    assert str(e.value).splitlines()[0] == "Mesh grid(core: 2) is not supported by the Mosaic GPU backend", str(e.value)
    assert e.value.backend == "mosaic-gpu" and "mosaic_gpu(" in (e.value.hint or ""), e.value.hint
    with tp.installed(backend="auto"):
        np.testing.assert_array_equal(np.asarray(jax.jit(doubled_on_cores)(x)), x * 2.0)


def test_a_failing_launch_is_a_jax_runtime_error_with_tesselss_message():
    """A custom call whose kernel text does not parse, and one whose operand does not fit the
    kernel: XLA raises the handler's error, with tessel's message in it."""
    tj.register("cpu")
    x = f32(16)
    bad = jax.ffi.ffi_call("tessel_call", jax.ShapeDtypeStruct((16,), jnp.float32))
    with pytest.raises(Exception) as e:
        jax.jit(lambda x: bad(x, text="kernel oops {", backend="interpret")).lower(x).compile()(x).block_until_ready()
    assert "tessel_call:" in str(e.value) and "<tessel_call>:1:" in str(e.value), str(e.value)
    text = tessel.load(EXAMPLES / "masked.tk").text  # f32[1000], given f32[16]
    with pytest.raises(Exception) as e:
        jax.jit(lambda x: bad(x, text=text, backend="interpret"))(x).block_until_ready()
    assert "input `x` of kernel `masked` is f32[16], but the kernel declares f32[1000]" in str(e.value), str(e.value)
    # The handler lives on.
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: tj.call(EXAMPLES / "masked.tk", x))(f32(1000) * 0)), np.ones(1000))


def test_vmap_batches_the_kernel_over_a_grid_axis_in_one_launch():
    k = tessel.load(EXAMPLES / "softmax.tk")
    x = f32(5, 32, 256)
    want = np.stack([_softmax(a.astype(np.float64)) for a in x])
    for backend in backends():
        before = launches(backend)
        got = jax.block_until_ready(jax.jit(jax.vmap(lambda x: tj.call(k, x, backend=backend)))(x))
        assert launches(backend) == before + 1, f"{backend}: 5 elements in one launch"
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7, err_msg=backend)
    # Nested vmap: the batch dimensions are one run of elements.
    x2 = f32(2, 3, 16, 256)
    before = launches("interpret")
    got = jax.block_until_ready(jax.jit(jax.vmap(jax.vmap(lambda x: tj.call(k, x, backend="interpret"))))(x2))
    assert launches("interpret") == before + 1
    np.testing.assert_allclose(np.asarray(got), _softmax(x2.reshape(-1, 256).astype(np.float64)).reshape(x2.shape), rtol=1e-6, atol=1e-7)
    # A kernel that accumulates over a `seq` axis keeps each element's accumulation apart.
    mm = tessel.load(EXAMPLES / "matmul.tk")
    a, b = f32(3, 64, 128), f32(3, 128, 64)
    before = launches("interpret")
    got = jax.block_until_ready(jax.jit(jax.vmap(lambda a, b: tj.call(mm, a, b, backend="interpret")))(a, b))
    assert launches("interpret") == before + 1
    np.testing.assert_allclose(np.asarray(got), np.einsum("bij,bjk->bik", a.astype(np.float64), b), rtol=1e-4, atol=1e-4)


def test_vmap_of_a_launch_on_a_mesh_is_one_launch_per_element():
    """A kernel whose programs come from a mesh is not batched over a grid axis (the mesh's axes
    would not include it): the handler launches it once per element, on that element's slice."""
    tj.register("cpu")
    text = (
        "kernel meshed\n  in  x: f32[512]\n  out o: f32[512]\n{\n  %i = program_id i\n  %s = mul %i, 128\n"
        "  %v = load x[ds(%s, 128)]\n  %y = mul %v, 3.0\n  store o[ds(%s, 128)], %y\n}\n"
    )
    f = jax.ffi.ffi_call("tessel_call", jax.ShapeDtypeStruct((512,), jnp.float32), vmap_method="broadcast_all")
    x = f32(3, 512)
    before = launches("interpret")
    got = jax.block_until_ready(jax.jit(jax.vmap(lambda x: f(x, text=text, backend="interpret", mesh="grid(i: 4)", externals="")))(x))
    assert launches("interpret") == before + 3
    np.testing.assert_array_equal(np.asarray(got), x * 3.0)
    # in_axes other than 0 and an unbatched operand broadcast by JAX.
    a, y = f32(1024), f32(1024, 3)
    add = tessel.load(EXAMPLES / "add.tk")
    got = jax.jit(jax.vmap(lambda y: tj.call(add, a, y), in_axes=1, out_axes=1))(y)
    np.testing.assert_array_equal(np.asarray(got), a[:, None] + y)


def test_scan_and_cond_carry_kernel_results():
    k = tessel.load(EXAMPLES / "fused.tk")
    x0, y = f32(4096) * 0.1, f32(4096) * 0.1

    def step(x, _):
        return tj.call(k, x, y) * 0.5, None

    got, _ = jax.jit(lambda x: jax.lax.scan(step, x, None, length=6))(x0)
    want = x0.copy()
    for _ in range(6):
        want = np.maximum(want * y + np.exp(-want), 0.0) * 0.5
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    pick = jax.jit(lambda p, x: jax.lax.cond(p, lambda x: tj.call(k, x, y), lambda x: -x, x))
    np.testing.assert_allclose(np.asarray(pick(True, x0)), np.maximum(x0 * y + np.exp(-x0), 0.0), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(pick(False, x0)), -x0)


def test_mosaic_gpu_lowers_for_cuda_on_this_machine():
    """`backend="mosaic-gpu"`, lowered for CUDA here: the program holds the tessel call."""
    k = tessel.load(EXAMPLES / "matmul_bf16.tk")
    a, b = _bf16((256, 256)), _bf16((256, 256))
    lowered = jax.jit(lambda a, b: tj.call(k, a, b, backend="mosaic-gpu")).trace(a, b).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "stablehlo.custom_call @tessel_call" in text and 'backend = "mosaic-gpu"' in text, text[:2000]


@pytest.mark.filterwarnings("ignore:Using ``pl.pallas_call`` for Mosaic GPU kernels is deprecated")
def test_compiler_params_route_a_pallas_call_to_tessel_when_lowered_for_cuda():
    """Opt-in only: a `pallas_call` with `tp.CompilerParams(backend="mosaic-gpu")` lowers to a
    tessel call for CUDA; the same call without it keeps Pallas's own GPU lowering."""

    def scaled(x, params=None):
        spec = pl.BlockSpec((128,), lambda i: (i,))
        return pl.pallas_call(
            _double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,), in_specs=[spec], out_specs=spec,
            compiler_params=params,
        )(x)

    x = f32(512)
    try:
        from jax.extend import pallas as _  # noqa: F401
    except ImportError:
        with pytest.raises(tessel.UnsupportedError, match="tp.CompilerParams needs jax.extend.pallas.register_lowering_rule"):
            tp.CompilerParams()
        return
    ours = jax.jit(lambda x: scaled(x, tp.CompilerParams(backend="mosaic-gpu"))).trace(x).lower(lowering_platforms=("cuda",))
    assert "stablehlo.custom_call @tessel_call" in ours.as_text() and 'backend = "mosaic-gpu"' in ours.as_text()
    theirs = jax.jit(scaled).trace(x).lower(lowering_platforms=("cuda",))
    assert "tessel_call" not in theirs.as_text()
    # On the CPU the call goes where `install` sends it, as any other.
    with tp.installed(backend="interpret"):
        got = jax.jit(lambda x: scaled(x, tp.CompilerParams()))(x)
    np.testing.assert_array_equal(np.asarray(got), x * 2.0 + 1.0)


@pytest.mark.parametrize("backend", ["interpret", "wgpu"])
def test_concurrent_calls_equal_a_serial_run_bit_for_bit(backend):
    """200 calls from 4 threads at once, each equal bit for bit to the same call made alone."""
    if backend not in backends():
        pytest.skip("no wgpu adapter")
    k = tessel.load(EXAMPLES / "softmax.tk")
    mm = tessel.load(EXAMPLES / "matmul.tk")
    f = jax.jit(lambda x, a, b: (tj.call(k, x, backend=backend), tj.call(mm, a, b, backend=backend)))
    inputs = [(f32(64, 256), f32(64, 64), f32(64, 64)) for _ in range(8)]
    serial = [[np.asarray(o) for o in f(*i)] for i in inputs]
    failures = []

    def worker(t):
        for n in range(50):
            i = (t * 50 + n) % len(inputs)
            try:
                got = f(*inputs[i])
                same = all(np.array_equal(np.asarray(g), w) for g, w in zip(got, serial[i]))
            except Exception as e:  # a call that raises is a failure, not a quiet thread
                failures.append((t, n, repr(e)))
                continue
            if not same:
                failures.append((t, n))

    calls = tj.stats()["calls"]
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    assert tj.stats()["calls"] - calls == 400, "every call reached the handler"


# ---- Pallas kernels under install ----


@pytest.mark.parametrize("case", test_pallas.CASES, ids=[c[0] for c in test_pallas.CASES])
def test_every_pallas_test_kernel_runs_unchanged_in_jit_under_installed(case):
    name, fn, make, tol = case
    args = make()
    want = jax.tree_util.tree_map(np.asarray, jax.jit(lambda *a: fn(*a, interpret=True))(*args))
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            got = jax.block_until_ready(jax.jit(lambda *a: fn(*a))(*args))
        assert launches(backend) > before, f"{name} did not run on tessel's {backend}"
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), w, rtol=tol, atol=tol, err_msg=f"{name} on {backend}")


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def doubled(x, interpret=False):
    spec = pl.BlockSpec((128,), lambda i: (i,))
    return pl.pallas_call(
        _double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 128,),
        in_specs=[spec], out_specs=spec, interpret=interpret,
    )(x)


def test_install_uninstall_and_interpret_mode():
    x = f32(512)
    tp.uninstall()
    with pytest.raises(Exception, match="Only interpret mode is supported on CPU backend"):
        jax.jit(doubled)(x)
    tp.install(backend="interpret")
    try:
        before = launches("interpret")
        np.testing.assert_array_equal(np.asarray(jax.jit(doubled)(x)), x * 2.0 + 1.0)
        assert launches("interpret") == before + 1
        # interpret=True keeps Pallas's own interpreter: tessel launches nothing.
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: doubled(x, interpret=True))(x)), x * 2.0 + 1.0)
        assert launches("interpret") == before + 1
        assert "tessel_call" not in jax.jit(lambda x: doubled(x, interpret=True)).lower(x).as_text()
        with tp.installed(backend="wgpu" if "wgpu" in backends() else "interpret"):
            assert "tessel_call" in jax.jit(doubled).lower(x).as_text()
        assert 'backend = "interpret"' in jax.jit(doubled).lower(x).as_text()
    finally:
        tp.uninstall()
    with pytest.raises(Exception, match="Only interpret mode is supported on CPU backend"):
        jax.jit(doubled)(x)


def test_installed_blocks_in_two_threads_take_turns_and_leave_the_rules_as_they_were():
    """Thread A's block is open when thread B opens its own: B waits for A's to end (JAX's rules
    are global), then runs under its own rules; after both, no rules of tessel's are left."""
    x = f32(512)
    tp.uninstall()
    a_inside, a_may_leave = threading.Event(), threading.Event()
    events, errors = [], []

    def a():
        try:
            with tp.installed(backend="interpret"):
                events.append("a in")
                a_inside.set()
                a_may_leave.wait(timeout=60)
                np.testing.assert_array_equal(np.asarray(jax.jit(doubled)(x)), x * 2.0 + 1.0)
                events.append("a out")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def b():
        try:
            a_inside.wait(timeout=60)
            with tp.installed(backend="interpret", explain=True):
                events.append("b in")
                np.testing.assert_array_equal(np.asarray(jax.jit(doubled)(x)), x * 2.0 + 1.0)
            events.append("b out")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start()
    tb.start()
    a_inside.wait(timeout=60)
    time.sleep(0.5)  # B is at its `installed` now, and must still be waiting there
    assert events == ["a in"], events
    a_may_leave.set()
    ta.join(timeout=120)
    tb.join(timeout=120)
    assert not errors, errors
    assert events == ["a in", "a out", "b in", "b out"], events
    with pytest.raises(Exception, match="Only interpret mode is supported on CPU backend"):
        jax.jit(doubled)(x)


def test_a_refusal_is_raised_when_lowered_with_the_kernel_and_line():
    def body(x_ref, o_ref):
        o_ref[...] = jax.lax.lgamma(x_ref[...])

    def stepped(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 8), jnp.float32))(x)

    with tp.installed(backend="interpret"):
        with pytest.raises(tessel.UnsupportedError) as e:
            jax.jit(stepped).lower(f32(8, 8))
    msg = str(e.value)
    assert "primitive `lgamma` in Pallas kernel `body`" in msg and "test_jax.py:" in msg, msg


def test_a_pallas_kernel_nested_past_the_limit_is_refused_at_the_users_line():
    """65 `pl.when`s inside one another: refused naming the Python line that opened the 65th
    (it was the verifier's error at a line of the generated text); 64 run."""
    def nested(depth):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

            def nest(d):
                if d == 0:
                    o_ref[...] = o_ref[...] + 1.0
                    return

                @pl.when(pl.program_id(0) >= 0)
                def _():
                    nest(d - 1)

            nest(depth)

        return lambda x: pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,))(x)

    x = f32(8, 128)
    with tp.installed(backend="interpret"):
        np.testing.assert_array_equal(np.asarray(jax.jit(nested(64))(x)), x + 1.0)
        with pytest.raises(tessel.UnsupportedError) as e:
            jax.jit(nested(65)).lower(x)
    msg = str(e.value)
    assert "a body nested 65 deep" in msg and "Pallas kernel `body`" in msg and "test_jax.py:" in msg, msg


def test_grad_through_a_custom_vjp_whose_backward_is_a_pallas_kernel():
    @jax.custom_vjp
    def scaled(x):
        return doubled(x)

    def fwd(x):
        return doubled(x), None

    def bwd(_, g):
        return (doubled(g) - 1.0,)  # d(2x + 1)/dx = 2, through a second Pallas call

    scaled.defvjp(fwd, bwd)
    x = f32(256)
    for backend in backends():
        before = launches(backend)
        with tp.installed(backend=backend):
            value, grad = jax.block_until_ready(jax.jit(jax.value_and_grad(lambda x: jnp.sum(scaled(x) ** 2)))(x))
        assert launches(backend) == before + 2, backend
        np.testing.assert_allclose(float(value), np.sum((2.0 * x.astype(np.float64) + 1.0) ** 2), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(grad), 4.0 * (2.0 * x + 1.0), rtol=1e-5, err_msg=backend)


def test_vmap_scan_and_cond_of_a_pallas_kernel():
    x = f32(3, 512)
    with tp.installed(backend="interpret"):
        got = jax.jit(jax.vmap(doubled))(x)
        np.testing.assert_array_equal(np.asarray(got), x * 2.0 + 1.0)
        carried, _ = jax.jit(lambda x: jax.lax.scan(lambda c, _: (doubled(c) * 0.25, None), x, None, length=4))(x[0])
        want = x[0].copy()
        for _ in range(4):
            want = (want * 2.0 + 1.0) * 0.25
        np.testing.assert_allclose(np.asarray(carried), want, rtol=1e-6)
        chosen = jax.jit(lambda p, x: jax.lax.cond(p, doubled, lambda x: x, x))
        np.testing.assert_array_equal(np.asarray(chosen(True, x[1])), x[1] * 2.0 + 1.0)


def test_ctrl_c_stops_a_long_kernel_inside_jit_and_the_process_goes_on():
    """SIGINT while XLA runs a `tessel_call` of a kernel that would take minutes: the launch stops
    within moments (it ran to its end: Python's handler only notes the signal while the main
    thread waits inside jaxlib), `KeyboardInterrupt` is raised, and jitted calls run as before."""
    from test_tessel import SPIN, interrupt_child

    code = textwrap.dedent(f"""
        import signal, sys, time, numpy as np, jax, tessel, tessel.jax as tj
        signal.signal(signal.SIGINT, signal.default_int_handler)
        add = tessel.load(sys.argv[1])
        y = np.arange(1024, dtype=np.float32)
        g = jax.jit(lambda a, b: tj.call(add, a, b, backend="interpret"))
        g(y, y).block_until_ready()
        f = jax.jit(lambda x: tj.call(tessel.compile({SPIN!r}), x, backend="interpret"))
        x = np.zeros((64, 16), np.float32)
        print("started", flush=True)
        try:
            f(x).block_until_ready()
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
        print("usable" if np.array_equal(np.asarray(g(y, y)), y + y) else "wrong", flush=True)
    """)
    rest, err, latency, code = interrupt_child(code, [str(EXAMPLES / "add.tk")], env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=60)
    assert rest == ["usable"] and code == 0, (rest, err[-2000:])
    assert latency < 5, f"KeyboardInterrupt came {latency:.1f} s after SIGINT"


def test_a_kernel_of_100000_statements_runs_in_python_and_inside_jit():
    """A chain `%v1 = add %v0, 1.0; ...` of 100,000 statements (it crashed the Python module at
    about 4,000 on wgpu, with a signal: the launch's thread has a smaller stack; the interpreter's
    compile took time quadratic in its length): right on the interpreter from Python and inside
    `jax.jit`, refused by wgpu by name, never a crash."""
    n = 100_000
    text = "kernel chain\n  grid (i: 4)\n  in x: f32[64] block [16] at (i)\n  out o: f32[64] block [16] at (i)\n{\n  %v0 = load x\n"
    text += "".join(f"  %v{k} = add %v{k - 1}, 1.0\n" for k in range(1, n + 1)) + f"  store o, %v{n}\n}}\n"
    x = np.arange(64, dtype=np.float32)
    want = x + np.float32(n)  # exact: every partial sum is an integer below 2^24
    k = tessel.compile(text)
    np.testing.assert_array_equal(k(x=x, backend="interpret")["o"], want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: tj.call(k, x, backend="interpret"))(x)), want)
    if "wgpu" in backends():
        with pytest.raises(tessel.UnsupportedError, match="has 100002 statements, more than the 16384 the wgpu backend compiles"):
            k(x=x, backend="wgpu")


# ---- scale-out ----


def test_shard_map_on_four_host_devices_equals_one_device():
    """examples/jax/shard_map.py in a process with 4 host devices: a tessel kernel per shard and
    a psum equal to the unsharded computation, the calls concurrent, no inputs gathered."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, str(EXAMPLES / "jax" / "shard_map.py")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "devices: 4" in r.stdout, r.stdout
    most = int(r.stdout.split("at most ")[1].split()[0])
    assert most >= 2, f"the shards' calls never overlapped: {r.stdout}"


@pytest.mark.parametrize("processes", [1, 2])
def test_a_kernel_per_shard_across_processes_with_psum_all_gather_and_ppermute(processes):
    """examples/jax/multiprocess.py: JAX's multi-process runtime on the CPU (gloo, 127.0.0.1),
    a tessel kernel on each process's shard under `shard_map`, and XLA's psum, all_gather and
    ppermute between the processes, each checked against numpy on the whole array; on the cpu
    plugin where it is built (auto chooses it), else the interpreter."""
    from pallas_common import cpu_backend

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if cpu_backend():
        env["TESSEL_PLUGIN_PATH"] = str(Path(os.environ["TESSEL_TEST_LIBS"]) / "libtessel_cpu.so")
    r = subprocess.run([sys.executable, str(EXAMPLES / "jax" / "multiprocess.py"), str(processes)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{processes} processes: all agree with numpy" in r.stdout, r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("process ")]
    assert len(lines) == processes and all(": ok;" in line for line in lines), r.stdout
    if cpu_backend():
        assert all("'cpu'" in line for line in lines), r.stdout


def test_a_pallas_kernel_under_shard_map():
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        import numpy as np, jax, jax.numpy as jnp
        from jax.sharding import Mesh, PartitionSpec as P
        from tessel import pallas as tp
        from test_jax import doubled
        mesh = Mesh(np.array(jax.devices()), ("d",))
        x = np.arange(4 * 512, dtype=np.float32) / 100
        # check_vma=False: Pallas's out_shape carries no varying-axes type (a Pallas rule, not tessel's).
        f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(jnp.sum(doubled(x)), "d"), mesh=mesh, in_specs=P("d"), out_specs=P(), check_vma=False))
        with tp.installed(backend="interpret"):
            got = float(f(x))
            hlo = f.lower(x).compile().as_text()
        assert "tessel_call" in hlo and "all-gather" not in hlo
        want = float(np.sum(x.astype(np.float64) * 2 + 1))
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)
        print("ok", len(jax.devices()))
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "ok 4" in r.stdout, r.stdout + r.stderr


def test_an_exported_program_carries_its_kernel_to_another_process(tmp_path):
    """`jax.export` of a program with a tessel call (tessel's target named as a custom call the
    exporter may keep): the serialized program runs in a fresh process that registered the
    handler, from the kernel text in its attributes."""
    k = tessel.load(EXAMPLES / "add.tk")
    x = f32(1024)
    exported = jax.export.export(
        jax.jit(lambda x, y: tj.call(k, x, y, backend="interpret") * 2),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("tessel_call")],
    )(x, x)
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(
        f"""
        import numpy as np, jax, tessel.jax as tj
        tj.register("cpu")
        program = jax.export.deserialize(bytearray(open({str(tmp_path / 'program.bin')!r}, "rb").read()))
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.testing.assert_array_equal(np.asarray(program.call(x, x)), (x + x) * 2)
        print("ok", tj.stats()["launches"])
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert r.returncode == 0 and "ok {'interpret': 1}" in r.stdout, r.stdout + r.stderr
