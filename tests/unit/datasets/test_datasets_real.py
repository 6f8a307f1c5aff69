"""Checks on the real public datasets in shared/data (skipped when that folder is absent)."""

import numpy as np
import pytest

from mindgr.datasets import read_movielens_1m, read_movielens_100k  # noqa: E402

from conftest import DATA_DIR  # noqa: E402


def _need(rel):
    path = DATA_DIR / rel
    if not path.exists():
        pytest.skip(f"{path} not found (set MINDGR_DATA_DIR to the folder holding ml-1m/ and ml-100k/)")
    return path


def test_ml1m_sequences():
    s = read_movielens_1m(_need("ml-1m/sequences.txt"))
    assert (s.num_users, s.num_items, s.num_interactions) == (6040, 3706, 1000209)
    assert s.user_ids[0] == 1 and s.item_raw_ids[s.item_seqs[0][:5]].tolist() == [3186, 1721, 1022, 1270, 2340]
    assert len(s.item_seqs[0]) == 53 and not s.has_timestamps


def test_ml1m_official_ratings_partial():
    s = read_movielens_1m(_need("ml-1m/ratings_users_1-2999.dat.gz"))
    assert (s.num_users, s.num_interactions) == (2999, 487650) and s.time_unit == "s"
    assert all((np.diff(t) >= 0).all() for t in s.time_seqs)


def test_ml100k():
    s = read_movielens_100k(_need("ml-100k"))
    assert (s.num_users, s.num_items, s.num_interactions) == (943, 1682, 100000)
    assert s.lengths().min() >= 20


def test_ml1m_sequences_with_the_partial_timestamps():
    s = read_movielens_1m(_need("ml-1m/sequences.txt"), timestamps=_need("ml-1m/ratings_users_1-2999.dat.gz"))
    assert s.num_interactions == 1000209 and s.has_timestamps
    timed = s.user_ids <= 2999
    assert all((np.diff(t) >= 0).all() and t.min() > 0 for t in np.array(s.time_seqs, dtype=object)[timed])
    assert all((t == 0).all() for t in np.array(s.time_seqs, dtype=object)[~timed])
