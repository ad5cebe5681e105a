"""A Qwen3 decoder with pluggable attention: `full` or chunked-`compressed` (science.md §2). Math only.

Layout everywhere: [B, T, H, D]. Letters: B batch, T tokens, C width, H query heads, HKV KV heads, D head dim,
W window, S stride, N entries.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from phasefix import kernels
from phasefix.kernels.gated_pool.naive import gated_pool
from phasefix.kernels import window_grid as compression
from phasefix.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))  # upcast half precision, never downcast float64
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE on the last `width` dims of each head (all dims by default, none when width is 0)."""

    def __init__(self, head_dim: int, width: int, theta: float):
        super().__init__()
        self.head_dim, self.width = head_dim, width
        inv_freq = 1.0 / theta ** (torch.arange(0, max(width, 2), 2, dtype=torch.float64) / max(width, 2))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x: [B, T, H, D]; pos: [T] integer positions (may be negative), or [T, H] one per head."""
        if self.width == 0:
            return x
        freqs = pos.to(torch.float32)[..., None] * self.inv_freq  # [T, width/2] or [T, H, width/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [T, (H,) width]
        emb = emb[None, :, None, :] if pos.dim() == 1 else emb[None]  # [1, T, 1|H, width]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        keep, rot = x[..., : self.head_dim - self.width], x[..., self.head_dim - self.width:]
        r1, r2 = rot.chunk(2, dim=-1)
        rot = rot * cos + torch.cat([-r2, r1], dim=-1) * sin
        return torch.cat([keep, rot], dim=-1) if keep.shape[-1] else rot


class Compressor(nn.Module):
    """Pools every window of W tokens into one key entry and one value entry per KV head.

    Slot i of a window has its own gate (Z_i, b_i) and payload map C_i:
        s_{j,i} = Z_i h_{j,i} + b_i,  a_{j,.} = softmax_i s_{j,.},  K_j = sum_i a_{j,i} C_i h_{j,i}
    Values use their own gate and payload unless `tied_kv`. Parameters keep the slot as their first dim, so
    gate cycling is a roll along dim 0.

    Token shift (`token_shift` K > 0): before the windows are cut, each token's input becomes a causal depthwise mix
    of itself and its K-1 predecessors, h'_t = sum_k w_k * h_{t-K+1+k} (per channel; zeros before position 0), one
    mix per compressor shared by the key and value branches, initialised to the identity (w = 1 on the current
    token). It only looks back, so an entry still sees nothing after its window's last token.

    Per-KV-head offsets (`head_offsets`, one grid offset per KV head, default all `grid_offset`): each distinct
    offset cuts its own windows, pooled with the columns of the payload and gate maps of the heads that have it.
    Entries are padded with zeros to the most any head has (a head's extra entries are never visible).

    Per-layer shape (`layer_compression`): the compressor has its layer's window and stride (`window`, `stride`).

    Boundary bridge (`boundary_bridge` b > 0): entry j also pools the b tokens before its window, each with the
    payload and gate maps (and bias) of the slot S-b+k it has in the previous window, so with the same payload and
    logit: b leading slots tied to slots S-b..S-1. No parameters of its own (arXiv 2606.02680's zero-parameter
    boundary edges; docs/mitigations.md). Gate distributions then have W + b slots, the bridged ones first.
    """

    float32_under_autocast = True  # the rule of `forward` (benchmarks patch it off to time the former bf16 one)

    def __init__(self, cfg: ModelConfig, grid_offset: int = 0, head_offsets: list[int] | None = None,
                 window: int | None = None, stride: int | None = None):
        super().__init__()
        self.cfg, self.grid_offset = cfg, grid_offset
        self.window, self.stride = window or cfg.window, stride or cfg.stride  # the layer's (layer_compression)
        self.head_offsets = list(head_offsets) if head_offsets is not None else [grid_offset] * cfg.num_kv_heads
        W, C, HKV, D = self.window, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
        # the parameter slot of every pooled slot: the bridged tokens' (slots S-b..S-1), then the window's
        bridge = cfg.boundary_bridge
        self.slot_maps = list(range(self.stride - bridge, self.stride)) + list(range(W)) if bridge else None
        gate_width = HKV if cfg.gate == "scalar" else HKV * D
        branches = ("key",) if cfg.tied_kv else ("key", "value")
        for b in branches:
            draws = 1 if cfg.shared_payload_init(W) else W
            payload = (torch.randn(draws, C, HKV * D) * cfg.init_std).expand(W, C, HKV * D).clone()
            self.register_parameter(f"{b}_payload", nn.Parameter(payload))
            if cfg.gate != "uniform":
                self.register_parameter(f"{b}_gate", nn.Parameter(torch.randn(W, C, gate_width) * cfg.gate_init_std))
                if cfg.gate_bias:
                    self.register_parameter(f"{b}_gate_bias", nn.Parameter(torch.zeros(W, gate_width)))
            # a fixed additive slot preference per KV head (zero unless a mitigation sets it)
            self.register_buffer(f"{b}_slot_prior", torch.zeros(W, HKV))
        self.branches = branches
        if cfg.token_shift:
            mix = torch.zeros(cfg.token_shift, C)  # [K, C]: row k weighs token t-K+1+k
            mix[-1] = 1.0  # the identity: all weight on the current token
            self.token_shift = nn.Parameter(mix)
        else:
            self.token_shift = None

    def shift(self, x: torch.Tensor) -> torch.Tensor:
        """The token shift: x [B, T, C] -> sum_k w_k x_{t-K+1+k}, a causal depthwise convolution of width K."""
        if self.token_shift is None:
            return x
        K, T = self.token_shift.shape[0], x.shape[1]
        xp = F.pad(x, (0, 0, K - 1, 0))  # [B, K-1+T, C]: zeros before position 0
        return sum(self.token_shift[k] * xp[:, k : k + T] for k in range(K))

    def windows(self, x: torch.Tensor, grid_offset: int | None = None):
        """x: [B, T, C] -> the tokens of every window [B, N, W, C] and the mask of filled slots [N, W], on the grid
        of `grid_offset` (the layer's by default)."""
        d = self.grid_offset if grid_offset is None else grid_offset
        pos = compression.window_positions(x.shape[1], self.window + self.cfg.boundary_bridge, self.stride, d,
                                           x.device)  # the bridged tokens are the first slots of a longer window
        filled = pos >= 0
        xw = x[:, pos.clamp(min=0)] * filled[None, :, :, None].to(x.dtype)  # [B, N, W, C]
        return xw, filled

    def branch(self, b: str, xw: torch.Tensor, filled: torch.Tensor, heads: list[int] | None = None):
        """Payloads [B, N, W, HKV, D] and gate logits [B, N, W, HKV, 1|D] of one branch (of the KV heads `heads`
        only, in that order, when given: HKV is then len(heads))."""
        cfg = self.cfg
        B, N, W, C = xw.shape
        D = cfg.head_dim
        HKV = cfg.num_kv_heads if heads is None else len(heads)

        def cols(p):  # [W, ..., HKV_all * width] -> the columns of `heads`, one row per pooled slot
            p = p if self.slot_maps is None else p[self.slot_maps]
            return p if heads is None else p.unflatten(-1, (cfg.num_kv_heads, -1))[..., heads, :].flatten(-2)

        xs = xw.permute(2, 0, 1, 3).reshape(W, B * N, C)  # [W, B*N, C] slot-major for per-slot maps
        payload = torch.bmm(xs, cols(getattr(self, f"{b}_payload")))  # [W, B*N, HKV*D]
        payload = payload.view(W, B, N, HKV, D).permute(1, 2, 0, 3, 4)  # [B, N, W, HKV, D]
        if cfg.gate == "uniform":
            logits = xw.new_zeros(B, N, W, HKV, 1)
        else:
            logits = torch.bmm(xs, cols(getattr(self, f"{b}_gate")))  # [W, B*N, HKV or HKV*D]
            if cfg.gate_bias:
                logits = logits + cols(getattr(self, f"{b}_gate_bias"))[:, None, :]
            logits = logits.view(W, B, N, HKV, logits.shape[-1] // HKV)  # (not -1: N may be 0)
            logits = logits.permute(1, 2, 0, 3, 4)  # [B, N, W, HKV, 1|D]
        prior = getattr(self, f"{b}_slot_prior")  # [W, HKV_all]
        prior = prior if self.slot_maps is None else prior[self.slot_maps]
        logits = logits + (prior if heads is None else prior[:, heads])[None, None, :, :, None]
        logits = logits.masked_fill(~filled[None, :, :, None, None], float("-inf"))
        return payload, logits

    def forward(self, x: torch.Tensor, k_norm: nn.Module | None, pool=gated_pool):
        """x: [B, T, C] normed hidden states -> pooled keys, values [B, N, HKV, D] (keys normed, not yet rotated)
        and the gate distributions {branch: [B, N, W, HKV]} (averaged over channels for vector gates; with per-head
        offsets only the first N' entries, N' the fewest any head has, so that every row is a real window).
        `pool`: a `gated_pool` of `phasefix.kernels` (the model passes its `attn_impl`'s).

        Under autocast the compressor computes in float32 (autocast off, `x` upcast), as the compressed attention does:
        measured, bf16 slot maps and gate logits kept a compiled coverage_w8s8 run on its retrieval plateau where
        float32 ones learned (docs/performance.md); it is a small share of the step's matmul work."""
        if self.float32_under_autocast and torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self.forward(x.to(torch.promote_types(x.dtype, torch.float32)), k_norm, pool)
        x = self.shift(x)  # [B, T, C]
        groups = compression.offset_groups(self.head_offsets)  # [(d, KV heads)]
        N = compression.num_entries(x.shape[1], self.stride, max(self.head_offsets))
        out, gates = {b: [] for b in self.branches}, {b: [] for b in self.branches}
        for d, heads in groups:
            xw, filled = self.windows(x, d)
            for b in self.branches:
                payload, logits = self.branch(b, xw, filled, None if len(groups) == 1 else heads)
                if b == "key" and k_norm is not None and self.cfg.post_norm:
                    payload = k_norm(payload)
                pooled = pool(payload, logits)  # [B, N_d, |heads|, D]
                out[b].append(F.pad(pooled, (0, 0, 0, 0, 0, N - pooled.shape[1])))  # zero entries, never visible
                gates[b].append(torch.softmax(logits.float(), dim=2).mean(-1))  # [B, N_d, W, |heads|]
        if len(groups) == 1:
            out, gates = {b: o[0] for b, o in out.items()}, {b: g[0] for b, g in gates.items()}
        else:  # back to head order
            order = torch.argsort(torch.tensor([h for _, heads in groups for h in heads], device=x.device))
            n_min = min(g.shape[1] for g in gates[self.branches[0]])
            out = {b: torch.cat(o, dim=2)[:, :, order] for b, o in out.items()}
            gates = {b: torch.cat([gi[:, :n_min] for gi in g], dim=3)[..., order] for b, g in gates.items()}
        k_cmp = out["key"]
        if k_norm is not None and not self.cfg.post_norm:
            k_cmp = k_norm(k_cmp)
        return k_cmp, out.get("value"), gates


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        C, H, HKV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, HKV * D, bias=False)
        self.v_proj = nn.Linear(C, HKV * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rope = RotaryEmbedding(D, cfg.rope_width, cfg.rope_theta)
        shape = cfg.layer_shape(layer)  # (W, S), None: no compressor (full attention, or the local window only)
        self.compressor = Compressor(cfg, cfg.grid_offset(layer), cfg.head_grid_offsets(layer), *shape) \
            if shape else None
        self.sink = nn.Parameter(torch.zeros(H)) if cfg.attention_sink else None
        self.last_gates: dict | None = None  # filled when the model runs with collect_gates=True
        # training only: attend as a layer without a compressor (the local window alone) on this step; the
        # entry_dropout mitigation sets it, eval mode ignores it
        self.drop_entries = False

    def forward(self, x: torch.Tensor, collect_gates: bool = False) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        pos = torch.arange(T, device=x.device)
        q = self.q_proj(x).view(B, T, cfg.num_heads, cfg.head_dim)  # [B, T, H, D]
        k = self.k_proj(x).view(B, T, cfg.num_kv_heads, cfg.head_dim)  # [B, T, HKV, D]
        v = self.v_proj(x).view(B, T, cfg.num_kv_heads, cfg.head_dim)  # [B, T, HKV, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, pos), self.rope(k, pos)
        if not cfg.compressed:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True).transpose(1, 2)
        else:
            ops = kernels.ops(cfg.attn_impl, x.device.type)  # auto: triton on CUDA, blocked elsewhere
            self.last_gates = None
            dropped = self.compressor is None or (self.training and self.drop_entries)
            if self.compressor is not None and (collect_gates or not dropped):  # dropped: pooled only for its gates
                k_cmp, v_cmp, gates = self.compressor(x, self.k_norm, pool=ops.gated_pool)
                self.last_gates = gates if collect_gates else None  # kept when dropped: the gate terms read them
            if dropped:
                # a layer_compression 'none' layer, or one whose entries entry_dropout drops: the local window alone
                none = k.new_zeros(B, 0, cfg.num_kv_heads, cfg.head_dim)
                y = ops.compressed_attention(q, k, v, none, none, stride=cfg.stride, local_window=cfg.local_window,
                                             local_memory="window", sink=self.sink, query_block=cfg.query_block)
            else:
                S = self.compressor.stride
                offs = self.compressor.head_offsets  # one grid offset per KV head
                off = offs[0] if len(set(offs)) == 1 else offs
                k_cmp = self.rope(k_cmp, compression.entry_positions(k_cmp.shape[1], S, off, x.device))
                v_cmp = k_cmp if cfg.tied_kv else v_cmp
                y = compression.by_grid_offset(ops.compressed_attention, q, k, v, k_cmp, v_cmp, grid_offset=off,
                                               stride=S, local_window=cfg.local_window,
                                               local_memory=cfg.local_memory, sink=self.sink,
                                               query_block=cfg.query_block)
        return self.o_proj(y.reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, collect_gates: bool = False):
        x = x + self.attn(self.input_norm(x), collect_gates)
        return x + self.mlp(self.post_attn_norm(x))


class CompressedQwen3(nn.Module):
    """Qwen3 with full or chunked-compressed attention. `forward(input_ids [B, T]) -> logits [B, T, V]`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_std)

    def forward(self, input_ids: torch.Tensor, collect_gates: bool = False) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [B, T, C]
        for block in self.layers:
            x = block(x, collect_gates)
        return self.lm_head(self.norm(x))  # [B, T, V]

    def gates(self) -> list[dict]:
        """Gate distributions {branch: [B, N, W, HKV]} per layer from the last forward with collect_gates=True."""
        return [block.attn.last_gates for block in self.layers]

    def compressors(self) -> list[Compressor]:
        return [block.attn.compressor for block in self.layers if block.attn.compressor is not None]

    @classmethod
    def from_name(cls, name: str, **overrides) -> "CompressedQwen3":
        return cls(ModelConfig.from_name(name, **overrides))

    @classmethod
    def from_hf(cls, model_or_dir, **overrides) -> "CompressedQwen3":
        """Build from a Hugging Face Qwen3 checkpoint (directory or `Qwen3ForCausalLM`); see `hf.py`."""
        from phasefix.model.hf import from_hf

        return from_hf(cls, model_or_dir, **overrides)
