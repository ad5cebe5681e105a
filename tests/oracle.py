"""An independent, deliberately plain float64 oracle of `CompressedQwen3` (science.md §2), for the tests only.

It shares no code with `phasefix.model`: it reads the model's parameters by name and recomputes the logits with
its own RMSNorm, its own RoPE (rotate-half on the last `rope_dims` dims of each head), its own pooling loop over
windows and slots and its own attention loop over queries and heads, straight from the definitions:

- window j ends at token (j+1)S-1-d and starts at (j+1)S-W-d (d = the layer's grid offset, 0 in the paper);
  slots before position 0 get zero weight (they are left out of the slot softmax);
- s_{j,i} = Z_i h_{j,i} + b_i; a = softmax over the filled slots (per channel for vector gates, 1/W for uniform);
  K_j = sum_i a_{j,i} C_i h_{j,i}, values with their own gate and payload unless tied;
- entry j is visible to the query at t iff j < floor((t+1+d)/S), i.e. iff its window has ended at or before t;
- raw keys of query t: the tokens (t-L, t] ("window") or the tokens after the last visible window ("tail");
- compressed keys get RoPE at position jS-d; one softmax over raw keys, visible entries and the sink logit.
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


def _pool(cfg, P: dict, branch: str, h: torch.Tensor, j: int, d: int, k_norm_w, post_norm_applies: bool):
    """Entry j of one branch: [HKV, D], from the normed hidden states h [T, C]."""
    W, S, HKV, D = cfg.window, cfg.stride, cfg.num_kv_heads, cfg.head_dim
    payloads, logits = [], []
    for i in range(W):
        p = (j + 1) * S - W - d + i
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


def attention_layer(cfg, P: dict, h: torch.Tensor, d: int) -> torch.Tensor:
    """One attention layer on the normed hidden states h [T, C] (float64) -> [T, C]."""
    T = h.shape[0]
    H, HKV, D, S, W = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.stride, cfg.window
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

    # compressed entries: every window that has ended inside the sequence
    entries_k, entries_v, ends = [], [], []
    if cfg.attention == "compressed":
        j = 0
        while (j + 1) * S - 1 - d <= T - 1:
            kj = _pool(cfg, P, "key", h, j, d, kn, cfg.post_norm and kn is not None)
            if not cfg.post_norm:
                kj = rmsnorm(kj, kn, cfg.rms_norm_eps)
            kj = torch.stack([rope(kj[g], j * S - d, width, cfg.rope_theta) for g in range(HKV)])
            vj = kj if cfg.tied_kv else _pool(cfg, P, "value", h, j, d, kn, False)
            entries_k.append(kj)
            entries_v.append(vj)
            ends.append((j + 1) * S - 1 - d)
            j += 1

    sink = P.get("sink")
    out = torch.zeros(T, H * D, dtype=h.dtype)
    for t in range(T):
        visible = [j for j in range(len(entries_k)) if j < (t + 1 + d) // S]
        assert all(ends[j] <= t for j in visible)  # the formula and "its window is complete" agree
        if cfg.attention == "full":
            raw = list(range(0, t + 1))
        elif cfg.local_memory == "window":
            raw = [s for s in range(t - cfg.local_window + 1, t + 1) if s >= 0]
        else:  # the uncompressed tail: tokens after the end of the last visible window
            first = ends[visible[-1]] + 1 if visible else 0
            raw = list(range(first, t + 1))
        for hh in range(H):
            g = hh // G
            logits, values = [], []
            for s in raw:
                logits.append(float(q[t][hh] @ k[s][g]) * scale)
                values.append(v[s][g])
            for j in visible:
                logits.append(float(q[t][hh] @ entries_k[j][g]) * scale)
                values.append(entries_v[j][g])
            if sink is not None:
                logits.append(float(sink[hh]))
                values.append(torch.zeros(D, dtype=h.dtype))
            m = max(logits)
            w = [math.exp(x - m) for x in logits]
            z = sum(w)
            out[t, hh * D:(hh + 1) * D] = sum(wi / z * vi for wi, vi in zip(w, values))
    return out @ P["o_proj.weight"].T


def logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Oracle logits [B, T, V] (float64) of a `CompressedQwen3` for input_ids [B, T]."""
    cfg = model.config
    sd = {name: t.detach().to(torch.float64) for name, t in model.state_dict().items()}
    eps = cfg.rms_norm_eps
    batches = []
    for ids in input_ids:
        x = sd["embed_tokens.weight"][ids]  # [T, C]
        for layer in range(cfg.num_layers):
            pre = f"layers.{layer}."
            P = {n[len(pre + "attn."):].replace("compressor.", ""): t for n, t in sd.items()
                 if n.startswith(pre + "attn.")}
            d = cfg.grid_offsets[layer % len(cfg.grid_offsets)] if cfg.grid_offsets else 0
            x = x + attention_layer(cfg, P, rmsnorm(x, sd[pre + "input_norm.weight"], eps), d)
            h = rmsnorm(x, sd[pre + "post_attn_norm.weight"], eps)
            gate = h @ sd[pre + "mlp.gate_proj.weight"].T
            up = h @ sd[pre + "mlp.up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ sd[pre + "mlp.down_proj.weight"].T
        x = rmsnorm(x, sd["norm.weight"], eps)
        lm = sd["embed_tokens.weight"] if cfg.tie_embeddings else sd["lm_head.weight"]
        batches.append(x @ lm.T)
    return torch.stack(batches)
