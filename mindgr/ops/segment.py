"""Prefix attention of short segments over a shared prompt (the "tree" training layout of the GR decoder).

jagged_prefix_attention(q, k, v, key_start, key_len, q_pos, w_pos, max_len, p_cap) -> [S, H, dv]
    For every segment token s (query q[s] [H, dqk]) and head, its HSTU attention over the prompt keys it
    sees: the key_len[s] keys k[key_start[s] + j], j < key_len[s], of its user's prompt:
        out_s = sum_{j < key_len[s]} SiLU(q_s . k_{key_start[s]+j} + w_pos[N-1 + j - q_pos[s]]) / N * v_{key_start[s]+j}
    q_pos[s] is the token's position in the row it stands for (prompt boundary + its index in the
    segment), so the relative bias is the one that row would see; N = max_len. key_len = 0 gives zeros.
    k [P, H, dqk], v [P, H, dv] are the prompt tokens; key_start, key_len, q_pos [S] int32;
    p_cap (static) bounds key_len.

HSTU attention is pointwise (no softmax normaliser), so a segment token's attention over its virtual row
(prompt prefix + its own segment) is exactly this prefix part + the causal attention inside its segment
(jagged_hstu_attention with one row per segment). The decoding engine (mindgr.serve.decode) relies on
the same identity.

Only the pure-MindSpore implementation exists (every backend runs it): it gathers p_cap keys per
segment token, S x p_cap x H x (dqk + dv) values.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops


def jagged_prefix_attention(q, k, v, key_start, key_len, q_pos, w_pos, max_len: int, p_cap: int):
    s, h, dqk = q.shape
    dv = v.shape[2]
    j = ops.arange(p_cap, dtype=ms.int32)
    valid = j[None, :] < key_len[:, None]                                   # [S, p_cap]
    index = ops.where(valid, key_start[:, None] + j[None, :], ops.zeros_like(valid).astype(ms.int32))
    flat = index.reshape(-1)
    kg = ops.gather(k, flat, 0).reshape(s, p_cap, h, dqk).transpose(0, 2, 3, 1)   # [S, H, dqk, p_cap]
    vg = ops.gather(v, flat, 0).reshape(s, p_cap, h, dv).transpose(0, 2, 1, 3)    # [S, H, p_cap, dv]
    scores = ops.matmul(q[:, :, None, :], kg)[:, :, 0, :]                 # [S, H, p_cap]
    rel = ops.clip(max_len - 1 + j[None, :] - q_pos[:, None], 0, 2 * max_len - 2)
    bias = ops.gather(w_pos, rel.reshape(-1), 0).reshape(s, 1, p_cap)
    weights = ops.silu(scores + bias) * (valid.astype(q.dtype)[:, None, :] / float(max_len))
    return ops.matmul(weights[:, :, None, :], vg)[:, :, 0, :]            # [S, H, dv]
