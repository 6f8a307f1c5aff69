"""The GR decoder's decoding state: the prompts' K/V kept once, each beam's decoded tokens in append-only
records forked by parent index (mindgr.models.generation's DecodeState for GRDecoder).

- Prefill encodes each user's prompt once (one jagged batch through the decoder's HSTU blocks with the
  fused attention) and keeps every block's prompt K/V in ONE cache [blocks, users, P_cap, H, d], never
  replicated per beam.
- Each step appends one token per beam to a record buffer [blocks, steps, users, beam, H, d] at slot
  (level - 1); the beams' parent indices stay on the host. Forking a beam copies nothing: a decoded token
  finds its ancestry by following parent indices (a gather at attention time, HSTUBlock.cached_step).
- The position-bias indices and masks are HSTU's (relative position within the user's row: the prompt
  at positions 0..n-1, decoded token t at n + t).

Fixed shapes: one prefill graph per (users, P_cap) and one step graph per (users, beam, P_cap); the level
enters as data (bias indices, masks, the record slot's one-hot), so every level reuses the same graph.
The prompts' jagged batch lays each user at a fixed stride P_cap with a filler row after it, so the jagged
layout is the padded cache layout and needs no gather. These two cells are also what `mindgr export`
writes as MindIR (mindgr.serve.export): their inputs are the export format.
"""
from __future__ import annotations


import numpy as np
from mindspore import Tensor, mutable, nn

from mindgr.models.generation import DecodeState
from mindgr.models.ntp import code_tokens


class PrefillCell(nn.Cell):
    """Prompt batch -> (level-0 logits [U, sum K], prompt K [blocks, U, P, H, dqk], prompt V [.., dv])."""

    def __init__(self, decoder, num_users: int, p_cap: int):
        super().__init__()
        self.dec, self.u, self.p = decoder, num_users, p_cap

    def construct(self, slots, merged, offsets, last):
        return self.dec.prefill(slots, merged, offsets, last, self.u, self.p)


class DecodeStepCell(nn.Cell):
    """One decoded token per (user, beam) -> (logits [U*Bm, sum K], updated record K, record V).

    parts: "both" (decoding), or "prompt" / "beam" (only that attention part: for the time split).
    head: "logits", or "hidden" (the normalised hidden vectors [U*Bm, D]: no code head in the graph)."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, steps: int, parts: str = "both",
                 head: str = "logits"):
        super().__init__()
        self.dec, self.u, self.b, self.p, self.s, self.parts = decoder, num_users, beam, p_cap, steps, parts
        self.head = head

    def construct(self, slots, kp, vp, pidx, pmask, kr, vr, onehot, anc, ridx, rmask):
        return self.dec.step(slots, kp, vp, pidx, pmask, kr, vr, onehot, anc, ridx, rmask, self.u, self.b,
                             self.s, self.parts, self.head)


class FastPrefillCell(nn.Cell):
    """The engine's prefill: (level-0 logits, then per block the prompt's K, V as HSTUBlock.prompt_blocks)."""

    def __init__(self, decoder, num_users: int, p_cap: int):
        super().__init__()
        self.dec, self.u, self.p = decoder, num_users, p_cap

    def construct(self, slots, merged, offsets, last):
        return self.dec.prefill_records(slots, merged, offsets, last, self.u, self.p)


class FastStepCell(nn.Cell):
    """The engine's step at one decoded level: the `used` earlier record slots in, one token per (user, beam)
    -> (hidden [U*Bm, D] (head "hidden") or logits, then this token's K, V per block)."""

    def __init__(self, decoder, num_users: int, beam: int, used: int, head: str = "hidden"):
        super().__init__()
        self.dec, self.u, self.b, self.used, self.head = decoder, num_users, beam, used, head

    def construct(self, slots, prompt, krs, vrs, anc, pidx, pmask, ridx):
        return self.dec.step_records(slots, prompt, krs, vrs, anc, pidx, pmask, ridx, self.u, self.b, self.used,
                                     self.head)


def code_head(dec):
    """(w_t [sum K, D], bias [sum K]) float32 host copies of a decoder's code head, read now (current weights):
    a decoding state's head_weights."""
    return (np.ascontiguousarray(dec.w_head.asnumpy().T, np.float32), np.asarray(dec.b_head.asnumpy(), np.float32))


def prompt_batch(dec, prompts, u: int, p: int):
    """The prefill's inputs: each user's prompt at stride p, a filler row after it -> (slots, merged, offsets,
    last token of each user, prompt lengths [U])."""
    slots = np.full((u * p, dec.group), dec.pad_id, np.int32)
    merged = np.zeros(u * p, np.float32)
    bounds = [0]
    lengths = np.zeros(u, np.int64)
    for i in range(u):
        ps, pm = prompts[i] if i < len(prompts) else prompts[0]        # spare capacity: any prompt
        n = ps.shape[0]
        slots[i * p:i * p + n], merged[i * p:i * p + n] = ps, pm
        lengths[i] = n
        bounds += [i * p + n, (i + 1) * p]                             # the user's row, then a filler row
    last = (np.arange(u) * p + lengths - 1).astype(np.int32)
    return slots, merged, np.asarray(bounds, np.int32), last, lengths


def run_prefill(state, graph, prompts):
    """A decoding state's prefill: the prompts laid out (the state keeps their lengths), then
    graph(slots, merged, offsets, last) timed on the state's runner -> its level-0 logits."""
    slots, merged, offsets, last, state.lengths = prompt_batch(state.dec, prompts, state.u, state.p)
    return state.timed("prefill", graph, slots, merged, offsets, last)


class KVCacheState(DecodeState):
    """Shared prompt K/V + append-only per-beam records with parent indices, for num_users x beam."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, parts: str = "both", runner=None,
                 graphs=None):
        """graphs: (prefill, step) callables with PrefillCell's and DecodeStepCell's inputs and outputs, run
        instead of cells built on the decoder (the exported MindIR graphs a server loads)."""
        super().__init__(decoder, num_users, beam, p_cap, runner)
        self.fast_prefill = self.fast_step = None
        if graphs is not None:
            self.prefill_net, self.step_net = graphs
        else:
            # each cell compiles on its first call: the stacked ones (prefill / step, also what `mindgr export`
            # writes) and the engine's own (prefill_records / step_hidden)
            self.prefill_net = PrefillCell(decoder, num_users, p_cap)
            self.step_net = DecodeStepCell(decoder, num_users, beam, p_cap, self.steps, parts)
            self.fast_prefill = FastPrefillCell(decoder, num_users, p_cap)
            self.fast_step = [FastStepCell(decoder, num_users, beam, t) for t in range(self.steps)]  # per level
            for net in [self.prefill_net, self.step_net, self.fast_prefill] + self.fast_step:
                net.set_train(False)
        self.kr = self.vr = None
        self.fast_active = False

    @property
    def gives_hidden(self) -> bool:
        """Whether prefill_records / step_hidden / head_weights are available (not with exported graphs)."""
        return self.fast_step is not None

    def share_graphs(self, other: "KVCacheState"):
        """Call `other`'s compiled cells (same decoder and shapes): one compile for two states."""
        self.prefill_net, self.step_net = other.prefill_net, other.step_net
        self.fast_prefill, self.fast_step = other.fast_prefill, other.fast_step

    def head_weights(self):
        return code_head(self.dec)

    def prefill(self, prompts):
        return run_prefill(self, self._prefill_graph, prompts)

    def _prefill_graph(self, slots, merged, offsets, last):
        """Every MindSpore call of a prefill (on the runner's thread): the graph, then empty records."""
        logits, self.kp, self.vp = self.prefill_net(Tensor(slots), Tensor(merged), Tensor(offsets), Tensor(last))
        self.fast_active = False
        if self.kr is None:      # empty records, made once: a step writes its slot (stale slots are masked)
            dec = self.dec
            shape = (dec.num_blocks, self.steps, self.u, self.b, dec.num_heads)
            self.kr = self._zero_kr = Tensor(np.zeros(shape + (dec.dqk,), np.float32))
            self.vr = self._zero_vr = Tensor(np.zeros(shape + (dec.dv,), np.float32))
        else:
            self.kr, self.vr = self._zero_kr, self._zero_vr
        return logits.asnumpy()

    def step(self, level, codes, parents):
        """Level `level` >= 1: append codes [U, Bm] (chosen at level-1) as record slot level-1."""
        return self._step(level, codes, parents, self.step_net)

    # ---- the engine's own graphs: prompt K/V and records one tensor per (block, slot), no code head ----------
    def prefill_records(self, prompts):
        """prefill through the engine's own graph (each block's prompt K/V apart) -> level-0 logits [U, sum K]."""
        return run_prefill(self, self._prefill_records_graph, prompts)

    def _prefill_records_graph(self, slots, merged, offsets, last):
        out = self.fast_prefill(Tensor(slots), Tensor(merged), Tensor(offsets), Tensor(last))
        self.prompt = tuple(out[1:])
        self.recs = []                       # recs[t]: slot t's (K, V) per block, block-major
        self.fast_active = True
        return out[0].asnumpy()

    def step_hidden(self, level, codes, parents):
        """Level `level` >= 1 after prefill_records, without the code head -> the final normalised hidden
        vectors [U, Bm, D]: the caller scores only the codes it needs with head_weights
        (mindgr.generate.children). This token's K/V become record slot level-1."""
        dec, u, b, n = self.dec, self.u, self.b, self.dec.max_len
        t = level - 1
        gids = (dec.level_offsets[t] + codes).reshape(-1)
        slots = np.ascontiguousarray(code_tokens(gids, dec.group, dec.pad_id)[0][:, :1])
        qpos = self.lengths + t
        j = np.arange(self.p)
        pidx = np.clip(n - 1 + j[None, :] - qpos[:, None], 0, 2 * n - 2).astype(np.int32)
        pmask = (j[None, :] < self.lengths[:, None]).astype(np.float32)
        used = max(t, 1)                     # (level 1 reads no slot: a placeholder input)
        ridx = np.clip(n - 1 + np.arange(used) - t, 0, 2 * n - 2).astype(np.int32)
        # the ancestor of each beam at each earlier slot: its parent at t-1, the parent's parent at t-2, ...
        anc = np.zeros((used, u, b), np.int64)
        cur = np.broadcast_to(np.arange(b), (u, b))
        for slot in range(t - 1, -1, -1):
            cur = np.take_along_axis(parents[slot + 1], cur, 1)
            anc[slot] = cur
        anc = (anc + (np.arange(u) * b)[None, :, None]).reshape(used, u * b).astype(np.int32)
        out = self.timed("step", self._step_records_graph, t, slots, anc, pidx, pmask, ridx)
        return out.reshape(u, b, -1)

    def _step_records_graph(self, t, slots, anc, pidx, pmask, ridx):
        nb = self.dec.num_blocks
        if t:
            krs = tuple(self.recs[s][2 * i] for i in range(nb) for s in range(t))
            vrs = tuple(self.recs[s][2 * i + 1] for i in range(nb) for s in range(t))
        else:                                # unused by the level-1 graph
            krs = vrs = (self.prompt[0],)
        # mutable: tuples of tensors are graph inputs, not constants (no compile per call)
        out = self.fast_step[t](Tensor(slots), mutable(self.prompt), mutable(krs), mutable(vrs), Tensor(anc),
                                Tensor(pidx), Tensor(pmask), Tensor(ridx))
        del self.recs[t:]
        self.recs.append(tuple(out[1:]))
        return out[0].asnumpy()

    def _step(self, level, codes, parents, net):
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
        logits = self.timed("step", self._step_graph, net, slots, pidx, pmask, onehot,
                            flat.reshape(-1).astype(np.int32), ridx, rmask)
        return logits.reshape(u, b, -1)

    def _step_graph(self, net, slots, pidx, pmask, onehot, anc, ridx, rmask):
        args = (Tensor(slots), self.kp, self.vp, Tensor(pidx), Tensor(pmask), self.kr, self.vr, Tensor(onehot),
                Tensor(anc), Tensor(ridx), Tensor(rmask))
        self.last_step_inputs = args            # kept for timing the attention parts (mindgr.bench.decode)
        logits, self.kr, self.vr = net(*args)
        return logits.asnumpy()

    def nbytes(self) -> dict:
        """Bytes the cache really holds: the shared prompt part and the per-beam records (of the last
        prefill's layout: the stacked one, or the engine's own, whose prompt K/V are block-diagonal over
        the heads and whose records are the slots written so far)."""
        if self.fast_active:
            return {"prompt": int(sum(t.nbytes for t in self.prompt)),
                    "beams": int(sum(t.nbytes for rec in self.recs for t in rec))}
        return {"prompt": int(self.kp.nbytes + self.vp.nbytes), "beams": int(self.kr.nbytes + self.vr.nbytes)}
