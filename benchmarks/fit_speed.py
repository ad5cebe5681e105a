"""Whole fits, not steps: `phasefix.fit` runs of one regime, float32 eager against the default path and against
`trainer.compile=true`, as ratios of their summed `train_seconds` in one run (issue 69).

Each fit is a fresh process (`python -m phasefix.fit`, one thread, no progress bar, its own MLflow store under a
temporary directory), so imports, the compile and its on-disk cache count as a user meets them. A warm-up round runs
every variant once (the training set gets built and cached, the compile's graphs reach inductor's cache under the
project's cache directory; its compile is reported, then left out), then `--rounds` rounds run every variant once
each, the order rotated per round. Reported per variant: the summed train_seconds of the timed rounds, of it the
compile (`compile_seconds`), the process's wall time, and the ratio of float32 eager's summed train_seconds to the
variant's (with and without its compile).

    python benchmarks/fit_speed.py                                   # coverage_w8s8, 80 steps, 2 timed rounds
    python benchmarks/fit_speed.py --regime default --steps 200 --variants fp32_eager default
    python benchmarks/fit_speed.py --markdown > table.md
    python benchmarks/fit_speed.py --parts --regime default           # the pieces of a step outside the model

`--parts`: in one process, one thread, process CPU time, the per-step cost of what a step does besides the model's
forward and backward (one batch from the training set, gradient clipping, AdamW as torch's per-tensor loop, foreach
and fused), beside the forward and backward they serve.

Variants (overrides on top of the regime's): fp32_eager (`trainer.precision=32-true trainer.compile=false`), default
(nothing: `precision=auto`, `compile=auto`), compile (`trainer.compile=true`), and fp32_eager_adamw_loop (float32
eager with torch's per-tensor AdamW loop instead of the fused kernel: what the fused optimizer bought).
Figures and the machine they came from: docs/performance.md, "Whole fits".
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "fp32_eager": ["trainer.precision=32-true", "trainer.compile=false"],
    "default": [],
    "compile": ["trainer.compile=true"],
    "fp32_eager_adamw_loop": ["trainer.precision=32-true", "trainer.compile=false"],
}
RUNNER = """
import sys
{patch}
from phasefix.fit import main
sys.exit(main(sys.argv[1:]))
"""


def run_fit(variant: str, regime: str, steps: int, workdir: Path, tag: str) -> dict:
    out = workdir / tag
    overrides = [f"regime={regime}", f"trainer.max_steps={steps}", "trainer.num_threads=1",
                 "trainer.progress_bar=false", f"trainer.checkpoint_every_n_steps={steps}",
                 f"logger.tracking_uri=sqlite:///{workdir / 'mlflow.db'}", f"output_dir={out}", *VARIANTS[variant]]
    patch = _loop_adamw_patch() if variant == "fp32_eager_adamw_loop" else ""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(patch=patch), *overrides], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"variant": variant, "train_seconds": s["train_seconds"], "total_seconds": s["total_seconds"],
            "compile_seconds": s["compile"].get("seconds", 0.0), "compiled": s["compile"]["used"],
            "precision": s["precision"]["used"], "wall": round(wall, 1),
            "prefix_mean": s.get("prefix", {}).get("acc_mean")}


def _loop_adamw_patch() -> str:
    """Subclass AdamW so that `fused` is off whatever the caller passes: torch's per-tensor loop."""
    return ("import torch\n"
            "class _LoopAdamW(torch.optim.AdamW):\n"
            "    def __init__(self, *a, **k):\n"
            "        k.update(fused=False, foreach=False)\n"
            "        super().__init__(*a, **k)\n"
            "torch.optim.AdamW = _LoopAdamW\n")


def parts(regime: str, repeats: int = 20) -> list[tuple[str, float]]:
    """(part, ms of process CPU time per step) for one step of `regime` at batch 64, one thread."""
    import torch
    from omegaconf import OmegaConf

    from phasefix.cli import compose
    from phasefix.data.select import train_stages
    from phasefix.fit import plan
    from phasefix.module import PhaseFixModule, StepBatchSampler, next_token_loss

    torch.set_num_threads(1)
    cfg = compose([f"regime={regime}"], "fit")
    p = plan(cfg)
    torch.manual_seed(0)
    module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                            optim=OmegaConf.to_container(cfg.optim, resolve=True), max_steps=1000)
    ds = train_stages(p["data"], 0)[0][1].with_format("torch")
    rows = next(iter(StepBatchSampler([(0, len(ds))], cfg.trainer.batch_size, 0, 0, 1)))
    batch = ds[rows]

    def ms(f, n=repeats) -> float:
        f()
        t0 = time.process_time()
        for _ in range(n):
            f()
        return (time.process_time() - t0) / n * 1000

    def forward_backward():
        module.zero_grad(set_to_none=True)
        next_token_loss(module.model(batch["input_ids"]), batch["labels"])[0].backward()

    out = [("one batch from the training set", ms(lambda: ds[rows])),
           ("forward + backward", ms(forward_backward, max(3, repeats // 4))),
           ("gradient clipping (foreach)", ms(lambda: torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)))]
    for name, kw in (("loop", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3, **kw)
        out.append((f"AdamW {name}", ms(opt.step)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regime", default="coverage_w8s8")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["fp32_eager", "default", "compile"], choices=list(VARIANTS))
    ap.add_argument("--warmup", nargs="*", default=None,
                    help="the variants the warm-up round runs (default: every one; a compiling one fills the cache)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--parts", action="store_true", help="time the pieces of one step instead of whole fits")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    meta = {"command": "python benchmarks/fit_speed.py " + " ".join(sys.argv[1:]), "commit": commit,
            "start": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs, "
                       + next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                               if ln.startswith("model name")), platform.processor()),
            "load_average": [round(x, 1) for x in os.getloadavg()]}
    if args.parts:
        print(json.dumps(meta))
        print(f"| {args.regime}: part | ms per step (CPU, 1 thread) |\n|---|---|")
        for name, value in parts(args.regime):
            print(f"| {name} | {value:.2f} |")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="fit_speed-") as tmp:
        work = Path(tmp)
        for v in args.variants if args.warmup is None else args.warmup:  # warm-up: data cache, inductor cache
            r = run_fit(v, args.regime, args.steps, work, f"warmup-{v}")
            print(f"warm-up {v}: {r}", file=sys.stderr, flush=True)
            rows.append({**r, "round": "warm-up"})
        for i in range(args.rounds):
            order = args.variants[i % len(args.variants):] + args.variants[:i % len(args.variants)]
            for v in order:
                r = run_fit(v, args.regime, args.steps, work, f"r{i}-{v}")
                print(f"round {i} {v}: {r}", file=sys.stderr, flush=True)
                rows.append({**r, "round": i})
    meta["end"] = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    meta["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(meta))
    print(table(rows, args.variants, args.markdown))


def table(rows: list[dict], variants: list[str], markdown: bool) -> str:
    timed = [r for r in rows if r["round"] != "warm-up"]
    base = sum(r["train_seconds"] for r in timed if r["variant"] == variants[0])
    head = ["variant", "precision", "compiled", "train_seconds per round", "summed", "of it compile",
            "ratio (with compile)", "ratio (compile left out)", "process wall per round", "warm-up compile s"]
    lines = []
    for v in variants:
        mine = [r for r in timed if r["variant"] == v]
        total = sum(r["train_seconds"] for r in mine)
        comp = sum(r["compile_seconds"] for r in mine)
        warm = next((r for r in rows if r["variant"] == v and r["round"] == "warm-up"), {"compile_seconds": 0.0})
        lines.append([v, mine[0]["precision"], str(mine[0]["compiled"]).lower(),
                      ", ".join(f"{r['train_seconds']:.1f}" for r in mine), f"{total:.1f}", f"{comp:.1f}",
                      f"**{base / total:.2f}**", f"{base / max(total - comp, 1e-9):.2f}",
                      ", ".join(f"{r['wall']:.0f}" for r in mine), f"{warm['compile_seconds']:.1f}"])
    if not markdown:
        return "\n".join("  ".join(x) for x in [head, *lines])
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(x) + " |" for x in lines])


if __name__ == "__main__":
    main()
