"""Compressed attention (science.md §2), naive: the readable reference (fla's `naive.py` beside the fast ops).

It builds the full [T, T + N] visibility mask from the definitions (not from `phasefix.kernels.window_grid`'s
helpers, so that it checks them too), uses one dense masked softmax in float32 for half-precision inputs (autocast
off inside, so also under bf16 autocast) and never downcasts float64: in float64 it is the ground truth the tests hold
`blocked` and `triton` to. Memory is O(T^2): for tests and small checks
(`model.attn_impl=naive`). Torch only (no phasefix import).
"""
from __future__ import annotations

import torch


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def visibility(T: int, N: int, stride: int, local_window: int = 16, local_memory: str = "window",
               grid_offset: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks of what each query sees: raw keys [T, T] and compressed entries [T, N]."""
    t = torch.arange(T, device=device)[:, None]  # [T, 1]
    s = torch.arange(T, device=device)[None, :]  # [1, T]
    n_vis = torch.div(t + 1 + grid_offset, stride, rounding_mode="floor")  # [T, 1]
    if local_memory == "window":
        raw = (s <= t) & (s > t - local_window)
    elif local_memory == "tail":
        raw = (s <= t) & (s >= (n_vis * stride - grid_offset).clamp(min=0))
    else:
        raise ValueError(f"local_memory must be 'window' or 'tail', got {local_memory!r}")
    cmp = torch.arange(N, device=device)[None, :] < n_vis  # [T, N]
    return raw, cmp


def compressed_attention(q, k, v, k_cmp, v_cmp, *, stride, local_window=16, local_memory="window", sink=None,
                         scale=None, grid_offset=0, query_block=256):
    """One softmax per query over its local raw keys, its visible entries and the optional sink (value zero),
    computed densely: q [B,T,H,D]; k, v [B,T,HKV,D]; k_cmp, v_cmp [B,N,HKV,D]; sink [H] or None -> [B,T,H,D].
    Raw keys of query t: (t-L, t] ("window") or the tokens no visible entry covers ("tail"). `query_block` is
    accepted for signature parity and ignored.
    grid_offset: one int, or one per KV head (each KV head and its query heads then see their own grid)."""
    with torch.autocast(q.device.type, enabled=False):  # float32 (float64) as written, also under autocast
        return _compressed_attention(q, k, v, k_cmp, v_cmp, stride=stride, local_window=local_window,
                                     local_memory=local_memory, sink=sink, scale=scale, grid_offset=grid_offset)


def _compressed_attention(q, k, v, k_cmp, v_cmp, *, stride, local_window, local_memory, sink, scale, grid_offset):
    B, T, H, D = q.shape
    HKV, N = k.shape[2], k_cmp.shape[1]
    G = H // HKV
    acc = _acc(q.dtype)
    scale = D ** -0.5 if scale is None else scale
    offsets = [grid_offset] * HKV if isinstance(grid_offset, int) else [int(d) for d in grid_offset]
    mask = torch.stack([torch.cat(visibility(T, N, stride, local_window, local_memory, d, q.device), dim=1)
                        for d in offsets]).repeat_interleave(G, dim=0)  # [H, T, T+N]
    keys = torch.cat([k, k_cmp], dim=1).to(acc).repeat_interleave(G, dim=2)  # [B, T+N, H, D]
    vals = torch.cat([v, v_cmp], dim=1).to(acc).repeat_interleave(G, dim=2)  # [B, T+N, H, D]
    s = torch.einsum("bthd,bshd->bhts", q.to(acc), keys) * scale  # [B, H, T, T+N]
    s = s.masked_fill(~mask[None], float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(acc).view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., : T + N]  # the sink's value is zero
    return torch.einsum("bhts,bshd->bthd", p, vals).to(q.dtype)
