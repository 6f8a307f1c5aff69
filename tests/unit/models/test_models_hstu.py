"""HSTUBlock and the HSTU encoder against the independent float64 numpy implementation (hstu_numpy.py).

Batches are jagged with fixed capacities (T_cap = 12 tokens, B_cap = 4 rows, N = 4): every layout holds
an empty row, a length-1 row and a length-N row, and leaves a non-empty unused tail. Timestamps are int64
around 1.6e9 s with ties (zero gaps), gaps that clamp to the last bucket, and a few negative gaps.
Parameters are redrawn at O(1) scale (not the tiny training init) so that every term is exercised.

Tolerances (MindSpore runs in float32, numpy in float64):
  * forward: |y_ms - y_np| <= 1e-5 + 1e-4 |y_np| elementwise (typical error ~1e-6; a sweep over 72 random
    batches peaked at 1/4 of the tolerance, where LayerNorm(A v) sees a small variance);
  * gradients: for random directions d, |<g_ms, d> - fd| <= 3e-4 * sum|g_ms * d| + 1e-6, where
    fd = (f(p + eps d) - f(p - eps d)) / (2 eps) on the float64 numpy implementation, eps = 1e-5
    (fd error ~1e-9; float32 error typically ~1e-6 relative, peaking at ~5e-5 in the same sweep).
    h * dv = 4 or 8: with a LayerNorm over only 2 values (h = 1, dv = 2) it is nearly a sign function
    and float32 gradients lose ~3 digits to cancellation;
  * tail tokens: the gradient w.r.t. a tail token is exactly the cotangent (its residual path), i.e. the
    attention/LayerNorm path contributes exactly 0; real outputs are bitwise independent of tail values;
  * encoder: output rows have norm 1 within 1e-5; dropout masks of ones reproduce drop=None to 1e-6.
"""

import numpy as np
import pytest

from mindspore import Tensor  # noqa: E402

import hstu_numpy as hn  # noqa: E402
from block_grad import BlockGrad, check_directional_grads  # noqa: E402
from mindgr.models.hstu import HSTU, HSTUBlock  # noqa: E402

N, D, DQK, DV, NB = 4, 8, 3, 4, 16
T_CAP, B_CAP = 12, 4
# Row lengths per layout: the empty row first, in the middle and last (repeated final offset).
LAYOUTS = [[0, 4, 1, 3], [2, 1, 0, 4], [4, 1, 3, 0]]


pytestmark = pytest.mark.graph_mode("reference")




def make_batch(rng, lengths):
    lengths = np.asarray(lengths)
    assert lengths.sum() < T_CAP and 0 in lengths and 1 in lengths and N in lengths
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    gaps = rng.choice([0, 1, 2, 3, 5, 9, 30, 200, 10 ** 6], p=[.3, .1, .1, .1, .1, .1, .1, .05, .05], size=T_CAP)
    gaps = gaps * np.where(rng.random(T_CAP) < 0.1, -1, 1)
    longest = int(offsets[list(lengths).index(N)])
    gaps[longest + rng.integers(1, N)] = 10 ** 6  # inside the length-N row: beyond the last bucket
    ts = (1_600_000_000 + np.cumsum(gaps)).astype(np.int64)
    return offsets, ts


def block_params(block):
    """{short name: Parameter} of an HSTUBlock (names may carry cell prefixes)."""
    return {p.name.split(".")[-1]: p for p in block.trainable_params()}


def randomize(block, rng):
    scales = {"w_uvqk": 0.6, "w_pos": 0.5, "w_ts": 0.5, "w_out": 0.4, "b_out": 0.1}
    values = {}
    for name, p in block_params(block).items():
        v = (rng.standard_normal(p.shape) * scales[name]).astype(np.float32)
        p.set_data(Tensor(v))
        values[name] = v.astype(np.float64)
    values.setdefault("w_ts", None)
    return values


def numpy_block(p, offsets, ts, h):
    return hn.hstu_layer(p["x"], offsets, ts, p["w_uvqk"], p["w_pos"], p["w_ts"], p["w_out"], p["b_out"],
                         h, DQK, DV, N)


@pytest.mark.parametrize("h,time_bias", [(1, True), (2, True), (1, False), (2, False)])
def test_block_forward_and_gradients_match_numpy(h, time_bias):
    rng = np.random.default_rng([7, h, int(time_bias)])
    block = HSTUBlock(rng, D, h, DQK, DV, N, NB, time_bias, "blk")
    assert (block.w_ts is None) == (not time_bias)
    grad_cell = BlockGrad(block)
    names = [p.name.split(".")[-1] for p in grad_cell.weights]
    for lengths in LAYOUTS:
        values = randomize(block, rng)
        offsets, ts = make_batch(rng, lengths)
        total = int(offsets[-1])
        x = rng.standard_normal((T_CAP, D)).astype(np.float32)
        c = rng.standard_normal((T_CAP, D)).astype(np.float32)
        (f, y), (gx, gw) = grad_cell(Tensor(x), Tensor(offsets), Tensor(ts), Tensor(c))
        y, gx = y.asnumpy(), gx.asnumpy()
        grads = {"x": gx, **{n: g.asnumpy() for n, g in zip(names, gw)}}
        assert set(grads) == {"x", "w_uvqk", "w_pos", "w_out", "b_out"} | ({"w_ts"} if time_bias else set())

        # Forward, all T_cap tokens (the tail of the oracle is x + b_out).
        p = dict(values, x=x.astype(np.float64))
        y_np = numpy_block(p, offsets, ts, h)
        np.testing.assert_allclose(y, y_np, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(f.asnumpy()), (y_np * c).sum(), rtol=1e-4, atol=1e-4)

        # Gradients: directional derivatives against central differences of the float64 oracle.
        c64 = c.astype(np.float64)

        def objective(q):
            return float((numpy_block(q, offsets, ts, h) * c64).sum())

        check_directional_grads(objective, p, grads, rng, directions=2, context=(lengths,))

        # Tail tokens: only the residual path reaches them, exactly.
        assert total < T_CAP
        np.testing.assert_array_equal(gx[total:], c[total:])
        assert np.abs(gx[:total] - c[:total]).max() > 1e-3  # real tokens do get the attention path

        # Real outputs do not depend on what the tail holds.
        x2 = x.copy()
        x2[total:] = rng.standard_normal((T_CAP - total, D)) * 10
        ts2 = ts.copy()
        ts2[total:] = ts2[total:] - 7 * 10 ** 6
        (_, y2), _ = grad_cell(Tensor(x2), Tensor(offsets), Tensor(ts2), Tensor(c))
        np.testing.assert_array_equal(y2.asnumpy()[:total], y[:total])


def _encoder_numpy_params(enc):
    p = {q.name: q.asnumpy().astype(np.float64) for q in enc.trainable_params()}
    blocks = [(p[f"blocks.{i}.w_uvqk"], p[f"blocks.{i}.w_pos"], p.get(f"blocks.{i}.w_ts"),
               p[f"blocks.{i}.w_out"], p[f"blocks.{i}.b_out"]) for i in range(enc.num_blocks)]
    return p["item_emb"], p["pos_emb"], blocks


def test_encoder_unit_rows_and_dropout_masks():
    rng = np.random.default_rng(11)
    num_items, h, blocks = 15, 2, 2
    enc = HSTU(num_items, D, blocks, h, DQK, DV, N, dropout=0.2, time_bias=True, num_time_buckets=NB, seed=3)
    for blk in enc.blocks:
        randomize(blk, rng)
    offsets, ts = make_batch(rng, LAYOUTS[0])
    total = int(offsets[-1])
    ids = rng.integers(1, num_items + 1, T_CAP).astype(np.int32)
    ids[total:] = 0
    lengths = np.diff(offsets)
    positions = np.zeros(T_CAP, np.int32)
    positions[:total] = np.concatenate([np.arange(n) for n in lengths])
    args = (Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(ts))

    out = enc(*args).asnumpy()
    assert out.shape == (T_CAP, D)
    np.testing.assert_allclose(np.linalg.norm(out[:total], axis=1), 1.0, atol=1e-5)

    item_emb, pos_emb, np_blocks = _encoder_numpy_params(enc)
    ref = hn.hstu_encoder(ids, positions, offsets, ts, item_emb, pos_emb, np_blocks, h, DQK, DV, N)
    np.testing.assert_allclose(out[:total], ref[:total], rtol=1e-4, atol=1e-5)

    shape = (enc.dropout_sites, T_CAP, enc.dropout_width)
    assert shape == (1 + blocks, T_CAP, max(D, h * DV))
    ones = enc(*args, Tensor(np.ones(shape, np.float32))).asnumpy()
    np.testing.assert_allclose(ones, out, rtol=0, atol=1e-6)

    # A real mask (0 or 1/(1-p)) changes the output, exactly as the oracle with the same mask.
    mask = ((rng.random(shape) >= 0.2) / 0.8).astype(np.float32)
    dropped = enc(*args, Tensor(mask)).asnumpy()
    ref_d = hn.hstu_encoder(ids, positions, offsets, ts, item_emb, pos_emb, np_blocks, h, DQK, DV, N,
                            drop=mask.astype(np.float64))
    np.testing.assert_allclose(dropped[:total], ref_d[:total], rtol=1e-4, atol=1e-5)
    assert np.abs(dropped[:total] - out[:total]).max() > 1e-2


def test_request_time_changes_only_each_rows_last_output():
    """model.request_time: the encoder matches the numpy published convention (the last position's
    time bias at the row's request time); moving the request times changes exactly the rows' last
    outputs, bit for bit nothing else; a model without the switch ignores them."""
    rng = np.random.default_rng(5)
    num_items, h = 15, 2
    encoders = [HSTU(num_items, D, 2, h, DQK, DV, N, dropout=0.0, time_bias=True, num_time_buckets=NB, seed=3,
                     request_time=on) for on in (True, False)]
    for enc in encoders:
        block_rng = np.random.default_rng(9)
        for blk in enc.blocks:
            randomize(blk, block_rng)
    offsets, ts = make_batch(rng, LAYOUTS[1])
    total, lengths = int(offsets[-1]), np.diff(offsets)
    ids = rng.integers(1, num_items + 1, T_CAP).astype(np.int32)
    ids[total:] = 0
    positions = np.zeros(T_CAP, np.int32)
    positions[:total] = np.concatenate([np.arange(n) for n in lengths])
    last_time = np.where(lengths > 0, ts[np.maximum(offsets[1:] - 1, 0)], 0)
    req = last_time + np.array([0, 40, 0, 10 ** 5])             # equal to / later than the last time
    args = (Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(ts), None)
    with_req = encoders[0](*args, Tensor(req.astype(np.int64))).asnumpy()
    item_emb, pos_emb, np_blocks = _encoder_numpy_params(encoders[0])
    ref = hn.hstu_encoder(ids, positions, offsets, ts, item_emb, pos_emb, np_blocks, h, DQK, DV, N,
                          request_times=req)
    np.testing.assert_allclose(with_req[:total], ref[:total], rtol=1e-4, atol=1e-5)
    later = encoders[0](*args, Tensor((req + 10 ** 6).astype(np.int64))).asnumpy()
    last = offsets[1:][lengths > 0] - 1
    others = np.setdiff1d(np.arange(T_CAP), last)
    assert np.array_equal(later[others], with_req[others])
    near = offsets[1:][(lengths > 0) & (req - last_time < 100)] - 1    # below the clamped last bucket
    assert len(near) >= 2 and (np.abs(later[near] - with_req[near]).max(1) > 1e-4).all()
    off = encoders[1](*args, Tensor(req.astype(np.int64))).asnumpy()
    ref_off = hn.hstu_encoder(ids, positions, offsets, ts, item_emb, pos_emb, np_blocks, h, DQK, DV, N)
    np.testing.assert_allclose(off[:total], ref_off[:total], rtol=1e-4, atol=1e-5)
    assert np.array_equal(encoders[1](*args, Tensor((req + 10 ** 6).astype(np.int64))).asnumpy(), off)
