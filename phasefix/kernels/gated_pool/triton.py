"""Gated slot pooling (science.md §2), Triton forward and backward.

    a_{j,i} = softmax_i s_{j,i}         (over the W slots; per channel when the gate is a vector)
    K_j     = sum_i a_{j,i} * P_{j,i}

Layout follows fla's `ops/`: kernel -> launcher -> autograd.Function -> public function.
One program pools one (entry, KV head) pair: it holds the whole [W, D] slot tile in registers, so W (<= 16 in all
presets) and D (<= 256) are single blocks. Empty slots carry a -inf logit and get zero weight. The softmax runs in
float32 (float64 for float64 inputs); the backward recomputes it instead of saving the weights.

Must import with torch and triton alone (no phasefix import); the reference is `naive.gated_pool`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------------------ kernels
@triton.jit
def _slots_and_weights(p_ptr, s_ptr, row, o_d, m_w, m_wd, D, ACC: tl.constexpr, VECTOR_GATE: tl.constexpr):
    """One (entry, KV head)'s slot tile P [BW, BD] and its gate weights a = softmax over the slots [BW, BD|1] (per
    channel for a vector gate), in ACC: the forward's pooling and the backward's recomputation of it."""
    b_p = tl.load(p_ptr + row[:, None] * D + o_d[None, :], mask=m_wd, other=0.).to(ACC)  # [BW, BD]
    if VECTOR_GATE:
        b_s = tl.load(s_ptr + row[:, None] * D + o_d[None, :], mask=m_wd, other=float("-inf")).to(ACC)  # [BW, BD]
    else:
        b_s = tl.load(s_ptr + row, mask=m_w, other=float("-inf")).to(ACC)[:, None]  # [BW, 1]
    b_m = tl.max(b_s, axis=0)  # [BD] or [1]
    b_m = tl.where(b_m == float("-inf"), 0., b_m)
    b_e = tl.exp(b_s - b_m[None, :])  # [BW, BD|1]
    b_z = tl.sum(b_e, axis=0)  # [BD] or [1]; zero only in padded channels
    return b_p, b_e / tl.where(b_z == 0., 1., b_z)[None, :]


@triton.jit
def _gated_pool_fwd_kernel(
    p_ptr,  # payload      [BN, W, HKV, D]   (BN = B * N, contiguous)
    s_ptr,  # gate logits  [BN, W, HKV, G]   (G = 1 scalar gate, G = D vector gate)
    o_ptr,  # output       [BN, HKV, D]
    W, HKV, D,
    ACC: tl.constexpr,  # accumulation dtype (float32, or float64 for float64 inputs)
    VECTOR_GATE: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_w = tl.arange(0, BLOCK_W)  # [BW]
    o_d = tl.arange(0, BLOCK_D)  # [BD]
    m_w = o_w < W
    m_d = o_d < D
    m_wd = m_w[:, None] & m_d[None, :]  # [BW, BD]
    row = (i_n * W + o_w) * HKV + i_h  # [BW] row index into the [BN*W*HKV] leading dims
    b_p, b_a = _slots_and_weights(p_ptr, s_ptr, row, o_d, m_w, m_wd, D, ACC, VECTOR_GATE)
    b_o = tl.sum(b_a * b_p, axis=0)  # [BD]
    tl.store(o_ptr + (i_n * HKV + i_h) * D + o_d, b_o.to(o_ptr.dtype.element_ty), mask=m_d)


@triton.jit
def _gated_pool_bwd_kernel(
    p_ptr,  # payload        [BN, W, HKV, D]
    s_ptr,  # gate logits    [BN, W, HKV, G]
    do_ptr,  # grad output   [BN, HKV, D]
    dp_ptr,  # grad payload  [BN, W, HKV, D]
    ds_ptr,  # grad logits   [BN, W, HKV, G]
    W, HKV, D,
    ACC: tl.constexpr,
    VECTOR_GATE: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_w = tl.arange(0, BLOCK_W)  # [BW]
    o_d = tl.arange(0, BLOCK_D)  # [BD]
    m_w = o_w < W
    m_d = o_d < D
    m_wd = m_w[:, None] & m_d[None, :]  # [BW, BD]
    row = (i_n * W + o_w) * HKV + i_h  # [BW]
    b_p, b_a = _slots_and_weights(p_ptr, s_ptr, row, o_d, m_w, m_wd, D, ACC, VECTOR_GATE)  # recomputed, not saved
    b_do = tl.load(do_ptr + (i_n * HKV + i_h) * D + o_d, mask=m_d, other=0.).to(ACC)  # [BD]
    b_o = tl.sum(b_a * b_p, axis=0)  # [BD]
    # dP = a * dO;  dS = a * dO * (P - O)  (per channel), summed over channels for a scalar gate
    b_dp = b_a * b_do[None, :]  # [BW, BD]
    tl.store(dp_ptr + row[:, None] * D + o_d[None, :], b_dp.to(dp_ptr.dtype.element_ty), mask=m_wd)
    b_ds = b_dp * (b_p - b_o[None, :])  # [BW, BD]
    b_ds = tl.where(m_wd, b_ds, 0.)
    if VECTOR_GATE:
        tl.store(ds_ptr + row[:, None] * D + o_d[None, :], b_ds.to(ds_ptr.dtype.element_ty), mask=m_wd)
    else:
        tl.store(ds_ptr + row, tl.sum(b_ds, axis=1).to(ds_ptr.dtype.element_ty), mask=m_w)  # [BW]


# ------------------------------------------------------------------------------------------------ launchers
def _acc_dtype(*tensors: torch.Tensor):
    return tl.float64 if any(t.dtype == torch.float64 for t in tensors) else tl.float32


def _check(payload: torch.Tensor, gate_logits: torch.Tensor):
    if payload.dim() != 5 or gate_logits.dim() != 5:
        raise ValueError(f"gated_pool: payload [B,N,W,HKV,D] and gate_logits [B,N,W,HKV,1|D] expected, got "
                         f"{tuple(payload.shape)} and {tuple(gate_logits.shape)}")
    B, N, W, HKV, D = payload.shape
    if tuple(gate_logits.shape[:4]) != (B, N, W, HKV) or gate_logits.shape[4] not in (1, D):
        raise ValueError(f"gated_pool: gate_logits {tuple(gate_logits.shape)} does not match payload "
                         f"{tuple(payload.shape)}")


def gated_pool_fwd(payload: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    B, N, W, HKV, D = payload.shape
    vector = gate_logits.shape[-1] == D and D != 1
    p, s = payload.contiguous(), gate_logits.contiguous()
    o = payload.new_empty(B, N, HKV, D)
    if B * N == 0:
        return o
    grid = (B * N, HKV)
    _gated_pool_fwd_kernel[grid](
        p, s, o, W, HKV, D,
        ACC=_acc_dtype(payload, gate_logits), VECTOR_GATE=vector,
        BLOCK_W=triton.next_power_of_2(W), BLOCK_D=triton.next_power_of_2(D),
    )
    return o


def gated_pool_bwd(payload: torch.Tensor, gate_logits: torch.Tensor, do: torch.Tensor):
    B, N, W, HKV, D = payload.shape
    vector = gate_logits.shape[-1] == D and D != 1
    p, s, do = payload.contiguous(), gate_logits.contiguous(), do.contiguous()
    dp = torch.empty_like(p)
    ds = torch.empty_like(s)
    if B * N == 0:
        return dp, ds
    grid = (B * N, HKV)
    _gated_pool_bwd_kernel[grid](
        p, s, do, dp, ds, W, HKV, D,
        ACC=_acc_dtype(payload, gate_logits), VECTOR_GATE=vector,
        BLOCK_W=triton.next_power_of_2(W), BLOCK_D=triton.next_power_of_2(D),
    )
    return dp, ds


# ------------------------------------------------------------------------------------------------ autograd
class GatedPoolFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, payload, gate_logits):
        ctx.save_for_backward(payload, gate_logits)
        return gated_pool_fwd(payload, gate_logits)

    @staticmethod
    def backward(ctx, do):
        payload, gate_logits = ctx.saved_tensors
        dp, ds = gated_pool_bwd(payload, gate_logits, do)
        return dp, ds


def gated_pool(payload: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """Softmax over slots, then the weighted sum of the slot payloads (Triton twin of `naive.gated_pool`).

    payload:     [B, N, W, HKV, D]  C_i h_{j,i} for every entry j and slot i
    gate_logits: [B, N, W, HKV, 1] (scalar gate) or [B, N, W, HKV, D] (vector gate); -inf marks empty slots
    returns:     [B, N, HKV, D] in payload's dtype
    """
    _check(payload, gate_logits)
    return GatedPoolFunction.apply(payload, gate_logits)
