"""An independent, deliberately plain float64 oracle of `CompressedQwen3` (science.md §2), for the tests only.
The attention implementations (phasefix/kernels/) are tested against
`phasefix/kernels/compressed_attention/naive.py` (a dense masked softmax); this loop formulation of the whole model
checks that reference in turn (test_model.py).

It shares no code with `phasefix.model` or `phasefix.kernels`: it reads the model's parameters by name and recomputes
the logits with its own RMSNorm, its own RoPE (rotate-half on the last `rope_dims` dims of each head), its own pooling
loop over windows and slots and its own attention loop over queries and heads, straight from the definitions:

- window j ends at token (j+1)S-1-d and starts at (j+1)S-W-d (d = the layer's grid offset, 0 in the paper);
  slots before position 0 get zero weight (they are left out of the slot softmax);
- s_{j,i} = Z_i h_{j,i} + b_i; a = softmax over the filled slots (per channel for vector gates, 1/W for uniform);
  K_j = sum_i a_{j,i} C_i h_{j,i}, values with their own gate and payload unless tied;
- entry j is visible to the query at t iff j < floor((t+1+d)/S), i.e. iff its window has ended at or before t;
- raw keys of query t: the tokens (t-L, t] ("window") or the tokens after the last visible window ("tail");
- compressed keys get RoPE at position jS-d; one softmax over raw keys, visible entries and the sink logit;
- token shift K: the compressor reads h'_t = sum_k w_k h_{t-K+1+k} (zeros before position 0) instead of h_t;
- per-layer shape (`layer_compression`): each layer has its own W and S, read from the pattern here; a 'none' layer
  has no entries and sees its raw local window (t-L, t] only;
- boundary bridge b: entry j also pools the b tokens before its window, token (start - b + k) with the maps of slot
  S-b+k (the slot it has in the previous window);
- head offsets: KV head g has its own grid, offset layer + head offset (not reduced mod S here: the windows are
  enumerated by their last token e = S-1-d (mod S), e >= 0, so offsets d and d+S give the same windows by
  construction); everything above (windows, visibility, tail, entry RoPE position e+1-S = jS-d) is per head.
"""
from __future__ import annotations

import math

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Over the last dim; weight None = no norm at all (qk_norm off)."""
    if weight is None:
        return x
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, pos: int, width: int, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of one vector x [D] at integer position pos, on its last `width` dims.

    The inverse frequencies are rounded to float32 (as Hugging Face and phasefix store them); everything else is
    float64."""
    if width == 0:
        return x.clone()
    D = x.shape[-1]
    half = width // 2
    out = x.clone()
    rot = x[D - width:]
    for k in range(half):
        inv_freq = float(torch.tensor(1.0 / theta ** (2 * k / width), dtype=torch.float32))
        angle = pos * inv_freq
        c, s = math.cos(angle), math.sin(angle)
        a, b = rot[k], rot[k + half]
        out[D - width + k] = a * c - b * s
        out[D - width + k + half] = b * c + a * s
    return out


def token_shift(h: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """h'_t = sum_k w[k] * h[t-K+1+k] over the positions >= 0; h [T, C], w [K, C] (None: no shift)."""
    if w is None:
        return h
    K, T = w.shape[0], h.shape[0]
    out = torch.zeros_like(h)
    for t in range(T):
        for k in range(K):
            s = t - K + 1 + k
            if s >= 0:
                out[t] = out[t] + w[k] * h[s]
    return out


def _pool(cfg, P: dict, branch: str, h: torch.Tensor, end: int, k_norm_w, post_norm_applies: bool, W: int,
          S: int):
    """The entry of the window ending at token `end`, one branch: [HKV, D] (every head pooled on this window; the
    caller keeps the heads whose grid it is), from the compressor's input h [T, C]."""
    HKV, D, b = cfg.num_kv_heads, cfg.head_dim, getattr(cfg, "boundary_bridge", 0)
    start = end - W + 1
    slots = [(start - b + k, S - b + k) for k in range(b)] + [(start + i, i) for i in range(W)]  # (token, maps)
    payloads, logits = [], []
    for p, i in slots:
        if p < 0:  # a slot before position 0: zero weight
            continue
        c = (h[p] @ P[f"{branch}_payload"][i]).view(HKV, D)
        if post_norm_applies:
            c = rmsnorm(c, k_norm_w, cfg.rms_norm_eps)
        if cfg.gate == "uniform":
            s = torch.zeros(HKV, 1, dtype=h.dtype)
        else:
            s = h[p] @ P[f"{branch}_gate"][i]
            if cfg.gate_bias:
                s = s + P[f"{branch}_gate_bias"][i]
            s = s.view(HKV, -1)  # [HKV, 1] scalar, [HKV, D] vector
        s = s + P[f"{branch}_slot_prior"][i].view(HKV, 1)
        payloads.append(c)
        logits.append(s.expand(HKV, D))
    s = torch.stack(logits)  # [filled slots, HKV, D]
    a = torch.exp(s - s.max(0).values)
    a = a / a.sum(0)
    return (a * torch.stack(payloads)).sum(0)


def layer_shape(cfg, layer: int):
    """(W, S) of a layer, None for a 'none' layer (the local window only), from the pattern as written."""
    pattern = getattr(cfg, "layer_compression", None) or [f"{cfg.window}/{cfg.stride}"]
    entry = pattern[layer % len(pattern)]
    return None if entry == "none" else tuple(int(x) for x in entry.split("/"))


def attention_layer(cfg, P: dict, h: torch.Tensor, d, shape=None) -> torch.Tensor:
    """One attention layer on the normed hidden states h [T, C] (float64) -> [T, C]; d: the grid offset, an int
    or one per KV head; shape: the layer's (W, S) (default the model's), None with a compressed model: no entries."""
    T = h.shape[0]
    H, HKV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    W, S = shape or (cfg.window, cfg.stride)
    compressed = cfg.attention == "compressed" and shape is not None
    G = H // HKV
    width = D if cfg.rope_dims is None else cfg.rope_dims
    qn = P.get("q_norm.weight") if cfg.qk_norm else None
    kn = P.get("k_norm.weight") if cfg.qk_norm else None
    scale = 1.0 / math.sqrt(D)

    q = [[None] * H for _ in range(T)]
    k = [[None] * HKV for _ in range(T)]
    v = [[None] * HKV for _ in range(T)]
    for t in range(T):
        qt = (P["q_proj.weight"] @ h[t]).view(H, D)
        kt = (P["k_proj.weight"] @ h[t]).view(HKV, D)
        vt = (P["v_proj.weight"] @ h[t]).view(HKV, D)
        for hh in range(H):
            q[t][hh] = rope(rmsnorm(qt[hh], qn, cfg.rms_norm_eps), t, width, cfg.rope_theta)
        for g in range(HKV):
            k[t][g] = rope(rmsnorm(kt[g], kn, cfg.rms_norm_eps), t, width, cfg.rope_theta)
            v[t][g] = vt[g]

    # compressed entries, per KV head: every window of its grid that has ended inside the sequence
    ds = list(d) if isinstance(d, (list, tuple)) else [d] * HKV
    entries_k = [[] for _ in range(HKV)]  # [KV head][entry] -> [D]
    entries_v = [[] for _ in range(HKV)]
    ends = [[] for _ in range(HKV)]
    if compressed:
        hc = token_shift(h, P.get("token_shift"))
        for g in range(HKV):
            end = (S - 1 - ds[g]) % S  # the first window end at or after position 0
            while end <= T - 1:
                kj = _pool(cfg, P, "key", hc, end, kn, cfg.post_norm and kn is not None, W, S)
                if not cfg.post_norm:
                    kj = rmsnorm(kj, kn, cfg.rms_norm_eps)
                kj = rope(kj[g], end + 1 - S, width, cfg.rope_theta)
                vj = kj if cfg.tied_kv else _pool(cfg, P, "value", hc, end, kn, False, W, S)[g]
                entries_k[g].append(kj)
                entries_v[g].append(vj)
                ends[g].append(end)
                end += S

    sink = P.get("sink")
    out = torch.zeros(T, H * D, dtype=h.dtype)
    for t in range(T):
        for hh in range(H):
            g = hh // G
            visible = [j for j in range(len(ends[g])) if ends[g][j] <= t]  # its window is complete
            if compressed:  # the formula, less the windows that end before position 0
                assert len(visible) == (t + 1 + ds[g]) // S - ds[g] // S
            if cfg.attention == "full":
                raw = list(range(0, t + 1))
            elif cfg.local_memory == "window" or not compressed:
                raw = [s for s in range(t - cfg.local_window + 1, t + 1) if s >= 0]
            else:  # the uncompressed tail: tokens after the end of the head's last visible window
                first = ends[g][visible[-1]] + 1 if visible else 0
                raw = list(range(first, t + 1))
            logits, values = [], []
            for s in raw:
                logits.append((q[t][hh] @ k[s][g]) * scale)
                values.append(v[s][g])
            for j in visible:
                logits.append((q[t][hh] @ entries_k[g][j]) * scale)
                values.append(entries_v[g][j])
            if sink is not None:
                logits.append(sink[hh])
                values.append(torch.zeros(D, dtype=h.dtype))
            logits = torch.stack(logits)  # 0-d tensors all along, so the oracle is differentiable too
            w = torch.exp(logits - logits.max().detach())
            out[t, hh * D:(hh + 1) * D] = (w / w.sum()) @ torch.stack(values)
    return out @ P["o_proj.weight"].T


def logits(model, input_ids: torch.Tensor, params: dict | None = None) -> torch.Tensor:
    """Oracle logits [B, T, V] (float64) of a `CompressedQwen3` for input_ids [B, T]. `params` {state-dict name:
    tensor} replaces some of the model's values, e.g. float64 leaves that require grad, to differentiate the oracle."""
    cfg = model.config
    sd = {name: t.detach().to(torch.float64) for name, t in model.state_dict().items()}
    sd.update(params or {})
    eps = cfg.rms_norm_eps
    batches = []
    for ids in input_ids:
        x = sd["embed_tokens.weight"][ids]  # [T, C]
        for layer in range(cfg.num_layers):
            pre = f"layers.{layer}."
            P = {n[len(pre + "attn."):].replace("compressor.", ""): t for n, t in sd.items()
                 if n.startswith(pre + "attn.")}
            shape = layer_shape(cfg, layer)
            S = shape[1] if shape else cfg.stride
            offsets = cfg.grid_offsets
            if offsets == "stagger":  # the rules of GRID_OFFSETS (phasefix.model.config), written out
                d = layer * S // cfg.num_layers
            elif offsets == "half":
                d = S // 2 if layer % 2 else 0
            elif offsets == "coprime":
                k = next(k for k in range(max(1, S // cfg.num_layers), S + 1) if math.gcd(k, S) == 1)
                d = layer * k % S
            else:
                d = offsets[layer % len(offsets)] if offsets and offsets != "none" else 0
            heads = getattr(cfg, "head_offsets", "none")
            if heads == "spread":
                heads = [g * S // cfg.num_kv_heads for g in range(cfg.num_kv_heads)]
            elif heads in ("none", None):
                heads = [0] * cfg.num_kv_heads
            d = [d + x for x in heads]  # not reduced mod S: see the module docstring
            x = x + attention_layer(cfg, P, rmsnorm(x, sd[pre + "input_norm.weight"], eps), d, shape)
            h = rmsnorm(x, sd[pre + "post_attn_norm.weight"], eps)
            gate = h @ sd[pre + "mlp.gate_proj.weight"].T
            up = h @ sd[pre + "mlp.up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ sd[pre + "mlp.down_proj.weight"].T
        x = rmsnorm(x, sd["norm.weight"], eps)
        lm = sd["embed_tokens.weight"] if cfg.tie_embeddings else sd["lm_head.weight"]
        batches.append(x @ lm.T)
    return torch.stack(batches)
