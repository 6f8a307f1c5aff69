"""`sequences` kind: one user per line, `user_id item item ...` (space or tab separated, oldest item first).

The format of ML-1M's sequences.txt and of many published preprocessed datasets; there are no timestamps,
so HSTU's time bias sees no gaps (set model.time_bias=false, or give times through the `csv` kind).
"""
import numpy as np

from .errors import DataError, SkipCounter
from .parsing import DELIMITERS, BadLine, parse_id, progress, read_lines, report
from .store import SequenceStore, remap_items


def parse_sequence_lines(path, lenient=False):
    """`user_id item item ...` lines -> (user ids ascending, their raw item arrays in file order)."""
    lines = read_lines(path)
    skips = SkipCounter()
    seen = {}
    user_ids, seqs = [], []
    dropped = 0
    for lineno, line in enumerate(progress(lines, path, len(lines)), 1):
        if not line.strip():
            continue
        try:
            for sep in ("::", ",", ";", "|"):
                if sep in line:
                    raise BadLine("wrong delimiter", f"expected space-separated 'user_id item item ...', "
                                                      f"found {DELIMITERS[sep]}")
            parts = line.split()
            try:
                values = np.array(parts, dtype=np.int64)
            except (ValueError, OverflowError):
                for k, p in enumerate(parts):
                    parse_id(p, "user_id" if k == 0 else f"item {k}", 1)
                raise BadLine("non-numeric field", "line holds a non-integer field") from None
            bad = np.flatnonzero(values < 1)
            if len(bad):
                k = int(bad[0])
                raise BadLine("negative id" if values[k] < 0 else "id out of range",
                               f"{'user_id' if k == 0 else f'item {k}'} must be >= 1, got {values[k]}")
            user = int(values[0])
            if user in seen:
                raise BadLine("duplicate user", f"user {user} already appeared on line {seen[user]}")
        except BadLine as bad:
            if not lenient:
                raise DataError(path, lineno, bad.message) from None
            skips.count(bad.reason)
            continue
        seen[user] = lineno
        if len(values) < 2:
            dropped += 1  # a user needs at least one item
            continue
        user_ids.append(user)
        seqs.append(values[1:])
    report(path, skips, dropped)
    if not seqs:
        raise DataError(path, None, f"no valid interactions ({skips.summary()})")
    order = np.argsort(np.asarray(user_ids, dtype=np.int64), kind="stable")
    return np.asarray(user_ids, dtype=np.int64)[order], [seqs[k] for k in order]


def read_sequences(path, lenient=False):
    """A `user_id item item ...` text file -> SequenceStore (no timestamps; each line's order is kept)."""
    user_ids, seqs = parse_sequence_lines(path, lenient)
    item_seqs, item_raw_ids = remap_items(seqs)
    return SequenceStore(name="sequences", user_ids=user_ids, item_seqs=item_seqs, time_seqs=None,
                         item_raw_ids=item_raw_ids, time_unit="s")
