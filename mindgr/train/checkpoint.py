"""Atomic checkpoints: MindSpore safetensors of every parameter of the train step (weights and optimizer
state) plus a JSON sidecar with the step, the data position and the file's sha256.

The sidecar is written last and is the commit marker: it names its weights file, and a checkpoint
saved again under the same name (`best`, or a step saved twice) writes its weights to the file the
committed sidecar does NOT name, then replaces the sidecar in one atomic rename, then deletes the old
weights. A crash at any point leaves the previous checkpoint (weights + sidecar) whole. A checkpoint whose
bytes do not match its sha256, or that does not parse, is an error, never a silent fresh start.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupted or does not fit the model (one-line message)."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


SIDECAR_FIELDS = ("weights", "sha256", "bytes")


def _write_sidecar(path: Path, sidecar: dict):
    """The commit of a checkpoint: its JSON sidecar, flushed to disk, in one rename."""
    atomic_write(path, json.dumps(sidecar, indent=1, sort_keys=True), fsync=True)


def read_sidecar(path: Path) -> dict:
    """The JSON sidecar of a checkpoint path, checked for the fields a checkpoint needs (one-line errors)."""
    sidecar = Path(path).with_suffix(".json")
    if not sidecar.is_file():
        raise CheckpointError(f"checkpoint {sidecar}: not found")
    try:
        meta = json.loads(sidecar.read_text())
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint {sidecar}: not valid JSON (truncated or corrupted)") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {sidecar}: expected a JSON object, found {type(meta).__name__}")
    missing = [k for k in SIDECAR_FIELDS if k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint {sidecar}: sidecar lacks {', '.join(missing)} (not a MindGR checkpoint?)")
    if not isinstance(meta["weights"], str) or Path(meta["weights"]).name != meta["weights"]:
        raise CheckpointError(f"checkpoint {sidecar}: weights = {meta['weights']!r}: expected a file name")
    return meta


def _committed_weights(path: Path) -> str | None:
    """The weights file name the committed sidecar of `path` names (None: no readable sidecar)."""
    try:
        return read_sidecar(path)["weights"]
    except CheckpointError:
        return None


def save_checkpoint(path: Path, tensors: dict, meta: dict) -> Path:
    """Write the weights, then `path`.json naming them (the commit). `tensors` maps names to numpy arrays
    or Tensors. Saving over an existing checkpoint keeps it whole until the new sidecar is in place."""
    import mindspore as ms
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = _committed_weights(path)
    weights = path.with_suffix(".safetensors")
    if old == weights.name:                      # never write over the weights the committed sidecar names
        weights = path.with_name(path.name + ".alt.safetensors")
    items = [{"name": k, "data": v if isinstance(v, ms.Tensor) else ms.Tensor(np.asarray(v))}
             for k, v in tensors.items()]
    atomic_write(weights, lambda tmp: ms.save_checkpoint(items, str(tmp), format="safetensors"), fsync=True,
                 tmp_suffix=".tmp.safetensors")
    sidecar = dict(meta, weights=weights.name, sha256=file_sha256(weights), bytes=weights.stat().st_size)
    _write_sidecar(path.with_suffix(".json"), sidecar)
    if old and old != weights.name:              # the replaced checkpoint's weights, no longer named
        (path.parent / old).unlink(missing_ok=True)
    return weights


def delete_checkpoint(path: Path):
    """Remove a checkpoint: the sidecar first (uncommitting it), then the weights it named."""
    path = Path(path)
    names = {_committed_weights(path), path.with_suffix(".safetensors").name,
             path.name + ".alt.safetensors"} - {None}
    path.with_suffix(".json").unlink(missing_ok=True)
    for name in names:
        (path.parent / name).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(name -> numpy array, meta) from a checkpoint path (with or without suffix), verified."""
    import mindspore as ms
    path = Path(path)
    sidecar = path.with_suffix(".json")
    meta = read_sidecar(path)
    weights = path.parent / meta["weights"]
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {weights}: not found (its sidecar {sidecar.name} exists)")
    size = weights.stat().st_size
    if size != meta.get("bytes"):
        raise CheckpointError(f"checkpoint {weights}: {size} bytes, expected {meta.get('bytes')} (truncated?)")
    if file_sha256(weights) != meta.get("sha256"):
        raise CheckpointError(f"checkpoint {weights}: sha256 does not match its sidecar (corrupted)")
    try:
        loaded = ms.load_checkpoint(str(weights), format="safetensors")
    except Exception as e:  # MindSpore raises ValueError/RuntimeError with multi-line text
        raise CheckpointError(f"checkpoint {weights}: cannot be parsed ({type(e).__name__})") from None
    return {k: v.asnumpy() for k, v in loaded.items()}, meta


def restore_parameters(cell, tensors: dict, where: str):
    """Copy every parameter of `cell` from `tensors`; missing names or shape changes are errors."""
    import mindspore as ms
    for name, p in cell.parameters_and_names():
        if name not in tensors:
            raise CheckpointError(f"checkpoint {where}: has no parameter '{name}' (was the model changed?)")
        value = tensors[name]
        if tuple(value.shape) != tuple(p.shape):
            raise CheckpointError(f"checkpoint {where}: parameter '{name}' has shape {tuple(value.shape)}, "
                                  f"the model expects {tuple(p.shape)}")
        p.set_data(ms.Tensor(value.astype(ms.dtype_to_nptype(p.dtype))))


def named_parameters(cell) -> dict:
    return {name: p.value() for name, p in cell.parameters_and_names()}


class CheckpointManager:
    """`ckpt-step{N}` files in RUN_DIR/checkpoints, the last `keep_last` kept, plus `best`."""

    def __init__(self, run_dir: Path, keep_last: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def _step_files(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.dir.glob("ckpt-step*.json"):
            try:
                found.append((int(p.stem[len("ckpt-step"):]), p.with_suffix("")))
            except ValueError:
                continue
        return sorted(found)

    def save(self, step: int, tensors: dict, meta: dict) -> Path:
        path = self.dir / f"ckpt-step{step:08d}"
        save_checkpoint(path, tensors, dict(meta, step=step))
        for _, old in self._step_files()[:-self.keep_last]:
            delete_checkpoint(old)
        return path

    def save_best(self, tensors: dict, meta: dict) -> Path:
        return save_checkpoint(self.dir / "best", tensors, meta)

    def latest(self) -> Path | None:
        files = self._step_files()
        return files[-1][1] if files else None

    def best(self) -> Path | None:
        p = self.dir / "best"
        return p if p.with_suffix(".json").is_file() else None
