"""Synthetic generator: determinism, realistic shape, learnable structure, KuaiRand CSV round trip."""
import csv
import time

import numpy as np
import pytest

from mindgr.datasets import generate_synthetic, read_kuairand, write_kuairand_csv  # noqa: E402
from mindgr.datasets.synthetic import KUAIRAND_COLUMNS  # noqa: E402


@pytest.fixture(scope="module")
def default_store():
    t0 = time.perf_counter()
    store = generate_synthetic()
    return store, time.perf_counter() - t0


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_fast_and_well_formed(default_store):
    s, seconds = default_store
    assert seconds < 2.0
    assert s.name == "synthetic" and s.time_unit == "ms" and s.num_users == 2000
    lens = s.lengths()
    assert lens.min() >= 5 and lens.max() <= 200
    assert 40 <= np.median(lens) <= 60 and np.percentile(lens, 99) > 2 * np.median(lens)  # long tail
    assert 900 < s.num_items <= 1000
    flat = np.concatenate(s.item_seqs)
    assert flat.min() >= 1 and flat.max() == s.num_items
    assert (s.item_raw_ids[1:] >= 1).all() and (np.diff(s.item_raw_ids[1:]) > 0).all()


def test_timestamps_realistic(default_store):
    s, _ = default_store
    firsts = np.array([t[0] for t in s.time_seqs])
    assert (1.6e12 <= firsts).all() and (firsts < 1.6e12 + 61 * 86400e3).all()
    gaps = np.concatenate([np.diff(t) for t in s.time_seqs])
    assert gaps.min() >= 1  # strictly increasing per user
    assert 5_000 < np.median(gaps) < 600_000  # mostly seconds to minutes
    assert 0.02 < (gaps > 3600_000).mean() < 0.3  # some hours-to-days session breaks


def test_popularity_is_long_tailed(default_store):
    s, _ = default_store
    counts = np.sort(np.bincount(np.concatenate(s.item_seqs)))[::-1]
    assert counts[:10].sum() > 0.1 * counts.sum()  # a few hits
    assert counts[len(counts) // 2] < counts[0] / 20  # and a long tail


def test_deterministic_per_seed():
    a = generate_synthetic(num_users=200, num_items=300, seed=3)
    b = generate_synthetic(num_users=200, num_items=300, seed=3)
    c = generate_synthetic(num_users=200, num_items=300, seed=4)
    assert _same(a.item_seqs, b.item_seqs) and _same(a.time_seqs, b.time_seqs)
    assert np.array_equal(a.item_raw_ids, b.item_raw_ids)
    assert not _same(a.item_seqs, c.item_seqs)


def test_bigram_beats_popularity(default_store):
    """Counting successors on train predicts held-out last items far better than popularity."""
    s, _ = default_store
    v = s.num_items
    train = [q[:-1] for q in s.item_seqs]
    pop = np.bincount(np.concatenate(train), minlength=v + 1)
    pairs = np.concatenate([q[:-1].astype(np.int64) * (v + 1) + q[1:] for q in train])
    bigram = np.bincount(pairs, minlength=(v + 1) ** 2).reshape(v + 1, v + 1)
    prev = np.array([q[-2] for q in s.item_seqs])
    target = np.array([q[-1] for q in s.item_seqs])
    pop_hit = (target == pop.argmax()).mean()
    bigram_hit = (bigram[prev].argmax(axis=1) == target).mean()
    assert bigram_hit > 0.3 and bigram_hit > 3 * pop_hit, (bigram_hit, pop_hit)


def test_kuairand_csv_round_trip(tmp_path):
    s = generate_synthetic(num_users=150, num_items=200, median_len=20, seed=1)
    paths = write_kuairand_csv(s, tmp_path, files=3, seed=2)
    assert len(paths) == 3 and all(p.name.startswith("log_") for p in paths)
    users_per_file, clicks = [], []
    for p in paths:
        assert p.read_text().split("\n", 1)[0] == ",".join(KUAIRAND_COLUMNS)  # unquoted, like KuaiRand
        with open(p, newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == KUAIRAND_COLUMNS
        col = {c: k for k, c in enumerate(rows[0])}
        users_per_file.append({r[col["user_id"]] for r in rows[1:]})
        clicks += [r[col["is_click"]] for r in rows[1:]]
    assert clicks.count("0") > 0.2 * len(clicks)  # non-clicks the reader must drop
    assert len(set.intersection(*users_per_file)) > 100  # users' rows are spread over the files
    r = read_kuairand(tmp_path)
    assert r.user_ids.tolist() == s.user_ids.tolist()
    assert np.array_equal(r.item_raw_ids, s.item_raw_ids)
    assert _same(r.item_seqs, s.item_seqs) and _same(r.time_seqs, s.time_seqs)
    assert r.time_unit == "ms"
