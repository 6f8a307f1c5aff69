"""Benchmarks behind `mindgr bench`: they print measured figures; none of them is a test."""

import json
from pathlib import Path


def write_result(result, out, default=None):
    """Write a benchmark's result as JSON to --out (parents created); nothing when out is empty."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1, default=default))
    return result
