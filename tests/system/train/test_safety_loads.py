"""Every load path checks the model: a checkpoint with non-finite weights is refused in one line by eval
(HSTU and GR), recommend, serve, export and resume; an edited checkpoint sidecar is refused; a full disk
during a save is one line."""
import errno
import json
import shutil

import numpy as np
import pytest

from gr_fixtures import random_codes_file
from mindgr.config import load_config
from mindgr.train.checkpoint import (CheckpointError, CheckpointManager, load_checkpoint, nonfinite_reason,
                                     read_sidecar, save_checkpoint)

# two tiny trained runs (HSTU and GR) and a command per load path (~2 min); graph mode for the GR decoder
pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]


def _clean_meta(meta):
    return {k: v for k, v in meta.items() if k not in ("weights", "sha256", "bytes", "sidecar_sha256")}


def _poison(path, value=np.nan):
    """Rewrite checkpoint `path` (a valid one: sizes and checksums match) with one non-finite weight."""
    tensors, meta = load_checkpoint(path)
    name = next(n for n, v in tensors.items() if v.dtype.kind == "f" and v.size > 1 and "learning_rate" not in n)
    bad = tensors[name].copy()
    bad.flat[1] = value
    save_checkpoint(path, dict(tensors, **{name: bad}), _clean_meta(meta))
    return name


def _one_line(capsys, code, want):
    out, err = capsys.readouterr()
    ours = [line for line in err.splitlines() if line.startswith("mindgr:")]
    assert code == 1 and len(ours) == 1 and ours[0].startswith("mindgr: error:"), (code, err[-2000:])
    assert "Traceback" not in err
    for w in want:
        assert w in ours[0], (w, ours[0])
    return ours[0], out


# ---- the shared check, as a unit ------------------------------------------------------------------------

@pytest.mark.parametrize("value, words", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf"),
                                          (3e25, "beyond")])
def test_a_non_finite_or_overflowing_checkpoint_is_refused_on_load(tmp_path, value, words):
    w = np.ones((4, 3), np.float32)
    save_checkpoint(tmp_path / "ck", {"layer.w": w, "steps": np.arange(3, dtype=np.int32)}, {"step": 1})
    load_checkpoint(tmp_path / "ck")                        # a clean one loads
    w[2, 1] = value
    save_checkpoint(tmp_path / "ck", {"layer.w": w, "steps": np.arange(3, dtype=np.int32)}, {"step": 1})
    with pytest.raises(CheckpointError, match=words) as e:
        load_checkpoint(tmp_path / "ck")
    assert "layer.w" in str(e.value) and "\n" not in str(e.value)
    assert nonfinite_reason({"layer.w": w}) is not None and nonfinite_reason({"x": np.ones(3)}) is None


# ---- sidecar fields under the checksum ------------------------------------------------------------------

def test_an_edited_sidecar_is_refused_and_an_old_one_still_loads(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    path = mgr.save(4, {"w": np.arange(6, dtype=np.float32)}, {"epoch": 0, "next_batch": 4})
    sidecar = path.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    assert "sidecar_sha256" in meta and read_sidecar(path)["next_batch"] == 4
    sidecar.write_text(json.dumps(dict(meta, next_batch=0), indent=1, sort_keys=True))
    with pytest.raises(CheckpointError, match="edited") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value) and sidecar.name in str(e.value)
    # a sidecar written before the field existed (no sidecar_sha256) is read as before
    sidecar.write_text(json.dumps({k: v for k, v in meta.items() if k != "sidecar_sha256"}))
    tensors, got = load_checkpoint(path)
    assert got["next_batch"] == 4 and tensors["w"][5] == 5


# ---- HSTU: eval, recommend, serve, export, resume ----------------------------------------------------------

@pytest.fixture(scope="module")
def hstu_run(tmp_path_factory):
    """A tiny trained HSTU run with a best and a latest checkpoint (pristine: tests copy it)."""
    from mindgr.train.trainer import Trainer
    out = tmp_path_factory.mktemp("hstu")
    overrides = [f"run.out_dir={out}", "run.name=tiny", "run.log_every=2", "data.kind=synthetic",
                 "data.max_len=20", "data.synthetic.num_users=120", "data.synthetic.num_items=60",
                 "data.synthetic.median_len=10", "data.synthetic.max_len=20", "model.dim=16", "model.num_blocks=1",
                 "model.num_heads=2", "loss.num_negatives=8", "train.batch_size=16", "train.epochs=1",
                 "eval.every_epochs=1", "ops.backend=reference"]
    Trainer(load_config(None, overrides), quiet=True).fit()
    return out / "tiny", overrides


def _copy(run, tmp_path):
    dst = tmp_path / run.name
    shutil.copytree(run, dst)
    cfg = dst / "config.yaml"      # the run dir moved: its config names the new place
    cfg.write_text(cfg.read_text().replace(str(run.parent), str(tmp_path)))
    return dst


def test_hstu_non_finite_checkpoint_is_refused_by_every_load_path(hstu_run, tmp_path, capsys):
    from mindgr.cli import main
    src, overrides = hstu_run
    run = _copy(src, tmp_path)
    ckpts = CheckpointManager(run, 2)
    _poison(ckpts.best())
    _poison(ckpts.latest(), np.inf)
    users = tmp_path / "users.txt"
    users.write_text("1 2 3\n")
    capsys.readouterr()
    commands = [["eval", "--run", run], ["eval", "--run", run, "--checkpoint", "latest"],
                ["recommend", "--run", run, "--user-history", "1 2 3"],
                ["export", "--run", run, "--out", tmp_path / "export"],
                ["serve", "--run", run, "--port", "1"]]
    for args in commands:
        _one_line(capsys, main([str(a) for a in args]), ["non-finite", "checkpoint"])
    assert not (tmp_path / "export" / "manifest.json").exists()
    resume = [o if not o.startswith("run.out_dir=") else f"run.out_dir={tmp_path}" for o in overrides]
    _one_line(capsys, main(["train", *resume, "train.epochs=2", "--resume"]),
              ["non-finite", "ckpt-step"])


def test_resume_refuses_an_edited_next_batch(hstu_run, tmp_path, capsys):
    from mindgr.cli import main
    src, overrides = hstu_run
    run = _copy(src, tmp_path)
    sidecar = CheckpointManager(run, 2).latest().with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps(dict(meta, next_batch=meta["next_batch"] + 1), indent=1, sort_keys=True))
    resume = [o if not o.startswith("run.out_dir=") else f"run.out_dir={tmp_path}" for o in overrides]
    capsys.readouterr()
    _one_line(capsys, main(["train", *resume, "train.epochs=2", "--resume"]), ["edited", sidecar.name])


# ---- GR: eval, recommend, export, serve --------------------------------------------------------------------

SYNTH = ["data.kind=synthetic", "data.max_len=12", "data.synthetic.num_users=80", "data.synthetic.num_items=40",
         "data.synthetic.median_len=8", "data.synthetic.max_len=16", "data.synthetic.num_clusters=4"]
LEVELS = [5, 5, 3]


@pytest.fixture(scope="module")
def gr_run(tmp_path_factory):
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("gr")
    store, codes, path = random_codes_file(out, SYNTH, LEVELS)
    cfg = load_config(None, [f"run.out_dir={out}", "run.name=gr", *SYNTH, "model.arch=gr", "model.dim=16",
                             "model.num_blocks=1", "model.num_heads=2", "loss.objective=ntp",
                             "train.batch_size=16", "train.epochs=1", "eval.every_epochs=1", "eval.ks=[1,5]",
                             "eval.beam=5", "eval.max_users=10", "ids.from_run=", f"ids.codes={path}",
                             "ops.backend=cpu"])
    GenerativeTrainer(cfg, quiet=True).fit()
    return out / "gr", store


def test_gr_non_finite_checkpoint_is_refused_by_every_load_path(gr_run, tmp_path, capsys):
    from mindgr.cli import main
    run, store = gr_run
    best = CheckpointManager(run, 2).best()
    pristine = {p.name: p.read_bytes() for p in best.parent.iterdir()}
    try:
        _poison(best)
        raw = " ".join(str(int(store.item_raw_ids[i])) for i in (1, 2, 3))
        capsys.readouterr()
        for args in (["eval", "--run", run], ["recommend", "--run", run, "--user-history", raw, "--k", "3"],
                     ["export", "--run", run, "--out", tmp_path / "export"], ["serve", "--run", run, "--port", "1"]):
            _one_line(capsys, main([str(a) for a in args]), ["non-finite", "checkpoint"])
        assert not (tmp_path / "export" / "manifest.json").exists()
    finally:
        for p in best.parent.iterdir():
            p.unlink()
        for name, data in pristine.items():
            (best.parent / name).write_bytes(data)


# ---- export checksums ---------------------------------------------------------------------------------------

def test_hstu_export_carries_checksums_and_a_tampered_file_is_refused(hstu_run, tmp_path, capsys):
    from mindgr.cli import main
    from mindgr.serve.export import ExportError, load_export
    run, _ = hstu_run
    out = tmp_path / "export"
    assert main(["export", "--run", str(run), "--out", str(out), "--batch-shapes", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["sha256"]) == {"encoder-r1.mindir", "item_table.npy", "item_raw_ids.npy"}
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    load_export(out)
    table = np.load(out / "item_table.npy")
    table[1, 0] += 0.5
    np.save(out / "item_table.npy", table)                  # a well-formed file, other numbers
    with pytest.raises(ExportError) as e:
        load_export(out)
    assert "item_table.npy" in str(e.value) and "\n" not in str(e.value)


# ---- a full disk during a save -----------------------------------------------------------------------------

def test_atomic_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    import mindgr.paths as paths
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")          # a write() names no file
    with pytest.raises(OSError) as e:
        paths.atomic_write(target, full)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.npz"]

    def library_error(tmp):                                              # a writer's own exception type
        open(tmp, "wb").write(b"part")
        raise RuntimeError("Failed to save the checkpoint file\n(C++ stack)")
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda d: type("U", (), {"free": 4096})())
    with pytest.raises(OSError) as e:
        paths.atomic_write(target, library_error)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.npz"]
    monkeypatch.undo()
    with pytest.raises(RuntimeError):                                    # disk not full: the error as it was
        paths.atomic_write(target, library_error)


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_any_save_is_one_line(hstu_run, tmp_path, monkeypatch, capsys):
    import mindspore as ms
    from mindgr.cli import main
    src, overrides = hstu_run
    run = _copy(src, tmp_path)
    latest = CheckpointManager(run, 2).latest()
    capsys.readouterr()
    with monkeypatch.context() as m:                    # checkpoint save (resume: the next checkpoint)
        m.setattr(ms, "save_checkpoint", _enospc)
        resume = [o if not o.startswith("run.out_dir=") else f"run.out_dir={tmp_path}" for o in overrides]
        line, _ = _one_line(capsys, main(["train", *resume, "train.epochs=2", "--resume"]),
                            ["no space left on device", "existing checkpoints and outputs are intact"])
        assert str(run / "checkpoints") in line
    load_checkpoint(latest)                             # the checkpoint it would have replaced is whole
    with monkeypatch.context() as m:                    # eval: its ranks file
        m.setattr(np, "savez", _enospc)
        line, _ = _one_line(capsys, main(["eval", "--run", str(run)]), ["no space left on device", "intact"])
        assert str(run / "ranks") in line
    with monkeypatch.context() as m:                    # export: its arrays
        m.setattr(np, "save", _enospc)
        line, _ = _one_line(capsys, main(["export", "--run", str(run), "--out", str(tmp_path / "x"),
                                          "--batch-shapes", "1"]), ["no space left on device", "intact"])
        assert str(tmp_path / "x" / "item_table.npy") in line
