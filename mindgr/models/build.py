"""Build the configured encoder."""
from mindgr.models import fuxi
from mindgr.models.hstu import HSTU
from mindgr.models.sasrec import SASRec


def build_encoder(model_cfg, num_items: int, max_len: int, seed: int, item_init=None):
    """`item_init(rng, shape, std)` replaces the item table's draw (default: truncated normal)."""
    m = model_cfg
    extra = {} if item_init is None else {"item_init": item_init}
    if m.arch == "fuxi":
        return fuxi.build(m, num_items, max_len, seed, item_init)
    if m.arch == "hstu":
        dqk = m.dqk or m.dim // m.num_heads
        dv = m.dv or m.dim // m.num_heads
        return HSTU(num_items, m.dim, m.num_blocks, m.num_heads, dqk, dv, max_len, m.dropout,
                    m.time_bias, m.num_time_buckets, seed, **extra)
    return SASRec(num_items, m.dim, m.num_blocks, m.num_heads, max_len, m.dropout, m.ffn_dim, seed, **extra)
