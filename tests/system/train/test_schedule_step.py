"""train.lr_schedule in a real compiled step: a rate of 0 leaves the weights exactly as they were (the rates
themselves and the loop setting them: tests/unit/train/test_schedule.py)."""
import numpy as np
import pytest

from mindgr.config import load_config
from mindgr.train import schedule


@pytest.mark.slow
def test_the_compiled_step_reads_the_scheduled_rate(tmp_path, tiny_overrides):
    """Cosine to a floor of 0: the last step's rate is exactly 0, so AdamWeightDecay leaves every weight as
    it was, while the step before it (rate > 0) moved them; the checkpoints hold the rate that was set."""
    from mindgr.train.checkpoint import load_checkpoint
    from mindgr.train.trainer import Trainer
    cfg = load_config(None, tiny_overrides + ["eval.every_epochs=0", "train.max_steps=5", "run.ckpt_every=1",
                                              "run.keep_last=10", "train.lr_schedule=cosine", "train.lr_floor=0"])
    Trainer(cfg, quiet=True).fit()
    ckpts = tmp_path / "tiny" / "checkpoints"
    state = {s: load_checkpoint(ckpts / f"ckpt-step{s:08d}.safetensors")[0] for s in (3, 4, 5)}
    for s in (3, 4, 5):
        rate = float(np.asarray(state[s]["optimizer.learning_rate"]).reshape(-1)[0])
        assert rate == np.float32(schedule.learning_rate(cfg.train, s, 5))               # stored as float32
    weights = [k for k in state[5] if not k.startswith("optimizer.") and state[5][k].dtype.kind == "f"]
    assert weights
    assert any(not np.array_equal(state[3][k], state[4][k]) for k in weights)       # rate > 0: moved
    assert all(np.array_equal(state[4][k], state[5][k]) for k in weights)           # rate 0: unchanged
