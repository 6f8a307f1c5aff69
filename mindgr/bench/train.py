"""`mindgr bench train`: real tokens/s, step time and MFU of the compiled training step of a config
(with --backends: several op backends side by side, mindgr.bench.backends)."""
from __future__ import annotations

import tempfile

import numpy as np

from mindgr.bench import (add_config_arguments, add_out_argument, config_overrides, load_bench_config, quiet_run,
                          write_result)


def _kernel_isa(backend: str) -> str | None:
    """The vector ISA of the C++ kernels when the cpu backend runs them (None otherwise)."""
    if backend != "cpu":
        return None
    from mindgr.ops import cpu
    return cpu.isa()


ZIPF_FIRST = 0.5     # skew of the synthetic first codes: p(code of rank r) ~ r^-0.5, as k-means buckets are uneven


def synthetic_codes(num_items: int, levels: int, codes_per_level: int, seed: int) -> tuple[np.ndarray, list]:
    """A seeded semantic-ID table [V+1, levels + 1] for a benchmark without a tokenised run: first codes
    drawn with a Zipf skew, later codes uniform, then the de-duplication digit of the tokenizer."""
    from mindgr.ids.tokenizer import dedup_digit
    rng = np.random.default_rng([seed, 42])
    p = np.arange(1, codes_per_level + 1, dtype=np.float64) ** -ZIPF_FIRST
    first = rng.permutation(codes_per_level)[rng.choice(codes_per_level, num_items, p=p / p.sum())]
    rest = rng.integers(0, codes_per_level, (num_items, levels - 1))
    prefix = np.concatenate([first[:, None], rest], 1)
    digit, largest, _ = dedup_digit(prefix)
    codes = np.zeros((num_items + 1, levels + 1), np.int32)
    codes[1:, :levels], codes[1:, levels] = prefix, digit
    return codes, [codes_per_level] * levels + [largest]


def _gr_synthetic_codes(cfg, tmp: str) -> str | None:
    """A GR config with neither ids.codes nor ids.from_run: write a synthetic table of the data's catalogue
    (ids.levels x ids.codes_per_level, seed ids.seed) and point ids.codes at it. Returns a description."""
    from mindgr.train.tasks import task_class
    if not task_class(cfg).semantic_ids or cfg.ids.codes or cfg.ids.from_run:
        return None
    from pathlib import Path
    from mindgr.ids.codes import save_codes
    from mindgr.train.data import load_store
    store = load_store(cfg.data, cfg.run.seed)
    codes, sizes = synthetic_codes(store.num_items, cfg.ids.levels, cfg.ids.codes_per_level, cfg.ids.seed)
    path = save_codes(Path(tmp) / "codes.parquet", codes, sizes, store.item_raw_ids, {"synthetic": True})
    cfg.ids.codes = str(path)
    return f"synthetic codes {'x'.join(str(s) for s in sizes)}"


def _trie_capacities(trainer) -> list | None:
    """The most children any prefix has, per level (a GR run's trie), else None."""
    trie = getattr(trainer.executor.task, "trie", None)
    return None if trie is None else [int(m.sum(1).max()) for m in trie.masks]


def bench_train(cfg, steps: int = 20, warmup: int = 3, out: str | None = None) -> dict:
    from mindgr.train.local import LocalExecutor
    from mindgr.train.loop import TrainLoop
    from mindgr.train.peak import busy_reason, measure_peak, quiet_peak
    from mindgr.train.tasks import resolve_task
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run.out_dir, cfg.run.name = tmp, "bench"
        quiet_run(cfg)
        codes_note = _gr_synthetic_codes(cfg, tmp)
        trainer = TrainLoop(cfg, LocalExecutor(cfg, resolve_task(cfg)), quiet=True)   # the config's task
        train_data = trainer.executor.task.examples          # the global capacities
        from mindgr.bench.backends import peak_rss_mb, rss_mb
        rss_before = rss_mb()
        compile_s = trainer.run_steps(1)["step_s"]          # the first step includes the compile
        peak_first = peak_rss_mb()                          # data + compiled step + one step's buffers
        if warmup > 1:
            trainer.run_steps(warmup - 1)
        block = trainer.run_steps(steps)
        times, tokens, flops = block["step_times"], block["tokens"], block["flops"]
        fill = block["fill"] / max(block["steps"], 1)
        # the MFU denominator measured now, in this process, under the same host load as the steps
        measured = measure_peak()
        peak = measured["flops_per_s"]
    total = float(np.sum(times))
    isa = _kernel_isa(trainer.backend)
    result = {
        "arch": cfg.model.arch, "backend": trainer.backend, "token_capacity": train_data.token_capacity,
        "row_capacity": train_data.row_capacity, "steps": steps, "first_step_s_incl_compile": compile_s,
        "step_time_s_median": float(np.median(times)), "real_tokens_per_s": tokens / total,
        "fill": float(fill), "model_tflops_per_step": flops / steps / 1e12,
        "mfu": flops / total / peak, "peak_gflops": peak / 1e9,
        "rss_before_mb": rss_before, "peak_rss_first_step_mb": peak_first,
        "peak_rss_mb": peak_rss_mb(), "kernel_isa": isa,
        "peak_busy": busy_reason(measured, quiet_peak()), "codes": codes_note,
        "trie_children_max": _trie_capacities(trainer),
    }
    print(f"bench train [{cfg.model.arch}, backend {result['backend']}, T_cap {result['token_capacity']}, "
          f"B_cap {result['row_capacity']}]" + (f", C++ kernels {isa}" if isa else ""))
    if result["trie_children_max"] is not None:
        print(f"  {codes_note or 'codes ' + cfg.ids.codes}; trie softmax {cfg.model.trie_softmax}, most "
              f"children per level {result['trie_children_max']}")
    print(f"  step time (median of {steps}) {result['step_time_s_median'] * 1e3:.1f} ms | first step incl. "
          f"compile {compile_s:.1f} s")
    print(f"  resident memory {result['rss_before_mb']:.0f} MB before the first step, peak "
          f"{result['peak_rss_first_step_mb']:.0f} MB after it (compile included), {result['peak_rss_mb']:.0f} MB "
          f"after every step")
    print(f"  real tokens/s {result['real_tokens_per_s']:.0f} | fill {result['fill']:.3f} | "
          f"MFU {result['mfu'] * 100:.2f}% of {result['peak_gflops']:.1f} GFLOP/s (MindSpore fp32 MatMul peak, "
          f"measured in this run after the steps)")
    if result["peak_busy"]:
        print(f"  note: the host was busy while the peak was measured ({result['peak_busy']}): MFU reads high")
    return write_result(result, out)


def add_arguments(parser):
    add_config_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first, compile included")
    parser.add_argument("--backends", help="compare op backends side by side, e.g. reference,cpu")
    parser.add_argument("--no-memory", action="store_true", help="--backends: skip the per-backend memory runs")
    add_out_argument(parser)


def run(args) -> int:
    cfg = load_bench_config(args)   # a bad config: one line before anything is built
    if args.backends:
        from mindgr.bench.backends import bench_backends
        bench_backends(args.config, config_overrides(args), args.backends.split(","), steps=args.steps,
                       memory=not args.no_memory, out=args.out)
        return 0
    bench_train(cfg, steps=args.steps, warmup=args.warmup, out=args.out)
    return 0
