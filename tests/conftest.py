"""Shared test fixtures: where the real data lives, and a tiny synthetic run config; and the test order."""
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


def pytest_collection_modifyitems(session, config, items):
    """Files holding `slow` tests (msrun jobs, kernel rebuilds, long runs) run first, each file's tests in
    their own order: with `-n 2 --dist loadfile` (README's test command) the longest files then start
    early and the two workers finish together instead of one waiting on a late msrun file."""
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
