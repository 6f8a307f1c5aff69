"""PrefixTrie on random catalogues, checked against brute-force sets of prefixes."""
import numpy as np
import pytest

from gr_fixtures import random_codes
from mindgr.ids.trie import PrefixTrie, TrieError, prefix_keys


@pytest.mark.parametrize("seed", range(5))
def test_trie_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(2, 7)) for _ in range(int(rng.integers(2, 5)))]
    v = int(rng.integers(1, min(40, int(np.prod(sizes))) + 1))
    codes = random_codes(rng, v, sizes)
    trie = PrefixTrie(codes, sizes)
    tuples = {tuple(r) for r in codes[1:].tolist()}
    assert set(trie.first_codes.tolist()) == {t[0] for t in tuples}
    for level in range(len(sizes)):
        prefixes = sorted({t[:level] for t in tuples})
        assert trie.num_prefixes(level) == len(prefixes)
        keys = prefix_keys(np.asarray(prefixes, np.int64).reshape(len(prefixes), level), sizes, level)
        assert (np.diff(trie.keys[level]) > 0).all()
        rows, found = trie.mask_rows(level, keys)
        assert found.all()
        for p, r in zip(prefixes, rows):
            want = {t[level] for t in tuples if t[:level] == p}
            assert set(np.nonzero(trie.masks[level][r])[0].tolist()) == want
    # every possible tuple: item_of finds exactly the items, and prefixes outside the trie are refused
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), -1).reshape(-1, len(sizes))
    items = trie.item_of(grid)
    for t, it in zip(grid.tolist(), items.tolist()):
        if tuple(t) in tuples:
            assert it > 0 and tuple(codes[it].tolist()) == tuple(t)
        else:
            assert it == 0
    for level in range(1, len(sizes)):
        pre = grid[:, :level]
        _, found = trie.mask_rows(level, prefix_keys(pre, sizes, level))
        assert found.tolist() == [any(t[:level] == tuple(p) for t in tuples) for p in pre.tolist()]
        assert not trie.allowed(level, prefix_keys(pre, sizes, level))[~found].any()
    assert trie.item_of(np.full((2, len(sizes)), -1)).tolist() == [0, 0]


@pytest.mark.parametrize("seed", range(3))
def test_item_nodes_and_node_masks_match_brute_force(seed):
    """The softmax groups of the trie softmax: an item's code l belongs to the node of its first l codes,
    whose row allows exactly the codes that follow that prefix in some item (in global code ids)."""
    rng = np.random.default_rng([seed, 11])
    sizes = [int(rng.integers(2, 6)) for _ in range(int(rng.integers(2, 5)))]
    codes = random_codes(rng, int(rng.integers(2, min(30, int(np.prod(sizes))) + 1)), sizes)
    trie = PrefixTrie(codes, sizes)
    nodes, masks = trie.item_nodes(), trie.node_masks()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    assert nodes.shape == codes.shape and masks.shape == (sum(trie.num_prefixes(l) for l in range(len(sizes))),
                                                          offsets[-1])
    tuples = [tuple(r) for r in codes[1:].tolist()]
    for i, t in enumerate(tuples, start=1):
        for level in range(len(sizes)):
            want = {offsets[level] + u[level] for u in tuples if u[:level] == t[:level]}
            assert set(np.nonzero(masks[nodes[i, level]])[0].tolist()) == want
    # two items share a node exactly when they share the prefix
    for level in range(len(sizes)):
        for i in range(1, len(tuples) + 1):
            for j in range(1, len(tuples) + 1):
                same = tuples[i - 1][:level] == tuples[j - 1][:level]
                assert (nodes[i, level] == nodes[j, level]) == same


def test_trie_errors_are_one_line():
    codes = np.array([[0, 0], [1, 2], [1, 2]], np.int32)
    with pytest.raises(TrieError, match="items 1 and 2 share the code tuple"):
        PrefixTrie(codes, [3, 3])
    with pytest.raises(TrieError, match="item 1 has code 5 at level 1"):
        PrefixTrie(np.array([[0, 0], [1, 5]]), [3, 3])
    with pytest.raises(TrieError, match="level_sizes"):
        PrefixTrie(np.array([[0, 0], [1, 1]]), [3, 3, 3])
