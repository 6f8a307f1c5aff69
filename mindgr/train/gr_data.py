"""Generative-retrieval training data: a run's training sequences -> next-token-prediction rows -> a
reproducible plan of fixed-capacity batches. Independent of the Trainer (it needs only numpy arrays).

One training example is one user's window of the last max_len + 1 training items (the items the
item-encoder trainers see: their inputs plus the last target). Its rows are mindgr.models.ntp.user_rows
(point-wise ntp: one flat row without a token merger, one row per target with one; page_ntp: one row
per item of every page after the first, prompted by the earlier pages). Row token counts are computed
in closed form first (`row_token_counts`, checked against the rows built), so the epoch plan
(mindgr.datasets.EpochPlan, seeded by (seed, epoch)) packs whole examples by their GR token counts;
the rows themselves are built when a batch is prepared (in the input thread).

Capacities: T_cap tokens (data.token_capacity, or about train.batch_size examples' mean tokens, at
least the longest example), and a row capacity that no batch can exceed: T_cap / (the shortest row),
so every batch is one compiled shape.

With the trie-gathered head (model.trie_softmax) a batch carries its loss entries (`entry_codes` given:
ENTRY_KEYS, at most T_cap / Lt target items) and its info counts the head's codes scored
(`head_codes`: the whole first level per item, each later entry's allowed children) for the FLOPs.
"""
from __future__ import annotations

import math

import numpy as np

from mindgr.datasets import EpochPlan
from mindgr.models.ntp import (BATCH_KEYS, ENTRY_KEYS, RowError, check_row_options, group_width, page_groups, pack_rows,
                               tokens_per_prompt_item, user_rows)
from mindgr.models.tree import TREE_KEYS, TreeCaps, pack_tree, tree_user
from mindgr.models.trie_head import entry_capacity, head_entries


def row_token_counts(n: int, lt: int, objective: str, token_merger: str, pages=None) -> list:
    """Token counts of the rows of a history of n items (Lt codes per item), as user_rows builds them."""
    per = tokens_per_prompt_item(lt, token_merger)
    if n < 2:
        return []
    if objective == "ntp" and token_merger == "none":
        return [n * lt - 1]
    if objective == "ntp":
        return [j * per + lt - 1 for j in range(1, n)]
    out = []
    for start, stop in page_groups(pages)[1:]:
        out += [start * per + lt - 1] * (stop - start)
    return out


def training_windows(inputs, targets) -> list:
    """The item window of each training example: its inputs and its last target."""
    return [np.append(np.asarray(x, np.int64), np.int64(t[-1])) for x, t in zip(inputs, targets)]


def page_windows(store, split, windows) -> list | None:
    """Page ids aligned with each training window (None if the data has no pages)."""
    if store.page_seqs is None:
        return None
    out = []
    for k, (u, w) in enumerate(zip(split.train_users, windows)):
        train_len = len(split.train[k])
        pages = np.asarray(store.page_seqs[u][:train_len], np.int64)[-len(w):]
        if pages.shape[0] != w.shape[0]:
            raise RowError(f"training sequence {k}: {pages.shape[0]} page ids for {w.shape[0]} items")
        out.append(pages)
    return out


def _round_up(x, multiple):
    return int(math.ceil(x / multiple) * multiple)


class GRTrainData:
    """Rows and batches of the GR objective over training windows (item ids into codes [V+1, Lt])."""

    keys = BATCH_KEYS            # the step's array inputs, in order (before the dropout masks)

    def __init__(self, windows, codes, level_offsets, pad_id: int, objective: str, token_merger: str,
                 batch_size: int, seed: int, token_capacity: int = 0, pages=None, item_groups=None,
                 entry_codes=None):
        """item_groups [V+1, Lt]: the softmax group of each item's codes (None = their level: ntp.user_rows).
        entry_codes [groups]: codes the trie head scores for an entry of each group; given, batches come in
        the entry layout (ENTRY_KEYS)."""
        check_row_options(objective, token_merger, pages)
        self.item_groups = item_groups
        self.entry_codes = None if entry_codes is None else np.asarray(entry_codes, np.int64)
        if self.entry_codes is not None:
            self.keys = ENTRY_KEYS
        self.codes = np.asarray(codes)
        self.level_offsets = np.asarray(level_offsets, np.int64)
        self.pad_id, self.objective, self.token_merger = pad_id, objective, token_merger
        lt = self.codes.shape[1]
        self.group = group_width(token_merger, lt)
        counts = [row_token_counts(len(w), lt, objective, token_merger, None if pages is None else pages[i])
                  for i, w in enumerate(windows)]
        keep = [i for i, c in enumerate(counts) if c]
        if not keep:
            raise RowError(f"no training example gives a {objective} row (every window has one item or one page)")
        self.example_ids = keep                # each kept example's index among the given windows
        self.windows = [windows[i] for i in keep]
        self.pages = None if pages is None else [pages[i] for i in keep]
        self.row_counts = [counts[i] for i in keep]
        tokens = np.array([sum(c) for c in self.row_counts], np.int64)
        self.tokens = tokens
        t_cap = token_capacity or _round_up(max(batch_size * tokens.mean(), tokens.max(), 1), 64)
        if tokens.max() > t_cap:
            raise RowError(f"data.token_capacity = {t_cap}: a training example has {int(tokens.max())} GR tokens; "
                           f"use at least that (or 0 = auto)")
        shortest = min(min(c) for c in self.row_counts)
        self.token_capacity = t_cap
        self.row_capacity = _round_up(math.ceil(t_cap / shortest), 8)
        self.plan = EpochPlan(tokens, t_cap, self.row_capacity, seed=seed)
        self.entry_capacity = entry_capacity(t_cap, lt)

    @property
    def inputs(self) -> list:
        return self.windows

    def rows(self, i: int, target_weights=None) -> list:
        """Example i's rows (target_weights [n]: as mindgr.models.ntp.user_rows)."""
        rows = user_rows(self.windows[i], self.codes, self.level_offsets, self.objective, self.token_merger,
                         None if self.pages is None else self.pages[i], self.pad_id, self.item_groups,
                         target_weights)
        if [r["slots"].shape[0] for r in rows] != self.row_counts[i]:
            raise AssertionError(f"example {i}: rows differ from their planned token counts")
        return rows

    def batch(self, indices, token_capacity: int | None = None, row_capacity: int | None = None) -> tuple[dict, dict]:
        """(arrays of one batch at the fixed capacities (the run's, or a rank's), info: real tokens, fill, row
        lengths, targets)."""
        t_cap, b_cap = token_capacity or self.token_capacity, row_capacity or self.row_capacity
        rows = [r for i in indices for r in self.rows(int(i))]
        packed = pack_rows(rows or [_empty_row(self.group, self.pad_id)], t_cap, b_cap, self.group, self.pad_id)
        if len(packed) != 1:
            raise AssertionError("a planned batch does not fit its capacities")
        batch = packed[0]
        lengths = np.array([r["slots"].shape[0] for r in rows], np.int64)
        n = int(lengths.sum())
        info = {"tokens": n, "fill": n / t_cap, "lengths": lengths,
                "targets": int((batch["weight"] > 0).sum())}
        if self.entry_codes is not None:       # a rank's batch: entries at its own token capacity
            e_cap = entry_capacity(t_cap, self.codes.shape[1]) if token_capacity else self.entry_capacity
            entries = head_entries(batch, self.codes.shape[1], self.level_offsets, e_cap)
            batch = dict(batch, **entries)
            info["head_codes"] = int(self.entry_codes[entries["group"]][entries["weight"] > 0].sum())
        return batch, info


def tree_token_counts(n: int, lt: int, objective: str, token_merger: str, pages=None) -> tuple:
    """(prompt, segment, virtual) tokens of a history of n items in the tree layout, as tree_user builds it
    (virtual: the attention's rows, the prompt once plus every target's copied row, models.tree)."""
    per, lseg = tokens_per_prompt_item(lt, token_merger), lt - 1
    if n < 2:
        return 0, 0, 0
    groups = [(j, j + 1) for j in range(n)] if objective == "ntp" else page_groups(pages)
    if len(groups) < 2:
        return 0, 0, 0
    prompt = groups[-1][0] * per
    rows = sum((stop - start) * (start * per + lseg) for start, stop in groups[1:])
    return prompt, (n - groups[1][0]) * lseg, prompt + rows


class GRTreeData:
    """The shared-prompt (tree) layout's batches (mindgr.models.tree, data.gr_layout = tree): each example's
    prompt once plus Lt-1 teacher-forced tokens per target, instead of a copied row per target.

    A batch has three regions of fixed capacity, prompt tokens (tp_cap), segment tokens (ts_cap) and the
    attention's virtual tokens (vt_cap), each sized from the data's own mean per example. The epoch plan
    packs examples by one cost, cost = max over regions r of ceil(n_r * UNIT / cap_r) <= UNIT per batch,
    which bounds every region at once (sum n_r * UNIT / cap_r <= sum cost <= UNIT), so every planned batch
    fits one compiled shape."""

    keys = TREE_KEYS
    UNIT = 1 << 20

    def __init__(self, windows, codes, level_offsets, pad_id: int, objective: str, token_merger: str,
                 batch_size: int, seed: int, max_len: int, token_capacity: int = 0, pages=None, item_groups=None,
                 entry_codes=None):
        check_row_options(objective, token_merger, pages)
        self.entry_codes = None if entry_codes is None else np.asarray(entry_codes, np.int64)
        self.codes = np.asarray(codes)
        self.level_offsets = np.asarray(level_offsets, np.int64)
        self.pad_id, self.objective, self.token_merger = pad_id, objective, token_merger
        self.item_groups = item_groups
        lt = self.codes.shape[1]
        if lt < 2:
            raise RowError(f"data.gr_layout = tree needs at least 2 codes per item, the code table has {lt}")
        self.num_levels, self.group = lt, group_width(token_merger, lt)
        counts = [tree_token_counts(len(w), lt, objective, token_merger, None if pages is None else pages[i])
                  for i, w in enumerate(windows)]
        keep = [i for i, c in enumerate(counts) if c[1]]
        if not keep:
            raise RowError(f"no training example gives a {objective} target (every window has one item or one page)")
        self.windows = [windows[i] for i in keep]
        self.pages = None if pages is None else [pages[i] for i in keep]
        need = np.array([counts[i] for i in keep], np.int64)                 # [examples, 3 regions]
        self.tokens = need[:, 0] + need[:, 1]
        if token_capacity and self.tokens.max() > token_capacity:
            raise RowError(f"data.token_capacity = {token_capacity}: a training example has {int(self.tokens.max())} "
                           "GR tokens in the tree layout; use at least that (or 0 = auto)")
        # token_capacity (prompt + segment tokens) scales the data's mean mix; virtual tokens follow it
        scale = token_capacity / self.tokens.mean() if token_capacity else batch_size
        caps = [max(_round_up(scale * need[:, r].mean(), 8), int(need[:, r].max())) for r in range(3)]
        cost = np.max(-(-need * self.UNIT // np.array(caps)), axis=1)
        u_cap = _round_up(math.ceil(self.UNIT / cost.min()), 8)
        self.caps = TreeCaps(caps[0], caps[1], u_cap, caps[1] // (lt - 1), caps[2], max_len)
        self.token_capacity, self.row_capacity = caps[0] + caps[1], u_cap
        self.plan = EpochPlan(cost, self.UNIT, u_cap, seed=seed)

    @property
    def inputs(self) -> list:
        return self.windows

    def user(self, i: int) -> dict:
        return tree_user(self.windows[i], self.codes, self.level_offsets, self.objective, self.token_merger,
                         None if self.pages is None else self.pages[i], self.pad_id, self.item_groups)

    def batch(self, indices) -> tuple[dict, dict]:
        """(arrays of one batch at the fixed capacities, info: real tokens, fill, rows, prefix pairs, targets)."""
        users = [self.user(int(i)) for i in indices]
        packed = pack_tree(users, self.caps, self.num_levels, self.group, self.pad_id)
        if len(packed) != 1:
            raise AssertionError("a planned batch does not fit its capacities")
        lseg = self.num_levels - 1
        prompts = [u["prompt_slots"].shape[0] for u in users]
        boundaries = np.array([b for u in users for b, _, _, _ in u["targets"]], np.int64)
        n = int(sum(prompts) + lseg * boundaries.shape[0])
        # useful FLOPs (mindgr.train.flops): per-token work once per token, the attention each token needs
        # (its prompt row, or its prompt prefix + its segment), not the copied rows' recomputed prompt part
        info = {"tokens": n, "fill": n / self.token_capacity,
                "lengths": np.array(prompts + [lseg] * boundaries.shape[0], np.int64),   # causal parts
                "prefix_pairs": int(lseg * boundaries.sum()),      # (segment token, prompt key) pairs
                "head_tokens": int(self.num_levels * boundaries.shape[0]),     # logits only at the loss entries
                "targets": int(self.num_levels * boundaries.shape[0])}
        if self.entry_codes is not None:          # the trie head: codes scored per entry (FLOPs)
            b = packed[0]
            info["head_codes"] = int(self.entry_codes[b["group"]][b["weight"] > 0].sum())
        return packed[0], info


def _empty_row(group, pad_id):
    z = np.zeros(1, np.int32)
    return dict(slots=np.full((1, group), pad_id, np.int32), merged=np.zeros(1, np.float32), target=z,
                group=z, weight=np.zeros(1, np.float32))
