"""Task: WHAT a run trains, apart from how it is executed (mindgr.train.executor).

A task owns its data and batch plan, the model it trains and its host draws, the inputs of a step (of the
whole global batch, or of one rank's share of it), the FLOPs of a step, its evaluation, and, for a saved
run, how the run is loaded, evaluated, served and exported. Any executor (one process, data parallel,
sharded table) runs any task that accepts it in check_config. Which task a config or a run is:
mindgr.train.tasks (the registry).

RetrievalTask (here): next-item retrieval over the catalogue, sampled-softmax training and full-ranking
evaluation. GenerativeTask (mindgr.train.generative): the GR decoder trained by next-token prediction of
semantic IDs, evaluated by trie-constrained beam search.
"""
from __future__ import annotations

import abc
import time
from pathlib import Path

import numpy as np

from mindgr.config import ConfigError


class Task(abc.ABC):
    """The interface the executors, the loop and the run-level commands use; see the module docstring."""

    name = ""                 # the registry's name (mindgr.train.tasks.TASKS)
    serving = ""              # which serving model serves its runs (mindgr.serve.models.SERVING_MODELS)
    samples_users = False     # `mindgr eval --max-users` applies (a decode of a fixed user sample)
    semantic_ids = False      # trains over a semantic-ID code table (ids.codes / ids.from_run)
    ranks_users = True        # its evaluation ranks items per user (RUN/ranks/ files, `mindgr compare`)

    def __init__(self, cfg):
        self.cfg = cfg
        self.data = None      # set by load()
        self.plan = None

    # ---- config ---------------------------------------------------------------------------------
    def check_config(self, executor: str):
        """ConfigError for a config this task cannot train, or cannot train with `executor` ("local",
        "data_parallel", "sharded_table"); called before any data loads."""
        from mindgr.models import model_spec
        model_spec(self.cfg.model.arch)  # an unknown model.arch is a config error before any data loads

    # ---- data -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def load(self, run_dir: Path, resuming: bool):
        """Load the data (a resumed run may read what it keeps in its run dir); returns the batch plan."""

    def on_run_dir(self, run_dir: Path, fresh: bool):
        """The writer, once the run dir is prepared (config, data fingerprint): what the task keeps there."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The data line of the log."""

    @property
    @abc.abstractmethod
    def examples(self):
        """The examples the plan batches: `.lengths` (tokens of each), `.token_capacity`, `.row_capacity`
        (the global batch's)."""

    def example_weights(self):
        """Each example's share of the loss normaliser (indexable by an index array), or None: its target
        tokens. A rank's loss is weighted by its examples' share of the global batch's."""
        return None

    def rank_capacities(self, world: int, slack: float) -> tuple[int, int]:
        """(tokens, rows) of one rank's share of a global batch: the global ones / world with `slack`."""
        import math
        ex = self.examples
        tokens = math.ceil(ex.token_capacity / world * (1.0 + slack) / 8) * 8
        rows = max(math.ceil(ex.row_capacity / world * (1.0 + slack)), 1)
        return int(tokens), int(rows)

    # ---- model and step inputs ------------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self, log):
        """The model (`.encoder`, `.loss_net`, `.optimizer`, `.train_step`) and the host draws."""

    @abc.abstractmethod
    def inputs(self, epoch: int, b: int, indices):
        """(inputs with .tensors(), info) of the whole global batch `b`; info has "tokens", "fill" and what
        flops() needs."""

    @abc.abstractmethod
    def rank_inputs(self, epoch: int, b: int, indices, share, shape):
        """(inputs with .tensors(), info) of one rank's share (mindgr.parallel.plan.RankShare) of global
        batch `b` (examples `indices`), packed at the rank's capacities (shape: StepShape), its loss weighted
        by share.scale; info's figures are the global batch's."""

    @abc.abstractmethod
    def flops(self, info: dict) -> float:
        """Model FLOPs (forward + backward) of a step, from its info."""

    # Whether evaluation during training runs apart from the training step in memory: every compiled graph
    # is freed before each evaluation (the step compiles again at the next step) and the evaluation's own
    # after it, so that the two never hold memory at once (the local executor; GR's decoding graphs are
    # as large as its training step's).
    eval_apart = False

    def release_eval(self):
        """Drop what an evaluation kept for the next one (its compiled graphs are freed after this)."""

    def train_step(self, model, inputs) -> float:
        """One training step of the local executor on prepared inputs -> its loss: the model's compiled train
        step (a task whose step is more than one update, e.g. rollouts then several updates, overrides it)."""
        return float(model.train_step(*inputs.tensors()).asnumpy())

    def window_extra(self) -> tuple[dict, str]:
        """More fields (and text) for a logging window, summed by the task since the last window."""
        return {}, ""

    def calibration_inputs(self) -> dict | None:
        """What the data-parallel cost-model probe (mindgr.parallel.calibrate) needs to build synthetic
        steps of this task, or None: its ranks are then balanced by the configured cost model."""
        return None

    # ---- evaluation -----------------------------------------------------------------------------
    def can_evaluate(self, split: str) -> bool:
        return self.data.eval[split] is not None

    @abc.abstractmethod
    def evaluate(self, model, split: str, ctx) -> dict:
        """Metrics of `split` with the model's current weights; ctx (mindgr.train.executor.EvalContext): the
        executor's dot-product ranking (one process or split over ranks), the log, the run dir, writer."""

    def baselines(self) -> dict:
        return {}

    def selection(self) -> tuple[str, bool]:
        """(validation metric that chooses `best`, whether higher is better): NDCG@10 (or at the largest K)."""
        ks = self.cfg.eval.ks
        return f"ndcg@{10 if 10 in ks else max(ks)}", True

    def restored(self, path: Path | None):
        """The model's weights are exactly checkpoint `path` (None: a step moved them on)."""

    # ---- saved runs (eval, compare, serve, export) --------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def load_run(cls, run_dir, which: str = "best", allow_data_change: bool = False, threads: int | None = None):
        """A saved run with its checkpoint restored, ready to score."""

    @classmethod
    @abc.abstractmethod
    def evaluate_run(cls, run_dir, split: str, which: str, allow_data_change: bool, filter_history,
                     max_users: int) -> dict:
        """`mindgr eval` of a saved run; writes its per-user ranks (RUN/ranks/) for `mindgr compare`."""


class ArrayInputs(tuple):
    """A step's inputs as a tuple of numpy arrays, in the order of the loss cell's arguments."""

    def tensors(self) -> list:
        from mindspore import Tensor
        return [Tensor(x) for x in self]


class RetrievalTask(Task):
    """Next-item retrieval over the catalogue: sequences -> sampled-softmax training, full-ranking eval."""

    name = "retrieval"
    serving = "retrieval"

    def __init__(self, cfg, check_negatives: bool = True):
        """check_negatives=False: a task that reuses the data but draws no item negatives (GR)."""
        super().__init__(cfg)
        self.check_negatives = check_negatives
        self.seq_draws = None

    def check_config(self, executor: str):
        super().check_config(executor)
        neg = self.cfg.loss.negatives
        if executor != "local" and neg != "per_token" and not (executor == "sharded_table" and neg == "shared_pool"):
            raise ConfigError(f"config: loss.negatives = {neg!r}: with more than one process only per_token is "
                              "supported (and shared_pool with a sharded table, parallel.sparse)")

    def load(self, run_dir=None, resuming: bool = False):
        from mindgr.train.data import RunData
        cfg = self.cfg
        t0 = time.perf_counter()
        self.data = RunData(cfg)                         # a failed load leaves no run dir behind
        self.load_s = time.perf_counter() - t0
        c, n = cfg.loss, self.data.num_items
        if self.check_negatives and c.negatives == "per_token" and c.num_negatives > n:
            raise ConfigError(f"config: loss.num_negatives = {c.num_negatives} is larger than the catalogue "
                              f"({n} items): every token would draw repeats of the same items; use at most {n}")
        self.plan = self.data.plan
        return self.plan

    def describe(self) -> str:
        d, tr = self.data, self.data.train
        return (f"{d.store.num_users} users, {d.num_items} items, {len(tr.inputs)} training sequences, capacity "
                f"{tr.token_capacity} tokens x {tr.row_capacity} rows, {d.plan.num_batches(0)} batches/epoch "
                f"({self.load_s:.1f}s)")

    @property
    def examples(self):
        return self.data.train

    # ---- model and step inputs ------------------------------------------------------------------
    def build_model(self, log=None):
        from mindgr.train.local import Model
        self.model = Model(self.cfg, self.data.num_items)
        self.sampler = self.make_sampler(self.model.encoder)
        return self.model

    def make_sampler(self, encoder):
        from mindgr.train.local import HostSampler
        from mindgr.train.negatives import item_frequencies
        d = self.data
        return HostSampler(self.cfg, d.num_items, encoder, d.train.token_capacity,
                           item_frequencies(d.split.train, d.num_items))

    def inputs(self, epoch: int, b: int, indices):
        """Host work for batch `b` of `epoch` (in the input thread): (step inputs, what is trained)."""
        from mindgr.train.step import StepInputs
        batch = self.data.train.batch(indices)
        negatives, drop = self.sampler.draw(epoch, b, batch.targets)
        return StepInputs.from_batch(batch, negatives, drop), {
            "tokens": batch.num_tokens, "fill": batch.fill, "lengths": np.diff(batch.offsets[: batch.num_rows + 1]),
            "targets": int((batch.targets > 0).sum())}

    def rank_inputs(self, epoch: int, b: int, indices, share, shape):
        """This rank's sequences packed at its capacities, with its rows of the single-process draws (or its
        own per-sequence draws under parallel.draws=sequence); a shared pool is the single process's, whole."""
        from mindgr.datasets import build_batch
        from mindgr.train.rank_draws import SequenceDraws, local_rows
        from mindgr.train.step import StepInputs
        tr, sh = self.data.train, shape
        batch = build_batch(share.indices, tr.inputs, tr.times, tr.targets, sh.rank_tokens, sh.rank_rows,
                            tr.request_times)
        shared = self.sampler.negatives.shared
        if self.cfg.parallel.draws == "sequence":
            if self.seq_draws is None:
                sites, _, width = self.sampler.shape
                self.seq_draws = SequenceDraws(self.cfg.run.seed, self.data.num_items,
                                               0 if shared else self.cfg.loss.num_negatives,
                                               self.cfg.model.dropout, sites, width)
            negatives, drop = self.seq_draws.draw(epoch, share.indices, tr.lengths[share.indices], sh.rank_tokens)
        else:                    # the single-process draws: negatives of the global batch, masks of own rows
            if not shared:
                negatives = local_rows(self.sampler.draw_negatives(epoch, b), share.token_src, sh.rank_tokens, fill=1)
            drop = self.sampler.masks.rows(epoch, b, share.token_src, sh.rank_tokens)
        if shared:    # the single process's pool of the global batch: the same ids on every rank, whatever draws
            negatives = self.sampler.draw_negatives(epoch, b)
        inputs = StepInputs.from_batch(batch, negatives, drop, share.scale)
        return inputs, {"tokens": share.global_tokens, "lengths": share.lengths, "targets": share.global_targets}

    def flops(self, info: dict) -> float:
        from mindgr.train.flops import train_flops
        return train_flops(self.cfg.model, info["lengths"], info["targets"], self.sampler.negatives.num_candidates)

    def calibration_inputs(self) -> dict:
        sites, _, width = self.sampler.shape
        return {"num_items": self.data.num_items, "num_negatives": self.cfg.loss.num_negatives, "sites": sites,
                "width": width}

    # ---- evaluation -----------------------------------------------------------------------------
    def evaluate(self, model, split: str, ctx) -> dict:
        return ctx.rank_items(model, self.data.eval[split], getattr(self.data.split, split), self.cfg.eval.ks,
                              self.cfg.eval.filter_history)

    def baselines(self) -> dict:
        from mindgr.train.metrics import popularity_metrics
        d = self.data
        if d.eval["test"] is None:
            return {}
        return {"popularity_test": popularity_metrics(d.split.train, d.num_items, d.split.test, self.cfg.eval.ks)}

    # ---- saved runs -----------------------------------------------------------------------------
    @classmethod
    def load_run(cls, run_dir, which: str = "best", allow_data_change: bool = False, threads: int | None = None):
        from mindgr.train.saved_run import load_run
        return load_run(run_dir, which, allow_data_change, threads)

    @classmethod
    def evaluate_run(cls, run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                     filter_history=None, max_users: int | None = None) -> dict:
        from mindgr.train.saved_run import evaluate_run
        if max_users:
            raise ValueError("eval: --max-users applies to generative runs (model.arch gr) only")
        return evaluate_run(run_dir, split, which, allow_data_change, filter_history)
