"""The model: config and presets, the Qwen3 backbone, the compressor and the reference compressed attention."""
from phasefix.model.compression import compressed_attention, gated_pool
from phasefix.model.config import ModelConfig, preset_names
from phasefix.model.qwen3 import CompressedQwen3

__all__ = ["CompressedQwen3", "ModelConfig", "compressed_attention", "gated_pool", "preset_names"]
