"""DeepSeek-V4 compressors as phasefix compressors (science.md §3; docs/deepseek_v4.md).

A DeepSeek-V4 compressor (transformers `DeepseekV4CSACompressor`, its `DeepseekV4Indexer`, or
`DeepseekV4HCACompressor`) stores per layer `kv_proj` and `gate_proj` ([2D, C] for CSA and the indexer, [D, C] for
HCA), `position_bias` ([S, 2D] resp. [S, D]: the slot bias, `ape` in the original checkpoints) and `kv_norm`.

CSA (stride S = 4, window W = 8): entry w pools 8 slots, the 4 tokens of block w-1 on the first half of the channels
(`[:D]`, "Ca") and the 4 tokens of block w on the second half (`[D:]`, "Cb"); the gate logit of a token at phase
t mod 4 is gate_proj·x + position_bias[t mod 4], softmax over the 8 slots per channel, then `kv_norm`, then RoPE on
the last rope dims (interleaved pairs) at position 4w. In phasefix's grid (W = 8, S = 4) window j covers tokens
[4j-4, 4j+4): the same windows, so slot i < 4 gets the first half's maps and bias row i, slot i >= 4 the second
half's maps and bias row i-4; entry 0's first half lies before position 0 and gets weight 0 in both.
HCA (W = S = 128, no overlap): every slot gets the same maps and its own bias row.

`import_compressor` builds a phasefix `Compressor` (vector gates, tied K/V: one latent) with those maps and wraps it
with DeepSeek-V4's own entry norm and interleaved partial RoPE (`DeepseekV4Compressor`), so its entries equal
transformers' (tests/test_deepseek_v4.py). Gate cycling and knockouts then act on the phasefix parameters
(`phasefix.analyze.cycle.cycled(imported, d)` rolls all W slots: a phase shift for HCA, where W = S);
`export_compressor` writes a (possibly edited) import back into the transformers module, and `cycled` rolls a real
compressor's slot biases in place (the only slot-specific gate parameter DeepSeek-V4 has).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from phasefix.errors import ConfigError
from phasefix.model.config import ModelConfig
from phasefix.model.qwen3 import Compressor

KINDS = ("csa", "indexer", "hca")


def compressor_kind(module) -> str:
    """'csa', 'indexer' or 'hca' for a transformers DeepSeek-V4 compressor module (by class name)."""
    name = type(module).__name__
    for kind, cls in (("csa", "DeepseekV4CSACompressor"), ("indexer", "DeepseekV4Indexer"),
                      ("hca", "DeepseekV4HCACompressor")):
        if name == cls:
            return kind
    raise ConfigError(f"compressor={name!r} is invalid: allowed values are DeepseekV4CSACompressor, "
                      "DeepseekV4Indexer, DeepseekV4HCACompressor")


def overlapping(kind: str) -> bool:
    """CSA and its indexer pool two blocks (W = 2S); HCA pools one (W = S)."""
    return kind in ("csa", "indexer")


class EntryNorm(nn.Module):
    """DeepSeek-V4's RMSNorm on an entry: normalise in float32, multiply by the float32 weight, cast once."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(weight.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(dtype)


def interleaved_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0):
    """DeepSeek-V4's RoPE: rotate consecutive channel pairs (2k, 2k+1) of the last 2 * len(inv_freq) dims.

    x: [B, N, D]; pos: [N] positions; inv_freq: [R/2]. Angles in float32, rotation in float32, as transformers does.
    """
    freqs = pos.float()[:, None] * inv_freq.float()[None, :]  # [N, R/2]
    cos = (freqs.cos() * scaling).to(x.dtype).repeat_interleave(2, dim=-1)  # [N, R]
    sin = (freqs.sin() * scaling).to(x.dtype).repeat_interleave(2, dim=-1)
    R = cos.shape[-1]
    keep, rot = x[..., :-R], x[..., -R:]
    pairs = torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)  # (x0, x1) -> (-x1, x0)
    rot = (rot.float() * cos + pairs.float() * sin).to(x.dtype)
    return torch.cat([keep, rot], dim=-1)


def compressor_config(hidden_size: int, head_dim: int, stride: int, overlap: bool, rope_dims: int = 0,
                      rope_theta: float = 10000.0) -> ModelConfig:
    """The phasefix config of one imported compressor: one latent (tied K/V, one KV head), vector gates with
    per-slot biases, the entry norm after pooling; W = 2S with overlap, else W = S."""
    return ModelConfig(name="deepseek_v4-compressor", vocab_size=1, hidden_size=hidden_size, num_layers=1,
                       num_heads=1, num_kv_heads=1, head_dim=head_dim, intermediate_size=1,
                       window=2 * stride if overlap else stride, stride=stride, gate="vector", gate_bias=True,
                       tied_kv=True, post_norm=False, qk_norm=True, rope_dims=rope_dims,
                       rope_theta=float(rope_theta) if rope_theta else 10000.0)


class DeepseekV4Compressor(nn.Module):
    """A phasefix `Compressor` holding one DeepSeek-V4 compressor's weights, with its entry norm and RoPE.

    forward(x [B, T, C]) -> (entries [B, N, D] normed and rotated at positions jS, gates [B, N, W] (mean over
    channels), pre-RoPE entries [B, N, D]). x is what the transformers compressor reads: the layer's
    `input_layernorm` output.
    """

    def __init__(self, compressor: Compressor, norm: EntryNorm, inv_freq: torch.Tensor, scaling: float, kind: str):
        super().__init__()
        self.compressor, self.norm, self.kind, self.scaling = compressor, norm, kind, float(scaling)
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)

    @property
    def config(self) -> ModelConfig:
        return self.compressor.cfg

    def compressors(self) -> list[Compressor]:
        """As `CompressedQwen3.compressors`, so phasefix's gate tools (`analyze.cycle.cycled`) act on an import."""
        return [self.compressor]

    def forward(self, x: torch.Tensor):
        k, _, gates = self.compressor(x, self.norm)  # [B, N, 1, D]: pooled, then the entry norm
        k = k[:, :, 0]
        S = self.config.stride
        pos = torch.arange(k.shape[1], device=x.device) * S
        return interleaved_rope(k, pos, self.inv_freq, self.scaling), gates["key"][..., 0], k


def _rope_of(module) -> tuple[torch.Tensor, float]:
    rot = module.rotary_emb
    layer_type = getattr(module, "rope_layer_type", "compress")
    return getattr(rot, f"{layer_type}_inv_freq"), float(getattr(rot, f"{layer_type}_attention_scaling"))


@torch.no_grad()
def import_compressor(module, dtype: torch.dtype | None = None) -> DeepseekV4Compressor:
    """A transformers DeepSeek-V4 compressor (CSA, indexer or HCA) as a `DeepseekV4Compressor` (float32 unless
    `dtype`). Memory: W payload and W gate maps of C x D each (HCA: 2 x 128 x C x D floats, 2 GiB at C = 4096,
    D = 512 in float32)."""
    kind = compressor_kind(module)
    S, D = int(module.compress_rate), int(module.head_dim)
    kv, gate = module.kv_proj.weight.detach(), module.gate_proj.weight.detach()  # [2D or D, C]
    bias = module.position_bias.detach()  # [S, 2D or D]
    C = kv.shape[1]
    inv_freq, scaling = _rope_of(module)
    overlap = overlapping(kind)
    cfg = compressor_config(C, D, S, overlap, rope_dims=2 * inv_freq.numel())
    dtype = dtype or torch.float32
    comp = Compressor(cfg).to(dtype)
    W = cfg.window
    halves = [slice(0, D), slice(D, 2 * D)] if overlap else [slice(0, D)]
    for i in range(W):
        h = halves[i // S]  # slots 0..S-1: block w-1 (first half), S..2S-1: block w (second half)
        comp.key_payload[i].copy_(kv[h].t())  # [C, D]
        comp.key_gate[i].copy_(gate[h].t())  # [C, D]
        comp.key_gate_bias[i].copy_(bias[i % S, h])  # [D]
    norm = EntryNorm(module.kv_norm.weight, module.kv_norm.variance_epsilon)
    return DeepseekV4Compressor(comp, norm, inv_freq, scaling, kind)


@torch.no_grad()
def export_compressor(imported: DeepseekV4Compressor, module) -> None:
    """Write an import back into the transformers module. DeepSeek-V4 shares one payload and one gate map across
    the slots of each half, so every slot of a half must still hold the same maps (a ConfigError otherwise); the
    slot biases may differ freely (that is what gate cycling changes)."""
    comp = imported.compressor
    S, D = comp.cfg.stride, comp.cfg.head_dim
    halves = [slice(0, D), slice(D, 2 * D)] if overlapping(imported.kind) else [slice(0, D)]
    for half, h in enumerate(halves):
        slots = range(half * S, (half + 1) * S)
        for name, target in (("key_payload", module.kv_proj.weight), ("key_gate", module.gate_proj.weight)):
            maps = getattr(comp, name)[list(slots)]  # [S, C, D]
            if not torch.equal(maps, maps[:1].expand_as(maps)):
                raise ConfigError(f"compressor.{name}=per-slot maps is invalid: DeepSeek-V4 shares one map across "
                                  f"the {S} slots of each half; only the slot biases may differ")
            target[h].copy_(maps[0].t().to(target.dtype))
        for i in slots:
            module.position_bias[i % S, h].copy_(comp.key_gate_bias[i].to(module.position_bias.dtype))
    module.kv_norm.weight.copy_(imported.norm.weight.to(module.kv_norm.weight.dtype))


@contextlib.contextmanager
def cycled(module, d: int):
    """Gate cycling on a real DeepSeek-V4 compressor: roll its slot biases by d phases, B[i] <- B[(i-d) mod S]
    (the gate map is shared by the slots, so the bias is the only slot-specific gate parameter); restored on exit.
    The paper's prediction: A_d(r) = A_0((r-d) mod S)."""
    original = module.position_bias.detach().clone()
    with torch.no_grad():
        module.position_bias.copy_(torch.roll(original, shifts=d, dims=0))
    try:
        yield module
    finally:
        with torch.no_grad():
            module.position_bias.copy_(original)


def compressors(hf_model) -> list[tuple[int, str, nn.Module]]:
    """(layer, kind, module) of every compressor of a transformers DeepSeek-V4 model: CSA, its indexer, HCA."""
    model = getattr(hf_model, "model", hf_model)
    out = []
    for layer, block in enumerate(model.layers):
        comp = block.self_attn.compressor
        if comp is None:
            continue
        out.append((layer, compressor_kind(comp), comp))
        if hasattr(comp, "indexer"):
            out.append((layer, "indexer", comp.indexer))
    return out


__all__ = ["DeepseekV4Compressor", "EntryNorm", "KINDS", "compressor_config", "compressor_kind", "compressors",
           "cycled", "export_compressor", "import_compressor", "interleaved_rope", "overlapping"]
