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


def test_several_runs_per_side_widen_the_interval_by_the_spread_between_runs():
    rng = np.random.default_rng(2)
    a = rng.random((1, 4000))
    # two "seeds" of B that agree on users but differ from each other by +-0.02: one run alone is
    # clearly better than A, the pair's interval must also carry the seed spread and reach wider
    noise = 0.05 * rng.standard_normal(4000)
    b = np.stack([a[0] + 0.02 + noise, a[0] + 0.06 + noise])
    one = paired_bootstrap(a, b[:1], samples=2000)
    two = paired_bootstrap(a, b, samples=2000)
    assert two["diff"] == pytest.approx(b.mean() - a.mean())
    assert two["b_runs"] == pytest.approx([b[0].mean(), b[1].mean()])
    assert (two["ci95"][1] - two["ci95"][0]) > 5 * (one["ci95"][1] - one["ci95"][0])
    gaps = b.mean(1) - a.mean()
    assert two["ci95"][0] <= gaps[0] + 1e-3 and two["ci95"][1] >= gaps[1] - 1e-3   # spans both runs' gaps
    # a side of identical runs gives the one-run figure's mean and a comparable interval
    same = paired_bootstrap(np.repeat(a, 3, 0), b[:1], samples=2000)
    assert same["diff"] == pytest.approx(one["diff"]) and same["a_runs"] == pytest.approx([a.mean()] * 3)
    width = lambda r: r["ci95"][1] - r["ci95"][0]  # noqa: E731
    assert width(same) == pytest.approx(width(one), rel=0.2)


def test_compare_ranks_with_several_runs_leaves_out_users_any_run_missed():
    targets = np.arange(1, 5)
    a = np.array([[0, 5, 20, 3], [1, -1, 9, 3]])            # the second A run did not rank user 1
    b = np.array([[0, 4, 30, 2]])
    r = compare_ranks(a, targets, b, targets, ks=(10,), samples=50)
    assert r["users"] == 3 and r["runs"] == [2, 1]
    assert r["metrics"]["hr@10"]["a_runs"] == pytest.approx([2 / 3, 1.0])
    assert r["metrics"]["hr@10"]["b"] == pytest.approx(2 / 3)


def test_compare_runs_refuses_an_empty_run_name_before_evaluating(tmp_path):
    from mindgr.train.compare import compare_runs
    for side in ([], [str(tmp_path), ""]):
        with pytest.raises(ValueError, match="empty run directory"):
            compare_runs(side, str(tmp_path))
    # side B's bad entry is found before side A (not a run directory) is evaluated
    with pytest.raises(ValueError, match="empty run directory"):
        compare_runs(str(tmp_path / "missing"), [""])


def test_holm_step_down_by_hand():
    from mindgr.train.compare import holm
    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    # sorted: d .005 x 4 = .02, a .01 x 3 = .03, c .03 x 2 = .06, b .04 x 1 (running max) = .06
    assert {k: round(v[0], 12) for k, v in got.items()} == {"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06}
    assert {k for k, v in got.items() if v[1]} == {"d", "a"}
    # a single p-value is its own adjusted value
    assert holm({"x": 0.04}) == {"x": (0.04, True)}


def test_compare_reports_holm_beside_the_raw_intervals_on_synthetic_ranks():
    from mindgr.train.compare import format_comparison
    rng = np.random.default_rng(5)
    targets = np.arange(1, 3001)
    a = rng.integers(0, 400, 3000)
    same = compare_ranks(a, targets, a.copy(), targets, ks=(1, 10, 50), samples=500)
    assert all(r["p_holm"] == 1.0 and not r["holm"] for r in same["metrics"].values())
    better = compare_ranks(a, targets, a // 4, targets, ks=(1, 10, 50), samples=500)   # every rank 4x better
    assert all(r["holm"] and r["p_holm"] >= r["p"] for r in better["metrics"].values())
    # a raw "B better" whose p does not survive the correction over the metrics is said to be so
    fake = {"users": 10, "samples": 100, "runs": [1, 1], "metrics": {
        f"m{i}": {"a": 0.1, "b": 0.1, "diff": 0.0, "ci95": [-0.01, 0.01], "p": 0.5} for i in range(7)}}
    fake["metrics"]["hr@10"] = {"a": 0.1, "b": 0.12, "diff": 0.02, "ci95": [0.001, 0.04], "p": 0.03}
    from mindgr.train.compare import _add_holm
    _add_holm(fake["metrics"])
    text = format_comparison(fake, "A", "B")
    line = next(l for l in text.splitlines() if l.startswith("hr@10"))
    assert "B better, not after Holm" in line
    assert fake["metrics"]["hr@10"]["p_holm"] == pytest.approx(0.24)
