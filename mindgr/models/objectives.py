"""The objective registry: what the encoder is trained to predict, as a loss cell, and its FLOPs.

An entry is ObjectiveSpec(name, build, flops):
    build(cfg, encoder, num_items) -> nn.Cell, the loss network the train step differentiates; its
        construct takes the step inputs (ids, positions, offsets, timestamps, targets, *negatives, drop)
    flops(model_cfg, num_targets, num_candidates) -> float, forward FLOPs of the loss for one step
`build_objective(cfg, encoder, num_items)` builds the configured one.

Registered today: `sampled_softmax`, the sampled softmax on cosine similarity (mindgr.models.losses) in
the shapes of config `loss.negatives`: per_token -> SampledSoftmaxLoss ([T, R] negatives, scored through
the whole table when the catalogue is small: use_score_all); shared_pool / in_batch / mixed ->
SharedNegativesLoss (one candidate set per batch, logQ-corrected).

`loss.objective` chooses the entry. Also registered: next-token prediction over semantic IDs
(mindgr.models.ntp), for the generative decoder (model.arch gr): `ntp` (point-wise) and `page_ntp`
(page-wise). Their `build` gets the GRDecoder as `encoder` and their `flops` count the code logits,
2*D*C per token with C = the codes of every level (passed as num_candidates). An entry's `generative`
says which kind of model it trains: item encoders (False) or the GR decoder (True);
`check_objective_arch` refuses a mismatch in one line. `rating` (mindgr.models.rating) is the reward
model's regression on observed values (the reward task, mindgr.train.reward).
`grpo_sr`: GRPO-SR preference alignment of a trained GR decoder (mindgr.models.grpo, trained by
mindgr.train.alignment).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mindgr.config import ConfigError
from mindgr.models.losses import SampledSoftmaxLoss, SharedNegativesLoss, use_score_all


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    build: Callable
    flops: Callable
    generative: bool = False                  # trains the GR decoder (model.arch gr), not an item encoder


_OBJECTIVES: dict[str, ObjectiveSpec] = {}
DEFAULT = "sampled_softmax"


def register_objective(spec: ObjectiveSpec) -> ObjectiveSpec:
    if spec.name in _OBJECTIVES and _OBJECTIVES[spec.name] != spec:
        raise ValueError(f"objective {spec.name!r} is already registered")
    _OBJECTIVES[spec.name] = spec
    return spec


def objective_names() -> tuple:
    return tuple(sorted(_OBJECTIVES))


def objective_spec(name: str = DEFAULT) -> ObjectiveSpec:
    spec = _OBJECTIVES.get(name)
    if spec is None:
        raise ConfigError(f"config: objective {name!r} is not registered (choose one of "
                          f"{', '.join(objective_names())})")
    return spec


def build_objective(cfg, encoder, num_items: int):
    """The loss cell of the configured objective over `encoder`."""
    return objective_spec(cfg.loss.objective).build(cfg, encoder, num_items)


GENERATIVE_ARCH = "gr"


def check_objective_arch(cfg):
    """One-line ConfigError if loss.objective and model.arch are of different kinds (an encoder objective
    for the GR decoder, or next-token prediction for an item encoder)."""
    spec = objective_spec(cfg.loss.objective)
    gr = cfg.model.arch == GENERATIVE_ARCH
    if spec.generative and not gr:
        raise ConfigError(f"config: loss.objective = {spec.name} trains the generative decoder: it needs "
                          f"model.arch = {GENERATIVE_ARCH} (got {cfg.model.arch})")
    if cfg.model.trie_softmax and not gr:
        raise ConfigError(f"config: model.trie_softmax is the generative decoder's scoring rule: it needs "
                          f"model.arch = {GENERATIVE_ARCH} (got {cfg.model.arch})")
    if cfg.model.backbone != "hstu" and not gr:
        raise ConfigError(f"config: model.backbone = {cfg.model.backbone} is a backbone of the generative decoder "
                          f"(model.arch {GENERATIVE_ARCH}), not of model.arch {cfg.model.arch}")
    if gr and not spec.generative:
        gen = ", ".join(n for n in objective_names() if _OBJECTIVES[n].generative)
        raise ConfigError(f"config: model.arch = {GENERATIVE_ARCH} is trained by next-token prediction: set "
                          f"loss.objective to one of {gen} (got {spec.name})")
    return spec


def _build_sampled_softmax(cfg, encoder, num_items: int):
    loss = cfg.loss
    if loss.negatives == "per_token":
        return SampledSoftmaxLoss(encoder, loss.temperature, use_score_all(num_items, loss.num_negatives))
    return SharedNegativesLoss(encoder, loss.temperature, loss.fp16_negatives)  # one candidate set per batch


def _sampled_softmax_flops(model_cfg, num_targets: int, num_candidates: int) -> float:
    """The logits the model needs: 2*D*(R+1) per token with a target, whatever way they are computed."""
    return 2.0 * model_cfg.dim * (num_candidates + 1) * num_targets


register_objective(ObjectiveSpec(DEFAULT, _build_sampled_softmax, _sampled_softmax_flops))


def _build_ntp(cfg, encoder, num_items: int):
    from mindgr.models.ntp import NTPLoss
    return NTPLoss(encoder)


def _ntp_flops(model_cfg, num_targets: int, num_candidates: int) -> float:
    """The head: logits over every level's codes (num_candidates = C) at each of num_targets tokens."""
    return 2.0 * model_cfg.dim * num_candidates * num_targets


register_objective(ObjectiveSpec("ntp", _build_ntp, _ntp_flops, generative=True))
register_objective(ObjectiveSpec("page_ntp", _build_ntp, _ntp_flops, generative=True))


def _build_rating(cfg, encoder, num_items: int):
    from mindgr.models.rating import build_rating
    return build_rating(cfg, encoder, num_items)


def _rating_flops(model_cfg, num_targets: int, num_candidates: int) -> float:
    from mindgr.models.rating import rating_flops
    return rating_flops(model_cfg, num_targets, num_candidates)


# the reward model (mindgr.models.rating, trained by the reward task, mindgr.train.reward): an item encoder's
# state and item table -> predicted value of (history, item), mean squared error on the observed values
register_objective(ObjectiveSpec("rating", _build_rating, _rating_flops))


# GRPO-SR (mindgr.models.grpo, trained by mindgr.train.alignment): preference alignment of a trained GR
# decoder. Its step is the alignment task's own; the loss this entry builds is the NTP loss, what loading an
# aligned run's checkpoint (eval, serve, export) needs, as for any GR run.
register_objective(ObjectiveSpec("grpo_sr", _build_ntp, _ntp_flops, generative=True))
