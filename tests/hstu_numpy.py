"""An independent numpy implementation of the published HSTU formulas, loop by loop, for tests."""
import numpy as np


def silu(x):
    return x / (1.0 + np.exp(-x))


def layer_norm(x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def bucket(dt, num_buckets):
    gap = max(abs(int(dt)), 1)
    return int(min(max(np.floor(np.log(gap) / 0.301), 0), num_buckets))


def query_time(timestamps, s, i, length, b, request_times):
    """The published HSTU convention: query i looks at the time of the event it predicts, t_{i+1}; at
    the row's last position that event is the target, whose time is the row's request time
    (request_times[b]). request_times=None: MindGR's earlier convention, the last position's own time."""
    if i + 1 < length:
        return timestamps[s + i + 1]
    return timestamps[s + i] if request_times is None else request_times[b]


def hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, n, request_times=None):
    """Loops over rows, heads, queries and keys: out_i = sum_{j<=i} SiLU(q.k + rab) / N * v_j."""
    t, h, _ = q.shape
    out = np.zeros((t, h, v.shape[2]), np.float64)
    for b in range(len(offsets) - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        length = e - s
        for i in range(length):
            tq = query_time(timestamps, s, i, length, b, request_times)
            for j in range(i + 1):
                rab = w_pos[n - 1 + j - i]
                if w_ts is not None:
                    rab += w_ts[bucket(tq - timestamps[s + j], len(w_ts) - 1)]
                for hh in range(h):
                    a = silu(q[s + i, hh] @ k[s + j, hh] + rab) / n
                    out[s + i, hh] += a * v[s + j, hh]
    return out


def hstu_layer(x, offsets, timestamps, w_uvqk, w_pos, w_ts, w_out, b_out, h, dqk, dv, n, drop_mask=None,
               request_times=None):
    """y = x + Linear(u * LayerNorm(attn(...))), with u,v,q,k = split(SiLU(LayerNorm(x) @ W)).

    drop_mask (optional, [T, >= h*dv]) multiplies u * LayerNorm(attn) before the output projection."""
    t = x.shape[0]
    z = silu(layer_norm(x) @ w_uvqk)
    u = z[:, : h * dv]
    v = z[:, h * dv: 2 * h * dv].reshape(t, h, dv)
    q = z[:, 2 * h * dv: 2 * h * dv + h * dqk].reshape(t, h, dqk)
    k = z[:, 2 * h * dv + h * dqk:].reshape(t, h, dqk)
    a = hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, n, request_times).reshape(t, h * dv)
    o = u * layer_norm(a)
    if drop_mask is not None:
        o = o * drop_mask[:, : o.shape[1]]
    return x + o @ w_out + b_out


def l2_normalize(x, eps=1e-6):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps * eps)


def hstu_encoder(ids, positions, offsets, timestamps, item_emb, pos_emb, blocks, h, dqk, dv, n, drop=None,
                 request_times=None):
    """x = item_emb[ids] * sqrt(D) + pos_emb[positions] (times drop[0]); HSTU layers (block i uses
    drop[i + 1]); rows L2-normalised. blocks: list of (w_uvqk, w_pos, w_ts or None, w_out, b_out)."""
    x = item_emb[ids] * np.sqrt(item_emb.shape[1]) + pos_emb[positions]
    if drop is not None:
        x = x * drop[0][:, : x.shape[1]]
    for i, (w_uvqk, w_pos, w_ts, w_out, b_out) in enumerate(blocks):
        x = hstu_layer(x, offsets, timestamps, w_uvqk, w_pos, w_ts, w_out, b_out, h, dqk, dv, n,
                       None if drop is None else drop[i + 1], request_times)
    return l2_normalize(x)
