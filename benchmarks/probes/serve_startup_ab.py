"""Serving start-up: time from process start to the first successful answer, and resident memory after it,
of `mindgr serve` started several ways, alternated round by round.

    python benchmarks/probes/serve_startup_ab.py --run RUN --export DIR --before OLD_CHECKOUT --reps 3

Sides (each a `python -m mindgr serve` process with PYTHONPATH set to its checkout, on a free port):
  before-run       OLD_CHECKOUT's `serve --run RUN` (the older code path, when --before is given)
  export           this checkout's `serve --export DIR`
  run-cached       this checkout's `serve --run RUN` with its serving cache already written
  run-first        this checkout's `serve --run RUN` after its serving cache is removed (export + serve)
The request is the run's first test user (raw ids, timestamps). RSS is VmRSS right after the first answer,
peak is VmHWM. Prints each measurement and the medians; --out writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def start_once(repo: Path, args: list, body: dict, timeout: float = 900.0) -> dict:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="serve-startup-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "mindgr", "serve", "--port", str(port), *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {Path(log.name).read_text()[-1500:]}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError("server not answering")
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/recommend", json=body, timeout=30)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        return {"startup_s": seconds, "rss_mb": proc_kb(proc.pid, "VmRSS") / 1024,
                "peak_mb": proc_kb(proc.pid, "VmHWM") / 1024, "items": r.json()["items"]}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--before", help="a checkout of the older code (its `serve --run` is the before side)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from mindgr.bench.serve import user_requests
    body = user_requests(args.run, k=10, limit=1)[0]
    sides = {"export": (HERE, ["--export", args.export]), "run-cached": (HERE, ["--run", args.run]),
             "run-first": (HERE, ["--run", args.run])}
    if args.before:
        sides = {"before-run": (Path(args.before), ["--run", args.run]), **sides}
    start_once(HERE, ["--run", args.run], body)                  # writes the serving cache once
    results = {name: [] for name in sides}
    for rep in range(args.reps):
        for name, (repo, side_args) in sides.items():
            if name == "run-first":
                shutil.rmtree(Path(args.run) / "serving", ignore_errors=True)
            m = start_once(repo, side_args, body)
            results[name].append(m)
            print(f"round {rep + 1} {name:11s} start-up {m['startup_s']:6.2f} s  RSS {m['rss_mb']:7.1f} MB  "
                  f"peak {m['peak_mb']:7.1f} MB  load {os.getloadavg()[0]:.1f}", flush=True)
    answers = {name: [m["items"] for m in ms] for name, ms in results.items()}
    same = all(a == answers["export"][0] for lists in answers.values() for a in lists)
    print(f"the same first answer on every side and round: {same}")
    summary = {name: {key: statistics.median(m[key] for m in ms) for key in ("startup_s", "rss_mb", "peak_mb")}
               for name, ms in results.items()}
    for name, med in summary.items():
        print(f"median {name:11s} start-up {med['startup_s']:6.2f} s  RSS {med['rss_mb']:7.1f} MB  "
              f"peak {med['peak_mb']:7.1f} MB")
    if args.out:
        Path(args.out).write_text(json.dumps({"results": results, "medians": summary, "same_answer": same},
                                             indent=1))


if __name__ == "__main__":
    main()
