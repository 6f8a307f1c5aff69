"""A saved retrieval run loaded back (`load_run`, `evaluate_run`: `mindgr eval` and serving, through the
retrieval task's load_run / evaluate_run), and where any evaluation writes its per-user ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.config import Config
from mindgr.paths import atomic_write
from mindgr.runtime import setup_mindspore
from mindgr.train.checkpoint import CheckpointError, load_checkpoint, restore_parameters
from mindgr.train.local import Model
from mindgr.train.rundir import data_change_note, run_config, saved_checkpoint


def _can_write(directory: Path) -> OSError | None:
    """None if files can be created in `directory` (made if missing), else why not: a check that costs an
    empty file, done before any evaluation."""
    import tempfile
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
        return None
    except OSError as e:
        return e


def _ranks_dir(run_dir: Path) -> tuple[Path, str | None]:
    """Where `eval` writes the per-user ranks: RUN/ranks, or for a read-only run a cache directory (with a note)."""
    wanted = run_dir / "ranks"
    why = _can_write(wanted)
    if why is None:
        return wanted, None
    import hashlib
    root = Path(os.environ.get("MINDGR_CACHE", str(Path.home() / ".cache" / "mindgr")))
    tag = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    elsewhere = root / "ranks" / f"{run_dir.name}-{tag}"
    if _can_write(elsewhere) is not None:
        raise CheckpointError(f"{wanted}: cannot be written ({why.strerror or why}), nor {elsewhere}")
    return elsewhere, f"{wanted} cannot be written ({why.strerror or why}): ranks written to {elsewhere}"


@dataclass
class LoadedRun:
    """A trained run ready to score: its config, data, model (encoder in eval mode) and what was loaded."""
    run_dir: Path
    cfg: Config
    data: object          # mindgr.train.data.RunData
    model: Model
    checkpoint: str       # file name of the checkpoint restored
    step: int | None
    data_note: str | None  # set when the data changed since training and that was allowed


def load_run(run_dir, which: str = "best", allow_data_change: bool = False, threads: int | None = None) -> LoadedRun:
    """A saved run with its best (or latest) checkpoint restored, on the data it was trained on (refused if
    that changed, unless allow_data_change). Used by `mindgr eval` and by serving (mindgr.serve).
    threads: CPU threads for MindSpore (default: the run's parallel.threads)."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if threads is not None:
        cfg.parallel.threads = threads
    path = saved_checkpoint(run_dir, cfg, which)
    from mindgr.train.data import RunData
    data_note = data_change_note(run_dir, cfg, allow_data_change)
    setup_mindspore(cfg)
    data = RunData(cfg)
    model = Model(cfg, data.num_items)
    tensors, meta = load_checkpoint(path)
    from mindgr.train.table_checkpoint import full_table
    table = full_table(path.parent, path.name, data.num_items + 1)   # the checkpoints directory
    if table is None:
        restore_parameters(model.train_step, tensors, str(path))
    else:                     # a run with a sharded item table (parallel.sparse): its shards hold the table
        encoder = {k[len("encoder."):]: v for k, v in tensors.items() if k.startswith("encoder.")}
        encoder["item_emb"] = table
        restore_parameters(model.encoder, encoder, str(path))
    model.encoder.set_train(False)
    return LoadedRun(run_dir, cfg, data, model, path.name, meta.get("step"), data_note)


SEARCH = "search"      # the history mode of a decode that skips the history's items (eval.exclude_history_in_search)


def history_mode(eval_cfg):
    """A run's default ranking: SEARCH (GR: history skipped by the decode), True (history filtered) or False."""
    return SEARCH if getattr(eval_cfg, "exclude_history_in_search", False) else bool(eval_cfg.filter_history)


def ranks_file_name(split: str, which: str, filter_history) -> str:
    """RUN/ranks/ file of an evaluation: test-best.npz (history filtered), test-best-unfiltered.npz,
    test-best-searched.npz (GR: history skipped by the decode)."""
    suffix = "-searched" if filter_history == SEARCH else "" if filter_history else "-unfiltered"
    return f"{split}-{which}{suffix}.npz"


def evaluate_run(run_dir: Path, split: str = "test", which: str = "best", allow_data_change: bool = False,
                 filter_history: bool | None = None) -> dict:
    """Re-evaluate a saved run (`mindgr eval`): its own config, its best (or latest) checkpoint, on the data
    it was trained on (refused if that changed, unless allow_data_change). filter_history: None = the run's
    eval.filter_history. Item-encoder runs (the retrieval task's evaluate_run)."""
    run = load_run(run_dir, which, allow_data_change)
    if filter_history is None or filter_history == SEARCH:   # an encoder ranks every item: its filter is exact
        filter_history = run.cfg.eval.filter_history if filter_history is None else True
    ranks_dir, ranks_note = _ranks_dir(run.run_dir)   # before the ranking, the long part
    from mindgr.train.evaluate import evaluate
    evalset = getattr(run.data.split, split)
    metrics, ranks, ties = evaluate(run.model.encode_last, run.model.item_table(), run.data.eval[split], evalset,
                                    run.cfg.eval.ks, per_user=True, filter_history=filter_history)
    # Per-user (greater, ties) pairs, for a paired comparison with another run (`mindgr compare`), and each
    # target's value for data with values (`mindgr compare --by-value`).
    ranks_path = ranks_dir / ranks_file_name(split, which, filter_history)
    tv = getattr(evalset, "target_values", None)
    values = {} if tv is None else {"target_values": np.asarray(tv, np.float32)}
    atomic_write(ranks_path, lambda tmp: np.savez(tmp, ranks=ranks, ties=ties, checkpoint=run.checkpoint,
                                                  targets=np.asarray(evalset.targets, np.int64), **values),
                 tmp_suffix=".tmp.npz")
    out = {"run": str(run.run_dir), "split": split, "checkpoint": run.checkpoint, "step": run.step,
           "filter_history": filter_history, **metrics, "ranks_file": str(ranks_path)}
    for key, note in (("ranks_note", ranks_note), ("data_note", run.data_note)):
        if note:
            out[key] = note
    return out
