"""Shared-prompt (tree) layout vs copied rows for GR training: tokens per user and training-step time.

mindgr bench gr-tree [--items 20 50] [--users 4] [--repeats 5] [--backend cpu]
                     [--variants ntp:item ntp:pairs page_ntp:none ntp:none]
(also as python -m mindgr.bench.gr_tree ...)

A random-weight GR decoder of a Beauty-like shape (Lt = 4 levels 256/256/256/32, D = 64, 2 blocks,
2 heads) and `users` random histories of `items` items (page_ntp: random pages of 1-4 items). Per
variant (objective:merger) both layouts hold the same users in one batch at exact-fit capacities; each
gets its compiled train step (value_and_grad + AdamWeightDecay), a warm-up, then the two steps run
alternately `repeats` times; figures are medians. `copied` is mindgr.models.ntp's layout (for ntp without
merger that is the gr helper's one flat row per user, already free of copies). The first step's losses of
the two layouts are printed too (equal weights, so they must agree).
The host is shared and noisy: read the ratio column of one run, not absolute times.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

SIZES = [256, 256, 256, 32]


def _codes(rng, num_items):
    seen, rows = set(), []
    while len(rows) < num_items:
        t = (int(rng.integers(64)), int(rng.integers(256)), int(rng.integers(256)), int(rng.integers(32)))
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return np.concatenate([np.zeros((1, 4), np.int64), np.asarray(rows)])


def _pages(rng, n):
    sizes = rng.integers(1, 5, n)
    return np.repeat(np.arange(n), sizes)[:n]


def _steps(objective, merger, histories, codes, args):
    from mindspore import nn

    from mindgr.models.generative import GRDecoder
    from mindgr.models.ntp import NTPLoss, batch_tensors, pack_rows, user_rows
    from mindgr.models.tree import (TreeCaps, TreeNTPLoss, pack_tree, tree_tensors, tree_tokens, tree_user,
                                    virtual_tokens)
    from mindgr.train.step import TrainStep

    lt = len(SIZES)
    max_len = args.max_items * lt + lt
    out = {}
    for layout in ("copied", "tree"):
        dec = GRDecoder(SIZES, args.dim, 2, 2, args.dim // 2, args.dim // 2, max_len=max_len,
                        token_merger=merger, seed=0)
        lo, group, pad = dec.level_offsets, dec.group, dec.pad_id
        if layout == "copied":
            rows = [r for items, pages in histories
                    for r in user_rows(items, codes, lo, objective, merger, pages=pages)]
            tokens = sum(r["slots"].shape[0] for r in rows)
            (batch,) = pack_rows(rows, tokens, len(rows), group, pad)
            loss, inputs = NTPLoss(dec), batch_tensors(batch)
        else:
            users = [tree_user(items, codes, lo, objective, merger, pages=pages) for items, pages in histories]
            tokens = sum(tree_tokens(u) for u in users)
            tp = sum(u["prompt_slots"].shape[0] for u in users)
            caps = TreeCaps(tp, tokens - tp, len(users), sum(len(u["targets"]) for u in users),
                            sum(virtual_tokens(u) for u in users), max_len)
            (batch,) = pack_tree(users, caps, lt, group, pad)
            loss, inputs = TreeNTPLoss(dec, caps), tree_tensors(batch)
        opt = nn.AdamWeightDecay(dec.trainable_params(), learning_rate=1e-3)
        step = TrainStep(loss, opt)
        step.set_train(True)
        t0 = time.perf_counter()
        first = float(step(*inputs).asnumpy())
        out[layout] = dict(step=step, inputs=inputs, tokens=tokens, first_loss=first,
                           compile_s=time.perf_counter() - t0)
    return out


def measure(args):
    import mindspore as ms
    from mindgr.ops import set_backend
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    backend = set_backend(args.backend)
    rng = np.random.default_rng(0)
    codes = _codes(rng, args.catalogue)
    args.max_items = max(args.items)
    results = []
    for n in args.items:
        histories = [(rng.integers(1, codes.shape[0], n), _pages(rng, n)) for _ in range(args.users)]
        for variant in args.variants:
            objective, merger = variant.split(":")
            s = _steps(objective, merger, histories, codes, args)
            times = {k: [] for k in s}
            for _ in range(args.repeats):
                for k, v in s.items():
                    t1 = time.perf_counter()
                    v["step"](*v["inputs"]).asnumpy()
                    times[k].append(time.perf_counter() - t1)
            med = {k: float(np.median(t)) * 1e3 for k, t in times.items()}
            rec = dict(items=n, objective=objective, merger=merger, backend=backend,
                       tokens_per_user={k: s[k]["tokens"] / args.users for k in s},
                       step_ms=med, time_ratio=med["tree"] / med["copied"],
                       token_ratio=s["tree"]["tokens"] / s["copied"]["tokens"],
                       first_loss={k: s[k]["first_loss"] for k in s})
            results.append(rec)
            print(json.dumps(rec), flush=True)
    print(f"\nbackend {backend}, {args.users} users per batch, Lt=4, D={args.dim}, medians of {args.repeats} "
          "alternating steps (shared host: read ratios)")
    print("| items | objective | merger | tokens/user copied | tree | tree/copied | step ms copied | tree | tree/copied |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t, m = r["tokens_per_user"], r["step_ms"]
        print(f"| {r['items']} | {r['objective']} | {r['merger']} | {t['copied']:.0f} | {t['tree']:.0f} | "
              f"{r['token_ratio']:.2f} | {m['copied']:.1f} | {m['tree']:.1f} | {r['time_ratio']:.2f} |")
    return results


def add_arguments(p):
    p.add_argument("--items", type=int, nargs="+", default=[20, 50], help="history lengths (items)")
    p.add_argument("--users", type=int, default=4, help="users in the batch")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (medians)")
    p.add_argument("--dim", type=int, default=64, help="decoder width")
    p.add_argument("--catalogue", type=int, default=2000, help="items in the catalogue")
    p.add_argument("--backend", default="cpu", help="ops backend")
    p.add_argument("--variants", nargs="+", default=["ntp:item", "ntp:pairs", "page_ntp:none", "ntp:none"],
                   help="objective:merger pairs")


def run(args) -> int:
    measure(args)
    return 0


def main(argv=None):
    """`python -m mindgr.bench.gr_tree`, as recorded in benchmarks/results: the same as `mindgr bench gr-tree`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    main()
