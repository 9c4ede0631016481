"""The Python module's call overhead: a launch of benches/kernels/tiny.tk on the interpreter from
Python (numpy arrays in and out) against the same launch through `Planned::run` in Rust, whose
median criterion wrote to target/criterion (`cargo bench --bench boundary`, run first by
scripts/bench); and of benches/kernels/add_16m.tk, where copies show: Python (inputs read in
place, the output written once) against `Planned::run` (host arrays copied in and out) and
`Planned::run_in_place` in Rust, and numpy's own `x + y`. Prints markdown table rows."""

import json
import pathlib
import timeit

import numpy as np

import tessel

ROOT = pathlib.Path(__file__).resolve().parents[1]
k = tessel.load(ROOT / "benches/kernels/tiny.tk")
arrays = {n: np.random.default_rng(1).standard_normal(s).astype(np.float32) for n, (_, s) in k.inputs.items()}
k(backend="interpret", **arrays)
runs = 2000
best = min(timeit.repeat(lambda: k(backend="interpret", **arrays), number=runs, repeat=7)) / runs * 1e6


def criterion_us(group, name):
    est = ROOT / f"target/criterion/{group}/{name}/new/estimates.json"
    return json.loads(est.read_text())["median"]["point_estimate"] / 1e3 if est.exists() else float("nan")


rust = criterion_us("launch_tiny_host", "runtime_run_interpret")
print(f"| tiny launch on interpret | {best:.1f} | {rust:.1f} | {best - rust:+.1f} |")

big = tessel.load(ROOT / "benches/kernels/add_16m.tk")
x, y = (np.random.default_rng(s).uniform(-1, 1, 16 << 20).astype(np.float32) for s in (1, 2))
big(x=x, y=y, backend="interpret")
py_ms = min(timeit.repeat(lambda: big(x=x, y=y, backend="interpret"), number=1, repeat=9)) * 1e3
np_ms = min(timeit.repeat(lambda: x + y, number=1, repeat=9)) * 1e3
copies_ms = criterion_us("launch_add16m_host", "runtime_run_interpret") / 1e3
in_place_ms = criterion_us("launch_add16m_host", "runtime_run_in_place_interpret") / 1e3
print(
    f"| add 16M f32 on interpret (ms) | {py_ms:.1f} | {copies_ms:.1f} with copies, {in_place_ms:.1f} in place "
    f"| numpy x + y: {np_ms:.1f} |"
)
