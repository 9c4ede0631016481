"""The `tessel` module: every function of PYTHON.md's module section, every exception class with its
message, numpy arrays in and out on the interpreter and on wgpu, threads, and plugins loaded from
Python. Expected values come from numpy, never from tessel itself.

`scripts/test` builds the wheel, installs it into target/venv and runs this file with
TESSEL_TEST_LIBS (the folder with the built plugin libraries) and TESSEL_BIN (the `tessel`
executable) set; TESSEL_REQUIRE_ADAPTER=1 makes a missing wgpu adapter a failure, not a skip.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tessel

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RNG = np.random.default_rng(7)


def example(name):
    return tessel.load(EXAMPLES / f"{name}.tk")


def wgpu_or_skip():
    """The wgpu backend where an adapter is there; a visible skip (a failure in CI) where not."""
    b = next(b for b in tessel.backends() if b["name"] == "wgpu")
    if not b["available"]:
        if os.environ.get("TESSEL_REQUIRE_ADAPTER") == "1":
            pytest.fail(f"wgpu is required here but unavailable: {b['reason']}")
        pytest.skip(f"wgpu: {b['reason']}")
    return "wgpu"


def libs():
    folder = os.environ.get("TESSEL_TEST_LIBS")
    if not folder:
        pytest.fail("TESSEL_TEST_LIBS is not set: run these tests with scripts/test")
    return pathlib.Path(folder)


def test_version_and_backends_are_what_the_command_line_lists():
    assert tessel.__version__ == "0.1.0"
    names = [b["name"] for b in tessel.backends()]
    assert {"interpret", "wgpu", "mosaic-gpu"} <= set(names)
    interp = next(b for b in tessel.backends() if b["name"] == "interpret")
    assert interp["available"] is True and "f32" in interp["capabilities"]["dtypes"]
    exe = os.environ.get("TESSEL_BIN")
    if not exe:
        pytest.fail("TESSEL_BIN is not set: run these tests with scripts/test")
    # The plugins this process loaded (the cpu backend's, by pallas_common), loaded by the CLI too.
    plugins = [a for b in tessel.backends() if b["source"] != "built-in" for a in ("--plugin", b["source"])]
    cli = json.loads(subprocess.run([exe, "backends", "--json", *plugins], capture_output=True, text=True, check=True).stdout)
    ours = {b["name"]: b["available"] for b in tessel.backends()}
    assert ours == {b["name"]: b["available"] for b in cli["backends"]}


def test_a_loaded_kernel_describes_itself():
    k = example("fused")
    assert k.name == "fused"
    assert k.inputs == {"x": ("f32", (4096,)), "y": ("f32", (4096,))}
    assert k.outputs == {"o": ("f32", (4096,))}
    assert k.params == {}
    assert k.text.startswith("kernel fused\n") and "= load x : f32[256]" in k.text
    assert tessel.compile(k.text).text == k.text
    assert "Kernel(fused, in: [x: f32[4096]" in repr(k)


def test_a_generic_kernel_describes_its_parameters():
    k = example("add")
    assert k.params == {"N": 1024, "B": 128}
    assert k.inputs == {"x": ("f32", ("N",)), "y": ("f32", ("N",))}
    assert k.outputs == {"o": ("f32", ("N",))}
    assert k.text.startswith("kernel add[N = 1024, B = 128 in (64, 128, 256, 512, 1024)]\n  grid (i: cdiv(N, B))\n")
    assert tessel.compile(k.text).text == k.text
    assert repr(k) == "Kernel(add[N, B], in: [x: f32[N], y: f32[N]], out: [o: f32[N]])"
    m = tessel.compile("kernel k[N, M = 2]\n  in x: f32[N, M*N - 1]\n  out o: f32[N]\n{\n}\n")
    assert m.params == {"N": None, "M": 2} and m.inputs == {"x": ("f32", ("N", "M*N - 1"))}


def test_check_gives_the_canonical_text_and_compile_picks_a_kernel():
    src = (EXAMPLES / "add.tk").read_text()
    assert tessel.check(src) == example("add").text
    two = (ROOT / "tests/in/two_kernels.tk").read_text()
    names = [n for n in ("first", "second")]
    with pytest.raises(tessel.KernelError, match="defines several kernels"):
        tessel.compile(two)
    kernels = [line.split()[1] for line in two.splitlines() if line.startswith("kernel ")]
    assert len(kernels) == 2, names
    assert tessel.compile(two, kernel=kernels[1]).name == kernels[1]
    with pytest.raises(tessel.KernelError, match="has no kernel `nope`"):
        tessel.load(ROOT / "tests/in/two_kernels.tk", kernel="nope")


@pytest.mark.parametrize("backend", ["interpret", "wgpu"])
def test_add_and_softmax_agree_with_numpy(backend):
    if backend == "wgpu":
        wgpu_or_skip()
    x, y = RNG.standard_normal(1024, dtype=np.float32), RNG.standard_normal(1024, dtype=np.float32)
    out = example("add")(x=x, y=y, backend=backend)
    assert set(out) == {"o"} and out["o"].dtype == np.float32 and out["o"].shape == (1024,)
    np.testing.assert_array_equal(out["o"], x + y)
    k = example("softmax")
    for shape, params in [((1024, 256), {}), ((1000, 96), {"BM": 32}), ((3, 5), {})]:
        a = RNG.standard_normal(shape, dtype=np.float32)
        want = np.exp(a - a.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
        got = k.run(x=a, backend=backend, params=params).outputs["o"]
        assert got.shape == shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_run_reports_the_backend_the_decisions_and_the_cache():
    k = example("matmul")
    assert k.inputs == {"a": ("f32", ("M", "K")), "b": ("f32", ("K", "N"))}
    a = RNG.standard_normal((100, 70), dtype=np.float32)
    b = RNG.standard_normal((70, 50), dtype=np.float32)
    first = k.run(a=a, b=b, backend="interpret")
    assert first.backend == "interpret" and first.decisions == ["interpret: chosen by name"]
    np.testing.assert_allclose(first.outputs["c"], a @ b, rtol=1e-4, atol=1e-4)
    again = k.run(a=a, b=b, backend="interpret")
    assert again.cache_hit and again.compile_s == 0.0 and again.run_s > 0.0
    auto = k.run(a=a, b=b)
    assert auto.decisions[-1].startswith(f"{auto.backend}: chosen")
    assert any(d.startswith("mosaic-gpu: ") for d in auto.decisions)


def test_explain_prints_why_the_backend_was_chosen(capsys):
    x = np.ones(1024, np.float32)
    r = example("add").run(x=x, y=x, explain=True)
    err = capsys.readouterr().err
    assert f"{r.backend}: chosen" in err and all(d in err for d in r.decisions)


def test_lower_gives_the_text_without_a_device():
    k = example("add")
    wgsl = k.lower("wgpu")
    assert wgsl.startswith("// ---- add.wgsl (wgpu) ----\n") and "@compute" in wgsl
    ptx = k.lower("mosaic-gpu", mesh="mosaic_gpu(i: 8)")
    assert ".target sm_90a" in ptx
    assert "dyn" not in k.text
    grid = tessel.load(ROOT / "tests/in/dyn_grid.tk").lower("wgpu", grid={"i": 3})
    assert "@compute" in grid


def test_the_seed_refusals_are_not_implemented_errors_with_pallas_sentences():
    k = example("add")
    with pytest.raises(tessel.UnsupportedError) as e:
        k.lower("mosaic-gpu", mesh="grid(i: 8)")
    assert isinstance(e.value, NotImplementedError) and isinstance(e.value, tessel.TesselError)
    assert str(e.value).splitlines()[0] == "Mesh grid(i: 8) is not supported by the Mosaic GPU backend"
    assert e.value.backend == "mosaic-gpu" and "mosaic_gpu(...)" in e.value.hint
    with pytest.raises(tessel.UnsupportedError) as e:
        k.lower("mosaic-gpu", external_meshes=["device(x: 2)"])
    assert str(e.value).splitlines()[0] == "External meshes are not supported by the Mosaic GPU backend"
    assert "run on wgpu" in e.value.hint


def test_an_unavailable_backend_is_a_runtime_error():
    mosaic = next(b for b in tessel.backends() if b["name"] == "mosaic-gpu")
    if mosaic["available"]:
        pytest.skip("a CUDA driver is here: mosaic-gpu runs")
    x = np.ones(1024, np.float32)
    with pytest.raises(tessel.BackendUnavailable) as e:
        example("add")(x=x, y=x, backend="mosaic-gpu")
    assert isinstance(e.value, RuntimeError) and e.value.backend == "mosaic-gpu"
    assert "backend mosaic-gpu is unavailable: " in str(e.value)


def test_kernel_errors_have_line_and_column():
    with pytest.raises(tessel.KernelError) as e:
        tessel.compile("kernel k\n  out o: f32[4]\n{\n  %a = bogus\n}\n")
    assert isinstance(e.value, ValueError)
    assert "<text>:4:8: error: unknown operation `bogus`" in str(e.value)
    with pytest.raises(tessel.KernelError, match="cannot read"):
        tessel.load(ROOT / "no/such.tk")


def test_bad_inputs_are_refused_before_anything_runs():
    k = example("add")
    x = np.ones(1024, np.float32)
    cases = [
        (dict(x=x), "kernel `add` needs input `y`: f32[N]\n  pass it by name"),
        (dict(x=x, y=x, z=x), "kernel `add` has no input `z`\n  its inputs are: x, y"),
        (dict(x=x.astype(np.float64), y=x), "input `x` of kernel `add` is float64[1024], but the kernel declares f32[N]"),
        (
            dict(x=np.ones(1000, np.float32), y=x),
            "inputs of kernel `add` disagree on parameter `N`: `x` says N = 1000 (its dimension 0), `y` says N = 1024",
        ),
        (dict(x=np.ones((4, 4), np.float32), y=np.ones((4, 4), np.float32)), "is f32[4, 4], but the kernel declares f32[1024]"),
    ]
    for args, message in cases:
        with pytest.raises(tessel.InputError) as e:
            k(**args)
        assert isinstance(e.value, ValueError) and message in str(e.value), str(e.value)
    with pytest.raises(tessel.InputError, match="unknown backend `nope`"):
        k(x=x, y=x, backend="nope")
    with pytest.raises(tessel.InputError, match="bad|mesh"):
        k.run(x=x, y=x, mesh="grid(i: ")
    with pytest.raises(tessel.InputError, match="kernel `add` has no parameter `BM`\n  its parameters are: N, B"):
        k.run(x=x, y=x, params={"BM": 32})
    with pytest.raises(tessel.InputError, match="kernel `fused` has no parameter `B`\n  it has no parameters"):
        example("fused").lower(params={"B": 32})


def test_params_specialize_a_generic_kernel():
    k = example("add")
    x = RNG.standard_normal(5000, dtype=np.float32)
    for params in [{}, {"B": 64}, {"B": 1024}]:
        np.testing.assert_array_equal(k.run(x=x, y=x, params=params, backend="interpret").outputs["o"], x + x)
    # Lowering takes the values and the defaults: the WGSL is of the shape asked for.
    wgsl = k.lower("wgpu", params={"N": 4000})
    assert "4000" in wgsl and wgsl != k.lower("wgpu")
    generic = tessel.compile("kernel g[N]\n  in x: f32[N]\n  out o: f32[N]\n{\n  %x = load x\n  store o, %x\n}\n")
    with pytest.raises(tessel.InputError, match="kernel `g` needs a value for parameter `N`"):
        generic.lower()
    np.testing.assert_array_equal(generic(x=x[:7])["o"], x[:7])
    res = k.run(x=x, y=x, params={"B": 256}, backend="interpret")
    assert res.params == {"N": 5000, "B": 256}
    assert example("fused").run(x=x[:4096], y=x[:4096], backend="interpret").params == {}
    # A value that makes a size wrong is the kernel's error, at its generic line.
    with pytest.raises(tessel.KernelError, match="<text>:2:12: error: `cdiv\\(N, B\\)`: divides by `B`, which is 0"):
        tessel.compile(k.text).lower(params={"B": 0})


def test_non_contiguous_inputs_are_copied_once_and_agree():
    k = example("add")
    big = RNG.standard_normal(2048, dtype=np.float32)
    x = big[::2]
    assert not x.flags["C_CONTIGUOUS"]
    # A list is taken as np.asarray takes it: of its dtype (float64 here), which the kernel refuses.
    y = [float(v) for v in range(1024)]
    with pytest.raises(tessel.InputError, match="is float64\\[1024\\]"):
        k(x=x, y=y)
    out = k(x=x, y=np.asarray(y, np.float32), backend="interpret")["o"]
    np.testing.assert_array_equal(out, x + np.arange(1024, dtype=np.float32))
    t = example("transpose_bias")
    arrays = {}
    for name, (dtype, shape) in t.inputs.items():
        a = RNG.standard_normal(shape[::-1], dtype=np.float32).T  # Fortran order
        assert len(shape) == 1 or not a.flags["C_CONTIGUOUS"]
        arrays[name] = a
    got = t(backend="interpret", **arrays)
    want = t(backend="interpret", **{n: np.ascontiguousarray(a) for n, a in arrays.items()})
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])


def test_every_dtype_crosses_the_boundary():
    src = """kernel dtypes
  in  h: f16[8]
  in  b: bf16[8]
  in  i: i32[8]
  in  u: u32[8]
  in  m: bool[8]
  out oh: f16[8]
  out ob: bf16[8]
  out oi: i32[8]
  out ou: u32[8]
  out om: bool[8]
{
  %h = load h
  %h2 = add %h, %h
  store oh, %h2
  %b = load b
  %b2 = mul %b, %b
  store ob, %b2
  %i = load i
  %i2 = sub %i, 3
  store oi, %i2
  %u = load u
  %u2 = add %u, 1
  store ou, %u2
  %m = load m
  %m2 = not %m
  store om, %m2
}
"""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    k = tessel.compile(src)
    h = (np.arange(8) / 4).astype(np.float16)
    b = (np.arange(8) / 2).astype(ml_dtypes.bfloat16)
    i = np.arange(8, dtype=np.int32) - 4
    u = np.arange(8, dtype=np.uint32) * 1000
    m = np.arange(8) % 3 == 0
    out = k(h=h, b=b, i=i, u=u, m=m, backend="interpret")
    assert out["oh"].dtype == np.float16 and out["ob"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out["oh"], h + h)
    np.testing.assert_array_equal(out["ob"].astype(np.float32), (b.astype(np.float32) ** 2))
    np.testing.assert_array_equal(out["oi"], i - 3)
    np.testing.assert_array_equal(out["ou"], u + 1)
    np.testing.assert_array_equal(out["om"], ~m)
    # bf16 also as uint16 bits.
    bits = k(h=h, b=b.view(np.uint16), i=i, u=u, m=m, backend="interpret")
    np.testing.assert_array_equal(bits["ob"], out["ob"])


def test_the_gil_is_released_while_a_kernel_runs():
    k = tessel.load(ROOT / "benches/kernels/matmul_1024.tk")
    a = RNG.standard_normal((1024, 1024), dtype=np.float32)
    count, done = [0], threading.Event()

    def spin():
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = count[0]
        start = time.perf_counter()
        k(a=a, b=a, backend="interpret")
        took = time.perf_counter() - start
        during = count[0] - before
    finally:
        done.set()
        t.join()
    # With the GIL held for the whole call the other thread could not have counted at all.
    assert took > 0.02 and during > 1000, (took, during)


def test_a_kernel_runs_from_several_threads_at_once():
    k = example("add")
    xs = [RNG.standard_normal(1024, dtype=np.float32) for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda x: k(x=x, y=x, backend="interpret")["o"], xs))
    for x, o in zip(xs, outs):
        np.testing.assert_array_equal(o, x + x)


def test_a_plugin_loads_from_python_and_a_broken_one_is_an_error(tmp_path):
    with pytest.raises(tessel.TesselError, match="junk.so"):
        junk = tmp_path / "libjunk.so"
        junk.write_text("junk")
        tessel.load_plugin(junk)
    plugin = libs() / "libtessel_mybackend.so"
    tessel.load_plugin(plugin)
    b = next(b for b in tessel.backends() if b["name"] == "mybackend")
    assert str(plugin) in b["source"] and b["available"]
    x = RNG.standard_normal(1024, dtype=np.float32)
    np.testing.assert_array_equal(example("add")(x=x, y=x, backend="mybackend")["o"], x + x)


def test_a_library_that_crashes_while_loading_takes_down_only_the_calls_that_load_it(tmp_path):
    """A library on TESSEL_PLUGIN_PATH whose loading aborts the process: calls naming a built-in
    backend never load it (in Python and inside `jax.jit`), as in the CLI; `auto`, which loads
    every plugin, is the one call it takes down (a crash inside `dlopen` cannot be caught)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the library that crashes while loading")
    src = tmp_path / "boom.c"
    src.write_text("#include <stdlib.h>\n__attribute__((constructor)) static void boom(void) { abort(); }\n")
    lib = tmp_path / "plugins" / "libtessel_boom.so"
    lib.parent.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    code = """
import sys, numpy as np, jax, tessel, tessel.jax as tj
k = tessel.load(sys.argv[1])
x = np.ones(1024, np.float32)
for b in sys.argv[2:]:
    assert float(k(x=x, y=x, backend=b)["o"][0]) == 2.0
    assert float(jax.jit(lambda x: tj.call(sys.argv[1], x, x, backend=b))(x)[0]) == 2.0
    print(b, "ok", flush=True)
"""
    env = dict(os.environ, TESSEL_PLUGIN_PATH=str(lib.parent), JAX_PLATFORMS="cpu")
    run = lambda *backends: subprocess.run([os.sys.executable, "-c", code, str(EXAMPLES / "add.tk"), *backends],
                                           capture_output=True, text=True, env=env, timeout=300)
    builtins = ["interpret"] + (["wgpu"] if next(b for b in tessel.backends() if b["name"] == "wgpu")["available"] else [])
    r = run(*builtins)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == [f"{b} ok" for b in builtins]
    r = run("auto")
    assert r.returncode == -signal.SIGABRT and "auto ok" not in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_panic_in_a_plugin_is_a_tessel_error_and_the_interpreter_lives_on(monkeypatch):
    tessel.load_plugin(libs() / "libtessel_fixture_panics.so")
    monkeypatch.setenv("TESSEL_FIXTURE_PANIC_IN", "launch")
    x = np.ones(1024, np.float32)
    with pytest.raises(tessel.TesselError, match="panicked in `launch`"):
        example("add")(x=x, y=x, backend="panicky")
    np.testing.assert_array_equal(example("add")(x=x, y=x, backend="interpret")["o"], x + x)


def test_loading_a_plugin_forgets_the_handlers_prepared_launches():
    pytest.importorskip("jax")
    import tessel.jax as tj

    text = (EXAMPLES / "fused.tk").read_text()
    tj.prepare(text, backend="interpret")
    before = tj.stats()
    tj.prepare(text, backend="interpret")
    assert (tj.stats()["hits"], tj.stats()["misses"]) == (before["hits"] + 1, before["misses"])
    # A new runtime: the launch prepared with the old one is prepared again.
    tessel.load_plugin(libs() / "libtessel_fixture_panics.so")
    tj.prepare(text, backend="interpret")
    assert tj.stats()["misses"] == before["misses"] + 1


def test_a_tuning_record_gives_the_values_for_the_backend_it_was_made_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_CACHE_DIR", str(tmp_path))
    exe = os.environ.get("TESSEL_BIN")
    if not exe:
        pytest.fail("TESSEL_BIN is not set: run these tests with scripts/test")
    softmax = str(EXAMPLES / "softmax.tk")
    tune = subprocess.run([exe, "tune", softmax, "--backend", "interpret", "--param", "N=48", "--runs", "1"],
                          capture_output=True, text=True, env=dict(os.environ), check=True)
    chosen = int(next(l for l in tune.stdout.splitlines() if l.startswith("chosen: BM = ")).split()[3])
    x = RNG.standard_normal((48, 256), dtype=np.float32)
    k = example("softmax")
    assert k.run(x=x, backend="interpret").params == {"N": 48, "D": 256, "BM": chosen}
    assert k.run(x=x, backend="interpret", params={"BM": 8}).params["BM"] == 8
    # Another shape has no record: the default.
    assert k.run(x=x[:47], backend="interpret").params["BM"] == 16
    # A record edited to a value that is not a candidate is ignored with a warning naming it (as
    # the CLI's `warning:` line), never silently.
    record = next(l for l in tune.stdout.splitlines() if l.startswith("record: ")).split(" ", 1)[1]
    edited = json.loads(pathlib.Path(record).read_text())
    edited["chosen"]["BM"] = 12
    pathlib.Path(record).write_text(json.dumps(edited))
    with pytest.warns(UserWarning, match=r"tuning record .* ignored \(it chooses BM = 12, which is not one of its candidates"):
        assert k.run(x=x, backend="interpret").params["BM"] == 16


def test_inputs_are_read_in_place_and_outputs_written_once():
    """A C-contiguous input reaches the interpreter without a copy, and each output is written
    once into a fresh numpy array: adding two 64 MiB arrays raises the process's peak memory by
    the output and the interpreter's own output memory (2 x 64 MiB), not by copies of the inputs
    (a copy of each input on the way in and of the output on the way out would add 192 MiB more)."""
    code = """
import resource, sys, numpy as np, tessel
k = tessel.load(sys.argv[1])
n = 16 << 20
x = np.ones(n, np.float32); y = np.full(n, 2.0, np.float32)
k(x=x[:1024], y=y[:1024], backend="interpret")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
o = k(x=x, y=y, backend="interpret")["o"]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert o.flags["C_CONTIGUOUS"] and o.flags["WRITEABLE"] and o.flags["OWNDATA"] and float(o[-1]) == 3.0
print((after - before) / 1024)
"""
    r = subprocess.run([os.sys.executable, "-c", code, str(EXAMPLES / "add.tk")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    grew_mib = float(r.stdout.strip())
    assert grew_mib < 200, f"peak memory grew by {grew_mib:.0f} MiB: inputs or outputs were copied"


def test_unaligned_and_strided_inputs_are_read_correctly():
    k = example("add")
    raw = np.zeros(4 * 4096 + 4, np.uint8)
    x = raw[2 : 2 + 4 * 4096].view(np.float32)  # 4096 floats whose data is 2 bytes off alignment
    x[:] = np.arange(4096, dtype=np.float32)
    assert x.ctypes.data % 4 != 0 and not x.flags["ALIGNED"] and x.flags["C_CONTIGUOUS"]
    y = np.arange(8192, dtype=np.float32)[::2]  # strided: numpy copies it once
    out = k(x=x, y=y, backend="interpret")["o"]
    np.testing.assert_array_equal(out, x + y)


# ---- issue 38: no silent wrong result, no crash ----

DYN_COPY = """kernel dyn_copy
  grid (i: dyn)
  in  x: f32[1024] block [128] at (i)
  out o: f32[1024] block [128] at (i)
{
  %a = load x
  store o, %a
}
"""

I32_ADD = """kernel iadd
  grid (i: 4)
  in  x: i32[1024] block [256] at (i)
  in  y: i32[1024] block [256] at (i)
  out o: i32[1024] block [256] at (i)
{
  %a = load x
  %b = load y
  %s = add %a, %b
  store o, %s
}
"""


@pytest.mark.parametrize("backend", ["interpret", "wgpu"])
def test_arrays_of_the_other_byte_order_are_converted_not_read_as_native(backend):
    """`>f4` and `>i4` arrays have the dtype names `float32` and `int32`; their bytes are
    big-endian, and used to be read as little-endian (garbage). They are converted once."""
    if backend == "wgpu":
        backend = wgpu_or_skip()
    x = RNG.standard_normal(4096).astype(np.float32)
    y = RNG.standard_normal(4096).astype(np.float32)
    big_x, big_y = x.astype(">f4"), y.astype(">f4")
    out = example("fused")(x=big_x, y=big_y, backend=backend)["o"]
    want = np.maximum(x.astype(np.float64) * y + np.exp(-x.astype(np.float64)), 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert out.dtype == np.float32 and out.shape == (4096,)
    a = RNG.integers(-(1 << 20), 1 << 20, 1024).astype(np.int32)
    b = RNG.integers(-(1 << 20), 1 << 20, 1024).astype(np.int32)
    got = tessel.compile(I32_ADD)(x=a.astype(">i4"), y=b.astype(">i4"), backend=backend)["o"]
    np.testing.assert_array_equal(got, a + b)
    # The caller's arrays are left as they were.
    assert big_x.dtype == np.dtype(">f4") and np.array_equal(big_x, x)


@pytest.mark.parametrize("value", [2**70, -(2**70), 2.5, "8", True])
def test_a_parameter_value_past_64_bits_or_not_an_int_is_an_input_error_naming_it(value):
    k = example("softmax")
    x = np.ones((64, 256), np.float32)
    calls = (lambda: k.run(x=x, params={"BM": value}), lambda: k.lower(params={"BM": value}),
             lambda: k._specialize({"x": [64, 256]}, {"BM": value}))
    for call in calls:
        with pytest.raises(tessel.InputError) as e:
            call()
        assert f"parameter `BM` of kernel `softmax` cannot be {value!r}" in str(e.value), str(e.value)
    with pytest.raises(tessel.InputError, match="params=\\{...\\} of kernel `softmax` has the key 1, not a parameter name"):
        k.run(x=x, params={1: 8})
    # A numpy integer is an int here, as `operator.index` takes it.
    assert k.run(x=x, params={"BM": np.int64(16)}).params["BM"] == 16


def test_long_names_and_text_past_the_file_limit_are_quoted_short():
    x = np.ones(1024, np.float32)
    name = "b" * (1 << 20)
    with pytest.raises(tessel.InputError) as e:
        example("add")(x=x, y=x, backend=name)
    assert len(str(e.value)) < 2000 and f"({len(name)} bytes in all)" in str(e.value), str(e.value)[:300]
    mesh = "grid(" + ", ".join(f"a{i}: 1" for i in range(10_000)) + ")"
    with pytest.raises(tessel.TesselError) as e:
        example("add").run(x=x, y=x, backend="interpret", mesh=mesh)
    assert len(str(e.value)) < 2000 and "it has 10000 axes, more than the 64 a mesh may have" in str(e.value)
    # Kernel text is held to the 16 MiB of a kernel file, given whole as well as read from one.
    text = (EXAMPLES / "add.tk").read_text() + "#" * (16 << 20) + "\n"
    with pytest.raises(tessel.TesselError, match=r"more than the 16 MiB tessel reads"):
        tessel.compile(text)


@pytest.mark.parametrize("size", [-5, 0, 2**31, 2**80, 2.5, "8", None])
def test_a_grid_size_out_of_range_is_an_input_error_naming_the_axis(size):
    k = tessel.compile(DYN_COPY)
    x = np.arange(1024, dtype=np.float32)
    for call in (lambda: k.run(x=x, grid={"i": size}), lambda: k.lower(grid={"i": size})):
        with pytest.raises(tessel.InputError) as e:
            call()
        assert f"grid axis `i` of kernel `dyn_copy` cannot have size {size!r}" in str(e.value), str(e.value)
        assert "expected an int from 1 to 2147483647" in str(e.value)
    with pytest.raises(tessel.InputError, match="grid=\\{...\\} of kernel `dyn_copy` has the key 1, not an axis name"):
        k.run(x=x, grid={1: 8})
    # The largest size and the smallest are taken (8 programs cover the array; 1 leaves the rest zero).
    np.testing.assert_array_equal(k.run(x=x, grid={"i": 8}).outputs["o"], x)
    np.testing.assert_array_equal(k.run(x=x, grid={"i": np.int32(8)}).outputs["o"], x)
    one = k.run(x=x, grid={"i": 1}).outputs["o"]
    np.testing.assert_array_equal(one[:128], x[:128])
    assert not one[128:].any()


def _vm_size():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return None


def _outputs_kernel(count, elements):
    outs = "".join(f"  out o{n}: f32[{elements}] block [1024] at (i)\n" for n in range(count))
    body = "".join(f"  store o{n}, %z\n" for n in range(count))
    return f"kernel big\n  grid (i: {elements // 1024})\n{outs}{{\n  %z = zeros : f32[1024]\n{body}}}\n"


def test_outputs_larger_than_memory_are_refused_before_numpy_allocates_them():
    """Three 4 TB outputs: refused by the memory check `tessel run` makes, not left to numpy (or,
    with fewer bytes, to the OOM killer once the launch writes them)."""
    k = tessel.compile(_outputs_kernel(3, 1 << 40))
    with pytest.raises(tessel.TesselError) as e:
        k(backend="interpret")
    msg = str(e.value)
    assert "making the outputs of `big` needs 12288.0 GB of memory (outputs 12288.0 GB), more than the " in msg, msg
    assert " this process has available\n  use smaller arrays" in msg, msg


@pytest.mark.skipif(_vm_size() is None, reason="no /proc/self/status here: the address-space limit is not read")
def test_outputs_past_the_address_space_limit_are_refused_in_a_process_under_ulimit_v():
    """Three 16 GB outputs (the interpreter's largest arrays) under an address-space limit 8 GB
    above the process's size: refused, and the process goes on (it used to fail in numpy, or be
    killed once the launch wrote the outputs)."""
    code = textwrap.dedent(f"""
        import resource, sys, numpy as np, tessel
        k = tessel.compile({_outputs_kernel(3, 1 << 32)!r})
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (8 << 30), resource.RLIM_INFINITY))
        try:
            k(backend="interpret")
            print("ran")
        except tessel.TesselError as e:
            print(type(e).__name__, e)
        x = np.arange(4096, dtype=np.float32)
        o = tessel.load(sys.argv[1])(x=x, y=x, backend="interpret")["o"]
        print("usable" if np.array_equal(o, x + x) else "wrong")
    """)
    r = subprocess.run([os.sys.executable, "-c", code, str(EXAMPLES / "add.tk")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TesselError making the outputs of `big` needs 48.0 GB of memory (outputs 48.0 GB), more than the " in r.stdout, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("usable"), r.stdout
    assert "Traceback" not in r.stderr and "panicked" not in r.stderr, r.stderr


def test_a_cli_launch_past_ulimit_v_is_refused_at_once_without_a_backtrace(tmp_path):
    """`tessel run` of a 12 GB launch under `ulimit -v` of 8 GB: exit 1 with the memory refusal
    before any input is made (it used to make 43 s of random inputs and then abort)."""
    exe = os.environ.get("TESSEL_BIN")
    if not exe:
        pytest.fail("TESSEL_BIN is not set: run these tests with scripts/test")
    n = 1_500_000_000
    big = tmp_path / "big.tk"
    big.write_text(
        f"kernel big\n  grid (i: {n // 1024 + 1})\n  in  x: f32[{n}] block [1024] at (i)\n"
        f"  out o: f32[{n}] block [1024] at (i)\n{{\n  %a = load x\n  store o, %a\n}}\n"
    )
    run = f'ulimit -v {8 << 20} && exec "$0" run "$1" --backend interpret --out-dir "$2"'
    start = time.monotonic()
    r = subprocess.run(["bash", "-c", run, exe, str(big), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "the launch of `big` with random inputs needs 11.2 GB of memory (inputs 5.6 GB, outputs 5.6 GB), more than the " in r.stderr, r.stderr
    assert "ulimit -v" in r.stderr and "panicked" not in r.stderr and "backtrace" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    assert took < 20, f"refused after {took:.1f} s: the inputs were made first"


SPIN = """kernel spin
  grid (i: 64)
  in  x: f32[64, 16] block [1, 16] at (i, 0)
  out o: f32[64, 16] block [1, 16] at (i, 0)
{
  %a = load x
  %r = for %t = 0 to 1000000000 iter (%acc = %a) {
    %n = add %acc, 1.0
    yield %n
  }
  store o, %r
}
"""


# A launch of many seconds on the software Vulkan adapter (about 20 s on 2 cores): every
# invocation under llvmpipe's loop budget, so that the launch is planned and runs.
SPIN_WGPU = """kernel spinw
  grid (i: 4096)
  in  x: f32[4096, 256] block [1, 256] at (i, 0)
  out o: f32[4096, 256] block [1, 256] at (i, 0)
{
  %a = load x
  %r = for %t = 0 to 60000 iter (%acc = %a) {
    %n = mul %acc, 1.0000001
    yield %n
  }
  store o, %r
}
"""


def interrupted_launch(kernel, shape, backend, plugin=None, after="interpret"):
    """Runs `kernel` on `backend` in a child process, sends SIGINT a second into the launch, and
    returns (what the child printed, its stderr, seconds from SIGINT to KeyboardInterrupt, exit
    code). A first small launch starts the runtime (plugins, adapters), which a signal does not cut
    short, so that the signal comes during the long launch itself; after the interrupt the child
    runs a kernel again on `after` and prints whether it was right.

    The child installs Python's SIGINT handler itself: a process started from a background job
    of a shell without job control (`scripts/test > log &`) inherits SIGINT ignored, and Python
    then leaves it ignored, so no KeyboardInterrupt could come (the cause of the timeouts three
    clean-clone runs saw, all started so)."""
    code = textwrap.dedent(f"""
        import signal, sys, time, numpy as np, tessel
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if sys.argv[2]:
            tessel.load_plugin(sys.argv[2])
        add = tessel.load(sys.argv[1])
        y = np.arange(4096, dtype=np.float32)
        add(x=y, y=y, backend={backend!r})
        k = tessel.compile({kernel!r})
        x = np.zeros({shape!r}, np.float32)
        print("started", flush=True)
        try:
            k(x=x, backend={backend!r})
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
        o = add(x=y, y=y, backend={after!r})["o"]
        print("usable" if np.array_equal(o, y + y) else "wrong", flush=True)
    """)
    return interrupt_child(code, [str(EXAMPLES / "add.tk"), str(plugin or "")])


def interrupt_child(code, args, env=None, timeout=30):
    """Runs `code` in a child Python with `args`, sends it SIGINT a second after it prints
    "started", and returns (the words it printed after "interrupted T", its stderr, seconds from
    SIGINT to T, exit code); a child still running `timeout` seconds after SIGINT fails the test."""
    p = subprocess.Popen([os.sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "started", p.communicate()
        time.sleep(1.0)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"the launch went on for {timeout} s after SIGINT")
    lines = out.split()
    assert lines[:1] == ["interrupted"], (out, err)
    return lines[2:], err, float(lines[1]) - sent, p.returncode


def test_ctrl_c_interrupts_a_long_launch_within_seconds_and_the_process_goes_on():
    """SIGINT during an interpreter launch that would take minutes raises KeyboardInterrupt
    within a few seconds (it used to wait for the launch to finish); the module then runs kernels
    as before."""
    rest, err, latency, code = interrupted_launch(SPIN, (64, 16), "interpret")
    assert latency < 5, f"KeyboardInterrupt came {latency:.1f} s after SIGINT"
    assert rest == ["usable"] and code == 0, (rest, err)


def test_ctrl_c_interrupts_a_plugins_launch_through_its_root_module():
    """A plugin has its own copy of the plugin API, so the host thread's cancellation token reaches
    it only through the root module's `follow_cancel`: a launch on mybackend (the interpreter
    copied and renamed as docs/writing-a-backend.md builds it) stops within seconds of SIGINT
    (it ran to its end before), and the module runs kernels as before."""
    rest, err, latency, code = interrupted_launch(SPIN, (64, 16), "mybackend", plugin=libs() / "libtessel_mybackend.so",
                                                  after="mybackend")
    assert latency < 5, f"KeyboardInterrupt came {latency:.1f} s after SIGINT"
    assert rest == ["usable"] and code == 0, (rest, err)


def test_ctrl_c_interrupts_a_long_wgpu_launch_without_waiting_for_the_device():
    """On wgpu the wait for the device wakes under the launch's cancellation token and gives up
    once Ctrl-C cancels it: KeyboardInterrupt comes within a few seconds, not after the 20 s the
    launch takes (with half this grid, 6.4 s after SIGINT before the wait looked at the token), and the module runs kernels as before."""
    wgpu_or_skip()
    rest, err, latency, code = interrupted_launch(SPIN_WGPU, (4096, 256), "wgpu")
    assert latency < 5, f"KeyboardInterrupt came {latency:.1f} s after SIGINT"
    assert rest == ["usable"] and code == 0, (rest, err)


def test_ctrl_c_interrupts_the_wgpu_call_after_an_interrupted_one():
    """The call after an interrupted wgpu launch waits for the work the device still runs (its
    queue is in order); that wait follows its own token, so a second Ctrl-C interrupts it at once
    (it waited inside the driver's submit, 6.2 s after the second SIGINT); once the device is
    done, wgpu runs kernels as before."""
    wgpu_or_skip()
    code = textwrap.dedent(f"""
        import signal, sys, time, numpy as np, tessel
        signal.signal(signal.SIGINT, signal.default_int_handler)
        add = tessel.load(sys.argv[1])
        y = np.arange(4096, dtype=np.float32)
        add(x=y, y=y, backend="wgpu")
        k = tessel.compile({SPIN_WGPU!r})
        print("started", flush=True)
        for what in ("first", "second"):
            try:
                k(x=np.zeros((4096, 256), np.float32), backend="wgpu") if what == "first" else add(x=y, y=y, backend="wgpu")
                print(what, "finished", flush=True)
            except KeyboardInterrupt:
                print(what, "interrupted", time.monotonic(), flush=True)
        o = add(x=y, y=y, backend="wgpu")["o"]
        print("usable" if np.array_equal(o, y + y) else "wrong", flush=True)
    """)
    p = subprocess.Popen([os.sys.executable, "-c", code, str(EXAMPLES / "add.tk")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started", p.communicate()
        lines = []
        for _ in range(2):
            time.sleep(1.0)
            sent = time.monotonic()
            p.send_signal(signal.SIGINT)
            line = p.stdout.readline().split()
            lines.append((line, float(line[2]) - sent if len(line) == 3 else None))
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("wgpu went on for 120 s after SIGINT")
    assert [l[:2] for l, _ in lines] == [["first", "interrupted"], ["second", "interrupted"]], (lines, err[-2000:])
    assert all(latency < 5 for _, latency in lines), lines
    assert out.split() == ["usable"] and p.returncode == 0, (out, err[-2000:])

