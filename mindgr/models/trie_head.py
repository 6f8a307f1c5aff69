"""The trie-gathered code head of the NTP loss (model.trie_softmax): per loss entry, the log-sum-exp over
only the codes the prefix trie allows after the item's earlier codes, minus the target's logit.

The masked reference (NTPLoss.grouped_ce) computes all sum K logits of every token and masks all but the
allowed ones; on a 3 x 2048 table a prefix of level l >= 1 allows a few to a few dozen codes, so almost all of
that head is wasted. Here, for the entries of one level at a time ([S] entries, a column of the [S, Lt] entry
layout, so every level is one static shape):
- level 0 (the root: one node) keeps the full level-0 matmul, masked by the root's allowed codes;
- level l >= 1 gathers each entry's node's children (PrefixTrie.children: codes padded with -1 to the
  level's most children, cap_l) and scores only those: either the fused sampled log-sum-exp
  (mindgr.ops.scoring.sampled_lse, the C++ kernel on the cpu backend: no [S, cap_l, D] tensor; padding
  slots hold the target's own id, which the kernel skips, and the target's logit enters as its positive)
  or composed ops (gather [S, cap_l, D] + batched matmul + masked logsumexp). The head's bias rides as one
  more column of the gathered rows (hidden [.., D] | 1 against W^T | b).
Entries with target 0 (padding) give 0. Equal to the masked reference's loss and gradients (tests).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgr.ops.scoring import sampled_lse

_MASKED = -1e9


class TrieHead(nn.Cell):
    """ce [S, Lt] of hidden states at the loss entries h [S, Lt, D], targets and prefix nodes [S, Lt].

    children: per level l >= 1, int32 [nodes of level l, cap_l] local codes padded with -1
    (PrefixTrie.children); node_offsets [Lt+1] (PrefixTrie.node_offsets: group ids are global node
    numbers); first_allowed bool [K_0] (the root's codes); fused: the sampled_lse kernel, else composed ops."""

    def __init__(self, decoder, children, node_offsets, first_allowed, fused: bool = True):
        super().__init__()
        self.decoder = decoder
        self.num_levels = decoder.num_levels
        if len(children) != self.num_levels - 1:
            raise ValueError(f"trie head: children tables for {len(children)} levels, the decoder has "
                             f"{self.num_levels - 1} after the first")
        offs = decoder.level_offsets
        self.k0 = int(offs[1])
        self.first_allowed = Tensor(np.asarray(first_allowed, bool).reshape(self.k0))
        tables, self.node_base, self.node_count = [], [], []
        for level, ch in enumerate(children, start=1):
            ch = np.asarray(ch, np.int64)
            # global code ids; -1 stays the padding mark
            tables.append(Tensor(np.where(ch >= 0, ch + int(offs[level]), -1).astype(np.int32)))
            self.node_base.append(int(node_offsets[level]))
            self.node_count.append(int(ch.shape[0]))
        self.children = tuple(tables)
        self.fused = bool(fused)

    def first_level(self, h0, tgt0):
        dec = self.decoder
        logits = ops.matmul(h0, ops.narrow(dec.w_head, 1, 0, self.k0)) + ops.narrow(dec.b_head, 0, 0, self.k0)
        masked = ops.where(self.first_allowed[None, :], logits, ops.full_like(logits, _MASKED))  # [S, K0]
        picked = ops.gather_elements(logits, 1, ops.maximum(tgt0, 0)[:, None]).reshape(-1)
        return ops.logsumexp(masked, 1) - picked

    def later_level(self, x, table, tgt, ids, valid):
        """x [S, D+1] (hidden | 1), table [C, D+1] (W^T | b), tgt [S] global ids (0 = no entry),
        ids [S, cap] global children (padding: -1), valid [S, cap]."""
        picked = (x * ops.gather(table, tgt, 0)).sum(-1)                                    # [S]
        if self.fused:
            ids = ops.where(valid, ids, ops.broadcast_to(ops.expand_dims(tgt, 1), ids.shape))   # padding: the target
            lse = sampled_lse(x, table, ids, tgt, picked)
            return lse - picked
        rows = ops.gather(table, ops.maximum(ids, 0), 0)                                    # [S, cap, D+1]
        logits = ops.BatchMatMul()(rows, ops.expand_dims(x, 2)).reshape(ids.shape)          # [S, cap]
        masked = ops.where(valid, logits, ops.full_like(logits, _MASKED))
        lse = ops.logsumexp(masked, 1)
        return ops.where(tgt > 0, lse - picked, ops.zeros_like(picked))

    def construct(self, h, target, group):
        dec = self.decoder
        s = h.shape[0]
        # per level [S, D] / [S] by unstack: a [:, level, :] slice is a strided copy ~8x slower on CPU
        hs, targets, groups = ops.unstack(h, 1), ops.unstack(target, 1), ops.unstack(group, 1)
        ces = [self.first_level(hs[0], targets[0])]
        table = ops.concat((dec.w_head.T, ops.expand_dims(dec.b_head, 1)), 1)                # [C, D+1]
        for i in range(self.num_levels - 1):
            level = i + 1
            x = ops.concat((hs[level], ops.ones((s, 1), ms.float32)), 1)
            node = ops.clip_by_value(groups[level] - self.node_base[i], 0, self.node_count[i] - 1)
            ids = ops.gather(self.children[i], node, 0)                                     # [S, cap]
            ces.append(self.later_level(x, table, targets[level], ids, ids >= 0))
        return ops.stack(ces, 1)


def entry_capacity(token_capacity: int, num_levels: int) -> int:
    """Target items a batch of token_capacity tokens can hold in the copied-row layout: each target item
    takes at least Lt tokens (its Lt positions in a flat row, or a row of >= 1 prompt + Lt-1 code tokens)."""
    return int(-(-token_capacity // num_levels))


def head_entries(batch: dict, num_levels: int, level_offsets, capacity: int) -> dict:
    """A copied-row batch (per-token target / group / weight) -> the [capacity, Lt] entry layout the trie head
    reads: pos (token index of each loss entry), target, group, weight, flattened; padding entries 0. A
    target item's Lt positions are consecutive and in level order in every row layout (checked)."""
    w = batch["weight"]
    idx = np.flatnonzero(w > 0)
    n = idx.shape[0] // num_levels
    if idx.shape[0] % num_levels or n > capacity:
        raise ValueError(f"{idx.shape[0]} loss positions: not whole items of {num_levels} codes within "
                         f"{capacity} entries")
    idx = idx.reshape(n, num_levels)
    level = np.searchsorted(np.asarray(level_offsets[1:]), batch["target"][idx], side="right")
    if (np.diff(idx, axis=1) != 1).any() or (level != np.arange(num_levels)[None, :]).any():
        raise ValueError("loss positions are not consecutive codes 0..Lt-1 of their items")
    out = {}
    for key, src in (("pos", None), ("target", batch["target"]), ("group", batch["group"]), ("weight", w)):
        arr = np.zeros((capacity, num_levels), np.float32 if key == "weight" else np.int32)
        arr[:n] = idx if src is None else src[idx]
        out[key] = arr.reshape(-1)
    return out
