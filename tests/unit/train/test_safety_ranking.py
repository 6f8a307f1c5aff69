"""Tie-aware ranking (issue 14): ties never flatter a model, NaN is an error, compare reads the ties."""
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from mindgr.train.metrics import per_user_metrics, popularity_metrics, ranking_metrics, target_ranks


def _brute_force(scores, target, hist, ks):
    """Average of the metrics over every ordering of the target's ties (explicit enumeration)."""
    cand = [i for i in range(1, len(scores)) if i == target or i not in hist]
    t = scores[target]
    greater = sum(scores[i] > t for i in cand)
    tied = [i for i in cand if scores[i] == t and i != target]
    rows = []
    for pos in range(len(tied) + 1):              # every slot among the ties is equally likely
        r = greater + pos
        row = {f"hr@{k}": float(r < k) for k in ks}
        row.update({f"ndcg@{k}": (1 / np.log2(r + 2)) * (r < k) for k in ks if k > 1})
        row["mrr"] = 1 / (r + 1)
        rows.append(row)
    return {m: np.mean([row[m] for row in rows]) for m in rows[0]}


def test_expected_metrics_under_random_tie_breaking_match_enumeration():
    rng = np.random.default_rng(0)
    ks = (1, 3, 10)
    for _ in range(30):
        v = int(rng.integers(3, 25))
        scores = rng.integers(0, 4, (1, v + 1)).astype(np.float32)      # few values: many ties
        target = int(rng.integers(1, v + 1))
        hist = [int(i) for i in rng.choice(np.arange(1, v + 1), int(rng.integers(0, v // 2 + 1)), replace=False)]
        g, t = target_ranks(scores, np.array([target]), [np.array(hist, int)])
        got = per_user_metrics(g, ks, t)
        want = _brute_force(scores[0], target, set(hist), ks)
        for m in want:
            assert got[m][0] == pytest.approx(want[m], abs=1e-12), (m, scores, target, hist)


def test_constant_scores_give_chance_level_metrics():
    users, items = 7, 40
    scores = np.zeros((users, items + 1), np.float32)
    targets = np.arange(1, users + 1)
    hists = [np.arange(10, 10 + u) for u in range(users)]               # user u has u other history items
    g, t = target_ranks(scores, targets, hists)
    assert (g == 0).all()
    candidates = items - np.arange(users)                               # target + unseen items
    assert t.tolist() == (candidates - 1).tolist()
    per = per_user_metrics(g, (10,), t)
    assert per["hr@10"].tolist() == (10 / candidates).tolist()          # exactly K / candidates per user
    m = ranking_metrics(g, (10,), t)
    assert m["hr@10"] == pytest.approx(np.mean(10 / candidates), rel=1e-12)
    assert m["mrr"] < 0.2 and m["hr@10"] < 0.5          # the old strict ranks gave 1.0 for both


def test_without_ties_the_strict_formulas_are_kept_bit_for_bit():
    ranks = np.array([0, 3, 12, 40])
    a = per_user_metrics(ranks, (1, 10, 50))
    b = per_user_metrics(ranks, (1, 10, 50), np.zeros(4, np.int64))
    gain = 1 / np.log2(ranks + 2.0)
    assert np.array_equal(a["ndcg@10"], gain * (ranks < 10)) and np.array_equal(a["mrr"], 1 / (ranks + 1.0))
    for m in a:
        assert np.array_equal(a[m], b[m])


@pytest.mark.parametrize("where, words", [("items", "item table"), ("users", "user embeddings")])
def test_nan_weights_are_an_error_naming_what(where, words):
    from mindgr.train.evaluate import evaluate
    table = np.ones((6, 4), np.float32)
    user = np.ones((2, 4), np.float32)
    if where == "items":
        table[3, 1] = np.nan
    else:
        user[1, 0] = np.inf
    batch = SimpleNamespace(ids=np.zeros(4, np.int32), positions=np.zeros(4, np.int32),
                            offsets=np.array([0, 2, 4], np.int32), timestamps=np.zeros(4, np.int64),
                            request_times=np.zeros(2, np.int64), num_rows=2, rows=np.array([0, 1]))
    examples = SimpleNamespace(plan=lambda: [None], batch=lambda idx: batch)
    evalset = SimpleNamespace(targets=np.array([1, 2]), histories=[np.array([], int), np.array([], int)])
    encode = lambda *a: SimpleNamespace(asnumpy=lambda: user)    # noqa: E731
    with pytest.raises(FloatingPointError, match=words) as e:
        evaluate(encode, table, examples, evalset, (10,))
    assert "\n" not in str(e.value)
    with pytest.raises(FloatingPointError, match="scores"):
        target_ranks(np.array([[0, np.nan, 1.0]], np.float32), np.array([1]), [np.array([], int)])


def test_constant_model_through_evaluate_is_chance_level():
    from mindgr.train.evaluate import evaluate
    items, users = 30, 5
    table = np.zeros((items + 1, 4), np.float32)          # a collapsed model: every score is 0
    batch = SimpleNamespace(ids=np.zeros(5, np.int32), positions=np.zeros(5, np.int32),
                            offsets=np.arange(6, dtype=np.int32), timestamps=np.zeros(5, np.int64),
                            request_times=np.zeros(users, np.int64), num_rows=users, rows=np.arange(users))
    examples = SimpleNamespace(plan=lambda: [None], batch=lambda idx: batch)
    evalset = SimpleNamespace(targets=np.arange(1, users + 1), histories=[np.array([], int)] * users)
    encode = lambda *a: SimpleNamespace(asnumpy=lambda: np.ones((users, 4), np.float32))    # noqa: E731
    m, ranks, ties = evaluate(encode, table, examples, evalset, (1, 10), per_user=True)
    assert m["hr@10"] == pytest.approx(10 / items, rel=1e-12) and m["hr@1"] == pytest.approx(1 / items, rel=1e-12)
    assert (ranks == 0).all() and (ties == items - 1).all()


def test_popularity_baseline_is_tie_aware():
    # items 4..9 are never seen in training: they tie at count 0, with targets 4 and 5 among them
    train = [np.array([1, 2, 2, 3]), np.array([3, 3])]
    evalset = SimpleNamespace(targets=np.array([4, 5, 3]), histories=[np.array([], int), np.array([6]),
                                                                       np.array([], int)])
    m = popularity_metrics(train, 9, evalset, (1, 10))
    pop = np.array([0, 1, 2, 3, 0, 0, 0, 0, 0, 0], np.float32)
    want = [_brute_force(pop, t, set(h), (1, 10)) for t, h in zip(evalset.targets, evalset.histories)]
    for name in ("hr@1", "hr@10", "ndcg@10", "mrr"):
        assert m[name] == pytest.approx(np.mean([w[name] for w in want]), abs=1e-12)
    assert m["hr@1"] == pytest.approx(1 / 3)      # only item 3 (rank 0) is a hit at 1; no tie counts


def test_compare_uses_ties_and_reads_old_rank_files(tmp_path):
    from mindgr.train.compare import compare_ranks, load_ranks
    targets = np.arange(1, 5)
    strict = np.zeros(4, np.int64)
    res = compare_ranks(strict, targets, strict, targets, ks=(10,), samples=50,
                        ties_a=np.full(4, 99), ties_b=np.zeros(4, np.int64))
    assert res["metrics"]["hr@10"]["a"] == pytest.approx(0.1) and res["metrics"]["hr@10"]["b"] == 1.0
    old = tmp_path / "old.npz"
    np.savez(old, ranks=np.array([2, -1, 0]), targets=np.array([1, 2, 3]), checkpoint="best")
    ranks, ties, got_targets = load_ranks(old)
    assert ties.tolist() == [0, -1, 0] and got_targets.tolist() == [1, 2, 3]
