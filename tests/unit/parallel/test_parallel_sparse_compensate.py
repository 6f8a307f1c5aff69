"""Delay compensation of stale embedding gradients (mindgr.parallel.sparse.compensate) against a plain
reference that snapshots the rows at every lookup."""
import numpy as np
import pytest

from mindgr.parallel.sparse.compensate import DelayCompensated
from mindgr.parallel.sparse.row_adam import RowAdam


def _opt(rng, lazy=True):
    return RowAdam(rng.normal(size=(30, 4)).astype(np.float32), 0.05, 0.9, 0.999, 1e-8, 0.01, lazy)


@pytest.mark.parametrize("tau", [1, 2, 3])
def test_the_drift_is_the_rows_change_since_the_gradients_lookup_and_the_correction_follows_the_formula(tau):
    rng = np.random.default_rng(tau)
    opt, ref = _opt(rng), _opt(np.random.default_rng(tau))
    lam0 = 0.7
    dc = DelayCompensated(opt, lam0, tau)
    queue = []                                     # (rows at the lookup, slots, grads) submitted, not applied
    for step in range(12):
        assert np.array_equal(opt.rows, ref.rows)
        looked_up = opt.rows.copy()
        slots = np.sort(rng.choice(30, size=int(rng.integers(1, 12)), replace=False))
        grads = rng.normal(size=(len(slots), 4)).astype(np.float32)
        dc.submitted()
        queue.append((looked_up, slots, grads))
        if len(queue) > tau or step == 11:         # due (or a final flush of everything)
            for then, s, g in (queue if step == 11 else queue[:1]):
                drift = ref.rows[s] - then[s]
                v = ref.v[s]
                scale = np.where(v > 0, lam0 / np.sqrt(np.maximum(v, 1e-30)), 0.0).astype(np.float32)
                np.testing.assert_allclose(dc.drift(s, dc.waiting[0]), drift, rtol=1e-6, atol=1e-7)
                dc.apply(s, g)
                ref.apply(s, (g + scale * g * g * drift).astype(np.float32))
                np.testing.assert_allclose(opt.rows, ref.rows, rtol=1e-6, atol=1e-7)
                opt.rows[...] = ref.rows                   # keep the two bit-equal for the next comparison
            queue = [] if step == 11 else queue[1:]
    assert dc.applied == 12 and not dc.waiting


def test_lambda_zero_is_the_plain_update_and_a_dense_update_is_refused():
    rng = np.random.default_rng(0)
    opt, ref = _opt(rng), _opt(np.random.default_rng(0))
    dc = DelayCompensated(opt, 0.0, 2)
    for _ in range(5):
        slots = np.sort(rng.choice(30, size=8, replace=False))
        grads = rng.normal(size=(8, 4)).astype(np.float32)
        dc.submitted()
        dc.apply(slots, grads)
        ref.apply(slots, grads)
    assert np.array_equal(opt.rows, ref.rows)
    with pytest.raises(ValueError, match="lazy"):
        DelayCompensated(_opt(rng, lazy=False), 0.5, 1)
