"""Per-step decode time, engine vs naive baseline, for a random-weight GR decoder of a Beauty-like shape.

mindgr bench decode [--beams 16 64] [--prompts 50 200] [--users 2] [--repeats 3] [--dim 64]
    [--blocks 2] [--heads 2] [--threads N]          (also as python -m mindgr.bench.decode ...)

Per configuration both searches run on the same users, alternating, `repeats` times after a warm-up
(compiles); figures are medians per decode step (the Lt-1 steps after the prefill):
  model   decoder time per step (engine: the decode-step graph; naive: the whole-sequence recompute),
  prompt  / beam: the engine's step graph with only the prompt / only the ancestry attention part
          (same shapes, same inputs: each includes the token's projections),
  select  selection per step (engine: partial top-k; naive: full sort),
  masks   valid-next masks per step (engine: reused trie masks; naive: rebuilt from the code table),
  request the whole search for the batch (engine: prefill + steps + selection), ms.
The host is shared and noisy: compare the two columns of one run (ratios), not absolute times.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def build(args):
    import mindspore as ms
    from mindspore import Tensor

    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.ops import set_backend
    from mindgr.runtime import select_device
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()
    backend = set_backend(args.backend)
    rng = np.random.default_rng(0)
    sizes = [256, 256, 256, 32]
    seen, rows = set(), []
    while len(rows) < args.items:                   # random unique tuples, clustered first levels
        t = (int(rng.integers(64)), int(rng.integers(256)), int(rng.integers(256)), int(rng.integers(4)))
        if t not in seen:
            seen.add(t)
            rows.append(t)
    codes = np.concatenate([np.zeros((1, 4), np.int64), np.asarray(rows)])
    dec = GRDecoder(sizes, args.dim, args.blocks, args.heads, args.dim // args.heads, args.dim // args.heads,
                    max_len=max(args.prompts) + 8, seed=0)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.1).astype(np.float32)))
    return dec, PrefixTrie(codes, sizes), codes, backend, rng


def measure(args):
    from mindgr.generate.engine import DecodingEngine
    from mindgr.models.kv_cache import DecodeStepCell
    dec, trie, codes, backend, rng = build(args)
    steps = dec.num_levels - 1
    results = []
    for prompt in args.prompts:
        hist = [rng.integers(1, codes.shape[0], prompt // dec.num_levels) for _ in range(args.users)]
        for beam in args.beams:
            eng = DecodingEngine(dec, trie, codes, beam, prompt, args.users)
            naive = DecodingEngine(dec, trie, codes, beam, prompt, args.users, cache="recompute",
                                   selection="full_sort", masks="rebuild")
            parts = {name: DecodeStepCell(dec, args.users, beam, prompt, steps, name) for name in ("prompt", "beam")}
            t0 = time.perf_counter()
            a = eng.search(hist, 10)
            b = naive.search(hist, 10)
            for net in parts.values():
                net.set_train(False)
                net(*eng.state.last_step_inputs)
            warm = time.perf_counter() - t0
            assert (a[0] == b[0]).all(), "engine and naive lists differ"
            rec = {k: [] for k in ("e_model", "e_prompt", "e_beam", "e_select", "e_masks", "e_prefill",
                                   "n_model", "n_select", "n_masks", "e_request", "n_request")}
            for _ in range(args.repeats):
                for side, e in (("e", eng), ("n", naive)):
                    for key in e.timings:
                        e.timings[key] = 0.0
                    t1 = time.perf_counter()
                    e.search(hist, 10)
                    rec[f"{side}_request"].append(time.perf_counter() - t1)
                    # model time of the decode steps only: the engine's level 0 comes from the prefill
                    rec[f"{side}_model"].append(e.timings["model"] / (steps if side == "e" else steps + 1))
                    rec[f"{side}_select"].append(e.timings["select"] / (steps + 1))
                    rec[f"{side}_masks"].append(e.timings["masks"] / (steps + 1))
                    if side == "e":
                        rec["e_prefill"].append(e.timings["prefill"])
                for name, net in parts.items():
                    t1 = time.perf_counter()
                    net(*eng.state.last_step_inputs)[0].asnumpy()
                    rec[f"e_{name}"].append(time.perf_counter() - t1)
            med = {k: float(np.median(v)) * 1e3 for k, v in rec.items()}
            bytes_ = eng.cache_nbytes()
            blk = dec.blocks[0]
            replicated = dec.num_blocks * blk.h * (blk.dqk + blk.dv) * 4 * args.users * beam * (prompt + steps)
            row = dict(prompt=prompt, beam=beam, users=args.users, warmup_s=round(warm, 1), **{k: round(v, 3) for k, v in med.items()},
                       step_ratio=round((med["n_model"] + med["n_select"] + med["n_masks"]) /
                                        (med["e_model"] + med["e_select"] + med["e_masks"]), 2),
                       request_ratio=round(med["n_request"] / med["e_request"], 2),
                       cache_bytes=bytes_["prompt"] + bytes_["beams"], replicated_bytes=replicated)
            results.append(row)
            print(json.dumps(row), flush=True)
    return dict(backend=backend, items=int(codes.shape[0] - 1), dim=args.dim, results=results)


def add_arguments(ap):
    ap.add_argument("--beams", type=int, nargs="+", default=[16, 64], help="beam widths")
    ap.add_argument("--prompts", type=int, nargs="+", default=[50, 200], help="prompt lengths (tokens)")
    ap.add_argument("--users", type=int, default=2, help="users decoded together")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (medians)")
    ap.add_argument("--items", type=int, default=12101, help="catalogue size")
    ap.add_argument("--dim", type=int, default=64, help="decoder width")
    ap.add_argument("--blocks", type=int, default=2, help="decoder blocks")
    ap.add_argument("--heads", type=int, default=2, help="attention heads")
    ap.add_argument("--threads", type=int, default=0, help="MindSpore CPU threads (0: its default)")
    ap.add_argument("--backend", default="auto", help="ops backend")
    ap.add_argument("--out", default=None, help="also write the JSON here")


def run(args) -> int:
    if args.threads:
        from mindgr.runtime import limit_threads, select_device
        select_device()
        limit_threads(args.threads)
    out = measure(args)
    print(f"{'prompt':>6} {'beam':>4} | {'engine ms/step: model (prompt, beam) select masks':<52} | "
          f"{'naive ms/step: model select masks':<36} | step ratio | request ms engine / naive (ratio)")
    for r in out["results"]:
        print(f"{r['prompt']:>6} {r['beam']:>4} | {r['e_model']:8.2f} ({r['e_prompt']:7.2f}, {r['e_beam']:7.2f})"
              f" {r['e_select']:8.3f} {r['e_masks']:8.3f}{'':>8} | {r['n_model']:9.2f} {r['n_select']:8.3f}"
              f" {r['n_masks']:8.2f}{'':>7} | {r['step_ratio']:9.1f}x | {r['e_request']:8.1f} / "
              f"{r['n_request']:8.1f} ({r['request_ratio']:.1f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def main(argv=None):
    """`python -m mindgr.bench.decode`, as recorded in benchmarks/results: the same as `mindgr bench decode`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
