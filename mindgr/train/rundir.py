"""A run directory's config: read it back (a moved or copied run included) and check what a resume may change;
which checkpoint a saved run loads and whether its data changed since."""
from __future__ import annotations

from pathlib import Path

from mindgr.config import RESUMABLE_CHANGES, Config, ConfigError
from mindgr.train.checkpoint import CheckpointError


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_run_config(cfg_path: Path) -> dict:
    """A run directory's config.yaml as a dict; a damaged file is one line naming it."""
    import yaml
    try:
        data = yaml.safe_load(cfg_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        raise CheckpointError(f"{cfg_path}: not valid YAML (damaged run config)") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg_path}: expected a mapping of config sections (damaged run config)")
    return data


def run_config(run_dir: Path) -> Config:
    """The Config a run was trained with, placed where the run directory is now (moved or copied)."""
    from mindgr.config import config_from_dict
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.yaml)")
    try:
        cfg = config_from_dict(read_run_config(cfg_path))
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
    cfg.run.out_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg


def check_resume_config(saved: dict, current: dict):
    a, b = _flatten(saved), _flatten(current)
    defaults = _flatten(Config().to_dict())
    for key in sorted(set(a) | set(b)):
        if key not in a and b.get(key) == defaults.get(key):
            continue  # a key newer than the run, left at its default, changes nothing
        if key.startswith("parallel."):
            continue  # how many ranks train a global batch never changes what is trained
        if key not in RESUMABLE_CHANGES and a.get(key) != b.get(key):
            raise ConfigError(f"config: {key} = {b.get(key)!r} differs from the run being resumed "
                              f"({a.get(key)!r}); only {', '.join(sorted(RESUMABLE_CHANGES))} may change")


def saved_checkpoint(run_dir: Path, cfg: Config, which: str) -> Path:
    """The checkpoint a saved run loads: its best (refused with a hint when no validation ran) or latest."""
    from mindgr.train.checkpoint import CheckpointManager
    if which not in ("best", "latest"):
        raise ValueError(f"checkpoint: {which!r} (expected best or latest)")
    ckpts = CheckpointManager(run_dir, cfg.run.keep_last)
    path = ckpts.best() if which == "best" else ckpts.latest()
    if path is None:
        if which == "best" and ckpts.latest() is not None:
            raise CheckpointError(f"{run_dir}: no best checkpoint (the run stopped before its final evaluation); "
                                  "use the last one with --checkpoint latest, or finish it with train --resume")
        raise CheckpointError(f"{run_dir}: no checkpoint to load")
    return path


def data_change_note(run_dir: Path, cfg: Config, allow_data_change: bool) -> str | None:
    """None when the run's data is as it was trained on (or predates fingerprints); a changed source is
    refused unless allow_data_change, then described in the returned note."""
    import json
    from mindgr.train.data import FINGERPRINT_FILE, data_fingerprint, fingerprint_mismatch
    saved_fp = run_dir / FINGERPRINT_FILE
    if not saved_fp.is_file():
        return None
    diff = fingerprint_mismatch(json.loads(saved_fp.read_text()), data_fingerprint(cfg.data))
    if diff and not allow_data_change:
        raise CheckpointError(f"{run_dir}: its data changed since it was trained ({diff}); pass "
                              "--allow-data-change to use the data as it is now")
    return f"evaluated on changed data ({diff})" if diff else None
