"""MovieLens readers: ML-1M (ratings.dat[.gz] or sequences.txt) and ML-100K (u.data)."""
import gzip
import sys
import zlib
from pathlib import Path

import numpy as np

from .errors import DataError, SkipCounter
from .parsing import (DELIMITERS, BadLine, build_store, check_file, other_delimiter, parse_id, parse_time,
                      progress, read_lines, report)
from .sequences import parse_sequence_lines
from .store import SequenceStore, remap_items


def _read_rating_lines(path, sep, field_names, lenient):
    """Parse `user SEP item SEP rating SEP timestamp` lines: (users, items, times, ratings) lists."""
    lines = read_lines(path)
    layout = sep.join(field_names) if sep != "\t" else "<tab>".join(field_names)
    nfields = len(field_names)
    user_f, item_f, rating_f, time_f = field_names
    skips = SkipCounter()
    users, items, times, ratings = [], [], [], []
    for lineno, line in enumerate(progress(lines, path, len(lines)), 1):
        if not line.strip():
            continue
        try:
            parts = line.split(sep)
            if len(parts) != nfields:
                other = other_delimiter(line, sep, nfields)
                if other is not None:
                    raise BadLine("wrong delimiter", f"expected fields separated by {DELIMITERS[sep]} "
                                                      f"({layout}), found {other}")
                raise BadLine("wrong number of fields",
                               f"expected {nfields} fields ({layout}), found {len(parts)}")
            u = parse_id(parts[0], user_f, 1)
            i = parse_id(parts[1], item_f, 1)
            try:
                r = float(parts[2])
            except ValueError:
                raise BadLine("non-numeric field",
                               f"field {rating_f} is not a number: {parts[2].strip()!r}") from None
            if not np.isfinite(r):
                raise BadLine("non-numeric field", f"field {rating_f} is not a finite number: {parts[2].strip()!r}")
            t = parse_time(parts[3], time_f)
        except BadLine as bad:
            if not lenient:
                raise DataError(path, lineno, bad.message) from None
            skips.count(bad.reason)
            continue
        users.append(u)
        items.append(i)
        times.append(t)
        ratings.append(r)
    report(path, skips)
    if not users:
        raise DataError(path, None, f"no valid interactions ({skips.summary()})")
    return users, items, times, ratings


def _read_sequence_lines(path, lenient, timestamps=None):
    """ML-1M's sequences.txt: `user_id item item ...` lines; `timestamps` attaches times from a ratings file."""
    user_ids, seqs = parse_sequence_lines(path, lenient)
    time_seqs = _attach_times(path, user_ids, seqs, timestamps, lenient) if timestamps else None
    item_seqs, item_raw_ids = remap_items(seqs)
    return SequenceStore(name="movielens-1m", user_ids=user_ids, item_seqs=item_seqs, time_seqs=time_seqs,
                         item_raw_ids=item_raw_ids, time_unit="s")


def _attach_times(seq_path, user_ids, seqs, ratings_path, lenient):
    """Timestamps for sequences.txt from a ratings file that covers some of its users (ML-1M: users
    1-2999). A covered user must have a rating for every item of the sequence, in non-decreasing time;
    users the file does not cover get all-zero timestamps: no time information, so every gap falls in
    the zero-gap bucket of the time bias (the position bias is unaffected)."""
    ratings_path = Path(ratings_path)
    check_file(ratings_path)
    users, items, times, _ = _read_rating_lines(ratings_path, "::", ["UserID", "MovieID", "Rating", "Timestamp"],
                                                lenient)
    when = dict(zip(zip(users, items), times))
    covered = set(users)
    out, with_times = [], 0
    for user, seq in zip(user_ids.tolist(), seqs):
        if user not in covered:
            out.append(np.zeros(len(seq), dtype=np.int64))
            continue
        missing = [int(i) for i in seq if (user, int(i)) not in when]
        if missing:
            raise DataError(ratings_path, None, f"user {user} of {seq_path.name} has no rating for item "
                                                f"{missing[0]} ({len(missing)} items missing)")
        t = np.array([when[(user, int(i))] for i in seq], dtype=np.int64)
        back = np.flatnonzero(np.diff(t) < 0)
        if len(back):
            raise DataError(seq_path, None, f"user {user}: time goes backwards at item {int(back[0]) + 2} of the "
                                            f"sequence ({t[back[0]]} -> {t[back[0] + 1]} from {ratings_path.name})")
        out.append(t)
        with_times += 1
    print(f"{seq_path.name}: timestamps from {ratings_path.name} for {with_times} of {len(seqs)} users "
          f"(the other {len(seqs) - with_times}: zeros, no time information)", file=sys.stderr)  # stdout: results
    return out


def _is_ratings_file(path):
    """Ratings lines hold '::', sequence lines never do; a file without '::' is a sequences file unless its
    name says ratings (then it is a malformed ratings file, and the error says what its lines lack)."""
    if "ratings" in path.name.lower():
        return True
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", errors="replace") as f:
            for line in f:
                if line.strip():
                    return "::" in line
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(path, None, f"cannot read file: {e}") from e
    return False


def read_movielens_1m(path, lenient=False, timestamps=None):
    """ML-1M from ratings.dat(.gz) (`UserID::MovieID::Rating::Timestamp`, e.g. the official lines of users
    1-2999 in ratings_users_1-2999.dat.gz: a file whose name says ratings is read as one) or sequences.txt.
    A ratings file keeps each rating as the interaction's value (SequenceStore.value_seqs); sequences.txt
    has none.

    A directory uses ratings.dat, then ratings.dat.gz, then sequences.txt. `timestamps` (sequences.txt
    only): a ratings file whose timestamps are attached to the users it covers (see _attach_times).
    """
    path = Path(path)
    if path.is_dir():
        for name in ("ratings.dat", "ratings.dat.gz", "sequences.txt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise DataError(path, None, "no ratings.dat, ratings.dat.gz or sequences.txt in directory")
    check_file(path)
    if not _is_ratings_file(path):
        return _read_sequence_lines(path, lenient, timestamps)
    if timestamps:
        raise DataError(path, None, "data.timestamps is for sequences.txt; a ratings file has its own timestamps")
    users, items, times, ratings = _read_rating_lines(path, "::", ["UserID", "MovieID", "Rating", "Timestamp"],
                                                      lenient)
    return build_store("movielens-1m", users, items, times, "s", values=ratings)


def read_movielens_100k(path, lenient=False):
    """ML-100K u.data: tab-separated `user item rating timestamp` (path = file or its directory); the rating
    is kept as the interaction's value."""
    path = Path(path)
    if path.is_dir():
        path = path / "u.data"
    users, items, times, ratings = _read_rating_lines(path, "\t", ["user_id", "item_id", "rating", "timestamp"],
                                                      lenient)
    return build_store("movielens-100k", users, items, times, "s", values=ratings)
