"""Trie-constrained beam search: valid tuples only, equal to exhaustive scoring when the beam covers
every prefix (fp32 scores within 1e-5 absolute: sums of Lt float32 log-probs), and ranks like eval."""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.generate.beam import BeamError, ItemExclusion, beam_ranks, beam_search, topk_items
from mindgr.ids.trie import PrefixTrie
from mindgr.models.generative import GRDecoder, RecomputeScorer, item_log_probs
from gr_fixtures import fast_backend, random_codes  # noqa: F401

pytestmark = pytest.mark.graph_mode("auto")




class HashScorer:
    """log-probs that depend only on (user, prefix): a deterministic stand-in for a model."""

    def __init__(self, sizes, seed):
        self.sizes, self.seed = sizes, seed

    def logp(self, u, prefix):
        rng = np.random.default_rng([self.seed, u, len(prefix), *[int(c) for c in prefix]])
        z = rng.standard_normal(self.sizes[len(prefix)]) * 2
        return z - np.log(np.exp(z).sum())

    def step(self, level, prefixes):
        return np.array([[self.logp(u, p) for p in row] for u, row in enumerate(prefixes)], np.float32)

    def advance(self, parent, code, alive):
        pass

    def item_scores(self, codes, num_users):
        out = np.full((num_users, codes.shape[0]), -np.inf, np.float32)
        for u in range(num_users):
            for i in range(1, codes.shape[0]):
                out[u, i] = sum(self.logp(u, codes[i, :l])[codes[i, l]] for l in range(codes.shape[1]))
        return out


def max_prefixes(trie):
    return max(trie.num_prefixes(level) for level in range(trie.num_levels))


@pytest.mark.parametrize("seed", range(6))
def test_only_valid_distinct_items_and_exhaustive_when_beam_covers(seed):
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(2, 6)) for _ in range(int(rng.integers(2, 5)))]
    codes = random_codes(rng, int(rng.integers(3, min(30, int(np.prod(sizes))) + 1)), sizes)
    trie = PrefixTrie(codes, sizes)
    scorer = HashScorer(sizes, seed)
    users, v = 3, codes.shape[0] - 1
    for beam, k in [(2, 2), (4, 3), (max(max_prefixes(trie), v), min(5, v))]:
        items, scores = beam_search(trie, scorer, users, beam, k)
        assert items.shape == (users, k) and scores.shape == (users, k)
        for u in range(users):
            live = items[u][np.isfinite(scores[u])]
            assert (live > 0).all() and len(set(live.tolist())) == len(live)
            assert (np.diff(scores[u][np.isfinite(scores[u])]) <= 0).all()
        # with B >= v every beam keeps k live items
        if beam >= v:
            assert np.isfinite(scores).all()
    beam = max(max_prefixes(trie), 1)
    k = min(4, v)
    items, scores = beam_search(trie, scorer, users, max(beam, k), k)
    want_items, want_scores = topk_items(scorer.item_scores(codes, users), k)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)
    # rebuilt masks (the naive baseline) give the same lists
    items2, scores2 = beam_search(trie, scorer, users, max(beam, k), k, rebuild_masks=True)
    np.testing.assert_array_equal(items2, items)
    np.testing.assert_array_equal(scores2, scores)


@pytest.mark.parametrize("seed", range(6))
def test_excluded_items_are_replaced_by_the_next_best(seed):
    """exclude: with a beam that covers every prefix the list is the exhaustive top k of the other items;
    with a narrow beam it is the unexcluded search's widest last level with those items removed (earlier
    levels are unchanged, the last level picks among the same beams' children)."""
    rng = np.random.default_rng([seed, 9])
    sizes = [int(rng.integers(3, 6)) for _ in range(int(rng.integers(1, 4)))]
    codes = random_codes(rng, int(rng.integers(3, min(24, int(np.prod(sizes))) + 1)), sizes)
    trie = PrefixTrie(codes, sizes)
    scorer = HashScorer(sizes, seed)
    users, v = 3, codes.shape[0] - 1
    exclude = [rng.choice(np.arange(1, v + 1), int(rng.integers(0, v // 2 + 1)), replace=False) for _ in range(users)]
    item_scores = scorer.item_scores(codes, users)
    for u in range(users):
        item_scores[u, exclude[u]] = -np.inf
    k = min(3, v - max(len(e) for e in exclude))
    items, scores = beam_search(trie, scorer, users, max(max_prefixes(trie), v), k, exclude=exclude)
    want_items, want_scores = topk_items(item_scores, k)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)
    beam = 2
    wide, wide_scores = beam_search(trie, scorer, users, beam, beam)
    narrow, narrow_scores = beam_search(trie, scorer, users, beam, beam, exclude=ItemExclusion(exclude))
    for u in range(users):
        keep = np.isfinite(wide_scores[u]) & ~np.isin(wide[u], exclude[u])
        n = int(keep.sum())
        np.testing.assert_array_equal(narrow[u][:n], wide[u][keep])
        assert not np.isin(narrow[u][np.isfinite(narrow_scores[u])], exclude[u]).any()


def test_exclusion_membership_is_per_user():
    ex = ItemExclusion([np.array([3, 5]), None, np.array([5])])
    owner = np.array([0, 0, 1, 2, 2, 0])
    got = ex.hits(owner, np.array([3, 4, 5, 5, 3, 0]))
    assert got.tolist() == [True, False, False, True, False, False]
    assert not ItemExclusion([None]).hits(np.array([0]), np.array([1])).any()
    with pytest.raises(BeamError):
        beam_search(PrefixTrie(np.array([[0], [0], [1]]), [2]), HashScorer([2], 0), 2, 2, 1, exclude=[[1]])


@pytest.mark.parametrize("seed", range(3))
def test_renormalized_beam_equals_exhaustive_over_trie_children(seed):
    """renormalize=True (the trie softmax's scoring rule): an item's score is the sum over its codes of the
    log-softmax over the codes the trie allows after its prefix; a covering beam finds the exact top k."""
    rng = np.random.default_rng([seed, 5])
    sizes = [int(rng.integers(2, 6)) for _ in range(3)]
    codes = random_codes(rng, int(rng.integers(4, min(30, int(np.prod(sizes))) + 1)), sizes)
    trie = PrefixTrie(codes, sizes)
    scorer = HashScorer(sizes, seed)
    users, v = 3, codes.shape[0] - 1
    tuples = [tuple(r) for r in codes[1:].tolist()]
    want = np.full((users, v + 1), -np.inf, np.float32)
    for u in range(users):
        for i, t in enumerate(tuples, start=1):
            total = 0.0
            for level in range(len(sizes)):
                children = sorted({c[level] for c in tuples if c[:level] == t[:level]})
                z = scorer.logp(u, np.asarray(t[:level]))[children]
                total += z[children.index(t[level])] - np.log(np.exp(z - z.max()).sum()) - z.max()
            want[u, i] = total
    k = min(4, v)
    items, scores = beam_search(trie, scorer, users, max(max_prefixes(trie), k), k, renormalize=True)
    want_items, want_scores = topk_items(want, k)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)
    # renormalising over a subset of the codes never lowers an item's score, and raises it when some
    # level of the item has a sibling code outside the trie
    plain = scorer.item_scores(codes, users)
    assert (want[:, 1:] >= plain[:, 1:] - 1e-6).all() and (want[:, 1:] > plain[:, 1:] + 1e-6).any()


def randomize(cell, rng, scale=0.3):
    for p in cell.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32)))


def gr_case(seed, merger, num_items=14, sizes=(3, 3, 2)):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, num_items, list(sizes))
    dec = GRDecoder(list(sizes), 8, 2, 2, 4, 4, max_len=12, token_merger=merger, seed=seed, num_items=num_items)
    randomize(dec, rng)
    histories = [rng.integers(1, num_items + 1, n) for n in (1, 3, 2)]
    return rng, codes, dec, histories


@pytest.mark.parametrize("merger", ["none", "item", "item_id", "pairs"])
def test_decoder_beam_equals_exhaustive(merger):
    _, codes, dec, histories = gr_case(4, merger)
    trie = PrefixTrie(codes, dec.level_sizes)
    beam, k = max(max_prefixes(trie), 5), 5
    cap = 9
    scorer = RecomputeScorer(dec, histories, codes, beam, cap)
    items, scores = beam_search(trie, scorer, len(histories), beam, k)
    want_items, want_scores = topk_items(item_log_probs(dec, histories, codes, cap), k)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("merger", ["none", "item_id", "pairs"])
def test_target_log_probs_equal_the_exhaustive_teacher_forcing(merger):
    """`mindgr compare --by-value-metric target_logp`'s per-user figure (mindgr.train.gr_eval): log p(target |
    the last max_history items), in batches with a padded last one, equals the exhaustive reference's entry."""
    from types import SimpleNamespace
    from mindgr.models.generative import max_prompt_tokens
    from mindgr.train.gr_eval import target_log_probs
    rng, codes, dec, _ = gr_case(7, merger)
    max_history = 3
    histories = [rng.integers(1, 15, n) for n in (1, 5, 2, 4, 3)]           # two longer than max_history
    targets = rng.integers(1, 15, len(histories))
    evalset = SimpleNamespace(histories=histories, targets=targets)
    rows = np.array([4, 0, 1, 3])
    got = target_log_probs(dec, codes, evalset, rows, max_history, batch_users=3)
    cap = max_prompt_tokens(dec.num_levels, merger, max_history)
    want = item_log_probs(dec, [histories[r][-max_history:] for r in rows], codes, cap)[np.arange(len(rows)),
                                                                                       targets[rows]]
    assert np.all(want < 0) and len(np.unique(want)) == len(rows)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_beam_ranks_like_eval():
    items = np.array([[5, 3, 9, 0], [2, 7, 4, 1], [8, 6, 1, 3]])
    hist = [[5], [7, 4], [1]]
    targets = [9, 4, 2]
    # user 0: 5 is history -> list 3, 9: rank 1; user 1: target 4 is in the history but is the target
    # (kept), 7 removed -> 2, 4: rank 1; user 2: target 2 absent -> miss = num_items
    assert beam_ranks(items, targets, hist, 20).tolist() == [1, 1, 20]
    assert beam_ranks(items, [5, 2, 3], None, 20).tolist() == [0, 0, 3]


def test_beam_width_error():
    trie = PrefixTrie(np.array([[0, 0], [1, 1], [0, 1]]), [2, 2])
    with pytest.raises(BeamError, match="beam width 2 must be >= the list length k = 3"):
        beam_search(trie, HashScorer([2, 2], 0), 1, 2, 3)
