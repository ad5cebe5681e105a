"""Static gate statistics: what the mitigations constrain and what every mitigated run logs (science.md §5).

The static gate distribution of a layer, branch and KV head is the gate distribution averaged over the batch and
over the windows, E[a] in [HKV, W]. Windows with empty slots (the first few, whose slots before position 0 get zero
weight) are left out: they would bias the average towards the late slots. Its effective number of slots is
exp(H(E[a])): 1 when the head always reads one slot, W when it spreads evenly.
"""
from __future__ import annotations

import torch

from phasefix.model.config import ModelConfig


def pooled_slots(config: ModelConfig, layer: int = 0) -> tuple[int, int]:
    """(slots a layer's gate spreads over, its stride): (W + b, S), the layer's window and stride
    (`model.layer_compression`) with the b bridged tokens before the window (`model.boundary_bridge`) as the first
    slots. (model.window, model.stride) for a layer without a compressor."""
    W, S = config.layer_shape(layer) or (config.window, config.stride)
    return W + config.boundary_bridge, S


def empty_windows(config: ModelConfig, layer: int = 0) -> int:
    """Leading windows of a layer that have slots before position 0 in some KV head: window j of a head with grid
    offset d starts at (j+1)S-W-d, so the first (W+d-1)//S of them, d the largest of the layer's head offsets
    (`model.head_offsets` moves them per head; the windows of all heads share the index j; W counts the bridged
    slots, `pooled_slots`)."""
    W, S = pooled_slots(config, layer)
    return (W + max(config.head_grid_offsets(layer)) - 1) // S


def _detect_empty_windows(a: torch.Tensor) -> int:
    """Without a config: the leading windows whose slot 0 (the earliest) has exactly zero weight for every batch
    element in some head (empty slots are masked with -inf; heads with spread offsets have different empty
    windows), at most W-1 of them (the most any grid can have)."""
    empty = (a[:, :, 0, :] == 0).any(dim=2).all(dim=0)  # [N]
    leading = int(torch.cumprod(empty.to(torch.int64), dim=0).sum())
    return min(leading, a.shape[2] - 1)


def static_gate_distribution(gates: list[dict | None], config: ModelConfig | None = None) -> list[dict]:
    """E over batch and complete windows of the gate distributions: per layer {branch: [HKV, W]}.

    gates: `model.gates()` (per layer {branch: [B, N, W, HKV]}, None for layers without a compressor).
    config: the model's config; gives each layer's number of windows with empty slots exactly. Without it they
    are detected from the zeros of the gate (exact unless the gates put underflowing weight on slot 0).
    Differentiable; detach for logging. A layer with no window (a sequence shorter than one) gives {}.
    """
    out = []
    for layer, branches in enumerate(gates):
        static = {}
        for branch, a in (branches or {}).items():
            N = a.shape[1]
            if N == 0:
                continue
            skip = empty_windows(config, layer) if config is not None else _detect_empty_windows(a)
            skip = min(skip, N - 1)  # too short for a complete window: keep the last one
            static[branch] = a[:, skip:].float().mean(dim=(0, 1)).transpose(0, 1)  # [HKV, W]
        out.append(static)
    return out


def entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy (nats) along `dim`, with 0 log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(dim)


def effective_slots(p: torch.Tensor) -> torch.Tensor:
    """exp(H(p)) along the last dim: [..., W] -> [...]."""
    return entropy(p).exp()


def head_slot_phases(config: ModelConfig, layer: int = 0, device=None) -> torch.Tensor:
    """The phase of every slot per KV head, [HKV, W] (long): slot i of window j holds token (j+1)S-W-d+i, whose phase
    is (i - W - d) mod S (= i when W = S and d = 0), d the head's grid offset (`config.head_grid_offsets`: the layer's,
    moved per head by `model.head_offsets`)."""
    W, S = pooled_slots(config, layer)
    d = torch.as_tensor(config.head_grid_offsets(layer), device=device)[:, None]  # [HKV, 1]
    return (torch.arange(W, device=device)[None, :] - W - d) % S


def answered_phases(config: ModelConfig, layer: int = 0, branch: str = "key", device=None) -> torch.Tensor:
    """Which target-key phase each slot of a gate can answer, per KV head: one-hot [HKV, W, S], with an all-zero
    row for the slot that answers nothing (science.md §5: a record is answered by one entry that binds its key,
    read by the key gate, to its value on the next token, read by the value gate).
    key gate: slot i reads the key at slot i, whose value is at slot i+1; slot W-1's value lies in the next window.
    value gate: slot i reads the value of the key at slot i-1; slot 0's key lies in the previous window.
    With W = S both dead slots belong to the grid's boundary phase (S-1-d) mod S, which the layer cannot answer;
    with W > S that phase is also an interior slot and stays answerable. The one place the coordination terms read
    phases from; per-head grid offsets change it per head (`head_slot_phases`)."""
    W, S = pooled_slots(config, layer)
    back = 0 if branch == "key" else 1  # how far before slot i the record's key sits
    read = torch.arange(W, device=device) - back
    alive = (read + 1 < W) & (read >= 0)  # its key and value are both in the window
    phase = (head_slot_phases(config, layer, device) - back) % S  # the phase of slot `read`, per head
    return torch.nn.functional.one_hot(phase, S).float() * alive[None, :, None]


__all__ = ["answered_phases", "effective_slots", "empty_windows", "entropy", "head_slot_phases", "pooled_slots",
           "static_gate_distribution"]

