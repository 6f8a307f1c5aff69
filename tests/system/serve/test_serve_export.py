"""Serving from an export alone: a tiny run trained on a prepared store is exported, then the store and the
run directory are moved away, and `mindgr serve --export` (a real server on a free 127.0.0.1 port, always
stopped) and `mindgr recommend --export` answer with the lists `--run` gives; loading the export imports no
training module; a bad export is refused in one line."""
import json
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest

from conftest import REPO

from serve_fixtures import mindgr  # noqa: E402

from mindgr.bench.serve import free_port, start_server, stop_server, user_requests  # noqa: E402

pytestmark = pytest.mark.slow  # a trained run, two real servers and an export (~1 min)

TINY = ["run.name=tiny", "run.log_every=2", "data.max_len=20", "model.dim=16", "model.num_blocks=1",
        "model.num_heads=2", "loss.num_negatives=8", "train.batch_size=16", "train.epochs=1", "eval.every_epochs=1",
        "ops.backend=reference"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny HSTU run whose training data is a store on disk (so that it can be moved away)."""
    root = tmp_path_factory.mktemp("serve-export")
    p = mindgr("data", "prepare", "synthetic", "--out", root / "store", "--option", "num_users=120",
               "--option", "num_items=60", "--option", "median_len=10", "--option", "max_len=20")
    assert p.returncode == 0, p.stderr[-2000:]
    p = mindgr("train", f"run.out_dir={root / 'runs'}", "data.kind=store", f"data.path={root / 'store'}", *TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    return root


def cli(capsys, *args):
    from mindgr.cli import main
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("mindgr: error:")]


def answers(run_or_export: list, bodies):
    port = free_port()
    proc = start_server(None, port, [*run_or_export, "--batch-shapes", "1,4"], cwd=REPO)
    try:
        return [httpx.post(f"http://127.0.0.1:{port}/recommend", json=b, timeout=60).json() for b in bodies]
    finally:
        stop_server(proc)


# the modules that read training data or build training cells: none may load when an export is served
_LOADS_ONLY_THE_EXPORT = """
import json, sys
import numpy as np
from mindgr.serve.models import load_served
from mindgr.serve.options import ServerOptions
rec, info, _ = load_served(ServerOptions(shapes=[1]), export_dir=sys.argv[1])
q = rec.parse([int(x) for x in sys.argv[2].split()], k=5)
ids, _ = rec.recommend([q])[0]
print(json.dumps({"items": rec.catalogue.to_raw(ids).tolist(),
                  "training": sorted(m for m in sys.modules if m.startswith(("mindgr.train", "mindgr.datasets")))}))
"""


def test_serve_and_recommend_from_an_export_with_the_training_data_moved_away(trained, capsys):
    run, store, export = trained / "runs" / "tiny", trained / "store", trained / "export"
    bodies = user_requests(run, k=10)[:12]
    by_run = answers(["--run", run], bodies)
    assert [len(a["items"]) for a in by_run] == [10] * len(bodies)
    assert [p.name.split("-")[0] for p in (run / "serving").iterdir()] == ["retrieval"]   # the serving cache
    hist = " ".join(map(str, bodies[0]["history"]))
    code, out_run, _ = cli(capsys, "recommend", "--run", run, "--user-history", hist, "--k", 7)
    assert code == 0
    assert cli(capsys, "export", "--run", run, "--out", export, "--batch-shapes", "1,4")[0] == 0
    run.rename(trained / "run.away")
    store.rename(trained / "store.away")
    try:
        by_export = answers(["--export", export], bodies)
        for a, b in zip(by_export, by_run):
            assert a["items"] == b["items"]
            np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-6)
        code, out_export, _ = cli(capsys, "recommend", "--export", export, "--user-history", hist, "--k", 7)
        assert code == 0 and out_export == out_run
        p = subprocess.run([sys.executable, "-c", _LOADS_ONLY_THE_EXPORT, str(export), hist], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert got["training"] == []
        assert got["items"] == [int(line.split("\t")[1]) for line in out_run.strip().splitlines()[1:6]]
    finally:
        (trained / "run.away").rename(run)
        (trained / "store.away").rename(store)


def test_a_bad_export_is_refused_in_one_line(trained, tmp_path, capsys):
    export = trained / "export"
    if not export.is_dir():
        assert cli(capsys, "export", "--run", trained / "runs" / "tiny", "--out", export, "--batch-shapes", "1,4")[0] == 0

    def refused(*args_then_words):
        split = args_then_words.index("--")
        code, _, errors = cli(capsys, *args_then_words[:split])
        assert code == 1 and len(errors) == 1, (code, errors)
        for w in args_then_words[split + 1:]:
            assert w in errors[0], (w, errors[0])

    ask = ["--user-history", "1 2", "--k", 3]
    refused("recommend", "--export", tmp_path / "nowhere", *ask, "--", "no such directory")
    refused("serve", "--export", tmp_path / "nowhere", "--", "no such directory")
    (tmp_path / "empty").mkdir()
    refused("recommend", "--export", tmp_path / "empty", *ask, "--", "no manifest.json")
    refused("serve", "--run", trained / "runs" / "tiny", "--export", export, "--", "exactly one of")
    refused("serve", "--export", export, "--batch-shapes", "8", "--", "no graphs for batch shapes [8]",
            "export again")
    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    table = bad / "item_table.npy"
    data = bytearray(table.read_bytes())
    data[-1] ^= 1
    table.write_bytes(bytes(data))
    refused("recommend", "--export", bad, *ask, "--", "item_table.npy does not match its sha256", "export the run again")
    (bad / "manifest.json").write_text('{"format_version": 2, "encoders": ')
    refused("serve", "--export", bad, "--", "manifest.json is not valid JSON")
