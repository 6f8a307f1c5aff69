"""A run directory's config: read it back (a moved or copied run included) and check what a resume may change."""
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
