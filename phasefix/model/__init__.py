"""The model: config and presets, the Qwen3 backbone and its compressor (the window grid: `phasefix.kernels.window_grid`).
The attention implementations live in `phasefix/kernels/`."""
from phasefix.model.config import ModelConfig, preset_names
from phasefix.model.qwen3 import CompressedQwen3

__all__ = ["CompressedQwen3", "ModelConfig", "preset_names"]
