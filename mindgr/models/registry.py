"""The model registry: `model.arch` -> a ModelSpec that builds the encoder and counts its FLOPs.

An entry is ModelSpec(name, build, encoder_flops, uses_timestamps=False):
    build(model_cfg, num_items, max_len, seed, item_init=None) -> nn.Cell (the encoder)
        item_init(rng, shape, std), when given, replaces the item table's draw (a sharded table keeps
        only its own rows, mindgr.parallel.sparse.init); None = the model's default draw.
    encoder_flops(model_cfg, lengths) -> float
        forward FLOPs of the encoder blocks for rows of these lengths (np.ndarray); the loss's FLOPs are
        the objective's (mindgr.models.objectives), the conventions are in mindgr.train.flops.
    uses_timestamps
        True when the model reads the tokens' timestamps (a time bias, model.time_bias): the data must
        then have them (mindgr.train.data refuses data without timestamps when model.time_bias is on).
Adding a model = its file (with module-level `build` and `encoder_flops`) + one `register_model` line in
mindgr/models/build.py + a config.

The encoder contract (what the trainers, losses and evaluation rely on; checked by `check_encoder` on
every encoder `build_encoder` returns):
    item_emb          Parameter [num_items + 1, D]: the item table, row 0 = padding. The sharded-table
                      trainer replaces the gather from it (it looks the parameter up by this name).
    item_table()      -> [num_items + 1, D] the table the logits are taken against (unit rows today).
    construct(ids, positions, offsets, timestamps, drop=None, request_times=None) -> [T, D]
                      jagged tokens: ids/positions [T] int32, offsets [B+1] int32, timestamps [T] int64,
                      drop the host-drawn dropout masks [dropout_sites, T, dropout_width] (None = eval),
                      request_times [B] int64: when each row's next item is requested (training: the
                      last target's time; evaluation: the held-out target's; serving: the request's).
                      A model with a time bias uses it at each row's last position when
                      model.request_time is on (mindgr.ops.attention); others ignore it.
    encode(item_vectors, positions, offsets, timestamps, drop=None, request_times=None) -> [T, D]
                      the same from already gathered item vectors [T, D] (what a sharded table hands in).
    dropout_sites     int: how many [T, dropout_width] masks one step draws.
    dropout_width     int: the width of each mask (the widest dropout site).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from mindgr.config import ConfigError


class ModelContractError(TypeError):
    """A registered model (or the encoder it builds) does not meet the contract above; one line."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable
    encoder_flops: Callable
    uses_timestamps: bool = False


_BUILD_PARAMS = ("model_cfg", "num_items", "max_len", "seed", "item_init")
_FLOPS_PARAMS = ("model_cfg", "lengths")
_CALL_PARAMS = ("ids", "positions", "offsets", "timestamps", "drop", "request_times")
_ENCODE_PARAMS = ("item_vectors", "positions", "offsets", "timestamps", "drop", "request_times")
_MODELS: dict[str, ModelSpec] = {}


def _params(fn) -> tuple:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add `spec` under spec.name; its callables must have the signatures above."""
    if not isinstance(spec, ModelSpec) or not spec.name or not isinstance(spec.name, str):
        raise ModelContractError(f"register_model needs a ModelSpec with a name, got {spec!r}")
    for what, fn, want in (("build", spec.build, _BUILD_PARAMS), ("encoder_flops", spec.encoder_flops, _FLOPS_PARAMS)):
        if not callable(fn) or _params(fn) != want:
            got = _params(fn) if callable(fn) else type(fn).__name__
            raise ModelContractError(f"model {spec.name!r}: {what} must take ({', '.join(want)}), got {got}")
    if spec.name in _MODELS and _MODELS[spec.name] != spec:
        raise ModelContractError(f"model {spec.name!r} is already registered")
    _MODELS[spec.name] = spec
    return spec


def unregister_model(name: str):
    _MODELS.pop(name, None)


def model_names() -> tuple:
    return tuple(sorted(_MODELS))


def model_spec(arch: str) -> ModelSpec:
    """The entry of `model.arch`, or the one-line config error listing the registered models."""
    spec = _MODELS.get(arch)
    if spec is None:
        raise ConfigError(f"config: model.arch = {arch!r} is not a registered model "
                          f"(choose one of {', '.join(model_names())})")
    return spec


def check_encoder(encoder, name: str):
    """Raise ModelContractError naming the first thing `encoder` lacks (see the contract above)."""
    kind = type(encoder).__name__

    def fail(what):
        raise ModelContractError(f"model {name!r}: its encoder {kind} {what} (the encoder contract: "
                                 "mindgr/models/registry.py)")

    from mindspore import Parameter, nn
    if not isinstance(encoder, nn.Cell):
        fail("is not a mindspore nn.Cell")
    if not isinstance(getattr(encoder, "item_emb", None), Parameter) or len(encoder.item_emb.shape) != 2:
        fail("has no 2-d Parameter item_emb [num_items + 1, D]")
    for attr, want in (("construct", _CALL_PARAMS), ("encode", _ENCODE_PARAMS)):
        fn = getattr(encoder, attr, None)
        if not callable(fn) or _params(fn) != want:
            fail(f"needs {attr}({', '.join(want)})")
    if not callable(getattr(encoder, "item_table", None)) or _params(encoder.item_table):
        fail("needs item_table() taking no arguments")
    for attr in ("dropout_sites", "dropout_width"):
        value = getattr(encoder, attr, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            fail(f"needs an int {attr} >= 1 (got {value!r})")
