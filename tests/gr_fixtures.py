"""Shared pieces of the generative-retrieval tests: random code tables and the backend they run on (a module
selects GRAPH mode and that backend with `pytestmark = pytest.mark.graph_mode("auto")`, tests/conftest.py);
the loss-and-gradient cell and the parameter redraw of the decoder checks; the tiny GR run's overrides
(SYNTH, LEVELS, gr_overrides) and its code table file (random_codes_file); GRPO's policy loss in numpy."""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn


def fast_backend():
    """The fused C++ kernels where they build (their graphs compile ~5x faster than the padded
    reference's), else the reference: the GR tests check GR logic, the kernels have their own tests."""
    from mindgr.ops import set_backend
    from mindgr.ops.backend import BackendUnavailable
    try:
        return set_backend("cpu")
    except BackendUnavailable:
        return set_backend("reference")


def random_codes(rng, num_items, level_sizes):
    """A random code table [V+1, Lt] of unique tuples (row 0 = padding, zeros), clustered so that
    prefixes are shared (as residual k-means makes them)."""
    sizes = np.asarray(level_sizes)
    space = int(np.prod(sizes))
    assert num_items <= space
    # draw the first levels from a few hot values so prefixes collide, then make tuples unique
    seen, rows = set(), []
    while len(rows) < num_items:
        t = tuple(int(min(rng.geometric(0.4) - 1, s - 1)) if rng.random() < 0.7 else int(rng.integers(s))
                  for s in sizes)
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return np.concatenate([np.zeros((1, len(sizes)), np.int32), np.asarray(rows, np.int32)])


class LossGrad(nn.Cell):
    """(loss, gradients of every trainable parameter of `loss`) of one call."""

    def __init__(self, loss):
        super().__init__()
        self.weights = loss.trainable_params()
        self.fn = ms.value_and_grad(loss, None, self.weights)

    def construct(self, *args):
        return self.fn(*args)


def randomize(cell, rng, scale=0.3):
    """Redraw every parameter at O(scale), so that every path of the cell matters."""
    for p in cell.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32)))


SYNTH = ["data.kind=synthetic", "data.max_len=12", "data.synthetic.num_users=120", "data.synthetic.num_items=60",
         "data.synthetic.median_len=10", "data.synthetic.max_len=20", "data.synthetic.num_clusters=4"]
LEVELS = [6, 6, 3]


def random_codes_file(out, overrides=SYNTH, levels=LEVELS, seed=3):
    """The store of config `overrides` and a random code table of its catalogue saved as out/codes.parquet
    -> (store, codes [V+1, Lt], path)."""
    from mindgr.config import load_config
    from mindgr.ids.codes import save_codes
    from mindgr.train.data import load_store
    store = load_store(load_config(None, list(overrides)).data)
    codes = random_codes(np.random.default_rng(seed), store.num_items, levels)
    path = save_codes(out / "codes.parquet", codes, levels, store.item_raw_ids, {"note": "random"})
    return store, codes, path


def gr_overrides(out, name, codes, *extra):
    """A tiny GR decoder run `name` under `out` on SYNTH with the code table file `codes` (2 epochs)."""
    return [f"run.out_dir={out}", f"run.name={name}", "run.log_every=1", *SYNTH, "model.arch=gr",
            "model.dim=16", "model.num_blocks=1", "model.num_heads=2", "model.dropout=0.1",
            "loss.objective=ntp", "train.batch_size=16", "train.epochs=2", "train.lr=0.005",
            "eval.every_epochs=1", "eval.ks=[1,5,10]", "eval.beam=10", "eval.max_users=40",
            "eval.batch_size=64", "ids.from_run=", f"ids.codes={codes}", "ops.backend=cpu", *extra]


def np_policy_loss(logp, old, ref, adv, w, eps, beta):
    """-sum w min(r A, clip(r) A) + beta sum w k3 and its analytic gradient w.r.t. logp."""
    r = np.exp(logp - old)
    c = np.clip(r, 1 - eps, 1 + eps)
    unclipped = r * adv <= c * adv
    surrogate = np.where(unclipped, r * adv, c * adv)
    log_r = ref - logp
    k3 = np.exp(log_r) - log_r - 1
    loss = -(w * surrogate).sum() + beta * (w * k3).sum()
    inside = (r >= 1 - eps) & (r <= 1 + eps)
    d_surr = np.where(unclipped | inside, r * adv, 0.0)          # the clipped branch has no gradient
    grad = -w * d_surr + beta * w * (1 - np.exp(log_r))
    return loss, grad
