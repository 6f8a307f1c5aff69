"""Beam search over the trie's children only: the decoding engine's default scoring (same lists as
mindgr.generate.beam.beam_search, the plain reference).

At a level after the first, a beam can only be extended by the codes the trie allows after its prefix:
a few (one or two at the last levels, tens at the second) out of thousands. So instead of the level's
whole logit row per beam, its log-softmax on the host and a mask of the level's width, each step here
- lists the (beam, allowed code) pairs from the trie in CSR form (ChildTable: built once per trie),
- scores only those pairs: from the state's hidden vectors and the code head's rows of those codes when
  the state gives hidden vectors (`gives_hidden`: prefill_records, step_hidden, head_weights; the step
  graph then runs no head at all), else from the state's logits gathered at those codes; where the pairs
  are a sizeable share of (live beams x the level's codes), or the level softmax needs every code's logit
  for its normaliser anyway, the hidden vectors' dense logits over the level (one GEMM) are gathered instead,
- normalises per beam: over its children with the trie softmax (the decoder's scoring rule), else by the
  level's log-sum-exp (the head over the level's codes, still computed only for live beams),
- keeps per user the `width` best pairs (select_ragged): a partition, then a sort of the winners only,
  ties by (beam, code) as the reference's stable sort of the flat (beam x code) candidates.
Pairs are laid out user-major, then by beam, then by code: the order the reference's flat index has.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.generate.beam import NEG_INF, exclusion

PAIR_CHUNK = 1 << 15        # pairs scored per gather (bounds the [pairs, D] temporaries to a few MB)
DENSE_SHARE = 8             # trie softmax: the level's dense logits once pairs >= 1/8 of (rows x codes)


class ChildTable:
    """The trie's children as CSR per level: level l's prefix row r (as trie.masks[l]) may be followed by
    codes[l][ptr[l][r]:ptr[l][r+1]], ascending."""

    def __init__(self, trie):
        self.trie = trie
        self.ptr, self.codes = [], []
        for mask in trie.masks:
            rows, codes = np.nonzero(mask)           # row-major: each row's codes ascending
            ptr = np.zeros(mask.shape[0] + 1, np.int64)
            np.cumsum(np.bincount(rows, minlength=mask.shape[0]), out=ptr[1:])
            self.ptr.append(ptr)
            self.codes.append(codes.astype(np.int64))

    def pairs(self, level: int, keys: np.ndarray, alive: np.ndarray):
        """(beam [M] flat index into keys, code [M], counts [n]) of every (live beam, allowed code) pair,
        beam-major, codes ascending; keys / alive [n] flat."""
        rows, found = self.trie.mask_rows(level, keys)
        ptr = self.ptr[level]
        start = ptr[rows]
        counts = np.where(alive & found, ptr[rows + 1] - start, 0)
        beam = np.repeat(np.arange(keys.shape[0]), counts)
        first = np.cumsum(counts) - counts
        within = np.arange(beam.shape[0]) - np.repeat(first, counts)
        return beam, self.codes[level][np.repeat(start, counts) + within], counts


def child_table(trie) -> ChildTable:
    """The trie's ChildTable, built once per trie (kept on it)."""
    table = getattr(trie, "_child_table", None)
    if table is None:
        table = trie._child_table = ChildTable(trie)
    return table


def pair_logits(hidden: np.ndarray, w_t: np.ndarray, bias: np.ndarray, beam: np.ndarray, gid: np.ndarray):
    """logit [M] = hidden[beam] . w_t[gid] + bias[gid], in chunks (float32, as the graph's head)."""
    out = np.empty(beam.shape[0], np.float32)
    for lo in range(0, beam.shape[0], PAIR_CHUNK):
        b, g = beam[lo:lo + PAIR_CHUNK], gid[lo:lo + PAIR_CHUNK]
        out[lo:lo + PAIR_CHUNK] = np.einsum("md,md->m", hidden[b], w_t[g]) + bias[g]
    return out


def segment_log_softmax(z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Log-softmax of z [M] within consecutive segments of `counts` (empty ones skipped), float64 -> float32
    (as mindgr.models.generative.log_softmax)."""
    z = z.astype(np.float64)
    if z.shape[0] == 0:
        return z.astype(np.float32)
    nz = counts[counts > 0]
    starts = np.cumsum(nz) - nz
    m = np.repeat(np.maximum.reduceat(z, starts), nz)
    e = z - m
    lse = np.repeat(np.log(np.add.reduceat(np.exp(e), starts)), nz)
    return (e - lse).astype(np.float32)


def level_pair_logits(hidden: np.ndarray, w_level: np.ndarray, b_level: np.ndarray, beam: np.ndarray,
                      child: np.ndarray, counts: np.ndarray, want_lse: bool):
    """The pairs' logits from the level's dense logits of the rows that have pairs: (z [M] float32, lse [n]
    float64 over the level's codes of every such row, 0 elsewhere; None unless want_lse). hidden [n, D],
    w_level [D, K], b_level [K]; pairs beam-major as ChildTable.pairs gives them (counts per row). One GEMM
    per chunk of rows where pair_logits gathers a head row per pair: cheaper once the pairs are a sizeable
    share of rows x K, and the plain level softmax needs the dense row for its normaliser anyway."""
    live = np.flatnonzero(counts)
    z = np.empty(beam.shape[0], np.float32)
    lse = np.zeros(hidden.shape[0], np.float64) if want_lse else None
    end = np.cumsum(counts)
    step = max(1, (1 << 22) // max(w_level.shape[1], 1))           # bounds the [rows, K] temporary
    for lo in range(0, live.shape[0], step):
        rows = live[lo:lo + step]
        dense = hidden[rows] @ w_level + b_level
        p0, p1 = end[rows[0]] - counts[rows[0]], end[rows[-1]]
        z[p0:p1] = dense[np.repeat(np.arange(rows.shape[0]), counts[rows]), child[p0:p1]]
        if want_lse:
            lse[rows] = level_lse_logits(dense)
    return z, lse


def select_ragged(vals: np.ndarray, owner: np.ndarray, users: int, width: int):
    """Per user the `width` best of its candidates: vals [M] float32 with owner [M] (users ascending, each
    user's candidates in tie order) -> (index into vals [users, width], -1 = dead; score [users, width],
    -inf = dead). Same choice and order as a stable sort by descending score."""
    counts = np.bincount(owner, minlength=users)
    cols = max(int(counts.max()) if counts.size else 0, 1)
    first = np.cumsum(counts) - counts
    pos = np.arange(owner.shape[0]) - first[owner]
    mat = np.full((users, cols), NEG_INF, np.float32)
    mat[owner, pos] = vals
    if cols > width:         # the width-th best value; keep everything >= it (ties at it resolved below)
        kth = -np.partition(-mat, width - 1, axis=1)[:, width - 1]
        keep = mat >= kth[:, None]
        n_keep = keep.sum(1)
        if int(n_keep.max()) > width:                     # ties at the boundary: compact, then sort
            sub = max(int(n_keep.max()), width)
            r, c = np.nonzero(keep)
            rank = np.arange(r.shape[0]) - np.repeat(np.cumsum(n_keep) - n_keep, n_keep)
            idx = np.full((users, sub), cols, np.int64)
            idx[r, rank] = c
            sv = np.full((users, sub), NEG_INF, np.float32)
            sv[r, rank] = mat[r, c]
        else:
            idx = np.nonzero(keep)[1].reshape(users, width)
            sv = np.take_along_axis(mat, idx, 1)
    else:
        idx = np.broadcast_to(np.arange(cols), (users, cols))
        sv = mat
    order = np.lexsort((idx, -sv), axis=1)[:, :width]
    idx, sv = np.take_along_axis(idx, order, 1), np.take_along_axis(sv, order, 1)
    if idx.shape[1] < width:
        pad = width - idx.shape[1]
        idx = np.concatenate([idx, np.full((users, pad), cols, np.int64)], 1)
        sv = np.concatenate([sv, np.full((users, pad), NEG_INF, np.float32)], 1)
    live = np.isfinite(sv) & (idx < counts[:, None])
    pick = np.where(live, first[:, None] + np.minimum(idx, cols - 1), -1)
    return pick, np.where(live, sv, NEG_INF).astype(np.float32)


def children_search(state, decoder, table: ChildTable, prompts, num_users: int, capacity: int, beam: int, k: int,
                    timings: dict, exclude=None):
    """Trie-constrained beam search of `num_users` prompts through a decoding state (capacity users x
    beam) -> (items [U, k], scores [U, k]); timings gains "prefill", "model", "head", "masks", "select".
    exclude: per user, items never returned (as mindgr.generate.beam.beam_search: dropped at the last level)."""
    exclude = exclusion(exclude, num_users)
    trie, u, lt = table.trie, num_users, table.trie.num_levels
    offsets = decoder.level_offsets
    renorm = bool(decoder.trie_softmax)
    hidden_path = bool(getattr(state, "gives_hidden", False))
    t0 = time.perf_counter()
    level0 = np.asarray(state.prefill_records(prompts) if hidden_path else state.prefill(prompts), np.float32)[:u]
    head = state.head_weights() if hidden_path else None
    t1 = time.perf_counter()
    timings["prefill"] += t1 - t0
    # level 0: one live beam per user (the empty prefix), the trie's first codes as candidates
    first = np.nonzero(trie.masks[0][0])[0]
    z = level0[:, offsets[0] + first]
    if renorm:
        logp = segment_log_softmax(z.reshape(-1), np.full(u, first.shape[0])).reshape(u, -1)
    else:
        from mindgr.models.generative import level_log_softmax
        logp = level_log_softmax(level0, offsets, 0)[:, first]
    t2 = time.perf_counter()
    width = k if lt == 1 else beam
    vals = (np.float32(0.0) + logp).reshape(-1)
    owner = np.repeat(np.arange(u), first.shape[0])
    if exclude is not None and lt == 1:
        vals = np.where(exclude.hits(owner, np.tile(trie.item_of(first[:, None]), u)), NEG_INF, vals)
    pick, score = select_ragged(vals, owner, u, width)
    pair_code = np.tile(first, u)
    code = np.where(pick >= 0, pair_code[np.maximum(pick, 0)], 0)
    parent = np.zeros((u, width), np.int64)
    timings["head"] += t2 - t1
    timings["select"] += time.perf_counter() - t2
    prefixes = code[:, :, None]
    keys = code.astype(np.int64)
    parents = []
    for level in range(1, lt):
        alive = np.isfinite(score)
        parents.append(_padded(parent, capacity, beam))
        t0 = time.perf_counter()
        codes_in = _padded(np.where(alive, code, 0), capacity, beam)
        if hidden_path:
            out = state.step_hidden(level, codes_in, parents)          # [C, Bm, D]
        else:
            out = state.step(level, codes_in, parents)                 # [C, Bm, sum K]
        out = np.asarray(out, np.float32)[:u].reshape(u * beam, -1)
        t1 = time.perf_counter()
        beam_of, child, counts = table.pairs(level, keys.reshape(-1), alive.reshape(-1))
        t2 = time.perf_counter()
        gid = offsets[level] + child
        a, b = int(offsets[level]), int(offsets[level + 1])
        lse = None
        if hidden_path:
            w_t, bias = head
            live_rows = int(np.count_nonzero(counts))
            if not renorm or beam_of.shape[0] * DENSE_SHARE >= live_rows * (b - a):
                z, lse = level_pair_logits(out, w_t[a:b].T, bias[a:b], beam_of, child, counts, not renorm)
            else:
                z = pair_logits(out, w_t, bias, beam_of, gid)
        else:
            z = out[beam_of, gid]
        if renorm:
            logp = segment_log_softmax(z, counts)
        else:
            if lse is None:
                live = np.flatnonzero(counts)
                lse = np.zeros(u * beam, np.float64)
                lse[live] = level_lse_logits(out[live, a:b])
            logp = (z.astype(np.float64) - lse[beam_of]).astype(np.float32)
        t3 = time.perf_counter()
        width = k if level == lt - 1 else beam
        vals = score.reshape(-1)[beam_of] + logp
        if exclude is not None and level == lt - 1:
            done = trie.item_of(np.concatenate([prefixes.reshape(u * beam, level)[beam_of], child[:, None]], 1))
            vals = np.where(exclude.hits(beam_of // beam, done), NEG_INF, vals)
        pick, score = select_ragged(vals, beam_of // beam, u, width)
        ok = pick >= 0
        p = np.maximum(pick, 0)
        parent = np.where(ok, beam_of[p] % beam, 0)
        code = np.where(ok, child[p], 0)
        prefixes = np.concatenate([np.take_along_axis(prefixes, parent[..., None], 1), code[..., None]], 2)
        prefixes = np.where(ok[..., None], prefixes, 0)
        keys = np.where(ok, trie.extend(level, np.take_along_axis(keys, parent, 1), code), 0)
        t4 = time.perf_counter()
        timings["model"] += t1 - t0
        timings["masks"] += t2 - t1
        timings["head"] += t3 - t2
        timings["select"] += t4 - t3
    items = np.where(np.isfinite(score), trie.item_of(prefixes), 0)
    return items, score


def level_lse_logits(z: np.ndarray) -> np.ndarray:
    """log-sum-exp [n] of logit rows [n, K] in float64."""
    z = z.astype(np.float64)
    m = z.max(1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(1, keepdims=True)))[:, 0]


def _padded(a: np.ndarray, capacity: int, beam: int) -> np.ndarray:
    """[u, w] -> [capacity, beam] int64 (spare users and beams 0): the state's fixed shape."""
    out = np.zeros((capacity, beam), np.int64)
    out[:a.shape[0], :a.shape[1]] = a
    return out
