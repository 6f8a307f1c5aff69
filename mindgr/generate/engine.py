"""The decoding engine: the fast path of trie-constrained beam search (mindgr.generate.beam), same lists.

Ideas (xGR, arXiv 2512.11529), as built here:
- Staged prefill / decode through the decoder's own decoding state (mindgr.models.generation): prefill
  encodes each user's prompt once, then one step per level given each beam's parent. The HSTU GR
  decoder's state (mindgr.models.kv_cache) keeps the prompt's K/V once per user and each beam's tokens in
  append-only records: forking a beam copies nothing, its ancestry is found by parent indices; HSTU's
  attention has no softmax normaliser, so a token's attention is (its part over the shared prompt) + (its
  part over its ancestry). The engine sees none of that: a decoder with another state (a recurrent one
  for linear attention) is decoded by the same engine.
- Only the trie's children scored (`head="children"`, the default: mindgr.generate.children): after the
  first level a beam's candidates are the few codes the trie allows after its prefix, so the step graph
  gives hidden vectors (no code head), the head runs on the host for those (beam, code) pairs only, and
  every user's best candidates are chosen from the ragged pairs at once. `head="full"` is the path before:
  every code of the level scored, masked and selected (with the two options below).
- Early sorting termination (head "full"): `select_partial` keeps per beam only its best candidates
  (argpartition, no sort), drops whole beams whose best candidate is below a threshold (a lower bound
  of the width-th best score, from the beams' maxima), and sorts only the `width` winners; never a full
  sort of beam x vocabulary.
- Valid-item masks from the trie (mindgr.ids.trie), built once per tokenizer and reused by every step
  and request (`masks="reuse"`).
The baselines stay selectable: `cache="per_beam"` (the cached beam search of common generate()
implementations: the prompt's K/V copied per beam, every beam's cache gathered from its parent's each step;
the decoder's state with layout "per_beam"; for a linear-attention decoder every beam's full recurrent
state), `cache="replay"` (linear attention only: every beam's state rebuilt from the prompt state and its
ancestry's records each step), `cache="recompute"` (every beam's whole sequence re-run each step,
mindgr.models.generative.RecomputeScorer), `selection="full_sort"`, `masks="rebuild"`.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.generate.beam import NEG_INF, beam_search, check_widths, select_full_sort
from mindgr.generate.children import child_table, children_search
from mindgr.models.generation import check_generator
from mindgr.models.generative import LastTokenLogits, RecomputeScorer, level_log_softmax

CACHES = ("shared", "per_beam", "replay", "recompute")
SELECTIONS = ("partial", "full_sort")
MASKS = ("reuse", "rebuild")
HEADS = ("children", "full")


class _RunnerNet:
    """A compiled cell called through a runner (the naive scorer's net): returns host arrays."""

    def __init__(self, net, runner):
        self.net, self.runner = net, runner

    def __call__(self, *args):
        return _HostArray(self.runner(lambda: self.net(*args).asnumpy()))


class _HostArray:
    def __init__(self, a):
        self.a = a

    def asnumpy(self):
        return self.a


class _EngineScorer:
    """beam_search's scorer on top of a decoding state: level 0 from the prefill, then one step a level."""

    def __init__(self, state, level0_logits, num_users, capacity, beam, level_offsets):
        self.state, self.level_offsets = state, level_offsets
        self.level0, self.num_users, self.capacity, self.beam = level0_logits, num_users, capacity, beam
        self.parents = []           # parents[t]: [U, Bm] parent (among level t-1's beams) of level t's beams

    def step(self, level, prefixes):
        u = self.num_users
        if level == 0:
            logp = level_log_softmax(self.level0[:u], self.level_offsets, 0)
            return np.broadcast_to(logp[:, None, :], (u, self.beam, logp.shape[-1]))
        codes = np.zeros((self.capacity, self.beam), np.int64)
        codes[:u] = prefixes[:, :, level - 1]
        spare = np.zeros((self.capacity - u, self.beam), np.int64)
        parents = [np.concatenate([p, spare]) for p in self.parents]
        logits = self.state.step(level, codes, parents)[:u]
        return level_log_softmax(logits, self.level_offsets, level)

    def advance(self, parent, code, alive):
        self.parents.append(parent)


def select_partial(cand: np.ndarray, width: int):
    """Early-terminated selection, same result as select_full_sort: (parent, code, score) [U, width].

    Per beam only its top-m (m = min(width, C)) candidates are kept by argpartition (no sort); a beam
    whose best candidate is below the width-th largest of the beams' best candidates (a lower bound of
    the final threshold: each of those is a real candidate) is skipped; the survivors' candidates are
    cut to `width` by argpartition and only those are sorted (score desc, then flat index, as the
    stable full sort orders ties)."""
    u, bm, c = cand.shape
    m = min(width, c)
    best = cand.max(-1)                                                       # [U, Bm]
    if bm > width:
        bound = -np.partition(-best, width - 1, axis=1)[:, width - 1]         # width-th best beam maximum
    else:
        bound = np.full(u, -np.inf, np.float32)
    keep = best >= bound[:, None]
    part = np.argpartition(-cand, m - 1, axis=2)[:, :, :m] if m < c else np.broadcast_to(np.arange(c), (u, bm, c))
    vals = np.take_along_axis(cand, part, 2)
    vals = np.where(keep[..., None], vals, NEG_INF)
    flat_idx = (np.arange(bm)[None, :, None] * c + part).reshape(u, bm * m)
    vals = vals.reshape(u, bm * m)
    if vals.shape[1] > width:
        top = np.argpartition(-vals, width - 1, axis=1)[:, :width]
        vals, flat_idx = np.take_along_axis(vals, top, 1), np.take_along_axis(flat_idx, top, 1)
    order = np.lexsort((flat_idx, -vals), axis=1) if vals.shape[1] else np.zeros((u, 0), np.int64)
    vals, flat_idx = np.take_along_axis(vals, order, 1), np.take_along_axis(flat_idx, order, 1)
    if vals.shape[1] < width:
        pad = width - vals.shape[1]
        vals = np.concatenate([vals, np.full((u, pad), NEG_INF, np.float32)], 1)
        flat_idx = np.concatenate([flat_idx, np.zeros((u, pad), flat_idx.dtype)], 1)
    dead = ~np.isfinite(vals)
    flat_idx = np.where(dead, 0, flat_idx)
    return flat_idx // c, flat_idx % c, vals.astype(np.float32)


class DecodingEngine:
    """Beam search for a batch of users with a generative decoder and its trie, engine or naive baseline.

    search(histories, k, exclude=None) -> (items [U, k], scores [U, k]); `num_users` is the fixed batch capacity. The
    decoder is reached only through its generation contract (mindgr.models.generation)."""

    def __init__(self, decoder, trie, codes, beam: int, max_prompt_tokens: int, num_users: int,
                 cache: str = "shared", selection: str = "partial", masks: str = "reuse", runner=None,
                 head: str = "children"):
        """runner(fn, *args) -> fn(*args): where the model calls run (default: the calling thread; the server
        passes one model thread so that host-side selection of one batch overlaps model compute of another).
        head: "children" (mindgr.generate.children: only the trie's allowed codes of each beam are scored and
        selected) or "full" (every code of the level scored, masked and selected: the earlier path; the
        selection / masks options apply to it). The recompute baseline always scores in full."""
        for name, value, allowed in (("cache", cache, CACHES), ("selection", selection, SELECTIONS),
                                     ("masks", masks, MASKS), ("head", head, HEADS)):
            if value not in allowed:
                raise ValueError(f"decode {name} = {value!r}: expected one of {', '.join(allowed)}")
        check_generator(decoder)
        self.dec, self.trie, self.codes = decoder, trie, np.asarray(codes)
        self.beam, self.p_cap, self.num_users = beam, max_prompt_tokens, num_users
        self.cache, self.selection, self.masks = cache, selection, masks
        self.head = head if cache != "recompute" else "full"
        self.children = child_table(trie) if self.head == "children" else None
        self.state = None
        if cache != "recompute":        # the decoder's layout of that name (a one-line error if it has none)
            self.state = decoder.decode_state(num_users, beam, max_prompt_tokens, runner=runner, layout=cache)
        if cache == "recompute":
            self.recompute_net = LastTokenLogits(decoder)
            self.recompute_net.set_train(False)
            if runner is not None:
                self.recompute_net = _RunnerNet(self.recompute_net, runner)
        self.timings = {"prefill": 0.0, "model": 0.0, "head": 0.0, "masks": 0.0, "select": 0.0}

    def search(self, histories, k: int, exclude=None):
        """exclude: per user, items never returned (e.g. the history itself): the k items are the best others."""
        check_widths(self.trie, self.beam, k)
        if len(histories) > self.num_users:
            raise ValueError(f"{len(histories)} users exceed the engine's batch capacity {self.num_users}")
        if self.head == "children":
            return children_search(self.state, self.dec, self.children,
                                   self.dec.prompts(histories, self.codes, self.p_cap), len(histories),
                                   self.num_users, self.beam, k, self.timings, exclude)
        select = select_partial if self.selection == "partial" else select_full_sort
        if self.cache == "recompute":
            scorer = RecomputeScorer(self.dec, histories, self.codes, self.beam, self.p_cap, self.num_users,
                                     net=self.recompute_net)
        else:
            t0 = time.perf_counter()
            level0 = self.state.prefill(self.dec.prompts(histories, self.codes, self.p_cap))
            self.timings["prefill"] += time.perf_counter() - t0
            scorer = _EngineScorer(self.state, level0, len(histories), self.num_users, self.beam,
                                   self.dec.level_offsets)
        return beam_search(self.trie, scorer, len(histories), self.beam, k, select=select,
                           rebuild_masks=self.masks == "rebuild", timings=self.timings,
                           renormalize=self.dec.trie_softmax, exclude=exclude)

    def share_graphs(self, other: "DecodingEngine"):
        """Call `other`'s cells (same decoder, shapes and options): one compile for two engines' states."""
        if (other.beam, other.p_cap, other.num_users, other.cache) != (self.beam, self.p_cap, self.num_users,
                                                                      self.cache):
            raise ValueError("share_graphs: the engines differ in beam, prompt capacity, users or cache")
        if self.state is not None:
            self.state.share_graphs(other.state)
        else:
            self.recompute_net = other.recompute_net

    def cache_nbytes(self) -> dict:
        return self.state.nbytes() if self.state is not None else {}
