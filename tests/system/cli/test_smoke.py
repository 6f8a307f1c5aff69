"""The README's main job, end to end: the built-in smoke config trains, evaluates and beats popularity."""
import json

import pytest

from cli_fixtures import run


@pytest.mark.slow   # the whole smoke run (about a minute on 2 quiet cores, 1.5-2 min on a busy host)
def test_smoke_config_trains_and_beats_popularity(tmp_path):
    p = run("train", "--config", "configs/smoke.yaml", f"run.out_dir={tmp_path}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "loss" in p.stdout and "fill" in p.stdout
    result = json.loads((tmp_path / "smoke" / "eval.json").read_text())
    model, pop = result["test"], result["popularity_test"]
    assert model["count"] == pop["count"] > 0
    # The synthetic catalogue is Zipf-popular, so popularity is a strong baseline: the model must miss
    # fewer than half as often at 10 and rank the target clearly higher.
    assert 1 - model["hr@10"] < 0.5 * (1 - pop["hr@10"]), (model, pop)
    assert model["ndcg@10"] > 1.5 * pop["ndcg@10"], (model, pop)
    logged = [json.loads(l) for l in (tmp_path / "smoke" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "loss" in r]
    assert steps and all(0 < r["fill"] <= 1 and r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    best = json.loads((tmp_path / "smoke" / "checkpoints" / "best.json").read_text())
    assert (tmp_path / "smoke" / "checkpoints" / best["weights"]).is_file()
