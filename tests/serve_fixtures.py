"""Shared by the serving tests of tests/system/serve/: one tiny trained run per session, and `mindgr` subprocesses.

The run is conftest's tiny_overrides with train.epochs=1, trained once (the first test that asks) into a
session temporary directory and reused by every serving test.
"""
import subprocess
import sys

import pytest

from conftest import REPO

_CACHE = {}


def mindgr(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "mindgr", *[str(a) for a in args]], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tiny_run(tiny_overrides, tmp_path_factory):
    """Directory of a trained tiny HSTU run (synthetic data with timestamps, time bias on)."""
    if "run" not in _CACHE:
        out = tmp_path_factory.mktemp("serve-run")
        overrides = [o for o in tiny_overrides if not o.startswith("run.out_dir=")] + [
            f"run.out_dir={out}", "train.epochs=1"]
        p = mindgr("train", *overrides)
        assert p.returncode == 0, p.stderr[-3000:]
        _CACHE["run"] = out / "tiny"
    return _CACHE["run"]
