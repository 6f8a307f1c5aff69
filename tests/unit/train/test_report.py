"""`mindgr report`: PNG plots that hold the runs' curves, and the Markdown table of final metrics."""
import json
import subprocess
import sys

import numpy as np

from conftest import REPO

C0, C1 = (0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)      # matplotlib's first two line colours


def _fake_run(d, final_ndcg, loss0, with_eval=True):
    d.mkdir(parents=True)
    recs = []
    for step in range(10, 110, 10):
        recs.append({"step": step, "epoch": step // 50, "loss": loss0 / step, "tokens_per_s": 1000.0 + step})
        if step % 50 == 0:
            recs.append({"eval": "valid", "step": step, "epoch": step // 50, "hr@10": 0.1 + step / 1e3,
                         "ndcg@10": 0.05 + step / 2e3, "mrr": 0.04})
    recs.append({"step": 100, "epoch": 2, "loss": loss0 / 100, "tokens_per_s": 1100.0})   # a resumed repeat
    lines = [json.dumps(r) for r in recs]
    (d / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 11')           # cut by a kill mid-line
    if with_eval:
        (d / "eval.json").write_text(json.dumps({
            "run": str(d), "step": 100, "epoch": 2,
            "checkpoint": {"name": "best", "metric": 0.1, "key": "ndcg@10", "epoch": 2, "step": 100},
            "history": [{"epoch": 1, "step": 50, "hr@10": 0.15, "ndcg@10": 0.075, "mrr": 0.04},
                        {"epoch": 2, "step": 100, "hr@10": 0.2, "ndcg@10": 0.1, "mrr": 0.04}],
            "valid": {"count": 5, "hr@10": 0.2, "ndcg@10": 0.1, "mrr": 0.04},
            "test": {"count": 5, "hr@1": 0.01, "hr@10": 0.3, "ndcg@10": final_ndcg, "mrr": 0.05},
            "popularity_test": {"count": 5, "hr@10": 0.1, "ndcg@10": 0.02, "mrr": 0.01}}))
    return d


def _pixels_of(img, rgb, tol=0.08):
    return int((np.abs(img[..., :3] - np.array(rgb) / 255.0).max(-1) < tol).sum())


def test_report_of_two_runs_draws_both_and_tables_final_metrics(tmp_path):
    from matplotlib.image import imread
    from mindgr.train.report import PLOTS, load_run, write_report
    a = _fake_run(tmp_path / "a", 0.1234, 50.0)
    b = _fake_run(tmp_path / "b", 0.2345, 80.0, with_eval=True)
    c = _fake_run(tmp_path / "c", 0.0, 60.0, with_eval=False)
    run = load_run(a)
    assert [s for s, _, _ in run["train"]] == list(range(10, 110, 10))      # the repeated step 100 counted once
    assert run["train"][-1][2] == 1100.0                                    # ... the later line wins
    assert [s for s, _ in run["valid"]] == [50, 100] and run["valid"][0][1]["ndcg@10"] == 0.075  # eval.json history
    result = write_report([a, b, c], tmp_path / "out")
    for name in PLOTS.values():
        path = tmp_path / "out" / name
        assert path.stat().st_size > 5000
        img = imread(path)
        assert img.shape[0] >= 300 and img.shape[1] >= 400 and img[..., :3].std() > 0.01   # not blank
        assert _pixels_of(img, C0) > 50 and _pixels_of(img, C1) > 50, name               # both runs drawn
    table = (tmp_path / "out" / "report.md").read_text()
    assert table == f"# Runs\n\n{result['table']}\n" + "".join(f"![{k}]({v})\n" for k, v in PLOTS.items())
    rows = result["table"].splitlines()
    assert rows[0] == ("| run | steps | checkpoint | test hr@1 | test hr@10 | test ndcg@10 | test mrr | "
                       "popularity ndcg@10 |")
    assert rows[2] == "| a | 100 | best (epoch 2, step 100) | 0.0100 | 0.3000 | 0.1234 | 0.0500 | 0.0200 |"
    assert rows[3].startswith("| b | 100 |") and "0.2345" in rows[3]
    assert rows[4].startswith("| c | 100 | (no eval.json: not finished)") and rows[4].count("|") == rows[0].count("|")


def test_report_cli_writes_into_the_run_and_fails_in_one_line(tmp_path, capsys):
    from mindgr import cli
    run = _fake_run(tmp_path / "r", 0.5, 10.0)
    p = subprocess.run([sys.executable, "-m", "mindgr", "report", str(run)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (run / "report-loss.png").is_file() and (run / "report.md").is_file() and "| r | 100 |" in p.stdout
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 1, "loss": 2}\nnot json\n{"step": 2, "loss": 1}\n')
    for target, words in ((tmp_path / "none", "run directory not found"), (tmp_path, "not a run directory"),
                          (bad, "metrics.jsonl:2: not valid JSON")):
        code = cli.main(["report", str(target)])         # in-process: the same error path, no start-up
        err = capsys.readouterr().err
        lines = [l for l in err.splitlines() if l.startswith("mindgr: error:")]
        assert code == 1 and len(lines) == 1 and words in lines[0], err
