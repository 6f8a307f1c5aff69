"""The item-retrieval task a step strategy trains: its data (mindgr.train.data.RunData), its batch plan,
the FLOPs of a step and its baselines. The local, data-parallel and sharded-table strategies share it;
a task with other data (e.g. generative retrieval over semantic-ID token rows) is another object with the
same few methods, owned by its own strategy (mindgr.train.strategy).
"""
from __future__ import annotations

import time

from mindgr.config import ConfigError


class ItemRetrievalTask:
    """Next-item retrieval over the catalogue: sequences -> sampled-softmax training, full-ranking eval."""

    def __init__(self, cfg, check_negatives: bool = True):
        """check_negatives=False: a task that reuses the data but draws no item negatives (GR)."""
        from mindgr.train.data import RunData
        self.cfg = cfg
        t0 = time.perf_counter()
        self.data = RunData(cfg)                         # a failed load leaves no run dir behind
        self.load_s = time.perf_counter() - t0
        c, n = cfg.loss, self.data.num_items
        if check_negatives and c.negatives == "per_token" and c.num_negatives > n:
            raise ConfigError(f"config: loss.num_negatives = {c.num_negatives} is larger than the catalogue "
                              f"({n} items): every token would draw repeats of the same items; use at most {n}")

    @property
    def plan(self):
        return self.data.plan

    def describe(self) -> str:
        d, tr = self.data, self.data.train
        return (f"{d.store.num_users} users, {d.num_items} items, {len(tr.inputs)} training sequences, capacity "
                f"{tr.token_capacity} tokens x {tr.row_capacity} rows, {d.plan.num_batches(0)} batches/epoch "
                f"({self.load_s:.1f}s)")

    def flops(self, info: dict, num_candidates: int) -> float:
        from mindgr.train.flops import train_flops
        return train_flops(self.cfg.model, info["lengths"], info["targets"], num_candidates)

    def can_evaluate(self, split: str) -> bool:
        return self.data.eval[split] is not None

    def baselines(self) -> dict:
        from mindgr.train.metrics import popularity_metrics
        d = self.data
        if d.eval["test"] is None:
            return {}
        return {"popularity_test": popularity_metrics(d.split.train, d.num_items, d.split.test, self.cfg.eval.ks)}
