"""The Python module's call overhead: a launch of benches/kernels/tiny.tk on the interpreter from
Python (numpy arrays in and out) against the same launch through `Runtime::run` in Rust, whose
median criterion wrote to target/criterion (`cargo bench --bench boundary`, run first by
scripts/bench). Prints one markdown table row."""

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
est = ROOT / "target/criterion/launch_tiny_host/runtime_run_interpret/new/estimates.json"
rust = json.loads(est.read_text())["median"]["point_estimate"] / 1e3 if est.exists() else float("nan")
print(f"| tiny launch on interpret | {best:.1f} | {rust:.1f} | {best - rust:+.1f} |")
