"""Atomic checkpoints: MindSpore safetensors of every parameter of the train step (weights and optimizer
state) plus a JSON sidecar with the step, the data position and the file's sha256.

The sidecar carries a second checksum, `sidecar_sha256`, over its own other fields (the step, the data
cursor `next_batch`, `best`, ...): an edited sidecar is refused like a damaged weights file. Sidecars
written before it existed have no such field and are still read.

Every checkpoint read passes one check of its values (`nonfinite_reason`, also what ends a diverging
run before it saves): NaN, inf or an overflowing weight is refused in one line by every command that
loads a checkpoint (eval, compare, recommend, serve, export, ids build, resume).

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

from mindgr.paths import atomic_write, file_sha256  # noqa: F401  (file_sha256: imported from here too)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupted or does not fit the model (one-line message)."""


SIDECAR_FIELDS = ("weights", "sha256", "bytes")
SIDECAR_CHECKSUM = "sidecar_sha256"

# A weight beyond sqrt(float32 max) overflows when multiplied by another such weight (LayerNorm's
# squares, dot products): with train.lr=1e30 every weight sits at ~5e30 while the loss stays finite at
# log(R+1), every score tied. Such weights count as non-finite.
WEIGHT_LIMIT = 1.8e19


def nonfinite_reason(named: dict) -> str | None:
    """Why these weights cannot be used (the first float tensor holding NaN / inf, or a value beyond
    WEIGHT_LIMIT), or None. `named` maps names to numpy arrays or MindSpore tensors / parameters. The one
    check of the training loop (before every save) and of every checkpoint load."""
    for name, value in named.items():
        v = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        if v.dtype.kind != "f" or v.size == 0 or name.endswith("learning_rate"):
            continue
        finite = np.isfinite(v)
        if not finite.all():
            kind = "NaN" if np.isnan(v).any() else "inf"
            return f"parameter '{name}' holds non-finite values ({int(v.size - finite.sum())} of {v.size}, {kind})"
        largest = float(np.abs(v).max())
        if largest > WEIGHT_LIMIT:
            return (f"parameter '{name}' reached {largest:.1e} (beyond {WEIGHT_LIMIT:.1e}, float32 products of "
                    "it overflow)")
    return None


def _sidecar_digest(sidecar: dict) -> str:
    """sha256 of every field but the checksum itself, in one canonical JSON form."""
    body = {k: v for k, v in sidecar.items() if k != SIDECAR_CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _write_sidecar(path: Path, sidecar: dict):
    """The commit of a checkpoint: its JSON sidecar (with the checksum of its fields), flushed to disk, in
    one rename."""
    sidecar = dict(sidecar)
    sidecar.pop(SIDECAR_CHECKSUM, None)
    sidecar[SIDECAR_CHECKSUM] = _sidecar_digest(sidecar)
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
    if SIDECAR_CHECKSUM in meta and meta[SIDECAR_CHECKSUM] != _sidecar_digest(meta):
        raise CheckpointError(f"checkpoint {sidecar}: its fields do not match their {SIDECAR_CHECKSUM} (the "
                              "sidecar was edited or corrupted); restore it or use another checkpoint")
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
    tensors = {k: v.asnumpy() for k, v in loaded.items()}
    reason = nonfinite_reason(tensors)
    if reason:
        raise CheckpointError(f"checkpoint {weights}: {reason}; the model diverged before it was saved, "
                              "nothing can be served or evaluated from it")
    return tensors, meta


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
