"""Prefix attention of short segments over a shared prompt (the "tree" training layout of the GR decoder).

jagged_prefix_attention(q, k, v, q_offsets, k_offsets, key_len, q_pos, w_pos, max_len, q_cap, p_cap)
    -> [S, H, dv]
    q [S, H, dqk]: segment tokens, user u's at q_offsets[u]:q_offsets[u+1]; k [P, H, dqk], v [P, H, dv]:
    prompt tokens, user u's prompt at k_offsets[u]:k_offsets[u+1]. key_len, q_pos [U, q_cap] int32: for
    the i-th segment token of user u, how many of its prompt's keys it sees and its position in the row
    it stands for (prompt boundary + its index in its segment). Per head:
        out = sum_{j < key_len} SiLU(q . k_j + w_pos[N-1 + j - q_pos]) / N * v_j      (k_j: j-th prompt key)
    so the relative bias is the one that row would see; N = max_len. key_len = 0 gives zeros.
    q_cap, p_cap (static) bound the segment tokens and the prompt tokens of one user.

HSTU attention is pointwise (no softmax normaliser), so a segment token's attention over its virtual row
(prompt prefix + its own segment) is exactly this prefix part + the causal attention inside its segment
(jagged_hstu_attention with one row per segment). The decoding engine (mindgr.ids.decode) relies on
the same identity.

Only a pure-MindSpore implementation exists (every backend runs it; the jagged <-> padded conversions
go through mindgr.ops.jagged, so the cpu backend's kernels do those): per user one [q_cap, p_cap]
score block per head, U x H x q_cap x p_cap.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

from mindgr.ops.jagged import jagged_to_padded, padded_to_jagged


def jagged_prefix_attention(q, k, v, q_offsets, k_offsets, key_len, q_pos, w_pos, max_len: int, q_cap: int,
                            p_cap: int):
    s = q.shape[0]
    u = key_len.shape[0]
    qp = jagged_to_padded(q, q_offsets, q_cap).transpose(0, 2, 1, 3)    # [U, H, Qc, dqk]
    kp = jagged_to_padded(k, k_offsets, p_cap).transpose(0, 2, 3, 1)    # [U, H, dqk, Pc]
    vp = jagged_to_padded(v, k_offsets, p_cap).transpose(0, 2, 1, 3)    # [U, H, Pc, dv]
    scores = ops.matmul(qp, kp)                                          # [U, H, Qc, Pc]
    j = ops.arange(p_cap, dtype=ms.int32)
    rel = ops.clip(max_len - 1 + j[None, None, :] - q_pos[:, :, None], 0, 2 * max_len - 2)
    bias = ops.gather(w_pos, rel.reshape(-1), 0).reshape(u, 1, q_cap, p_cap)
    valid = (j[None, None, :] < key_len[:, :, None]).astype(q.dtype)[:, None] / float(max_len)
    out = ops.matmul(ops.silu(scores + bias) * valid, vp).transpose(0, 2, 1, 3)   # [U, Qc, H, dv]
    return padded_to_jagged(out, q_offsets, s)
