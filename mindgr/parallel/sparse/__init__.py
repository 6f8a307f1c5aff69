"""Sharded item embeddings for multi-process training (docs/sparse.md).

    topology      nodes x local_ranks: which ranks share a node group, the intra and inter groups
    layout        TableLayout, the plan of the sharded table (plan_table: topology + config [+ id statistics]
                  -> layout)
    hotcold       HotCold: the frequency layout's row ownership (hot rows per node group, cold per job)
    init          the item table's initial rows, drawn exactly as the replicated model draws them
    table         ShardedTable: row ownership, lookup of de-duplicated ids, gradient route-back;
                  HotColdTable: the frequency layout's table, cold rows through a gateway per node
    row_adam      AdamWeightDecay applied row by row on an owner's shard (lazy or every row)
    exchange      the cross-node gradient exchange, synchronous or one step behind (bounded staleness)
    link          a modelled inter-node link: the time a cluster's link would add to each cross-node exchange
    traffic       bytes per step inside / across nodes, the two-bandwidth cost model, the hot-row cut
    step          the compiled step that takes the gathered rows as an input and returns their gradient
    executor      ShardedTableExecutor: the data-parallel executor with the item table sharded
The shards' checkpoint files (save / load, resharding to another rank count) are mindgr.train.table_checkpoint.
The msrun self-check of these pieces is tests/harness/sparse_selftest.py.
"""
