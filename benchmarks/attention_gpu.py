"""Compressed attention on a GPU: bf16 correctness and speed against full attention (issue 7).

One prepared script for a lent H200 (or any CUDA GPU):
  1. correctness: the Triton kernels in bf16 against the float32 blocked path
     (phasefix.kernels.compressed_attention.blocked, itself tested against the naive reference), output and
     the gradients of q, k, v, k_cmp, v_cmp and sink, at T = --check-len;
  2. speed, forward and forward+backward, for T in --seqlens:
     - `triton`: phasefix.kernels.compressed_attention.triton (S=4, local window 128, sink on),
     - `sdpa_flash`: F.scaled_dot_product_attention, flash backend, full causal attention,
     - `flex`: FlexAttention over [entries | raw keys] with the same mask as a block mask (no sink: FlexAttention
       has no extra denominator term),
     with effective TFLOP/s counting only the visible (query, key) pairs (4*P*D*H FLOPs forward, 2.5x that
     backward, the FlashAttention convention);
  3. the issue's targets: triton effective TFLOP/s >= 0.6x sdpa_flash, and at T=16K >= 2x faster wall time than
     full attention (fwd+bwd).
Prints a table and writes JSON to --out.

    python benchmarks/attention_gpu.py --out attention_gpu.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="path of the JSON results")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--local-window", type=int, default=128)
    ap.add_argument("--local-memory", choices=["window", "tail"], default="window")
    ap.add_argument("--check-len", type=int, default=4096, help="T of the bf16-vs-float32 correctness check")
    ap.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement (triton do_bench)")
    ap.add_argument("--skip-flex", action="store_true")
    ap.add_argument("--block-m", type=int, default=None, help="override the kernels' query tile (tuning)")
    ap.add_argument("--block-n", type=int, default=None, help="override the kernels' key tile (tuning)")
    return ap.parse_args(argv)


# ------------------------------------------------------------------------------------------------ counting
def visible_pairs(T: int, N: int, stride: int, L: int, mode: str, grid_offset: int = 0) -> int:
    """Visible (query, key) pairs per head: raw band/tail plus visible entries (the sink is not counted)."""
    t = torch.arange(T, dtype=torch.int64)
    n_vis = torch.div(t + 1 + grid_offset, stride, rounding_mode="floor").clamp(max=N)
    if mode == "window":
        raw = torch.minimum(t + 1, torch.full_like(t, L))
    else:
        raw = t + 1 - (n_vis * stride - grid_offset).clamp(min=0)
    return int((raw + n_vis).sum())


def flops(pairs: int, B: int, H: int, D: int, backward: bool) -> float:
    fwd = 4.0 * pairs * D * B * H
    return fwd * 3.5 if backward else fwd  # fwd + bwd (2.5x fwd)


# ------------------------------------------------------------------------------------------------ inputs
def make_inputs(B, T, H, HKV, D, stride, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    N = T // stride

    def r(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype).requires_grad_()

    return dict(q=r(B, T, H, D), k=r(B, T, HKV, D), v=r(B, T, HKV, D), k_cmp=r(B, N, HKV, D),
                v_cmp=r(B, N, HKV, D), sink=r(H))


# ------------------------------------------------------------------------------------------------ correctness
def check_correctness(args, tri, ref):
    B, T, H, HKV, D = args.batch, args.check_len, args.heads, args.kv_heads, args.head_dim
    x = make_inputs(B, T, H, HKV, D, args.stride, torch.bfloat16, "cuda")
    kw = dict(stride=args.stride, local_window=args.local_window, local_memory=args.local_memory)
    names = ["q", "k", "v", "k_cmp", "v_cmp", "sink"]
    out = tri.compressed_attention(x["q"], x["k"], x["v"], x["k_cmp"], x["v_cmp"], sink=x["sink"], **kw)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x[n] for n in names], do)
    x32 = {n: x[n].detach().float().requires_grad_() for n in names}
    exp = ref.compressed_attention(x32["q"], x32["k"], x32["v"], x32["k_cmp"], x32["v_cmp"], sink=x32["sink"],
                                   **kw, query_block=512)
    exp_grads = torch.autograd.grad(exp, [x32[n] for n in names], do.float())
    res = {}
    for name, a, b in [("out", out, exp)] + [(f"d{n}", a, b) for n, a, b in zip(names, grads, exp_grads)]:
        a, b = a.float(), b.float()
        rel = ((a - b).norm() / b.norm().clamp_min(1e-12)).item()
        res[name] = dict(max_abs=(a - b).abs().max().item(), rel_l2=rel, ok=bool(rel < 2e-2))
    return res


# ------------------------------------------------------------------------------------------------ timing
def bench(fn, rep_ms):
    import triton.testing

    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms))


def time_triton(args, ka, T):
    B, H, HKV, D = args.batch, args.heads, args.kv_heads, args.head_dim
    x = make_inputs(B, T, H, HKV, D, args.stride, torch.bfloat16, "cuda")
    kw = dict(stride=args.stride, local_window=args.local_window, local_memory=args.local_memory, sink=x["sink"],
              block_m=args.block_m, block_n=args.block_n)
    ins = [x[n] for n in ("q", "k", "v", "k_cmp", "v_cmp", "sink")]

    def fwd():
        return ka.compressed_attention_(x["q"], x["k"], x["v"], x["k_cmp"], x["v_cmp"], **kw)

    do = torch.randn_like(fwd())

    def fwd_bwd():
        torch.autograd.grad(fwd(), ins, do)

    with torch.no_grad():
        t_fwd = bench(fwd, args.rep_ms)
    return t_fwd, bench(fwd_bwd, args.rep_ms)


def time_sdpa_flash(args, T):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, HKV, D = args.batch, args.heads, args.kv_heads, args.head_dim
    x = make_inputs(B, T, H, HKV, D, args.stride, torch.bfloat16, "cuda")
    q = x["q"].detach().transpose(1, 2).contiguous().requires_grad_()
    # the flash backend wants equal head counts: expand K/V outside the timed region (its best case)
    k = x["k"].detach().repeat_interleave(H // HKV, dim=2).transpose(1, 2).contiguous().requires_grad_()
    v = x["v"].detach().repeat_interleave(H // HKV, dim=2).transpose(1, 2).contiguous().requires_grad_()

    def fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    do = torch.randn_like(fwd())

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), do)

    with torch.no_grad():
        t_fwd = bench(fwd, args.rep_ms)
    return t_fwd, bench(fwd_bwd, args.rep_ms)


def time_flex(args, T):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, HKV, D = args.batch, args.heads, args.kv_heads, args.head_dim
    S, L, mode = args.stride, args.local_window, args.local_memory
    N = T // S
    x = make_inputs(B, T, H, HKV, D, S, torch.bfloat16, "cuda")
    q = x["q"].detach().transpose(1, 2).contiguous().requires_grad_()  # [B, H, T, D]
    kk = torch.cat([x["k_cmp"], x["k"]], 1).detach().transpose(1, 2).contiguous().requires_grad_()  # [B,HKV,N+T,D]
    vv = torch.cat([x["v_cmp"], x["v"]], 1).detach().transpose(1, 2).contiguous().requires_grad_()

    def mask_mod(b, h, q_idx, kv_idx):
        n_vis = (q_idx + 1) // S
        s = kv_idx - N
        if mode == "window":
            raw = (s >= 0) & (s <= q_idx) & (s > q_idx - L)
        else:
            raw = (s >= 0) & (s <= q_idx) & (s >= n_vis * S)
        return raw | ((kv_idx < N) & (kv_idx < n_vis))

    try:  # compiled: never materialises the dense T x (N+T) mask (GBs at 64K)
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=N + T, device="cuda",
                                       _compile=True)
    except TypeError:
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=N + T, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)

    def fwd():
        return flex(q, kk, vv, block_mask=block_mask, enable_gqa=True)

    do = torch.randn_like(fwd())

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, kk, vv), do)

    with torch.no_grad():
        t_fwd = bench(fwd, args.rep_ms)
    return t_fwd, bench(fwd_bwd, args.rep_ms)


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_gpu.py: no CUDA device here; this benchmark needs a GPU (it is prepared for an H200). "
              "Run it on a machine with one: python benchmarks/attention_gpu.py --out attention_gpu.json",
              file=sys.stderr)
        return 2
    from phasefix.kernels.compressed_attention import blocked as ref
    from phasefix.kernels.compressed_attention import triton as tri

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    B, H, HKV, D, S, L = args.batch, args.heads, args.kv_heads, args.head_dim, args.stride, args.local_window
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
                  config=dict(batch=B, heads=H, kv_heads=HKV, head_dim=D, stride=S, local_window=L,
                              local_memory=args.local_memory, dtype="bfloat16", sink=True,
                              block_m=args.block_m, block_n=args.block_n),
                  started=time.strftime("%Y-%m-%dT%H:%M:%S"))
    import triton

    result["triton"] = triton.__version__

    t0 = time.time()
    result["correctness"] = check_correctness(args, tri, ref)
    print(f"bf16 vs float32 reference at T={args.check_len} ({time.time() - t0:.0f}s):")
    for name, r in result["correctness"].items():
        print(f"  {name:7s} rel_l2 {r['rel_l2']:.2e}  max_abs {r['max_abs']:.2e}  {'ok' if r['ok'] else 'FAIL'}")
    torch.cuda.empty_cache()

    rows = []
    impls = [("triton", lambda T: time_triton(args, tri, T)), ("sdpa_flash", lambda T: time_sdpa_flash(args, T))]
    if not args.skip_flex:
        impls.append(("flex", lambda T: time_flex(args, T)))
    for T in args.seqlens:
        N = T // S
        pairs = {"triton": visible_pairs(T, N, S, L, args.local_memory), "flex": visible_pairs(T, N, S, L,
                 args.local_memory), "sdpa_flash": T * (T + 1) // 2}
        for name, fn in impls:
            try:
                t_fwd, t_fb = fn(T)
                err = None
            except Exception as e:  # one failing baseline must not lose the others' figures
                t_fwd = t_fb = float("nan")
                err = f"{type(e).__name__}: {e}"[:500]
            row = dict(T=T, impl=name, pairs_per_head=pairs[name], fwd_ms=t_fwd, fwd_bwd_ms=t_fb,
                       fwd_tflops=flops(pairs[name], B, H, D, False) / (t_fwd * 1e9),
                       fwd_bwd_tflops=flops(pairs[name], B, H, D, True) / (t_fb * 1e9), error=err)
            rows.append(row)
            print(f"T={T:6d} {name:10s} fwd {t_fwd:9.3f} ms {row['fwd_tflops']:7.1f} TF/s | fwd+bwd "
                  f"{t_fb:9.3f} ms {row['fwd_bwd_tflops']:7.1f} TF/s" + (f"  [{err}]" if err else ""), flush=True)
            torch.cuda.empty_cache()
    result["rows"] = rows

    # the targets
    targets = []
    for T in args.seqlens:
        tri = next(r for r in rows if r["T"] == T and r["impl"] == "triton")
        sdpa = next(r for r in rows if r["T"] == T and r["impl"] == "sdpa_flash")
        ratio = tri["fwd_bwd_tflops"] / sdpa["fwd_bwd_tflops"]
        speedup = sdpa["fwd_bwd_ms"] / tri["fwd_bwd_ms"]
        targets.append(dict(T=T, eff_tflops_ratio_vs_sdpa=ratio, ratio_ok=bool(ratio >= 0.6),
                            wall_speedup_vs_full=speedup, speedup_ok=bool(speedup >= 2.0) if T == 16384 else None))
    result["targets"] = targets

    print("\n| T | impl | fwd ms | fwd TF/s (eff) | fwd+bwd ms | fwd+bwd TF/s (eff) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['T']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.1f} | {r['fwd_bwd_ms']:.3f} | "
              f"{r['fwd_bwd_tflops']:.1f} |")
    print("\ntargets (fwd+bwd): eff TF/s >= 0.6x sdpa_flash; at T=16K wall time >= 2x faster than full attention")
    for t in targets:
        print(f"  T={t['T']}: eff ratio {t['eff_tflops_ratio_vs_sdpa']:.2f} ({'ok' if t['ratio_ok'] else 'MISS'}), "
              f"speedup {t['wall_speedup_vs_full']:.2f}x"
              + ("" if t["speedup_ok"] is None else f" ({'ok' if t['speedup_ok'] else 'MISS'})"))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
