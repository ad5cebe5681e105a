"""Gated slot pooling (science.md §2), the readable reference: the ground truth of the tests and the pooling of
the `naive` and `blocked` attention implementations (it is a few element-wise ops, nothing to block).

    a_{j,i} = softmax_i s_{j,i}         (over the W slots; per channel when the gate is a vector)
    K_j     = sum_i a_{j,i} * P_{j,i}

Torch only (no phasefix import).
"""
from __future__ import annotations

import torch


def gated_pool(payload: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """Softmax over slots, then the weighted sum of the slot payloads.

    payload:     [B, N, W, HKV, D]  C_i h_{j,i} for every entry j and slot i
    gate_logits: [B, N, W, HKV, 1] (scalar gate) or [B, N, W, HKV, D] (vector gate); -inf marks empty slots
    returns:     [B, N, HKV, D]
    The softmax runs in float32 for half-precision logits and never downcasts float64, so in float64 this is exact.
    """
    acc = torch.promote_types(gate_logits.dtype, torch.float32)
    a = torch.softmax(gate_logits.to(acc), dim=2).to(payload.dtype)  # [B, N, W, HKV, 1|D]
    return (a * payload).sum(dim=2)
