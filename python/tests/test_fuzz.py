"""Fuzzing the surfaces added since the last reliability work, with hypothesis: the `tessel_call`
custom call's attributes (text, backend, mesh, externals, keep) straight to the XLA FFI handler,
`tessel.jax.call`'s arguments under `jit` and `vmap`, and the Pallas import (kernels drawn from a
grammar of the primitives it translates, against Pallas's own interpreter).

What every input must give: the right answer, or an exception of tessel's (or JAX's, for misuse
JAX itself checks) naming what is wrong — never a crash, a hang, a wrong answer, or an error
raised from inside tessel's Python code by accident (a `KeyError` in `tessel/jax.py` is a bug).

Budget: TESSEL_FUZZ_EXAMPLES examples per test (default 40, what `scripts/test` runs; the draws
are derandomized there, so a run is repeatable). `scripts/fuzz` runs many more with fresh draws
and keeps hypothesis's database of failing examples under target/hypothesis. A failure found
becomes an `@example(...)` on its test, which every later run tries first.
"""

import os
import pathlib
import traceback

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import tessel  # noqa: E402
import tessel.jax as tj  # noqa: E402
from tessel import pallas as tp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADD_PATH = ROOT / "examples" / "add.tk"
ADD = ADD_PATH.read_text()

FRESH = os.environ.get("TESSEL_FUZZ_FRESH") == "1"
FUZZ = settings(
    max_examples=int(os.environ.get("TESSEL_FUZZ_EXAMPLES", "40")),
    deadline=None,
    derandomize=not FRESH,
    database=hypothesis.database.DirectoryBasedExampleDatabase(str(ROOT / "target" / "hypothesis")) if FRESH else None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

TESSEL_CODE = str(ROOT / "python" / "tessel")
# wgpu where an adapter is there (the other tests count its absence as a skip).
WGPU = next(b for b in tessel.backends() if b["name"] == "wgpu")["available"]


def assert_clean(e: BaseException, *, jax_misuse: bool = False):
    """`e` is tessel's own error, or JAX's (raised in JAX's code), or an XLA runtime error
    carrying the handler's message; never an accident inside tessel's Python code, never a
    panic's text."""
    text = str(e)
    event(f"{type(e).__name__}: {text.splitlines()[0][:60] if text else ''}")
    assert "panicked" not in text and "internal error in tessel" not in text, text[:2000]
    if isinstance(e, tessel.TesselError):
        return
    if type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
        assert text.strip(), "an XLA error without tessel's message"
        return
    frames = traceback.extract_tb(e.__traceback__)
    last = frames[-1].filename if frames else ""
    assert jax_misuse and not last.startswith(TESSEL_CODE), (
        f"{type(e).__name__} raised in {last}:{frames[-1].lineno if frames else '?'}: {text[:1000]}"
    )


# ---- the custom call's attributes, straight to the handler ----


def mutated(text: str, data) -> str:
    """`text` with a few random edits: a slice cut, a token inserted, a character replaced."""
    tokens = ["%", "add", "load", "store", "[", "]", "(", ")", "{", "}", ",", ":", "f32", "i32", "-1",
              "99999999999999999999", "1e999", "grid", "block", "at", "\n", " ", "kernel", "seq", "#", "\x00", "é"]
    for _ in range(data.draw(st.integers(1, 3))):
        if not text:
            break
        at = data.draw(st.integers(0, len(text) - 1))
        kind = data.draw(st.sampled_from(["cut", "insert", "replace"]))
        if kind == "cut":
            text = text[:at] + text[at + data.draw(st.integers(1, 40)):]
        elif kind == "insert":
            text = text[:at] + data.draw(st.sampled_from(tokens)) + text[at:]
        else:
            text = text[:at] + data.draw(st.characters()) + text[at + 1:]
    return text


NAMES = ["", "auto", "interpret", "wgpu", "mosaic-gpu", "nope", "INTERPRET", "interpret ", "b" * 5000]
MESHES = ["", "grid(i: 8)", "grid(i: 0)", "grid(j: 8)", "device(x: 2)", "mosaic_gpu(i: 8)", "mosaic_gpu(i: 8, wg: 2 thread)",
          "wgpu(i: 8)", "grid(i: 8", "grid(" + ", ".join(f"a{i}: 1" for i in range(100)) + ")"]


@FUZZ
@given(data=st.data(),
       which=st.sampled_from(["valid", "mutated", "junk"]),
       backend=st.one_of(st.sampled_from(NAMES), st.text(max_size=30)),
       mesh=st.one_of(st.sampled_from(MESHES), st.text(max_size=30)),
       externals=st.one_of(st.sampled_from(MESHES), st.text(max_size=30)),
       keep=st.one_of(st.sampled_from(["", "o", "x", "o,o", ",", "nope"]), st.text(max_size=10)))
def test_tessel_call_attributes_give_the_answer_or_an_error(data, which, backend, mesh, externals, keep):
    tj.register("cpu")
    text = {"valid": lambda: ADD, "mutated": lambda: mutated(ADD, data), "junk": lambda: data.draw(st.text(max_size=300))}[which]()
    x = np.arange(1024, dtype=np.float32)
    y = np.full(1024, 0.5, np.float32)
    f = jax.ffi.ffi_call("tessel_call", jax.ShapeDtypeStruct((1024,), jnp.float32))
    try:
        out = np.asarray(jax.jit(lambda x, y: f(x, y, text=text, backend=backend, mesh=mesh, externals=externals, keep=keep))(x, y))
    except Exception as e:  # noqa: BLE001 - judged by assert_clean
        assert_clean(e)
        return
    event(f"ran: {which}")
    if text == ADD:
        np.testing.assert_array_equal(out, x + y)
    else:
        # A mutation that still makes a kernel of these arguments: the interpreter's answer.
        want = tessel.compile(text)(x=x, y=y, backend="interpret")
        np.testing.assert_array_equal(out, next(iter(want.values())))


# ---- tessel.jax.call's arguments ----


DTYPES = [np.float32, np.float16, np.int32, np.float64, np.bool_]


# Each draw leans to calls the kernel takes (one dimension, f32, its own names), so that the
# transforms are reached, and keeps the ways to get them wrong.
@FUZZ
@given(n=st.sampled_from([0, 1, 64, 127, 128, 1024, 2048, 4096]),
       dims=st.sampled_from([1, 1, 1, 0, 2]),
       dtype=st.sampled_from([np.float32] * 4 + DTYPES),
       how=st.sampled_from(["positional", "named", "mixed"] * 3 + ["extra", "missing", "twice", "unknown"]),
       transform=st.sampled_from(["eager", "jit", "vmap", "jit_vmap", "shard_map"]),
       params=st.one_of(st.none(), st.none(), st.dictionaries(st.sampled_from(["N", "B", "Q"]),
                                                    st.one_of(st.sampled_from([64, 128, 100, 0, -1]),
                                                              st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3)),
                                                    max_size=2)),
       backend=st.sampled_from(["auto", "interpret", "interpret", "wgpu", "nope"]))
def test_jax_call_arguments_give_the_answer_or_an_error(n, dims, dtype, how, transform, params, backend):
    shape = [n] if dims == 1 else [2, n] if dims == 2 else []
    x = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) % 7).astype(dtype)
    y = np.ones(shape, dtype)
    k = tessel.load(ADD_PATH)

    def call(x, y):
        kw = dict(backend=backend, params=params)
        if how == "positional":
            return tj.call(k, x, y, **kw)
        if how == "named":
            return tj.call(k, y=y, x=x, **kw)
        if how == "mixed":
            return tj.call(k, x, y=y, **kw)
        if how == "extra":
            return tj.call(k, x, y, x, **kw)
        if how == "missing":
            return tj.call(k, x, **kw)
        if how == "twice":
            return tj.call(k, x, y, x=x, **kw)
        return tj.call(k, x, y, z=y, **kw)

    wrapped = {
        "eager": call,
        "jit": jax.jit(call),
        "vmap": jax.vmap(call),
        "jit_vmap": jax.jit(jax.vmap(call)),
        "shard_map": jax.jit(jax.shard_map(call, mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)),
                                           in_specs=jax.sharding.PartitionSpec(), out_specs=jax.sharding.PartitionSpec())),
    }[transform]
    try:
        out = np.asarray(wrapped(x, y))
    except Exception as e:  # noqa: BLE001 - judged by assert_clean
        assert_clean(e, jax_misuse=True)
        return
    # Success only for a call the kernel takes: inputs of f32 (float64 is taken as JAX takes it,
    # as float32 where x64 is off), one dimension per call, by the kernel's names.
    event(f"ran: {transform}")
    assert how in ("positional", "named", "mixed"), f"{how} was taken"
    np.testing.assert_array_equal(out, (x.astype(np.float32) + y.astype(np.float32)))


# ---- the Pallas import: kernels from a grammar of primitives ----


# Continuous operations only between computed values: an ulp of difference in a computed value
# (a sum's order) must stay an ulp of difference. The discontinuous ones (`floor`, a comparison,
# rounding to f16) read the inputs only, where both sides see the same bits — the first find of
# this fuzzer was `floor(c - mean(c))`, 0 on one side and -1 on the other, which is no bug.
UNARY = {
    "neg": jnp.negative, "abs": jnp.abs, "exp": lambda a: jnp.exp(jnp.clip(a, -20.0, 20.0)), "tanh": jnp.tanh,
    "sin": jnp.sin, "sqrt": lambda a: jnp.sqrt(jnp.abs(a) + 1.0), "square": jnp.square,
    "logistic": jax.nn.sigmoid, "log1p": lambda a: jnp.log1p(jnp.abs(a)),
    "rowsum": lambda a: a - jnp.sum(a, axis=-1, keepdims=True) / a.shape[-1],
    "rowmax": lambda a: a - jnp.max(a, axis=-1, keepdims=True),
}
BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "where": lambda a, b, x, y: jnp.where(x > y, a, b * 0.5), "div": lambda a, b: a / (jnp.abs(b) + 1.0),
}
LEAVES = {
    "x": lambda x, y: x, "y": lambda x, y: y,
    "floor": lambda x, y: jnp.floor(x * 4.0) / 4.0,
    "f16": lambda x, y: y.astype(jnp.float16).astype(jnp.float32),
    "iota": lambda x, y: jax.lax.broadcasted_iota(jnp.int32, x.shape, 1).astype(jnp.float32) / x.shape[1],
}

EXPR = st.recursive(
    st.one_of(st.sampled_from(sorted(LEAVES)), st.floats(-4, 4, width=32).map(lambda c: ("const", c))),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(sorted(UNARY)), inner),
        st.tuples(st.sampled_from(sorted(BINARY)), inner, inner),
    ),
    max_leaves=6,
)


def evaluate(e, x, y):
    if isinstance(e, str):
        return LEAVES[e](x, y)
    if e[0] == "const":
        return jnp.full(x.shape, e[1], jnp.float32)
    if e[0] in UNARY:
        return UNARY[e[0]](evaluate(e[1], x, y))
    a, b = evaluate(e[1], x, y), evaluate(e[2], x, y)
    return BINARY[e[0]](a, b, x, y) if e[0] == "where" else BINARY[e[0]](a, b)


@FUZZ
@given(expr=EXPR,
       rows=st.sampled_from([8, 16]),
       cols=st.sampled_from([128, 256]),
       programs=st.integers(1, 4),
       reverse=st.booleans(),
       control=st.sampled_from(["none", "when", "fori"]),
       backend=st.sampled_from(["interpret", "interpret", "wgpu"]))
def test_pallas_kernels_from_a_grammar_equal_pallas_s_interpreter(expr, rows, cols, programs, reverse, control, backend):
    n = rows * programs
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (n, cols)).astype(np.float32)
    y = rng.uniform(-2, 2, (n, cols)).astype(np.float32)
    index = (lambda i: (programs - 1 - i, 0)) if reverse else (lambda i: (i, 0))
    spec = pl.BlockSpec((rows, cols), index)

    def body(x_ref, y_ref, o_ref):
        v = evaluate(expr, x_ref[...], y_ref[...])
        if control == "when":
            o_ref[...] = v

            @pl.when(pl.program_id(0) % 2 == 1)
            def _():
                o_ref[...] = v * 2.0
        elif control == "fori":
            o_ref[...] = jax.lax.fori_loop(0, 3, lambda t, acc: acc + v * 0.25, jnp.zeros_like(v))
        else:
            o_ref[...] = v

    def kernel(x, y, interpret=False):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((n, cols), jnp.float32), grid=(programs,),
                              in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)

    backend = backend if WGPU else "interpret"
    want = np.asarray(jax.jit(lambda x, y: kernel(x, y, interpret=True))(x, y))
    try:
        with tp.installed(backend=backend):
            got = np.asarray(jax.jit(kernel)(x, y))
    except tessel.UnsupportedError as e:
        event(f"refused: {str(e).splitlines()[0][:60]}")
        assert "Pallas kernel `body`" in str(e), str(e)
        return
    except Exception as e:  # noqa: BLE001 - judged by assert_clean
        assert_clean(e)
        raise
    event(f"ran: {control} on {backend}")
    # f32 maths within the language's tolerance (docs/language.md §8), NaN where Pallas has NaN.
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True, err_msg=repr(expr))
