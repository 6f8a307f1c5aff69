"""Decoding states of the linear-attention GR decoder (mindgr.models.generation's DecodeState): OneLA and
its two baselines.

A linear-attention block keeps, per head, a state S_t = gamma S_{t-1} + k_t v_t^T and reads o_t = q_t^T S_t
(mindgr.models.linear_attention; gamma the head's fixed decay). After a prompt of state S_p, the n-th
decoded token of a beam (n = 1..Lt-1) reads

    o_n = gamma^n (q_n^T S_p) + sum_{j=1..n} gamma^(n-j) (q_n . k_j) v_j      (j over the beam's ancestry)

Three layouts of that state, same lists (tests/system/models/test_onela.py):
- "onela" (the default, alias "shared"): per user and block ONE prompt state S_p [U, H, dqk, dv]; each beam
  holds only the (k, v) records of its own decoded tokens, append-only slots [S, U, Bm, H, d] as the HSTU
  state's records (mindgr.models.kv_cache), found through an ancestry index built from parent indices on
  the host (`ancestry_index`). The prompt part is one batched GEMM per user and block over all its beams
  ([U, H, Bm, dqk] x [U, H, dqk, dv]): the prompt state is reused by every beam, and a beam reorder moves
  indices, never states.
- "per_beam_state" (alias "per_beam"): the usual recurrent serving layout, every beam carries its own full
  state [U*Bm, H, dqk, dv] per block, gathered by parent (a copy) and updated S = gamma S + k v^T each step.
- "replay": OneLA's records, but every step each beam rebuilds its state gamma^n S_p + sum_j gamma^(n-j)
  k_j v_j^T (materialised per beam), then o = q^T S.
The level enters as data (the decay powers and the record slot's one-hot), so one step graph per shape
serves every level; one prefill graph per (users, P_cap), the HSTU state's prompt layout (prompt_batch).
Each layout's step cell also comes without the code head (head="hidden": the final normalised hidden
vectors), what the engine's children scoring runs (mindgr.generate.children; `gives_hidden`).

OneLA's cells also come stacked (`stacked=True`: the prompt states one tensor [blocks, U, H, dqk, dv], the
records [blocks, S, U, Bm, H, d], the same arithmetic block by block): plain tensor inputs and outputs,
what `mindgr export` writes as MindIR (mindgr.serve.export) and what RecordState runs from an export
(`graphs=`).
"""
from __future__ import annotations


import numpy as np
import mindspore as ms
from mindspore import Tensor, mutable, nn, ops

from mindgr.models.generation import DecodeState
from mindgr.models.kv_cache import code_head, run_prefill
from mindgr.models.layers import layer_norm
from mindgr.models.ntp import code_tokens

LAYOUTS = ("onela", "per_beam_state", "replay")
ALIASES = {"shared": "onela", "per_beam": "per_beam_state"}     # the engine's generic cache names


def ancestry_index(parents, level: int, num_users: int, beam: int, steps: int) -> np.ndarray:
    """Flat record rows [U, Bm, S] of each level-`level` beam's ancestry in records laid out [S, U, Bm]:
    slot level-1 is the beam itself, slot level-2 its parent, ... (parents[t] [U, Bm]: the level-(t-1) beam
    each level-t beam forked from). Slots after level-1 point at the beam's own row (their weight is 0)."""
    t = level - 1
    anc = np.broadcast_to(np.arange(beam)[:, None], (num_users, beam, steps)).copy()
    cur = np.broadcast_to(np.arange(beam), (num_users, beam)).copy()
    for slot in range(t, -1, -1):
        anc[:, :, slot] = cur
        if slot > 0:
            cur = np.take_along_axis(np.asarray(parents[slot]), cur, 1)
    s = np.arange(steps)
    return (s[None, None, :] * num_users + np.arange(num_users)[:, None, None]) * beam + anc


def decay_weights(decays: np.ndarray, level: int, steps: int):
    """decays [blocks, H] -> (prompt weight gamma^level [blocks, H], record weights [blocks, S, H]:
    gamma^(level-1-j) for record slots j < level, 0 after)."""
    g = np.asarray(decays, np.float64)
    t = level - 1
    j = np.arange(steps)
    power = np.where(j <= t, t - j, 0)
    rec = g[:, None, :] ** power[None, :, None] * (j <= t)[None, :, None]
    return (g ** level).astype(np.float32), rec.astype(np.float32)


def decays_of(decoder) -> np.ndarray:
    """The decoder's per-head decays [blocks, H] float32: its blocks', or those an export recorded."""
    if getattr(decoder, "decays", None) is not None:
        return np.asarray(decoder.decays, np.float32)
    return np.stack([np.asarray(blk.decay, np.float32) for blk in decoder.blocks])


class LinearPrefillCell(nn.Cell):
    """Prompt batch -> (level-0 logits [U, sum K], the prompt states, one [U, H, dqk, dv] per block; stacked:
    one tensor [blocks, U, H, dqk, dv])."""

    def __init__(self, decoder, num_users: int, p_cap: int, stacked: bool = False):
        super().__init__()
        self.dec, self.u, self.p, self.stacked = decoder, num_users, p_cap, stacked

    def construct(self, slots, merged, offsets, last):
        dec = self.dec
        x = dec.embed(slots, merged)
        states = ()
        for i in range(dec.num_blocks - 1):
            x, s = dec.blocks[i].prompt_forward(x, offsets, self.u, self.p)
            states = states + (s,)
        # the last block: every token's state, but outputs at the prompts' last tokens only
        x_last, s = dec.blocks[dec.num_blocks - 1].prompt_last(x, offsets, self.u, self.p, last)
        logits = dec.logits(layer_norm(x_last))
        states = states + (s,)
        if self.stacked:
            return logits, ops.stack(states)
        return logits, states


class ExpandStateCell(nn.Cell):
    """The prompt states -> one copy per beam [U*Bm, H, dqk, dv] per block (the per-beam layout's start)."""

    def __init__(self, beam: int):
        super().__init__()
        self.b = beam

    def construct(self, states):
        out = ()
        for s in states:
            u, h, dqk, dv = s.shape
            copies = ops.broadcast_to(ops.expand_dims(s, 1), (u, self.b, h, dqk, dv))
            out = out + (copies.reshape(u * self.b, h, dqk, dv),)
        return out


def _write(records, onehot, new):
    """Records [S, U, Bm, H, d] with `new` [U, Bm, H, d] written at the slot where onehot [S] is 1 (a new
    tensor: a scatter into a graph input is not an in-place update in graph mode; one scatter copies it,
    where a blend with the one-hot costs three passes)."""
    slot = ops.argmax(onehot).reshape(1, 1).astype(ms.int32)
    return ops.tensor_scatter_update(records, slot, ops.expand_dims(new, 0))


def _head(dec, x, head: str):
    """The step's output from the last block's x: the code logits (head "logits") or the final normalised
    hidden vectors (head "hidden": the engine applies the head to the allowed codes only)."""
    hidden = layer_norm(x)
    if head == "hidden":
        return hidden
    return dec.logits(hidden)


class RecordStepCell(nn.Cell):
    """One decoded token per (user, beam) over the prompt states and the ancestry records -> (logits
    [U*Bm, sum K], record K, record V per block). replay=False: OneLA (the prompt part as one GEMM per user
    over its beams, the ancestry part as weighted dot products); replay=True: each beam's state rebuilt.
    stacked: sp, kr, vr (in and out) one tensor each, blocks first, instead of a tuple per block.
    head: "logits", or "hidden" (the normalised hidden vectors [U*Bm, D] instead: no code head in the graph)."""

    def __init__(self, decoder, num_users: int, beam: int, steps: int, replay: bool, stacked: bool = False,
                 head: str = "logits"):
        super().__init__()
        self.dec, self.u, self.b, self.s, self.replay = decoder, num_users, beam, steps, replay
        self.stacked, self.head = stacked, head

    def construct(self, slots, sp, kr, vr, onehot, anc, pw, rw):
        dec, u, b, s = self.dec, self.u, self.b, self.s
        n = u * b
        x = dec.embed_code(slots)
        new_k, new_v = (), ()
        for i in range(dec.num_blocks):
            blk = dec.blocks[i]
            h, dqk, dv = blk.h, blk.dqk, blk.dv
            uu, q, k, v = blk.project(x)
            kri = _write(kr[i], onehot, k.reshape(u, b, h, dqk))
            vri = _write(vr[i], onehot, v.reshape(u, b, h, dv))
            ka = ops.gather(kri.reshape(s * n, h, dqk), anc, 0).reshape(n, s, h, dqk)       # the ancestry's
            va = ops.gather(vri.reshape(s * n, h, dv), anc, 0).reshape(n, s, h, dv)
            if self.replay:
                # every beam's own state: gamma^n S_p + sum_j gamma^(n-j) k_j v_j^T, [U, Bm, H, dqk, dv]
                ka = (ka * rw[i].reshape(1, s, h, 1)).reshape(u, b, s, h, dqk)              # 0 past n
                st = ops.expand_dims(sp[i], 1) * pw[i].reshape(1, 1, h, 1, 1)
                va = va.reshape(u, b, s, h, dv)
                st = st + ops.matmul(ka.transpose(0, 1, 3, 4, 2), va.transpose(0, 1, 3, 2, 4))
                o = ops.matmul(q.reshape(u, b, h, 1, dqk), st).reshape(n, h * dv)
            else:
                # the prompt part: one [Bm, dqk] x [dqk, dv] GEMM per (user, head), S_p shared by the beams
                op = ops.matmul(q.reshape(u, b, h, dqk).transpose(0, 2, 1, 3), sp[i]) * pw[i].reshape(1, h, 1, 1)
                # the ancestry part: [1, dqk] x [dqk, S] then [1, S] x [S, dv] per (beam, head), decayed
                # gamma^(n-j) and 0 past n
                w = ops.matmul(q.reshape(n, h, 1, dqk), ka.transpose(0, 2, 3, 1))
                w = w * rw[i].transpose(1, 0).reshape(1, h, 1, s)
                oa = ops.matmul(w, va.transpose(0, 2, 1, 3)).reshape(u, b, h, dv)
                o = (op.transpose(0, 2, 1, 3) + oa).reshape(n, h * dv)
            x = blk.finish(x, uu, o)
            new_k = new_k + (kri,)
            new_v = new_v + (vri,)
        if self.stacked:
            return _head(dec, x, self.head), ops.stack(new_k), ops.stack(new_v)
        return _head(dec, x, self.head), new_k, new_v


class PerBeamStateStepCell(nn.Cell):
    """One decoded token per beam over full per-beam states -> (logits [U*Bm, sum K], the states gathered by
    parent and updated S = gamma S + k v^T, one [U*Bm, H, dqk, dv] per block). head: as RecordStepCell's."""

    def __init__(self, decoder, head: str = "logits"):
        super().__init__()
        self.dec, self.head = decoder, head
        self.gammas = Tensor(np.stack([np.asarray(blk.decay, np.float32) for blk in decoder.blocks]))  # [blocks, H]

    def construct(self, slots, states, parent):
        dec = self.dec
        x = dec.embed_code(slots)
        n = slots.shape[0]
        out = ()
        for i in range(dec.num_blocks):
            blk = dec.blocks[i]
            uu, q, k, v = blk.project(x)
            # the reorder (a copy of every beam's state) and the update S = gamma S + k v^T
            st = ops.gather(states[i], parent, 0) * self.gammas[i].reshape(1, blk.h, 1, 1)
            st = st + k.reshape(n, blk.h, blk.dqk, 1) * v.reshape(n, blk.h, 1, blk.dv)
            o = ops.matmul(q.reshape(n, blk.h, 1, blk.dqk), st).reshape(n, blk.h * blk.dv)
            x = blk.finish(x, uu, o)
            out = out + (st,)
        return _head(dec, x, self.head), out


class _LinearState(DecodeState):
    """What the three layouts share: the prefill graph and its prompt layout, the step's code tokens, and the
    engine's fast scoring (mindgr.generate.children): a step cell without the code head (`hidden_net`,
    built when the state runs cells on the decoder, not loaded graphs)."""

    hidden_net = None

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, runner=None, stacked: bool = False,
                 prefill=None):
        """prefill: a callable with LinearPrefillCell's inputs and outputs (stacked or not) run instead of a
        cell built on the decoder (an exported graph)."""
        super().__init__(decoder, num_users, beam, p_cap, runner, bounded_positions=False)
        self.decays = decays_of(decoder)                                    # [blocks, H]
        self.prefill_net = prefill
        if prefill is None:
            self.prefill_net = LinearPrefillCell(decoder, num_users, p_cap, stacked)
            self.prefill_net.set_train(False)

    @property
    def gives_hidden(self) -> bool:
        """Whether prefill_records / step_hidden / head_weights are available (not with exported graphs)."""
        return self.hidden_net is not None

    def head_weights(self):
        return code_head(self.dec)

    def prefill(self, prompts):
        return run_prefill(self, self._prefill_graph, prompts)

    def prefill_records(self, prompts):
        """The prefill itself: its level-0 logits are what the engine scores level 0 from."""
        return self.prefill(prompts)

    def step_hidden(self, level, codes, parents):
        """As step, the step cell without the code head -> the final normalised hidden vectors [U, Bm, D]."""
        return self._step(level, codes, parents, self.hidden_net)

    def step(self, level, codes, parents):
        return self._step(level, codes, parents, self.step_net)

    def _prefill_graph(self, slots, merged, offsets, last):
        logits, states = self.prefill_net(Tensor(slots), Tensor(merged), Tensor(offsets), Tensor(last))
        self._keep(states)
        return logits.asnumpy()

    def _tokens(self, level, codes):
        gids = (self.dec.level_offsets[level - 1] + codes).reshape(-1)
        return code_tokens(gids, self.dec.group, self.dec.pad_id)[0]

    def state_bytes_per_block_beam(self) -> int:
        """Bytes of one head-set's full recurrent state: H * dqk * dv * 4 (one beam, one block)."""
        return self.dec.num_heads * self.dec.dqk * self.dec.dv * 4


class RecordState(_LinearState):
    """OneLA (replay=False) or the replay baseline (replay=True): prompt states kept once per user, each
    beam's decoded tokens in append-only records found by ancestry index. stacked: the cells' stacked form
    (the export's); graphs: (prefill, step) callables with the stacked cells' inputs and outputs, run
    instead of cells built on the decoder (the exported MindIR graphs a server loads)."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, runner=None, replay: bool = False,
                 stacked: bool = False, graphs=None):
        stacked = stacked or graphs is not None
        super().__init__(decoder, num_users, beam, p_cap, runner, stacked, graphs[0] if graphs else None)
        self.replay, self.stacked = replay, stacked
        if graphs is not None:
            self.step_net = graphs[1]
        else:
            self.step_net = RecordStepCell(decoder, num_users, beam, self.steps, replay, stacked)
            self.hidden_net = RecordStepCell(decoder, num_users, beam, self.steps, replay, stacked, head="hidden")
            for net in (self.step_net, self.hidden_net):    # each compiles on its first call
                net.set_train(False)

    def share_graphs(self, other: "RecordState"):
        self.prefill_net, self.step_net, self.hidden_net = other.prefill_net, other.step_net, other.hidden_net

    def _keep(self, states):
        self.sp = states
        dec = self.dec
        shape = (self.steps, self.u, self.b, dec.num_heads)
        if self.stacked:
            self.kr = Tensor(np.zeros((dec.num_blocks,) + shape + (dec.dqk,), np.float32))
            self.vr = Tensor(np.zeros((dec.num_blocks,) + shape + (dec.dv,), np.float32))
        else:
            self.kr = tuple(Tensor(np.zeros(shape + (dec.dqk,), np.float32)) for _ in range(dec.num_blocks))
            self.vr = tuple(Tensor(np.zeros(shape + (dec.dv,), np.float32)) for _ in range(dec.num_blocks))

    def _step(self, level, codes, parents, net):
        """Level `level` >= 1: append codes [U, Bm] (chosen at level-1) as record slot level-1."""
        slots = self._tokens(level, codes)
        anc = ancestry_index(parents, level, self.u, self.b, self.steps).reshape(-1).astype(np.int32)
        onehot = (np.arange(self.steps) == level - 1).astype(np.float32)
        pw, rw = decay_weights(self.decays, level, self.steps)
        out = self.timed("step", self._step_graph, net, slots, onehot, anc, pw, rw)
        return out.reshape(self.u, self.b, -1)

    def _step_graph(self, net, slots, onehot, anc, pw, rw):
        if self.stacked:
            args = (Tensor(slots), self.sp, self.kr, self.vr, Tensor(onehot), Tensor(anc), Tensor(pw), Tensor(rw))
            self.last_step_inputs = args        # the inputs of the exported step graph (mindgr.serve.export)
        else:
            # tuples of tensors enter as mutable: a plain tuple input is a graph constant (a compile per call)
            args = (Tensor(slots), mutable(self.sp), mutable(self.kr), mutable(self.vr), Tensor(onehot),
                    Tensor(anc), Tensor(pw), Tensor(rw))
        out, self.kr, self.vr = net(*args)
        return out.asnumpy()

    def nbytes(self) -> dict:
        """Held bytes: the prompt states (one per user and block) and the per-beam records; replay also
        materialises every beam's state for one block at a time during a step ("rebuilt", transient)."""
        parts = lambda x: (x,) if isinstance(x, Tensor) else x      # noqa: E731 (stacked: one tensor)
        out = {"prompt": int(sum(s.nbytes for s in parts(self.sp))),
               "beams": int(sum(k.nbytes for k in parts(self.kr)) + sum(v.nbytes for v in parts(self.vr)))}
        if self.replay:
            out["rebuilt"] = self.u * self.b * self.state_bytes_per_block_beam()
        return out


class PerBeamState(_LinearState):
    """The per-beam recurrent state baseline: a full state per beam, gathered by parent every step."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, runner=None):
        super().__init__(decoder, num_users, beam, p_cap, runner)
        self.expand_net = ExpandStateCell(beam)
        self.step_net = PerBeamStateStepCell(decoder)
        self.hidden_net = PerBeamStateStepCell(decoder, head="hidden")
        for net in (self.expand_net, self.step_net, self.hidden_net):
            net.set_train(False)

    def share_graphs(self, other: "PerBeamState"):
        self.prefill_net, self.expand_net = other.prefill_net, other.expand_net
        self.step_net, self.hidden_net = other.step_net, other.hidden_net

    def _keep(self, states):
        self.states = self.expand_net(mutable(states))

    def _step(self, level, codes, parents, net):
        """Level `level` >= 1: gather the states by parents[level-1] (level 1: every beam holds the prompt's
        copy), then absorb codes [U, Bm]."""
        slots = self._tokens(level, codes)
        t = level - 1
        parent = np.arange(self.u)[:, None] * self.b + (parents[t] if t > 0 else np.arange(self.b)[None, :])
        out = self.timed("step", self._step_graph, net, slots, parent.reshape(-1).astype(np.int32))
        return out.reshape(self.u, self.b, -1)

    def _step_graph(self, net, slots, parent):
        out, self.states = net(Tensor(slots), mutable(self.states), Tensor(parent))
        return out.asnumpy()

    def nbytes(self) -> dict:
        return {"prompt": 0, "beams": int(sum(s.nbytes for s in self.states))}


def linear_decode_state(decoder, num_users: int, beam: int, p_cap: int, runner=None, layout: str = "onela",
                        stacked: bool = False):
    """The decoding state of a linear-backbone GR decoder for `layout` (LAYOUTS, or the engine's generic
    names "shared" / "per_beam"); a one-line error for another. stacked: OneLA's exported form."""
    name = ALIASES.get(layout, layout)
    if name == "onela":
        return RecordState(decoder, num_users, beam, p_cap, runner, stacked=stacked)
    if name == "replay":
        return RecordState(decoder, num_users, beam, p_cap, runner, replay=True)
    if name == "per_beam_state":
        return PerBeamState(decoder, num_users, beam, p_cap, runner)
    raise ValueError(f"decode layout {layout!r}: the linear backbone has {', '.join(LAYOUTS)} "
                     f"(or {', '.join(ALIASES)})")
