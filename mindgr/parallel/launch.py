"""Start N ranks with msrun, show rank 0's progress, and end the job cleanly when a rank fails.

`mindgr train --nproc N ...` and scripts/run_distribute_train.sh call `run()`. Each worker runs
`python -m mindgr ...` with the interpreter that runs this launcher (its bin directory first on PATH:
msrun starts `python` from PATH). Failure handling, outermost first:
  - msrun --join True: a worker that exits non-zero (error, crash, SIGKILL) makes msrun kill the others
    within ~1 s; msrun then waits for its scheduler, which notices the dead ranks after MS_NODE_TIMEOUT
    (parallel.node_timeout) seconds; this launcher kills it after that deadline plus a grace period;
  - every rank runs a watchdog (mindgr.parallel.watchdog) that exits when the rank makes no progress
    for parallel.timeout seconds, which turns a hang (a peer stuck, a collective that never completes)
    into an exit;
  - workers record their pid in LOG_DIR/rank{r}.pid; whatever is still alive when the launcher leaves
    is killed by pid.
Ctrl-C / SIGTERM: the launcher forwards the signal to every rank by pid; the ranks agree on it at the next
step boundary (mindgr.parallel.executor), rank 0 saves a checkpoint and all exit; the launcher waits for
them (at most `stop_grace` seconds), then kills what is left. A second signal kills at once.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from mindgr.runtime import thread_env

LAUNCH_DIR_ENV = "MINDGR_LAUNCH_DIR"
_NOISE = re.compile(r"^\[(WARNING|INFO|DEBUG)\] ")
_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: |$)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def msrun_prefix() -> list[str]:
    """msrun of the running interpreter's environment (never another install found on PATH)."""
    beside = Path(sys.executable).with_name("msrun")
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-c", "import sys; from mindspore.parallel.cluster.run import main; "
                                  "sys.argv[0] = 'msrun'; sys.exit(main())"]


def msrun_command(nproc: int, task: list[str], log_dir: Path, port: int, cluster_timeout: int) -> list[str]:
    return msrun_prefix() + [
        "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_addr", "127.0.0.1",
        "--master_port", str(port), "--log_dir", str(log_dir), "--join", "True",
        "--cluster_time_out", str(cluster_timeout),
        "--tail_worker_log", str(nproc),        # no rank: launch.run tails rank 0 itself
        *task]


def child_env(log_dir: Path, threads: int, node_timeout: int) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["MS_NODE_TIMEOUT"] = str(node_timeout)
    env.setdefault("GLOG_v", "3")               # MindSpore's C++ INFO/WARNING lines drown the progress
    env["PYTHONUNBUFFERED"] = "1"
    env[LAUNCH_DIR_ENV] = str(log_dir)
    env.update(thread_env(threads))
    return env


def record_pid(rank: int):
    """Called by each worker: lets the launcher (and tests) find and stop rank processes by pid."""
    d = os.environ.get(LAUNCH_DIR_ENV)
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / f"rank{rank}.pid").write_text(str(os.getpid()))


def rank_pids(log_dir: Path) -> dict:
    out = {}
    for p in Path(log_dir).glob("rank*.pid"):
        try:
            out[int(p.stem[4:])] = int(p.read_text())
        except ValueError:
            continue
    return out


def _is_our_worker(pid: int, log_dir: Path) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{LAUNCH_DIR_ENV}={log_dir}".encode() in env.split(b"\0")


def signal_workers(log_dir: Path, signum: int) -> int:
    """Send `signum` to every live rank of this job; returns how many were signalled."""
    sent = 0
    for pid in rank_pids(log_dir).values():
        if _is_our_worker(pid, log_dir):
            try:
                os.kill(pid, signum)
                sent += 1
            except OSError:
                pass
    return sent


def live_workers(log_dir: Path) -> int:
    return sum(_is_our_worker(pid, log_dir) for pid in rank_pids(log_dir).values())


def kill_workers(log_dir: Path):
    signal_workers(log_dir, signal.SIGKILL)


_WORKER_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


def failed_ranks(log_dir: Path) -> dict:
    """rank -> exit code of the ranks msrun saw exit with an error, in the order it saw them."""
    log = Path(log_dir) / "msrun.log"
    if not log.is_file():
        return {}
    rank_of = {pid: r for r, pid in rank_pids(log_dir).items()}
    out = {}
    for pid, code in _WORKER_EXIT.findall(log.read_text(errors="replace")):
        if int(pid) in rank_of:
            out.setdefault(rank_of[int(pid)], int(code))
    return out


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def failure_summary(log_dir: Path, nproc: int) -> list[str]:
    """One line per rank: the rank(s) that died first (with how), then every rank's error message or, if it
    left none, its last log line."""
    failed = failed_ranks(log_dir)
    lines = []
    for r in list(failed) + [r for r in range(nproc) if r not in failed]:
        f = Path(log_dir) / f"worker_{r}.log"
        died = f" died ({_exit_text(failed[r])})" if r in failed else ""
        if not f.is_file():
            lines.append(f"rank {r}{died}: no log ({f})")
            continue
        text = [l for l in f.read_text(errors="replace").splitlines() if l.strip() and not _NOISE.match(l)]
        msg = [l for l in text if l.startswith("mindgr: error:")] or [l for l in text if _EXC.match(l)]
        if msg:
            lines.append(f"rank {r}{died}: {msg[-1]}")
        else:
            last = f"last log line: {text[-1].strip()[:200]}" if text else "nothing logged"
            why = "" if died else " (killed by msrun after another rank failed, or lost)"
            lines.append(f"rank {r}{died}: no error message{why}; {last}")
    return lines


class _Tail(threading.Thread):
    """Prints rank 0's log as it grows (without MindSpore's noise) and watches msrun's own log for a
    failed worker."""

    def __init__(self, log_dir: Path, quiet: bool):
        super().__init__(daemon=True)
        self.rank0, self.msrun_log, self.quiet = log_dir / "worker_0.log", log_dir / "msrun.log", quiet
        self.failed_at = None
        self.done = threading.Event()

    def _check_failed(self):
        if self.failed_at is None and self.msrun_log.is_file() and \
                "exit with exception" in self.msrun_log.read_text(errors="replace"):
            self.failed_at = time.monotonic()

    def run(self):
        f = None
        while True:
            finished = self.done.is_set()
            self._check_failed()
            if f is None and self.rank0.is_file():
                f = open(self.rank0, errors="replace")
            if f is not None:
                for line in f.readlines():
                    if not (self.quiet or _NOISE.match(line)):
                        print(line.rstrip("\n"), flush=True)
            if finished:
                break
            time.sleep(0.3)
        if f is not None:
            f.close()


def run(task: list[str], nproc: int, log_dir, *, port: int = 0, threads: int = 0, node_timeout: int = 30,
        cluster_timeout: int = 120, quiet: bool = False, stop_grace: float = 120.0) -> int:
    """Run `task` (argv after `python`, e.g. ["-m", "mindgr", "train", ...]) on `nproc` ranks. Exit code."""
    log_dir = Path(log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank*.pid", "worker_*.log", "scheduler.log", "msrun.log"):
        for old in log_dir.glob(pattern):     # a stale log would be tailed or summarised as this run's
            old.unlink()
    port = port or free_port()
    cmd = msrun_command(nproc, ["python", *task], log_dir, port, cluster_timeout)
    if not quiet:
        print(f"mindgr: {nproc} ranks via msrun (port {port}, logs {log_dir})", flush=True)
    with open(log_dir / "msrun.log", "wb") as out:
        proc = subprocess.Popen(cmd, env=child_env(log_dir, threads, node_timeout), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    pump = _Tail(log_dir, quiet)
    pump.start()
    grace = node_timeout + 15
    interrupted, stop_at, forced = None, None, False

    def stop(signum, frame):
        nonlocal interrupted, stop_at, forced
        if interrupted is not None:
            forced = True                               # a second signal: no more waiting
            return
        interrupted, stop_at = signum, time.monotonic()
        sent = signal_workers(log_dir, signum)
        print(f"mindgr: {signal.Signals(signum).name}: asked {sent} of {nproc} ranks to stop at the next step "
              "boundary and save a checkpoint (signal again to kill them now)", file=sys.stderr, flush=True)
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while proc.poll() is None and not forced:
            if interrupted is not None:
                if not live_workers(log_dir) or time.monotonic() - stop_at > stop_grace:
                    break                               # every rank has left (or will not): end msrun
            elif pump.failed_at is not None and time.monotonic() - pump.failed_at > grace:
                break                                   # msrun still waits for its scheduler: enough
            time.sleep(0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # msrun and its scheduler
            except OSError:
                pass
            proc.wait()
        kill_workers(log_dir)
        pump.done.set()
        pump.join(timeout=5)
    if interrupted is not None:
        how = "killed" if forced or time.monotonic() - stop_at > stop_grace else "stopped"
        print(f"mindgr: interrupted: all ranks {how}", file=sys.stderr)
        return 130
    if proc.returncode == 0 and pump.failed_at is None:
        return 0
    print(f"mindgr: error: the distributed job failed; per-rank logs in {log_dir}", file=sys.stderr)
    for line in failure_summary(log_dir, nproc):
        print(f"  {line}", file=sys.stderr)
    return 1


def strip_nproc(argv: list[str]) -> list[str]:
    """The command line without --nproc N: the ranks must not launch again."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def launch_train(cfg, argv: list[str]) -> int:
    """`mindgr train --nproc N ...`: the same command on N ranks; logs in parallel.log_dir or RUN_DIR/msrun."""
    p = cfg.parallel
    log_dir = Path(p.log_dir) if p.log_dir else cfg.run_dir / "msrun"
    return run(["-m", "mindgr", *strip_nproc(argv)], p.nproc, log_dir, port=p.master_port, threads=p.threads,
               node_timeout=p.node_timeout, cluster_timeout=p.cluster_timeout)


def run_job(argv: list[str], timeout: float, cwd=None, env=None, stop_grace: float = 30.0):
    """Run a launcher command (`python -m mindgr train --nproc ...`) with a hard timeout.

    On timeout the launcher gets SIGTERM (it stops msrun and kills its ranks by pid), then its whole
    session SIGKILL. Returns (exit code, stdout, stderr, timed_out).
    """
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=stop_grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return proc.returncode, out, err, True


def main(argv=None) -> int:
    """python -m mindgr.parallel.launch --nproc N [--log-dir D] [--threads T] -- -m some.module args..."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m mindgr.parallel.launch",
                                 description="run `python ARGS...` on N ranks with msrun")
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--log-dir", default="msrun_logs")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--node-timeout", type=int, default=30)
    ap.add_argument("task", nargs=argparse.REMAINDER, help="after --: the python arguments of every rank")
    args = ap.parse_args(argv)
    task = args.task[1:] if args.task[:1] == ["--"] else args.task
    if not task:
        ap.error("nothing to run: give the python arguments after --")
    return run(task, args.nproc, args.log_dir, port=args.port, threads=args.threads,
               node_timeout=args.node_timeout)


if __name__ == "__main__":
    sys.exit(main())
