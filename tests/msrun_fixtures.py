"""Shared by the msrun tests (test_parallel_comm.py, test_parallel_sparse_msrun.py): a script on N ranks
through mindgr.parallel.launch, with a hard timeout (a failed collective desynchronises the ranks)."""
import sys

from conftest import REPO

TIMEOUT = 240


def run_ranks(nproc, log_dir, *task):
    """`python *task` on nproc ranks via mindgr.parallel.launch, with a hard timeout."""
    from mindgr.parallel.launch import run_job
    cmd = [sys.executable, "-m", "mindgr.parallel.launch", "--nproc", str(nproc), "--log-dir", str(log_dir),
           "--threads", "1", "--node-timeout", "10", "--", *task]
    code, out, err, timed_out = run_job(cmd, TIMEOUT, cwd=REPO)
    assert not timed_out, f"{nproc}-rank job timed out after {TIMEOUT}s\n{out[-2000:]}\n{err[-2000:]}"
    return code, out, err
