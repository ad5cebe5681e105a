"""Compressed attention (science.md §2), Triton forward and backward.

Each query t attends, in one softmax, to
  (a) its raw local keys: the band (t-L, t] ("window") or the uncompressed tail [tail_start(t), t] ("tail"),
      tail_start(t) = max(floor((t+1+d)/S)*S - d, 0);
  (b) its visible compressed entries j < n_vis(t) = floor((t+1+d)/S);
  (c) the optional sink logit (value zero), which only enters the denominator.
GQA: query head h reads KV head h // (H / HKV).

Layout follows fla's `ops/`: kernels -> launchers -> autograd.Function -> public function.

Tiling (FlashAttention-2 style, online softmax in base 2, float32 accumulators; float64 for float64 inputs):
- forward / dq: one program per (query tile of BLOCK_M tokens, batch, query head). It walks only the key tiles that
  some query of the tile can see: entries [0, n_vis(last query)) and raw keys [lo(first query), last query].
  Entry tiles below n_vis(first query) are visible to every query of the tile and run without a mask; only the
  boundary entry tile and the raw band/tail are masked. The sink initialises the running max/denominator.
- dk/dv (raw keys) and dk_cmp/dv_cmp (entries): one program per (key tile of BLOCK_N, batch, KV head); it loops over
  the G query heads of its KV head and over the query tiles that can see the key tile (for entries: queries
  t >= (j+1)S-1-d, unmasked once every entry of the tile is visible). No atomics: each program owns its key rows.
- backward recomputes the probabilities from the saved base-2 logsumexp; delta = rowsum(dO * O) and the sink's
  gradient -sum_t p_sink(t) delta(t) are cheap reductions done in PyTorch.

Must import with torch and triton alone (no phasefix import); the reference is `naive.compressed_attention`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOCAL_MEMORY = ("window", "tail")
_RAW_WINDOW, _RAW_TAIL, _CMP = 0, 1, 2  # key-source modes of the kernels
LOG2E = 1.4426950408889634


# ------------------------------------------------------------------------------------------------ helpers
@triton.jit
def _visible(t, s, n_src, T, L, S, GOFF, MODE: tl.constexpr):
    """Mask of (query position t, key index s) pairs; t and s are broadcastable 2-D index tensors."""
    if MODE == 0:  # raw window (t-L, t]
        m = (s <= t) & (s > t - L)
    elif MODE == 1:  # raw tail [floor((t+1+d)/S)*S - d, t]
        m = (s <= t) & (s >= ((t + 1 + GOFF) // S) * S - GOFF)
    else:  # compressed entries j < floor((t+1+d)/S)
        m = s < (t + 1 + GOFF) // S
    return m & (s < n_src) & (t < T)


@triton.jit
def _query_tile_sources(i_m, T, N, L, S, GOFF, RAW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """What the query tile [t0, t1] reads: compressed entries [0, full) seen by every query of the tile (no mask)
    and [full, nv1) seen by some, then raw keys [lo, t1]. Returns (full, nv1, lo, t1)."""
    t0 = i_m * BLOCK_M
    t1 = tl.minimum(t0 + BLOCK_M, T) - 1  # last real query of the tile
    nv0 = tl.minimum((t0 + 1 + GOFF) // S, N)
    nv1 = tl.minimum((t1 + 1 + GOFF) // S, N)
    full = (nv0 // BLOCK_N) * BLOCK_N
    if RAW == 0:  # window (t-L, t]
        lo = tl.maximum(t0 - L + 1, 0)
    else:  # tail: from the first query's window start
        lo = tl.maximum(((t0 + 1 + GOFF) // S) * S - GOFF, 0)
    return full, nv1, lo, t1


@triton.jit
def _kv_block_scores(b_q, k_ptr, v_ptr, stride_s, o_s, m_s, o_d, m_d, qk_scale,
                     ACC: tl.constexpr, PREC: tl.constexpr):
    """A block of source keys and values [BN, BD] and the query tile's scaled scores against them [BM, BN]."""
    b_k = tl.load(k_ptr + o_s[:, None] * stride_s + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.)
    b_v = tl.load(v_ptr + o_s[:, None] * stride_s + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.)
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC, out_dtype=ACC) * qk_scale  # [BM, BN]
    return b_k, b_v, b_s


@triton.jit
def _fwd_inner(
    b_acc, b_m, b_l,  # [BM, BD], [BM], [BM] running output, max (base 2) and denominator
    b_q,  # [BM, BD]
    k_ptr, v_ptr,  # source keys/values at (batch, kv head): row s at + s * stride_s
    stride_s,
    o_t,  # [BM] query positions
    lo, hi, n_src, T, L, S, GOFF, qk_scale, D,
    MODE: tl.constexpr, MASKED: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
):
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    for start in range(lo, hi, BLOCK_N):
        o_s = start + tl.arange(0, BLOCK_N)  # [BN]
        m_s = o_s < hi
        b_k, b_v, b_s = _kv_block_scores(b_q, k_ptr, v_ptr, stride_s, o_s, m_s, o_d, m_d, qk_scale, ACC, PREC)
        if MASKED:
            b_s = tl.where(_visible(o_t[:, None], o_s[None, :], n_src, T, L, S, GOFF, MODE), b_s, float("-inf"))
        b_mn = tl.maximum(b_m, tl.max(b_s, axis=1))  # [BM]
        b_ms = tl.where(b_mn == float("-inf"), 0., b_mn)
        b_alpha = tl.exp2(b_m - b_ms)  # [BM]
        b_p = tl.exp2(b_s - b_ms[:, None])  # [BM, BN]
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC, out_dtype=ACC)
        b_m = b_mn
    return b_acc, b_m, b_l


# ------------------------------------------------------------------------------------------------ forward
@triton.jit
def _fwd_kernel(
    q_ptr,  # [B, T, H, D]
    k_ptr, v_ptr,  # [B, T, HKV, D]
    kc_ptr, vc_ptr,  # [B, N, HKV, D]
    sink_ptr,  # [H] (unused without sink)
    o_ptr,  # [B, T, H, D]
    lse_ptr,  # [B, H, T] base-2 logsumexp
    T, N, H, HKV, D, L, S, GOFF, qk_scale,
    RAW: tl.constexpr, HAS_SINK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PREC: tl.constexpr,
):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_hk = i_h // (H // HKV)
    i_b64 = i_b.to(tl.int64)
    o_t = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    o_d = tl.arange(0, BLOCK_D)  # [BD]
    m_t, m_d = o_t < T, o_d < D
    m_td = m_t[:, None] & m_d[None, :]  # [BM, BD]
    q_base = q_ptr + i_b64 * T * H * D + i_h * D
    b_q = tl.load(q_base + o_t[:, None] * (H * D) + o_d[None, :], mask=m_td, other=0.)  # [BM, BD]

    if HAS_SINK:
        b_m = tl.zeros([BLOCK_M], dtype=ACC) + tl.load(sink_ptr + i_h).to(ACC) * 1.4426950408889634  # [BM]
        b_l = tl.zeros([BLOCK_M], dtype=ACC) + 1.  # exp2(sink - m) = 1
    else:
        b_m = tl.zeros([BLOCK_M], dtype=ACC) + float("-inf")
        b_l = tl.zeros([BLOCK_M], dtype=ACC)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)

    # (b) compressed entries: [0, full) seen by every query of the tile, [full, nv1) by some; (a) raw keys [lo, t1]
    full, nv1, lo, t1 = _query_tile_sources(i_m, T, N, L, S, GOFF, RAW, BLOCK_M, BLOCK_N)
    kc_base = kc_ptr + i_b64 * N * HKV * D + i_hk * D
    vc_base = vc_ptr + i_b64 * N * HKV * D + i_hk * D
    b_acc, b_m, b_l = _fwd_inner(b_acc, b_m, b_l, b_q, kc_base, vc_base, HKV * D, o_t, 0, full, N, T, L, S, GOFF,
                                 qk_scale, D, 2, False, BLOCK_N, BLOCK_D, ACC, PREC)
    b_acc, b_m, b_l = _fwd_inner(b_acc, b_m, b_l, b_q, kc_base, vc_base, HKV * D, o_t, full, nv1, N, T, L, S, GOFF,
                                 qk_scale, D, 2, True, BLOCK_N, BLOCK_D, ACC, PREC)
    k_base = k_ptr + i_b64 * T * HKV * D + i_hk * D
    v_base = v_ptr + i_b64 * T * HKV * D + i_hk * D
    b_acc, b_m, b_l = _fwd_inner(b_acc, b_m, b_l, b_q, k_base, v_base, HKV * D, o_t, lo, t1 + 1, T, T, L, S, GOFF,
                                 qk_scale, D, RAW, True, BLOCK_N, BLOCK_D, ACC, PREC)

    b_l = tl.where(b_l == 0., 1., b_l)  # padded rows (t >= T) saw nothing; keep them finite
    b_o = b_acc / b_l[:, None]
    tl.store(o_ptr + i_b64 * T * H * D + i_h * D + o_t[:, None] * (H * D) + o_d[None, :],
             b_o.to(o_ptr.dtype.element_ty), mask=m_td)
    tl.store(lse_ptr + (i_b64 * H + i_h) * T + o_t, b_m + tl.log2(b_l), mask=m_t)


# ------------------------------------------------------------------------------------------------ backward: dq
@triton.jit
def _bwd_dq_inner(
    b_dq, b_q, b_do, b_lse, b_delta,  # [BM, BD] x3, [BM] x2
    k_ptr, v_ptr, stride_s, o_t,
    lo, hi, n_src, T, L, S, GOFF, qk_scale, D,
    MODE: tl.constexpr, MASKED: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
):
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    for start in range(lo, hi, BLOCK_N):
        o_s = start + tl.arange(0, BLOCK_N)  # [BN]
        m_s = o_s < hi
        b_k, b_v, b_s = _kv_block_scores(b_q, k_ptr, v_ptr, stride_s, o_s, m_s, o_d, m_d, qk_scale, ACC, PREC)
        b_p = tl.exp2(b_s - b_lse[:, None])  # [BM, BN]
        if MASKED:
            b_p = tl.where(_visible(o_t[:, None], o_s[None, :], n_src, T, L, S, GOFF, MODE), b_p, 0.)
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC, out_dtype=ACC)  # [BM, BN]
        b_ds = b_p * (b_dp - b_delta[:, None])  # [BM, BN]
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=PREC, out_dtype=ACC)  # [BM, BD]
    return b_dq


@triton.jit
def _bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr,
    do_ptr,  # [B, T, H, D]
    lse_ptr, delta_ptr,  # [B, H, T]
    dq_ptr,  # [B, T, H, D]
    T, N, H, HKV, D, L, S, GOFF, qk_scale, scale,
    RAW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PREC: tl.constexpr,
):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_hk = i_h // (H // HKV)
    i_b64 = i_b.to(tl.int64)
    o_t = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    o_d = tl.arange(0, BLOCK_D)
    m_t, m_d = o_t < T, o_d < D
    m_td = m_t[:, None] & m_d[None, :]
    qo_off = i_b64 * T * H * D + i_h * D + o_t[:, None] * (H * D) + o_d[None, :]  # [BM, BD]
    b_q = tl.load(q_ptr + qo_off, mask=m_td, other=0.)  # [BM, BD]
    b_do = tl.load(do_ptr + qo_off, mask=m_td, other=0.)  # [BM, BD]
    b_lse = tl.load(lse_ptr + (i_b64 * H + i_h) * T + o_t, mask=m_t, other=0.)  # [BM]
    b_delta = tl.load(delta_ptr + (i_b64 * H + i_h) * T + o_t, mask=m_t, other=0.)  # [BM]
    b_dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)

    full, nv1, lo, t1 = _query_tile_sources(i_m, T, N, L, S, GOFF, RAW, BLOCK_M, BLOCK_N)
    kc_base = kc_ptr + i_b64 * N * HKV * D + i_hk * D
    vc_base = vc_ptr + i_b64 * N * HKV * D + i_hk * D
    b_dq = _bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, kc_base, vc_base, HKV * D, o_t, 0, full, N, T, L, S, GOFF,
                         qk_scale, D, 2, False, BLOCK_N, BLOCK_D, ACC, PREC)
    b_dq = _bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, kc_base, vc_base, HKV * D, o_t, full, nv1, N, T, L, S,
                         GOFF, qk_scale, D, 2, True, BLOCK_N, BLOCK_D, ACC, PREC)
    k_base = k_ptr + i_b64 * T * HKV * D + i_hk * D
    v_base = v_ptr + i_b64 * T * HKV * D + i_hk * D
    b_dq = _bwd_dq_inner(b_dq, b_q, b_do, b_lse, b_delta, k_base, v_base, HKV * D, o_t, lo, t1 + 1, T, T, L, S, GOFF,
                         qk_scale, D, RAW, True, BLOCK_N, BLOCK_D, ACC, PREC)
    tl.store(dq_ptr + qo_off, (b_dq * scale).to(dq_ptr.dtype.element_ty), mask=m_td)


# ------------------------------------------------------------------------------------------------ backward: dk, dv
@triton.jit
def _bwd_dkdv_inner(
    b_dk, b_dv, b_k, b_v,  # [BN, BD] x4
    q_ptr, do_ptr, lse_ptr, delta_ptr,  # at (batch, query head): q/do row t at + t * H * D, lse/delta at + t
    o_s,  # [BN] key indices
    lo, hi, n_src, T, H, L, S, GOFF, qk_scale, D,
    MODE: tl.constexpr, MASKED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
):
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    for start in range(lo, hi, BLOCK_M):
        o_t = start + tl.arange(0, BLOCK_M)  # [BM]
        m_t = o_t < T
        m_td = m_t[:, None] & m_d[None, :]
        b_q = tl.load(q_ptr + o_t[:, None] * (H * D) + o_d[None, :], mask=m_td, other=0.)  # [BM, BD]
        b_do = tl.load(do_ptr + o_t[:, None] * (H * D) + o_d[None, :], mask=m_td, other=0.)  # [BM, BD]
        b_lse = tl.load(lse_ptr + o_t, mask=m_t, other=0.)  # [BM]
        b_delta = tl.load(delta_ptr + o_t, mask=m_t, other=0.)  # [BM]
        b_sT = tl.dot(b_k, tl.trans(b_q), input_precision=PREC, out_dtype=ACC) * qk_scale  # [BN, BM]
        b_pT = tl.exp2(b_sT - b_lse[None, :])  # [BN, BM]
        if MASKED:
            b_pT = tl.where(_visible(o_t[None, :], o_s[:, None], n_src, T, L, S, GOFF, MODE), b_pT, 0.)
        else:
            b_pT = tl.where(m_t[None, :], b_pT, 0.)
        b_dv += tl.dot(b_pT.to(b_do.dtype), b_do, input_precision=PREC, out_dtype=ACC)  # [BN, BD]
        b_dpT = tl.dot(b_v, tl.trans(b_do), input_precision=PREC, out_dtype=ACC)  # [BN, BM]
        b_dsT = b_pT * (b_dpT - b_delta[None, :])  # [BN, BM]
        b_dk += tl.dot(b_dsT.to(b_q.dtype), b_q, input_precision=PREC, out_dtype=ACC)  # [BN, BD]
    return b_dk, b_dv


@triton.jit
def _bwd_dkdv_kernel(
    q_ptr,  # [B, T, H, D]
    k_ptr, v_ptr,  # the key source: raw [B, T, HKV, D] or entries [B, N, HKV, D]
    do_ptr,  # [B, T, H, D]
    lse_ptr, delta_ptr,  # [B, H, T]
    dk_ptr, dv_ptr,  # like k, v
    T, NS, H, HKV, D, L, S, GOFF, qk_scale, scale,
    MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PREC: tl.constexpr,
):
    i_n, i_bhk = tl.program_id(0), tl.program_id(1)
    i_b, i_hk = i_bhk // HKV, i_bhk % HKV
    G = H // HKV
    i_b64 = i_b.to(tl.int64)
    o_s = i_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    o_d = tl.arange(0, BLOCK_D)
    m_s, m_d = o_s < NS, o_d < D
    m_sd = m_s[:, None] & m_d[None, :]
    kv_off = i_b64 * NS * HKV * D + i_hk * D + o_s[:, None] * (HKV * D) + o_d[None, :]  # [BN, BD]
    b_k = tl.load(k_ptr + kv_off, mask=m_sd, other=0.)  # [BN, BD]
    b_v = tl.load(v_ptr + kv_off, mask=m_sd, other=0.)  # [BN, BD]
    b_dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    b_dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)

    s0 = i_n * BLOCK_N
    s1 = tl.minimum(s0 + BLOCK_N, NS) - 1  # last real key of the tile
    if MODE == 2:
        # entry j is visible from query (j+1)S-1-d on; all entries of the tile from (s1+1)S-1-d on
        lo = (s0 + 1) * S - 1 - GOFF
        full = lo + tl.cdiv(tl.maximum((s1 + 1) * S - 1 - GOFF - lo, 0), BLOCK_M) * BLOCK_M
        full = tl.minimum(full, T)
        hi = T
    else:
        # a raw key s is seen by queries s .. s+L-1 (window) or s .. s+S-1 at most (tail)
        lo = s0
        if MODE == 0:
            full = tl.minimum(s1 + L, T)
        else:
            full = tl.minimum(s1 + S, T)
        hi = full
    for g in range(G):
        i_h = i_hk * G + g
        q_base = q_ptr + i_b64 * T * H * D + i_h * D
        do_base = do_ptr + i_b64 * T * H * D + i_h * D
        lse_base = lse_ptr + (i_b64 * H + i_h) * T
        delta_base = delta_ptr + (i_b64 * H + i_h) * T
        b_dk, b_dv = _bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q_base, do_base, lse_base, delta_base, o_s,
                                     lo, full, NS, T, H, L, S, GOFF, qk_scale, D,
                                     MODE, True, BLOCK_M, BLOCK_D, ACC, PREC)
        if MODE == 2:
            b_dk, b_dv = _bwd_dkdv_inner(b_dk, b_dv, b_k, b_v, q_base, do_base, lse_base, delta_base, o_s,
                                         full, hi, NS, T, H, L, S, GOFF, qk_scale, D,
                                         MODE, False, BLOCK_M, BLOCK_D, ACC, PREC)
    tl.store(dk_ptr + kv_off, (b_dk * scale).to(dk_ptr.dtype.element_ty), mask=m_sd)
    tl.store(dv_ptr + kv_off, b_dv.to(dv_ptr.dtype.element_ty), mask=m_sd)


# ------------------------------------------------------------------------------------------------ launchers
def _config(D: int, dtype: torch.dtype):
    """Accumulator dtype, dot precision, padded head dim and launch options."""
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    prec = "ieee" if dtype in (torch.float32, torch.float64) else "tf32"
    return acc, prec, max(16, triton.next_power_of_2(D))


def _launch(kind: str, BD: int, block_m: int | None, block_n: int | None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of one kernel; BLOCK_M tiles queries, BLOCK_N keys.

    For head dim 128 on sm_90 these are the largest tiles that ptxas fits without (fwd, dq) or with little (dkdv)
    register spilling, checked by compiling ahead of time; not yet tuned on a device."""
    if BD <= 64:
        cfg = (64, 64, 4, 2)
    else:
        cfg = {"fwd": (128, 64, 8, 2), "dq": (64, 32, 8, 2), "dkdv": (32, 64, 8, 2)}[kind]
    return (block_m or cfg[0], block_n or cfg[1], cfg[2], cfg[3])


def attention_fwd(q, k, v, k_cmp, v_cmp, sink, *, stride, local_window, local_memory, scale, grid_offset,
                  block_m=None, block_n=None):
    B, T, H, D = q.shape
    HKV, N = k.shape[2], k_cmp.shape[1]
    acc, prec, BD = _config(D, q.dtype)
    BM, BN, warps, stages = _launch("fwd", BD, block_m, block_n)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, device=q.device, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    if B * T * H == 0:
        return o, lse
    L = local_window if local_memory == "window" else stride
    grid = (triton.cdiv(T, BM), B * H)
    _fwd_kernel[grid](
        q, k, v, k_cmp, v_cmp, sink if sink is not None else q, o, lse,
        T, N, H, HKV, D, L, stride, grid_offset, scale * LOG2E,
        RAW=_RAW_WINDOW if local_memory == "window" else _RAW_TAIL, HAS_SINK=sink is not None,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BD, ACC=acc, PREC=prec, num_warps=warps, num_stages=stages,
    )
    return o, lse


def attention_bwd(q, k, v, k_cmp, v_cmp, sink, o, lse, do, *, stride, local_window, local_memory, scale,
                  grid_offset, block_m=None, block_n=None):
    B, T, H, D = q.shape
    HKV, N = k.shape[2], k_cmp.shape[1]
    acc, prec, BD = _config(D, q.dtype)
    L = local_window if local_memory == "window" else stride
    raw = _RAW_WINDOW if local_memory == "window" else _RAW_TAIL
    delta = (o.to(lse.dtype) * do.to(lse.dtype)).sum(-1).transpose(1, 2).contiguous()  # [B, H, T]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dkc, dvc = torch.empty_like(k_cmp), torch.empty_like(v_cmp)
    if B * T * H > 0:
        BM, BN, warps, stages = _launch("dq", BD, block_m, block_n)
        _bwd_dq_kernel[(triton.cdiv(T, BM), B * H)](
            q, k, v, k_cmp, v_cmp, do, lse, delta, dq,
            T, N, H, HKV, D, L, stride, grid_offset, scale * LOG2E, scale,
            RAW=raw, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BD, ACC=acc, PREC=prec, num_warps=warps, num_stages=stages,
        )
        BM, BN, warps, stages = _launch("dkdv", BD, block_m, block_n)
        _bwd_dkdv_kernel[(triton.cdiv(T, BN), B * HKV)](
            q, k, v, do, lse, delta, dk, dv,
            T, T, H, HKV, D, L, stride, grid_offset, scale * LOG2E, scale,
            MODE=raw, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BD, ACC=acc, PREC=prec, num_warps=warps, num_stages=stages,
        )
    else:
        dq.zero_(), dk.zero_(), dv.zero_()
    if B * N * HKV > 0 and T > 0:
        BM, BN, warps, stages = _launch("dkdv", BD, block_m, block_n)
        _bwd_dkdv_kernel[(triton.cdiv(N, BN), B * HKV)](
            q, k_cmp, v_cmp, do, lse, delta, dkc, dvc,
            T, N, H, HKV, D, L, stride, grid_offset, scale * LOG2E, scale,
            MODE=_CMP, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BD, ACC=acc, PREC=prec, num_warps=warps, num_stages=stages,
        )
    else:
        dkc.zero_(), dvc.zero_()
    dsink = None
    if sink is not None:
        # d loss / d sink_h = -sum_{b,t} p_sink(b,h,t) * delta(b,h,t), p_sink = exp2(sink * log2e - lse)
        p_sink = torch.exp2(sink.to(lse.dtype)[None, :, None] * LOG2E - lse)  # [B, H, T]
        dsink = -(p_sink * delta).sum((0, 2)).to(sink.dtype)
    return dq, dk, dv, dkc, dvc, dsink


# ------------------------------------------------------------------------------------------------ autograd
class CompressedAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, k_cmp, v_cmp, sink, stride, local_window, local_memory, scale, grid_offset,
                block_m, block_n):
        kw = dict(stride=stride, local_window=local_window, local_memory=local_memory, scale=scale,
                  grid_offset=grid_offset, block_m=block_m, block_n=block_n)
        o, lse = attention_fwd(q, k, v, k_cmp, v_cmp, sink, **kw)
        ctx.save_for_backward(q, k, v, k_cmp, v_cmp, sink, o, lse)
        ctx.kw = kw
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, k_cmp, v_cmp, sink, o, lse = ctx.saved_tensors
        dq, dk, dv, dkc, dvc, dsink = attention_bwd(q, k, v, k_cmp, v_cmp, sink, o, lse, do.contiguous(), **ctx.kw)
        return dq, dk, dv, dkc, dvc, dsink, None, None, None, None, None, None, None


def compressed_attention_(q, k, v, k_cmp, v_cmp, *, stride, local_window=16, local_memory="window", sink=None,
                          scale=None, grid_offset=0, block_m=None, block_n=None):
    """`compressed_attention` with explicit tile sizes (tests use small tiles to get many tiles on tiny inputs)."""
    B, T, H, D = q.shape
    if k.shape[:2] != (B, T) or v.shape != k.shape or k.shape[-1] != D:
        raise ValueError(f"compressed_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    HKV = k.shape[2]
    if H % HKV:
        raise ValueError(f"compressed_attention: {H} query heads are not a multiple of {HKV} KV heads")
    if k_cmp.dim() != 4 or k_cmp.shape[0] != B or k_cmp.shape[2:] != (HKV, D) or v_cmp.shape != k_cmp.shape:
        raise ValueError(f"compressed_attention: k_cmp {tuple(k_cmp.shape)}, v_cmp {tuple(v_cmp.shape)}")
    if local_memory not in LOCAL_MEMORY:
        raise ValueError(f"compressed_attention: local_memory must be one of {LOCAL_MEMORY}, got {local_memory!r}")
    if not isinstance(grid_offset, int):
        raise ValueError(f"compressed_attention: grid_offset must be one int, got {grid_offset!r}: per-KV-head offsets "
                         "(model.head_offsets) take one call per offset (phasefix.kernels.window_grid.by_grid_offset)")
    if not 0 <= grid_offset < stride:
        raise ValueError(f"compressed_attention: grid_offset {grid_offset} not in [0, {stride})")
    if sink is not None and tuple(sink.shape) != (H,):
        raise ValueError(f"compressed_attention: sink must be [H]={H}, got {tuple(sink.shape)}")
    scale = D ** -0.5 if scale is None else float(scale)
    dtype = q.dtype
    k, v, k_cmp, v_cmp = (x.to(dtype).contiguous() for x in (k, v, k_cmp, v_cmp))
    return CompressedAttentionFunction.apply(
        q.contiguous(), k, v, k_cmp, v_cmp, sink.contiguous() if sink is not None else None,
        int(stride), int(local_window), local_memory, scale, int(grid_offset), block_m, block_n)


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

    Triton twin of `naive.compressed_attention`: q [B, T, H, D]; k, v [B, T, HKV, D]; k_cmp, v_cmp [B, N, HKV, D];
    sink [H] or None. Returns [B, T, H, D]. `query_block` is accepted for signature parity and ignored.
    """
    return compressed_attention_(q, k, v, k_cmp, v_cmp, stride=stride, local_window=local_window,
                                 local_memory=local_memory, sink=sink, scale=scale, grid_offset=grid_offset)
