"""Shared pieces of the generative-retrieval tests: random code tables, the backend they run on, and the
graph-mode fixture (import `graph_mode` into a test module to use it there)."""
import numpy as np
import pytest


def fast_backend():
    """The fused C++ kernels where they build (their graphs compile ~5x faster than the padded
    reference's), else the reference: the GR tests check GR logic, the kernels have their own tests."""
    from mindgr.ops import set_backend
    from mindgr.ops.backend import BackendUnavailable
    try:
        return set_backend("cpu")
    except BackendUnavailable:
        return set_backend("reference")


def random_codes(rng, num_items, level_sizes):
    """A random code table [V+1, Lt] of unique tuples (row 0 = padding, zeros), clustered so that
    prefixes are shared (as residual k-means makes them)."""
    sizes = np.asarray(level_sizes)
    space = int(np.prod(sizes))
    assert num_items <= space
    # draw the first levels from a few hot values so prefixes collide, then make tuples unique
    seen, rows = set(), []
    while len(rows) < num_items:
        t = tuple(int(min(rng.geometric(0.4) - 1, s - 1)) if rng.random() < 0.7 else int(rng.integers(s))
                  for s in sizes)
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return np.concatenate([np.zeros((1, len(sizes)), np.int32), np.asarray(rows, np.int32)])


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    """Graph mode on the CPU, the fast backend for the module, the previous backend restored after it."""
    import mindspore as ms
    from mindgr.ops import get_backend, set_backend
    from mindgr.runtime import select_device
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()  # CPU, once per process (set_device fails after kernels ran)
    previous = get_backend()
    fast_backend()
    yield
    set_backend(previous)
