"""The model and objective registries: typed entries, the encoder contract checked, unknown names as
one-line config errors, FLOPs from the model's entry."""
import numpy as np
import pytest

from mindspore import nn

from mindgr.config import Config, ConfigError, load_config
from mindgr.models import HSTU, SASRec, build_encoder, model_names, model_spec
from mindgr.models.layers import param
from mindgr.models.losses import SampledSoftmaxLoss, SharedNegativesLoss
from mindgr.models.objectives import build_objective, objective_names
from mindgr.models.registry import ModelContractError, ModelSpec, register_model, unregister_model
from mindgr.train.flops import forward_flops


def test_builtin_models_are_registered_and_build_their_encoders():
    assert {"hstu", "sasrec"} <= set(model_names())
    cfg = Config().model
    assert isinstance(build_encoder(cfg, 30, 12, 0), HSTU)
    cfg.arch = "sasrec"
    assert isinstance(build_encoder(cfg, 30, 12, 0), SASRec)


def test_item_init_reaches_the_table():
    cfg = Config().model
    enc = build_encoder(cfg, 9, 8, 0, item_init=lambda rng, shape, std: np.full(shape, 0.5, np.float32))
    np.testing.assert_array_equal(enc.item_emb.asnumpy(), np.full((10, cfg.dim), 0.5, np.float32))


def test_unknown_arch_is_one_config_line_listing_the_choices():
    cfg = load_config(None, ["model.arch=gpt"])     # config cannot import models: checked at build
    with pytest.raises(ConfigError) as e:
        build_encoder(cfg.model, 10, 8, 0)
    msg = str(e.value)
    assert "\n" not in msg and "model.arch = 'gpt'" in msg and "hstu, sasrec" in msg


def test_trainer_rejects_unknown_arch_before_loading_data(tiny_overrides):
    from mindgr.train.trainer import Trainer
    cfg = load_config(None, tiny_overrides + ["model.arch=gpt", "data.kind=movielens-1m", "data.path=/nonexistent"])
    with pytest.raises(ConfigError, match="model.arch = 'gpt' is not a registered model"):
        Trainer(cfg, quiet=True)


class _NoEncode(nn.Cell):
    """Has an item table and a construct, but no encode(): the sharded trainer could not use it."""

    def __init__(self, num_items, dim):
        super().__init__()
        self.item_emb = param(np.zeros((num_items + 1, dim), np.float32), "item_emb")
        self.dropout_sites, self.dropout_width = 1, dim

    def item_table(self):
        return self.item_emb

    def construct(self, ids, positions, offsets, timestamps, drop=None, request_times=None):
        return self.item_emb[ids]


def _bad_build(model_cfg, num_items, max_len, seed, item_init=None):
    return _NoEncode(num_items, model_cfg.dim)


def _flops(model_cfg, lengths):
    return 1.0


def test_an_encoder_breaking_the_contract_is_a_clear_error():
    register_model(ModelSpec("no_encode", _bad_build, _flops))
    try:
        cfg = Config().model
        cfg.arch = "no_encode"
        with pytest.raises(ModelContractError) as e:
            build_encoder(cfg, 5, 4, 0)
        msg = str(e.value)
        assert "\n" not in msg and "'no_encode'" in msg and "_NoEncode" in msg and "encode(item_vectors" in msg
    finally:
        unregister_model("no_encode")
    assert "no_encode" not in model_names()


@pytest.mark.parametrize("spec, words", [
    (ModelSpec("x", lambda cfg, n: None, _flops), ["'x'", "build must take (model_cfg, num_items"]),
    (ModelSpec("x", _bad_build, lambda cfg: 0.0), ["'x'", "encoder_flops must take (model_cfg, lengths)"]),
    (ModelSpec("hstu", _bad_build, _flops), ["'hstu' is already registered"]),
    (("x", _bad_build, _flops), ["needs a ModelSpec"]),
])
def test_malformed_registrations_are_refused(spec, words):
    with pytest.raises(ModelContractError) as e:
        register_model(spec)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert "x" not in model_names()


def test_flops_come_from_the_models_entry():
    cfg = Config().model
    lengths = np.array([3, 5, 0])
    for arch in ("hstu", "sasrec"):
        cfg.arch = arch
        blocks = model_spec(arch).encoder_flops(cfg, lengths)
        assert blocks > 0
        assert forward_flops(cfg, lengths, 4, 7) == blocks + 2.0 * cfg.dim * 8 * 4
    register_model(ModelSpec("flat", _bad_build, lambda model_cfg, lengths: 1000.0 * np.sum(lengths)))
    try:
        cfg.arch = "flat"
        assert forward_flops(cfg, lengths, 0, 7) == 8000.0
    finally:
        unregister_model("flat")


@pytest.mark.parametrize("negatives, cls", [("per_token", SampledSoftmaxLoss), ("shared_pool", SharedNegativesLoss),
                                            ("in_batch", SharedNegativesLoss), ("mixed", SharedNegativesLoss)])
def test_objective_builds_the_loss_of_each_negatives_shape(negatives, cls):
    cfg = load_config(None, [f"loss.negatives={negatives}", "loss.num_negatives=4"])
    enc = build_encoder(cfg.model, 20, 8, 0)
    loss = build_objective(cfg, enc, 20)
    assert type(loss) is cls and loss.encoder is enc
    if cls is SampledSoftmaxLoss:
        assert loss.score_all          # 21 items <= 64 * 4: score the whole table
    assert {"sampled_softmax", "ntp", "page_ntp"} <= set(objective_names())


def test_cli_unknown_arch_is_one_line_exit_2(tmp_path):
    from cli_fixtures import one_line_error, run
    p = run("train", "--config", "configs/smoke.yaml", "model.arch=gpt", f"run.out_dir={tmp_path}")
    one_line_error(p, 2, "model.arch = 'gpt'", "hstu, sasrec")
    assert not (tmp_path / "smoke" / "metrics.jsonl").exists()
