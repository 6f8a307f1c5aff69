"""The benchmarks behind `mindgr bench NAME`, in the order `mindgr bench --help` lists them.

Each is one module of this package with `add_arguments(parser)` (its own flags: `mindgr bench NAME --help`
shows only those) and `run(args) -> int` (the exit code). A new benchmark is such a module plus one line
here; the cli builds one subcommand per entry and dispatches to its `run`.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from mindgr.bench import (align, balance, decode, distributed, gr_tree, negatives, ops, peak, pipeline, serve,
                          sparse, train)


@dataclass(frozen=True)
class Benchmark:
    name: str             # the subcommand
    module: ModuleType    # add_arguments(parser), run(args) -> int
    summary: str          # one line for `mindgr bench --help`


_ALL = (
    Benchmark("peak", peak, "this machine's fp32 GEMM peak (the MFU denominator), cached in ~/.cache/mindgr"),
    Benchmark("train", train, "tokens/s, step time and MFU of a config's compiled training step "
                              "(--backends: side by side)"),
    Benchmark("ops", ops, "the jagged HSTU attention op alone: C++ kernels vs the padded reference, "
                          "forward + backward"),
    Benchmark("negatives", negatives, "negative-sampling strategies side by side: step time, tokens/s, peak memory"),
    Benchmark("pipeline", pipeline, "busy fraction of the training loop with and without the background "
                                    "input producer"),
    Benchmark("balance", balance, "how evenly the cost model splits a global batch over simulated (and 2 real) "
                                  "ranks"),
    Benchmark("distributed", distributed, "data-parallel scaling efficiency: 2 processes vs 1, same per-rank "
                                          "work (--method reduce: flat vs MindSpore gradient sum)"),
    Benchmark("sparse", sparse, "embedding traffic of the sharded table layouts, modelled and measured; "
                                "staleness runs"),
    Benchmark("serve", serve, "HTTP load test of `mindgr serve` (open-loop arrivals on loopback): throughput, "
                              "p50/p99 latency"),
    Benchmark("decode", decode, "per-step decode time of a random GR decoder: the decoding engine vs the naive "
                                "search"),
    Benchmark("gr-tree", gr_tree, "GR training: tokens per user and step time of the shared-prompt (tree) layout "
                                  "vs copied rows"),
    Benchmark("align", align, "GRPO-SR cost: rollout items/s and the RL step (rollout, scoring, updates) next to "
                              "the SFT step of the GR run it aligns, alternated"),
)

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in _ALL}
