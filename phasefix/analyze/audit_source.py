"""Where the phase audit's gates come from (`phasefix.analyze.audit`): the bias-only gate of every compressor of
a DeepSeek-V4 checkpoint or a phasefix run (`GateBias`), reading only the compressor tensors from safetensors shards
(FP8 with block scales), and calibration (the gates averaged over hooked forward passes on phase-controlled prompts)."""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from phasefix.errors import ConfigError, check, check_choice

READINGS = ("answer", "slot")  # which gate a phasefix run's bias is read from (audit's reading=)


# ------------------------------------------------------------------------------------------------ gate biases
@dataclasses.dataclass
class GateBias:
    """One compressor's (or one phasefix KV head's) slot biases, read from the weights.

    bias [W, Ch]: the additive gate logit of slot i on channel c; phase [W, Ch]: the phase (t mod S) of the token
    slot i holds; content [W, Ch]: sigma[i, c], the std of the content term for unit-RMS input (None: unknown)."""

    name: str  # "L3/csa", "L3/indexer", "L1/hca"; phasefix "L0/key/h1"
    layer: int
    kind: str
    stride: int  # S: the phase period of this compressor
    bias: torch.Tensor
    phase: torch.Tensor
    content: torch.Tensor | None = None
    main: bool = True  # counts toward the model's prediction with include=main

    @property
    def window(self) -> int:
        return self.bias.shape[0]


def _row_norms(weight: torch.Tensor, norm_weight: torch.Tensor | None) -> torch.Tensor:
    """||g * w_c||_2 for every row c of a [out, C] map: the std of (W x)_c for x = g * u, u unit-RMS i.i.d."""
    w = weight.float()
    if norm_weight is not None:
        w = w * norm_weight.float()[None, :]
    return w.norm(dim=1)


def hf_gate_biases(tensors: Mapping[str, torch.Tensor], config) -> list[GateBias]:
    """The slot biases of every DeepSeek-V4 compressor from its tensors, named as transformers names them without
    the `model.` prefix (`layers.{i}.self_attn.compressor[.indexer].position_bias`, `...gate_proj.weight`,
    `layers.{i}.input_layernorm.weight`; `normalise_name` maps the original checkpoints' names).

    CSA / indexer: position_bias [S, 2D]; slot i < S (block w-1) uses row i of the first half, slot S + i (block w)
    row i of the second half, both at phase i -> bias [2S, D]. HCA: position_bias [S, D], slot i at phase i."""
    out = []
    rates = config.compress_rates
    for layer, layer_type in enumerate(config.layer_types):
        if layer_type == "sliding_attention":
            continue
        p = f"layers.{layer}.self_attn.compressor."
        g = tensors.get(f"layers.{layer}.input_layernorm.weight")
        parts = [("csa", p, config.head_dim), ("indexer", p + "indexer.", config.index_head_dim)] \
            if layer_type == "compressed_sparse_attention" else [("hca", p, config.head_dim)]
        for kind, prefix, D in parts:
            S = int(rates[layer_type])
            if prefix + "position_bias" not in tensors:
                raise ConfigError(f"model={prefix + 'position_bias'!r} is invalid: the checkpoint has no slot bias for "
                                  f"layer {layer} ({layer_type})")
            b = tensors[prefix + "position_bias"].float()  # [S, 2D] or [S, D]
            gate = tensors.get(prefix + "gate_proj.weight")
            sigma = None if gate is None else _row_norms(gate, g)  # [2D] or [D]
            if kind == "hca":
                bias, phase = b, torch.arange(S)[:, None].expand(S, D)
                content = None if sigma is None else sigma[None, :].expand(S, D)
            else:
                bias = torch.cat([b[:, :D], b[:, D:]], dim=0)  # [2S, D]
                phase = (torch.arange(2 * S) % S)[:, None].expand(2 * S, D)
                content = None if sigma is None else torch.cat([sigma[None, :D].expand(S, D),
                                                                sigma[None, D:].expand(S, D)], dim=0)
            out.append(GateBias(f"L{layer}/{kind}", layer, kind, S, bias, phase.clone(),
                                None if content is None else content.clone(), main=kind != "indexer"))
    return out


def phasefix_gate_biases(model, reading: str = "answer") -> list[GateBias]:
    """The slot biases of a phasefix model, per layer, branch and KV head: gate bias + slot prior, [W, channels of
    that head] (1 channel for scalar gates, D for vector gates).

    reading="slot": slot i of head h with grid offset d_h counts for the phase of the token it holds,
    (i - W - d_h) mod S. reading="answer" (default): for the target-key phase it can answer
    (`mitigations.gates.answered_phases`: a key gate's slot i answers the key it holds, a value gate's slot i the key
    at slot i-1; the slot whose record straddles two windows answers nothing and its mass is dropped, so the
    boundary phase of a W = S grid gets no mass at all). phasefix's K and V gates are separate, so the answer reading
    is what predicts retrieval; DeepSeek-V4's single latent has only the slot reading."""
    from phasefix.mitigations.gates import answered_phases

    check_choice("reading", reading, READINGS)
    cfg = model.config
    HKV = cfg.num_kv_heads
    out = []
    for layer, block in enumerate(model.layers):
        comp = block.attn.compressor
        if comp is None or cfg.gate == "uniform":
            continue
        W, S = comp.window, comp.stride  # the layer's own (model.layer_compression)
        offsets = list(getattr(comp, "head_offsets", None) or [comp.grid_offset] * HKV)
        g = block.input_norm.weight.detach()
        for b in comp.branches:
            gate = getattr(comp, f"{b}_gate").detach().float()  # [W, C, HKV * width]
            width = gate.shape[-1] // HKV
            bias = getattr(comp, f"{b}_gate_bias", None)
            bias = torch.zeros(W, HKV * width) if bias is None else bias.detach().float()  # [W, HKV * width]
            prior = getattr(comp, f"{b}_slot_prior").detach().float()  # [W, HKV]
            sigma = (gate * g.float()[None, :, None]).norm(dim=1)  # [W, HKV * width]
            # [HKV, W, S] one-hot, zero rows for dead slots (the window's own slots: bridged ones are tied to them)
            answers = answered_phases(cfg, layer, b)[:, cfg.boundary_bridge:]
            for h in range(HKV):
                cols = slice(h * width, (h + 1) * width)
                if reading == "slot":
                    phase = (torch.arange(W) - W - offsets[h]) % S
                else:
                    phase = torch.where(answers[h].sum(-1) > 0, answers[h].argmax(-1), -1)  # -1: answers nothing
                phase = phase[:, None].expand(W, width)
                out.append(GateBias(f"L{layer}/{b}/h{h}", layer, b, S, bias[:, cols] + prior[:, h:h + 1],
                                    phase.clone(), sigma[:, cols].clone()))
    return out




# ------------------------------------------------------------------------------------------------ loading
RENAMES = [  # original DeepSeek-V4 checkpoint names -> transformers' (the part of its conversion mapping we read)
    (r"\.attn\.", ".self_attn."), (r"\.indexer\.compressor\.", ".compressor.indexer."), (r"\.ape$", ".position_bias"),
    (r"\.wgate\.", ".gate_proj."), (r"\.wkv\.", ".kv_proj."), (r"\.attn_norm\.", ".input_layernorm."),
]
NEEDED = re.compile(r"^layers\.\d+\.(self_attn\.compressor\.(indexer\.)?(position_bias|gate_proj\.weight)"
                    r"|input_layernorm\.weight)$")


def normalise_name(name: str) -> str:
    name = name[len("model."):] if name.startswith("model.") else name
    for pattern, repl in RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def _dequantise(w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """FP8 weights with a block scale (one per 128 x 128 block) -> float32; other dtypes just upcast."""
    if scale is None or w.element_size() > 1:
        return w.float()
    bs0, bs1 = -(-w.shape[0] // scale.shape[0]), -(-w.shape[1] // scale.shape[1])
    s = scale.float().repeat_interleave(bs0, 0)[: w.shape[0]].repeat_interleave(bs1, 1)[:, : w.shape[1]]
    return w.float() * s


def read_compressor_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Only the tensors the audit reads (slot biases, gate maps, input norms), from the safetensors shards of a
    Hugging Face directory, without loading the model (a few hundred MB for the real DeepSeek-V4)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model={str(path)!r} is invalid: no *.safetensors files in the directory")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names = list(st.keys())
            for name in names:
                key = normalise_name(name)
                if not NEEDED.match(key):
                    continue
                w = st.get_tensor(name)
                scale = None
                scales = [name + "_scale_inv"] + ([name[: -len("weight")] + "scale"] if name.endswith("weight") else [])
                for s_name in scales:
                    if s_name in names:
                        scale = st.get_tensor(s_name)
                out[key] = _dequantise(w, scale)
    return out


def state_tensors(hf_model) -> dict[str, torch.Tensor]:
    """The audit's tensors from a loaded transformers model."""
    return {k: v.detach() for name, v in hf_model.state_dict().items() if NEEDED.match(k := normalise_name(name))}


@dataclasses.dataclass
class Source:
    """What is audited: a DeepSeek-V4 checkpoint ('hf') or a phasefix run ('phasefix')."""

    kind: str
    name: str
    spec: str
    biases: list[GateBias]
    period: int
    hf_config: object = None
    ctx: object = None  # phasefix RunContext


def hf_config_of(path: Path):
    cfg_file = path / "config.json"
    model_type = json.loads(cfg_file.read_text()).get("model_type")
    check(model_type == "deepseek_v4", "model", str(path),
          f"has model_type={model_type!r}: the weights-only audit reads 'deepseek_v4' checkpoints (any causal LM: "
          "phasefix.evaluate)")
    from transformers import DeepseekV4Config

    return DeepseekV4Config.from_pretrained(path)


def load_source(opts: dict) -> Source:
    spec = str(opts["model"])
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        cfg = hf_config_of(path)
        biases = hf_gate_biases(read_compressor_tensors(path), cfg)
        return Source("hf", path.resolve().name, str(path.resolve()), biases, opts["period"] or 24, hf_config=cfg)
    from phasefix.analyze import load_run
    from phasefix.analyze.gates import check_gated

    try:
        ctx = load_run(spec, opts["tracking_uri"], opts["which"])
    except Exception as e:  # an unresolvable id or path: one line naming model=
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"model={spec!r} is invalid: not a Hugging Face DeepSeek-V4 directory (with config.json) "
                          f"nor a phasefix run ({why})") from None
    check_gated(ctx.config)
    return Source("phasefix", str(ctx.config.name), spec, phasefix_gate_biases(ctx.model, opts["reading"]),
                  opts["period"] or ctx.period, ctx=ctx)


# ------------------------------------------------------------------------------------------------ calibration
@torch.no_grad()
def hf_gate_means(hf_model, batches) -> dict[str, torch.Tensor]:
    """E[a] [W, Ch] of every DeepSeek-V4 compressor over the prompts (`batches` of input ids [B, T]) and complete
    windows: forward hooks read gate_proj's output z [B, T, width]; the gate is rebuilt as the compressor builds
    it, softmax over slots of z + position_bias (CSA windows without their previous block are left out)."""
    from phasefix.model.deepseek_v4 import compressors

    sums: dict[str, list] = {}
    hooks = []
    for layer, kind, mod in compressors(hf_model):
        name = f"L{layer}/{kind}"

        def hook(_, inputs, z, name=name, kind=kind, m=mod):
            S, D = m.compress_rate, m.head_dim
            B, T, _ = z.shape
            N = T // S
            if N < (2 if kind != "hca" else 1):
                return
            z = z[:, : N * S].float().view(B, N, S, -1) + m.position_bias.float()  # [B, N, S, width]
            if kind == "hca":
                logits = z  # [B, N, S, D]
            else:  # entry w: block w-1's first half, block w's second half
                logits = torch.cat([z[:, :-1, :, :D], z[:, 1:, :, D:]], dim=2)  # [B, N-1, 2S, D]
            a = torch.softmax(logits, dim=2)
            s = sums.setdefault(name, [0.0, 0])
            s[0] = s[0] + a.sum(dim=(0, 1)).double()
            s[1] += a.shape[0] * a.shape[1]

        hooks.append(mod.gate_proj.register_forward_hook(hook))
    device = next(hf_model.parameters()).device
    try:
        for ids in batches:
            hf_model(input_ids=ids.to(device), use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    return {name: (s / n).float().cpu() for name, (s, n) in sums.items()}


def calibrate(source: Source, opts: dict) -> dict[str, torch.Tensor]:
    """E[a] [W, Ch] per audited compressor (names as `GateBias.name`) from hooked forward passes over the
    phase-controlled prompts."""
    n_max = opts["max_prompts"]
    if source.kind == "phasefix":
        from phasefix.analyze import eval_set
        from phasefix.analyze.gates import gate_statistics

        ctx = source.ctx
        ds = eval_set(ctx, "prefix", opts["per_residue"], opts["seed"])
        stats = gate_statistics(ctx.model, ds, opts["batch_size"], n_max)
        out = {}
        for layer, branches in enumerate(stats):
            for b, s in branches.items():
                for h, P in enumerate(s["static"]):  # [W]: averaged over channels already
                    out[f"L{layer}/{b}/h{h}"] = P[:, None]
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from phasefix.data.text_prompts import TextPhaseSet

    path = Path(source.spec)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"calibrate=true is invalid for model={str(path)!r}: no tokenizer in the directory "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    device = opts["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, opts["dtype"])).to(device).eval()
    kw = {"max_length": opts["max_length"]} if opts["max_length"] else {}
    prompts = TextPhaseSet(tok, "kv_lookup", "prefix", period=source.period, per_residue=opts["per_residue"],
                           seed=opts["seed"], **kw)

    def batches():
        seen = 0
        for batch in prompts.batches(opts["batch_size"]):
            ids = torch.from_numpy(batch["input_ids"])[: n_max - seen]
            if ids.shape[0] == 0:
                return
            seen += ids.shape[0]
            yield ids

    return hf_gate_means(model, batches())
