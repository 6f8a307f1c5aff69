"""A trained run's item table as tokenizer input (`mindgr ids build --run`): rows 1..V of the item table
of its best (or latest) checkpoint, and the run's raw item ids (the layout mindgr.ids.vectors documents)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mindgr.train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from mindgr.train.trainer import run_config


def run_item_vectors(run_dir, which: str = "best") -> tuple[np.ndarray, np.ndarray]:
    """(vectors [V, D] float64, raw_ids int64 [V+1] with raw_ids[0] = -1) of the run's checkpoint."""
    from mindgr.train.data import load_store
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    ckpts = CheckpointManager(run_dir, 1)
    path = ckpts.best() if which == "best" else ckpts.latest()
    if path is None:
        if which == "best" and ckpts.latest() is not None:
            raise CheckpointError(f"{run_dir}: no best checkpoint; use the last one with --checkpoint latest")
        raise CheckpointError(f"{run_dir}: no checkpoint to read the item table from")
    tensors, _ = load_checkpoint(path)
    names = [k for k in tensors if k.endswith("item_emb") and not k.startswith("optimizer.")]
    if len(names) != 1:
        raise CheckpointError(f"checkpoint {path}: {len(names)} item tables (expected one parameter named "
                              f"*item_emb; runs with a sharded table, parallel.sparse, are not supported)")
    table = tensors[names[0]]
    raw_ids = np.asarray(load_store(cfg.data, cfg.run.seed).item_raw_ids, np.int64)
    if len(raw_ids) != len(table):
        raise CheckpointError(f"checkpoint {path}: item table has {len(table) - 1} items, the run's data "
                              f"{len(raw_ids) - 1} (was the data changed?)")
    return np.asarray(table[1:], np.float64), raw_ids
