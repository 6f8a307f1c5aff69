"""In-process A/B of HSTU's u, v, q, k projection on the cpu backend (GRAPH mode, one process).

    PYTHONPATH=$PWD python benchmarks/probes/silu_ab.py [--tokens 13824] [--rounds 12]

Three ways to compute u, v, q, k = split(SiLU(LN(x) W_uvqk)), everything else the cpu backend:
  sliced     four matmuls on column slices of W_uvqk, each through the generic SiLU (Sigmoid, Mul; backward
             Mul, Mul, SigmoidGrad, Add) -- the block before the fused SiLU split
  split_ref  one matmul, then the reference silu_split: generic SiLU and Split (its backward sums
             zero-filled [T, 200] slice gradients)
  fused      one matmul, then mindgr.ops.cpu silu_split (silu.cc): one pass each way
Each is one HSTUBlock forward + backward (value_and_grad w.r.t. x and every parameter) at ML-1M shape
(D 50, H 1, dqk = dv = 50, N 200, time bias; log-normal row lengths, median 60, filling --tokens).
The variants' graphs are compiled once each; then calls alternate (the order rotates every round).
Prints wall ms and process CPU ms (all threads) per call, median [min, max], ratios of medians, and the
largest difference of the loss and every gradient from `sliced`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=13824)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)

    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindgr.runtime import select_device
    select_device()
    ms.set_context(mode=ms.GRAPH_MODE)
    from mindgr.models.hstu import HSTUBlock
    from mindgr.ops import backend, cpu, reference
    from mindgr.ops.attention import jagged_hstu_attention
    from mindgr.ops.norm import gated_layer_norm, layer_norm
    backend.set_backend("cpu", strict=False)
    print(f"kernels: {cpu.isa()}, {cpu.kernel_threads()} threads")

    class SlicedBlock(HSTUBlock):
        """The block as it was before the fused SiLU split (four sliced matmuls, generic SiLU)."""

        def construct(self, x, offsets, timestamps, request_times=None, drop_mask=None):
            t = x.shape[0]
            hv, hqk = self.h * self.dv, self.h * self.dqk
            xn = layer_norm(x)
            w = self.w_uvqk
            u = ops.silu(ops.matmul(xn, w[:, :hv]))
            v = ops.silu(ops.matmul(xn, w[:, hv:2 * hv])).reshape(t, self.h, self.dv)
            q = ops.silu(ops.matmul(xn, w[:, 2 * hv:2 * hv + hqk])).reshape(t, self.h, self.dqk)
            k = ops.silu(ops.matmul(xn, w[:, 2 * hv + hqk:])).reshape(t, self.h, self.dqk)
            attn = jagged_hstu_attention(q, k, v, offsets, timestamps, self.w_pos, self.w_ts, self.max_len,
                                         request_times)
            o = gated_layer_norm(u, attn.reshape(t, hv))
            return x + ops.matmul(o, self.w_out) + self.b_out

    rng = np.random.default_rng(0)
    N, D, T = 200, 50, args.tokens
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
    cot = Tensor(rng.standard_normal((T, D)).astype(np.float32))
    print(f"T {T} tokens, {len(lengths)} rows ({int(sum(lengths))} real tokens), D {D}, N {N}")

    class BlockLoss(nn.Cell):
        def __init__(self, cls):
            super().__init__()
            self.b = cls(np.random.default_rng(1), D, 1, D, D, N, 128, True, "b")

        def construct(self, x, o, t, c):
            return (self.b(x, o, t) * c).sum()

    variants = {"sliced": (SlicedBlock, cpu.silu_split), "split_ref": (HSTUBlock, reference.silu_split),
                "fused": (HSTUBlock, cpu.silu_split)}
    fns, first = {}, {}
    saved = dict(backend.ACTIVE)
    for name, (cls, split) in variants.items():
        backend.ACTIVE["silu_split"] = split
        cell = BlockLoss(cls)
        f = ms.value_and_grad(cell, 0, cell.trainable_params())
        first[name] = f(x, offsets, ts, cot)                          # compiles with this table entry
        fns[name] = lambda f=f: f(x, offsets, ts, cot)
    backend.ACTIVE.clear()
    backend.ACTIVE.update(saved)

    def flat(res):
        v, (dx, dw) = res
        return [v, dx, *dw]

    ref = [a.asnumpy() for a in flat(first["sliced"])]
    for name in list(variants)[1:]:
        got = [a.asnumpy() for a in flat(first[name])]
        err = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)) for g, r in zip(got, ref))
        print(f"{name}: largest |diff| / scale vs sliced over the loss and all gradients: {err:.2g}")

    wall = {n: [] for n in variants}
    cpu_t = {n: [] for n in variants}
    names = list(variants)
    for i in range(args.rounds):
        for n in names[i % len(names):] + names[:i % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[n]()[0].asnumpy()
            wall[n].append(time.perf_counter() - t0)
            cpu_t[n].append(time.process_time() - c0)
    print(f"\n{args.rounds} alternating rounds, block forward + backward, median [min, max]:")
    print(f"{'variant':10s} {'wall ms':>24s} {'process CPU ms':>24s}")
    med = {}
    for n in names:
        w, c = np.array(wall[n]) * 1e3, np.array(cpu_t[n]) * 1e3
        med[n] = (float(np.median(w)), float(np.median(c)))
        print(f"{n:10s} {med[n][0]:8.1f} [{w.min():6.1f}, {w.max():6.1f}] {med[n][1]:8.1f} [{c.min():6.1f}, {c.max():6.1f}]")
    for n in names[:2]:
        print(f"{n} / fused: wall {med[n][0] / med['fused'][0]:.2f}x, CPU {med[n][1] / med['fused'][1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
