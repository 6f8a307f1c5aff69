"""mindgr.cli in-process: a full disk is one line, every benchmark has its own help, and benchmark arguments
reach their run (the command in a subprocess, as a user runs it: tests/system/cli/test_cli.py)."""
from pathlib import Path

import pytest


def test_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """A write that meets a full disk (the kernel's /dev/full answers every write with ENOSPC)."""
    import importlib
    from mindgr import cli
    prepare = importlib.import_module("mindgr.datasets.prepare")  # (the package's `prepare` is the function)

    def write_to_full_disk(store, out):
        with open("/dev/full", "w") as f:
            f.write("x" * 65536)
            f.flush()
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    monkeypatch.setattr(prepare, "write_store", write_to_full_disk)
    code = cli.main(["data", "prepare", "synthetic", "--out", str(tmp_path / "s"), "--option", "num_users=20"])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("mindgr: error:")]
    assert code == 1 and len(lines) == 1, err
    assert f"writing {tmp_path / 's'}: no space left on device" in lines[0], lines[0]


def _help_of(capsys, *words) -> str:
    from mindgr.cli import build_parser
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*words, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _flags(text: str) -> set:
    return {w.strip("[],") for w in text.split() if w.startswith(("--", "[--"))}


def test_every_benchmark_has_its_own_help(capsys):
    from mindgr.bench.registry import BENCHMARKS
    flags = {}
    for name, bench in BENCHMARKS.items():
        text = _help_of(capsys, "bench", name)
        assert f"usage: mindgr bench {name}" in text and bench.summary.split()[0] in text, text
        flags[name] = _flags(text)
    train = flags["train"]
    assert {"--config", "--set", "--steps", "--warmup", "--backends", "--no-memory", "--out"} <= train
    assert "--gr-batch-shapes" not in train and "--topologies" not in train and "--refresh" not in train
    assert "--gr-batch-shapes" in flags["serve"] and "--config" not in flags["serve"]
    assert {"--topologies", "--model-steps", "--taus", "--out-dir"} <= flags["sparse"]
    assert flags["peak"] == {"--help", "--refresh", "--out"}
    # the flags of the one flat parser before, each kept by the benchmarks that read it
    before = {"--config", "--set", "--steps", "--warmup", "--refresh", "--out", "--ranks", "--no-real",
              "--backends", "--no-memory", "--sizes", "--repeats", "--topologies", "--model-steps", "--runs",
              "--train", "--taus", "--out-dir", "--rounds", "--rank-tokens", "--method", "--run", "--rates",
              "--duration", "--max-requests", "--p99-bound-ms", "--k", "--batch-shapes", "--threads", "--index",
              "--gr", "--beams", "--prompts", "--items", "--dim", "--blocks", "--min-requests", "--bound-factor",
              "--gr-p99-bound-ms", "--cell-budget", "--rate-multiples", "--gr-batch-shapes",
              "--gr-big-batch-shapes", "--memory-fraction", "--overlap-ab", "--index-recall"}
    assert before <= set().union(*flags.values())


def test_benchmark_arguments_reach_their_run(monkeypatch):
    """The cli dispatches through the registry: the named benchmark's run gets its own parsed flags."""
    from mindgr import cli
    from mindgr.bench import ops, pipeline
    seen = {}
    monkeypatch.setattr(ops, "bench_ops", lambda sizes, repeats, out, reference: seen.update(
        ops=(sizes, repeats, out, reference)))
    monkeypatch.setattr(pipeline, "bench_pipeline", lambda cfg, overrides, steps, rounds, out: seen.update(
        pipeline=(cfg, overrides, steps, rounds, out)))
    assert cli.main(["bench", "ops", "--sizes", "small", "--no-reference"]) == 0
    assert seen["ops"] == (["small"], 3, None, False)
    assert cli.main(["bench", "pipeline", "--steps", "4", "model.dim=16", "--set", "train.lr=0.01"]) == 0
    assert seen["pipeline"] == (None, ["train.lr=0.01", "model.dim=16"], 4, 3, None)
    # a bad override of a config benchmark: one line before any work
    assert cli.main(["bench", "pipeline", "model.dim=big"]) == 2
    with pytest.raises(SystemExit) as e:     # overrides for a benchmark without a config
        cli.main(["bench", "ops", "model.dim=16"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):          # another benchmark's flag
        cli.main(["bench", "train", "--gr-batch-shapes", "1,2"])
