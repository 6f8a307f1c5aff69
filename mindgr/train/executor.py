"""Executor: HOW a run trains one global batch (one process, data parallel, sharded table); the task
(mindgr.train.task) says WHAT is trained. The loop (mindgr.train.loop.TrainLoop) talks only to the executor,
which hands every question about the data, inputs, FLOPs and evaluation to its task.

The loop owns the run directory (lock, resume refusals, data fingerprint, config.yaml), epochs and the
batch cursor, logging windows, stop signals, divergence checks, the evaluation cadence and `best`,
checkpoint files and the final summary. An executor owns, in the order the loop calls it:

  check_config()              one-line ConfigError before anything is loaded or compiled (the task's and its own)
  writer, eval_ranks          does this process write the shared outputs; processes sharing an evaluation
  build_data(run_dir, resuming) -> plan
                              the task's data and batch plan: `plan.num_batches(epoch)`,
                              `plan.iter_batches(epoch, start)` -> (batch number, indices)
  on_run_dir(run_dir, fresh)  the writer, once the run dir is prepared: what the task keeps there
  describe_data() -> str      the data line of the log (the task's)
  barrier()                   ranks meet (after the run directory is prepared)
  build(run)                  the task's model, this executor's compiled step; `run` is a RunContext
  shape                       StepShape: the step's global and per-rank capacities (computed once)
  stream(items)               the input stream, wrapped (the ranks' stop agreement)
  prepare(epoch, b, indices)  host work of one global batch, in the input thread: (inputs, info) (the task
                              builds the inputs of the whole batch or of this rank's share)
  set_learning_rate(lr)       the rate of the next steps (only under a non-constant train.lr_schedule)
  execute(prepared, step)     one optimizer step: (loss, seconds inside the step, info); info holds
                              "tokens", "fill" (logging) and whatever the task's flops need
  batch_flops(info)           model FLOPs of that step (MFU; the task's)
  window_extra()              more fields (and text) for a logging window, at the same steps on every rank
  can_evaluate(split)         whether `split` has examples; evaluate(split, step) -> metrics (the task's
                              evaluation, with this executor's ranking: one process or split over ranks)
  baselines() -> dict         figures for the final result, e.g. {"popularity_test": metrics} (the task's)
  selection() -> (key, higher)  the validation metric that chooses `best` (the task's: NDCG@10; RMSE, lower)
  named_state()               the tensors a checkpoint holds (name -> Parameter); restore(tensors, path)
  check_finite() -> str|None  state outside named_state that went non-finite (e.g. a table shard)
  settle(what, step)          a consistent state before an evaluation or checkpoint (flush an exchange,
                              tell a watchdog)
  save_checkpoint(step, cursor, commit), save_best(commit)
                              around the loop's commit of the checkpoint files (cursor: the next
                              {"epoch", "batch"}; commit() writes the files;
                              only the writer calls it): per-rank sidecars, table shards, barriers
  meta() -> dict              extra sidecar fields of a checkpoint
  training_done()             training is over (free optimizer state before the final evaluation)
  failure(error, step)        a clearer error for a failed step (a dead peer), or None
  close()                     end of the run's final evaluation

Executors: mindgr.train.local.LocalExecutor, mindgr.parallel.executor.DataParallelExecutor,
mindgr.parallel.sparse.executor.ShardedTableExecutor; which one a config runs: mindgr.parallel.resolve.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepShape:
    """The fixed shape of one step, computed once per run: the global batch's capacities (what one process
    would train) and this rank's share of them."""
    token_capacity: int          # global T_cap
    row_capacity: int            # global B_cap
    rank_tokens: int             # this rank's T_cap (= token_capacity in one process)
    rank_rows: int               # this rank's B_cap
    unique_capacity: int | None = None   # U_cap: distinct item ids of a rank-step (sharded table only)

    @classmethod
    def single(cls, token_capacity: int, row_capacity: int) -> "StepShape":
        return cls(token_capacity, row_capacity, token_capacity, row_capacity)


@dataclass
class EvalContext:
    """What a task's evaluation gets from the executor: its ranking (rank_items(model, evalset, split_data, ks,
    filter_history) -> metrics, in one process or split over ranks), the log, the run dir and
    whether this process writes the shared outputs; beat(what): a long evaluation is alive (a watchdog)."""
    rank_items: object
    log: object
    run_dir: Path
    writer: bool
    beat: object = None


@dataclass
class RunContext:
    """What the loop hands an executor when it builds: the config, where the run writes, its log."""
    cfg: object                  # mindgr.config.Config
    run_dir: Path
    ckpt_dir: Path               # run_dir / checkpoints
    log: object                  # MetricsLog (writer) or a log that drops everything


class Executor(abc.ABC):
    """The interface of the module docstring; defaults are those of one process, and the task's answers."""

    kind = "local"               # the name a task's check_config sees (Task.check_config(executor_kind))

    def __init__(self, cfg, task):
        self.cfg, self.task = cfg, task

    # ---- who this process is ------------------------------------------------------------------
    @property
    def writer(self) -> bool:
        return True

    @property
    def eval_ranks(self) -> int:
        return 1

    def check_config(self):
        """Raise ConfigError for a config this executor (or its task) cannot train."""
        self.task.check_config(self.kind)

    def barrier(self):
        pass

    # ---- data and model ------------------------------------------------------------------------
    def build_data(self, run_dir: Path, resuming: bool):
        """Load the task's data; returns its batch plan (also kept as self.plan)."""
        self.plan = self.task.load(run_dir, resuming)
        return self.plan

    @property
    def data(self):
        return self.task.data

    def on_run_dir(self, run_dir: Path, fresh: bool):
        """Called on the writer after the run dir is prepared; `fresh`: not a resume."""
        self.task.on_run_dir(run_dir, fresh)

    def describe_data(self) -> str:
        return self.task.describe()

    @abc.abstractmethod
    def build(self, run: RunContext):
        """Build the model and the step (after the data and the run directory)."""

    # ---- one step ------------------------------------------------------------------------------
    def stream(self, items):
        return items

    @abc.abstractmethod
    def prepare(self, epoch: int, b: int, indices):
        ...

    def set_learning_rate(self, lr: float):
        """The optimizer's rate from the next step on (mindgr.train.schedule): its learning_rate Parameter,
        read by the compiled step, so no recompilation. An executor with another optimizer sets that too."""
        set_optimizer_lr(self.model.optimizer, lr)

    @abc.abstractmethod
    def execute(self, prepared, step: int):
        ...

    def batch_flops(self, info: dict) -> float:
        return self.task.flops(info)

    def window_extra(self) -> tuple[dict, str]:
        extra = getattr(self.task, "window_extra", None)      # (an executor may train without a Task)
        return extra() if extra is not None else ({}, "")

    # ---- evaluation ----------------------------------------------------------------------------
    def can_evaluate(self, split: str) -> bool:
        return self.task.can_evaluate(split)

    def evaluate(self, split: str, step: int) -> dict:
        """The task's evaluation of the current weights (dropout off), ranked by this executor's `rank_items`."""
        self.model.encoder.set_train(False)
        try:
            ctx = EvalContext(self.rank_items, self.run.log, self.run.run_dir, self.writer, self.settle_beat)
            return self.task.evaluate(self.model, split, ctx)
        finally:
            self.model.encoder.set_train(True)

    def rank_items(self, model, evalset, split_data, ks, filter_history):
        """Dot-product ranking of an item-retrieval evaluation (the model's encode_last against its item
        table): in one process here; other executors split it over ranks."""
        from mindgr.train.evaluate import evaluate
        return evaluate(model.encode_last, model.item_table(), evalset, split_data, ks, filter_history=filter_history)

    def settle_beat(self, what: str):
        """Tell whoever watches this process that it is alive (nobody in one process)."""

    def baselines(self) -> dict:
        return self.task.baselines()

    def selection(self) -> tuple[str, bool]:
        """(validation metric that chooses `best`, higher is better?): the task's (an executor without one:
        NDCG@10, or at the largest K)."""
        if self.task is not None:
            return self.task.selection()
        ks = self.cfg.eval.ks
        return f"ndcg@{10 if 10 in ks else max(ks)}", True

    # ---- state ---------------------------------------------------------------------------------
    def named_state(self) -> dict:
        from mindgr.train.checkpoint import named_parameters
        return named_parameters(self.model.train_step)

    def restore(self, tensors: dict, path: Path):
        from mindgr.train.checkpoint import restore_parameters
        restore_parameters(self.model.train_step, tensors, str(path))
        self.task.restored(path)

    def check_finite(self) -> str | None:
        return None

    def settle(self, what: str, step: int):
        pass

    def save_checkpoint(self, step: int, cursor: dict, commit) -> Path:
        return commit()

    def save_best(self, commit):
        commit()

    def meta(self) -> dict:
        return {}

    def training_done(self):
        pass

    def failure(self, error: BaseException, step: int) -> BaseException | None:
        return None

    def close(self):
        pass


def set_optimizer_lr(optimizer, lr: float):
    """Write `lr` into a MindSpore optimizer's learning_rate Parameter (a float rate, not a dynamic one)."""
    import numpy as np
    from mindspore import Tensor
    param = optimizer.learning_rate
    param.set_data(Tensor(np.full(param.shape, lr, np.float32)))
