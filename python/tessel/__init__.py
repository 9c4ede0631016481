"""tessel: block-level GPU kernels written once — a grid, blocks of arrays chosen by index maps,
meshes — and run on whatever the machine has: an NVIDIA Hopper GPU (Mosaic GPU), any GPU (wgpu),
or the CPU (the reference interpreter).

    import numpy as np, tessel
    k = tessel.load("examples/add.tk")
    out = k(x=np.ones(4096, np.float32), y=np.ones(4096, np.float32))   # {"o": array}
"""

from ._errors import BackendUnavailable, InputError, KernelError, TesselError, UnsupportedError
from ._tessel import Kernel, RunResult, __version__, backends, check, compile, load, load_plugin

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
