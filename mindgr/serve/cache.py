"""The serving cache of a run: `mindgr serve --run` and `mindgr recommend --run` export the run once and
then serve from that export, exactly as `--export DIR` does.

An export is kept in RUN/serving/KIND-KEY/ (or, when the run directory cannot be written, under
$MINDGR_CACHE/serving, default ~/.cache/mindgr) and reused while its key is the same. The key covers what
the exported graphs depend on: the checkpoint (its sidecar, which holds the weights' sha256), the batch
shapes and beam width asked for, the MindGR code (every source file of the package) and the MindSpore
version. Anything else makes a new export, written to a temporary directory and renamed into place, so a
half-written export is never served and two servers starting at once do not collide. The newest few
entries of a kind are kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from mindgr.paths import file_sha256, unwritable_reason
from mindgr.serve.options import ServerOptions

CACHE_DIR = "serving"
KEEP = 3                 # entries of a kind kept in a run's cache (the newest)
_code_hash: dict = {}


def code_hash() -> str:
    """sha256 over every source file of the mindgr package (paths and bytes): a changed model, op or kernel
    source gives another key (computed once per process)."""
    if "sha" not in _code_hash:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cc", ".h") and "_build" not in p.parts):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        _code_hash["sha"] = h.hexdigest()
    return _code_hash["sha"]


def _root(run_dir: Path) -> Path:
    wanted = run_dir / CACHE_DIR
    if unwritable_reason(wanted) is None:
        return wanted
    base = Path(os.environ.get("MINDGR_CACHE", str(Path.home() / ".cache" / "mindgr")))
    tag = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return base / CACHE_DIR / f"{run_dir.name}-{tag}"


def cache_key(run_dir: Path, kind, options: ServerOptions) -> tuple[str, dict]:
    """(key, the fields it hashes) of a run's export for these options."""
    import mindspore as ms
    from mindgr.train.rundir import run_config, saved_checkpoint
    checkpoint = saved_checkpoint(run_dir, run_config(run_dir), options.checkpoint)
    fields = {"kind": kind.name, "checkpoint": checkpoint.name,
              "sidecar_sha256": file_sha256(checkpoint.with_suffix(".json")),
              "shapes": sorted({int(s) for s in (options.shapes or kind.shapes)}),
              "beam": None if kind.beam is None else int(options.beam or kind.beam),
              "code_sha256": code_hash(), "mindspore": ms.__version__}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16], fields


def cached_export(run_dir, kind, options: ServerOptions) -> Path:
    """The export directory of a run for these options: the cached one, or a new export of it by its
    serving kind (mindgr.serve.models.ServingKind)."""
    from mindgr.serve.exported import ExportError, read_manifest
    run_dir = Path(run_dir)
    key, fields = cache_key(run_dir, kind, options)
    root = _root(run_dir)
    target = root / f"{kind.name}-{key}"
    if target.is_dir():
        try:
            if read_manifest(target, verify=False).get("source") == fields:
                return target
        except ExportError:
            pass                          # damaged: exported again below
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{kind.name}-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        kind.export(run_dir, tmp, options.checkpoint, fields["shapes"], fields["beam"], {"source": fields})
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():       # another server renamed the same export into place first: use it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, kind.name, keep=target)
    import gc
    gc.collect()                          # the run loaded for the export is garbage now
    return target


def _prune(root: Path, kind: str, keep: Path):
    """Remove all but the KEEP newest entries of a kind (never `keep`)."""
    entries = sorted((p for p in root.glob(f"{kind}-*") if p.is_dir() and p != keep),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP - 1:]:
        shutil.rmtree(old, ignore_errors=True)
