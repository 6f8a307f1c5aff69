"""Model FLOPs per training step, counted from shapes, and MFU.

Conventions (every model's `encoder_flops` and every objective's `flops` follow them):
  1 multiply-add = 2 FLOPs, counted per real token (never the padded capacity).
  Encoder:      each registered model counts its blocks (ModelSpec.encoder_flops, mindgr.models.registry;
                e.g. HSTU in mindgr/models/hstu.py, SASRec in mindgr/models/sasrec.py); attention counts
                the causal half of each row, diagonal included: L*(L+1)/2 pairs for a row of length L.
  Loss:         the objective's (ObjectiveSpec.flops, mindgr.models.objectives): for the sampled softmax
                the logits the model needs, 2*D*(R+1) per token with a target (whatever way they are computed).
  Not counted:  LayerNorm, SiLU, biases, softmax, embedding gathers, optimizer (all O(T*D)).
  Backward = 2 x forward, so a training step = 3 x forward.
"""
from __future__ import annotations

from mindgr.models import model_spec  # the package registers the built-in models
from mindgr.models.objectives import objective_spec


def forward_flops(model_cfg, lengths, num_targets: int, num_negatives: int) -> float:
    blocks = model_spec(model_cfg.arch).encoder_flops(model_cfg, lengths)
    return blocks + objective_spec().flops(model_cfg, num_targets, num_negatives)


def train_flops(model_cfg, lengths, num_targets: int, num_negatives: int) -> float:
    return 3.0 * forward_flops(model_cfg, lengths, num_targets, num_negatives)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    if seconds <= 0 or peak_flops_per_s <= 0:
        return 0.0
    return flops / seconds / peak_flops_per_s
