"""One entry point from a raw dataset to a prepared store on disk.

    python -m mindgr.datasets KIND SRC OUT [--lenient]   (see __main__.py)
"""
import argparse
import sys
from pathlib import Path

from .errors import DataError
from .readers import read_csv_log, read_kuairand, read_movielens_100k, read_movielens_1m, read_sequences
from .store import write_store
from .synthetic import generate_synthetic

# Every kind's reader options and their types: `--option KEY=VALUE` is checked against these before any
# file is read, so a typo is one line, not a traceback from inside a reader.
KIND_OPTIONS = {
    "movielens-1m": {"timestamps": str},
    "movielens-100k": {},
    "kuairand": {"positive_column": str, "positive_value": int},
    "sequences": {},
    "csv": {"user_column": (str, int), "item_column": (str, int), "time_column": (str, int),
            "page_column": (str, int), "value_column": (str, int), "time_unit": str, "separator": str, "header": bool, "dedupe": bool},
    "synthetic": {"num_users": int, "num_items": int, "median_len": int, "max_len": int, "min_len": int,
                  "num_clusters": int, "seed": int, "sigma": float, "zipf_a": float,
                  "page_size": float, "values": bool},
}
KINDS = tuple(KIND_OPTIONS)
_READERS = {"movielens-1m": read_movielens_1m, "movielens-100k": read_movielens_100k, "kuairand": read_kuairand,
            "sequences": read_sequences, "csv": read_csv_log}


def _type_names(tp) -> str:
    return " or ".join(t.__name__ for t in (tp if isinstance(tp, tuple) else (tp,)))


def check_options(kind, opts):
    """Raise ValueError (one line) for an unknown kind, an unknown option or a value of the wrong type."""
    if kind not in KIND_OPTIONS:
        raise ValueError(f"unknown dataset kind {kind!r}; known kinds: {', '.join(KINDS)}")
    known = KIND_OPTIONS[kind]
    for name, value in opts.items():
        if name not in known:
            allowed = ", ".join(known) if known else "none"
            raise ValueError(f"data prepare {kind}: unknown option {name!r} (options of {kind}: {allowed})")
        tp = known[name]
        types = tp if isinstance(tp, tuple) else (tp,)
        ok = any(isinstance(value, t) and not (isinstance(value, bool) and t is not bool) for t in types)
        if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ValueError(f"data prepare {kind}: option {name} = {value!r}: expected {_type_names(tp)}")


def read_any(kind, src, lenient=False, **opts):
    """Read dataset ``kind`` from ``src`` into a SequenceStore (nothing written)."""
    check_options(kind, opts)
    if kind == "synthetic":
        return generate_synthetic(**opts)
    if src is None or str(src) == "":
        raise ValueError(f"data kind {kind} needs a source file or directory (--src, or data.path)")
    return _READERS[kind](src, lenient=lenient, **opts)


def format_summary(store):
    """Human-readable multi-line summary of a store's size and length distribution."""
    s = store.stats()
    return "\n".join([
        f"dataset {s['name']}",
        f"  users          {s['users']:,}",
        f"  items          {s['items']:,}",
        f"  interactions   {s['interactions']:,}",
        f"  has timestamps {s['has_timestamps']}" + (f" (unit {s['time_unit']})" if s["has_timestamps"] else ""),
        f"  length         min {s['length_min']}  p50 {s['length_p50']:g}  p90 {s['length_p90']:g}  "
        f"p99 {s['length_p99']:g}  max {s['length_max']}  mean {s['length_mean']:.2f}",
    ] + ([f"  duplicates     {s['duplicate_events']:,} events repeated an earlier one "
          f"({'dropped' if s.get('duplicates_dropped') else 'kept; --option dedupe=true drops them'})"]
         if "duplicate_events" in s else []))


def check_out_dir(out):
    """Fail before reading anything when the store cannot go to ``out``."""
    from mindgr.paths import unwritable_reason
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(out, None, "exists and is not a directory (the store is a directory)")
    reason = unwritable_reason(out)
    if reason:
        raise DataError(out, None, f"cannot write the store: {reason}")


def prepare(kind, src, out, lenient=False, **kind_options):
    """Read ``kind`` from ``src``, write the store to ``out``, print a summary; returns the store."""
    check_out_dir(out)
    store = read_any(kind, src, lenient=lenient, **kind_options)
    write_store(store, out)
    print(format_summary(store))
    print(f"  written to     {out}")
    return store


def main(argv=None):
    ap = argparse.ArgumentParser(description="Prepare a MindGR sequence store.")
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("src", help="dataset file or directory (ignored for synthetic)")
    ap.add_argument("out", help="output store directory")
    ap.add_argument("--lenient", action="store_true", help="skip and count bad lines instead of failing")
    ap.add_argument("--positive-column", default=None, help="kuairand: column marking positives")
    args = ap.parse_args(argv)
    opts = {"positive_column": args.positive_column} if args.positive_column else {}
    try:
        prepare(args.kind, args.src, args.out, lenient=args.lenient, **opts)
    except ValueError as e:  # DataError included: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
