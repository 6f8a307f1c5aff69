"""Shared pieces of the C++ kernel tests (test_ops_cpu*.py): the skip without a compiler, GRAPH mode
with the kernels built, and the scale-relative comparison every kernel test uses.

Tolerance (fp32): for every compared tensor, max|cpu - reference| <= rtol * max|reference|, with
RTOL = 2e-5 by default, i.e. relative to the scale of that output (the kernels and the reference sum in
different orders; observed errors are ~1e-6 of the scale).

Use: `pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]` (GRAPH mode with the kernels built and
selected for the module, then the previous mode and backend restored: tests/conftest.py).
"""
import functools
import os
import shutil

import numpy as np
import pytest

RTOL = 2e-5

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                                    reason="g++ not found: the C++ CPU kernels cannot be built")



def assert_close(got, want, name, rtol=RTOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.all(np.isfinite(got)), name
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= rtol * max(scale, 1e-30), f"{name}: max abs error {err:.3g} vs scale {scale:.3g}"


def pynative(fn):
    """Run fn in PyNative mode (no graph compile per shape), then back to the module's GRAPH mode."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        import mindspore as ms
        ms.set_context(mode=ms.PYNATIVE_MODE)
        try:
            return fn(*args, **kwargs)
        finally:
            ms.set_context(mode=ms.GRAPH_MODE)
    return wrapped
