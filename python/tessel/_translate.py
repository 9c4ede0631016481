"""One `pallas_call` (or `pl.kernel`'s `mpmd_map`) as a `.tk` kernel: its grid, the block spec of
every operand (affine, computed or whole), its body (`_Writer`), `input_output_aliases`, meshes."""

from __future__ import annotations

import re
from typing import Any, Dict, List

import numpy as np

from ._common import _dims, _refuse, _ty, _scratch, Translated
from ._index_maps import _MAX_AXIS, _affine, _index_texts
from ._jax_support import _jax
from ._writer import _Writer


def _translate(eqn, name: str) -> Translated:
    if eqn.primitive.name == "mpmd_map":
        return _translate_mesh(eqn, name)
    jax, core, _ = _jax()
    p = eqn.params
    gm = p["grid_mapping"]
    if p.get("mesh") is not None:
        raise _refuse("a `pallas_call` with a mesh", name, eqn)
    # A dynamic grid bound (megablox's count of active tiles) is an operand before all others:
    # a scalar input `g{k}` whose value sizes the axis, `dyn(g{k})`. Proofs about index maps
    # take such an axis as too large to check point by point.
    dynamic = [a for a, g in enumerate(gm.grid) if type(g).__name__ == "DynamicGridDim"]
    ndyn = len(dynamic)
    grid = [_MAX_AXIS if a in dynamic else int(g) for a, g in enumerate(gm.grid)]
    if 0 in grid:
        raise _refuse(
            f"the grid {tuple(grid)}, which has no program,",
            name,
            eqn,
            "tessel's grid axes have sizes from 1; under tp.run or tp.install a pallas_call with an empty grid runs no "
            "program, as in Pallas, and its outputs are zeros (or the inputs they alias)",
        )
    body = p["jaxpr"]
    # Scalar-prefetch operands come first (`PrefetchScalarGridSpec`): whole inputs the body reads.
    nscalar = getattr(gm, "num_index_operands", 0)
    nin, nout = nscalar + gm.num_inputs, gm.num_outputs
    ins = [f"x{i}" for i in range(nin)]
    outs = [f"o{i}" for i in range(nout)]
    bounds = [f"g{k}" for k in range(ndyn)]
    header = []
    #: per output with an affine index map, the grid axes its block moves along
    per_output: List[set] = []
    squeezed: Dict[str, List[int]] = {}
    operands = eqn.invars[ndyn:]
    lines_in = [f"  in  {arg}: {_ty(v.aval, name, eqn)}" for arg, v in zip(bounds + ins, eqn.invars[: ndyn + nscalar])]
    lines_out = []
    #: operand -> (its block spec's text, its index map, its array shape, its block shape)
    specs: Dict[str, Any] = {}
    #: operands whose index map the body computes -> (the index map, the block shape)
    computed: Dict[str, Any] = {}
    #: operands with a computed block index in the header
    indexed = set()
    #: the scalar-prefetch operands a computed block index can read (integer arrays)
    tables = [
        arg if np.dtype(v.aval.dtype) in (np.dtype(np.int32), np.dtype(np.uint32)) else None
        for arg, v in zip(ins, operands[:nscalar])
    ]
    for n, (bm, arg) in enumerate(zip(gm.block_mappings, ins[nscalar:] + outs)):
        shape = tuple(bm.array_aval.shape)
        blocks = []
        for d, b in enumerate(bm.block_shape):
            if b is None or type(b).__name__ == "Squeezed":
                squeezed.setdefault(arg, []).append(d)
                blocks.append(1)
                continue
            size = getattr(b, "block_size", b)
            if not isinstance(size, (int, np.integer)) or type(b).__name__ not in ("Blocked", "int"):
                raise _refuse(f"the block dimension {b!r} of `{arg}`", name, eqn, "tessel blocks are Blocked(size) or squeezed")
            blocks.append(int(size))
        ty = _ty(bm.array_aval, name, eqn)
        affine = _affine(bm.index_map_jaxpr, grid, name, f"`{arg}`", nscalar)
        is_out = n >= gm.num_inputs
        if affine is None:
            texts = _index_texts(bm.index_map_jaxpr, grid, tables)
            if texts is not None:
                # A computed block index (docs/language.md §2), clamped as Pallas clamps.
                indexed.add(arg)
                if is_out:
                    # Its block still moves along an axis that is a dimension's whole index,
                    # where the axis has no more points than the dimension has blocks (no clamp
                    # then): megablox's column tiles (`at (x2[i1], i0)`).
                    per_output.append({
                        a for a in range(len(grid)) for d, t in enumerate(texts)
                        if t == f"i{a}" and a not in dynamic and grid[a] <= -(-shape[d] // blocks[d])
                    })
                spec = f" block [{', '.join(str(b) for b in blocks)}] at ({', '.join(texts)})"
                specs[arg] = (spec, None, shape, blocks)
                (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}{spec}")
                continue
            # The whole array, each access at the block the body computes.
            computed[arg] = (bm.index_map_jaxpr, blocks)
            specs[arg] = ("computed", None, shape, blocks)
            (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}")
            continue
        index = affine.text()
        if is_out:
            per_output.append({a for a in range(len(grid)) if any(f"i{a}" in t.replace("*", " ").split() for t in index)})
        whole = tuple(blocks) == shape and all(t == "0" for t in index)
        spec = "" if whole else f" block [{', '.join(str(b) for b in blocks)}] at ({', '.join(index)})"
        specs[arg] = (spec, affine, shape, blocks)
        (lines_out if is_out else lines_in).append(f"  {'out' if is_out else 'in '} {arg}: {ty}{spec}")
    # An axis runs in parallel only where every output's block moves along it: two programs apart
    # on another axis would write one block (an output with a constant index map is a TPU
    # kernel's scratch kept across the grid, as splash attention keeps its running max), and
    # Pallas runs them in order.
    used_by_outputs = set.intersection(*per_output) if per_output and len(per_output) == nout else set()
    if any(o in computed for o in outs):
        # Programs whose output blocks computed in the body may coincide run in order, as
        # Pallas runs them (with a computed block index in the header, the axes `per_output`
        # holds for it still run apart).
        used_by_outputs = set()
    jaxpr = body.jaxpr if hasattr(body, "jaxpr") else body
    # Scalar-prefetch operands the body writes (TPU kernels keep state there, as paged attention
    # keeps its buffer index).
    written_scalars = [k for k, var in enumerate(jaxpr.invars[:nscalar]) if _stored(jaxpr, var)]
    if _copies_by_dma(body) or written_scalars:
        # A TPU kernel copying by DMA may prefetch into its scratch for the next grid step, and
        # one writing its scalar-prefetch operands carries state from step to step: its steps
        # run in order (Pallas TPU's "arbitrary"), those declared "parallel" apart.
        used_by_outputs &= _declared_parallel(p)
    if grid:
        sizes = [f"dyn(g{dynamic.index(a)})" if a in dynamic else str(s) for a, s in enumerate(grid)]
        axes = ", ".join(f"i{a}: {s}{'' if a in used_by_outputs else ' seq'}" for a, s in enumerate(sizes))
        header.append(f"  grid ({axes})")
    # `scratch_shapes`: per-program memory that persists across the `seq` steps, as tessel's
    # `scratch` does.
    scratch = [f"s{i}" for i in range(getattr(gm, "num_scratch_operands", 0))]
    lines_scratch = [line for line in (_scratch(arg, aval, name, eqn) for arg, aval in zip(scratch, gm.scratch_avals)) if line]

    def written(refs: List[str]) -> "_Writer":
        w = _Writer(name, [f"i{a}" for a in range(len(grid))])
        vmapped = set(getattr(gm, "vmapped_dims", ()) or ())
        w.body_axes = [f"i{a}" for a in range(len(grid)) if a not in vmapped]
        w.squeezed = squeezed
        for var, arg in zip(jaxpr.invars, refs):
            w.env[var] = ("ref", arg)
        if computed:
            w.computed_blocks(computed, ins[:nscalar])
        w.eqns(jaxpr)
        return w

    refs = ins + outs + scratch
    # A written scalar-prefetch operand: a scratch copy, taken at the program's first step, which
    # the body reads and writes instead.
    for k in written_scalars:
        refs[k] = f"w{k}"
        lines_scratch.append(f"  scratch w{k}: {_ty(jaxpr.invars[k].aval, name, eqn)}")
    firsts = [(k, refs[k]) for k in written_scalars]
    seq_axes = [a for a in range(len(grid)) if a not in used_by_outputs]

    def finished(refs: List[str]) -> "_Writer":
        w = written(refs)
        if firsts:
            w.body.lines[:0] = _first_step_copies(firsts, ins, seq_axes, jaxpr, name, eqn)
        return w

    w = finished(refs)
    padded = [o for o in outs if _padded_readback(o, specs, w.body.lines)]
    aliased = {outs[o] for _, o in p.get("input_output_aliases") or ()}
    for o in padded:
        # Pallas on TPU keeps an output's whole block in VMEM, where the kernel reads back what
        # it stored past the array (JAX's TPU paged attention keeps its running max and sum so,
        # in a block of the head dimension's width over an array of width 1). A scratch block
        # stands in for the VMEM one: every store goes to it and to the output (whose elements
        # past the array are dropped), every load reads it. Scratch lives as long as a program,
        # as a block does while the programs' steps keep its index.
        other = [line for line in w.body.lines if re.search(rf"\b{o}\b", line) and not re.match(rf"^\s*(store {o}\b|%.* = load {o}\b)", line)]
        if specs[o][0] == "computed" or o in aliased or other:
            raise _refuse(
                f"reading back the output `{o}`, whose block is larger than the array,", name, eqn,
                "tessel reads a padded output block back only where its index map is in the block spec, it aliases no input, "
                "and the kernel only loads and stores it",
            )
        dtype = _ty(gm.block_mappings[gm.num_inputs + outs.index(o)].array_aval, name, eqn).split("[")[0]
        lines_scratch.append(f"  scratch v{o}: {dtype}[{_dims(specs[o][3])}]")
    # `input_output_aliases`: an input and an output of one buffer in Pallas. Where separate
    # arrays give the same results they stay so; elsewhere the output starts from the input's
    # buffer (XLA aliases them; the handler keeps its contents), and every load of the input is a
    # load of the output where none could come after a store to it; where one could, the input
    # stays an input too, which XLA copies (`_alias_kept`).
    kept, copied = [], []
    for i, o in p.get("input_output_aliases") or ():
        x, out = ins[i], outs[o]
        same = x in specs and out in specs and specs[x][0] == specs[out][0] and specs[x][3] == specs[out][3]
        same = same and squeezed.get(x) == squeezed.get(out)
        # Two computed index maps print alike ("computed"): their equations must agree too.
        if same and x in computed:
            same = out in computed and str(computed[x][0]) == str(computed[out][0])
        if not same:
            raise _refuse(
                f"`input_output_aliases` pairing `{x}` with `{out}`", name, eqn,
                "tessel takes an alias whose input and output have the same block spec",
            )
        how = _alias_kept(x, out, specs, grid, used_by_outputs, w.body.lines)
        if how:
            kept.append((i, o))
        if how == "copied":
            copied.append(i)
    if len(kept) > len(copied):
        for i, o in kept:
            if i not in copied:
                refs[i] = outs[o]
        w = finished(refs)
        gone = {ins[i] for i, _ in kept if i not in copied}
        lines_in = [line for line in lines_in if line.split(":")[0].split()[-1] not in gone]
    body_lines = [_padded_line(line, padded) for stmt in w.body.lines for line in _padded_stores(stmt, padded)]
    text = "\n".join([f"kernel {name}"] + header + lines_in + lines_out + lines_scratch + w.scoped + ["{"] + body_lines + ["}"]) + "\n"
    return Translated(name, text, bounds + ins, outs, kept=[(len(bounds) + i, o) for i, o in kept],
                      copied=[len(bounds) + i for i in copied])


def _padded_readback(o: str, specs, lines: List[str]) -> bool:
    """Whether output `o` has a block larger than its array along some dimension and the kernel
    loads it back."""
    _, _, shape, blocks = specs.get(o, (None, None, None, None))
    past = any(b > n for b, n in zip(blocks or (), shape or ()))
    return past and any(re.search(rf"= load {o}\b", line) for line in lines)


def _padded_stores(line: str, padded: List[str]) -> List[str]:
    """A store into a padded output (`_padded_readback`) as two: into its scratch block, then
    into the output; any other line as it is."""
    m = re.match(r"^(\s*store )(\w+)\b(.*)$", line)
    if m and m.group(2) in padded:
        return [f"{m.group(1)}v{m.group(2)}{m.group(3)}", line]
    return [line]


def _padded_line(line: str, padded: List[str]) -> str:
    """A load of a padded output (`_padded_readback`) reads its scratch block."""
    m = re.match(r"^(.* = load )(\w+)\b(.*)$", line)
    if m and m.group(2) in padded:
        return f"{m.group(1)}v{m.group(2)}{m.group(3)}"
    return line


def _alias_kept(x: str, o: str, specs, grid, parallel, lines: List[str]):
    """How `input_output_aliases` pairing input `x` with output `o` (of one block spec) runs:
    Pallas reads `x` as it was when the call began and `o` starts as `x`'s values. Where the
    kernel overwrites `o` whole (every element stored unmasked at the body's top level, affine
    blocks covering the array), separate arrays give that (False). Elsewhere `o` starts from
    `x`'s buffer, which XLA aliases to it: loads of `x` read `o` (True) where no read of `x` could
    see what the kernel stored into `o`; where one could (a read after a store, in a loop or
    across `seq` steps: megablox's `existing_out`, read at a tile's first visit only), `x` stays
    an input of its own, a copy XLA makes ("copied")."""
    _, affine, shape, blocks = specs[o]
    whole_store = re.compile(rf"^  store {o}, %\S+$")
    whole = any(whole_store.match(line) for line in lines) and affine is not None and specs[x][1] is not None
    # A load of the output (`o_ref[...] += 1`) reads the input's values in Pallas: kept too.
    whole = whole and not any(re.search(rf"= load {o}\b", line) for line in lines)
    if whole and affine.covers(grid, shape, blocks):
        return False
    stores = [n for n, line in enumerate(lines) if re.match(rf"^\s*store {o}\b", line)]
    read = [n for n, line in enumerate(lines) if re.search(rf"= load {x}\b", line)]
    revisits = any(size > 1 and a not in parallel for a, size in enumerate(grid))
    # The `for` loops of the body, as line ranges: a store in one, then a read in the next turn.
    loops, open_ = [], []
    for n, line in enumerate(lines):
        # `} else {` closes an `if`'s first branch and opens its second.
        if line.strip().startswith("}") and open_:
            start, is_for = open_.pop()
            if is_for:
                loops.append(range(start, n + 1))
        if line.rstrip().endswith("{"):
            open_.append((n, re.search(r"\bfor %", line) is not None))
    looped = any(any(n in r for n in stores) and any(n in r for n in read) for r in loops)
    if stores and (any(n > stores[0] for n in read) or (read and revisits) or looped):
        return "copied"
    return True


def _mesh(mesh, kernel: str, eqn, kind: str = "mesh"):
    """A Pallas mesh as tessel's mesh text and its axis names: a Mosaic GPU mesh (`plgpu.Mesh`)
    as `mosaic_gpu(...)` with its cluster and thread axes, a device mesh (`jax.sharding.Mesh`)
    as `device(...)`, and any other (a TPU core mesh, ...) as the portable `grid(...)` of its
    named axes."""
    cls = type(mesh).__name__
    module = type(mesh).__module__
    if cls == "Mesh" and "mosaic_gpu" in module:
        names = list(mesh.grid_names or [f"i{a}" for a in range(len(mesh.grid))])
        axes = [(n, s, "") for n, s in zip(names, mesh.grid)]
        axes += [(n, s, " cluster") for n, s in zip(mesh.cluster_names or (), mesh.cluster or ())]
        if mesh.num_threads is not None:
            axes.append((mesh.thread_name, mesh.num_threads, " thread"))
        kind_text = "mosaic_gpu"
    else:
        shape = getattr(mesh, "shape", None)
        if not hasattr(shape, "items"):
            raise _refuse(f"the {kind} {mesh!r}", kernel, eqn, "tessel reads a mesh's named axes (its `shape`)")
        axes = [(n, s, "") for n, s in shape.items()]
        kind_text = "device" if "jax._src.mesh" in module or cls == "AbstractMesh" else "grid"
    text = f"{kind_text}({', '.join(f'{n}: {s}{k}' for n, s, k in axes)})"
    return text, [n for n, _, _ in axes]


def _mesh_roles(mesh) -> List:
    """A Mosaic GPU mesh's axes in `_mesh`'s order: (name, size, "", "cluster" or "thread")."""
    names = list(mesh.grid_names or [f"i{a}" for a in range(len(mesh.grid))])
    axes = [(n, s, "") for n, s in zip(names, mesh.grid)]
    axes += [(n, s, "cluster") for n, s in zip(mesh.cluster_names or (), mesh.cluster or ())]
    return axes + [(mesh.thread_name, mesh.num_threads, "thread")]


def _translate_mesh(eqn, name: str) -> Translated:
    """`pl.kernel(body, mesh=...)` (`mpmd_map` with one mesh): the body runs once per point of
    the mesh on whole arrays, each `jax.lax.axis_index` a `program_id` of the mesh's axis; the
    mesh and the external meshes go to the launch, where each backend takes or refuses them."""
    _, core, _ = _jax()
    p = eqn.params
    if len(p["jaxprs"]) != 1:
        raise _refuse("`mpmd_map` of several mesh/function pairs", name, eqn, "pass one body and one mesh to pl.kernel")
    if p.get("input_output_aliases"):
        raise _refuse("`input_output_aliases` of a kernel on a mesh", name, eqn, "pass the refs' values and return new outputs")
    (closed,), (mesh,) = p["jaxprs"], p["meshes"]
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    mesh_text, axes = _mesh(mesh, name, eqn)
    external = [_mesh(m, name, eqn, "external mesh")[0] for m in p.get("external_meshes") or ()]
    nin, nout = len(eqn.invars), len(p["out_avals"])
    ins = [f"x{i}" for i in range(nin)]
    outs = [f"o{i}" for i in range(nout)]
    scratch = [f"s{i}" for i in range(len(jaxpr.invars) - nin - nout)]
    lines = [f"  in  {a}: {_ty(v.aval, name, eqn)}" for a, v in zip(ins, eqn.invars)]
    # A 0-d output is an array of one element (tessel's outputs are arrays): a store of a 0-d
    # value fills it, and XLA's buffer of one element is the same bytes.
    lines += [f"  out {a}: {_ty(v, name, eqn)}{'[1]' if not v.shape else ''}" for a, v in zip(outs, p["out_avals"])]
    lines += [_scratch(a, var.aval, name, eqn) for a, var in zip(scratch, jaxpr.invars[nin + nout:])]
    w = _Writer(name, axes)
    threads = getattr(mesh, "num_threads", None) if "mosaic_gpu" in type(mesh).__module__ else None
    if threads is not None:
        w.mgpu.thread_axis, w.mgpu.threads = mesh.thread_name, int(threads)
    for var, arg in zip(jaxpr.invars, ins + outs + scratch):
        w.env[var] = ("ref", arg)
    w.eqns(jaxpr)
    grid = []
    if w.mgpu.used and threads is not None:
        # The Mosaic GPU model: the mesh's warpgroups are the threads of one program, sharing
        # its scratch and barriers (docs/language.md §10); the other axes are its programs.
        roles = _mesh_roles(mesh)
        axes_text = ", ".join(f"{n}: {s}" + (" thread" if r == "thread" else "") for n, s, r in roles)
        grid = [f"  grid ({axes_text})"]
    text = "\n".join([f"kernel {name}"] + grid + lines + w.scoped + ["{"] + w.body.lines + ["}"]) + "\n"
    return Translated(name, text, ins, outs, mesh_text, external)


def _copies_by_dma(body) -> bool:
    """Whether a kernel body (or a body nested in it) starts a DMA (`pltpu.make_async_copy`)."""
    from jax._src import core as jcore

    def walk(jaxpr) -> bool:
        return any(e.primitive.name == "dma_start" for e in jaxpr.eqns) or any(walk(j) for j in jcore.subjaxprs(jaxpr))

    return walk(body.jaxpr if hasattr(body, "jaxpr") else body)


def _declared_parallel(p) -> set:
    """The grid axes a TPU kernel's compiler parameters declare "parallel"."""
    params = p.get("compiler_params") or {}
    found = set()
    for c in (params.values() if isinstance(params, dict) else [params]):
        for a, kind in enumerate(getattr(c, "dimension_semantics", None) or ()):
            if str(kind).lower().endswith("parallel"):
                found.add(a)
    return found


def _stored(jaxpr, var) -> bool:
    """Whether the body (or a body nested in it) stores into the ref `var`. A nested body's
    inputs are matched to its equation's operands from the end (`cond`'s branches after the
    index, a loop body's constants and carry, a call's arguments), a `run_scoped` body's
    captured constants to its operands."""
    from jax._src import core as jcore

    def walk(j, refs) -> bool:
        for e in j.eqns:
            held = [k for k, a in enumerate(e.invars) if not isinstance(a, jcore.Literal) and a in refs]
            if e.primitive.name in ("swap", "masked_swap") and 0 in held:
                return True
            if not held:
                continue
            for sub in jcore.jaxprs_in_params(e.params):
                inner = set()
                if sub.constvars and len(sub.constvars) == len(e.invars):
                    inner |= {sub.constvars[k] for k in held}
                back = len(e.invars) - len(sub.invars)
                inner |= {sub.invars[k - back] for k in held if 0 <= k - back < len(sub.invars)}
                if inner and walk(sub, inner):
                    return True
        return False

    return walk(jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr, {var})


def _first_step_copies(firsts, ins, seq_axes, jaxpr, name, eqn) -> List[str]:
    """Lines that copy each written scalar-prefetch operand into its scratch at the program's
    first step (every `seq` axis at 0)."""
    lines, cond = [], None
    for a in seq_axes:
        lines += [f"  %first_p{a} = program_id i{a}", f"  %first_c{a} = eq %first_p{a}, 0"]
        if cond is None:
            cond = f"%first_c{a}"
        else:
            lines.append(f"  %first_and{a} = and {cond}, %first_c{a}")
            cond = f"%first_and{a}"
    body = []
    for k, copy in firsts:
        body += [f"%first_v{k} = load {ins[k]} : {_ty(jaxpr.invars[k].aval, name, eqn)}", f"store {copy}, %first_v{k}"]
    if cond is None:
        return lines + [f"  {b}" for b in body]
    return lines + [f"  when {cond} {{"] + [f"    {b}" for b in body] + ["  }"]

