"""The alignment measures of `mindgr compare`: hit@K split by the target's value (value groups, the
bootstrap of the difference of two groups' changes), the top-K lists a GR run's ranks file keeps (against
beam_ranks), coverage and the judge's mean list reward (a fake scorer), and their one-line errors
(the whole chain with real runs: tests/system/train/test_align_eval.py)."""
import numpy as np
import pytest

from mindgr.generate.beam import beam_ranks
from mindgr.train.compare import paired_bootstrap
from mindgr.train.judge import coverage, coverage_bootstrap, judge_rewards, top_lists
from mindgr.train.value_split import compare_by_value, contrast_bootstrap, group_masks, parse_groups


def test_value_groups_parse_with_open_ends_and_refuse_bad_words():
    assert parse_groups([]) == [("liked", 4.0, np.inf), ("disliked", -np.inf, 2.0)]
    assert parse_groups(["mid=2.5:3.5"]) == [("mid", 2.5, 3.5)]
    masks = group_masks(np.array([1, 2, 3, 4, 5.0]), parse_groups([]))
    assert masks["liked"].tolist() == [False, False, False, True, True]
    assert masks["disliked"].tolist() == [True, True, False, False, False]
    for bad, what in (("liked", "NAME=LO:HI"), ("liked=4", "NAME=LO:HI"), ("=4:", "NAME=LO:HI"),
                      ("x=a:2", "numbers"), ("x=3:2", "above"), ):
        with pytest.raises(ValueError, match=what) as e:
            parse_groups([bad])
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="twice"):
        parse_groups(["a=1:2", "a=3:4"])


def test_contrast_of_two_groups_matches_its_point_and_standard_error():
    rng = np.random.default_rng(0)
    a1, a2 = rng.random(3000) < 0.3, rng.random(1500) < 0.3
    b1 = np.where(rng.random(3000) < 0.1, ~a1, a1).astype(float)         # noisy changes of each user's hit
    b2 = np.where(rng.random(1500) < 0.1, ~a2, a2).astype(float)
    a1, a2 = a1.astype(float), a2.astype(float)
    r = contrast_bootstrap(a1, b1, a2, b2, samples=3000)
    want = (b1.mean() - a1.mean()) - (b2.mean() - a2.mean())
    assert r["diff"] == pytest.approx(want, abs=1e-12) and r["users"] == [3000, 1500]
    se = np.sqrt((b1 - a1).var() / 3000 + (b2 - a2).var() / 1500)   # independent groups: the variances add
    lo, hi = r["ci95"]
    assert lo < want < hi and (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.12)
    # a real gap between the groups' changes is found; several runs per side take the [S, U] form
    r = contrast_bootstrap(a1, a1 + 0.05, a2, a2 - 0.05, samples=500)
    assert r["ci95"][0] > 0.09 and r["p"] < 0.01
    r = contrast_bootstrap(np.stack([a1, a1]), np.stack([b1, b1]), np.stack([a2, a2]), np.stack([b2, b2]), 500)
    assert r["ci95"][0] < want < r["ci95"][1]
    with pytest.raises(ValueError, match="no evaluated user"):
        contrast_bootstrap(a1, b1, a2[:0], b2[:0])


def test_compare_by_value_is_the_paired_bootstrap_of_each_group():
    rng = np.random.default_rng(1)
    values = rng.integers(1, 6, 2000).astype(np.float32)
    a, b = (rng.random(2000) < 0.2).astype(float), (rng.random(2000) < 0.25).astype(float)
    out = compare_by_value(a[None], b[None], values, parse_groups([]), samples=400)
    liked, disliked = values >= 4, values <= 2
    assert out["hr@10 liked"]["diff"] == pytest.approx(paired_bootstrap(a[liked], b[liked], 400)["diff"])
    assert out["hr@10 liked"]["ci95"] == paired_bootstrap(a[liked], b[liked], 400)["ci95"]
    assert out["hr@10 disliked"]["users"] == int(disliked.sum())
    change = out["hr@10 liked - disliked change"]
    assert change["diff"] == pytest.approx(out["hr@10 liked"]["diff"] - out["hr@10 disliked"]["diff"])
    with pytest.raises(ValueError, match="no evaluated user"):
        compare_by_value(a[None], b[None], values, parse_groups(["top=6:"]))
    with pytest.raises(ValueError, match="overlap"):
        compare_by_value(a[None], b[None], values, parse_groups(["x=1:3", "y=3:5"]))
    with pytest.raises(ValueError, match="no value"):
        compare_by_value(a[None], b[None], np.full(2000, np.nan), parse_groups([]))


def test_top_lists_agree_with_beam_ranks_on_random_lists():
    """hit@K of the ranks file (beam_ranks) is exactly `target in the top-K list` (the judged list)."""
    rng = np.random.default_rng(2)
    n, items, width = 300, 40, 12
    lists = np.stack([rng.permutation(np.arange(1, items + 1))[:width] for _ in range(n)]).astype(np.int32)
    lists[rng.random(lists.shape) < 0.1] = 0                                     # dead slots
    targets = rng.integers(1, items + 1, n)
    histories = [rng.choice(np.arange(1, items + 1), rng.integers(0, 8), replace=False) for _ in range(n)]
    for hist in (histories, None):
        ranks = beam_ranks(lists, targets, hist, items)
        for k in (1, 5, 10):
            top = top_lists(lists, targets, hist, k)
            assert ((top == targets[:, None]).any(1) == (ranks < k)).all()
            for u in range(n):                                    # no dead slot, no history item but the target
                kept = top[u][top[u] > 0]
                assert hist is None or not (set(kept.tolist()) & (set(hist[u].tolist()) - {targets[u]}))
                assert len(kept) == min(k, sum(1 for i in lists[u] if i and (hist is None or i not in
                                                                            set(hist[u].tolist()) - {targets[u]})))


def test_coverage_and_its_bootstrap():
    top_a = np.array([[1, 2], [1, 2], [1, 0]])
    top_b = np.array([[1, 2], [3, 4], [5, 6]])
    assert coverage(top_a, 10) == 0.2 and coverage(top_b, 10) == 0.6
    r = coverage_bootstrap([top_a], [top_b], 10, samples=300)
    assert r["a"] == 0.2 and r["b"] == 0.6 and r["diff"] == pytest.approx(0.4)
    assert r["ci95"][0] >= 0 and r["ci95"][1] <= 0.6
    r = coverage_bootstrap([top_a, top_b], [top_b], 10, samples=50)
    assert r["a"] == pytest.approx(0.4) and r["a_runs"] == [0.2, 0.6]


class FakeScorer:
    """score = item id / 10 + the history's mean value: a reward model with a known answer."""

    def score(self, histories, items, history_values=None):
        items = np.asarray(items)
        assert items.ndim == 2 and (items >= 1).all() and len(histories) == len(items)
        base = np.array([np.mean(v) for v in history_values])[:, None]
        return (items / 10.0 + base).astype(np.float32)


def test_judge_reward_is_the_mean_score_of_the_filled_slots():
    top = np.array([[3, 5, 0], [0, 0, 0], [7, 0, 0]])
    hist = [np.array([1, 2]), np.array([4]), np.array([9])]
    values = [np.array([4.0, 2.0]), np.array([5.0]), np.array([1.0])]
    got = judge_rewards(FakeScorer(), hist, values, top)
    assert got[0] == pytest.approx(0.4 + 3.0) and np.isnan(got[1]) and got[2] == pytest.approx(0.7 + 1.0)


def _fake_runs(tmp_path, monkeypatch, values=True):
    """Two 'runs' whose evaluation is a saved ranks file each (no run directories)."""
    import mindgr.train.run_eval as run_eval
    import mindgr.train.tasks as tasks
    from mindgr.train.generative import GenerativeTask
    rng = np.random.default_rng(3)
    targets = np.arange(1, 401)
    extra = {"target_values": rng.integers(1, 6, 400).astype(np.float32)} if values else {}
    files = {}
    for name in "ab":
        files[name] = tmp_path / f"{name}.npz"
        np.savez(files[name], ranks=rng.integers(-1, 30, 400), ties=np.zeros(400, np.int64), targets=targets,
                 **extra)
    monkeypatch.setattr(tasks, "resolve_run", lambda run: GenerativeTask)
    monkeypatch.setattr(run_eval, "evaluate_any_run", lambda run, split, which, filter_history=None, max_users=0: {
        "ranks_file": files[str(run)[-1]], "checkpoint": "best", "hr@10": 0.0})
    return files, extra.get("target_values")


def test_compare_runs_splits_hits_by_the_targets_values(tmp_path, monkeypatch):
    from mindgr.train.compare import compare_runs, format_comparison, load_ranks
    files, values = _fake_runs(tmp_path, monkeypatch)
    out = compare_runs(tmp_path / "a", tmp_path / "b", samples=300, by_value=[])
    ra, rb = (load_ranks(files[n])[0] for n in "ab")
    seen = (ra >= 0) & (rb >= 0)
    liked = seen & (values >= 4)
    r = out["alignment"]["hr@10 liked"]
    assert r["a"] == pytest.approx((ra[liked] < 10).mean()) and r["b"] == pytest.approx((rb[liked] < 10).mean())
    assert r["users"] == liked.sum() and "p_holm" in r
    assert set(out["alignment"]) == {"hr@10 liked", "hr@10 disliked", "hr@10 liked - disliked change"}
    text = format_comparison(out, "a", "b")
    assert "alignment measures (Holm over these 3)" in text and "liked - disliked change" in text
    with pytest.raises(ValueError, match="NAME=LO:HI"):
        compare_runs(tmp_path / "a", tmp_path / "b", by_value=["liked"])
    with pytest.raises(ValueError, match="by-value-metric"):
        compare_runs(tmp_path / "a", tmp_path / "b", samples=10, by_value=[], value_metric="recall@3")


def test_compare_runs_refuses_by_value_on_data_without_values(tmp_path, monkeypatch):
    from mindgr.train.compare import compare_runs
    _fake_runs(tmp_path, monkeypatch, values=False)
    with pytest.raises(ValueError, match="holds no target_values.*value per interaction") as e:
        compare_runs(tmp_path / "a", tmp_path / "b", samples=10, by_value=[])
    assert "\n" not in str(e.value)
