"""CPU benchmark: one training step (forward, backward, AdamW) of a configured model, eager against
`torch.compile` (inductor), as a ratio measured in one run.

The model and a batch come from `phasefix.fit`'s own config (any overrides, e.g. an experiment), so the step is the
one a run trains: `CompressedQwen3` on the CPU path, `next_token_loss`, AdamW. Each repeat times the eager step then
the compiled step back to back (two copies of the same initial model) and the reported ratio is the median of the
per-repeat ratios; the compiled model's first steps (its compile) are timed apart and reported as the one-off cost.

    python benchmarks/train_step_cpu.py regime=records64 model.head_dim=64 model.window=9 --threads 1
    python benchmarks/train_step_cpu.py --steps 5 --repeats 5          # the CPU default (W4/S4 tiny)
    python benchmarks/train_step_cpu.py regime=records64 --profile  # where one eager step's time goes

Figures and the machine they came from: docs/performance.md, "Training step on the CPU".
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch


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
    return model, batch, optim, cfg


def stepper(model, batch, optim):
    from phasefix.module import next_token_loss

    opt = torch.optim.AdamW(model.parameters(), lr=optim["lr"], betas=tuple(optim["betas"]),
                            weight_decay=optim["weight_decay"])

    def step() -> float:
        logits = model(batch["input_ids"])
        loss, _ = next_token_loss(logits, batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    return step


def timed(step, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="phasefix.fit overrides (Hydra syntax)")
    ap.add_argument("--steps", type=int, default=3, help="steps per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="compiled steps before timing (the compile itself)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="instead: profile one eager step (torch.profiler)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, batch, optim, cfg = build(args.overrides, args.seed)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        step = stepper(model, batch, optim)
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return
    compiled = copy.deepcopy(model)
    compiled.compile()
    eager_step, compiled_step = stepper(model, batch, optim), stepper(compiled, batch, optim)
    t = time.perf_counter()
    for _ in range(args.warmup):
        compiled_step()
    compile_s = time.perf_counter() - t
    for _ in range(args.warmup):  # as many eager steps: both models have taken the same updates
        eager_step()
    # the same initial weights, batch and updates: the two losses agree to fp32 rounding
    eager_loss, compiled_loss = eager_step(), compiled_step()
    ratios, eager_t, compiled_t = [], [], []
    for _ in range(args.repeats):
        e, c = timed(eager_step, args.steps), timed(compiled_step, args.steps)
        eager_t.append(e), compiled_t.append(c), ratios.append(e / c)
    shape = tuple(batch["input_ids"].shape)
    print(json.dumps({
        "overrides": args.overrides, "batch": shape, "threads": args.threads, "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.node(),
        "eager_s_per_step": round(statistics.median(eager_t), 4),
        "compiled_s_per_step": round(statistics.median(compiled_t), 4),
        "speedup_median": round(statistics.median(ratios), 3), "speedups": [round(r, 3) for r in ratios],
        "compile_s": round(compile_s, 1), "loss_eager": round(eager_loss, 5), "loss_compiled": round(compiled_loss, 5),
    }, indent=1))


if __name__ == "__main__":
    main()
