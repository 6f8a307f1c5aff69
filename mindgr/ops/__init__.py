"""Jagged operators behind one API. Models call the dispatch modules (`attention`, `jagged`, `scoring`);
the backend that implements them is chosen once per process (config `ops.backend`, through
mindgr.runtime) and never imported by models.

Backends (registered in mindgr.ops.backend, each declaring the ops it PROVIDES): `reference` (pure
MindSpore, padded inside: the oracle, and every op's fallback), `cpu` (C++ custom ops), `ascend`
(AscendC custom ops). `auto` = ascend on Ascend, cpu elsewhere when built, else reference.
"""
from mindgr.ops.backend import (BACKENDS, BackendUnavailable, backends, fallbacks, get_backend, register_backend,
                                resolve_backend, set_backend)

__all__ = ["BACKENDS", "BackendUnavailable", "backends", "fallbacks", "get_backend", "register_backend",
           "resolve_backend", "set_backend"]
