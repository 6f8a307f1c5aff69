"""In-process A/B of the C++ sampled-scoring kernels of two source trees, alternating calls.

Builds mindgr/ops/cpu of each tree (its own `python -m mindgr.ops.cpu.build`, PYTHONPATH = that tree,
so each library lands in that tree's mindgr/ops/cpu/_build; MINDGR_CPU_ISA is passed through) and
loads both libraries into this process with ctypes. The AOT entry points are called directly on
numpy buffers (no MindSpore in the loop: the figures are the kernels' own time, including their
id checks and scratch handling). For each op the two builds are strictly alternated (order flipped
every round) on the same inputs; printed: median [min-max] ms per build, the useful GFLOP/s of the
median, the median process CPU time (all threads; under load it shows the work apart from the
waiting), base/new ratio of the wall medians, and max |base - new| of the outputs.

Ops (fused sampled-softmax tail `MindgrSampledLse(/Bwd)`, what SampledSoftmaxLoss runs on the cpu
backend, and plain `MindgrSampledLogits(/Bwd)`). Useful FLOPs counted: forward 2*T*R*D (the dots);
lse backward 6*T*R*D (recomputed dots + d_x + d_table; also for trees whose backward reads the
forward's probs (and u) instead, so that the GFLOP/s compare; compare fwd + bwd there); logits
backward 4*T*R*D.

Inputs: uniform negatives in [1, V] (the trainer's draws), targets uniform with 8 % zeros (tokens
without a target), so accidental hits occur at rate ~R/V as in training.

Usage (from the repository root):
  python benchmarks/probes/slogits_ab.py [--base TREE] [--new TREE] [--rounds 9] [--shapes ml1m,small]
--base defaults to a tree extracted from `git -C /work/main archive HEAD` into /tmp/slogits_base;
--new defaults to this repository. --base-lib / --new-lib load prebuilt libraries instead (e.g. only
sampled_logits.cc compiled with build.py's flags for one ISA).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SHAPES = {  # T, D, R, V+1
    "ml1m": (21706, 50, 128, 3707),   # ML-1M: 192 rows of log-normal lengths, 128 per-token negatives
    "small": (1500, 32, 64, 1001),
}


def build(tree: str) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.run([sys.executable, "-m", "mindgr.ops.cpu.build"], cwd=tree, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"build of {tree} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip().splitlines()[-1]


def default_base() -> str:
    base = "/tmp/slogits_base"
    if not os.path.isdir(os.path.join(base, "mindgr")):
        os.makedirs(base, exist_ok=True)
        arch = subprocess.run(["git", "-C", "/work/main", "archive", "HEAD"], stdout=subprocess.PIPE, check=True)
        subprocess.run(["tar", "-x", "-C", base], input=arch.stdout, check=True)
    return base


_DT = {np.dtype(np.float32): b"float32", np.dtype(np.int32): b"int32", np.dtype(np.int64): b"int64"}


class Lib:
    def __init__(self, path: str):
        self.path = path
        self.cdll = ctypes.CDLL(path)

    def call(self, name: str, arrays, ok=(0,)):
        n = len(arrays)
        params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
        ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
        shp = [(ctypes.c_int64 * max(1, a.ndim))(*a.shape) for a in arrays]
        shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shp])
        dtypes = (ctypes.c_char_p * n)(*[_DT[a.dtype] for a in arrays])
        fn = getattr(self.cdll, name)
        fn.restype = ctypes.c_int
        rc = fn(n, params, ndims, shapes, dtypes, None, None)
        if rc not in ok:
            raise RuntimeError(f"{name} returned {rc}")
        return rc


def make_inputs(T, D, R, V1, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, D)) * 0.3).astype(np.float32)
    table = (rng.standard_normal((V1, D)) * 0.3).astype(np.float32)
    ids = rng.integers(1, V1, (T, R)).astype(np.int32)
    tgt = rng.integers(1, V1, T).astype(np.int32)
    tgt[rng.random(T) < 0.08] = 0
    pos = (x * table[tgt]).sum(1).astype(np.float32)
    dlse = (rng.random(T) / T).astype(np.float32)
    g = rng.standard_normal((T, R)).astype(np.float32)
    return x, table, ids, tgt, pos, dlse, g


def ops_for(T, D, R, V1, inp):
    """(name, fn(lib), useful FLOPs) per op; outputs are allocated once per library (as MindSpore's
    memory pool does), so the timed calls do not pay page faults."""
    x, table, ids, tgt, pos, dlse, g = inp
    f32 = np.float32
    bufs = {}

    def buf(lib, key, make):
        if (id(lib), key) not in bufs:
            bufs[(id(lib), key)] = make()
        return bufs[(id(lib), key)]

    # The forward's extra outputs, which the backward then reads, by library version: none (6 / 10
    # arguments: the backward rescores), probs [T, R] (7 / 11), probs and u [T, D] (8 / 12); told
    # apart by the argument-count error (10) on empty tensors.
    def extras(lib):
        def probe():
            base = [np.empty((0, D), f32), np.empty((1, D), f32), np.empty((0, R), np.int32), np.empty(0, np.int32),
                    np.empty(0, f32), np.empty(0, f32)]
            for more in ([("probs", (T, R)), ("u", (T, D))], [("probs", (T, R))], []):
                a = base + [np.empty((0,) + shape[1:], f32) for _, shape in more]
                if lib.call("MindgrSampledLse", a, ok=(0, 10)) == 0:
                    return more
            raise RuntimeError("MindgrSampledLse takes none of the known argument lists")
        return buf(lib, "extras", probe)

    def lse_fwd(lib):
        lse = buf(lib, "lse", lambda: np.empty(T, f32))
        more = [buf(lib, name, lambda: np.empty(shape, f32)) for name, shape in extras(lib)]
        lib.call("MindgrSampledLse", [x, table, ids, tgt, pos, lse, *more])
        return [lse]

    def lse_bwd(lib):
        lse = buf(lib, "lse_ref", lambda: lse_fwd(lib)[0].copy())
        more = [buf(lib, name + "_ref", lambda: buf(lib, name, lambda: None).copy()) for name, _ in extras(lib)]
        d_x, d_t, d_p = buf(lib, "lse_bwd", lambda: (np.empty((T, D), f32), np.empty((V1, D), f32), np.empty(T, f32)))
        lib.call("MindgrSampledLseBwd", [x, table, ids, tgt, pos, lse, *more, dlse, d_x, d_t, d_p])
        return [d_x, d_t, d_p]

    def logits_fwd(lib):
        out = buf(lib, "logits", lambda: np.empty((T, R), f32))
        lib.call("MindgrSampledLogits", [x, table, ids, out])
        return [out]

    def logits_bwd(lib):
        d_x, d_t = buf(lib, "logits_bwd", lambda: (np.empty((T, D), f32), np.empty((V1, D), f32)))
        lib.call("MindgrSampledLogitsBwd", [x, table, ids, g, d_x, d_t])
        return [d_x, d_t]

    trd = float(T) * R * D
    return [("lse fwd", lse_fwd, 2 * trd), ("lse bwd", lse_bwd, 6 * trd),
            ("logits fwd", logits_fwd, 2 * trd), ("logits bwd", logits_bwd, 4 * trd)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None)
    ap.add_argument("--new", default=REPO)
    ap.add_argument("--base-lib", default=None, help="a prebuilt base library instead of building --base")
    ap.add_argument("--new-lib", default=None, help="a prebuilt new library instead of building --new")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--shapes", default="ml1m,small")
    ap.add_argument("--ops", default="", help="comma-separated subset of: lse fwd, lse bwd, logits fwd, logits bwd")
    a = ap.parse_args()
    trees = [a.base or ("(prebuilt)" if a.base_lib else default_base()), a.new]
    libs = [Lib(lib or build(t)) for t, lib in zip(trees, (a.base_lib, a.new_lib))]
    print(f"isa {os.environ.get('MINDGR_CPU_ISA') or 'native'}, threads {os.environ.get('MINDGR_CPU_THREADS') or 'all'}, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for i, (t, lib) in enumerate(zip(trees, libs)):
        print(f"  {'base' if i == 0 else 'new '}: {t} -> {os.path.basename(lib.path)}")
    wanted = [s.strip() for s in a.ops.split(",") if s.strip()]
    for shape in a.shapes.split(","):
        T, D, R, V1 = SHAPES[shape]
        print(f"\n{shape}: T {T}, D {D}, R {R}, V+1 {V1}, {a.rounds} alternating rounds")
        inp = make_inputs(T, D, R, V1)
        for name, fn, flops in ops_for(T, D, R, V1, inp):
            if wanted and name not in wanted:
                continue
            outs = [[o.copy() for o in fn(lib)] for lib in libs]   # warm-up, and the outputs compared
            diff = max(float(np.max(np.abs(p - q))) if p.size else 0.0 for p, q in zip(*outs))
            times, cpu = [[], []], [[], []]
            for r in range(a.rounds):
                for j in ((0, 1) if r % 2 == 0 else (1, 0)):
                    c0, t0 = time.process_time(), time.perf_counter()
                    fn(libs[j])
                    times[j].append(time.perf_counter() - t0)
                    cpu[j].append(time.process_time() - c0)
            med = [1e3 * float(np.median(t)) for t in times]
            cmed = [1e3 * float(np.median(c)) for c in cpu]
            cells = [f"{m:8.2f} ms [{1e3 * min(t):.2f}-{1e3 * max(t):.2f}] {flops / m / 1e6:6.1f} GFLOP/s (cpu {c:.1f} ms)"
                     for m, t, c in zip(med, times, cmed)]
            print(f"  {name:10s} base {cells[0]} | new {cells[1]} | base/new {med[0] / med[1]:5.2f}x"
                  f" | max|diff| {diff:.2e}")
    print(f"\nload average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
