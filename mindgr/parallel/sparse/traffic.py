"""Bytes of the embedding exchange, inside a node and across nodes, and a two-bandwidth time model.

Convention: the LOGICAL payload a native collective moves: a message from rank a to rank b counts once,
as intra-node if a and b are on the same node, inter-node otherwise; a rank's message to itself costs
nothing. (On CPU the all_to_all_v / subgroup gathers are emulated with AllGather/AllReduce at n x that
traffic; the emulation's overhead is not counted, the algorithm's payload is.) Ids travel as int32.

Three ways to hold the item table over W = nodes x L ranks, per step (ids of rank r: its de-duplicated
ids U_r; D = row width, 4 bytes per float):
  hierarchical  rows sharded over the L ranks of a node, replicated over nodes. Inside a node: id
                requests, rows back, row gradients to their owner. Across nodes: the owners' node-summed
                gradients, exchanged in two phases over the `nodes` replicas of a shard (each row has one
                reducer replica: reduce to it, then it sends the sum to the others).
  flat          rows sharded over all W ranks: requests, rows and gradients go to any rank, so
                (nodes-1)/nodes of them cross nodes.
  frequency     hot rows (the head of the id distribution) as hierarchical; cold rows sharded over all W
                ranks and fetched in two stages: a rank's cold ids go to the rank of its own node with the
                owner's local index (its gateway), which de-duplicates them for the node and exchanges them
                with the owner (same local index, other node); rows come back and gradients go out along
                the same routes, the gateway summing its node's gradients of a row before they cross.
  dp            the table replicated everywhere, its dense gradient all-reduced every step
                (hierarchical ring: 2 (nodes-1)/nodes x table bytes leave each node).
Time model: a step's exchange takes max over nodes of (bytes inside / intra bandwidth) plus max over
nodes of (bytes leaving / inter bandwidth); bandwidths per node, latency ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ID_BYTES = 4
FLOAT_BYTES = 4


@dataclass
class Traffic:
    """Bytes this rank sent in the current step and in total, split intra / inter by physical node."""
    node_of_rank: np.ndarray                   # physical node of every world rank
    me: int
    step_intra: int = 0
    step_inter: int = 0
    total_intra: int = 0
    total_inter: int = 0
    steps: int = 0
    by_phase: dict = field(default_factory=dict)
    step_inter_messages: int = 0               # cross-node destinations of every send (the link model's)

    def send(self, dest_world_ranks, nbytes, phase: str):
        """Count messages of nbytes[k] bytes to world rank dest_world_ranks[k]."""
        dest = np.asarray(dest_world_ranks, np.int64)
        nbytes = np.asarray(nbytes, np.int64)
        other = dest != self.me
        cross = self.node_of_rank[dest] != self.node_of_rank[self.me]
        inter = int(nbytes[other & cross].sum())
        intra = int(nbytes[other & ~cross].sum())
        self.step_intra += intra
        self.step_inter += inter
        self.step_inter_messages += int((other & cross).sum())
        a, b = self.by_phase.get(phase, (0, 0))
        self.by_phase[phase] = (a + intra, b + inter)

    def end_step(self) -> tuple[int, int]:
        out = (self.step_intra, self.step_inter)
        self.total_intra += self.step_intra
        self.total_inter += self.step_inter
        self.steps += 1
        self.step_intra = self.step_inter = self.step_inter_messages = 0
        return out


def row_bytes(dim: int) -> int:
    return dim * FLOAT_BYTES


@dataclass
class Bandwidth:
    intra_gbps: float = 600.0
    inter_gbps: float = 25.0

    def seconds(self, node_intra: np.ndarray, node_inter: np.ndarray) -> float:
        """Exchange time of one step from each node's bytes inside and leaving it."""
        return float(np.max(node_intra, initial=0) / (self.intra_gbps * 1e9)
                     + np.max(node_inter, initial=0) / (self.inter_gbps * 1e9))


def touch_probabilities(freq: np.ndarray, rank_tokens: int, num_negatives: int, ranks: int,
                        pool: int = 0) -> np.ndarray:
    """P(row i is among the distinct ids of `ranks` ranks in one step), every row: each rank looks up
    `rank_tokens` ids and as many targets (unigram `freq`, [V+1], row 0 = padding) and `num_negatives`
    uniform ids per token, and every rank of the job the same `pool` uniform ids (a shared pool: it does
    not grow with the ranks); row 0 is always there."""
    freq = np.asarray(freq, np.float64)
    num_items = len(freq) - 1
    log_miss = 2.0 * rank_tokens * np.log1p(-np.minimum(freq, 1.0 - 1e-12))
    log_miss[1:] += rank_tokens * num_negatives * np.log1p(-1.0 / num_items)
    log_miss = ranks * log_miss
    log_miss[1:] += pool * np.log1p(-1.0 / num_items)
    p = -np.expm1(log_miss)
    p[0] = 1.0
    return p


def row_costs(p_node: np.ndarray, p_job: np.ndarray, nodes: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Expected inter-node bytes per step of each row (summed over nodes) when replicated on every node
    (hot: reduce to the row's reducer replica, which sends the sum back to the other nodes) and when held
    once and fetched in two stages (cold: every other node that touches it gets the row, sends its
    gradient back); p_node / p_job: the row is touched by a given node / by any rank of the job."""
    rb = row_bytes(dim)
    hot = (nodes - 1) * (ID_BYTES + rb) * (p_node + p_job)
    cold = (nodes - 1) * (ID_BYTES + 2 * rb) * p_node
    return hot, cold


def hot_cut(freq: np.ndarray, rank_tokens: int, num_negatives: int, nodes: int, local_ranks: int, dim: int,
            tolerance: float, pool: int = 0) -> dict:
    """The hot rows of the frequency layout: the rows whose replication costs at most (1 + tolerance) x
    the inter-node bytes of fetching them (row_costs, from touch_probabilities), in descending touch
    probability; every row on one node (nothing crosses nodes, and replicas inside a node save the
    gateway hop). A replicated row never costs fewer bytes than a fetched one (both move the row twice
    per remote node that touches it; the replica also sends it to nodes that did not): the gain is that
    its exchange runs off the step's critical path (in the background with staleness >= 1) and needs no
    fetch before the step, so the cut keeps only rows where the byte price of that is small. A shared pool
    of `pool` ids per step (touch_probabilities) makes a row's nodes touch it together: rows touched mostly
    through the pool cost about the same both ways and become hot."""
    world = nodes * local_ranks
    p_node = touch_probabilities(freq, rank_tokens, num_negatives, local_ranks, pool)
    p_job = touch_probabilities(freq, rank_tokens, num_negatives, world, pool)
    order = np.argsort(-p_node, kind="stable")
    if nodes == 1:
        hot = order
    else:
        h, c = row_costs(p_node, p_job, nodes, dim)
        hot = order[h[order] <= (1.0 + tolerance) * c[order]]
    return {"hot": hot.astype(np.int64), "order": order}


def hot_share(freq: np.ndarray, rank_tokens: int, num_negatives: int, hot: np.ndarray, pool: int = 0) -> float:
    """Expected share of a rank's distinct ids per step that are hot rows."""
    p_rank = touch_probabilities(freq, rank_tokens, num_negatives, 1, pool)
    return float(p_rank[hot].sum() / max(p_rank.sum(), 1e-12))


def model_step(rank_ids: list, nodes: int, local_ranks: int, dim: int, num_rows: int, hot=None) -> dict:
    """Bytes per node (intra, inter) of one step for each layout, from every rank's de-duplicated ids.

    Follows exactly the messages mindgr.parallel.sparse sends (hierarchical and flat; frequency when `hot`,
    the replicated rows in frequency order, is given), so with the ids of a real run it reproduces that
    run's counters; dp is the all-reduce of the dense table gradient.
    """
    world = nodes * local_ranks
    assert len(rank_ids) == world
    rb, ib = row_bytes(dim), ID_BYTES
    node_of = np.arange(world) // local_ranks
    out = {}
    for layout, shards in (("hierarchical", local_ranks), ("flat", world)):
        intra, inter = np.zeros(nodes), np.zeros(nodes)
        owners_ids = {}                                     # (node, owner local) -> ids it received
        for r, ids in enumerate(rank_ids):
            owner = ids % shards
            dest = (node_of[r] * local_ranks + owner) if layout == "hierarchical" else owner
            counts = np.bincount(dest, minlength=world)
            other = np.arange(world) != r
            cross = node_of != node_of[r]
            # request id and gradient leave r, the row leaves the owner: each counted at its sender's node
            inter_r = counts[other & cross]
            intra_r = counts[other & ~cross]
            intra[node_of[r]] += intra_r.sum() * (ib + rb)
            inter[node_of[r]] += inter_r.sum() * (ib + rb)
            for d in np.flatnonzero(other & counts.astype(bool)):
                if cross[d]:
                    inter[node_of[d]] += counts[d] * rb
                else:
                    intra[node_of[d]] += counts[d] * rb
            if layout == "hierarchical":
                for l in range(local_ranks):
                    owners_ids.setdefault((node_of[r], l), []).append(ids[owner == l])
        if layout == "hierarchical" and nodes > 1:
            for l in range(local_ranks):
                node_sets = [np.unique(np.concatenate(owners_ids.get((n, l), [np.zeros(0, np.int64)])))
                             for n in range(nodes)]
                slots = [s // local_ranks for s in node_sets]
                reduced = [set() for _ in range(nodes)]
                for n, sl in enumerate(slots):               # phase 1: to each slot's reducer replica
                    red = sl % nodes
                    for m in range(nodes):
                        if m != n:
                            inter[n] += int((red == m).sum()) * (ib + rb)
                        reduced[m].update(sl[red == m].tolist())
                for m in range(nodes):                       # phase 2: every reducer sends its sums
                    inter[m] += len(reduced[m]) * (ib + rb) * (nodes - 1)
        out[layout] = {"intra": intra, "inter": inter}
    if hot is not None:
        out["frequency"] = _model_frequency(rank_ids, nodes, local_ranks, dim, num_rows, hot)
    table = num_rows * rb
    dp_inter = np.full(nodes, 2.0 * (nodes - 1) / nodes * table) if nodes > 1 else np.zeros(nodes)
    dp_intra = np.full(nodes, 2.0 * (local_ranks - 1) / local_ranks * table)
    out["dp"] = {"intra": dp_intra, "inter": dp_inter}
    return out


def _model_frequency(rank_ids, nodes, local_ranks, dim, num_rows, hot) -> dict:
    """Bytes per node of the frequency layout (mindgr.parallel.sparse.table.HotColdTable's messages)."""
    from mindgr.parallel.sparse.hotcold import HotCold
    plan = HotCold(np.asarray(hot, np.int64), num_rows, nodes, local_ranks)
    world, L = nodes * local_ranks, local_ranks
    rb, ib = row_bytes(dim), ID_BYTES
    intra, inter = np.zeros(nodes), np.zeros(nodes)
    hot_ids, gate_ids = [], {}
    for r, ids in enumerate(rank_ids):
        ids = np.asarray(ids, np.int64)
        node = r // L
        is_hot, pos = plan.is_hot[ids], plan.pos[ids]
        # hot: (id + gradient) to the owner inside the node, the row back
        owner = pos[is_hot] % L
        n = int((owner != r % L).sum())
        intra[node] += n * (ib + 2 * rb)
        hot_ids.append(ids[is_hot])
        # cold stage 1: (id + gradient) to the gateway (local index of the owner), the row back
        gate = (pos[~is_hot] % world) % L
        n = int((gate != r % L).sum())
        intra[node] += n * (ib + 2 * rb)
        for g in np.unique(gate):
            gate_ids.setdefault((node, int(g)), []).append(ids[~is_hot][gate == g])
    # cold stage 2: each gateway's distinct ids to their owners on other nodes (id + gradient), rows back
    for (node, g), parts in gate_ids.items():
        owner_node = (plan.pos[np.unique(np.concatenate(parts))] % world) // L
        inter[node] += int((owner_node != node).sum()) * (ib + rb)
        for m in np.flatnonzero(np.bincount(owner_node, minlength=nodes)):
            if m != node:
                inter[m] += int((owner_node == m).sum()) * rb
    if nodes > 1 and len(plan.hot):             # hot rows: the two-phase exchange over the node replicas
        by_node = [np.unique(np.concatenate([hot_ids[r] for r in range(n * L, (n + 1) * L)] or
                                            [np.zeros(0, np.int64)])) for n in range(nodes)]
        for l in range(L):
            reduced = [set() for _ in range(nodes)]
            for n in range(nodes):
                p = plan.pos[by_node[n]]
                slots = p[p % L == l] // L
                red = slots % nodes
                inter[n] += int((red != n).sum()) * (ib + rb)
                for m in range(nodes):
                    reduced[m].update(slots[red == m].tolist())
            for m in range(nodes):
                inter[m] += len(reduced[m]) * (ib + rb) * (nodes - 1)
    return {"intra": intra, "inter": inter}
