"""GRPO-SR's hybrid reward and group advantages (numpy): r = gate(user, item) * RM(user, item).

The reward model (RM) alone can be won by items it scores high for everyone (reward hacking); the gate
keeps the reward to items relevant to the user:
- "none": the plain RM reward;
- "first_code": the item shares its first semantic-ID code with one of the user's last N items;
- "retrieval_topm": the item is in the top M of an item-retrieval run's dot-product ranking for the user
  (the ranking is computed by the caller and passed as `allowed`; no config key selects it yet).
Whatever the gate, an item the user already consumed is never rewarded (reward 0).

Advantages are normalised within each prompt's group: A = (r - mean) / (std + eps); a group whose rewards
are all equal gets A = 0 exactly (it carries no preference, so no policy gradient).
"""
from __future__ import annotations

import numpy as np

GATES = ("none", "first_code", "retrieval_topm")
ADV_EPS = 1e-6


def first_code_gate(histories, items: np.ndarray, codes: np.ndarray, recent: int) -> np.ndarray:
    """bool [U, G]: item's first code equals the first code of one of the user's last `recent` items."""
    items = np.asarray(items, np.int64)
    out = np.zeros(items.shape, bool)
    for u, h in enumerate(histories):
        seen = np.unique(codes[np.asarray(h, np.int64)[-recent:], 0])
        out[u] = np.isin(codes[items[u], 0], seen)
    return out


def consumed_mask(histories, items: np.ndarray) -> np.ndarray:
    """bool [U, G]: the item is in the user's history."""
    items = np.asarray(items, np.int64)
    return np.stack([np.isin(items[u], np.asarray(h, np.int64)) for u, h in enumerate(histories)]) \
        if len(histories) else np.zeros(items.shape, bool)


def gate_mask(gate: str, histories, items: np.ndarray, codes: np.ndarray | None = None, recent: int = 10,
              allowed: np.ndarray | None = None) -> np.ndarray:
    """bool [U, G]: which candidates may be rewarded (consumed items and padding item 0 never)."""
    items = np.asarray(items, np.int64)
    if gate == "none":
        keep = np.ones(items.shape, bool)
    elif gate == "first_code":
        keep = first_code_gate(histories, items, codes, recent)
    elif gate == "retrieval_topm":
        if allowed is None or np.shape(allowed) != items.shape:
            raise ValueError(f"gate retrieval_topm needs a bool [U, G] of the ranking's top-M members, got "
                             f"{None if allowed is None else np.shape(allowed)}")
        keep = np.asarray(allowed, bool)
    else:
        raise ValueError(f"gate {gate!r}: expected one of {', '.join(GATES)}")
    return keep & ~consumed_mask(histories, items) & (items > 0)


def hybrid_reward(rm: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """r = gate * RM: float32 [U, G], 0 where the gate is shut."""
    return np.where(keep, np.asarray(rm, np.float32), np.float32(0.0)).astype(np.float32)


def group_advantages(rewards: np.ndarray, eps: float = ADV_EPS) -> np.ndarray:
    """(r - mean_g) / (std_g + eps) per row (group), in float64; exactly 0 for a group of equal rewards."""
    r = np.asarray(rewards, np.float64)
    mean = r.mean(1, keepdims=True)
    std = r.std(1, keepdims=True)
    adv = (r - mean) / (std + eps)
    flat = (r.max(1) == r.min(1))[:, None]           # no preference inside the group
    return np.where(flat, 0.0, adv).astype(np.float32)
