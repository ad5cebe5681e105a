"""Attention implementations for chunked KV compression (science.md §2), side by side in fla's `ops/<op>/` style:
each op has a readable `naive` reference beside its fast versions, all of one signature and tested against it.

- `gated_pool/`: `naive` (also what `naive` and `blocked` pool with), `triton`;
- `compressed_attention/`: `naive` (dense, the tests' ground truth), `blocked` (the CPU default), `triton` (CUDA).

`ops(impl)` gives the pair the model calls for `model.attn_impl`; nothing is imported before it is asked for, so
`import phasefix.kernels` needs torch alone; the kernels import nothing of phasefix but the window grid
(`window_grid`, a leaf) and each other: no arrow back up into the model.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

IMPLS = ("naive", "blocked", "triton")


def resolve(attn_impl: str, device_type: str = "cpu") -> str:
    """The implementation `model.attn_impl` means on a device: `auto` is triton on CUDA and blocked elsewhere."""
    if attn_impl == "auto":
        return "triton" if device_type == "cuda" else "blocked"
    if attn_impl not in IMPLS:
        raise ValueError(f"attn_impl must be one of {', '.join(IMPLS + ('auto',))}, got {attn_impl!r}")
    return attn_impl


def ops(attn_impl: str, device_type: str = "cpu") -> SimpleNamespace:
    """`gated_pool` and `compressed_attention` of one implementation (`naive`, `blocked`, `triton` or `auto`)."""
    impl = resolve(attn_impl, device_type)
    pool = importlib.import_module(f"phasefix.kernels.gated_pool.{'triton' if impl == 'triton' else 'naive'}")
    attention = importlib.import_module(f"phasefix.kernels.compressed_attention.{impl}")
    return SimpleNamespace(gated_pool=pool.gated_pool, compressed_attention=attention.compressed_attention)
