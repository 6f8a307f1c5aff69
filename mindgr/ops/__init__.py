"""Jagged operators behind one API. Models call the dispatch modules (`attention`, `jagged`); the backend
that implements them is chosen once per process (config `ops.backend`) and never imported by models.

Backends: `reference` (pure MindSpore, padded inside: the oracle), `cpu` (C++ custom ops),
`ascend` (AscendC custom ops). `auto` = ascend on Ascend, cpu elsewhere when built, else reference.
"""
from mindgr.ops.backend import BACKENDS, get_backend, resolve_backend, set_backend

__all__ = ["BACKENDS", "get_backend", "resolve_backend", "set_backend"]
