"""tessel: block-level GPU kernels written once — a grid, blocks of arrays chosen by index maps,
meshes — and run on whatever the machine has: an NVIDIA Hopper GPU (Mosaic GPU), any GPU (wgpu),
or the CPU (the reference interpreter).

    import numpy as np, tessel
    k = tessel.load("examples/add.tk")
    out = k(x=np.ones(4096, np.float32), y=np.ones(4096, np.float32))   # {"o": array}
"""

import os as _os
import tempfile as _tempfile

# On a machine without a desktop session, Mesa's drivers (the software adapter wgpu finds there)
# print "error: XDG_RUNTIME_DIR is invalid or not set" at start although nothing is wrong; the
# command line quiets it the same way. Nothing here opens a window.
if not _os.environ.get("XDG_RUNTIME_DIR"):
    _os.environ["XDG_RUNTIME_DIR"] = _tempfile.gettempdir()

from ._errors import BackendUnavailable, InputError, KernelError, TesselError, UnsupportedError  # noqa: E402
from ._tessel import Kernel, RunResult, __version__, backends, check, compile, load, load_plugin  # noqa: E402



def __getattr__(name):
    # `tessel.jax` and `tessel.pallas` import jax (a second or more): only when first used.
    if name in ("jax", "pallas"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendUnavailable",
    "InputError",
    "Kernel",
    "KernelError",
    "RunResult",
    "TesselError",
    "UnsupportedError",
    "__version__",
    "backends",
    "check",
    "compile",
    "load",
    "load_plugin",
]
