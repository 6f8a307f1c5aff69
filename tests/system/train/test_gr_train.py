"""Generative retrieval end to end through `mindgr train` / `mindgr eval` / `mindgr compare`: a tiny GR
decoder trained by next-token prediction on synthetic data, its decoded ranks, a bit-identical resume,
a comparison with an HSTU run on the same users, and the one-line config errors (the plan's token counts,
evaluation without the history filter and the progress line: tests/unit/train/test_gr_train_units.py)."""
import io
import json

import numpy as np
import pytest

from gr_fixtures import SYNTH, gr_overrides, random_codes_file
from mindgr.config import load_config

pytestmark = pytest.mark.graph_mode("auto")


@pytest.fixture(scope="module")
def gr_setup(tmp_path_factory):
    """A random code table of the synthetic catalogue and one trained GR run."""
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("gr")
    store, codes, path = random_codes_file(out)
    cfg = load_config(None, gr_overrides(out, "gr", path))
    result = GenerativeTrainer(cfg, quiet=True).fit()
    return {"out": out, "codes": path, "run": out / "gr", "result": result, "num_items": store.num_items}


def test_train_eval_ranks_file_better_than_chance(gr_setup, capsys):
    from mindgr.cli import main
    run, result = gr_setup["run"], gr_setup["result"]
    assert (run / "ids" / "codes.parquet").is_file() and (run / "checkpoints" / "best.json").is_file()
    assert "codes" in json.loads((run / "data.json").read_text())
    assert result["checkpoint"]["name"] == "best" and result["valid"]["count"] == 40  # eval.max_users
    # the final test decode wrote both ranks files of the best checkpoint: eval reuses them
    saved = {name: (run / "ranks" / name).read_bytes() for name in ("test-best.npz", "test-best-unfiltered.npz")}
    assert main(["eval", "--run", str(run), "--json"]) == 0
    reused = json.loads(capsys.readouterr().out)
    assert reused["decode"] == {"reused": str(run / "ranks" / "test-best.npz")}
    for name in saved:                                  # an eval decoding afresh writes the same ranks
        (run / "ranks" / name).unlink()
    assert main(["eval", "--run", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "reused" not in out["decode"] and out["count"] == result["test"]["count"] and out["filter_history"]
    assert all(np.isfinite(out[k]) for k in ("hr@10", "ndcg@10", "mrr"))
    assert out["hr@10"] == pytest.approx(result["test"]["hr@10"]) == reused["hr@10"]
    for name, blob in saved.items():
        with np.load(run / "ranks" / name) as now, np.load(io.BytesIO(blob)) as then:
            assert all(np.array_equal(now[k], then[k]) for k in ("ranks", "ties", "targets", "checkpoint_sha256"))
    assert out["hr@10"] > 2 * 10 / gr_setup["num_items"]              # well above a random list of 10
    with np.load(out["ranks_file"]) as f:
        ranks, ties = f["ranks"], f["ties"]
    assert ranks.shape == ties.shape and (ties == 0).all() and ranks.max() == gr_setup["num_items"]  # misses
    assert main(["eval", "--run", str(run), "--filter-history", "false", "--json"]) == 0
    unf = json.loads(capsys.readouterr().out)
    assert unf["ranks_file"].endswith("test-best-unfiltered.npz") and unf["hr@10"] <= out["hr@10"] + 1e-9


def test_eval_equals_plain_beam_search(gr_setup):
    """The engine's lists (mindgr eval's decoder) equal generate/beam.py's plain search on the same checkpoint."""
    from mindgr.generate.beam import beam_ranks, beam_search
    from mindgr.models.generative import RecomputeScorer, max_prompt_tokens
    from mindgr.train.data import RunData
    from mindgr.train.generative import load_generative_run
    from mindgr.train.gr_eval import generative_ranks
    run = load_generative_run(gr_setup["run"])
    data = RunData(run.cfg)
    ev = data.split.test
    rows = np.arange(12)
    calls = []
    greater, _, _ = generative_ranks(run.decoder, run.trie, run.codes, ev, rows, run.max_history, 10, 5,
                                     data.num_items, progress=lambda *a: calls.append(a))
    done = [c[0] for c in calls]          # one call per decoded batch: increasing, ending at every user
    assert done == sorted(done) and done[-1] == len(rows) and all(c[1] == len(rows) for c in calls)
    hist = [np.asarray(ev.histories[r][-run.max_history:]) for r in rows]
    p_cap = max_prompt_tokens(run.decoder.num_levels, run.decoder.token_merger, run.max_history)
    items, _ = beam_search(run.trie, RecomputeScorer(run.decoder, hist, run.codes, 10, p_cap), len(rows), 10, 10)
    assert np.array_equal(greater, beam_ranks(items, ev.targets[rows], [ev.histories[r] for r in rows],
                                              data.num_items))
    # the decode that skips the history (eval.exclude_history_in_search): the plain search with the same
    # items excluded; its lists hold beam items new to each user, so it hits at least as often
    seen = [np.setdiff1d(ev.histories[r], [ev.targets[r]]) for r in rows]
    searched, _, _ = generative_ranks(run.decoder, run.trie, run.codes, ev, rows, run.max_history, 10, 5,
                                      data.num_items, exclude_in_search=True)
    items, _ = beam_search(run.trie, RecomputeScorer(run.decoder, hist, run.codes, 10, p_cap), len(rows), 10, 10,
                           exclude=seen)
    assert np.array_equal(searched, beam_ranks(items, ev.targets[rows], None, data.num_items))
    assert all(not np.isin(items[u], seen[u]).any() for u in range(len(rows)))
    assert (searched <= greater).all() and (searched < greater).any()


def test_eval_and_compare_with_the_history_skipped_by_the_search(gr_setup, capsys, tmp_path):
    """--filter-history search: its own ranks file, reused by a second eval, and compare pairs it."""
    from mindgr.cli import main
    run = gr_setup["run"]
    assert main(["eval", "--run", str(run), "--filter-history", "search", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks_file"].endswith("test-best-searched.npz") and out["filter_history"] == "search"
    assert main(["eval", "--run", str(run), "--filter-history", "search", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["decode"] == {"reused": out["ranks_file"]} and again["hr@10"] == out["hr@10"]
    assert main(["eval", "--run", str(run), "--json"]) == 0
    filtered = json.loads(capsys.readouterr().out)
    assert out["hr@10"] >= filtered["hr@10"]
    assert main(["compare", str(run), str(run), "--filter-history", "search", "--samples", "200",
                 "--out", str(tmp_path / "c.json")]) == 0
    compared = json.loads((tmp_path / "c.json").read_text())
    assert compared["metrics"]["hr@10"]["a"] == pytest.approx(out["hr@10"]) and compared["users"] == out["count"]


def test_trie_softmax_run_trains_and_decodes_renormalised(gr_setup):
    """model.trie_softmax: the run trains with the trie's groups (same init, data and dropout as the
    fixture's run, so its first loss is strictly lower: each softmax runs over a subset of the same
    logits), its loaded decoder carries the rule, and eval's lists equal the plain beam search
    renormalised over the trie's children."""
    from mindgr.generate.beam import beam_ranks, beam_search
    from mindgr.models.generative import RecomputeScorer, max_prompt_tokens
    from mindgr.train.data import RunData
    from mindgr.train.generative import GenerativeTrainer, load_generative_run
    from mindgr.train.gr_eval import generative_ranks
    out = gr_setup["out"]
    cfg = load_config(None, gr_overrides(out, "trie", gr_setup["codes"], "model.trie_softmax=true", "train.max_steps=3",
                                         "eval.every_epochs=0"))
    GenerativeTrainer(cfg, quiet=True).fit()
    plain, trie = _losses(gr_setup["run"]), _losses(out / "trie")
    assert sorted(trie) == [1, 2, 3] and all(np.isfinite(v) for v in trie.values())
    assert trie[1] < plain[1] - 1e-3, (trie[1], plain[1])
    run = load_generative_run(out / "trie", which="latest")
    assert run.decoder.trie_softmax
    data = RunData(run.cfg)
    ev, rows = data.split.test, np.arange(12)
    greater, _, _ = generative_ranks(run.decoder, run.trie, run.codes, ev, rows, run.max_history, 10, 12,
                                     data.num_items)
    hist = [np.asarray(ev.histories[r][-run.max_history:]) for r in rows]
    p_cap = max_prompt_tokens(run.decoder.num_levels, run.decoder.token_merger, run.max_history)
    scorer = RecomputeScorer(run.decoder, hist, run.codes, 10, p_cap)
    items, _ = beam_search(run.trie, scorer, len(rows), 10, 10, renormalize=True)
    assert np.array_equal(greater, beam_ranks(items, ev.targets[rows], [ev.histories[r] for r in rows],
                                              data.num_items))


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "eval" not in r}


def test_resume_is_bit_identical(gr_setup):
    from mindgr.train.checkpoint import load_checkpoint
    from mindgr.train.generative import GenerativeTrainer
    out, codes = gr_setup["out"], gr_setup["codes"]
    GenerativeTrainer(load_config(None, gr_overrides(out, "cut", codes, "train.max_steps=5")), quiet=True).fit()
    GenerativeTrainer(load_config(None, gr_overrides(out, "cut", codes)), resume=True, quiet=True).fit()
    straight, resumed = _losses(gr_setup["run"]), _losses(out / "cut")
    assert len(straight) > 5 and straight == resumed
    a, _ = load_checkpoint(out / "gr" / "checkpoints" / "best.safetensors")
    b, _ = load_checkpoint(out / "cut" / "checkpoints" / "best.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_evaluating_apart_from_the_step_changes_nothing(gr_setup, monkeypatch):
    """A GR run frees its compiled graphs before every validation (the training step compiles again at the
    next step) and the decoding graphs after it (eval_apart, for peak memory): it trains the losses and
    weights, and decodes the ranks, of a run that keeps both; eval.json records each phase's peak memory."""
    from mindgr.train.checkpoint import load_checkpoint
    from mindgr.train.generative import GenerativeTask, GenerativeTrainer
    assert GenerativeTask.eval_apart          # the fixture's run evaluated apart
    out, codes = gr_setup["out"], gr_setup["codes"]
    released = []
    monkeypatch.setattr(GenerativeTask, "eval_apart", False)
    monkeypatch.setattr(GenerativeTask, "release_eval", lambda self: released.append(self))
    GenerativeTrainer(load_config(None, gr_overrides(out, "together", codes)), quiet=True).fit()
    assert not released
    apart, together = _losses(gr_setup["run"]), _losses(out / "together")
    assert len(apart) > 5 and apart == together
    a, _ = load_checkpoint(out / "gr" / "checkpoints" / "best.safetensors")
    b, _ = load_checkpoint(out / "together" / "checkpoints" / "best.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for name in ("test-best.npz", "test-best-unfiltered.npz"):
        with np.load(out / "gr" / "ranks" / name) as x, np.load(out / "together" / "ranks" / name) as y:
            assert np.array_equal(x["ranks"], y["ranks"])
    memory = gr_setup["result"]["memory"]
    assert {"setup", "train", "valid", "final", "test"} <= set(memory["phases"])
    assert memory["peak_rss_mb"] >= max(p["peak_mb"] for p in memory["phases"].values()) > 0


def test_a_run_saved_before_the_trie_head_layout_loads_for_decoding(gr_setup, tmp_path):
    """Runs saved before the trie head's entry layout name their optimizer moments adam_m.decoder.* (now
    adam_m.head.decoder.*): eval, compare and serving load them by the loss cell's weights alone."""
    import mindspore as ms
    from mindgr.train.checkpoint import CheckpointManager, load_checkpoint
    from mindgr.train.generative import GenerativeTrainer, load_generative_run
    cfg = load_config(None, gr_overrides(tmp_path, "older", gr_setup["codes"], "model.trie_softmax=true",
                                         "train.max_steps=3", "eval.every_epochs=0", "eval.max_users=8",
                                         "eval.test_max_users=8"))
    GenerativeTrainer(cfg, quiet=True).fit()
    run = tmp_path / "older"
    tensors, meta = load_checkpoint(run / "checkpoints" / "best.safetensors")
    renamed = {k.replace("adam_m.head.", "adam_m.").replace("adam_v.head.", "adam_v."): v for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    CheckpointManager(run, 2).save_best({k: ms.Tensor(v) for k, v in renamed.items()}, meta)
    loaded = load_generative_run(run)
    for name, p in loaded.decoder.parameters_and_names():
        assert np.array_equal(p.asnumpy(), tensors["loss_net.decoder." + name])


def test_compare_with_an_hstu_run(gr_setup, capsys):
    from mindgr.cli import main
    from mindgr.train.trainer import Trainer
    out = gr_setup["out"]
    hstu = load_config(None, [f"run.out_dir={out}", "run.name=hstu", *SYNTH, "model.dim=16", "model.num_blocks=1",
                              "model.num_heads=2", "loss.num_negatives=8", "train.batch_size=16", "train.epochs=1",
                              "eval.every_epochs=1", "eval.ks=[5,10,50]", "ops.backend=cpu"])
    Trainer(hstu, quiet=True).fit()
    assert main(["compare", str(out / "hstu"), str(gr_setup["run"]), "--samples", "200"]) == 0
    text = capsys.readouterr().out
    assert "paired comparison over" in text and "hr@10" in text and "hr@50" not in text  # K both evaluated
    # --max-users: the GR side decodes a fixed sample, the pairing keeps only those users
    assert main(["compare", str(out / "hstu"), str(gr_setup["run"]), "--samples", "200", "--max-users", "20"]) == 0
    assert "paired comparison over 20 users" in capsys.readouterr().out
    # ids.from_run: the HSTU run's item table tokenised at start, catalogue-checked
    from mindgr.train.data import load_store
    from mindgr.train.generative import check_codes_catalogue, resolve_codes
    cfg = load_config(None, gr_overrides(out, "fr", gr_setup["codes"], "ids.codes=", f"ids.from_run={out / 'hstu'}",
                                         "ids.levels=2", "ids.codes_per_level=4"))
    table = resolve_codes(cfg)
    check_codes_catalogue(table, load_store(cfg.data))
    assert table.codes.shape == (gr_setup["num_items"] + 1, 3) and table.level_sizes[:2] == [4, 4]
    assert len({tuple(c) for c in table.codes[1:]}) == gr_setup["num_items"]


@pytest.mark.parametrize("extra, message", [
    (["ids.codes=/nonexistent/codes.parquet"], "ids.codes = /nonexistent/codes.parquet: no such file"),
    (["data.synthetic.num_items=50"], "items, the data"),
    (["eval.beam=5"], "eval.beam = 5"),
    (["loss.objective=sampled_softmax"], "model.arch = gr is trained by next-token prediction"),
    (["model.arch=hstu"], "loss.objective = ntp trains the generative decoder"),
    (["loss.objective=page_ntp"], "page_ntp needs pages"),
    (["ids.codes="], "needs a semantic-ID table"),
    (["model.arch=hstu", "loss.objective=sampled_softmax", "model.trie_softmax=true"],
     "model.trie_softmax is the generative decoder's scoring rule"),
    (["model.item_id_dropout=0.5"], "model.item_id_dropout = 0.5 needs model.token_merger = item_id (it is none)"),
])
def test_bad_configs_are_one_line(gr_setup, capsys, extra, message):
    from mindgr.cli import main
    args = gr_overrides(gr_setup["out"], "bad", gr_setup["codes"], *extra)
    assert main(["train", *args]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_tree_layout_trains_like_copied_rows(gr_setup):
    """data.gr_layout = tree through `mindgr train` (item merger, trie softmax, no dropout, the whole epoch in
    one batch): the same losses as the copied rows, step after step."""
    from mindgr.train.generative import GenerativeTrainer
    out, runs = gr_setup["out"], {}
    for layout in ("rows", "tree"):
        cfg = load_config(None, gr_overrides(out, f"lay-{layout}", gr_setup["codes"], f"data.gr_layout={layout}",
                                             "model.token_merger=item", "model.trie_softmax=true",
                                             "model.dropout=0", "train.batch_size=400", "train.epochs=3",
                                             "eval.every_epochs=0", "eval.max_users=8"))
        GenerativeTrainer(cfg, quiet=True).fit()
        runs[layout] = _losses(out / f"lay-{layout}")
    assert sorted(runs["rows"]) == sorted(runs["tree"]) == [1, 2, 3]
    for step in (1, 2, 3):
        a, b = runs["rows"][step], runs["tree"][step]
        assert np.isfinite(a) and abs(a - b) <= 1e-4 * (1 + abs(a)), (step, a, b)


def test_item_id_dropout_reaches_the_step(gr_setup):
    """model.item_id_dropout through `mindgr train` (merger item_id, no other dropout): the first step's loss,
    before any update, differs from the same run without it; the same config twice gives the same losses."""
    from mindgr.train.generative import GenerativeTrainer
    out, runs = gr_setup["out"], {}
    for name, p in (("idd0", 0.0), ("idd9", 0.9), ("idd9b", 0.9)):
        cfg = load_config(None, gr_overrides(out, name, gr_setup["codes"], "model.token_merger=item_id",
                                             f"model.item_id_dropout={p}", "model.dropout=0", "train.max_steps=3",
                                             "eval.every_epochs=0", "eval.max_users=8"))
        GenerativeTrainer(cfg, quiet=True).fit()
        runs[name] = _losses(out / name)
    assert sorted(runs["idd0"]) == sorted(runs["idd9"]) == [1, 2, 3]
    assert runs["idd9"] == runs["idd9b"]
    assert abs(runs["idd0"][1] - runs["idd9"][1]) > 1e-4, runs


@pytest.mark.slow  # an export of every graph shape
def test_recommend_and_export_the_trained_run(gr_setup, tmp_path, capsys):
    """The trained run served by its run directory: `mindgr recommend --run` gives the decoding engine's lists
    on load_generative_run's model, `mindgr export --run` writes graphs that give the same lists, and
    `mindgr recommend --export` gives them from the export alone (the run and its code table moved away)."""
    from mindgr.cli import main
    from mindgr.generate.engine import DecodingEngine
    from mindgr.serve.export import load_generative_export
    from mindgr.serve.models import serving_kind
    from mindgr.train.generative import load_generative_run
    from mindgr.train.data import load_store
    run_dir, store = gr_setup["run"], load_store(load_config(None, SYNTH).data)
    assert serving_kind(run_dir) == "generative"
    raw = np.asarray(store.item_raw_ids)
    hist = [3, 8, 1, 20, 7]
    capsys.readouterr()
    assert main(["recommend", "--run", str(run_dir), "--user-history", " ".join(str(raw[i]) for i in hist),
                 "--k", "5", "--beam", "6", "--include-history"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    got = [int(line.split("\t")[1]) for line in lines]
    run = load_generative_run(run_dir)
    eng = DecodingEngine(run.decoder, run.trie, run.codes, 6, run.max_history * run.decoder.num_levels, 1)
    items, _ = eng.search([np.asarray(hist)[-run.max_history:]], 6)
    assert got == [int(raw[i]) for i in items[0][:5]]

    out = tmp_path / "export"
    assert main(["export", "--run", str(run_dir), "--out", str(out), "--beam", "6", "--batch-shapes", "1"]) == 0
    manifest, graphs, codes, _, _ = load_generative_export(out)
    assert manifest["kind"] == "generative" and manifest["data"]["fingerprint"] is not None
    np.testing.assert_array_equal(codes, run.codes)
    eng.state.prefill_net, eng.state.step_net = graphs[1]
    items2, _ = eng.search([np.asarray(hist)[-run.max_history:]], 6)
    np.testing.assert_array_equal(items2, items)
    json.dumps(manifest)
    # the export alone, with the run directory and the code table moved away: the same lists
    codes_file, away = gr_setup["codes"], tmp_path / "away"
    away.mkdir()
    run_dir.rename(away / "run")
    codes_file.rename(away / "codes.parquet")
    try:
        capsys.readouterr()
        assert main(["recommend", "--export", str(out), "--user-history", " ".join(str(raw[i]) for i in hist),
                     "--k", "5", "--include-history"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()[1:]
        assert [int(line.split("\t")[1]) for line in lines] == got
    finally:
        (away / "run").rename(run_dir)
        (away / "codes.parquet").rename(codes_file)
