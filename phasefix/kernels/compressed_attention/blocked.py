"""Compressed attention (science.md §2), blocked: the fast CPU path and the CPU default (`model.attn_impl=blocked`).

Same contract as `naive.compressed_attention` (the dense reference it is tested against) without a T x T matrix:
query blocks, a chunked raw band and `_JointSoftmax`, whose backward is written out so that the entries' gradients
accumulate in place. The grid rules (visibility, tail start, per-head offsets) come from `phasefix.kernels.window_grid`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from phasefix.kernels.window_grid import by_grid_offset, num_visible, tail_start


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half precision -> float32 for softmax; float32 and float64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    """The dtype the attention computes in: the inputs' common dtype, and at least float32 under autocast (as
    `naive` does). Everything inside then runs in that one dtype with autocast off (matmul operands and accumulators
    match in the hand-written backward), the softmax and its row sums in float32. Why not bf16 under bf16 autocast:
    measured, bf16 attention kept compiled runs of the CPU default on their retrieval plateau, float32 attention
    did not (docs/performance.md); the projections and the MLP, most of the step's matmul work, stay bf16."""
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    if torch.is_autocast_enabled(xs[0].device.type):
        dtype = torch.promote_types(dtype, torch.float32)
    return dtype


def _bmm_acc_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b in place (out may be float32 while a, b are half precision: then a float32 accumulator)."""
    if out.dtype == a.dtype:
        out.baddbmm_(a, b)
    else:
        out.add_(torch.bmm(a, b))


RAW_CHUNK = 16  # queries per chunk of the local raw band (see `compressed_attention`)


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
    grid_offset: int | list[int] = 0,
    query_block: int = 256,
) -> torch.Tensor:
    """One softmax per query over its local raw keys, its visible compressed entries and the optional sink.

    q: [B, T, H, D]; k, v: [B, T, HKV, D] raw keys/values; k_cmp, v_cmp: [B, N, HKV, D] entries;
    sink: [H] logits (value zero) or None. Local raw keys of query t: the `local_window` tokens (t-L, t]
    ("window") or the tokens not covered by a visible entry ("tail"). Returns [B, T, H, D].
    grid_offset: one d for every head, or one per KV head (then split by `by_grid_offset`).

    Two kinds of scores, joined in one softmax per query (GQA: the G query heads of a KV head share its keys, so
    they are laid out next to each other, [B, HKV, T, G, D], and no key is repeated):
    - raw: the queries are cut into chunks of C = RAW_CHUNK; a chunk's raw keys are its own tokens and the (at least
      L-1) tokens before it, R keys in all, so one batched matmul gives every query R >= L raw scores, and a fixed
      band mask keeps its own local keys;
    - entries: queries are processed in blocks of `query_block`; a block's scores are one matmul against the entries
      visible to its last query, the staircase of entries that complete inside the block masked per query.
    `_JointSoftmax` does, per block, the softmax over [sink | entries | raw] and the entries' share of the output;
    the raw keys' probabilities come back for one more batched matmul with the raw values. No T x T matrix is
    built: a block costs Tb x (N_visible + R + 1) scores, about N/2 + Tb/2S + R per query.
    """
    if not isinstance(grid_offset, int):
        return by_grid_offset(compressed_attention, q, k, v, k_cmp, v_cmp, grid_offset=grid_offset, stride=stride,
                              local_window=local_window, local_memory=local_memory, sink=sink, scale=scale,
                              query_block=query_block)
    dtype = compute_dtype(q, k, v, k_cmp, v_cmp)
    q, k, v, k_cmp, v_cmp = (x.to(dtype) for x in (q, k, v, k_cmp, v_cmp))
    with torch.autocast(q.device.type, enabled=False):
        return _compressed_attention(q, k, v, k_cmp, v_cmp, stride=stride, local_window=local_window,
                                     local_memory=local_memory, sink=sink, scale=scale, grid_offset=grid_offset,
                                     query_block=query_block)


def _compressed_attention(q, k, v, k_cmp, v_cmp, *, stride, local_window, local_memory, sink, scale, grid_offset,
                          query_block):
    """`compressed_attention` for one grid offset, its inputs in one dtype, autocast off."""
    B, T, H, D = q.shape
    HKV, N = k.shape[2], k_cmp.shape[1]
    G = H // HKV
    scale = D**-0.5 if scale is None else scale
    L = local_window if local_memory == "window" else stride  # the tail is always shorter than S
    C = max(1, min(RAW_CHUNK, query_block))
    m = -(-(L - 1) // C)  # earlier chunks a query may reach back into
    R = (m + 1) * C  # raw keys per chunk: tokens [(c-m)C, (c+1)C) for chunk c
    Tp = -(-T // C) * C  # queries padded to whole chunks (the padding is dropped at the end)
    nc = Tp // C
    dev = q.device

    q = F.pad((q * scale).view(B, T, HKV, G, D).transpose(1, 2), (0, 0, 0, 0, 0, Tp - T)).contiguous()

    def band(x):  # [B, T, HKV, D] -> [B, HKV, nc, R, D]: every chunk's raw keys (zeros before token 0)
        x = F.pad(x.transpose(1, 2), (0, 0, m * C, Tp - T)).view(B, HKV, m + nc, C, D)
        return torch.cat([x[:, :, i : i + nc] for i in range(m + 1)], dim=3)

    k_band, v_band = band(k), band(v)
    t = torch.arange(Tp, device=dev)[:, None]
    s = torch.div(t, C, rounding_mode="floor") * C - m * C + torch.arange(R, device=dev)  # [Tp, R] key tokens
    raw_ok = (s <= t) & (s > t - L) & (s >= 0)
    if local_memory == "tail":
        raw_ok &= s >= tail_start(t, stride, grid_offset)
    raw_ok |= t >= T  # padding queries: any finite row (they are dropped)
    raw = (q.view(B, HKV, nc, C * G, D) @ k_band.transpose(-1, -2)).view(B, HKV, Tp, G, R)
    raw = raw.masked_fill(~raw_ok[:, None, :], float("-inf"))

    n_vis = num_visible(torch.arange(Tp, device=dev), stride, grid_offset).clamp(max=N)  # [Tp]

    # the block bounds as Python ints, by the same rule (not n_vis.tolist(): no sync, no graph break)
    counts = [min(N, num_visible(t, stride, grid_offset)) for t in range(Tp)]
    blocks = [(t0, min(Tp, t0 + query_block)) for t0 in range(0, Tp, query_block)]
    blocks = [(t0, t1, counts[t0], counts[t1 - 1]) for t0, t1 in blocks]  # (t0, t1, seen by all, by the last)
    n_max = blocks[-1][3]
    k_cmp, v_cmp = (x[:, :n_max].transpose(1, 2).contiguous() for x in (k_cmp, v_cmp))  # [B, HKV, n_max, D]
    sink = None if sink is None else sink.view(HKV, G)
    out, p_raw = _JointSoftmax.apply(q, k_cmp, v_cmp, raw, sink, n_vis, blocks)
    out = out.view(B, HKV, nc, C * G, D) + p_raw.view(B, HKV, nc, C * G, R) @ v_band
    return out.view(B, HKV, Tp, G, D)[:, :, :T].transpose(1, 2).reshape(B, T, H, D)


class _JointSoftmax(torch.autograd.Function):
    """Per query block: the softmax over [sink | visible entries | raw scores] and the entries' weighted values.

    q: [B, HKV, Tp, G, D] (scaled); kc, vc: [B, HKV, Ne, D] contiguous; raw: [B, HKV, Tp, G, R] masked raw scores;
    sink: [HKV, G] or None; n_vis: [Tp] entries visible to each query; blocks: (t0, t1, n0, n) per query block,
    the block's n entries (those visible to its last query), the first n0 visible to all its queries.
    Returns the entries' part of the output, [B, HKV, Tp, G, D], and the raw keys' probabilities, [B, HKV, Tp, G, R].

    The backward is the softmax gradient written out (dS = P * (dP - rowsum(P * dP))), so that the entries'
    gradients accumulate in place instead of as one full-size gradient per block; it saves every block's
    probabilities, as autograd would.
    """

    @staticmethod
    def forward(ctx, q, kc, vc, raw, sink, n_vis, blocks):
        B, HKV, Tp, G, D = q.shape
        R = raw.shape[-1]
        q3, kc3, vc3 = q.view(B * HKV, Tp * G, D), kc.view(B * HKV, -1, D), vc.view(B * HKV, -1, D)
        keep = any(ctx.needs_input_grad)  # otherwise (no grad) each block's probabilities are dropped at once
        out = torch.empty(B, HKV, Tp, G, D, dtype=vc.dtype, device=q.device)
        p_raw = torch.empty(B, HKV, Tp, G, R, dtype=vc.dtype, device=q.device)
        out3, probs = out.view(B * HKV, Tp * G, D), []
        # last block first: the blocks' buffers then shrink, and the allocator reuses the memory the previous freed
        for t0, t1, n0, n in reversed(blocks):
            Tb, rows = t1 - t0, slice(t0 * G, t1 * G)
            ent = (q3[:, rows] @ kc3[:, :n].transpose(1, 2)).view(B, HKV, Tb, G, n)
            if n0 < n:  # the staircase: entries that complete inside the block
                late = torch.arange(n0, n, device=q.device) >= n_vis[t0:t1, None, None]  # [Tb, 1, n - n0]
                ent[..., n0:].masked_fill_(late, float("-inf"))
            parts = [_upcast(ent), _upcast(raw[:, :, t0:t1])]  # the softmax in float32 (bf16: its stats too)
            if sink is not None:
                parts.insert(0, sink.to(parts[0].dtype).view(1, HKV, 1, G, 1).expand(B, HKV, Tb, G, 1))
            p = torch.softmax(torch.cat(parts, dim=-1), dim=-1).to(vc.dtype)
            p_e = p[..., -(n + R) : p.shape[-1] - R]
            out3[:, rows].baddbmm_(p_e.reshape(B * HKV, Tb * G, n), vc3[:, :n], beta=0)
            p_raw[:, :, t0:t1] = p[..., p.shape[-1] - R :]  # a copy: a view would keep every block's p alive
            if keep:
                probs.append(p)
        probs.reverse()
        ctx.blocks, ctx.sink_dtype = blocks, None if sink is None else sink.dtype
        if keep:
            ctx.save_for_backward(q, kc, vc, out, p_raw, *probs)
        return out, p_raw

    @staticmethod
    def backward(ctx, d_out, d_praw):
        q, kc, vc, out, p_raw, *probs = ctx.saved_tensors
        B, HKV, Tp, G, D = q.shape
        R = p_raw.shape[-1]
        d_out, d_praw = d_out.contiguous(), d_praw.contiguous()
        q3, kc3, vc3 = q.view(B * HKV, Tp * G, D), kc.view(B * HKV, -1, D), vc.view(B * HKV, -1, D)
        do3 = d_out.view(B * HKV, Tp * G, D)
        acc = _upcast(q).dtype  # the entries' gradients accumulate over blocks in float32 (or float64)
        dq = torch.empty_like(q)  # every row written once
        dkc, dvc = torch.zeros_like(kc, dtype=acc), torch.zeros_like(vc, dtype=acc)
        dq3, dkc3, dvc3 = dq.view(B * HKV, Tp * G, D), dkc.view(B * HKV, -1, D), dvc.view(B * HKV, -1, D)
        # rowsum(P * dP), in float32: the entries' part is rowsum(dO * O) (O being their output), plus the raw part
        delta = ((_upcast(d_out) * out).sum(-1) + (_upcast(p_raw) * d_praw).sum(-1))[..., None]  # [B, HKV, Tp, G, 1]
        d_raw = (p_raw * (d_praw - delta)).to(q.dtype)
        d_sink = None
        if ctx.sink_dtype is not None:  # the sink's value is zero: dS = -P * delta
            p_sink = torch.cat([p[..., 0] for p in probs], dim=2)
            d_sink = -(p_sink * delta[..., 0]).sum((0, 2)).to(ctx.sink_dtype)
        for (t0, t1, _, n), p in reversed(list(zip(ctx.blocks, probs))):  # last first, as in forward
            Tb, rows = t1 - t0, slice(t0 * G, t1 * G)
            p_e = p[..., -(n + R) : p.shape[-1] - R].reshape(B * HKV, Tb * G, n)
            ds = _upcast(do3[:, rows] @ vc3[:, :n].transpose(1, 2))  # dP of the entries, then dS in place (fp32)
            ds.view(B, HKV, Tb, G, n).sub_(delta[:, :, t0:t1]).mul_(p_e.view(B, HKV, Tb, G, n))
            ds = ds.to(q.dtype)
            dq3[:, rows].baddbmm_(ds, kc3[:, :n], beta=0)
            _bmm_acc_(dkc3[:, :n], ds.transpose(1, 2), q3[:, rows])
            _bmm_acc_(dvc3[:, :n], p_e.transpose(1, 2), do3[:, rows])
        return dq, dkc.to(kc.dtype), dvc.to(vc.dtype), d_raw, d_sink, None, None
