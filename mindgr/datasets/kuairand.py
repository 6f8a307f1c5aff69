"""KuaiRand reader: official log_*.csv files -> positive-interaction SequenceStore.

Clean files go through a vectorised pyarrow parse; a file that fails it (or any
lenient read) is re-read line by line so errors name the exact file and line.
"""
import csv
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import DataError, SkipCounter
from .parsing import PROGRESS_BYTES, BadLine, build_store, check_file, other_delimiter, parse_id, parse_time, report


def _kuairand_files(paths):
    if isinstance(paths, (str, Path)) and Path(paths).is_dir():
        files = sorted(Path(paths).glob("log_*.csv"))
        if not files:
            raise DataError(paths, None, "no log_*.csv files in directory")
        return files
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("read_kuairand: empty list of files")
    return files


def _kuairand_header(path, required):
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        first = f.readline()
    if not first.strip():
        raise DataError(path, 1, "missing header line")
    header = [c.strip() for c in next(csv.reader([first]))]
    if len(header) == 1:
        other = other_delimiter(first.strip(), ",", 2)
        if other is not None:
            raise DataError(path, 1, f"expected comma-separated header, found {other}")
    for col in required:
        if col not in header:
            raise DataError(path, 1, f"missing required column '{col}' (found: {', '.join(header)})")
    return header


def _kuairand_fast(path, required):
    """Vectorised parse; returns None when anything looks wrong (the slow path then locates it)."""
    import pyarrow as pa  # lazy: only KuaiRand needs it
    import pyarrow.csv as pacsv
    try:
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            include_columns=required, column_types={c: pa.int64() for c in required}))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    cols = {}
    for c in required:
        col = table.column(c)
        if col.null_count:
            return None
        cols[c] = col.to_numpy()
        if len(cols[c]) and cols[c].min() < 0:
            return None
    return cols


def _kuairand_slow(path, header, required, lenient, skips):
    """Line-by-line parse with exact line numbers (used on bad files and in lenient mode)."""
    where = {c: header.index(c) for c in required}
    out = {c: [] for c in required}
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            try:
                if len(row) != len(header):
                    raise BadLine("wrong number of fields",
                                   f"expected {len(header)} fields (as in the header), found {len(row)}")
                parsed = {}
                for c in required:
                    text = row[where[c]]
                    parsed[c] = parse_time(text, c) if c == "time_ms" else parse_id(text, c, 0)
            except BadLine as bad:
                if not lenient:
                    raise DataError(path, reader.line_num, bad.message) from None
                skips.count(bad.reason)
                continue
            for c in required:
                out[c].append(parsed[c])
    return {c: np.asarray(v, dtype=np.int64) for c, v in out.items()}


def read_kuairand(paths, positive_column="is_click", positive_value=1, lenient=False):
    """KuaiRand logs (a directory of log_*.csv, or a list of CSV files) -> positive-interaction store.

    Rows with ``positive_column == positive_value`` are kept, all files are merged
    per user and ordered by ``time_ms`` (stable, so ties keep file order).
    """
    files = _kuairand_files(paths)
    required = list(dict.fromkeys(["user_id", "video_id", "time_ms", positive_column]))
    total_bytes = 0
    for f in files:
        total_bytes += check_file(f).stat().st_size
    parts = []
    skips = SkipCounter()
    bar = tqdm(total=total_bytes, desc="kuairand", unit="B", unit_scale=True, file=sys.stderr,
               disable=None if total_bytes > PROGRESS_BYTES else True, leave=False)
    for f in files:
        header = _kuairand_header(f, required)
        cols = _kuairand_fast(f, required)
        if cols is None:
            file_skips = SkipCounter()
            cols = _kuairand_slow(f, header, required, lenient, file_skips)
            report(f, file_skips)
            for reason, n in file_skips.counts.items():
                skips.count(reason, n)
        parts.append(cols)
        bar.update(f.stat().st_size)
    bar.close()
    merged = {c: np.concatenate([p[c] for p in parts]) for c in required}
    keep = merged[positive_column] == positive_value
    all_users = np.unique(merged["user_id"])
    if not keep.any():
        where = files[0] if len(files) == 1 else files[0].parent
        raise DataError(where, None, f"no rows with {positive_column} == {positive_value} "
                                     f"({len(merged['user_id'])} rows read, {skips.summary()})")
    store = build_store("kuairand", merged["user_id"][keep], merged["video_id"][keep],
                         merged["time_ms"][keep], "ms")
    dropped = len(all_users) - store.num_users
    if dropped:
        where = files[0] if len(files) == 1 else files[0].parent
        report(where, SkipCounter(), dropped, f"no rows where {positive_column} == {positive_value}")
    return store
