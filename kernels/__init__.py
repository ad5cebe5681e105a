"""Triton kernels for chunked KV compression (science.md §2); twins of `phasefix.model.compression`.

Importable with torch and triton alone. `TRITON_INTERPRET=1` runs them on CPU (float32/float64 only).
"""
from .compressed_attention import compressed_attention
from .gated_pool import gated_pool

__all__ = ["gated_pool", "compressed_attention"]
