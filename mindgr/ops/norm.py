"""The block glue (row LayerNorms, the SiLU of the split projection, the output L2 norm), dispatched through the selected backend's table
(mindgr.ops.backend.ACTIVE).

layer_norm(x, eps=1e-6) -> [.., D]
    (x - mean) / sqrt(var + eps) over the last axis, var = mean((x - mean)^2), no learned scale or
    shift (HSTU's LayerNorm). The reference composes ~7 generic ops (and their gradients); the CPU
    kernel makes one pass over x forward and one over (x, dy) backward.
gated_layer_norm(u, y, eps=1e-6) -> [.., D]
    u * layer_norm(y) for u, y of the same shape: HSTU's u * LayerNorm(A v), gradients to u and y.
l2_normalize(x, eps=1e-6) -> [.., D]
    x / sqrt(sum(x^2) + eps^2) over the last axis (the encoders' output and the item table rows): the
    reference composes 5 generic ops (RealDiv broadcast [.., D] / [.., 1]) and their gradients; the CPU
    kernel makes one pass each way.
silu_split(x, widths) -> tuple of [.., w_k]
    split(SiLU(x), widths, axis=-1), sum(widths) = x.shape[-1]: HSTU's u, v, q, k from ONE projection
    LN(x) W_uvqk. The reference is the generic SiLU (Sigmoid, Mul) and Split, whose gradient sums
    zero-filled [.., W] slice gradients; the CPU kernel makes one pass each way and writes x's gradient once.
"""
from mindgr.ops.backend import ACTIVE, ensure_backend

ensure_backend()  # the reference until the runtime selects a backend


def layer_norm(x, eps: float = 1e-6):
    return ACTIVE["layer_norm"](x, eps)


def gated_layer_norm(u, y, eps: float = 1e-6):
    return ACTIVE["gated_layer_norm"](u, y, eps)


def silu_split(x, widths):
    widths = tuple(int(w) for w in widths)
    if sum(widths) != x.shape[-1]:
        raise ValueError(f"silu_split: widths {widths} must sum to the last dimension {x.shape[-1]}")
    return ACTIVE["silu_split"](x, widths)


def l2_normalize(x, eps: float = 1e-6):
    return ACTIVE["l2_normalize"](x, eps)
