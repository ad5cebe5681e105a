"""bf16 mixed precision on the CPU path (`trainer.precision=bf16-mixed`, what `auto` picks on a CPU with bf16 matmul
hardware): the attention implementations, the compressor and every mitigation term run forward and backward under
`torch.autocast("cpu", dtype=torch.bfloat16)` and give fp32's gradients within bf16's rounding.

The references are independent of the code under test: the attention against `naive` in float64 on the same
(bf16-rounded) inputs; the model and the mitigation terms against the same model in float32 without autocast.

Tolerances, as relative L2 errors ||a - b|| / ||b|| (bf16 keeps 8 significant bits, a relative rounding of 2^-9 per
number; sums of a few hundred products keep most of it, chains of them compound it):
- one attention call, output and the gradient of every input: <= 1.5e-2; both implementations compute in float32
  under autocast, so their output and the float32 inputs' gradients are float64's within 1e-5;
- a whole model's loss: <= 1e-2 (relative), each parameter's gradient: <= 6e-2 (checked on 64+ numbers each).
"""
from __future__ import annotations

import pytest
import torch

from phasefix import precision
from phasefix.kernels.compressed_attention import blocked, naive
from phasefix.kernels import window_grid as grid

ATTN_TOL, LOSS_TOL, GRAD_TOL = 1.5e-2, 1e-2, 6e-2
FLOAT32_TOL = 1e-5  # an attention computed in float32 against float64 on the same inputs
bf16_autocast = torch.autocast("cpu", dtype=torch.bfloat16)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------ one attention call
ATTN_CASES = {  # several query blocks and raw chunks; GQA; the sink; per-KV-head offsets (split by grid offset)
    "window-T45-S4-G2-sink-off1-qb16": dict(T=45, H=4, HKV=2, S=4, L=16, mode="window", goff=1, sink=True),
    "tail-T63-S8-G1-spread-qb16": dict(T=63, H=2, HKV=2, S=8, L=16, mode="tail", goff=[0, 4], sink=False),
    "tail-T70-S4-G4-sink-qb32": dict(T=70, H=4, HKV=1, S=4, L=16, mode="tail", goff=3, sink=True, query_block=32),
}


@pytest.mark.parametrize("impl", ["naive", "blocked"])
@pytest.mark.parametrize("case", ATTN_CASES.values(), ids=ATTN_CASES.keys())
def test_attention_under_bf16_autocast_matches_float64(case, impl):
    """Inputs as the model hands them over under autocast: queries and keys float32 (after their RMSNorm), values
    and entries bf16 (straight from a matmul). Output and every gradient against naive in float64."""
    T, H, HKV, S, goff = case["T"], case["H"], case["HKV"], case["S"], case["goff"]
    D = 32
    N = grid.num_entries(T, S, goff if isinstance(goff, int) else max(goff))
    g = torch.Generator().manual_seed(0)
    shapes = dict(q=(1, T, H, D), k=(1, T, HKV, D), v=(1, T, HKV, D), k_cmp=(1, N, HKV, D), v_cmp=(1, N, HKV, D))
    leaves = {n: torch.randn(*s, generator=g).requires_grad_() for n, s in shapes.items()}
    sink = torch.randn(H, generator=g).requires_grad_() if case["sink"] else None
    kw = dict(stride=S, local_window=case["L"], local_memory=case["mode"], grid_offset=goff,
              query_block=case.get("query_block", 16))
    fn = {"naive": naive.compressed_attention, "blocked": blocked.compressed_attention}[impl]
    with bf16_autocast:
        args = [leaves["q"], leaves["k"]] + [leaves[n].to(torch.bfloat16) for n in ("v", "k_cmp", "v_cmp")]
        out = fn(*args, sink=sink, **kw)
    do = torch.randn(out.shape, generator=g)
    wrt = [*leaves.values()] + ([sink] if sink is not None else [])
    grads = torch.autograd.grad(out.float(), wrt, do)
    # the reference sees the values the kernel saw: v, k_cmp, v_cmp rounded to bf16
    x64 = {n: (x.to(torch.bfloat16) if n in ("v", "k_cmp", "v_cmp") else x).detach().double().requires_grad_()
           for n, x in leaves.items()}
    s64 = sink.detach().double().requires_grad_() if sink is not None else None
    exp = naive.compressed_attention(*x64.values(), sink=s64, **kw)
    exp_grads = torch.autograd.grad(exp, [*x64.values()] + ([s64] if s64 is not None else []), do.double())
    assert rel_err(out, exp) <= ATTN_TOL, f"{impl} output: {rel_err(out, exp):.2e}"
    for name, a, b in zip([*leaves, "sink"], grads, exp_grads):
        assert a.dtype == torch.float32 and rel_err(a, b) <= ATTN_TOL, f"{impl} d{name}: {rel_err(a, b):.2e}"
    # and both compute in float32 under autocast (bf16 scores kept the CPU default on its plateau): on the same
    # inputs the output and the gradients of the float32 leaves (q, k, the sink) are float64's to float32 rounding
    # (the bf16 inputs' gradients are rounded to bf16 on their way back, so they keep the bf16 tolerance above)
    assert out.dtype == torch.float32 and rel_err(out, exp) <= FLOAT32_TOL, f"{impl} output: {rel_err(out, exp):.2e}"
    for name, a, b in zip([*leaves, "sink"], grads, exp_grads):
        if name in ("q", "k", "sink"):
            assert rel_err(a, b) <= FLOAT32_TOL, f"{impl} d{name} not float32-exact: {rel_err(a, b):.2e}"


def test_blocked_accumulates_entry_gradients_in_float32():
    """Many query blocks (query_block=4): the entries' gradients summed over blocks stay as exact as one block's."""
    T, S, D = 96, 4, 16
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, T, 2, D, generator=g, dtype=torch.bfloat16) for _ in range(3))
    kc = torch.randn(1, T // S, 2, D, generator=g, dtype=torch.bfloat16).requires_grad_()
    kw = dict(stride=S, local_window=8, local_memory="window")
    out = blocked.compressed_attention(q, k, v, kc, kc, query_block=4, **kw)
    do = torch.randn(out.shape, generator=g, dtype=torch.bfloat16)
    (dkc,) = torch.autograd.grad(out, kc, do)
    k64 = kc.detach().double().requires_grad_()
    exp = naive.compressed_attention(q.double(), k.double(), v.double(), k64, k64, **kw)
    (exp_dkc,) = torch.autograd.grad(exp, k64, do.double())
    assert dkc.dtype == torch.bfloat16 and rel_err(dkc, exp_dkc) <= ATTN_TOL


# ------------------------------------------------------------------------------------------------ the compressor
COMPRESSOR_CASES = {  # vector gates with gate biases; token shift with per-KV-head offsets
    "w8s8-vector": dict(window=8, stride=8, gate="vector"),
    "w5s4-shift2-spread": dict(window=5, stride=4, token_shift=2, head_offsets="spread"),
}


@pytest.mark.parametrize("case", COMPRESSOR_CASES.values(), ids=COMPRESSOR_CASES.keys())
def test_compressor_computes_in_float32_under_autocast(case):
    """Under bf16 autocast the compressor (slot maps, gate logits, gated pool, key norm) computes in float32: its
    entries, gates and every parameter's gradient are the float64 compressor's to float32 rounding (bf16 slot maps
    and logits kept a compiled coverage run on its plateau; computed in bf16 they are off by ~4e-3 here)."""
    from phasefix.model.config import ModelConfig
    from phasefix.model.qwen3 import Compressor, RMSNorm

    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=64, query_block=16, **case)
    torch.manual_seed(0)
    comp, norm = Compressor(cfg, 0, cfg.head_grid_offsets(0)), RMSNorm(16, 1e-6)
    x = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(5))
    results = []
    for dtype, autocast in ((torch.float32, True), (torch.float64, False)):
        comp.to(dtype), norm.to(dtype)
        comp.zero_grad(), norm.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            k_cmp, v_cmp, gates = comp(x.to(dtype), norm)
        outs = [k_cmp, v_cmp, *gates.values()]
        sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view(o.shape)).sum()
            for o in outs).backward()
        results.append((outs, {n: p.grad.clone() for n, p in comp.named_parameters()}))
    (outs, grads), (exp_outs, exp_grads) = results
    for i, (a, b) in enumerate(zip(outs, exp_outs)):
        assert a.dtype == torch.float32 and rel_err(a, b) <= FLOAT32_TOL, f"output {i}: {rel_err(a, b):.2e}"
    for n in exp_grads:
        assert rel_err(grads[n], exp_grads[n]) <= FLOAT32_TOL, f"d{n}: {rel_err(grads[n], exp_grads[n]):.2e}"


# ------------------------------------------------------------------------------------------------ a whole model
MODEL_CASES = {  # the compressor's every part: vector gates, token shift, per-head offsets, the tail, the sink
    "w8s4-vector-tail-sink": dict(window=8, stride=4, gate="vector", local_memory="tail", attention_sink=True),
    "w5s4-shift2-spread-tail-sink": dict(window=5, stride=4, token_shift=2, head_offsets="spread",
                                         local_memory="tail", attention_sink=True),
    "w8s8-window-hd64": dict(window=8, stride=8, num_heads=2, head_dim=64, local_memory="window"),
}


def _grads_fp32_and_bf16(build, ids, labels, terms=lambda model: {}):
    """One loss (next-token loss + extra terms) and its parameter gradients in float32 and under bf16 autocast,
    from the same initial weights."""
    from phasefix.module import next_token_loss

    out = {}
    for name, autocast in (("fp32", False), ("bf16", True)):
        model = build()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids, collect_gates=True)
            loss, _ = next_token_loss(logits, labels)
            loss = loss + sum(terms(model).values())
        loss.backward()
        out[name] = float(loss.detach()), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out["fp32"], out["bf16"]


def _check(fp32, bf16, what):
    (l32, g32), (l16, g16) = fp32, bf16
    assert abs(l16 - l32) <= LOSS_TOL * abs(l32), f"{what} loss: {l16} vs {l32}"
    assert g16.keys() == g32.keys()
    errs = {n: rel_err(g16[n], g32[n]) for n in g32 if g32[n].numel() >= 64}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= GRAD_TOL, f"{what}: d{worst} off by {errs[worst]:.2e} (all: {errs})"


@pytest.mark.parametrize("impl", ["naive", "blocked"])
@pytest.mark.parametrize("case", MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_model_gradients_under_bf16_autocast_match_float32(case, impl):
    from phasefix.model.config import ModelConfig
    from phasefix.model.qwen3 import CompressedQwen3

    cfg = ModelConfig(**{**dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                head_dim=16, intermediate_size=64, query_block=16), **case}, attn_impl=impl)

    def build():
        torch.manual_seed(0)
        return CompressedQwen3(cfg)

    g = torch.Generator().manual_seed(2)
    ids, labels = torch.randint(0, 64, (2, 40), generator=g), torch.randint(0, 64, (2, 40), generator=g)
    _check(*_grads_fp32_and_bf16(build, ids, labels), f"{impl} {cfg.window}/{cfg.stride}")


# ------------------------------------------------------------------------------------------------ mitigations
MITIGATIONS = {  # every registered mitigation, the gate terms at weights that matter against the LM loss
    "gate_diversity-per_head": {"gate_diversity": {"weight": 1.0}},
    "gate_diversity-soft": {"gate_diversity": {"weight": 1.0, "mode": "soft"}},
    "gate_diversity-hard": {"gate_diversity": {"mode": "hard", "branch": "both"}},
    "head_coord+layer_coord": {"head_coord": {"weight": 1.0}, "layer_coord": {"weight": 1.0}},
    # floor 2.5: two near-uniform heads (u = 2/S - 1/S^2 = 1.75/4) are below it, where the term has a gradient
    "slot_coverage": {"slot_coverage": {"weight": 1.0, "floor": 2.5}},
    "phase_jitter+staggered_offsets": {"phase_jitter": None, "staggered_offsets": None},
    # p = 1: the step drops one layer's entries (the same layer in both models: the same step generator)
    "entry_dropout+gate_diversity": {"entry_dropout": {"p": 1.0}, "gate_diversity": {"weight": 1.0}},
}


def test_every_mitigation_is_covered():
    from phasefix.mitigations import REGISTRY

    assert {name for m in MITIGATIONS.values() for name in m} == set(REGISTRY)


@pytest.mark.parametrize("spec", MITIGATIONS.values(), ids=MITIGATIONS.keys())
def test_mitigation_terms_under_bf16_autocast_match_float32(spec, impl="blocked"):
    """The training step's loss as PhaseFixModule builds it (batch transform, LM loss, every gate term) and its
    gradients, under bf16 autocast against float32 (on the CPU default's attention; the terms read only the gates,
    which both attention paths share)."""
    from phasefix.mitigations import build_mitigations
    from phasefix.model.config import ModelConfig
    from phasefix.model.qwen3 import CompressedQwen3

    mits = build_mitigations(spec)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=64, window=5, stride=4, query_block=16, attn_impl=impl)
    for m in mits:
        cfg = m.configure_model(cfg)

    def build():
        torch.manual_seed(0)
        model = CompressedQwen3(cfg)
        for m in mits:
            m.setup(model)
        for m in mits:
            m.before_forward(10, torch.Generator().manual_seed(5))
        assert sum(block.attn.drop_entries for block in model.layers) == ("entry_dropout" in spec)
        return model

    g = torch.Generator().manual_seed(3)
    ids, labels = torch.randint(0, 64, (2, 40), generator=g), torch.randint(0, 64, (2, 40), generator=g)
    for m in mits:
        ids, labels = m.transform_batch(ids, labels, torch.Generator().manual_seed(4))

    def terms(model):
        out = {}
        for m in mits:
            if m.needs_gates:
                out.update(m.loss(model, model.gates(), step=10))
        return out

    fp32, bf16 = _grads_fp32_and_bf16(build, ids, labels, terms)
    _check(fp32, bf16, f"{impl} {'+'.join(spec)}")


# ------------------------------------------------------------------------------------------------ trainer.precision=auto
def test_auto_picks_bf16_only_with_bf16_matmul_hardware(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["amx_bf16"])
    used, why = precision.resolve_precision("auto", "cpu")
    assert used == "bf16-mixed" and "amx_bf16" in why
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    used, why = precision.resolve_precision("auto", "cpu")
    assert used == "32-true" and "no bf16" in why
    assert precision.resolve_precision("auto", "gpu")[0] == "bf16-mixed"  # the GPU trainer keeps its bf16
    assert precision.resolve_precision("32-true", "cpu") == ("32-true", "trainer.precision")  # set: kept as set


def test_cpu_bf16_flags_reads_cpuinfo(monkeypatch, tmp_path):
    import builtins

    info = tmp_path / "cpuinfo"
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(info if p == "/proc/cpuinfo" else p, *a, **k))
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert precision.cpu_bf16_flags() == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert precision.cpu_bf16_flags() == []
    info.unlink()
    assert precision.cpu_bf16_flags() == []  # no /proc/cpuinfo (macOS, Windows): float32


def test_bad_precision_is_a_config_error():
    from phasefix.config import TrainerConfig, validate_trainer
    from phasefix.errors import ConfigError

    validate_trainer(TrainerConfig(precision="auto"))
    with pytest.raises(ConfigError, match=r"trainer\.precision='bf17' is invalid: allowed values are 'auto'"):
        validate_trainer(TrainerConfig(precision="bf17"))


def test_bad_compile_is_a_config_error():
    from phasefix.cli import compose
    from phasefix.config import TrainerConfig, validate_trainer
    from phasefix.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer\.compile='yes please' is invalid: must be true, false or auto"):
        validate_trainer(TrainerConfig(compile="yes please"))
    from phasefix.fit import plan

    with pytest.raises(ConfigError, match=r"trainer\.compile"):  # from the command line: refused while planning
        plan(compose(["trainer.compile=maybe"], "fit"))
