"""Sampled softmax on cosine similarity: every position predicts its next item against R negatives.

loss_i = -log( exp(s(o_i, e_target)/tau) / (exp(s(o_i, e_target)/tau) + sum_r exp(s(o_i, e_r)/tau)) ),
s = cosine similarity, negatives equal to the target (accidental hits) masked out, averaged over the
positions that have a target.
"""
import mindspore as ms
from mindspore import nn, ops

from mindgr.models.layers import l2_normalize

_MASKED = -1e9


def use_score_all(num_items: int, num_negatives: int) -> bool:
    """Score every item with one [T, D] x [D, V] matmul and pick the sampled columns, or gather [T, R, D].

    Measured (DESIGN.md §4): for a catalogue of a few thousand items, scoring all items is ~4x faster than
    materialising [T, R, D]; the gather wins once V is much larger than R.
    """
    return num_items + 1 <= 64 * num_negatives


class SampledSoftmaxLoss(nn.Cell):
    def __init__(self, encoder, temperature: float, score_all: bool):
        super().__init__()
        self.encoder = encoder
        self.inv_tau = 1.0 / temperature
        self.score_all = score_all

    def construct(self, ids, positions, offsets, timestamps, targets, negatives, drop):
        out = self.encoder(ids, positions, offsets, timestamps, drop)         # [T, D], unit rows
        table = self.encoder.item_table()                                    # [V+1, D], unit rows
        tgt = targets.astype(ms.int32)
        pos = (out * ops.gather(table, tgt, 0)).sum(-1, keepdims=True)       # [T, 1]
        if self.score_all:
            logits = ops.matmul(out, table.T)                                # [T, V+1]
            neg = ops.gather_elements(logits, 1, negatives)                  # [T, R]
        else:
            neg_emb = ops.gather(table, negatives, 0)                        # [T, R, D]
            neg = (out[:, None, :] * neg_emb).sum(-1)
        hit = ops.equal(negatives, tgt[:, None])
        neg = ops.where(hit, ops.full_like(neg, _MASKED), neg * self.inv_tau)
        all_logits = ops.concat((pos * self.inv_tau, neg), 1)
        per_token = ops.logsumexp(all_logits, 1) - pos[:, 0] * self.inv_tau
        valid = (tgt > 0).astype(ms.float32)
        return (per_token * valid).sum() / ops.maximum(valid.sum(), ops.ones_like(valid.sum()))
