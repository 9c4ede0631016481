"""Type stubs of the Rust extension (`python/src/lib.rs`)."""

from os import PathLike
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

# name -> (dtype name, shape); a dimension of a generic kernel is its expression's text ("N").
Signature = Dict[str, Tuple[str, Tuple[Union[int, str], ...]]]

class RunResult:
    """What a launch did: its outputs, the backend that ran it and why, and its times."""

    @property
    def outputs(self) -> Dict[str, np.ndarray]:
        """Output name -> a fresh numpy array."""
    @property
    def backend(self) -> str:
        """The backend that ran the launch."""
    @property
    def decisions(self) -> List[str]:
        """One line per backend `auto` tried: why it was skipped, or that it was chosen."""
    @property
    def compile_s(self) -> float:
        """Seconds to lower (0 when the compile cache had the launch)."""
    @property
    def run_s(self) -> float:
        """Seconds of the launch: uploads, run, downloads."""
    @property
    def cache_hit(self) -> bool:
        """Whether the backend's compile cache held the launch already."""
    @property
    def params(self) -> Dict[str, int]:
        """The values the kernel's parameters took: from the arrays, `params`, the tuning record
        of the backend named, or the defaults. Empty for a kernel without parameters."""

class Kernel:
    """A kernel: `tessel.load(path)` or `tessel.compile(text)`; call it with numpy arrays by
    argument name. A generic kernel (language §9) takes its shapes from the arrays and the rest
    of its parameters from `params` and its defaults."""

    @property
    def name(self) -> str:
        """The kernel's name."""
    @property
    def text(self) -> str:
        """Its canonical `.tk` text; a generic kernel's keeps its parameters."""
    @property
    def inputs(self) -> Signature:
        """`in` arguments: name -> (dtype name, shape); a generic dimension as its text."""
    @property
    def outputs(self) -> Signature:
        """`out` arguments: name -> (dtype name, shape); a generic dimension as its text."""
    @property
    def params(self) -> Dict[str, Optional[int]]:
        """Parameters (language §9): name -> default, or None where a launch must give it."""
    def __call__(self, *, backend: str = "auto", **arrays: Any) -> Dict[str, np.ndarray]:
        """Runs on `backend` ("auto": the first that takes the launch); returns the outputs."""
    def run(
        self,
        *,
        backend: str = "auto",
        mesh: Optional[str] = None,
        external_meshes: Optional[Sequence[str]] = None,
        grid: Optional[Mapping[str, int]] = None,
        params: Optional[Mapping[str, int]] = None,
        explain: bool = False,
        **arrays: Any,
    ) -> RunResult:
        """Runs and reports where and how; `params` gives values of the kernel's parameters;
        `explain` prints why the backend was chosen."""
    def lower(
        self,
        backend: str = "interpret",
        *,
        mesh: Optional[str] = None,
        external_meshes: Optional[Sequence[str]] = None,
        grid: Optional[Mapping[str, int]] = None,
        params: Optional[Mapping[str, int]] = None,
        plan: bool = False,
    ) -> str:
        """The lowered text (PTX, WGSL, ...) for `backend`, without a device, or with `plan` the
        backend's plan (every decision it made, as `tessel lower --plan` prints it); a generic
        kernel takes `params` and its defaults."""

def backends() -> List[Dict[str, Any]]:
    """Every backend, as `tessel backends --json` lists them."""

def load(path: Union[str, PathLike], kernel: Optional[str] = None) -> Kernel:
    """The kernel of a `.tk` file (`kernel`: which, where the file has several)."""

def compile(text: str, kernel: Optional[str] = None) -> Kernel:
    """The kernel of `.tk` text (`kernel`: which, where the text has several)."""

def check(text: str) -> str:
    """The canonical text of every kernel of `text`, or `KernelError` with every error."""

def load_plugin(path: Union[str, PathLike]) -> None:
    """Loads a backend plugin (a shared library), as the command line's `--plugin` does."""
