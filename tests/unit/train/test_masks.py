"""Dropout masks drawn by token row (mindgr.train.masks): any set of rows, drawn alone, equals the same
rows of the whole batch's masks; keep rate and scale are those of dropout p."""
import numpy as np
import pytest

from mindgr.train.masks import DropoutMasks


@pytest.mark.parametrize("width", [1, 4, 6, 64])
def test_rows_equal_the_whole_batch_rows(width):
    masks = DropoutMasks(seed=5, p=0.3, shape=(3, 200, width))
    full = masks.batch(2, 7)
    rng = np.random.default_rng(0)
    for trial in range(20):
        # runs of consecutive positions (as a rank's sequences), sometimes shuffled, sometimes single rows
        starts = np.sort(rng.choice(200, rng.integers(1, 8), replace=False))
        runs = [np.arange(s, min(s + rng.integers(1, 30), 200)) for s in starts]
        if trial % 3 == 0:
            rng.shuffle(runs)
        positions = np.unique(np.concatenate(runs)) if trial % 3 == 1 else np.concatenate(runs)
        if len(positions) > 150:
            positions = positions[:150]
        got = masks.rows(2, 7, positions, 160)
        assert got.shape == (3, 160, width)
        np.testing.assert_array_equal(got[:, : len(positions)], full[:, positions])
        assert (got[:, len(positions):] == 1.0).all()        # padding rows: keep, unscaled


def test_keep_rate_scale_and_determinism():
    p = 0.2
    masks = DropoutMasks(seed=1, p=p, shape=(2, 5000, 64))
    a = masks.batch(0, 3)
    assert set(np.unique(a).tolist()) == {0.0, np.float32(1.0 / (1.0 - p))}
    n = a.size
    kept = (a > 0).mean()
    assert abs(kept - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)   # binomial, 5 sigma
    np.testing.assert_array_equal(a, DropoutMasks(seed=1, p=p, shape=(2, 5000, 64)).batch(0, 3))
    assert not np.array_equal(a, masks.batch(0, 4))
    assert not np.array_equal(a, masks.batch(1, 3))
    assert not np.array_equal(a, DropoutMasks(seed=2, p=p, shape=(2, 5000, 64)).batch(0, 3))
    assert not np.array_equal(a[0], a[1])                     # sites are independent streams of words


def test_no_dropout_and_bad_positions():
    masks = DropoutMasks(seed=1, p=0.0, shape=(2, 10, 4))
    assert (masks.batch(0, 0) == 1.0).all()
    assert (masks.rows(0, 0, np.arange(3), 5) == 1.0).all()
    masks = DropoutMasks(seed=1, p=0.5, shape=(2, 10, 4))
    assert masks.rows(0, 0, np.zeros(0, np.int64), 4).shape == (2, 4, 4)
    with pytest.raises(ValueError, match="do not fit"):
        masks.rows(0, 0, np.arange(8, 11), 5)                 # position 10 is outside the batch
    with pytest.raises(ValueError, match="do not fit"):
        masks.rows(0, 0, np.arange(6), 5)                     # more rows than the capacity
