"""In-process A/B of two builds of the jagged HSTU attention kernel (mindgr/ops/cpu/hstu_attention.cc).

    cd WORKTREE && export PYTHONPATH=$PWD
    git -C /work/main archive HEAD | tar -x -C /tmp/attn_base          # the "old" tree
    python benchmarks/probes/attn_ab.py --old /tmp/attn_base [--new .] [--rounds 9] [--isa avx2]

Each tree's hstu_attention.cc is compiled alone (with its workers.cc, if any; same flags as mindgr/ops/cpu/build.py for the chosen
ISA, `MINDGR_CPU_ISA` or --isa) into a temporary library, both are loaded with ctypes, and the
forward (MindgrHstuFwd) and backward (MindgrHstuBwd) entry points are called through their AOT
signature on the same numpy inputs, alternating old/new (order reversed every round, one warm-up
call each).  Prints median [min-max] ms per op and build, the achieved rate in useful causal GFLOP/s
(forward 2 * pairs * (dq + dv) * H, backward twice that, as mindgr.train.flops counts), the ratio
old/new, and whether the two builds' results agree.  Also the process CPU time per call (all threads:
core-ms), less sensitive than wall time to other jobs on a loaded host.  No MindSpore involved: only the kernels are timed.

Shapes: `ml1m` = 192 rows, log-normal lengths (median 100, sigma 0.8, clipped to [20, 200]; T 21706),
H 1, d 50, N 200, 128 time buckets, request times; `ml1m0` = the same with the second half of the rows'
times and request times 0 (ML-1M's users without time data); `ml1mreal` = the same lengths, the first half
of the rows with the real times of ML-1M users (each row the last L ratings of a random user of
../shared/data/ml-1m/ratings_users_1-2999.dat.gz in time order, request time = the last), the second half 0; `small` = `mindgr bench ops --sizes small`
(128 rows, log-normal lengths of mindgr.ops.cpu.bench, H 2, d 32, N 200).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def build_lib(tree: str, out_dir: str, tag: str) -> str:
    from mindgr.ops.cpu import build as b
    src = os.path.join(tree, "mindgr", "ops", "cpu", "hstu_attention.cc")
    out = os.path.join(out_dir, f"attn_{tag}.so")
    # with the tree's worker pool (parallel_run's implementation) when it has one
    pool = os.path.join(os.path.dirname(src), "workers.cc")
    cmd = [b.compiler(), *b.flags(), "-I", os.path.dirname(src), src, *([pool] if os.path.exists(pool) else []), "-o", out]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    return out


class Kernel:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        for name in ("MindgrHstuFwd", "MindgrHstuBwd"):
            fn = getattr(self.lib, name)
            fn.restype = ctypes.c_int

    def call(self, name, arrays):
        n = len(arrays)
        params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
        ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
        shp = [(ctypes.c_int64 * max(1, a.ndim))(*a.shape) for a in arrays]
        shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shp])
        names = {np.float32: b"float32", np.int32: b"int32", np.int64: b"int64"}
        dtypes = (ctypes.c_char_p * n)(*[names[a.dtype.type] for a in arrays])
        rc = getattr(self.lib, name)(n, params, ndims, shapes, dtypes, None, None)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc}")


def make_case(kind: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind in ("ml1m", "ml1m0", "ml1mreal"):
        N, H, d, B = 200, 1, 50, 192
        lengths = np.clip(rng.lognormal(np.log(100), 0.8, B).round(), 20, N).astype(int)
    elif kind == "small":
        from mindgr.ops.cpu.bench import lognormal_lengths
        N, H, d = 200, 2, 32
        lengths = np.array(lognormal_lengths(128, N), dtype=int)
    else:
        raise SystemExit(f"unknown shape {kind!r}")
    T = int(lengths.sum())
    B = len(lengths)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    q, k, v, dout = [(rng.standard_normal((T, H, d)) * 0.3).astype(np.float32) for _ in range(4)]
    ts = np.cumsum(rng.integers(1, 100000, T)).astype(np.int64)
    req = ts[off[1:] - 1] + rng.integers(0, 100000, B).astype(np.int64)
    if kind in ("ml1m0", "ml1mreal"):  # as ML-1M's data: rows of users without time data (half) have times 0
        ts[off[B // 2]:] = 0
        req[B // 2:] = 0
    if kind == "ml1mreal":
        users = real_ml1m_times()
        for b in range(B // 2):
            t = users[int(rng.integers(len(users)))]
            L = int(lengths[b])
            row = t[-L:] if len(t) >= L else np.concatenate([np.full(L - len(t), t[0]), t])
            ts[off[b]:off[b + 1]] = row
            req[b] = row[-1]
    wp = (rng.standard_normal(2 * N - 1) * 0.1).astype(np.float32)
    wt = (rng.standard_normal(129) * 0.1).astype(np.float32)
    car = np.zeros(N, np.float32)
    pairs = float(sum(min(L, N) * (min(L, N) + 1) / 2 for L in lengths))
    fwd_flops = 2.0 * pairs * (d + d) * H
    inputs = [q, k, v, off, ts, req, wp, wt, car]
    return dict(kind=kind, T=T, B=B, H=H, d=d, N=N, inputs=inputs, dout=dout, fwd_flops=fwd_flops)


def real_ml1m_times() -> list:
    """Per user of ../shared/data/ml-1m/ratings_users_1-2999.dat.gz: its rating times, sorted."""
    import gzip
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "../shared/data/ml-1m/ratings_users_1-2999.dat.gz"
    if not path.is_file():
        raise SystemExit(f"{path}: not found (shape ml1mreal needs ML-1M's ratings)")
    users: dict = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            u, _, _, t = line.split("::")
            users.setdefault(int(u), []).append(int(t))
    return [np.sort(np.array(v, np.int64)) for v in users.values()]


def outputs(case, backward: bool):
    q, k, v = case["inputs"][:3]
    if not backward:
        return [np.empty_like(v)]
    wp, wt = case["inputs"][6:8]
    return [np.empty_like(q), np.empty_like(k), np.empty_like(v), np.empty_like(wp), np.empty_like(wt)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="source tree of the old build")
    ap.add_argument("--new", default=".", help="source tree of the new build (default: .)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--shapes", default="ml1m,small")
    ap.add_argument("--isa", default=None, help="avx512 | avx2 | generic (default: MINDGR_CPU_ISA or native)")
    args = ap.parse_args()
    if args.isa:
        os.environ["MINDGR_CPU_ISA"] = args.isa
    from mindgr.ops.cpu import build as b
    tmp = tempfile.mkdtemp(prefix="attn_ab_")
    libs = {"old": Kernel(build_lib(args.old, tmp, "old")), "new": Kernel(build_lib(args.new, tmp, "new"))}
    print(f"isa {b.isa()}, threads {os.environ.get('MINDGR_CPU_THREADS', 'all')}, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for kind in args.shapes.split(","):
        case = make_case(kind)
        print(f"\n{kind}: rows {case['B']}, T {case['T']}, H {case['H']}, d {case['d']}, N {case['N']}, "
              f"forward {case['fwd_flops'] / 1e9:.3f} GFLOP (useful causal)")
        for op, name, bwd in (("forward", "MindgrHstuFwd", False), ("backward", "MindgrHstuBwd", True)):
            args_of = {}
            for tag in libs:
                outs = outputs(case, bwd)
                ins = case["inputs"] + ([case["dout"]] if bwd else [])
                args_of[tag] = (ins + outs, outs)
                libs[tag].call(name, args_of[tag][0])  # warm-up
            times = {tag: [] for tag in libs}
            cpu = {tag: [] for tag in libs}
            order = list(libs)
            for r in range(args.rounds):
                for tag in (order if r % 2 == 0 else order[::-1]):
                    c0, t0 = time.process_time(), time.perf_counter()
                    libs[tag].call(name, args_of[tag][0])
                    times[tag].append(time.perf_counter() - t0)
                    cpu[tag].append(time.process_time() - c0)
            flops = case["fwd_flops"] * (2.0 if bwd else 1.0)
            diffs = [float(np.max(np.abs(a - c)) / max(1e-30, float(np.max(np.abs(a)))))
                     for a, c in zip(args_of["old"][1], args_of["new"][1])]
            meds = {}
            for tag in libs:
                t = np.array(times[tag]) * 1e3
                meds[tag] = float(np.median(t))
                c = np.array(cpu[tag]) * 1e3
                print(f"  {op:8s} {tag}: {meds[tag]:8.2f} ms [{t.min():.2f}-{t.max():.2f}]  "
                      f"{flops / (meds[tag] * 1e-3) / 1e9:6.1f} GFLOP/s;  cpu {np.median(c):8.2f} ms "
                      f"[{c.min():.2f}-{c.max():.2f}]")
            cmed = {tag: float(np.median(cpu[tag])) for tag in libs}
            print(f"  {op:8s} old/new {meds['old'] / meds['new']:.2f}x (cpu time {cmed['old'] / cmed['new']:.2f}x); max relative difference of the "
                  f"results {max(diffs):.2e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
