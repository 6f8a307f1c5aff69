"""`mindgr bench negatives`: negative strategies side by side on one config (see bench_variants).

The first variant is the published baseline (per_token R=128); the others are shared pools of growing
K (fp32 candidates), FP16 candidates and the mixed strategy. Besides bench_variants' table (step time,
real tokens/s, peak memory per variant in its own process) it reports the acceptance figures of the
shared pool: its step time relative to the baseline, and the largest measured K whose peak memory
(VmHWM) is at most the baseline's, as a multiple of R. Without --config it runs the ML-1M HSTU config;
when that config's data file is missing it prints why and measures nothing.
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG = "configs/ml-1m/hstu.yaml"
BASELINE_R = 128
POOL_SIZES = (4096, 16384, 65536, 131072, 262144)


def _pool(k: int, *extra: str) -> list[str]:
    return ["loss.negatives=shared_pool", f"loss.pool_size={k}", *extra]


class NegativeVariants(dict):
    """name -> overrides, with the hooks bench_variants calls: `prepare` (config and data check) and
    `summarise` (the equal-memory and step-time figures)."""

    def prepare(self, cfg_path, overrides):
        """(config path to run, None) or (None, why nothing can be measured)."""
        from mindgr.config import load_config
        cfg_path = cfg_path or DEFAULT_CONFIG
        cfg = load_config(cfg_path, list(overrides))
        if cfg.data.kind != "synthetic" and cfg.data.path and not Path(cfg.data.path).exists():
            return None, (f"{cfg_path}: data file {cfg.data.path} not found (relative to {Path.cwd()}); "
                          f"run from the repository root with the data in place or set data.path=...")
        return cfg_path, None

    @staticmethod
    def pool_size(overrides) -> int | None:
        """K of a plain shared_pool variant (fp32 candidates), else None."""
        if "loss.negatives=shared_pool" not in overrides or any("fp16" in o for o in overrides):
            return None
        sizes = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("loss.pool_size=")]
        return sizes[0] if sizes else None

    def summarise(self, result: dict) -> dict:
        """Adds result["acceptance"]: step time of each shared pool vs the baseline, and the largest K
        with peak RSS <= the baseline's (ratio K / R); prints them."""
        variants = result["variants"]
        base_name = next(iter(variants))
        base = variants[base_name]
        pools = sorted((k, name) for name, v in variants.items()
                       if (k := self.pool_size(v["overrides"])) is not None)
        summary = {"baseline": base_name, "baseline_peak_rss_mb": base.get("peak_rss_mb"),
                   "step_time_vs_baseline": {name: variants[name]["step_time_s_median"] / base["step_time_s_median"]
                                             for _, name in pools}}
        fits = [(k, name) for k, name in pools
                if base.get("peak_rss_mb") and variants[name].get("peak_rss_mb", float("inf")) <= base["peak_rss_mb"]]
        if fits:
            k, name = fits[-1]
            summary.update(largest_k_at_equal_memory=k, ratio_vs_per_token=k / BASELINE_R,
                           largest_k_is_largest_measured=(k == pools[-1][0]))
        else:
            summary.update(largest_k_at_equal_memory=None, ratio_vs_per_token=None)
        result["acceptance"] = summary
        _print_summary(summary, variants)
        return summary


def _print_summary(s: dict, variants: dict):
    print(f"  step time vs {s['baseline']}: " + ", ".join(
        f"{name} {ratio:.2f}x" for name, ratio in s["step_time_vs_baseline"].items()))
    if s["baseline_peak_rss_mb"] is None:
        print("  equal-memory comparison: not measured (run without --no-memory)")
    elif s["largest_k_at_equal_memory"] is None:
        print(f"  equal peak memory: no measured shared pool stays within {s['baseline']}'s "
              f"{s['baseline_peak_rss_mb']:.0f} MB")
    else:
        k = s["largest_k_at_equal_memory"]
        bound = " (the largest K measured: a lower bound)" if s["largest_k_is_largest_measured"] else ""
        name = next(n for n, v in variants.items() if NegativeVariants.pool_size(v["overrides"]) == k)
        print(f"  equal peak memory: largest shared pool K with peak RSS <= {s['baseline_peak_rss_mb']:.0f} MB "
              f"is K={k} ({variants[name]['peak_rss_mb']:.0f} MB) = {s['ratio_vs_per_token']:.0f}x the "
              f"per-token R={BASELINE_R}{bound}")


NEGATIVE_VARIANTS = NegativeVariants({
    f"per_token R={BASELINE_R}": ["loss.negatives=per_token", f"loss.num_negatives={BASELINE_R}"],
    **{f"shared_pool K={k}": _pool(k) for k in POOL_SIZES},
    "shared_pool K=4096 fp16": _pool(4096, "loss.fp16_negatives=true"),
    "mixed K=4096 + in-batch 1024": ["loss.negatives=mixed", "loss.pool_size=4096", "loss.in_batch_size=1024"],
})


def add_arguments(parser):
    from mindgr.bench import add_config_arguments, add_out_argument
    add_config_arguments(parser, f"the config to measure (default: {DEFAULT_CONFIG})")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-variant memory runs")
    add_out_argument(parser)


def run(args) -> int:
    from mindgr.bench import config_overrides, load_bench_config
    from mindgr.bench.backends import bench_variants
    load_bench_config(args)  # validate first: one line for a bad config
    bench_variants(args.config, config_overrides(args), NEGATIVE_VARIANTS, steps=args.steps,
                   memory=not args.no_memory, out=args.out)
    return 0
