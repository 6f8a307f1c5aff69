"""Resuming training runs from their checkpoints: a resumed run replays the same losses as one straight run,
and resume refuses what it cannot continue (the checkpoint files themselves:
tests/unit/train/test_checkpoint.py)."""
import json

import pytest

from mindgr.config import load_config
from mindgr.train.checkpoint import CheckpointError


def _losses(run_dir):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow   # two training runs and a resume: ~2 min on a busy host
def test_resume_replays_identical_losses(tmp_path, tiny_overrides):
    from mindgr.train.trainer import Trainer
    base = tiny_overrides + ["run.log_every=1", "eval.every_epochs=0", "run.ckpt_every=3",
                             "train.epochs=3"]
    straight = load_config(None, base + [f"run.out_dir={tmp_path / 'a'}", "train.max_steps=7"])
    Trainer(straight, quiet=True).fit()
    first = load_config(None, base + [f"run.out_dir={tmp_path / 'b'}", "train.max_steps=3"])
    Trainer(first, quiet=True).fit()
    resumed = load_config(None, base + [f"run.out_dir={tmp_path / 'b'}", "train.max_steps=7"])
    Trainer(resumed, resume=True, quiet=True).fit()
    a, b = _losses(tmp_path / "a" / "tiny"), _losses(tmp_path / "b" / "tiny")
    assert sorted(a) == list(range(1, 8)) and sorted(b) == list(range(1, 8))
    for step in range(1, 8):
        assert a[step] == b[step], (step, a[step], b[step])


@pytest.mark.slow  # several short runs (~10 s)
def test_resume_refusals(tmp_path, tiny_overrides):
    from mindgr.config import ConfigError
    from mindgr.train.trainer import Trainer
    base = tiny_overrides + ["eval.every_epochs=0", "train.max_steps=2"]
    with pytest.raises(CheckpointError, match="no run"):
        Trainer(load_config(None, base), resume=True, quiet=True)
    Trainer(load_config(None, base), quiet=True).fit()
    with pytest.raises(CheckpointError, match="--resume"):
        Trainer(load_config(None, base), quiet=True)
    with pytest.raises(ConfigError, match="model.dim"):
        Trainer(load_config(None, base + ["model.dim=8"]), resume=True, quiet=True)
    ckdir = tmp_path / "tiny" / "checkpoints"
    latest = sorted(ckdir.glob("ckpt-step*.safetensors"))[-1]
    latest.write_bytes(latest.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        Trainer(load_config(None, base), resume=True, quiet=True)
