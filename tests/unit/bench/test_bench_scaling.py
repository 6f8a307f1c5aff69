"""The arithmetic of `mindgr bench distributed` (blocks method) on hand-made block timings, and its argument checks."""
import numpy as np

from mindgr.bench.distributed import efficiencies, round_sums


def _block(rnd, variant, rank, tokens, wall):
    return {"round": rnd, "variant": variant, "rank": rank, "tokens": tokens, "wall_s": wall}


def test_pooled_and_per_round_efficiencies():
    blocks = []
    for r, (two_wall, pair_walls, alone_wall) in enumerate([(2.0, (1.8, 2.2), 1.5), (4.0, (3.0, 3.0), 2.5)]):
        # two: each rank logs the global batch's tokens; the slower rank's wall counts
        blocks += [_block(r, "two", 0, 4000, two_wall), _block(r, "two", 1, 4000, two_wall - 0.5)]
        blocks += [_block(r, "split", 0, 4000, two_wall + 0.5), _block(r, "split", 1, 4000, two_wall)]
        blocks += [_block(r, "local", 0, 4000, 1.9), _block(r, "local", 1, 4000, 1.9)]
        blocks += [_block(r, "pair", k, 2000, w) for k, w in enumerate(pair_walls)]
        blocks.append(_block(r, "alone", r % 2, 2000, alone_wall))
    blocks.append(_block(2, "two", 0, 4000, 1.0))             # an incomplete round is left out
    sums = round_sums(blocks)
    assert sums["round"].tolist() == [0, 1]
    first = efficiencies(sums, [0])
    assert np.isclose(first["two"], 2000.0) and np.isclose(first["pair"], 1000.0)
    assert np.isclose(first["eff_side_by_side"], 1.0)
    assert np.isclose(first["eff_vs_alone"], 2000.0 / (2 * 2000 / 1.5))
    assert np.isclose(first["split"], 1600.0) and np.isclose(first["two_over_split"], 1.25)
    assert np.isclose(first["eff_split_side_by_side"], 0.8)
    pooled = efficiencies(sums, np.arange(2))
    assert np.isclose(pooled["two"], 8000 / 6.0)
    assert np.isclose(pooled["pair"], 8000 / 10.0)
    assert np.isclose(pooled["eff_side_by_side"], (8000 / 6.0) / (2 * 800.0))
    assert np.isclose(efficiencies(sums, [1, 1])["eff_side_by_side"], efficiencies(sums, [1])["eff_side_by_side"])
    # without the one-graph step there are no `split` blocks: the rounds are complete without them
    plain = round_sums([b for b in blocks if b["variant"] != "split"])
    assert plain["round"].tolist() == [0, 1] and "split" not in plain
    assert "two_over_split" not in efficiencies(plain, [0])
    assert np.isclose(efficiencies(plain, [0])["eff_side_by_side"], 1.0)


def test_bad_bench_arguments_fail_before_any_rank_starts():
    import pytest
    from mindgr.bench.distributed import bench_scaling_blocks
    from mindgr.config import ConfigError
    for kwargs in ({"rounds": 0}, {"steps": 0}, {"rank_tokens": 512}, {"overrides": ["model.dim=-1"]}):
        with pytest.raises(ConfigError):
            bench_scaling_blocks(**kwargs)


def test_rank_tokens_is_refused_with_the_runs_method(capsys):
    from mindgr.cli import main
    assert main(["bench", "distributed", "--method", "runs", "--rank-tokens", "4096"]) != 0
    assert "--rank-tokens applies to --method blocks or reduce only" in capsys.readouterr().err


def test_reduce_method_rates_per_round():
    from mindgr.bench.distributed import reduce_round_rates

    def blk(rnd, side, rank, wall, apply_s):
        return {"round": rnd, "side": side, "rank": rank, "tokens": 4000, "steps": 10, "wall_s": wall,
                "apply_s": apply_s}
    blocks = [blk(0, "own", 0, 2.0, 0.2), blk(0, "own", 1, 2.5, 0.4), blk(0, "ms1", 0, 1.6, 0.1),
              blk(0, "ms1", 1, 2.0, 0.3), blk(1, "own", 0, 4.0, 0.2), blk(1, "own", 1, 4.0, 0.2),
              blk(2, "own", 0, 1.0, 0.1)]                       # rounds 1 and 2 lack a side: left out
    blocks += [blk(1, "ms1", 0, 4.0, 0.2)]
    per = reduce_round_rates(blocks, ["own", "ms1"])
    assert per["round"] == [0]
    assert np.isclose(per["tokens_per_s"]["own"][0], 4000 / 2.5)    # the slower rank's wall
    assert np.isclose(per["tokens_per_s"]["ms1"][0], 4000 / 2.0)
    assert np.isclose(per["apply_ms"]["own"][0], 30.0) and np.isclose(per["step_ms"]["ms1"][0], 200.0)


def test_bad_bucket_lists_fail_before_any_rank_starts(capsys):
    import pytest
    from mindgr.bench.distributed import bench_reduce_blocks
    from mindgr.cli import main
    from mindgr.config import ConfigError
    for buckets in ("", "1,x", "-1", "1,1"):
        with pytest.raises(ConfigError):
            bench_reduce_blocks(buckets=buckets)
    assert main(["bench", "distributed", "--buckets", "2"]) != 0
    assert "--buckets applies to --method reduce only" in capsys.readouterr().err


def test_generative_configs_keep_their_own_data_and_model(tmp_path):
    """A retrieval config gets the KuaiRand-like benchmark data and model; a generative one only the run
    settings (its rows copy the prompt per target), and a config without codes gets a synthetic table."""
    from mindgr.bench.distributed_common import BENCH_OVERRIDES, RUN_OVERRIDES, bench_overrides
    from mindgr.bench.scaling_blocks import synthetic_codes_override
    from mindgr.config import load_config
    from conftest import REPO
    assert bench_overrides(None) == BENCH_OVERRIDES
    assert bench_overrides(str(REPO / "configs" / "smoke.yaml")) == BENCH_OVERRIDES
    gr = str(REPO / "configs" / "gr-smoke.yaml")
    assert bench_overrides(gr) == RUN_OVERRIDES
    cfg = load_config(gr, ["ids.from_run=", "data.synthetic.num_users=60"])
    (override,) = synthetic_codes_override(cfg, str(tmp_path))
    assert override.startswith("ids.codes=") and (tmp_path / override.split("=", 1)[1]).is_file()
    given = load_config(gr, ["ids.from_run=", override])
    assert synthetic_codes_override(given, str(tmp_path)) == []                     # codes given: none drawn
