"""Attention implementations for chunked KV compression (science.md §2), side by side in fla's `ops/<op>/` style:
each op has a readable `naive` reference beside its fast versions, all of one signature and tested against it.

- `gated_pool/`: `naive` (also what `naive` and `blocked` pool with), `triton`;
- `compressed_attention/`: `naive` (dense, the tests' ground truth), `blocked` (the CPU default), `triton` (CUDA).

`ops(impl)` gives the pair the model calls for `model.attn_impl`; nothing is imported before it is asked for, so
`import phasefix.kernels` needs torch alone; the kernels import nothing of phasefix but the window grid
(`window_grid`, a leaf) and each other: no arrow back up into the model.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

IMPLS = ("naive", "blocked", "triton")


def resolve(attn_impl: str, device_type: str = "cpu") -> str:
    """The implementation `model.attn_impl` means on a device: `auto` is triton on CUDA and blocked elsewhere."""
    if attn_impl == "auto":
        return "triton" if device_type == "cuda" else "blocked"
    if attn_impl not in IMPLS:
        raise ValueError(f"attn_impl must be one of {', '.join(IMPLS + ('auto',))}, got {attn_impl!r}")
    return attn_impl


class Ops(NamedTuple):
    """The pair of one implementation (a named tuple, not a namespace: torch.compile traces it)."""
    gated_pool: Callable
    compressed_attention: Callable


def ops(attn_impl: str, device_type: str = "cpu") -> Ops:
    """`gated_pool` and `compressed_attention` of one implementation (`naive`, `blocked`, `triton` or `auto`)."""
    impl = resolve(attn_impl, device_type)
    # plain import statements, not importlib: torch.compile traces them (importlib.import_module breaks the graph)
    if impl == "triton":
        from phasefix.kernels.compressed_attention import triton as attention
        from phasefix.kernels.gated_pool import triton as pool
    else:
        from phasefix.kernels.gated_pool import naive as pool
        if impl == "naive":
            from phasefix.kernels.compressed_attention import naive as attention
        else:
            from phasefix.kernels.compressed_attention import blocked as attention
    return Ops(pool.gated_pool, attention.compressed_attention)
