"""The window grid of chunked KV compression (science.md §2): which tokens each entry pools, which entries each
query sees, where the entries sit. Math only; the attention itself lives in `phasefix/kernels/` (`naive`, `blocked`,
`triton`, chosen by `model.attn_impl`), the compressor in `phasefix.model.qwen3.Compressor`. A leaf: it imports
only torch, so the kernels and the model both use it and the kernels never import the model.

Grid (with an optional `grid_offset` d in [0, S), 0 in the paper): window j ends at token (j+1)S-1-d and starts at
(j+1)S-W-d; slots before position 0 get zero weight. Entry j is visible to query t once its window is complete:
j < floor((t+1+d)/S). Entries get RoPE at position jS-d (jS in the paper).

Per-KV-head offsets (`model.head_offsets`): every rule above holds per KV head with its own d. GQA groups are
independent, so `by_grid_offset` runs the attention once per distinct offset on the KV heads that have it (and
their query heads) and puts the heads back in order; the compressor pools each offset's windows for its heads.
"""
from __future__ import annotations

import torch


# ------------------------------------------------------------------------------------------------ grid
def num_entries(T: int, stride: int, grid_offset: int = 0) -> int:
    """Complete windows in a sequence of T tokens (the only ones any query can see)."""
    return (T + grid_offset) // stride


def window_positions(T: int, window: int, stride: int, grid_offset: int = 0, device=None) -> torch.Tensor:
    """Token position of every (entry, slot): [N, W]; negative positions are empty slots."""
    N = num_entries(T, stride, grid_offset)
    j = torch.arange(N, device=device)[:, None]
    i = torch.arange(window, device=device)[None, :]
    return (j + 1) * stride - window - grid_offset + i


def num_visible(t: torch.Tensor | int, stride: int, grid_offset: int = 0) -> torch.Tensor | int:
    """Entries visible to the query at position t: floor((t+1+d)/S); a Python int for an int t (block bounds that
    torch.compile can trace without reading a tensor back)."""
    if isinstance(t, int):
        return (t + 1 + grid_offset) // stride
    return torch.div(t + 1 + grid_offset, stride, rounding_mode="floor")


def tail_start(t: torch.Tensor, stride: int, grid_offset: int = 0) -> torch.Tensor:
    """First token not covered by an entry visible to query t (the uncompressed tail starts here)."""
    return (num_visible(t, stride, grid_offset) * stride - grid_offset).clamp(min=0)


def entry_positions(N: int, stride: int, grid_offset: int | list[int] = 0, device=None) -> torch.Tensor:
    """RoPE position of each entry: jS - d, [N]; with one offset per KV head, [N, HKV]."""
    j = torch.arange(N, device=device)
    if isinstance(grid_offset, int):
        return j * stride - grid_offset
    return j[:, None] * stride - torch.tensor(grid_offset, device=device)[None, :]


def offset_groups(offsets: list[int]) -> list[tuple[int, list[int]]]:
    """The KV heads of each distinct grid offset, [(d, [heads])], in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for h, d in enumerate(offsets):
        groups.setdefault(int(d), []).append(h)
    return list(groups.items())


def by_grid_offset(attention, q, k, v, k_cmp, v_cmp, *, grid_offset: int | list[int], sink=None, **kw):
    """`attention` (one grid offset for every head) with one offset per KV head: one call per distinct offset on
    the KV heads that have it and on their G query heads each; the outputs [B, T, H, D] go back in head order.

    k_cmp, v_cmp: [B, N, HKV, D], N the most entries of any head; a head's entries past its own count are never
    visible (j < floor((t+1+d)/S) <= floor((T+d)/S)), so their values do not matter."""
    if isinstance(grid_offset, int):
        return attention(q, k, v, k_cmp, v_cmp, sink=sink, grid_offset=grid_offset, **kw)
    groups = offset_groups(list(grid_offset))
    if len(groups) == 1:
        return attention(q, k, v, k_cmp, v_cmp, sink=sink, grid_offset=groups[0][0], **kw)
    H, HKV = q.shape[2], k.shape[2]
    G = H // HKV
    outs, order = [], []
    for d, heads in groups:
        kv = torch.tensor(heads, device=q.device)  # its KV heads
        qh = (kv[:, None] * G + torch.arange(G, device=q.device)).flatten()  # and their query heads
        outs.append(attention(q[:, :, qh], k[:, :, kv], v[:, :, kv], k_cmp[:, :, kv], v_cmp[:, :, kv],
                              sink=None if sink is None else sink[qh], grid_offset=d, **kw))  # [B, T, |qh|, D]
        order.append(qh)
    return torch.cat(outs, dim=2)[:, :, torch.argsort(torch.cat(order))]
