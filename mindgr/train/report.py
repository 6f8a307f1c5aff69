"""`mindgr report RUN [RUN ...]`: plots of one or several runs over steps, and a table of their final metrics.

Reads only what a run leaves on disk: metrics.jsonl (one JSON record per line: training windows with
`loss` and `tokens_per_s`, evaluations with `eval`) and eval.json (the final metrics, written at the end).
A record logged twice for one step (a resumed run repeats the steps after its checkpoint) counts once: the
later line wins for training windows, the first for evaluations (the final evaluation of the best checkpoint
is logged at the last step too, and is not a point of the validation curve).
"""
from __future__ import annotations

import json
from pathlib import Path

from mindgr.datasets import DataError

class ReportError(ValueError):
    """Something `mindgr report` needs is missing (one line)."""


PLOTS = {"loss": "report-loss.png", "throughput": "report-tokens_per_s.png", "valid": "report-valid.png"}
TABLE = "report.md"
_CURVE_METRICS = ("ndcg@10", "hr@10", "mrr")   # the validation panels, when the run has them


def _records(path: Path) -> list[dict]:
    out = []
    lines = path.read_text(errors="replace").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):
                continue                               # the last line cut short by a kill mid-write
            raise DataError(path, lineno, f"not valid JSON ({e.msg})") from None
        if isinstance(rec, dict):
            out.append(rec)
    return out


def load_run(run_dir) -> dict:
    """A run's curves and final metrics: {name, dir, train: [(step, loss, tokens/s)], valid: [(step, metrics)],
    final: eval.json or None}."""
    d = Path(run_dir)
    if not d.is_dir():
        raise DataError(d, None, "run directory not found" if not d.exists() else "not a directory")
    metrics, final_path = d / "metrics.jsonl", d / "eval.json"
    if not metrics.is_file() and not final_path.is_file():
        raise DataError(d, None, "not a run directory (no metrics.jsonl or eval.json)")
    train, valid = {}, {}
    for rec in _records(metrics) if metrics.is_file() else []:
        step = rec.get("step")
        if not isinstance(step, int):
            continue
        if "loss" in rec and "eval" not in rec:
            train[step] = (rec["loss"], rec.get("tokens_per_s"))
        elif rec.get("eval") == "valid":
            valid.setdefault(step, {k: v for k, v in rec.items() if k == "mrr" or "@" in k})
    final = None
    if final_path.is_file():
        try:
            final = json.loads(final_path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(final_path, e.lineno, f"not valid JSON ({e.msg})") from None
        history = final.get("history") if isinstance(final, dict) else None
        if history:                                    # the per-epoch validation the run kept: authoritative
            valid = {h["step"]: {k: v for k, v in h.items() if k == "mrr" or "@" in k}
                     for h in history if isinstance(h, dict) and "step" in h}
    return {"name": d.name, "dir": d, "train": sorted((s, *v) for s, v in train.items()),
            "valid": sorted(valid.items()), "final": final}


def _labels(runs: list[dict]) -> list[str]:
    names = [r["name"] for r in runs]
    if len(set(names)) == len(names):
        return names
    return [f"{r['dir'].parent.name}/{r['name']}" for r in runs]


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("" if v is None else str(v))


def metrics_table(runs: list[dict], labels: list[str]) -> str:
    """Markdown: one row per run with its final test metrics (eval.json), best checkpoint and popularity."""
    keys: list[str] = []
    for r in runs:
        test = (r["final"] or {}).get("test") or {}
        keys += [k for k in test if (k == "mrr" or "@" in k) and k not in keys]
    keys.sort(key=lambda k: (k == "mrr", k.split("@")[0], int(k.split("@")[1]) if "@" in k else 0))
    head = ["run", "steps", "checkpoint"] + [f"test {k}" for k in keys] + ["popularity ndcg@10"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, label in zip(runs, labels):
        final = r["final"]
        if not final:
            last = r["train"][-1][0] if r["train"] else ""
            rows.append("| " + " | ".join([label, str(last), "(no eval.json: not finished)"] + [""] * len(keys)
                                          + [""]) + " |")
            continue
        ck = final.get("checkpoint") or {}
        where = ck.get("name", "")
        if ck.get("epoch") is not None:
            where += f" (epoch {ck['epoch']}, step {ck.get('step')})"
        test, pop = final.get("test") or {}, final.get("popularity_test") or {}
        rows.append("| " + " | ".join([label, _fmt(final.get("step")), where] + [_fmt(test.get(k)) for k in keys]
                                      + [_fmt(pop.get("ndcg@10"))]) + " |")
    return "\n".join(rows) + "\n"


def _plot(path: Path, panels: list[tuple[str, list]], xlabel: str = "step"):
    """panels: (title, [(label, xs, ys)]) drawn side by side; one line per run."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("mindgr report draws with matplotlib, which is not installed: "
                          "pip install -e \".[report]\" in the checkout (or pip install matplotlib)") from None
    matplotlib.use("Agg")                              # files only: no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels):
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(run_dirs, out=None) -> dict:
    """Write the PNG plots and report.md into `out` (default: the (first) run's directory)."""
    from mindgr.paths import unwritable_reason
    runs = [load_run(d) for d in run_dirs]
    labels = _labels(runs)
    out = Path(out) if out else runs[0]["dir"]
    reason = unwritable_reason(out)
    if reason:
        raise OSError(f"cannot write the report: {reason}")
    out.mkdir(parents=True, exist_ok=True)
    train = [(label, [s for s, _, _ in r["train"]], [l for _, l, _ in r["train"]], [t for _, _, t in r["train"]])
             for r, label in zip(runs, labels) if r["train"]]
    _plot(out / PLOTS["loss"], [("training loss", [(lb, xs, ls) for lb, xs, ls, _ in train])])
    _plot(out / PLOTS["throughput"], [("tokens/s (real tokens, training windows)",
                                       [(lb, [x for x, t in zip(xs, ts) if t is not None],
                                         [t for t in ts if t is not None]) for lb, xs, _, ts in train])])
    names = [k for k in _CURVE_METRICS if any(k in m for r in runs for _, m in r["valid"])]
    panels = [(f"validation {k}", [(label, [s for s, m in r["valid"] if k in m], [m[k] for _, m in r["valid"] if k in m])
                                   for r, label in zip(runs, labels) if r["valid"]]) for k in names]
    _plot(out / PLOTS["valid"], panels or [("validation", [])])
    table = metrics_table(runs, labels)
    (out / TABLE).write_text(f"# Runs\n\n{table}\n" + "".join(f"![{k}]({name})\n" for k, name in PLOTS.items()))
    return {"table": table, "plots": [out / name for name in PLOTS.values()], "out": out}
