"""SequenceStore: every user's chronological item sequence, plus its on-disk form.

Item ids are remapped to a dense 1..V range (0 is the padding id) so embedding
tables have no holes; ``item_raw_ids`` maps them back to the source ids. An optional value per
interaction (a rating, watch ratio, purchase flag: ``value_seqs``, float32) sits next to each item;
a store without values has ``value_seqs = None`` and no values column on disk.
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write

from .errors import DataError

SEQUENCES_FILE = "sequences.parquet"
ITEMS_FILE = "items.parquet"
STATS_FILE = "stats.json"
_META_KEY = b"mindgr.store"
FORMAT_VERSION = 1


@dataclass
class SequenceStore:
    name: str
    user_ids: np.ndarray  # int64 [U], original user ids
    item_seqs: list  # U int32 arrays of dense ids 1..V, chronological
    time_seqs: list | None  # U int64 arrays, or None without timestamps
    item_raw_ids: np.ndarray  # int64 [V+1]; [0] = -1 (padding)
    time_unit: str = "s"  # "s" or "ms"
    page_seqs: list | None = None  # U int64 arrays: the page/request id of every item (csv page_column), or None
    read_notes: dict | None = None  # what the reader counted in the raw file (csv: duplicate events), for stats
    value_seqs: list | None = None  # U float32 arrays: a value per interaction (e.g. the rating), or None

    @property
    def has_values(self):
        return self.value_seqs is not None

    @property
    def num_items(self):
        return int(len(self.item_raw_ids) - 1)

    @property
    def num_users(self):
        return int(len(self.item_seqs))

    @property
    def num_interactions(self):
        return int(sum(len(s) for s in self.item_seqs))

    @property
    def has_timestamps(self):
        return self.time_seqs is not None

    def lengths(self):
        return np.fromiter((len(s) for s in self.item_seqs), dtype=np.int64, count=len(self.item_seqs))

    def stats(self):
        lens = self.lengths()
        if len(lens) == 0:
            lens = np.zeros(1, dtype=np.int64)
        p50, p90, p99 = np.percentile(lens, [50, 90, 99])
        return {
            "name": self.name,
            "users": self.num_users,
            "items": self.num_items,
            "interactions": self.num_interactions,
            "has_timestamps": self.has_timestamps,
            "time_unit": self.time_unit,
            "length_min": int(lens.min()),
            "length_mean": round(float(lens.mean()), 2),
            "length_p50": float(p50),
            "length_p90": float(p90),
            "length_p99": float(p99),
            "length_max": int(lens.max()),
            **({"has_values": True} if self.has_values else {}),
            **(self.read_notes or {}),
        }


def remap_items(raw_item_seqs):
    """Map raw item ids to dense 1..V (in increasing raw id order).

    Returns ``(item_seqs, item_raw_ids)`` with int32 sequences and an int64
    lookup whose entry 0 is -1 (the padding id has no raw id).
    """
    lens = np.fromiter((len(s) for s in raw_item_seqs), dtype=np.int64, count=len(raw_item_seqs))
    flat = (np.concatenate([np.asarray(s, dtype=np.int64) for s in raw_item_seqs])
            if len(raw_item_seqs) else np.zeros(0, dtype=np.int64))
    uniq, inverse = np.unique(flat, return_inverse=True)
    if len(uniq) >= np.iinfo(np.int32).max:
        raise ValueError(f"too many distinct items for int32 ids: {len(uniq)}")
    dense = (inverse.reshape(-1) + 1).astype(np.int32)
    item_seqs = np.split(dense, np.cumsum(lens)[:-1]) if len(lens) else []
    item_raw_ids = np.concatenate([[-1], uniq]).astype(np.int64)
    return item_seqs, item_raw_ids


def _pyarrow():
    """pyarrow is imported lazily: only the parquet files need it, not the in-memory pipeline."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    return pa, pq


def _list_array(seqs, value_type):
    pa, _ = _pyarrow()
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    values = pa.array(np.concatenate(seqs) if len(seqs) else np.zeros(0), value_type)
    if offsets[-1] > np.iinfo(np.int32).max:  # list<> offsets are int32: go large beyond 2^31 values
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values)


def _atomic_write(path, write_fn):
    # Write beside the target then rename, so readers never see a half file.
    atomic_write(path, write_fn, tmp_suffix=f".{os.getpid()}.tmp{path.suffix}")  # per process: concurrent writers


def write_store(store, out_dir):
    """Write ``sequences.parquet``, ``items.parquet`` and ``stats.json`` into ``out_dir``."""
    pa, pq = _pyarrow()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"version": FORMAT_VERSION, "name": store.name, "time_unit": store.time_unit,
            "num_items": store.num_items}
    columns = {
        "user_id": pa.array(np.asarray(store.user_ids, dtype=np.int64), pa.int64()),
        "item_ids": _list_array([np.asarray(s, dtype=np.int32) for s in store.item_seqs], pa.int32()),
    }
    if store.time_seqs is not None:
        columns["timestamps"] = _list_array([np.asarray(t, dtype=np.int64) for t in store.time_seqs],
                                            pa.int64())
    if store.page_seqs is not None:
        columns["page_ids"] = _list_array([np.asarray(p, dtype=np.int64) for p in store.page_seqs], pa.int64())
    if store.value_seqs is not None:
        columns["values"] = _list_array([np.asarray(v, dtype=np.float32) for v in store.value_seqs], pa.float32())
    seq_table = pa.table(columns).replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    raw = np.asarray(store.item_raw_ids, dtype=np.int64)
    items_table = pa.table({
        "item_id": pa.array(np.arange(1, len(raw), dtype=np.int32), pa.int32()),
        "raw_id": pa.array(raw[1:], pa.int64()),
    })
    _atomic_write(out / ITEMS_FILE, lambda p: pq.write_table(items_table, p))
    _atomic_write(out / SEQUENCES_FILE, lambda p: pq.write_table(seq_table, p))
    stats_text = json.dumps(store.stats(), indent=2) + "\n"
    _atomic_write(out / STATS_FILE, lambda p: Path(p).write_text(stats_text))


def _read_table(path):
    pa, pq = _pyarrow()
    if not path.is_file():
        raise DataError(path, None, "file not found (expected a store written by write_store)")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(path, None, f"cannot read parquet: {e}") from e


def _require_columns(path, table, names):
    for name in names:
        if name not in table.column_names:
            raise DataError(path, None, f"missing column '{name}' (found: {', '.join(table.column_names)})")


def _flatten_list_column(path, table, name, user_ids, dtype=np.int64):
    """Return (values, lengths) of a list column, rejecting null lists or values."""
    col = table.column(name).combine_chunks()
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(path, None, f"row {row} (user {user_ids[row]}): '{name}' is null")
    values = col.flatten()
    if values.null_count:
        raise DataError(path, None, f"column '{name}' holds null values")
    lens = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    return values.to_numpy(zero_copy_only=False).astype(dtype), lens


def _row_of(flat_index, lens):
    return int(np.searchsorted(np.cumsum(lens), flat_index, side="right"))


def read_store(path):
    """Load and validate a store directory written by :func:`write_store`."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(root, None, "store directory not found")
    seq_path, items_path = root / SEQUENCES_FILE, root / ITEMS_FILE

    items = _read_table(items_path)
    _require_columns(items_path, items, ["item_id", "raw_id"])
    item_ids = items.column("item_id").to_numpy().astype(np.int64)
    raw_ids = items.column("raw_id").to_numpy().astype(np.int64)
    if not np.array_equal(item_ids, np.arange(1, len(item_ids) + 1)):
        raise DataError(items_path, None, "item_id must run 1..V in order")
    num_items = len(item_ids)

    table = _read_table(seq_path)
    _require_columns(seq_path, table, ["user_id", "item_ids"])
    meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
    user_ids = table.column("user_id").to_numpy().astype(np.int64)
    flat_items, lens = _flatten_list_column(seq_path, table, "item_ids", user_ids)

    bad = np.flatnonzero((flat_items < 1) | (flat_items > num_items))
    if len(bad):
        row = _row_of(bad[0], lens)
        raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): item id {flat_items[bad[0]]} "
                                        f"outside 1..{num_items}")

    time_seqs = None
    if "timestamps" in table.column_names and table.column("timestamps").null_count < table.num_rows:
        flat_times, tlens = _flatten_list_column(seq_path, table, "timestamps", user_ids)
        if not np.array_equal(tlens, lens):
            row = int(np.flatnonzero(tlens != lens)[0])
            raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): {tlens[row]} timestamps "
                                            f"for {lens[row]} items")
        # A negative step inside a row (not across a row boundary) means time goes backwards.
        starts = np.cumsum(lens)[:-1]
        steps = np.diff(flat_times)
        backwards = steps < 0
        backwards[starts[(starts > 0) & (starts <= len(steps))] - 1] = False
        if backwards.any():
            k = int(np.flatnonzero(backwards)[0])
            row = _row_of(k + 1, lens)
            pos = k + 1 - (int(np.cumsum(lens)[row - 1]) if row else 0)
            raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): time goes backwards at "
                                            f"position {pos} ({flat_times[k]} -> {flat_times[k + 1]})")
        time_seqs = np.split(flat_times, np.cumsum(lens)[:-1]) if len(lens) else []

    splits = np.cumsum(lens)[:-1]
    page_seqs = None
    if "page_ids" in table.column_names:
        flat_pages, plens = _flatten_list_column(seq_path, table, "page_ids", user_ids)
        if not np.array_equal(plens, lens):
            row = int(np.flatnonzero(plens != lens)[0])
            raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): {plens[row]} page ids "
                                            f"for {lens[row]} items")
        page_seqs = np.split(flat_pages, splits) if len(lens) else []
    value_seqs = None
    if "values" in table.column_names:
        flat_values, vlens = _flatten_list_column(seq_path, table, "values", user_ids, np.float32)
        if not np.array_equal(vlens, lens):
            row = int(np.flatnonzero(vlens != lens)[0])
            raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): {vlens[row]} values "
                                            f"for {lens[row]} items")
        if not np.isfinite(flat_values).all():
            row = _row_of(int(np.flatnonzero(~np.isfinite(flat_values))[0]), lens)
            raise DataError(seq_path, None, f"row {row} (user {user_ids[row]}): a value is not finite")
        value_seqs = np.split(flat_values, splits) if len(lens) else []
    item_seqs = np.split(flat_items.astype(np.int32), splits) if len(lens) else []
    return SequenceStore(
        name=meta.get("name", root.name),
        user_ids=user_ids,
        item_seqs=item_seqs,
        time_seqs=time_seqs,
        item_raw_ids=np.concatenate([[-1], raw_ids]).astype(np.int64),
        time_unit=meta.get("time_unit", "s"),
        page_seqs=page_seqs,
        value_seqs=value_seqs,
    )
