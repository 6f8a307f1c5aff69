"""The sharded item table as a plan: `plan_table(topology, config, ...)` -> TableLayout, a plain value
that says who owns which rows, who replicates them, and the per-rank capacities of a step.

Made once per job from the topology and the config (no communication: every rank computes the same plan,
its own fields included), then consumed by the sharded-table executor (mindgr.parallel.sparse.executor: its StepShape) and by
`mindgr bench sparse`. Rows are sharded round robin: shard k owns the ids with id % shards == k
(mindgr.parallel.sparse.init.owned_rows).
  hierarchical  the shards are the local ranks of a node group; every node group holds the whole table
                and the ranks with the same local index replicate one shard (the cross-node exchange)
  flat          every rank of the job owns one shard; nothing is replicated (no cross-node exchange)
  frequency     chosen from the data's id statistics (HotCold): the hot rows, the head of the id
                distribution, are laid out as hierarchical (sharded over a node's local ranks by their
                frequency rank, replicated across node groups, exchanged across nodes); the cold rows are
                sharded over all ranks (round robin in id order) and fetched in two stages through a
                gateway rank of the node (mindgr.parallel.sparse.table.HotColdTable). The hot set is the
                plan's data (TableLayout.hot); the cut is mindgr.parallel.sparse.traffic.hot_cut.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mindgr.config import ConfigError
from mindgr.parallel.plan import rank_capacities
from mindgr.parallel.sparse.hotcold import HotCold
from mindgr.parallel.sparse.topology import Topology

KINDS = ("hierarchical", "flat", "frequency")


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
    hot: np.ndarray | None = field(default=None, compare=False, repr=False)  # frequency: hot ids, by rank
    cut: dict = field(default_factory=dict, compare=False)                  # frequency: how hot was chosen

    @property
    def rows(self) -> int:
        """Rows this rank owns."""
        return self.rows_per_shard[self.shard]

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1

    def hot_cold(self) -> HotCold | None:
        return HotCold(self.hot, self.num_rows, self.nodes, self.local_ranks) if self.kind == "frequency" else None

    def owned_ids(self) -> np.ndarray:
        """Ids of the rows this rank holds, in the order of its table."""
        if self.kind == "frequency":
            return self.hot_cold().rank_ids(self.rank)
        return np.arange(self.shard, self.num_rows, self.shards, dtype=np.int64)


def negative_ids(loss_cfg) -> tuple[int, int]:
    """(uniform negatives per token, ids of the step's shared pool) a rank looks up: (R, 0) for per_token,
    (0, K) for shared_pool (the only strategies a sharded table takes, config._validate_cross)."""
    if loss_cfg.negatives == "shared_pool":
        return 0, loss_cfg.pool_size
    return loss_cfg.num_negatives, 0


def unique_capacity(cfg, num_items: int, rank_tokens: int) -> int:
    """U_cap: distinct ids a rank-step may hold (config, or every id the step could name, capped at V+1)."""
    if cfg.parallel.unique_capacity:
        return cfg.parallel.unique_capacity
    per_token, pool = negative_ids(cfg.loss)
    bound = rank_tokens * (per_token + 2) + pool + 1
    return int(min(num_items + 1, -(-bound // 8) * 8))


def plan_table(topo: Topology, cfg, num_items: int, token_capacity: int, row_capacity: int,
               kind: str | None = None, freq: np.ndarray | None = None) -> TableLayout:
    """The layout of `kind` (default config parallel.sparse) for rank topo.rank of `topo`, with the step's
    global capacities `token_capacity` x `row_capacity` split over the ranks as the data-parallel planner
    splits them. The frequency layout needs `freq`, the unigram frequency of every row among training
    targets ([V + 1], mindgr.train.negatives.item_frequencies): every rank computes the same plan."""
    kind = kind or cfg.parallel.sparse
    if kind not in KINDS:
        raise ConfigError(f"config: parallel.sparse = {kind!r} is not a sharded layout (one of {', '.join(KINDS)})")
    world, rank = topo.world, topo.rank
    if kind == "hierarchical":
        shards, shard, members = topo.local_ranks, topo.local, tuple(topo.intra_ranks)
        replicas, staleness = tuple(topo.inter_ranks), cfg.parallel.staleness
    elif kind == "frequency":
        shards, shard, members = world, rank, tuple(range(world))
        replicas, staleness = tuple(topo.inter_ranks), cfg.parallel.staleness
    else:
        shards, shard, members = world, rank, tuple(range(world))
        replicas, staleness = (rank,), 0
    num_rows = num_items + 1
    rows_per_shard = tuple(len(range(k, num_rows, shards)) for k in range(shards))
    rank_tokens, rank_rows = rank_capacities(token_capacity, row_capacity, world, cfg.parallel.capacity_slack)
    hot, cut = None, {}
    if kind == "frequency":
        hot, cut = _hot_rows(topo, cfg, num_rows, rank_tokens, freq)
        plan = HotCold(hot, num_rows, topo.nodes, topo.local_ranks)
        rows_per_shard = tuple(len(plan.rank_ids(r)) for r in range(world))
    return TableLayout(kind=kind, world=world, nodes=topo.nodes, local_ranks=topo.local_ranks, rank=rank,
                       shards=shards, shard=shard, members=members, replicas=replicas, num_rows=num_rows,
                       rows_per_shard=rows_per_shard, rank_tokens=rank_tokens, rank_rows=rank_rows,
                       unique_capacity=unique_capacity(cfg, num_items, rank_tokens),
                       staleness=staleness, hot=hot, cut=cut)


def _hot_rows(topo: Topology, cfg, num_rows: int, rank_tokens: int, freq) -> tuple[np.ndarray, dict]:
    """The hot ids (most touched first) and how they were chosen: parallel.hot_rows of them, or the byte
    model's cut (traffic.hot_cut) when it is -1."""
    from mindgr.parallel.sparse.traffic import hot_cut, hot_share
    p = cfg.parallel
    if freq is None:
        raise ValueError("plan_table: the frequency layout needs the id frequencies of the training data")
    if len(freq) != num_rows:
        raise ValueError(f"plan_table: {len(freq)} id frequencies for a table of {num_rows} rows")
    per_token, pool = negative_ids(cfg.loss)
    cut = hot_cut(freq, rank_tokens, per_token, topo.nodes, topo.local_ranks, cfg.model.dim, p.hot_tolerance, pool)
    hot, order = cut.pop("hot"), cut.pop("order")
    if p.hot_rows >= 0:                       # a fixed count: the head of the same ranking
        hot = order[: min(p.hot_rows, num_rows)]
        cut["rule"] = f"parallel.hot_rows = {p.hot_rows}"
    else:
        cut["rule"] = f"byte model, tolerance {p.hot_tolerance:g}"
    cut["hot_rows"] = int(len(hot))
    cut["hot_share_of_rank_ids"] = hot_share(freq, rank_tokens, per_token, hot, pool)
    return hot.astype(np.int64), cut
