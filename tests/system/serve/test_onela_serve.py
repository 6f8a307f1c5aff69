"""A tiny linear-attention GR run end to end: trained by `mindgr train` (model.backbone linear), evaluated,
exported (`mindgr export`: OneLA's prefill and step graphs as MindIR), answered by `mindgr recommend` and by
`mindgr serve` over real HTTP from the run (through its serving cache) and from the export directory alone,
every way giving the in-process OneLA engine's lists (which the plain recompute search also gives)."""
import json

import httpx
import numpy as np
import pytest

from conftest import REPO
from mindgr.config import load_config
from gr_fixtures import gr_overrides, random_codes_file

pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]


@pytest.fixture(scope="module")
def linear_run(tmp_path_factory):
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("gr-linear")
    store, codes, path = random_codes_file(out)
    cfg = load_config(None, gr_overrides(out, "gr-linear", path, "model.backbone=linear"))
    result = GenerativeTrainer(cfg, quiet=True).fit()
    return {"run": out / "gr-linear", "result": result, "raw": np.asarray(store.item_raw_ids)}


def test_linear_run_trains_and_decodes(linear_run):
    from mindgr.generate.engine import DecodingEngine
    from mindgr.train.generative import load_generative_run
    metrics = linear_run["result"]["test"]
    assert 0.0 <= metrics["hr@10"] <= 1.0
    run = load_generative_run(linear_run["run"])
    assert run.decoder.backbone == "linear"
    hist = [np.asarray([3, 8, 1, 20, 7]), np.asarray([5, 9])]
    p_cap = run.max_history * run.decoder.num_levels
    want = DecodingEngine(run.decoder, run.trie, run.codes, 6, p_cap, 2, cache="recompute").search(hist, 6)
    for cache in ("shared", "per_beam", "replay"):
        got = DecodingEngine(run.decoder, run.trie, run.codes, 6, p_cap, 2, cache=cache).search(hist, 6)
        np.testing.assert_array_equal(got[0], want[0], err_msg=cache)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=2e-5, err_msg=cache)


def test_recommend_serve_and_export(linear_run, tmp_path, capsys):
    from mindgr.bench.serve import free_port, start_server, stop_server
    from mindgr.cli import main
    from mindgr.generate.engine import DecodingEngine
    from mindgr.serve.models import serving_kind
    from mindgr.train.generative import load_generative_run
    run_dir, raw = linear_run["run"], linear_run["raw"]
    assert serving_kind(run_dir) == "generative"
    hist = [3, 8, 1, 20, 7]
    run = load_generative_run(run_dir)
    eng = DecodingEngine(run.decoder, run.trie, run.codes, 6, run.max_history * run.decoder.num_levels, 1)
    items, _ = eng.search([np.asarray(hist)[-run.max_history:]], 6)
    want = [int(raw[i]) for i in items[0][:5]]

    capsys.readouterr()
    assert main(["recommend", "--run", str(run_dir), "--user-history", " ".join(str(raw[i]) for i in hist),
                 "--k", "5", "--beam", "6", "--include-history"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert [int(line.split("\t")[1]) for line in lines] == want

    port = free_port()
    proc = start_server(run_dir, port, ["--beam", 6, "--batch-shapes", "1", "--threads", 1], cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health").json()["model"] == "generative"
        r = httpx.post(f"{url}/recommend", json={"history": [int(raw[i]) for i in hist], "k": 5,
                                                 "exclude_history": False}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["items"] == want
        unknown = int(raw.max()) + 1000
        r = httpx.post(f"{url}/recommend", json={"history": [int(raw[1]), unknown], "k": 3}, timeout=60)
        assert r.status_code == 422 and f"unknown item id {unknown}" in r.json()["error"]
    finally:
        stop_server(proc)

    export = tmp_path / "export"
    capsys.readouterr()
    assert main(["export", "--run", str(run_dir), "--out", str(export), "--beam", "6", "--batch-shapes", "2"]) == 0
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["kind"] == "generative" and manifest["decoder"]["backbone"] == "linear"
    assert sorted(manifest["graphs"]) == ["2"] and manifest["beam"] == 6      # one user served in a 2-user graph
    capsys.readouterr()
    assert main(["recommend", "--export", str(export), "--user-history", " ".join(str(raw[i]) for i in hist),
                 "--k", "5", "--include-history"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert [int(line.split("\t")[1]) for line in lines] == want

    port = free_port()
    proc = start_server(None, port, ["--export", export, "--threads", 1], cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}"
        health = httpx.get(f"{url}/health").json()
        assert health["model"] == "generative" and health["export"] == str(export)
        r = httpx.post(f"{url}/recommend", json={"history": [int(raw[i]) for i in hist], "k": 5,
                                                 "exclude_history": False}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["items"] == want
        r = httpx.post(f"{url}/recommend", json={"history": [int(raw[1])], "k": 7}, timeout=60)
        assert r.status_code == 422 and "more than the beam width 6" in r.json()["error"]
        by_status = httpx.get(f"{url}/metrics").json()["requests"]["by_status"]
        assert by_status["422"] == 1 and by_status["200"] >= 1          # counted as from a run
    finally:
        stop_server(proc)
    # the baselines need the model itself: refused from an export in one line
    capsys.readouterr()
    assert main(["serve", "--export", str(export), "--decode", "per_beam"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mindgr: error:")]
    assert len(err) == 1 and "export holds the graphs of the decoding engine's fast path only" in err[0]
