"""Build the configured encoder."""
from mindgr.models.hstu import HSTU
from mindgr.models.sasrec import SASRec


def build_encoder(model_cfg, num_items: int, max_len: int, seed: int):
    m = model_cfg
    if m.arch == "hstu":
        dqk = m.dqk or m.dim // m.num_heads
        dv = m.dv or m.dim // m.num_heads
        return HSTU(num_items, m.dim, m.num_blocks, m.num_heads, dqk, dv, max_len, m.dropout,
                    m.time_bias, m.num_time_buckets, seed)
    return SASRec(num_items, m.dim, m.num_blocks, m.num_heads, max_len, m.dropout, m.ffn_dim, seed)
