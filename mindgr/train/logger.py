"""Metrics to stdout and RUN_DIR/metrics.jsonl (one JSON object per line, flushed as written).

Every record carries its wall-clock time (`time`, Unix seconds) and the id of the attempt that wrote it
(`attempt`: one per start or resume of the run). A resumed run first cuts the file back to where it stood
when its checkpoint was saved (`position()` is stored in the checkpoint), so no step appears twice; a
fresh run never appends to the records of an earlier attempt that left no checkpoint.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from mindgr.paths import atomic_write


def new_attempt_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class MetricsLog:
    """`resume_at`: None for a fresh run (an existing file is moved aside to metrics.prev.jsonl); for a
    resume, the byte position the checkpoint recorded (the file is cut back to it), or a step (old
    checkpoints without a position: records of later steps are dropped)."""

    def __init__(self, run_dir: Path, quiet: bool = False, resume_at: dict | None = None,
                 attempt: str | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.quiet = quiet
        self.attempt = attempt or new_attempt_id()
        self.note = None
        if resume_at is None:
            if self.path.is_file() and self.path.stat().st_size:
                prev = self.path.with_name("metrics.prev.jsonl")
                os.replace(self.path, prev)
                self.note = f"{self.path} held records of an earlier attempt that left no checkpoint: moved to {prev.name}"
        elif self.path.is_file():
            self._cut_back(resume_at)
        self._f = open(self.path, "a")

    def _cut_back(self, resume_at: dict):
        if resume_at.get("log_bytes") is not None:
            if self.path.stat().st_size > resume_at["log_bytes"]:
                os.truncate(self.path, resume_at["log_bytes"])
            return
        if "step" not in resume_at:                   # {}: keep every record
            return
        step = resume_at["step"]                      # a checkpoint from before positions were recorded
        kept = [line for line in self.path.read_text().splitlines(keepends=True)
                if not line.strip() or json.loads(line).get("step", -1) <= step]
        atomic_write(self.path, "".join(kept))

    def position(self) -> int:
        """Bytes written so far (flushed): where a resume from a checkpoint saved now cuts the file."""
        self._f.flush()
        return self._f.tell()

    def write(self, record: dict, text: str | None = None):
        record = dict(record, time=round(time.time(), 3), attempt=self.attempt)
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
    keys = [k for k in metrics if k.startswith(("hr@", "ndcg@", "mrr", "rmse", "auc"))]
    return " ".join(f"{k}={metrics[k]:.4f}" if isinstance(metrics[k], float) else f"{k}={metrics[k]}" for k in keys)


def warn(text: str):
    print(f"warning: {text}", file=sys.stderr, flush=True)
