"""Training with the fused shared-pool kernel (mindgr.ops.cpu.shared_pool_lse): 8 steps of a tiny run give the
losses of the materialised reference, for shared_pool and mixed negatives (the kernel against the reference
on random inputs: tests/unit/ops/test_ops_cpu_pool.py)."""
import json

import pytest

from ops_fixtures import needs_compiler

pytestmark = needs_compiler


@pytest.mark.slow   # trains twice per variant: ~70 s each on a busy host
@pytest.mark.parametrize("extra", [["loss.negatives=shared_pool", "loss.pool_size=48"],
                                   ["loss.negatives=mixed", "loss.pool_size=40", "loss.in_batch_size=24",
                                    "loss.sampling=popularity"]],
                         ids=["shared_pool", "mixed"])
def test_cpu_training_with_shared_candidates_matches_reference(tmp_path, tiny_overrides, extra):
    """8 steps of the same run with the streamed kernel and with the materialised reference."""
    from mindgr.config import load_config
    from mindgr.train.trainer import Trainer
    losses = {}
    for be in ("reference", "cpu"):
        cfg = load_config(None, tiny_overrides + extra + [
            f"run.out_dir={tmp_path / be}", "ops.backend=" + be, "train.max_steps=8", "run.log_every=1",
            "eval.every_epochs=0"])
        Trainer(cfg, quiet=True).fit()
        rows = [json.loads(line) for line in (tmp_path / be / "tiny" / "metrics.jsonl").read_text().splitlines()]
        losses[be] = [r["loss"] for r in rows if "loss" in r]
    assert len(losses["cpu"]) == len(losses["reference"]) == 8
    for step, (a, b) in enumerate(zip(losses["reference"], losses["cpu"]), 1):
        assert abs(a - b) <= 1e-4 * abs(a) + 1e-5, (step, a, b)
