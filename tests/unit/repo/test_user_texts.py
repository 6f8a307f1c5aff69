"""What a user reads (README, docs/, configs/, benchmarks/results/*.md, the messages in mindgr/) names no
internal work items (issue numbers, sessions, numbered work periods, people's jobs) and no absolute paths of
one machine."""
import ast
import re
from pathlib import Path

from conftest import REPO

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
INTERNAL = [
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue number"),
    (re.compile(r"\bthe issue'?s\b", re.I), "'the issue'"),
    (re.compile(r"\bsessions?\b", re.I), "'session'"),
    (re.compile(rf"\b({ORDINALS})\s+(work\s+)?(period|round|helper|engineer)s?\b", re.I), "a numbered work period"),
    (re.compile(r"\bcoordinator\b", re.I), "'coordinator'"),
    (re.compile(r"\bhelpers?\b", re.I), "'helper'"),
    (re.compile(r"other engineers", re.I), "other people's jobs"),
]
ABSOLUTE = re.compile(r"(?<![\w.~-])/(work|tmp|root|home)(/|\b)")


def user_files():
    files = [REPO / "README.md"]
    for folder, pattern in (("docs", "*.md"), ("configs", "*.yaml"), ("benchmarks/results", "*.md")):
        files += sorted((REPO / folder).rglob(pattern))
    return files


def hits(text: str):
    found = [(what, m.group(0)) for pattern, what in INTERNAL for m in pattern.finditer(text)]
    found += [("an absolute machine path", m.group(0)) for m in ABSOLUTE.finditer(text)]
    return found


def test_the_patterns_catch_what_they_are_for():
    assert hits("see issue 17 and the issue's base") and hits("measured in the seventh session")
    assert hits("the coordinator paused jobs") and hits("reads /work/shared/data") and hits("in /tmp/x")
    assert not hits("reads ../shared/data/ml-1m and runs/beauty-hstu") and not hits("a user's history")


def test_user_facing_files_carry_no_internal_words_or_absolute_paths():
    bad = []
    for path in user_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            bad += [f"{path.relative_to(REPO)}:{n}: {what}: {text!r}" for what, text in hits(line)]
    assert not bad, "\n".join(bad[:40])


def _messages(path: Path):
    """String literals of a module that are not docstrings (messages, help texts, log lines)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_messages_carry_no_internal_words_or_absolute_paths():
    bad = []
    for path in sorted((REPO / "mindgr").rglob("*.py")):
        for n, text in _messages(path):
            # the synthetic users' browsing sessions are not work sessions
            found = [h for h in hits(text) if not (h[0] == "'session'" and re.search(r"new_session|browsing", text))]
            bad += [f"{path.relative_to(REPO)}:{n}: {what}: {t!r}" for what, t in found]
    assert not bad, "\n".join(bad[:40])
