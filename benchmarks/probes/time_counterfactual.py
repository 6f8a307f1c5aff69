"""What the time input is worth to trained ML-1M models: each run's best checkpoint evaluated on test as
trained (the real times of the users `data.timestamps` covers, zeros for the rest) and again with those
times removed (zeros for every user but the file's first, kept so that the reader still attaches a
file), paired over the same users and seeds.

    python benchmarks/probes/time_counterfactual.py runs/ml-1m-hstu runs/ml-1m-hstu-s2 [--out JSON]

Run it from the directory the runs were trained from (their configs' data paths are relative to it).
Several runs are seeds of one setting (bootstrap over users and seeds, as `mindgr compare`). The users
without times in the shared data get identical inputs in both evaluations, so the difference over all
users is the covered users' share of it; `--projected` adds what the uncovered users would gain if they
gained as much per user: the figure the run would have with every user's times, to the extent the trained
model uses them (a model trained on times for every user can learn more from them: a lower bound).
"""
import argparse
import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

from mindgr.train.compare import compare_ranks, format_comparison, load_ranks
from mindgr.train.run_eval import evaluate_any_run


def first_user_only(ratings: Path, out: Path) -> int:
    """Writes the ratings lines of the file's first user to `out`; returns how many users the file covers."""
    opener = gzip.open if ratings.suffix == ".gz" else open
    first, kept, users = None, [], set()
    with opener(ratings, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            user = line.split("::", 1)[0]
            users.add(user)
            if first is None:
                first = user
            if user == first:
                kept.append(line)
    if first is None:
        raise SystemExit(f"{ratings}: no ratings lines")
    with gzip.open(out, "wt") as f:
        f.writelines(kept)
    return len(users)


def without_times(run: Path, work: Path) -> tuple[Path, int]:
    """(a copy of `run` (config and data record; checkpoints linked) whose data.timestamps covers one user,
    how many users the run's own data.timestamps covers)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    stamps = (cfg.get("data") or {}).get("timestamps")
    if not stamps:
        raise SystemExit(f"{run}: its config has no data.timestamps (nothing to remove)")
    copy = work / run.name
    copy.mkdir(parents=True)
    covered = first_user_only(Path(stamps), work / f"{run.name}-one-user.dat.gz")
    cfg["data"]["timestamps"] = str(work / f"{run.name}-one-user.dat.gz")
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    shutil.copy(run / "data.json", copy / "data.json")
    (copy / "checkpoints").symlink_to((run / "checkpoints").resolve())
    return copy, covered


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories, seeds of one setting")
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mindgr-notime-") as tmp:
        sides = [[], []]
        for run in args.runs:
            copy, covered = without_times(run, Path(tmp))
            for side, target in zip(sides, (run, copy)):
                result = evaluate_any_run(target, "test", "best", allow_data_change=target != run)
                side.append(load_ranks(result["ranks_file"]))
        targets = sides[0][0][2]
        ranks = [np.stack([r for r, _, _ in side]) for side in sides]
        ties = [np.stack([t for _, t, _ in side]) for side in sides]
        result = compare_ranks(ranks[0], targets, ranks[1], targets, samples=args.samples,
                               ties_a=ties[0], ties_b=ties[1])
    users = len(targets)
    removed, uncovered = covered - 1, users - covered      # the first covered user keeps its times
    print(format_comparison(result, "as trained", "times removed"))
    print(f"times removed for {removed} of {users} users; {uncovered} never had them")
    for m in ("hr@10", "ndcg@10"):
        r = result["metrics"].get(m)
        if r:
            # -diff: what the removed users' times add, over all users; per such user x users / removed
            gain = -r["diff"] * uncovered / removed
            print(f"{m}: as trained {r['a']:.4f}; with every user's times, projected {r['a'] + gain:.4f} "
                  f"(+{gain:.4f}: the users without times gaining what those with times lose without them)")
    if args.out:
        from mindgr.bench import write_result
        write_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
