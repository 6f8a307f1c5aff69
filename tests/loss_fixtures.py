"""Shared by the loss tests (test_models_loss.py, test_models_shared_loss.py, test_ops_cpu_scoring.py): a tiny
stand-in encoder (embedding table + linear map, L2-normalised rows; the construct signature of HSTU/SASRec)
so that only a loss is under test, and a small jagged batch for it."""
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

V, D, T, R, B = 12, 6, 10, 5, 3
TAU = 0.05


def _unit(x):
    return x / ops.sqrt((x * x).sum(-1, keepdims=True))


class TinyEncoder(nn.Cell):
    """out = normalise((emb[ids] @ w) * drop); item_table() = normalise(emb)."""

    def __init__(self, emb, w):
        super().__init__()
        self.emb = Parameter(Tensor(emb), name="emb")
        self.w = Parameter(Tensor(w), name="w")

    def item_table(self):
        return _unit(self.emb)

    def construct(self, ids, positions, offsets, timestamps, drop, request_times=None):
        return _unit(ops.matmul(ops.gather(self.emb, ids, 0), self.w) * drop)


def tiny_batch(rng):
    """5 real tokens in rows of length 3, 0, 2 (B_cap = 3), then an unused tail of T - 5 tokens."""
    offsets = np.array([0, 3, 3, 5], np.int32)
    ids = np.zeros(T, np.int32)
    ids[:5] = rng.integers(1, V + 1, 5)
    targets = np.zeros(T, np.int32)
    targets[:5] = rng.integers(1, V + 1, 5)
    negatives = rng.integers(1, V + 1, (T, R)).astype(np.int32)
    positions = np.array([0, 1, 2, 0, 1] + [0] * (T - 5), np.int32)
    return ids, positions, offsets, targets, negatives
