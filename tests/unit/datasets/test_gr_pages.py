"""Request pages: the synthetic generator's pages, pages from equal timestamps, the page holdout, page
recall of a generated list, and their config errors (issue 17, page-wise vs point-wise NTP)."""
import hashlib

import numpy as np
import pytest

from mindgr.config import ConfigError, config_from_dict
from mindgr.datasets import SequenceStore, generate_synthetic
from mindgr.datasets.pages import page_bounds, page_leave_one_out, timestamp_pages
from mindgr.train.gr_eval import page_recall

_SMALL = dict(num_users=50, num_items=40, median_len=8, max_len=20, num_clusters=4, seed=3)
# sha256 of the store generate_synthetic(**_SMALL) gave before pages existed (item and time sequences,
# raw item ids, user ids): page_size 0 must keep every existing synthetic run's data bit for bit.
_BEFORE_PAGES = "5d3f367c9b5191863225eaa81b89338cb5b463909026c130cacd774dd3b476ae"


def _digest(store):
    h = hashlib.sha256()
    for a in store.item_seqs + store.time_seqs + [store.item_raw_ids, store.user_ids]:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def test_synthetic_without_pages_is_unchanged():
    for store in (generate_synthetic(**_SMALL), generate_synthetic(**_SMALL, page_size=0)):
        assert _digest(store) == _BEFORE_PAGES
        assert store.page_seqs is None


def test_synthetic_pages_deterministic_and_well_formed():
    a = generate_synthetic(num_users=300, num_items=200, median_len=20, max_len=40, seed=1, page_size=3)
    b = generate_synthetic(num_users=300, num_items=200, median_len=20, max_len=40, seed=1, page_size=3)
    assert _digest(a) == _digest(b)
    assert all(np.array_equal(x, y) for x, y in zip(a.page_seqs, b.page_seqs))
    plain = generate_synthetic(num_users=300, num_items=200, median_len=20, max_len=40, seed=1)
    assert np.array_equal(a.lengths(), plain.lengths())            # same lengths, now in pages
    sizes = []
    for items, pages, times in zip(a.item_seqs, a.page_seqs, a.time_seqs):
        bounds = page_bounds(pages)
        assert np.array_equal(np.unique(pages), np.arange(len(bounds) - 1))   # ids 0.. in order, consecutive
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            assert len(np.unique(times[lo:hi])) == 1                 # one request, one time
            assert len(np.unique(items[lo:hi])) == hi - lo           # a page holds distinct items
        assert (np.diff(times[bounds[:-1]]) > 0).all()               # pages strictly later
        sizes += list(np.diff(bounds))
    assert 2.5 < np.mean(sizes) < 3.5
    with pytest.raises(ValueError, match="page_size"):
        generate_synthetic(**_SMALL, page_size=0.5)


def _store(items, times):
    return SequenceStore(name="tiny", user_ids=np.arange(1, len(items) + 1), item_seqs=[np.array(s, np.int32) for s in items],
                         time_seqs=None if times is None else [np.array(t, np.int64) for t in times],
                         item_raw_ids=np.arange(-1, 10), time_unit="s")


def test_timestamp_pages_and_page_holdout():
    store = _store([[1, 2, 3, 4, 5, 6, 7], [8, 9], [3, 4, 5]], [[5, 5, 7, 9, 9, 9, 12], [0, 0], [1, 2, 2]])
    paged, dropped = timestamp_pages(store)
    assert dropped == 1                                              # user 2 has only zero times
    assert [p.tolist() for p in paged.page_seqs] == [[0, 0, 1, 2, 2, 2, 3], [0, 1, 1]]
    assert paged.user_ids.tolist() == [1, 3]
    split = page_leave_one_out(paged, holdout=2)
    assert [s.tolist() for s in split.train] == [[1, 2, 3]]          # user 3's training page is one item
    assert split.valid.users.tolist() == [0] and split.valid.targets.tolist() == [4]
    assert split.valid.page_items[0].tolist() == [4, 5, 6] and split.valid.histories[0].tolist() == [1, 2, 3]
    assert split.test.users.tolist() == [0, 1] and split.test.targets.tolist() == [7, 4]
    assert [p.tolist() for p in split.test.page_items] == [[7], [4, 5]]
    assert split.test.history_times[1].tolist() == [1] and split.test.target_times.tolist() == [12, 2]
    assert [s.tolist() for s in page_leave_one_out(paged, holdout=1).train] == [[1, 2, 3, 4, 5, 6]]
    with pytest.raises(ValueError, match="no timestamps"):
        timestamp_pages(_store([[1, 2]], None))
    with pytest.raises(ValueError, match="no pages"):
        page_leave_one_out(store)


def test_page_recall_hand_computed():
    items = np.array([[3, 0, 9, 4, 7, 1], [5, 6, 2, 8, 3, 4]])
    pages = [[4, 1, 8], [2]]
    hist = [[9], [5, 6]]
    # user 0, unfiltered: top-2 [3, 0->dead, 9] = {3, 9}: 0 of min(2, 3); top-5 {3, 9, 4, 7, 1}: 2 of 3
    # user 1, unfiltered: top-2 {5, 6}: 0 of 1; top-5: 2 is there: 1 of 1
    r = page_recall(items, pages, None, [2, 5])
    assert r["page_recall@2"].tolist() == [0.0, 0.0] and r["page_recall@5"].tolist() == [2 / 3, 1.0]
    # filtered: user 0's 9 leaves the list: top-2 {3, 4} = 1 of 2; user 1's 5, 6 leave: top-2 {2, 8}: 1 of 1
    r = page_recall(items, pages, hist, [2, 5])
    assert r["page_recall@2"].tolist() == [0.5, 1.0] and r["page_recall@5"].tolist() == [2 / 3, 1.0]


@pytest.mark.parametrize("data, message", [
    ({"kind": "sequences", "path": "x.txt", "pages": "timestamps"}, "no timestamps"),
    ({"pages": "timestamps", "synthetic": {"page_size": 3}}, "one source only"),
    ({"kind": "csv", "path": "x.csv", "pages": "timestamps", "csv": {"page_column": "req"}}, "one source only"),
    ({"kind": "movielens-1m", "path": "x.dat", "synthetic": {"page_size": 3}}, "only for data.kind synthetic"),
    ({"holdout_unit": "page"}, "needs pages"),
    ({"kind": "movielens-1m", "path": "x.dat", "holdout_unit": "page"}, "needs pages"),
])
def test_page_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"data": data})
    config_from_dict({"data": {"holdout_unit": "page", "synthetic": {"page_size": 3}}})
    config_from_dict({"data": {"kind": "movielens-1m", "path": "x.dat", "pages": "timestamps", "holdout_unit": "page"}})


def test_compare_reads_page_recall_from_ranks_files(tmp_path, monkeypatch):
    import mindgr.train.run_eval as run_eval
    from mindgr.train.compare import compare_runs
    targets = np.arange(1, 5)
    files = {}
    for name, ranks, recall in (("a", [0, 3, 20, 1], [1.0, 0.5, 0.0, -1.0]), ("b", [0, 2, 1, 1], [1.0, 1.0, 0.5, 0.5])):
        files[name] = tmp_path / f"{name}.npz"
        np.savez(files[name], ranks=np.array(ranks), ties=np.zeros(4, np.int64), targets=targets,
                 **{"metric_page_recall@10": np.array(recall)})
    import mindgr.train.tasks as tasks
    from mindgr.train.generative import GenerativeTask
    monkeypatch.setattr(tasks, "resolve_run", lambda run: GenerativeTask)     # no run directories here
    monkeypatch.setattr(run_eval, "evaluate_any_run", lambda run, split, which, filter_history=None, max_users=0: {
        "ranks_file": files[str(run)[-1]], "checkpoint": "best", "hr@10": 0.0})
    out = compare_runs(tmp_path / "a", tmp_path / "b", samples=200)
    r = out["metrics"]["page_recall@10"]               # user 3 was not evaluated by a: left out
    assert r["a"] == pytest.approx(0.5) and r["b"] == pytest.approx(2.5 / 3) and r["ci95"][0] <= r["diff"] <= r["ci95"][1]
    assert out["metrics"]["hr@10"]["b"] == 1.0
