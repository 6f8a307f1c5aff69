"""Item vectors for the tokenizer from a user file of item id + vector (a trained run's item table:
mindgr.train.item_table.run_item_vectors, a layer above).

Both return (vectors [V, D] float64, raw_ids int64 [V+1] with raw_ids[0] = -1): row i of the vectors is
internal item i+1. A run keeps its own internal ids (the rows of its table); a file's items are numbered
1..V in increasing raw id order, the order MindGR's readers use, so a file over a dataset's raw ids
lines up with runs on that dataset.

File formats:
- .npy: a [V, D] array; row i is raw item i+1.
- .csv: one item a line, `item_id,v0,v1,...` (a first line that is not numeric is a header).
- .parquet: a column `item` (or `item_id`) and either a list column `vector` or one numeric column per
  dimension.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mindgr.ids.tokenizer import TokenizerError


def _by_raw_id(ids: np.ndarray, vectors: np.ndarray, path) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, np.int64)
    order = np.argsort(ids, kind="stable")
    ids, vectors = ids[order], vectors[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if len(dup):
        raise TokenizerError(f"ids: {path}: item id {int(ids[dup[0]])} appears more than once")
    return vectors, np.concatenate([[-1], ids])


def _read_csv(path: Path):
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if lines and not lines[0].split(",")[0].strip().lstrip("-").isdigit():
        lines = lines[1:]  # header
    if not lines:
        raise TokenizerError(f"ids: {path}: no item vectors (empty file)")
    ids, rows = [], []
    width = None
    for n, line in enumerate(lines, 1):
        parts = [p.strip() for p in line.split(",")]
        try:
            item, row = int(parts[0]), [float(p) for p in parts[1:]]
        except ValueError:
            raise TokenizerError(f"ids: {path}: data line {n}: expected `item_id,v0,v1,...` numbers") from None
        if width is None:
            width = len(row)
        if len(row) != width or width == 0:
            raise TokenizerError(f"ids: {path}: data line {n}: {len(row)} values, expected {width or '>= 1'}")
        ids.append(item)
        rows.append(row)
    return np.array(ids), np.array(rows, np.float64)


def _read_parquet(path: Path):
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(path)
    except Exception as e:
        raise TokenizerError(f"ids: {path}: not a readable Parquet file ({type(e).__name__})") from None
    if table.num_rows == 0:
        raise TokenizerError(f"ids: {path}: no item vectors (empty table)")
    id_col = next((c for c in ("item", "item_id") if c in table.column_names), None)
    if id_col is None:
        raise TokenizerError(f"ids: {path}: no `item` or `item_id` column")
    ids = table.column(id_col).to_numpy()
    if "vector" in table.column_names:
        vectors = table.column("vector").to_pylist()
        if len({len(v) for v in vectors}) != 1:
            raise TokenizerError(f"ids: {path}: the `vector` lists have different lengths")
        return ids, np.array(vectors, np.float64)
    rest = [c for c in table.column_names if c != id_col]
    if not rest:
        raise TokenizerError(f"ids: {path}: no vector columns besides `{id_col}`")
    return ids, np.stack([table.column(c).to_numpy(zero_copy_only=False) for c in rest], 1)


def file_item_vectors(path) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ids: {path}: no such vectors file")
    if path.stat().st_size == 0:
        raise TokenizerError(f"ids: {path}: no item vectors (empty file)")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            vectors = np.load(path, allow_pickle=False)
        except ValueError:
            raise TokenizerError(f"ids: {path}: not a readable .npy array") from None
        if vectors.ndim != 2 or len(vectors) == 0:
            raise TokenizerError(f"ids: {path}: expected a non-empty [items, dim] array, got shape {vectors.shape}")
        raw_ids = np.arange(len(vectors) + 1, dtype=np.int64)
        raw_ids[0] = -1
        return np.asarray(vectors), raw_ids
    if suffix == ".csv":
        ids, vectors = _read_csv(path)
    elif suffix == ".parquet":
        ids, vectors = _read_parquet(path)
    else:
        raise TokenizerError(f"ids: {path}: unknown vectors format {suffix or '(none)'}: use .npy, .csv or .parquet")
    if not np.issubdtype(np.asarray(ids).dtype, np.integer):
        raise TokenizerError(f"ids: {path}: item ids must be integers")
    return _by_raw_id(ids, vectors, path)
