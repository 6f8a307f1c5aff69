"""The GR decoder's per-beam K/V cache: the standard cached beam search that common generate() implementations
run, kept as the decoding engine's baseline (mindgr.generate.engine, cache="per_beam").

- Prefill is the shared state's (mindgr.models.kv_cache): one graph encodes each user's prompt once; its K/V
  are then expanded per beam into one dense cache per block, [users x beam, H, P_cap + steps, d]: every beam
  holds its own copy of the prompt.
- Each step gathers every beam's whole cache row from its parent's row (the reorder a forked beam costs in
  this layout), writes the new token's K/V at position P_cap + (level - 1), and attends over the dense row
  (HSTUBlock.per_beam_step).
Same position biases and masks as the shared state, so the same lists; it only does the copying work the
shared state avoids. Fixed shapes: one expand graph per (users, beam, P_cap), one step graph likewise.
"""
from __future__ import annotations


import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from mindgr.models.generation import DecodeState
from mindgr.models.kv_cache import PrefillCell, run_prefill
from mindgr.models.layers import layer_norm
from mindgr.models.ntp import code_tokens


class ExpandCell(nn.Cell):
    """Prompt K/V [blocks, U, P, H, d] -> the per-beam cache [blocks, U*Bm, H, P + S, d] (S empty slots)."""

    def __init__(self, beam: int, steps: int):
        super().__init__()
        self.b, self.s = beam, steps

    def construct(self, kp):
        nb, u, p, h, d = kp.shape
        k = ops.broadcast_to(ops.expand_dims(kp.transpose(0, 1, 3, 2, 4), 2), (nb, u, self.b, h, p, d))
        k = k.reshape(nb, u * self.b, h, p, d)
        return ops.concat([k, ops.zeros((nb, u * self.b, h, self.s, d), ms.float32)], 3)


class PerBeamStepCell(nn.Cell):
    """One decoded token per beam -> (logits [U*Bm, sum K], reordered and appended caches K, V)."""

    def __init__(self, decoder):
        super().__init__()
        self.dec = decoder

    def construct(self, slots, kc, vc, parent, slot, idx, mask):
        dec = self.dec
        x = dec.embed_code(slots)
        new_k, new_v = [], []
        for i in range(dec.num_blocks):
            x, k, v = dec.blocks[i].per_beam_step(x, kc[i], vc[i], parent, slot, idx, mask)
            new_k.append(k)
            new_v.append(v)
        return dec.logits(layer_norm(x)), ops.stack(new_k), ops.stack(new_v)


class PerBeamKVState(DecodeState):
    """A dense K/V cache per beam (prompt copied per beam), reordered by parent index every step."""

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, runner=None):
        super().__init__(decoder, num_users, beam, p_cap, runner)
        self.prefill_net = PrefillCell(decoder, num_users, p_cap)
        self.expand_net = ExpandCell(beam, self.steps)
        self.step_net = PerBeamStepCell(decoder)
        for net in (self.prefill_net, self.expand_net, self.step_net):
            net.set_train(False)

    def share_graphs(self, other: "PerBeamKVState"):
        self.prefill_net, self.expand_net, self.step_net = other.prefill_net, other.expand_net, other.step_net

    def prefill(self, prompts):
        return run_prefill(self, self._prefill_graph, prompts)

    def _prefill_graph(self, slots, merged, offsets, last):
        logits, kp, vp = self.prefill_net(Tensor(slots), Tensor(merged), Tensor(offsets), Tensor(last))
        self.kc, self.vc = self.expand_net(kp), self.expand_net(vp)
        return logits.asnumpy()

    def step(self, level, codes, parents):
        """Level `level` >= 1: reorder the caches by parents[level-1] (level 1: every beam's row is still the
        prompt's copy), then append codes [U, Bm] at position P_cap + level - 1."""
        dec, u, b, n, p = self.dec, self.u, self.b, self.dec.max_len, self.p
        t = level - 1
        gids = (dec.level_offsets[t] + codes).reshape(-1)
        slots, _ = code_tokens(gids, dec.group, dec.pad_id)
        rows = np.arange(u)[:, None] * b
        parent = rows + (parents[t] if t > 0 else np.arange(b)[None, :])
        qpos = self.lengths + t                                        # [U] query position in the user's row
        j = np.arange(self.p)
        r = np.arange(self.steps)
        pidx = n - 1 + j[None, :] - qpos[:, None]                      # prompt keys at positions 0..n-1
        ridx = np.broadcast_to(n - 1 + r - t, (u, self.steps))         # decoded token r at n + r
        idx = np.clip(np.concatenate([pidx, ridx], 1), 0, 2 * n - 2)
        mask = np.concatenate([j[None, :] < self.lengths[:, None], np.broadcast_to(r <= t, (u, self.steps))], 1)
        slot = np.zeros(p + self.steps, np.float32)
        slot[p + t] = 1.0
        per_beam = lambda a: np.repeat(a, b, axis=0)                   # noqa: E731  [U, L] -> [U*Bm, L]
        logits = self.timed("step", self._step_graph, slots, parent.reshape(-1).astype(np.int32), slot,
                            per_beam(idx).astype(np.int32), per_beam(mask).astype(np.float32))
        return logits.reshape(u, b, -1)

    def _step_graph(self, slots, parent, slot, idx, mask):
        logits, self.kc, self.vc = self.step_net(Tensor(slots), self.kc, self.vc, Tensor(parent), Tensor(slot),
                                                 Tensor(idx), Tensor(mask))
        return logits.asnumpy()

    def nbytes(self) -> dict:
        """Bytes the cache holds: every beam's copy of the prompt and its decoded tokens."""
        return {"prompt": 0, "beams": int(self.kc.nbytes + self.vc.nbytes)}
