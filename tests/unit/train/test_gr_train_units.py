"""Pieces of the generative run without a run: the plan's closed-form token counts against the rows and tree
layouts built, HSTU evaluation without the history filter, and the throttled progress line of a decode."""
import numpy as np
import pytest

from gr_fixtures import SYNTH, random_codes
from mindgr.config import load_config

pytestmark = pytest.mark.graph_mode("auto")


def _count_cases(seed):
    """(n, objective, merger, layout builder args) over random histories: the cases a closed-form count must
    match, every objective and merger (3 codes per item)."""
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, 40, [5, 5, 3])
    offsets = np.concatenate([[0], np.cumsum([5, 5, 3])])
    for _ in range(20):
        n = int(rng.integers(1, 12))
        items = rng.integers(1, 41, n)
        pages = np.cumsum(np.r_[0, rng.random(n - 1) < 0.5]) if n > 1 else np.zeros(n, np.int64)
        for objective in ("ntp", "page_ntp"):
            for merger in ("none", "item", "item_id", "pairs"):
                yield n, objective, merger, pages, (items, codes, offsets, objective, merger,
                                                    pages if objective == "page_ntp" else None)


def test_row_counts_match_rows():
    """The plan's closed-form token counts equal the rows built, for every objective and merger."""
    from mindgr.models.ntp import user_rows
    from mindgr.train.gr_data import row_token_counts
    for n, objective, merger, pages, args in _count_cases(0):
        want = [r["slots"].shape[0] for r in user_rows(*args)]
        assert row_token_counts(n, 3, objective, merger, pages) == want


def test_tree_counts_match_users():
    """The tree plan's closed-form (prompt, segment, virtual) token counts equal the layouts tree_user builds."""
    from mindgr.models.tree import tree_user, virtual_tokens
    from mindgr.train.gr_data import tree_token_counts
    for n, objective, merger, pages, args in _count_cases(1):
        u = tree_user(*args)
        want = (0, 0, 0) if u is None else (u["prompt_slots"].shape[0], 2 * len(u["targets"]), virtual_tokens(u))
        assert tree_token_counts(n, 3, objective, merger, pages) == want


def test_hstu_eval_without_history_filter():
    """eval.filter_history=false: evaluate() ranks against every item, history included."""
    from mindgr.train.data import RunData
    from mindgr.train.evaluate import evaluate
    from mindgr.train.metrics import target_ranks
    data = RunData(load_config(None, SYNTH + ["model.time_bias=false"]))
    rng = np.random.default_rng(1)
    table = rng.normal(size=(data.num_items + 1, 8)).astype(np.float32)
    users = {}

    class FakeEncoder:               # a user vector per row, fixed by the row's first item id
        def __call__(self, ids, positions, offsets, timestamps, request_times):
            off = offsets.asnumpy()
            first = ids.asnumpy()[np.minimum(off[:-1], len(ids.asnumpy()) - 1)]
            vec = np.stack([users.setdefault(int(i), rng.normal(size=8).astype(np.float32)) for i in first])
            return type("T", (), {"asnumpy": lambda self: vec})()

    ev = data.split.test
    got = {}
    for flt in (True, False):
        _, ranks, _ = evaluate(FakeEncoder(), table, data.eval["test"], ev, [10], per_user=True, filter_history=flt)
        got[flt] = ranks
    assert (got[False] >= got[True]).all() and (got[False] > got[True]).any()
    scores = np.stack([users[int(h[-12:][0])] for h in ev.histories]) @ table.T
    want, _ = target_ranks(scores, ev.targets, [()] * len(ev.targets))
    assert np.array_equal(got[False], want)


def test_progress_printer_is_throttled_and_silent_at_the_end():
    from mindgr.train.gr_eval import progress_printer
    lines = []
    report = progress_printer("test", every_s=30.0, emit=lines.append)
    report(100, 1000, 10.0)        # too early
    report(400, 1000, 40.0)        # printed: 400 users in 40 s, 600 left at 10 users/s = 1.0 min
    report(500, 1000, 50.0)        # within 30 s of the last line
    report(1000, 1000, 100.0)      # the end: the caller prints its own summary
    assert lines == ["decode test: 400/1000 users (40%), 10 users/s, about 1.0 min left"]


def test_trie_head_batches_of_a_rank():
    """With the trie head, a rank's batch (its share of the global batch's examples at its own token capacity)
    carries entries at that capacity, the same loss entries as the global batch's split, and the head-code
    count a rank reports for the whole global batch (GRExamples.head_codes) equals the global batch's."""
    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.trie_head import entry_capacity
    from mindgr.train.generative import GRExamples, entry_codes
    from mindgr.train.gr_data import GRTrainData, training_windows
    rng = np.random.default_rng(4)
    sizes = [6, 6, 3]
    codes = random_codes(rng, 60, sizes)
    trie = PrefixTrie(codes, sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    histories = [rng.integers(1, 61, int(rng.integers(2, 9))) for _ in range(24)]
    windows = training_windows([h[:-1] for h in histories], [h[-1:] for h in histories])  # one example each
    train = GRTrainData(windows, codes, offsets, int(offsets[-1]), "ntp", "item", 8, 0, 0, None,
                        trie.item_nodes(), entry_codes(trie))
    examples = GRExamples(train)
    indices = np.asarray(train.plan.batches(0)[0], np.int64)          # the first planned global batch
    whole, info = train.batch(indices)
    halves = [indices[: len(indices) // 2], indices[len(indices) // 2:]]
    rank_cap = int(max(train.tokens[h].sum() for h in halves))           # the larger share's real tokens
    assert rank_cap < train.token_capacity
    got_codes = 0
    for half in halves:
        part, part_info = train.batch(half, rank_cap, train.row_capacity)
        assert part["pos"].shape[0] == entry_capacity(rank_cap, len(sizes) + 1) * (len(sizes) + 1)
        got_codes += part_info["head_codes"]
    assert got_codes == info["head_codes"] == examples.head_codes(indices) > 0
    assert whole["weight"].sum() == pytest.approx(sum(examples[indices]))
