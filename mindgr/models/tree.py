"""Shared-prompt ("tree") training layout for the GR decoder: each user's prompt once, not once per target.

The copied-row layout of mindgr.models.ntp gives every (prompt, target) its own row
[prompt prefix] + [codes 0..Lt-2 of the target], so with a token merger (or with page_ntp) a user's
tokens grow quadratically with its history. Here a user is ONE prompt sequence (the tokens of every item
before its last target group) plus, per target, a segment of its Lt-1 teacher-forced code tokens. The
per-token work (embeddings, LayerNorms, projections, the head) runs once per unique token; only the
attention sees the copied rows, as *virtual rows* of gathered q / k / v:
- virtual row of a user's prompt: its prompt tokens (their outputs are the prompt tokens' attention);
- virtual row of a target: the prompt prefix before its boundary + its segment (the segment tokens'
  outputs), i.e. exactly the row the copied layout would hold, so the fused jagged attention kernel
  (relative position bias from the position in that row) gives the copied layout's attention.
- code 0 of a target is predicted by the prompt token just before its boundary (shared by every target
  of a page), codes 1..Lt-1 by the segment's tokens: the loss gathers these positions (Lt per target).
Loss, weights and objectives are those of NTPLoss (mean over prompts of the mean over their targets).

Batch layout (fixed capacities, one compiled graph): tokens [tp_cap prompt region | ts_cap segment region];
virtual tokens [vt_cap]: virt_src (the token each one copies), virt_offsets [u_cap + s_cap + 1] (virtual
rows), take [tp_cap + ts_cap] (the virtual token whose attention output each token keeps); per loss entry
(s_cap * Lt) pos / target / group (softmax group) / weight. p_offsets and s_offsets (the users' prompts
and the segments) are kept in the batch for inspection; the step does not read them.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgr.models.layers import apply_dropout, layer_norm
from mindgr.models.ntp import (NTPLoss, RowError, check_row_options, code_tokens, page_groups, prompt_tokens,
                               tokens_per_prompt_item)
from mindgr.ops.attention import jagged_hstu_attention

TREE_KEYS = ("slots", "merged", "virt_src", "virt_offsets", "take", "pos", "target", "group", "weight")


def tree_user(items, codes, level_offsets, objective: str = "ntp", token_merger: str = "none", pages=None,
              pad_id: int | None = None, item_groups=None):
    """One user's tree layout: dict(prompt_slots [P, G], prompt_merged [P], targets [(boundary, gids [Lt],
    groups [Lt], weight)]) with the targets, softmax groups and weights of ntp.user_rows (item_groups
    [V+1, Lt] as there; None = each code's level); None when the user has no target."""
    check_row_options(objective, token_merger, pages)
    items = np.asarray(items, np.int64)
    codes = np.asarray(codes)
    lt = codes.shape[1]
    pad_id = int(level_offsets[-1]) if pad_id is None else pad_id
    if items.shape[0] < 2:
        return None
    if objective == "ntp":
        groups = [(j, j + 1) for j in range(items.shape[0])]
    else:
        if np.asarray(pages).shape != items.shape:
            raise RowError(f"pages has {np.asarray(pages).shape[0]} ids for {items.shape[0]} items")
        groups = page_groups(pages)
    if len(groups) < 2:
        return None
    item_codes = codes[items].astype(np.int64)
    if item_groups is None:
        target_groups = np.broadcast_to(np.arange(lt, dtype=np.int32), item_codes.shape)
    else:
        target_groups = np.asarray(item_groups, np.int32)[items]
    per_item = tokens_per_prompt_item(lt, token_merger)
    last = groups[-1][0]
    slots, merged = prompt_tokens(item_codes[:last], level_offsets, token_merger, pad_id, items[:last])
    targets = []
    for start, stop in groups[1:]:
        for j in range(start, stop):
            gids = (item_codes[j] + np.asarray(level_offsets[:-1])).astype(np.int32)
            targets.append((start * per_item, gids, target_groups[j], 1.0 / (stop - start)))
    return dict(prompt_slots=slots, prompt_merged=merged, targets=targets)


def tree_tokens(user: dict) -> int:
    """Tokens of a user's tree layout: its prompt plus Lt-1 per target."""
    return user["prompt_slots"].shape[0] + sum(g.shape[0] - 1 for _, g, _, _ in user["targets"])


def virtual_tokens(user: dict) -> int:
    """Virtual (attention) tokens of a user: its prompt row plus one copied row per target."""
    return user["prompt_slots"].shape[0] + sum(b + g.shape[0] - 1 for b, g, _, _ in user["targets"])


class TreeCaps:
    """Fixed capacities of a tree batch: prompt tokens, segment tokens, users, targets, virtual (attention)
    tokens; the decoder's max_len (a virtual row must fit in it)."""

    def __init__(self, tp_cap: int, ts_cap: int, u_cap: int, s_cap: int, vt_cap: int, max_len: int):
        self.tp_cap, self.ts_cap, self.u_cap, self.s_cap = tp_cap, ts_cap, u_cap, s_cap
        self.vt_cap, self.max_len = vt_cap, max_len


def pack_tree(users: list, caps: TreeCaps, num_levels: int, group: int, pad_id: int) -> list:
    """Greedy packing of tree users (in order, None skipped) into fixed-capacity batches of numpy arrays."""
    batches, cur, used = [], [], np.zeros(4, np.int64)
    lseg = num_levels - 1
    limits = np.array([caps.tp_cap, caps.ts_cap, caps.s_cap, caps.vt_cap])
    for u in users:
        if u is None:
            continue
        p, n_t = u["prompt_slots"].shape[0], len(u["targets"])
        need = np.array([p, n_t * lseg, n_t, virtual_tokens(u)])
        if (need > limits).any():
            raise RowError(f"a user with a {p}-token prompt and {n_t} targets exceeds the tree capacities "
                           f"(per batch: prompt tokens {caps.tp_cap}, segment tokens {caps.ts_cap}, targets "
                           f"{caps.s_cap}, virtual tokens {caps.vt_cap})")
        longest = max(b for b, _, _, _ in u["targets"]) + lseg
        if longest > caps.max_len:
            raise RowError(f"a target's row has {longest} tokens (prompt prefix + {lseg} codes), "
                           f"more than the decoder's max_len {caps.max_len}")
        full = (used + need > limits).any() or len(cur) == caps.u_cap
        if cur and full:
            batches.append(_tree_batch(cur, caps, num_levels, group, pad_id))
            cur, used = [], np.zeros(4, np.int64)
        cur.append(u)
        used += need
    if cur:
        batches.append(_tree_batch(cur, caps, num_levels, group, pad_id))
    return batches


def _tree_batch(users, caps, lt, group, pad_id):
    lseg = lt - 1
    t_all = caps.tp_cap + caps.ts_cap
    slots = np.full((t_all, group), pad_id, np.int32)
    merged = np.zeros(t_all, np.float32)
    p_offsets = np.zeros(caps.u_cap + 1, np.int32)
    s_offsets = np.zeros(caps.s_cap + 1, np.int32)
    virt_src = np.zeros(caps.vt_cap, np.int32)
    virt_offsets = np.zeros(caps.u_cap + caps.s_cap + 1, np.int32)
    take = np.zeros(t_all, np.int32)
    e_cap = caps.s_cap * lt
    pos = np.zeros(e_cap, np.int32)
    target, group_of = np.zeros(e_cap, np.int32), np.zeros(e_cap, np.int32)
    weight = np.zeros(e_cap, np.float32)
    pp, sp, seg, vp, vr = 0, 0, 0, 0, 0           # next prompt token, segment token, segment, virtual token, row

    def virtual_row(sources):
        nonlocal vp, vr
        virt_src[vp:vp + len(sources)] = sources
        vp += len(sources)
        vr += 1
        virt_offsets[vr] = vp
        return vp - len(sources)

    for ui, u in enumerate(users):
        p = u["prompt_slots"].shape[0]
        slots[pp:pp + p], merged[pp:pp + p] = u["prompt_slots"], u["prompt_merged"]
        take[pp:pp + p] = virtual_row(pp + np.arange(p)) + np.arange(p)
        for boundary, gids, groups, w in u["targets"]:
            cs, cm = code_tokens(gids[:-1], group, pad_id)
            g0 = caps.tp_cap + sp
            slots[g0:g0 + lseg], merged[g0:g0 + lseg] = cs, cm
            row = virtual_row(np.concatenate([pp + np.arange(boundary), g0 + np.arange(lseg)]))
            take[g0:g0 + lseg] = row + boundary + np.arange(lseg)
            e = seg * lt
            pos[e] = pp + boundary - 1                      # the prompt token that predicts code 0
            pos[e + 1:e + lt] = g0 + np.arange(lseg)
            target[e:e + lt], group_of[e:e + lt], weight[e:e + lt] = gids, groups, w
            sp += lseg
            seg += 1
            s_offsets[seg] = sp
        pp += p
        p_offsets[ui + 1] = pp
    p_offsets[len(users) + 1:] = pp
    s_offsets[seg + 1:] = sp
    virt_offsets[vr + 1:] = vp
    return dict(slots=slots, merged=merged, p_offsets=p_offsets, s_offsets=s_offsets, virt_src=virt_src,
                virt_offsets=virt_offsets, take=take, pos=pos, target=target, group=group_of, weight=weight)


def tree_tensors(batch: dict) -> tuple:
    return tuple(Tensor(batch[k]) for k in TREE_KEYS)


class TreeDecoder(nn.Cell):
    """The GRDecoder's forward over a tree batch -> hidden [tp_cap + ts_cap, D] (the decoder's weights)."""

    def __init__(self, decoder, caps: TreeCaps):
        super().__init__()
        self.decoder = decoder
        self.vt = caps.vt_cap

    def block(self, blk, x, virt_src, virt_offsets, take, drop_mask):
        """HSTUBlock's math with the attention over virtual rows: q / k / v gathered into the copied rows,
        each token's attention taken from its own virtual token."""
        h, dv, dqk = blk.h, blk.dv, blk.dqk
        hv, hqk = h * dv, h * dqk
        z = ops.silu(ops.matmul(layer_norm(x), blk.w_uvqk))
        u, v, q, k = ops.split(z, [hv, hv, hqk, hqk], 1)
        qkv = ops.gather(ops.concat((q, k, v), 1), virt_src, 0)              # [VT, 2 hqk + hv]
        qr, kr, vr = ops.split(qkv, [hqk, hqk, hv], 1)
        attn = jagged_hstu_attention(qr.reshape(self.vt, h, dqk), kr.reshape(self.vt, h, dqk),
                                     vr.reshape(self.vt, h, dv), virt_offsets, ops.zeros((self.vt,), ms.int64),
                                     blk.w_pos, blk.w_ts, blk.max_len)
        attn = ops.gather(attn.reshape(self.vt, hv), take, 0)                # [T, hv]
        o = u * layer_norm(attn)
        if drop_mask is not None:
            o = apply_dropout(o, drop_mask)
        return x + ops.matmul(o, blk.w_out) + blk.b_out

    def construct(self, slots, merged, virt_src, virt_offsets, take, drop=None):
        dec = self.decoder
        x = dec.embed(slots, merged)
        masks = ops.unstack(drop, 0) if drop is not None else None
        if masks is not None:
            x = apply_dropout(x, masks[0])
        for i in range(dec.num_blocks):
            x = self.block(dec.blocks[i], x, virt_src, virt_offsets, take,
                           masks[i + 1] if masks is not None else None)
        return layer_norm(x)


class TreeNTPLoss(NTPLoss):
    """NTPLoss over a tree batch: Lt * sum(w * ce) / sum(w) over the loss entries (Lt per target), the
    softmax of an entry over its group's codes (its level, or with restrict_to its trie prefix node).
    Equal to NTPLoss over the copied rows of the same users."""

    def __init__(self, decoder, caps: TreeCaps, allowed=None):
        super().__init__(decoder, allowed)
        self.tree = TreeDecoder(decoder, caps)

    def construct(self, slots, merged, virt_src, virt_offsets, take, pos, target, group, weight, drop=None):
        hidden = self.tree(slots, merged, virt_src, virt_offsets, take, drop)
        return self.weighted_mean(self.entry_losses(ops.gather(hidden, pos, 0), target, group), weight)
