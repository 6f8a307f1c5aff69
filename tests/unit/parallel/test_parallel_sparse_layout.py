"""The table planner (mindgr.parallel.sparse.layout.plan_table): topology + config -> TableLayout, checked
against the owners the table really uses (init.owned_rows) and the per-rank capacities of the planner."""
import numpy as np
import pytest

from mindgr.config import ConfigError, load_config
from mindgr.parallel.plan import rank_capacities
from mindgr.parallel.sparse.init import owned_rows
from mindgr.parallel.sparse.layout import TableLayout, plan_table, unique_capacity
from mindgr.parallel.sparse.topology import Topology


def _cfg(*extra):
    return load_config(None, ["loss.num_negatives=4", "parallel.staleness=2", *extra])


@pytest.mark.parametrize("nodes, local", [(1, 1), (2, 2), (3, 2), (2, 4)])
@pytest.mark.parametrize("kind", ["hierarchical", "flat"])
def test_every_row_has_one_owner_per_shard_group(nodes, local, kind):
    num_items, world = 37, nodes * local
    plans = [plan_table(Topology(nodes, local, r), _cfg(), num_items, 800, 16, kind) for r in range(world)]
    for p in plans:
        assert isinstance(p, TableLayout) and p.kind == kind and p.world == world and p.num_rows == num_items + 1
        assert p.rows == len(owned_rows(p.num_rows, p.shards, p.shard))
        assert sum(p.rows_per_shard) == p.num_rows
        assert p.rank in p.members and p.rank in p.replicas
    # within every shard group the shards are 0..shards-1 exactly once: the group holds the whole table
    groups = {p.members for p in plans}
    for members in groups:
        assert sorted(plans[r].shard for r in members) == list(range(plans[members[0]].shards))
        assert all(plans[r].members == members for r in members)
    # replicas hold the same shard, one per node group
    for p in plans:
        assert {plans[r].shard for r in p.replicas} == {p.shard}
        assert len({r // local for r in p.replicas}) == len(p.replicas)
    if kind == "hierarchical":
        assert all(p.shards == local and len(p.replicas) == nodes and p.staleness == 2 for p in plans)
        assert len(groups) == nodes
    else:
        assert all(p.shards == world and p.replicas == (p.rank,) and p.staleness == 0 for p in plans)
        assert not any(p.replicated for p in plans) and len(groups) == 1


def test_capacities_are_the_data_parallel_planners():
    cfg = _cfg("parallel.capacity_slack=0.05")
    p = plan_table(Topology(2, 2, 3), cfg, 50000, 4096, 64, "hierarchical")
    assert (p.rank_tokens, p.rank_rows) == rank_capacities(4096, 64, 4, 0.05)
    assert p.unique_capacity == unique_capacity(cfg, 50000, p.rank_tokens)
    assert p.unique_capacity % 8 == 0 and p.unique_capacity >= p.rank_tokens * 6 + 1


def test_unique_capacity_is_capped_by_the_catalogue_and_set_by_config():
    small = plan_table(Topology(1, 2, 0), _cfg(), 30, 4096, 64, "flat")
    assert small.unique_capacity == 31
    fixed = plan_table(Topology(1, 2, 0), _cfg("parallel.unique_capacity=96"), 5000, 4096, 64, "flat")
    assert fixed.unique_capacity == 96


def test_kind_defaults_to_config_and_unknown_kind_is_a_config_error():
    p = plan_table(Topology(2, 1, 1), _cfg("parallel.sparse=flat"), 10, 64, 4)
    assert p.kind == "flat" and p.shard == 1
    with pytest.raises(ConfigError, match="parallel.sparse = 'none' is not a sharded layout"):
        plan_table(Topology(1, 1, 0), _cfg(), 10, 64, 4)


def test_plan_matches_the_owner_rule_of_the_table():
    p = plan_table(Topology(2, 3, 4), _cfg(), 100, 600, 12, "hierarchical")
    ids = np.arange(p.num_rows)
    mine = ids[ids % p.shards == p.shard]
    np.testing.assert_array_equal(mine, owned_rows(p.num_rows, p.shards, p.shard))
    assert (p.shard, p.members, p.replicas) == (1, (3, 4, 5), (1, 4))
