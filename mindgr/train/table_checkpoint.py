"""Checkpoints of a sharded table: one file per shard (rows and Adam moments), readable by any layout.

`NAME.table-SofN.npz` holds shard S of N: the rows with ids S, S+N, S+2N, ... (row-wise round robin) and
their moments. Replicas are identical, so only node group 0 writes. Loading into a layout of N' shards
takes, for each of its ids, the row from the file that holds it: the same ids with any rank count
(reshard), bit for bit. Files are written atomically (mindgr.paths.atomic_write).

The file format lives in the train layer so that loading a trained run (mindgr.train.trainer.load_run)
can reassemble a sharded table; the sharded-table strategy (mindgr.parallel.sparse) writes and reads it.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write
from mindgr.train.checkpoint import CheckpointError

_NAME = re.compile(r"^(?P<name>.+)\.table-(?P<shard>\d+)of(?P<shards>\d+)\.npz$")


def owned_rows(num_rows: int, shards: int, shard: int) -> np.ndarray:
    """Ids of the rows shard `shard` of `shards` owns: id % shards == shard (row-wise, round robin)."""
    return np.arange(shard, num_rows, shards, dtype=np.int64)


def shard_path(directory: Path, name: str, shard: int, shards: int) -> Path:
    return Path(directory) / f"{name}.table-{shard}of{shards}.npz"


def save_shard(directory: Path, name: str, shard: int, shards: int, num_rows: int, rows, m, v) -> Path:
    path = shard_path(directory, name, shard, shards)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: np.savez(tmp, rows=rows, m=m, v=v, num_rows=np.int64(num_rows),
                                            shard=np.int64(shard), shards=np.int64(shards)), tmp_suffix=".tmp.npz")
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


def load_shard(directory: Path, name: str, num_rows: int, shards: int, shard: int):
    """(rows, m, v) of shard `shard` of `shards` (ids shard, shard + shards, ...) from any saved layout."""
    files = shard_files(directory, name)
    saved = len(files)
    want = owned_rows(num_rows, shards, shard)
    out = None
    for k, path in enumerate(files):
        if saved == shards and k != shard:
            continue                                     # same layout: only this shard's own file
        with np.load(path) as z:
            if int(z["num_rows"]) != num_rows:
                raise CheckpointError(f"{path}: table of {int(z['num_rows'])} rows, the model has {num_rows}")
            mine = want[want % saved == k]               # the ids of `want` this file holds
            if out is None:
                out = [np.zeros((len(want), z["rows"].shape[1]), np.float32) for _ in range(3)]
            at = np.searchsorted(want, mine)
            for arr, key in zip(out, ("rows", "m", "v")):
                arr[at] = z[key][mine // saved]
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
