"""SASRec (Kang & McAuley, 2018), the baseline of the published HSTU table, on jagged sequences.

Pre-LayerNorm Transformer blocks with causal softmax attention and a ReLU feed-forward; input
item_emb * sqrt(D) + pos_emb with dropout; final LayerNorm; output L2-normalised so it trains with
the same sampled-softmax-on-cosine loss as HSTU.
"""
import numpy as np
from mindspore import nn, ops

from mindgr.models.layers import (ItemSequenceEncoder, add_bias, apply_dropout, l2_normalize, param, trunc_normal,
                                  xavier_uniform)
from mindgr.ops.backend import note_uses
from mindgr.ops.attention import jagged_softmax_attention
from mindgr.ops.linear import linear
from mindgr.ops.norm import layer_norm


class AffineLayerNorm(nn.Cell):
    """LayerNorm with a learned scale and shift (gamma, beta: the names and math of nn.LayerNorm), its
    normalisation through the ops backend (cpu: one fused pass each way; measured faster than
    MindSpore's LayerNorm in the SASRec step)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.gamma = param(np.ones(dim, np.float32), "gamma")
        self.beta = param(np.zeros(dim, np.float32), "beta")

    def construct(self, x):
        return add_bias(layer_norm(x, self.eps) * self.gamma, self.beta)

    def project(self, x, w, b, parts: int = 1):
        """LayerNorm(x) @ w + b with the scale and shift folded into the projection:
        (n * gamma + beta) w + b = n (gamma w) + (beta w + b), so the per-token [T, D] scale and shift
        become [D, K] and [K] ones on the weights. parts > 1: w's columns in that many equal parts, one
        product each (a tuple): on the CPU backend the backward of splitting one product costs as much
        again as the product (measured at the ML-1M shape), slicing the weights almost nothing."""
        w_scaled = self.gamma.reshape(-1, 1) * w
        b_shifted = ops.matmul(self.beta.reshape(1, -1), w).reshape(-1) + b
        n = layer_norm(x, self.eps)
        if parts == 1:
            return add_bias(linear(n, w_scaled), b_shifted)
        k = w.shape[1] // parts
        return tuple(add_bias(linear(n, ops.narrow(w_scaled, 1, i * k, k)), ops.narrow(b_shifted, 0, i * k, k))
                     for i in range(parts))


class SASRecBlock(nn.Cell):
    def __init__(self, rng, dim, num_heads, ffn_dim, max_len, prefix):
        super().__init__()
        note_uses("softmax_attention")   # logs once if the backend runs it on the reference
        self.h, self.d, self.max_len = num_heads, dim // num_heads, max_len
        self.ln_attn = AffineLayerNorm(dim, 1e-8)
        self.ln_ffn = AffineLayerNorm(dim, 1e-8)
        self.w_qkv = param(xavier_uniform(rng, dim, 3 * dim), f"{prefix}.w_qkv")
        self.b_qkv = param(np.zeros(3 * dim, np.float32), f"{prefix}.b_qkv")
        self.w_o = param(xavier_uniform(rng, dim, dim), f"{prefix}.w_o")
        self.w_1 = param(xavier_uniform(rng, dim, ffn_dim), f"{prefix}.w_1")
        self.b_1 = param(np.zeros(ffn_dim, np.float32), f"{prefix}.b_1")
        self.w_2 = param(xavier_uniform(rng, ffn_dim, dim), f"{prefix}.w_2")
        self.b_2 = param(np.zeros(dim, np.float32), f"{prefix}.b_2")
        self.ln_attn.gamma.name, self.ln_attn.beta.name = f"{prefix}.ln_attn.gamma", f"{prefix}.ln_attn.beta"
        self.ln_ffn.gamma.name, self.ln_ffn.beta.name = f"{prefix}.ln_ffn.gamma", f"{prefix}.ln_ffn.beta"

    def construct(self, x, offsets, m_attn=None, m_hidden=None, m_ffn=None):
        t, dim = x.shape
        q, k, v = self.ln_attn.project(x, self.w_qkv, self.b_qkv, parts=3)
        q = q.reshape(t, self.h, self.d)
        k = k.reshape(t, self.h, self.d)
        v = v.reshape(t, self.h, self.d)
        a = linear(jagged_softmax_attention(q, k, v, offsets, self.max_len).reshape(t, dim), self.w_o)
        if m_attn is not None:
            a = apply_dropout(a, m_attn)
        x = x + a
        hidden = ops.relu(self.ln_ffn.project(x, self.w_1, self.b_1))
        if m_hidden is not None:
            hidden = apply_dropout(hidden, m_hidden)
        f = add_bias(linear(hidden, self.w_2), self.b_2)
        if m_ffn is not None:
            f = apply_dropout(f, m_ffn)
        return x + f


class SASRec(ItemSequenceEncoder):
    def __init__(self, num_items, dim, num_blocks, num_heads, max_len, dropout=0.2, ffn_dim=0, seed=0,
                 item_init=trunc_normal):
        rng = np.random.default_rng([seed, 2])
        super().__init__(rng, num_items, dim, max_len, dropout, item_init)
        ffn_dim = ffn_dim or dim
        self.blocks = nn.CellList([SASRecBlock(rng, dim, num_heads, ffn_dim, max_len, f"blocks.{i}")
                                   for i in range(num_blocks)])
        self.ln_out = AffineLayerNorm(dim, 1e-8)
        self.ln_out.gamma.name, self.ln_out.beta.name = "ln_out.gamma", "ln_out.beta"
        self.num_blocks = num_blocks
        self.dropout_sites = 1 + 3 * num_blocks
        self.dropout_width = max(dim, ffn_dim)

    def encode(self, item_vectors, positions, offsets, timestamps, drop=None, request_times=None):
        """The encoder from the tokens' item embeddings [T, D] (gathered here, or by a sharded table).
        SASRec has no time information: timestamps and request_times are ignored."""
        x = self.embed(item_vectors, positions)
        if drop is not None:
            masks = ops.unstack(drop, 0)
            x = apply_dropout(x, masks[0])
            for i in range(self.num_blocks):
                x = self.blocks[i](x, offsets, masks[1 + 3 * i], masks[2 + 3 * i], masks[3 + 3 * i])
        else:
            for i in range(self.num_blocks):
                x = self.blocks[i](x, offsets)
        return l2_normalize(self.ln_out(x))


def build(model_cfg, num_items: int, max_len: int, seed: int, item_init=None):
    """The registry's builder (mindgr.models.registry): SASRec from config `model`."""
    m = model_cfg
    extra = {} if item_init is None else {"item_init": item_init}
    return SASRec(num_items, m.dim, m.num_blocks, m.num_heads, max_len, m.dropout, m.ffn_dim, seed, **extra)


def encoder_flops(model_cfg, lengths) -> float:
    """Forward FLOPs of the blocks (conventions: mindgr.train.flops), per block and real token: qkv
    projection 2*D*3D, output 2*D*D, FFN 2*2*D*F; attention per row of length L: H*4*(D/H) * L*(L+1)/2."""
    m = model_cfg
    lengths = np.asarray(lengths, dtype=np.float64)
    d, h, f = m.dim, m.num_heads, m.ffn_dim or m.dim
    per_token = 2 * d * 3 * d + 2 * d * d + 4 * d * f
    attn = h * 4 * (d // h) * float((lengths * (lengths + 1) / 2).sum())
    return m.num_blocks * (per_token * float(lengths.sum()) + attn)
