"""`ModelConfig`: one flat dataclass for every model phasefix builds; named presets are YAML data in conf/model/."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from phasefix import kernels
from phasefix.errors import check, check_choice, check_group_keys
from phasefix.paths import CONF_DIR

ATTENTION = ("full", "compressed")
LOCAL_MEMORY = ("window", "tail")
GATE = ("scalar", "vector", "uniform")
PAYLOAD_INIT = ("independent", "shared", "auto")
ATTN_IMPL = (*kernels.IMPLS, "auto")  # auto: triton on CUDA, blocked elsewhere
HEAD_OFFSETS = ("none", "spread")  # or an explicit list [d_0, ..., d_{HKV-1}]
# per-layer grid offsets by rule (or an explicit list, cycled over layers), layer l of L with stride S_l:
# stagger: floor(l S_l / L); half: S_l // 2 on odd layers (LongLoRA's S2 shift across depth); coprime: l k mod S_l,
# k the smallest integer >= max(1, S_l // L) coprime to S_l (the stagger's spacing made coprime, arXiv 2606.28560)
GRID_OFFSETS = ("none", "stagger", "half", "coprime")
SLIDING = "none"  # a layer_compression entry: no compressor, the local window only
LAYER_COMPRESSION_RULE = ("must be a list of 'W/S' (window/stride, W >= S >= 1) or 'none' (local window only), "
                          "cycled over layers, e.g. [8/4,16/16,none]")


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
    # per-layer (window, stride): a pattern cycled over layers like grid_offsets, each entry "W/S" (or [W, S]) or
    # "none" (no compressor: the local window only); [] = every layer model.window/model.stride. With a pattern,
    # model.window and model.stride are not read by any layer; the phase is measured mod `phase_stride`
    layer_compression: Any = field(default_factory=list)  # list[str]; Any: entries may be lists
    # per-layer shift of the window grid: a list (cycled over layers, layer l's entry in [0, S_l)) or a rule of
    # GRID_OFFSETS (none, stagger, half, coprime); Any: OmegaConf structured configs reject unions of containers
    grid_offsets: Any = field(default_factory=list)
    # per-KV-head shift of the grid inside a layer: none (all 0), spread (head h: floor(h S / HKV)) or a list of HKV
    # offsets in [0, S); a head's offset in layer l is (grid_offset(l) + d_h) mod S (the grid repeats every S)
    head_offsets: Any = "none"  # str | list[int]; Any: OmegaConf structured configs reject unions of containers
    # K: each token's compressor input also sees its K-1 predecessors (a causal depthwise convolution of width K,
    # initialised to the identity); 0 = off. Bridges the boundary phase: slot 0 then carries token jS-1 too
    token_shift: int = 0
    # b: each entry also pools the b tokens before its window, each with the payload and gate maps of the slot it
    # has in the previous window (Boundary Bridge Attention's zero-parameter edges across the boundary, arXiv
    # 2606.02680; docs/mitigations.md): no parameters, entries or bytes, and no new slot products to compute; 0 = off
    boundary_bridge: int = 0
    # the attention implementation (phasefix/kernels/): naive (dense, O(T^2): tests), blocked (CPU), triton, auto
    attn_impl: str = "blocked"
    query_block: int = 128  # queries per block of the blocked path (bounds memory at long T)

    def __post_init__(self):
        self.validate()

    # ---- validation: one clear line per bad value, before any work starts ----
    def shared_payload_init(self, window: int | None = None) -> bool:
        """Whether a compressor of `window` slots (model.window by default) starts with one payload draw for all."""
        return self.payload_init == "shared" or (self.payload_init == "auto" and (window or self.window) >= 8)

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
        self._validate_layer_compression()
        self._validate_grid_offsets()
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
        check(isinstance(self.boundary_bridge, int) and not isinstance(self.boundary_bridge, bool)
              and 0 <= self.boundary_bridge <= min(self.layer_strides(), default=0),
              "model.boundary_bridge", self.boundary_bridge,
              f"must be an integer in [0, S] for every compressed layer's stride S ({self.layer_strides()})")
        if self.attention == "full":
            check(self.layer_compression == [], "model.layer_compression", self.layer_compression,
                  "per-layer compression is only available with model.attention='compressed'")
            check(not self.attention_sink, "model.attention_sink", self.attention_sink,
                  "the attention sink is only available with model.attention='compressed'")
            check(self.token_shift == 0, "model.token_shift", self.token_shift,
                  "the token shift is only available with model.attention='compressed'")
            check(self.head_offsets == "none", "model.head_offsets", self.head_offsets,
                  "head offsets are only available with model.attention='compressed'")

    def _validate_layer_compression(self) -> None:
        pattern = [] if self.layer_compression is None else self.layer_compression
        check(not isinstance(pattern, str) and hasattr(pattern, "__iter__"), "model.layer_compression", pattern,
              LAYER_COMPRESSION_RULE)
        self.layer_compression = [_layer_entry(e, pattern) for e in pattern]
        check(not pattern or self.layer_strides() or not self.compressed, "model.layer_compression", list(pattern),
              "needs at least one compressed layer ('W/S'); for the local window alone use model.attention=full")

    def _validate_grid_offsets(self) -> None:
        offsets = self.grid_offsets
        if offsets is None:
            offsets = []
        if isinstance(offsets, str):
            check_choice("model.grid_offsets", offsets, GRID_OFFSETS)
            self.grid_offsets = offsets
            return
        offsets = list(offsets)
        ok = all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        if ok and offsets and self.compressed:  # layer l's offset against layer l's stride
            ok = all(offsets[l % len(offsets)] < shape[1] for l, shape in enumerate(self.layer_shapes()) if shape)
        check(ok, "model.grid_offsets", offsets, f"must be one of {', '.join(GRID_OFFSETS)} or a list of integers "
              f"cycled over layers, layer l's in [0, S_l) (the layers' strides: {self.layer_strides()})")
        self.grid_offsets = offsets

    # ---- derived ----
    @property
    def rope_width(self) -> int:
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def compressed(self) -> bool:
        return self.attention == "compressed"

    def layer_shape(self, layer: int) -> tuple[int, int] | None:
        """(window, stride) of a layer's compressor, None for a layer without one (full attention, or a 'none'
        entry of layer_compression: the local window only)."""
        if not self.compressed:
            return None
        if not self.layer_compression:
            return self.window, self.stride
        entry = self.layer_compression[layer % len(self.layer_compression)]
        return None if entry == SLIDING else tuple(int(x) for x in entry.split("/"))

    def layer_shapes(self) -> list[tuple[int, int] | None]:
        return [self.layer_shape(layer) for layer in range(self.num_layers)]

    def layer_strides(self) -> list[int]:
        """The stride of every compressed layer, in layer order."""
        return [shape[1] for shape in self.layer_shapes() if shape]

    @property
    def phase_stride(self) -> int:
        """The period of the phase: the least common multiple of the compressed layers' strides (model.stride
        without a per-layer pattern); the evaluation folds residues onto phases mod this."""
        return math.lcm(*self.layer_strides()) if self.compressed and self.layer_strides() else self.stride

    def shape_tags(self) -> dict:
        """The run's window and stride as its tags and summary fields: the per-layer pattern joined
        ('8/4,16/16,none') and the phase stride when there is one, else model.window and model.stride."""
        if self.compressed and self.layer_compression:
            return {"window": ",".join(self.layer_compression), "stride": self.phase_stride}
        return {"window": self.window, "stride": self.stride}

    def grid_offset(self, layer: int) -> int:
        shape = self.layer_shape(layer)
        if shape is None:
            return 0
        S, L, rule = shape[1], self.num_layers, self.grid_offsets
        if not isinstance(rule, str):
            return rule[layer % len(rule)] if rule else 0
        if rule == "stagger":
            return layer * S // L
        if rule == "half":
            return (layer % 2) * (S // 2)
        if rule == "coprime":
            k = max(1, S // L)
            while math.gcd(k, S) != 1:
                k += 1
            return layer * k % S
        return 0

    def head_grid_offsets(self, layer: int) -> list[int]:
        """The grid offset of every KV head in a layer: (grid_offset(layer) + d_h) mod S. Offsets d and d + S give
        the same windows (entry j of one is entry j+1 of the other), so taking the sum mod S changes no window."""
        shape = self.layer_shape(layer)
        S, HKV = shape[1] if shape else self.stride, self.num_kv_heads
        if self.head_offsets == "spread":
            heads = [h * S // HKV for h in range(HKV)]
        elif self.head_offsets == "none":
            heads = [0] * HKV
        else:
            heads = list(self.head_offsets)
        return [(self.grid_offset(layer) + d) % S for d in heads]

    # ---- cost (for report tables; formulas in docs/mitigations.md), summed over the compressed layers ----
    def cache_entries_per_token(self) -> float:
        """Compressed cache entries written per token, summed over layers and KV heads: HKV / S_l per compressed
        layer (an entry is one key vector and one value vector of head_dim, one vector when tied). 0 for full
        attention; a layer without a compressor writes none (its local window is a constant, not per token)."""
        return sum(self.num_kv_heads / S for S in self.layer_strides())

    def compressor_flops_per_token(self) -> float:
        """Multiply-adds of the compressors per token, summed over layers: each token fills W_l/S_l slots on average
        and each slot applies its payload map (C x HKV*D) and gate map (C x HKV, or C x HKV*D for vector gates) per
        branch (key, and value unless tied); the token shift adds K*C (one conv per layer, shared by the branches).
        The boundary bridge adds none: a bridged token's slot products are the ones its own window computed. The
        pooling's weighted sum (HKV*D per slot and branch) and the softmax are left out (under 1%)."""
        C, HKV, D = self.hidden_size, self.num_kv_heads, self.head_dim
        branches = 1 if self.tied_kv else 2
        per_slot = branches * C * (HKV * D + self._gate_width)
        return sum(W / S * per_slot + self.token_shift * C for W, S in filter(None, self.layer_shapes()))

    def compressor_params(self) -> int:
        """Parameters of the compressors, summed over layers: per branch W_l payload maps (C x HKV*D), W_l gate maps
        (C x gate width) and W_l gate biases; plus the token shift's K x C mix (the boundary bridge adds none)."""
        C, HKV, D = self.hidden_size, self.num_kv_heads, self.head_dim
        branches = 1 if self.tied_kv else 2
        total = 0
        for W, _ in filter(None, self.layer_shapes()):
            gate = 0 if self.gate == "uniform" else W * C * self._gate_width + (W * self._gate_width
                                                                                 if self.gate_bias else 0)
            total += branches * (W * C * HKV * D + gate) + self.token_shift * C
        return total

    @property
    def _gate_width(self) -> int:
        return {"scalar": self.num_kv_heads, "vector": self.num_kv_heads * self.head_dim, "uniform": 0}[self.gate]

    # ---- presets ----
    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        check_group_keys("model", d, {f.name for f in dataclasses.fields(cls)})
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


def _layer_entry(entry, pattern) -> str:
    """One layer_compression entry as 'W/S' or 'none', from 'W/S', [W, S] or 'none'."""
    if isinstance(entry, str) and entry.strip().lower() == SLIDING:
        return SLIDING
    parts = entry.split("/") if isinstance(entry, str) else list(entry) if hasattr(entry, "__iter__") else []
    try:
        W, S = (int(str(p).strip()) for p in parts) if len(parts) == 2 else (0, 0)
    except ValueError:
        W, S = 0, 0
    check(1 <= S <= W, "model.layer_compression", list(pattern), LAYER_COMPRESSION_RULE)
    return f"{W}/{S}"


def cache_entries_per_token(cfg: ModelConfig) -> float:
    """Compressed cache entries per token over all layers and KV heads (`ModelConfig.cache_entries_per_token`)."""
    return cfg.cache_entries_per_token()


def compressor_flops_per_token(cfg: ModelConfig) -> float:
    """Compressor multiply-adds per token over all layers (`ModelConfig.compressor_flops_per_token`)."""
    return cfg.compressor_flops_per_token()


def preset_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
