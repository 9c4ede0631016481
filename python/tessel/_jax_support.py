"""What the Pallas import's modules share: JAX, imported when first needed, and the primitives
that wrap a jaxpr to be read inline."""

from __future__ import annotations

#: Primitives whose inner jaxpr is read as if written in place (jnp's own functions).
_INLINE = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint"}


def _jax():
    try:
        import jax
        from jax._src import core, source_info_util
    except ImportError as e:  # pragma: no cover - the tests install jax
        raise ImportError("tessel.pallas needs jax: pip install jax") from e
    return jax, core, source_info_util
