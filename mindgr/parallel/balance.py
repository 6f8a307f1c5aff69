"""Split one global batch of whole sequences across ranks so that every rank's step costs the same.

Cost of a sequence of length L: c(L) = c0 + a*L + b*L^2 (per-row overhead, per-token work such as
projections and the loss, and attention over L^2 pairs). A rank's cost is the sum over its sequences;
imbalance = max rank cost / mean rank cost - 1, the fraction of a step the fastest ranks sit idle.

Every rank computes the same partition from the same inputs (the global batch and a cost model that
is identical on all ranks), so no communication is needed: the algorithm is deterministic, ties
included. Each rank's part must fit the fixed per-rank capacities (tokens and rows), because every
rank runs the same compiled graph at static shapes.

Method ("balanced"): longest-processing-time first on cost, restricted to ranks where the sequence
still fits, then a local search that repeatedly lowers the most expensive rank by moving one of its
sequences to another rank or swapping it for a cheaper one, keeping every capacity. LPT rather than
Karmarkar-Karp because the differencing merges of KK cannot respect the two capacities; the local
search recovers what LPT leaves on the table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class PartitionError(ValueError):
    """The global batch cannot be split into the per-rank capacities."""


@dataclass(frozen=True)
class CostModel:
    """c(L) = c0 + a*L + b*L^2, in seconds (calibrated) or any consistent unit (given in config)."""
    a: float
    b: float
    c0: float = 0.0

    def __call__(self, lengths) -> np.ndarray:
        x = np.asarray(lengths, dtype=np.float64)
        return np.where(x > 0, self.c0 + self.a * x + self.b * x * x, 0.0)

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "c0": self.c0}


def imbalance(rank_costs) -> float:
    """max / mean - 1 (0 for an all-zero step)."""
    c = np.asarray(rank_costs, dtype=np.float64)
    mean = c.mean() if len(c) else 0.0
    return float(c.max() / mean - 1.0) if mean > 0 else 0.0


def rank_loads(lengths, parts, cost_model: CostModel):
    """(cost, tokens, rows) per rank for a partition (list of index arrays)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = cost_model(lengths)
    cost = np.array([costs[p].sum() for p in parts])
    tokens = np.array([lengths[p].sum() for p in parts], dtype=np.int64)
    rows = np.array([len(p) for p in parts], dtype=np.int64)
    return cost, tokens, rows


class _State:
    """Assignment of items to ranks with running per-rank cost / tokens / rows."""

    def __init__(self, lengths, costs, n):
        self.lengths, self.costs, self.n = lengths, costs, n
        self.owner = np.full(len(lengths), -1, dtype=np.int64)
        self.cost = np.zeros(n)
        self.tokens = np.zeros(n, dtype=np.int64)
        self.rows = np.zeros(n, dtype=np.int64)

    def put(self, i, r):
        self.owner[i] = r
        self.cost[r] += self.costs[i]
        self.tokens[r] += self.lengths[i]
        self.rows[r] += 1

    def take(self, i):
        r = self.owner[i]
        self.owner[i] = -1
        self.cost[r] -= self.costs[i]
        self.tokens[r] -= self.lengths[i]
        self.rows[r] -= 1

    def parts(self):
        return [np.flatnonzero(self.owner == r) for r in range(self.n)]


def _greedy(state, order, token_cap, row_cap, key):
    """Place items in `order` on the fitting rank with the smallest key(state); False if one fits nowhere."""
    for i in order:
        fits = (state.tokens + state.lengths[i] <= token_cap) & (state.rows < row_cap)
        if not fits.any():
            return False
        state.put(i, int(np.argmin(np.where(fits, key(state), np.inf))))
    return True


def _initial(lengths, costs, n, token_cap, row_cap, by_cost=True):
    """Cost-LPT within capacities; if packing gets stuck, fall back to token bin packing (worst then best fit)."""
    idx = np.arange(len(lengths))
    by_len = np.lexsort((idx, -lengths))
    attempts = [(by_len, lambda s: s.tokens.astype(np.float64)),           # worst-fit decreasing
                (by_len, lambda s: (token_cap - s.tokens).astype(np.float64))]  # best-fit decreasing
    if by_cost:
        attempts.insert(0, (np.lexsort((idx, -lengths, -costs)), lambda s: s.cost))  # LPT on cost
    for order, key in attempts:
        state = _State(lengths, costs, n)
        if _greedy(state, order, token_cap, row_cap, key):
            return state
    raise PartitionError(f"{len(lengths)} sequences, {int(lengths.sum())} tokens (longest {int(lengths.max())}) "
                         f"do not fit {n} ranks of {token_cap} tokens x {row_cap} rows; raise "
                         "parallel.capacity_slack or lower the fill of the global batch")


def _improve(state, token_cap, row_cap, max_iter):
    """Lower the most expensive rank by one move or swap at a time while it strictly helps."""
    L, c = state.lengths, state.costs
    for _ in range(max_iter):
        m = int(np.argmax(state.cost))
        top = state.cost[m]
        mine = np.flatnonzero(state.owner == m)
        if len(mine) == 0:
            break
        best, best_val = None, top * (1 - 1e-12)
        # Moves: item i of m to rank r.
        room_ok = (state.rows < row_cap)
        room_ok[m] = False
        if room_ok.any():
            fit = (state.tokens[None, :] + L[mine, None] <= token_cap) & room_ok[None, :]
            val = np.maximum(top - c[mine, None], state.cost[None, :] + c[mine, None])
            val = np.where(fit, val, np.inf)
            k = int(np.argmin(val))
            if val.flat[k] < best_val:
                best_val, best = val.flat[k], ("move", mine[k // state.n], k % state.n)
        # Swaps: item i of m with a cheaper item j of another rank.
        other = np.flatnonzero(state.owner != m)
        if len(other):
            rj = state.owner[other]
            dc = c[mine, None] - c[None, other]                       # cost m sheds
            dl = L[mine, None] - L[None, other]                       # tokens m sheds
            fit = (dc > 0) & (state.tokens[m] - dl <= token_cap) & (state.tokens[rj][None, :] + dl <= token_cap)
            val = np.where(fit, np.maximum(top - dc, state.cost[rj][None, :] + dc), np.inf)
            k = int(np.argmin(val))
            if val.flat[k] < best_val:
                best_val, best = val.flat[k], ("swap", mine[k // len(other)], other[k % len(other)])
        if best is None:
            break
        if best[0] == "move":
            state.take(best[1])
            state.put(best[1], int(best[2]))
        else:
            i, j = best[1], best[2]
            ri = state.owner[j]
            state.take(i)
            state.take(j)
            state.put(i, int(ri))
            state.put(j, m)
    return state


def partition_balanced(lengths, n, token_capacity, row_capacity, cost_model: CostModel, max_iter=None):
    """Indices (ascending) of the sequences each of `n` ranks trains on, cost-balanced within capacities."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return [np.zeros(0, dtype=np.int64) for _ in range(n)]
    state = _initial(lengths, cost_model(lengths), n, token_capacity, row_capacity)
    if n > 1:
        _improve(state, token_capacity, row_capacity, max_iter or 4 * len(lengths) + 8 * n)
    return state.parts()


def partition_by_tokens(lengths, n, token_capacity, row_capacity):
    """Token-balanced split (bin packing on length only): what balancing without a cost model gives."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return [np.zeros(0, dtype=np.int64) for _ in range(n)]
    return _initial(lengths, lengths.astype(np.float64), n, token_capacity, row_capacity, by_cost=False).parts()


def partition_random(lengths, n, token_capacity, row_capacity, rng, tries=10):
    """Baseline: sequences in random order, each to a random rank where it still fits."""
    lengths = np.asarray(lengths, dtype=np.int64)
    for _ in range(tries):
        state = _State(lengths, lengths.astype(np.float64), n)
        ok = True
        for i in rng.permutation(len(lengths)):
            fits = np.flatnonzero((state.tokens + lengths[i] <= token_capacity) & (state.rows < row_capacity))
            if len(fits) == 0:
                ok = False
                break
            state.put(i, int(rng.choice(fits)))
        if ok:
            return state.parts()
    return partition_by_tokens(lengths, n, token_capacity, row_capacity)


def deal_random(num, n, rng):
    """Baseline without capacities: the sequences dealt to ranks at random, equal counts (+-1)."""
    order = rng.permutation(num)
    return [np.sort(order[r::n]) for r in range(n)]


def partition(lengths, n, token_capacity, row_capacity, cost_model: CostModel, method="balanced", rng=None):
    if method == "balanced":
        return partition_balanced(lengths, n, token_capacity, row_capacity, cost_model)
    if method == "tokens":
        return partition_by_tokens(lengths, n, token_capacity, row_capacity)
    if method == "random":
        rng = rng if rng is not None else np.random.default_rng(0)
        return partition_random(lengths, n, token_capacity, row_capacity, rng)
    raise ValueError(f"unknown partition method {method!r} (balanced, tokens, random)")
