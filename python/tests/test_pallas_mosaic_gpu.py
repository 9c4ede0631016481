"""JAX's own Mosaic GPU Pallas ops (`jax.experimental.pallas.ops.gpu.*_mgpu`, written with
`plgpu.kernel`: shared memory, TMA copies, barriers, warp-specialized pipelines, `wgmma`),
unchanged, inside `jax.jit` under `tessel.pallas.installed(...)`: on the interpreter and on wgpu
(its warpgroups made one thread with the interpreter's schedule compiled in, `ir::schedule`) each
equals the op's own reference function (or `jnp`'s product where the op has none); mutations of
their translations (a wait removed, a stage handed back before its product is waited for, a stage
refilled while a product reads it) are each refused by the interpreter's race check; on Mosaic GPU
each lowers to PTX that `ptxas` takes, its warpgroups at once, its barriers mbarriers.

On the CPU the ops read an SM count and a CUDA version from a device that is not there: the tests
give them (`cores`, `cuda_version`), never the ops."""

import contextlib
import os
import re
import subprocess
import tempfile
import types

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import tessel
from tessel import pallas as tp

from pallas_common import concurrent_backends, needs_mpmd

pytestmark = needs_mpmd

gpu_ops = pytest.importorskip("jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu", reason="this jax has no Mosaic GPU ops")
from jax.experimental.pallas.ops.gpu import attention_mgpu as am  # noqa: E402
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm  # noqa: E402
from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as hmx  # noqa: E402
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd  # noqa: E402
from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as trd  # noqa: E402

RNG = np.random.default_rng(52)
#: Streaming multiprocessors the ops' persistent grids spread over (an H100 has 132).
SMS = 2


class _WithCores:
    """A device as the ops read it: the CPU device, with an SM count."""

    core_count = SMS

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)


@contextlib.contextmanager
def cores(monkeypatch):
    """While an op is traced: `jax.devices()` and the default device carry an SM count."""
    devices = jax.devices
    with monkeypatch.context() as m:
        m.setattr(hm, "get_num_sms", lambda: SMS)
        m.setattr(hmx, "backend", types.SimpleNamespace(get_default_device=lambda: _WithCores(devices()[0])))
        m.setattr(jax, "devices", lambda *a: [_WithCores(d) for d in devices(*a)])
        yield
    assert jax.devices is devices


@pytest.fixture
def cuda_version(monkeypatch):
    """The CUDA runtime version attention reads (12.9.1: causal masking allowed)."""
    monkeypatch.setattr(am, "cuda_versions", types.SimpleNamespace(cuda_runtime_get_version=lambda: 12091))


def traced(monkeypatch, op):
    """`op` with the device facts given while JAX traces it (inside `tp.run`'s `jax.jit`)."""

    def f(*args):
        with cores(monkeypatch):
            return op(*args)

    return f


def close(got, want, dtype, what):
    """Equal within two units in the last place of the output's dtype at the output's scale."""
    eps = {np.dtype(np.float16): 2.0**-10, np.dtype(jnp.bfloat16): 2.0**-7}.get(np.dtype(dtype), 1e-6)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, atol=2 * eps * scale, rtol=0, err_msg=what)


def _matmul(monkeypatch, backend, dtype, with_c, grid_minor_dim, wg_dimension, grid_tile_width):
    config = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32,
                             grid_minor_dim=grid_minor_dim, wg_dimension=wg_dimension, grid_tile_width=grid_tile_width)
    a = RNG.standard_normal((128, 128)).astype(dtype)
    b = RNG.standard_normal((128, 256)).astype(dtype)
    c = RNG.standard_normal((128, 256)).astype(dtype) if with_c else None
    want = jnp.dot(a, b, preferred_element_type=jnp.float32) + (c.astype(np.float32) if with_c else 0)
    want = np.asarray(want.astype(dtype))
    op = traced(monkeypatch, lambda a, b, *c: hm.matmul(a, b, c[0] if c else None, config))
    got = tp.run(op, a, b, *([c] if with_c else []), backend=backend)
    assert got.dtype == np.dtype(dtype)
    close(got, want, dtype, f"hopper_matmul_mgpu on {backend}")


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("with_c", [False, True], ids=["ab", "ab+c"])
@pytest.mark.parametrize("grid_minor_dim", list(hm.MatmulDimension), ids=str)
@pytest.mark.parametrize("wg_dimension", list(hm.MatmulDimension), ids=str)
@pytest.mark.parametrize("grid_tile_width", [1, 2])
def test_hopper_matmul_runs_unchanged_on_the_interpreter(monkeypatch, dtype, with_c, grid_minor_dim, wg_dimension, grid_tile_width):
    _matmul(monkeypatch, "interpret", dtype, with_c, grid_minor_dim, wg_dimension, grid_tile_width)


#: The matmul's settings on wgpu: an orthogonal array (the first five columns of L8), so every
#: pair of values of any two settings is run, in 8 of the 32 launches.
PAIRWISE = [(0, 0, 0, 0, 0), (0, 0, 0, 1, 1), (0, 1, 1, 0, 0), (0, 1, 1, 1, 1),
            (1, 0, 1, 0, 1), (1, 0, 1, 1, 0), (1, 1, 0, 0, 1), (1, 1, 0, 1, 0)]


@pytest.mark.parametrize("setting", PAIRWISE, ids=lambda s: "".join(map(str, s)))
def test_hopper_matmul_runs_unchanged_on_wgpu(monkeypatch, setting):
    if "wgpu" not in concurrent_backends():
        pytest.skip("wgpu has no adapter here")
    d, c, g, w, t = setting
    dims = list(hm.MatmulDimension)
    _matmul(monkeypatch, "wgpu", [np.float16, jnp.bfloat16][d], bool(c), dims[g], dims[w], [1, 2][t])


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
def test_hopper_mixed_type_matmul_equals_its_reference(monkeypatch, dtype, backend):
    config = hmx.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32)
    a = RNG.integers(-100, 100, (128, 128)).astype(np.int8)
    b = RNG.standard_normal((128, 256)).astype(dtype)
    op = traced(monkeypatch, lambda a, b: hmx.mixed_matmul_kernel(a, b, out_dtype=dtype, config=config))
    got = tp.run(op, a, b, backend=backend)
    close(got, hmx.reference(a, b, out_dtype=dtype), dtype, f"hopper_mixed_type_matmul_mgpu on {backend}")


def _qkv(dtype, seq=128, heads=2, head_dim=64):
    return [RNG.standard_normal((1, seq, heads, head_dim)).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_attention_forward_equals_its_reference(monkeypatch, cuda_version, causal, backend):
    config = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=causal)
    q, k, v = _qkv(np.float16)
    got = tp.run(traced(monkeypatch, lambda q, k, v: am.attention(q, k, v, config)), q, k, v, backend=backend)
    close(got, am.attention_reference(q, k, v, causal=causal), np.float16, f"attention_mgpu on {backend}")


@pytest.mark.parametrize("backend", concurrent_backends())
def test_attention_with_the_pipeline_emitter_equals_its_reference(monkeypatch, cuda_version, backend):
    config = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    # f16: the op casts its probabilities to f16 whatever the inputs (a bf16 run fails in JAX).
    q, k, v = _qkv(np.float16)
    op = traced(monkeypatch, lambda q, k, v: am.attention_with_pipeline_emitter(q, k, v, config))
    got = tp.run(op, q, k, v, backend=backend)
    close(got, am.attention_reference(q, k, v), np.float16, f"attention_with_pipeline_emitter on {backend}")


@pytest.mark.parametrize("backend", concurrent_backends())
def test_attention_gradients_through_its_backward_kernels_equal_the_reference(monkeypatch, cuda_version, backend):
    config = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2,
                             block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    q, k, v = _qkv(np.float16)

    def loss(q, k, v):
        return am.attention(q, k, v, config).astype(jnp.float32).sum()

    def loss_ref(q, k, v):
        return am.attention_reference(q, k, v).astype(jnp.float32).sum()

    grads = traced(monkeypatch, jax.grad(loss, argnums=(0, 1, 2)))
    got = tp.run(grads, q, k, v, backend=backend)
    for name, g, r in zip("qkv", got, jax.grad(loss_ref, argnums=(0, 1, 2))(q, k, v)):
        close(g, r, np.float16, f"d{name} of attention_mgpu on {backend}")


def _groups(m, sizes):
    assert sum(sizes) == m
    return np.array(sizes, np.int32)


@pytest.mark.parametrize("backend", concurrent_backends())
@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["rhs", "rhs^T"])
def test_ragged_dot_equals_a_product_per_group(monkeypatch, transpose_rhs, backend):
    lhs = RNG.standard_normal((256, 128)).astype(np.float16)
    rhs = RNG.standard_normal((4, 128, 128) if not transpose_rhs else (4, 128, 128)).astype(np.float16)
    sizes = _groups(256, [64, 0, 128, 64])
    op = traced(monkeypatch, lambda l, r, g: rd.ragged_dot(l, r, group_sizes=g, block_m=64, block_n=64, block_k=64,
                                                          max_concurrent_steps=2, grid_block_n=1, transpose_rhs=transpose_rhs))
    got = tp.run(op, lhs, rhs, sizes, backend=backend)
    want, start = np.zeros((256, 128), np.float32), 0
    for g, n in enumerate(sizes):
        r = rhs[g].T if transpose_rhs else rhs[g]
        want[start:start + n] = lhs[start:start + n].astype(np.float32) @ r.astype(np.float32)
        start += n
    close(got, want.astype(np.float16), np.float16, f"ragged_dot_mgpu on {backend}")


@pytest.mark.parametrize("backend", concurrent_backends())
def test_transposed_ragged_dot_equals_its_reference(monkeypatch, backend):
    lhs = RNG.standard_normal((256, 128)).astype(np.float16)
    rhs = RNG.standard_normal((256, 128)).astype(np.float16)
    sizes = _groups(256, [64, 0, 128, 64])
    op = traced(monkeypatch, lambda l, r, g: trd.transposed_ragged_dot(l, r, group_sizes=g, block_m=64, block_n=64, block_k=64,
                                                                       max_concurrent_steps=2, grid_block_n=1))
    got = tp.run(op, lhs, rhs, sizes, backend=backend)
    close(got, trd.ref_transposed_ragged_dot(lhs, rhs, sizes), np.float16, f"transposed_ragged_dot_mgpu on {backend}")


def _matmul_translation(monkeypatch):
    config = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32)
    a = RNG.standard_normal((128, 128)).astype(np.float16)
    b = RNG.standard_normal((128, 256)).astype(np.float16)
    with cores(monkeypatch):
        (t,) = tp.translate(lambda a, b: hm.matmul(a, b, None, config), a, b)
    return t, a, b


def test_the_matmul_translates_to_threads_barriers_and_asynchronous_copies(monkeypatch):
    t, _, _ = _matmul_translation(monkeypatch)
    assert t.mesh == "mosaic_gpu(cluster_grid: 2, cluster: 1 cluster, wg: 3 thread)", t.mesh
    assert "  grid (cluster_grid: 2, cluster: 1, wg: 3 thread)\n" in t.text, t.text
    for line in ["barrier r1[2] arrivals 2", "barrier r4[2] arrivals 2", "scratch r2: f16[2, 64, 32]", "scratch r5: f32[3, 64, 64]"]:
        assert line in t.text, t.text
    for stmt in ["copy_async r2[", "arrive r4[", "wait r4[", "mma_async r5[", "mma_wait 0", "arrive r1[", "fence", "wait_copies 0 reads"]:
        assert stmt in t.text, t.text


def _run_text(text, a, b):
    k = tessel.compile(text)
    return k.run(x0=a, x1=b, backend="interpret").outputs["o0"]


def test_mutations_of_the_matmul_are_refused_by_the_race_check(monkeypatch):
    t, a, b = _matmul_translation(monkeypatch)
    close(_run_text(t.text, a, b), (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), np.float16, "as translated")
    consumer = t.text.index("mma_async")
    mutations = {
        "a consumer's wait for its stage removed": (r"\n *wait r4\[%v\d+\]", "", "has a data race on `r2`"),
        "a stage handed back before its product is waited for": (r"(\n *mma_wait 0)(\n *arrive r1\[%v\d+\])", r"\2\1", "has a data race on `r2`"),
        "the producer refilling a stage without waiting for it": (r"\n *wait r1\[%v\d+\]", "", "has a data race on `r2`"),
    }
    for what, (pattern, repl, says) in mutations.items():
        if what.startswith("a consumer") or what.startswith("a stage"):
            head, tail = t.text[:consumer - 200], t.text[consumer - 200:]
            text = head + re.sub(pattern, repl, tail, count=1)
        else:
            text = re.sub(pattern, repl, t.text, count=1)
        assert text != t.text, what
        with pytest.raises(tessel.TesselError) as e:
            _run_text(text, a, b)
        assert says in str(e.value), f"{what}: {e.value}"


def _ptxas():
    """NVIDIA's assembler from the `nvidia-cuda-nvcc` wheel (`scripts/test` installs it), or None."""
    import glob
    import os
    import sys
    found = os.environ.get("TESSEL_PTXAS") or next(iter(sorted(glob.glob(f"{sys.prefix}/lib/python3*/site-packages/nvidia/*/bin/ptxas"))), None)
    return found if found and os.path.exists(found) else None


_F16 = np.float16
_QKV = _qkv(_F16)
_ATTENTION = dict(block_q=64, block_kv=64, max_concurrent_steps=2)
_LHS, _RHS = RNG.standard_normal((256, 128)).astype(_F16), RNG.standard_normal((4, 128, 128)).astype(_F16)
_SIZES = _groups(256, [64, 0, 128, 64])
_RAGGED = dict(group_sizes=None, block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, grid_block_n=1)
_TILES = dict(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32)

#: Each op at a small size: the function to translate and its arguments.
_OPS = {
    "hopper_matmul": (lambda a, b: hm.matmul(a, b, None, hm.TuningConfig(**_TILES)),
                      (RNG.standard_normal((128, 128)).astype(_F16), RNG.standard_normal((128, 256)).astype(_F16))),
    "mixed_type_matmul": (lambda a, b: hmx.mixed_matmul_kernel(a, b, out_dtype=_F16, config=hmx.TuningConfig(**_TILES)),
                          (RNG.integers(-100, 100, (128, 128)).astype(np.int8), RNG.standard_normal((128, 256)).astype(_F16))),
    "attention": (lambda q, k, v: am.attention(q, k, v, am.TuningConfig(**_ATTENTION)), _QKV),
    "attention_causal": (lambda q, k, v: am.attention(q, k, v, am.TuningConfig(**_ATTENTION, causal=True)), _QKV),
    "attention_with_pipeline_emitter": (lambda q, k, v: am.attention_with_pipeline_emitter(q, k, v, am.TuningConfig(**_ATTENTION)), _QKV),
    "attention_grad": (jax.grad(lambda q, k, v: am.attention(q, k, v, am.TuningConfig(
        **_ATTENTION, block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)).astype(jnp.float32).sum(), argnums=(0, 1, 2)), _QKV),
    "ragged_dot": (lambda l, r, g: rd.ragged_dot(l, r, **{**_RAGGED, "group_sizes": g}), (_LHS, _RHS, _SIZES)),
    "ragged_dot_rhs_t": (lambda l, r, g: rd.ragged_dot(l, r, **{**_RAGGED, "group_sizes": g}, transpose_rhs=True), (_LHS, _RHS, _SIZES)),
    "transposed_ragged_dot": (lambda l, r, g: trd.transposed_ragged_dot(l, r, **{**_RAGGED, "group_sizes": g}),
                              (_LHS, RNG.standard_normal((256, 128)).astype(_F16), _SIZES)),
}


#: The ops whose PTX `ptxas` spills: the causal attention's masking outgrows the 232 registers a
#: thread its consumers take (`set_max_registers`, `setmaxnreg`).
_SPILLS = {"attention_causal"}


@pytest.mark.parametrize("op", list(_OPS))
def test_each_op_lowers_for_mosaic_gpu_with_its_warpgroups_at_once_and_its_barriers_mbarriers(monkeypatch, cuda_version, op):
    """Every kernel of each op lowers to PTX whose CTA has a warpgroup per thread, running at
    once, with an mbarrier per barrier of the kernel (thread 0 makes them, warpgroups arrive and
    wait with their phase's parity), its copies between global and shared memory by TMA, its
    products on `wgmma` (accumulators in registers), and `ptxas` assembles it for sm_90a without
    spilling. (The emulated runs of the matmul and the attention against the interpreter are
    tests/mosaic.rs's.)"""
    f, args = _OPS[op]
    with cores(monkeypatch):
        translations = tp.translate(f, *args)
    assert translations, op
    ptxas = _ptxas()
    for i, t in enumerate(translations):
        ptx = tessel.compile(t.text).lower("mosaic-gpu", mesh=t.mesh)
        threads = re.search(r"(\w+): (\d+) thread\)", t.mesh or "")
        warpgroups = int(threads.group(2)) if threads else 1
        assert f".maxntid {128 * warpgroups}, 1, 1" in ptx, f"{op}[{i}]: a warpgroup per thread"
        barriers = sum(int(n) for n in re.findall(r"^  barrier \w+\[(\d+)\]", t.text, re.M))
        assert ptx.count("mbarrier.init.shared::cta.b64") == barriers, f"{op}[{i}]: an mbarrier per barrier"
        if barriers:
            assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive" in ptx, f"{op}[{i}]"
        products = len(re.findall(r"^\s*mma_async ", t.text, re.M))
        assert products > 0 and ptx.count("cp.async.bulk.tensor") > 0, f"{op}[{i}]: {products} products, copies by TMA"
        assert ptx.count("wgmma.mma_async") >= products and "mma.sync" not in ptx, f"{op}[{i}]: every product on wgmma"
        if ptxas:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "k.ptx")
                with open(path, "w") as out:
                    out.write(ptx)
                r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")], capture_output=True, text=True)
            assert r.returncode == 0, f"{op}[{i}]: ptxas: {r.stderr}"
            assert "0 bytes spill stores" in r.stderr or op in _SPILLS, f"{op}[{i}]: {r.stderr}"
    if not ptxas:
        pytest.skip("no ptxas here (pip install nvidia-cuda-nvcc): lowered, not assembled")


def _with_pallas_interpret(module, op):
    """`op` with `module`'s `plgpu.kernel` in Pallas's own GPU interpret mode."""
    params = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params", reason="this jax has no GPU interpret mode")
    real = module.plgpu

    def run(*args):
        module.plgpu = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
        module.plgpu.kernel = lambda *a, **k: real.kernel(*a, **{**k, "interpret": params.InterpretGPUParams()})
        try:
            return op(*args)
        finally:
            module.plgpu = real

    return run


def test_the_matmul_and_the_ragged_dot_equal_pallas_gpu_interpret_mode_bit_for_bit(monkeypatch):
    """The oracle where it runs (jax 0.10.2: these two ops): Pallas's GPU interpret mode, each
    warpgroup a Python thread, gives the same bits as tessel's interpreter."""
    config = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32)
    a = RNG.standard_normal((128, 128)).astype(np.float16)
    b = RNG.standard_normal((128, 256)).astype(np.float16)
    matmul = traced(monkeypatch, lambda a, b: hm.matmul(a, b, None, config))
    ours = tp.run(matmul, a, b, backend="interpret")
    theirs = np.asarray(jax.jit(_with_pallas_interpret(hm, matmul))(a, b))
    np.testing.assert_array_equal(ours, theirs, err_msg="hopper_matmul_mgpu")
    lhs = RNG.standard_normal((256, 128)).astype(np.float16)
    rhs = RNG.standard_normal((4, 128, 128)).astype(np.float16)
    sizes = _groups(256, [64, 0, 128, 64])
    ragged = traced(monkeypatch, lambda l, r, g: rd.ragged_dot(l, r, group_sizes=g, block_m=64, block_n=64, block_k=64,
                                                              max_concurrent_steps=2, grid_block_n=1))
    ours = tp.run(ragged, lhs, rhs, sizes, backend="interpret")
    theirs = np.asarray(jax.jit(_with_pallas_interpret(rd, ragged))(lhs, rhs, sizes))
    np.testing.assert_array_equal(ours, theirs, err_msg="ragged_dot_mgpu")
