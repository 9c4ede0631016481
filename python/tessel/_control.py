"""Control flow in a Pallas kernel's body: inlined calls, `run_scoped`, `pl.when` and
`lax.cond`/`lax.switch` (as `when` and `if`), `fori_loop`, `while_loop` and `scan` (as `for`)."""

from __future__ import annotations

from typing import List

from ._common import _dims, _literal, _scratch, _ty
from ._jax_support import _jax
from ._rules import rule


class _Control:
    """The `_Writer`'s methods for sub-jaxprs."""

    def sub(self, jaxpr, args, eqn) -> None:
        """Maps a sub-jaxpr's inputs to `args` (values or refs) in this writer's env, each with
        its argument's defining equation (so that a run `start + jnp.arange(n)` made outside a
        loop or branch is still seen as one inside)."""
        _, core, _ = _jax()
        for var, a in zip(jaxpr.invars, args):
            if isinstance(a, core.Literal):
                self.env[var] = _literal(a.val)
            else:
                self.env[var] = self.env[a]
                if a in self.defs:
                    self.defs[var] = self.defs[a]

    def inline(self, eqn) -> None:
        _, core, _ = _jax()
        p = eqn.params
        closed = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
        jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
        if getattr(closed, "consts", None):
            raise self.refuse(f"`{eqn.primitive.name}` with captured constants", eqn)
        self.sub(jaxpr, eqn.invars, eqn)
        self.eqns(jaxpr)
        self.results(eqn, jaxpr)

    def results(self, eqn, jaxpr) -> None:
        """The results of an inlined sub-jaxpr become `eqn`'s."""
        _, core, _ = _jax()
        for out, res in zip(eqn.outvars, jaxpr.outvars):
            self.env[out] = _literal(res.val) if isinstance(res, core.Literal) else self.env[res]

    def run_scoped(self, eqn) -> None:
        """`pl.run_scoped(f, *allocations)`: each allocation is a kernel `scratch` (its contents
        are undefined on entry in Pallas, so memory that persists is as good), then `f` inline."""
        _, core, _ = _jax()
        jaxpr = eqn.params["jaxpr"]
        if any(t for t in eqn.params.get("ref_transforms") or ()):
            raise self.refuse("a `run_scoped` allocation with transforms", eqn)
        # What the scope captures (the kernel's refs, values) comes in as its constants.
        for var, a in zip(jaxpr.constvars, eqn.invars):
            self.env[var] = self.read(a) if isinstance(a, core.Literal) else self.env[a]
        for var in jaxpr.invars:
            arg = f"r{len(self.scoped)}"
            self.scoped.append(_scratch(arg, var.aval, self.kernel, eqn, "`run_scoped` allocation"))
            self.env[var] = ("ref", arg)
        self.eqns(jaxpr)
        self.results(eqn, jaxpr)

    def cond(self, eqn) -> None:
        """`pl.when(c)` (a `cond` whose false branch does nothing), a `lax.cond` or `lax.switch`
        whose branches write refs (each under a `when`), or one returning values (`cond_values`)."""
        branches = eqn.params["branches"]
        index, *ops = eqn.invars
        if eqn.outvars:
            self.cond_values(eqn)
            return
        # Each branch that does something runs under a `when` of its own condition: the
        # predicate (or its negation) of a two-way `cond`, `index == k` of a `switch` (whose
        # index JAX has clamped into range). The conditions are computed before any branch runs.
        cond = self.bools.get(index) if len(branches) == 2 else None
        taken = []
        for k, b in enumerate(branches):
            if b.consts:
                raise self.refuse("`cond` with captured constants", eqn)
            if not b.jaxpr.eqns:
                taken.append(None)
            elif cond is not None and k == 1:
                taken.append(cond)
            else:
                t = self.body.fresh()
                if cond is not None:
                    self.body.emit(f"{t} = not {cond} : bool")
                else:
                    self.body.emit(f"{t} = eq {self.value(index, eqn)}, {k} : bool")
                taken.append(t)
        for b, t in zip(branches, taken):
            if t is None:
                continue
            self.body.emit(f"when {t} {{")
            self.body.depth += 1
            self.sub(b.jaxpr, ops, eqn)
            self.eqns(b.jaxpr)
            self.body.depth -= 1
            self.body.emit("}")

    def cond_values(self, eqn) -> None:
        """`lax.cond` and `lax.switch` returning values (skipping a block's work while keeping the
        carried state): an `if` whose branch taken alone runs, refs it writes included; a
        `switch` a chain of them on `index == k` (JAX has clamped the index into range), the last
        branch the final `else`."""
        branches = eqn.params["branches"]
        index, *ops = eqn.invars
        if any(b.consts for b in branches):
            raise self.refuse("`cond` with captured constants", eqn)
        # A two-way `cond` on a bool takes it as it is (the int JAX makes of it is not written):
        # `lax.cond(p, t, f)` is `cond(p, f, t)`, branch 1 where `p` holds.
        pred = self.bools.get(index) if len(branches) == 2 else None
        if pred is not None:
            results = self.choose(eqn, [branches[1], branches[0]], ops, lambda k: pred)
        else:
            idx = self.value(index, eqn)

            def taken(k: int) -> str:
                t = self.body.fresh()
                self.body.emit(f"{t} = eq {idx}, {k} : bool")
                return t

            results = self.choose(eqn, list(branches), ops, taken)
        for out, v in zip(eqn.outvars, results):
            self.define(out, v)

    def choose(self, eqn, branches, ops, taken) -> List[str]:
        """`RESULTS = if taken(0) { branches[0] } else { the branches after it }`, the last
        branch written alone; returns the result names."""
        b = branches[0]
        if len(branches) == 1:
            self.sub(b.jaxpr, ops, eqn)
            self.eqns(b.jaxpr)
            return [self.value(v, eqn) for v in b.jaxpr.outvars]
        c = taken(0)
        results = [self.body.fresh() for _ in eqn.outvars]
        self.body.emit(f"{', '.join(results)} = if {c} {{")
        self.body.depth += 1
        self.sub(b.jaxpr, ops, eqn)
        self.eqns(b.jaxpr)
        self.body.emit(f"yield {', '.join(self.value(v, eqn) for v in b.jaxpr.outvars)}")
        self.body.depth -= 1
        self.body.emit("} else {")
        self.body.depth += 1
        rest = self.choose(eqn, branches[1:], ops, lambda k: taken(k + 1))
        self.body.emit(f"yield {', '.join(rest)}")
        self.body.depth -= 1
        self.body.emit("}")
        return results

    def fori_while(self, eqn) -> None:
        """`lax.fori_loop` with bounds known only at run time (a `while` whose carry starts with
        the counter and the bound, whose condition is `counter < bound` and whose body adds 1 to
        the counter and keeps the bound): a `for` from the lower to the upper bound."""
        _, core, _ = _jax()
        p = eqn.params
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        consts, carry = eqn.invars[cn:cn + bn], eqn.invars[cn + bn:]
        cj, bj = cond.jaxpr, body.jaxpr
        counter_ok = (
            cn == 0
            and len(carry) >= 2
            and len(cj.eqns) == 1
            and cj.eqns[0].primitive.name == "lt"
            and list(cj.eqns[0].invars) == list(cj.invars[:2])
            and cj.outvars == cj.eqns[0].outvars
        )
        if counter_ok:
            i_in, hi_in = bj.invars[bn], bj.invars[bn + 1]
            i_out, hi_out = bj.outvars[0], bj.outvars[1]
            step = [q for q in bj.eqns if i_out in q.outvars]
            counter_ok = (
                hi_out == hi_in
                and len(step) == 1
                and step[0].primitive.name == "add"
                and step[0].invars[0] == i_in
                and isinstance(step[0].invars[1], core.Literal)
                and int(step[0].invars[1].val) == 1
                and not body.consts
            )
        if not counter_ok:
            return self.while_loop(eqn)
        lo, hi = self.value(carry[0], eqn), self.value(carry[1], eqn)
        rest = carry[2:]
        inits = [self.value(c, eqn) for c in rest]
        names = [self.body.fresh() for _ in rest]
        results = [self.body.fresh() for _ in rest]
        t = self.body.fresh()
        head = f"{', '.join(results)} = " if results else ""
        iters = f" iter ({', '.join(f'{n} = {i}' for n, i in zip(names, inits))})" if rest else ""
        self.body.emit(f"{head}for {t} = {lo} to {hi}{iters} {{")
        self.body.depth += 1
        for var, a in zip(bj.invars[:bn], consts):
            self.env[var] = self.read(a) if isinstance(a, core.Literal) else self.env[a]
        self.env[bj.invars[bn]] = t
        self.env[bj.invars[bn + 1]] = hi
        for var, n in zip(bj.invars[bn + 2:], names):
            self.env[var] = n
        self.eqns(bj)
        if rest:
            self.body.emit(f"yield {', '.join(self.value(o, eqn) for o in bj.outvars[2:])}")
        self.body.depth -= 1
        self.body.emit("}")
        self.env[eqn.outvars[0]] = hi
        self.env[eqn.outvars[1]] = hi
        for out, r in zip(eqn.outvars[2:], results):
            self.env[out] = r

    def while_loop(self, eqn) -> None:
        """`lax.while_loop` with any condition: `for %t = 0 to 2^31 - 1 iter (..., %go = c0)
        while %go`, `c0` the condition on the initial carry and each trip's last value the
        condition on the carry it yields (docs/language.md's `while`)."""
        p = eqn.params
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        if cond.consts or body.consts:
            raise self.refuse("`while` with captured constants", eqn)
        cconsts, bconsts, carry = eqn.invars[:cn], eqn.invars[cn:cn + bn], eqn.invars[cn + bn:]
        cj, bj = cond.jaxpr, body.jaxpr

        def test(values: List[str]) -> str:
            for var, a in zip(cj.invars[:cn], cconsts):
                self.env[var] = self.env[a] if not isinstance(a, _jax()[1].Literal) else self.read(a)
            for var, v in zip(cj.invars[cn:], values):
                self.env[var] = v
            self.eqns(cj)
            return self.value(cj.outvars[0], eqn)

        inits = [self.value(c, eqn) for c in carry]
        go = self.body.fresh()
        self.carried_loop(eqn, bj, bconsts, inits, "0 to 2147483647", (go, test(inits), test))

    def scan(self, eqn) -> None:
        """`lax.fori_loop` (a `scan` with no scanned inputs): a `for` over its length with every
        carried value an `iter`."""
        _, core, _ = _jax()
        p = eqn.params
        nc, ncar = p["num_consts"], p["num_carry"]
        if len(eqn.invars) != nc + ncar or len(eqn.outvars) != ncar:
            self.scan_arrays(eqn)
            return
        if p["reverse"]:
            raise self.refuse("a reversed `scan` without scanned arrays", eqn, "count down in the body")
        body = p["jaxpr"]
        if body.consts:
            raise self.refuse("`scan` with captured constants", eqn)
        consts, carry = eqn.invars[:nc], eqn.invars[nc:]
        self.carried_loop(eqn, body.jaxpr, consts, [self.value(c, eqn) for c in carry], f"0 to {p['length']}")

    def scan_arrays(self, eqn) -> None:
        """`lax.scan` over arrays (a recurrence over a block's rows, as linear-attention and
        state-space kernels write): a `for` over its length carrying the carry and the stacked
        outputs (zeros before), each trip taking row `t` of every scanned array (`t` counted
        down where `reverse`) and putting each output row at `t`, by the moves of
        `dynamic_slice` and `dynamic_update_slice` (`_order.py`)."""
        p = eqn.params
        nc, ncar, n = p["num_consts"], p["num_carry"], p["length"]
        body = p["jaxpr"]
        if body.consts:
            raise self.refuse("`scan` with captured constants", eqn)
        jaxpr = body.jaxpr
        emit, fresh = self.body.emit, self.body.fresh
        dims = _dims
        consts, carry, xs = eqn.invars[:nc], eqn.invars[nc:nc + ncar], eqn.invars[nc + ncar:]
        ys = eqn.outvars[ncar:]
        inits = [self.value(c, eqn) for c in carry]
        for y in ys:
            z = fresh()
            emit(f"{z} = zeros : {_ty(y.aval, self.kernel, eqn)}")
            inits.append(z)
        names = [fresh() for _ in inits]
        results = [fresh() for _ in inits]
        t = fresh()
        iters = ", ".join(f"{a} = {b}" for a, b in zip(names, inits))
        emit(f"{', '.join(results)} = for {t} = 0 to {n} iter ({iters}) {{")
        self.body.depth += 1
        at = t
        if p["reverse"]:
            at = fresh()
            emit(f"{at} = sub {n - 1}, {t} : i32")
        self.sub(jaxpr, consts, eqn)
        for var, name in zip(jaxpr.invars[nc:nc + ncar], names):
            self.env[var] = name
        flat = fresh()
        emit(f"{flat} = iota 0 : i32[{n}]")
        pos = fresh()
        emit(f"{pos} = sub {flat}, {at} : i32[{n}]")
        for var, x in zip(jaxpr.invars[nc + ncar:], xs):
            shape = list(x.aval.shape)
            dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
            row = self.along(self.value(x, eqn), dt, shape, 0, pos, 1)
            r = fresh()
            emit(f"{r} = reshape {row} : {_ty(var.aval, self.kernel, eqn)}")
            self.env[var] = r
        self.eqns(jaxpr)
        outs = [self.value(o, eqn) for o in jaxpr.outvars[:ncar]]
        for y, acc, yv in zip(ys, names[ncar:], jaxpr.outvars[ncar:]):
            shape = list(y.aval.shape)
            dt = _ty(y.aval, self.kernel, eqn).split("[")[0]
            one = fresh()
            emit(f"{one} = reshape {self.value(yv, eqn)} : {dt}[{dims([1] + shape[1:])}]")
            zero, place = fresh(), fresh()
            emit(f"{zero} = iota 0 : i32[1]")
            emit(f"{place} = add {zero}, {at} : i32[1]")
            moved = self.along(one, dt, [1] + shape[1:], 0, place, n)
            rows, here, new = fresh(), fresh(), fresh()
            emit(f"{rows} = iota 0 : i32[{dims(shape)}]")
            emit(f"{here} = eq {rows}, {at} : bool[{dims(shape)}]")
            emit(f"{new} = select {here}, {moved}, {acc} : {dt}[{dims(shape)}]")
            outs.append(new)
        emit(f"yield {', '.join(outs)}")
        self.body.depth -= 1
        emit("}")
        for out, r in zip(eqn.outvars, results):
            self.env[out] = r

    def carried_loop(self, eqn, jaxpr, consts, inits: List[str], bounds: str, cond=None) -> None:
        """`RESULTS = for %t = BOUNDS iter (NAMES = INITS) { BODY; yield ... }` for a loop body
        `jaxpr` whose operands are `consts` then the carried values, its results the `eqn`'s.
        `cond` = (name, initial value, condition of the yielded values) carries one more `bool`
        after them and ends the loop where it is false (`while NAME`)."""
        _, core, _ = _jax()
        names = [self.body.fresh() for _ in inits]
        results = [self.body.fresh() for _ in inits]
        extra = [(cond[0], cond[1])] if cond else []
        iters = ", ".join(f"{n} = {i}" for n, i in [*zip(names, inits), *extra])
        heads = results + ([self.body.fresh()] if cond else [])
        until = f" while {cond[0]}" if cond else ""
        self.body.emit(f"{', '.join(heads)} = for {self.body.fresh()} = {bounds} iter ({iters}){until} {{")
        self.body.depth += 1
        self.sub(jaxpr, consts, eqn)
        for var, n in zip(jaxpr.invars[len(consts) :], names):
            self.env[var] = n
        self.eqns(jaxpr)
        outs = [self.value(o, eqn) for o in jaxpr.outvars]
        self.body.emit(f"yield {', '.join(outs + ([cond[2](outs)] if cond else []))}")
        self.body.depth -= 1
        self.body.emit("}")
        for out, r in zip(eqn.outvars, results):
            self.env[out] = r


# The rules this family gives the writer (`_rules.RULES`): its methods of (writer, equation).
rule("cond")(_Control.cond)
rule("scan")(_Control.scan)
rule("while")(_Control.fori_while)
