"""The prefix trie of a semantic-ID code table, as flat arrays built once and reused by every decode.

Input (the tokenizer's seam): `codes` int32 [V+1, Lt] (row 0 is the padding item and is ignored; Lt = L
levels of K codes plus the de-dup digit) and `level_sizes` int [Lt]. Every item's tuple must be unique.

A prefix of length l (its first l codes) is stored as one mixed-radix int64 key
    key(c_0..c_{l-1}) = sum_i c_i * prod(level_sizes[i+1:l])
so a whole level of prefixes is one sorted int64 array, and lookups are `searchsorted`s. Per level l
(0..Lt-1, the code being chosen):
    keys[l]  sorted keys of the valid prefixes of length l ([1] key 0 for the empty prefix at level 0);
    masks[l] bool [len(keys[l]), level_sizes[l]]: which codes may follow each prefix. These are the
             valid-item masks the decoders reuse across steps and requests (never rebuilt per step).
`item_of(full codes)` maps a complete tuple back to its item id (0 if no item has it).
Pure numpy: the masks are applied on the host, beside the selection they feed.
"""
from __future__ import annotations

import numpy as np


class TrieError(ValueError):
    """The code table cannot form a trie (bad shape, out-of-range code, duplicate tuple)."""


def prefix_keys(codes: np.ndarray, level_sizes, length: int) -> np.ndarray:
    """Mixed-radix int64 keys of the first `length` codes of each row of `codes` [N, >=length]."""
    codes = np.asarray(codes, np.int64)
    key = np.zeros(codes.shape[0], np.int64)
    for i in range(length):
        key = key * int(level_sizes[i]) + codes[:, i]
    return key


class PrefixTrie:
    def __init__(self, codes, level_sizes):
        codes = np.asarray(codes)
        sizes = np.asarray(level_sizes, np.int64)
        if codes.ndim != 2 or codes.shape[0] < 2 or sizes.shape != (codes.shape[1],):
            raise TrieError(f"codes must be [V+1, Lt] with V >= 1 and level_sizes [Lt]; got codes "
                            f"{codes.shape}, level_sizes {sizes.shape}")
        if (sizes < 1).any() or float(np.prod(sizes.astype(np.float64))) >= 2.0 ** 62:
            raise TrieError(f"level_sizes {sizes.tolist()}: each must be >= 1 and their product < 2^62")
        items = codes[1:].astype(np.int64)
        bad = (items < 0) | (items >= sizes[None, :])
        if bad.any():
            row, level = np.argwhere(bad)[0]
            raise TrieError(f"item {row + 1} has code {items[row, level]} at level {level}, outside "
                            f"[0, {sizes[level]})")
        self.level_sizes = sizes
        self.num_levels = int(sizes.shape[0])
        self.num_items = int(items.shape[0])
        self.codes = np.concatenate([np.zeros((1, self.num_levels), np.int64), items])
        full = prefix_keys(items, sizes, self.num_levels)
        order = np.argsort(full, kind="stable")
        dup = np.nonzero(full[order][1:] == full[order][:-1])[0]
        if dup.size:
            a, b = order[dup[0]] + 1, order[dup[0] + 1] + 1
            raise TrieError(f"items {min(a, b)} and {max(a, b)} share the code tuple {items[a - 1].tolist()}")
        self._full_keys = full[order]
        self._full_items = (order + 1).astype(np.int64)
        self.keys, self.masks = [], []
        for level in range(self.num_levels):
            pre = prefix_keys(items, sizes, level)
            keys, row = np.unique(pre, return_inverse=True)
            mask = np.zeros((keys.shape[0], int(sizes[level])), bool)
            mask[row, items[:, level]] = True
            self.keys.append(keys)
            self.masks.append(mask)

    @property
    def first_codes(self) -> np.ndarray:
        """The allowed first codes (sorted)."""
        return np.nonzero(self.masks[0][0])[0]

    def num_prefixes(self, level: int) -> int:
        return int(self.keys[level].shape[0])

    def mask_rows(self, level: int, keys) -> tuple[np.ndarray, np.ndarray]:
        """For prefix keys of length `level`: (row index into masks[level], whether the prefix is valid).
        Invalid prefixes get row 0 and found=False: callers must not use their mask row."""
        keys = np.asarray(keys, np.int64)
        table = self.keys[level]
        pos = np.searchsorted(table, keys)
        pos_c = np.minimum(pos, table.shape[0] - 1)
        found = table[pos_c] == keys
        return np.where(found, pos_c, 0), found

    def allowed(self, level: int, keys) -> np.ndarray:
        """bool [..., level_sizes[level]]: the allowed next codes of each prefix (all False if invalid)."""
        rows, found = self.mask_rows(level, keys)
        return self.masks[level][rows] & found[..., None]

    def extend(self, level: int, keys, code) -> np.ndarray:
        """The key of prefix `keys` (length `level`) followed by `code`."""
        return np.asarray(keys, np.int64) * int(self.level_sizes[level]) + np.asarray(code, np.int64)

    def item_of(self, codes) -> np.ndarray:
        """Item id of each full code tuple [..., Lt] (0 where no item has that tuple)."""
        codes = np.asarray(codes, np.int64)
        shape = codes.shape[:-1]
        flat = codes.reshape(-1, self.num_levels)
        inside = ((flat >= 0) & (flat < self.level_sizes[None, :])).all(1)
        key = prefix_keys(np.where(inside[:, None], flat, 0), self.level_sizes, self.num_levels)
        pos = np.minimum(np.searchsorted(self._full_keys, key), self._full_keys.shape[0] - 1)
        hit = inside & (self._full_keys[pos] == key)
        return np.where(hit, self._full_items[pos], 0).reshape(shape)

    def item_nodes(self) -> np.ndarray:
        """int32 [V+1, Lt]: the prefix node of each item's code l, i.e. of its first l codes, numbered over
        all levels (level l's prefixes are nodes node_offsets[l] + row of masks[l]). Row 0 (padding) is 0s."""
        out = np.zeros((self.num_items + 1, self.num_levels), np.int32)
        base = 0
        for level in range(self.num_levels):
            rows, _ = self.mask_rows(level, prefix_keys(self.codes[1:], self.level_sizes, level))
            out[1:, level] = base + rows
            base += self.num_prefixes(level)
        return out

    def node_masks(self) -> np.ndarray:
        """bool [nodes, sum K]: which global code ids (level offset + code) may follow each prefix node
        (numbered as item_nodes): the groups of a softmax that runs over the trie's valid children only."""
        offsets = np.concatenate([[0], np.cumsum(self.level_sizes)])
        out = np.zeros((sum(self.num_prefixes(l) for l in range(self.num_levels)), int(offsets[-1])), bool)
        base = 0
        for level in range(self.num_levels):
            n = self.num_prefixes(level)
            out[base:base + n, offsets[level]:offsets[level + 1]] = self.masks[level]
            base += n
        return out

    def node_offsets(self) -> np.ndarray:
        """int64 [Lt+1]: level l's prefix nodes are node_offsets[l] .. node_offsets[l+1]-1 (item_nodes' numbering)."""
        return np.concatenate([[0], np.cumsum([self.num_prefixes(l) for l in range(self.num_levels)])]).astype(np.int64)

    def children(self, level: int) -> np.ndarray:
        """int32 [prefixes of the level, most children of one]: the codes that may follow each prefix of
        length `level` (row as masks[level]), ascending, padded with -1. The index-list form of masks[level]:
        a softmax over a node's children gathers these rows instead of masking every code of the level."""
        mask = self.masks[level]
        counts = mask.sum(1)
        out = np.full((mask.shape[0], max(int(counts.max()), 1)), -1, np.int32)
        rows, codes = np.nonzero(mask)                               # row-major: each row's codes ascending
        out[rows, np.arange(rows.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)] = codes
        return out

    def nbytes(self) -> int:
        return int(sum(k.nbytes + m.nbytes for k, m in zip(self.keys, self.masks)))
