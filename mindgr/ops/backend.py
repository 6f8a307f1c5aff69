"""The ops backend registry: which module implements which jagged op, and the table the models call.

A backend is a module registered here by name (`register_backend`). It declares what it provides:
    PROVIDES             {op name: function}, each with the signature documented in OPS below
    unavailable_reason() None when it can run in this process, else a one-line reason
Adding a backend = one `register_backend` line below (and its module). `set_backend(name)` fills ACTIVE,
the module-level table the dispatch modules (attention, jagged, scoring, norm) read inside graph code: a dict
of plain functions, resolved when a Cell compiles, so set the backend before building a model (the
runtime does it from config `ops.backend`). An op the chosen backend does not provide runs the
reference with ONE logged warning naming the ops (or, with strict=True, is an error): never silently. The
attention ops' warning waits until a model that calls them is built (`note_uses`).
"""
from __future__ import annotations

import importlib
import logging

# Every op a backend may provide, with the signature its function must have (semantics: the dispatch
# modules' docstrings; the reference implements them all).
OPS = {
    "hstu_attention": "(q, k, v, offsets, timestamps, w_pos, w_ts, max_len, request_times) -> [T, H, dv]",
    "bias_attention": "(v, offsets, timestamps, w_pos, w_ts, max_len, request_times) -> [T, H, C, dv]",
    "softmax_attention": "(q, k, v, offsets, max_len) -> [T, H, dv]",
    "linear_attention": "(q, k, v, offsets, log_decay, intra, tail, lead) -> [T, H, dv]",
    "jagged_to_padded": "(values, offsets, max_len) -> [B, N, *F]",
    "padded_to_jagged": "(padded, offsets, num_tokens) -> [T, *F]",
    "sampled_logits": "(out, table, ids, score_all) -> [T, R]",
    "sampled_lse": "(x, table, ids, targets, pos, score_all) -> [T]",
    "shared_pool_lse": "(x, cand, logq, cand_ids, targets, pos) -> [T]",
    "layer_norm": "(x, eps) -> [.., D]",
    "gated_layer_norm": "(u, y, eps) -> [.., D]",
    "l2_normalize": "(x, eps) -> [.., D]",
    "silu_split": "(x, widths) -> tuple of [.., w] (split(SiLU(x), widths, -1))",
}
REFERENCE = "reference"
AUTO_ORDER = {"Ascend": ("ascend", REFERENCE)}  # `auto`: the first that runs here; other devices below
AUTO_DEFAULT = ("cpu", REFERENCE)

_modules: dict[str, str] = {}            # backend name -> module path
ACTIVE: dict = {}                        # op name -> function of the selected backend (read in graph code)
_state = {"name": None, "fallbacks": ()}
log = logging.getLogger("mindgr.ops")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (or lacks an op under strict=True); one line says why."""


def register_backend(name: str, module: str):
    """Register `module` (a dotted path, imported only when the backend is asked for) as backend `name`."""
    _modules[name] = module


def unregister_backend(name: str):
    if name == REFERENCE:
        raise ValueError("the reference backend is every op's fallback and cannot be removed")
    _modules.pop(name, None)


register_backend(REFERENCE, "mindgr.ops.reference")
register_backend("cpu", "mindgr.ops.cpu")        # C++ custom AOT ops (built on first use)
register_backend("ascend", "mindgr.ops.ascend")  # AscendC custom ops


def backends() -> tuple:
    return tuple(_modules)


BACKENDS = backends()  # the built-in names (kept for callers of the old constant)


def _module(name: str):
    """(module, None) or (None, the reason it cannot run here)."""
    if name not in _modules:
        return None, f"unknown backend (expected one of {', '.join(_modules)})"
    try:
        mod = importlib.import_module(_modules[name])   # the cpu backend builds/loads its kernels on first use
    except ImportError as exc:
        return None, f"{_modules[name]} cannot be imported ({exc})"
    if not isinstance(getattr(mod, "PROVIDES", None), dict) or not hasattr(mod, "unavailable_reason"):
        return None, f"{_modules[name]} declares no PROVIDES table / unavailable_reason() (not a backend)"
    reason = mod.unavailable_reason()
    return (mod, None) if reason is None else (None, reason)


def provided(name: str) -> dict:
    """{op: function} that backend `name` provides (raises BackendUnavailable if it cannot run here)."""
    mod, reason = _module(name)
    if mod is None:
        raise BackendUnavailable(f"ops.backend = {name}: {reason}; use ops.backend=reference")
    unknown = sorted(set(mod.PROVIDES) - set(OPS))
    if unknown:
        raise BackendUnavailable(f"ops backend {name} provides unknown ops {', '.join(unknown)} "
                                 f"(known: {', '.join(OPS)})")
    return dict(mod.PROVIDES)


def resolve_backend(name: str) -> str:
    """Map a config value (auto or a registered name) to a backend that runs here, or raise."""
    if name == "auto":
        import mindspore as ms
        for candidate in AUTO_ORDER.get(ms.get_context("device_target"), AUTO_DEFAULT):
            if _module(candidate)[0] is not None:
                return candidate
        return REFERENCE
    provided(name)
    return name


def set_backend(name: str, strict: bool = False) -> str:
    """Select the backend for every op compiled from now on; returns its name. An op it lacks runs the
    reference, logged once here (strict=True: BackendUnavailable instead)."""
    chosen = resolve_backend(name)
    table = provided(chosen)
    missing = [op for op in OPS if op not in table]
    if missing and strict:
        raise BackendUnavailable(f"ops backend {chosen} does not provide {', '.join(missing)}")
    if missing:
        reference = provided(REFERENCE)
        table.update({op: reference[op] for op in missing})
        now = [op for op in missing if op not in NOTED_AT_USE]
        if now:
            log.warning("ops backend %s: %s not provided, using the reference", chosen, ", ".join(now))
    ACTIVE.clear()
    ACTIVE.update(table)
    _state["name"], _state["fallbacks"] = chosen, tuple(missing)
    _state["noted"] = set()
    return chosen


# Attention ops differ by model (SASRec alone uses softmax_attention): their fallback is logged when a
# model that uses them is built (`note_uses`), not on every command.
NOTED_AT_USE = frozenset({"hstu_attention", "bias_attention", "softmax_attention", "linear_attention"})


def note_uses(*ops: str):
    """Called by a model's constructor with the attention ops it calls: logs once per process each of them
    that the selected backend runs on the reference."""
    noted = _state.setdefault("noted", set())
    missing = [op for op in ops if op in _state["fallbacks"] and op not in noted]
    if missing:
        noted.update(missing)
        log.warning("ops backend %s: %s not provided, using the reference", _state["name"], ", ".join(missing))


def get_backend() -> str:
    return _state["name"] or REFERENCE


def fallbacks() -> tuple:
    """The ops of the selected backend that run the reference instead."""
    return _state["fallbacks"]


def ensure_backend():
    """Select the reference if nothing is selected yet: called when a dispatch module is imported (not by
    importing this registry, which must stay free of MindSpore for mindgr.ops.ascend's import check)."""
    if _state["name"] is None:
        set_backend(REFERENCE)
