"""Decode time of two GR runs (e.g. unmerged vs token merger) on the same test users, alternating rounds
in one process. Usage: PYTHONPATH=$PWD python benchmarks/probes/gr_merger_decode.py RUN_A RUN_B [USERS] [ROUNDS]
(recorded in benchmarks/results/generative.md)."""
import sys, time, json
import numpy as np
from mindgr.train.data import RunData
from mindgr.train.generative import load_generative_run
from mindgr.train.gr_eval import beam_width
from mindgr.generate.engine import DecodingEngine
from mindgr.models.generative import max_prompt_tokens, prompts_of
runs = [load_generative_run(r, threads=1) for r in sys.argv[1:3]]
users = int(sys.argv[3]) if len(sys.argv) > 3 else 256
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
data = RunData(runs[0].cfg)
ev = data.split.test
hist = [np.asarray(h[-runs[0].max_history:], np.int64) for h in ev.histories[:users]]
engines = []
for r in runs:
    p_cap = max_prompt_tokens(r.decoder.num_levels, r.decoder.token_merger, r.max_history)
    e = DecodingEngine(r.decoder, r.trie, r.codes, beam_width(r.cfg.eval), p_cap, users)
    e.search(hist, beam_width(r.cfg.eval))            # compile, untimed
    prompt = np.mean([p[0].shape[0] for p in prompts_of(r.decoder, hist, r.codes, p_cap)])
    engines.append((r, e, p_cap, prompt))
times = [[], []]
for k in range(rounds):
    for i, (r, e, p_cap, prompt) in enumerate(engines):
        t0 = time.perf_counter(); e.search(hist, beam_width(r.cfg.eval)); times[i].append(time.perf_counter() - t0)
for i, (r, e, p_cap, prompt) in enumerate(engines):
    print(json.dumps({"run": str(r.run_dir), "merger": r.cfg.model.token_merger, "prompt_cap": p_cap,
                      "prompt_tokens_mean": float(prompt), "seconds": [round(t, 2) for t in times[i]],
                      "median_s": float(np.median(times[i]))}))
print(json.dumps({"median_ratio_a_over_b": float(np.median(np.array(times[0]) / np.array(times[1])))}))
