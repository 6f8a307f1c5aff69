"""Shared test fixtures: where the real data lives, a tiny synthetic run config, GRAPH mode with a chosen ops
backend for a test module; and the test order."""
import contextlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("MINDGR_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture
def tiny_overrides(tmp_path):
    """A synthetic HSTU small enough to compile and train in seconds."""
    return [f"run.out_dir={tmp_path}", "run.name=tiny", "run.log_every=2",
            "data.kind=synthetic", "data.max_len=20", "data.synthetic.num_users=120",
            "data.synthetic.num_items=60", "data.synthetic.median_len=10", "data.synthetic.max_len=20",
            "model.dim=16", "model.num_blocks=1", "model.num_heads=2", "loss.num_negatives=8",
            "train.batch_size=16", "train.epochs=2", "eval.every_epochs=1", "ops.backend=reference"]


@contextlib.contextmanager
def graph_mode_with(backend: str):
    """GRAPH mode on this process's device with `backend` selected (reference, cpu: the C++ kernels, an error
    if they cannot be built, or auto: the kernels where they build, else the reference); yields the backend's
    name. The mode and the backend in force before are restored on the way out, an error included."""
    import mindspore as ms
    from mindgr.ops.backend import get_backend, set_backend
    from mindgr.runtime import select_device
    mode, previous = ms.get_context("mode"), get_backend()
    select_device()   # GRAPH mode; the device is set once per process (set_device fails after kernels ran)
    try:
        yield set_backend(backend)
    finally:
        ms.set_context(mode=mode)
        set_backend(previous)


@pytest.fixture(scope="module", autouse=True)
def graph_mode(request):
    """`graph_mode_with(BACKEND)` around a test module marked `pytestmark = pytest.mark.graph_mode(BACKEND)`
    (auto is for tests of logic above the ops, whose graphs compile faster on the kernels). Unmarked modules
    are left alone (this yields None for them); a marked module gets the backend's name. The mark is read per
    module: it goes in `pytestmark`, not on a single test."""
    mark = request.node.get_closest_marker("graph_mode")
    if mark is None:
        yield None
        return
    with graph_mode_with(mark.args[0] if mark.args else "reference") as backend:
        yield backend


def pytest_collection_modifyitems(session, config, items):
    """Files holding `slow` tests (msrun jobs, kernel rebuilds, long runs) run first, each file's tests in
    their own order: with `-n 2 --dist loadfile` (README's test command) the longest files then start
    early and the two workers finish together instead of one waiting on a late msrun file."""
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
