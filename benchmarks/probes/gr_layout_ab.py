"""Does the tree layout (data.gr_layout = tree) train a GR epoch faster than copied rows? Both layouts of one
config's real data and code table, each with its own compiled train step (same initial weights), run
strictly alternately over their own epoch-0 batches after a warm-up. Prints per layout the tokens and
batches of an epoch, the median and range of ms per step, the epoch time they imply, and the first
losses; the ratio of epoch times is the figure to read (the host is shared).

    PYTHONPATH=$PWD python benchmarks/probes/gr_layout_ab.py --config configs/beauty/gr.yaml \
        --set data.path=/work/shared/data/amazon-beauty/Beauty.txt --set model.token_merger=item --steps 8
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def build(cfg, layout: str, task_data, codes, trie):
    """(GRModel, GRTrainData | GRTreeData, dropout masks) of one layout."""
    from mindgr.train.generative import GRModel, gr_train_data
    from mindgr.train.masks import DropoutMasks
    cfg.data.gr_layout = layout
    gd = gr_train_data(cfg, task_data, codes, trie)
    model = GRModel(cfg, trie, task_data.num_items, getattr(gd, "caps", None))
    dec = model.decoder
    masks = DropoutMasks(cfg.run.seed, cfg.model.dropout, (dec.dropout_sites, gd.token_capacity, dec.dropout_width))
    return model, gd, masks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], help="SECTION.KEY=VALUE override")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layouts", default="rows,tree", help="comma-separated; one layout = a profile of it alone")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)

    from mindspore import Tensor
    from mindgr.config import load_config
    from mindgr.ids.trie import PrefixTrie
    from mindgr.runtime import setup_mindspore
    from mindgr.train.generative import resolve_codes
    from mindgr.train.task import RetrievalTask

    cfg = load_config(args.config, args.set)
    setup_mindspore(cfg)
    task = RetrievalTask(cfg, check_negatives=False)
    task.load()
    task_data = task.data
    codes = resolve_codes(cfg)
    trie = PrefixTrie(codes.codes, codes.level_sizes)
    sides = {}
    for layout in args.layouts.split(","):
        model, gd, masks = build(cfg, layout, task_data, codes, trie)
        plan = gd.plan.batches(0)
        sides[layout] = dict(model=model, gd=gd, masks=masks, plan=plan, times=[], losses=[])

    def one_step(side, b):
        batch, _ = side["gd"].batch(side["plan"][b])
        inputs = [Tensor(batch[k]) for k in side["gd"].keys] + [Tensor(side["masks"].batch(0, b))]
        t0 = time.perf_counter()
        loss = float(side["model"].train_step(*inputs).asnumpy())
        return time.perf_counter() - t0, loss

    for b in range(args.warmup + args.steps):
        for name, side in sides.items():
            dt, loss = one_step(side, b)
            side["losses"].append(loss)
            if b >= args.warmup:
                side["times"].append(dt)
    result = {}
    for name, side in sides.items():
        med = statistics.median(side["times"])
        result[name] = dict(tokens_per_epoch=int(side["gd"].tokens.sum()), batches_per_epoch=len(side["plan"]),
                            token_capacity=side["gd"].token_capacity, step_ms=med * 1e3,
                            step_ms_range=[min(side["times"]) * 1e3, max(side["times"]) * 1e3],
                            epoch_s=med * len(side["plan"]), first_losses=side["losses"][:3])
        r = result[name]
        print(f"{name}: {r['tokens_per_epoch']} tokens/epoch in {r['batches_per_epoch']} batches of "
              f"{r['token_capacity']} tokens; step {r['step_ms']:.1f} ms [{r['step_ms_range'][0]:.1f}-"
              f"{r['step_ms_range'][1]:.1f}] -> epoch {r['epoch_s']:.1f} s; first losses {r['first_losses']}")
    if {"rows", "tree"} <= set(result):
        result["epoch_ratio_rows_over_tree"] = result["rows"]["epoch_s"] / result["tree"]["epoch_s"]
        print(f"epoch time rows / tree = {result['epoch_ratio_rows_over_tree']:.2f}x "
              f"(medians of {args.steps} alternating steps each)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(config=args.config, overrides=args.set, **result), f, indent=1)


if __name__ == "__main__":
    main()
