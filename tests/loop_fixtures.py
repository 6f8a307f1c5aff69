"""Shared by the loop tests (test_loop.py, test_schedule.py): an executor with its own data, step, FLOPs and
evaluation (no model, no compile) and the tiny config it runs under."""
import numpy as np

from mindgr.config import load_config


class _Plan:
    """Three batches an epoch, batch b = [b]."""

    def num_batches(self, epoch):
        return 3

    def iter_batches(self, epoch, start):
        for b in range(start, 3):
            yield b, [b]


def toy_executor(cfg):
    from mindspore import Parameter, Tensor
    from mindgr.train.executor import Executor, StepShape

    class Toy(Executor):
        """An executor with its own data, step, FLOPs and evaluation (no task): the loop only calls the
        executor's interface."""

        def check_config(self):
            pass

        def on_run_dir(self, run_dir, fresh):
            pass

        def baselines(self):
            return {}

        def build_data(self, run_dir, resuming):
            self.plan = _Plan()
            return self.plan

        def describe_data(self):
            return "toy: 3 batches/epoch"

        def build(self, run):
            self.shape = StepShape.single(1, 1)
            self.w = Parameter(Tensor(np.zeros(2, np.float32)), name="w")
            self.prepared, self.restored = [], None

        def prepare(self, epoch, b, indices):
            self.prepared.append((epoch, b))
            return (epoch, b), {"tokens": 4, "fill": 1.0}

        def execute(self, prepared, step):
            self.w.set_data(Tensor(np.full(2, step, np.float32)))
            return 1.0 / step, 0.001, prepared[1]

        def batch_flops(self, info):
            return 10.0 * info["tokens"]

        def can_evaluate(self, split):
            return True

        def evaluate(self, split, step):
            score = float(self.w.asnumpy()[0]) / 100
            return {"count": 1, "ndcg@10": score, "mrr": score}

        def named_state(self):
            return {"w": self.w.value()}

        def restore(self, tensors, path):
            self.restored = path.name
            self.w.set_data(Tensor(tensors["w"]))

    return Toy(cfg, None)


def toy_cfg(tmp_path, *extra):
    return load_config(None, [f"run.out_dir={tmp_path}", "run.name=toy", "data.kind=synthetic",
                              "data.synthetic.num_users=50", "data.synthetic.num_items=20", "train.epochs=2",
                              "eval.every_epochs=1", "run.log_every=2", "ops.backend=reference", *extra])
