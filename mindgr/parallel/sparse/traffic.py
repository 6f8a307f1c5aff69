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
        a, b = self.by_phase.get(phase, (0, 0))
        self.by_phase[phase] = (a + intra, b + inter)

    def end_step(self) -> tuple[int, int]:
        out = (self.step_intra, self.step_inter)
        self.total_intra += self.step_intra
        self.total_inter += self.step_inter
        self.steps += 1
        self.step_intra = self.step_inter = 0
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


def model_step(rank_ids: list, nodes: int, local_ranks: int, dim: int, num_rows: int) -> dict:
    """Bytes per node (intra, inter) of one step for each layout, from every rank's de-duplicated ids.

    Follows exactly the messages mindgr.parallel.sparse sends (hierarchical and flat), so with the ids of a
    real run it reproduces that run's counters; dp is the all-reduce of the dense table gradient.
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
    table = num_rows * rb
    dp_inter = np.full(nodes, 2.0 * (nodes - 1) / nodes * table) if nodes > 1 else np.zeros(nodes)
    dp_intra = np.full(nodes, 2.0 * (local_ranks - 1) / local_ranks * table)
    out["dp"] = {"intra": dp_intra, "inter": dp_inter}
    return out
