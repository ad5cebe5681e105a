"""Training precision: `trainer.precision=auto` picks bf16 autocast where the CPU multiplies bf16 in hardware.

On a CPU with AMX or AVX-512 BF16 a bf16 matmul runs several times faster than a float32 one (docs/performance.md);
without them bf16 is emulated and slower, so `auto` keeps float32 there. Weights, optimizer state, norms, the
compressor (slot maps, gate logits, pooling) and the compressed attention (scores, softmax, weighted sums) stay
float32 under `bf16-mixed` (Lightning's torch.autocast); the q/k/v/o projections and the MLP run in bf16.
tests/test_bf16.py holds its gradients to fp32's.
"""
from __future__ import annotations

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
