"""Which implementation the jagged ops dispatch to. Read at graph-compile time, so set it before
building a model (the trainer does it from config `ops.backend`)."""
from __future__ import annotations

BACKENDS = ("reference", "cpu", "ascend")
_current = "reference"
_cpu = None     # the mindgr.ops.cpu module once selected: graph code cannot run import statements
_ascend = None  # likewise mindgr.ops.ascend


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says why and what to choose instead."""


def _available(name: str) -> str | None:
    """None if `name` can run here, else the reason it cannot."""
    if name == "reference":
        return None
    if name == "cpu":
        try:
            from mindgr.ops import cpu  # builds/loads the C++ kernels on first use
        except ImportError:
            cpu = None
        if not hasattr(cpu, "unavailable_reason"):
            return "the C++ kernels are not part of this installation"
        return cpu.unavailable_reason()
    if name == "ascend":
        from mindgr.ops import ascend  # imports nothing Ascend-only until used
        return ascend.unavailable_reason()
    return f"unknown backend (expected one of {', '.join(BACKENDS)})"


def resolve_backend(name: str) -> str:
    """Map a config value (auto|reference|cpu|ascend) to a backend that runs here, or raise."""
    if name == "auto":
        import mindspore as ms
        if ms.get_context("device_target") == "Ascend":
            return "ascend" if _available("ascend") is None else "reference"
        return "cpu" if _available("cpu") is None else "reference"
    reason = _available(name)
    if reason is not None:
        raise BackendUnavailable(f"ops.backend = {name}: {reason}; use ops.backend=reference")
    return name


def set_backend(name: str) -> str:
    global _current, _cpu, _ascend
    _current = resolve_backend(name)
    if _current == "cpu":
        from mindgr.ops import cpu
        _cpu = cpu
    if _current == "ascend":
        from mindgr.ops import ascend
        _ascend = ascend
    return _current


def get_backend() -> str:
    return _current
