"""Write docs/configuration.md from mindgr/config.py: every key, its type, default, allowed values and the
comment next to it in the code. tests/unit/core/test_config_docs.py fails when the page and the code disagree.

    python scripts/config_docs.py            # rewrite docs/configuration.md
"""
from __future__ import annotations

import ast
import dataclasses
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "configuration.md"

INTRO = """# Configuration keys

Generated from `mindgr/config.py` by `python scripts/config_docs.py` (a test checks that this page and the
code agree). A config is a YAML file of these sections; any key can also be set on the command line as
`section.key=value` (values read as YAML: `1e-3`, `true`, `[1, 10]`), and `mindgr train --config C
--print-config` prints the resolved config. An unknown key, a wrong type or a value out of range is a
one-line error naming the key.

Relative paths (`data.path`, `data.timestamps`, `ids.codes`, `ids.from_run`, `run.out_dir`) are relative to
the directory `mindgr` runs from; every command in the README runs from the repository root, which is what
the shipped configs assume (`../shared/data/...` is the data folder next to the checkout).

`mindgr train --resume` accepts changes only to the keys marked *resumable* (and every `parallel.*` key).

## Building on another config: `base:`

A config can name the config it refines:

```yaml
# configs/ml-1m/hstu-large.yaml
base: hstu.yaml          # relative to this file's directory
run:
  name: ml-1m-hstu-large
model:
  num_blocks: 8
  num_heads: 2
```

- The base is read first, then this file's keys override it section by section: `model.num_blocks` here
  replaces the base's, every other `model` key stays as the base has it. A list (`eval.ks`) or a value is
  replaced whole. Command-line overrides come last.
- A base may have its own `base:`, to any depth; each is found relative to the file that names it.
  Paths inside the sections (`data.path`, `ids.codes`, ...) are not rewritten: they mean what they mean in
  a single file (relative to the working directory).
- To return a key of the base to its default, set it to the default (`data.timestamps: ""`).
- A base that does not exist, a `base:` that is not a file name, or a chain that comes back to a file
  already in it is a one-line error naming the file.
- A run directory's `config.yaml` is the resolved config (no `base:`), so a run never depends on the files
  it was built from.

Shipped examples: `configs/ml-1m/{hstu-large,fuxi-alpha,sasrec,hstu-time-2999}.yaml` refine
`configs/ml-1m/hstu.yaml`, `configs/beauty/sasrec.yaml` refines `configs/beauty/hstu.yaml`,
`configs/gr-smoke.yaml` refines `configs/smoke.yaml` and `configs/gr-pages.yaml` refines
`configs/gr-pages-ids.yaml` (the generative runs on the data of the item-encoder run their semantic IDs come from).

# Keys
"""


def _comments(source: str) -> dict:
    """{(class name, field name): comment}: the comment lines just above a field and the one at its end."""
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                continue
            above, i = [], item.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            end = lines[item.end_lineno - 1]
            trailing = end.split("#", 1)[1].strip() if "#" in end and "#" not in end.split("=", 1)[0] else ""
            text = " ".join(above + ([trailing] if trailing else []))
            out[(node.name, item.target.id)] = text.replace("|", "\\|")
    return out


def _allowed(meta: dict) -> str:
    if meta.get("choices"):
        return ", ".join(f"`{c}`" if c else "`''`" for c in meta["choices"])
    lo, hi = meta.get("lo"), meta.get("hi")
    parts = []
    if lo is not None:
        parts.append(f"{'>' if meta.get('lo_open') else '>='} {lo}")
    if hi is not None:
        parts.append(f"<= {hi}")
    return " and ".join(parts)


def _default(value) -> str:
    if value == "":
        return "`''`"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _doc(obj) -> str | None:
    """A section's docstring, unless it is the one dataclasses generate (the signature)."""
    doc = type(obj).__doc__
    return doc if doc and not doc.startswith(type(obj).__name__ + "(") else None


def render() -> str:
    sys.path.insert(0, str(REPO))
    from mindgr import config as c
    comments = _comments(Path(c.__file__).read_text())
    parts = [INTRO]

    def section(obj, prefix: str, title: str, doc: str | None):
        hints = typing.get_type_hints(type(obj))
        rows, nested = [], []
        for f in dataclasses.fields(obj):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                nested.append((getattr(obj, f.name), f"{prefix}{f.name}."))
                continue
            key = prefix + f.name
            note = comments.get((type(obj).__name__, f.name), "")
            if key in c.RESUMABLE_CHANGES:
                note = (note + " " if note else "") + "*resumable*"
            rows.append(f"| `{key}` | {getattr(tp, '__name__', str(tp))} | {_default(getattr(obj, f.name))} | "
                        f"{_allowed(f.metadata)} | {note} |")
        parts.append(f"## `{title}`\n")
        if doc:
            parts.append(" ".join(doc.split()) + "\n")
        parts.append("| key | type | default | allowed | meaning |\n|---|---|---|---|---|")
        parts.append("\n".join(rows) + "\n")
        for child, child_prefix in nested:
            section(child, child_prefix, child_prefix.rstrip("."), _doc(child))

    cfg = c.Config()
    for f in dataclasses.fields(cfg):
        obj = getattr(cfg, f.name)
        section(obj, f.name + ".", f.name, _doc(obj))
    return "\n".join(parts)


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(REPO)}")
