"""The GRID (snap-research/GRID) side of tiger_side_by_side.py. Runs in the peer's own Python (torch,
lightning, tensorflow), never in MindGR's.

`python grid_side.py write DIR`: DIR/peer.npz (written by tiger_side_by_side.py) -> GRID's input files:
GZIP TFRecords of `sequence_data` (0-based item ids) and `user_id` under DIR/training, DIR/evaluation and
DIR/testing, and the semantic-ID table DIR/sids.pt ([levels, items], as GRID's id map reads it).

`Timer`: a Lightning callback added to GRID's own train / inference commands by a Hydra override
(`+callbacks.peer_timer._target_=grid_side.Timer`); it writes the time inside each training step
(on_train_batch_start -> on_train_batch_end: forward, backward and the optimizer, not the loader) with
the step's examples and real tokens, or each predict batch's time and users, to a JSON file.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:          # `write` needs only tensorflow and torch
    Callback = object


def _records(path: Path, seqs, users):
    import tensorflow as tf
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=tf.io.TFRecordOptions(compression_type="GZIP")) as w:
        for u, s in zip(users, seqs):
            feat = {"sequence_data": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in s])),
                    "user_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(u)]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())


def write(out: Path):
    import numpy as np
    import torch
    z = np.load(out / "peer.npz")
    split = lambda name: np.split(z[f"{name}_items"], z[f"{name}_offsets"][1:-1])
    _records(out / "training" / "part-0.tfrecord.gz", split("train"), z["train_users"])
    for folder in ("evaluation", "testing"):
        _records(out / folder / "part-0.tfrecord.gz", split("test"), z["test_users"])
    torch.save(torch.from_numpy(z["sids"].astype(np.int64)), out / "sids.pt")
    print(f"GRID data: {len(z['train_users'])} training rows, {len(z['test_users'])} test prompts, "
          f"sids {tuple(z['sids'].shape)} -> {out}")


def _mask(batch):
    """The attention mask [examples, tokens] of a GRID batch (SequentialModelInputData, maybe in tuples)."""
    while not hasattr(batch, "mask"):
        batch = batch[0]
    return batch.mask


class Timer(Callback):
    def __init__(self, out: str, skip: int = 1):
        self.out, self.skip = out, skip
        self.rows, self.t0, self.counter, self.flops = [], 0.0, None, None

    def _start(self):
        self.t0 = time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if not self.rows:        # the untimed first step: count its FLOPs (forward, backward, optimizer)
            from torch.utils.flop_counter import FlopCounterMode
            self.counter = FlopCounterMode(display=False)
            self.counter.__enter__()
        self._start()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        dt = time.perf_counter() - self.t0
        mask = _mask(batch)
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.flops = {"flops": int(self.counter.get_total_flops()), "examples": int(mask.size(0))}
            self.counter = None
        self.rows.append({"s": dt, "examples": int(mask.size(0)), "tokens": int(mask.sum())})
        self._dump("train", module)

    def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self._start()

    def on_predict_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        dt = time.perf_counter() - self.t0
        self.rows.append({"s": dt, "users": int(_mask(batch).size(0)), "beam": int(module.top_k_for_generation)})
        self._dump("predict", module)

    def _dump(self, kind, module):
        import torch
        params = sum(p.numel() for p in module.parameters())
        Path(self.out).write_text(json.dumps({"kind": kind, "skip": self.skip, "params": params,
                                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                                              "first_step_flops": self.flops, "rows": self.rows}))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        sys.exit("usage: grid_side.py write DIR")
    write(Path(sys.argv[2]))
