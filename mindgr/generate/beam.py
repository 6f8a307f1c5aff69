"""Trie-constrained beam search over semantic-ID tuples: the plain reference.

beam_search(trie, scorer, num_users, beam, k) runs Lt = L+1 steps for a batch of users at fixed shapes
[users, beam]. At step s every live beam holds a valid prefix of length s; the scorer gives the
log-probabilities of the level-s codes after each beam's prefix; only codes the trie allows after that
prefix are candidates (so only valid prefixes are ever scored or kept); a beam's score is the sum of its
per-step log-probs (with `renormalize`, each step's log-probs are first renormalised over the allowed
codes of their prefix: the scoring rule of a decoder trained with the trie softmax). The best `beam`
candidates over (beam x code) survive (a full stable sort here: the
reference), and after the last step the best `k` complete tuples become items. Tuples are unique per
item, so the k items are distinct. Beams that cannot be filled (fewer valid prefixes than `beam`) stay
dead (score -inf, item 0).

The scorer is any object with `step(level, prefixes [U, Bm, level] int64) -> log-probs [U, Bm, K_level]`
and `advance(parent [U, Bm], code [U, Bm], alive [U, Bm])`, told which beam each new beam forked from:
the reference one (mindgr.models.generative.RecomputeScorer) re-runs the decoder over every beam's whole
sequence each step; the engine (mindgr.generate.engine) is the fast path of the same search.

beam_ranks(items, targets, histories, num_items) turns the lists into 0-based ranks as `mindgr eval`
writes them (mindgr.train.metrics.target_ranks): history items other than the target are skipped; a
target outside the list is a miss, ranked `num_items` (below every item, so hit@K is 0 for any K).
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.models.generative import log_softmax

NEG_INF = np.float32(-np.inf)


class BeamError(ValueError):
    """A beam width / list length / batch that the search cannot run with."""


def check_widths(trie, beam: int, k: int):
    if k < 1 or beam < k:
        raise BeamError(f"beam width {beam} must be >= the list length k = {k} >= 1")


class ItemExclusion:
    """Per-user items a search must not return (e.g. what each user already consumed): the last level's
    candidates that complete one of them are dropped before selection, so the k items returned are k
    other items whenever the beams hold that many (a filter after the search would leave fewer)."""

    def __init__(self, per_user):
        keys = [(u << 32) + np.unique(np.asarray(ids, np.int64)) for u, ids in enumerate(per_user)
                if ids is not None and len(ids)]
        self.keys = np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
        self.num_users = len(per_user)

    def hits(self, owner, items) -> np.ndarray:
        """bool, shaped as items: whether (owner, item) is excluded (item 0, no item, never is)."""
        items = np.asarray(items, np.int64)
        if not self.keys.shape[0]:
            return np.zeros(items.shape, bool)
        q = (np.asarray(owner, np.int64) << 32) + items
        pos = np.minimum(np.searchsorted(self.keys, q), self.keys.shape[0] - 1)
        return (self.keys[pos] == q) & (items > 0)


def exclusion(exclude, num_users: int):
    """ItemExclusion of `exclude` (None, an ItemExclusion, or one item array per user), or None."""
    if exclude is None:
        return None
    given = exclude.num_users if isinstance(exclude, ItemExclusion) else len(exclude)
    if given != num_users:
        raise BeamError(f"exclude: {given} item lists for {num_users} users")
    return exclude if isinstance(exclude, ItemExclusion) else ItemExclusion(exclude)


def select_full_sort(cand: np.ndarray, width: int):
    """Reference selection: flatten [U, Bm, C] candidates, stable sort descending, keep `width`.
    Returns (parent beam [U, width], code [U, width], score [U, width])."""
    u, bm, c = cand.shape
    flat = cand.reshape(u, bm * c)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :width]
    score = np.take_along_axis(flat, order, 1)
    if order.shape[1] < width:          # fewer candidates than the width: pad with dead beams
        pad = width - order.shape[1]
        order = np.concatenate([order, np.zeros((u, pad), order.dtype)], 1)
        score = np.concatenate([score, np.full((u, pad), NEG_INF, np.float32)], 1)
    return order // c, order % c, score


def beam_search(trie, scorer, num_users: int, beam: int, k: int, select=select_full_sort, rebuild_masks=False,
                timings: dict | None = None, renormalize: bool = False, exclude=None):
    """-> (items [U, k] int64, scores [U, k] float32), best first; dead slots are item 0, score -inf.

    rebuild_masks: recompute each step's valid-next masks from the code table instead of reusing the
    trie's prebuilt ones (the naive baseline of the decoding engine; same result).
    timings: if given, seconds spent in the scorer ("model"), masks ("masks") and selection ("select")
    are added to it.
    exclude: per user, items never returned (ItemExclusion or one item array per user): at the last level
    their tuples are not candidates, so the k items are the best others."""
    timings = {} if timings is None else timings
    exclude = exclusion(exclude, num_users)
    for key in ("model", "masks", "select"):
        timings.setdefault(key, 0.0)
    check_widths(trie, beam, k)
    lt = trie.num_levels
    prefixes = np.zeros((num_users, beam, 0), np.int64)
    keys = np.zeros((num_users, beam), np.int64)
    score = np.full((num_users, beam), NEG_INF, np.float32)
    score[:, 0] = 0.0                                  # one live beam: the empty prefix
    for level in range(lt):
        t0 = time.perf_counter()
        logp = np.asarray(scorer.step(level, prefixes), np.float32)        # [U, Bm, K_level]
        t1 = time.perf_counter()
        allowed = rebuilt_allowed(trie, level, prefixes) if rebuild_masks else trie.allowed(level, keys)
        t2 = time.perf_counter()
        if renormalize:
            logp = renormalized(logp, allowed)
        if exclude is not None and level == lt - 1:
            allowed = allowed & ~last_level_excluded(trie, prefixes, allowed.shape[-1], exclude)
        live = np.isfinite(score)
        cand = np.where(allowed & live[..., None], score[..., None] + logp, NEG_INF).astype(np.float32)
        width = k if level == lt - 1 else beam
        parent, code, score = select(cand, width)
        t3 = time.perf_counter()
        timings["model"] += t1 - t0
        timings["masks"] += t2 - t1
        timings["select"] += t3 - t2
        alive = np.isfinite(score)
        prefixes = np.concatenate([np.take_along_axis(prefixes, parent[..., None], 1), code[..., None]], 2)
        prefixes = np.where(alive[..., None], prefixes, 0)
        keys = np.where(alive, trie.extend(level, np.take_along_axis(keys, parent, 1), code), 0)
        if level < lt - 1:
            scorer.advance(parent, code, alive)
    items = np.where(np.isfinite(score), trie.item_of(prefixes), 0)
    return items, score


def last_level_excluded(trie, prefixes: np.ndarray, width: int, exclude: ItemExclusion) -> np.ndarray:
    """bool [U, Bm, width]: which (beam, last code) completes an excluded item of the beam's user."""
    u, bm, level = prefixes.shape
    full = np.concatenate([np.broadcast_to(prefixes[:, :, None, :], (u, bm, width, level)),
                           np.broadcast_to(np.arange(width)[None, None, :, None], (u, bm, width, 1))], -1)
    owner = np.broadcast_to(np.arange(u)[:, None, None], (u, bm, width))
    return exclude.hits(owner, trie.item_of(full))


def renormalized(logp: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """log-probs [..., K] renormalised over the allowed codes of each row (-inf elsewhere and in rows that
    allow none)."""
    return log_softmax(logp, allowed)


def rebuilt_allowed(trie, level: int, prefixes: np.ndarray) -> np.ndarray:
    """The valid-next mask built from scratch from the code table (no reuse): [U, Bm, K_level]."""
    items = trie.codes[1:]
    u, bm, _ = prefixes.shape
    out = np.zeros((u, bm, int(trie.level_sizes[level])), bool)
    flat = prefixes.reshape(u * bm, level)
    for r in range(u * bm):
        match = (items[:, :level] == flat[r][None, :]).all(1)
        out.reshape(u * bm, -1)[r, items[match, level]] = True
    return out


def topk_items(item_scores: np.ndarray, k: int):
    """Exhaustive reference: the k best of item_scores [U, V+1] (column 0 = padding, never chosen)."""
    s = np.array(item_scores, np.float32, copy=True)
    s[:, 0] = NEG_INF
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(s, order, 1)


def beam_ranks(items: np.ndarray, targets, histories, num_items: int) -> np.ndarray:
    """0-based rank of each target in its returned list, history items (other than the target) and
    dead slots removed; `num_items` (a miss) when the target is not in the list."""
    items = np.asarray(items)
    ranks = np.full(items.shape[0], num_items, np.int64)
    for u in range(items.shape[0]):
        t = int(targets[u])
        seen = set(int(i) for i in histories[u]) - {t} if histories is not None else set()
        r = 0
        for it in items[u].tolist():
            if it == 0 or it in seen:
                continue
            if it == t:
                ranks[u] = r
                break
            r += 1
    return ranks
