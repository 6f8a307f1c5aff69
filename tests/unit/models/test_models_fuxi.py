"""FuXi-alpha (mindgr/models/fuxi.py) against the independent float64 numpy implementation (fuxi_numpy.py),
on the reference backend and on the C++ kernels; the registry seam (build, encoder_flops); training.

Batches as in test_models_hstu.py: T_cap = 12 tokens, B_cap = 4 rows, N = 4, with an empty row, a length-1
row, a length-N row and an unused tail. Time gaps are small integers or clamp to the last of 16 buckets, so
no gap sits near a bucket edge (the temporal weights are raw w_ts entries: an edge case would show in full).
Tolerances as in test_models_hstu.py: forward 1e-5 + 1e-4 relative; gradients as directional derivatives
against central differences of the float64 oracle, |<g, d> - fd| <= 3e-4 * sum|g * d| + 1e-6.
"""
import json
import shutil

import numpy as np
import pytest

from mindspore import Tensor, nn  # noqa: E402

import fuxi_numpy as fn  # noqa: E402
from block_grad import BlockGrad, check_directional_grads  # noqa: E402
from mindgr.config import ConfigError, load_config  # noqa: E402
from mindgr.models import build_encoder, fuxi  # noqa: E402
from mindgr.models.fuxi import FuXiAlpha, FuXiBlock  # noqa: E402
from mindgr.ops import set_backend  # noqa: E402

N, D, DQK, DV, NB, FFN = 4, 8, 3, 4, 16, 2
T_CAP = 12
LAYOUTS = [[0, 4, 1, 3], [2, 1, 0, 4], [4, 1, 3, 0]]
HAVE_CXX = shutil.which("g++") is not None
BACKENDS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not HAVE_CXX, reason="g++ not found"))]


pytestmark = pytest.mark.graph_mode("reference")


def make_batch(rng, lengths):
    lengths = np.asarray(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    gaps = rng.choice([0, 1, 2, 3, 5, 9, 30, 10 ** 6], p=[.3, .1, .1, .1, .1, .1, .15, .05], size=T_CAP)
    gaps = gaps * np.where(rng.random(T_CAP) < 0.1, -1, 1)
    return offsets, (1_600_000_000 + np.cumsum(gaps)).astype(np.int64)


def short(p):
    return p.name.split(".")[-1]


def randomize(block, rng):
    values = {}
    for p in block.trainable_params():
        scale = 0.5 if short(p).startswith("w_") else 0.1
        v = (rng.standard_normal(p.shape) * scale).astype(np.float32)
        p.set_data(Tensor(v))
        values[short(p)] = v.astype(np.float64)
    values.setdefault("w_ts", None)
    return values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h,time_bias", [(1, True), (2, True), (2, False)])
def test_block_forward_and_gradients_match_numpy(backend, h, time_bias):
    set_backend(backend)
    rng = np.random.default_rng([5, h, int(time_bias)])
    block = FuXiBlock(rng, D, h, DQK, DV, N, NB, time_bias, D * FFN, "blk")
    grad_cell = BlockGrad(block)
    names = [short(p) for p in grad_cell.weights]
    expected = {"w_uvqk", "w_pos", "w_o", "b_o", "w_1", "b_1", "w_2", "b_2", "w_3", "b_3"}
    assert set(names) == expected | ({"w_ts"} if time_bias else set())
    for lengths in LAYOUTS:
        values = randomize(block, rng)
        offsets, ts = make_batch(rng, lengths)
        total = int(offsets[-1])
        x = rng.standard_normal((T_CAP, D)).astype(np.float32)
        c = rng.standard_normal((T_CAP, D)).astype(np.float32)
        (_, y), (gx, gw) = grad_cell(Tensor(x), Tensor(offsets), Tensor(ts), Tensor(c))
        grads = {"x": gx.asnumpy(), **{n: g.asnumpy() for n, g in zip(names, gw)}}
        p = dict(values, x=x.astype(np.float64))

        def oracle(q):
            return fn.fuxi_block(q["x"], offsets, ts, q, h, DQK, DV, N)

        np.testing.assert_allclose(y.asnumpy(), oracle(p), rtol=1e-4, atol=1e-5)
        c64 = c.astype(np.float64)
        check_directional_grads(lambda q: float((oracle(q) * c64).sum()), p, grads, rng, directions=2,
                                context=(lengths,))
        # the attention channels reach real tokens only: a tail token is a plain residual + FFN token
        x2 = x.copy()
        x2[total:] = rng.standard_normal((T_CAP - total, D)) * 10
        (_, y2), _ = grad_cell(Tensor(x2), Tensor(offsets), Tensor(ts), Tensor(c))
        np.testing.assert_array_equal(y2.asnumpy()[:total], y.asnumpy()[:total])


def _numpy_blocks(enc):
    blocks = []
    for blk in enc.blocks:
        p = {short(q): q.asnumpy().astype(np.float64) for q in blk.trainable_params()}
        p.setdefault("w_ts", None)
        blocks.append(p)
    return blocks


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_matches_numpy_with_and_without_dropout_masks(backend):
    set_backend(backend)
    rng = np.random.default_rng(11)
    num_items, h, num_blocks = 15, 2, 2
    enc = FuXiAlpha(num_items, D, num_blocks, h, DQK, DV, N, dropout=0.2, time_bias=True, num_time_buckets=NB,
                    ffn_multiply=FFN, seed=3)
    for blk in enc.blocks:
        randomize(blk, rng)
    offsets, ts = make_batch(rng, LAYOUTS[0])
    total = int(offsets[-1])
    ids = rng.integers(1, num_items + 1, T_CAP).astype(np.int32)
    ids[total:] = 0
    positions = np.zeros(T_CAP, np.int32)
    positions[:total] = np.concatenate([np.arange(n) for n in np.diff(offsets)])
    args = (Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(ts))
    item_emb, pos_emb = enc.item_emb.asnumpy().astype(np.float64), enc.pos_emb.asnumpy().astype(np.float64)
    assert enc.item_emb.name == "item_emb"

    out = enc(*args).asnumpy()
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    ref = fn.fuxi_encoder(ids, positions, offsets, ts, item_emb, pos_emb, _numpy_blocks(enc), h, DQK, DV, N)
    np.testing.assert_allclose(out[:total], ref[:total], rtol=1e-4, atol=1e-5)

    shape = (enc.dropout_sites, T_CAP, enc.dropout_width)
    assert shape == (1 + 2 * num_blocks, T_CAP, max(D, 3 * h * DV))
    np.testing.assert_allclose(enc(*args, Tensor(np.ones(shape, np.float32))).asnumpy(), out, rtol=0, atol=1e-6)
    mask = ((rng.random(shape) >= 0.2) / 0.8).astype(np.float32)
    dropped = enc(*args, Tensor(mask)).asnumpy()
    ref_d = fn.fuxi_encoder(ids, positions, offsets, ts, item_emb, pos_emb, _numpy_blocks(enc), h, DQK, DV, N,
                            drop=mask.astype(np.float64))
    np.testing.assert_allclose(dropped[:total], ref_d[:total], rtol=1e-4, atol=1e-5)
    assert np.abs(dropped[:total] - out[:total]).max() > 1e-2
    np.testing.assert_allclose(enc.item_table().asnumpy(),
                               item_emb / np.linalg.norm(item_emb, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_build_follows_the_config(tmp_path):
    cfg = load_config(None, ["model.arch=fuxi", "model.dim=12", "model.num_heads=2", "model.num_blocks=3",
                             "model.ffn_multiply=3", "model.time_bias=false", "model.dv=5"])
    enc = build_encoder(cfg.model, num_items=30, max_len=7, seed=0)
    assert isinstance(enc, FuXiAlpha) and len(enc.blocks) == 3
    blk = enc.blocks[0]
    assert blk.w_ts is None and blk.channels == 2
    assert tuple(blk.w_uvqk.shape) == (12, 2 * 2 * 5 + 2 * 5 + 2 * 2 * 6)
    assert tuple(blk.w_o.shape) == (2 * 2 * 5, 12) and tuple(blk.w_1.shape) == (12, 36)
    assert tuple(enc.item_emb.shape) == (31, 12) and enc.dropout_sites == 7
    drawn = []

    def init(rng, shape, std):
        drawn.append(shape)
        return np.zeros(shape, np.float32)

    fuxi.build(cfg.model, 30, 7, 0, item_init=init)
    assert drawn == [(31, 12)]
    with pytest.raises(ConfigError, match="model.ffn_multiply"):
        load_config(None, ["model.ffn_multiply=0"])


def test_encoder_flops_counts_every_term():
    """The count against a sum written out per matmul and per attended pair."""
    cfg = load_config(None, ["model.arch=fuxi", "model.dim=10", "model.num_heads=2", "model.dqk=3",
                             "model.dv=4", "model.num_blocks=2", "model.ffn_multiply=2"])
    lengths = np.array([0, 1, 5, 3])
    d, h, dqk, dv, f = 10, 2, 3, 4, 20
    want = 0.0
    for length in lengths:
        for i in range(length):
            want += 2 * d * (3 * h * dv + h * dv + 2 * h * dqk)       # uvqk
            want += 2 * 3 * h * dv * d + 2 * d * f * 2 + 2 * f * d    # W_o, W_1 and W_2, W_3
            for _ in range(i + 1):                                      # keys j <= i
                want += h * (2 * dqk + 2 * dv) + 2 * (2 * h * dv)       # semantic; positional + temporal
    assert fuxi.encoder_flops(cfg.model, lengths) == pytest.approx(2 * want, rel=1e-12)
    cfg.model.time_bias = False
    assert fuxi.encoder_flops(cfg.model, lengths) < fuxi.encoder_flops(
        load_config(None, ["model.arch=fuxi", "model.dim=10", "model.num_heads=2", "model.dqk=3", "model.dv=4",
                           "model.num_blocks=2", "model.ffn_multiply=2"]).model, lengths)


def test_fuxi_trains_and_its_mfu_counts_fuxi_flops(tmp_path, tiny_overrides, monkeypatch):
    """The normal training path (cpu kernels when they build), and the logged MFU uses the FuXi count."""
    from mindgr.train import trainer as trainer_mod
    from mindgr.train.local import LocalExecutor
    from mindgr.train.loop import TrainLoop
    from mindgr.train.flops import train_flops
    backend = "cpu" if HAVE_CXX else "reference"
    cfg = load_config(None, tiny_overrides + ["model.arch=fuxi", "model.ffn_multiply=2", f"ops.backend={backend}",
                                              "train.max_steps=4", "run.log_every=1", "eval.every_epochs=0"])
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)
    seen = []
    original = LocalExecutor.execute

    def execute(self, prepared, step):
        loss, step_s, batch = original(self, prepared, step)
        seen.append(train_flops(self.cfg.model, batch["lengths"], batch["targets"],
                                self.task.sampler.negatives.num_candidates) / batch["tokens"])
        return loss, step_s, batch

    monkeypatch.setattr(LocalExecutor, "execute", execute)
    trainer = trainer_mod.Trainer(cfg, quiet=True)
    assert isinstance(trainer.model.encoder, FuXiAlpha)
    result = trainer.fit()
    assert result["test"]["count"] > 0 and np.isfinite(result["test"]["ndcg@10"])
    rows = [json.loads(l) for l in (tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 4 and all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in steps)
    # peak = 1: mfu / tokens_per_s = the window's FLOPs per real token, the FuXi count for that batch
    for r, per_token in zip(steps, seen):
        assert r["mfu"] / r["tokens_per_s"] == pytest.approx(per_token, rel=1e-9)
    hstu = load_config(None, ["model.dim=16", "model.num_heads=2"]).model
    lengths = np.array([10, 7])
    assert train_flops(cfg.model, lengths, 15, 8) != train_flops(hstu, lengths, 15, 8)


def test_fuxi_time_bias_needs_timestamps(tmp_path, tiny_overrides):
    from mindgr.train.data import RunData
    data = tmp_path / "seq.txt"
    data.write_text("".join(f"{u} " + " ".join(str(1 + (u + i) % 9) for i in range(6)) + "\n" for u in range(1, 30)))
    cfg = load_config(None, tiny_overrides + ["model.arch=fuxi", "data.kind=movielens-1m", f"data.path={data}"])
    with pytest.raises(ValueError, match="model.time_bias = true, but data .* has no timestamps"):
        RunData(cfg)


def test_request_time_reaches_the_temporal_channel():
    """model.request_time: FuXi-alpha's temporal channel uses the row's request time at its last
    position, as the numpy reference of the published convention does."""
    set_backend("reference")
    rng = np.random.default_rng(12)
    num_items, h = 15, 2
    enc = FuXiAlpha(num_items, D, 1, h, DQK, DV, N, dropout=0.0, time_bias=True, num_time_buckets=NB,
                    ffn_multiply=FFN, seed=3, request_time=True)
    for blk in enc.blocks:
        randomize(blk, rng)
    offsets, ts = make_batch(rng, LAYOUTS[0])
    total, lengths = int(offsets[-1]), np.diff(offsets)
    ids = rng.integers(1, num_items + 1, T_CAP).astype(np.int32)
    ids[total:] = 0
    positions = np.zeros(T_CAP, np.int32)
    positions[:total] = np.concatenate([np.arange(n) for n in lengths])
    req = np.where(lengths > 0, ts[np.maximum(offsets[1:] - 1, 0)], 0) + np.array([0, 10 ** 5, 7, 0])
    out = enc(Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(ts), None, Tensor(req.astype(np.int64)))
    item_emb, pos_emb = enc.item_emb.asnumpy().astype(np.float64), enc.pos_emb.asnumpy().astype(np.float64)
    ref = fn.fuxi_encoder(ids, positions, offsets, ts, item_emb, pos_emb, _numpy_blocks(enc), h, DQK, DV, N,
                          request_times=req)
    np.testing.assert_allclose(out.asnumpy()[:total], ref[:total], rtol=1e-4, atol=1e-5)
    old = fn.fuxi_encoder(ids, positions, offsets, ts, item_emb, pos_emb, _numpy_blocks(enc), h, DQK, DV, N)
    assert np.abs(ref[:total] - old[:total]).max() > 1e-3     # the request times do matter here


class _Channels(nn.Cell):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def construct(self, x, offsets, timestamps, request_times):
        u, a = self.block.gate_and_channels(x, offsets, timestamps, request_times)
        return u, a, self.block(x, offsets, timestamps, request_times)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("time_bias", [True, False])
def test_block_tensor_by_tensor_against_the_published_padded_form(backend, time_bias):
    """MindGR's block against fuxi_numpy.dense_block (the published implementation's padded [B, N, N]
    maps, written apart from the loop oracle) one tensor at a time: the gate u, each channel of each
    head (positional, temporal, semantic), the block output; then gradients of every parameter and x
    as directional derivatives of the padded form. N = 16 with long-tailed rows (16, 9, 5, 1, 0)."""
    set_backend(backend)
    n, h, t_cap = 16, 2, 36
    rng = np.random.default_rng([21, int(time_bias)])
    block = FuXiBlock(rng, D, h, DQK, DV, n, NB, time_bias, D * FFN, "blk")
    values = randomize(block, rng)
    lengths = [16, 0, 1, 9, 5]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(offsets[-1])
    gaps = rng.choice([0, 1, 2, 3, 5, 9, 30, 10 ** 6], p=[.3, .1, .1, .1, .1, .1, .15, .05], size=t_cap)
    ts = (1_600_000_000 + np.cumsum(gaps * np.where(rng.random(t_cap) < 0.1, -1, 1))).astype(np.int64)
    req = ts[np.maximum(offsets[1:] - 1, 0)] + np.array([7, 0, 10 ** 5, 2, 0])
    x = rng.standard_normal((t_cap, D)).astype(np.float32)
    u, a, y = (r.asnumpy() for r in _Channels(block)(Tensor(x), Tensor(offsets), Tensor(ts), Tensor(req)))
    ref = fn.dense_block(x.astype(np.float64), offsets, ts, values, h, DQK, DV, n, request_times=req)
    c = 3 if time_bias else 2
    np.testing.assert_allclose(u[:total], ref["u"][:total], rtol=1e-5, atol=1e-6)
    per_head = a[:total].reshape(total, h, c, DV)
    names = ["pos", "ts", "sem"] if time_bias else ["pos", "sem"]
    for ch, name in enumerate(names):
        np.testing.assert_allclose(per_head[:, :, ch], ref[name][:total], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(y[:total], ref["y"][:total], rtol=1e-4, atol=1e-5)
    # the loop oracle and the padded form are one function
    loop = fn.fuxi_block(x.astype(np.float64), offsets, ts, values, h, DQK, DV, n, request_times=req)
    np.testing.assert_allclose(loop[:total], ref["y"][:total], rtol=1e-10, atol=1e-10)

    grad_cell = BlockGrad(block)
    cot = rng.standard_normal((t_cap, D)).astype(np.float32)
    cot[total:] = 0.0
    (_, _), (gx, gw) = grad_cell(Tensor(x), Tensor(offsets), Tensor(ts), Tensor(cot))
    grads = {"x": gx.asnumpy(), **{short(p): g.asnumpy() for p, g in zip(grad_cell.weights, gw)}}
    p = dict(values, x=x.astype(np.float64))

    def f(q):  # the block without request times (BlockGrad's call), summed against the cotangent
        return float((fn.dense_block(q["x"], offsets, ts, q, h, DQK, DV, n)["y"] * cot).sum())

    check_directional_grads(f, p, grads, rng)
