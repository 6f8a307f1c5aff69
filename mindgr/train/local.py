"""The local executor: one process trains the whole global batch of any task with one compiled TrainStep;
and the retrieval task's model (encoder, loss, optimizer, cells) and host draws (negatives, dropout masks).

Everything random on the host (negatives, dropout masks) is drawn from generators seeded by
(seed, epoch, batch), so a run resumed from a checkpoint replays exactly what an uninterrupted run does.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.config import Config
from mindgr.train.executor import Executor, RunContext, StepShape


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


class LocalExecutor(Executor):
    """One process, the whole global batch, one TrainStep (the model's own), for any task."""

    kind = "local"

    def build(self, run: RunContext):
        self.run = run
        ex = self.task.examples
        self.shape = StepShape.single(ex.token_capacity, ex.row_capacity)
        self.model = self.task.build_model(run.log)

    def prepare(self, epoch: int, b: int, indices):
        """Host work for batch `b` of `epoch` (in the input thread): (step inputs, what is trained)."""
        return self.task.inputs(epoch, b, indices)

    def evaluate(self, split: str, step: int) -> dict:
        """The task's evaluation; with task.eval_apart, after every compiled graph is freed (the training
        step's compiles again at the next step) and, during training, with its own graphs freed after it."""
        from mindgr.train.memory import release_memory
        if not self.task.eval_apart:
            return super().evaluate(split, step)
        release_memory(graphs=True)
        try:
            return super().evaluate(split, step)
        finally:
            if not self.training_over:
                self.task.release_eval()
                release_memory(graphs=True)

    training_over = False

    def training_done(self):
        """The final evaluation follows: the training step's graph is not needed again."""
        self.training_over = True
        if self.task.eval_apart:
            from mindgr.train.memory import release_memory
            release_memory(graphs=True)

    def execute(self, prepared, step: int):
        """One optimizer step on prepared inputs: (loss, seconds inside the compiled step, info)."""
        inputs, info = prepared
        self.task.restored(None)             # the weights move on from any restored checkpoint
        t0 = time.perf_counter()
        loss = self.task.train_step(self.model, inputs)
        return loss, time.perf_counter() - t0, info
