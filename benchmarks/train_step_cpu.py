"""CPU benchmark: one training step (forward, backward, clipping, AdamW) per regime, the fp32 eager step against its
faster variants (bf16 autocast, ...), side by side in one run.

The model and a batch come from `phasefix.fit`'s own config with the regime's overrides (plain key=value lists
below, so that the script does not depend on the config group's name), so the step is the one a run trains:
`CompressedQwen3` on the CPU path, `next_token_loss`, AdamW. Each repeat times every variant back to back (each its
own copy of the same initial model and optimizer), the per-repeat ratio to fp32 is taken, and the medians are
reported: on a shared machine only such interleaved ratios are meaningful, timed in process CPU time by default
(`--clock cpu`, with one thread: what the step costs a core, not how long it waited for one).

Per regime and variant: s/step, training tokens/s per core (batch x tokens / s / threads), the ratio to fp32, the
loss after the timed steps (the variants agree to bf16 rounding), the step split, and the achieved matmul GFLOP/s
(flops of mm/bmm forward and backward, torch.utils.flop_counter) against this machine's fp32 and bf16 matmul peaks,
measured in the same run on the regime's largest projection shape. The split times each part alone, forward and
backward, on the inputs one step hands it: projections (every nn.Linear), compressor (pooling, gates, token
shift), attention (the compressed-attention call), loss, optimizer (clip + AdamW), data (one batch from the
training set); `rest` is the step minus these (norms, rotary, residuals, activations, embedding).

    python benchmarks/train_step_cpu.py                                   # every regime, fp32 vs bf16, 1 thread
    python benchmarks/train_step_cpu.py --regimes coverage_w8s8 --repeats 7 --markdown
    python benchmarks/train_step_cpu.py --regimes records64 --profile     # where one step's time goes (bf16)
    python benchmarks/train_step_cpu.py --regimes coverage_w8s8 records64 --variants fp32 bf16 bf16_compile --no-split
                                                                          # + torch.compile (trainer.compile=true)
    python benchmarks/train_step_cpu.py --isa avx2 --variants fp32 fp32_compile --no-split
                                                                          # as on a CPU without AVX-512 or bf16

Figures and the machine they came from: docs/performance.md, "Training step on the CPU".
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

# The regimes of the headline (conf/regime/<name>.yaml, formerly conf/experiment/): the keys that shape the step.
REGIMES = {
    "default": [],
    "coverage_w8s8": ["model.stride=8", "model.window=8", "model.num_heads=2", "model.num_kv_heads=2",
                      "model.head_dim=64", "model.local_memory=window", "model.local_window=16",
                      "model.payload_init=shared", "model.vocab_size=160", "data.num_records=32", "data.num_keys=64",
                      "data.num_values=64", "data.in_sequence_prob=0.0", "data.max_prefix_pad=47"],
    "w8s8": ["model.stride=8", "model.window=8", "model.payload_init=shared", "data.num_demos=8"],
    "records64": ["model.stride=8", "model.window=8", "model.payload_init=shared", "model.vocab_size=160",
                  "data.num_records=64", "data.num_keys=64", "data.num_values=64", "data.num_demos=48",
                  "data.max_prefix_pad=23"],
    "lm_mix_w4s4": ["data=lm_mix", "model.payload_init=shared", "model.vocab_size=384"],
}

# --isa avx2: what a CPU without AVX-512 (so without bf16 matmul instructions) runs, on this one: ATen's kernels,
# oneDNN and MKL capped at AVX2 (environment variables read when torch loads: the script starts itself again with
# them) and inductor's generated C++ at 256-bit vectors
ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}

# name -> (autocast dtype (None: float32), torch.compile: False (eager), "model" (the whole model, one graph),
# "max-autotune" (the same, mode="max-autotune") or "blocks" (each transformer block alone: identical layers share one
# compile), model config changes); fp32 eager is the baseline
VARIANTS = {
    "fp32": (None, False, {}),
    "bf16": (torch.bfloat16, False, {}),
    "fp32_compile": (None, "model", {}),
    "fp32_compile_autotune": (None, "max-autotune", {}),  # inductor's own C++ GEMM templates, timed against MKL's
    "bf16_compile": (torch.bfloat16, "model", {}),
    "bf16_compile_blocks": (torch.bfloat16, "blocks", {}),
    "bf16_compile_qb256": (torch.bfloat16, "model", {"query_block": 256}),  # one query block up to T = 256
    "fp32_compile_qb256": (None, "model", {"query_block": 256}),
    # former rules, to time what computing in float32 under autocast costs: `*_cmp16` the compressor in bf16 (the rule
    # of 045c7f6 to 0a1247f), `*_attn16` the compressor and the blocked attention in bf16 (the rule before 045c7f6)
    "bf16_cmp16": (torch.bfloat16, False, {}),
    "bf16_compile_cmp16": (torch.bfloat16, "model", {}),
    "bf16_attn16": (torch.bfloat16, False, {}),
    "bf16_compile_attn16": (torch.bfloat16, "model", {}),
}


def attention_in_autocast_dtype(*xs):
    """The blocked attention's former compute dtype: autocast's (bf16) under autocast, else the inputs' common one."""
    if torch.is_autocast_enabled("cpu") and all(x.dtype != torch.float64 for x in xs):
        return torch.get_autocast_dtype("cpu")
    return functools.reduce(torch.promote_types, (x.dtype for x in xs))


def variant_rule(variant: str):
    """The context a variant's steps run in: the former rules its name ends with patched in (`_cmp16`: the
    compressor in bf16, `_attn16`: the compressor and the attention), or nothing."""
    from unittest import mock

    from phasefix.kernels.compressed_attention import blocked
    from phasefix.model.qwen3 import Compressor

    stack = contextlib.ExitStack()
    if variant.endswith(("_cmp16", "_attn16")):
        stack.enter_context(mock.patch.object(Compressor, "float32_under_autocast", False))
    if variant.endswith("_attn16"):
        stack.enter_context(mock.patch.object(blocked, "compute_dtype", attention_in_autocast_dtype))
    return stack


def variant_model(model, variant: str):
    """A copy of `model` as `variant` runs it: its config changes, then compiled (whole or per block) or eager."""
    _, how, changes = VARIANTS[variant]
    m = copy.deepcopy(model)
    for key, value in changes.items():
        setattr(m.config, key, value)  # one config object, shared by every layer of the copy
    m.config.validate()
    if how == "model":  # static shapes, as phasefix.module compiles the training step (trainer.compile)
        m.compile(dynamic=False)
    elif how == "max-autotune":
        m.compile(dynamic=False, mode="max-autotune")
    elif how == "blocks":
        for block in m.layers:
            block.compile(dynamic=False)
    return m


def build(overrides: list[str], seed: int):
    from omegaconf import OmegaConf

    from phasefix.cli import compose
    from phasefix.data.select import train_stages
    from phasefix.fit import plan
    from phasefix.model.qwen3 import CompressedQwen3

    cfg = compose(overrides, "fit")
    p = plan(cfg)
    torch.manual_seed(seed)
    model = CompressedQwen3(p["model"])
    ds = train_stages(p["data"], seed)[0][1].with_format("torch")
    batch = ds[: cfg.trainer.batch_size]
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    text_start = p["data"].text_loss["text_label_start"] if hasattr(p["data"], "text_loss") else None
    return model, batch, optim, cfg, ds, text_start


def autocast(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def stepper(model, batch, optim, dtype, text_start=None, variant: str = "fp32"):
    from phasefix.module import next_token_loss

    opt = torch.optim.AdamW(model.parameters(), lr=optim["lr"], betas=tuple(optim["betas"]),
                            weight_decay=optim["weight_decay"])

    def step() -> float:
        with autocast(dtype), variant_rule(variant):
            logits = model(batch["input_ids"])
            loss, _ = next_token_loss(logits, batch["labels"], text_start)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    step.opt = opt
    return step


CLOCK = time.process_time  # CPU seconds of this process: on a shared machine wall time measures the neighbours


def timed(step, n: int) -> float:
    t = CLOCK()
    for _ in range(n):
        step()
    return (CLOCK() - t) / n


def matmul_peak(m: int, k: int, n: int, dtype, reps: int = 5) -> float:
    """GFLOP/s of one [m, k] @ [k, n] matmul in `dtype` (best of reps; the shape of a projection)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    best = min(timed(lambda: a @ b, 3) for _ in range(reps))
    return 2 * m * k * n / best / 1e9


def step_flops(step) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        step()
    return fc.get_total_flops()


def split(model, batch, dtype, ds, text_start, reps: int = 3) -> dict:
    """Seconds per part of one step: each part's forward and backward alone on the inputs a step hands it."""
    from phasefix.model import qwen3
    from phasefix.module import next_token_loss

    calls = {"projections": [], "compressor": [], "attention": []}
    hooks = []
    for mod in model.modules():
        kind = "projections" if isinstance(mod, torch.nn.Linear) else "compressor" \
            if isinstance(mod, qwen3.Compressor) else None
        if kind:
            hooks.append(mod.register_forward_hook(
                lambda m, args, out, kind=kind: calls[kind].append((m, [a.detach() if torch.is_tensor(a) else a
                                                                         for a in args]))))
    real = qwen3.compression.by_grid_offset

    def spy(fn, *args, **kw):
        calls["attention"].append((None, ([a.detach() if torch.is_tensor(a) else a for a in args], kw)))
        return real(fn, *args, **kw)

    qwen3.compression.by_grid_offset = spy
    try:
        with autocast(dtype):
            logits = model(batch["input_ids"])
    finally:
        qwen3.compression.by_grid_offset = real
        for h in hooks:
            h.remove()
    from phasefix import kernels

    attn = kernels.ops(model.config.attn_impl, "cpu").compressed_attention

    def fwd_bwd(fn):
        with autocast(dtype):
            out = fn()
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward() if out.requires_grad else None

    def part(kind):
        def run():
            for m, args in calls[kind]:
                if kind == "attention":
                    a, kw = args
                    a = [x.requires_grad_() if torch.is_tensor(x) and x.is_floating_point() else x for x in a]
                    fwd_bwd(lambda: real(attn, *a, **kw))
                elif kind == "compressor":
                    x = args[0].requires_grad_()
                    fwd_bwd(lambda: m(x, args[1]) if len(args) > 1 else m(x))
                else:
                    x = args[0].requires_grad_()
                    fwd_bwd(lambda: m(x))
        return run

    def loss_part():
        lg = logits.detach().requires_grad_()
        with autocast(dtype):
            loss, _ = next_token_loss(lg, batch["labels"], text_start)
        loss.backward()

    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-9)

    def optim_part():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    idx = torch.randperm(len(ds))[: batch["input_ids"].shape[0]].tolist()
    parts = {k: part(k) for k in calls} | {"loss": loss_part, "optimizer": optim_part, "data": lambda: ds[idx]}
    out = {}
    for name, fn in parts.items():
        fn()
        out[name] = statistics.median(timed(fn, 1) for _ in range(reps))
    model.zero_grad(set_to_none=True)
    return out


def cpu_info() -> dict:
    from phasefix.precision import cpu_bf16_flags

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma"))]
    load = open("/proc/loadavg").read().split()[:3] if platform.system() == "Linux" else []
    return {"cpu": model, "bf16_matmul_flags": cpu_bf16_flags(), "simd_flags": simd,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_average": load}


def cap_isa(isa: str) -> None:
    """`--isa avx2`: start this script again with ISA_ENV set (torch reads it when it loads), then cap inductor's
    generated C++ at 256-bit vectors; `native`: nothing."""
    if isa == "native":
        return
    env = ISA_ENV[isa]
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})
    import torch._inductor.config as inductor_config

    inductor_config.cpp.simdlen = 256


def run_info(**settings) -> dict:
    """What a benchmark's figures name: commit, time, machine, torch, the CPU (`cpu_info`) and its own settings."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": platform.node(), "torch": torch.__version__, **settings, **cpu_info()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="extra phasefix.fit overrides for every regime (Hydra syntax)")
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--variants", nargs="+", default=["fp32", "bf16"], choices=list(VARIANTS),
                    help="the first is the baseline of the ratios (compiled variants: their compile is timed apart)")
    ap.add_argument("--steps", type=int, default=2, help="steps per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: process CPU time (the default: steady on a shared machine, with --threads 1); wall")
    ap.add_argument("--no-split", action="store_true", help="skip the step split")
    ap.add_argument("--profile", action="store_true", help="instead: profile one step per variant (torch.profiler)")
    ap.add_argument("--markdown", action="store_true", help="also print the docs/performance.md table")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native",
                    help="avx2: cap every kernel at AVX2, as on a CPU without AVX-512 and bf16 matmul instructions")
    args = ap.parse_args()
    cap_isa(args.isa)
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    info = run_info(threads=args.threads, clock=args.clock, isa=args.isa)
    print(json.dumps(info), flush=True)
    results = []
    torch._dynamo.config.recompile_limit = 64  # every variant of every regime compiles the same forward anew
    for regime in args.regimes:
        torch._dynamo.reset()  # each regime's compiles start fresh (inductor's on-disk cache stays)
        model, batch, optim, cfg, ds, text_start = build(REGIMES[regime] + args.overrides, args.seed)
        B, T = batch["input_ids"].shape
        steps = {}
        for v in args.variants:
            steps[v] = stepper(variant_model(model, v), batch, optim, VARIANTS[v][0], text_start, v)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            for v, step in steps.items():
                step()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    step()
                print(f"== {regime} {v}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            continue
        C = model.config.hidden_size
        peaks = {"fp32": matmul_peak(B * T, C, model.config.intermediate_size, torch.float32),
                 "bf16": matmul_peak(B * T, C, model.config.intermediate_size, torch.bfloat16)}
        flops = step_flops(stepper(copy.deepcopy(model), batch, optim, None, text_start))
        warm, compile_s = {}, {}
        for v, step in steps.items():
            t = time.perf_counter()
            step()  # the first step: a compiled variant's compile (forward and backward graphs)
            compile_s[v] = time.perf_counter() - t
            for _ in range(args.warmup):
                step()
            warm[v] = time.perf_counter() - t
        times = {v: [] for v in steps}
        for _ in range(args.repeats):
            for v, step in steps.items():
                times[v].append(timed(step, args.steps))
        losses = {v: round(step(), 5) for v, step in steps.items()}
        base = args.variants[0]
        for v in steps:
            s = statistics.median(times[v])
            row = {"regime": regime, "variant": v, "batch": [B, T], "s_per_step": round(s, 4),
                   "tokens_per_s_per_core": round(B * T / s / args.threads),
                   "speedup_median": round(statistics.median(b / x for b, x in zip(times[base], times[v])), 3),
                   "speedups": [round(b / x, 3) for b, x in zip(times[base], times[v])],
                   "loss_after": losses[v], "warmup_wall_s": round(warm[v], 1),
                   "first_step_wall_s": round(compile_s[v], 1), "matmul_gflop_per_step": round(flops / 1e9, 2),
                   "achieved_gflops": round(flops / s / 1e9, 1),
                   "peak_gflops": {k: round(p, 1) for k, p in peaks.items()},
                   "peak_shape": [B * T, C, model.config.intermediate_size]}
            if not args.no_split and not VARIANTS[v][1]:
                with variant_rule(v):
                    parts = split(variant_model(model, v), batch, VARIANTS[v][0], ds, text_start)
                parts["rest"] = max(0.0, s - sum(parts.values()))
                row["split_s"] = {k: round(x, 4) for k, x in parts.items()}
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"info": info, "args": vars(args), "results": results}, f, indent=1)
    if args.markdown and results:
        print(markdown(info, results))


def markdown(info: dict, results: list[dict]) -> str:
    parts = [k for k in results[0].get("split_s", {})]
    head = ["regime", "variant", "batch x tokens", "s/step", "tokens/s/core", "speedup (median; per repeat)",
            "loss after", "first step (compile), wall s", "matmul GFLOP/s (fp32 / bf16 peak)"] \
        + [f"{p} %" for p in parts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        sp = r.get("split_s", {})
        tot = sum(sp.values()) or 1
        sp = sp or {p: float("nan") for p in parts}
        lines.append("| " + " | ".join([
            r["regime"], r["variant"], f"{r['batch'][0]} x {r['batch'][1]}", f"{r['s_per_step']:.3f}",
            f"{r['tokens_per_s_per_core']:,}",
            f"**{r['speedup_median']:.2f}** ({', '.join(f'{x:.2f}' for x in r['speedups'])})", f"{r['loss_after']:.4f}",
            f"{r['first_step_wall_s']:.1f}",
            f"{r['achieved_gflops']:.0f} ({r['peak_gflops']['fp32']:.0f} / {r['peak_gflops']['bf16']:.0f})"]
            + [f"{100 * sp[p] / tot:.0f}" for p in parts]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
