"""CPU benchmark: the blocked compressed attention (the CPU path) against full causal attention (issue 2).

Times forward+backward (forward only at the longest T) of `phasefix.kernels.compressed_attention.blocked`,
with the pooled entries given as inputs, against `F.scaled_dot_product_attention(is_causal=True)` on the same
shapes, and prints compressed/full ratios. Each repeat times full then compressed back to back and the reported
ratio is the median of the per-repeat ratios (robust to a machine whose load drifts). Peak memory is the growth
of the peak resident set of a fresh subprocess per measurement (CPU tensors have no allocator statistics).

    python benchmarks/attention_cpu.py                      # the issue's grid: T 1024, 4096 (fwd+bwd), 16384 (fwd)
    python benchmarks/attention_cpu.py --T 4096 --repeats 9 --no-memory
    python benchmarks/attention_cpu.py --threads 1 --clock cpu     # steadier when other jobs share the cores

Figures and the machine they came from: docs/performance.md, "CPU (blocked path)".
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from phasefix.kernels.compressed_attention.blocked import compressed_attention


def make_inputs(T: int, H: int, HKV: int, D: int, S: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    N = T // S

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    # compressed: [B, T, heads, D] as the model calls it; full: SDPA's own [B, heads, T, D] layout
    cmp = dict(q=r(1, T, H, D), k=r(1, T, HKV, D), v=r(1, T, HKV, D), k_cmp=r(1, N, HKV, D), v_cmp=r(1, N, HKV, D))
    full = dict(q=r(1, H, T, D), k=r(1, HKV, T, D), v=r(1, HKV, T, D))
    return cmp, full


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU time (all threads)


def step_fn(kind: str, x: dict, args, backward: bool):
    if kind == "compressed":
        def f():
            return compressed_attention(x["q"], x["k"], x["v"], x["k_cmp"], x["v_cmp"], stride=args.stride,
                                        local_window=args.local_window, query_block=args.query_block)
    else:
        def f():
            return F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True,
                                                  enable_gqa=args.heads != args.kv_heads)

    def step():
        if backward:
            out = f()
            out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                f()

    return step


def timed(step, clock=time.perf_counter) -> float:
    t0 = clock()
    step()
    return clock() - t0


def time_pair(T: int, backward: bool, args) -> dict:
    cmp_in, full_in = make_inputs(T, args.heads, args.kv_heads, args.head_dim, args.stride)
    steps = {"full": step_fn("full", full_in, args, backward),
             "compressed": step_fn("compressed", cmp_in, args, backward)}
    for step in steps.values():  # warm-up
        step()
    times = {"full": [], "compressed": []}
    for _ in range(args.repeats):
        for kind, step in steps.items():
            times[kind].append(timed(step, CLOCKS[args.clock]))
    ratios = [c / f for c, f in zip(times["compressed"], times["full"])]
    return {"full_s": statistics.median(times["full"]), "compressed_s": statistics.median(times["compressed"]),
            "ratio": statistics.median(ratios)}


def status_mib(field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(kind: str, T: int, backward: bool, args) -> float:
    """In a fresh process: peak resident memory (MiB) of one step beyond the inputs already in memory."""
    cmp_in, full_in = make_inputs(T, args.heads, args.kv_heads, args.head_dim, args.stride)
    step = step_fn(kind, cmp_in if kind == "compressed" else full_in, args, backward)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = status_mib("VmRSS")
    step()
    return status_mib("VmHWM") - before


def peak_memory(kind: str, T: int, backward: bool, args) -> float:
    cmd = [sys.executable, __file__, "--child", kind, "--T", str(T), *(["--backward"] if backward else []),
           "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
           "--stride", str(args.stride), "--local-window", str(args.local_window),
           "--query-block", str(args.query_block), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--forward-only-from", type=int, default=16384, help="T at and above which only forward is timed")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--local-window", type=int, default=16)
    p.add_argument("--query-block", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="wall (default) or cpu: process CPU time, steadier on a shared machine (use with --threads 1)")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--child", choices=["compressed", "full"], help=argparse.SUPPRESS)
    p.add_argument("--backward", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.child:
        print(json.dumps({"peak_mib": memory_child(args.child, args.T[0], args.backward, args)}))
        return

    print(f"B=1 H={args.heads} HKV={args.kv_heads} D={args.head_dim} S={args.stride} local_window={args.local_window} "
          f"query_block={args.query_block} threads={args.threads} repeats={args.repeats} clock={args.clock} "
          f"torch {torch.__version__}")
    header = f"{'T':>6} {'pass':>8} {'full ms':>9} {'cmp ms':>9} {'time c/f':>9}"
    header += "" if args.no_memory else f" {'full MiB':>9} {'cmp MiB':>9} {'mem c/f':>8}"
    print(header)
    rows = []
    for T in args.T:
        backward = T < args.forward_only_from
        r = time_pair(T, backward, args)
        line = (f"{T:>6} {'fwd+bwd' if backward else 'fwd':>8} {1e3 * r['full_s']:>9.1f} "
                f"{1e3 * r['compressed_s']:>9.1f} {r['ratio']:>9.3f}")
        if not args.no_memory:
            r["full_mib"] = peak_memory("full", T, backward, args)
            r["compressed_mib"] = peak_memory("compressed", T, backward, args)
            line += (f" {r['full_mib']:>9.1f} {r['compressed_mib']:>9.1f}"
                     f" {r['compressed_mib'] / max(r['full_mib'], 1e-9):>8.3f}")
        print(line, flush=True)
        rows.append({"T": T, "pass": "fwd+bwd" if backward else "fwd", **r})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
