"""Shared pieces of the generative-retrieval tests: random code tables and the backend they run on (a module
selects GRAPH mode and that backend with `pytestmark = pytest.mark.graph_mode("auto")`, tests/conftest.py)."""
import numpy as np


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

