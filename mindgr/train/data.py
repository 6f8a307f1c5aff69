"""From a data config to the fixed-capacity batches the compiled step consumes."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from mindgr.datasets import (EpochPlan, JaggedBatch, auto_capacities, build_batch, eval_examples, leave_one_out,
                             plan_batches, read_any, read_store, training_examples, training_request_times)
from mindgr.datasets.packer import batch_frame, row_request_times
from mindgr.train.checkpoint import file_sha256


def load_store(data_cfg, seed: int = 0):
    """Read the configured source (a directory holding a prepared store is read as a store), with
    data.pages applied (mindgr.datasets.pages)."""
    store = _read_source(data_cfg)
    if data_cfg.pages == "timestamps":
        from mindgr.datasets.pages import timestamp_pages
        store, _ = timestamp_pages(store)
    return store


def _read_source(data_cfg):
    d = data_cfg
    if d.kind == "synthetic":
        s = d.synthetic
        return read_any("synthetic", None, num_users=s.num_users, num_items=s.num_items,
                        median_len=s.median_len, min_len=s.min_len, max_len=s.max_len,
                        num_clusters=s.num_clusters, seed=s.seed, page_size=s.page_size,
                        **({"values": True} if s.values else {}))
    if d.kind == "store" or (Path(d.path) / "sequences.parquet").is_file():
        return read_store(d.path)
    opts = {"positive_column": d.positive_column} if d.kind == "kuairand" else {}
    if d.kind == "csv":
        opts = {name: getattr(d.csv, name) for name in ("user_column", "item_column", "time_column",
                                                        "page_column", "time_unit", "separator", "header",
                                                        "dedupe", "value_column")}
    if d.timestamps:
        opts["timestamps"] = d.timestamps
    return read_any(d.kind, d.path, lenient=d.lenient, **opts)


def _in_seconds(times, unit: str):
    """HSTU's time buckets are defined on seconds; millisecond logs are converted once here."""
    if times is None or unit == "s":
        return times
    return [t // 1000 for t in times]


class FlatExamples:
    """Jagged examples as flat arrays, concatenated once: a batch is packed with one gather per field
    (no per-row Python), exactly what mindgr.datasets.build_batch packs (the readable reference).
    Every example's targets must be as long as its inputs (Examples.flat checks)."""

    def __init__(self, inputs, times, targets, request_times=None):
        self.lengths = np.fromiter((len(x) for x in inputs), np.int64, len(inputs))
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        total = int(self.lengths.sum())
        flat = (lambda arrays, dtype: np.concatenate(arrays) if total else np.zeros(0, dtype))
        self.inputs, self.targets = flat(inputs, np.int32), flat(targets, np.int32)
        self.times = None if times is None else flat(times, np.int64)
        self.positions = np.arange(total, dtype=np.int64) - np.repeat(self.starts, self.lengths)
        self.request_times = None if request_times is None else np.asarray(request_times, dtype=np.int64)

    def batch(self, indices, token_capacity: int, row_capacity: int) -> JaggedBatch:
        indices = np.asarray(indices, dtype=np.int64)
        nrows = len(indices)
        lens = self.lengths[indices]
        total, ids, tgt, times, positions, offsets, rows = batch_frame(indices, lens, token_capacity, row_capacity)
        if total:
            # token k of the batch is flat token src[k]: its example's start + its position in the row
            ends = offsets[1:nrows + 1].astype(np.int64)
            src = np.arange(total, dtype=np.int64) + np.repeat(self.starts[indices] - (ends - lens), lens)
            ids[:total] = self.inputs[src]
            tgt[:total] = self.targets[src]
            positions[:total] = self.positions[src]
            if self.times is not None:
                times[:total] = self.times[src]
        req = row_request_times(indices, lens, offsets, times, row_capacity, self.request_times,
                                self.times is not None)
        return JaggedBatch(ids=ids, targets=tgt, timestamps=times, offsets=offsets, positions=positions,
                           rows=rows, num_tokens=total, num_rows=nrows, request_times=req)


@dataclass
class Examples:
    """Jagged examples (inputs, their times, aligned targets) packed at fixed capacities; request_times:
    when each example's last position's target is requested (JaggedBatch.request_times)."""
    inputs: list
    times: list | None
    targets: list
    token_capacity: int
    row_capacity: int
    request_times: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.inputs], dtype=np.int64)

    @cached_property
    def flat(self) -> FlatExamples | None:
        """The examples concatenated, made on the first batch (the lists are not changed afterwards);
        None when some example's targets or times and inputs differ in length (build_batch reports it)."""
        times = self.times if self.times is not None else self.inputs
        if any(len(x) != len(y) or len(x) != len(t) for x, y, t in zip(self.inputs, self.targets, times)):
            return None
        return FlatExamples(self.inputs, self.times, self.targets, self.request_times)

    def batch(self, indices, token_capacity: int | None = None, row_capacity: int | None = None):
        """The packed batch of these examples (JaggedBatch; capacities default to the examples')."""
        t_cap = self.token_capacity if token_capacity is None else token_capacity
        b_cap = self.row_capacity if row_capacity is None else row_capacity
        if self.flat is None:
            return build_batch(indices, self.inputs, self.times, self.targets, t_cap, b_cap, self.request_times)
        return self.flat.batch(indices, t_cap, b_cap)

    def plan(self) -> list:
        """The evaluation batches: every example once, in order (the same on every rank)."""
        return plan_batches(self.lengths, self.token_capacity, self.row_capacity, rng=None)


class RunData:
    """Store, leave-one-out split, training examples with their epoch plans, and the eval sets."""

    def __init__(self, cfg):
        d = cfg.data
        self.store = load_store(d)
        from mindgr.models import model_spec
        if model_spec(cfg.model.arch).uses_timestamps and cfg.model.time_bias and not self.store.has_timestamps:
            raise ValueError(f"model.time_bias = true, but data '{self.store.name}' has no timestamps: "
                             "set model.time_bias=false")
        self.num_items = self.store.num_items
        if d.holdout_unit == "page":                 # whole pages held out (mindgr.datasets.pages)
            from mindgr.datasets.pages import page_leave_one_out
            self.split = page_leave_one_out(self.store, holdout=d.holdout)
        else:
            self.split = leave_one_out(self.store, holdout=d.holdout)
        unit = self.store.time_unit
        train_times = _in_seconds(self.split.train_times, unit)
        inputs, times, targets = training_examples(self.split.train, train_times, d.max_len)
        request_times = training_request_times(self.split.train, train_times)
        if not inputs:
            raise ValueError(f"data '{self.store.name}': no training sequence has 2 or more items")
        lengths = np.array([len(x) for x in inputs])
        t_cap, b_cap = auto_capacities(lengths, cfg.train.batch_size, d.max_len)
        self.train = Examples(inputs, times, targets, d.token_capacity or t_cap, d.row_capacity or b_cap,
                              request_times)
        self.plan = EpochPlan(lengths, self.train.token_capacity, self.train.row_capacity, seed=cfg.run.seed)
        self.eval = {name: self._eval_examples(getattr(self.split, name), cfg) for name in ("valid", "test")}

    def _eval_examples(self, evalset, cfg):
        if len(evalset.targets) == 0:
            return None
        inputs, times, targets = eval_examples(evalset, cfg.data.max_len)
        times = _in_seconds(times, self.store.time_unit)
        request_times = _in_seconds(evalset.target_times, self.store.time_unit)   # the held-out target's time
        request_times = None if request_times is None else np.asarray(request_times, np.int64)
        lengths = np.array([len(x) for x in inputs])
        t_cap, b_cap = auto_capacities(lengths, cfg.eval.batch_size, cfg.data.max_len)
        return Examples(inputs, times, targets, t_cap, b_cap, request_times)


# ---- data fingerprint -----------------------------------------------------------------------------
FINGERPRINT_FILE = "data.json"


def data_fingerprint(data_cfg) -> dict:
    """What the run's data is: the generator's settings (synthetic), or every source file's size and
    sha256 (a directory source, a store included: every file under it), named relative to the source."""
    d = data_cfg
    if d.kind == "synthetic":
        import dataclasses
        settings = dataclasses.asdict(d.synthetic)
        for key in ("page_size", "values"):         # runs without them keep the fingerprint they had before
            if not settings[key]:
                del settings[key]
        return {"kind": d.kind, "synthetic": settings}
    files = []
    for source in [d.path] + ([d.timestamps] if d.timestamps else []):
        root = Path(source)
        members = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for p in members:
            if p.is_file():
                name = str(p.relative_to(root)) if root.is_dir() else p.name
                files.append({"file": name, "bytes": p.stat().st_size, "sha256": file_sha256(p)})
    return {"kind": d.kind, "files": files}


def fingerprint_mismatch(saved: dict, current: dict) -> str | None:
    """None if two fingerprints describe the same data, else what differs (a short phrase)."""
    if saved.get("kind") != current.get("kind"):
        return f"data.kind was {saved.get('kind')}, now {current.get('kind')}"
    if "synthetic" in saved or "synthetic" in current:
        return None if saved.get("synthetic") == current.get("synthetic") else "the synthetic settings differ"
    was = {f["file"]: f for f in saved.get("files", [])}
    now = {f["file"]: f for f in current.get("files", [])}
    for name in sorted(set(was) | set(now)):
        if name not in now:
            return f"{name} is gone"
        if name not in was:
            return f"{name} is new"
        if was[name]["bytes"] != now[name]["bytes"]:
            return f"{name} has {now[name]['bytes']} bytes, was {was[name]['bytes']}"
        if was[name]["sha256"] != now[name]["sha256"]:
            return f"{name} has other contents (sha256 {now[name]['sha256'][:12]}, was {was[name]['sha256'][:12]})"
    return None
