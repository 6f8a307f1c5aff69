"""Small pieces shared by the encoders: parameter init, affine-free LayerNorm, L2 norm, dropout by mask."""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, ops


def trunc_normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """Normal(0, std) truncated at 2 std, drawn from a seeded numpy generator (so init is reproducible)."""
    x = rng.standard_normal(shape)
    bad = np.abs(x) > 2.0
    while bad.any():
        x[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(x) > 2.0
    return (x * std).astype(np.float32)


def xavier_uniform(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    bound = float(np.sqrt(6.0 / (fan_in + fan_out)))
    return rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)


def param(array: np.ndarray, name: str) -> Parameter:
    return Parameter(Tensor(array), name=name)


def layer_norm(x, eps: float = 1e-6):
    """LayerNorm over the last axis with no learned scale or shift (as in HSTU)."""
    mean = x.mean(-1, keep_dims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keep_dims=True)
    return centered * ops.rsqrt(var + eps)


def l2_normalize(x, eps: float = 1e-6):
    return x / ops.sqrt((x * x).sum(-1, keepdims=True) + eps * eps)


def apply_dropout(x, mask):
    """`mask` holds 0 or 1/(1-p) per element; it is drawn on the host so a resumed run replays it exactly."""
    if mask.shape[-1] != x.shape[-1]:
        mask = mask[:, : x.shape[-1]]
    return x * mask


def last_positions(outputs, offsets):
    """The output at each row's last token: [B, D] (zeros for empty rows)."""
    ends = offsets[1:].astype(ms.int32)
    nonempty = ends > offsets[:-1].astype(ms.int32)
    idx = ops.maximum(ends - 1, ops.zeros_like(ends))
    last = ops.gather(outputs, idx, 0)
    return last * nonempty.astype(outputs.dtype)[:, None]
