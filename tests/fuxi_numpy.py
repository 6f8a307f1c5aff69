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


# ------------------------------------------------------------------------------------------------
# A second, independent form: the published implementation's padded formulation (one [B, N, N]
# attention map per channel, the time gaps from the "next time" convention on a padded [B, N + 1]
# time array whose slot after each row holds its request time), written from the equations and
# sharing nothing with the loops above but silu/bucket. It returns every intermediate tensor so a
# test can compare MindGR's block with it one tensor at a time.

def _pad(vals, offsets, n):
    b = len(offsets) - 1
    out = np.zeros((b, n) + vals.shape[1:], np.float64)
    for r in range(b):
        s, e = int(offsets[r]), int(offsets[r + 1])
        out[r, : e - s] = vals[s:e]
    return out


def _unpad(padded, offsets, t):
    out = np.zeros((t,) + padded.shape[2:], np.float64)
    for r in range(len(offsets) - 1):
        s, e = int(offsets[r]), int(offsets[r + 1])
        out[s:e] = padded[r, : e - s]
    return out


def dense_block(x, offsets, timestamps, p, h, dqk, dv, n, request_times=None):
    """-> dict of u, v, q, k [T, ...], pos, ts, sem [T, H, dv], a [T, C*H*dv], o, hid, y [T, .]."""
    t, b = x.shape[0], len(offsets) - 1
    c = 3 if p["w_ts"] is not None else 2
    z = silu(rms_norm(x) @ p["w_uvqk"])
    cw = c * h * dv
    u, v, q, k = np.split(z, [cw, cw + h * dv, cw + h * dv + h * dqk], axis=1)
    vp = _pad(v.reshape(t, h, dv), offsets, n)                       # [B, N, H, dv]
    qp, kp = _pad(q.reshape(t, h, dqk), offsets, n), _pad(k.reshape(t, h, dqk), offsets, n)
    causal = np.tril(np.ones((n, n)))
    idx = np.arange(n)
    pos_map = p["w_pos"][n - 1 + idx[None, :] - idx[:, None]] * causal          # [N, N]
    sem_map = silu(np.einsum("bihd,bjhd->bhij", qp, kp)) / n * causal            # [B, H, N, N]
    out = {"u": u, "v": v, "q": q, "k": k,
           "pos": _unpad(np.einsum("ij,bjhd->bihd", pos_map, vp), offsets, t),
           "sem": _unpad(np.einsum("bhij,bjhd->bihd", sem_map, vp), offsets, t)}
    chans = [out["pos"]]
    if p["w_ts"] is not None:
        ext = np.zeros((b, n + 1), np.int64)                          # the time after each position
        for r in range(b):
            s, e = int(offsets[r]), int(offsets[r + 1])
            ext[r, : e - s] = timestamps[s:e]
            ext[r, e - s] = timestamps[e - 1] if request_times is None and e > s else (
                request_times[r] if request_times is not None else 0)
        nb = len(p["w_ts"]) - 1
        gaps = ext[:, 1:, None] - ext[:, None, :-1]                   # tq_i - t_j, [B, N, N]
        ts_map = p["w_ts"][np.vectorize(lambda g: bucket(g, nb))(gaps)] * causal
        out["ts"] = _unpad(np.einsum("bij,bjhd->bihd", ts_map, vp), offsets, t)
        chans.append(out["ts"])
    chans.append(out["sem"])
    out["a"] = np.stack(chans, 2).reshape(t, cw)                      # per head: pos, ts, sem
    out["o"] = u * rms_norm(out["a"])
    out["hid"] = x + out["o"] @ p["w_o"] + p["b_o"]
    g = rms_norm(out["hid"])
    out["y"] = out["hid"] + (silu(g @ p["w_1"] + p["b_1"]) * (g @ p["w_2"] + p["b_2"])) @ p["w_3"] + p["b_3"]
    return out
