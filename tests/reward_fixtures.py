"""Shared by the reward-model tests (test_reward.py, test_reward_units.py): the tiny run's synthetic data
(with a value per interaction) and its overrides."""
SYNTH = ["data.kind=synthetic", "data.max_len=16", "data.synthetic.num_users=150", "data.synthetic.num_items=60",
         "data.synthetic.median_len=12", "data.synthetic.max_len=24", "data.synthetic.num_clusters=4",
         "data.synthetic.values=true"]


def reward_overrides(out, name, *extra):
    """A tiny reward-model run `name` under `out` (3 epochs, cpu kernels)."""
    return [f"run.out_dir={out}", f"run.name={name}", "run.log_every=1", *SYNTH, "model.dim=16",
            "model.num_blocks=1", "model.num_heads=2", "model.dropout=0.1", "model.time_bias=false",
            "loss.objective=rating", "train.batch_size=32", "train.epochs=3", "train.lr=0.005",
            "eval.every_epochs=1", "ops.backend=cpu", *extra]
