"""Row LayerNorms of the HSTU block glue, dispatched through the selected backend's table
(mindgr.ops.backend.ACTIVE).

layer_norm(x, eps=1e-6) -> [.., D]
    (x - mean) / sqrt(var + eps) over the last axis, var = mean((x - mean)^2), no learned scale or
    shift (HSTU's LayerNorm). The reference composes ~7 generic ops (and their gradients); the CPU
    kernel makes one pass over x forward and one over (x, dy) backward.
gated_layer_norm(u, y, eps=1e-6) -> [.., D]
    u * layer_norm(y) for u, y of the same shape: HSTU's u * LayerNorm(A v), gradients to u and y.
"""
from mindgr.ops.backend import ACTIVE, ensure_backend

ensure_backend()  # the reference until the runtime selects a backend


def layer_norm(x, eps: float = 1e-6):
    return ACTIVE["layer_norm"](x, eps)


def gated_layer_norm(u, y, eps: float = 1e-6):
    return ACTIVE["gated_layer_norm"](u, y, eps)
