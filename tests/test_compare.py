"""Paired comparison of two runs: per-user metrics, the bootstrap interval, mismatched evaluations."""
import numpy as np
import pytest

from mindgr.train.compare import compare_ranks, paired_bootstrap, per_user_metrics
from mindgr.train.metrics import ranking_metrics


def test_per_user_metrics_average_to_the_ranking_metrics():
    ranks = np.random.default_rng(0).integers(0, 300, 500)
    want = ranking_metrics(ranks, (1, 10, 50))
    got = per_user_metrics(ranks, (1, 10, 50))
    assert set(got) == set(want) - {"count"}
    for name, values in got.items():
        assert values.mean() == pytest.approx(want[name], rel=1e-12)


def test_bootstrap_interval_covers_a_known_mean_and_separates_a_real_gap():
    rng = np.random.default_rng(1)
    a = rng.random(4000)
    same = paired_bootstrap(a, a)
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["p"] == 1.0
    # b = a + noise of mean 0.01 and sd 0.1: standard error 0.0016, so the 95% interval excludes 0
    b = a + 0.01 + 0.1 * rng.standard_normal(4000)
    r = paired_bootstrap(a, b, samples=2000)
    lo, hi = r["ci95"]
    assert 0 < lo < r["diff"] < hi and hi - lo == pytest.approx(2 * 1.96 * 0.1 / np.sqrt(4000), rel=0.15)
    assert r["p"] < 0.01


def test_compare_ranks_skips_unevaluated_users_and_refuses_other_targets():
    targets = np.arange(1, 7)
    a = np.array([0, 5, 20, -1, 3, 100])
    b = np.array([0, 4, 30, 2, -1, 1])
    r = compare_ranks(a, targets, b, targets, ks=(10,), samples=100)
    assert r["users"] == 4                                  # users 3 and 4 lack a rank in one run
    assert r["metrics"]["hr@10"]["a"] == pytest.approx(2 / 4) and r["metrics"]["hr@10"]["b"] == pytest.approx(3 / 4)
    assert r["metrics"]["hr@10"]["diff"] == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="different users or targets"):
        compare_ranks(a, targets, b, targets[::-1], ks=(10,))
    with pytest.raises(ValueError, match="no user was evaluated by both"):
        compare_ranks(np.full(6, -1), targets, b, targets, ks=(10,))
    with pytest.raises(ValueError, match="at least 1"):
        compare_ranks(a, targets, b, targets, ks=(10,), samples=0)
