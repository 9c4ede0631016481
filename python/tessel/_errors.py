"""The exceptions tessel raises. Each carries the message the command line prints: its first
line says what is wrong, the lines after it what would work."""


class TesselError(Exception):
    """Base of every tessel error; also what a panic inside the extension or a plugin becomes."""


class KernelError(TesselError, ValueError):
    """A kernel that does not parse or verify (the message has `line:col`), or a kernel name a
    file does not define."""


class InputError(TesselError, ValueError):
    """Arguments that do not fit the kernel: a missing, unknown or mistyped array, a bad mesh or
    grid size."""


class UnsupportedError(TesselError, NotImplementedError):
    """A backend's refusal of a kernel, mesh or launch, before anything runs. The first line is
    the backend's own sentence (Mosaic GPU's are Pallas's); `.hint` is what would work."""

    def __init__(self, message, backend=None, hint=None):
        super().__init__(message)
        self.backend = backend
        self.hint = hint


class BackendUnavailable(TesselError, RuntimeError):
    """A backend that cannot run on this machine (no driver, no device), or no backend at all
    that takes the launch."""

    def __init__(self, message, backend=None):
        super().__init__(message)
        self.backend = backend
