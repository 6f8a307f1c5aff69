"""GRID's training entry, for tiger_side_by_side.py. Run in a GRID checkout with the peer's Python:
`python grid_train.py experiment=tiger_train_flat KEY=VALUE ...` (GRID's own Hydra overrides).

GRID's `python -m src.train` stops at import in the checkout measured (src/utils/restart_job.py imports
`_copy_time_dependent_args`, which src/utils/restart_job_utils.py does not define). Its training is
GRID's `pipeline_launcher` (config -> datamodule, model, callbacks, trainer) then `trainer.fit`; this
entry calls exactly those, without the job-restart wrapper that fails to import. Nothing of GRID is
changed or copied.
"""
import os
import sys

sys.path.insert(0, os.getcwd())            # the GRID checkout: its `src` package and configs/

import hydra                                # noqa: E402
import torch                                # noqa: E402
from omegaconf import DictConfig            # noqa: E402

from src.utils import extras                # noqa: E402
from src.utils.custom_hydra_resolvers import *  # noqa: E402,F401,F403  (GRID's config resolvers)
from src.utils.launcher_utils import pipeline_launcher  # noqa: E402

torch.set_float32_matmul_precision("medium")   # as GRID's src/train.py


@hydra.main(version_base="1.3", config_path=os.path.join(os.getcwd(), "configs"), config_name="train.yaml")
def main(cfg: DictConfig) -> None:
    extras(cfg)
    with pipeline_launcher(cfg) as modules:
        modules.trainer.fit(model=modules.model, datamodule=modules.datamodule, ckpt_path=cfg.get("ckpt_path"))


if __name__ == "__main__":
    main()
