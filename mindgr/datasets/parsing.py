"""Line-parsing helpers shared by the dataset readers.

A bad line raises BadLine(reason, message); each reader turns it into a
DataError (strict) or a counted skip (lenient) so nothing is lost silently.
"""
import gzip
import sys
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import DataError
from .store import SequenceStore, remap_items

PROGRESS_BYTES = 1 << 20  # show a progress bar only for files over ~1 MB
_MAX_ID = np.iinfo(np.int64).max
DELIMITERS = {"::": "'::'", "\t": "tab", ",": "','", ";": "';'", "|": "'|'", " ": "space"}


class BadLine(Exception):
    """One bad line: ``reason`` groups skips in lenient mode, ``message`` explains it."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason, self.message = reason, message


def check_file(path):
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, "file not found")
    if not path.is_file():
        raise DataError(path, None, "not a regular file")
    if path.stat().st_size == 0:
        raise DataError(path, None, "file is empty")
    return path


def read_lines(path):
    """Whole file as a list of lines (gzip by suffix); undecodable bytes become U+FFFD."""
    path = check_file(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(path, None, f"cannot read file: {e}") from e
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not any(line.strip() for line in lines):
        raise DataError(path, None, "file is empty (no data lines)")
    return lines


def progress(iterable, path, total):
    big = Path(path).stat().st_size > PROGRESS_BYTES
    return tqdm(iterable, total=total, desc=Path(path).name, unit=" lines",
                file=sys.stderr, disable=None if big else True, leave=False)


def report(path, skips, dropped_users=0, why_dropped="no items"):
    """Tell the user (stderr) about every skipped line and dropped user."""
    if skips.total:
        print(f"{path}: {skips.summary()}", file=sys.stderr)
    if dropped_users:
        print(f"{path}: dropped {dropped_users} users with {why_dropped}", file=sys.stderr)


def other_delimiter(line, expected, nfields):
    """Name of a delimiter (not ``expected``) that would split the line into nfields."""
    for sep, label in DELIMITERS.items():
        if sep != expected and sep in line and len(line.split(sep)) == nfields:
            return label
    for sep, label in DELIMITERS.items():
        if sep != expected and sep in line.strip():
            return label
    return None


def parse_id(text, field, minimum):
    try:
        value = int(text)
    except ValueError:
        raise BadLine("non-numeric field", f"field {field} is not an integer: {text.strip()!r}") from None
    if value < minimum or value > _MAX_ID:
        reason = "negative id" if value < 0 else "id out of range"
        raise BadLine(reason, f"{field} must be >= {minimum}, got {value}")
    return value


def parse_time(text, field):
    try:
        value = int(text)
    except ValueError:
        raise BadLine("non-numeric field", f"field {field} is not an integer: {text.strip()!r}") from None
    if value < 0 or value > _MAX_ID:
        raise BadLine("negative timestamp" if value < 0 else "timestamp out of range",
                       f"{field} must be >= 0, got {value}")
    return value


def build_store(name, users, items, times, time_unit, pages=None, values=None):
    """Group interactions by user (ascending id), stable-sorted by time when given; `pages` (one id per
    interaction) and `values` (one float per interaction, kept as float32) follow their items."""
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    order = np.arange(len(users))
    if times is not None:
        times = np.asarray(times, dtype=np.int64)
        order = np.argsort(times, kind="stable")  # ties keep file order
    order = order[np.argsort(users[order], kind="stable")]
    users, items = users[order], items[order]
    user_ids, starts = np.unique(users, return_index=True)
    item_seqs, item_raw_ids = remap_items(np.split(items, starts[1:]))
    time_seqs = np.split(times[order], starts[1:]) if times is not None else None
    page_seqs = None
    if pages is not None:
        page_seqs = np.split(np.asarray(pages, dtype=np.int64)[order], starts[1:])
    value_seqs = None
    if values is not None:
        value_seqs = np.split(np.asarray(values, dtype=np.float32)[order], starts[1:])
    return SequenceStore(name=name, user_ids=user_ids, item_seqs=item_seqs, time_seqs=time_seqs,
                         item_raw_ids=item_raw_ids, time_unit=time_unit, page_seqs=page_seqs,
                         value_seqs=value_seqs)
