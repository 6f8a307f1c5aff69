"""`csv` kind: an interaction log with one row per event, columns chosen by the user.

    user_id,item_id,timestamp[,page_id][,value]      (names, separator and time unit are options)

Each user's rows are ordered by time (stable: equal times keep file order) or, without a time column, kept
in file order. The optional page column (e.g. a request or page-view id) is carried into the store beside
every item, for models that group a user's items by the page they were shown on. The optional value
column (a rating, watch ratio, purchase flag: any finite number) is carried the same way
(SequenceStore.value_seqs), for objectives that learn from it.

Duplicate events are counted and reported (the summary and stats.json, `duplicate_events`): an event is a
duplicate when an earlier row has the same user, item, timestamp (and page); without a time column, when
it repeats the same user's previous row (same item and page). They are kept by default (the file is read
as it is); `dedupe=True` (`--option dedupe=true`) keeps only the first of each. With leave-one-out, a
duplicated last event makes the held-out target equal to the last history item, which inflates metrics.
"""
import csv

import numpy as np

from .errors import DataError, SkipCounter
from .parsing import DELIMITERS, BadLine, build_store, check_file, other_delimiter, parse_id, parse_time, progress, \
    read_lines, report

# time unit of the file -> (divisor to the store's unit, the store's unit)
TIME_UNITS = {"s": (1, "s"), "ms": (1, "ms"), "us": (1000, "ms"), "ns": (1_000_000, "ms")}
_SEPARATOR_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "space": " ", "pipe": "|"}


def _separator(path, sep):
    sep = _SEPARATOR_NAMES.get(sep, sep)
    if not isinstance(sep, str) or len(sep) != 1:
        raise DataError(path, None, f"separator {sep!r}: expected one character (or tab, comma, semicolon, "
                                    "space, pipe)")
    return sep


def _columns(path, header_row, wanted, sep, header):
    """Field index of each wanted column: looked up by name in the header, or given as a 0-based index."""
    where = {}
    for role, col in wanted.items():
        if header:
            name = str(col)
            if name not in header_row:
                hint = ""
                if len(header_row) == 1:
                    other = other_delimiter(header_row[0], sep, 2)
                    if other is not None:
                        hint = f"; the header looks separated by {other}, not {DELIMITERS.get(sep, repr(sep))}"
                raise DataError(path, 1, f"missing {role} column '{name}' (found: {', '.join(header_row)}){hint}")
            where[role] = header_row.index(name)
        else:
            try:
                where[role] = int(col)
            except (TypeError, ValueError):
                raise DataError(path, None, f"{role}_column {col!r}: without a header, columns are 0-based "
                                            "field numbers") from None
            if where[role] < 0:
                raise DataError(path, None, f"{role}_column {col!r}: expected a field number >= 0")
    return where


def duplicate_events(out: dict) -> np.ndarray:
    """Bool mask over the parsed rows (file order): True for a row that repeats an earlier event (same
    user, item, time and page; without times: the same user's previous row, same item and page)."""
    keys = [np.asarray(out[role], np.int64) for role in ("user", "item", "time", "page") if role in out]  # not the value
    n = len(keys[0])
    dup = np.zeros(n, bool)
    if n < 2:
        return dup
    if "time" in out:
        order = np.lexsort([np.arange(n)] + keys[::-1])
        same = np.ones(n - 1, bool)
        for k in keys:
            same &= k[order][1:] == k[order][:-1]
        dup[order[1:][same]] = True
        return dup
    order = np.argsort(keys[0], kind="stable")                      # each user's rows in file order
    same = np.ones(n - 1, bool)
    for k in keys:
        same &= k[order][1:] == k[order][:-1]
    dup[order[1:][same]] = True
    return dup


def parse_value(text, field):
    """A row's value: any finite number."""
    try:
        value = float(text)
    except ValueError:
        raise BadLine("non-numeric field", f"field {field} is not a number: {text!r}") from None
    if not np.isfinite(value):
        raise BadLine("non-numeric field", f"field {field} is not a finite number: {text!r}")
    return value


def read_csv_log(path, user_column="user_id", item_column="item_id", time_column="timestamp", page_column="",
                 time_unit="s", separator=",", header=True, lenient=False, dedupe=False, value_column=""):
    """An interaction log (CSV or any one-character separator) -> SequenceStore.

    ``time_column=""`` means no timestamps (file order is the order); ``time_unit`` is the unit of the
    time column (s, ms, us, ns; stored as s or ms). Ids must be integers >= 0. Duplicate events
    (`duplicate_events`) are counted in the store's stats; ``dedupe`` drops them (the first is kept).
    ``value_column`` (optional, "" = none): a number per row kept as the interaction's value.
    """
    path = check_file(path)
    sep = _separator(path, separator)
    if time_unit not in TIME_UNITS:
        raise DataError(path, None, f"time_unit {time_unit!r}: expected one of {', '.join(TIME_UNITS)}")
    wanted = {"user": user_column, "item": item_column}
    if time_column != "":
        wanted["time"] = time_column
    if page_column != "":
        wanted["page"] = page_column
    if value_column != "":
        wanted["value"] = value_column
    lines = read_lines(path)
    reader = csv.reader(lines, delimiter=sep)
    nfields = None
    if header:
        header_row = next(reader)
        if header_row:
            header_row[0] = header_row[0].lstrip("\ufeff")
        header_row = [c.strip() for c in header_row]
        where = _columns(path, header_row, wanted, sep, True)
        nfields = len(header_row)
    else:
        where = _columns(path, [], wanted, sep, False)
    skips = SkipCounter()
    out = {role: [] for role in wanted}
    for row in progress(reader, path, len(lines)):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        try:
            if nfields is None:                    # no header: the first data row fixes the width
                nfields = len(row)
                if max(where.values()) >= nfields:
                    role = max(where, key=where.get)
                    raise DataError(path, reader.line_num, f"{role}_column {where[role]} does not exist: the row "
                                                           f"has {nfields} fields")
            if len(row) != nfields:
                other = other_delimiter(sep.join(row), sep, nfields)
                if len(row) == 1 and other is not None:
                    raise BadLine("wrong delimiter", f"expected fields separated by "
                                                      f"{DELIMITERS.get(sep, repr(sep))}, found {other}")
                raise BadLine("wrong number of fields", f"expected {nfields} fields, found {len(row)}")
            parsed = {}
            for role, k in where.items():
                name = str(wanted[role])
                text = row[k].strip()
                if not text:
                    raise BadLine("missing field", f"field {name} is empty")
                if role == "value":
                    parsed[role] = parse_value(text, name)
                else:
                    parsed[role] = parse_time(text, name) if role == "time" else parse_id(text, name, 0)
        except BadLine as bad:
            if not lenient:
                raise DataError(path, reader.line_num, bad.message) from None
            skips.count(bad.reason)
            continue
        for role, v in parsed.items():
            out[role].append(v)
    report(path, skips)
    if not out["user"]:
        raise DataError(path, None, f"no valid interactions ({skips.summary()})")
    dup = duplicate_events(out)
    notes = {"duplicate_events": int(dup.sum()), "duplicates_dropped": bool(dedupe)}
    if dedupe and dup.any():
        out = {role: [v for v, d in zip(values, dup) if not d] for role, values in out.items()}
    divisor, unit = TIME_UNITS[time_unit]
    times = None
    if "time" in out:
        times = [t // divisor for t in out["time"]] if divisor > 1 else out["time"]
    store = build_store("csv", out["user"], out["item"], times, unit, pages=out.get("page"), values=out.get("value"))
    store.read_notes = notes
    return store
