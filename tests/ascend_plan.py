"""The work split of the Ascend HSTU attention kernels, in Python (numpy), for tests and documentation.

The AscendC kernels (op_kernel/hstu_common.h, `WorkPlan`) compute this same plan ON THE DEVICE from
the `offsets` tensor: the host tiling only sees shapes, so one compiled executor serves every batch
(see docs/ascend_ops.md, "Why the split is made on the device"). Keep the two in step: the constants
and the integer arithmetic below are the kernel's.

Items
    A row b holds tokens [s, e) with s = clamp(offsets[b], 0, T), e = clamp(offsets[b+1], s, T);
    only its first Le = min(e - s, N) tokens take part (the reference cuts rows to N = max_len).
    Its blocks are the BLOCK-token slices [i0, i0 + m) of those Le tokens.
    forward : one item per (row, head, query block)      -> out rows of that block
    backward: per (row, head) first the dq items (query block qb: keys 0 .. i0+m-1), then the
              dkv items (key block kb: queries j0 .. Le-1), both kinds over the same blocks.
Cost
    cost(item) = rows * partners + ITEM_OVERHEAD, i.e. ~ the number of (query, key) pairs it scores
    (the pairs a block skips above the diagonal are not worth a special case). A row costs ~ H*Le^2/2
    (twice that in the backward), so one long row is spread over many workers.
Assignment
    Items are laid out in the fixed order (row, head, kind, block) with prefix costs S_i; item i goes
    to worker floor((2*S_i + cost_i) * P / (2*C)) (its cost midpoint), C = total cost, P workers.
    Every worker evaluates the same integer formula, so items are covered exactly once and a
    worker's load is within one item cost of C / P.
Dead tokens
    Tokens of no row (the tail past offsets[B]) and tokens cut off a row (positions >= N) get zero
    outputs / gradients: they are listed in token order and split into P contiguous shares.
"""
from __future__ import annotations

import numpy as np

BLOCK = 64            # query / key block (rows of the Cube matmuls), HSTU_BLOCK in the kernels
ITEM_OVERHEAD = BLOCK * BLOCK  # fixed cost of an item (matmul set-up, DMA latency), in pair units
KIND_FWD, KIND_DQ, KIND_DKV = 0, 1, 2


def row_spans(offsets, num_tokens: int, max_len: int):
    """[(s, e, Le)] per row, with the kernel's clamping of malformed offsets."""
    spans = []
    off = [int(x) for x in np.asarray(offsets).reshape(-1)]
    for b in range(len(off) - 1):
        s = min(max(off[b], 0), num_tokens)
        e = min(max(off[b + 1], s), num_tokens)
        spans.append((s, e, min(e - s, max_len)))
    return spans


def _blocks(le: int):
    return (le + BLOCK - 1) // BLOCK


def item_cost(kind: int, le: int, blk: int) -> int:
    i0 = blk * BLOCK
    rows = min(BLOCK, le - i0)
    if kind == KIND_DKV:
        partners = le - i0            # queries i0 .. le-1 look at keys of this block
    else:
        partners = i0 + rows          # keys 0 .. i0+rows-1
    return rows * partners + ITEM_OVERHEAD


def items(offsets, num_tokens: int, heads: int, max_len: int, backward: bool = False):
    """All items in plan order: list of (row, head, kind, block, cost)."""
    kinds = (KIND_DQ, KIND_DKV) if backward else (KIND_FWD,)
    out = []
    for b, (_, _, le) in enumerate(row_spans(offsets, num_tokens, max_len)):
        nb = _blocks(le)
        for h in range(heads):
            for kind in kinds:
                for blk in range(nb):
                    out.append((b, h, kind, blk, item_cost(kind, le, blk)))
    return out


def assign(costs, workers: int):
    """Worker of each item (midpoint rule, integer arithmetic as in the kernel)."""
    costs = [int(c) for c in costs]
    total = sum(costs)
    owner, start = [], 0
    for c in costs:
        w = ((2 * start + c) * workers) // (2 * total) if total else 0
        owner.append(min(w, workers - 1))
        start += c
    return owner


def plan(offsets, num_tokens: int, heads: int, max_len: int, workers: int, backward: bool = False):
    """{worker: [(row, head, kind, block, cost), ...]} in the order each worker runs them."""
    its = items(offsets, num_tokens, heads, max_len, backward)
    owner = assign([c for *_, c in its], workers)
    per = {w: [] for w in range(workers)}
    for it, w in zip(its, owner):
        per[w].append(it)
    return per


def dead_tokens(offsets, num_tokens: int, max_len: int):
    """Tokens whose outputs and gradients are zero: cut parts of long rows, then the tail."""
    dead = []
    spans = row_spans(offsets, num_tokens, max_len)
    for s, e, le in spans:
        dead.extend(range(s + le, e))
    last = spans[-1][1] if spans else 0
    dead.extend(range(last, num_tokens))
    return dead


def dead_share(num_dead: int, worker: int, workers: int):
    """[lo, hi) of the dead-token list zeroed by `worker`."""
    return num_dead * worker // workers, num_dead * (worker + 1) // workers


# ------------------------------------------------------------------------------------------------
# Time buckets: the kernels take a fast logarithm and correct it with exact float32 thresholds that
# the host tiling computes (so the bucket is a function of float32(|dt|) matching the reference
# formula clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, nb) evaluated in float32).

MAX_BUCKET = 146     # floor(ln(2^63) / 0.301) = 145: no int64 gap reaches a higher bucket
NUM_BOUNDS = MAX_BUCKET + 2


def bucket_formula_f32(gap_f32):
    g = np.maximum(np.asarray(gap_f32, np.float32), np.float32(1.0))
    return np.floor(np.log(g) / np.float32(0.301)).astype(np.int64)


def bucket_bounds():
    """bounds[k] = smallest float32 g >= 1 with floor(ln(g)/0.301) >= k (k = 0..MAX_BUCKET+1);
    +inf where no float32 reaches k. Bisection over float32 bit patterns, as the host tiling does."""
    bounds = np.full(NUM_BOUNDS, np.inf, np.float32)
    lo_bits = int(np.float32(1.0).view(np.int32))
    hi_bits = int(np.float32(np.finfo(np.float32).max).view(np.int32))
    for k in range(NUM_BOUNDS):
        if bucket_formula_f32(np.int32(hi_bits).view(np.float32)) < k:
            continue
        a, c = lo_bits, hi_bits
        while a < c:
            mid = (a + c) // 2
            if bucket_formula_f32(np.int32(mid).view(np.float32)) >= k:
                c = mid
            else:
                a = mid + 1
        bounds[k] = np.int32(a).view(np.float32)
    return bounds


def gap_f32(tq, tk):
    """float32(|tq - tk|) the way the kernel forms it from 24-bit halves (exact below 2^47)."""
    tq = np.asarray(tq, np.int64)
    tk = np.asarray(tk, np.int64)
    dh = ((tq >> 24) - (tk >> 24)).astype(np.int32).astype(np.float32) * np.float32(16777216.0)
    dl = ((tq & 0xFFFFFF) - (tk & 0xFFFFFF)).astype(np.int32).astype(np.float32)
    return np.abs(dh + dl)


def kernel_bucket(tq, tk, num_buckets: int, bounds=None):
    """The kernel's bucket: estimate with ln * (1/0.301), fix by one step with the bounds, clamp."""
    bounds = bucket_bounds() if bounds is None else bounds
    g = np.maximum(gap_f32(tq, tk), np.float32(1.0))
    est = np.floor(np.log(g) * np.float32(1.0 / 0.301)).astype(np.int64)
    est = np.clip(est, 0, MAX_BUCKET)
    est = est - (g < bounds[est]) + (g >= bounds[est + 1])
    return np.minimum(est, num_buckets)
