"""Chunked KV compression, the readable reference path (science.md §2).

Two ops, each with a Triton twin of the same signature in `kernels/`:
- `gated_pool`: per window, softmax the gate logits over the W slots and sum the slot payloads;
- `compressed_attention`: each query attends, in one softmax, to its local raw keys and its visible entries.

Grid (with an optional `grid_offset` d in [0, S), 0 in the paper): window j ends at token (j+1)S-1-d and starts at
(j+1)S-W-d; slots before position 0 get zero weight. Entry j is visible to query t once its window is complete:
j < floor((t+1+d)/S). Entries get RoPE at position jS-d (jS in the paper).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LOCAL_MEMORY = ("window", "tail")


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


def num_visible(t: torch.Tensor, stride: int, grid_offset: int = 0) -> torch.Tensor:
    """Entries visible to the query at position t: floor((t+1+d)/S)."""
    return torch.div(t + 1 + grid_offset, stride, rounding_mode="floor")


def tail_start(t: torch.Tensor, stride: int, grid_offset: int = 0) -> torch.Tensor:
    """First token not covered by an entry visible to query t (the uncompressed tail starts here)."""
    return (num_visible(t, stride, grid_offset) * stride - grid_offset).clamp(min=0)


def entry_positions(N: int, stride: int, grid_offset: int = 0, device=None) -> torch.Tensor:
    """RoPE position of each entry: jS - d."""
    return torch.arange(N, device=device) * stride - grid_offset


# ------------------------------------------------------------------------------------------------ pooling
def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half precision -> float32 for softmax; float32 and float64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gated_pool(payload: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """Softmax over slots, then the weighted sum of the slot payloads.

    payload:     [B, N, W, HKV, D]  C_i h_{j,i} for every entry j and slot i
    gate_logits: [B, N, W, HKV, 1] (scalar gate) or [B, N, W, HKV, D] (vector gate); -inf marks empty slots
    returns:     [B, N, HKV, D]
    """
    a = torch.softmax(_upcast(gate_logits), dim=2).to(payload.dtype)  # [B, N, W, HKV, 1|D]
    return (a * payload).sum(dim=2)


# ------------------------------------------------------------------------------------------------ attention
def compressed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    *,
    stride: int,
    local_window: int = 16,
    local_memory: str = "window",
    sink: torch.Tensor | None = None,
    scale: float | None = None,
    grid_offset: int = 0,
    query_block: int = 256,
) -> torch.Tensor:
    """One softmax per query over its local raw keys, its visible compressed entries and the optional sink.

    q: [B, T, H, D]; k, v: [B, T, HKV, D] raw keys/values; k_cmp, v_cmp: [B, N, HKV, D] entries;
    sink: [H] logits (value zero) or None. Local raw keys of query t: the `local_window` tokens (t-L, t]
    ("window") or the tokens not covered by a visible entry ("tail"). Returns [B, T, H, D].

    Queries are processed in blocks and raw keys through a band of width L, so no T x T matrix is ever built.
    """
    B, T, H, D = q.shape
    HKV = k.shape[2]
    G = H // HKV
    N = k_cmp.shape[1]
    scale = D**-0.5 if scale is None else scale
    # the raw band: tokens t-L+1..t for every query; the tail is always shorter than S
    L = local_window if local_memory == "window" else stride
    k_band = F.pad(k, (0, 0, 0, 0, L - 1, 0)).unfold(1, L, 1)  # [B, T, HKV, D, L]
    v_band = F.pad(v, (0, 0, 0, 0, L - 1, 0)).unfold(1, L, 1)  # [B, T, HKV, D, L]
    qg = q.view(B, T, HKV, G, D)
    t_all = torch.arange(T, device=q.device)
    band_pos = t_all[:, None] - (L - 1) + torch.arange(L, device=q.device)[None, :]  # [T, L]
    band_ok = band_pos >= 0
    if local_memory == "tail":
        band_ok &= band_pos >= tail_start(t_all, stride, grid_offset)[:, None]
    n_vis = num_visible(t_all, stride, grid_offset).clamp(max=N)  # [T]

    blocks = []
    for t0 in range(0, T, query_block):
        t1 = min(T, t0 + query_block)
        qb = qg[:, t0:t1]  # [B, Tb, HKV, G, D]
        # raw band scores [B, Tb, HKV, G, L]
        s_raw = torch.einsum("bthgd,bthdl->bthgl", qb, k_band[:, t0:t1]) * scale
        s_raw = s_raw.masked_fill(~band_ok[t0:t1, None, None, :], float("-inf"))
        # compressed scores [B, Tb, HKV, G, Nb]: only entries some query of the block can see
        Nb = int(n_vis[t1 - 1])
        s_cmp = torch.einsum("bthgd,bnhd->bthgn", qb, k_cmp[:, :Nb]) * scale
        cmp_ok = torch.arange(Nb, device=q.device)[None, :] < n_vis[t0:t1, None]  # [Tb, Nb]
        s_cmp = s_cmp.masked_fill(~cmp_ok[:, None, None, :], float("-inf"))
        parts = [s_raw, s_cmp]
        if sink is not None:
            parts.append(sink.view(1, 1, HKV, G, 1).expand(B, t1 - t0, HKV, G, 1).to(s_raw.dtype))
        p = torch.softmax(_upcast(torch.cat(parts, dim=-1)), dim=-1).to(q.dtype)
        p_raw, p_cmp = p[..., :L], p[..., L:L + Nb]
        o = torch.einsum("bthgl,bthdl->bthgd", p_raw, v_band[:, t0:t1])
        o = o + torch.einsum("bthgn,bnhd->bthgd", p_cmp, v_cmp[:, :Nb])
        blocks.append(o.reshape(B, t1 - t0, H, D))
    return torch.cat(blocks, dim=1)
