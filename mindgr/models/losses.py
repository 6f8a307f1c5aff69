"""Sampled softmax on cosine similarity: every position predicts its next item against negatives.

loss_i = -log( exp(s(o_i, e_target)/tau) / (exp(s(o_i, e_target)/tau) + sum_r exp(s(o_i, e_r)/tau - c_r)) ),
s = cosine similarity, negatives equal to the target (accidental hits) masked out, averaged over the
positions that have a target.

Two shapes of negatives:
- SampledSoftmaxLoss: R negatives per position ([T, R] ids; the published baseline, c_r = 0).
- SharedNegativesLoss: ONE set of K candidates for the whole batch ([K] ids), scored for every position
  (intra-batch logit sharing) through `mindgr.ops.scoring.shared_pool_lse`: the cpu backend streams over
  the candidates in chunks (memory O(T + K), never the [T, K] logits), the reference materialises them
  with one [T, D] x [D, K] matmul. c_r = log(K * q_r) is the logQ correction for candidates drawn from q
  (popularity sampling, in-batch targets), which makes the sum an importance-sampling estimate of the
  full softmax denominator; id 0 marks an unused slot.
"""
import mindspore as ms
from mindspore import nn, ops

from mindgr.ops.scoring import sampled_lse, shared_pool_lse


def sampled_softmax_mean(out, table, targets, negatives, inv_tau: float, score_all: bool):
    """The per-token sampled softmax above, averaged over the positions with a target: out [T, D] and table
    [rows, D] unit vectors, targets [T] and negatives [T, R] row indices of table (0 = no target). Also
    the loss of the sharded layout (mindgr.parallel.sparse.step), where table holds only the batch's rows."""
    tgt = targets.astype(ms.int32)
    valid = (tgt > 0).astype(ms.float32)
    x = out * inv_tau                                                        # logits = x . e
    pos = (x * ops.gather(table, tgt, 0)).sum(-1)                            # [T]
    # mask, log-sum-exp with the positive (fused with the scoring on the cpu backend)
    per_token = sampled_lse(x, table, negatives, tgt, pos, score_all) - pos
    return (per_token * valid).sum() / ops.maximum(valid.sum(), ops.ones_like(valid.sum()))


def shared_negatives_mean(out, table, targets, neg_ids, neg_logq, inv_tau: float, fp16: bool):
    """The shared-candidate sampled softmax above, averaged over the positions with a target: out [T, D] and
    table [rows, D] unit vectors, targets [T] and neg_ids [K] row indices of table (0 = no target / unused
    slot), neg_logq [K] the correction. Also the pool loss of the sharded layout
    (mindgr.parallel.sparse.step), where table holds only the batch's rows."""
    tgt = targets.astype(ms.int32)
    x = out * inv_tau                                                        # logits = x . e
    pos = (x * ops.gather(table, tgt, 0)).sum(-1)                            # [T]
    cand = ops.gather(table, neg_ids, 0)                                     # [K, D]
    if fp16:
        cand = cand.astype(ms.float16)
    # log(exp(pos) + sum over the candidates (masked: id 0, accidental hits) of exp(x . e - logQ))
    lse = shared_pool_lse(x, cand, neg_logq, neg_ids, tgt, pos)
    valid = (tgt > 0).astype(ms.float32)
    per_token = lse - pos
    return (per_token * valid).sum() / ops.maximum(valid.sum(), ops.ones_like(valid.sum()))


def use_score_all(num_items: int, num_negatives: int) -> bool:
    """Score every item with one [T, D] x [D, V] matmul and pick the sampled columns, or gather [T, R, D].

    Measured (docs/ARCHITECTURE.md "Platform facts"): for a catalogue of a few thousand items, scoring all
    items is ~4x faster than materialising [T, R, D]; the gather wins once V is much larger than R.
    """
    return num_items + 1 <= 64 * num_negatives


class SampledSoftmaxLoss(nn.Cell):
    def __init__(self, encoder, temperature: float, score_all: bool):
        super().__init__()
        self.encoder = encoder
        self.inv_tau = 1.0 / temperature
        self.score_all = score_all

    def construct(self, ids, positions, offsets, timestamps, request_times, targets, negatives, drop):
        out = self.encoder(ids, positions, offsets, timestamps, drop, request_times)   # [T, D], unit rows
        table = self.encoder.item_table()                                    # [V+1, D], unit rows
        return sampled_softmax_mean(out, table, targets, negatives, self.inv_tau, self.score_all)


class SharedNegativesLoss(nn.Cell):
    """Sampled softmax against one shared candidate set per batch. `fp16` holds the gathered candidate
    embeddings in float16 (the reference also scores them in float16); the log-sum-exp is in fp32."""

    def __init__(self, encoder, temperature: float, fp16: bool = False):
        super().__init__()
        self.encoder = encoder
        self.inv_tau = 1.0 / temperature
        self.fp16 = fp16

    def construct(self, ids, positions, offsets, timestamps, request_times, targets, neg_ids, neg_logq, drop):
        out = self.encoder(ids, positions, offsets, timestamps, drop, request_times)   # [T, D], unit rows
        table = self.encoder.item_table()
        return shared_negatives_mean(out, table, targets, neg_ids, neg_logq, self.inv_tau, self.fp16)
