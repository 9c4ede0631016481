"""Moving elements along an axis in a Pallas kernel's body: `sort`, `top_k` and `rev` (each
element's place, then every operand moved there by `select` and `max`), and `dynamic_slice` /
`dynamic_update_slice` of values (the same moves, to a window clamped as JAX clamps it)."""

from __future__ import annotations

from ._common import _axis_last, _dims, _inverse, _literal, _ty
from ._rules import rule


class _Order:
    """The `_Writer`'s methods that move elements along an axis."""

    def permute(self, v: str, dt: str, shape, perm) -> str:
        """`v` (`dt[shape]`, the shape before) transposed by `perm`; `v` itself where `perm` is None."""
        if perm is None:
            return v
        t = self.body.fresh()
        self.body.emit(f"{t} = transpose {v} perm ({_dims(perm)}) : {dt}[{_dims([shape[d] for d in perm])}]")
        return t

    def permuted(self, eqn, name: str) -> None:
        """`sort` (`jnp.sort`, `jnp.argsort`, `lax.sort` by several keys: its operands ordered by
        the first `num_keys`, stably), `top_k`
        (the `k` largest along the last axis and their indices, ties the lower index first) and
        `rev` (`jnp.flip`), along one axis (another moved last by `transpose` and back after). Each
        element's place along the axis is computed, then every operand is moved there: for a
        sort, its rank, the number of elements ordered before it (by JAX's order of floats: -0
        as 0, NaN after everything, so the bits come out as JAX's), counted over a comparison
        of every pair (the block's row length squared per row)."""
        p = eqn.params
        shape = list(eqn.invars[0].aval.shape)
        rank = len(shape)
        axis = {"sort": lambda: p["dimension"], "top_k": lambda: rank - 1, "rev": lambda: None}[name]()
        if name == "rev":
            if len(p["dimensions"]) != 1:
                raise self.refuse(f"`rev` along {len(p['dimensions'])} axes at once", eqn, "flip one axis at a time")
            axis = p["dimensions"][0]
        emit, fresh, dims = self.body.emit, self.body.fresh, _dims
        perm = _axis_last(axis, rank)
        moved = shape if perm is None else [shape[d] for d in perm]
        n, lead = moved[-1], moved[:-1]

        def last(v: str, dt: str) -> str:
            return self.permute(v, dt, shape, perm)

        def pair(sh_i, sh_j):
            return lead + [sh_i, sh_j]

        # Where each element goes along the axis (`i32`, the moved shape).
        iota_i, iota_j = fresh(), fresh()
        emit(f"{iota_i} = iota {len(lead)} : i32[{dims(pair(n, n))}]")
        emit(f"{iota_j} = iota {len(lead) + 1} : i32[{dims(pair(n, n))}]")
        pos = fresh()
        if name == "rev":
            flat = fresh()
            emit(f"{flat} = iota {len(lead)} : i32[{dims(moved)}]")
            emit(f"{pos} = sub {n - 1}, {flat} : i32[{dims(moved)}]")
            k = n
        else:
            # j before i: ordered before it by the first key that differs, or by none and earlier
            # (a stable order): built from the tie-breaker out, the last key first.
            order = "gt" if name == "top_k" else "lt"
            before = fresh()
            emit(f"{before} = lt {iota_j}, {iota_i} : bool[{dims(pair(n, n))}]")
            for key_var in reversed(eqn.invars[: p.get("num_keys", 1) if name == "sort" else 1]):
                dt0 = _ty(key_var.aval, self.kernel, eqn).split("[")[0]
                key, kt = self.sort_key(last(self.value(key_var, eqn), dt0), dt0, moved, zeros_equal=name == "sort")
                ki, kj, o, e, tie, either = (fresh() for _ in range(6))
                emit(f"{ki} = reshape {key} : {kt}[{dims(lead + [n, 1])}]")
                emit(f"{kj} = reshape {key} : {kt}[{dims(lead + [1, n])}]")
                emit(f"{o} = {order} {kj}, {ki} : bool[{dims(pair(n, n))}]")
                emit(f"{e} = eq {kj}, {ki} : bool[{dims(pair(n, n))}]")
                emit(f"{tie} = and {e}, {before} : bool[{dims(pair(n, n))}]")
                emit(f"{either} = or {o}, {tie} : bool[{dims(pair(n, n))}]")
                before = either
            count = fresh()
            emit(f"{count} = cast {before} : i32[{dims(pair(n, n))}]")
            emit(f"{pos} = sum {count} axis {len(lead) + 1} : i32[{dims(moved)}]")
            k = p["k"] if name == "top_k" else n
        # Output place q takes the element whose place is q: the one hit in each row of
        # `hit[.., q, i]`, picked by a max over i with everything else the max's identity.
        src, slot, hit = fresh(), fresh(), fresh()
        emit(f"{src} = reshape {pos} : i32[{dims(lead + [1, n])}]")
        emit(f"{slot} = iota {len(lead)} : i32[{dims(lead + [k, n])}]")
        emit(f"{hit} = eq {src}, {slot} : bool[{dims(lead + [k, n])}]")
        operands = list(eqn.invars) if name == "sort" else [eqn.invars[0]]
        outs = list(eqn.outvars)
        picked = []
        for v in operands:
            ty = _ty(v.aval, self.kernel, eqn)
            dt = ty.split("[")[0]
            x = last(self.value(v, eqn), dt)
            if dt == "bool":
                c = fresh()
                emit(f"{c} = cast {x} : i32[{dims(moved)}]")
                x, dt = c, "i32"
            picked.append(self.pick(x, dt, hit, lead, k, n))
        if name == "top_k":
            picked.append(self.pick(iota_j, "i32", hit, lead, k, n, row=True))
        back = None if perm is None else _inverse(perm)
        for out, (v, dt) in zip(outs, picked):
            want = _ty(out.aval, self.kernel, eqn).split("[")[0]
            v = self.permute(v, dt, lead + [k], back)
            if want != dt:
                c = fresh()
                emit(f"{c} = {'ne' if want == 'bool' else 'cast'} {v}{', 0' if want == 'bool' else ''} : {_ty(out.aval, self.kernel, eqn)}")
                v = c
            self.define(out, v)

    def sort_key(self, x: str, dt: str, shape, zeros_equal: bool = True) -> tuple:
        """The value JAX orders `x` (of `dt[shape]`) by, and its type: a float as the `i32` whose
        order is JAX's (every NaN as one NaN after everything; -0 as 0 for a sort, `zeros_equal`,
        where XLA's `top_k` takes -0 below 0), an integer as it is."""
        emit, fresh = self.body.emit, self.body.fresh
        if dt not in ("f32", "f16", "bf16"):
            return x, dt
        sh = f"[{', '.join(str(d) for d in shape)}]"
        if dt != "f32":
            c = fresh()
            emit(f"{c} = cast {x} : f32{sh}")
            x = c
        z, x0, nan, xn, si, un, fl, fi, neg, key = (fresh() for _ in range(10))
        if zeros_equal:
            emit(f"{z} = eq {x}, 0.0 : bool{sh}")
            emit(f"{x0} = select {z}, 0.0, {x} : f32{sh}")
        else:
            x0 = x
        emit(f"{nan} = ne {x}, {x} : bool{sh}")
        emit(f"{xn} = select {nan}, nan, {x0} : f32{sh}")
        emit(f"{si} = bitcast {xn} : i32{sh}")
        emit(f"{un} = bitcast {xn} : u32{sh}")
        emit(f"{fl} = sub 2147483647, {un} : u32{sh}")
        emit(f"{fi} = bitcast {fl} : i32{sh}")
        emit(f"{neg} = lt {si}, 0 : bool{sh}")
        emit(f"{key} = select {neg}, {fi}, {si} : i32{sh}")
        return key, "i32"

    def pick(self, x: str, dt: str, hit: str, lead, k: int, n: int, row: bool = False):
        """Element `q` of the result: the element of `x` (the moved shape; with `row`, already
        `[.., n, n]` of which row 0 is used) whose `hit` is set in row `q`."""
        emit, fresh = self.body.emit, self.body.fresh
        dims = _dims
        low = {"f32": "-inf", "f16": "-inf", "bf16": "-inf", "i32": "-2147483648", "u32": "0",
               "i16": "-32768", "u16": "0", "i8": "-128", "u8": "0"}[dt]
        xs = fresh()
        if row:
            emit(f"{xs} = slice {x} start ({dims([0] * (len(lead) + 2))}) : {dt}[{dims(lead + [1, n])}]")
        else:
            emit(f"{xs} = reshape {x} : {dt}[{dims(lead + [1, n])}]")
        sel, out = fresh(), fresh()
        emit(f"{sel} = select {hit}, {xs}, {low} : {dt}[{dims(lead + [k, n])}]")
        emit(f"{out} = max {sel} axis {len(lead) + 1} : {dt}[{dims(lead + [k])}]")
        return out, dt

    def along(self, x: str, dt: str, shape, axis: int, pos: str, k: int) -> str:
        """`x` (`dt[shape]`) with its `axis` made `k` long: element `q` along it is the one whose
        place `pos` (`i32[n]`, one per element along the axis) is `q`, the others the `max`'s
        identity (moved by `select` and `max` along a transposed copy, as `permuted` moves)."""
        emit, fresh, dims = self.body.emit, self.body.fresh, _dims
        rank, n = len(shape), shape[axis]
        perm = _axis_last(axis, rank)
        moved = list(shape) if perm is None else [shape[d] for d in perm]
        lead = moved[:-1]
        if dt == "bool":
            c = fresh()
            emit(f"{c} = cast {x} : i32[{dims(shape)}]")
            x = c
        work = "i32" if dt == "bool" else dt
        x = self.permute(x, work, shape, perm)
        ones = [1] * len(lead)
        src, slot, hit = fresh(), fresh(), fresh()
        emit(f"{src} = reshape {pos} : i32[{dims(ones + [1, n])}]")
        emit(f"{slot} = iota {len(lead)} : i32[{dims(ones + [k, n])}]")
        emit(f"{hit} = eq {src}, {slot} : bool[{dims(ones + [k, n])}]")
        out, _ = self.pick(x, work, hit, lead, k, n)
        out = self.permute(out, work, lead + [k], None if perm is None else _inverse(perm))
        if dt == "bool":
            c = fresh()
            emit(f"{c} = ne {out}, 0 : bool[{dims([*shape[:axis], k, *shape[axis + 1:]])}]")
            out = c
        return out

    def start(self, atom, n: int, k: int, eqn) -> str:
        """A dynamic start along an axis of `n` for a window of `k`, clamped into `[0, n - k]` as
        JAX clamps it, as an `i32` scalar."""
        emit, fresh = self.body.emit, self.body.fresh
        s = self.read(atom)
        if not s.startswith("%"):
            return str(min(max(int(float(s)), 0), n - k))
        dt = _ty(atom.aval, self.kernel, eqn)
        if dt.startswith("u"):
            # Unsigned: past the window clamps to its end (not, through a negative `i32`, to 0).
            m = fresh()
            emit(f"{m} = min {s}, {n - k} : {dt}")
            c = fresh()
            emit(f"{c} = cast {m} : i32")
            return c
        if dt != "i32":
            c = fresh()
            emit(f"{c} = cast {s} : i32")
            s = c
        lo, hi = fresh(), fresh()
        emit(f"{lo} = max {s}, 0 : i32")
        emit(f"{hi} = min {lo}, {n - k} : i32")
        return hi

    def roll(self, eqn) -> None:
        """Pallas TPU's `roll` (`pltpu.roll(x, shift, axis)`, `jnp.roll`'s rotation): element `q`
        along the axis is the one at `q - shift` modulo its length. A static shift is two
        `slice`s and a `concatenate`; one from data is rolled by each of its bits in turn (a
        static roll by 2^b chosen by `select`). With `stride` the slices along `stride_axis` roll by
        `shift + i * stride` each, a static shift apiece (up to 64 slices)."""
        let, dims = self.body.let, _dims
        x, shift_atom = eqn.invars
        p = eqn.params
        axis, stride, stride_axis = p["axis"], p.get("stride"), p.get("stride_axis")
        shape = list(x.aval.shape)
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        v = self.value(x, eqn)
        lit = self.read(shift_atom)
        n = shape[axis]

        def rolled(v: str, shape, k: int) -> str:
            """`v` (`dt[shape]`) rolled by a static `k` along `axis`: its last `k` then the rest."""
            k %= n
            if k == 0:
                return v
            start = [0] * len(shape)
            start[axis] = n - k
            tail = let(f"slice {v} start ({dims(start)})", f"{dt}[{dims(shape[:axis] + [k] + shape[axis + 1:])}]")
            head = let(f"slice {v} start ({dims([0] * len(shape))})", f"{dt}[{dims(shape[:axis] + [n - k] + shape[axis + 1:])}]")
            return let(f"concatenate {tail}, {head} axis {axis}", f"{dt}[{dims(shape)}]")

        if stride is None and not lit.startswith("%"):
            return self.define(eqn.outvars[0], rolled(v, shape, int(float(lit))))
        if stride is None:
            # A shift from data: taken modulo the length into [0, n), then rolled by each of its
            # bits in turn (static rolls by 1, 2, 4, ... chosen by `select`): O(n log n) work and
            # no value larger than the block.
            s = lit if _ty(shift_atom.aval, self.kernel, eqn) == "i32" else let(f"cast {lit}", "i32")
            k = let(f"rem {s}, {n}", "i32")
            k = let(f"add {k}, {n}", "i32")
            k = let(f"rem {k}, {n}", "i32")
            bit = 0
            while (1 << bit) < n:
                on = let(f"ne {let(f'and {k}, {1 << bit}', 'i32')}, 0", "bool")
                v = let(f"select {on}, {rolled(v, shape, 1 << bit)}, {v}", f"{dt}[{dims(shape)}]")
                bit += 1
            return self.define(eqn.outvars[0], v)
        m = shape[stride_axis]
        if lit.startswith("%") or m > 64:
            raise self.refuse("a strided `roll` by a shift from data, or along more than 64 slices", eqn)
        one = [1 if e == stride_axis else shape[e] for e in range(len(shape))]
        parts = []
        for i in range(m):
            piece = let(f"slice {v} start ({dims([i if e == stride_axis else 0 for e in range(len(shape))])})", f"{dt}[{dims(one)}]")
            parts.append(rolled(piece, one, int(float(lit)) + i * stride))
        self.define(eqn.outvars[0], let(f"concatenate {', '.join(parts)} axis {stride_axis}", f"{dt}[{dims(shape)}]"))

    def dynamic_slice(self, eqn) -> None:
        """`lax.dynamic_slice` of a value (`v[pl.ds(i, k)]` of a loaded block): along each axis
        whose start is data, element `q` is the one at `start + q` (the start clamped as JAX
        clamps it); along the others a `slice`."""
        x, *atoms = eqn.invars
        sizes = list(eqn.params["slice_sizes"])
        shape = list(x.aval.shape)
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        starts = [self.start(a, n, k, eqn) for a, n, k in zip(atoms, shape, sizes)]
        self.define(eqn.outvars[0], self.take_window(self.value(x, eqn), shape, dt, starts, sizes))

    def take_window(self, v: str, shape, dt: str, starts, sizes) -> str:
        """The window of `v` (`dt[shape]`) at `starts` (`i32` scalars or literals, in range) of
        `sizes`: a `slice` along axes whose start is known, along the others element `q` moved
        from `start + q` (`along`)."""
        emit, fresh, dims = self.body.emit, self.body.fresh, _dims
        shape = list(shape)
        for d, (s, k) in enumerate(zip(starts, sizes)):
            n = shape[d]
            if not s.startswith("%"):
                if (int(s), k) != (0, n):
                    cut = shape[:d] + [k] + shape[d + 1:]
                    t = fresh()
                    emit(f"{t} = slice {v} start ({dims([int(s) if e == d else 0 for e in range(len(shape))])}) : {dt}[{dims(cut)}]")
                    v, shape = t, cut
                continue
            flat, pos = fresh(), fresh()
            emit(f"{flat} = iota 0 : i32[{n}]")
            emit(f"{pos} = sub {flat}, {s} : i32[{n}]")
            v = self.along(v, dt, shape, d, pos, k)
            shape = shape[:d] + [k] + shape[d + 1:]
        return v

    def dynamic_update_slice(self, eqn) -> None:
        """`lax.dynamic_update_slice` of a value: the update moved to its place along each axis
        (its element `j` to `start + j`, the start clamped as JAX clamps it), chosen there by a
        mask of the window, the operand elsewhere."""
        x, u, *atoms = eqn.invars
        shape, ushape = list(x.aval.shape), list(u.aval.shape)
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        starts = [self.start(a, n, m, eqn) for a, n, m in zip(atoms, shape, ushape)]
        self.define(eqn.outvars[0], self.put_window(self.value(x, eqn), shape, dt, self.value(u, eqn), ushape, starts))

    def put_window(self, x: str, shape, dt: str, u: str, ushape, starts) -> str:
        """`x` (`dt[shape]`) with `u` (`dt[ushape]`) in the window at `starts` (`i32` scalars or
        literals, in range): `u` moved to its place along each axis (`along`) and chosen there by
        a mask of the window, `x` elsewhere."""
        emit, fresh, dims = self.body.emit, self.body.fresh, _dims
        shape = list(shape)
        v, cur = u, list(ushape)
        inside = None
        for d, (s, n, m) in enumerate(zip(starts, shape, ushape)):
            flat, pos = fresh(), fresh()
            emit(f"{flat} = iota 0 : i32[{m}]")
            emit(f"{pos} = add {flat}, {s} : i32[{m}]")
            v = self.along(v, dt, cur, d, pos, n)
            cur[d] = n
            # Whether the element is in the window along this axis.
            at, lo, end, hi, both = (fresh() for _ in range(5))
            emit(f"{at} = iota {d} : i32[{dims(shape)}]")
            emit(f"{lo} = ge {at}, {s} : bool[{dims(shape)}]")
            if s.startswith("%"):
                emit(f"{end} = add {s}, {m} : i32")
            else:
                end = str(int(s) + m)
            emit(f"{hi} = lt {at}, {end} : bool[{dims(shape)}]")
            emit(f"{both} = and {lo}, {hi} : bool[{dims(shape)}]")
            if inside is None:
                inside = both
            else:
                t = fresh()
                emit(f"{t} = and {inside}, {both} : bool[{dims(shape)}]")
                inside = t
        if inside is None:
            return v
        return self.body.let(f"select {inside}, {v}, {x}", f"{dt}[{dims(shape)}]")

    def value_gather(self, eqn) -> None:
        """`gather` of a loaded value (not a ref) by an index array, in the two forms kernels
        write: rows `x[idx]` of a matrix, and `jnp.take_along_axis(x, idx, axis=1)`. Each output
        element is the element whose index along the gathered axis equals its entry, picked by
        a `select` and a `max` over that axis (`pick`); an entry outside the axis gives JAX's
        fill value (NaN for floats) in `fill` mode, and is clamped in `clip` mode."""
        emit, fresh = self.body.emit, self.body.fresh
        x, idx = eqn.invars
        p = eqn.params
        dn = p["dimension_numbers"]
        shape, ishape = list(x.aval.shape), list(idx.aval.shape)
        rows = (len(shape) == 2 and tuple(dn.start_index_map) == (0,) and tuple(dn.collapsed_slice_dims) == (0,)
                and tuple(dn.offset_dims) == (1,) and not dn.operand_batching_dims and len(ishape) == 2 and ishape[1] == 1
                and tuple(p["slice_sizes"]) == (1, shape[1]))
        along = (len(shape) == 2 and tuple(dn.start_index_map) == (1,) and tuple(dn.collapsed_slice_dims) == (1,)
                 and not dn.offset_dims and tuple(dn.operand_batching_dims) == (0,) and tuple(dn.start_indices_batching_dims) == (0,)
                 and len(ishape) == 3 and ishape[0] == shape[0] and ishape[2] == 1 and tuple(p["slice_sizes"]) == (1, 1))
        if not (rows or along):
            raise self.refuse("a `gather` of a value other than rows `x[idx]` or `take_along_axis` along the last axis", eqn,
                              "gather from a ref (`x_ref[idx]`), which tessel loads by index vectors")
        dt = _ty(x.aval, self.kernel, eqn).split("[")[0]
        v = self.value(x, eqn)
        if rows:
            # As `take_along_axis` of the transpose: columns of `x.T` by one index row.
            t = fresh()
            emit(f"{t} = transpose {v} perm (1, 0) : {dt}[{shape[1]}, {shape[0]}]")
            v, lead, n, m = t, [shape[1]], shape[0], ishape[0]
            ix_shape = [1, m, 1]
        else:
            lead, n, m = [shape[0]], shape[1], ishape[1]
            ix_shape = [shape[0], m, 1]
        ix = self.value(idx, eqn)
        it = _ty(idx.aval, self.kernel, eqn).split("[")[0]
        e = fresh()
        emit(f"{e} = reshape {ix} : {it}[{_dims(ix_shape)}]")
        if it != "i32":
            c = fresh()
            emit(f"{c} = cast {e} : i32[{_dims(ix_shape)}]")
            e = c
        mode = str(p.get("mode", "")).lower()
        if "clip" in mode or "promise" in mode:
            lo, hi = fresh(), fresh()
            emit(f"{lo} = max {e}, 0 : i32[{_dims(ix_shape)}]")
            emit(f"{hi} = min {lo}, {n - 1} : i32[{_dims(ix_shape)}]")
            e = hi
        slot, hit = fresh(), fresh()
        emit(f"{slot} = iota 2 : i32[1, 1, {n}]")
        sh = [ix_shape[0], m, n]
        emit(f"{hit} = eq {e}, {slot} : bool[{_dims(sh)}]")
        work = "i32" if dt == "bool" else dt
        if dt == "bool":
            c = fresh()
            emit(f"{c} = cast {v} : i32[{_dims(lead + [n])}]")
            v = c
        out, _ = self.pick(v, work, hit, lead, m, n)
        if "fill" in mode:
            fill = p.get("fill_value")
            if fill is None:
                fill = {"f32": "nan", "f16": "nan", "bf16": "nan", "i32": "-2147483648", "u32": "4294967295",
                        "i16": "-32768", "u16": "65535", "i8": "-128", "u8": "255"}[work]
            else:
                fill = _literal(fill)
            # Whether any element was hit: no entry outside the axis.
            hits, some, got = fresh(), fresh(), fresh()
            emit(f"{hits} = cast {hit} : i32[{_dims(sh)}]")
            emit(f"{some} = max {hits} axis 2 : i32[{sh[0]}, {m}]")
            emit(f"{got} = ne {some}, 0 : bool[{sh[0]}, {m}]")
            chosen = fresh()
            emit(f"{chosen} = select {got}, {out}, {fill} : {work}[{_dims(lead + [m])}]")
            out = chosen
        if rows:
            t = fresh()
            emit(f"{t} = transpose {out} perm (1, 0) : {work}[{m}, {shape[1]}]")
            out = t
        if dt == "bool":
            c = fresh()
            emit(f"{c} = ne {out}, 0 : {_ty(eqn.outvars[0].aval, self.kernel, eqn)}")
            out = c
        self.define(eqn.outvars[0], out)


# The rules this family gives the writer (`_rules.RULES`): its methods of (writer, equation).
rule("dynamic_slice")(_Order.dynamic_slice)
rule("dynamic_update_slice")(_Order.dynamic_update_slice)
rule("gather")(_Order.value_gather)
