"""Atomic checkpoints: MindSpore safetensors of every parameter of the train step (weights and optimizer
state) plus a JSON sidecar with the step, the data position and the file's sha256.

The sidecar is written last and is the commit marker: a crash mid-save leaves no sidecar for the new
file, so resume takes the previous checkpoint. A checkpoint whose bytes do not match its sha256, or that
does not parse, is an error, never a silent fresh start.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupted or does not fit the model (one-line message)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write_text(path: Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(path: Path, tensors: dict, meta: dict) -> Path:
    """Write `path`.safetensors then `path`.json. `tensors` maps names to numpy arrays or Tensors."""
    import mindspore as ms
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = path.with_suffix(".safetensors")
    tmp = weights.with_name(weights.name + ".tmp.safetensors")
    items = [{"name": k, "data": v if isinstance(v, ms.Tensor) else ms.Tensor(np.asarray(v))}
             for k, v in tensors.items()]
    ms.save_checkpoint(items, str(tmp), format="safetensors")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, weights)
    sidecar = dict(meta, weights=weights.name, sha256=_sha256(weights), bytes=weights.stat().st_size)
    _atomic_write_text(path.with_suffix(".json"), json.dumps(sidecar, indent=1, sort_keys=True))
    return weights


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(name -> numpy array, meta) from a checkpoint path (with or without suffix), verified."""
    import mindspore as ms
    path = Path(path)
    sidecar = path.with_suffix(".json")
    weights = path.with_suffix(".safetensors")
    if not sidecar.is_file():
        raise CheckpointError(f"checkpoint {sidecar}: not found")
    try:
        meta = json.loads(sidecar.read_text())
    except ValueError:
        raise CheckpointError(f"checkpoint {sidecar}: not valid JSON (truncated or corrupted)") from None
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {weights}: not found (its sidecar {sidecar.name} exists)")
    size = weights.stat().st_size
    if size != meta.get("bytes"):
        raise CheckpointError(f"checkpoint {weights}: {size} bytes, expected {meta.get('bytes')} (truncated?)")
    if _sha256(weights) != meta.get("sha256"):
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
            for suffix in (".json", ".safetensors"):
                old.with_suffix(suffix).unlink(missing_ok=True)
        return path

    def save_best(self, tensors: dict, meta: dict) -> Path:
        return save_checkpoint(self.dir / "best", tensors, meta)

    def latest(self) -> Path | None:
        files = self._step_files()
        return files[-1][1] if files else None

    def best(self) -> Path | None:
        p = self.dir / "best"
        return p if p.with_suffix(".json").is_file() else None
