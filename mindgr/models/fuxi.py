"""FuXi-alpha (Ye et al., arXiv 2502.03036) on jagged sequences, built like MindGR's HSTU.

Per block, for tokens x [T, D] (RMSNorm(z) = z / sqrt(mean(z^2) + 1e-6), no learned scale, as HSTU's
LayerNorm has none; N = the configured max length; C = 3 channels, 2 with model.time_bias = false):
    u, v, q, k = split(SiLU(RMSNorm(x) @ W_uvqk))        u: C*H*dv, v: H*dv, q, k: H*dqk  (no bias)
    Adaptive multi-channel self-attention, three channels over the same v, causal (j <= i):
      positional  p_i = sum_j w_pos[N-1+j-i] * v_j                    raw bias, shared by heads, no SiLU, no /N
      temporal    r_i = sum_j w_ts[bucket(t_{i+1} - t_j)] * v_j        likewise
      semantic    s_i = sum_j SiLU(q_i.k_j) / N * v_j                  per head
    a = concat per head (p, r, s) -> [T, C*H*dv];  o = u * RMSNorm(a)
    Multi-stage FFN:
      h = x + Dropout(o) @ W_o + b_o                                      (W_o: C*H*dv -> D)
      g = Dropout(RMSNorm(h))
      y = h + (SiLU(g @ W_1 + b_1) * (g @ W_2 + b_2)) @ W_3 + b_3          (SwiGLU, hidden D * ffn_multiply)
Input: item_emb * sqrt(D) + pos_emb, dropout; output L2-normalised (as HSTU).

This is the published implementation's math (checked tensor by tensor against a transcription of its
padded form: tests/unit/models/test_models_fuxi.py, tests/fuxi_numpy.py dense_block), with HSTU's conventions in
MindGR: the time bucket is clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_time_buckets) with query time
t_{i+1} (the last position: the request time with model.request_time, else its own time), w_pos has
2N-1 entries, rows are cut to N. Known differences, small: b_1, b_2, b_3 (zero-initialised) exist here
only, and the semantic channel divides by N = max_len, the published code by its padded length. The positional and temporal channels run
as one jagged bias-only op (mindgr.ops.attention.jagged_bias_attention: no [B, N, N] tensor on the cpu
backend); the semantic channel is the HSTU op with a zero position bias and no time bias, which is
exactly SiLU(q k^T) / N. Dropout masks are drawn on the host: site 0 the input, then per block the gated
attention output and the FFN input. As computed (the same math, for the CPU backend's sake: docs/ARCHITECTURE.md,
platform facts): each RMSNorm is the backend's fused L2 normalisation with its sqrt(width) factor folded into
the weights of the product that follows, the SiLU and split are HSTU's fused `silu_split`, biases go through
BiasAdd and [T, .] products through `mindgr.ops.linear`.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindgr.models.layers import (ItemSequenceEncoder, add_bias, apply_dropout, l2_normalize, param, trunc_normal,
                                  xavier_uniform)
from mindgr.ops.backend import note_uses
from mindgr.ops.attention import jagged_bias_attention, jagged_hstu_attention
from mindgr.ops.linear import linear
from mindgr.ops.norm import silu_split

RMS_EPS = 1e-6


class RMSDirection:
    """RMSNorm(z) = z / sqrt(mean(z^2) + eps) over a width n, computed as sqrt(n) * z / sqrt(sum(z^2) + n eps):
    the backend's fused L2 normalisation (`unit`) and a factor sqrt(n) that the block folds into the
    weights of the product that follows (a [n, K] scale instead of a [T, n] one)."""

    def __init__(self, width: int, eps: float = RMS_EPS):
        self.scale = float(np.sqrt(width))
        self.eps = float(np.sqrt(width * eps))

    def unit(self, z):
        return l2_normalize(z, self.eps)


def _widths(model_cfg):
    m = model_cfg
    dqk = m.dqk or m.dim // m.num_heads
    dv = m.dv or m.dim // m.num_heads
    channels = 3 if m.time_bias else 2
    return dqk, dv, channels, m.dim * m.ffn_multiply


class FuXiBlock(nn.Cell):
    def __init__(self, rng, dim, num_heads, dqk, dv, max_len, num_time_buckets, time_bias, hidden, prefix):
        super().__init__()
        note_uses("hstu_attention", "bias_attention")   # logs once if the backend runs it on the reference
        self.h, self.dqk, self.dv, self.max_len = num_heads, dqk, dv, max_len
        self.channels = 3 if time_bias else 2
        cw = self.channels * num_heads * dv
        width = cw + num_heads * (dv + 2 * dqk)
        self.w_uvqk = param(trunc_normal(rng, (dim, width), 0.02), f"{prefix}.w_uvqk")
        self.w_pos = param(trunc_normal(rng, (2 * max_len - 1,), 0.02), f"{prefix}.w_pos")
        self.w_ts = param(trunc_normal(rng, (num_time_buckets + 1,), 0.02), f"{prefix}.w_ts") if time_bias else None
        self.w_o = param(xavier_uniform(rng, cw, dim), f"{prefix}.w_o")
        self.b_o = param(np.zeros(dim, np.float32), f"{prefix}.b_o")
        self.w_1 = param(xavier_uniform(rng, dim, hidden), f"{prefix}.w_1")
        self.b_1 = param(np.zeros(hidden, np.float32), f"{prefix}.b_1")
        self.w_2 = param(xavier_uniform(rng, dim, hidden), f"{prefix}.w_2")
        self.b_2 = param(np.zeros(hidden, np.float32), f"{prefix}.b_2")
        self.w_3 = param(xavier_uniform(rng, hidden, dim), f"{prefix}.w_3")
        self.b_3 = param(np.zeros(dim, np.float32), f"{prefix}.b_3")
        self.zero_pos = ops.zeros((2 * max_len - 1,), ms.float32)  # the semantic channel has no bias
        self.rms_x, self.rms_a = RMSDirection(dim), RMSDirection(cw)

    def gate_and_channels(self, x, offsets, timestamps, request_times=None):
        """(u [T, C*H*dv], a [T, C*H*dv]): the gate and the channels before their RMSNorm, per head in the
        order positional, temporal, semantic (the tests compare them with the published form)."""
        t = x.shape[0]
        hv, hqk = self.h * self.dv, self.h * self.dqk
        # SiLU(RMSNorm(x) W_uvqk) split: the fused SiLU split, as HSTU's block (a Split's backward is slow here)
        xn = self.rms_x.unit(x)
        u, v, q, k = silu_split(linear(xn, self.w_uvqk * self.rms_x.scale), (self.channels * hv, hv, hqk, hqk))
        v = v.reshape(t, self.h, self.dv)
        q = q.reshape(t, self.h, self.dqk)
        k = k.reshape(t, self.h, self.dqk)
        biased = jagged_bias_attention(v, offsets, timestamps, self.w_pos, self.w_ts, self.max_len,
                                       request_times)                                 # [T,H,C-1,dv]
        semantic = jagged_hstu_attention(q, k, v, offsets, timestamps, self.zero_pos, None, self.max_len)
        return u, ops.concat((biased, ops.expand_dims(semantic, 2)), 2).reshape(t, self.channels * hv)

    def construct(self, x, offsets, timestamps, request_times=None, drop_attn=None, drop_ffn=None):
        # the RMSNorms' sqrt(n) factors ride on W_o, W_1 and W_2 (mindgr.models.layers.add_bias: why BiasAdd)
        u, a = self.gate_and_channels(x, offsets, timestamps, request_times)
        o = u * self.rms_a.unit(a)
        if drop_attn is not None:
            o = apply_dropout(o, drop_attn)
        h = x + add_bias(linear(o, self.w_o * self.rms_a.scale), self.b_o)
        g = self.rms_x.unit(h)
        if drop_ffn is not None:
            g = apply_dropout(g, drop_ffn)
        gate = (ops.silu(add_bias(linear(g, self.w_1 * self.rms_x.scale), self.b_1))
                * add_bias(linear(g, self.w_2 * self.rms_x.scale), self.b_2))
        return h + add_bias(linear(gate, self.w_3), self.b_3)


class FuXiAlpha(ItemSequenceEncoder):
    """Jagged FuXi-alpha encoder. construct(ids, positions, offsets, timestamps, drop, request_times) -> [T, D]
    unit vectors. request_time: the temporal channel's last position uses request_times [B] (as HSTU)."""

    def __init__(self, num_items, dim, num_blocks, num_heads, dqk, dv, max_len, dropout=0.2, time_bias=True,
                 num_time_buckets=128, ffn_multiply=1, seed=0, item_init=trunc_normal, request_time=False):
        rng = np.random.default_rng([seed, 1])
        super().__init__(rng, num_items, dim, max_len, dropout, item_init)
        self.blocks = nn.CellList([
            FuXiBlock(rng, dim, num_heads, dqk, dv, max_len, num_time_buckets, time_bias, dim * ffn_multiply,
                      f"blocks.{i}") for i in range(num_blocks)])
        self.num_blocks = num_blocks
        self.request_time = bool(request_time)
        # Host-drawn dropout masks: the input, then per block the gated attention output and the FFN input.
        self.dropout_sites = 1 + 2 * num_blocks
        self.dropout_width = max(dim, (3 if time_bias else 2) * num_heads * dv)

    def encode(self, item_vectors, positions, offsets, timestamps, drop=None, request_times=None):
        """The encoder from the tokens' item embeddings [T, D] (gathered here, or by a sharded table)."""
        req = request_times if self.request_time else None
        x = self.embed(item_vectors, positions)
        masks = ops.unstack(drop, 0) if drop is not None else None
        if masks is not None:
            x = apply_dropout(x, masks[0])
        for i in range(self.num_blocks):
            if masks is not None:
                x = self.blocks[i](x, offsets, timestamps, req, masks[1 + 2 * i], masks[2 + 2 * i])
            else:
                x = self.blocks[i](x, offsets, timestamps, req)
        return l2_normalize(x)


def build(model_cfg, num_items: int, max_len: int, seed: int, item_init=None):
    """The registry's builder: a FuXiAlpha from `model` config (item_init as in models/build.py)."""
    m = model_cfg
    dqk, dv, _, _ = _widths(m)
    extra = {} if item_init is None else {"item_init": item_init}
    return FuXiAlpha(num_items, m.dim, m.num_blocks, m.num_heads, dqk, dv, max_len, m.dropout, m.time_bias,
                     m.num_time_buckets, m.ffn_multiply, seed, request_time=m.request_time, **extra)


def encoder_flops(model_cfg, lengths: np.ndarray) -> float:
    """Encoder forward FLOPs (1 multiply-add = 2) for rows of these lengths; the loss is counted apart.

    Per token and block: uvqk 2*D*(C*H*dv + H*dv + 2*H*dqk); W_o 2*C*H*dv*D; SwiGLU 3 * 2*D*F (F = D *
    ffn_multiply). Per attended pair (the causal half, diagonal included, L(L+1)/2 per row): semantic
    H*(2*dqk + 2*dv) (q.k and the weighted v), positional and temporal 2*H*dv each.
    Not counted: norms, SiLU, gating products, biases, the bucket lookups (all O(T*D) or cheaper)."""
    m = model_cfg
    dqk, dv, channels, hidden = _widths(m)
    lengths = np.asarray(lengths, dtype=np.float64)
    tokens = float(lengths.sum())
    pairs = float((lengths * (lengths + 1) / 2).sum())
    d, h = m.dim, m.num_heads
    per_token = 2 * d * (channels * h * dv + h * dv + 2 * h * dqk) + 2 * channels * h * dv * d + 6 * d * hidden
    per_pair = h * (2 * dqk + 2 * dv) + (channels - 1) * 2 * h * dv
    return m.num_blocks * (per_token * tokens + per_pair * pairs)
