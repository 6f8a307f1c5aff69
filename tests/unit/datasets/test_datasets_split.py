"""Leave-one-out split semantics for the standard (holdout=2) and HSTU (holdout=1) protocols."""

import numpy as np
import pytest

from mindgr.datasets import SequenceStore, leave_one_out  # noqa: E402


def _store(times=True):
    seqs = [np.array(s, np.int32) for s in ([1], [1, 2], [1, 2, 3], [5, 4, 3, 2, 1])]
    tseq = [np.arange(len(s), dtype=np.int64) * 10 + 100 * u for u, s in enumerate(seqs)] if times else None
    return SequenceStore("toy", np.arange(4, dtype=np.int64), seqs, tseq, np.arange(-1, 6, dtype=np.int64))


def _lists(arrays):
    return [a.tolist() for a in arrays]


def test_standard_holdout_two():
    sp = leave_one_out(_store(), holdout=2)
    assert sp.test.users.tolist() == [1, 2, 3]
    assert sp.test.targets.tolist() == [2, 3, 1] and _lists(sp.test.histories) == [[1], [1, 2], [5, 4, 3, 2]]
    assert sp.valid.users.tolist() == [2, 3]
    assert sp.valid.targets.tolist() == [2, 2] and _lists(sp.valid.histories) == [[1], [5, 4, 3]]
    assert _lists(sp.train) == [[5, 4, 3]] and sp.train_users.tolist() == [3]  # [1] from user 2 is too short
    assert sp.dropped == {"train": 3, "valid": 2, "test": 1}
    assert sp.test.target_times.tolist() == [110, 220, 340]
    assert _lists(sp.test.history_times) == [[100], [200, 210], [300, 310, 320, 330]]
    assert _lists(sp.train_times) == [[300, 310, 320]]
    assert sp.test.targets.dtype == np.int32 and sp.test.users.dtype == np.int64


def test_hstu_holdout_one_trains_on_valid_item():
    sp = leave_one_out(_store(), holdout=1)
    assert _lists(sp.train) == [[1, 2], [5, 4, 3, 2]] and sp.train_users.tolist() == [2, 3]
    assert sp.valid.targets.tolist() == [2, 2] and sp.test.targets.tolist() == [2, 3, 1]
    assert sp.dropped["train"] == 2


def test_min_train_len_and_no_timestamps():
    sp = leave_one_out(_store(times=False), holdout=1, min_train_len=1)
    assert _lists(sp.train) == [[1], [1, 2], [5, 4, 3, 2]]
    assert sp.train_times is None and sp.test.history_times is None and sp.test.target_times is None


def test_bad_holdout():
    with pytest.raises(ValueError, match="holdout"):
        leave_one_out(_store(), holdout=3)
