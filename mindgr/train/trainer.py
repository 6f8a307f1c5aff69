"""The training loop: fixed-capacity jagged batches -> one compiled step -> logs, checkpoints, evaluation.

Everything random on the host (batch order, negatives, dropout masks) is drawn from generators seeded by
(seed, epoch, batch), so a run resumed from a checkpoint replays exactly what an uninterrupted run does.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.config import RESUMABLE_CHANGES, Config, ConfigError, dump_config
from mindgr.runtime import setup_mindspore  # noqa: F401  (also imported from here by bench and tests)
from mindgr.train.checkpoint import (CheckpointError, CheckpointManager, load_checkpoint, named_parameters,
                                     read_sidecar, restore_parameters)
from mindgr.train.logger import MetricsLog, format_metrics, write_json_atomic
from mindgr.train.runlock import RunLock


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_run_config(cfg_path: Path) -> dict:
    """A run directory's config.yaml as a dict; a damaged file is one line naming it."""
    import yaml
    try:
        data = yaml.safe_load(cfg_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        raise CheckpointError(f"{cfg_path}: not valid YAML (damaged run config)") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg_path}: expected a mapping of config sections (damaged run config)")
    return data


def run_config(run_dir: Path) -> Config:
    """The Config a run was trained with, placed where the run directory is now (moved or copied)."""
    from mindgr.config import config_from_dict
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.yaml)")
    try:
        cfg = config_from_dict(read_run_config(cfg_path))
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
    cfg.run.out_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg


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


def _reached_end(cfg: Config, meta: dict) -> bool:
    """Whether a checkpoint is the end of the run `cfg` describes (its epochs, or its max_steps)."""
    return meta["epoch"] >= cfg.train.epochs or bool(cfg.train.max_steps and meta["step"] >= cfg.train.max_steps)


class Trainer:
    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False):
        self.cfg = cfg
        from mindgr.models import model_spec
        model_spec(cfg.model.arch)  # an unknown model.arch is a config error before any data loads
        self.backend = setup_mindspore(cfg)
        self.run_dir = cfg.run_dir
        self.ckpts = CheckpointManager(self.run_dir, cfg.run.keep_last)
        self.lock = RunLock(self.run_dir)
        try:
            if self.writer and self.run_dir.is_dir():
                self.lock.acquire()                          # first: a second writer learns who holds the run
            self.resume_meta = self._check_run_dir(resume)   # only reads: a refused run writes nothing
            self.complete = resume and _reached_end(cfg, self.resume_meta)
            from mindgr.train.data import RunData
            t0 = time.perf_counter()
            self.data = RunData(cfg)                         # a failed load leaves no run dir behind
            self._check_catalogue()
            self._prepare_run_dir(resume)
            self.log = self._make_log(quiet)
            tr = self.data.train
            self.log.info(f"data: {self.data.store.num_users} users, {self.data.num_items} items, "
                          f"{len(tr.inputs)} training sequences, capacity {tr.token_capacity} tokens x "
                          f"{tr.row_capacity} rows, {self.data.plan.num_batches(0)} batches/epoch "
                          f"({time.perf_counter() - t0:.1f}s) | ops backend: {self.backend}")
            if getattr(self.log, "note", None):
                self.log.info(f"note: {self.log.note}")
            self.model = self._build_model()
            from mindgr.train.negatives import item_frequencies
            self.sampler = HostSampler(cfg, self.data.num_items, self.model.encoder, tr.token_capacity,
                                       item_frequencies(self.data.split.train, self.data.num_items))
            self.step, self.epoch, self.next_batch = 0, 0, 0
            self.best = {"metric": -1.0, "epoch": None}
            self.history: list[dict] = []
            self.started = None               # fit's start: time, step, tokens since, total steps
            if resume:
                self._resume()
        except BaseException:
            self.lock.release()
            raise

    # Hooks a multi-process trainer (mindgr.parallel.trainer) overrides: who writes shared outputs,
    # how one global batch is trained, how checkpoints are committed.
    writer = True

    def _make_log(self, quiet: bool):
        if self.complete:                     # a finished run's log is left exactly as it is
            resume_at = {}
        elif self.resume_meta is not None:    # cut back to where the log stood at the checkpoint
            resume_at = {"log_bytes": self.resume_meta.get("log_bytes"), "step": self.resume_meta["step"]}
        else:
            resume_at = None
        return MetricsLog(self.run_dir, quiet, resume_at)

    def _build_model(self):
        return Model(self.cfg, self.data.num_items)

    # ---- run directory and resume ---------------------------------------------------------------
    def _check_catalogue(self):
        c, n = self.cfg.loss, self.data.num_items
        if c.negatives == "per_token" and c.num_negatives > n:
            raise ConfigError(f"config: loss.num_negatives = {c.num_negatives} is larger than the catalogue "
                              f"({n} items): every token would draw repeats of the same items; use at most {n}")

    def _prepare_run_dir(self, resume: bool):
        """Create the run dir, take its lock (the writer), check again under the lock (another writer may have
        started or ended in between), check or record the data fingerprint, write config.yaml."""
        if self.writer:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not self.lock.held:
                self.lock.acquire()
            self.resume_meta = self._check_run_dir(resume)
            self.complete = resume and _reached_end(self.cfg, self.resume_meta)
        self._check_data(resume)
        if self.writer and not self.complete:
            self._write_run_config()

    def _check_data(self, resume: bool):
        from mindgr.train.data import FINGERPRINT_FILE, data_fingerprint, fingerprint_mismatch
        path = self.run_dir / FINGERPRINT_FILE
        current = data_fingerprint(self.cfg.data)
        if resume and path.is_file():
            diff = fingerprint_mismatch(json.loads(path.read_text()), current)
            if diff:
                raise CheckpointError(f"--resume: the data of {self.run_dir} changed since the run started ({diff}); "
                                      "a run resumes only on the data it was trained on")
        elif self.writer:                     # a fresh run (or one from before fingerprints) records its data
            write_json_atomic(path, current)

    def _check_run_dir(self, resume: bool) -> dict | None:
        """Refusals that only read: returns the sidecar of the checkpoint a resume continues from."""
        cfg_path = self.run_dir / "config.yaml"
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise CheckpointError(f"{self.run_dir}: exists and is not a directory (run.out_dir/run.name)")
        if resume:
            if not cfg_path.is_file():
                raise CheckpointError(f"--resume: {self.run_dir} holds no run (no config.yaml)")
            check_resume_config(read_run_config(cfg_path), self.cfg.to_dict())
            latest = self.ckpts.latest()
            if latest is None:
                raise CheckpointError(f"--resume: no checkpoint in {self.ckpts.dir}")
            meta = read_sidecar(latest)
            missing = [k for k in ("step", "epoch", "next_batch") if not isinstance(meta.get(k), int)]
            if missing:
                raise CheckpointError(f"checkpoint {latest.with_suffix('.json')}: sidecar lacks {', '.join(missing)} "
                                      "(not a training checkpoint)")
            return meta
        if self.ckpts.latest() is not None:
            raise CheckpointError(f"{self.run_dir} already holds checkpoints: pass --resume to continue it, "
                                  "or choose another run.name")
        return None

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
        if "optimizer.learning_rate" in tensors:   # train.lr may change on resume (e.g. lowered after a divergence)
            lr = tensors["optimizer.learning_rate"]
            tensors["optimizer.learning_rate"] = np.full(lr.shape, self.cfg.train.lr, lr.dtype)
        restore_parameters(self.model.train_step, tensors, str(latest))
        self.step, self.epoch, self.next_batch = meta["step"], meta["epoch"], meta["next_batch"]
        self.best = meta.get("best", self.best)
        self.history = meta.get("history", [])
        self.log.info(f"resumed from {latest.name}: step {self.step}, epoch {self.epoch}, batch {self.next_batch}")

    def _meta(self) -> dict:
        position = getattr(self.log, "position", None)
        return {"step": self.step, "epoch": self.epoch, "next_batch": self.next_batch, "best": self.best,
                "history": self.history, "log_bytes": position() if position else None,
                "seed": self.cfg.run.seed, "rng": "host draws are seeded by (seed, epoch, batch)"}

    def _diverged(self, what: str) -> FloatingPointError:
        """The one-line end of a diverged run: where, what, the checkpoint it can continue from."""
        last = self.ckpts.latest()
        lower = f"{self.cfg.train.lr / 10:g}"
        advice = (f"last good checkpoint: {last.name}; lower the learning rate and continue: --resume train.lr={lower}"
                  if last is not None else f"no checkpoint was saved; start again with a lower train.lr (e.g. {lower})")
        return FloatingPointError(f"training diverged at step {self.step} (epoch {self.epoch}): {what}; nothing "
                                  f"was saved for it; {advice}")

    # A weight beyond sqrt(float32 max) overflows when multiplied by another such weight (LayerNorm's
    # squares, dot products): with train.lr=1e30 every weight sits at ~5e30 while the loss stays finite at
    # log(R+1), every score tied. Such weights count as non-finite.
    WEIGHT_LIMIT = 1.8e19

    def ensure_finite(self):
        """Non-finite (or overflowing) weights or optimizer state end the run before they reach a checkpoint
        or `best`."""
        for name, value in named_parameters(self.model.train_step).items():
            v = value.asnumpy()
            if v.dtype.kind != "f" or v.size == 0 or name.endswith("learning_rate"):
                continue
            if not np.isfinite(v).all():
                raise self._diverged(f"parameter '{name}' holds non-finite values")
            largest = float(np.abs(v).max())
            if largest > self.WEIGHT_LIMIT:
                raise self._diverged(f"parameter '{name}' reached {largest:.1e} (beyond {self.WEIGHT_LIMIT:.1e}, "
                                     "float32 products of it overflow)")

    def save(self):
        self.ensure_finite()
        return self.ckpts.save(self.step, named_parameters(self.model.train_step), self._meta())

    def _save_best(self):
        self.ensure_finite()
        self.ckpts.save_best(named_parameters(self.model.train_step), self._meta())

    # ---- training --------------------------------------------------------------------------------
    def _peak(self) -> float:
        from mindgr.train.peak import peak_flops
        p = peak_flops(log=self.log.info)
        self.peak_info = p
        return p["flops_per_s"]

    def total_steps(self) -> int:
        """Steps of the whole run: the remaining epochs at the current epoch's batch count (epochs differ by
        a batch or so), capped by train.max_steps."""
        per_epoch = self.data.plan.num_batches(self.epoch)
        total = self.step + per_epoch - self.next_batch + max(self.cfg.train.epochs - self.epoch - 1, 0) * per_epoch
        return min(total, self.cfg.train.max_steps) if self.cfg.train.max_steps else total

    def fit(self) -> dict:
        try:
            if self.complete:
                return self._already_complete()
            return self._fit()
        finally:
            self.lock.release()

    def _already_complete(self) -> dict:
        """`--resume` of a run that reached its end: nothing is trained, rotated or rewritten."""
        done = f"{self.run_dir}: the run is complete (step {self.step}, epoch {self.epoch})"
        eval_path = self.run_dir / "eval.json"
        if eval_path.is_file():
            self.log.info(f"{done}: nothing to do (raise train.epochs or train.max_steps to train further); "
                          f"results in {eval_path}")
            return json.loads(eval_path.read_text())
        self.log.info(f"{done}, but its final evaluation is missing: evaluating")
        return self.finish()

    def _fit(self) -> dict:
        peak = self._peak()
        self.started = {"time": time.perf_counter(), "step": self.step, "tokens": 0, "total": self.total_steps()}
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

    def _train_flops(self, batch: dict) -> float:
        """Model FLOPs of one trained batch (its info dict: row lengths, targets)."""
        from mindgr.train.flops import train_flops
        return train_flops(self.cfg.model, batch["lengths"], batch["targets"], self.sampler.negatives.num_candidates)

    def _epochs(self, window: dict, peak: float, stop):
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
                        raise self._diverged(f"the loss is {loss} (batch {b})")
                    if self.started:           # (a benchmark may drive _epochs without fit)
                        self.started["tokens"] += batch["tokens"]
                    window["loss"] += loss
                    window["n"] += 1
                    window["tokens"] += batch["tokens"]
                    window["fill"] += batch["fill"]
                    window["step_s"] += step_s
                    window["flops"] += self._train_flops(batch)
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
        inputs = (batch.ids, batch.positions, batch.offsets, batch.timestamps, batch.request_times, batch.targets,
                  *negatives, drop)
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
        rec["peak_flops"] = peak
        progress = ""
        started = self.started
        if started:
            elapsed = time.perf_counter() - started["time"]
            done, total = self.step - started["step"], started["total"]
            eta = elapsed / done * max(total - self.step, 0) if done else float("nan")
            rec.update(total_steps=total, elapsed_s=elapsed, eta_s=eta)
            progress = f"/{total} {_clock(elapsed)} eta {_clock(eta)}"
        self.log.write(rec, f"step {self.step:6d}{progress} epoch {self.epoch:3d} loss {rec['loss']:.4f} "
                            f"tok/s {rec['tokens_per_s']:8.0f} step {rec['step_time_s'] * 1e3:7.1f}ms "
                            f"fill {rec['fill']:.3f} mfu {rec['mfu'] * 100:.2f}% of {peak / 1e9:.0f} GFLOP/s busy "
                            f"{rec['compute_fraction'] * 100:.0f}%{text}")
        w.update(loss=0.0, n=0, tokens=0, fill=0.0, step_s=0.0, flops=0.0, wait_s=0.0, pause_s=0.0, t0=time.perf_counter(),
                 cpu0=time.process_time())

    def _end_of_epoch(self):
        every = self.cfg.eval.every_epochs
        if every and self.epoch % every == 0 and self.data.eval["valid"] is not None:
            self.ensure_finite()              # diverged weights are never evaluated into a `best`
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
                        getattr(self.data.split, split), self.cfg.eval.ks,
                        filter_history=self.cfg.eval.filter_history)

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
        started = self.started
        if started:
            wall = time.perf_counter() - started["time"]
            result["wall_s"] = wall
            result["tokens_per_s"] = started["tokens"] / wall if wall > 0 else 0.0
        if self.writer:
            write_json_atomic(self.run_dir / "eval.json", result)
        self.log.info(f"test: {format_metrics(result['test'])} -> {self.run_dir / 'eval.json'}")
        self.log.info(self._summary(result))
        return result

    def _summary(self, result: dict) -> str:
        """The end of a run in a few lines: which checkpoint, how good against popularity, how long, where."""
        key = f"ndcg@{10 if 10 in self.cfg.eval.ks else max(self.cfg.eval.ks)}"
        hr = f"hr@{10 if 10 in self.cfg.eval.ks else max(self.cfg.eval.ks)}"
        ck = result["checkpoint"]
        which = (f"best = epoch {ck.get('epoch')} (step {ck.get('step')}, valid {ck.get('key', key)} "
                 f"{ck.get('metric', float('nan')):.4f})" if ck["name"] == "best"
                 else f"last weights (step {ck['step']}; no validation ran)")
        lines = [f"summary: {self.step} steps, {self.epoch} epochs; evaluated: {which}"]
        test, pop = result.get("test", {}), result.get("popularity_test")
        if test.get("count") and pop:
            lines.append(f"  test {hr} {test[hr]:.4f} vs popularity {pop[hr]:.4f}, {key} {test[key]:.4f} vs "
                         f"{pop[key]:.4f} ({test['count']} users)")
        if "wall_s" in result:
            lines.append(f"  wall time {_clock(result['wall_s'])} this attempt, {result['tokens_per_s']:.0f} "
                         "tokens/s overall (evaluation included)")
        lines.append(f"  files: {self.run_dir}/ eval.json, metrics.jsonl, config.yaml, checkpoints/")
        return "\n".join(lines)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


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
    if which not in ("best", "latest"):
        raise ValueError(f"checkpoint: {which!r} (expected best or latest)")
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if threads is not None:
        cfg.parallel.threads = threads
    ckpts = CheckpointManager(run_dir, cfg.run.keep_last)
    path = ckpts.best() if which == "best" else ckpts.latest()
    if path is None:
        if which == "best" and ckpts.latest() is not None:
            raise CheckpointError(f"{run_dir}: no best checkpoint (no validation has run: eval.every_epochs = "
                                  f"{cfg.eval.every_epochs}); use the last one with --checkpoint latest")
        raise CheckpointError(f"{run_dir}: no checkpoint to load")
    from mindgr.train.data import FINGERPRINT_FILE, RunData, data_fingerprint, fingerprint_mismatch
    saved_fp = run_dir / FINGERPRINT_FILE
    data_note = None
    if saved_fp.is_file():
        diff = fingerprint_mismatch(json.loads(saved_fp.read_text()), data_fingerprint(cfg.data))
        if diff and not allow_data_change:
            raise CheckpointError(f"{run_dir}: its data changed since it was trained ({diff}); pass "
                                  "--allow-data-change to use the data as it is now")
        data_note = f"evaluated on changed data ({diff})" if diff else None
    setup_mindspore(cfg)
    data = RunData(cfg)
    model = Model(cfg, data.num_items)
    tensors, meta = load_checkpoint(path)
    from mindgr.parallel.sparse.checkpoint import full_table
    table = full_table(ckpts.dir, path.name, data.num_items + 1)
    if table is None:
        restore_parameters(model.train_step, tensors, str(path))
    else:                     # a run with a sharded item table (parallel.sparse): its shards hold the table
        encoder = {k[len("encoder."):]: v for k, v in tensors.items() if k.startswith("encoder.")}
        encoder["item_emb"] = table
        restore_parameters(model.encoder, encoder, str(path))
    model.encoder.set_train(False)
    return LoadedRun(run_dir, cfg, data, model, path.name, meta.get("step"), data_note)


def ranks_file_name(split: str, which: str, filter_history: bool) -> str:
    """RUN/ranks/ file of an evaluation: test-best.npz (history filtered), test-best-unfiltered.npz."""
    return f"{split}-{which}{'' if filter_history else '-unfiltered'}.npz"


def evaluate_run(run_dir: Path, split: str = "test", which: str = "best", allow_data_change: bool = False,
                 filter_history: bool | None = None) -> dict:
    """Re-evaluate a saved run (`mindgr eval`): its own config, its best (or latest) checkpoint, on the data
    it was trained on (refused if that changed, unless allow_data_change). filter_history: None = the run's
    eval.filter_history. Item-encoder runs; mindgr.train.run_eval.evaluate_any_run dispatches GR runs."""
    run = load_run(run_dir, which, allow_data_change)
    if filter_history is None:
        filter_history = run.cfg.eval.filter_history
    ranks_dir, ranks_note = _ranks_dir(run.run_dir)   # before the ranking, the long part
    from mindgr.train.evaluate import evaluate
    evalset = getattr(run.data.split, split)
    metrics, ranks, ties = evaluate(run.model.encode_last, run.model.item_table(), run.data.eval[split], evalset,
                                    run.cfg.eval.ks, per_user=True, filter_history=filter_history)
    # Per-user (greater, ties) pairs, for a paired comparison with another run (`mindgr compare`).
    ranks_path = ranks_dir / ranks_file_name(split, which, filter_history)
    tmp = ranks_path.with_name(ranks_path.stem + ".tmp.npz")
    np.savez(tmp, ranks=ranks, ties=ties, targets=np.asarray(evalset.targets, np.int64), checkpoint=run.checkpoint)
    os.replace(tmp, ranks_path)
    out = {"run": str(run.run_dir), "split": split, "checkpoint": run.checkpoint, "step": run.step,
           "filter_history": filter_history, **metrics, "ranks_file": str(ranks_path)}
    for key, note in (("ranks_note", ranks_note), ("data_note", run.data_note)):
        if note:
            out[key] = note
    return out
