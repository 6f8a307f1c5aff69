"""The training loop: fixed-capacity jagged batches -> one compiled step -> logs, checkpoints, evaluation.

Everything random on the host (batch order, negatives, dropout masks) is drawn from generators seeded by
(seed, epoch, batch), so a run resumed from a checkpoint replays exactly what an uninterrupted run does.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

import numpy as np

from mindgr.config import Config, ConfigError, dump_config
from mindgr.runtime import setup_mindspore  # noqa: F401  (also imported from here by bench and tests)
from mindgr.train.checkpoint import (CheckpointError, CheckpointManager, load_checkpoint, named_parameters,
                                     restore_parameters)
from mindgr.train.logger import MetricsLog, format_metrics, write_json_atomic

# Config keys a resumed run may change; anything else would change what is being trained.
RESUMABLE_CHANGES = {"train.epochs", "train.max_steps", "run.log_every", "run.keep_last", "run.ckpt_every",
                     "eval.every_epochs", "eval.ks", "ops.backend", "data.prefetch"}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume_config(saved: dict, current: dict):
    a, b = _flatten(saved), _flatten(current)
    defaults = _flatten(Config().to_dict())
    for key in sorted(set(a) | set(b)):
        if key not in a and b.get(key) == defaults.get(key):
            continue  # a key newer than the run, left at its default, changes nothing
        if key.startswith("parallel."):
            continue  # how many ranks train a global batch never changes what is trained
        if key not in RESUMABLE_CHANGES and a.get(key) != b.get(key):
            raise ConfigError(f"config: {key} = {b.get(key)!r} differs from the run being resumed "
                              f"({a.get(key)!r}); only {', '.join(sorted(RESUMABLE_CHANGES))} may change")


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


class StopSignals:
    """SIGINT / SIGTERM ask the loop to stop at the next step boundary, where it saves a checkpoint.

    MindSpore turns Ctrl-C into SIGTERM to its own process, so both are caught; a second signal while
    stopping ends the process at once.
    """

    def __init__(self):
        self.signum = None
        self._old = {}

    def _handler(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        import signal
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


@contextlib.contextmanager
def _paused(window: dict):
    """Time spent outside the training loop (evaluation, checkpoints), kept out of its busy fraction."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        window["pause_s"] += time.perf_counter() - t0


class _StopRequested(Exception):
    """A stop signal arrived; raised at a step boundary so that the checkpoint is consistent."""


class Trainer:
    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False):
        self.cfg = cfg
        from mindgr.models import model_spec
        model_spec(cfg.model.arch)  # an unknown model.arch is a config error before any data loads
        self.backend = setup_mindspore(cfg)
        self.run_dir = cfg.run_dir
        self.ckpts = CheckpointManager(self.run_dir, cfg.run.keep_last)
        self._prepare_run_dir(resume)
        from mindgr.train.data import RunData
        t0 = time.perf_counter()
        self.data = RunData(cfg)
        self.log = self._make_log(quiet)
        tr = self.data.train
        self.log.info(f"data: {self.data.store.num_users} users, {self.data.num_items} items, "
                      f"{len(tr.inputs)} training sequences, capacity {tr.token_capacity} tokens x "
                      f"{tr.row_capacity} rows, {self.data.plan.num_batches(0)} batches/epoch "
                      f"({time.perf_counter() - t0:.1f}s) | ops backend: {self.backend}")
        self.model = self._build_model()
        from mindgr.train.negatives import item_frequencies
        self.sampler = HostSampler(cfg, self.data.num_items, self.model.encoder, tr.token_capacity,
                                   item_frequencies(self.data.split.train, self.data.num_items))
        self.step, self.epoch, self.next_batch = 0, 0, 0
        self.best = {"metric": -1.0, "epoch": None}
        self.history: list[dict] = []
        if resume:
            self._resume()

    # Hooks a multi-process trainer (mindgr.parallel.trainer) overrides: who writes shared outputs,
    # how one global batch is trained, how checkpoints are committed.
    writer = True

    def _make_log(self, quiet: bool):
        return MetricsLog(self.run_dir, quiet)

    def _build_model(self):
        return Model(self.cfg, self.data.num_items)

    # ---- run directory and resume ---------------------------------------------------------------
    def _prepare_run_dir(self, resume: bool):
        self._check_run_dir(resume)
        self._write_run_config()

    def _check_run_dir(self, resume: bool):
        import yaml
        cfg_path = self.run_dir / "config.yaml"
        if resume:
            if not cfg_path.is_file():
                raise CheckpointError(f"--resume: {self.run_dir} holds no run (no config.yaml)")
            check_resume_config(yaml.safe_load(cfg_path.read_text()), self.cfg.to_dict())
        elif self.ckpts.latest() is not None:
            raise CheckpointError(f"{self.run_dir} already holds checkpoints: pass --resume to continue it, "
                                  "or choose another run.name")

    def _write_run_config(self):
        cfg_path = self.run_dir / "config.yaml"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_text = cfg_path.with_name("config.yaml.tmp")
        write_text.write_text(dump_config(self.cfg))
        os.replace(write_text, cfg_path)

    def _resume(self):
        latest = self.ckpts.latest()
        if latest is None:
            raise CheckpointError(f"--resume: no checkpoint in {self.ckpts.dir}")
        tensors, meta = load_checkpoint(latest)
        restore_parameters(self.model.train_step, tensors, str(latest))
        self.step, self.epoch, self.next_batch = meta["step"], meta["epoch"], meta["next_batch"]
        self.best = meta.get("best", self.best)
        self.history = meta.get("history", [])
        self.log.info(f"resumed from {latest.name}: step {self.step}, epoch {self.epoch}, batch {self.next_batch}")

    def _meta(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "next_batch": self.next_batch, "best": self.best,
                "history": self.history,
                "seed": self.cfg.run.seed, "rng": "host draws are seeded by (seed, epoch, batch)"}

    def save(self):
        return self.ckpts.save(self.step, named_parameters(self.model.train_step), self._meta())

    def _save_best(self):
        self.ckpts.save_best(named_parameters(self.model.train_step), self._meta())

    # ---- training --------------------------------------------------------------------------------
    def _peak(self) -> float:
        from mindgr.train.peak import peak_flops
        return peak_flops()["flops_per_s"]

    def fit(self) -> dict:
        peak = self._peak()
        window = {"loss": 0.0, "n": 0, "tokens": 0, "fill": 0.0, "step_s": 0.0, "flops": 0.0, "wait_s": 0.0,
                  "pause_s": 0.0, "t0": time.perf_counter(), "cpu0": time.process_time()}
        with StopSignals() as stop:
            try:
                self._epochs(window, peak, stop)
            except _StopRequested:
                path = self.save()
                self.log.info(f"stopped by signal {stop.signum}: saved {path.name} at step {self.step}; "
                              "continue with --resume")
                raise KeyboardInterrupt from None
            except KeyboardInterrupt:
                self.log.info(f"interrupted during step {self.step + 1}: nothing saved for it; --resume continues "
                              "from the last checkpoint")
                raise
        if window["n"]:
            self._log_window(window, peak)
        self.save()
        return self.finish()

    def _epochs(self, window: dict, peak: float, stop):
        from mindgr.train.flops import train_flops
        cfg = self.cfg
        done = False
        while self.epoch < cfg.train.epochs and not done:
            epoch = self.epoch
            stream = self._input_stream(epoch)
            try:
                for (b, indices), prepared in stream:
                    if prepared is None:  # a subclass that trains a batch its own way
                        loss, step_s, batch = self._train_batch(epoch, b, indices)
                    else:
                        loss, step_s, batch = self._execute(prepared)
                    self.step, self.next_batch = self.step + 1, b + 1
                    if not math.isfinite(loss):
                        raise FloatingPointError(f"loss is {loss} at step {self.step} (epoch {epoch}, batch {b}); "
                                                 "the last checkpoint is kept: lower train.lr and resume")
                    window["loss"] += loss
                    window["n"] += 1
                    window["tokens"] += batch["tokens"]
                    window["fill"] += batch["fill"]
                    window["step_s"] += step_s
                    window["flops"] += train_flops(cfg.model, batch["lengths"], batch["targets"],
                                                   self.sampler.negatives.num_candidates)
                    window["wait_s"] += stream.wait_s
                    stream.wait_s = 0.0
                    if self.step % cfg.run.log_every == 0:
                        self._log_window(window, peak)
                    if cfg.run.ckpt_every and self.step % cfg.run.ckpt_every == 0:
                        with _paused(window):
                            self.save()
                    if stop.signum is not None:
                        raise _StopRequested
                    if cfg.train.max_steps and self.step >= cfg.train.max_steps:
                        done = True
                        break
            finally:
                stream.close()
            if self.next_batch >= self.data.plan.num_batches(epoch):
                self.epoch, self.next_batch = epoch + 1, 0
                with _paused(window):
                    self._end_of_epoch()

    def _input_stream(self, epoch: int):
        """(batch number, indices) with the batch's host arrays, prepared `data.prefetch` batches ahead in
        a thread. A subclass that replaces _train_batch gets the items unprepared (None)."""
        from mindgr.train.pipeline import Inline, Prefetcher
        items = self.data.plan.iter_batches(epoch, self.next_batch)
        if type(self)._train_batch is not Trainer._train_batch:
            return Inline(items, lambda item: None)
        if self.cfg.data.prefetch == 0:
            return Inline(items, lambda item: self._prepare(epoch, *item))
        return Prefetcher(items, lambda item: self._prepare(epoch, *item), self.cfg.data.prefetch)

    def _prepare(self, epoch: int, b: int, indices):
        """Host work for batch `b` of `epoch` (in the input thread): (step inputs, what is trained)."""
        batch = self.data.train.batch(indices)
        negatives, drop = self.sampler.draw(epoch, b, batch.targets)
        negatives = negatives if isinstance(negatives, tuple) else (negatives,)
        inputs = (batch.ids, batch.positions, batch.offsets, batch.timestamps, batch.targets, *negatives, drop)
        return inputs, {"tokens": batch.num_tokens, "fill": batch.fill,
                        "lengths": np.diff(batch.offsets[: batch.num_rows + 1]),
                        "targets": int((batch.targets > 0).sum())}

    def _execute(self, prepared):
        """One optimizer step on prepared inputs: (loss, seconds inside the compiled step, info)."""
        from mindspore import Tensor
        inputs, info = prepared
        tensors = [Tensor(x) for x in inputs]
        t0 = time.perf_counter()
        loss = float(self.model.train_step(*tensors).asnumpy())
        return loss, time.perf_counter() - t0, info

    def _train_batch(self, epoch: int, b: int, indices):
        """One optimizer step on batch `b` of `epoch`: (loss, seconds, what was trained)."""
        return self._execute(self._prepare(epoch, b, indices))

    def _window_extra(self) -> tuple[dict, str]:
        """More fields (and text) for a logging window; called at the same steps on every rank."""
        return {}, ""

    def _log_window(self, w: dict, peak: float):
        # Evaluation and checkpoint pauses are reported apart: the busy fraction is that of the training loop.
        wall = time.perf_counter() - w["t0"] - w["pause_s"]
        rec = {"step": self.step, "epoch": self.epoch, "loss": w["loss"] / w["n"],
               "tokens_per_s": w["tokens"] / wall, "step_time_s": w["step_s"] / w["n"],
               "fill": w["fill"] / w["n"], "mfu": w["flops"] / wall / peak,
               "compute_fraction": w["step_s"] / wall, "input_wait_s": w["wait_s"], "pause_s": w["pause_s"],
               "cpu_util": (time.process_time() - w["cpu0"]) / (wall + w["pause_s"])}  # cores this process kept busy
        extra, text = self._window_extra()
        rec.update(extra)
        self.log.write(rec, f"step {self.step:6d} epoch {self.epoch:3d} loss {rec['loss']:.4f} "
                            f"tok/s {rec['tokens_per_s']:8.0f} step {rec['step_time_s'] * 1e3:7.1f}ms "
                            f"fill {rec['fill']:.3f} mfu {rec['mfu'] * 100:.2f}% busy "
                            f"{rec['compute_fraction'] * 100:.0f}%{text}")
        w.update(loss=0.0, n=0, tokens=0, fill=0.0, step_s=0.0, flops=0.0, wait_s=0.0, pause_s=0.0, t0=time.perf_counter(),
                 cpu0=time.process_time())

    def _end_of_epoch(self):
        every = self.cfg.eval.every_epochs
        if every and self.epoch % every == 0 and self.data.eval["valid"] is not None:
            metrics = self.evaluate("valid")
            key = f"ndcg@{10 if 10 in self.cfg.eval.ks else max(self.cfg.eval.ks)}"
            score = metrics.get(key, metrics["mrr"])
            self.history.append({"epoch": self.epoch, "step": self.step, **metrics})
            if score > self.best["metric"]:
                self.best = {"metric": score, "key": key, "epoch": self.epoch, "step": self.step}
                self._save_best()
        if not self.cfg.run.ckpt_every:
            self.save()

    eval_ranks = 1  # processes that share the ranking (a multi-process trainer splits it)

    def _split_metrics(self, examples, split: str) -> dict:
        from mindgr.train.evaluate import evaluate
        return evaluate(self.model.encode_last, self.model.item_table(), examples,
                        getattr(self.data.split, split), self.cfg.eval.ks)

    def evaluate(self, split: str) -> dict:
        examples = self.data.eval[split]
        if examples is None:
            return {"count": 0}
        t0 = time.perf_counter()
        self.model.encoder.set_train(False)
        metrics = self._split_metrics(examples, split)
        self.model.encoder.set_train(True)
        rec = {"eval": split, "step": self.step, "epoch": self.epoch, "seconds": time.perf_counter() - t0,
               "ranks": self.eval_ranks, **metrics}
        ranks = f", {self.eval_ranks} ranks" if self.eval_ranks > 1 else ""
        self.log.write(rec, f"eval {split} epoch {self.epoch} step {self.step}: {format_metrics(metrics)} "
                            f"({rec['seconds']:.1f}s{ranks})")
        return metrics

    def finish(self) -> dict:
        """Test (and validation) metrics of the best validation checkpoint, or of the last weights."""
        result = {"run": str(self.run_dir), "step": self.step, "epoch": self.epoch, "history": self.history}
        best = self.ckpts.best()
        if best is not None:
            tensors, meta = load_checkpoint(best)
            restore_parameters(self.model.train_step, tensors, str(best))
            result["checkpoint"] = {"name": "best", **self.best}
        else:
            result["checkpoint"] = {"name": "last", "step": self.step}
        for split in ("valid", "test"):
            result[split] = self.evaluate(split)
        from mindgr.train.metrics import popularity_metrics
        if self.data.eval["test"] is not None:
            result["popularity_test"] = popularity_metrics(self.data.split.train, self.data.num_items,
                                                           self.data.split.test, self.cfg.eval.ks)
            self.log.info(f"popularity baseline, test: {format_metrics(result['popularity_test'])}")
        if self.writer:
            write_json_atomic(self.run_dir / "eval.json", result)
        self.log.info(f"test: {format_metrics(result['test'])} -> {self.run_dir / 'eval.json'}")
        return result


def evaluate_run(run_dir: Path, split: str = "test", which: str = "best") -> dict:
    """Re-evaluate a saved run (`mindgr eval`): its own config, its best (or latest) checkpoint."""
    import yaml
    from mindgr.config import config_from_dict
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.yaml)")
    cfg = config_from_dict(yaml.safe_load(cfg_path.read_text()))
    cfg.run.out_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    setup_mindspore(cfg)
    from mindgr.train.data import RunData
    data = RunData(cfg)
    model = Model(cfg, data.num_items)
    ckpts = CheckpointManager(run_dir, cfg.run.keep_last)
    path = ckpts.best() if which == "best" else ckpts.latest()
    if path is None:
        path = ckpts.latest()
    if path is None:
        raise CheckpointError(f"{run_dir}: no checkpoint to evaluate")
    tensors, meta = load_checkpoint(path)
    from mindgr.parallel.sparse.checkpoint import full_table
    table = full_table(ckpts.dir, path.name, data.num_items + 1)
    if table is None:
        restore_parameters(model.train_step, tensors, str(path))
    else:                     # a run with a sharded item table (parallel.sparse): its shards hold the table
        encoder = {k[len("encoder."):]: v for k, v in tensors.items() if k.startswith("encoder.")}
        encoder["item_emb"] = table
        restore_parameters(model.encoder, encoder, str(path))
    from mindgr.train.evaluate import evaluate
    model.encoder.set_train(False)
    evalset = getattr(data.split, split)
    metrics, ranks = evaluate(model.encode_last, model.item_table(), data.eval[split], evalset, cfg.eval.ks,
                              per_user=True)
    # Per-user ranks, for a paired comparison with another run (`mindgr compare`).
    ranks_path = run_dir / "ranks" / f"{split}-{which}.npz"
    ranks_path.parent.mkdir(exist_ok=True)
    tmp = ranks_path.with_name(ranks_path.stem + ".tmp.npz")
    np.savez(tmp, ranks=ranks, targets=np.asarray(evalset.targets, np.int64), checkpoint=path.name)
    os.replace(tmp, ranks_path)
    return {"run": str(run_dir), "split": split, "checkpoint": path.name, "step": meta.get("step"), **metrics,
            "ranks_file": str(ranks_path)}
