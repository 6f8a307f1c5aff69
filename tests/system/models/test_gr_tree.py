"""Shared-prompt (tree) training layout: its loss and gradients equal NTPLoss over the copied rows of the
same users (random models, merger none | item | item_id | pairs, ntp and page_ntp; level and trie softmax groups),
its virtual rows are the copied rows, fewer tokens than copied rows, and one-line errors for capacities
and max_len.

Tolerances: both sides are float32 MindSpore over the same weights; loss |d| <= 1e-5 (1 + |ref|),
gradients |d| <= 2e-4 max|g| + 1e-6 per parameter."""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.models.generative import GRDecoder
from mindgr.models.ntp import NTPLoss, RowError, batch_tensors, pack_rows, user_rows
from mindgr.models.tree import TreeCaps, TreeNTPLoss, pack_tree, tree_tensors, tree_tokens, tree_user
from mindgr.ops import set_backend
from gr_fixtures import LossGrad, fast_backend, random_codes, randomize  # noqa: F401

# slow: one graph compile per layout equality case (~40 s in all)
pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]

SIZES = [4, 3, 2, 3]
D, H, DQK, DV, NBLK = 8, 2, 3, 4, 2
MAX_LEN = 24




def _histories(rng, num_items, objective):
    out = []
    for n in (5, 3, 6):
        items = rng.integers(1, num_items + 1, n)
        pages = np.arange(n) if objective == "ntp" else np.sort(rng.integers(0, 3, n))
        out.append((items, pages))
    return out


def _copied_rows(items, pages, codes, dec, objective):
    """Every (prompt, target) its own row, also for ntp without merger (not the flat row)."""
    if objective == "ntp" and dec.token_merger == "none":
        # same targets as the flat row: page_ntp with one item per page builds one row per target
        return user_rows(items, codes, dec.level_offsets, "page_ntp", "none", pages=np.arange(len(items)))
    return user_rows(items, codes, dec.level_offsets, objective, dec.token_merger, pages=pages)


@pytest.mark.parametrize("objective", ["ntp", "page_ntp"])
@pytest.mark.parametrize("merger", ["none", "item", "item_id", "pairs"])
def test_tree_loss_and_gradients_equal_copied_rows(merger, objective):
    rng = np.random.default_rng([7, len(merger), len(objective)])
    codes = random_codes(rng, 15, SIZES)
    dec = GRDecoder(SIZES, D, NBLK, H, DQK, DV, max_len=MAX_LEN, token_merger=merger, seed=2, num_items=15)
    randomize(dec, rng)
    hist = _histories(rng, 15, objective)
    rows, users = [], []
    for items, pages in hist:
        rows += _copied_rows(items, pages, codes, dec, objective)
        users.append(tree_user(items, codes, dec.level_offsets, objective, merger, pages=pages))
    flat = pack_rows(rows, 400, len(rows) + 1, dec.group, dec.pad_id)
    assert len(flat) == 1
    caps = TreeCaps(tp_cap=64, ts_cap=60, u_cap=4, s_cap=20, vt_cap=400, max_len=MAX_LEN)
    tree = pack_tree(users, caps, dec.num_levels, dec.group, dec.pad_id)
    assert len(tree) == 1
    assert sum(tree_tokens(u) for u in users if u is not None) < sum(r["slots"].shape[0] for r in rows)
    want_v, want_g = LossGrad(NTPLoss(dec))(*batch_tensors(flat[0]))
    got_v, got_g = LossGrad(TreeNTPLoss(dec, caps))(*tree_tensors(tree[0]))
    want_v, got_v = float(want_v.asnumpy()), float(got_v.asnumpy())
    assert abs(got_v - want_v) <= 1e-5 * (1 + abs(want_v))
    assert len(want_g) == len(got_g) > 0
    for w, g in zip(want_g, got_g):
        w, g = w.asnumpy(), g.asnumpy()
        assert np.abs(w - g).max() <= 2e-4 * np.abs(w).max() + 1e-6


@pytest.mark.parametrize("merger", ["none", "item"])
def test_tree_trie_softmax_equals_copied_rows(merger):
    """With the trie's softmax groups (model.trie_softmax) the tree loss still equals the copied rows'."""
    from mindgr.ids.trie import PrefixTrie
    rng = np.random.default_rng([9, len(merger)])
    codes = random_codes(rng, 15, SIZES)
    trie = PrefixTrie(codes, SIZES)
    groups, allowed = trie.item_nodes(), trie.node_masks()
    dec = GRDecoder(SIZES, D, NBLK, H, DQK, DV, max_len=MAX_LEN, token_merger=merger, seed=4, trie_softmax=True)
    randomize(dec, rng)
    rows, users, hist = [], [], _histories(rng, 15, "ntp")
    for items, _ in hist:
        rows += user_rows(items, codes, dec.level_offsets, "page_ntp", merger, pages=np.arange(len(items)),
                          item_groups=groups)
        users.append(tree_user(items, codes, dec.level_offsets, "ntp", merger, item_groups=groups))
    (flat,) = pack_rows(rows, 400, len(rows) + 1, dec.group, dec.pad_id)
    caps = TreeCaps(tp_cap=64, ts_cap=60, u_cap=4, s_cap=20, vt_cap=400, max_len=MAX_LEN)
    (tree,) = pack_tree(users, caps, dec.num_levels, dec.group, dec.pad_id)
    assert (tree["group"][tree["weight"] > 0] >= dec.num_levels).any()     # real prefix nodes, not levels
    want_v, want_g = LossGrad(NTPLoss(dec, allowed))(*batch_tensors(flat))
    got_v, got_g = LossGrad(TreeNTPLoss(dec, caps, allowed))(*tree_tensors(tree))
    by_level = [tree_user(items, codes, dec.level_offsets, "ntp", merger) for items, _ in hist]
    level_v = float(LossGrad(TreeNTPLoss(dec, caps))(*tree_tensors(
        pack_tree(by_level, caps, dec.num_levels, dec.group, dec.pad_id)[0]))[0].asnumpy())
    want_v, got_v = float(want_v.asnumpy()), float(got_v.asnumpy())
    assert abs(got_v - want_v) <= 1e-5 * (1 + abs(want_v))
    assert got_v < level_v - 1e-3          # fewer competitors per code: the groups were applied
    for w, g in zip(want_g, got_g):
        w, g = w.asnumpy(), g.asnumpy()
        assert np.abs(w - g).max() <= 2e-4 * np.abs(w).max() + 1e-6


def test_tree_layout_shares_the_prompt():
    rng = np.random.default_rng(4)
    codes = random_codes(rng, 30, SIZES)
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    items = rng.integers(1, 31, 20)
    u = tree_user(items, codes, lo, "ntp", "item")
    assert u["prompt_slots"].shape == (19, 4)                    # one merged token per item but the last
    assert [b for b, _, _, _ in u["targets"]] == list(range(1, 20))
    assert tree_tokens(u) == 19 + 19 * 3
    copied = sum(r["slots"].shape[0] for r in user_rows(items, codes, lo, "ntp", "item"))
    assert copied == sum(j + 3 for j in range(1, 20))
    pages = np.array([0, 0, 1, 1, 1, 2] + [3] * 14)
    u = tree_user(items, codes, lo, "page_ntp", "none", pages=pages)
    assert u["prompt_slots"].shape[0] == 6 * 4                   # items of pages < the last page
    assert [(b, w) for b, _, _, w in u["targets"][:4]] == [(8, 1 / 3)] * 3 + [(20, 1.0)]
    assert tree_user(items[:1], codes, lo) is None
    assert tree_user(items[:4], codes, lo, "page_ntp", pages=np.zeros(4)) is None


def test_virtual_rows_are_the_copied_rows():
    """Gathering a tree batch's tokens by virt_src gives, row after row, the copied layout's rows (after each
    user's prompt row), and every token keeps the virtual token that copies it."""
    rng = np.random.default_rng(6)
    codes = random_codes(rng, 15, SIZES)
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    for merger, objective in (("item", "ntp"), ("pairs", "page_ntp"), ("none", "page_ntp")):
        hist = _histories(rng, 15, objective)
        users = [tree_user(items, codes, lo, objective, merger, pages=pages) for items, pages in hist]
        group = {"none": 1, "item": 4, "pairs": 2}[merger]
        caps = TreeCaps(tp_cap=64, ts_cap=60, u_cap=4, s_cap=20, vt_cap=400, max_len=MAX_LEN)
        (tree,) = pack_tree(users, caps, len(SIZES), group, int(lo[-1]))
        virt = tree["slots"][tree["virt_src"]]
        vo, k = tree["virt_offsets"], 0
        for (items, pages), u in zip(hist, users):
            if u is None:
                continue
            p = u["prompt_slots"].shape[0]
            assert np.array_equal(virt[vo[k]:vo[k + 1]], u["prompt_slots"])
            k += 1
            pg = pages if objective == "page_ntp" else np.arange(len(items))
            for r in user_rows(items, codes, lo, "page_ntp", merger, pages=pg):
                assert np.array_equal(virt[vo[k]:vo[k + 1]], r["slots"])
                k += 1
        real = np.concatenate([np.arange(tree["p_offsets"][-1]), caps.tp_cap + np.arange(tree["s_offsets"][-1])])
        assert np.array_equal(tree["virt_src"][tree["take"][real]], real)


def test_tree_errors_are_one_line():
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 10, SIZES)
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    u = tree_user(rng.integers(1, 11, 6), codes, lo, "ntp", "none")
    with pytest.raises(RowError, match="exceeds the tree capacities") as e:
        pack_tree([u], TreeCaps(10, 60, 2, 10, 400, 40), 4, 1, int(lo[-1]))
    assert "\n" not in str(e.value)
    with pytest.raises(RowError, match="more than the decoder's max_len 16"):
        pack_tree([u], TreeCaps(40, 60, 2, 10, 400, 16), 4, 1, int(lo[-1]))
    with pytest.raises(RowError, match="page_ntp needs pages"):
        tree_user([1, 2], codes, lo, "page_ntp")
    with pytest.raises(RowError, match="token_merger"):
        tree_user([1, 2], codes, lo, "ntp", "triples")


def test_dropout_equals_copied_rows_with_the_same_masks():
    """Each copied-row token gets the mask of the tree token it copies: same loss and gradients."""
    rng = np.random.default_rng(8)
    codes = random_codes(rng, 15, SIZES)
    dec = GRDecoder(SIZES, D, NBLK, H, DQK, DV, max_len=MAX_LEN, token_merger="pairs", seed=3)
    randomize(dec, rng)
    rows, users = [], []
    for items, pages in _histories(rng, 15, "page_ntp"):
        rows += _copied_rows(items, pages, codes, dec, "page_ntp")
        users.append(tree_user(items, codes, dec.level_offsets, "page_ntp", "pairs", pages=pages))
    users = [u for u in users if u is not None]
    caps = TreeCaps(tp_cap=64, ts_cap=60, u_cap=4, s_cap=20, vt_cap=400, max_len=MAX_LEN)
    (tree,) = pack_tree(users, caps, dec.num_levels, dec.group, dec.pad_id)
    (flat,) = pack_rows(rows, 400, len(rows) + 1, dec.group, dec.pad_id)
    source, seg = [], 0                       # tree token of every copied-row token, row by row
    for ui, u in enumerate(users):
        for boundary, _, _, _ in u["targets"]:
            source += list(tree["p_offsets"][ui] + np.arange(boundary))
            source += list(caps.tp_cap + tree["s_offsets"][seg] + np.arange(dec.num_levels - 1))
            seg += 1
    assert len(source) == int(flat["offsets"][-1])
    width = max(D, H * DV)
    drop_tree = ((rng.random((dec.dropout_sites, caps.tp_cap + caps.ts_cap, width)) > 0.3) / 0.7).astype(np.float32)
    drop_flat = np.ones((dec.dropout_sites, 400, width), np.float32)
    drop_flat[:, :len(source)] = drop_tree[:, source]
    want_v, want_g = LossGrad(NTPLoss(dec))(*batch_tensors(flat), Tensor(drop_flat))
    got_v, got_g = LossGrad(TreeNTPLoss(dec, caps))(*tree_tensors(tree), Tensor(drop_tree))
    nodrop = float(LossGrad(TreeNTPLoss(dec, caps))(*tree_tensors(tree))[0].asnumpy())
    want_v, got_v = float(want_v.asnumpy()), float(got_v.asnumpy())
    assert abs(got_v - want_v) <= 1e-5 * (1 + abs(want_v))
    assert abs(got_v - nodrop) > 1e-3                          # the masks matter
    for w, g in zip(want_g, got_g):
        w, g = w.asnumpy(), g.asnumpy()
        assert np.abs(w - g).max() <= 2e-4 * np.abs(w).max() + 1e-6
