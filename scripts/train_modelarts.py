"""ModelArts boot file: stage `--data_url` in, train (one or N ranks), stage the run out to `--train_url`.

ModelArts starts this file with `--data_url` / `--train_url` (OBS paths) plus the job's own arguments.
OBS is reached through `moxing`, which exists only on ModelArts: it is imported on demand, and without
it both URLs are taken as local paths (data read in place, outputs copied), so the same entry runs
anywhere (docs/distributed.md). It lives outside the package: it sits above the CLI that it calls.

    python scripts/train_modelarts.py --data_url=obs://b/kuairand --train_url=obs://b/out \\
        --config configs/... --nproc 8 data.kind=store train.epochs=20
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # code dir uploaded as-is


def moxing():
    """The moxing module on ModelArts, None elsewhere."""
    try:
        import moxing as mox  # noqa: F401  (ModelArts only)
    except ImportError:
        return None
    return mox


def _is_remote(url: str) -> bool:
    return "://" in url


def stage_in(data_url: str, local_dir: str, mox=None) -> str:
    """A local path holding data_url's content: copied from OBS with moxing, or data_url itself."""
    if not _is_remote(data_url):
        return str(Path(data_url).resolve())
    if mox is None:
        raise RuntimeError(f"--data_url {data_url}: a remote URL needs moxing (only available on ModelArts)")
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    if mox.file.is_directory(data_url):
        mox.file.copy_parallel(data_url, str(local))
        return str(local)
    target = local / data_url.rstrip("/").rsplit("/", 1)[-1]
    mox.file.copy(data_url, str(target))
    return str(target)


def stage_out(local_dir: str, train_url: str, mox=None):
    """Copy the run outputs (checkpoints, metrics, eval.json, rank logs) to train_url."""
    if not Path(local_dir).is_dir():
        return
    if _is_remote(train_url):
        if mox is None:
            raise RuntimeError(f"--train_url {train_url}: a remote URL needs moxing (only available on ModelArts)")
        mox.file.copy_parallel(str(local_dir), train_url)
    elif Path(train_url).resolve() != Path(local_dir).resolve():
        shutil.copytree(local_dir, train_url, dirs_exist_ok=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="MindGR training on ModelArts (or anywhere: URLs may be paths)")
    ap.add_argument("--data_url", default="", help="training data (OBS URL or path) -> data.path")
    ap.add_argument("--train_url", default="", help="where the run directory is copied at the end")
    ap.add_argument("--config", default=None)
    ap.add_argument("--nproc", type=int, default=None, help="ranks on this node (default: parallel.nproc)")
    ap.add_argument("--cache_dir", default="/cache", help="local disk for staged data and outputs")
    args, overrides = ap.parse_known_args(argv)
    mox = moxing()
    train = ["train"] + (["--config", args.config] if args.config else [])
    train += ["--nproc", str(args.nproc)] if args.nproc else []
    train += list(overrides)
    if args.data_url:
        train.append(f"data.path={stage_in(args.data_url, str(Path(args.cache_dir) / 'data'), mox)}")
    out_dir = Path(args.cache_dir) / "output"
    if args.train_url:
        train.append(f"run.out_dir={out_dir}")
    from mindgr.cli import main as cli_main
    try:
        code = cli_main(train)
    finally:
        if args.train_url:                   # also after a failure: the logs say what happened
            stage_out(str(out_dir), args.train_url, mox)
    return code


if __name__ == "__main__":
    sys.exit(main())
