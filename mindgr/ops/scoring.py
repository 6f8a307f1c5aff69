"""Sampled scoring for the sampled-softmax loss, dispatched through the selected
backend's table (mindgr.ops.backend.ACTIVE).

sampled_logits(out, table, ids, score_all=False) -> [T, R]
    logits[t, r] = out[t] . table[ids[t, r]]; out [T, D], table [V+1, D], ids [T, R] int32 with every
    id in [0, V]. The CPU kernel never materialises [T, V+1] or [T, R, D]; the reference either scores
    all items and picks columns (score_all, small catalogues) or gathers [T, R, D].

shared_pool_lse(x, cand, logq, cand_ids, targets, pos) -> [T]
    The log-sum-exp of a shared-candidate sampled softmax: for every token with targets[t] > 0,
    log(exp(pos[t]) + sum_k exp(x[t] . cand[k] - logq[k])) over the candidates with cand_ids[k] != 0
    and cand_ids[k] != targets[t] (unused slots and accidental hits); 0 for other tokens. x [T, D]
    float32 (already divided by the temperature), cand [K, D] float32 or float16, logq [K] the logQ
    correction, cand_ids [K] and targets [T] int32, pos [T] the positive logit. The CPU kernel streams
    over K in cache-sized chunks with an online max/sum (memory O(T + K), never [T, K]) and recomputes
    the chunk logits in its backward; the reference materialises the [T, K] logits (the oracle).
"""
from mindgr.ops.backend import ACTIVE, ensure_backend

ensure_backend()  # the reference until the runtime selects a backend


def sampled_logits(out, table, ids, score_all: bool = False):
    return ACTIVE["sampled_logits"](out, table, ids, score_all)


def sampled_lse(x, table, ids, targets, pos, score_all: bool = False):
    return ACTIVE["sampled_lse"](x, table, ids, targets, pos, score_all)


def shared_pool_lse(x, cand, logq, cand_ids, targets, pos):
    return ACTIVE["shared_pool_lse"](x, cand, logq, cand_ids, targets, pos)
