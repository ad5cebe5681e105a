"""`ModelConfig`: one flat dataclass for every model phasefix builds; named presets are YAML data in conf/model/."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from phasefix.errors import ConfigError, check, check_choice
from phasefix.paths import CONF_DIR

ATTENTION = ("full", "compressed")
LOCAL_MEMORY = ("window", "tail")
GATE = ("scalar", "vector", "uniform")
PAYLOAD_INIT = ("independent", "shared", "auto")
ATTN_IMPL = ("torch", "triton", "auto")


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
    attn_impl: str = "torch"  # torch (reference), triton (kernels/), auto (triton on CUDA)
    query_block: int = 128  # queries per block in the reference path (bounds memory at long T)

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
        if self.attention == "full":
            check(not self.attention_sink, "model.attention_sink", self.attention_sink,
                  "the attention sink is only available with model.attention='compressed'")

    # ---- derived ----
    @property
    def rope_width(self) -> int:
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def compressed(self) -> bool:
        return self.attention == "compressed"

    def grid_offset(self, layer: int) -> int:
        return self.grid_offsets[layer % len(self.grid_offsets)] if self.grid_offsets else 0

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


def preset_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
