"""The shared test fixtures themselves: `graph_mode` (tests/conftest.py) selects GRAPH mode and a backend for a
marked module and restores what was in force before, also when the module fails."""
import pytest

from conftest import graph_mode_with


def test_graph_mode_sets_then_restores_mode_and_backend():
    import mindspore as ms
    from mindgr.ops.backend import get_backend, set_backend
    mode, backend = ms.get_context("mode"), get_backend()
    try:
        _check_restores(ms, get_backend, set_backend)
    finally:
        ms.set_context(mode=mode)
        set_backend(backend)


def _check_restores(ms, get_backend, set_backend):
    set_backend("reference")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with graph_mode_with("auto") as chosen:
        assert ms.get_context("mode") == ms.GRAPH_MODE
        assert chosen == get_backend() and chosen in ("cpu", "reference")
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and get_backend() == "reference"
    with pytest.raises(ZeroDivisionError):
        with graph_mode_with("reference"):
            1 / 0
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and get_backend() == "reference"
    from mindgr.ops.backend import BackendUnavailable
    with pytest.raises(BackendUnavailable, match="no-such-backend: unknown backend"):
        with graph_mode_with("no-such-backend"):
            pass
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and get_backend() == "reference"


def test_unmarked_modules_are_left_alone(graph_mode):
    assert graph_mode is None
