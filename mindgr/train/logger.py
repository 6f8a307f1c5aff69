"""Metrics to stdout and RUN_DIR/metrics.jsonl (one JSON object per line, flushed as written)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, quiet: bool = False):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.quiet = quiet
        self._f = open(self.path, "a")

    def write(self, record: dict, text: str | None = None):
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()
        if text and not self.quiet:
            print(text, flush=True)

    def info(self, text: str):
        if not self.quiet:
            print(text, flush=True)

    def close(self):
        self._f.close()


def format_metrics(metrics: dict) -> str:
    keys = [k for k in metrics if k.startswith(("hr@", "ndcg@", "mrr"))]
    return " ".join(f"{k}={metrics[k]:.4f}" for k in keys)


def write_json_atomic(path: Path, data: dict):
    import os
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def warn(text: str):
    print(f"warning: {text}", file=sys.stderr, flush=True)
