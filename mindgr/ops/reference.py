"""Pure-MindSpore implementations of the jagged ops: the oracle every fused kernel is tested against.

They convert jagged tensors to padded [B, N, ...] blocks internally, so they cost B * N^2 for attention.
That is what the fused kernels remove; here clarity matters more than speed.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

TIME_BUCKET_DIV = 0.301  # HSTU: bucket = floor(ln(|dt|) / 0.301), about log base 2


def token_rows(offsets, num_tokens: int):
    """Row index of each token position 0..T-1 (B for the unused tail): the number of row ends <= i."""
    tok = ops.arange(num_tokens, dtype=offsets.dtype)
    return ops.searchsorted(offsets[1:], tok, right=True).astype(ms.int32)


def padded_index(offsets, max_len: int):
    """For each (row, position) the token it holds and whether it is real: ([B, N] int32, [B, N] bool)."""
    starts = offsets[:-1].astype(ms.int32)
    lengths = (offsets[1:] - offsets[:-1]).astype(ms.int32)
    pos = ops.arange(max_len, dtype=ms.int32)
    index = starts[:, None] + pos[None, :]
    valid = pos[None, :] < lengths[:, None]
    return ops.where(valid, index, ops.zeros_like(index)), valid


def jagged_to_padded(values, offsets, max_len: int):
    """values [T, *F] -> [B, N, *F], zeros past each row's length. Rows longer than N are cut to N."""
    index, valid = padded_index(offsets, max_len)
    b = index.shape[0]
    gathered = ops.gather(values, index.reshape(-1), 0)
    gathered = gathered.reshape((b, max_len) + tuple(values.shape[1:]))
    mask = valid.reshape((b, max_len) + (1,) * (values.ndim - 1)).astype(values.dtype)
    return gathered * mask


def padded_to_jagged(padded, offsets, num_tokens: int):
    """padded [B, N, *F] -> [T, *F]; tokens past the last offset (the tail) are zero."""
    b, n = padded.shape[0], padded.shape[1]
    rows = token_rows(offsets, num_tokens)
    real = rows < b
    rows_c = ops.where(real, rows, ops.zeros_like(rows))
    pos = ops.arange(num_tokens, dtype=ms.int32) - ops.gather(offsets.astype(ms.int32), rows_c, 0)
    real = ops.logical_and(real, pos < n)
    pos = ops.where(real, pos, ops.zeros_like(pos))
    flat = padded.reshape((b * n,) + tuple(padded.shape[2:]))
    out = ops.gather(flat, rows_c * n + pos, 0)
    mask = real.reshape((num_tokens,) + (1,) * (padded.ndim - 2)).astype(padded.dtype)
    return out * mask


def time_buckets(dt, num_buckets: int):
    """Bucket of a time gap: clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_buckets)."""
    gap = ops.maximum(ops.abs(dt), ops.ones_like(dt)).astype(ms.float32)
    b = ops.floor(ops.log(gap) / TIME_BUCKET_DIV)
    return ops.clip(b, 0.0, float(num_buckets)).astype(ms.int32)


def _causal(max_len: int):
    """[N, N] float mask: key j <= query i."""
    pos = ops.arange(max_len, dtype=ms.int32)
    return (pos[None, :] <= pos[:, None]).astype(ms.float32)


def _causal_valid(offsets, max_len: int):
    """[B, 1, N, N] float mask: key j <= query i and both inside the row."""
    _, valid = padded_index(offsets, max_len)
    pos = ops.arange(max_len, dtype=ms.int32)
    causal = pos[None, :] <= pos[:, None]                       # [N(i), N(j)]
    both = ops.logical_and(valid[:, :, None], valid[:, None, :])
    # expand_dims, not [:, None]: a strided copy on CPU (docs/ARCHITECTURE.md, platform facts)
    return ops.expand_dims(ops.logical_and(both, causal[None]).astype(ms.float32), 1)


def default_request_times(offsets, timestamps, max_len: int):
    """[B] int64: each row's last kept token's own time (0 for an empty row). As request times it gives
    the convention MindGR used before request times existed: the last position's query time is its own."""
    starts, ends = offsets[:-1].astype(ms.int32), offsets[1:].astype(ms.int32)
    last = ops.minimum(ends, starts + max_len) - 1
    nonempty = ends > starts
    idx = ops.clip(last, 0, timestamps.shape[0] - 1)
    times = ops.gather(timestamps, idx, 0)
    return ops.where(nonempty, times, ops.zeros_like(times))


def time_bias(offsets, timestamps, w_ts, max_len: int, request_times=None):
    """Bucketed-time bias [B, 1, N, N]: w_ts[bucket(tq_i - t_j)] with the query time tq_i = t_{i+1}, and at
    each row's last position (i = L - 1, L cut to N) the row's request time (request_times [B] int64;
    None = that position's own time, default_request_times)."""
    n = max_len
    pos = ops.arange(n, dtype=ms.int32)
    ts = jagged_to_padded(timestamps, offsets, n)               # [B, N] int64
    lengths = ops.minimum((offsets[1:] - offsets[:-1]).astype(ms.int32), ops.full_like(offsets[1:], n).astype(ms.int32))
    if request_times is None:
        request_times = default_request_times(offsets, timestamps, n)
    req = request_times.astype(ts.dtype)
    # The query at i looks at the time of the next event t_{i+1}; the last position at the request time
    # (the time of the event being predicted).
    nxt = ops.concat((ts[:, 1:], ts[:, -1:]), 1)
    has_next = (pos[None, :] + 1) < lengths[:, None]
    tq = ops.where(has_next, nxt, ops.broadcast_to(req[:, None], ts.shape))
    buckets = time_buckets(tq[:, :, None] - ts[:, None, :], w_ts.shape[0] - 1)
    b = buckets.shape[0]
    return ops.gather(w_ts, buckets.reshape(-1), 0).reshape(b, 1, n, n)


def position_bias(w_pos, max_len: int):
    """Relative position bias [1, 1, N, N]: w_pos[N-1+j-i]."""
    n = max_len
    pos = ops.arange(n, dtype=ms.int32)
    rel = n - 1 + pos[None, :] - pos[:, None]                   # [N, N], in [0, 2N-2]
    return ops.gather(w_pos, rel.reshape(-1), 0).reshape(1, 1, n, n)


def hstu_bias(offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """Relative attention bias [B or 1, 1, N, N]: w_pos[N-1+j-i] (+ w_ts[bucket(tq_i - t_j)], time_bias)."""
    bias = position_bias(w_pos, max_len)
    if w_ts is None:
        return bias
    return bias + time_bias(offsets, timestamps, w_ts, max_len, request_times)


def hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """out_i = sum_{j<=i} SiLU(q_i.k_j + rab(i, j)) / N * v_j per row and head. q,k [T,H,dqk], v [T,H,dv]."""
    t = q.shape[0]
    qp = jagged_to_padded(q, offsets, max_len).transpose(0, 2, 1, 3)   # [B, H, N, dqk]
    kp = jagged_to_padded(k, offsets, max_len).transpose(0, 2, 1, 3)
    vp = jagged_to_padded(v, offsets, max_len).transpose(0, 2, 1, 3)   # [B, H, N, dv]
    scores = ops.matmul(qp, kp.transpose(0, 1, 3, 2))                 # [B, H, N, N]
    scores = scores + hstu_bias(offsets, timestamps, w_pos, w_ts, max_len, request_times)
    # Only the causal mask is needed: padded keys have v = 0 and padded queries are dropped on the way back.
    weights = ops.silu(scores) * (_causal(max_len) / float(max_len))
    out = ops.matmul(weights, vp).transpose(0, 2, 1, 3)               # [B, N, H, dv]
    return padded_to_jagged(out, offsets, t)


def bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """The bias-only attention channels of FuXi-alpha over the same v [T, H, dv] -> [T, H, C, dv]:
    channel 0 out_i = sum_{j<=i} w_pos[N-1+j-i] v_j; channel 1 (when w_ts is given, C = 2)
    out_i = sum_{j<=i} w_ts[bucket(tq_i - t_j)] v_j (tq_i as in time_bias). The raw biases are the weights (no SiLU, no /N),
    shared by every head."""
    t, h, dv = v.shape
    vp = jagged_to_padded(v, offsets, max_len)                        # [B, N, H, dv]
    b = vp.shape[0]
    vp = vp.reshape(b, max_len, h * dv)
    causal = _causal(max_len)
    # padded keys have v = 0 and padded queries are dropped on the way back: the causal mask suffices
    pb = position_bias(w_pos, max_len).reshape(1, max_len, max_len)
    channels = [ops.matmul(pb * causal, vp)]                          # [1, N, N] x [B, N, H*dv]
    if w_ts is not None:
        tb = time_bias(offsets, timestamps, w_ts, max_len, request_times).reshape(b, max_len, max_len)
        channels.append(ops.matmul(tb * causal, vp))
    out = ops.stack(channels, 2).reshape(b, max_len, len(channels), h, dv).transpose(0, 1, 3, 2, 4)
    return padded_to_jagged(out, offsets, t)                          # [T, H, C, dv]


def softmax_attention(q, k, v, offsets, max_len: int):
    """Causal softmax attention (SASRec), scaled by 1/sqrt(d). q,k [T,H,d], v [T,H,dv]."""
    t, d = q.shape[0], q.shape[2]
    qp = jagged_to_padded(q, offsets, max_len).transpose(0, 2, 1, 3)
    kp = jagged_to_padded(k, offsets, max_len).transpose(0, 2, 1, 3)
    vp = jagged_to_padded(v, offsets, max_len).transpose(0, 2, 1, 3)
    scores = ops.matmul(qp, kp.transpose(0, 1, 3, 2)) / float(d) ** 0.5
    allowed = _causal_valid(offsets, max_len)
    scores = scores * allowed + (allowed - 1.0) * 1e9
    weights = ops.softmax(scores, -1) * allowed
    out = ops.matmul(weights, vp).transpose(0, 2, 1, 3)
    return padded_to_jagged(out, offsets, t)


def linear_attention(q, k, v, offsets, log_decay, intra, tail, lead):
    """o_t = sum_{j<=t, same row} gamma_h^(t-j) (q_t . k_j) v_j by the chunked form over the flat token
    stream (mindgr.models.linear_attention's docstring): intra-chunk masked products plus the state carried
    between chunks by one [Nc, Nc] decay-matrix product; composed ops, autodiff backward.

    q, k [T, H, dqk]; v [T, H, dv]; offsets [B+1] int32; log_decay [H] float32 (log gamma_h); intra, tail,
    lead: mindgr.models.linear_attention.decay_tables(gamma, C) as tensors (C capped at T).
    -> [T, H, dv], zeros past offsets[-1]."""
    t, h, dqk = q.shape
    dv = v.shape[2]
    num_rows = offsets.shape[0] - 1
    chunk = intra.shape[-1]
    c = min(chunk, t)
    if c < chunk:      # gamma^(i-j), gamma^(i+1) from the start of the tables, gamma^(C-1-j) from the end
        intra, tail, lead = intra[:, :c, :c], tail[:, chunk - c:], lead[:, :c]
    nc = -(-t // c)
    tp = nc * c
    seg = token_rows(offsets, t)                                  # [T] row of each token, B past the end
    if tp > t:                                                    # zero tokens in a row of their own
        pad = tp - t
        q = ops.concat((q, ops.zeros((pad, h, dqk), q.dtype)), 0)
        k = ops.concat((k, ops.zeros((pad, h, dqk), k.dtype)), 0)
        v = ops.concat((v, ops.zeros((pad, h, dv), v.dtype)), 0)
        seg = ops.concat((seg, ops.ones((pad,), seg.dtype) * (num_rows + 1)), 0)
    qc = q.reshape(nc, c, h, dqk).transpose(2, 0, 1, 3)           # [H, Nc, C, dqk]
    kc = k.reshape(nc, c, h, dqk).transpose(2, 0, 1, 3)
    vc = v.reshape(nc, c, h, dv).transpose(2, 0, 1, 3)            # [H, Nc, C, dv]
    segc = seg.reshape(nc, c)

    # intra-chunk: gamma^(i-j) for j <= i in the same row
    same = (segc[:, :, None] == segc[:, None, :]).astype(q.dtype)                # [Nc, C, C]
    scores = ops.matmul(qc, kc.transpose(0, 1, 3, 2)) * (intra[:, None] * same[None])
    out = ops.matmul(scores, vc)                                                 # [H, Nc, C, dv]
    if nc > 1:
        first, last = segc[:, 0], segc[:, c - 1]
        # each chunk's part of its last row's state, decayed to the chunk's end
        w_tail = tail[:, None, :] * (segc == last[:, None]).astype(q.dtype)[None]          # [H, Nc, C]
        kv = ops.matmul((kc * w_tail[..., None]).transpose(0, 1, 3, 2), vc)              # [H, Nc, dqk, dv]
        # the state entering chunk n: chunks m < n that end in chunk n's first row, decayed C*(n-1-m) steps
        ci = ops.arange(nc).astype(ms.float32)
        steps = (ci[:, None] - 1.0 - ci[None, :]) * float(c)
        link = ops.logical_and(steps >= 0, first[:, None] == last[None, :]).astype(q.dtype)
        carry = ops.exp(log_decay.reshape(h, 1, 1) * ops.maximum(steps, 0.0)[None]) * link[None]   # [H, Nc, Nc]
        s_in = ops.matmul(carry, kv.reshape(h, nc, dqk * dv)).reshape(h, nc, dqk, dv)
        # its readout by the tokens of that first row: gamma^(i+1) q_i^T S_in
        w_in = lead[:, None, :] * (segc == first[:, None]).astype(q.dtype)[None]           # [H, Nc, C]
        out = out + ops.matmul(qc, s_in) * w_in[..., None]
    o = out.transpose(1, 2, 0, 3).reshape(tp, h, dv)[:t]
    real = (seg[:t] < num_rows).astype(o.dtype)
    return o * real[:, None, None]


def sampled_logits(out, table, ids, score_all: bool = False):
    """logits[t, r] = out[t] . table[ids[t, r]]: out [T, D], table [V+1, D], ids [T, R] -> [T, R].

    score_all: compute every item's score with one [T, D] x [D, V+1] matmul and pick the sampled columns;
    for a catalogue of a few thousand items that is ~2x faster than materialising [T, R, D] (measured
    on the ML-1M config, docs/ARCHITECTURE.md "Platform facts")."""
    if score_all:
        return ops.gather_elements(ops.matmul(out, table.T), 1, ids)
    return (out[:, None, :] * ops.gather(table, ids, 0)).sum(-1)


_MASKED = -1e9


def sampled_lse(x, table, ids, targets, pos, score_all: bool = False):
    """lse[t] = log(exp(pos[t]) + sum_{r: ids[t, r] != targets[t]} exp(x[t] . table[ids[t, r]])) for
    targets[t] > 0, else 0 (the sampled-softmax tail: accidental hits masked, the positive included):
    sampled_logits + mask + logsumexp, materialising [T, R]. The oracle of the fused CPU kernel."""
    neg = sampled_logits(x, table, ids, score_all)                           # [T, R]
    neg = ops.where(ops.equal(ids, targets[:, None]), ops.full_like(neg, _MASKED), neg)
    lse = ops.logsumexp(ops.concat((pos[:, None], neg), 1), 1)
    return ops.where(targets > 0, lse, ops.zeros_like(lse))


def shared_pool_lse(x, cand, logq, cand_ids, targets, pos):
    """lse[t] = log(exp(pos[t]) + sum_{k: ids[k] != 0, ids[k] != targets[t]} exp(x[t] . cand[k] - logq[k]))
    for targets[t] > 0, else 0. Materialises the [T, K] logits with one matmul (in float16 when cand is
    float16, the log-sum-exp in float32): the oracle of the streamed CPU kernel."""
    if cand.dtype == ms.float16:
        neg = ops.matmul(x.astype(ms.float16), cand.T).astype(ms.float32)
    else:
        neg = ops.matmul(x, cand.T)                                          # [T, K]
    neg = neg - logq[None, :]
    drop = ops.logical_or(ops.equal(cand_ids[None, :], targets[:, None]), (cand_ids == 0)[None, :])
    neg = ops.where(drop, ops.full_like(neg, _MASKED), neg)
    lse = ops.logsumexp(ops.concat((pos[:, None], neg), 1), 1)
    return ops.where(targets > 0, lse, ops.zeros_like(lse))


def layer_norm(x, eps: float = 1e-6):
    """LayerNorm over the last axis with no learned scale or shift (HSTU's): (x - mean) / sqrt(var + eps),
    var = mean((x - mean)^2), as ~7 generic MindSpore ops and their gradients (the fused kernels' oracle)."""
    mean = x.mean(-1, keep_dims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keep_dims=True)
    return centered * ops.rsqrt(var + eps)


def gated_layer_norm(u, y, eps: float = 1e-6):
    """u * layer_norm(y): HSTU's gated output u * LayerNorm(A v)."""
    return u * layer_norm(y, eps)


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2, -1) + eps^2): generic Mul, ReduceSum, Add, Sqrt, RealDiv and their gradients."""
    return x / ops.sqrt((x * x).sum(-1, keepdims=True) + eps * eps)


def silu_split(x, widths):
    """split(SiLU(x), widths, axis=-1): the generic SiLU and Split ops and their autodiff gradients."""
    return tuple(ops.split(ops.silu(x), list(widths), axis=-1))


# The backend registry's view of this module (mindgr.ops.backend): every op, runnable anywhere.
PROVIDES = {"hstu_attention": hstu_attention, "bias_attention": bias_attention,
            "softmax_attention": softmax_attention, "linear_attention": linear_attention,
            "jagged_to_padded": jagged_to_padded, "padded_to_jagged": padded_to_jagged,
            "sampled_logits": sampled_logits, "sampled_lse": sampled_lse, "shared_pool_lse": shared_pool_lse,
            "layer_norm": layer_norm, "gated_layer_norm": gated_layer_norm, "silu_split": silu_split,
            "l2_normalize": l2_normalize}


def unavailable_reason():
    return None
