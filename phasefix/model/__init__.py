"""The model: config and presets, the Qwen3 backbone and its compressor (the window grid: `phasefix.kernels.window_grid`).
The attention implementations live in `phasefix/kernels/`. `CompressedQwen3` (torch) is imported when first used,
so that `phasefix.model.config` checks a config without importing torch."""
from phasefix.model.config import ModelConfig, preset_names


def __getattr__(name: str):
    if name == "CompressedQwen3":
        from phasefix.model.qwen3 import CompressedQwen3

        return CompressedQwen3
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CompressedQwen3", "ModelConfig", "preset_names"]
