"""A GR run trained in the test (the public API: GenerativeTrainer on synthetic data with a random code
table) served by its run directory: `mindgr recommend --run` gives the decoding engine's lists on
load_generative_run's model, and `mindgr export --run` writes graphs that give the same lists."""
import json

import numpy as np
import pytest

from gr_fixtures import graph_mode, random_codes  # noqa: F401
from mindgr.config import load_config

pytest.importorskip("mindgr.train.generative")
pytestmark = pytest.mark.slow  # a tiny GR training run (~30 s) and an export

SYNTH = ["data.kind=synthetic", "data.max_len=8", "data.synthetic.num_users=60", "data.synthetic.num_items=40",
         "data.synthetic.median_len=8", "data.synthetic.max_len=12", "data.synthetic.num_clusters=4"]
LEVELS = [4, 4, 3]


@pytest.fixture(scope="module")
def gr_run(tmp_path_factory):
    from mindgr.ids.codes import save_codes
    from mindgr.train.data import load_store
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("gr-serve")
    store = load_store(load_config(None, SYNTH).data)
    codes = random_codes(np.random.default_rng(5), store.num_items, LEVELS)
    path = save_codes(out / "codes.parquet", codes, LEVELS, store.item_raw_ids, {"note": "random"})
    cfg = load_config(None, [f"run.out_dir={out}", "run.name=gr", *SYNTH, "model.arch=gr", "model.dim=8",
                             "model.num_blocks=1", "model.num_heads=2", "loss.objective=ntp", "train.batch_size=16",
                             "train.epochs=1", "eval.every_epochs=1", "eval.ks=[1,5]", "eval.beam=6",
                             "eval.max_users=10", "eval.batch_size=32", "ids.from_run=", f"ids.codes={path}",
                             "ops.backend=cpu"])
    GenerativeTrainer(cfg, quiet=True).fit()
    return out / "gr", store


def test_recommend_and_export_a_trained_gr_run(gr_run, tmp_path, capsys):
    from mindgr.cli import main
    from mindgr.ids.decode import DecodingEngine
    from mindgr.serve.export import load_generative_export
    from mindgr.serve.generative import is_generative_run
    from mindgr.train.generative import load_generative_run
    run_dir, store = gr_run
    assert is_generative_run(run_dir)
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
    eng.backend.prefill_net, eng.backend.step_net = graphs[1]
    items2, _ = eng.search([np.asarray(hist)[-run.max_history:]], 6)
    np.testing.assert_array_equal(items2, items)
    json.dumps(manifest)
