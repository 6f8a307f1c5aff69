"""Checkpoints: atomic files and clear errors on damage (a resumed run that replays the same losses, and
resume's refusals: tests/system/train/test_checkpoint_resume.py)."""
import numpy as np
import pytest

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
