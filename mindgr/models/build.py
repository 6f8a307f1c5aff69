"""The registered models, and building the configured encoder through the registry."""
from mindgr.models import fuxi, generative, hstu, sasrec
from mindgr.models.registry import ModelSpec, check_encoder, model_spec, register_model

# One line per model (mindgr.models.registry documents the entry and the encoder contract).
register_model(ModelSpec("hstu", hstu.build, hstu.encoder_flops, uses_timestamps=True))
register_model(ModelSpec("sasrec", sasrec.build, sasrec.encoder_flops))
register_model(ModelSpec("fuxi", fuxi.build, fuxi.encoder_flops, uses_timestamps=True))
register_model(ModelSpec("gr", generative.build, generative.encoder_flops))  # the GR decoder: see generative.py


def build_encoder(model_cfg, num_items: int, max_len: int, seed: int, item_init=None):
    """The `model.arch` encoder; `item_init(rng, shape, std)` replaces the item table's draw (default:
    the model's own, a truncated normal). Unknown arch: ConfigError listing the registered models."""
    spec = model_spec(model_cfg.arch)
    encoder = spec.build(model_cfg, num_items, max_len, seed, item_init)
    check_encoder(encoder, spec.name)
    return encoder
