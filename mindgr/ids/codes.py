"""The semantic-ID table on disk: Parquet (item, raw_item, c0..cL) plus a JSON of its statistics.

`item` is the internal id 1..V (the row of the run's item table), `raw_item` the source id, c0..c{L-1}
the residual k-means codes and cL the de-duplication digit. The Parquet's schema metadata holds
`level_sizes` so the table alone is enough to load; the JSON beside it (same name, .json) holds the
statistics for people.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mindgr.ids.tokenizer import TokenizerError
from mindgr.paths import atomic_write


def stats_path(path) -> Path:
    return Path(path).with_suffix(".json")


def save_codes(path, codes: np.ndarray, level_sizes, raw_ids, stats: dict) -> Path:
    """Write the table (rows 1..V of codes [V+1, L+1]; raw_ids [V+1], entry 0 unused) and its stats."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codes = np.asarray(codes, np.int32)
    level_sizes = [int(s) for s in level_sizes]
    columns = {"item": np.arange(1, len(codes), dtype=np.int64),
               "raw_item": np.asarray(raw_ids, np.int64)[1:]}
    columns.update({f"c{j}": codes[1:, j] for j in range(codes.shape[1])})
    table = pa.table(columns).replace_schema_metadata({"mindgr.level_sizes": json.dumps(level_sizes)})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    atomic_write(stats_path(path), json.dumps(dict(stats, level_sizes=level_sizes, table=path.name), indent=1) + "\n")
    return path


def load_codes(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int32 [V+1, L+1] with row 0 = zeros, level_sizes int64 [L+1], raw_ids int64 [V+1], [0] = -1).

    Checked: items are exactly 1..V, every code is inside its level's range, every tuple is unique."""
    import pyarrow.parquet as pq
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ids: {path}: no such semantic-ID table")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow's messages span lines
        raise TokenizerError(f"ids: {path}: not a readable Parquet file ({type(e).__name__})") from None
    meta = table.schema.metadata or {}
    if b"mindgr.level_sizes" not in meta:
        raise TokenizerError(f"ids: {path}: no level_sizes in its metadata (not written by `mindgr ids build`)")
    level_sizes = np.array(json.loads(meta[b"mindgr.level_sizes"]), np.int64)
    names = ["item", "raw_item"] + [f"c{j}" for j in range(len(level_sizes))]
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise TokenizerError(f"ids: {path}: missing column(s) {', '.join(missing)}")
    items = table.column("item").to_numpy().astype(np.int64)
    order = np.argsort(items, kind="stable")
    if not np.array_equal(items[order], np.arange(1, len(items) + 1)):
        raise TokenizerError(f"ids: {path}: item ids must be exactly 1..{len(items)}")
    codes = np.zeros((len(items) + 1, len(level_sizes)), np.int32)
    for j in range(len(level_sizes)):
        col = table.column(f"c{j}").to_numpy().astype(np.int64)[order]
        bad = np.flatnonzero((col < 0) | (col >= level_sizes[j]))
        if len(bad):
            raise TokenizerError(f"ids: {path}: item {int(bad[0]) + 1} has code c{j} = {int(col[bad[0]])}, "
                                 f"outside 0..{int(level_sizes[j]) - 1}")
        codes[1:, j] = col
    if len(np.unique(codes[1:], axis=0)) != len(items):
        raise TokenizerError(f"ids: {path}: two items share one code tuple")
    raw_ids = np.concatenate([[-1], table.column("raw_item").to_numpy().astype(np.int64)[order]])
    return codes, level_sizes, raw_ids


def format_stats(stats: dict) -> str:
    """The statistics as a few readable lines (what `mindgr ids build` prints)."""
    k = stats["codes"]
    usage = ", ".join(f"{u}/{k}" for u in stats["usage"])
    errors = ", ".join(f"{e:.4f}" for e in stats["quantization_error"])
    return "\n".join([
        f"items {stats['items']} (dim {stats['dim']}), {stats['levels']} levels x {k} codes, seed {stats['seed']}, "
        f"k-means {stats['backend']} ({stats['iters']} iterations), {stats['seconds']:.1f}s",
        f"distinct tuples before the digit {stats['distinct_tuples']} of {stats['items']}; largest bucket "
        f"{stats['largest_bucket']}; items with digit > 0 {stats['collided_items']}; digit range {stats['dedup_range']}",
        f"codebook usage per level {usage}",
        f"quantisation error per level (mean squared distance to the centre) {errors}",
    ])
