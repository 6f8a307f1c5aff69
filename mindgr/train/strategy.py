"""StepStrategy: how a run builds its data and model and trains one global batch; the loop
(mindgr.train.loop.TrainLoop) asks it for everything that is not the loop itself.

The loop owns the run directory (lock, resume refusals, data fingerprint, config.yaml), epochs and the
batch cursor, logging windows, stop signals, divergence checks, the evaluation cadence and `best`,
checkpoint files and the final summary. A strategy owns, in the order the loop calls it:

  check_config()              one-line ConfigError before anything is loaded or compiled
  writer, eval_ranks          does this process write the shared outputs; processes sharing an evaluation
  build_data(run_dir, resuming) -> plan
                              the task's data; `plan.num_batches(epoch)`, `plan.iter_batches(epoch, start)`
                              -> (batch number, indices) (a GR task brings its own token rows and plan;
                              a resumed run may read what it keeps in its run dir)
  on_run_dir(run_dir, fresh)  the writer, once the run dir is prepared (config, data fingerprint): what the
                              task keeps there (e.g. a GR run's own code table)
  describe_data() -> str      the data line of the log
  barrier()                   ranks meet (after the run directory is prepared)
  build(run)                  model, compiled step, host samplers; `run` is a RunContext
  shape                       StepShape: the step's global and per-rank capacities (computed once)
  stream(items)               the input stream, wrapped (the ranks' stop agreement)
  prepare(epoch, b, indices)  host work of one global batch, in the input thread: (inputs, info)
  set_learning_rate(lr)       the rate of the next steps (only under a non-constant train.lr_schedule)
  execute(prepared, step)     one optimizer step: (loss, seconds inside the step, info); info holds
                              "tokens", "fill" (logging) and whatever batch_flops needs
  batch_flops(info)           model FLOPs of that step (MFU)
  window_extra()              more fields (and text) for a logging window, at the same steps on every rank
  can_evaluate(split)         whether `split` has examples; evaluate(split, step) -> metrics
                              (dot-product ranking here, beam search -> ranks -> metrics for GR)
  baselines() -> dict         figures for the final result, e.g. {"popularity_test": metrics}
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
class RunContext:
    """What the loop hands a strategy when it builds: the config, where the run writes, its log."""
    cfg: object                  # mindgr.config.Config
    run_dir: Path
    ckpt_dir: Path               # run_dir / checkpoints
    log: object                  # MetricsLog (writer) or a log that drops everything


class StepStrategy(abc.ABC):
    """The interface of the module docstring; defaults are those of one process."""

    def __init__(self, cfg):
        self.cfg = cfg

    # ---- who this process is ------------------------------------------------------------------
    @property
    def writer(self) -> bool:
        return True

    @property
    def eval_ranks(self) -> int:
        return 1

    def check_config(self):
        """Raise ConfigError for a config this strategy cannot train."""

    def barrier(self):
        pass

    # ---- data and model ------------------------------------------------------------------------
    @abc.abstractmethod
    def build_data(self, run_dir: Path, resuming: bool):
        """Load the task's data; returns its batch plan (also kept as self.plan)."""

    def on_run_dir(self, run_dir: Path, fresh: bool):
        """Called on the writer after the run dir is prepared; `fresh`: not a resume."""

    @abc.abstractmethod
    def describe_data(self) -> str:
        ...

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
        read by the compiled step, so no recompilation. A strategy with another optimizer sets that too."""
        set_optimizer_lr(self.model.optimizer, lr)

    @abc.abstractmethod
    def execute(self, prepared, step: int):
        ...

    @abc.abstractmethod
    def batch_flops(self, info: dict) -> float:
        ...

    def window_extra(self) -> tuple[dict, str]:
        return {}, ""

    # ---- evaluation ----------------------------------------------------------------------------
    @abc.abstractmethod
    def can_evaluate(self, split: str) -> bool:
        ...

    @abc.abstractmethod
    def evaluate(self, split: str, step: int) -> dict:
        ...

    def baselines(self) -> dict:
        return {}

    # ---- state ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def named_state(self) -> dict:
        ...

    @abc.abstractmethod
    def restore(self, tensors: dict, path: Path):
        ...

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
