"""Rules for Pallas's Mosaic GPU model (`plgpu.kernel`, `jax.experimental.pallas.mosaic_gpu`):
shared memory, barriers, asynchronous copies between global and shared memory, `wgmma` into
accumulators, and the waits between them, as the statements of docs/language.md §10.

- `pl.run_scoped` allocations: `plgpu.SMEM` is a `scratch` of the shape the kernel indexes (the
  allocation seen through its tiling and swizzle transforms, which only lay it out); `plgpu.Barrier`
  a `barrier` line; `plgpu.ACC` (a warpgroup's registers) a scratch with one accumulator per
  thread, indexed by the thread's `program_id`, zeroed where the scope begins.
- `copy_gmem_to_smem` is `copy_async ... arrive B[k]`; `copy_smem_to_gmem` a `copy_async` joining
  the thread's group (and `commit_copies` where it commits); `barrier_wait`/`barrier_arrive` are
  `wait`/`arrive`; `wgmma` is `mma_async` (a transposed operand read with `trans_a`/`trans_b`, a
  left operand in registers as a value),
  `wgmma_wait` `mma_wait`, and reading an accumulator `mma_wait` (its `wait_n`) then `load`;
  `commit_smem` is `fence`, `wait_smem_to_gmem` `wait_copies`; `set_max_registers` is
  `max_registers`, a hint that changes no result.
- A kernel that uses any of them on a mesh with `num_threads` declares its grid with the thread
  axis (`wg: 3 thread`), so its warpgroups share their scratch and barriers as Mosaic GPU's do.
"""

from __future__ import annotations

import re

from typing import Dict, List, Optional, Tuple

from ._common import _dims, _ty
from ._jax_support import _jax
from ._rules import rule


class MosaicState:
    """What a kernel body of the Mosaic GPU model has made so far (the `_Writer`'s `mgpu`)."""

    def __init__(self) -> None:
        #: Whether the body uses the model (its kernel then declares its thread axis).
        self.used = False
        #: Scratch made for an allocation -> the shape the kernel indexes.
        self.logical: Dict[str, Tuple[int, ...]] = {}
        #: Scratch with one part per thread (an accumulator) -> that thread's index (a `%value`).
        self.per_thread: Dict[str, str] = {}
        #: Barrier arrays made -> how many barriers.
        self.barriers: Dict[str, int] = {}
        #: The mesh's thread axis and its size, where it has one.
        self.thread_axis: Optional[str] = None
        self.threads = 1


def _kind(aval) -> str:
    """`smem`, `regs`, `gmem`, `barrier`, `cluster barrier` for a Mosaic GPU `run_scoped`
    allocation's aval, "" for any other (Pallas TPU's SMEM among them)."""
    inner = getattr(aval, "inner_aval", None)
    dtype = type(getattr(inner, "dtype", None)).__name__
    if dtype == "BarrierType":
        return "barrier"
    if dtype == "ClusterBarrierType":
        return "cluster barrier"
    space = getattr(aval, "memory_space", None)
    if "mosaic_gpu" not in type(space).__module__:
        return ""
    return str(space) if str(space) in ("smem", "regs", "gmem") else ""


def is_mosaic_scope(eqn) -> bool:
    """Whether a `run_scoped` allocates Mosaic GPU memory (or names a collective axis)."""
    jaxpr = eqn.params["jaxpr"]
    return bool(eqn.params.get("collective_axes")) or any(_kind(v.aval) for v in jaxpr.invars)


@rule("run_scoped")
def _run_scoped(w, eqn) -> None:
    """`pl.run_scoped`: of Mosaic GPU memory, [`mosaic_run_scoped`]; else as Pallas TPU's and
    Triton's scratch (`_Control.run_scoped`)."""
    if is_mosaic_scope(eqn):
        mosaic_run_scoped(w, eqn)
    else:
        w.run_scoped(eqn)


def mosaic_run_scoped(w, eqn) -> None:
    """A `pl.run_scoped` of Mosaic GPU memory: each allocation made (see the module), then the
    scope's body inline."""
    _, core, _ = _jax()
    m: MosaicState = w.mgpu
    m.used = True
    jaxpr = eqn.params["jaxpr"]
    transforms = eqn.params.get("ref_transforms") or ((),) * len(jaxpr.invars)
    shared = m.thread_axis is None or m.thread_axis in (eqn.params.get("collective_axes") or ())
    for var, a in zip(jaxpr.constvars, eqn.invars):
        w.env[var] = w.read(a) if isinstance(a, core.Literal) else w.env[a]
    for var, ts in zip(jaxpr.invars, transforms):
        kind = _kind(var.aval)
        inner = var.aval.inner_aval
        name = f"r{len(w.scoped)}"
        if kind == "cluster barrier":
            raise w.refuse("a `plgpu.ClusterBarrier` (arrivals from the blocks of a cluster)", eqn,
                           "tessel runs a cluster's blocks as separate programs: use a `plgpu.Barrier` within a block")
        if kind == "barrier":
            if not shared:
                raise w.refuse("a barrier allocated per warpgroup (`run_scoped` without `collective_axes`)", eqn,
                               "allocate barriers for every warpgroup: `collective_axes` naming the thread axis")
            arrivals = int(getattr(inner.dtype, "num_arrivals", 1))
            count = int(inner.shape[0]) if inner.shape else 1
            w.scoped.append(f"  barrier {name}[{count}] arrivals {arrivals}")
            m.barriers[name] = count
        else:
            ty = inner
            for t in ts or ():
                ty = t.transform_type(ty)
            name = allocate(w, eqn, ty, kind == "regs" or not shared)
            if kind == "regs":
                # An accumulator starts as zeros each time its scope begins.
                zeros = w.body.let("zeros", _ty(ty, w.kernel, eqn))
                w.body.emit(f"store {name}{_prefixed(m, name, '')}, {zeros}")
        w.env[var] = ("ref", name)
    w.eqns(jaxpr)
    w.results(eqn, jaxpr)


def allocate(w, eqn, aval, per_thread: bool) -> str:
    """A scratch of `aval`'s type that the kernel indexes as `aval`: with one part per thread
    where `per_thread` (and the mesh has several), a scalar as one element."""
    m: MosaicState = w.mgpu
    name = f"r{len(w.scoped)}"
    shape = tuple(int(d) for d in aval.shape)
    dtype = _ty(aval, w.kernel, eqn).split("[")[0]
    lead = (m.threads,) if per_thread and m.thread_axis is not None and m.threads > 1 else ()
    if lead or not shape:
        lead = lead or (1,)
        m.per_thread[name] = w.body.let(f"program_id {m.thread_axis}", "i32") if lead != (1,) else "0"
    w.scoped.append(f"  scratch {name}: {dtype}[{_dims(lead + shape)}]")
    m.logical[name] = shape
    return name


def _prefixed(m: MosaicState, name: str, index: str) -> str:
    """`index` (`[...]` or "" for the whole view) of a per-thread scratch (or a scalar's), with
    the thread's part first."""
    tid = m.per_thread.get(name)
    if tid is None:
        return index
    inner = index[1:-1] if index else ", ".join(":" for _ in m.logical[name])
    return f"[{tid}, {inner}]" if inner else f"[{tid}]"


def region(w, eqn, ref, transforms) -> Tuple[str, Tuple[int, ...], bool]:
    """The `.tk` region a Mosaic GPU ref access names (`s[%k, :, :]`), the shape it selects, and
    whether its view is transposed (`plgpu.transpose_ref`): the layout transforms (tiling,
    swizzle) are dropped, the indexers composed on the shape the kernel indexes."""
    from jax._src.state import indexing

    name = w.ref(ref, eqn)
    m: MosaicState = w.mgpu
    shape = m.logical.get(name, tuple(int(d) for d in ref.aval.shape))
    indexers: List = []
    transposed = False
    for t in transforms or ():
        cls = type(t).__name__
        if cls in ("UnswizzleRef", "UntilingTransform"):
            continue
        if transposed:
            raise w.refuse("a transposed ref indexed after its transpose", eqn, "index the ref before `plgpu.transpose_ref`")
        if isinstance(t, indexing.NDIndexer):
            indexers.append(t)
        elif cls in ("TransposeRef", "TransposeTransform") and tuple(getattr(t, "permutation", ())) == (1, 0):
            transposed = True
        else:
            raise w.refuse(f"the ref transform {t!r}", eqn, "tessel reads tiling, swizzle, 2-D transposes and indexers of Mosaic GPU refs")
    index = w.chained(eqn, shape, indexers) if indexers else ""
    if index and all(p.strip() == ":" for p in index[1:-1].split(",")):
        index = ""
    selected = _selected(indexers, shape)
    return f"{name}{_prefixed(m, name, index)}", selected, transposed


def _selected(indexers, shape) -> Tuple[int, ...]:
    """The shape a chain of indexers leaves of `shape`."""
    from jax._src.state import indexing

    view = list(shape)
    for nd in indexers:
        view = [ix.size for ix in nd.indices if isinstance(ix, indexing.Slice)]
    return tuple(view)


def is_view(w, ref) -> bool:
    """Whether `ref` is scratch made for a Mosaic GPU allocation (read and written through
    [`region`])."""
    v = w.env.get(ref)
    return isinstance(v, tuple) and (v[1] in w.mgpu.logical)


def _split(eqn, *trees):
    """The unflattened transforms of each operand, from the equation's operands after `skip`."""
    out, at = [], len(eqn.invars) - sum(t.num_leaves if t is not None else 0 for t in trees)
    for t in trees:
        n = t.num_leaves if t is not None else 0
        out.append(t.unflatten(eqn.invars[at:at + n]) if t is not None else ())
        at += n
    return out


def _barrier(w, eqn, ref, transforms) -> str:
    """`b[%k]`: the barrier a barrier ref names."""
    text, shape, _ = region(w, eqn, ref, transforms)
    one = re.fullmatch(r"(\w+)\[ds\((.+), 1\)\]", text)
    if one:
        # A window of one barrier (`barrier.at[2:4].at[1:2]`): that barrier.
        return f"{one.group(1)}[{one.group(2)}]"
    if "[" in text:
        return text
    if shape not in ((1,), ()):
        raise w.refuse("a whole array of barriers", eqn, "name one barrier: `barrier.at[k]`")
    return f"{text}[0]"


def _literal_int(w, eqn, atom, what: str) -> int:
    _, core, _ = _jax()
    if not isinstance(atom, core.Literal):
        raise w.refuse(f"{what} computed at run time", eqn, f"give {what} as a Python integer")
    return int(atom.val)


@rule("copy_gmem_to_smem", effect=True)
def _copy_gmem_to_smem(w, eqn) -> None:
    p = eqn.params
    if p.get("collective_axes"):
        raise w.refuse("a copy multicast over cluster axes (`collective_axes`)", eqn, "copy into each block's shared memory on its own")
    src, dst, bar = eqn.invars[:3]
    st, dt, bt = _split(eqn, p["src_transforms_treedef"], p["dst_transforms_treedef"], p["barrier_transforms_treedef"])
    w.mgpu.used = True
    w.body.emit(f"copy_async {_copied(w, eqn, dst, dt)}, {_copied(w, eqn, src, st)} arrive {_barrier(w, eqn, bar, bt)}")


def _copied(w, eqn, ref, transforms) -> str:
    """The region a copy reads or writes; a transposed view is refused (a copy moves elements
    in the order its view gives them, which `region` does not express)."""
    text, _, transposed = region(w, eqn, ref, transforms)
    if transposed:
        raise w.refuse("a copy through `plgpu.transpose_ref`", eqn, "copy the ref untransposed and transpose where it is read")
    return text


@rule("copy_smem_to_gmem", effect=True)
def _copy_smem_to_gmem(w, eqn) -> None:
    p = eqn.params
    if p.get("reduction_op") is not None:
        raise w.refuse(f"a copy to global memory reducing with {p['reduction_op']}", eqn, "copy, then reduce in the kernel")
    trees = (p["src_transforms_treedef"], p["dst_transforms_treedef"])
    src, dst = eqn.invars[:2]
    leaves = sum(t.num_leaves for t in trees)
    st, dt = (trees[0].unflatten(eqn.invars[2:2 + trees[0].num_leaves]), trees[1].unflatten(eqn.invars[2 + trees[0].num_leaves:2 + leaves]))
    w.mgpu.used = True
    copy = f"copy_async {_copied(w, eqn, dst, dt)}, {_copied(w, eqn, src, st)}"
    if p.get("has_user_predicate"):
        w.body.emit(f"when {w.value(eqn.invars[2 + leaves], eqn)} {{")
        w.body.emit(f"  {copy}")
        w.body.emit("}")
    else:
        w.body.emit(copy)
    if p.get("commit_group", True):
        # Not predicated: every warpgroup's commit makes a group, an empty one where it copied
        # nothing, as Mosaic GPU's does.
        w.body.emit("commit_copies")


@rule("barrier_wait", "barrier_arrive", effect=True)
def _barrier_statement(w, eqn) -> None:
    (tree,) = (eqn.params["transforms_treedef"],)
    (ts,) = _split(eqn, tree)
    w.mgpu.used = True
    stmt = "wait" if eqn.primitive.name == "barrier_wait" else "arrive"
    w.body.emit(f"{stmt} {_barrier(w, eqn, eqn.invars[0], ts)}")


@rule("wgmma_ref", effect=True)
def _wgmma(w, eqn) -> None:
    p = eqn.params
    acc, a, b = eqn.invars[:3]
    ct, at, bt = _split(eqn, p.get("acc_transforms_tree"), p.get("a_transforms_tree"), p.get("b_transforms_tree"))
    acc_dtype = str(acc.aval.dtype)
    if acc_dtype not in ("float32", "int32"):
        raise w.refuse(f"a `wgmma` into a {acc_dtype} accumulator", eqn,
                       "accumulate in float32 (`plgpu.ACC(shape, jnp.float32)`) and cast the result")
    w.mgpu.used = True
    c, _, _ = region(w, eqn, acc, ct)
    _, core, _ = _jax()
    if isinstance(a, core.Literal) or not isinstance(w.env.get(a), tuple):
        # The left operand in registers: a value, read where the product is issued.
        x, ta = w.value(a, eqn), False
    else:
        x, _, ta = region(w, eqn, a, at)
    y, _, tb = region(w, eqn, b, bt)
    flags = (" trans_a" if ta else "") + (" trans_b" if tb else "")
    w.body.emit(f"mma_async {c}, {x}, {y}{flags}")


@rule("wgmma_wait", effect=True)
def _wgmma_wait(w, eqn) -> None:
    w.body.emit(f"mma_wait {_literal_int(w, eqn, eqn.invars[0], 'the count of wgmma groups left pending')}")


@rule("wgmma_accumulator_deref_p")
def _deref(w, eqn) -> None:
    wait = eqn.params.get("wait_n")
    if wait is not None:
        w.body.emit(f"mma_wait {int(wait)}")
    text, _, _ = region(w, eqn, eqn.invars[0], ())
    w.define(eqn.outvars[0], w.body.let(f"load {text}", _ty(eqn.outvars[0].aval, w.kernel, eqn)))


@rule("wgmma_accumulator_store_p", effect=True)
def _acc_store(w, eqn) -> None:
    text, _, _ = region(w, eqn, eqn.invars[0], ())
    w.body.emit(f"store {text}, {w.value(eqn.invars[1], eqn)}")


@rule("wait_smem_to_gmem", effect=True)
def _wait_smem_to_gmem(w, eqn) -> None:
    n = _literal_int(w, eqn, eqn.invars[0], "the count of copy groups left pending")
    w.body.emit(f"wait_copies {n}{' reads' if eqn.params.get('wait_read_only') else ''}")


@rule("commit_group", effect=True)
def _commit_group(w, eqn) -> None:
    w.body.emit("commit_copies")


@rule("commit_smem", effect=True)
def _commit_smem(w, eqn) -> None:
    w.body.emit("fence")


@rule("set_max_registers_p", effect=True)
def _set_max_registers(w, eqn) -> None:
    """`max_registers N increase|decrease`: a hint (Mosaic GPU's `setmaxnreg`) that changes no
    result."""
    n = _literal_int(w, eqn, eqn.invars[0], "the registers a thread")
    w.body.emit(f"max_registers {n} {eqn.params['action']}")


def get(w, eqn) -> None:
    """`s[...]` of Mosaic GPU scratch (through a transposed view: loaded, then transposed)."""
    ts = w.transforms(eqn, eqn.params["tree"], eqn.invars[1:])
    _define_loaded(w, eqn, eqn.invars[0], ts, eqn.outvars[0])


class _Aval:
    """A dtype and a shape, as `_ty` reads an aval."""

    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, shape


def _define_loaded(w, eqn, ref, transforms, out) -> None:
    """`out` as a load of `ref`'s region, transposed where the view is (`plgpu.transpose_ref`)."""
    text, selected, transposed = region(w, eqn, ref, transforms)
    if not transposed:
        w.define(out, w.body.let(f"load {text}", _ty(out.aval, w.kernel, eqn)))
        return
    loaded = w.body.let(f"load {text}", _ty(_Aval(out.aval.dtype, tuple(selected)), w.kernel, eqn))
    w.define(out, w.body.let(f"transpose {loaded} perm (1, 0)", _ty(out.aval, w.kernel, eqn)))


def swap(w, eqn) -> None:
    """`s[...] = v` of Mosaic GPU scratch (and the value before, where the kernel reads it);
    through a transposed view, `v` transposed is stored."""
    ref, val = eqn.invars[:2]
    ts = w.transforms(eqn, eqn.params["tree"], eqn.invars[2:])
    text, selected, transposed = region(w, eqn, ref, ts)
    old = eqn.outvars[0]
    if old in w.uses:
        _define_loaded(w, eqn, ref, ts, old)
    value = w.value(val, eqn)
    if transposed:
        value = w.body.let(f"transpose {value} perm (1, 0)", _ty(_Aval(val.aval.dtype, tuple(selected)), w.kernel, eqn))
    w.body.emit(f"store {text}, {value}")


@rule("layout_cast")
def _layout_cast(w, eqn) -> None:
    """The value itself: a layout in registers changes no element."""
    w.define(eqn.outvars[0], w.read(eqn.invars[0]))


@rule("optimization_barrier")
def _optimization_barrier(w, eqn) -> None:
    """Each value itself: the barrier only stops the compiler moving work across it."""
    for out, a in zip(eqn.outvars, eqn.invars):
        w.env[out] = w.env[a] if isinstance(w.env.get(a), tuple) else w.read(a)


@rule("run_state", effect=True)
def _run_state(w, eqn) -> None:
    """`run_state` (what `emit_pipeline`'s carries discharge to): each of its refs made from its
    initial value (a ref passed in stays that ref), the body inline, and each ref's final value
    read out; an accumulator is waited for first."""
    _, core, _ = _jax()
    jaxpr = eqn.params["jaxpr"]
    jaxpr = jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr
    init = eqn.params.get("is_initialized") or (True,) * len(jaxpr.invars)
    m: MosaicState = w.mgpu
    made = []
    for var, a, given in zip(jaxpr.invars, eqn.invars, init):
        if not isinstance(a, core.Literal) and isinstance(w.env.get(a), tuple):
            w.env[var] = w.env[a]
            made.append(None)
            continue
        kind = _kind(var.aval)
        name = allocate(w, eqn, var.aval.inner_aval, True)
        w.env[var] = ("ref", name)
        if given:
            w.body.emit(f"store {name}{_prefixed(m, name, '')}, {w.value(a, eqn)}")
        made.append((name, kind))
    w.eqns(jaxpr)
    for out, var, mk in zip(eqn.outvars, jaxpr.invars, made):
        if mk is None:
            w.env[out] = w.env[var]
            continue
        name, kind = mk
        if kind == "regs":
            w.body.emit("mma_wait 0")
        w.define(out, w.body.let(f"load {name}{_prefixed(m, name, '')}", _ty(out.aval, w.kernel, eqn)))


@rule("load")
def _load(w, eqn) -> None:
    """`plgpu.load(ref, idx, layout=...)`: a load, in whatever layout."""
    ts = list(eqn.params["tree"].unflatten(eqn.invars[1:]))
    _define_loaded(w, eqn, eqn.invars[0], ts, eqn.outvars[0])


@rule("core_map", effect=True)
def _core_map(w, eqn) -> None:
    """`plgpu.warp_map` (a `core_map` over the warps of a warpgroup): refused by name."""
    raise w.refuse("`plgpu.warp_map` (a `core_map` over the four warps of a warpgroup)", eqn,
                   "tessel's threads are warpgroups: give the kernel `num_threads` warpgroups and branch on `lax.axis_index`")
