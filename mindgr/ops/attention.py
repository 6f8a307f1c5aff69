"""Jagged attention ops, dispatched through the selected backend's table
(mindgr.ops.backend.ACTIVE, filled by set_backend).

jagged_hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len, request_times=None) -> [T, H, dv]
    per row and head: out_i = sum_{j<=i} SiLU(q_i.k_j + w_pos[N-1+j-i] + w_ts[bucket(tq_i, t_j)]) / N * v_j
    q, k [T, H, dqk]; v [T, H, dv]; offsets [B+1] int32; timestamps [T] int64; w_pos [2N-1];
    w_ts [buckets+1] or None (no time bias); N = max_len. Tail tokens and empty rows give zeros.
    The query time (the published HSTU convention): tq_i = t_{i+1}, the time of the event position i
    predicts; at each row's last position (i = L - 1, L = min(length, N)) that event is not in the row,
    and tq is the row's request time, request_times [B] int64 (training: the last target's time;
    evaluation: the held-out target's; serving: the request's). request_times=None gives the last
    position its own time t_i (MindGR's convention before request times; model.request_time=false).
jagged_bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len, request_times=None) -> [T, H, C, dv]
    FuXi-alpha's bias-only channels over the same v, shared by all heads, no SiLU, no /N:
    channel 0: out_i = sum_{j<=i} w_pos[N-1+j-i] * v_j; channel 1 (w_ts given, else C = 1):
    out_i = sum_{j<=i} w_ts[bucket(tq_i, t_j)] * v_j (same buckets and query times as HSTU).
jagged_softmax_attention(q, k, v, offsets, max_len) -> [T, H, dv]: causal softmax attention (SASRec).
jagged_linear_attention(q, k, v, offsets, log_decay, intra, tail, lead) -> [T, H, dv]
    causal linear attention with a fixed per-head decay gamma_h = exp(log_decay[h]), per row and head:
    out_i = sum_{j<=i} gamma_h^(i-j) (q_i.k_j) v_j (S_i = gamma S_{i-1} + k_i v_i^T, out_i = S_i^T q_i);
    intra / tail / lead: the chunked form's decay tables (mindgr.models.linear_attention.decay_tables),
    which the reference computes with and a recurrent kernel ignores. Tokens outside the rows give zeros.
"""
from mindgr.ops.backend import ACTIVE, ensure_backend

ensure_backend()  # the reference until the runtime selects a backend


def jagged_hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    return ACTIVE["hstu_attention"](q, k, v, offsets, timestamps, w_pos, w_ts, max_len, request_times)


def jagged_bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    # no Ascend kernel yet: there the registry runs the padded reference (B * N^2 memory) and logs it
    return ACTIVE["bias_attention"](v, offsets, timestamps, w_pos, w_ts, max_len, request_times)


def jagged_linear_attention(q, k, v, offsets, log_decay, intra, tail, lead):
    # reference: the chunked form (composed ops); cpu: linear_attention.cc (a recurrent scan per row and head)
    return ACTIVE["linear_attention"](q, k, v, offsets, log_decay, intra, tail, lead)


def jagged_softmax_attention(q, k, v, offsets, max_len: int):
    # cpu: softmax_attention.cc (online softmax, no [B, N, N] tensor); elsewhere the padded reference
    return ACTIVE["softmax_attention"](q, k, v, offsets, max_len)
