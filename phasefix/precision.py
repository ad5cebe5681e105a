"""How the training step runs: its precision (`trainer.precision=auto`: bf16 autocast where the CPU multiplies bf16
in hardware) and whether it goes through torch.compile (`trainer.compile=auto`: where the run is long enough to pay
for the compile).

On a CPU with AMX or AVX-512 BF16 a bf16 matmul runs several times faster than a float32 one (docs/performance.md);
without them bf16 is emulated and slower, so `auto` keeps float32 there. Weights, optimizer state, norms, the
compressor (slot maps, gate logits, pooling) and the compressed attention (scores, softmax, weighted sums) stay
float32 under `bf16-mixed` (Lightning's torch.autocast); the q/k/v/o projections and the MLP run in bf16.
tests/test_bf16.py holds its gradients to fp32's.
"""
from __future__ import annotations

import os

BF16_MATMUL_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of the CPUs with bf16 matmul instructions


def cpu_bf16_flags() -> list[str]:
    """This CPU's bf16 matmul flags (of BF16_MATMUL_FLAGS) from /proc/cpuinfo; [] where there is none to read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in BF16_MATMUL_FLAGS if name in flags]
    except OSError:
        pass
    return []


def resolve_precision(precision: str, accelerator: str) -> tuple[str, str]:
    """`trainer.precision` -> (the Lightning precision to train with, why). `auto`: bf16-mixed on a GPU and on a CPU
    with bf16 matmul hardware, 32-true on any other CPU."""
    if precision != "auto":
        return precision, "trainer.precision"
    if accelerator in ("gpu", "cuda"):
        return "bf16-mixed", "auto: GPU"
    flags = cpu_bf16_flags()
    if flags:
        return "bf16-mixed", f"auto: the CPU has bf16 matmul hardware ({', '.join(flags)})"
    return "32-true", f"auto: the CPU has no bf16 matmul hardware (none of {', '.join(BF16_MATMUL_FLAGS)})"


# trainer.compile=auto compiles a CPU run that trains at least this many steps: a cold compile (empty cache) is paid
# back by then (measured: docs/performance.md, "trainer.compile=auto"); a shorter run (the README's main job, a test)
# stays eager.
COMPILE_MIN_STEPS = 1000


def resolve_compile(compile: bool | str, accelerator: str, steps: int) -> tuple[bool, str]:
    """`trainer.compile` -> (compile the training step, why). `auto`: on the CPU when this piece trains at least
    COMPILE_MIN_STEPS steps (`steps`: max_steps minus the step a resume starts from); eager on a GPU (not measured)."""
    if compile != "auto":
        return bool(compile), "trainer.compile"
    if accelerator != "cpu":
        return False, "auto: eager off the CPU (compile=auto is measured on the CPU only)"
    if steps < COMPILE_MIN_STEPS:
        return False, f"auto: {steps} steps to train, under the {COMPILE_MIN_STEPS} that pay for a compile"
    return True, f"auto: {steps} steps to train, at least the {COMPILE_MIN_STEPS} that pay for a compile"


def use_compile_cache() -> str:
    """Point inductor's on-disk caches (the FX graph and AOTAutograd caches, on by default in torch) at
    <phasefix cache>/inductor, unless TORCHINDUCTOR_CACHE_DIR names another directory: a second run of a config, or
    a study's other workers, load its compiled graphs instead of compiling them again (torch's default is a /tmp
    directory a reboot empties). Importing Lightning already writes torch's default into TORCHINDUCTOR_CACHE_DIR,
    so that value counts as unset. Called before anything compiles; returns the directory."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # no torch import: a plain module

    from phasefix.paths import cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
