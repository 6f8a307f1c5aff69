"""SharedNegativesLoss (one candidate set per batch, scored by one matmul) against numpy, and FP16.

For every position i with target t_i > 0:
    loss_i = logsumexp([s_it / tau] + [s_ij / tau - c_j for candidates j != t_i, j != 0]) - s_it / tau
Tolerances: fp32 path vs float64 numpy 1e-5 + 1e-5 |ref|. The FP16 path (candidate embeddings and the
scoring product in float16, log-sum-exp in fp32) must stay within 2e-2 absolute of the fp32 loss for
logits bounded by 1/tau = 20: float16 keeps ~3 significant digits of each cosine (~5e-4), x 20.
"""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.models.losses import SharedNegativesLoss
from loss_fixtures import TAU, D, T, V, TinyEncoder, tiny_batch


pytestmark = pytest.mark.graph_mode("reference")




def numpy_shared(emb, w, ids, targets, cand, corr, tau):
    emb, w = emb.astype(np.float64), w.astype(np.float64)
    out = emb[ids] @ w
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    table = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    losses = []
    for i in range(len(ids)):
        if targets[i] <= 0:
            continue
        pos = out[i] @ table[targets[i]] / tau
        logits = [pos] + [out[i] @ table[c] / tau - corr[k] for k, c in enumerate(cand)
                          if c != targets[i] and c != 0]
        m = max(logits)
        losses.append(m + np.log(np.exp(np.array(logits) - m).sum()) - pos)
    return float(np.mean(losses)) if losses else 0.0


@pytest.mark.parametrize("fp16", [False, True])
def test_shared_candidates_match_numpy(fp16):
    rng = np.random.default_rng(11)
    emb = rng.standard_normal((V + 1, D)).astype(np.float32)
    w = rng.standard_normal((D, D)).astype(np.float32)
    ids, positions, offsets, targets, _ = tiny_batch(rng)
    cand = rng.integers(1, V + 1, 9).astype(np.int32)
    cand[2] = targets[0]          # an accidental hit for token 0
    cand[7:] = 0                  # unused slots
    corr = rng.normal(0, 3, 9).astype(np.float32)
    loss = SharedNegativesLoss(TinyEncoder(emb, w), TAU, fp16=fp16)
    got = float(loss(Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(np.zeros(T, np.int64)),
                     Tensor(np.zeros(len(offsets) - 1, np.int64)), Tensor(targets), Tensor(cand), Tensor(corr), Tensor(np.ones((T, D), np.float32))).asnumpy())
    want = numpy_shared(emb, w, ids, targets, cand, corr, TAU)
    tol = 2e-2 if fp16 else 1e-5 + 1e-5 * abs(want)
    assert abs(got - want) <= tol, (fp16, got, want)
    # the correction and the masks matter: without them the loss is clearly different
    assert abs(numpy_shared(emb, w, ids, targets, cand, np.zeros(9), TAU) - want) > 0.05
    unmasked = cand.copy()
    unmasked[7:] = 1
    assert abs(numpy_shared(emb, w, ids, targets, unmasked, corr, TAU) - want) > 1e-3
