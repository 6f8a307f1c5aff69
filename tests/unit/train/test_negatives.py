"""Host-side negative sampling: distributions, logQ values, in-batch candidates, determinism."""
import numpy as np
import pytest

from mindgr.config import LossConfig
from mindgr.train.negatives import NegativeSampler, item_frequencies


def sampler(strategy, freq, **kw):
    cfg = LossConfig(negatives=strategy, **kw)
    return NegativeSampler(cfg, len(freq) - 1, freq, token_capacity=32)



def test_frequencies_count_targets_with_smoothing():
    freq = item_frequencies([np.array([1, 2, 2]), np.array([3, 2])], 3)
    # targets: 2, 2, 2 -> counts 1+0, 1+3, 1+0 over items 1..3 -> [1, 4, 1] / 6
    np.testing.assert_allclose(freq, [0, 1 / 6, 4 / 6, 1 / 6])


def test_per_token_uniform_chi_square():
    freq = np.concatenate([[0.0], np.full(50, 1 / 50)])
    ids, = sampler("per_token", freq, num_negatives=400).draw(np.random.default_rng(0), np.zeros(32, np.int32))
    assert ids.shape == (32, 400) and ids.min() >= 1 and ids.max() <= 50
    counts = np.bincount(ids.ravel(), minlength=51)[1:]
    expected = ids.size / 50
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stat < 90.0, stat  # chi-square, 49 dof: p(stat > 90) < 0.001
    # and a clearly non-uniform draw would fail the same bound
    skewed = np.bincount(np.minimum(ids.ravel(), 40), minlength=51)[1:]
    assert ((skewed - expected) ** 2 / expected).sum() > 90.0


def test_pool_popularity_matches_q_and_logq():
    freq = item_frequencies([np.array([1] + [2] * 30 + [3] * 10 + [4] * 5)], 4)
    s = sampler("shared_pool", freq, pool_size=20000, sampling="popularity")
    ids, corr = s.draw(np.random.default_rng(1), np.zeros(32, np.int32))
    q = freq[1:] / freq[1:].sum()
    observed = np.bincount(ids, minlength=5)[1:] / len(ids)
    np.testing.assert_allclose(observed, q, atol=0.01)
    np.testing.assert_allclose(corr, np.log(20000 * q[ids - 1]).astype(np.float32), rtol=1e-6)


def test_uniform_pool_logq_is_log_k_over_v_and_switchable():
    freq = np.concatenate([[0.0], np.full(10, 0.1)])
    ids, corr = sampler("shared_pool", freq, pool_size=5).draw(np.random.default_rng(0), np.zeros(32, np.int32))
    np.testing.assert_allclose(corr, np.log(5 / 10), rtol=1e-6)
    _, off = sampler("shared_pool", freq, pool_size=5, logq=False).draw(np.random.default_rng(0),
                                                                       np.zeros(32, np.int32))
    assert not off.any()


def test_in_batch_distinct_targets_padding_and_inclusion_logq():
    freq = np.concatenate([[0.0], np.full(10, 0.1)])
    targets = np.zeros(32, np.int32)
    targets[:6] = [3, 3, 5, 7, 7, 7]
    ids, corr = sampler("in_batch", freq, in_batch_size=5).draw(np.random.default_rng(0), targets)
    assert ids.tolist() == [3, 5, 7, 0, 0]
    expected = np.log(1 - (1 - 0.1) ** 6)
    np.testing.assert_allclose(corr[:3], expected, rtol=1e-5)
    assert not corr[3:].any()
    ids2, corr2 = sampler("in_batch", freq, in_batch_size=2).draw(np.random.default_rng(0), targets)
    assert len(set(ids2.tolist())) == 2 and set(ids2.tolist()) <= {3, 5, 7}
    # 2 of the 3 distinct targets kept: each is in the set with probability 2/3 of its inclusion
    np.testing.assert_allclose(corr2, expected + np.log(2 / 3), rtol=1e-5)


def test_mixed_concatenates_and_is_deterministic():
    freq = np.concatenate([[0.0], np.full(10, 0.1)])
    s = sampler("mixed", freq, pool_size=4, in_batch_size=3)
    targets = np.array([2, 4] + [0] * 30, np.int32)
    a = s.draw(np.random.default_rng([5, 1]), targets)
    b = s.draw(np.random.default_rng([5, 1]), targets)
    assert a[0].shape == (7,) and s.num_candidates == 7
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[0][4:].tolist() == [2, 4, 0]
    np.testing.assert_allclose(a[1][:4], np.log(4 / 10) + np.log(2), rtol=1e-6)


def test_bench_negatives_summary_and_missing_data(tmp_path, capsys):
    """The acceptance figures of `mindgr bench negatives` from a result table, and the skip message."""
    from mindgr.bench.negatives import NEGATIVE_VARIANTS, NegativeVariants

    def row(overrides, step_s, peak):
        return {"overrides": overrides, "step_time_s_median": step_s, "peak_rss_mb": peak}

    variants = NegativeVariants({"per_token R=128": ["loss.negatives=per_token"]})
    result = {"variants": {
        "per_token R=128": row(["loss.negatives=per_token"], 0.4, 1000.0),
        "shared_pool K=4096": row(["loss.negatives=shared_pool", "loss.pool_size=4096"], 0.6, 950.0),
        "shared_pool K=16384": row(["loss.negatives=shared_pool", "loss.pool_size=16384"], 1.6, 990.0),
        "shared_pool K=65536": row(["loss.negatives=shared_pool", "loss.pool_size=65536"], 6.0, 1200.0),
        "fp16": row(["loss.negatives=shared_pool", "loss.pool_size=99999", "loss.fp16_negatives=true"], 1, 1)}}
    s = variants.summarise(result)
    assert s["largest_k_at_equal_memory"] == 16384 and s["ratio_vs_per_token"] == 128
    assert not s["largest_k_is_largest_measured"]
    assert abs(s["step_time_vs_baseline"]["shared_pool K=4096"] - 1.5) < 1e-12
    assert "K=16384 (990 MB) = 128x" in capsys.readouterr().out
    # the ML-1M comparison needs its data file: a clear message and nothing measured
    from conftest import REPO
    cfg = str(REPO / "configs" / "ml-1m" / "hstu.yaml")
    path, reason = NEGATIVE_VARIANTS.prepare(cfg, [f"data.path={tmp_path / 'none.txt'}"])
    assert path is None and "none.txt not found" in reason


def test_pool_estimating_the_per_token_softmax_shifts_logq_by_log_v_over_r():
    """pool_estimate=per_token: a uniform pool of K scores each candidate with c = log(K / R), so the
    pool's sum is R / K of the raw sum: the expected per-token sum over R uniform negatives."""
    freq = np.concatenate([[0.0], np.full(10, 0.1)])
    ids, corr = sampler("shared_pool", freq, pool_size=40, num_negatives=4,
                        pool_estimate="per_token").draw(np.random.default_rng(0), np.zeros(32, np.int32))
    np.testing.assert_allclose(corr, np.log(40 / 4), rtol=1e-6)
    _, corr_full = sampler("shared_pool", freq, pool_size=40, num_negatives=4).draw(
        np.random.default_rng(0), np.zeros(32, np.int32))
    np.testing.assert_allclose(corr_full, np.log(40 / 10), rtol=1e-6)
    ids, corr = sampler("in_batch", freq, in_batch_size=5, num_negatives=4,
                        pool_estimate="per_token").draw(np.random.default_rng(0), np.array([3] + [0] * 31))
    assert corr[0] == pytest.approx(np.log(0.1) + np.log(10 / 4), rel=1e-5) and not corr[1:].any()  # unused slots: 0
