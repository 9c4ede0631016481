"""`tessel.pallas` on Pallas TPU's stateful PRNG (`pltpu.prng_seed`, `pltpu.prng_random_bits`,
and `pltpu.stateful_uniform` on top of them): tessel's documented scheme (docs/pallas.md), checked
against the same scheme computed by JAX's own Threefry-2x32 primitive, never by tessel. Pallas's
interpret mode draws zeros (its TODO) and a TPU its hardware generator, so neither is the
reference; the properties a dropout mask needs are checked too."""

import os

import numpy as np
import pytest

if os.environ.get("TESSEL_REQUIRE_PYTHON") == "1":
    import jax  # CI: no jax is a failure, not a skip
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

from tessel import pallas as tp  # noqa: E402
from pallas_common import backends  # noqa: E402


def draws(seed, interpret=False):
    """Each of 4 programs seeds with (seed, its id) and draws two blocks of bits: a [8, 128]
    block, then 256 more (the second continues the first's counter)."""

    def body(s_ref, a_ref, b_ref):
        pltpu.prng_seed(s_ref[0], pl.program_id(0))
        a_ref[...] = pltpu.prng_random_bits((8, 128))
        b_ref[...] = pltpu.prng_random_bits((1, 256))

    out = (jax.ShapeDtypeStruct((32, 128), jnp.int32), jax.ShapeDtypeStruct((4, 256), jnp.int32))
    return pl.pallas_call(
        body, out_shape=out, grid=(4,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=(pl.BlockSpec((8, 128), lambda i: (i, 0)), pl.BlockSpec((1, 256), lambda i: (i, 0))),
        interpret=interpret,
    )(seed)


def scheme(seed: int, program: int, n: int, start: int = 0) -> np.ndarray:
    """The scheme for the seeds (seed, program)."""
    return scheme_words([seed, program], n, start)


def scheme_words(words, n: int, start: int = 0) -> np.ndarray:
    """The scheme, by JAX's Threefry-2x32 primitive: the key is each seed word folded in by
    Threefry (the key so far, the word and its position) from zeros; word `j` is the first word
    of Threefry of (start + j, 0) under it, as `int32`."""
    from jax.extend.random import threefry2x32_p

    u32 = lambda v: jnp.asarray(np.uint32(int(v) & 0xFFFFFFFF))  # noqa: E731
    k0, k1 = u32(0), u32(0)
    for i, w in enumerate(words):
        k0, k1 = threefry2x32_p.bind(k0, k1, u32(w), u32(i))
    ctr = jnp.arange(start, start + n, dtype=jnp.uint32)
    y0, _ = threefry2x32_p.bind(jnp.broadcast_to(k0, ctr.shape), jnp.broadcast_to(k1, ctr.shape), ctr, jnp.zeros_like(ctr))
    return np.asarray(y0).view(np.int32)


def test_seeded_bits_are_the_documented_threefry_scheme_on_every_backend():
    seed = np.array([1234], np.int32)
    want_a = np.concatenate([scheme(1234, p, 1024).reshape(8, 128) for p in range(4)])
    want_b = np.stack([scheme(1234, p, 256, start=1024) for p in range(4)])
    for backend in backends():
        a, b = (np.asarray(v) for v in tp.run(draws, seed, backend=backend))
        np.testing.assert_array_equal(a, want_a, err_msg=backend)
        np.testing.assert_array_equal(b, want_b, err_msg=backend)
    # Pallas's interpret modes are not the reference (jax 0.10.2): the generic one has no rule for
    # `prng_seed`, and the TPU one draws zeros (its TODO).
    if hasattr(pltpu, "InterpretParams"):
        assert not np.asarray(draws(seed, interpret=pltpu.InterpretParams())[0]).any()


def test_bits_look_random_and_follow_the_seed():
    a1, _ = (np.asarray(v) for v in tp.run(draws, np.array([7], np.int32), backend="interpret"))
    a2, _ = (np.asarray(v) for v in tp.run(draws, np.array([7], np.int32), backend="interpret"))
    a3, _ = (np.asarray(v) for v in tp.run(draws, np.array([8], np.int32), backend="interpret"))
    np.testing.assert_array_equal(a1, a2)  # the same seed, the same bits
    assert (a1 != a3).mean() > 0.99  # another seed, other bits
    assert len({a1[8 * p: 8 * (p + 1)].tobytes() for p in range(4)}) == 4  # each program its own
    bits = np.unpackbits(a1.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.01, bits.mean()  # 131,072 bits: 0.5 within 7 sigma
    u = a1.view(np.uint32) / 2.0**32
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 1 / 12) < 0.01


def test_stateful_uniform_draws_a_dropout_mask():
    """`pltpu.stateful_uniform` (bits made floats by jnp) as a dropout kernel uses it."""

    def dropout(x, seed, interpret=False):
        def body(s_ref, x_ref, o_ref):
            pltpu.prng_seed(s_ref[0], pl.program_id(0))
            keep = pltpu.stateful_uniform((8, 128), jnp.float32) > 0.25
            o_ref[...] = jnp.where(keep, x_ref[...] / 0.75, 0.0)

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), spec], out_specs=spec, interpret=interpret,
        )(seed, x)

    if not hasattr(pltpu, "stateful_uniform"):
        pytest.skip("this jax has no pltpu.stateful_uniform")
    x = np.ones((64, 128), np.float32)
    for backend in backends():
        o = np.asarray(tp.run(dropout, x, np.array([3], np.int32), backend=backend))
        kept = o != 0
        assert abs(kept.mean() - 0.75) < 0.02, (backend, kept.mean())
        np.testing.assert_allclose(o[kept], 1 / 0.75, rtol=1e-6)


def pallas_fold_in(seed: int, data: int):
    """A `pallas_tpu` key of `seed` (both words the seed) with `data` folded in, as Pallas's
    implementation defines it (jax/_src/pallas/mosaic/random.py): `data` added to the second
    word, then one round of JAX's own Threefry code (`apply_round`, rotation 13)."""
    from jax._src.random.threefry2x32 import apply_round

    k0, k1 = np.uint32(seed & 0xFFFFFFFF), np.uint32((seed + data) & 0xFFFFFFFF)
    return [int(np.asarray(w)) for w in apply_round([jnp.uint32(k0), jnp.uint32(k1)], 13)]


def test_fold_in_of_a_pallas_tpu_key_mixes_as_pallas_does_and_draws_by_the_scheme():
    """`jax.random.fold_in(key, pl.program_id(0))` of a `pallas_tpu` key: its data (key_data) is
    Pallas's mix of the two words, and its bits the scheme seeded with them, on every backend."""

    def kernel(s_ref, bits_ref, data_ref):
        key = jax.random.fold_in(jax.random.key(s_ref[0], impl="pallas_tpu"), pl.program_id(0))
        bits_ref[...] = jax.random.bits(key, (8, 128), jnp.uint32)
        data_ref[...] = jax.random.key_data(key)

    def f(seed):
        out = (jax.ShapeDtypeStruct((32, 128), jnp.uint32), jax.ShapeDtypeStruct((4, 2), jnp.uint32))
        return pl.pallas_call(
            kernel, out_shape=out, grid=(4,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=(pl.BlockSpec((8, 128), lambda i: (i, 0)), pl.BlockSpec((1, 2), lambda i: (i, 0))),
        )(seed)

    keys = [pallas_fold_in(99, p) for p in range(4)]
    want_bits = np.concatenate([scheme_words(k, 1024).view(np.uint32).reshape(8, 128) for k in keys])
    for backend in backends():
        bits, data = (np.asarray(v) for v in tp.run(f, np.array([99], np.int32), backend=backend))
        np.testing.assert_array_equal(data, np.array(keys, np.uint32), err_msg=backend)
        np.testing.assert_array_equal(bits, want_bits, err_msg=backend)


def test_a_wrapped_pallas_tpu_key_draws_from_its_words_and_split_is_refused():
    def kernel(d_ref, o_ref):
        key = jax.random.wrap_key_data(d_ref[...], impl="pallas_tpu")
        o_ref[...] = jax.random.bits(key, (1, 256), jnp.uint32)

    def f(d):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1, 256), jnp.uint32))(d)

    words = np.array([[0xDEADBEEF, 7]], np.uint32)
    want = scheme_words(list(words[0]), 256).view(np.uint32).reshape(1, 256)
    for backend in backends():
        np.testing.assert_array_equal(np.asarray(tp.run(f, words, backend=backend)), want, err_msg=backend)

    def splits(s_ref, o_ref):
        key, _ = jax.random.split(jax.random.key(s_ref[0], impl="pallas_tpu"))
        o_ref[...] = jax.random.bits(key, (1, 128), jnp.uint32)

    g = lambda s: pl.pallas_call(  # noqa: E731
        splits, out_shape=jax.ShapeDtypeStruct((1, 128), jnp.uint32), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)]
    )(s)
    with pytest.raises(tp.UnsupportedError, match="`split` of a Pallas TPU key") as e:
        tp.run(g, np.array([1], np.int32), backend="interpret")
    assert "fold_in" in (e.value.hint or ""), e.value.hint
