"""The trie-gathered head (model.trie_softmax) against the masked full-softmax reference: the same loss and
parameter gradients on random tries (fused kernel and composed ops; copied rows, flat rows, page_ntp, the
tree layout), tie cases (equal logits, one-child nodes), the children tables and the entry layout."""

import numpy as np
import pytest

from mindspore import Tensor  # noqa: E402

from mindgr.ids.trie import PrefixTrie  # noqa: E402
from mindgr.models.generative import GRDecoder  # noqa: E402
from mindgr.models.ntp import ENTRY_KEYS, EntryNTPLoss, NTPLoss, batch_tensors, pack_rows, user_rows  # noqa: E402
from mindgr.models.tree import TreeCaps, TreeNTPLoss, pack_tree, tree_tensors, tree_user  # noqa: E402
from mindgr.models.trie_head import TrieHead, entry_capacity, head_entries  # noqa: E402
from mindgr.train.generative import entry_codes, trie_head  # noqa: E402
from gr_fixtures import LossGrad, random_codes, randomize  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]

D, H, DQK, DV, NBLK, MAX_LEN = 8, 2, 3, 4, 2, 40


def _setup(seed, sizes, num_items, merger):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, num_items, sizes)
    trie = PrefixTrie(codes, sizes)
    dec = GRDecoder(sizes, D, NBLK, H, DQK, DV, max_len=MAX_LEN, token_merger=merger, seed=seed,
                    trie_softmax=True, num_items=num_items)
    randomize(dec, rng)
    return rng, codes, trie, dec


def _rows_batch(rng, codes, trie, dec, objective, merger, users=(5, 2, 7, 3)):
    rows = []
    for n in users:
        items = rng.integers(1, codes.shape[0], n)
        pages = np.arange(n) if objective == "ntp" else np.sort(rng.integers(0, 3, n))
        rows += user_rows(items, codes, dec.level_offsets, objective, merger, pages=pages,
                          item_groups=trie.item_nodes())
    t_cap = sum(r["slots"].shape[0] for r in rows) + 5                      # a non-empty unused tail
    (batch,) = pack_rows(rows, t_cap, len(rows) + 2, dec.group, dec.pad_id)
    return batch


def _entry_tensors(batch, dec):
    ent = dict(batch, **head_entries(batch, dec.num_levels, dec.level_offsets,
                                     entry_capacity(batch["slots"].shape[0], dec.num_levels)))
    return tuple(Tensor(ent[k]) for k in ENTRY_KEYS), ent


def _close(want, got):
    want_v, want_g = want
    got_v, got_g = got
    want_v, got_v = float(want_v.asnumpy()), float(got_v.asnumpy())
    assert abs(got_v - want_v) <= 1e-5 * (1 + abs(want_v)), (got_v, want_v)
    for w, g in zip(want_g, got_g):
        w, g = w.asnumpy(), g.asnumpy()
        assert np.abs(w - g).max() <= 1e-4 * np.abs(w).max() + 1e-7


def _gathered(dec, trie, fused, loss_cls=EntryNTPLoss, *args):
    loss = loss_cls(dec, *args)
    head = trie_head(dec, trie)
    head.fused = fused
    loss.use_trie_head(head)
    return loss


@pytest.mark.parametrize("seed,sizes,merger,objective,fused", [
    (0, [6, 5, 4], "item", "ntp", True), (1, [6, 5, 4], "item", "ntp", False),
    (2, [5, 4, 3, 2], "none", "ntp", True), (3, [7, 3, 4], "pairs", "page_ntp", True),
    (4, [8, 6, 2], "item_id", "ntp", False), (5, [4, 4, 4], "none", "page_ntp", False)])
def test_gathered_head_equals_masked_full_softmax(seed, sizes, merger, objective, fused):
    rng, codes, trie, dec = _setup(seed, sizes, 25, merger)
    batch = _rows_batch(rng, codes, trie, dec, objective, merger)
    want = LossGrad(NTPLoss(dec, trie.node_masks()))(*batch_tensors(batch))
    tensors, ent = _entry_tensors(batch, dec)
    assert (ent["weight"] == 0).any()                                         # padding entries too
    got = LossGrad(_gathered(dec, trie, fused))(*tensors)
    _close(want, got)


@pytest.mark.parametrize("fused", [True, False])
def test_ties_and_single_children(fused):
    """Equal logits everywhere a node's children compete (tied head columns), a trie where most nodes have
    one child and a first-level code no item uses: the gathered head still equals the masked reference."""
    sizes = [4, 4, 3]
    codes = np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 1], [1, 2, 2], [2, 3, 1], [2, 0, 2], [1, 0, 0]],
                     np.int32)
    trie = PrefixTrie(codes, sizes)
    assert not trie.masks[0][0][3]                        # the root does not allow code 3
    dec = GRDecoder(sizes, D, NBLK, H, DQK, DV, max_len=MAX_LEN, token_merger="item", seed=7, trie_softmax=True)
    rng = np.random.default_rng(7)
    randomize(dec, rng)
    w = dec.w_head.asnumpy()
    w[:, 4:] = w[:, 4:5]                                  # every code after level 0 ties with the first one
    dec.w_head.set_data(Tensor(w))
    dec.b_head.set_data(Tensor(np.zeros(dec.num_codes, np.float32)))
    batch = _rows_batch(rng, codes, trie, dec, "ntp", "item", users=(4, 3, 5))
    want = LossGrad(NTPLoss(dec, trie.node_masks()))(*batch_tensors(batch))
    tensors, _ = _entry_tensors(batch, dec)
    _close(want, LossGrad(_gathered(dec, trie, fused))(*tensors))


def test_tree_layout_with_gathered_head():
    sizes = [5, 4, 2, 3]
    rng, codes, trie, dec = _setup(11, sizes, 20, "item")
    groups = trie.item_nodes()
    users = [tree_user(rng.integers(1, 21, n), codes, dec.level_offsets, "ntp", "item", item_groups=groups)
             for n in (5, 3, 6)]
    caps = TreeCaps(tp_cap=24, ts_cap=60, u_cap=4, s_cap=20, vt_cap=200, max_len=MAX_LEN)
    (tree,) = pack_tree(users, caps, dec.num_levels, dec.group, dec.pad_id)
    want = LossGrad(TreeNTPLoss(dec, caps, trie.node_masks()))(*tree_tensors(tree))
    _close(want, LossGrad(_gathered(dec, trie, True, TreeNTPLoss, caps))(*tree_tensors(tree)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_children_tables_match_masks(seed):
    rng = np.random.default_rng(seed)
    sizes = [5, 4, 6]
    trie = PrefixTrie(random_codes(rng, 40, sizes), sizes)
    offsets = trie.node_offsets()
    assert offsets[-1] == trie.node_masks().shape[0]
    for level in range(trie.num_levels):
        ch = trie.children(level)
        assert ch.shape[1] == trie.masks[level].sum(1).max()
        for row, mask in enumerate(trie.masks[level]):
            assert ch[row][ch[row] >= 0].tolist() == np.flatnonzero(mask).tolist()
    counts = entry_codes(trie)
    assert counts[0] == sizes[0] and (counts[1:] == trie.node_masks().sum(1)[1:]).all()


def test_head_entries_layout_and_errors():
    rng, codes, trie, dec = _setup(3, [6, 5, 4], 25, "none")
    batch = _rows_batch(rng, codes, trie, dec, "ntp", "none")
    cap = entry_capacity(batch["slots"].shape[0], dec.num_levels)
    ent = head_entries(batch, dec.num_levels, dec.level_offsets, cap)
    real = ent["weight"] > 0
    assert (batch["target"][ent["pos"][real]] == ent["target"][real]).all()
    assert real.sum() == (batch["weight"] > 0).sum()
    with pytest.raises(ValueError, match="entries"):
        head_entries(batch, dec.num_levels, dec.level_offsets, 1)
    bad = dict(batch, weight=np.where(np.arange(batch["weight"].shape[0]) == np.flatnonzero(batch["weight"])[0],
                                      0.0, batch["weight"]).astype(np.float32))
    with pytest.raises(ValueError):
        head_entries(bad, dec.num_levels, dec.level_offsets, cap)


def test_head_refuses_wrong_table_count():
    _, _, trie, dec = _setup(0, [6, 5, 4], 25, "item")
    with pytest.raises(ValueError, match="children tables"):
        TrieHead(dec, [trie.children(1)], trie.node_offsets(), trie.masks[0][0])
