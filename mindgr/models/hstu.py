"""HSTU (Zhai et al., ICML 2024) exactly as published, on jagged sequences.

Per block, for tokens x [T, D]:
    u, v, q, k = split(SiLU(LayerNorm(x) @ W_uvqk))                      (no bias)
    A(x) v     = per row: sum_{j<=i} SiLU(q_i.k_j + rab_pos(i,j) + rab_time(i,j)) / N * v_j
    y          = x + Linear(Dropout(u * LayerNorm(A(x) v)))
Input: item_emb * sqrt(D) + pos_emb, dropout; output L2-normalised. N is the configured max length.
rab_time(i, j) = w_ts[bucket(tq_i - t_j)] with tq_i = t_{i+1}; at each row's last position tq is the row's
request time when request_time=True (config model.request_time, the published convention: the time of
the event being predicted), else that position's own time (MindGR's earlier convention; mindgr.ops.attention).
"""
import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindgr.models import layers
from mindgr.models.layers import ItemSequenceEncoder, apply_dropout, l2_normalize, param, trunc_normal, xavier_uniform
from mindgr.ops.backend import note_uses
from mindgr.ops.attention import jagged_hstu_attention
from mindgr.ops.linear import linear
from mindgr.ops.norm import gated_layer_norm, layer_norm, silu_split


class HSTUBlock(nn.Cell):
    def __init__(self, rng, dim, num_heads, dqk, dv, max_len, num_time_buckets, time_bias, prefix):
        super().__init__()
        note_uses("hstu_attention")   # logs once if the backend runs it on the reference
        self.h, self.dqk, self.dv, self.max_len = num_heads, dqk, dv, max_len
        width = num_heads * (2 * dv + 2 * dqk)
        self.w_uvqk = param(trunc_normal(rng, (dim, width), 0.02), f"{prefix}.w_uvqk")
        self.w_pos = param(trunc_normal(rng, (2 * max_len - 1,), 0.02), f"{prefix}.w_pos")
        self.w_ts = param(trunc_normal(rng, (num_time_buckets + 1,), 0.02), f"{prefix}.w_ts") if time_bias else None
        self.w_out = param(xavier_uniform(rng, num_heads * dv, dim), f"{prefix}.w_out")
        self.b_out = param(np.zeros(dim, np.float32), f"{prefix}.b_out")

    def construct(self, x, offsets, timestamps, request_times=None, drop_mask=None):
        """x [T, D] -> [T, D]. Callers pass request_times and drop_mask by name (both optional)."""
        t = x.shape[0]
        hv, hqk = self.h * self.dv, self.h * self.dqk
        # u, v, q, k = split(SiLU(LN(x) W_uvqk)) as ONE matmul and one fused SiLU split (mindgr.ops.norm):
        # on the cpu backend its backward writes the projection's gradient once (the generic split's
        # gradient zero-fills one [T, width] buffer per slice), and W_uvqk's gradient is one matmul.
        # Both LayerNorms go through mindgr.ops.norm too (the cpu backend: one fused kernel each way);
        # the projections through mindgr.ops.linear (a backward without a materialised transpose).
        xn = layer_norm(x)
        u, v, q, k = silu_split(linear(xn, self.w_uvqk), (hv, hv, hqk, hqk))
        v = v.reshape(t, self.h, self.dv)
        q = q.reshape(t, self.h, self.dqk)
        k = k.reshape(t, self.h, self.dqk)
        attn = jagged_hstu_attention(q, k, v, offsets, timestamps, self.w_pos, self.w_ts, self.max_len,
                                     request_times)
        o = gated_layer_norm(u, attn.reshape(t, hv))
        if drop_mask is not None:
            o = apply_dropout(o, drop_mask)
        return x + linear(o, self.w_out) + self.b_out

    # ---- the cached forward: what a decoder built from these blocks generates with -------------------------
    # HSTU's attention is pointwise SiLU with no softmax normaliser, so a decoded token's attention is exactly
    # (its part over the prompt) + (its part over its own earlier decoded tokens): the prompt's keys and
    # values are kept once and each decoded token's in an append-only record (mindgr.models.kv_cache).
    # The prompts go through the block's own forward (the jagged attention of the ops backend); the K/V kept
    # and the step use plain MindSpore ops: a step's attention is dense per-user products, not a jagged batch.

    def _uvqk_plain(self, x):
        """u, v, q, k [T, H*d] of inputs x [T, D]: the block's projection, SiLU(LN(x) W_uvqk) split."""
        hv, hqk = self.h * self.dv, self.h * self.dqk
        z = ops.silu(ops.matmul(layers.layer_norm(x), self.w_uvqk))
        return ops.split(z, [hv, hv, hqk, hqk], 1)

    def prompt_forward(self, x, offsets, timestamps, rows: int, row_len: int):
        """The block over prompts laid out one per `row_len` tokens -> (y [T, D], K [rows, row_len, H, dqk],
        V [rows, row_len, H, dv]): its output and the keys / values decoded tokens attend to."""
        hv, hqk = self.h * self.dv, self.h * self.dqk
        _, v, _, k = silu_split(linear(layer_norm(x), self.w_uvqk), (hv, hv, hqk, hqk))   # as construct's
        y = self.construct(x, offsets, timestamps)     # (graph mode cannot call `self`)
        return y, k.reshape(rows, row_len, self.h, self.dqk), v.reshape(rows, row_len, self.h, self.dv)

    def cached_step(self, x, kp, vp, pidx, pmask, kr, vr, onehot, anc, ridx, rmask, users: int, beam: int,
                    steps: int, parts: str = "both"):
        """One decoded token per (user, beam), x [U*Bm, D] -> (y [U*Bm, D], record K, record V).

        kp / vp [U, P, H, d]: the prompt's keys / values (prompt_forward), shared by the user's beams;
        pidx [U, P] int32 / pmask [U, P]: each prompt key's position-bias index and validity;
        kr / vr [S, U, Bm, H, d]: the append-only records, one slot per decoded level; this token's k / v
        are written at the slot where onehot [S] is 1 (a select: a scatter into a graph input is not an
        in-place update in graph mode); anc [U*Bm*S] int32: flat record rows of each beam's ancestry (itself
        at this slot, its parent at the slot before, ...), followed by parent indices on the host so that a
        forked beam copies nothing; ridx [S] int32 / rmask [S]: the records' bias index and validity.
        parts: "both", or "prompt" / "beam" (one attention part only: for timing the split)."""
        u, b, s, h, dqk, dv = users, beam, steps, self.h, self.dqk, self.dv
        n = u * b
        inv_n = 1.0 / float(self.max_len)
        # the block's own fused projection (LayerNorm, one matmul, SiLU split), as in construct
        uu, v, q, k = silu_split(linear(layer_norm(x), self.w_uvqk), (h * dv, h * dv, h * dqk, h * dqk))
        attn = ops.zeros((u, b, h, dv), ms.float32)
        if parts != "beam":
            # the prompt part: one [beam, dqk] x [dqk, P] product per (user, head) over the shared keys
            q4 = q.reshape(u, b, h, dqk)
            sp = ops.matmul(q4.transpose(0, 2, 1, 3), kp.transpose(0, 2, 3, 1))           # [U, H, Bm, P]
            wp = ops.silu(sp + ops.gather(self.w_pos, pidx, 0)[:, None, None, :])
            wp = wp * (pmask * inv_n)[:, None, None, :]
            attn = attn + ops.matmul(wp, vp.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        # this step's record written at its slot (a select: cheaper than a blend), then the ancestry part
        # (ancestors found through the parent indices) as one [1, dqk] x [dqk, S] product per (beam, head)
        write = onehot.reshape(s, 1, 1, 1, 1) > 0.5
        kr = ops.where(write, k.reshape(1, u, b, h, dqk), kr)
        vr = ops.where(write, v.reshape(1, u, b, h, dv), vr)
        if parts != "prompt":
            ka = ops.gather(kr.reshape(s * n, h, dqk), anc, 0).reshape(n, s, h, dqk).transpose(0, 2, 3, 1)
            va = ops.gather(vr.reshape(s * n, h, dv), anc, 0).reshape(n, s, h, dv).transpose(0, 2, 1, 3)
            sb = ops.matmul(q.reshape(n, h, 1, dqk), ka)                                     # [N, H, 1, S]
            wb = ops.silu(sb + ops.gather(self.w_pos, ridx, 0)) * (rmask * inv_n)
            attn = attn + ops.matmul(wb, va).reshape(u, b, h, dv)
        o = gated_layer_norm(uu, attn.reshape(n, h * dv))
        return x + linear(o, self.w_out) + self.b_out, kr, vr

    def prompt_blocks(self, k, v):
        """The prompt's K [U, P, H, dqk] / V [U, P, H, dv] as per-user block-diagonal matrices over the heads,
        K [U, H*dqk, H*P] and V [U, H*P, H*dv] (made once per prefill): record_step's prompt attention is then
        two plain batched products in the token layout, no per-step transposes."""
        u, p, h, dqk, dv = k.shape[0], k.shape[1], self.h, self.dqk, self.dv
        eye = ops.eye(h, h, ms.float32)
        kb = k.transpose(0, 2, 3, 1).reshape(u, h, dqk, 1, p) * eye.reshape(1, h, 1, h, 1)
        vb = v.transpose(0, 2, 1, 3).reshape(u, h, p, 1, dv) * eye.reshape(1, h, 1, h, 1)
        return kb.reshape(u, h * dqk, h * p), vb.reshape(u, h * p, h * dv)

    def record_step(self, x, kb, vb, pidx, pmask, krs, vrs, anc, ridx, users: int, beam: int):
        """cached_step with the records kept apart, one tensor per slot (the engine's own decoding graph,
        mindgr.models.kv_cache.FastStepCell, one per decoded level): nothing of the records is sliced,
        blended or copied back, and only the slots before this step's are read.

        x [N, D] (N = U*Bm); kb / vb the prompt's K / V as prompt_blocks; pidx [U, P] int32 / pmask [U, P]
        as cached_step; krs / vrs: the t earlier slots' k / v [N, H, d] (rows: the beams of that step); anc
        [t, N] int32: each beam's ancestor row at each of them; ridx [t] int32: their bias index ->
        (y [N, D], this token's k [N, H, dqk], v [N, H, dv])."""
        u, b, h, dqk, dv = users, beam, self.h, self.dqk, self.dv
        n = u * b
        inv_n = 1.0 / float(self.max_len)
        uu, v, q, k = silu_split(linear(layer_norm(x), self.w_uvqk), (h * dv, h * dv, h * dqk, h * dqk))
        # the prompt part: scores [U, Bm, H*P] of every head at once against the block-diagonal keys
        sp = ops.matmul(q.reshape(u, b, h * dqk), kb)
        bias = ops.tile(ops.gather(self.w_pos, pidx, 0), (1, h))
        wp = ops.silu(sp + bias[:, None, :]) * (ops.tile(pmask, (1, h)) * inv_n)[:, None, :]
        attn = ops.matmul(wp, vb).reshape(n, h, dv)
        q3, k3, v3 = q.reshape(n, h, dqk), k.reshape(n, h, dqk), v.reshape(n, h, dv)
        wself = ops.silu((q3 * k3).sum(-1) + self.w_pos[self.max_len - 1]) * inv_n            # [N, H]
        attn = attn + ops.expand_dims(wself, 2) * v3
        rbias = ops.gather(self.w_pos, ridx, 0)
        for s in range(len(krs)):                  # the ancestors, one earlier slot at a time
            ka = ops.gather(krs[s], anc[s], 0)
            ws = ops.silu((q3 * ka).sum(-1) + rbias[s]) * inv_n
            attn = attn + ops.expand_dims(ws, 2) * ops.gather(vrs[s], anc[s], 0)
        o = gated_layer_norm(uu, attn.reshape(n, h * dv))
        return x + linear(o, self.w_out) + self.b_out, k3, v3

    def per_beam_step(self, x, kc, vc, parent, slot, idx, mask):
        """The per-beam cache's step (the usual generate() layout, mindgr.models.per_beam_cache): every beam
        holds its own copy of the prompt's and its decoded tokens' K/V. x [N, D] one token per beam (N =
        users x beam); kc / vc [N, H, L, d]: the caches of the previous step's beams, L = prompt capacity +
        decoded slots; parent [N] int32: the row each beam forked from (the whole row is gathered: the copy
        a beam reorder does); slot [L]: 1 where this token's K/V is written; idx [N, L] int32 / mask [N, L]:
        each key's position-bias index and validity -> (y [N, D], the reordered caches with this token)."""
        n, h, dqk, dv = x.shape[0], self.h, self.dqk, self.dv
        length = kc.shape[2]
        uu, v, q, k = self._uvqk_plain(x)
        write = slot.reshape(1, 1, length, 1) > 0.5
        kc = ops.where(write, k.reshape(n, h, 1, dqk), ops.gather(kc, parent, 0))
        vc = ops.where(write, v.reshape(n, h, 1, dv), ops.gather(vc, parent, 0))
        s = (q.reshape(n, h, 1, dqk) * kc).sum(-1)                                          # [N, H, L]
        w = ops.silu(s + ops.expand_dims(ops.gather(self.w_pos, idx, 0), 1))
        w = w * ops.expand_dims(mask * (1.0 / float(self.max_len)), 1)
        attn = ops.matmul(w.reshape(n, h, 1, length), vc).reshape(n, h * dv)
        o = uu * layers.layer_norm(attn)
        return x + ops.matmul(o, self.w_out) + self.b_out, kc, vc


class HSTU(ItemSequenceEncoder):
    """Jagged HSTU encoder. construct(ids, positions, offsets, timestamps, drop, request_times) -> [T, D]
    unit vectors. request_time: the last position's time bias uses request_times [B] (else they are
    ignored and that position uses its own time)."""

    def __init__(self, num_items, dim, num_blocks, num_heads, dqk, dv, max_len, dropout=0.2,
                 time_bias=True, num_time_buckets=128, seed=0, item_init=trunc_normal, request_time=False):
        rng = np.random.default_rng([seed, 1])
        super().__init__(rng, num_items, dim, max_len, dropout, item_init)
        self.blocks = nn.CellList([
            HSTUBlock(rng, dim, num_heads, dqk, dv, max_len, num_time_buckets, time_bias, f"blocks.{i}")
            for i in range(num_blocks)])
        self.num_blocks = num_blocks
        self.request_time = bool(request_time)
        # Host-drawn dropout masks: one for the input and one per block, each [T, width].
        self.dropout_sites = 1 + num_blocks
        self.dropout_width = max(dim, num_heads * dv)

    def encode(self, item_vectors, positions, offsets, timestamps, drop=None, request_times=None):
        """The encoder from the tokens' item embeddings [T, D] (gathered here, or by a sharded table)."""
        req = request_times if self.request_time else None
        x = self.embed(item_vectors, positions)
        masks = ops.unstack(drop, 0) if drop is not None else None
        if masks is not None:
            x = apply_dropout(x, masks[0])
        for i in range(self.num_blocks):
            x = self.blocks[i](x, offsets, timestamps, request_times=req,
                               drop_mask=masks[i + 1] if masks is not None else None)
        return l2_normalize(x)


def head_widths(m):
    return m.dqk or m.dim // m.num_heads, m.dv or m.dim // m.num_heads


def build(model_cfg, num_items: int, max_len: int, seed: int, item_init=None):
    """The registry's builder (mindgr.models.registry): HSTU from config `model`."""
    m = model_cfg
    dqk, dv = head_widths(m)
    extra = {} if item_init is None else {"item_init": item_init}
    return HSTU(num_items, m.dim, m.num_blocks, m.num_heads, dqk, dv, max_len, m.dropout,
                m.time_bias, m.num_time_buckets, seed, request_time=m.request_time, **extra)


def encoder_flops(model_cfg, lengths) -> float:
    """Forward FLOPs of the blocks (conventions: mindgr.train.flops), per block and real token:
    uvqk projection 2*D*H*(2dv+2dqk), output projection 2*H*dv*D; attention per row of length L:
    H*(2*dqk + 2*dv) * L*(L+1)/2 (the causal half, diagonal included: q.k scores and the sum over v)."""
    m = model_cfg
    lengths = np.asarray(lengths, dtype=np.float64)
    d, h = m.dim, m.num_heads
    dqk, dv = head_widths(m)
    per_token = 2 * d * h * (2 * dv + 2 * dqk) + 2 * h * dv * d
    attn = h * (2 * dqk + 2 * dv) * float((lengths * (lengths + 1) / 2).sum())
    return m.num_blocks * (per_token * float(lengths.sum()) + attn)
