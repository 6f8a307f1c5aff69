"""Is one checkout's training step faster than another's? Run `mindgr bench train` from several checkouts,
strictly alternating (A B C A B C ...), and print each side's median and range of ms per step and the
ratios of the medians. The host is shared: only sides alternated in one window are compared.

    python benchmarks/probes/step_ab.py /work/snap/old /work/snap/new --rounds 3 --out /tmp/step_ab.json
    python benchmarks/probes/step_ab.py A B -- --config configs/ml-1m/hstu.yaml --steps 6 --warmup 2

Each side runs with PYTHONPATH set to its checkout and its own copy of the config (so a config key one
side lacks is not passed to it), with the cwd at the checkout (configs name data as ../shared/data/...).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(repo: Path, bench_args: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "mindgr", "bench", "train", *bench_args, "--out", str(out)]
        proc = subprocess.run(cmd, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)), capture_output=True,
                              text=True)
        if proc.returncode != 0:
            sys.exit(f"{repo}: bench train failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


def step_ms(result: dict) -> float:
    """ms per timed step (the median of the timed steps) from a `bench train` JSON."""
    if "step_time_s_median" not in result:
        raise SystemExit(f"no step_time_s_median in the bench train output: {sorted(result)}")
    return 1e3 * float(result["step_time_s_median"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repos", nargs="+", type=Path, help="checkouts to alternate (the first is the baseline)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)    # after `--`: `mindgr bench train` arguments
    args = ap.parse_args(argv[:cut])
    bench = argv[cut + 1:] or ["--config", "configs/ml-1m/hstu.yaml", "--steps", "6", "--warmup", "2"]
    times = {str(r): [] for r in args.repos}
    runs = {str(r): [] for r in args.repos}
    for k in range(args.rounds):
        for repo in args.repos:
            result = one_run(repo.resolve(), bench)
            times[str(repo)].append(step_ms(result))
            runs[str(repo)].append(result)
            mfu = result.get("mfu", float("nan")) * 100
            print(f"round {k + 1}: {repo}: {times[str(repo)][-1]:.1f} ms/step, MFU {mfu:.2f}% of "
                  f"{result.get('peak_gflops', float('nan')):.1f} GFLOP/s, load {os.getloadavg()[0]:.1f}"
                  + (f" (MFU reads high: {result['peak_busy']})" if result.get("peak_busy") else ""), flush=True)
    base = statistics.median(times[str(args.repos[0])])
    summary = {}
    for repo, ts in times.items():
        med = statistics.median(ts)
        summary[repo] = {"ms": ts, "median_ms": med, "min_ms": min(ts), "max_ms": max(ts),
                         "speedup_vs_first": base / med}
        print(f"{repo}: median {med:.1f} ms [{min(ts):.1f}-{max(ts):.1f}], baseline / this = {base / med:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"bench_args": bench, "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
