"""Packer: fixed shapes, capacities, fill ratio, no token lost or duplicated, determinism."""

import numpy as np
import pytest

from mindgr.datasets import (EpochPlan, EvalSet, auto_capacities, build_batch, eval_examples,  # noqa: E402
                             plan_batches, training_examples, training_request_times)


def _lognormal_lengths(n, median=50, sigma=0.8, max_len=200, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(np.log(median) + sigma * rng.standard_normal(n))), 1, max_len).astype(np.int64)


def _examples(lengths, seed=0):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1, 1000, size=n + 1).astype(np.int32) for n in lengths]
    times = [np.cumsum(rng.integers(1, 100, size=n + 1)).astype(np.int64) for n in lengths]
    return training_examples(seqs, times, max_len=int(max(lengths)))


def test_training_examples_shift_and_truncate():
    seqs = [np.array([1, 2, 3, 4, 5], np.int32), np.array([7], np.int32), np.array([8, 9], np.int32)]
    times = [np.array([10, 20, 30, 40, 50]), np.array([1]), np.array([5, 6])]
    x, xt, y = training_examples(seqs, times, max_len=3)
    assert [a.tolist() for a in x] == [[2, 3, 4], [8]]  # length-1 sequence gives no example
    assert [a.tolist() for a in y] == [[3, 4, 5], [9]]
    assert [a.tolist() for a in xt] == [[20, 30, 40], [5]]
    assert training_examples(seqs, None, 3)[1] is None
    # request time: the time of each example's last target (the event its last position predicts)
    assert training_request_times(seqs, times).tolist() == [50, 6] and training_request_times(seqs, None) is None
    req = training_request_times(seqs, times)
    jb = build_batch([1, 0], x, xt, y, 8, 3, req)
    assert jb.request_times.tolist() == [6, 50, 0]
    assert build_batch([1, 0], x, xt, y, 8, 3).request_times.tolist() == [5, 40, 0]   # default: last input time


def test_eval_examples_target_only_at_last_position():
    ev = EvalSet([np.array([1, 2, 3, 4], np.int32), np.array([5], np.int32)], None,
                 np.array([9, 8], np.int32), None, np.array([0, 1]))
    x, xt, y = eval_examples(ev, max_len=2)
    assert [a.tolist() for a in x] == [[3, 4], [5]] and [a.tolist() for a in y] == [[0, 9], [8]]
    assert xt is None


def test_plan_covers_every_index_once_within_capacities():
    lengths = _lognormal_lengths(3000)
    batches = plan_batches(lengths, 4096, 256, rng=np.random.default_rng(1))
    allidx = np.concatenate(batches)
    assert np.array_equal(np.sort(allidx), np.arange(len(lengths)))
    assert all(lengths[b].sum() <= 4096 and len(b) <= 256 for b in batches)


def test_fill_ratio_on_long_tailed_lengths():
    lengths = _lognormal_lengths(20000, seed=2)
    cap = 64 * 128
    batches = plan_batches(lengths, cap, 10_000, rng=np.random.default_rng(0))
    fill = lengths.sum() / (len(batches) * cap)
    assert fill >= 0.97, fill
    assert min(lengths[b].sum() for b in batches[:-1]) / cap >= 0.97


def test_plan_keeps_order_without_rng():
    batches = plan_batches([3, 3, 3, 3], 6, 8)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]


def test_row_capacity_binds():
    batches = plan_batches(np.ones(10, np.int64), 100, 4)
    assert [len(b) for b in batches] == [4, 4, 2]


def test_too_long_example_names_length_and_capacity():
    with pytest.raises(ValueError, match="length 300, more than token_capacity 256"):
        plan_batches([10, 300], 256, 8)


def test_batches_have_fixed_shapes_and_lose_no_token():
    lengths = np.array([1, 5, 1, 37, 12, 1, 64, 3, 20, 8] * 20)
    x, xt, y = _examples(lengths)
    tcap, rcap = 128, 16
    plan = plan_batches([len(a) for a in x], tcap, rcap, rng=np.random.default_rng(5), window=8)
    seen = {}
    for b in plan:
        jb = build_batch(b, x, xt, y, tcap, rcap)
        assert jb.ids.shape == jb.targets.shape == jb.timestamps.shape == jb.positions.shape == (tcap,)
        assert jb.offsets.shape == (rcap + 1,) and jb.rows.shape == (rcap,)
        assert (jb.ids.dtype, jb.targets.dtype, jb.timestamps.dtype) == (np.int32, np.int32, np.int64)
        assert (jb.offsets.dtype, jb.positions.dtype, jb.rows.dtype) == (np.int32, np.int32, np.int64)
        assert jb.num_rows == len(b) and jb.num_tokens == sum(len(x[i]) for i in b)
        assert jb.fill == jb.num_tokens / tcap
        # empty rows repeat the last offset; the tail is all zeros
        assert (jb.offsets[jb.num_rows:] == jb.num_tokens).all() and (jb.rows[jb.num_rows:] == -1).all()
        tail = slice(jb.num_tokens, None)
        assert not jb.ids[tail].any() and not jb.targets[tail].any() and not jb.positions[tail].any()
        assert not jb.timestamps[tail].any()
        for r in range(jb.num_rows):
            i, lo, hi = jb.rows[r], jb.offsets[r], jb.offsets[r + 1]
            assert i not in seen
            seen[i] = True
            assert np.array_equal(jb.ids[lo:hi], x[i]) and np.array_equal(jb.targets[lo:hi], y[i])
            assert np.array_equal(jb.timestamps[lo:hi], xt[i])
            assert jb.positions[lo:hi].tolist() == list(range(hi - lo))
    assert sorted(seen) == list(range(len(x)))


def test_build_batch_checks_capacities_and_missing_times():
    x = [np.array([1, 2, 3], np.int32), np.array([4], np.int32)]
    y = [np.array([2, 3, 4], np.int32), np.array([5], np.int32)]
    jb = build_batch([1, 0], x, None, y, 8, 4)
    assert jb.ids.tolist() == [4, 1, 2, 3, 0, 0, 0, 0] and jb.offsets.tolist() == [0, 1, 4, 4, 4]
    assert jb.positions.tolist() == [0, 0, 1, 2, 0, 0, 0, 0] and not jb.timestamps.any()
    with pytest.raises(ValueError, match="exceed token_capacity"):
        build_batch([0, 1], x, None, y, 3, 4)
    with pytest.raises(ValueError, match="exceed row_capacity"):
        build_batch([0, 1], x, None, y, 8, 1)
    empty = build_batch([], x, None, y, 8, 2)
    assert empty.num_tokens == 0 and empty.offsets.tolist() == [0, 0, 0]
    assert not jb.request_times.any() and not empty.request_times.any()   # no times: zeros


def test_auto_capacities():
    lengths = _lognormal_lengths(5000, max_len=200)
    tcap, rcap = auto_capacities(lengths, batch_size=128, max_len=200)
    assert tcap % 64 == 0 and tcap >= 128 * lengths.mean() and tcap >= 200
    assert rcap % 8 == 0 and 128 <= rcap <= 4 * 128
    batches = plan_batches(lengths, tcap, rcap, rng=np.random.default_rng(0))
    full_rows = sum(len(b) == rcap for b in batches)
    assert full_rows <= 1  # the token budget, not the rows, is what binds
    assert auto_capacities([3, 3], batch_size=2, max_len=200) == (256, 8)


def test_epoch_plan_is_deterministic_and_resumable():
    lengths = _lognormal_lengths(500)
    a = EpochPlan(lengths, 1024, 64, seed=7)
    b = EpochPlan(lengths, 1024, 64, seed=7)
    e0, e1 = a.batches(0), a.batches(1)
    assert all(np.array_equal(p, q) for p, q in zip(e0, b.batches(0))) and len(e0) == b.num_batches(0)
    assert not np.array_equal(np.concatenate(e0), np.concatenate(e1))
    resumed = list(b.iter_batches(1, start=3))
    assert resumed[0][0] == 3 and len(resumed) == len(e1) - 3
    assert all(np.array_equal(p, e1[k]) for k, p in resumed)
    assert not np.array_equal(np.concatenate(EpochPlan(lengths, 1024, 64, seed=8).batches(0)), np.concatenate(e0))
