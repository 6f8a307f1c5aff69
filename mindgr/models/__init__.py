"""Sequence encoders (HSTU, SASRec) behind the model registry, item embeddings, losses and objectives."""
from mindgr.models.build import build_encoder
from mindgr.models.hstu import HSTU, HSTUBlock
from mindgr.models.losses import SampledSoftmaxLoss
from mindgr.models.registry import ModelSpec, model_names, model_spec, register_model
from mindgr.models.sasrec import SASRec

__all__ = ["build_encoder", "HSTU", "HSTUBlock", "SASRec", "SampledSoftmaxLoss", "ModelSpec", "model_names",
           "model_spec", "register_model"]
