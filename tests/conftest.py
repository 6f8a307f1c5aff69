"""Shared test fixtures: where the real data lives, a tiny synthetic run config, GRAPH mode with a chosen ops
backend for a test module; and the test order.

Two rooms: tests/unit/<package>/ (one mindgr package at a time, in-process, fast: the day-to-day subset) and
tests/system/<package>/ (the program as a user runs it: complete training runs, servers on local ports,
msrun jobs, the `mindgr` command end to end, README's lines; and every test marked `slow`). Pieces several
files share live in *_fixtures.py modules beside this file (tests/ is on sys.path: pytest.ini); test files
never import each other, and their basenames are unique (no __init__.py)."""
import contextlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("MINDGR_DATA_DIR", REPO.parent / "shared" / "data"))


# A synthetic HSTU small enough to compile and train in seconds (run.out_dir added by tiny_overrides). On the
# C++ kernels where they build: their graphs compile about twice as fast as the padded reference's (the
# suite's time); tests of the reference itself select it.
TINY = ["run.name=tiny", "run.log_every=2",
        "data.kind=synthetic", "data.max_len=20", "data.synthetic.num_users=120",
        "data.synthetic.num_items=60", "data.synthetic.median_len=10", "data.synthetic.max_len=20",
        "model.dim=16", "model.num_blocks=1", "model.num_heads=2", "loss.num_negatives=8",
        "train.batch_size=16", "train.epochs=2", "eval.every_epochs=1", "ops.backend=auto"]


@pytest.fixture
def tiny_overrides(tmp_path):
    """A synthetic HSTU small enough to compile and train in seconds."""
    return [f"run.out_dir={tmp_path}", *TINY]


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


SYSTEM = REPO / "tests" / "system"


def pytest_collection_modifyitems(session, config, items):
    """The system files (msrun jobs, kernel rebuilds, long runs) run first, each file's tests in their own
    order: with `-n 2 --dist loadfile` (README's test command) the longest files then start early and the
    two workers finish together instead of one waiting on a late msrun file. A `slow` test outside
    tests/system is an error: the unit room is the fast subset."""
    stray = [item.nodeid for item in items if item.get_closest_marker("slow") and SYSTEM not in item.path.parents]
    if stray:
        raise pytest.UsageError(f"marked slow but outside tests/system: {stray[0]} (move it to tests/system)")
    items.sort(key=lambda item: SYSTEM not in item.path.parents)
