"""The README cannot go stale: its test command is the CI command, every `mindgr` line of its shell blocks
(and of the docs' blocks) parses and its configs load, and the lines that work on the built-in synthetic
data run as written (training lines with --quick, their short-run form) in a scratch directory."""
import os
import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO
PAGES = [REPO / "README.md", REPO / "docs" / "training.md", REPO / "docs" / "generative.md",
         REPO / "docs" / "serving.md"]


def shell_lines(path: Path) -> list[str]:
    """Lines of the page's ```bash blocks, continuation lines joined, comments dropped."""
    text = path.read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s\[--[^\]]*\]", "", line.split(" #")[0]).strip()   # drop optional [--flag ...]
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def mindgr_commands(path: Path) -> list[list[str]]:
    """Every `mindgr ...` command of the page's shell blocks as argv (after `mindgr`)."""
    out = []
    for line in shell_lines(path):
        for part in re.split(r"&&|;|\bdo\b|\bdone\b", line):
            words = shlex.split(part.strip().rstrip("&").strip())
            if words and words[0].endswith("mindgr"):
                out.append(words[1:])
    return out


def test_the_readme_test_command_is_the_ci_command():
    ci = (REPO / ".ci" / "run").read_text()
    command = next(l for l in ci.splitlines() if "-m pytest" in l).strip()
    env = next(l for l in ci.splitlines() if l.startswith("export ")).split(None, 1)[1].strip()
    readme = (REPO / "README.md").read_text()
    assert f"{env} {command}" in readme, "README's test command differs from .ci/run's"
    fast = command.replace(" tests", " tests/unit")
    assert f"{env} {fast}" in readme, "README's day-to-day command is not the CI command on tests/unit"
    assert '.venv/bin/pip install -e ".[test]"' in readme and 'pip install -q -e ".[test]"' in ci


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_parses_and_its_config_loads(page):
    from mindgr.cli import build_parser, quick_overrides
    from mindgr.config import load_config
    commands = mindgr_commands(page)
    assert commands, f"{page.name}: no mindgr command found"
    parser = build_parser()
    for argv in commands:
        args, extra = parser.parse_known_args(argv)
        bad = [w for w in extra if "=" not in w or w.startswith("-")]
        assert not bad, f"{page.name}: mindgr {' '.join(argv)}: unknown {bad}"
        if getattr(args, "config", None):
            assert (REPO / args.config).is_file(), f"{page.name}: {args.config} does not exist"
            overrides = list(args.set or []) + extra
            cfg = load_config(str(REPO / args.config), overrides)
            if getattr(args, "quick", False):
                load_config(str(REPO / args.config), quick_overrides(cfg) + overrides)


# The README lines that run on the built-in synthetic data (the smoke runs), as written.
RUNNABLE = re.compile(r"(configs/smoke\.yaml|runs/smoke)")


@pytest.mark.slow   # a few short training runs, eval, recommend, compare and export: ~2 min on a busy host
def test_the_readme_smoke_lines_run_as_written(tmp_path, capsys):
    from mindgr.cli import main
    (tmp_path / "configs").symlink_to(REPO / "configs")
    commands = [argv for argv in mindgr_commands(REPO / "README.md")
                if RUNNABLE.search(" ".join(argv)) and "serve" not in argv and "--nproc" not in argv]
    kinds = {argv[0] for argv in commands}
    assert {"train", "eval", "recommend", "compare", "export"} <= kinds, kinds
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for argv in commands:
            if argv[0] == "train" and "--quick" not in argv:
                argv = argv + ["--quick"]          # the short-run form of the same line
            assert main(argv) == 0, f"mindgr {' '.join(argv)}"
            capsys.readouterr()
    finally:
        os.chdir(cwd)
    assert (tmp_path / "runs" / "smoke" / "checkpoints" / "best.json").is_file()
    assert (tmp_path / "exported" / "manifest.json").is_file()
