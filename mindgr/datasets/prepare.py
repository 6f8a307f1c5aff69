"""One entry point from a raw dataset to a prepared store on disk.

    python -m mindgr.datasets KIND SRC OUT [--lenient]   (see __main__.py)
"""
import argparse
import sys

from .readers import read_kuairand, read_movielens_100k, read_movielens_1m
from .store import write_store
from .synthetic import generate_synthetic

KINDS = ("movielens-1m", "movielens-100k", "kuairand", "synthetic")
_SYNTHETIC_OPTIONS = ("num_users", "num_items", "median_len", "max_len", "min_len", "num_clusters",
                      "seed", "sigma", "zipf_a")


def read_any(kind, src, lenient=False, **opts):
    """Read dataset ``kind`` from ``src`` into a SequenceStore (nothing written)."""
    if kind == "movielens-1m":
        return read_movielens_1m(src, lenient=lenient, **opts)
    if kind == "movielens-100k":
        return read_movielens_100k(src, lenient=lenient, **opts)
    if kind == "kuairand":
        return read_kuairand(src, lenient=lenient, **opts)
    if kind == "synthetic":
        unknown = set(opts) - set(_SYNTHETIC_OPTIONS)
        if unknown:
            raise ValueError(f"unknown synthetic options {sorted(unknown)}; known: {', '.join(_SYNTHETIC_OPTIONS)}")
        return generate_synthetic(**opts)
    raise ValueError(f"unknown dataset kind {kind!r}; known kinds: {', '.join(KINDS)}")


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
    ])


def prepare(kind, src, out, lenient=False, **kind_options):
    """Read ``kind`` from ``src``, write the store to ``out``, print a summary; returns the store."""
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
