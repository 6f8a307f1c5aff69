"""The GR decoding engine: the fast path of trie-constrained beam search (mindgr.ids.beam), same lists.

Ideas (xGR, arXiv 2512.11529), as built here:
- Staged prefill / decode. `prefill` encodes each user's prompt once (one jagged batch, the decoder's
  HSTU blocks with the fused attention) and keeps every layer's prompt K/V in ONE shared cache
  [layers, users, P_cap, H, d]: never replicated per beam.
- Per-beam unshared cache. Each decode step appends one token per beam to an append-only record buffer
  [layers, steps, users, beam, H, d] at slot (step), with the beam's parent index kept on the host.
  Forking a beam copies nothing: a decode token finds its ancestry by following parent indices (a
  gather at attention time), not by copying its parent's cache.
- Split attention. HSTU's attention is pointwise SiLU with no softmax normaliser, so a decode token's
  attention is exactly (its part over the shared prompt, one [beam, d] x [d, P] product per user and
  head) + (its part over its own <= Lt-1 ancestry tokens). A softmax decoder would merge the two parts
  with an online-softmax merge instead; that is the state backend's job (see StateBackend).
- Early sorting termination: `select_partial` keeps per beam only its best candidates
  (argpartition, no sort), drops whole beams whose best candidate is below a threshold (a lower bound
  of the width-th best score, from the beams' maxima), and sorts only the `width` winners; never a full
  sort of beam x vocabulary.
- Valid-item masks from the trie (mindgr.ids.trie), built once per tokenizer and reused by every step
  and request (`masks="reuse"`).
The naive baseline stays selectable: `cache="recompute"` (every beam's whole sequence re-run each step,
mindgr.models.generative.RecomputeScorer), `selection="full_sort"`, `masks="rebuild"`.

Fixed shapes: one prefill graph per (users, P_cap) and one decode-step graph per (users, beam, P_cap);
the step number enters as data (bias indices and masks), so every step reuses the same graph.
Graph-mode notes: the record buffer is updated in-graph by a one-hot blend (a scatter into a graph
input is not an in-place update in graph mode), which costs O(buffer) per step, small next to the
prompt part; the prompt's jagged batch lays each user at a fixed stride P_cap with a filler row after
it, so the jagged layout is the padded cache layout and needs no gather.
"""
from __future__ import annotations

import abc
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgr.ids.beam import NEG_INF, beam_search, check_widths, select_full_sort
from mindgr.models.generative import LastTokenLogits, RecomputeScorer, level_log_softmax, prompts_of
from mindgr.models.layers import layer_norm
from mindgr.models.ntp import code_tokens

CACHES = ("shared", "recompute")
SELECTIONS = ("partial", "full_sort")
MASKS = ("reuse", "rebuild")


def _uvqk(block, x):
    """u, v, q, k of an HSTUBlock for inputs x [T, D] (its published projection, DESIGN.md §3)."""
    hv, hqk = block.h * block.dv, block.h * block.dqk
    z = ops.silu(ops.matmul(layer_norm(x), block.w_uvqk))
    return ops.split(z, [hv, hv, hqk, hqk], 1)


class PrefillCell(nn.Cell):
    """Prompt batch -> (level-0 logits [U, C], prompt K [layers, U, P, H, dqk], prompt V [.., dv])."""

    def __init__(self, decoder, num_users: int, p_cap: int):
        super().__init__()
        self.dec, self.u, self.p = decoder, num_users, p_cap

    def construct(self, slots, merged, offsets, last):
        dec = self.dec
        x = dec.embed(slots, merged)
        ts = ops.zeros((x.shape[0],), ms.int64)
        ks, vs = [], []
        for i in range(dec.num_blocks):
            blk = dec.blocks[i]
            _, v, _, k = _uvqk(blk, x)
            ks.append(k.reshape(self.u, self.p, blk.h, blk.dqk))
            vs.append(v.reshape(self.u, self.p, blk.h, blk.dv))
            x = blk(x, offsets, ts)
        logits = dec.logits(ops.gather(layer_norm(x), last, 0))
        return logits, ops.stack(ks), ops.stack(vs)


class DecodeStepCell(nn.Cell):
    """One decode token per (user, beam) -> (logits [U*Bm, C], updated record K, record V).

    parts: "both" (the engine), or "prompt" / "beam" (only that attention part: for the time split)."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, steps: int, parts: str = "both"):
        super().__init__()
        self.dec, self.u, self.b, self.p, self.s, self.parts = decoder, num_users, beam, p_cap, steps, parts
        self.inv_n = 1.0 / float(decoder.max_len)

    def construct(self, slots, kp, vp, pidx, pmask, kr, vr, onehot, anc, ridx, rmask):
        dec = self.dec
        u, b, s = self.u, self.b, self.s
        x = dec.embed(slots, ops.zeros((slots.shape[0],), ms.float32))
        oh = onehot.reshape(s, 1, 1, 1, 1)
        new_k, new_v = [], []
        for i in range(dec.num_blocks):
            blk = dec.blocks[i]
            h, dqk, dv = blk.h, blk.dqk, blk.dv
            uu, v, q, k = _uvqk(blk, x)
            q4 = q.reshape(u, b, h, dqk)
            attn = ops.zeros((u, b, h, dv), ms.float32)
            if self.parts != "beam":
                # prompt part: the shared cache, one [beam, dqk] x [dqk, P] product per (user, head)
                sp = ops.matmul(q4.transpose(0, 2, 1, 3), kp[i].transpose(0, 2, 3, 1))      # [U, H, Bm, P]
                wp = ops.silu(sp + ops.gather(blk.w_pos, pidx, 0)[:, None, None, :])
                wp = wp * (pmask * self.inv_n)[:, None, None, :]
                attn = attn + ops.matmul(wp, vp[i].transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
            # this step's record, then the ancestry part (ancestors found by parent indices)
            kr_i = kr[i] * (1.0 - oh) + oh * k.reshape(1, u, b, h, dqk)
            vr_i = vr[i] * (1.0 - oh) + oh * v.reshape(1, u, b, h, dv)
            new_k.append(kr_i)
            new_v.append(vr_i)
            if self.parts != "prompt":
                ka = ops.gather(kr_i.reshape(s * u * b, h, dqk), anc, 0).reshape(u, b, s, h, dqk)
                va = ops.gather(vr_i.reshape(s * u * b, h, dv), anc, 0).reshape(u, b, s, h, dv)
                sb = (q4.reshape(u, b, 1, h, dqk) * ka).sum(-1)                            # [U, Bm, S, H]
                wb = ops.silu(sb + ops.gather(blk.w_pos, ridx, 0)[None, None, :, None])
                wb = wb * (rmask * self.inv_n)[None, None, :, None]
                attn = attn + (wb[..., None] * va).sum(2)
            o = uu * layer_norm(attn.reshape(u * b, h * dv))
            x = x + ops.matmul(o, blk.w_out) + blk.b_out
        return dec.logits(layer_norm(x)), ops.stack(new_k), ops.stack(new_v)


class StateBackend(abc.ABC):
    """What the engine needs from a decoder's serving state: prefill the prompts once, then one step per
    level given each beam's parent. KVCacheBackend is today's; a recurrent state for linear-attention
    decoders would keep a per-beam state and fork it by parent index the same way."""

    @abc.abstractmethod
    def prefill(self, prompts) -> np.ndarray:           # -> level-0 logits [U, C]
        """Encode the prompts once."""

    @abc.abstractmethod
    def step(self, level: int, codes: np.ndarray, parents: list) -> np.ndarray:   # -> logits [U, Bm, C]
        """One decode step: each beam's new code, forked from its parent beam."""

    @abc.abstractmethod
    def nbytes(self) -> dict:
        """Bytes held, by part (shared prompt, per-beam records)."""


def _inline(fn, *args):
    """The default runner: a model call on the calling thread."""
    return fn(*args)


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


class KVCacheBackend(StateBackend):
    """Shared prompt K/V + append-only per-beam records with parent indices."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, parts: str = "both", runner=None):
        self.dec, self.u, self.b, self.p = decoder, num_users, beam, p_cap
        self.run = runner or _inline
        self.steps = max(decoder.num_levels - 1, 1)
        if p_cap + decoder.num_levels - 1 > decoder.max_len:
            raise ValueError(f"prompt capacity {p_cap} + {decoder.num_levels - 1} decoded tokens exceeds the "
                             f"decoder's max_len {decoder.max_len}")
        self.prefill_net = PrefillCell(decoder, num_users, p_cap)
        self.step_net = DecodeStepCell(decoder, num_users, beam, p_cap, self.steps, parts)
        for net in (self.prefill_net, self.step_net):
            net.set_train(False)
        self.timings = {"prefill": 0.0, "step": 0.0}

    def prefill(self, prompts):
        dec, u, p = self.dec, self.u, self.p
        slots = np.full((u * p, dec.group), dec.pad_id, np.int32)
        merged = np.zeros(u * p, np.float32)
        bounds = [0]
        self.lengths = np.zeros(u, np.int64)
        for i in range(u):
            ps, pm = prompts[i] if i < len(prompts) else prompts[0]    # spare capacity: any prompt
            n = ps.shape[0]
            slots[i * p:i * p + n], merged[i * p:i * p + n] = ps, pm
            self.lengths[i] = n
            bounds += [i * p + n, (i + 1) * p]                         # the user's row, then a filler row
        offsets = np.asarray(bounds, np.int32)
        last = (np.arange(u) * p + self.lengths - 1).astype(np.int32)
        t0 = time.perf_counter()
        logits = self.run(self._prefill_graph, slots, merged, offsets, last)
        self.timings["prefill"] += time.perf_counter() - t0
        return logits

    def _prefill_graph(self, slots, merged, offsets, last):
        """Every MindSpore call of a prefill (on the runner's thread): the graph, then empty records."""
        logits, self.kp, self.vp = self.prefill_net(Tensor(slots), Tensor(merged), Tensor(offsets), Tensor(last))
        h = self.dec.blocks[0]
        shape = (self.dec.num_blocks, self.steps, self.u, self.b, h.h)
        self.kr = Tensor(np.zeros(shape + (h.dqk,), np.float32))
        self.vr = Tensor(np.zeros(shape + (h.dv,), np.float32))
        return logits.asnumpy()

    def step(self, level, codes, parents):
        """Level `level` >= 1: append codes [U, Bm] (chosen at level-1) as record slot level-1."""
        dec, u, b, n = self.dec, self.u, self.b, self.dec.max_len
        t = level - 1                                                  # the record slot written now
        gids = (dec.level_offsets[t] + codes).reshape(-1)
        slots, _ = code_tokens(gids, dec.group, dec.pad_id)
        qpos = self.lengths + t                                        # [U] query position in the row
        j = np.arange(self.p)
        pidx = np.clip(n - 1 + j[None, :] - qpos[:, None], 0, 2 * n - 2).astype(np.int32)
        pmask = (j[None, :] < self.lengths[:, None]).astype(np.float32)
        r = np.arange(self.steps)
        ridx = np.clip(n - 1 + r - t, 0, 2 * n - 2).astype(np.int32)
        rmask = (r <= t).astype(np.float32)
        onehot = (r == t).astype(np.float32)
        # ancestry: record slot t is the beam itself, slot t-1 its parent, t-2 the parent's parent, ...
        anc = np.zeros((u, b, self.steps), np.int64)
        cur = np.broadcast_to(np.arange(b), (u, b)).copy()
        for slot in range(t, -1, -1):
            anc[:, :, slot] = cur
            if slot > 0:
                cur = np.take_along_axis(parents[slot], cur, 1)
        flat = (r[None, None, :] * u + np.arange(u)[:, None, None]) * b + anc
        t0 = time.perf_counter()
        logits = self.run(self._step_graph, slots, pidx, pmask, onehot, flat.reshape(-1).astype(np.int32), ridx,
                          rmask)
        self.timings["step"] += time.perf_counter() - t0
        return logits.reshape(u, b, -1)

    def _step_graph(self, slots, pidx, pmask, onehot, anc, ridx, rmask):
        args = (Tensor(slots), self.kp, self.vp, Tensor(pidx), Tensor(pmask), self.kr, self.vr, Tensor(onehot),
                Tensor(anc), Tensor(ridx), Tensor(rmask))
        self.last_step_inputs = args            # kept for timing the attention parts (mindgr.bench.decode)
        logits, self.kr, self.vr = self.step_net(*args)
        return logits.asnumpy()

    def nbytes(self) -> dict:
        """Bytes the cache really holds: the shared prompt part and the per-beam records."""
        return {"prompt": int(self.kp.nbytes + self.vp.nbytes), "beams": int(self.kr.nbytes + self.vr.nbytes)}


class _EngineScorer:
    """beam_search's scorer on top of a state backend: level 0 from the prefill, then one step a level."""

    def __init__(self, backend, level0_logits, num_users, beam, level_offsets):
        self.backend, self.level_offsets = backend, level_offsets
        self.level0, self.num_users, self.beam = level0_logits, num_users, beam
        self.parents = []           # parents[t]: [U, Bm] parent (among level t-1's beams) of level t's beams

    def step(self, level, prefixes):
        u = self.num_users
        if level == 0:
            logp = level_log_softmax(self.level0[:u], self.level_offsets, 0)
            return np.broadcast_to(logp[:, None, :], (u, self.beam, logp.shape[-1]))
        codes = np.zeros((self.backend.u, self.beam), np.int64)
        codes[:u] = prefixes[:, :, level - 1]
        spare = np.zeros((self.backend.u - u, self.beam), np.int64)
        parents = [np.concatenate([p, spare]) for p in self.parents]
        logits = self.backend.step(level, codes, parents)[:u]
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
    """Beam search for a batch of users with a GR decoder and its trie, engine or naive baseline.

    search(histories, k) -> (items [U, k], scores [U, k]); `num_users` is the fixed batch capacity."""

    def __init__(self, decoder, trie, codes, beam: int, max_prompt_tokens: int, num_users: int,
                 cache: str = "shared", selection: str = "partial", masks: str = "reuse", parts: str = "both",
                 runner=None):
        """runner(fn, *args) -> fn(*args): where the model calls run (default: the calling thread; the server
        passes one model thread so that host-side selection of one batch overlaps model compute of another)."""
        for name, value, allowed in (("cache", cache, CACHES), ("selection", selection, SELECTIONS),
                                     ("masks", masks, MASKS)):
            if value not in allowed:
                raise ValueError(f"decode {name} = {value!r}: expected one of {', '.join(allowed)}")
        self.dec, self.trie, self.codes = decoder, trie, np.asarray(codes)
        self.beam, self.p_cap, self.num_users = beam, max_prompt_tokens, num_users
        self.cache, self.selection, self.masks = cache, selection, masks
        self.backend = (KVCacheBackend(decoder, num_users, beam, max_prompt_tokens, parts, runner)
                        if cache == "shared" else None)
        if cache == "recompute":
            self.recompute_net = LastTokenLogits(decoder)
            self.recompute_net.set_train(False)
            if runner is not None:
                self.recompute_net = _RunnerNet(self.recompute_net, runner)
        self.timings = {"prefill": 0.0, "model": 0.0, "masks": 0.0, "select": 0.0}

    def search(self, histories, k: int):
        check_widths(self.trie, self.beam, k)
        if len(histories) > self.num_users:
            raise ValueError(f"{len(histories)} users exceed the engine's batch capacity {self.num_users}")
        select = select_partial if self.selection == "partial" else select_full_sort
        if self.cache == "recompute":
            scorer = RecomputeScorer(self.dec, histories, self.codes, self.beam, self.p_cap, self.num_users,
                                     net=self.recompute_net)
        else:
            t0 = time.perf_counter()
            prompts = prompts_of(self.dec, histories, self.codes, self.p_cap)
            level0 = self.backend.prefill(prompts)
            self.timings["prefill"] += time.perf_counter() - t0
            scorer = _EngineScorer(self.backend, level0, len(histories), self.beam, self.dec.level_offsets)
        return beam_search(self.trie, scorer, len(histories), self.beam, k, select=select,
                           rebuild_masks=self.masks == "rebuild", timings=self.timings,
                           renormalize=self.dec.trie_softmax)

    def share_graphs(self, other: "DecodingEngine"):
        """Call `other`'s cells (same decoder, shapes and options): one compile for two engines' states."""
        if (other.beam, other.p_cap, other.num_users, other.cache) != (self.beam, self.p_cap, self.num_users,
                                                                      self.cache):
            raise ValueError("share_graphs: the engines differ in beam, prompt capacity, users or cache")
        if self.backend is not None:
            self.backend.prefill_net, self.backend.step_net = other.backend.prefill_net, other.backend.step_net
        else:
            self.recompute_net = other.recompute_net

    def cache_nbytes(self) -> dict:
        return self.backend.nbytes() if self.backend is not None else {}
