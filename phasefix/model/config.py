"""`ModelConfig`: one flat dataclass for every model phasefix builds; named presets are YAML data in conf/model/."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from phasefix import kernels
from phasefix.errors import ConfigError, check, check_choice
from phasefix.paths import CONF_DIR

ATTENTION = ("full", "compressed")
LOCAL_MEMORY = ("window", "tail")
GATE = ("scalar", "vector", "uniform")
PAYLOAD_INIT = ("independent", "shared", "auto")
ATTN_IMPL = (*kernels.IMPLS, "auto")  # auto: triton on CUDA, blocked elsewhere
HEAD_OFFSETS = ("none", "spread")  # or an explicit list [d_0, ..., d_{HKV-1}]


@dataclass
class ModelConfig:
    """A Qwen3 decoder whose attention is `full` or chunked-`compressed` (science.md §2)."""

    name: str = "custom"
    # backbone (Qwen3)
    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    init_std: float = 0.02
    # attention
    attention: str = "compressed"
    window: int = 4  # W: tokens pooled into one entry
    stride: int = 4  # S: a new window starts every S tokens; phase = t mod S
    local_memory: str = "window"  # raw keys: a local window, or the uncompressed "tail"
    local_window: int = 16
    gate: str = "scalar"  # scalar: one logit per slot and KV head; vector: one per channel; uniform: a = 1/W
    gate_bias: bool = True  # per-slot gate bias b_i
    gate_init_std: float = 0.02  # std of the gate weights Z_i (biases start at zero)
    # per-slot payload maps C_i start as independent draws, or as one draw copied to every slot (they stay
    # separate parameters and differentiate in training; a key then reads the same from any slot at the start);
    # auto: shared for windows of 8 slots or more, independent below (what learns fastest on the CPU, README)
    payload_init: str = "independent"
    tied_kv: bool = False  # values reuse the normalised, rotated compressed keys
    post_norm: bool = False  # K/V norm on each slot's payload (after the payload map) instead of on the pooled entry
    qk_norm: bool = True
    rope_dims: int | None = None  # None: all head dims; 0: no RoPE; else RoPE on the last `rope_dims` dims
    attention_sink: bool = False  # a learnable per-head logit joins the softmax denominator
    grid_offsets: list[int] = field(default_factory=list)  # per-layer shift of the window grid (cycled over layers)
    # per-KV-head shift of the grid inside a layer: none (all 0), spread (head h: floor(h S / HKV)) or a list of HKV
    # offsets in [0, S); a head's offset in layer l is (grid_offset(l) + d_h) mod S (the grid repeats every S)
    head_offsets: Any = "none"  # str | list[int]; Any: OmegaConf structured configs reject unions of containers
    # K: each token's compressor input also sees its K-1 predecessors (a causal depthwise convolution of width K,
    # initialised to the identity); 0 = off. Bridges the boundary phase: slot 0 then carries token jS-1 too
    token_shift: int = 0
    # the attention implementation (phasefix/kernels/): naive (dense, O(T^2): tests), blocked (CPU), triton, auto
    attn_impl: str = "blocked"
    query_block: int = 128  # queries per block of the blocked path (bounds memory at long T)

    def __post_init__(self):
        self.validate()

    # ---- validation: one clear line per bad value, before any work starts ----
    @property
    def shared_payload_init(self) -> bool:
        return self.payload_init == "shared" or (self.payload_init == "auto" and self.window >= 8)

    def validate(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "query_block"):
            value = getattr(self, key)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"model.{key}", value,
                  "must be an integer >= 1")
        check(self.num_heads % self.num_kv_heads == 0, "model.num_heads", self.num_heads,
              f"must be divisible by model.num_kv_heads ({self.num_kv_heads})")
        check_choice("model.attention", self.attention, ATTENTION)
        check_choice("model.local_memory", self.local_memory, LOCAL_MEMORY)
        check_choice("model.gate", self.gate, GATE)
        check_choice("model.payload_init", self.payload_init, PAYLOAD_INIT)
        if self.attn_impl == "torch":  # the blocked path's earlier name (stored configs use it)
            self.attn_impl = "blocked"
        check_choice("model.attn_impl", self.attn_impl, ATTN_IMPL)
        check(isinstance(self.stride, int) and self.stride >= 1, "model.stride", self.stride,
              "must be an integer >= 1")
        check(isinstance(self.window, int) and self.window >= self.stride, "model.window", self.window,
              f"must be an integer >= model.stride ({self.stride})")
        check(isinstance(self.local_window, int) and self.local_window >= 1, "model.local_window",
              self.local_window, "must be an integer >= 1")
        if self.rope_dims is not None:
            check(isinstance(self.rope_dims, int) and 0 <= self.rope_dims <= self.head_dim
                  and self.rope_dims % 2 == 0, "model.rope_dims", self.rope_dims,
                  f"must be null (all dims), 0 (no RoPE) or an even integer <= model.head_dim ({self.head_dim})")
        check(self.head_dim % 2 == 0, "model.head_dim", self.head_dim, "must be even (RoPE rotates pairs)")
        check(self.rope_theta > 0, "model.rope_theta", self.rope_theta, "must be > 0")
        offsets = list(self.grid_offsets or [])
        check(all(isinstance(o, int) and 0 <= o < self.stride for o in offsets), "model.grid_offsets", offsets,
              f"must be a list of integers in [0, model.stride={self.stride})")
        self.grid_offsets = offsets
        check(isinstance(self.token_shift, int) and not isinstance(self.token_shift, bool) and self.token_shift >= 0,
              "model.token_shift", self.token_shift, "must be an integer >= 0 (0 = off, K = a causal mix of K tokens)")
        if self.head_offsets is None:
            self.head_offsets = "none"
        if not isinstance(self.head_offsets, str) and hasattr(self.head_offsets, "__iter__"):  # list, ListConfig
            offsets = list(self.head_offsets)
            check(len(offsets) == self.num_kv_heads and all(
                isinstance(o, int) and not isinstance(o, bool) and 0 <= o < self.stride for o in offsets),
                "model.head_offsets", offsets, f"must be 'none', 'spread' or a list of model.num_kv_heads="
                f"{self.num_kv_heads} integers in [0, model.stride={self.stride})")
            self.head_offsets = offsets
        else:
            check(self.head_offsets in HEAD_OFFSETS, "model.head_offsets", self.head_offsets,
                  f"must be 'none', 'spread' or a list of model.num_kv_heads={self.num_kv_heads} integers in "
                  f"[0, model.stride={self.stride})")
        if self.attention == "full":
            check(not self.attention_sink, "model.attention_sink", self.attention_sink,
                  "the attention sink is only available with model.attention='compressed'")
            check(self.token_shift == 0, "model.token_shift", self.token_shift,
                  "the token shift is only available with model.attention='compressed'")
            check(self.head_offsets == "none", "model.head_offsets", self.head_offsets,
                  "head offsets are only available with model.attention='compressed'")

    # ---- derived ----
    @property
    def rope_width(self) -> int:
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def compressed(self) -> bool:
        return self.attention == "compressed"

    def grid_offset(self, layer: int) -> int:
        return self.grid_offsets[layer % len(self.grid_offsets)] if self.grid_offsets else 0

    def head_grid_offsets(self, layer: int) -> list[int]:
        """The grid offset of every KV head in a layer: (grid_offset(layer) + d_h) mod S. Offsets d and d + S give
        the same windows (entry j of one is entry j+1 of the other), so taking the sum mod S changes no window."""
        S, HKV = self.stride, self.num_kv_heads
        if self.head_offsets == "spread":
            heads = [h * S // HKV for h in range(HKV)]
        elif self.head_offsets == "none":
            heads = [0] * HKV
        else:
            heads = list(self.head_offsets)
        return [(self.grid_offset(layer) + d) % S for d in heads]

    # ---- cost (for report tables; formulas in docs/mitigations.md) ----
    def cache_entries_per_token(self) -> float:
        """Compressed cache entries written per token, summed over layers and KV heads: num_layers * HKV / S (an
        entry is one key vector and one value vector of head_dim, one vector when tied). 0 for full attention."""
        return self.num_layers * self.num_kv_heads / self.stride if self.compressed else 0.0

    def compressor_flops_per_token(self) -> float:
        """Multiply-adds of the compressors per token, summed over layers: each token fills W/S slots on average and
        each slot applies its payload map (C x HKV*D) and gate map (C x HKV, or C x HKV*D for vector gates) per
        branch (key, and value unless tied); the token shift adds K*C (one conv per layer, shared by the branches).
        The pooling's weighted sum (HKV*D per slot and branch) and the softmax are left out (under 1%)."""
        if not self.compressed:
            return 0.0
        C, HKV, D, W, S = self.hidden_size, self.num_kv_heads, self.head_dim, self.window, self.stride
        branches = 1 if self.tied_kv else 2
        per_slot = branches * C * (HKV * D + self._gate_width)
        return self.num_layers * (W / S * per_slot + self.token_shift * C)

    def compressor_params(self) -> int:
        """Parameters of the compressors, summed over layers: per branch W payload maps (C x HKV*D), W gate maps
        (C x gate width) and W gate biases; plus the token shift's K x C mix."""
        if not self.compressed:
            return 0
        C, HKV, D, W = self.hidden_size, self.num_kv_heads, self.head_dim, self.window
        branches = 1 if self.tied_kv else 2
        gate = 0 if self.gate == "uniform" else W * C * self._gate_width + (W * self._gate_width if self.gate_bias
                                                                              else 0)
        return self.num_layers * (branches * (W * C * HKV * D + gate) + self.token_shift * C)

    @property
    def _gate_width(self) -> int:
        return {"scalar": self.num_kv_heads, "vector": self.num_kv_heads * self.head_dim, "uniform": 0}[self.gate]

    # ---- presets ----
    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"model.{unknown[0]} is not a model key: allowed keys are {', '.join(sorted(known))}")
        return cls(**d)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """A named preset from conf/model/<name>.yaml with overrides, e.g. `from_name("tiny", stride=8)`."""
        presets = preset_names()
        check_choice("model", name, presets)
        from omegaconf import OmegaConf  # presets may interpolate (e.g. window: ${.stride})

        preset = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
        preset.pop("defaults", None)
        merged = OmegaConf.merge(preset, OmegaConf.create(overrides))
        return cls.from_dict(OmegaConf.to_container(merged, resolve=True))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cache_entries_per_token(cfg: ModelConfig) -> float:
    """Compressed cache entries per token over all layers and KV heads (`ModelConfig.cache_entries_per_token`)."""
    return cfg.cache_entries_per_token()


def compressor_flops_per_token(cfg: ModelConfig) -> float:
    """Compressor multiply-adds per token over all layers (`ModelConfig.compressor_flops_per_token`)."""
    return cfg.compressor_flops_per_token()


def preset_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
