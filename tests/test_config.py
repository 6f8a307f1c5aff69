from pathlib import Path

import pytest

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
])
def test_bad_values_name_key_value_and_allowed(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


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


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name + "/" + p.name)
def test_shipped_configs_load_and_validate(path):
    """Every config in configs/ parses, names only known keys and passes the cross-key checks (a typo in a
    shipped file would otherwise surface only when someone runs it). Data paths are not opened here."""
    cfg = load_config(str(path))
    assert cfg.train.epochs >= 1 and cfg.model.dim >= 1
