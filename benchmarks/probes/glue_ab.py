"""In-process A/B of the HSTU block glue's LayerNorms on the cpu backend (GRAPH mode, one process).

    PYTHONPATH=$PWD python benchmarks/probes/glue_ab.py [--tokens 13824] [--rounds 12] [--full-rows]

Three ways to compute LayerNorm(x) and u * LayerNorm(A v), everything else the cpu backend:
  composed  the reference: ~7 generic MindSpore ops per LayerNorm and their gradients (the old glue)
  ms_prim   MindSpore's own fused ops.LayerNorm primitive (gamma = 1, beta = 0) with its LayerNormGrad
  fused     mindgr.ops.cpu layer_norm / gated_layer_norm (layernorm.cc)
  floor     no LayerNorm at all (x, u * y): WRONG math, timing only, the cost of everything around it
Each is timed (a) as one HSTUBlock forward + backward (value_and_grad w.r.t. x and every parameter)
at ML-1M shape (D 50, H 1, dqk = dv = 50, N 200, time bias), and (b) as the glue alone: LN(x) and
u * LN(y) forward + backward over [T, 50]. The variants' graphs are compiled once each by swapping
the op table entry (mindgr.ops.backend.ACTIVE) before the first call; then calls alternate
(the order rotates every round). Prints median [min, max] ms, ratios of medians, the glue's share
of the block (glue-alone median / block median), the largest differences from `composed`, and
what the fused LayerNorms cost over `floor`.
Rows: log-normal lengths (median 60, cut to [1, N]) filling --tokens with a short unused tail,
or 200-token rows (--full-rows: attention at its most expensive, so the glue's smallest share).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=13824)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--full-rows", action="store_true")
    args = ap.parse_args(argv)

    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindgr.runtime import select_device
    select_device()
    ms.set_context(mode=ms.GRAPH_MODE)
    from mindgr.models.hstu import HSTUBlock
    from mindgr.ops import backend, cpu, reference
    backend.set_backend("cpu", strict=False)
    print(f"kernels: {cpu.isa()}, {cpu.kernel_threads()} threads")

    prim = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-6)

    def prim_layer_norm(x, eps=1e-6):
        d = x.shape[-1]
        return prim(x, ops.ones((d,), x.dtype), ops.zeros((d,), x.dtype))[0]

    def prim_gated(u, y, eps=1e-6):
        return u * prim_layer_norm(y, eps)

    def no_norm(x, eps=1e-6):
        return x

    def no_norm_gated(u, y, eps=1e-6):
        return u * y

    variants = {"composed": (reference.layer_norm, reference.gated_layer_norm),
                "ms_prim": (prim_layer_norm, prim_gated),
                "fused": (cpu.layer_norm, cpu.gated_layer_norm),
                "floor": (no_norm, no_norm_gated)}

    rng = np.random.default_rng(0)
    N, D, T = 200, 50, args.tokens
    if args.full_rows:
        lengths = [N] * (T // N)
    else:
        lengths, total = [], 0
        while True:
            n = int(np.clip(round(rng.lognormal(np.log(60), 1.0)), 1, N))
            if total + n > T - 16:
                break
            lengths.append(n)
            total += n
    offsets = Tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ts = Tensor(np.cumsum(rng.integers(0, 100000, T)).astype(np.int64))
    x = Tensor(rng.standard_normal((T, D)).astype(np.float32))
    u = Tensor(rng.standard_normal((T, D)).astype(np.float32))
    y = Tensor(rng.standard_normal((T, D)).astype(np.float32))
    print(f"T {T} tokens, {len(lengths)} rows ({int(sum(lengths))} real tokens), D {D}, N {N}")

    class BlockLoss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.b = HSTUBlock(np.random.default_rng(1), D, 1, D, D, N, 128, True, "b")

        def construct(self, x, o, t):
            return self.b(x, o, t).sum()

    class GlueLoss(nn.Cell):
        def __init__(self, ln, gated):
            super().__init__()
            self.ln, self.gated = ln, gated

        def construct(self, x, u, y):
            return (self.ln(x) * y).sum() + self.gated(u, y).sum()

    fns, first = {}, {}
    saved = dict(backend.ACTIVE)
    for name, (ln, gated) in variants.items():
        backend.ACTIVE["layer_norm"], backend.ACTIVE["gated_layer_norm"] = ln, gated
        cell = BlockLoss()
        block = ms.value_and_grad(cell, 0, cell.trainable_params())
        glue = ms.value_and_grad(GlueLoss(ln, gated), (0, 1, 2))
        first[name] = (block(x, offsets, ts), glue(x, u, y))        # compiles with this table entry
        fns[name] = {"block": lambda f=block: f(x, offsets, ts), "glue": lambda f=glue: f(x, u, y)}
    backend.ACTIVE.clear()
    backend.ACTIVE.update(saved)

    def flat(res):
        (bv, (bdx, bdw)), (gv, gd) = res
        return [bv, bdx, *bdw, gv, *gd]

    ref = [a.asnumpy() for a in flat(first["composed"])]
    for name in [n for n in variants if n != "floor"]:
        got = [a.asnumpy() for a in flat(first[name])]
        err = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)) for g, r in zip(got, ref))
        print(f"{name}: largest |diff| / scale vs composed over loss and all gradients: {err:.2g}")

    times = {(n, part): [] for n in variants for part in ("block", "glue")}
    names = list(variants)
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for part in ("block", "glue"):
            for n in order:
                t0 = time.perf_counter()
                res = fns[n][part]()
                res[0].asnumpy()
                times[(n, part)].append(time.perf_counter() - t0)

    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"\n{args.rounds} alternating rounds, ms median [min, max]:")
    print(f"{'variant':10s} {'block fwd+bwd':>26s} {'glue alone fwd+bwd':>26s} {'glue share':>11s}")
    for n in names:
        cols = []
        for part in ("block", "glue"):
            v = np.array(times[(n, part)]) * 1e3
            cols.append(f"{med[(n, part)]:8.1f} [{v.min():7.1f}, {v.max():7.1f}]")
        print(f"{n:10s} {cols[0]:>26s} {cols[1]:>26s} {med[(n, 'glue')] / med[(n, 'block')]:10.0%}")
    for n in names[1:3]:
        print(f"composed / {n}: block {med[('composed', 'block')] / med[(n, 'block')]:.2f}x, "
              f"glue {med[('composed', 'glue')] / med[(n, 'glue')]:.2f}x")
    print(f"fused over floor: block +{med[('fused', 'block')] - med[('floor', 'block')]:.1f} ms, "
          f"glue +{med[('fused', 'glue')] - med[('floor', 'glue')]:.1f} ms (what the two LayerNorms still cost)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
