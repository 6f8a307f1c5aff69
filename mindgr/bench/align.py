"""`mindgr bench align`: the cost of GRPO-SR next to the SFT step it starts from. For a grpo_sr config
(its align.init_from GR run and align.reward_run reward run trained), alternated blocks in one process of
(a) RL steps of the alignment task: rollout (beam search of G items per prompt), teacher-forced scoring
(old policy + reference), reward, inner updates; and (b) SFT steps of the GR task on the same data and
decoder (the initial run's config). Prints rollout items/s, the RL step and its parts, the SFT step and
their ratios; the medians of the blocks, so that a loaded host moves both sides alike."""
from __future__ import annotations

import tempfile

import numpy as np

from mindgr.bench import add_config_arguments, add_out_argument, load_bench_config, quiet_run, write_result


def _loops(cfg, tmp: str):
    from mindgr.train.alignment import init_run_config
    from mindgr.train.local import LocalExecutor
    from mindgr.train.loop import TrainLoop
    from mindgr.train.tasks import resolve_task
    cfg.run.out_dir, cfg.run.name = tmp, "bench-align"
    quiet_run(cfg)
    rl = TrainLoop(cfg, LocalExecutor(cfg, resolve_task(cfg)), quiet=True)
    sft_cfg = init_run_config(cfg)
    sft_cfg.run.out_dir, sft_cfg.run.name = tmp, "bench-sft"
    sft_cfg.ops, sft_cfg.parallel = cfg.ops, cfg.parallel
    sft_cfg.train.max_steps, sft_cfg.train.epochs = 0, 1000
    quiet_run(sft_cfg)
    sft = TrainLoop(sft_cfg, LocalExecutor(sft_cfg, resolve_task(sft_cfg)), quiet=True)
    return rl, sft


def bench_align(cfg, steps: int = 5, blocks: int = 3, out: str | None = None) -> dict:
    cfg.train.max_steps, cfg.train.epochs = 0, 1000
    with tempfile.TemporaryDirectory() as tmp:
        rl, sft = _loops(cfg, tmp)
        task = rl.executor.task
        rl.run_steps(1)
        sft.run_steps(1)                                     # compiles
        rl_step, sft_step, items_s, parts = [], [], [], []
        sft_prompts = []
        for _ in range(blocks):                              # alternated: both sides see the same host load
            t = dict(task.timing)
            b = rl.run_steps(steps)
            d = {k: task.timing[k] - t[k] for k in t}
            rl_step.append(b["step_s"] / b["steps"])
            items_s.append(d["items"] / d["generate_s"])
            parts.append({k: d[k] / d["n"] for k in ("generate_s", "score_s", "reward_s", "update_s")})
            s = sft.run_steps(steps)
            sft_step.append(s["step_s"] / s["steps"])
            sft_prompts.append(s["tokens"] / s["steps"])
    sh = task.shape
    med = {k: float(np.median([p[k] for p in parts])) for k in parts[0]}
    result = {"group_size": sh.group, "prompts_per_batch_max": sh.prompts, "inner_updates": cfg.align.inner_updates,
              "rl_token_capacity": sh.token_capacity, "sft_token_capacity": sft.executor.task.examples.token_capacity,
              "steps_per_block": steps, "blocks": blocks,
              "rollout_items_per_s": float(np.median(items_s)), "rl_step_s": float(np.median(rl_step)),
              "rl_parts_s": med, "sft_step_s": float(np.median(sft_step)),
              "rl_over_sft_step": float(np.median(rl_step) / np.median(sft_step)),
              "sft_tokens_per_step": float(np.mean(sft_prompts))}
    print(f"bench align [G {sh.group}, <= {sh.prompts} prompts per rollout batch, {cfg.align.inner_updates} updates; "
          f"T_cap RL {sh.token_capacity} / SFT {result['sft_token_capacity']}; {blocks} alternated blocks of "
          f"{steps} steps, medians]")
    other = result["rl_step_s"] - sum(med.values())
    print(f"  rollout (beam search): {result['rollout_items_per_s']:.0f} items/s")
    print(f"  RL step {result['rl_step_s'] * 1e3:.1f} ms = rollout {med['generate_s'] * 1e3:.1f} + scoring (old + "
          f"reference) {med['score_s'] * 1e3:.1f} + reward {med['reward_s'] * 1e3:.1f} + updates "
          f"{med['update_s'] * 1e3:.1f} ms + other {other * 1e3:.1f} ms (host tensors, accounting)")
    print(f"  SFT step (the initial run's GR task) {result['sft_step_s'] * 1e3:.1f} ms; RL / SFT step "
          f"{result['rl_over_sft_step']:.2f}x")
    return write_result(result, out)


def add_arguments(parser):
    add_config_arguments(parser)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=3, help="alternated blocks of RL and SFT steps")
    add_out_argument(parser)


def run(args) -> int:
    cfg = load_bench_config(args)
    bench_align(cfg, args.steps, args.blocks, args.out)
    return 0
