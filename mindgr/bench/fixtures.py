"""Models with random weights for the serving benchmarks and tests when no trained run is at hand:
`random_bundle`, a random-weight GR decoder with a Beauty-like random code table, in the GenerativeBundle
form the generative serving model takes (`mindgr serve --random-gr SPEC`, `mindgr export --random-gr`,
`mindgr bench serve --gr`). Raw item ids are RAW_ID_BASE + internal id.
"""
from __future__ import annotations

import numpy as np

BEAUTY_LEVELS = (256, 256, 256, 32)    # 3 residual k-means levels of 256 codes + a de-dup digit
RAW_ID_BASE = 1000                     # random bundles: raw id of item i is RAW_ID_BASE + i
def beauty_like_codes(rng, num_items: int, level_sizes=BEAUTY_LEVELS) -> np.ndarray:
    """Random unique code tuples [V+1, Lt] (row 0 = padding) with Beauty-like sharing: the first level
    from 64 of its codes, the de-dup digit mostly 0..3 (as a real residual k-means table clusters)."""
    sizes = [int(s) for s in level_sizes]
    first = min(64, sizes[0])
    seen, rows = set(), []
    while len(rows) < num_items:
        t = (int(rng.integers(first)),) + tuple(int(rng.integers(s)) for s in sizes[1:-1]) + \
            (int(rng.integers(min(4, sizes[-1]))),)
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return np.concatenate([np.zeros((1, len(sizes)), np.int32), np.asarray(rows, np.int32)])


def random_bundle(num_items: int = 12101, prompt_tokens: int = 200, dim: int = 128, blocks: int = 4,
                  heads: int = 2, level_sizes=BEAUTY_LEVELS, seed: int = 0, weight_scale: float = 0.1,
                  token_merger: str = "none", backbone: str = "hstu"):
    """A random-weight GR decoder of the given shape and a random code table: what serving needs of a run.
    prompt_tokens fixes max_history (prompt_tokens // tokens per item) and the decoder's max_len."""
    from mindspore import Tensor
    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.models.ntp import tokens_per_prompt_item
    from mindgr.serve.generative import GenerativeBundle
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in level_sizes]
    codes = beauty_like_codes(rng, num_items, sizes)
    per_item = tokens_per_prompt_item(len(sizes), token_merger)
    max_history = prompt_tokens // per_item
    if max_history < 1:
        raise ValueError(f"prompt of {prompt_tokens} tokens holds no item ({per_item} tokens each)")
    dec = GRDecoder(sizes, dim, blocks, heads, dim // heads, dim // heads,
                    max_len=max_history * per_item + len(sizes) - 1, token_merger=token_merger, seed=seed,
                    num_items=num_items, backbone=backbone)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * weight_scale).astype(np.float32)))
    dec.set_train(False)
    raw = np.concatenate([[-1], RAW_ID_BASE + np.arange(1, num_items + 1)]).astype(np.int64)
    spec = dict(items=num_items, prompt_tokens=prompt_tokens, dim=dim, blocks=blocks, heads=heads,
                level_sizes=sizes, seed=seed, token_merger=token_merger, backbone=backbone)
    return GenerativeBundle(cfg=None, run_dir=None, decoder=dec, codes=codes, level_sizes=sizes,
                            trie=PrefixTrie(codes, sizes), raw_ids=raw, max_history=max_history,
                            checkpoint="random weights", extra={"random": spec})


def parse_random_spec(text: str) -> dict:
    """`items=12101,prompt=200,dim=128,blocks=4,heads=2,seed=0,levels=256x256x256x32,backbone=linear` -> random_bundle's
    keyword arguments (any subset; the rest keep their defaults)."""
    names = {"items": "num_items", "prompt": "prompt_tokens", "dim": "dim", "blocks": "blocks",
             "heads": "heads", "seed": "seed"}
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key == "backbone":
            if value not in ("hstu", "linear"):
                raise ValueError(f"--random-gr: {part!r} (expected backbone=hstu or backbone=linear)")
            out["backbone"] = value
            continue
        if key == "levels":
            try:
                out["level_sizes"] = [int(x) for x in value.split("x")]
            except ValueError:
                raise ValueError(f"--random-gr: {part!r} (expected levels=K0xK1x...)") from None
            continue
        if key not in names or not value.lstrip("-").isdigit():
            raise ValueError(f"--random-gr: {part!r} (expected KEY=INT with KEY one of {', '.join(names)})")
        out[names[key]] = int(value)
    return out
