"""SampledSoftmaxLoss in isolation, against a numpy sampled softmax, for both scoring paths.

A tiny stand-in encoder (embedding table + linear map, L2-normalised rows; the same construct signature
as HSTU/SASRec) (loss_fixtures.py) replaces the real model so only the loss is under test. For every position i with
target t_i > 0:
    loss_i = logsumexp([s(o_i, e_t) / tau] + [s(o_i, e_r) / tau for negatives r != t_i]) - s(o_i, e_t) / tau
with s the cosine similarity; the loss is the mean of loss_i over those positions (0 if there are none).
Tolerance: float32 vs float64, |loss_ms - loss_np| <= 1e-5 + 1e-5 |loss_np|; score_all=True and
score_all=False agree to 1e-5.
"""

import numpy as np
import pytest

from mindspore import Tensor

from loss_fixtures import D, R, T, TAU, V, TinyEncoder, tiny_batch
from mindgr.models.losses import SampledSoftmaxLoss


pytestmark = pytest.mark.graph_mode("reference")


def numpy_loss(emb, w, ids, drop, targets, negatives, tau, mask_hits=True):
    emb, w = emb.astype(np.float64), w.astype(np.float64)
    out = (emb[ids] @ w) * drop
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    table = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    losses = []
    for i in range(len(ids)):
        if targets[i] <= 0:
            continue
        pos = out[i] @ table[targets[i]] / tau
        logits = [pos] + [out[i] @ table[r] / tau for r in negatives[i] if not (mask_hits and r == targets[i])]
        m = max(logits)
        losses.append(m + np.log(np.sum(np.exp(np.array(logits) - m))) - pos)
    return float(np.mean(losses)) if losses else 0.0


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(5)
    emb = rng.standard_normal((V + 1, D)).astype(np.float32)
    w = rng.standard_normal((D, D)).astype(np.float32)
    enc = TinyEncoder(emb, w)
    losses = {sa: SampledSoftmaxLoss(enc, TAU, score_all=sa) for sa in (True, False)}
    return rng, emb, w, losses


def _run(losses, ids, positions, offsets, targets, negatives, drop):
    ts = Tensor(np.zeros(T, np.int64))
    req = Tensor(np.zeros(len(offsets) - 1, np.int64))
    args = (Tensor(ids), Tensor(positions), Tensor(offsets), ts, req, Tensor(targets), Tensor(negatives),
            Tensor(drop))
    return {sa: float(loss(*args).asnumpy()) for sa, loss in losses.items()}


def _check(got, want):
    for sa, value in got.items():
        assert abs(value - want) <= 1e-5 + 1e-5 * abs(want), (sa, value, want)
    assert abs(got[True] - got[False]) <= 1e-5, got


def test_random_batch_with_accidental_hits(setup):
    rng, emb, w, losses = setup
    ids, positions, offsets, targets, negatives = tiny_batch(rng)
    targets[1] = 0  # a real token without a target (as at non-final eval positions)
    negatives[0, [1, 3]] = targets[0]  # accidental hits
    negatives[4, 0] = targets[4]
    drop = np.ones((T, D), np.float32)
    got = _run(losses, ids, positions, offsets, targets, negatives, drop)
    want = numpy_loss(emb, w, ids, drop, targets, negatives, TAU)
    _check(got, want)
    # The masking matters here: the unmasked loss is clearly different.
    assert abs(numpy_loss(emb, w, ids, drop, targets, negatives, TAU, mask_hits=False) - want) > 1e-2
    # The unused tail is ignored whatever it holds (targets 0 there).
    ids2, negatives2 = ids.copy(), negatives.copy()
    ids2[5:] = rng.integers(1, V + 1, T - 5)
    negatives2[5:] = rng.integers(1, V + 1, (T - 5, R))
    _check(_run(losses, ids2, positions, offsets, targets, negatives2, drop), want)


def test_all_negatives_accidental_hits(setup):
    rng, emb, w, losses = setup
    ids, positions, offsets, targets, negatives = tiny_batch(rng)
    negatives[2, :] = targets[2]  # token 2: every negative is its target -> its loss is exactly 0
    negatives[3, :-1] = targets[3]  # token 3: one real negative left
    drop = ((rng.random((T, D)) > 0.3) / 0.7).astype(np.float32)
    drop[:5] = np.where(drop[:5].sum(1, keepdims=True) == 0, 1.0, drop[:5])
    got = _run(losses, ids, positions, offsets, targets, negatives, drop)
    want = numpy_loss(emb, w, ids, drop, targets, negatives, TAU)
    _check(got, want)
    # Token 2 counts in the mean with loss 0: the mean over the other 4 tokens is 5/4 of it.
    others = targets.copy()
    others[2] = 0
    np.testing.assert_allclose(numpy_loss(emb, w, ids, drop, others, negatives, TAU) * 4 / 5, want, rtol=1e-9)
    assert abs(numpy_loss(emb, w, ids, drop, targets, negatives, TAU, mask_hits=False) - want) > 1e-2


def test_every_token_all_hits_and_no_targets(setup):
    rng, emb, w, losses = setup
    ids, positions, offsets, targets, negatives = tiny_batch(rng)
    drop = np.ones((T, D), np.float32)
    # Every negative of every token equals its target: nothing to contrast with, the loss is 0.
    all_hits = np.repeat(targets[:, None], R, axis=1).astype(np.int32)
    got = _run(losses, ids, positions, offsets, targets, all_hits, drop)
    assert all(abs(v) <= 1e-6 for v in got.values()), got
    assert numpy_loss(emb, w, ids, drop, targets, all_hits, TAU, mask_hits=False) > 0.5
    # No position has a target: the mean over an empty set is defined as 0 (not NaN).
    got = _run(losses, ids, positions, offsets, np.zeros(T, np.int32), negatives, drop)
    assert all(v == 0.0 for v in got.values()), got
