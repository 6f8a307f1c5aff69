"""Sequence encoders (HSTU, SASRec), item embeddings and losses."""
from mindgr.models.build import build_encoder
from mindgr.models.hstu import HSTU, HSTUBlock
from mindgr.models.losses import SampledSoftmaxLoss
from mindgr.models.sasrec import SASRec

__all__ = ["build_encoder", "HSTU", "HSTUBlock", "SASRec", "SampledSoftmaxLoss"]
