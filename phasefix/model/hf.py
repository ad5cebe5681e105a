"""Conversion from Hugging Face transformers' Qwen3 (the only module that imports transformers' modelling).

New compressor parameters are initialised so the converted model is a sensible continuation of the checkpoint:
every slot's key/value payload map starts as the layer's k_proj/v_proj (so an entry is a convex mix of the window's
own keys and values, in the space the queries already read), the gate weights start at zero and the biases at zero
(uniform averaging at step 0), and the attention sink at zero. Training then specialises the slots.
"""
from __future__ import annotations

from pathlib import Path

import torch

from phasefix.errors import ConfigError
from phasefix.model.config import ModelConfig


def config_from_hf(hf_config, **overrides) -> ModelConfig:
    rope_theta = getattr(hf_config, "rope_theta", None)
    if rope_theta is None:  # transformers >= 5 keeps it in rope_parameters
        rope_theta = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    fields = dict(
        name=f"hf:{getattr(hf_config, '_name_or_path', '') or 'qwen3'}",
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        intermediate_size=hf_config.intermediate_size,
        rope_theta=float(rope_theta),
        rms_norm_eps=hf_config.rms_norm_eps,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention="full",
        qk_norm=True,
    )
    fields.update(overrides)
    return ModelConfig.from_dict(fields)


def _load_hf(model_or_dir):
    if isinstance(model_or_dir, (str, Path)):
        from transformers import AutoModelForCausalLM

        path = Path(model_or_dir)
        if not path.is_dir():
            raise ConfigError(f"model={str(model_or_dir)!r} is invalid: expected a Hugging Face checkpoint directory")
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    return model_or_dir


def from_hf(cls, model_or_dir, **overrides):
    hf = _load_hf(model_or_dir)
    if getattr(hf.config, "model_type", "qwen3") != "qwen3":
        raise ConfigError(f"model.model_type={hf.config.model_type!r} is invalid: allowed values are 'qwen3'")
    cfg = config_from_hf(hf.config, **overrides)
    model = cls(cfg)
    sd = hf.state_dict()
    own = {}
    own["embed_tokens.weight"] = sd["model.embed_tokens.weight"]
    own["norm.weight"] = sd["model.norm.weight"]
    own["lm_head.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        own[f"layers.{i}.input_norm.weight"] = sd[p + "input_layernorm.weight"]
        own[f"layers.{i}.post_attn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            own[f"layers.{i}.attn.{name}.weight"] = sd[p + f"self_attn.{name}.weight"]
        if cfg.qk_norm:
            own[f"layers.{i}.attn.q_norm.weight"] = sd[p + "self_attn.q_norm.weight"]
            own[f"layers.{i}.attn.k_norm.weight"] = sd[p + "self_attn.k_norm.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            own[f"layers.{i}.mlp.{name}.weight"] = sd[p + f"mlp.{name}.weight"]
    missing, unexpected = model.load_state_dict(own, strict=False)
    assert not unexpected, unexpected
    with torch.no_grad():
        for block in model.layers:
            comp = block.attn.compressor
            if comp is None:
                continue
            for b, proj in (("key", block.attn.k_proj), ("value", block.attn.v_proj)):
                if b not in comp.branches:
                    continue
                getattr(comp, f"{b}_payload").copy_(proj.weight.t().expand_as(getattr(comp, f"{b}_payload")))
                if cfg.gate != "uniform":
                    getattr(comp, f"{b}_gate").zero_()
                    if cfg.gate_bias:
                        getattr(comp, f"{b}_gate_bias").zero_()
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model
