"""GRPO-SR's cells: group-relative policy optimisation of the GR decoder with an NLL (supervised) regulariser.

One jagged batch holds two kinds of rows, packed at fixed capacities (one compiled graph per shape):
- rollout rows: a prompt + the codes 0..Lt-2 of one generated candidate; their target positions carry the
  candidate's codes and `cand`, the candidate's index (C, a spare slot, on every other token). A
  candidate's sequence log-probability is minus the sum of its Lt code cross-entropies (the level-masked
  log-softmax of the NTP loss): teacher forcing over the generated code tuple.
- NLL rows: the GR task's own NTP rows of the prompts' users (point-wise or page-wise, as the initial run
  was trained), with their loss weights `weight` (0 on rollout rows).
One decoder pass over both gives the candidates' log-probs and the NTP loss.

The objective (per prompt g with G candidates i, advantages A, old-policy and reference log-probs):
    L = mean_g [ -rho/G sum_i min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i) + beta/G sum_i k3_i ] + lambda * NLL
with rho the policy term's weight (1; 0 leaves the KL and NLL terms alone, an ablation),
r_i = exp(logp_i - old_i) and the KL to the frozen initial policy by the k3 estimator
    k3_i = exp(ref_i - logp_i) - (ref_i - logp_i) - 1   (>= 0, unbiased for KL(current || ref) on samples).
`cand_w` carries 1 / (G * prompts) for a real candidate and 0 for a padded one, so sums are the means above.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgr.models.ntp import NTPLoss

# the rollout batch's arrays, in the cells' order (before the per-candidate arrays)
ROLLOUT_KEYS = ("slots", "merged", "offsets", "target", "group", "weight", "cand")


def policy_terms(logp, old_logp, ref_logp, adv, cand_w, clip_eps: float):
    """(surrogate, k3 KL, clip fraction) summed with weights cand_w over the candidates [C]."""
    ratio = ops.exp(logp - old_logp)
    clipped = ops.clip_by_value(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate = (cand_w * ops.minimum(ratio * adv, clipped * adv)).sum()
    log_r = ref_logp - logp
    kl = (cand_w * (ops.exp(log_r) - log_r - 1.0)).sum()
    outside = (ops.abs(ratio - 1.0) > clip_eps).astype(ms.float32)
    total = cand_w.sum()
    clip_frac = (cand_w * outside).sum() / ops.maximum(total, ops.ones_like(total) * 1e-12)
    return surrogate, kl, clip_frac


class PolicyObjective(nn.Cell):
    """The policy part of the loss from given log-probs: -surrogate + beta * KL (its gradient w.r.t. logp is
    what the decoder receives through the candidates; tests check it against numpy)."""

    def __init__(self, clip_eps: float, beta: float):
        super().__init__()
        self.clip_eps, self.beta = float(clip_eps), float(beta)

    def construct(self, logp, old_logp, ref_logp, adv, cand_w):
        surrogate, kl, _ = policy_terms(logp, old_logp, ref_logp, adv, cand_w, self.clip_eps)
        return -surrogate + self.beta * kl


class CandidateLogProbs(NTPLoss):
    """log p(candidate | prompt) [C] of every candidate of a rollout batch (no dropout): the forward pass the
    rollout records the old-policy and reference log-probs with."""

    def __init__(self, decoder, num_candidates: int):
        super().__init__(decoder)
        self.num_candidates = int(num_candidates)

    def candidate_log_probs(self, ce, cand):
        """-sum of each candidate's code cross-entropies; tokens of no candidate go to the spare slot C."""
        return -ops.unsorted_segment_sum(ce, cand, self.num_candidates + 1)[: self.num_candidates]

    def construct(self, slots, merged, offsets, target, group, weight, cand):
        return self.candidate_log_probs(self.token_losses(slots, merged, offsets, target, group), cand)


class GRPOLoss(CandidateLogProbs):
    """The GRPO-SR loss of a rollout batch -> (loss, surrogate, KL, NLL, clip fraction); the NLL is the GR
    run's NTP loss (NTPLoss.weighted_mean over the NLL rows' weights)."""

    def __init__(self, decoder, num_candidates: int, clip_eps: float, beta: float, nll_weight: float,
                 policy_weight: float = 1.0):
        super().__init__(decoder, num_candidates)
        self.clip_eps, self.beta, self.nll_weight = float(clip_eps), float(beta), float(nll_weight)
        self.policy_weight = float(policy_weight)

    def construct(self, slots, merged, offsets, target, group, weight, cand, old_logp, ref_logp, adv, cand_w):
        ce = self.token_losses(slots, merged, offsets, target, group)
        nll = self.weighted_mean(ce, weight)
        logp = self.candidate_log_probs(ce, cand)
        surrogate, kl, clip_frac = policy_terms(logp, old_logp, ref_logp, adv, cand_w, self.clip_eps)
        loss = -self.policy_weight * surrogate + self.beta * kl + self.nll_weight * nll
        return loss, surrogate, kl, nll, clip_frac


class AlignStep(nn.Cell):
    """One optimizer update of GRPOLoss -> (loss, surrogate, KL, NLL, clip fraction). Its attributes are
    named as the GR task's TrainStep (loss_net.decoder, optimizer), so an aligned run's checkpoint loads
    wherever a GR run's does (eval, serve, export)."""

    def __init__(self, loss_net: GRPOLoss, optimizer):
        super().__init__()
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters, has_aux=True)

    def construct(self, *inputs):
        out, grads = self.grad_fn(*inputs)
        self.optimizer(grads)
        return out
