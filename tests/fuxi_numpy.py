"""An independent numpy implementation of the FuXi-alpha block (mindgr/models/fuxi.py docstring), loop by
loop over rows, queries and keys, for tests. Shares silu, the time bucket and the query-time convention
(hstu_numpy.query_time) with hstu_numpy."""
import numpy as np

from hstu_numpy import bucket, l2_normalize, query_time, silu


def rms_norm(x, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def channels(v, q, k, offsets, timestamps, w_pos, w_ts, n, request_times=None):
    """Per token and head: positional, temporal (if w_ts is not None), semantic outputs -> [T, H, C, dv]."""
    t, h, dv = v.shape
    c = 3 if w_ts is not None else 2
    out = np.zeros((t, h, c, dv))
    for b in range(len(offsets) - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        length = e - s
        for i in range(length):
            tq = query_time(timestamps, s, i, length, b, request_times)
            for j in range(i + 1):
                out[s + i, :, 0] += w_pos[n - 1 + j - i] * v[s + j]
                if w_ts is not None:
                    out[s + i, :, 1] += w_ts[bucket(tq - timestamps[s + j], len(w_ts) - 1)] * v[s + j]
                for hh in range(h):
                    out[s + i, hh, c - 1] += silu(q[s + i, hh] @ k[s + j, hh]) / n * v[s + j, hh]
    return out


def fuxi_block(x, offsets, timestamps, p, h, dqk, dv, n, drop_attn=None, drop_ffn=None, request_times=None):
    """p: w_uvqk, w_pos, w_ts (or None), w_o, b_o, w_1, b_1, w_2, b_2, w_3, b_3."""
    t = x.shape[0]
    c = 3 if p["w_ts"] is not None else 2
    z = silu(rms_norm(x) @ p["w_uvqk"])
    cw = c * h * dv
    u = z[:, :cw]
    v = z[:, cw: cw + h * dv].reshape(t, h, dv)
    q = z[:, cw + h * dv: cw + h * dv + h * dqk].reshape(t, h, dqk)
    k = z[:, cw + h * dv + h * dqk:].reshape(t, h, dqk)
    a = channels(v, q, k, offsets, timestamps, p["w_pos"], p["w_ts"], n, request_times).reshape(t, cw)
    o = u * rms_norm(a)
    if drop_attn is not None:
        o = o * drop_attn[:, :cw]
    hid = x + o @ p["w_o"] + p["b_o"]
    g = rms_norm(hid)
    if drop_ffn is not None:
        g = g * drop_ffn[:, : g.shape[1]]
    gate = silu(g @ p["w_1"] + p["b_1"]) * (g @ p["w_2"] + p["b_2"])
    return hid + gate @ p["w_3"] + p["b_3"]


def fuxi_encoder(ids, positions, offsets, timestamps, item_emb, pos_emb, blocks, h, dqk, dv, n, drop=None,
                 request_times=None):
    """x = item_emb[ids] * sqrt(D) + pos_emb[positions] (times drop[0]); blocks (block i uses drop[1 + 2i],
    drop[2 + 2i]); rows L2-normalised. blocks: list of parameter dicts as for fuxi_block."""
    x = item_emb[ids] * np.sqrt(item_emb.shape[1]) + pos_emb[positions]
    if drop is not None:
        x = x * drop[0][:, : x.shape[1]]
    for i, p in enumerate(blocks):
        x = fuxi_block(x, offsets, timestamps, p, h, dqk, dv, n,
                       None if drop is None else drop[1 + 2 * i], None if drop is None else drop[2 + 2 * i],
                       request_times)
    return l2_normalize(x)
