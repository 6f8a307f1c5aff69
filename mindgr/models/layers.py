"""Small pieces shared by the encoders: parameter init, affine-free LayerNorm, L2 norm, dropout by mask."""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgr.ops import norm as _norm_ops


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


def add_bias(x, b):
    """x [T, K] + b [K] as BiasAdd: MindSpore's CPU Add that broadcasts b over rows runs a scalar index loop
    (~3x the time of BiasAdd's kernel at [20000, 150] forward, ~1.6x with the backward; docs/ARCHITECTURE.md).
    2-D only: BiasAdd adds along axis 1."""
    if len(x.shape) != 2:
        raise ValueError(f"add_bias: x must be [T, K], got shape {x.shape}")
    return ops.bias_add(x, b)


def layer_norm(x, eps: float = 1e-6):
    """LayerNorm over the last axis with no learned scale or shift (as in HSTU)."""
    mean = x.mean(-1, keep_dims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keep_dims=True)
    return centered * ops.rsqrt(var + eps)


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2, -1) + eps^2), through the ops backend (mindgr.ops.norm; cpu: one fused kernel each way)."""
    return _norm_ops.l2_normalize(x, eps)


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


class ItemSequenceEncoder(nn.Cell):
    """What every encoder shares (the contract in mindgr.models.registry): the item table `item_emb`
    [V+1, D] and position table `pos_emb` [N, D], drawn in that order from `rng` (`item_init(rng, shape,
    std)` draws the item table: a sharded table keeps only its rows, mindgr.parallel.sparse); the input
    `item_emb * sqrt(D) + pos_emb`; scores against the unit rows of the item table. A subclass builds its
    blocks and writes `encode(item_vectors, positions, offsets, timestamps, drop, request_times)`."""

    def __init__(self, rng, num_items: int, dim: int, max_len: int, dropout: float, item_init=trunc_normal):
        super().__init__()
        self.dim, self.max_len, self.dropout = dim, max_len, dropout
        self.item_emb = param(item_init(rng, (num_items + 1, dim), 0.02), "item_emb")
        self.pos_emb = param(trunc_normal(rng, (max_len, dim), float(np.sqrt(1.0 / dim))), "pos_emb")
        self.scale = float(np.sqrt(dim))

    def item_table(self):
        return l2_normalize(self.item_emb)

    def construct(self, ids, positions, offsets, timestamps, drop=None, request_times=None):
        return self.encode(ops.gather(self.item_emb, ids, 0), positions, offsets, timestamps, drop, request_times)

    def embed(self, item_vectors, positions):
        """The blocks' input from the tokens' item embeddings [T, D] (gathered here, or by a sharded table)."""
        return item_vectors * self.scale + ops.gather(self.pos_emb, positions, 0)
