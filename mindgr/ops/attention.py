"""Jagged attention ops, dispatched to the configured backend (see mindgr.ops.backend).

jagged_hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len) -> [T, H, dv]
    per row and head: out_i = sum_{j<=i} SiLU(q_i.k_j + w_pos[N-1+j-i] + w_ts[bucket(t_{i+1}, t_j)]) / N * v_j
    q, k [T, H, dqk]; v [T, H, dv]; offsets [B+1] int32; timestamps [T] int64; w_pos [2N-1];
    w_ts [buckets+1] or None (no time bias); N = max_len. Tail tokens and empty rows give zeros.
jagged_bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len) -> [T, H, C, dv]
    FuXi-alpha's bias-only channels over the same v, shared by all heads, no SiLU, no /N:
    channel 0: out_i = sum_{j<=i} w_pos[N-1+j-i] * v_j; channel 1 (w_ts given, else C = 1):
    out_i = sum_{j<=i} w_ts[bucket(t_{i+1}, t_j)] * v_j (same buckets and t_{i+1} convention as HSTU).
jagged_softmax_attention(q, k, v, offsets, max_len) -> [T, H, dv]: causal softmax attention (SASRec).
"""
from mindgr.ops import backend, reference


def jagged_hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len: int):
    if backend._current == "cpu":
        return backend._cpu.hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len)
    if backend._current == "ascend":
        return backend._ascend.hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len)
    return reference.hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len)


def jagged_bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len: int):
    if backend._current == "cpu":
        return backend._cpu.bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len)
    # no Ascend kernel yet: the reference runs there (padded, B * N^2 memory)
    return reference.bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len)


def jagged_softmax_attention(q, k, v, offsets, max_len: int):
    # Only the reference exists for SASRec: it is the baseline, not an accelerated path.
    return reference.softmax_attention(q, k, v, offsets, max_len)
