"""The trie-gathered head alone, forward + backward, at the Beauty GR shape: the fused sampled log-sum-exp
kernel vs composed ops (gather + batched matmul + masked logsumexp) vs the masked full softmax over every
code (the reference), alternated in one process.

    PYTHONPATH=. python benchmarks/probes/trie_head_ab.py [--entries 1904] [--rounds 5] [--iters 5]

The trie is the synthetic one of `mindgr bench train` (configs/bench/gr-beauty-shape.yaml: 12,101 items,
3 x 2048 codes + a de-duplication digit); hidden states, targets and prefix nodes are drawn from it at
random. Prints the median seconds per call of each arm in each round and the ratios.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=1904, help="target items per step ([items, Lt] entries)")
    ap.add_argument("--items", type=int, default=12101)
    ap.add_argument("--codes", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import Tensor, nn
    from mindgr.bench.train import synthetic_codes
    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.models.ntp import NTPLoss
    from mindgr.ops import set_backend
    from mindgr.runtime import select_device
    from mindgr.train.generative import trie_head
    from mindgr.runtime import limit_threads
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()
    limit_threads(args.threads)           # as configs/beauty/gr.yaml (parallel.threads 1)
    set_backend("cpu")
    codes, sizes = synthetic_codes(args.items, 3, args.codes, 0)
    trie = PrefixTrie(codes, sizes)
    lt = len(sizes)
    dec = GRDecoder(sizes, args.dim, 1, 1, args.dim, args.dim, 8, trie_softmax=True)
    rng = np.random.default_rng(0)
    items = rng.integers(1, args.items + 1, args.entries)
    target = (codes[items] + dec.level_offsets[None, :-1]).astype(np.int32)               # [S, Lt]
    group = trie.item_nodes()[items].astype(np.int32)
    h = Tensor(rng.standard_normal((args.entries, lt, args.dim)).astype(np.float32))
    weight = Tensor(np.ones(args.entries * lt, np.float32))

    class Arm(nn.Cell):
        def __init__(self, loss, flat):
            super().__init__()
            self.loss, self.flat = loss, flat

        def construct(self, h, target, group, weight):
            if self.flat:
                ce = self.loss.grouped_ce(self.loss.decoder.logits(h.reshape(-1, h.shape[2])), target.reshape(-1),
                                          group.reshape(-1))
            else:
                ce = self.loss.entry_losses(h.reshape(-1, h.shape[2]), target.reshape(-1), group.reshape(-1))
            return self.loss.weighted_mean(ce, weight)

    arms = {}
    for name in ("fused", "composed"):
        loss = NTPLoss(dec)
        head = trie_head(dec, trie)
        head.fused = name == "fused"
        loss.use_trie_head(head)
        arms[name] = Arm(loss, False)
    arms["masked full"] = Arm(NTPLoss(dec, trie.node_masks()), True)
    grads = {k: ms.value_and_grad(a, 0, dec.trainable_params()) for k, a in arms.items()}
    inputs = (h, Tensor(target), Tensor(group), weight)
    values = {k: float(g(*inputs)[0].asnumpy()) for k, g in grads.items()}     # compile + warm up
    print(f"entries {args.entries} x {lt} levels, children caps {[int(m.sum(1).max()) for m in trie.masks]}, "
          f"losses {values}")
    times = {k: [] for k in grads}
    for r in range(args.rounds):
        for k, g in grads.items():
            t = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                _, gs = g(*inputs)
                gs[0].asnumpy()
                t.append(time.perf_counter() - t0)
            times[k].append(float(np.median(t)))
        print(f"round {r}: " + ", ".join(f"{k} {times[k][-1] * 1e3:.1f} ms" for k in times))
    med = {k: float(np.median(v)) for k, v in times.items()}
    print("median: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
    print(f"composed / fused {med['composed'] / med['fused']:.2f}x, masked full / fused "
          f"{med['masked full'] / med['fused']:.2f}x")


if __name__ == "__main__":
    main()
