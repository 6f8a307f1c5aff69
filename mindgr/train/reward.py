"""The reward model: `loss.objective: rating` trains a predictor of the value a user gives an item (a rating)
from the user's history, through `mindgr train` / `mindgr eval` like any run; and its scorer for other
tasks (load_reward_scorer: RewardScorer.score(histories, items) -> predicted values).

The model (mindgr.models.rating): an item encoder (model.arch hstu, or any item encoder) reads the history;
r_hat = <W h_{t-1}, sqrt(D) e_t> + b_item(t) + b_global, with h_{t-1} the encoder's state after the items
before t and e_t the encoder's own embedding of item t. Training: the mean squared error of r_hat against
the observed value at every position of the training sequences (their last data.max_len items, one jagged
pass per batch); b_global starts at the mean training value. The split is the retrieval one (data.holdout
2: test = a user's last interaction, validation = the one before, training = the rest), so the validation
and test targets are values the model never saw. Evaluation: RMSE, MAE and the AUC of liked (value >= 4)
against disliked (<= 2) targets (mindgr.train.reward_metrics), beside the global / item / user means of the
training values; `best` is the checkpoint of the lowest validation RMSE. The run directory, checkpoints,
resume and logging are the loop's (mindgr.train.loop); the task trains on the local executor.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.config import Config, ConfigError
from mindgr.train.task import ArrayInputs, Task

PREDICTIONS_DIR = "predictions"      # RUN/predictions/{split}-{which}.npz: `mindgr eval`'s per-user predictions


def check_reward_config(cfg: Config, executor: str = "local"):
    """One-line ConfigError for a config the reward task cannot train (before any data loads)."""
    from mindgr.models.objectives import check_objective_arch
    check_objective_arch(cfg)        # an item encoder reads the history (the GR decoder is refused there)
    if executor != "local":
        raise ConfigError("config: loss.objective = rating trains in one process so far (parallel.nproc = 1, "
                          "parallel.sparse = none)")
    d = cfg.data
    if d.holdout != 2 or d.holdout_unit != "item":
        raise ConfigError(f"config: loss.objective = rating chooses its checkpoint on held-out values: it needs "
                          f"data.holdout = 2 and data.holdout_unit = item (got {d.holdout}, {d.holdout_unit})")
    if cfg.model.request_time:
        raise ConfigError("config: loss.objective = rating scores a history without a request time: set "
                          "model.request_time = false")


def training_values(split, max_len: int) -> tuple[list, list]:
    """(values of the inputs, values of the targets) of every training example (float32), beside
    mindgr.datasets.training_examples's inputs and targets: the same sequences (2 items or more), the same
    last max_len positions."""
    kept = [v for s, v in zip(split.train, split.train_values) if len(s) >= 2]
    return ([np.asarray(v[:-1][-max_len:], np.float32) for v in kept],
            [np.asarray(v[1:][-max_len:], np.float32) for v in kept])


class IndexedExamples:
    """Examples packed with each token's flat index + 1 as its `target` (0 = padding), so that per-token
    arrays of any type (target items, values) are gathered from flat arrays after packing."""

    def __init__(self, examples):
        from mindgr.train.data import Examples
        lengths = np.array([len(x) for x in examples.inputs], np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        index = [np.arange(a + 1, a + n + 1, dtype=np.int32) for a, n in zip(starts, lengths)]
        self.examples = Examples(examples.inputs, examples.times, index, examples.token_capacity,
                                 examples.row_capacity, examples.request_times)

    def batch(self, indices):
        """(JaggedBatch, the flat index of each token [T_cap] int64, -1 for padding)."""
        batch = self.examples.batch(indices)
        return batch, batch.targets.astype(np.int64) - 1


def gather_tokens(flat: np.ndarray, index: np.ndarray, fill=0):
    """flat[index] where index >= 0, `fill` elsewhere."""
    return np.where(index >= 0, flat[np.maximum(index, 0)], fill).astype(flat.dtype)


class RewardData:
    """RunData (store, split, eval sets, batch plan) plus the values: every training token's target item and
    value, reached through the packed batch's `targets`, which hold each token's flat index + 1 (0 = none)."""

    def __init__(self, cfg: Config):
        from mindgr.train.data import RunData
        from mindgr.train.reward_metrics import MeanBaselines
        data = RunData(cfg)
        store = data.store
        if not store.has_values:
            raise ConfigError(f"config: loss.objective = rating needs a value per interaction, and data '{store.name}' "
                              "has none (a MovieLens ratings file, data.csv.value_column, data.synthetic.values)")
        self.data = data
        split, tr = data.split, data.train
        in_values, values = training_values(split, cfg.data.max_len)
        assert len(values) == len(tr.targets) and all(len(v) == len(t) for v, t in zip(values, tr.targets))
        self.target_items = np.concatenate(tr.targets).astype(np.int32)
        self.target_values = np.concatenate(values).astype(np.float32)
        self.input_values = np.concatenate(in_values).astype(np.float32)
        self.indexed = IndexedExamples(tr)
        self.train = self.indexed.examples
        self.plan = data.plan
        self.eval = {}                 # split -> (IndexedExamples of its histories, their values flat)
        for name in ("valid", "test"):
            evalset, examples = getattr(split, name), data.eval[name]
            if examples is not None:
                hist = [np.asarray(v[-cfg.data.max_len:], np.float32) for v in evalset.history_values]
                self.eval[name] = (IndexedExamples(examples), np.concatenate(hist))
        users = np.repeat(split.train_users, [len(s) for s in split.train])      # every training interaction
        self.baselines = MeanBaselines(users, np.concatenate(split.train), np.concatenate(split.train_values),
                                       store.num_items, store.num_users)

    def step_arrays(self, indices):
        """(batch, input values [T_cap] float32, target items [T_cap] int32, target values [T_cap] float32) of
        the training examples `indices`."""
        batch, index = self.indexed.batch(indices)
        return (batch, gather_tokens(self.input_values, index), gather_tokens(self.target_items, index),
                gather_tokens(self.target_values, index))

    def predict(self, score_cell, split: str, items: np.ndarray) -> np.ndarray:
        """r_hat of items [n, G] after each `split` history (valid or test) -> [n, G]."""
        examples, values = self.eval[split]
        return predict_last(score_cell, examples, values, items)


class RewardModel:
    """Encoder, rating loss, optimizer and the compiled train step; `score`: the last-position scorer."""

    def __init__(self, cfg: Config, num_items: int):
        from mindgr.models import build_encoder
        from mindgr.models.objectives import build_objective
        from mindgr.models.rating import ScoreLast
        from mindgr.train.step import TrainStep, build_optimizer
        self.encoder = build_encoder(cfg.model, num_items, cfg.data.max_len, cfg.run.seed)
        self.loss_net = build_objective(cfg, self.encoder, num_items)
        self.optimizer = build_optimizer(self.loss_net.trainable_params(), cfg.train)
        self.train_step = TrainStep(self.loss_net, self.optimizer)
        self.score = ScoreLast(self.loss_net)

    def set_global_bias(self, value: float):
        from mindspore import Tensor
        self.loss_net.head.global_bias.set_data(Tensor(np.full((1,), value, np.float32)))


def predict_last(score_cell, indexed: IndexedExamples, values: np.ndarray, items: np.ndarray) -> np.ndarray:
    """r_hat of items [n, G] for every example's whole history (the examples' own batches; `values`: the
    histories' values, flat) -> [n, G]."""
    from mindspore import Tensor
    from mindgr.train.step import encoder_inputs
    items = np.asarray(items, np.int32)
    out = np.full(items.shape, np.nan, np.float32)
    examples = indexed.examples
    for indices in examples.plan():
        indices = np.asarray(indices, np.int64)
        batch, index = indexed.batch(indices)
        rows = np.zeros((examples.row_capacity, items.shape[1]), np.int32)
        rows[: len(indices)] = items[indices]
        arrays = encoder_inputs(batch) + (gather_tokens(values, index), rows)
        out[indices] = score_cell(*[Tensor(x) for x in arrays]).asnumpy()[: len(indices)]
    return out


class RewardTask(Task):
    """The reward model (module docstring): RewardData, RewardModel, MSE steps, RMSE / AUC evaluation."""

    name = "reward"
    serving = ""              # no serving model: other tasks load its scorer (load_reward_scorer)
    ranks_users = False       # no per-user ranking: `mindgr compare` does not apply

    def check_config(self, executor: str):
        super().check_config(executor)
        check_reward_config(self.cfg, executor)

    def load(self, run_dir, resuming: bool):
        import time
        t0 = time.perf_counter()
        self.reward = RewardData(self.cfg)
        self.load_s = time.perf_counter() - t0
        self.data = self.reward.data
        self.plan = self.reward.plan
        return self.plan

    def describe(self) -> str:
        d, tr = self.data, self.reward.train
        return (f"{d.store.num_users} users, {d.num_items} items, {len(tr.inputs)} training sequences, "
                f"{len(self.reward.target_values)} training values (mean {self.reward.baselines.global_mean:.3f}), "
                f"capacity {tr.token_capacity} tokens x {tr.row_capacity} rows, {self.plan.num_batches(0)} "
                f"batches/epoch ({self.load_s:.1f}s)")

    @property
    def examples(self):
        return self.reward.train

    def build_model(self, log=None):
        from mindgr.train.masks import DropoutMasks
        self.model = RewardModel(self.cfg, self.data.num_items)
        self.model.set_global_bias(self.reward.baselines.global_mean)    # a resume restores its own
        enc = self.model.encoder
        self.masks = DropoutMasks(self.cfg.run.seed, self.cfg.model.dropout,
                                  (enc.dropout_sites, self.reward.train.token_capacity, enc.dropout_width))
        return self.model

    def inputs(self, epoch: int, b: int, indices):
        batch, in_values, items, values = self.reward.step_arrays(indices)
        drop = self.masks.batch(epoch, b)
        arrays = (batch.ids, batch.positions, batch.offsets, batch.timestamps, batch.request_times, in_values, items,
                  values, drop)
        return ArrayInputs(arrays), {"tokens": batch.num_tokens, "fill": batch.fill,
                                     "lengths": np.diff(batch.offsets[: batch.num_rows + 1]),
                                     "targets": int((items > 0).sum())}

    def rank_inputs(self, epoch: int, b: int, indices, share, shape):
        raise ConfigError("config: loss.objective = rating trains in one process so far")

    def flops(self, info: dict) -> float:
        from mindgr.models import model_spec
        from mindgr.models.rating import rating_flops
        fwd = model_spec(self.cfg.model.arch).encoder_flops(self.cfg.model, info["lengths"])
        return 3.0 * (fwd + rating_flops(self.cfg.model, info["targets"], 1))

    # ---- evaluation -----------------------------------------------------------------------------
    def selection(self) -> tuple[str, bool]:
        return "rmse", False      # best = the lowest validation RMSE

    def evaluate(self, model, split: str, ctx) -> dict:
        from mindgr.train.reward_metrics import rating_metrics
        evalset = getattr(self.data.split, split)
        pred = self.reward.predict(model.score, split, np.asarray(evalset.targets)[:, None])[:, 0]
        return rating_metrics(pred, evalset.target_values)

    def baselines(self) -> dict:
        from mindgr.train.reward_metrics import rating_metrics
        out = {}
        for split in ("valid", "test"):
            evalset = getattr(self.data.split, split)
            if len(evalset.targets) == 0:
                continue
            preds = self.reward.baselines.predictions(evalset.users, evalset.targets)
            for name, pred in preds.items():
                out[f"{name}_{split}"] = rating_metrics(pred, evalset.target_values)
        return out

    # ---- saved runs -----------------------------------------------------------------------------
    @classmethod
    def load_run(cls, run_dir, which: str = "best", allow_data_change: bool = False, threads: int | None = None):
        return load_reward_scorer(run_dir, which, threads=threads)

    @classmethod
    def evaluate_run(cls, run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                     filter_history=None, max_users: int | None = None) -> dict:
        return evaluate_reward_run(run_dir, split, which, allow_data_change, max_users)


# ---- the scorer (what other tasks call) ---------------------------------------------------------------
@dataclass
class RewardScorer:
    """A trained reward model, ready to score: `score(histories, items)` -> predicted values [U, G] float32.

    Batched at static shapes: users in chunks of `rows` (the last chunk padded with empty rows), the tokens
    of a chunk packed at the next power of two >= 64 that holds them (at most rows * max_history), so a
    caller with fixed group sizes compiles a handful of graphs, one per shape. Each history keeps its last
    `max_history` items (data.max_len, as in training)."""
    cfg: Config
    run_dir: Path
    model: RewardModel        # the checkpoint's weights, dropout off
    num_items: int
    max_history: int
    checkpoint: str           # the checkpoint file loaded
    step: int | None
    uses_times: bool          # the encoder reads timestamps (model.time_bias): score() needs history_times
    uses_values: bool         # the encoder reads the history's values (model.value_input): score() needs them
    rows: int = 256

    def score(self, histories, items, history_values=None, history_times=None) -> np.ndarray:
        """histories: U arrays of item ids (1..num_items, oldest first, at least one each); items [U, G] int
        item ids to score for each user; history_values: U float arrays, the value of each history item
        (only for a model trained with model.value_input); history_times: U int64 arrays in seconds (only
        for a model with a time bias). Returns r_hat [U, G] float32: the predicted value of each item after
        its history."""
        items = np.asarray(items)
        if items.ndim != 2 or len(histories) != items.shape[0]:
            raise ValueError(f"score: items must be [U, G] for U = {len(histories)} histories, got shape "
                             f"{items.shape}")
        if items.size and (items.min() < 1 or items.max() > self.num_items):
            raise ValueError(f"score: item ids must be in 1..{self.num_items}")
        if self.uses_times and history_times is None:
            raise ValueError("score: this reward model has a time bias (model.time_bias): pass history_times")
        if self.uses_values and history_values is None:
            raise ValueError("score: this reward model reads the history's values (model.value_input): pass "
                             "history_values")
        inputs, times, values = [], [], []
        for u, h in enumerate(histories):
            h = np.asarray(h, np.int64)
            if len(h) == 0 or h.min() < 1 or h.max() > self.num_items:
                raise ValueError(f"score: history {u} must hold 1 or more item ids in 1..{self.num_items}")
            inputs.append(h[-self.max_history:].astype(np.int32))
            t = np.zeros(len(h), np.int64) if history_times is None else np.asarray(history_times[u], np.int64)
            if len(t) != len(h):
                raise ValueError(f"score: history {u} has {len(h)} items and {len(t)} times")
            times.append(t[-self.max_history:])
            v = np.zeros(len(h), np.float32) if history_values is None else np.asarray(history_values[u], np.float32)
            if len(v) != len(h) or not np.isfinite(v).all():
                raise ValueError(f"score: history {u} has {len(h)} items and needs as many finite values "
                                 f"(got {len(v)})")
            values.append(v[-self.max_history:])
        out = np.empty(items.shape, np.float32)
        rows = max(1, min(self.rows, len(inputs)))
        for lo in range(0, len(inputs), rows):
            chunk = np.arange(lo, min(lo + rows, len(inputs)))
            out[chunk] = self._score_chunk([inputs[i] for i in chunk], [times[i] for i in chunk],
                                           [values[i] for i in chunk], items[chunk], rows)
        return out

    def _score_chunk(self, inputs, times, values, items, rows: int) -> np.ndarray:
        from mindspore import Tensor
        from mindgr.datasets import build_batch
        from mindgr.train.step import encoder_inputs
        total = sum(len(x) for x in inputs)
        capacity = min(max(64, 1 << (total - 1).bit_length()), rows * self.max_history)
        targets = [np.zeros(len(x), np.int32) for x in inputs]
        batch = build_batch(np.arange(len(inputs)), inputs, times, targets, capacity, rows)
        in_values = np.zeros(capacity, np.float32)
        in_values[: batch.num_tokens] = np.concatenate(values)     # build_batch packs rows in order, no gaps
        padded = np.zeros((rows, items.shape[1]), np.int32)
        padded[: len(inputs)] = items
        arrays = encoder_inputs(batch) + (in_values, padded)
        scores = self.model.score(*[Tensor(x) for x in arrays]).asnumpy()
        return scores[: len(inputs)]


def load_reward_scorer(run_dir, checkpoint: str = "best", threads: int | None = None, setup: bool = True,
                       rows: int = 256) -> RewardScorer:
    """The reward model of a `loss.objective: rating` run with its best (or latest) checkpoint restored.
    setup=True sets up MindSpore for the run (graph mode, device, seed, ops backend: a process of its
    own); a process that already set itself up (a training run calling the scorer) passes False."""
    from mindgr.models import model_spec
    from mindgr.train.checkpoint import CheckpointError, load_checkpoint, restore_parameters
    from mindgr.train.rundir import run_config, saved_checkpoint
    from mindgr.runtime import setup_mindspore
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if cfg.loss.objective != "rating":
        raise CheckpointError(f"{run_dir}: not a reward model run (loss.objective = {cfg.loss.objective}, "
                              "expected rating)")
    if threads is not None:
        cfg.parallel.threads = threads
    path = saved_checkpoint(run_dir, cfg, checkpoint)
    if setup:
        setup_mindspore(cfg)
    tensors, meta = load_checkpoint(path)
    num_items = int(tensors[_item_table_name(tensors)].shape[0]) - 1
    model = RewardModel(cfg, num_items)
    restore_parameters(model.train_step, tensors, str(path))
    model.encoder.set_train(False)
    uses_times = bool(model_spec(cfg.model.arch).uses_timestamps and cfg.model.time_bias)
    return RewardScorer(cfg, run_dir, model, num_items, cfg.data.max_len, path.name, meta.get("step"), uses_times,
                        bool(cfg.model.value_input), rows)


def _item_table_name(tensors: dict) -> str:
    """The checkpoint's item table (the encoder's item_emb, not the optimizer's moments of it), whose rows
    give the catalogue size."""
    names = [k for k in tensors if k.endswith("item_emb") and not k.startswith("optimizer.")]
    if len(names) != 1:
        from mindgr.train.checkpoint import CheckpointError
        raise CheckpointError(f"a reward checkpoint with {len(names)} item tables (expected one *item_emb)")
    return names[0]


def evaluate_reward_run(run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                        max_users: int | None = None) -> dict:
    """`mindgr eval` of a reward run: its metrics on `split` and the baselines', per-user predictions saved to
    RUN/predictions/{split}-{which}.npz."""
    from mindgr.paths import atomic_write
    from mindgr.train.reward_metrics import rating_metrics
    from mindgr.train.rundir import data_change_note
    if max_users:
        raise ValueError("eval: --max-users applies to generative runs (model.arch gr) only")
    if split not in ("valid", "test"):
        raise ValueError(f"eval: split {split!r} (expected valid or test)")
    scorer = load_reward_scorer(run_dir, which)
    cfg = scorer.cfg
    note = data_change_note(scorer.run_dir, cfg, allow_data_change)
    reward = RewardData(cfg)
    evalset = getattr(reward.data.split, split)
    pred = reward.predict(scorer.model.score, split, np.asarray(evalset.targets)[:, None])[:, 0]
    out = {"run": str(scorer.run_dir), "split": split, "checkpoint": scorer.checkpoint, "step": scorer.step,
           **rating_metrics(pred, evalset.target_values)}
    for name, base in reward.baselines.predictions(evalset.users, evalset.targets).items():
        out[f"{name}_baseline"] = rating_metrics(base, evalset.target_values)
    path = scorer.run_dir / PREDICTIONS_DIR / f"{split}-{which}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: np.savez(tmp, predictions=pred, values=evalset.target_values,
                                            items=np.asarray(evalset.targets), users=evalset.users,
                                            checkpoint=scorer.checkpoint),
                 tmp_suffix=".tmp.npz")
    out["predictions_file"] = str(path)
    if note:
        out["data_note"] = note
    return out


def reward_trainer(cfg: Config, resume: bool = False, quiet: bool = False):
    """The training loop with the reward task on the local executor (what `mindgr train` runs for it)."""
    from mindgr.train.local import LocalExecutor
    from mindgr.train.loop import TrainLoop
    return TrainLoop(cfg, LocalExecutor(cfg, RewardTask(cfg)), resume, quiet)
