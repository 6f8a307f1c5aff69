"""Does a refactor change what is trained? Train one config from two checkouts (same seed) and compare
every logged loss and every evaluation exactly.

    python benchmarks/probes/same_run_ab.py /work/main /work/wt/seams --out /tmp/ab -- train.epochs=2
    python benchmarks/probes/same_run_ab.py A B --config configs/smoke.yaml -- model.arch=sasrec

Each side runs `python -m mindgr train` with PYTHONPATH set to its checkout (so its own `mindgr` is the
one imported); exit 0 only when losses, evaluation metrics and eval.json's test/valid metrics are
bit-identical. Timing fields (seconds, tokens/s, MFU) are not compared.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TIMING = {"seconds", "tokens_per_s", "step_time_s", "mfu", "compute_fraction", "input_wait_s", "pause_s",
          "cpu_util", "time", "attempt"}   # time, attempt: the log's wall-clock stamp and attempt id


def train(repo: Path, config: str, overrides: list, out: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=str(repo))
    cmd = [sys.executable, "-m", "mindgr", "train", "--config", config, f"run.out_dir={out}", "run.name=ab",
           *overrides]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{repo}: training failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return out / "ab"


def records(run: Path) -> tuple[list, list, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    strip = (lambda r: {k: v for k, v in r.items() if k not in TIMING})
    losses = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [strip(r) for r in rows if "eval" in r]
    result = json.loads((run / "eval.json").read_text())
    return losses, evals, {k: result[k] for k in ("valid", "test")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--config", default="configs/smoke.yaml")
    ap.add_argument("--out", default="/tmp/mindgr-ab")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]           # passed to `mindgr train` (overrides, --nproc N)
    got = {}
    for side, repo in (("a", args.a), ("b", args.b)):
        got[side] = records(train(Path(repo).resolve(), args.config, args.overrides, Path(args.out) / side))
    same = [x == y for x, y in zip(got["a"], got["b"])]
    losses, evals, final = got["a"]
    print(f"losses ({len(losses)} windows, last {losses[-1]}): {'identical' if same[0] else 'DIFFER'}")
    print(f"evaluations ({len(evals)}): {'identical' if same[1] else 'DIFFER'}")
    print(f"final valid/test metrics (test hr@10 {final['test'].get('hr@10')}): "
          f"{'identical' if same[2] else 'DIFFER'}")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
