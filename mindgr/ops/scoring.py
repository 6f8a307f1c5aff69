"""Sampled scoring for the sampled-softmax loss, dispatched to the configured backend (mindgr.ops.backend).

sampled_logits(out, table, ids, score_all=False) -> [T, R]
    logits[t, r] = out[t] . table[ids[t, r]]; out [T, D], table [V+1, D], ids [T, R] int32 with every
    id in [0, V]. The CPU kernel never materialises [T, V+1] or [T, R, D]; the reference either scores
    all items and picks columns (score_all, small catalogues) or gathers [T, R, D].
"""
from mindgr.ops import backend, reference


def sampled_logits(out, table, ids, score_all: bool = False):
    if backend._current == "cpu":
        return backend._cpu.sampled_logits(out, table, ids)
    return reference.sampled_logits(out, table, ids, score_all)
