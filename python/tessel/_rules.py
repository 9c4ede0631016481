"""The Pallas import's rules, as JAX registers its own lowerings (`mlir.register_lowering`): one
function per primitive, registered by name, called with the kernel body being written (the
`_Writer`, which holds the model's state: each variable's value or ref, the `.tk` lines so far,
the scratch made) and one equation. A family of primitives is a module (`_lax_rules`: values;
`_ref_rules`: loads and stores; `_control`, `_values`, `_refs`, `_order`, `_prng`,
`_multi_index`: their methods registered below them; `_mosaic_gpu`: the Mosaic GPU model);
adding a primitive adds a function and touches nothing else."""

from __future__ import annotations

from typing import Any, Callable, Dict, Set

#: A rule: the writer and one equation; it emits `.tk` lines and defines the outputs.
Rule = Callable[[Any, Any], None]

#: Every rule, by primitive name.
RULES: Dict[str, Rule] = {}

#: Primitives written whether or not anything reads their results (they have none, or act on
#: refs and barriers), besides `_common._EFFECTS`.
EFFECTFUL: Set[str] = set()


def rule(*names: str, effect: bool = False) -> Callable[[Rule], Rule]:
    """Registers a function as the rule of each primitive in `names`; with `effect`, each is
    written even where nothing reads what it makes."""

    def register(f: Rule) -> Rule:
        for n in names:
            if n in RULES:
                raise AssertionError(f"two rules for primitive `{n}`")
            RULES[n] = f
            if effect:
                EFFECTFUL.add(n)
        return f

    return register
