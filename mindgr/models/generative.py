"""The generative-retrieval (GR) decoder over semantic-ID tokens, and the token merger.

What was chosen, and why:
- Decoder-only and causal, over jagged token sequences (offsets, no padding), built from
  `mindgr.models.hstu.HSTUBlock`: MindGR's fused jagged attention is the fast path we have on every
  backend, and HSTU's pointwise SiLU attention has no softmax normaliser, so the attention of a decoded
  token is exactly (its part over the prompt) + (its part over its own beam's tokens): that is what lets
  the decoder's cached forward (prefill / step below, HSTUBlock.cached_step) keep the prompt's K/V once
  and each beam's few tokens apart.
  No time bias (semantic-ID tokens of one item share a timestamp); relative position bias only.
  model.backbone linear swaps the blocks for mindgr.models.linear_attention.LinearAttentionBlock (causal
  linear attention with a fixed per-head decay, HSTU's gating kept, no position bias), called the same way
  in training; its cached decoding keeps a recurrent state instead of the prompt's K/V.
- Token input: a code embedding per (level, code) plus a level embedding, times sqrt(D) as in HSTU.
  Codes are numbered globally: gid = level_offsets[level] + code, level_offsets = cumsum(level_sizes).
- Output: a final affine-free LayerNorm, then one head per level (one [D, sum K] matrix whose columns
  of level l are the level-l codes) giving plain logits; the softmax is taken over the target level's
  codes only. Plain logits, not L2 / temperature: each step is a softmax over a few hundred codes, not a
  retrieval over a large catalogue where cosine scoring calibrates a sampled loss.
- Token merger (`token_merger`): none | item | item_id | pairs. A prompt token holds G slots of global code
  ids (G = 1, Lt, Lt + 1 or 2; a missing slot = `pad_id`, embedded as zero). A merged token is
  W_merge [G*D, D] applied to the concatenation of its G slot embeddings (+ b_merge): an item's Lt codes
  (item) or two consecutive codes (pairs) become one token, so the prompt is Lt (or 2) times shorter.
  item_id adds the item itself as a last slot: a learned per-item embedding (rows pad_id + 1 + item of the
  slot table, after the codes' and the pad's; slot level Lt), as item-ID models have, so a prompt item is
  not only the sum of its codes' factors. Decoded tokens are never merged: the decoder still emits every code.
- Trie softmax (`trie_softmax`): the decoder's scoring rule, not a weight. When set, the model was trained
  with each code's softmax over the codes the prefix trie allows after the item's earlier codes (NTPLoss
  groups), so decoding must renormalise over those same codes (mindgr.generate.beam.beam_search); the logits
  of codes the trie never allows there were never trained.

construct(slots [T, G] int32, merged [T] float32 (1 = merged token), offsets [B+1] int32, drop=None)
    -> hidden [T, D]; logits(hidden) -> [T, sum K]. Generation (mindgr.models.generation's contract):
prompts, decode_state (-> mindgr.models.kv_cache.KVCacheState) and the graph methods prefill / step.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgr.models.hstu import HSTUBlock
from mindgr.models.linear_attention import LinearAttentionBlock
from mindgr.models.layers import apply_dropout, last_positions, layer_norm, param, trunc_normal, xavier_uniform
from mindgr.ops.norm import layer_norm as fused_layer_norm
from mindgr.models.ntp import code_tokens, group_width, prompt_tokens, tokens_per_prompt_item


BACKBONES = ("hstu", "linear")      # model.backbone: the decoder's blocks


class GRDecoder(nn.Cell):
    def __init__(self, level_sizes, dim: int, num_blocks: int, num_heads: int, dqk: int, dv: int, max_len: int,
                 token_merger: str = "none", seed: int = 0, trie_softmax: bool = False, num_items: int = 0,
                 backbone: str = "hstu", linear_chunk: int = 64):
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"backbone {backbone!r}: expected one of {', '.join(BACKBONES)}")
        self.backbone = backbone
        sizes = [int(s) for s in level_sizes]
        rng = np.random.default_rng([seed, 17])
        self.level_sizes = sizes
        self.num_levels = len(sizes)
        self.level_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_codes = int(self.level_offsets[-1])
        self.pad_id = self.num_codes
        self.dim, self.max_len, self.num_blocks = dim, max_len, num_blocks
        self.num_heads, self.dqk, self.dv = num_heads, dqk, dv
        self.token_merger = token_merger
        self.trie_softmax = bool(trie_softmax)
        self.group = group_width(token_merger, self.num_levels)     # a one-line error for an unknown merger
        # item_id: one embedding per item 0..V after the codes and the pad (item 0, the padding item, unused)
        self.num_items = int(num_items) if token_merger == "item_id" else 0
        if token_merger == "item_id" and self.num_items < 1:
            raise ValueError("token_merger item_id needs the catalogue size (num_items >= 1)")
        extra = self.num_items + 1 if self.num_items else 0
        level_of = np.concatenate([np.repeat(np.arange(self.num_levels), sizes), [0],
                                   np.full(extra, self.num_levels)]).astype(np.int32)
        self.slot_level = Tensor(level_of)                                   # [num_codes + 1 (+ V + 1)]
        self.code_emb = param(trunc_normal(rng, (self.num_codes + 1 + extra, dim), 0.02), "code_emb")
        self.level_emb = param(trunc_normal(rng, (self.num_levels + (1 if extra else 0), dim), 0.02), "level_emb")
        if self.group > 1:
            self.w_merge = param(xavier_uniform(rng, self.group * dim, dim), "w_merge")
            self.b_merge = param(np.zeros(dim, np.float32), "b_merge")
        if backbone == "linear":        # no position bias: the per-head decay encodes recency
            blocks = [LinearAttentionBlock(rng, dim, num_heads, dqk, dv, f"blocks.{i}", linear_chunk)
                      for i in range(num_blocks)]
        else:
            blocks = [HSTUBlock(rng, dim, num_heads, dqk, dv, max_len, 128, False, f"blocks.{i}")
                      for i in range(num_blocks)]
        self.blocks = nn.CellList(blocks)
        self.w_head = param(xavier_uniform(rng, dim, self.num_codes), "w_head")
        self.b_head = param(np.zeros(self.num_codes, np.float32), "b_head")
        self.scale = float(np.sqrt(dim))
        self.dropout_sites = 1 + num_blocks
        self.dropout_width = max(dim, num_heads * dv)

    def slot_embeddings(self, slots):
        """[T, G, D]: code + level embedding of every slot, zero for pad slots."""
        real = ops.expand_dims((slots != self.pad_id).astype(ms.float32), 2)
        emb = ops.gather(self.code_emb, slots, 0) + ops.gather(self.level_emb, ops.gather(self.slot_level, slots, 0), 0)
        return emb * real

    def embed(self, slots, merged):
        """Input vectors [T, D] of the tokens: a single code's embedding, or the merger's map of G slots."""
        emb = self.slot_embeddings(slots)
        x = ops.narrow(emb, 1, 0, 1).reshape(emb.shape[0], self.dim)    # slot 0 ([:, 0, :]: ~20x slower on CPU)
        if self.group > 1:
            t = slots.shape[0]
            joined = ops.matmul(emb.reshape(t, self.group * self.dim), self.w_merge) + self.b_merge
            m = ops.expand_dims(merged, 1)
            x = m * joined + (1.0 - m) * x
        return x * self.scale

    def embed_code(self, slots):
        """embed(slots, merged = 0) of decoded tokens (one real code in slot 0): no merger map computed."""
        c = slots[:, 0]
        return (ops.gather(self.code_emb, c, 0) + ops.gather(self.level_emb, ops.gather(self.slot_level, c, 0), 0)) \
            * self.scale

    def construct(self, slots, merged, offsets, drop=None):
        x = self.embed(slots, merged)
        t = x.shape[0]
        timestamps = ops.zeros((t,), ms.int64)     # no time bias: the blocks ignore them
        masks = ops.unstack(drop, 0) if drop is not None else None
        if masks is not None:
            x = apply_dropout(x, masks[0])
        for i in range(self.num_blocks):
            x = self.blocks[i](x, offsets, timestamps,  # no request time
                               drop_mask=masks[i + 1] if masks is not None else None)
        return layer_norm(x)

    def logits(self, hidden):
        """[..., sum K] plain logits over every level's codes (mask to one level before a softmax)."""
        return ops.matmul(hidden, self.w_head) + self.b_head

    # ---- generation (the contract in mindgr.models.generation; mindgr.generate calls only these) ---------

    def prompts(self, histories, codes, max_prompt_tokens: int):
        """Per user (slots, merged) of its prompt (prompts_of)."""
        return prompts_of(self, histories, codes, max_prompt_tokens)

    def decode_state(self, num_users: int, beam: int, max_prompt_tokens: int, runner=None, parts: str = "both",
                     layout: str = "shared"):
        """The decoding state of a batch of users. HSTU blocks: layout "shared", the shared prompt K/V cache
        and per-beam records (mindgr.models.kv_cache.KVCacheState, which compiles prefill and step below), or
        "per_beam", the usual generate() cache, the prompt copied per beam (mindgr.models.per_beam_cache, a
        baseline). Linear-attention blocks: "onela" (= "shared"), "per_beam_state" (= "per_beam") or
        "replay" (mindgr.models.linear_decode)."""
        if self.backbone == "linear":
            from mindgr.models.linear_decode import linear_decode_state
            return linear_decode_state(self, num_users, beam, max_prompt_tokens, runner, layout)
        from mindgr.models.kv_cache import KVCacheState
        if layout not in ("shared", "per_beam"):
            raise ValueError(f"decode layout {layout!r}: the hstu backbone has shared, per_beam")
        if layout == "per_beam":
            from mindgr.models.per_beam_cache import PerBeamKVState
            return PerBeamKVState(self, num_users, beam, max_prompt_tokens, runner)
        return KVCacheState(self, num_users, beam, max_prompt_tokens, parts, runner)

    def prefill(self, slots, merged, offsets, last, num_users: int, p_cap: int):
        """The cached forward over the prompts (one per p_cap tokens) -> (level-0 logits [U, sum K] at the
        tokens `last`, prompt K [blocks, U, P, H, dqk], prompt V [blocks, U, P, H, dv])."""
        x = self.embed(slots, merged)
        ts = ops.zeros((x.shape[0],), ms.int64)
        ks, vs = [], []
        for i in range(self.num_blocks):
            x, k, v = self.blocks[i].prompt_forward(x, offsets, ts, num_users, p_cap)
            ks.append(k)
            vs.append(v)
        return self.logits(ops.gather(layer_norm(x), last, 0)), ops.stack(ks), ops.stack(vs)

    def prefill_records(self, slots, merged, offsets, last, num_users: int, p_cap: int):
        """prefill for the engine's own step graphs -> (level-0 logits, then per block the prompt's K and V as
        HSTUBlock.prompt_blocks: K_0, V_0, K_1, V_1, ..)."""
        x = self.embed(slots, merged)
        ts = ops.zeros((x.shape[0],), ms.int64)
        out = ()
        for i in range(self.num_blocks):
            x, k, v = self.blocks[i].prompt_forward(x, offsets, ts, num_users, p_cap)
            out = out + self.blocks[i].prompt_blocks(k, v)
        return (self.logits(ops.gather(layer_norm(x), last, 0)),) + out

    def step_records(self, slots, prompt, krs, vrs, anc, pidx, pmask, ridx, num_users: int, beam: int,
                     used: int, head: str = "hidden"):
        """One decoded token per (user, beam) on records kept one tensor per (block, slot)
        (HSTUBlock.record_step): prompt = prefill_records' K_0, V_0, K_1, ..; krs / vrs block-major, the
        `used` earlier slots each -> (hidden [U*Bm, D] (or logits), K_0, V_0, K_1, ..) of this token."""
        x = self.embed_code(slots)
        out = ()
        for i in range(self.num_blocks):
            x, k, v = self.blocks[i].record_step(x, prompt[2 * i], prompt[2 * i + 1], pidx, pmask,
                                                 krs[i * used:(i + 1) * used], vrs[i * used:(i + 1) * used], anc,
                                                 ridx, num_users, beam)
            out = out + (k, v)
        hidden = fused_layer_norm(x)
        return (hidden if head == "hidden" else self.logits(hidden),) + out

    def step(self, slots, kp, vp, pidx, pmask, kr, vr, onehot, anc, ridx, rmask, num_users: int, beam: int,
             steps: int, parts: str = "both", head: str = "logits"):
        """One decoded code per (user, beam) -> (logits [U*Bm, sum K], record K, record V), every block's
        HSTUBlock.cached_step over its slice of the caches ([blocks, ...]). head "hidden": the final
        normalised hidden vectors [U*Bm, D] instead of logits (the caller scores only the codes it needs)."""
        x = self.embed_code(slots)
        new_k, new_v = [], []
        for i in range(self.num_blocks):
            x, k, v = self.blocks[i].cached_step(x, kp[i], vp[i], pidx, pmask, kr[i], vr[i], onehot, anc, ridx,
                                                 rmask, num_users, beam, steps, parts)
            new_k.append(k)
            new_v.append(v)
        out = fused_layer_norm(x)
        if head == "logits":
            out = self.logits(out)
        return out, ops.stack(new_k), ops.stack(new_v)


def log_softmax(z: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """Host-side log-softmax over the last axis, in float64, returned as float32; with a boolean `allowed`
    of z's shape, over the allowed entries only (-inf elsewhere, and in rows that allow none)."""
    z = np.asarray(z, np.float64)
    if allowed is not None:
        z = np.where(allowed, z, -np.inf)
    m = z.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    return (out if allowed is None else np.where(allowed, out, -np.inf)).astype(np.float32)


def level_log_softmax(logits: np.ndarray, level_offsets, level: int) -> np.ndarray:
    """Host-side log-softmax of the level-`level` columns of logits [..., sum K] -> [..., K_level]."""
    a, b = int(level_offsets[level]), int(level_offsets[level + 1])
    return log_softmax(logits[..., a:b])


class TokenLogits(nn.Cell):
    """logits [T, sum K] of every token of a jagged batch."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def construct(self, slots, merged, offsets):
        return self.decoder.logits(self.decoder(slots, merged, offsets))


class LastTokenLogits(nn.Cell):
    """logits [B, sum K] of the last token of each row (zeros for empty rows)."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def construct(self, slots, merged, offsets):
        return self.decoder.logits(last_positions(self.decoder(slots, merged, offsets), offsets))


def prompts_of(decoder, histories, codes, max_prompt_tokens: int):
    """Per user (slots, merged) of its prompt: the history's tokens, the oldest dropped beyond the cap."""
    out = []
    for u, h in enumerate(histories):
        h = np.asarray(h, np.int64)
        if h.shape[0] == 0:
            raise ValueError(f"user {u} has an empty history: a generative model needs a prompt")
        slots, merged = prompt_tokens(codes[h], decoder.level_offsets, decoder.token_merger, decoder.pad_id, h)
        per_item = tokens_per_prompt_item(decoder.num_levels, decoder.token_merger)
        keep = (max_prompt_tokens // per_item) * per_item
        if keep < per_item:
            raise ValueError(f"max_prompt_tokens {max_prompt_tokens} holds no item ({per_item} tokens each)")
        out.append((slots[-keep:], merged[-keep:]))
    return out


def pack_sequences(seqs, t_cap: int, b_cap: int, group: int, pad_id: int):
    """[(slots, merged)] -> fixed-capacity (slots [t_cap, G], merged [t_cap], offsets [b_cap+1])."""
    slots = np.full((t_cap, group), pad_id, np.int32)
    merged = np.zeros(t_cap, np.float32)
    lengths = [s.shape[0] for s, _ in seqs]
    if sum(lengths) > t_cap or len(seqs) > b_cap:
        raise ValueError(f"{len(seqs)} sequences of {sum(lengths)} tokens exceed capacities ({b_cap}, {t_cap})")
    offsets = np.full(b_cap + 1, sum(lengths), np.int32)
    offsets[: len(seqs) + 1] = np.concatenate([[0], np.cumsum(lengths)])
    pos = 0
    for (s, m), n in zip(seqs, lengths):
        slots[pos:pos + n], merged[pos:pos + n] = s, m
        pos += n
    return slots, merged, offsets


class RecomputeScorer:
    """The reference scorer of beam search: each step re-runs the decoder over every beam's whole
    sequence (prompt + its decoded codes), one row per (user, beam), at fixed capacities
    (users x beam rows of max_prompt_tokens + Lt - 1 tokens): one compiled graph for every step."""

    def __init__(self, decoder, histories, codes, beam: int, max_prompt_tokens: int, num_users: int | None = None,
                 net=None):
        self.decoder = decoder
        self.prompts = prompts_of(decoder, histories, codes, max_prompt_tokens)
        self.num_users = num_users or len(self.prompts)
        self.beam = beam
        self.rows = self.num_users * beam
        self.t_cap = self.rows * (max_prompt_tokens + decoder.num_levels - 1)
        if net is None:                  # pass one in to reuse its compiled graph across requests
            net = LastTokenLogits(decoder)
            net.set_train(False)
        self.net = net

    def step(self, level, prefixes):
        dec = self.decoder
        seqs = []
        for u in range(len(self.prompts)):
            ps, pm = self.prompts[u]
            for b in range(self.beam):
                gids = dec.level_offsets[:level] + prefixes[u, b, :level]
                cs, cm = code_tokens(gids, dec.group, dec.pad_id)
                seqs.append((np.concatenate([ps, cs]), np.concatenate([pm, cm])))
        slots, merged, offsets = pack_sequences(seqs, self.t_cap, self.rows, dec.group, dec.pad_id)
        logits = self.net(Tensor(slots), Tensor(merged), Tensor(offsets)).asnumpy()
        logp = level_log_softmax(logits, dec.level_offsets, level)
        return logp.reshape(self.num_users, self.beam, -1)[: len(self.prompts)]

    def advance(self, parent, code, alive):
        """Nothing to keep: the next step recomputes everything."""


def item_log_probs(decoder, histories, codes, max_prompt_tokens: int) -> np.ndarray:
    """Exhaustive reference: log p(item | prompt) of every item [U, V+1] (column 0 = -inf) by teacher
    forcing, one row per (user, item), the level-masked log-softmax of the training loss."""
    prompts = prompts_of(decoder, histories, codes, max_prompt_tokens)
    v, lt = codes.shape[0] - 1, decoder.num_levels
    net = TokenLogits(decoder)
    net.set_train(False)
    out = np.full((len(prompts), v + 1), -np.inf, np.float32)
    gids = codes[1:].astype(np.int64) + decoder.level_offsets[None, :-1]
    for u, (ps, pm) in enumerate(prompts):
        seqs = []
        for i in range(v):
            cs, cm = code_tokens(gids[i, :-1], decoder.group, decoder.pad_id)
            seqs.append((np.concatenate([ps, cs]), np.concatenate([pm, cm])))
        slots, merged, offsets = pack_sequences(seqs, v * (max_prompt_tokens + lt - 1), v, decoder.group, decoder.pad_id)
        logits = net(Tensor(slots), Tensor(merged), Tensor(offsets)).asnumpy()
        total = np.zeros(v, np.float64)
        for level in range(lt):
            pos = offsets[1:] - lt + level                      # the token that predicts code `level`
            logp = level_log_softmax(logits[pos], decoder.level_offsets, level)
            total += logp[np.arange(v), codes[1:, level]]
        out[u, 1:] = total
    return out


# ---- the model registry's entry for model.arch = gr ------------------------------------------------
# The GR decoder is not an item encoder: it has no item table and no user embedding, its input is semantic-ID
# tokens and its output a distribution over the next code. It is registered (so `model.arch: gr` is a known
# model and its FLOPs are counted like every model's) with a `build` that refuses the encoder contract in one
# line; the decoder itself is built from the run's code table by `build_decoder`, through the generative
# trainer (mindgr.train.generative).

def max_prompt_tokens(num_levels: int, token_merger: str, max_history: int) -> int:
    """Prompt capacity in tokens of `max_history` items."""
    return max_history * tokens_per_prompt_item(num_levels, token_merger)


def decoder_max_len(num_levels: int, token_merger: str, max_history: int) -> int:
    """The position-bias length of the decoder: a prompt of max_history items plus the Lt - 1 decoded codes
    (the longest training row, copied or virtual)."""
    return max_prompt_tokens(num_levels, token_merger, max_history) + num_levels - 1


def build_decoder(model_cfg, level_sizes, max_history: int, seed: int, num_items: int = 0) -> GRDecoder:
    """The GR decoder of a config over a code table's level sizes: position bias sized for a prompt of
    max_history items plus the Lt - 1 decoded codes (the longest training row); num_items (the catalogue)
    sizes the item embeddings of token_merger item_id."""
    m = model_cfg
    lt = len(level_sizes)
    dqk = m.dqk or m.dim // m.num_heads
    dv = m.dv or m.dim // m.num_heads
    max_len = decoder_max_len(lt, m.token_merger, max_history)
    return GRDecoder(level_sizes, m.dim, m.num_blocks, m.num_heads, dqk, dv, max_len, m.token_merger, seed,
                     m.trie_softmax, num_items, m.backbone, m.linear_chunk)


def build(model_cfg, num_items, max_len, seed, item_init):
    from mindgr.config import ConfigError
    raise ConfigError("config: model.arch = gr is the generative decoder, not an item encoder: it is trained "
                      "with loss.objective = ntp or page_ntp by `mindgr train` (mindgr.train.generative), from "
                      "a semantic-ID table (ids.codes or ids.from_run)")


def encoder_flops(model_cfg, lengths) -> float:
    """Forward FLOPs of the decoder's blocks for rows of these token lengths: HSTU's count, or the linear
    blocks' (mindgr.models.linear_attention.encoder_flops) with model.backbone linear."""
    from mindgr.models import hstu, linear_attention
    if getattr(model_cfg, "backbone", "hstu") == "linear":
        return linear_attention.encoder_flops(model_cfg, lengths, model_cfg.linear_chunk)
    return hstu.encoder_flops(model_cfg, lengths)


def prefix_attention_flops(model_cfg, pairs: int) -> float:
    """Forward FLOPs of the tree layout's segment-over-prompt attention for this many (segment token, prompt
    key) pairs: per block and head 2*dqk (score) + 2*dv (weighted v), as hstu.encoder_flops counts a pair."""
    from mindgr.models import hstu
    dqk, dv = hstu.head_widths(model_cfg)
    return model_cfg.num_blocks * model_cfg.num_heads * (2 * dqk + 2 * dv) * float(pairs)
