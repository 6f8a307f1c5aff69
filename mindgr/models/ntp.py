"""Next-token-prediction objectives for the GR decoder: point-wise (`ntp`) and page-wise (`page_ntp`).

Every target item is predicted code by code, teacher-forced, from a prompt: the last prompt token
predicts code 0, the decoded code l predicts code l+1 (Lt = L+1 steps). A training row is
    [prompt tokens] + [codes 0..Lt-2 of the target, as single-code tokens]
and its Lt target positions carry the target's codes. The item's loss is the sum of its Lt code
cross-entropies (= -log p(item | prompt)); the objective is the mean over prompts of the mean over that
prompt's targets:
- ntp (point-wise, the default and the only choice for page-less data): every item after the first is a
  target, its prompt is every earlier item. Without a token merger all these rows are prefixes of one
  flat row (all codes of the history), so each user is that ONE row, every target in it.
- page_ntp: pages (items consumed in one request) come as a page id per item (equal ids, consecutive).
  For page p >= 1, the prompt is every item of pages < p and EVERY item of page p is a target of that
  same prompt (their losses averaged, one row each), so page-mates never condition on each other.
With a token merger the prompt is merged (one token per item, or per pair of codes) and the target's
codes are not, so every (prompt, target) is its own row: rows share no prefix. Merger `item_id` is `item`
plus one more slot per prompt token: the item's own id (a learned per-item embedding in the merged token).
Rows are packed into batches of fixed capacities (T_cap tokens, B_cap rows): one compiled graph.

Softmax groups: a target position's `group` names the row of the loss's allowed-code table its softmax
runs over. By default that is the target code's level (every code of the level competes); with the trie
softmax (model.trie_softmax) it is the target's prefix node in the trie (only the codes that may follow
that prefix compete, as in trie-constrained decoding). `item_groups` [V+1, Lt] gives each item's code its
group; None means the level.

With the trie softmax the loss scores only the allowed codes (mindgr.models.trie_head.TrieHead, set by
`use_trie_head`): a copied-row batch then carries its loss entries instead of per-token targets
(`ENTRY_KEYS`, trie_head.head_entries: the token index of each target code, [items, Lt] flattened), and
`EntryNTPLoss` gathers the hidden states there. `restrict_to` (masked full logits at every token) stays as
the reference the gathered head is tested against.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

OBJECTIVES = ("ntp", "page_ntp")
_MASKED = -1e9


class RowError(ValueError):
    """A history, page array or capacity that cannot make training rows."""


TOKEN_MERGERS = ("none", "item", "item_id", "pairs")


def group_width(token_merger: str, num_levels: int) -> int:
    """Slots per prompt token: 1 (none), every code of an item (item), those and the item's id (item_id), or
    two codes (pairs)."""
    if token_merger not in TOKEN_MERGERS:
        raise RowError(f"model.token_merger = {token_merger!r}: expected one of {', '.join(TOKEN_MERGERS)}")
    return {"none": 1, "item": num_levels, "item_id": num_levels + 1, "pairs": 2}[token_merger]


def prompt_tokens(item_codes: np.ndarray, level_offsets, token_merger: str, pad_id: int, items=None):
    """Prompt tokens of items with codes [n, Lt]: (slots [m, G] int32, merged [m] float32). Merger item_id
    needs the item ids [n] too: its last slot is pad_id + 1 + item (the item embeddings follow the codes'
    and the pad's in the decoder's table)."""
    item_codes = np.asarray(item_codes, np.int64).reshape(-1, len(level_offsets) - 1)
    gids = (item_codes + np.asarray(level_offsets[:-1])[None, :]).astype(np.int32)
    n, lt = gids.shape
    if token_merger == "none":
        return gids.reshape(-1, 1), np.zeros(n * lt, np.float32)
    if token_merger == "item":
        return gids, np.ones(n, np.float32)
    if token_merger == "item_id":
        if items is None or np.asarray(items).shape != (n,):
            raise RowError(f"token_merger item_id: prompt_tokens needs the {n} items' ids")
        ids = (pad_id + 1 + np.asarray(items, np.int64)).astype(np.int32)
        return np.concatenate([gids, ids[:, None]], 1), np.ones(n, np.float32)
    if token_merger == "pairs":
        if lt % 2:
            gids = np.concatenate([gids, np.full((n, 1), pad_id, np.int32)], 1)
        slots = gids.reshape(-1, 2)
        return slots, np.ones(slots.shape[0], np.float32)
    raise RowError(f"token_merger {token_merger!r}: expected one of {', '.join(TOKEN_MERGERS)}")


def code_tokens(gids, group: int, pad_id: int):
    """Single-code (unmerged) tokens of global code ids [s]: (slots [s, G], merged [s])."""
    gids = np.asarray(gids, np.int32).reshape(-1)
    slots = np.full((gids.shape[0], group), pad_id, np.int32)
    slots[:, 0] = gids
    return slots, np.zeros(gids.shape[0], np.float32)


def drop_item_slots(slots: np.ndarray, pad_id: int, p: float, rng) -> np.ndarray:
    """Training-time id dropout of merger item_id: each prompt token's item slot (a slot > pad_id) becomes
    pad_id (embedded as zero) with probability p, so the merged token must also carry the item by its codes
    alone. A copy; code and pad slots are untouched."""
    slots = np.array(slots, copy=True)
    ids = slots > pad_id
    slots[ids & (rng.random(slots.shape) < p)] = pad_id
    return slots


def tokens_per_prompt_item(num_levels: int, token_merger: str) -> int:
    return {"none": num_levels, "item": 1, "item_id": 1, "pairs": (num_levels + 1) // 2}[token_merger]


def _row(prompt_slots, prompt_merged, target_gids, target_groups, group, pad_id, weight):
    """One training row: prompt + the target's codes 0..Lt-2; targets (and their softmax groups) on the
    last Lt positions."""
    dec_slots, dec_merged = code_tokens(target_gids[:-1], group, pad_id)
    slots = np.concatenate([prompt_slots, dec_slots])
    n = slots.shape[0]
    target = np.zeros(n, np.int32)
    groups = np.zeros(n, np.int32)
    w = np.zeros(n, np.float32)
    start = prompt_slots.shape[0] - 1
    target[start:] = target_gids
    groups[start:] = target_groups
    w[start:] = weight
    return dict(slots=slots, merged=np.concatenate([prompt_merged, dec_merged]), target=target, group=groups,
                weight=w)


def _flat_row(item_codes, item_groups, level_offsets, pad_id):
    """Point-wise and unmerged: one row of every code of the history but the last; items 1.. are targets."""
    gids = (item_codes + np.asarray(level_offsets[:-1])[None, :]).astype(np.int32).reshape(-1)
    lt = item_codes.shape[1]
    slots = gids[:-1].reshape(-1, 1)
    target = gids[1:].copy()
    groups = np.asarray(item_groups, np.int32).reshape(-1)[1:].copy()
    w = (np.arange(1, gids.shape[0]) >= lt).astype(np.float32)   # the first item has no prompt
    target[w == 0] = 0
    groups[w == 0] = 0
    return dict(slots=slots, merged=np.zeros(slots.shape[0], np.float32), target=target, group=groups, weight=w)


def page_groups(pages) -> list:
    """Start/stop of each page from a per-item page id array (ids equal within a page, consecutive)."""
    pages = np.asarray(pages)
    if pages.ndim != 1:
        raise RowError(f"pages must be one id per item, got shape {pages.shape}")
    cut = np.nonzero(pages[1:] != pages[:-1])[0] + 1
    bounds = np.concatenate([[0], cut, [pages.shape[0]]])
    ids = pages[bounds[:-1]]
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise RowError(f"page id {uniq[counts > 1][0]} appears in two separate runs of items: a page's items must be consecutive")
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def check_row_options(objective: str, token_merger: str, pages):
    """One-line RowErrors for an unknown objective or merger, and page_ntp without pages."""
    if objective not in OBJECTIVES:
        raise RowError(f"loss.objective = {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    group_width(token_merger, 1)          # a one-line RowError for an unknown merger
    if objective == "page_ntp" and pages is None:
        raise RowError("loss.objective = page_ntp needs pages (a page id per item); use ntp for page-less data")


def user_rows(items, codes, level_offsets, objective: str = "ntp", token_merger: str = "none", pages=None,
              pad_id: int | None = None, item_groups=None, target_weights=None) -> list:
    """Training rows of one user's history `items` [n] (item ids into `codes` [V+1, Lt]; item_groups
    [V+1, Lt] the softmax group of each item's codes, None = their level; target_weights [n]: each item's
    factor on the weight of the tokens that predict it, None = 1)."""
    check_row_options(objective, token_merger, pages)
    items = np.asarray(items, np.int64)
    codes = np.asarray(codes)
    lt = codes.shape[1]
    pad_id = int(level_offsets[-1]) if pad_id is None else pad_id
    group = group_width(token_merger, lt)
    item_codes = codes[items].astype(np.int64)
    if item_groups is None:
        target_groups = np.broadcast_to(np.arange(lt, dtype=np.int32), item_codes.shape)
    else:
        target_groups = np.asarray(item_groups, np.int32)[items]
    if items.shape[0] < 2:
        return []
    tw = None if target_weights is None else np.asarray(target_weights, np.float32)
    if tw is not None and tw.shape != items.shape:
        raise RowError(f"target_weights has {tw.shape[0] if tw.ndim else 0} weights for {items.shape[0]} items")
    if objective == "ntp" and token_merger == "none":
        row = _flat_row(item_codes, target_groups, level_offsets, pad_id)
        if tw is not None:          # token t predicts a code of item (t + 1) // Lt
            row["weight"] = row["weight"] * tw[(np.arange(row["weight"].shape[0]) + 1) // lt]
        return [row]
    if objective == "ntp":
        groups = [(j, j + 1) for j in range(items.shape[0])]
    else:
        if np.asarray(pages).shape != items.shape:
            raise RowError(f"pages has {np.asarray(pages).shape[0]} ids for {items.shape[0]} items")
        groups = page_groups(pages)
    rows = []
    for start, stop in groups[1:]:
        p_slots, p_merged = prompt_tokens(item_codes[:start], level_offsets, token_merger, pad_id, items[:start])
        for j in range(start, stop):
            tgt = (item_codes[j] + np.asarray(level_offsets[:-1])).astype(np.int32)
            weight = (1.0 if tw is None else float(tw[j])) / (stop - start)
            rows.append(_row(p_slots, p_merged, tgt, target_groups[j], group, pad_id, weight))
    return rows


def pack_rows(rows: list, t_cap: int, b_cap: int, group: int, pad_id: int) -> list:
    """Greedy packing of rows (in order) into fixed-capacity batches of numpy arrays."""
    batches, cur, used = [], [], 0
    for r in rows:
        n = r["slots"].shape[0]
        if n > t_cap:
            raise RowError(f"a training row has {n} tokens, more than the token capacity {t_cap}")
        if cur and (used + n > t_cap or len(cur) == b_cap):
            batches.append(_batch(cur, t_cap, b_cap, group, pad_id))
            cur, used = [], 0
        cur.append(r)
        used += n
    if cur:
        batches.append(_batch(cur, t_cap, b_cap, group, pad_id))
    return batches


def _batch(rows, t_cap, b_cap, group, pad_id):
    lengths = [r["slots"].shape[0] for r in rows]
    offsets = np.full(b_cap + 1, sum(lengths), np.int32)
    offsets[: len(rows) + 1] = np.concatenate([[0], np.cumsum(lengths)])
    out = dict(slots=np.full((t_cap, group), pad_id, np.int32), merged=np.zeros(t_cap, np.float32),
               target=np.zeros(t_cap, np.int32), group=np.zeros(t_cap, np.int32), weight=np.zeros(t_cap, np.float32))
    pos = 0
    for r, n in zip(rows, lengths):
        for key in out:
            out[key][pos:pos + n] = r[key]
        pos += n
    out["offsets"] = offsets
    return out


BATCH_KEYS = ("slots", "merged", "offsets", "target", "group", "weight")
ENTRY_KEYS = ("slots", "merged", "offsets", "pos", "target", "group", "weight")     # EntryNTPLoss's inputs


def batch_tensors(batch: dict) -> tuple:
    return tuple(Tensor(batch[k]) for k in BATCH_KEYS)


def level_groups(level_sizes) -> np.ndarray:
    """bool [Lt, sum K]: the default softmax groups, row l = the level-l codes."""
    sizes = [int(k) for k in level_sizes]
    return np.repeat(np.eye(len(sizes), dtype=bool), sizes, axis=1)


class NTPLoss(nn.Cell):
    """mean over prompts of mean over their targets of sum_l CE(code_l): Lt * sum(w * ce) / sum(w), where a
    target position's weight w is 1 / (targets of its prompt). Per position the softmax runs over the
    codes of its group: row `group` of `allowed` [groups, sum K] (default: its level's codes; with the
    trie softmax, the codes the trie allows after the target's prefix, PrefixTrie.node_masks)."""

    def __init__(self, decoder, allowed=None):
        super().__init__()
        self.decoder = decoder
        self.num_levels = float(decoder.num_levels)
        self.head = None
        self.restrict_to(level_groups(decoder.level_sizes) if allowed is None else allowed)

    def use_trie_head(self, head):
        """Score loss entries with a trie_head.TrieHead (only the trie's allowed codes) instead of masked full
        logits; the entries must then come as [items, Lt] (EntryNTPLoss, or the tree layout's)."""
        self.head = head
        self.allowed = None                  # the [groups, sum K] table is no longer read: do not keep it

    def entry_losses(self, hidden, target, group):
        """ce [E] of the hidden states [E, D] at loss entries: the trie head on [E / Lt, Lt] items when set,
        else masked full logits."""
        if self.head is None:
            return self.grouped_ce(self.decoder.logits(hidden), target, group)
        lt = self.decoder.num_levels
        items = hidden.shape[0] // lt
        return self.head(hidden.reshape(items, lt, hidden.shape[1]), target.reshape(items, lt),
                         group.reshape(items, lt)).reshape(-1)

    def restrict_to(self, allowed):
        """Use other softmax groups, e.g. the trie's prefix nodes (PrefixTrie.node_masks): call before the
        first step (the table is a constant of the compiled graph)."""
        allowed = np.asarray(allowed, bool)
        if allowed.ndim != 2 or allowed.shape[1] != self.decoder.num_codes:
            raise ValueError(f"softmax groups must be [groups, {self.decoder.num_codes}], got {allowed.shape}")
        self.allowed = Tensor(allowed)

    def grouped_ce(self, logits, target, group):
        """Per position: the log-sum-exp of its logits over its group's codes minus its target's logit."""
        same = ops.gather(self.allowed, group, 0)
        masked = ops.where(same, logits, ops.full_like(logits, _MASKED))
        picked = ops.gather_elements(logits, 1, ops.expand_dims(target, 1)).reshape(-1)
        return ops.logsumexp(masked, 1) - picked

    def weighted_mean(self, ce, weight):
        """Lt * sum(w * ce) / sum(w): the mean over prompts of the mean over their targets' item losses."""
        total = weight.sum()
        return self.num_levels * (ce * weight).sum() / ops.maximum(total, ops.ones_like(total) * 1e-12)

    def token_losses(self, slots, merged, offsets, target, group, drop=None):
        logits = self.decoder.logits(self.decoder(slots, merged, offsets, drop))      # [T, C]
        return self.grouped_ce(logits, target, group)

    def construct(self, slots, merged, offsets, target, group, weight, drop=None):
        return self.weighted_mean(self.token_losses(slots, merged, offsets, target, group, drop), weight)


class EntryNTPLoss(NTPLoss):
    """NTPLoss over a copied-row batch in the entry layout (ENTRY_KEYS: pos / target / group / weight per loss
    entry, [items, Lt] flattened), so the head runs at the target positions only: with use_trie_head, over
    the trie's allowed codes. Equal to NTPLoss over the same batch's per-token arrays."""

    def construct(self, slots, merged, offsets, pos, target, group, weight, drop=None):
        hidden = self.decoder(slots, merged, offsets, drop)
        return self.weighted_mean(self.entry_losses(ops.gather(hidden, pos, 0), target, group), weight)
