"""Load a trained run for serving: its own config, its data (for the item id mapping), its weights.

This mirrors mindgr.train.trainer.evaluate_run's loading step by step (config.yaml -> config_from_dict,
RunData, Model, CheckpointManager best/latest, load_checkpoint, restore_parameters, the sharded item
table of parallel.sparse runs), using only those public pieces, so one of the two can call the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mindgr.train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, restore_parameters


@dataclass
class LoadedRun:
    run_dir: Path
    cfg: object          # mindgr.config.Config
    data: object         # mindgr.train.data.RunData
    model: object        # mindgr.train.trainer.Model, encoder in eval mode
    checkpoint: str      # file name of the checkpoint loaded
    step: int | None


def load_run(run_dir, which: str = "best", threads: int | None = None) -> LoadedRun:
    """The run's model with its best (or latest) checkpoint restored, encoder set to eval mode.
    threads: CPU threads for MindSpore (default: the run's parallel.threads)."""
    import yaml
    from mindgr.config import config_from_dict
    from mindgr.train.data import RunData
    from mindgr.train.trainer import Model, setup_mindspore
    if which not in ("best", "latest"):
        raise ValueError(f"checkpoint: {which!r} (expected best or latest)")
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.yaml)")
    cfg = config_from_dict(yaml.safe_load(cfg_path.read_text()))
    cfg.run.out_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    if threads is not None:
        cfg.parallel.threads = threads
    setup_mindspore(cfg)
    data = RunData(cfg)
    model = Model(cfg, data.num_items)
    ckpts = CheckpointManager(run_dir, cfg.run.keep_last)
    path = (ckpts.best() if which == "best" else None) or ckpts.latest()
    if path is None:
        raise CheckpointError(f"{run_dir}: no checkpoint to load")
    tensors, meta = load_checkpoint(path)
    from mindgr.parallel.sparse.checkpoint import full_table
    table = full_table(ckpts.dir, path.name, data.num_items + 1)
    if table is None:
        restore_parameters(model.train_step, tensors, str(path))
    else:  # parallel.sparse runs keep the item table in shards
        encoder = {k[len("encoder."):]: v for k, v in tensors.items() if k.startswith("encoder.")}
        encoder["item_emb"] = table
        restore_parameters(model.encoder, encoder, str(path))
    model.encoder.set_train(False)
    return LoadedRun(run_dir, cfg, data, model, path.name, meta.get("step"))
