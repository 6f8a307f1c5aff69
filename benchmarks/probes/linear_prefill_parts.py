"""Where the linear-attention decoder's prefill goes, and the least it could cost on this CPU.

    python benchmarks/probes/linear_prefill_parts.py [--prompt 4000] [--users 2] [--threads 1]

The decoder of `mindgr bench decode --backbone linear` (D 128, 2 heads of 64, 2 blocks, random weights).
Prints the median ms of the prefill graph the decoding states run, of its parts compiled as graphs of
their own (the input embedding; block 1's projection, attention, output and prompt states; the last block,
which projects only k and v for every token), and of the prefill's three GEMMs alone: x W_uvqk and
o W_out of the first block, x W_vk of the last. The GEMMs are work every layout's prefill must do, so
their sum bounds from below what a prefill can cost here (the OneLA / per-beam ratio of the whole search
is (prefill + per-beam decode) / (prefill + OneLA decode)).
"""
import argparse
import time
import types

import numpy as np


def median_ms(fn, repeats=10):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def part_cell():
    from mindspore import nn, ops

    class Part(nn.Cell):
        """One piece of the prefill as a graph of its own (`what`)."""

        def __init__(self, dec, users, prompt, what):
            super().__init__()
            self.dec, self.u, self.p, self.what = dec, users, prompt, what

        def construct(self, a, b=None, c=None, d=None):
            first, final = self.dec.blocks[0], self.dec.blocks[self.dec.num_blocks - 1]
            if self.what == "embed":
                return self.dec.embed(a, b)
            if self.what == "project":
                return first._projected(a)
            if self.what == "attend":
                return first._attention(a, b, c, d)
            if self.what == "output":
                return first._output(a, b, c)
            if self.what == "states":
                return first._prompt_states(a, b, c, self.u, self.p)
            if self.what == "first":
                return first.prompt_forward(a, b, self.u, self.p)
            if self.what == "last":
                return final.prompt_last(a, b, self.u, self.p, c)
            return ops.matmul(a, b)

    return Part


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=4000)
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from mindgr.runtime import limit_threads
    limit_threads(args.threads)
    from mindspore import Tensor
    from mindgr.bench.decode import build_linear
    from mindgr.models.kv_cache import prompt_batch
    from mindgr.models.linear_decode import LinearPrefillCell

    p, u = args.prompt, args.users
    spec = types.SimpleNamespace(backbone="linear", backend="auto", items=12101, prompts=[p], dim=128, heads=2,
                                 blocks=2)
    dec, _, codes, backend, rng = build_linear(spec)
    hist = [rng.integers(1, codes.shape[0], p // dec.num_levels) for _ in range(u)]
    slots, merged, offsets, last, _ = prompt_batch(dec, dec.prompts(hist, codes, p), u, p)
    slots, merged, offsets, last = (Tensor(a) for a in (slots, merged, offsets, last))
    first, final = dec.blocks[0], dec.blocks[-1]
    Part = part_cell()

    def run(cell, *xs):
        out = cell(*xs)
        (out[0] if isinstance(out, tuple) else out).asnumpy()

    prefill = LinearPrefillCell(dec, u, p)
    prefill.set_train(False)
    embed = Part(dec, u, p, "embed")
    x = embed(slots, merged)
    project = Part(dec, u, p, "project")
    h_u, q, k, v = project(x)
    attend = Part(dec, u, p, "attend")
    att = attend(q, k, v, offsets)
    output = Part(dec, u, p, "output")
    states = Part(dec, u, p, "states")
    whole_first = Part(dec, u, p, "first")
    y = whole_first(x, offsets)[0]
    whole_last = Part(dec, u, p, "last")
    gemm = Part(dec, u, p, "gemm")
    t = x.shape[0]
    width_vk = final.h * (final.dv + final.dqk)
    mats = [(x, first.w_uvqk), (Tensor(np.ones((t, first.h * first.dv), np.float32)), first.w_out),
            (x, Tensor(np.ones((x.shape[1], width_vk), np.float32)))]
    rows = [("prefill graph", median_ms(lambda: run(prefill, slots, merged, offsets, last))),
            ("  embedding", median_ms(lambda: run(embed, slots, merged))),
            ("  block 1", median_ms(lambda: run(whole_first, x, offsets))),
            ("    projection (LN, x W_uvqk, SiLU, split)", median_ms(lambda: run(project, x))),
            ("    attention (chunked / fused kernel)", median_ms(lambda: run(attend, q, k, v, offsets))),
            ("    output (u * LN(o), o W_out, residual)", median_ms(lambda: run(output, x, h_u, att))),
            ("    prompt states", median_ms(lambda: run(states, k, v, offsets))),
            ("  last block (k, v of every token, the last token's output)",
             median_ms(lambda: run(whole_last, y, offsets, last)))]
    gemms = [median_ms(lambda a=a, w=w: run(gemm, a, w)) for a, w in mats]
    flops = [2.0 * t * a.shape[1] * w.shape[1] for a, w in mats]
    rows.append(("the three GEMMs alone", sum(gemms)))
    print(f"{backend} backend, {u} users x {p} prompt tokens ({t} rows), {args.threads} thread(s); ms, median of 10")
    for name, ms_ in rows:
        print(f"{name:<62} {ms_:7.2f}")
    print(f"GEMM rate: {sum(flops) / sum(gemms) / 1e6:.0f} GFLOP/s "
          f"({', '.join(f'{g:.2f}' for g in gemms)} ms)")


if __name__ == "__main__":
    main()
