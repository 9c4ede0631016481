"""`Kernel.lower(..., plan=True)`: the plan a backend writes its text from, every decision by
name, as `tessel lower --plan` prints it (the plan snapshots of `tests/lowering.rs` cover every
kernel file; this is the Python side). No device."""

from pathlib import Path

import tessel

ROOT = Path(__file__).resolve().parents[2]


def test_lower_with_plan_gives_the_backends_decisions():
    """`plan=True`: the plan the text is written from, as `tessel lower --plan` prints it."""
    k = tessel.load(ROOT / "examples/add.tk")
    plan = k.lower("mosaic-gpu", mesh="mosaic_gpu(i: 8)", plan=True)
    assert plan.startswith("// ---- plan (mosaic-gpu) ----\nkernel add\n  grid: (i: 8)\n"), plan
    assert "  ctas: 8\n" in plan and ".target" not in plan
    wgpu = tessel.load(ROOT / "tests/in/dyn_grid.tk").lower("wgpu", grid={"i": 3}, plan=True)
    assert "  launch grid: (i: 3)\n" in wgpu and "  programs: 3\n" in wgpu, wgpu
