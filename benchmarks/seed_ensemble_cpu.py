"""CPU benchmark: several seeds' forward + backward in one process, one vmapped call (torch.func model ensembling:
`stack_module_state`, `vmap(grad(...))`) against the same models one after the other, side by side in one run.

Issue 53 asked whether training several seeds in one process pays on this hardware. The models are the regime's
own (`train_step_cpu.build`, seeds 0..N-1) on one batch; each repeat times both ways back to back, in process CPU
time with one thread, and the medians and their ratio are printed. The blocked attention's hand-written backward is
an `autograd.Function` without a vmap rule, so the ensemble runs on `model.attn_impl=naive` (both ways, so the ratio
compares like with like); `--attn-impl blocked` shows the error.

    python benchmarks/seed_ensemble_cpu.py                          # coverage_w8s8, 3 seeds, naive attention
    python benchmarks/seed_ensemble_cpu.py --isa avx2               # as on a CPU without AVX-512
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step_cpu import ISA_ENV, REGIMES, build, cap_isa, run_info  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regime", default="coverage_w8s8", choices=sorted(REGIMES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--attn-impl", default="naive", choices=["naive", "blocked"])
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native",
                    help="avx2: cap ATen, oneDNN and MKL at AVX2, as on a CPU without AVX-512 (train_step_cpu's rule)")
    args = ap.parse_args()
    cap_isa(args.isa)

    from torch.func import functional_call, grad, stack_module_state, vmap

    from phasefix.module import next_token_loss

    torch.set_num_threads(1)
    overrides = REGIMES[args.regime] + [f"model.attn_impl={args.attn_impl}"]
    built = [build(overrides, seed) for seed in range(args.seeds)]
    models, batch = [b[0] for b in built], built[0][1]  # seed 0's batch for every model
    x, y = batch["input_ids"], batch["labels"]

    def one_by_one():
        for m in models:
            m.zero_grad(set_to_none=True)
            next_token_loss(m(x), y, None)[0].backward()

    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")

    def loss(p, b):
        return next_token_loss(functional_call(skeleton, (p, b), (x,)), y, None)[0]
    ensemble_grads = vmap(grad(loss), randomness="same")

    def ensemble():
        ensemble_grads(params, buffers)

    times = {"one_by_one": [], "ensemble": []}
    for name, f in (("one_by_one", one_by_one), ("ensemble", ensemble)):
        try:
            f()  # warm-up; the ensemble fails here on the blocked attention
        except RuntimeError as e:
            sys.exit(f"{name} fails: {str(e).splitlines()[0]}")
    for _ in range(args.repeats):
        for name, f in (("one_by_one", one_by_one), ("ensemble", ensemble)):
            t = time.process_time()
            f()
            times[name].append(time.process_time() - t)
    a, b = statistics.median(times["one_by_one"]), statistics.median(times["ensemble"])
    print(json.dumps(run_info(threads=1, clock="cpu", isa=args.isa, regime=args.regime, seeds=args.seeds,
                              attn_impl=args.attn_impl)))
    print(f"CPU s per forward + backward of all seeds (median of {args.repeats}):")
    print(f"  one by one {a:.3f}  {[round(v, 3) for v in times['one_by_one']]}")
    print(f"  ensemble   {b:.3f}  {[round(v, 3) for v in times['ensemble']]}")
    print(f"  ensemble speedup {a / b:.2f}x")


if __name__ == "__main__":
    main()
