from pathlib import Path

import pytest

from conftest import REPO
from mindgr.config import ConfigError, load_config, parse_override


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  dim: 64\ntrain:\n  lr: 0.01\n")
    cfg = load_config(str(path), ["model.num_heads=4", "train.lr=2e-3", "eval.ks=[5,10]",
                                  "data.synthetic.num_users=10"])
    assert cfg.model.dim == 64 and cfg.model.num_heads == 4
    assert cfg.train.lr == pytest.approx(2e-3)
    assert cfg.eval.ks == [5, 10]
    assert cfg.data.synthetic.num_users == 10
    assert cfg.run_dir.name == "run"


@pytest.mark.parametrize("override, words", [
    ("model.dimm=3", ["unknown key 'model.dimm'", "dim"]),
    ("modle.dim=3", ["unknown key 'modle'"]),
    ("model.dim=abc", ["model.dim", "'abc'", "expected int"]),
    ("model.dropout=1.5", ["model.dropout", "1.5", "<= 0.95"]),
    ("train.lr=0", ["train.lr", "> 0.0"]),
    ("model.time_bias=maybe", ["model.time_bias", "expected bool"]),
    ("eval.ks=[0]", ["eval.ks", ">= 1"]),
    ("model.num_heads=3", ["model.dqk", "not divisible"]),
    ("data.kind=movielens-1m", ["data.path", "needs a source path"]),
    ("data.timestamps=r.dat", ["data.timestamps", "'r.dat'", "only for data.kind movielens-1m", "synthetic"]),
    ("parallel.grad_reduce=nccl", ["parallel.grad_reduce", "'nccl'", "auto, own, mindspore"]),
    ("parallel.grad_buckets=-1", ["parallel.grad_buckets", ">= 0"]),
])
def test_bad_values_name_key_value_and_allowed(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_sharded_table_keeps_the_flat_gradient_sum():
    from mindgr.parallel.dp import reduce_mode
    assert reduce_mode(load_config(None, []).parallel) == "mindspore"
    assert reduce_mode(load_config(None, ["parallel.grad_reduce=own"]).parallel) == "own"
    assert reduce_mode(load_config(None, ["parallel.sparse=flat"]).parallel) == "own"
    assert reduce_mode(load_config(None, []).parallel, one_cpu_host=True) == "host"
    assert reduce_mode(load_config(None, ["parallel.sparse=flat"]).parallel, one_cpu_host=True) == "own"
    assert reduce_mode(load_config(None, ["parallel.grad_reduce=mindspore"]).parallel, one_cpu_host=True) == "mindspore"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["parallel.sparse=flat", "parallel.grad_reduce=mindspore"])
    assert "\n" not in str(e.value) and "parallel.grad_reduce=auto or own" in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    notmap = tmp_path / "list.yaml"
    notmap.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(notmap))


def test_override_syntax():
    assert parse_override("a.b.c=1") == {"a": {"b": {"c": 1}}}
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("nokey")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("dim=3")


SHIPPED = sorted((REPO / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name + "/" + p.name)
def test_shipped_configs_load_and_validate(path):
    """Every config in configs/ parses, names only known keys and passes the cross-key checks (a typo in a
    shipped file would otherwise surface only when someone runs it). Data paths are not opened here."""
    cfg = load_config(str(path))
    assert cfg.train.epochs >= 1 and cfg.model.dim >= 1


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_base_is_refined_section_by_section(tmp_path):
    _write(tmp_path / "a.yaml", "model:\n  dim: 64\n  num_heads: 2\ntrain:\n  lr: 0.01\neval:\n  ks: [1, 10, 50]\n")
    b = _write(tmp_path / "b.yaml", "base: a.yaml\nmodel:\n  num_heads: 4\neval:\n  ks: [5]\n")
    cfg = load_config(b)
    assert cfg.model.dim == 64 and cfg.model.num_heads == 4   # a section is merged key by key
    assert cfg.train.lr == pytest.approx(0.01)                  # a section only the base names is kept
    assert cfg.eval.ks == [5]                                   # a list is replaced whole
    # overrides still come last
    assert load_config(b, ["model.dim=32"]).model.dim == 32


def test_nested_base_and_paths_relative_to_each_file(tmp_path, monkeypatch):
    _write(tmp_path / "root.yaml", "model:\n  dim: 16\n  num_blocks: 3\ntrain:\n  epochs: 2\n")
    _write(tmp_path / "mid" / "mid.yaml", "base: ../root.yaml\nmodel:\n  num_blocks: 5\n")
    leaf = _write(tmp_path / "mid" / "deep" / "leaf.yaml", "base: ../mid.yaml\ntrain:\n  epochs: 7\n")
    cfg = load_config(leaf)
    assert (cfg.model.dim, cfg.model.num_blocks, cfg.train.epochs) == (16, 5, 7)
    # each base is found from the directory of the file naming it, whatever the working directory
    monkeypatch.chdir(tmp_path / "mid" / "deep")
    cfg = load_config("leaf.yaml")
    assert (cfg.model.dim, cfg.model.num_blocks, cfg.train.epochs) == (16, 5, 7)


def test_base_cycle_is_one_line(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\nmodel:\n  dim: 8\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    self_ref = _write(tmp_path / "s.yaml", "base: ./s.yaml\n")
    for path in (str(tmp_path / "a.yaml"), self_ref):
        with pytest.raises(ConfigError, match="cycle") as e:
            load_config(path)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"a.yaml -> b.yaml -> a.yaml"):
        load_config(str(tmp_path / "a.yaml"))


def test_missing_or_bad_base_is_one_line(tmp_path):
    missing = _write(tmp_path / "m.yaml", "base: nope.yaml\n")
    with pytest.raises(ConfigError) as e:
        load_config(missing)
    assert "not found" in str(e.value) and "nope.yaml" in str(e.value) and "\n" not in str(e.value)
    # a missing base deeper in the chain names the file that asks for it
    _write(tmp_path / "top.yaml", "base: m.yaml\n")
    with pytest.raises(ConfigError, match=r"m.yaml: base 'nope.yaml' not found"):
        load_config(str(tmp_path / "top.yaml"))
    for bad in ("base: 3\n", "base: ''\n", "base: [a.yaml]\n"):
        with pytest.raises(ConfigError, match="expected the path of a config file"):
            load_config(_write(tmp_path / "bad.yaml", bad))
    # a base that is not a mapping, or names an unknown key, fails as the file itself would
    _write(tmp_path / "list.yaml", "- 1\n")
    with pytest.raises(ConfigError, match="list.yaml: expected a mapping"):
        load_config(_write(tmp_path / "on-list.yaml", "base: list.yaml\n"))
    _write(tmp_path / "typo.yaml", "model:\n  dimm: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'model.dimm'"):
        load_config(_write(tmp_path / "on-typo.yaml", "base: typo.yaml\n"))


def test_shipped_refinement_changes_only_what_it_names():
    """configs/ml-1m/hstu-large.yaml is hstu.yaml with 8 blocks and 2 heads, nothing else."""
    root = REPO / "configs" / "ml-1m"
    base, large = load_config(str(root / "hstu.yaml")).to_dict(), load_config(str(root / "hstu-large.yaml")).to_dict()
    assert (large["model"]["num_blocks"], large["model"]["num_heads"], large["run"]["name"]) == (8, 2, "ml-1m-hstu-large")
    for key, value in (("num_blocks", 2), ("num_heads", 1)):
        large["model"][key] = value
    large["run"]["name"] = "ml-1m-hstu"
    assert large == base
