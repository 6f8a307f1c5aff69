"""The decoding engine (shared prompt K/V, per-beam records with parent indices, split attention, partial
selection, reused masks) against the naive baseline (whole sequences recomputed, full sort, masks rebuilt
per step) on random models, histories and beam widths.

Tolerance: items equal; scores |engine - naive| <= 2e-5 + 1e-5 |naive| (float32: the engine sums the
prompt and ancestry parts of attention separately, the baseline in one pass; a score is the sum of Lt
log-probs). Memory: the engine's own tensors hold layers x H x (dqk + dv) x 4 bytes x
(users x P_cap + users x beam x (Lt-1)): prompt + beams x steps, not beams x (prompt + steps).
"""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.generate.beam import beam_search, select_full_sort
from mindgr.generate.children import level_pair_logits, pair_logits, select_ragged
from mindgr.generate.engine import DecodingEngine, select_partial
from mindgr.ids.trie import PrefixTrie
from mindgr.models.generative import GRDecoder, RecomputeScorer
from mindgr.ops import set_backend
from gr_fixtures import fast_backend, random_codes  # noqa: F401

# slow: engine vs naive over several models and beam widths (~20 s)
pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]




def case(seed, merger, sizes, num_items, users, dim=8, blocks=2, trie_softmax=False):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, num_items, sizes)
    dec = GRDecoder(sizes, dim, blocks, 2, 4, 4, max_len=16, token_merger=merger, seed=seed, num_items=num_items,
                    trie_softmax=trie_softmax)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.3).astype(np.float32)))
    hist = [rng.integers(1, num_items + 1, int(rng.integers(1, 4))) for _ in range(users)]
    return codes, dec, hist


@pytest.mark.parametrize("seed,merger,beam,backend", [(0, "none", 4, "fast"), (2, "item", 5, "fast"),
                                                      (3, "pairs", 7, "reference"), (4, "item_id", 5, "fast")])
def test_engine_equals_naive_baseline(seed, merger, beam, backend):
    """The prefill and the baseline run the blocks' jagged attention: the fused C++ kernels (when they
    build) and, in one case, the pure-MindSpore reference."""
    if backend == "reference":
        set_backend("reference")
    try:
        _engine_vs_naive(seed, merger, beam)
    finally:
        fast_backend()


def _engine_vs_naive(seed, merger, beam):
    sizes = [4, 3, 3] if seed % 2 == 0 else [3, 4, 2, 2]
    codes, dec, hist = case(seed, merger, sizes, 30, users=3)
    trie = PrefixTrie(codes, sizes)
    k = 4
    engine = DecodingEngine(dec, trie, codes, beam, 12, num_users=4)
    naive = DecodingEngine(dec, trie, codes, beam, 12, num_users=4, cache="recompute", selection="full_sort",
                           masks="rebuild")
    per_beam = DecodingEngine(dec, trie, codes, beam, 12, num_users=4, cache="per_beam")
    items, scores = engine.search(hist, k)
    want_items, want_scores = naive.search(hist, k)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=2e-5)
    assert (items > 0).all()
    # the cached baseline (prompt K/V copied per beam, reordered by parent each step): the same lists
    pb_items, pb_scores = per_beam.search(hist, k)
    np.testing.assert_array_equal(pb_items, want_items)
    np.testing.assert_allclose(pb_scores, want_scores, rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(per_beam.search(hist[::-1], k)[0], want_items[::-1])
    # a second request reuses the same graphs and masks and gives its own answer
    items2, _ = engine.search(hist[::-1], k)
    np.testing.assert_array_equal(items2, items[::-1])


def test_per_beam_cache_reorders_by_parent():
    """A state-level check that the per-beam cache really follows the parents: steps fed with random codes
    and random parents give the shared state's logits (which finds ancestry by parent indices instead)."""
    sizes = [4, 3, 3, 2]
    codes, dec, hist = case(11, "item", sizes, 30, users=2)
    rng = np.random.default_rng(3)
    u, beam, p_cap = 2, 5, 9
    shared = dec.decode_state(u, beam, p_cap)
    per_beam = dec.decode_state(u, beam, p_cap, layout="per_beam")
    prompts = dec.prompts(hist, codes, p_cap)
    np.testing.assert_allclose(per_beam.prefill(prompts), shared.prefill(prompts), rtol=1e-5, atol=1e-5)
    parents = [np.zeros((u, beam), np.int64)]
    for level in range(1, len(sizes)):
        step_codes = rng.integers(0, sizes[level - 1], (u, beam))
        want = shared.step(level, step_codes, parents)
        got = per_beam.step(level, step_codes, parents)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        parents.append(rng.integers(0, beam, (u, beam)))
    blk = dec.blocks[0]
    per_token = dec.num_blocks * blk.h * (blk.dqk + blk.dv) * 4
    assert per_beam.nbytes()["beams"] == per_token * u * beam * (p_cap + len(sizes) - 1)


def test_cache_bytes_grow_with_prompt_plus_beams_times_steps():
    sizes = [4, 3, 3]
    codes, dec, hist = case(7, "none", sizes, 25, users=2)
    trie = PrefixTrie(codes, sizes)
    blk = dec.blocks[0]
    per_token = dec.num_blocks * blk.h * (blk.dqk + blk.dv) * 4
    steps = len(sizes) - 1
    seen = {}
    for p_cap, beam in [(6, 4), (12, 8)]:
        eng = DecodingEngine(dec, trie, codes, beam, p_cap, num_users=2)
        eng.state.prefill([(np.zeros((2, 1), np.int32), np.zeros(2, np.float32))] * 2)   # allocates the cache
        got = eng.cache_nbytes()
        assert got["prompt"] == per_token * 2 * p_cap
        assert got["beams"] == per_token * 2 * beam * steps
        replicated = per_token * 2 * beam * (p_cap + steps)
        assert got["prompt"] + got["beams"] < replicated
        seen[(p_cap, beam)] = got
    # prompt bytes follow the prompt only, beam bytes the beam only (x steps)
    assert seen[(12, 8)]["prompt"] == 2 * seen[(6, 4)]["prompt"]
    assert seen[(12, 8)]["beams"] == 2 * seen[(6, 4)]["beams"]


@pytest.mark.parametrize("seed", range(8))
def test_partial_selection_equals_full_sort(seed):
    rng = np.random.default_rng(seed)
    u, bm, c = 3, int(rng.integers(1, 9)), int(rng.integers(1, 12))
    width = int(rng.integers(1, 12))
    cand = rng.standard_normal((u, bm, c)).astype(np.float32)
    cand[rng.random(cand.shape) < 0.4] = -np.inf              # invalid codes and dead beams
    cand[:, -1] = -np.inf
    got, want = select_partial(cand, width), select_full_sort(cand, width)
    live = np.isfinite(want[2])
    np.testing.assert_array_equal(got[2], want[2])
    np.testing.assert_array_equal(got[0][live], want[0][live])
    np.testing.assert_array_equal(got[1][live], want[1][live])


@pytest.mark.parametrize("seed,merger,trie_softmax,beam,users", [(21, "item", True, 6, 5), (22, "none", False, 40, 2),
                                                                 (23, "pairs", True, 3, 4)])
def test_children_scoring_equals_full_scoring_and_the_reference(seed, merger, trie_softmax, beam, users):
    """The engine's default scoring (the trie's allowed codes only: the step graph without the code head, the
    head on the host, ragged top-k over many users' beams at once) returns the lists of the whole-level
    scoring, of the plain beam search over recomputed sequences and of the per-beam cache (whose logits
    are gathered at the allowed codes): with and without the trie softmax, fewer users than the batch
    capacity, and a beam wider than the trie's first level (dead beams)."""
    sizes = [5, 3, 3, 2] if seed % 2 else [4, 4, 3]
    codes, dec, hist = case(seed, merger, sizes, 40, users, trie_softmax=trie_softmax)
    trie = PrefixTrie(codes, sizes)
    k = min(beam, 4)
    cap = users + 1
    children = DecodingEngine(dec, trie, codes, beam, 12, num_users=cap)
    full = DecodingEngine(dec, trie, codes, beam, 12, num_users=cap, head="full")
    full.state.share_graphs(children.state)             # one prefill graph (CI time); each head its step
    per_beam = DecodingEngine(dec, trie, codes, beam, 12, num_users=cap, cache="per_beam")
    assert children.state.gives_hidden and not getattr(per_beam.state, "gives_hidden", False)
    items, scores = children.search(hist, k)
    ref_items, ref_scores = beam_search(trie, RecomputeScorer(dec, hist, codes, beam, 12), users, beam, k,
                                        renormalize=trie_softmax)
    np.testing.assert_array_equal(items, ref_items)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=2e-5)
    for other in (full, per_beam):
        o_items, o_scores = other.search(hist, k)
        np.testing.assert_array_equal(o_items, items)
        np.testing.assert_allclose(o_scores, scores, rtol=1e-5, atol=2e-5)
    if beam > trie.masks[0][0].sum():          # more beams than first codes: the dead slots agree too
        assert (children.search(hist, beam)[0] == full.search(hist, beam)[0]).all()
    # the engine's state is reused by the next batch: another order of the users gives their own lists
    np.testing.assert_array_equal(children.search(hist[::-1], k)[0], items[::-1])
    # excluding items (each user's history plus the first item of its list): every path drops them at
    # the last level and returns the same best others as the reference
    exclude = [np.concatenate([h, items[u, :1]]) for u, h in enumerate(hist)]
    ex_items, ex_scores = children.search(hist, k, exclude=exclude)
    ref_items, ref_scores = beam_search(trie, RecomputeScorer(dec, hist, codes, beam, 12), users, beam, k,
                                        renormalize=trie_softmax, exclude=exclude)
    np.testing.assert_array_equal(ex_items, ref_items)
    np.testing.assert_allclose(ex_scores, ref_scores, rtol=1e-5, atol=2e-5)
    for other in (full, per_beam):
        np.testing.assert_array_equal(other.search(hist, k, exclude=exclude)[0], ex_items)
    for u in range(users):
        assert not np.isin(ex_items[u], exclude[u]).any()


@pytest.mark.parametrize("seed", range(10))
def test_ragged_selection_equals_stable_sort(seed):
    """select_ragged (per user the width best of a ragged candidate list, in tie order) against a stable sort
    per user, with exact ties (values from a few integers), -inf candidates and users with no candidates."""
    rng = np.random.default_rng(seed)
    users, width = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    counts = rng.integers(0, 14, users)
    owner = np.repeat(np.arange(users), counts)
    vals = rng.integers(-4, 2, owner.shape[0]).astype(np.float32)
    vals[rng.random(vals.shape) < 0.2] = -np.inf
    pick, score = select_ragged(vals, owner, users, width)
    first = np.cumsum(counts) - counts
    for u in range(users):
        mine = vals[first[u]:first[u] + counts[u]]
        order = np.argsort(-mine, kind="stable")[:width]
        order = order[np.isfinite(mine[order])]
        n = order.shape[0]
        np.testing.assert_array_equal(pick[u, :n], first[u] + order)
        np.testing.assert_array_equal(score[u, :n], mine[order])
        assert (pick[u, n:] == -1).all() and np.isneginf(score[u, n:]).all()


def test_dense_pair_logits_equal_the_gathered_ones():
    """level_pair_logits (a level's dense logits per chunk of live rows, then the pairs picked) against
    pair_logits (a head row gathered per pair) and a float64 reference: rows without pairs, rows spread
    over several chunks (a level wide enough that a chunk holds few rows), the normaliser of every live row."""
    rng = np.random.default_rng(7)
    n, d, k, a = 40, 16, 1 << 18, 5                    # k: chunks of 16 rows
    hidden = rng.standard_normal((n, d)).astype(np.float32)
    w_t = (rng.standard_normal((a + k + 3, d)) * 0.1).astype(np.float32)      # [sum K, D], level at [a, a+k)
    bias = (rng.standard_normal(a + k + 3) * 0.1).astype(np.float32)
    counts = rng.integers(0, 4, n)
    counts[[0, 7, n - 1]] = 0
    beam = np.repeat(np.arange(n), counts)
    child = np.concatenate([np.sort(rng.choice(k, c, replace=False)) for c in counts]).astype(np.int64)
    z, lse = level_pair_logits(hidden, w_t[a:a + k].T, bias[a:a + k], beam, child, counts, True)
    gathered = pair_logits(hidden, w_t, bias, beam, a + child)
    ref = np.einsum("md,md->m", hidden[beam].astype(np.float64), w_t[a + child].astype(np.float64)) + bias[a + child]
    np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, gathered, rtol=1e-5, atol=1e-5)
    live = counts > 0
    dense = hidden[live].astype(np.float64) @ w_t[a:a + k].T.astype(np.float64) + bias[a:a + k]
    m = dense.max(1)
    np.testing.assert_allclose(lse[live], m + np.log(np.exp(dense - m[:, None]).sum(1)), rtol=1e-6)
    assert not lse[~live].any()
    assert level_pair_logits(hidden, w_t[a:a + k].T, bias[a:a + k], beam, child, counts, False)[1] is None


def test_bad_engine_options_are_one_line():
    codes, dec, _ = case(0, "none", [3, 3], 6, users=1)
    trie = PrefixTrie(codes, [3, 3])
    with pytest.raises(ValueError, match="decode cache = 'dense': expected one of shared, per_beam, replay, recompute"):
        DecodingEngine(dec, trie, codes, 4, 6, 1, cache="dense")
    with pytest.raises(ValueError, match="decode selection = 'heap': expected one of partial, full_sort"):
        DecodingEngine(dec, trie, codes, 4, 6, 1, selection="heap")
    with pytest.raises(ValueError, match="decode head = 'all': expected one of children, full"):
        DecodingEngine(dec, trie, codes, 4, 6, 1, head="all")
    with pytest.raises(ValueError, match="exceeds the decoder's max_len 16"):
        DecodingEngine(dec, trie, codes, 4, 16, 1)
