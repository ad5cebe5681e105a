"""The golden loss curve: a short fixed-seed training run of the CPU default per precision, the guard of the training
step (tests/test_golden_loss.py holds every change to the step to the committed curve).

The run is the default's training step as `phasefix.fit` trains it, shortened: the tiny W4/S4 model, its data
(seed 0), PhaseFixModule's optimizer and schedule (warm-up shortened to 5 steps so that the loss moves), gradient
clipping at 1.0, STEPS steps of BATCH sequences, in float32 and under bf16 autocast (`trainer.precision=bf16-mixed`,
what `auto` picks on a CPU with bf16 matmul hardware). Each precision starts from the same weights.

    python tests/golden_loss.py          # prints the curves and writes tests/data/golden_loss.json
"""
from __future__ import annotations

import contextlib
import json
import platform
import subprocess
from pathlib import Path

import torch

STEPS, BATCH, SEED = 20, 16, 0
OVERRIDES = ["optim.warmup_steps=5"]
PRECISIONS = {"32-true": None, "bf16-mixed": torch.bfloat16}
PATH = Path(__file__).parent / "data" / "golden_loss.json"


def loss_curve(precision: str, compile: bool = False) -> list[float]:
    """The training loss at every step of the short run in `precision` (a key of PRECISIONS); `compile`: the
    step's forward through torch.compile, as `trainer.compile=true` trains (PhaseFixModule.train_forward)."""
    from omegaconf import OmegaConf

    from phasefix.cli import compose
    from phasefix.data.select import train_stages
    from phasefix.fit import plan
    from phasefix.module import PhaseFixModule, next_token_loss

    cfg = compose(OVERRIDES, "fit")
    p = plan(cfg)
    torch.manual_seed(SEED)
    module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                            optim=OmegaConf.to_container(cfg.optim, resolve=True), max_steps=cfg.trainer.max_steps)
    module.compile_training = compile
    forward = module.train_forward()
    opts = module.configure_optimizers()
    opt, sched = opts["optimizer"], opts["lr_scheduler"]["scheduler"]
    ds = train_stages(p["data"], SEED)[0][1].with_format("torch")
    dtype = PRECISIONS[precision]
    losses = []
    for i in range(STEPS):
        batch = ds[i * BATCH : (i + 1) * BATCH]
        with torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext():
            loss, _ = next_token_loss(forward(batch["input_ids"]), batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 5))
    return losses


def main() -> None:
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    curves = {prec: loss_curve(prec) for prec in PRECISIONS}
    for prec, c in curves.items():
        print(prec, c)
    from phasefix.precision import cpu_bf16_flags

    PATH.parent.mkdir(exist_ok=True)
    PATH.write_text(json.dumps({
        "command": "python tests/golden_loss.py", "commit": commit, "torch": torch.__version__,
        "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                    platform.processor()), "bf16_matmul_flags": cpu_bf16_flags(),
        "steps": STEPS, "batch": BATCH, "seed": SEED, "overrides": OVERRIDES, "loss": curves}, indent=1) + "\n")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
