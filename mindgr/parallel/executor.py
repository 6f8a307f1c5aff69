"""DataParallelExecutor: the executor every rank of an msrun job runs under the one training loop
(mindgr.train.loop), for any task that accepts it (retrieval, generative).

Per step every rank takes the same global batch (the task's single-process plan), keeps its cost-balanced
part (mindgr.parallel.plan), has the task pack that share (Task.rank_inputs, its loss weighted by the
share of the global normaliser), computes the gradients of its share of the globally normalised loss, and
the gradients are summed over ranks (mindgr.parallel.dp). Rank 0 writes the shared outputs (config,
metrics, checkpoints, eval.json); every rank writes its own shard state next to each checkpoint.
A dot-product evaluation is split over ranks and gathered (mindgr.parallel.evaluate). A watchdog ends a rank that
stops making progress.
"""
from __future__ import annotations

import json
import os
import threading
import time
import zlib

import numpy as np

from mindgr.config import ConfigError
from mindgr.parallel import comm
from mindgr.parallel.balance import CostModel, imbalance
from mindgr.parallel.context import CollectiveError, collective_failure, init_distributed, use_data_parallel_mode
from mindgr.parallel.watchdog import Watchdog
from mindgr.train.checkpoint import named_parameters
from mindgr.train.executor import Executor, RunContext, StepShape


def param_digest(cell) -> int:
    """crc32 over every parameter's bytes: replicas that diverged show different digests."""
    crc = 0
    for _, p in sorted(named_parameters(cell).items()):
        crc = zlib.crc32(np.ascontiguousarray(p.asnumpy()).tobytes(), crc)
    return crc


def _step_cpu() -> float:
    """CPU seconds of this process minus the input thread's: the compiled step runs on MindSpore's own
    threads (the calling thread measured ~1% of it), while the input thread prepares the next batch."""
    total = time.process_time()
    for t in threading.enumerate():
        if t.name == "mindgr-input" and t.ident is not None:
            try:
                total -= time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):
                pass
    return total


def _fault_plan():
    """MINDGR_FAULT=RANK:STEP:raise|hang|exit - make one rank fail on purpose (tests of failure handling)."""
    text = os.environ.get("MINDGR_FAULT", "")
    if not text:
        return None
    rank, step, kind = text.split(":")
    return int(rank), int(step), kind


def _inject_fault(kind: str, rank: int, step: int):
    if kind == "raise":
        raise RuntimeError(f"injected fault (MINDGR_FAULT) on rank {rank} at step {step}")
    if kind == "exit":
        os._exit(3)
    while True:                               # "hang": alive but never reaching the next collective
        time.sleep(60)


def _host_id() -> int:
    """crc32 of this host's boot id and name: equal on every rank of one host."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    import socket
    return zlib.crc32(f"{boot}/{socket.gethostname()}".encode()) & 0x7FFFFFFF


def _host_facts(ctx) -> np.ndarray:
    """[world, 2] int32: every rank's host id and whether it can NOT use the shared-memory sum."""
    from mindgr.parallel import host_sum
    mine = np.array([_host_id(), 0 if host_sum.supported() is None else 1], np.int32).reshape(1, 2)
    return comm.all_gather(mine)


def _one_cpu_host(ctx) -> bool:
    """Every rank on one CPU (mccl) host that can use the shared-memory gradient sum."""
    if ctx.backend != "mccl" or ctx.world < 2:
        return False
    facts = _host_facts(ctx)
    return len(set(facts[:, 0].tolist())) == 1 and not facts[:, 1].any()


def _join_host_sum(ctx, n: int, timeout: float):
    """Every rank opens the job's shared-memory sum of n floats (parallel.grad_reduce=host): checks that the
    ranks share one host, rank 0 creates the segment under a name it broadcasts, all open it, then it is
    unlinked (the mappings stay; a crash leaves nothing in /dev/shm)."""
    from mindgr.parallel import host_sum
    why = host_sum.supported()
    hosts = _host_facts(ctx)
    if len(set(hosts[:, 0].tolist())) > 1:
        raise ConfigError(f"config: parallel.grad_reduce=host needs every rank on one host; the {ctx.world} ranks "
                          f"are on {len(set(hosts[:, 0].tolist()))}: use parallel.grad_reduce=auto")
    if hosts[:, 1].any():
        raise ConfigError(f"config: parallel.grad_reduce=host: {why or 'not supported on a peer rank'}; "
                          "use parallel.grad_reduce=auto")
    token = int(np.random.default_rng().integers(1, 2**31 - 1)) if ctx.rank == 0 else 0
    token = int(comm.broadcast(np.array([token], np.int32), 0)[0])
    path = host_sum.segment_path(token)
    made, why = None, ""
    if ctx.rank == 0:
        try:
            made = host_sum.HostSum(path, ctx.rank, ctx.world, n, create=True, timeout=timeout)
        except OSError as e:
            why = str(e)
    if not int(comm.broadcast(np.array([made is not None or ctx.rank != 0], np.int32), 0)[0]):
        raise OSError(why or "rank 0 could not create the shared-memory gradient sum (see its log)")
    joined = made or host_sum.HostSum(path, ctx.rank, ctx.world, n, create=False, timeout=timeout)
    comm.barrier()
    if ctx.rank == 0:
        joined.unlink()
    return joined


class _AgreedStop:
    """Ranks receive a stop signal at different moments; they must stop at the SAME step boundary, or rank 0
    would save while the others wait in the next step's collective.

    While training, this replaces the single-process SIGINT/SIGTERM handler (mindgr.train.loop.StopSignals)
    with one that only notes the signal. Before every step the ranks all-reduce (max) the noted signal; when
    any rank has one, every rank hands it to the saved handler at once, so the loop stops on all of them after
    that same step (and rank 0 saves). A second signal on a rank that already noted one ends it at once.
    With the shared-memory gradient sum the noted signal is a vote in the last step's sum instead
    (`ballot`, mindgr.parallel.dp.Ballot): every rank sees the same total after the same step, no collective.
    """

    def __init__(self):
        self.noted = 0
        self.delivered = False
        self._saved = {}
        self.ballot = None

    def install(self):
        import signal
        import threading
        if threading.current_thread() is not threading.main_thread():
            return
        from mindgr.train.loop import StopSignals
        for sig in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(sig)
            # Only fit's own handler is deferred: outside fit (a benchmark driving the loop) nothing changes,
            # and no rank adds the agreement's all-reduce.
            if isinstance(getattr(current, "__self__", None), StopSignals):
                self._saved[sig] = current
                signal.signal(sig, self._note)

    def _note(self, signum, frame):
        if self.noted:
            raise KeyboardInterrupt
        self.noted = signum

    def agree(self):
        """Called by every rank before each step: one int32 all-reduce (1.3-1.8 ms per call measured on 2 ranks
        of the shared 2-core host, next to steps of 100 ms and more)."""
        if self.delivered or not self._saved:
            return
        if self.ballot is not None:
            self.ballot.vote = float(self.noted)        # counted in this step's sum, seen before the next
            agreed = int(round(self.ballot.total))      # a sum of signal numbers: > 0 when any rank noted one
        else:
            agreed = int(comm.all_reduce(np.array([self.noted], np.int32), op="max")[0])
        if agreed:
            self.delivered = True
            handler = (self._saved.get(agreed) or self._saved.get(self.noted)
                       or next(iter(self._saved.values())))
            handler(agreed, None)        # the loop now stops after this step, on every rank


class _AgreeingStream:
    """The input stream of the training loop, with the ranks' stop agreement before each batch."""

    def __init__(self, inner, stop: _AgreedStop):
        self._inner, self._stop = inner, stop

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._inner)
        self._stop.agree()
        return item

    @property
    def wait_s(self):
        return self._inner.wait_s

    @wait_s.setter
    def wait_s(self, value):
        self._inner.wait_s = value

    def close(self, *args, **kwargs):
        return self._inner.close(*args, **kwargs)


class DataParallelExecutor(Executor):
    """Every rank trains its cost-balanced share of the global batch; dense gradients are summed."""

    kind = "data_parallel"

    def __init__(self, cfg, task):
        super().__init__(cfg, task)
        self.ctx = init_distributed(cfg.parallel.threads, cfg.parallel.bind_cores)  # msrun's scheduler stops here
        from mindgr.parallel.dp import reduce_mode
        p = cfg.parallel
        self.grad_reduce = reduce_mode(p, p.grad_reduce == "auto" and p.sparse == "none" and _one_cpu_host(self.ctx))
        if self.grad_reduce == "mindspore":              # before build() creates any parameter or graph
            use_data_parallel_mode(self.ctx.world)
        self.fault = _fault_plan()
        self.watchdog = Watchdog(cfg.parallel.timeout, self.ctx.rank)
        self.win = {"pred": [], "pred_step": [], "local": [], "local_cpu": [], "apply": [], "steps": [], "costs": [],
                    "tokens": []}
        self.win_cpu0 = time.process_time()
        self.agreed_stop = _AgreedStop()
        self.apply_updates = True     # False: forward + backward only (`mindgr bench distributed`'s `local` blocks)
        self.fuse = True              # False: the two-graph step where the one-graph step is built (its `split` blocks)

    @property
    def writer(self) -> bool:
        return self.ctx.is_writer

    @property
    def eval_ranks(self) -> int:
        return self.ctx.world

    def barrier(self):
        comm.barrier()

    # ---- setup -----------------------------------------------------------------------------------
    def plan_shape(self) -> StepShape:
        """The step's per-rank capacities: the global ones / world with parallel.capacity_slack headroom."""
        ex = self.task.examples
        tokens, rows = self.task.rank_capacities(self.ctx.world, self.cfg.parallel.capacity_slack)
        return StepShape(ex.token_capacity, ex.row_capacity, tokens, rows)

    def build_model(self):
        return self.task.build_model(self.run.log)

    def make_local_step(self):
        """The step whose `local(*inputs)` the calibration times (a sharded table replaces it)."""
        from mindgr.parallel.dp import DataParallelStep
        p = self.cfg.parallel
        # More than one fusion bucket inside the one-graph step fails in MindSpore 2.10's CPU runtime (a
        # memory-allocation error at the first step): those steps stay two graphs.
        fused = p.fused_step and not (self.grad_reduce == "mindspore" and p.grad_buckets > 1)
        host_sum = None
        if self.grad_reduce == "host":
            n = sum(int(np.prod(q.shape)) for q in self.model.optimizer.parameters) + 2   # + the loss, a vote
            try:
                host_sum = _join_host_sum(self.ctx, n, p.timeout)
            except OSError as e:
                if p.grad_reduce == "host":
                    raise ConfigError(f"config: parallel.grad_reduce=host: {e}; use parallel.grad_reduce=auto") from None
                self.run.log.info(f"note: {e}; the gradients are summed by one flat AllReduce instead")
                self.grad_reduce = "own"
        step = DataParallelStep(self.model.loss_net, self.model.optimizer, self.grad_reduce, p.grad_buckets,
                                fused=fused, host_sum=host_sum)
        self.agreed_stop.ballot = step.ballot
        return step

    def build(self, run: RunContext):
        from mindgr.parallel.plan import RankPlanner
        self.run = run
        cfg, ex, world = self.cfg, self.task.examples, self.ctx.world
        self.shape = self.plan_shape()
        longest = int(ex.lengths.max())
        if longest > self.shape.rank_tokens:
            raise ConfigError(f"config: data.token_capacity = {ex.token_capacity} over {world} ranks leaves "
                              f"{self.shape.rank_tokens} tokens per rank, less than the longest sequence ({longest}): "
                              "raise data.token_capacity (or train.batch_size)")
        self.model = self.build_model()
        self.dp = self.make_local_step()
        probe = self.task.calibration_inputs() if cfg.parallel.calibrate else None
        self.calibration = self._calibrate(probe) if probe else None
        p = cfg.parallel
        self.cost_model = self.calibration["model"] if self.calibration else CostModel(p.cost_a, p.cost_b, p.cost_c0)
        if not self.calibration and cfg.parallel.calibrate:     # a task without a probe: balance by tokens
            self.cost_model = CostModel(a=1.0, b=0.0)
        self.fixed_s = self.calibration["fixed_s"] if self.calibration else 0.0   # per-step cost every rank pays
        self.planner = RankPlanner(ex, world, self.ctx.rank, self.shape.rank_tokens, self.shape.rank_rows,
                                   self.cost_model, p.balance, cfg.run.seed, self.task.example_weights())
        if p.draws != "sequence" and world > 8:
            run.log.info(f"note: parallel.draws=global makes every rank draw the negatives of the whole global "
                         f"batch ({world} ranks' tokens); parallel.draws=sequence draws only its own")
        cm, sh = self.cost_model, self.shape
        run.log.info(f"parallel: {world} ranks ({self.ctx.backend}), per rank {sh.rank_tokens} tokens x "
                     f"{sh.rank_rows} rows (global {sh.token_capacity} x {sh.row_capacity}, slack "
                     f"{p.capacity_slack:g}), gradients summed by {self._reducer_name()}, balance {p.balance}, "
                     f"cost c(L) = {cm.c0:.3g} + {cm.a:.3g} L + "
                     f"{cm.b:.3g} L^2" + (f" (calibrated in {self.calibration['probe_s']:.1f}s, fixed "
                                           f"{self.calibration['fixed_s'] * 1e3:.1f} ms/step)"
                                           if self.calibration else " (given)" if not cfg.parallel.calibrate
                                           else " (by tokens: the task has no probe)"))
        if self.calibration:
            run.log.write({"calibration": {**cm.as_dict(), "fixed_s": self.calibration["fixed_s"],
                                           "rel_residual": self.calibration["rel_residual"],
                                           "probe": self.calibration["probe"], "world": world}})

    def _reducer_name(self) -> str:
        p = self.cfg.parallel
        graphs = ", one graph per step" if getattr(self.dp, "fused", None) is not None else ", two graphs per step"
        if getattr(self.dp, "reduce", "own") == "host":
            return "shared memory on one host" + graphs
        if getattr(self.dp, "reduce", "own") != "mindspore":
            return "one flat AllReduce" + graphs
        return ("MindSpore DATA_PARALLEL, " + ("one AllReduce per parameter" if p.grad_buckets == 0 else
                                                f"{len(self.dp.apply_cell.splits) + 1} fusion bucket(s)") + graphs)

    def _calibrate(self, probe: dict) -> dict:
        from mindgr.parallel.calibrate import calibrate, grads_timer
        self.watchdog.beat("calibrating the cost model")
        time_step = grads_timer(self.dp.local, probe["num_items"], self.shape.rank_tokens, self.shape.rank_rows,
                                probe["num_negatives"], probe["sites"], probe["width"], seed=self.cfg.run.seed)
        result = calibrate(time_step, self.shape.rank_tokens, self.shape.rank_rows, self.cfg.data.max_len)
        m = result["model"]
        # Every rank must split batches identically: average the fits, then take rank 0's bytes.
        mean = comm.all_reduce(np.array([m.a, m.b, m.c0, result["fixed_s"]], np.float32)) / self.ctx.world
        mean = comm.broadcast(mean.astype(np.float32), 0)
        result["model"] = CostModel(a=float(mean[0]), b=float(mean[1]), c0=float(mean[2]))
        result["fixed_s"] = float(mean[3])
        return result

    # ---- a step ----------------------------------------------------------------------------------
    def stream(self, items):
        # Called inside fit's signal handling, before the epoch's first step: from here on a signal is only
        # noted, and acted on when the ranks agree (_AgreedStop).
        self.agreed_stop.install()
        return _AgreeingStream(items, self.agreed_stop)

    def failure(self, error, step: int):
        name = collective_failure(error)
        if name is None:
            return None
        return CollectiveError(f"rank {self.ctx.rank}: collective {name} failed after step {step}; another "
                               "rank has probably died or hung (see its log)")

    def prepare(self, epoch: int, b: int, indices):
        """Host work for global batch `b` (in the input thread): this rank's part, packed by the task."""
        sh = self.shape
        share = self.planner.share(epoch, b, indices)
        inputs, info = self.task.rank_inputs(epoch, b, indices, share, sh)
        return inputs, {**info, "fill": share.global_tokens / (self.ctx.world * sh.rank_tokens), "share": share}

    def before_step(self, step: int):
        self.watchdog.beat(f"training step {step}")
        if self.fault and self.fault[:2] == (self.ctx.rank, step):
            _inject_fault(self.fault[2], self.ctx.rank, step)

    def execute(self, prepared, step: int):
        inputs, info = prepared
        tensors = inputs.tensors()
        self.task.restored(None)             # the weights move on from any restored checkpoint
        self.before_step(step)
        t0, c0 = time.perf_counter(), _step_cpu()
        if self.dp.fused is not None and self.fuse and self.apply_updates:
            loss = self.dp.step(*tensors)                       # one graph: its wall time includes the wait
            t1, c1 = time.perf_counter(), _step_cpu()
            t2 = t1
        else:
            loss, grads = self.dp.grads(*tensors)
            t1, c1 = time.perf_counter(), _step_cpu()
            loss = self.dp.apply(loss, grads) if self.apply_updates else float(loss.asnumpy())
            t2 = time.perf_counter()
        self.record_step(step, info["share"], t1 - t0, c1 - c0, t2 - t1)
        return loss, t2 - t0, info

    def record_step(self, step: int, share, local_s: float, local_cpu_s: float, apply_s: float):
        """One step's predicted and measured per-rank figures, for the logging window's balance report."""
        w = self.win
        w["pred"].append(imbalance(share.rank_cost))
        w["pred_step"].append(imbalance(share.rank_cost + self.fixed_s))
        w["local"].append(local_s)
        w["local_cpu"].append(local_cpu_s)
        w["apply"].append(apply_s)
        w["steps"].append(step)
        w["costs"].append(share.rank_cost)
        w["tokens"].append(share.rank_tokens)

    def take_step_split(self) -> tuple[float, float]:
        """(forward + backward seconds, all-reduce + update seconds) summed over the steps since the last
        logging window (or the last call), and cleared: a benchmark's attribution of a block."""
        split = float(sum(self.win["local"])), float(sum(self.win["apply"]))
        for v in self.win.values():
            v.clear()
        return split

    def window_extra(self):
        """Per-rank compute times of the window, gathered: measured imbalance next to the predicted one.

        Wall time is what the step costs; CPU time (one compute thread per process) is the same work
        without the time other processes on a shared machine took the core away.
        """
        w = self.win
        if not w["local"]:
            return {}, ""
        cpu_now = time.process_time()
        mine = np.concatenate([w["local"], w["local_cpu"], [cpu_now - self.win_cpu0]]).astype(np.float32)
        self.win_cpu0 = cpu_now
        every = comm.all_gather(mine[None, :])                                     # [rank, 2 n + 1]
        n = len(w["local"])
        times, cpu, window_cpu = every[:, :n], every[:, n: 2 * n], every[:, 2 * n]
        measured = [imbalance(times[:, k]) for k in range(n)]
        measured_cpu = [imbalance(cpu[:, k]) for k in range(n)]
        extra = {"imbalance_pred": float(np.mean(w["pred"])), "imbalance_pred_step": float(np.mean(w["pred_step"])),
                 "imbalance_measured": float(np.mean(measured)),
                 "imbalance_measured_cpu": float(np.mean(measured_cpu)), "rank_step_s": times.mean(1).tolist(),
                 "rank_step_cpu_s": cpu.mean(1).tolist(), "rank_cpu_s": window_cpu.tolist(),
                 "reduce_apply_s": float(np.mean(w["apply"]))}
        if self.writer:
            with open(self.run.run_dir / "balance.jsonl", "a") as f:
                for k, step in enumerate(w["steps"]):
                    f.write(json.dumps({"step": step, "pred_cost": np.round(w["costs"][k], 9).tolist(),
                                        "tokens": w["tokens"][k].tolist(), "step_s": times[:, k].tolist(),
                                        "step_cpu_s": cpu[:, k].tolist(), "imbalance_pred": w["pred"][k],
                                        "imbalance_pred_step": w["pred_step"][k],
                                        "imbalance_measured": measured[k],
                                        "imbalance_measured_cpu": measured_cpu[k]}) + "\n")
        for v in w.values():
            v.clear()
        return extra, (f" imb {extra['imbalance_pred'] * 100:.1f}% pred / "
                       f"{extra['imbalance_measured'] * 100:.1f}% meas")

    # ---- evaluation ------------------------------------------------------------------------------
    def rank_items(self, model, evalset, split_data, ks, filter_history):
        """The dot-product ranking split over the ranks and gathered."""
        from mindgr.parallel.evaluate import evaluate_sharded
        return evaluate_sharded(model.encode_last, model.item_table(), evalset, split_data, ks, self.ctx.rank,
                                self.ctx.world,
                                beat=self.watchdog.beat, filter_history=filter_history)

    def settle_beat(self, what: str):
        self.watchdog.beat(what)

    # ---- checkpoints -----------------------------------------------------------------------------
    def settle(self, what: str, step: int):
        self.watchdog.beat(what)

    def meta(self) -> dict:
        return {"parallel": {"world": self.ctx.world, "cost_model": self.cost_model.as_dict()}}

    def rank_state(self, step: int, cursor: dict) -> dict:
        """This rank's own state at a checkpoint: who it was and a digest of its weights."""
        return {"rank": self.ctx.rank, "world": self.ctx.world, "step": step, "pid": os.getpid(),
                "cores": list(self.ctx.cores), "param_crc32": param_digest(self.model.train_step),
                "next": dict(cursor)}

    def save_checkpoint(self, step: int, cursor: dict, commit):
        from mindgr.paths import write_json_atomic
        d = self.run.ckpt_dir / "ranks"
        d.mkdir(parents=True, exist_ok=True)
        state = self.rank_state(step, cursor)
        write_json_atomic(d / f"ckpt-step{step:08d}.rank{self.ctx.rank}.json", state, sort_keys=False)
        crcs = comm.all_gather(np.array([state["param_crc32"]], np.int64))
        if len(set(crcs.tolist())) > 1:
            self.run.log.info(f"warning: step {step}: weights differ between ranks (crc32 {crcs.tolist()})")
        path = commit() if self.writer else self.run.ckpt_dir / f"ckpt-step{step:08d}"
        comm.barrier()                        # nobody runs ahead of a checkpoint that is not committed yet
        if self.writer:                       # shard files of pruned checkpoints (any world size) go too
            keep = {p.name for p in self.run.ckpt_dir.glob("ckpt-step*.json")}
            for old in d.glob("ckpt-step*.rank*.json"):
                if old.name.split(".rank")[0] + ".json" not in keep:
                    old.unlink(missing_ok=True)
        return path

    def save_best(self, commit):
        if self.writer:
            commit()
        comm.barrier()

    def close(self):
        self.watchdog.close()
