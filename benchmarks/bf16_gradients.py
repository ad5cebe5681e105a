"""How far one training step's gradient moves from float64's under each CPU precision path (issue 53).

On one batch of the run's own training stream, the gradient of the next-token loss is taken in float64 (the
reference), float32, bf16 autocast with the compressor and the blocked attention in float32 (today's rule) or in
bf16 (the former rules: `*_cmp16` the compressor, `*_attn16` both), each eager and through `torch.compile` (as
`trainer.compile` compiles the forward). Per path: the loss, the cosine
of the whole gradient with float64's, and the median and worst relative L2 error over the parameters.

    python benchmarks/bf16_gradients.py --run <run dir>          # a trained (or plateau) checkpoint's weights
    python benchmarks/bf16_gradients.py --init regime=default    # a fresh model of a config

Findings and the checkpoint they were measured on: docs/performance.md ("Why bf16 + compile stayed on the plateau").
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step_cpu import VARIANTS, variant_rule  # noqa: E402  (the former rules, one definition)

# train_step_cpu.py's variants of the model as configured, eager or compiled whole (plain mode): precision and rules
PATHS = [name for name, (_, how, changes) in VARIANTS.items() if not changes and how in (False, "model")]


def load(args):
    from phasefix.cli import compose
    from phasefix.fit import plan
    from phasefix.model.qwen3 import CompressedQwen3
    from phasefix.fit_run import Run

    if args.run:
        run = Run.open(args.run)
        cfg, (module, _) = run.config, run.load_module()
        model = module.model
    else:
        cfg = compose(args.overrides, "fit")
        torch.manual_seed(cfg.seed)
        model = CompressedQwen3(plan(cfg)["model"])
    return cfg, model.train()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run directory (its last checkpoint's weights and its config)")
    ap.add_argument("--init", action="store_true", help="a fresh model of the overrides' config instead")
    ap.add_argument("overrides", nargs="*", help="phasefix.fit overrides (with --init)")
    ap.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    if bool(args.run) == bool(args.init):
        ap.error("give --run DIR or --init [overrides]")
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64  # one forward, compiled per path (autocast and the rule are guarded)
    from phasefix.data.select import train_stages
    from phasefix.fit import plan
    from phasefix.module import next_token_loss

    cfg, model = load(args)
    batch = train_stages(plan(cfg)["data"], cfg.seed)[0][1].with_format("torch")[: args.batch]
    params = dict((n, p) for n, p in model.named_parameters() if p.requires_grad)

    def gradient(forward, bf16: bool, rule=contextlib.nullcontext(), dtype=torch.float32):
        model.to(dtype)
        for p in params.values():
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), rule:
            loss, _ = next_token_loss(forward(batch["input_ids"]), batch["labels"])
        loss.backward()
        grads = {n: p.grad.detach().double().clone() for n, p in params.items()}
        model.to(torch.float32)
        return float(loss.detach()), grads

    ref_loss, ref = gradient(model, False, dtype=torch.float64)
    flat_ref = torch.cat([g.flatten() for g in ref.values()])
    print(f"{'path':22s} {'loss':>9s} {'cos(g, g64)':>12s} {'median rel':>11s}  worst parameters (rel. L2)")
    print(f"{'float64':22s} {ref_loss:9.5f}")
    for name in args.paths:
        autocast_dtype, compiled, _ = VARIANTS[name]
        forward = torch.compile(model.forward, dynamic=False) if compiled else model
        loss, g = gradient(forward, autocast_dtype is not None, variant_rule(name))
        flat = torch.cat([x.flatten() for x in g.values()])
        cos = float(flat @ flat_ref / (flat.norm() * flat_ref.norm()))
        errs = {n: float((g[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref}
        med = sorted(errs.values())[len(errs) // 2]
        worst = sorted(errs, key=errs.get, reverse=True)[:3]
        print(f"{name:22s} {loss:9.5f} {cos:12.6f} {med:11.2e}  " + ", ".join(f"{n} {errs[n]:.1e}" for n in worst),
              flush=True)


if __name__ == "__main__":
    main()
