"""Model FLOPs per training step, counted from shapes (one documented function), and MFU.

Counted (1 multiply-add = 2 FLOPs), per real token unless said otherwise:
  HSTU block:   uvqk projection 2*D*H*(2dv+2dqk); output projection 2*H*dv*D;
                attention per row of length L: H*(2*dqk + 2*dv) * L*(L+1)/2  (the causal half only,
                diagonal included: q.k scores plus the weighted sum of v).
  FuXi-alpha:   counted by mindgr.models.fuxi.encoder_flops (its docstring lists the terms).
  SASRec block: qkv projection 2*D*3D; output 2*D*D; FFN 2*2*D*F; attention as above with d = D/H.
  Loss:         the sampled-softmax logits that the model needs: 2*D*(R+1) per token with a target
                (whatever way the implementation computes them).
  Not counted:  LayerNorm, SiLU, biases, softmax, embedding gathers, optimizer (all O(T*D)).
  Backward = 2 x forward, so a training step = 3 x forward.
"""
from __future__ import annotations

import numpy as np


def forward_flops(model_cfg, lengths, num_targets: int, num_negatives: int) -> float:
    m = model_cfg
    lengths = np.asarray(lengths, dtype=np.float64)
    tokens = float(lengths.sum())
    pairs = float((lengths * (lengths + 1) / 2).sum())
    d, h = m.dim, m.num_heads
    if m.arch == "fuxi":  # the model counts its own encoder (mindgr.models.fuxi.encoder_flops)
        from mindgr.models import fuxi
        return fuxi.encoder_flops(m, lengths) + 2.0 * d * (num_negatives + 1) * num_targets
    if m.arch == "hstu":
        dqk = m.dqk or d // h
        dv = m.dv or d // h
        per_token = 2 * d * h * (2 * dv + 2 * dqk) + 2 * h * dv * d
        attn = h * (2 * dqk + 2 * dv) * pairs
    else:
        f = m.ffn_dim or d
        per_token = 2 * d * 3 * d + 2 * d * d + 4 * d * f
        attn = h * 4 * (d // h) * pairs
    blocks = m.num_blocks * (per_token * tokens + attn)
    loss = 2.0 * d * (num_negatives + 1) * num_targets
    return blocks + loss


def train_flops(model_cfg, lengths, num_targets: int, num_negatives: int) -> float:
    return 3.0 * forward_flops(model_cfg, lengths, num_targets, num_negatives)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    if seconds <= 0 or peak_flops_per_s <= 0:
        return 0.0
    return flops / seconds / peak_flops_per_s
