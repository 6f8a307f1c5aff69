"""Shared by the tests of the `mindgr` command (test_cli.py, test_smoke.py, test_models_registry.py): the
command in a subprocess from the repository, as a user runs it, and the check of a one-line error."""
import subprocess
import sys

from conftest import REPO


def run(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "mindgr", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def one_line_error(proc, code, *words):
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = [l for l in proc.stderr.splitlines() if l.startswith("mindgr: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
