"""`Trainer`: the training loop (mindgr.train.loop) with the retrieval task on the local executor
(mindgr.train.local); loading a trained retrieval run back (`load_run`, `evaluate_run`: `mindgr eval`
and serving) lives in mindgr.train.saved_run and is importable from here.

Multi-process runs use the same loop with another executor: mindgr.parallel.executor (data parallel),
mindgr.parallel.sparse.executor (sharded item table); mindgr.parallel.resolve picks one for a config.
"""
from __future__ import annotations

from mindgr.config import Config
from mindgr.runtime import setup_mindspore  # noqa: F401  (also imported from here by bench and tests)
from mindgr.train.local import HostSampler, LocalExecutor, Model  # noqa: F401
from mindgr.train.loop import StopSignals, TrainLoop  # noqa: F401
from mindgr.train.rundir import check_resume_config, data_change_note, read_run_config, run_config, saved_checkpoint  # noqa: F401
from mindgr.train.saved_run import (LoadedRun, _can_write, _ranks_dir, evaluate_run, load_run,  # noqa: F401
                                    ranks_file_name)
from mindgr.train.task import RetrievalTask


class Trainer(TrainLoop):
    """The loop with the retrieval task on the local executor: one process trains the whole global batch."""

    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False):
        super().__init__(cfg, LocalExecutor(cfg, RetrievalTask(cfg)), resume, quiet)
