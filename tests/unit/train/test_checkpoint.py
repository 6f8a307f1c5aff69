"""Checkpoints: atomic files, clear errors on damage, and a resumed run that replays the same losses."""
import json

import numpy as np
import pytest

from mindgr.config import load_config
from mindgr.train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, save_checkpoint


def test_roundtrip_and_keep_last(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(step, {"w": np.full((2, 3), step, np.float32)}, {"epoch": 0, "next_batch": step})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt-step00000002.json", "ckpt-step00000002.safetensors",
                     "ckpt-step00000003.json", "ckpt-step00000003.safetensors"]
    tensors, meta = load_checkpoint(mgr.latest())
    assert meta["step"] == 3 and meta["next_batch"] == 3
    np.testing.assert_array_equal(tensors["w"], np.full((2, 3), 3, np.float32))


def _damage(path, how):
    weights = path.with_suffix(".safetensors")
    data = bytearray(weights.read_bytes())
    if how == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flip":
        data[-3] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "sidecar":
        path.with_suffix(".json").write_text("{not json")


@pytest.mark.parametrize("how, words", [("truncate", "truncated"), ("flip", "sha256"),
                                        ("sidecar", "not valid JSON")])
def test_damaged_checkpoint_is_an_error(tmp_path, how, words):
    path = tmp_path / "ck"
    save_checkpoint(path, {"w": np.arange(64, dtype=np.float32)}, {"step": 1})
    _damage(path, how)
    with pytest.raises(CheckpointError, match=words) as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)


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
