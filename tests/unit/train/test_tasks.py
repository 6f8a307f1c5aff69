"""Tasks and executors: the task registry is the one place that tells a generative run from a retrieval
one, resolve(cfg) picks the executor, and every task/executor pair either runs or fails in one line."""
import re

import pytest

from conftest import REPO
from mindgr.config import ConfigError, load_config

SMOKE, GR_SMOKE = str(REPO / "configs" / "smoke.yaml"), str(REPO / "configs" / "gr-smoke.yaml")

# "Is this a generative run?" asked by hand: an arch compared with the GR name, a predicate named so, a
# class test against a task, or the old strategy classes.
FORK = re.compile(r"""arch\s*[!=]=\s*(["']gr["']|GENERATIVE_ARCH)|(["']gr["']|GENERATIVE_ARCH)\s*[!=]=\s*\S*arch"""
                  r"""|\bis_generative\w*|isinstance\([^)]*(Generative|Retrieval)\w*Task|GenerativeStrategy""")

# Where such a test is the point: the registry, and the objectives table that pairs each objective with the
# model kind it trains (a config check; it selects no code path).
ALLOWED = {"mindgr/train/tasks.py", "mindgr/models/objectives.py"}


def _forks(text: str) -> list:
    return [line.strip() for line in text.splitlines() if FORK.search(line)]


def test_the_fork_pattern_finds_hand_made_branches():
    for line in ['if cfg.model.arch == "gr":', "if GENERATIVE_ARCH == cfg.model.arch:", "gr = is_generative_run(d)",
                 "if isinstance(task, GenerativeTask):", "from x import GenerativeStrategy",
                 "if run.cfg.model.arch != 'gr':"]:
        assert _forks(line), line
    assert not _forks('name = "gr-smoke"; arch = cfg.model.arch; kind = task.serving')


def test_no_generative_fork_outside_the_task_registry():
    found = {}
    for path in sorted((REPO / "mindgr").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel not in ALLOWED and _forks(path.read_text()):
            found[rel] = _forks(path.read_text())
    assert not found, f"decide through mindgr.train.tasks (resolve_task / resolve_run), not by hand: {found}"


def test_registry_names_each_config_and_every_task_implements_the_interface():
    from mindgr.train.generative import GenerativeTask
    from mindgr.train.task import RetrievalTask, Task
    from mindgr.train.tasks import TASKS, resolve_task, task_class, task_name
    assert task_name(load_config(SMOKE)) == "retrieval" and task_class(load_config(SMOKE)) is RetrievalTask
    gr = load_config(GR_SMOKE)
    assert task_name(gr) == "generative" and isinstance(resolve_task(gr), GenerativeTask)
    for name, _, load in TASKS:
        cls = load()
        assert issubclass(cls, Task) and cls.name == name and not cls.__abstractmethods__, name
        assert cls.serving or not cls.ranks_users, name     # only a task that ranks nothing serves nothing
    reward = load_config(SMOKE, ["loss.objective=rating", "data.synthetic.values=true"])
    assert task_name(reward) == "reward"


def test_resolve_picks_the_executor_and_the_task_refuses_what_it_cannot_run():
    from mindgr.parallel.resolve import EXECUTORS, executor_kind, resolve
    from mindgr.train.generative import GenerativeTask
    from mindgr.train.local import LocalExecutor
    from mindgr.train.task import RetrievalTask
    ex = resolve(load_config(GR_SMOKE))
    assert isinstance(ex, LocalExecutor) and isinstance(ex.task, GenerativeTask)
    ex = resolve(load_config(SMOKE))
    assert isinstance(ex, LocalExecutor) and isinstance(ex.task, RetrievalTask)
    assert resolve(load_config(GR_SMOKE, ["parallel.nproc=2"])) is None       # launch the ranks
    assert executor_kind(load_config(SMOKE, ["parallel.nproc=2", "parallel.sparse=flat"])) == "sharded_table"
    assert executor_kind(load_config(SMOKE, ["parallel.sparse=flat"])) == "local"   # one process: nothing to shard
    assert executor_kind(load_config(SMOKE), ranks=True) == "data_parallel"
    assert set(EXECUTORS) == {"local", "data_parallel", "sharded_table"}
    with pytest.raises(ConfigError, match="model.arch = gr trains in one process or data parallel"):
        resolve(load_config(GR_SMOKE, ["parallel.nproc=2", "parallel.sparse=flat"]))
    with pytest.raises(ConfigError, match="data.gr_layout = tree trains in one process"):
        resolve(load_config(GR_SMOKE, ["parallel.nproc=2", "data.gr_layout=tree"]))
    with pytest.raises(ConfigError, match="only per_token is supported"):
        resolve(load_config(SMOKE, ["parallel.nproc=2", "loss.negatives=shared_pool"]))
