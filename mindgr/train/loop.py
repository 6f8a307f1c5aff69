"""The one training loop: an executor's batches -> its step -> logs, checkpoints, evaluation.

TrainLoop(cfg, executor, resume, quiet).fit() owns what every way of training shares: the run directory
(lock, resume refusals, data fingerprint, config.yaml), epochs and the batch cursor (epoch, next_batch),
the background input stream, logging windows (progress, ETA, MFU), stop signals (saved at a step
boundary), divergence checks, the evaluation cadence and `best`, checkpoint files, the final evaluation
and the summary. It talks only to the executor (mindgr.train.executor, whose docstring lists that narrow
interface): how a global batch is trained (local mindgr.train.local, data parallel mindgr.parallel.executor,
sharded item table mindgr.parallel.sparse.executor); the executor asks its task (mindgr.train.task) for
what is trained: data and batch plan, model, step inputs, FLOPs, evaluation.

Benchmarks drive a built loop with `run_steps(n)` (n more steps through the same input stream, no signal
handling) and read the per-block figures it returns.
"""
from __future__ import annotations

import contextlib
import json
import math
import time

import numpy as np

from mindgr.config import Config, dump_config
from mindgr.paths import atomic_write, write_json_atomic
from mindgr.runtime import setup_mindspore
from mindgr.train.checkpoint import (CheckpointError, CheckpointManager, load_checkpoint, nonfinite_reason,
                                     read_sidecar)
from mindgr.train.logger import MetricsLog, format_metrics
from mindgr.train.memory import MemoryPhases
from mindgr.train.rundir import check_resume_config, read_run_config
from mindgr.train.runlock import RunLock
from mindgr.train import schedule
from mindgr.train.executor import Executor, RunContext


class NullLog:
    """The log of a process that is not the writer (ranks other than 0): writes and prints nothing."""

    note = None

    def position(self):
        return None

    def write(self, record, text=None):
        pass

    def info(self, text):
        pass

    def close(self):
        pass


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

    def reclaim(self):
        """Install the Python handlers again at the C level: MindSpore puts its own SIGINT handler in place when
        it runs a graph (it turns Ctrl-C into SIGTERM), which would make Ctrl-C read as SIGTERM. The handler
        Python holds is kept (a multi-process rank's agreement handler, mindgr.parallel.executor, stays)."""
        import signal
        for sig in self._old:
            current = signal.getsignal(sig)
            if callable(current):
                signal.signal(sig, current)

    def __exit__(self, *exc):
        import signal
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


class _NoSignals:
    signum = None

    def reclaim(self):
        pass


@contextlib.contextmanager
def _paused(*windows):
    """Time spent outside the training loop (evaluation, checkpoints), kept out of its busy fraction."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        for window in windows:
            window["pause_s"] += time.perf_counter() - t0


class _StopRequested(Exception):
    """A stop signal arrived; raised at a step boundary so that the checkpoint is consistent."""


def _reached_end(cfg: Config, meta: dict) -> bool:
    """Whether a checkpoint is the end of the run `cfg` describes (its epochs, its max_steps, or its
    validation patience)."""
    return (meta["epoch"] >= cfg.train.epochs or bool(cfg.train.max_steps and meta["step"] >= cfg.train.max_steps)
            or _patience_spent(cfg, meta.get("best", {}), meta.get("history", [])))


def _patience_spent(cfg: Config, best: dict, history: list[dict]) -> bool:
    """eval.patience validations in a row have passed without a new best (every rank sees the same gathered
    metrics, so every rank stops at the same epoch)."""
    if not cfg.eval.patience or best.get("epoch") is None:
        return False
    return sum(1 for h in history if h["epoch"] > best["epoch"]) >= cfg.eval.patience


def _new_window() -> dict:
    return {"loss": 0.0, "n": 0, "tokens": 0, "fill": 0.0, "step_s": 0.0, "flops": 0.0, "wait_s": 0.0,
            "pause_s": 0.0, "t0": time.perf_counter(), "cpu0": time.process_time()}


class TrainLoop:
    def __init__(self, cfg: Config, executor: Executor, resume: bool = False, quiet: bool = False):
        self.cfg, self.executor = cfg, executor
        executor.check_config()
        self.backend = setup_mindspore(cfg)
        self.run_dir = cfg.run_dir
        self.ckpts = CheckpointManager(self.run_dir, cfg.run.keep_last)
        self.lock = RunLock(self.run_dir)
        self.writer = executor.writer
        self.host_cpu_s = 0.0                  # CPU seconds of the input thread's batch preparation
        self.memory = MemoryPhases()           # peak resident memory per phase (eval.json "memory")
        self.memory.enter("setup")
        try:
            if self.writer and self.run_dir.is_dir():
                self.lock.acquire()                          # first: a second writer learns who holds the run
            self.resume_meta = self._check_run_dir(resume)   # only reads: a refused run writes nothing
            self.complete = resume and _reached_end(cfg, self.resume_meta)
            self.plan = executor.build_data(self.run_dir, self.resume_meta is not None)  # a failed load: no run dir
            self._prepare_run_dir(resume)
            executor.barrier()                               # the writer holds the lock; every rank checked the data
            self.log = self._make_log(quiet) if self.writer else NullLog()
            self.log.info(f"data: {executor.describe_data()} | ops backend: {self.backend}")
            if self.log.note:
                self.log.info(f"note: {self.log.note}")
            executor.build(RunContext(cfg, self.run_dir, self.ckpts.dir, self.log))
            self.step, self.epoch, self.next_batch = 0, 0, 0
            self.best = {"metric": -1.0, "epoch": None}
            self.history: list[dict] = []
            self.started = None               # fit's start: time, step, tokens since, total steps
            self.lr_now = None                # under a non-constant train.lr_schedule: the rate last set
            if resume:
                self._resume()
        except BaseException:
            self.lock.release()
            raise

    @property
    def data(self):
        """The task's data (for an item-retrieval run, mindgr.train.data.RunData)."""
        return self.executor.data

    @property
    def model(self):
        return self.executor.model

    def _make_log(self, quiet: bool):
        if self.complete:                     # a finished run's log is left exactly as it is
            resume_at = {}
        elif self.resume_meta is not None:    # cut back to where the log stood at the checkpoint
            resume_at = {"log_bytes": self.resume_meta.get("log_bytes"), "step": self.resume_meta["step"]}
        else:
            resume_at = None
        return MetricsLog(self.run_dir, quiet, resume_at)

    # ---- run directory and resume ---------------------------------------------------------------
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
        if self.writer:
            self.executor.on_run_dir(self.run_dir, fresh=self.resume_meta is None)

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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.run_dir / "config.yaml", dump_config(self.cfg))

    def _resume(self):
        latest = self.ckpts.latest()
        if latest is None:
            raise CheckpointError(f"--resume: no checkpoint in {self.ckpts.dir}")
        tensors, meta = load_checkpoint(latest)
        if "optimizer.learning_rate" in tensors:   # train.lr may change on resume (e.g. lowered after a divergence)
            lr = tensors["optimizer.learning_rate"]
            tensors["optimizer.learning_rate"] = np.full(lr.shape, self.cfg.train.lr, lr.dtype)
        self.executor.restore(tensors, latest)
        self.step, self.epoch, self.next_batch = meta["step"], meta["epoch"], meta["next_batch"]
        self.best = meta.get("best", self.best)
        self.history = meta.get("history", [])
        self.log.info(f"resumed from {latest.name}: step {self.step}, epoch {self.epoch}, batch {self.next_batch}")

    def _meta(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "next_batch": self.next_batch, "best": self.best,
                "history": self.history, "log_bytes": self.log.position(),
                "seed": self.cfg.run.seed, "rng": "host draws are seeded by (seed, epoch, batch)",
                **self.executor.meta()}

    def _diverged(self, what: str) -> FloatingPointError:
        """The one-line end of a diverged run: where, what, the checkpoint it can continue from."""
        last = self.ckpts.latest()
        lower = f"{self.cfg.train.lr / 10:g}"
        advice = (f"last good checkpoint: {last.name}; lower the learning rate and continue: --resume train.lr={lower}"
                  if last is not None else f"no checkpoint was saved; start again with a lower train.lr (e.g. {lower})")
        return FloatingPointError(f"training diverged at step {self.step} (epoch {self.epoch}): {what}; nothing "
                                  f"was saved for it; {advice}")

    def ensure_finite(self):
        """Non-finite (or overflowing) weights or optimizer state end the run before they reach a checkpoint
        or `best` (the check every checkpoint load makes too)."""
        reason = nonfinite_reason(self.executor.named_state())
        if reason:
            raise self._diverged(reason)
        other = self.executor.check_finite()
        if other:
            raise self._diverged(other)

    def save(self):
        self.executor.settle("saving a checkpoint", self.step)
        self.ensure_finite()                  # every rank (identical weights): all stop at the same step
        return self.executor.save_checkpoint(
            self.step, {"epoch": self.epoch, "batch": self.next_batch}, lambda: self.ckpts.save(self.step, self.executor.named_state(), self._meta()))

    def _save_best(self):
        self.executor.settle("saving the best checkpoint", self.step)
        self.ensure_finite()
        self.executor.save_best(lambda: self.ckpts.save_best(self.executor.named_state(), self._meta()))

    # ---- training --------------------------------------------------------------------------------
    def measure_peak(self) -> float:
        """The MFU denominator (FLOP/s), measured once per machine and cached (mindgr.train.peak)."""
        from mindgr.train.peak import peak_flops
        p = peak_flops(log=self.log.info)
        self.peak_info = p
        return p["flops_per_s"]

    def total_steps(self) -> int:
        """Steps of the whole run: the remaining epochs at the current epoch's batch count (epochs differ by
        a batch or so), capped by train.max_steps."""
        per_epoch = self.plan.num_batches(self.epoch)
        total = self.step + per_epoch - self.next_batch + max(self.cfg.train.epochs - self.epoch - 1, 0) * per_epoch
        return min(total, self.cfg.train.max_steps) if self.cfg.train.max_steps else total

    def fit(self) -> dict:
        try:
            if self.complete:
                return self._already_complete()
            return self._fit()
        except RuntimeError as e:
            clearer = self.executor.failure(e, self.step)
            if clearer is None:
                raise
            raise clearer from None
        finally:
            self.lock.release()

    def _already_complete(self) -> dict:
        """`--resume` of a run that reached its end: nothing is trained, rotated or rewritten."""
        done = f"{self.run_dir}: the run is complete (step {self.step}, epoch {self.epoch})"
        eval_path = self.run_dir / "eval.json"
        if eval_path.is_file():
            self.log.info(f"{done}: nothing to do (raise train.epochs, train.max_steps or eval.patience to train further); "
                          f"results in {eval_path}")
            return json.loads(eval_path.read_text())
        self.log.info(f"{done}, but its final evaluation is missing: evaluating")
        return self.finish()

    def _fit(self) -> dict:
        peak = self.measure_peak()
        self.memory.enter("train")
        self.log.info(f"training: {self.total_steps()} steps, a line every {self.cfg.run.log_every}; the first "
                      "step compiles the graph (seconds to a minute)")
        self.started = {"time": time.perf_counter(), "step": self.step, "tokens": 0, "total": self.total_steps()}
        window = _new_window()
        with StopSignals() as stop:
            try:
                self._epochs(window, peak, stop, self.cfg.train.max_steps)
            except _StopRequested:
                path = self.save()
                self.log.info(f"stopped by {_signal_name(stop.signum)}: saved {path.name} at step {self.step}; "
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

    def run_steps(self, n: int) -> dict:
        """`n` more training steps of a built loop, for benchmarks (no signal handling, no fit): the block's
        wall seconds (checkpoint/eval pauses excluded), real tokens, steps, seconds inside the step, input
        wait, process CPU, the input thread's preparation CPU, model FLOPs, summed fill, each step's time."""
        block, host0 = dict(_new_window(), step_times=[]), self.host_cpu_s
        self._epochs(_new_window(), 1.0, _NoSignals(), self.step + n, block)
        wall = time.perf_counter() - block["t0"] - block["pause_s"]
        return {"wall_s": wall, "tokens": block["tokens"], "steps": block["n"], "step_s": block["step_s"],
                "wait_s": block["wait_s"], "cpu_s": time.process_time() - block["cpu0"],
                "host_cpu_s": self.host_cpu_s - host0, "flops": block["flops"], "fill": block["fill"],
                "step_times": block["step_times"]}

    def _epochs(self, window: dict, peak: float, stop, until: int, block: dict | None = None):
        """Train until the run's epochs end or the step count reaches `until` (0: no limit). `window` is the
        logging window (reset when it is logged); `block`, if given, sums the same figures over the call."""
        sums = (window,) if block is None else (window, block)
        cfg, executor = self.cfg, self.executor
        scheduled = not schedule.is_constant(cfg.train)
        lr_horizon = schedule.horizon(cfg.train, self.plan.num_batches(0))
        done = False
        while self.epoch < cfg.train.epochs and not done and not _patience_spent(cfg, self.best, self.history):
            epoch = self.epoch
            stream = self._input_stream(epoch)
            try:
                for (b, indices), prepared in stream:
                    if scheduled:
                        lr = schedule.learning_rate(cfg.train, self.step + 1, lr_horizon)
                        if lr != self.lr_now:      # e.g. flat after a warm-up: no write into the optimizer
                            self.lr_now = lr
                            executor.set_learning_rate(lr)
                    loss, step_s, batch = executor.execute(prepared, self.step + 1)
                    stop.reclaim()
                    self.step, self.next_batch = self.step + 1, b + 1
                    if not math.isfinite(loss):
                        raise self._diverged(f"the loss is {loss} (batch {b})")
                    if self.started:           # (a benchmark may drive the loop without fit)
                        self.started["tokens"] += batch["tokens"]
                    flops = executor.batch_flops(batch)
                    for w in sums:
                        w["loss"] += loss
                        w["n"] += 1
                        w["tokens"] += batch["tokens"]
                        w["fill"] += batch["fill"]
                        w["step_s"] += step_s
                        w["flops"] += flops
                        w["wait_s"] += stream.wait_s
                    stream.wait_s = 0.0
                    if block is not None:
                        block["step_times"].append(step_s)
                    if self.step % cfg.run.log_every == 0:
                        self._log_window(window, peak)
                    if cfg.run.ckpt_every and self.step % cfg.run.ckpt_every == 0:
                        with _paused(*sums):
                            self.save()
                    if stop.signum is not None:
                        raise _StopRequested
                    if until and self.step >= until:
                        done = True
                        break
            finally:
                stream.close()
            if self.next_batch >= self.plan.num_batches(epoch):
                self.epoch, self.next_batch = epoch + 1, 0
                with _paused(*sums):
                    self._end_of_epoch()

    def _input_stream(self, epoch: int):
        """(batch number, indices) with the executor's prepared batch, `data.prefetch` batches ahead in a
        thread (inline with data.prefetch=0), wrapped by the executor (the ranks' stop agreement)."""
        from mindgr.train.pipeline import Inline, Prefetcher
        items = self.plan.iter_batches(epoch, self.next_batch)

        def make(item):
            c0 = time.thread_time()
            try:
                return self.executor.prepare(epoch, *item)
            finally:
                self.host_cpu_s += time.thread_time() - c0
        if self.cfg.data.prefetch == 0:
            stream = Inline(items, make)
        else:
            stream = Prefetcher(items, make, self.cfg.data.prefetch)
        return self.executor.stream(stream)

    def _log_window(self, w: dict, peak: float):
        # Evaluation and checkpoint pauses are reported apart: the busy fraction is that of the training loop.
        wall = time.perf_counter() - w["t0"] - w["pause_s"]
        rec = {"step": self.step, "epoch": self.epoch, "loss": w["loss"] / w["n"],
               "tokens_per_s": w["tokens"] / wall, "step_time_s": w["step_s"] / w["n"],
               "fill": w["fill"] / w["n"], "mfu": w["flops"] / wall / peak,
               "compute_fraction": w["step_s"] / wall, "input_wait_s": w["wait_s"], "pause_s": w["pause_s"],
               "cpu_util": (time.process_time() - w["cpu0"]) / (wall + w["pause_s"])}  # cores this process kept busy
        extra, text = self.executor.window_extra()
        rec.update(extra)
        if self.lr_now is not None:            # under a schedule: the rate of the window's last step
            rec["lr"] = self.lr_now
            text = f" lr {self.lr_now:.3g}{text}"
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
        if every and self.epoch % every == 0 and self.executor.can_evaluate("valid"):
            self.ensure_finite()              # diverged weights are never evaluated into a `best`
            metrics = self.evaluate("valid")
            key, higher = self.executor.selection()
            score = metrics.get(key, metrics.get("mrr"))
            self.history.append({"epoch": self.epoch, "step": self.step, **metrics})
            if self._improves(score, higher):
                self.best = {"metric": score, "key": key, "epoch": self.epoch, "step": self.step}
                self._save_best()
            elif _patience_spent(self.cfg, self.best, self.history):
                self.log.write({"early_stop": True, "step": self.step, "epoch": self.epoch, "key": key,
                                "patience": self.cfg.eval.patience, "best": self.best},
                               f"early stop at epoch {self.epoch}: no better valid {key} in {self.cfg.eval.patience} "
                               f"evaluations (best {self.best['metric']:.4f} at epoch {self.best['epoch']})")
        if not self.cfg.run.ckpt_every:
            self.save()

    def evaluate(self, split: str, resume_phase: bool = True, weights: dict | None = None) -> dict:
        """The executor's evaluation of `split`, logged; its memory is the phase `split`, after which the
        phase before it goes on (resume_phase) or none does (the final test). weights: the checkpoint
        restored for it ({"name", "epoch", "step"}), named in the log; the current weights otherwise."""
        if not self.executor.can_evaluate(split):
            return {"count": 0}
        t0 = time.perf_counter()
        phase = self.memory.current if resume_phase else None
        self.memory.enter(split)
        try:
            metrics = self.executor.evaluate(split, self.step)
        finally:
            self.memory.enter(phase)
        eval_ranks = self.executor.eval_ranks
        rec = {"eval": split, "step": self.step, "epoch": self.epoch, "seconds": time.perf_counter() - t0,
               "ranks": eval_ranks, **metrics}
        ranks = f", {eval_ranks} ranks" if eval_ranks > 1 else ""
        at = f"epoch {self.epoch} step {self.step}"
        if weights is not None:
            rec["checkpoint"] = weights
            known = " ".join(f"{k} {weights[k]}" for k in ("epoch", "step") if weights.get(k) is not None)
            at = f"{weights['name']} checkpoint" + (f" ({known})" if known else "")
        self.log.write(rec, f"eval {split} {at}: {format_metrics(metrics)} ({rec['seconds']:.1f}s{ranks})")
        return metrics

    def finish(self) -> dict:
        """Test (and validation) metrics of the best validation checkpoint, or of the last weights."""
        self.executor.settle("final evaluation", self.step)
        self.memory.enter("final")
        try:
            result = {"run": str(self.run_dir), "step": self.step, "epoch": self.epoch, "history": self.history}
            best = self.ckpts.best()
            if best is not None:
                # The best file's own record says which weights it holds: a resumed run's last checkpoint
                # may predate it (a best saved by an earlier finish).
                self.best = read_sidecar(best).get("best", self.best)
                if self.best.get("final") and self.best.get("step") != self.step:
                    best = None               # an earlier finish's final weights, trained on since unvalidated
            valid = None
            if best is None and self.executor.can_evaluate("valid"):
                # No validation ran during training (a short run, or eval.every_epochs = 0): the final weights
                # are validated now and kept as `best`, so every later command finds a best checkpoint.
                self.ensure_finite()
                valid = self.evaluate("valid")
                key, _ = self.executor.selection()
                self.best = {"metric": valid.get(key, valid.get("mrr", 0.0)), "key": key, "epoch": self.epoch,
                             "step": self.step, "final": True}
                self._save_best()
                best = self.ckpts.best()
            if best is not None:
                tensors, meta = load_checkpoint(best)
                self.executor.restore(tensors, best)
                result["checkpoint"] = {"name": "best", **self.best}
                if valid is None:             # the best's validation was logged when it was chosen: not again
                    valid = self._best_validation()
            else:
                result["checkpoint"] = {"name": "last", "step": self.step}
            self.executor.training_done()
            result["valid"] = valid if valid is not None else self.evaluate("valid")
            result["test"] = self.evaluate("test", resume_phase=False, weights=result["checkpoint"])
            for name, metrics in self.executor.baselines().items():
                result[name] = metrics
                self.log.info(f"{name.replace('_', ' baseline, ')}: {format_metrics(metrics)}")
            self.memory.enter(None)
            result["memory"] = self.memory.summary()
            started = self.started
            if started:
                wall = time.perf_counter() - started["time"]
                result["wall_s"] = wall
                result["tokens_per_s"] = started["tokens"] / wall if wall > 0 else 0.0
            if self.writer:
                write_json_atomic(self.run_dir / "eval.json", result)
            self.log.info(self._summary(result))
            return result
        finally:
            self.executor.close()

    def _improves(self, score, higher: bool) -> bool:
        """A validation score beats `best` (the task's selection metric: higher or lower is better); a
        missing or non-finite score never does."""
        if score is None or not math.isfinite(score):
            return False
        if higher:
            return score > self.best["metric"]
        return self.best.get("key") is None or score < self.best["metric"]

    def _best_validation(self) -> dict | None:
        """The validation metrics recorded when `best` was chosen (same weights, same users), if recorded."""
        for h in reversed(self.history):
            if h.get("step") == self.best.get("step"):
                return {k: v for k, v in h.items() if k not in ("epoch", "step")}
        return None

    def _summary(self, result: dict) -> str:
        """The end of a run in a few lines: which checkpoint, how good against popularity, how long, where."""
        key = f"ndcg@{10 if 10 in self.cfg.eval.ks else max(self.cfg.eval.ks)}"
        hr = f"hr@{10 if 10 in self.cfg.eval.ks else max(self.cfg.eval.ks)}"
        ck = result["checkpoint"]
        if ck["name"] != "best":
            which = f"last weights (step {ck['step']}; no validation split)"
        elif ck.get("final"):
            which = (f"best = the final weights (step {ck.get('step')}, valid {ck.get('key', key)} "
                     f"{ck.get('metric', float('nan')):.4f}; no validation during training)")
        else:
            which = (f"best = epoch {ck.get('epoch')} (step {ck.get('step')}, valid {ck.get('key', key)} "
                     f"{ck.get('metric', float('nan')):.4f})")
        lines = [f"summary: {self.step} steps, {self.epoch} epochs; evaluated: {which}"]
        test, pop = result.get("test", {}), result.get("popularity_test")
        if test.get("count") and pop:
            lines.append(f"  test {hr} {test[hr]:.4f} vs popularity {pop[hr]:.4f}, {key} {test[key]:.4f} vs "
                         f"{pop[key]:.4f} ({test['count']} users)")
        mem = result.get("memory")
        if mem:
            parts = ", ".join(f"{k} {v['peak_mb']:,.0f}" for k, v in mem["phases"].items())
            lines.append(f"  peak resident memory {mem['peak_rss_mb']:,.0f} MB (by phase: {parts})")
        if "wall_s" in result:
            lines.append(f"  wall time {_clock(result['wall_s'])} this attempt, {result['tokens_per_s']:.0f} "
                         "tokens/s overall (evaluation included)")
        lines.append(f"  files: {self.run_dir}/ eval.json, metrics.jsonl, config.yaml, checkpoints/")
        return "\n".join(lines)


def _signal_name(signum) -> str:
    """SIGINT / SIGTERM by name (Ctrl-C is SIGINT)."""
    import signal
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
