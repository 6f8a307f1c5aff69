import numpy as np
import pytest

from mindgr.train.flops import forward_flops, train_flops
from mindgr.train.metrics import popularity_scores, ranking_metrics, target_ranks
from mindgr.config import ModelConfig


def test_ranks_filter_history_but_not_the_target():
    # items 1..5; column 0 is padding and never ranks.
    scores = np.array([[9.0, 0.5, 0.9, 0.1, 0.8, 0.7],
                       [9.0, 0.5, 0.9, 0.1, 0.8, 0.7]], np.float32)
    targets = np.array([1, 1])
    ranks, ties = target_ranks(scores, targets, [np.array([], int), np.array([2, 4, 1])])
    # user 0: items 2 (0.9), 4 (0.8), 5 (0.7) beat item 1 (0.5) -> rank 3
    # user 1: 2 and 4 are history and removed; the target 1 in its own history is kept -> only 5 beats it
    assert ranks.tolist() == [3, 1] and ties.tolist() == [0, 0]


def test_metrics_hand_computed():
    m = ranking_metrics(np.array([0, 3, 12]), ks=(1, 10))
    assert m["count"] == 3
    assert m["hr@1"] == pytest.approx(1 / 3)
    assert m["hr@10"] == pytest.approx(2 / 3)
    assert m["ndcg@10"] == pytest.approx((1.0 + 1 / np.log2(5)) / 3)
    assert m["mrr"] == pytest.approx((1 + 1 / 4 + 1 / 13) / 3)
    assert "ndcg@1" not in m


def test_popularity_counts():
    counts = popularity_scores([np.array([1, 2, 2]), np.array([2, 3])], 4)
    assert counts.tolist() == [0, 1, 3, 1, 0]


def test_flops_count_causal_pairs():
    m = ModelConfig(arch="hstu", dim=4, num_blocks=1, num_heads=1, dqk=2, dv=3)
    # one row of length 3 -> 6 causal pairs; per token: uvqk 2*4*(2*3+2*2) + out 2*3*4
    per_token = 2 * 4 * 10 + 2 * 3 * 4
    attn = (2 * 2 + 2 * 3) * 6
    loss = 2 * 4 * (5 + 1) * 2
    assert forward_flops(m, [3], num_targets=2, num_negatives=5) == 3 * per_token + attn + loss
    assert train_flops(m, [3], 2, 5) == 3 * forward_flops(m, [3], 2, 5)
