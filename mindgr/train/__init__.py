"""Training: the compiled step, the loop, checkpoints, evaluation, metrics, FLOPs and MFU."""
