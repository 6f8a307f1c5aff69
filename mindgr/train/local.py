"""The local step strategy: one process trains the whole global batch with one compiled TrainStep.

Everything random on the host (negatives, dropout masks) is drawn from generators seeded by
(seed, epoch, batch), so a run resumed from a checkpoint replays exactly what an uninterrupted run does.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.config import Config
from mindgr.train.checkpoint import named_parameters, restore_parameters
from mindgr.train.step import StepInputs
from mindgr.train.strategy import RunContext, StepShape, StepStrategy


class Model:
    """Encoder, loss, optimizer and the compiled cells built from a config and the data's catalogue."""

    def __init__(self, cfg: Config, num_items: int):
        from mindgr.models import build_encoder
        from mindgr.models.objectives import build_objective
        from mindgr.train.step import EncodeLast, TrainStep, build_optimizer
        self.encoder = build_encoder(cfg.model, num_items, cfg.data.max_len, cfg.run.seed)
        self.loss_net = build_objective(cfg, self.encoder, num_items)
        self.optimizer = build_optimizer(self.encoder.trainable_params(), cfg.train)
        self.train_step = TrainStep(self.loss_net, self.optimizer)
        self.encode_last = EncodeLast(self.encoder)

    def item_table(self) -> np.ndarray:
        return self.encoder.item_table().asnumpy()


class HostSampler:
    """Negatives and dropout masks for one batch: negatives from a generator seeded by (seed, epoch,
    batch), masks from mindgr.train.masks (a stream of their own, so that a rank can draw its rows)."""

    def __init__(self, cfg: Config, num_items: int, encoder, token_capacity: int, frequencies=None):
        from mindgr.train.masks import DropoutMasks
        from mindgr.train.negatives import NegativeSampler
        self.seed, self.num_items = cfg.run.seed, num_items
        self.num_negatives, self.p = cfg.loss.num_negatives, cfg.model.dropout
        self.shape = (encoder.dropout_sites, token_capacity, encoder.dropout_width)
        self.token_capacity = token_capacity
        if frequencies is None:
            frequencies = np.concatenate([[0.0], np.full(num_items, 1.0 / num_items)])
        self.negatives = NegativeSampler(cfg.loss, num_items, frequencies, token_capacity)
        self.masks = DropoutMasks(cfg.run.seed, self.p, self.shape)

    def draw_negatives(self, epoch: int, batch: int, targets=None):
        """ids [T, R] (per_token) or (ids [K], logQ [K])."""
        rng = np.random.default_rng([self.seed, epoch, batch, 7])
        drawn = self.negatives.draw(rng, targets if targets is not None else np.zeros(0, np.int32))
        return drawn[0] if len(drawn) == 1 else drawn

    def draw(self, epoch: int, batch: int, targets=None):
        """(negatives, dropout masks [sites, T, width]) of the whole batch."""
        return self.draw_negatives(epoch, batch, targets), self.masks.batch(epoch, batch)


class RetrievalStrategy(StepStrategy):
    """What the item-retrieval strategies share: the task (data, FLOPs, baselines), the host sampler."""

    def check_config(self):
        from mindgr.models import model_spec
        model_spec(self.cfg.model.arch)  # an unknown model.arch is a config error before any data loads

    def build_data(self, run_dir, resuming: bool):
        from mindgr.train.task import ItemRetrievalTask
        self.task = ItemRetrievalTask(self.cfg)
        self.data = self.task.data
        self.plan = self.task.plan
        return self.plan

    def describe_data(self) -> str:
        return self.task.describe()

    def make_sampler(self, encoder) -> HostSampler:
        from mindgr.train.negatives import item_frequencies
        d = self.data
        return HostSampler(self.cfg, d.num_items, encoder, d.train.token_capacity,
                           item_frequencies(d.split.train, d.num_items))

    def batch_flops(self, info: dict) -> float:
        return self.task.flops(info, self.sampler.negatives.num_candidates)

    def can_evaluate(self, split: str) -> bool:
        return self.task.can_evaluate(split)

    def baselines(self) -> dict:
        return self.task.baselines()

    def evaluate(self, split: str, step: int) -> dict:
        self.model.encoder.set_train(False)
        try:
            return self.split_metrics(split)
        finally:
            self.model.encoder.set_train(True)

    def split_metrics(self, split: str) -> dict:
        from mindgr.train.evaluate import evaluate
        return evaluate(self.model.encode_last, self.model.item_table(), self.data.eval[split],
                        getattr(self.data.split, split), self.cfg.eval.ks, filter_history=self.cfg.eval.filter_history)

    def named_state(self) -> dict:
        return named_parameters(self.model.train_step)

    def restore(self, tensors: dict, path):
        restore_parameters(self.model.train_step, tensors, str(path))


class LocalStrategy(RetrievalStrategy):
    """One process, the whole global batch, one TrainStep."""

    def build(self, run: RunContext):
        self.run = run
        tr = self.data.train
        self.shape = StepShape.single(tr.token_capacity, tr.row_capacity)
        self.model = Model(self.cfg, self.data.num_items)
        self.sampler = self.make_sampler(self.model.encoder)

    def prepare(self, epoch: int, b: int, indices):
        """Host work for batch `b` of `epoch` (in the input thread): (step inputs, what is trained)."""
        batch = self.data.train.batch(indices)
        negatives, drop = self.sampler.draw(epoch, b, batch.targets)
        return StepInputs.from_batch(batch, negatives, drop), {
            "tokens": batch.num_tokens, "fill": batch.fill, "lengths": np.diff(batch.offsets[: batch.num_rows + 1]),
            "targets": int((batch.targets > 0).sum())}

    def execute(self, prepared, step: int):
        """One optimizer step on prepared inputs: (loss, seconds inside the compiled step, info)."""
        inputs, info = prepared
        tensors = inputs.tensors()
        t0 = time.perf_counter()
        loss = float(self.model.train_step(*tensors).asnumpy())
        return loss, time.perf_counter() - t0, info
