"""The sharded item table as a plan: `plan_table(topology, config, ...)` -> TableLayout, a plain value
that says who owns which rows, who replicates them, and the per-rank capacities of a step.

Made once per job from the topology and the config (no communication: every rank computes the same plan,
its own fields included), then consumed by the sharded-table strategy (mindgr.parallel.sparse.strategy: its StepShape) and by
`mindgr bench sparse`. Rows are sharded round robin: shard k owns the ids with id % shards == k
(mindgr.parallel.sparse.init.owned_rows).
  hierarchical  the shards are the local ranks of a node group; every node group holds the whole table
                and the ranks with the same local index replicate one shard (the cross-node exchange)
  flat          every rank of the job owns one shard; nothing is replicated (no cross-node exchange)
"""
from __future__ import annotations

from dataclasses import dataclass

from mindgr.config import ConfigError
from mindgr.parallel.plan import rank_capacities
from mindgr.parallel.sparse.topology import Topology

KINDS = ("hierarchical", "flat")


@dataclass(frozen=True)
class TableLayout:
    kind: str                   # "hierarchical" | "flat"
    world: int
    nodes: int                  # node groups
    local_ranks: int            # ranks per node group
    rank: int                   # the rank this plan was made for
    shards: int                 # shards of the table = ranks of one shard group
    shard: int                  # this rank's shard
    members: tuple              # world ranks of this rank's shard group (between them: the whole table)
    replicas: tuple             # world ranks holding this rank's shard, one per node group ((rank,) if flat)
    num_rows: int               # V + 1 (row 0 = padding)
    rows_per_shard: tuple       # rows each shard owns
    rank_tokens: int            # per-rank token capacity of a step
    rank_rows: int              # per-rank sequence (row) capacity of a step
    unique_capacity: int        # U_cap: distinct ids one rank-step may hold
    staleness: int              # tau of the cross-node exchange (parallel.staleness; 0 for flat)

    @property
    def rows(self) -> int:
        """Rows this rank owns."""
        return self.rows_per_shard[self.shard]

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1


def unique_capacity(cfg, num_items: int, rank_tokens: int) -> int:
    """U_cap: distinct ids a rank-step may hold (config, or every id the step could name, capped at V+1)."""
    if cfg.parallel.unique_capacity:
        return cfg.parallel.unique_capacity
    bound = rank_tokens * (cfg.loss.num_negatives + 2) + 1
    return int(min(num_items + 1, -(-bound // 8) * 8))


def plan_table(topo: Topology, cfg, num_items: int, token_capacity: int, row_capacity: int,
               kind: str | None = None) -> TableLayout:
    """The layout of `kind` (default config parallel.sparse) for rank topo.rank of `topo`, with the step's
    global capacities `token_capacity` x `row_capacity` split over the ranks as the data-parallel planner
    splits them."""
    kind = kind or cfg.parallel.sparse
    if kind not in KINDS:
        raise ConfigError(f"config: parallel.sparse = {kind!r} is not a sharded layout (one of {', '.join(KINDS)})")
    world, rank = topo.world, topo.rank
    if kind == "hierarchical":
        shards, shard, members = topo.local_ranks, topo.local, tuple(topo.intra_ranks)
        replicas, staleness = tuple(topo.inter_ranks), cfg.parallel.staleness
    else:
        shards, shard, members = world, rank, tuple(range(world))
        replicas, staleness = (rank,), 0
    num_rows = num_items + 1
    rows_per_shard = tuple(len(range(k, num_rows, shards)) for k in range(shards))
    rank_tokens, rank_rows = rank_capacities(token_capacity, row_capacity, world, cfg.parallel.capacity_slack)
    return TableLayout(kind=kind, world=world, nodes=topo.nodes, local_ranks=topo.local_ranks, rank=rank,
                       shards=shards, shard=shard, members=members, replicas=replicas, num_rows=num_rows,
                       rows_per_shard=rows_per_shard, rank_tokens=rank_tokens, rank_rows=rank_rows,
                       unique_capacity=unique_capacity(cfg, num_items, rank_tokens),
                       staleness=staleness)
