"""Random numbers in a Pallas kernel's body: JAX's `threefry2x32` primitive (the counter-based
generator `jax.random` calls) and Pallas TPU's PRNG (`pltpu.prng_seed`/`prng_random_bits`, the
stateful samplers, `jax.random` keys of the `pallas_tpu` implementation and their `fold_in`), all
on tessel's own documented scheme (docs/pallas.md)."""

from __future__ import annotations

from typing import List

import numpy as np

from ._common import _dims, _ty
from ._rules import rule


def _key_impl(key) -> str:
    """The name of the PRNG implementation of a `jax.random` key variable (`pallas_tpu`, ...)."""
    return getattr(getattr(key.aval.dtype, "_impl", None), "name", "")


class _Prng:
    """The `_Writer`'s methods for random numbers."""

    def as_u32(self, v: str, dt: str, shape=()) -> str:
        """`v`, of elements `dt` and shape `shape`, as `u32` words: itself, the bits of an `i32`,
        or a `cast` of another integer."""
        if dt == "u32":
            return v
        return self.body.let(f"bitcast {v}" if dt == "i32" else f"cast {v}", f"u32[{_dims(shape)}]" if shape else "u32")

    def threefry(self, eqn) -> None:
        """`threefry2x32` (JAX's counter-based PRNG, as `jax.random` and Pallas's TPU PRNG kernels
        call it): the bits are JAX's (`threefry_words`)."""
        ty = _ty(eqn.outvars[0].aval, self.kernel, eqn)
        key_ty = _ty(eqn.invars[0].aval, self.kernel, eqn)
        for out, v in zip(eqn.outvars, self.threefry_words(*(self.value(a, eqn) for a in eqn.invars), ty, key_ty)):
            self.define(out, v)

    def threefry_words(self, k0: str, k1: str, x0: str, x1: str, ty: str, key_ty: str) -> List[str]:
        """Threefry-2x32 of counters `x0`, `x1` (`ty`) under key `k0`, `k1` (`key_ty`): 20 rounds
        on `u32` words, as JAX computes it (Salmon et al., 2011): each round adds, rotates left
        and xors; every four rounds the key schedule (the two key words and their xor with
        0x1BD11BDA) is added in, with the injection's count."""

        def e(rhs: str) -> str:
            return self.body.let(rhs, ty)

        ks = [k0, k1, self.body.let(f"xor {self.body.let(f'xor {k0}, {k1}', key_ty)}, 466688986", key_ty)]
        x = [e(f"add {x0}, {ks[0]}"), e(f"add {x1}, {ks[1]}")]
        rotations = [(13, 15, 26, 6), (17, 29, 16, 24)]
        for g in range(5):
            for r in rotations[g % 2]:
                a = e(f"add {x[0]}, {x[1]}")
                rot = e(f"or {e(f'shl {x[1]}, {r}')}, {e(f'shr {x[1]}, {32 - r}')}")
                x = [a, e(f"xor {a}, {rot}")]
            x = [e(f"add {x[0]}, {ks[(g + 1) % 3]}"), e(f"add {e(f'add {x[1]}, {ks[(g + 2) % 3]}')}, {g + 1}")]
        return x

    def prng_state(self) -> str:
        """The scratch that holds Pallas TPU's PRNG state, `u32[3]`: the key's two words and the
        count of words drawn since the seed (allocated on first use; zeros before any seed)."""
        if self.prng is None:
            self.prng = f"r{len(self.scoped)}"
            self.scoped.append(f"  scratch {self.prng}: u32[3]")
        return self.prng

    def prng_seed(self, eqn) -> None:
        """`pltpu.prng_seed(*seeds)`: the key made from the seeds' words (`seed_words`)."""
        avals = [tuple(getattr(a.aval, "shape", ())) for a in eqn.invars]
        dts = [_ty(a.aval, self.kernel, eqn).split("[")[0] for a in eqn.invars]
        self.seed_words([self.value(a, eqn) for a in eqn.invars], avals, dts, eqn)

    def seed_words(self, values, shapes, dts, eqn) -> None:
        """Seeds the kernel's PRNG: the key made from the seeds' words in order, each folded in
        by Threefry-2x32 (the key so far, the word and its position as the counters), from a
        zero key; the count of words drawn restarts at 0. tessel's own scheme: Pallas's interpret
        mode draws zeros and a TPU its hardware generator, whose bits are not specified."""
        state = self.prng_state()
        words = []
        for v, shape, base in zip(values, shapes, dts):
            n = int(np.prod(shape)) if shape else 1
            if n > 16:
                raise self.refuse(f"a PRNG seed of {n} words", eqn, "seed with a few scalars (pltpu.prng_seed(seed, pl.program_id(0)))")
            if shape:
                v = self.body.let(f"reshape {v}", f"{base}[{n}]")
            for i in range(n):
                w = v
                if shape:
                    w = self.body.let(f"reshape {self.body.let(f'slice {v} start ({i})', f'{base}[1]')}", base)
                words.append(self.as_u32(w, base))
        k0 = k1 = self.body.let("full 0", "u32")
        for i, w in enumerate(words):
            k0, k1 = self.threefry_words(k0, k1, w, str(i), "u32", "u32")
        self.body.emit(f"store {state}[0], {k0}")
        self.body.emit(f"store {state}[1], {k1}")
        self.body.emit(f"store {state}[2], 0")

    def random_seed(self, eqn) -> None:
        """`jax.random` keys of Pallas TPU's implementations: the stateful one's (what
        `pltpu.stateful_uniform` and friends make; the state is the kernel's seeded PRNG, so the
        key carries nothing), and `pallas_tpu`'s (`jax.random.key(seed, impl="pallas_tpu")`,
        whose two words are the seed, each draw seeding with them). Other keys are refused."""
        impl = getattr(eqn.params.get("impl"), "name", "")
        if impl == "_pallas_internal_stateful":
            self.define(eqn.outvars[0], "0")
        elif impl == "pallas_tpu":
            seed = self.value(eqn.invars[0], eqn)
            dt = _ty(eqn.invars[0].aval, self.kernel, eqn)
            self.define(eqn.outvars[0], self.body.let(f"broadcast {self.as_u32(seed, dt)}", "u32[2]"))
        else:
            raise self.refuse(f"a `jax.random` key of the `{impl}` implementation", eqn,
                              "draw with pltpu.prng_seed and pltpu.prng_random_bits, or pltpu.stateful_* samplers")

    def random_bits(self, eqn) -> None:
        """`random_bits` of a Pallas TPU key (`random_seed`): 32-bit words drawn from the kernel's
        PRNG (`prng_random_bits`); a `pallas_tpu` key seeds it with its two words first."""
        key = eqn.invars[0]
        impl = _key_impl(key)
        if impl not in ("_pallas_internal_stateful", "pallas_tpu") or eqn.params.get("bit_width") != 32:
            raise self.refuse(f"`random_bits` of a `{impl}` key of {eqn.params.get('bit_width')} bits", eqn,
                              "draw 32-bit words with pltpu.prng_random_bits")
        if impl == "pallas_tpu":
            self.seed_words([self.value(key, eqn)], [(2,)], ["u32"], eqn)
        bits = self.draw(tuple(eqn.params["shape"]))
        self.define(eqn.outvars[0], self.body.let(f"bitcast {bits}", _ty(eqn.outvars[0].aval, self.kernel, eqn)))

    def random_fold_in(self, eqn) -> None:
        """`jax.random.fold_in` of a `pallas_tpu` key, as Pallas defines it for that
        implementation: the data added to the key's second word, then one Threefry round (add,
        rotate left by 13, xor) mixes the two words. Keys of other implementations are refused."""
        key, data = eqn.invars
        impl = _key_impl(key)
        if impl != "pallas_tpu" or tuple(key.aval.shape) != () or tuple(getattr(data.aval, "shape", ())) != ():
            raise self.refuse(f"`fold_in` of a `{impl}` key of shape {tuple(key.aval.shape)}", eqn,
                              "fold a scalar into one key made with jax.random.key(seed, impl='pallas_tpu')")
        k = self.value(key, eqn)
        d = self.as_u32(self.value(data, eqn), _ty(data.aval, self.kernel, eqn))
        k0, k1 = (self.body.let(f"reshape {self.body.let(f'slice {k} start ({i})', 'u32[1]')}", "u32") for i in range(2))
        k1 = self.body.let(f"add {k1}, {d}", "u32")
        k0 = self.body.let(f"add {k0}, {k1}", "u32")
        rot = self.body.let(f"or {self.body.let(f'shl {k1}, 13', 'u32')}, {self.body.let(f'shr {k1}, 19', 'u32')}", "u32")
        k1 = self.body.let(f"xor {k0}, {rot}", "u32")
        words = [self.body.let(f"reshape {w}", "u32[1]") for w in (k0, k1)]
        self.define(eqn.outvars[0], self.body.let(f"concatenate {words[0]}, {words[1]} axis 0", "u32[2]"))

    def random_split(self, eqn) -> None:
        """`jax.random.split` of a Pallas TPU key: Pallas itself cannot split one."""
        raise self.refuse("`split` of a Pallas TPU key", eqn,
                          "Pallas cannot split a Pallas key either; make new keys with jax.random.fold_in")

    def random_wrap(self, eqn) -> None:
        """`jax.random.wrap_key_data(data, impl="pallas_tpu")`: a key from its two `u32` words
        (Pallas's key data is `u32[1, 2]`)."""
        impl = getattr(eqn.params.get("impl"), "name", "")
        shape = tuple(eqn.invars[0].aval.shape)
        if impl != "pallas_tpu" or int(np.prod(shape)) != 2:
            raise self.refuse(f"`wrap_key_data` of a `{impl}` key of data shape {shape}", eqn,
                              "wrap one key's two words with impl='pallas_tpu'")
        dt = _ty(eqn.invars[0].aval, self.kernel, eqn).partition("[")[0]
        v = self.as_u32(self.value(eqn.invars[0], eqn), dt, shape)
        self.define(eqn.outvars[0], v if shape == (2,) else self.body.let(f"reshape {v}", "u32[2]"))

    def random_unwrap(self, eqn) -> None:
        """`jax.random.key_data` of a `pallas_tpu` key: its two words as `u32[1, 2]`."""
        key = eqn.invars[0]
        impl = _key_impl(key)
        if impl != "pallas_tpu" or tuple(key.aval.shape) != ():
            raise self.refuse(f"`key_data` of a `{impl}` key of shape {tuple(key.aval.shape)}", eqn,
                              "take the data of one key made with impl='pallas_tpu'")
        self.define(eqn.outvars[0], self.body.let(f"reshape {self.value(key, eqn)}", _ty(eqn.outvars[0].aval, self.kernel, eqn)))

    def prng_random_bits(self, eqn) -> None:
        """`pltpu.prng_random_bits(shape)`: a draw (`draw`) as `i32`."""
        bits = self.draw(tuple(eqn.params["shape"]))
        self.define(eqn.outvars[0], self.body.let(f"bitcast {bits}", _ty(eqn.outvars[0].aval, self.kernel, eqn)))

    def draw(self, shape) -> str:
        """`u32[shape]` words from the kernel's PRNG: word `j` (row-major) is the first word of
        Threefry-2x32 of the counters (count + j, 0) under the seeded key; the count moves past
        the draw. The same seed gives the same bits on every backend."""
        state = self.prng_state()
        n = int(np.prod(shape)) if shape else 1
        k0, k1, count = (self.body.let(f"load {state}[{i}]", "u32") for i in range(3))
        flat = self.body.let("iota 0", f"i32[{n}]")
        ctr = self.body.let(f"add {self.body.let(f'cast {flat}', f'u32[{n}]')}, {count}", f"u32[{n}]")
        zero = self.body.let("full 0", f"u32[{n}]")
        y, _ = self.threefry_words(k0, k1, ctr, zero, f"u32[{n}]", "u32")
        if tuple(shape) != (n,):
            y = self.body.let(f"reshape {y}", f"u32[{_dims(shape)}]" if shape else "u32")
        self.body.emit(f"store {state}[2], {self.body.let(f'add {count}, {n}', 'u32')}")
        return y


# The rules this family gives the writer (`_rules.RULES`): its methods of (writer, equation).
rule("prng_seed")(_Prng.prng_seed)
rule("prng_random_bits")(_Prng.prng_random_bits)
rule("random_seed")(_Prng.random_seed)
rule("random_bits")(_Prng.random_bits)
rule("random_fold_in")(_Prng.random_fold_in)
rule("random_split")(_Prng.random_split)
rule("random_wrap")(_Prng.random_wrap)
rule("random_unwrap")(_Prng.random_unwrap)
