"""Host input A/B: the producer's per-batch work (packing, per-token negatives, dropout masks, the step's
tensors) of two checkouts at ML-1M shape, in alternating subprocesses, ms per batch per part.

    python benchmarks/probes/host_input_ab.py --old /work/main --new . --rounds 5 --batches 24

Each side is `git archive HEAD` of its checkout, unpacked to a temporary directory and put first on
PYTHONPATH of a subprocess (so that side's own `mindgr` is imported); the rounds alternate old, new,
old, ... Every subprocess loads configs/ml-1m/hstu.yaml's data (or --data-dir), draws the first
--batches batches of epoch 0 as RetrievalTask.inputs does, and times each part with the thread's CPU
clock (time.thread_time: what it takes from the 2 shared cores) and the wall clock; per round the
median over batches, then the median [range] over rounds. `plan` is the per-epoch batch plan divided by
the batches of an epoch. Skips (exit 0) when the ML-1M files are absent.

    python benchmarks/probes/host_input_ab.py --rng-floor     # why negatives and masks stay as they are

times, in this process, numpy's per-token draw (Generator.integers: Lemire's method in C) against the
raw PCG64 words it consumes and against the same multiply-high written as numpy array operations
(without even the rare rejections), and the masks' raw words against their conversion to floats.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("plan", "pack", "negatives", "masks", "inputs", "tensors")


def worker(args):
    import numpy as np
    from types import SimpleNamespace

    from mindgr.config import load_config
    from mindgr.train.data import RunData
    from mindgr.train.local import HostSampler
    from mindgr.train.negatives import item_frequencies
    from mindgr.train.step import StepInputs
    data = Path(args.data_dir)
    cfg = load_config(args.config, [f"data.path={data / 'sequences.txt'}",
                                    f"data.timestamps={data / 'ratings_users_1-2999.dat.gz'}"])
    d = RunData(cfg)
    from mindgr.models import build_encoder
    enc = build_encoder(cfg.model, d.num_items, cfg.data.max_len, cfg.run.seed)
    shape = SimpleNamespace(dropout_sites=enc.dropout_sites, dropout_width=enc.dropout_width)
    sampler = HostSampler(cfg, d.num_items, shape, d.train.token_capacity,
                          item_frequencies(d.split.train, d.num_items))
    cpu = {p: [] for p in PARTS}
    wall = {p: [] for p in PARTS}

    def timed(part, fn):
        c, w = time.thread_time(), time.perf_counter()
        out = fn()
        cpu[part].append(time.thread_time() - c)
        wall[part].append(time.perf_counter() - w)
        return out

    plan = d.plan
    for epoch in range(1, 4):                  # the per-epoch plan, amortised over its batches
        n = len(timed("plan", lambda: plan.batches(epoch)))
        cpu["plan"][-1] /= n
        wall["plan"][-1] /= n
    batches = plan.batches(0)
    c0 = time.thread_time()
    d.train.batch(batches[0])                  # the first batch of a run (new: also concatenates the examples)
    first = 1e3 * (time.thread_time() - c0)
    for b in range(args.batches):
        indices = batches[b % len(batches)]
        batch = timed("pack", lambda: d.train.batch(indices))
        negatives = timed("negatives", lambda: sampler.draw_negatives(0, b, batch.targets))
        drop = timed("masks", lambda: sampler.masks.batch(0, b))
        inputs = timed("inputs", lambda: (StepInputs.from_batch(batch, negatives, drop),
                                          {"tokens": batch.num_tokens, "fill": batch.fill,
                                           "lengths": np.diff(batch.offsets[: batch.num_rows + 1]),
                                           "targets": int((batch.targets > 0).sum())}))[0]
        timed("tensors", inputs.tensors)
    med = (lambda v: 1e3 * float(np.median(v)))
    print(json.dumps({"cpu": {p: med(v) for p, v in cpu.items()}, "wall": {p: med(v) for p, v in wall.items()},
                      "shape": [d.train.token_capacity, d.train.row_capacity, cfg.loss.num_negatives,
                                enc.dropout_sites, enc.dropout_width],
                      "first_pack": first,
                      "rows": float(np.mean([len(batches[b % len(batches)]) for b in range(args.batches)]))}))


def rng_floor(rounds: int = 15):
    import numpy as np
    t, r, v, sites, width = 13824, 128, 3706, 3, 50          # ML-1M: tokens, negatives, items, mask shape
    words = -(-width // 4)

    def draws():
        return np.random.default_rng([0, 1, 2, 7]).integers(1, v + 1, (t, r), dtype=np.int32)

    def draw_words():
        return np.random.default_rng([0, 1, 2, 7]).bit_generator.random_raw(t * r // 2)

    def vectorised_lemire():
        u = draw_words().view(np.uint32)                     # next_uint32: the low half of a word first
        x = np.multiply(u, v * 2.0 ** -32, dtype=np.float64)  # u * v / 2^32, exact in float64 here
        x += 1.0
        return x.astype(np.int32).reshape(t, r)

    def mask_words():
        return np.random.PCG64(np.random.SeedSequence([0, 1, 2, 8])).random_raw(sites * t * words)
    raw = mask_words()

    def mask_floats():
        from mindgr.train.masks import DropoutMasks
        m = DropoutMasks(0, 0.2, (sites, t, width))
        out = np.empty((sites, t, width), np.float32)
        m._keep(raw, sites * t, out.reshape(sites * t, width))
        return out
    a, b = draws().ravel(), vectorised_lemire().ravel()
    first = np.flatnonzero(a != b)
    print(f"vectorised Lemire equals Generator.integers up to its first rejection, at draw "
          f"{first[0] if len(first) else 'none'} of {len(a)}")
    fns = {"negatives: Generator.integers": draws, "negatives: its raw PCG64 words alone": draw_words,
           "negatives: the same as numpy array ops": vectorised_lemire,
           "masks: raw PCG64 words": mask_words, "masks: words -> scaled keep floats": mask_floats}
    cpu = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            c = time.thread_time()
            f()
            cpu[k].append(time.thread_time() - c)
    print(f"cpu ms, {rounds} alternating calls: median [range]")
    for k, vals in cpu.items():
        vals = 1e3 * np.array(vals)
        print(f"  {k}: {np.median(vals):.2f} [{vals.min():.2f}-{vals.max():.2f}]")


def snapshot(repo: Path, into: Path) -> tuple:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return into, rev


def run_side(tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), GLOG_v="3")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--config", args.config,
           "--data-dir", args.data_dir, "--batches", str(args.batches)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{tree}: worker failed: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(values) -> str:
    import numpy as np
    return f"{np.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main():
    import numpy as np
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="/work/main")
    ap.add_argument("--new", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--config", default="configs/ml-1m/hstu.yaml")
    ap.add_argument("--data-dir", default="/work/shared/data/ml-1m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--rng-floor", action="store_true", help="time numpy's draws against their raw words")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.rng_floor:
        return rng_floor()
    data = Path(args.data_dir)
    if not (data / "sequences.txt").is_file() or not (data / "ratings_users_1-2999.dat.gz").is_file():
        print(f"skipped: no ML-1M data under {data}")
        return
    with tempfile.TemporaryDirectory(prefix="host-input-ab-") as tmp:
        trees = {side: snapshot(Path(getattr(args, side)), Path(tmp) / side) for side in ("old", "new")}
        got = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in ("old", "new"):
                got[side].append(run_side(trees[side][0], args))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    shape = got["new"][0]["shape"]
    print(f"ML-1M shape: {shape[0]} tokens x {shape[1]} rows, {shape[2]} negatives per token, masks "
          f"[{shape[3]}, {shape[0]}, {shape[4]}]; {got['new'][0]['rows']:.0f} rows per batch on average; "
          f"{args.rounds} rounds x {args.batches} batches, alternating; old {args.old} @ {trees['old'][1]}, "
          f"new {args.new} @ {trees['new'][1]}")
    print("first batch of a run, pack cpu ms (new: includes concatenating the examples once): old "
          f"{summary([r['first_pack'] for r in got['old']])}, new {summary([r['first_pack'] for r in got['new']])}")
    for clock in ("cpu", "wall"):
        print(f"\n{clock} ms per batch: median [range] over rounds of the per-round median")
        print("| part | old | new | old / new |")
        print("|---|---|---|---|")
        totals = {}
        for side in ("old", "new"):
            totals[side] = [sum(rec[clock][p] for p in PARTS) for rec in got[side]]
        for p in PARTS + ("total",):
            old = totals["old"] if p == "total" else [rec[clock][p] for rec in got["old"]]
            new = totals["new"] if p == "total" else [rec[clock][p] for rec in got["new"]]
            ratio = np.median(old) / max(np.median(new), 1e-9)
            print(f"| {p} | {summary(old)} | {summary(new)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
