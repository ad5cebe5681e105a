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

    Queries are processed in blocks of `query_block`. A block's keys are the entries visible to its last query
    followed by the raw tokens its queries can reach ([t0-L+1, t1)); a boolean mask then picks, for every query,
    its own visible entries and local raw keys, and one masked `scaled_dot_product_attention` call does the joint
    softmax. So no T x T matrix is ever built: a block costs Tb x (N_visible + Tb + L) scores.
    """
    B, T, H, D = q.shape
    HKV, N = k.shape[2], k_cmp.shape[1]
    scale = D**-0.5 if scale is None else scale
    L = local_window if local_memory == "window" else stride  # the tail is always shorter than S
    q, k, v, k_cmp, v_cmp = (x.transpose(1, 2) for x in (q, k, v, k_cmp, v_cmp))  # [B, heads, tokens, D]
    n_sink = 0
    if sink is not None:
        q, k, v, k_cmp, v_cmp = _sink_as_entry(q, k, v, k_cmp, v_cmp, sink, scale)
        n_sink = 1

    t_all = torch.arange(T, device=q.device)
    n_vis = num_visible(t_all, stride, grid_offset).clamp(max=N) + n_sink  # [T] visible entries (and the sink)
    starts = range(0, T, query_block)
    n_block = [int(n_vis[min(T, t0 + query_block) - 1]) for t0 in starts]  # entries some query of block b sees
    # Split once, outside the loop: every block then reads its own pieces, and autograd assembles each gradient
    # in one go (slicing the whole tensors per block would allocate a full-size gradient per block).
    q_b = q.split(query_block, dim=2)
    k_b, v_b = k.split(query_block, dim=2), v.split(query_block, dim=2)
    new_entries = [n - m for n, m in zip(n_block, [0] + n_block[:-1])]
    kc_b = k_cmp[:, :, : n_block[-1]].split(new_entries, dim=2)
    vc_b = v_cmp[:, :, : n_block[-1]].split(new_entries, dim=2)

    out = []
    for b, t0 in enumerate(starts):
        t1 = t0 + q_b[b].shape[2]
        lo = max(0, t0 - L + 1)  # the first raw token a query of this block can reach
        first, skip = divmod(lo, query_block)  # ... is token `skip` of block `first`
        keys = torch.cat([*kc_b[: b + 1], k_b[first][:, :, skip:], *k_b[first + 1 : b + 1]], dim=2)
        values = torch.cat([*vc_b[: b + 1], v_b[first][:, :, skip:], *v_b[first + 1 : b + 1]], dim=2)
        t = t_all[t0:t1, None]
        raw = torch.arange(lo, t1, device=q.device)[None, :]
        raw_ok = (raw <= t) & (raw > t - L)
        if local_memory == "tail":
            raw_ok &= raw >= tail_start(t, stride, grid_offset)
        entry_ok = torch.arange(n_block[b], device=q.device)[None, :] < n_vis[t0:t1, None]
        mask = torch.cat([entry_ok, raw_ok], dim=1)  # [Tb, entries + raw]; every row has its own token or an entry
        out.append(F.scaled_dot_product_attention(q_b[b], keys, values, attn_mask=mask, scale=scale,
                                                  enable_gqa=H != HKV))
    return torch.cat(out, dim=2)[..., :D].transpose(1, 2)


def _sink_as_entry(q, k, v, k_cmp, v_cmp, sink, scale):
    """The sink as an always-visible entry 0 with a zero value, via one extra channel on every head:
    queries carry sink_h / scale there, the sink key is 1 there and 0 elsewhere, all other keys and all values are
    0 there. So the sink's logit is exactly sink_h, every other logit is unchanged, and the sink adds nothing to
    the output (whose extra channel the caller drops). Inputs and outputs are [B, heads, tokens, D(+1)]."""
    B, H, T, D = q.shape
    HKV = k.shape[1]
    q = torch.cat([q, (sink.to(q.dtype) / scale).view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    k, v, k_cmp, v_cmp = (F.pad(x, (0, 1)) for x in (k, v, k_cmp, v_cmp))
    sink_key = F.pad(q.new_ones(B, HKV, 1, 1), (D, 0))  # [B, HKV, 1, D+1] = (0, ..., 0, 1)
    k_cmp = torch.cat([sink_key, k_cmp], dim=2)
    v_cmp = torch.cat([torch.zeros_like(sink_key), v_cmp], dim=2)
    return q, k, v, k_cmp, v_cmp
