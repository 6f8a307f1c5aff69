"""Checkpoints of a sharded table: one file per shard (rows and Adam moments), readable by any layout.

`NAME.table-SofN.npz` holds shard S of N: the rows with ids S, S+N, S+2N, ... (row-wise round robin) and
their moments, or, when the file has an `ids` array (the frequency layout: every rank's cold rows, node
group 0's hot rows too), the rows of those ids; the layout's hot ids are kept in shard 0's file (`hot`).
Replicas are identical, so only one copy of each row is written. Loading into a layout of N' shards
takes, for each of its ids, the row from the file that holds it: the same ids with any rank count
(reshard), bit for bit. Files are written atomically (mindgr.paths.atomic_write).

The file format lives in the train layer so that loading a trained run (mindgr.train.trainer.load_run)
can reassemble a sharded table; the sharded-table executor (mindgr.parallel.sparse) writes and reads it.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write
from mindgr.train.checkpoint import CheckpointError, nonfinite_reason

_NAME = re.compile(r"^(?P<name>.+)\.table-(?P<shard>\d+)of(?P<shards>\d+)\.npz$")


def owned_rows(num_rows: int, shards: int, shard: int) -> np.ndarray:
    """Ids of the rows shard `shard` of `shards` owns: id % shards == shard (row-wise, round robin)."""
    return np.arange(shard, num_rows, shards, dtype=np.int64)


def shard_path(directory: Path, name: str, shard: int, shards: int) -> Path:
    return Path(directory) / f"{name}.table-{shard}of{shards}.npz"


def save_shard(directory: Path, name: str, shard: int, shards: int, num_rows: int, rows, m, v, ids=None,
               hot=None) -> Path:
    """Write shard `shard` of `shards`: the round-robin rows, or the rows of `ids` when given."""
    path = shard_path(directory, name, shard, shards)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {} if ids is None else {"ids": np.asarray(ids, np.int64)}
    if hot is not None:
        extra["hot"] = np.asarray(hot, np.int64)
    atomic_write(path, lambda tmp: np.savez(tmp, rows=rows, m=m, v=v, num_rows=np.int64(num_rows),
                                            shard=np.int64(shard), shards=np.int64(shards), **extra),
                 tmp_suffix=".tmp.npz")
    return path


def _layouts(directory: Path, name: str) -> dict:
    """{shard count: {shard: path}} of the files of checkpoint `name`."""
    found = {}
    for p in Path(directory).glob(f"{name}.table-*of*.npz"):
        mt = _NAME.match(p.name)
        if mt and mt["name"] == name:
            found.setdefault(int(mt["shards"]), {})[int(mt["shard"])] = p
    return found


def shard_files(directory: Path, name: str) -> list[Path]:
    """The shard files of checkpoint `name` in shard order (the newest complete layout); an error if
    there is none."""
    complete = [(max(p.stat().st_mtime for p in files.values()), n, files)
                for n, files in _layouts(directory, name).items() if sorted(files) == list(range(n))]
    if not complete:
        raise CheckpointError(f"{directory}: no complete set of table shards for checkpoint {name}")
    _, n, files = max(complete, key=lambda c: c[:2])
    return [files[k] for k in range(n)]


def drop_other_layouts(directory: Path, name: str, shards: int):
    """After every shard of `name` in the `shards` layout is written: remove its files of other layouts."""
    for n, files in _layouts(directory, name).items():
        if n != shards:
            for p in files.values():
                p.unlink(missing_ok=True)


def load_shard(directory: Path, name: str, num_rows: int, shards: int, shard: int, ids=None):
    """(rows, m, v) of shard `shard` of `shards` (ids shard, shard + shards, ...), or of the rows `ids` in
    that order when given, from any saved layout."""
    files = shard_files(directory, name)
    saved = len(files)
    implicit = owned_rows(num_rows, shards, shard)
    want = implicit if ids is None else np.asarray(ids, np.int64)
    round_robin = ids is None or np.array_equal(want, implicit)
    order = np.argsort(want, kind="stable")
    sorted_want = want[order]
    out, found = None, np.zeros(len(want), bool)
    for k, path in enumerate(files):
        with np.load(path) as z:
            explicit = "ids" in z.files
            if saved == shards and k != shard and round_robin and not explicit:
                continue                                 # same round-robin layout: only this shard's file
            if int(z["num_rows"]) != num_rows:
                raise CheckpointError(f"{path}: table of {int(z['num_rows'])} rows, the model has {num_rows}")
            held = z["ids"] if explicit else owned_rows(num_rows, saved, k)   # the ids this file holds
            at = np.searchsorted(sorted_want, held)
            hit = at < len(want)
            hit[hit] = sorted_want[at[hit]] == held[hit]
            if out is None:
                out = [np.zeros((len(want), z["rows"].shape[1]), np.float32) for _ in range(3)]
            dest = order[at[hit]]
            found[dest] = True
            for arr, key in zip(out, ("rows", "m", "v")):
                arr[dest] = z[key][hit]
    if out is None or not found.all():
        raise CheckpointError(f"{directory}: checkpoint {name}'s table shards miss {int((~found).sum())} rows")
    reason = nonfinite_reason(dict(zip(("rows", "m", "v"), out)))
    if reason:   # the same refusal as a checkpoint's weights (mindgr.train.checkpoint.load_checkpoint)
        raise CheckpointError(f"{Path(directory) / name}: table shard {reason}; the model diverged before it was saved")
    return tuple(out)


def prune(directory: Path, keep_names: set):
    """Remove table files of checkpoints not in keep_names."""
    for p in Path(directory).glob("*.table-*of*.npz"):
        mt = _NAME.match(p.name)
        if mt and mt["name"] not in keep_names:
            p.unlink(missing_ok=True)


def full_table(directory: Path, name: str, num_rows: int):
    """The whole table of checkpoint `name` (rows only), or None if it has no table shards."""
    if not _layouts(directory, name):
        return None
    return load_shard(directory, name, num_rows, 1, 0)[0]
