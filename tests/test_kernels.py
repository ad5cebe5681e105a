"""Triton kernels (kernels/) against the reference path (phasefix.model.compression) and the dense float64 oracle
(kernels/naive.py), run on CPU under the Triton interpreter in float32 and float64 (bf16 is broken there).

Shapes are tiny (B=1, T <= 64, D=16) and tiles small (16) so every case has several query and key tiles, partial
last tiles and unaligned band/tail starts while the whole file stays well under a minute and a half on 2 cores.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit decorators of kernels/

import importlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels.naive import naive_compressed_attention, naive_gated_pool  # noqa: E402
from phasefix.model import compression as ref  # noqa: E402

# the submodules (their names are shadowed by the functions `kernels` exports)
kg = importlib.import_module("kernels.gated_pool")
ka = importlib.import_module("kernels.compressed_attention")
if "Interpreted" not in type(kg._gated_pool_fwd_kernel).__name__:  # imported earlier without the interpreter
    kg, ka = importlib.reload(kg), importlib.reload(ka)
    kernels = importlib.reload(kernels)

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def _close(actual, expected, dtype, what):
    torch.testing.assert_close(actual, expected, **TOL[dtype], msg=lambda m: f"{what}: {m}")


# ------------------------------------------------------------------------------------------------ pooling
def _pool_inputs(T, W, S, HKV, D, vector, goff, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = ref.num_entries(T, S, goff)
    pos = ref.window_positions(T, W, S, goff)  # [N, W]; negative: empty slot
    payload = torch.randn(1, N, W, HKV, D, generator=g, dtype=torch.float64).to(dtype)
    logits = (2 * torch.randn(1, N, W, HKV, D if vector else 1, generator=g, dtype=torch.float64)).to(dtype)
    logits = logits.masked_fill(~(pos >= 0)[None, :, :, None, None], float("-inf"))
    return payload.requires_grad_(), logits.requires_grad_()


POOL_CASES = {
    "W4S4-scalar-f32": dict(T=37, W=4, S=4, HKV=2, vector=False, goff=0, dtype=torch.float32),
    "W8S4-scalar-f64-off1": dict(T=37, W=8, S=4, HKV=2, vector=False, goff=1, dtype=torch.float64),
    "W8S4-vector-f32-off3": dict(T=63, W=8, S=4, HKV=1, vector=True, goff=3, dtype=torch.float32),
    "W12S12-vector-f64": dict(T=50, W=12, S=12, HKV=4, vector=True, goff=0, dtype=torch.float64),
    "W8S6-scalar-f64": dict(T=40, W=8, S=6, HKV=2, vector=False, goff=2, dtype=torch.float64),
}


@pytest.mark.parametrize("case", POOL_CASES.values(), ids=POOL_CASES.keys())
def test_gated_pool_matches_reference_and_oracle(case):
    dtype = case["dtype"]
    payload, logits = _pool_inputs(case["T"], case["W"], case["S"], case["HKV"], 16, case["vector"], case["goff"],
                                   dtype)
    assert torch.isinf(logits).any() or case["W"] == case["S"]  # W > S: the first windows have empty slots
    out = kernels.gated_pool(payload, logits)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (payload, logits), do)
    for name, fn in (("reference", ref.gated_pool), ("oracle", naive_gated_pool)):
        p64, s64 = payload.detach().double().requires_grad_(), logits.detach().double().requires_grad_()
        exp = fn(p64, s64)
        exp_grads = torch.autograd.grad(exp, (p64, s64), do.double())
        _close(out, exp.to(dtype), dtype, f"{name} output")
        _close(grads[0], exp_grads[0].to(dtype), dtype, f"{name} d payload")
        finite = torch.isfinite(logits)
        _close(grads[1][finite], exp_grads[1].to(dtype)[finite], dtype, f"{name} d gate logits")
        assert (grads[1][~finite] == 0).all()
    # the reference in the same dtype agrees too
    _close(out, ref.gated_pool(payload, logits), dtype, "reference (same dtype)")


def test_gated_pool_gradcheck():
    payload, logits = _pool_inputs(T=10, W=8, S=4, HKV=1, D=3, vector=False, goff=1, dtype=torch.float64)
    finite = torch.isfinite(logits.detach())
    base = logits.detach().clone()

    def f(p, s):  # gradcheck perturbs only the finite logits
        return kernels.gated_pool(p, torch.where(finite, s, base))

    s0 = torch.where(finite, base, torch.zeros_like(base)).requires_grad_()
    assert torch.autograd.gradcheck(f, (payload, s0), eps=1e-6, atol=1e-8)
    vp, vs = _pool_inputs(T=8, W=4, S=4, HKV=1, D=3, vector=True, goff=0, dtype=torch.float64)
    assert torch.autograd.gradcheck(kernels.gated_pool, (vp, vs), eps=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------------ attention
def _attn_inputs(T, H, HKV, S, goff, sink, dtype, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = ref.num_entries(T, S, goff)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()

    q, k, v = r(1, T, H, D), r(1, T, HKV, D), r(1, T, HKV, D)
    kc, vc = r(1, N, HKV, D), r(1, N, HKV, D)
    s = r(H) if sink else None
    return q, k, v, kc, vc, s


ATTN_CASES = {
    "window-T37-S4-L8-G2-sink-off1-f64": dict(T=37, H=4, HKV=2, S=4, L=8, mode="window", goff=1, sink=True,
                                              dtype=torch.float64),
    "window-T63-S4-L16-G4-f32": dict(T=63, H=4, HKV=1, S=4, L=16, mode="window", goff=0, sink=False,
                                     dtype=torch.float32),
    "window-T64-S8-L3-G1-sink-off5-f32": dict(T=64, H=2, HKV=2, S=8, L=3, mode="window", goff=5, sink=True,
                                              dtype=torch.float32),
    "tail-T37-S4-G2-sink-off3-f64": dict(T=37, H=4, HKV=2, S=4, L=16, mode="tail", goff=3, sink=True,
                                         dtype=torch.float64),
    "tail-T63-S6-G4-off2-f32": dict(T=63, H=4, HKV=1, S=6, L=16, mode="tail", goff=2, sink=False,
                                    dtype=torch.float32),
    "tail-T50-S4-G1-f64-bn32": dict(T=50, H=2, HKV=2, S=4, L=16, mode="tail", goff=0, sink=False,
                                    dtype=torch.float64, block_n=32),
}


@pytest.mark.parametrize("case", ATTN_CASES.values(), ids=ATTN_CASES.keys())
def test_compressed_attention_matches_reference_and_oracle(case):
    dtype = case["dtype"]
    inputs = _attn_inputs(case["T"], case["H"], case["HKV"], case["S"], case["goff"], case["sink"], dtype)
    kw = dict(stride=case["S"], local_window=case["L"], local_memory=case["mode"], grid_offset=case["goff"])
    q, k, v, kc, vc, sink = inputs
    wrt = [x for x in inputs if x is not None]
    out = ka.compressed_attention_(q, k, v, kc, vc, sink=sink, **kw, block_m=16, block_n=case.get("block_n", 16))
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, wrt, do)
    names = ["q", "k", "v", "k_cmp", "v_cmp", "sink"]
    for name, fn in (("reference", ref.compressed_attention), ("oracle", naive_compressed_attention)):
        x64 = [x.detach().double().requires_grad_() for x in wrt]
        q6, k6, v6, kc6, vc6 = x64[:5]
        exp = fn(q6, k6, v6, kc6, vc6, sink=x64[5] if sink is not None else None, **kw, query_block=16)
        exp_grads = torch.autograd.grad(exp, x64, do.double())
        _close(out, exp.to(dtype), dtype, f"{name} output")
        for n, a, b in zip(names, grads, exp_grads):
            _close(a, b.to(dtype), dtype, f"{name} d{n}")
    _close(out, ref.compressed_attention(q, k, v, kc, vc, sink=sink, **kw), dtype, "reference (same dtype)")


def test_public_compressed_attention_default_tiles_and_tied_kv():
    """The model's call: default tiles (one tile here), query_block ignored, tied K/V (v_cmp is k_cmp)."""
    q, k, v, kc, _, sink = _attn_inputs(T=45, H=4, HKV=2, S=4, goff=1, sink=True, dtype=torch.float64)
    kw = dict(stride=4, local_window=16, local_memory="window", sink=sink, grid_offset=1, query_block=8)
    out = kernels.compressed_attention(q, k, v, kc, kc, **kw)
    exp = ref.compressed_attention(q, k, v, kc, kc, **kw)
    _close(out, exp, torch.float64, "output")
    do = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, kc, sink), do)
    ge = torch.autograd.grad(exp, (q, kc, sink), do)
    for n, a, b in zip(("q", "k_cmp", "sink"), g, ge):
        _close(a, b, torch.float64, f"d{n}")


@pytest.mark.parametrize("mode,fast", [("tail", False), ("window", True)], ids=["tail-full", "window-fast"])
def test_compressed_attention_gradcheck(mode, fast):
    """Full finite-difference Jacobian on one tiny case (tail), gradcheck's fast mode on the other."""
    q, k, v, kc, vc, sink = _attn_inputs(T=9, H=2, HKV=1, S=4, goff=1, sink=True, dtype=torch.float64, D=2)

    def f(*x):
        return ka.compressed_attention_(*x[:5], sink=x[5], stride=4, local_window=3, local_memory=mode,
                                        grid_offset=1, block_m=16, block_n=16)

    assert torch.autograd.gradcheck(f, (q, k, v, kc, vc, sink), eps=1e-6, atol=1e-8, fast_mode=fast)


def test_reference_matches_oracle_float64():
    """The model's reference path itself, checked against the dense oracle (no downcast in float64)."""
    q, k, v, kc, vc, sink = _attn_inputs(T=29, H=4, HKV=2, S=4, goff=2, sink=True, dtype=torch.float64)
    for mode in ("window", "tail"):
        kw = dict(stride=4, local_window=6, local_memory=mode, sink=sink, grid_offset=2)
        torch.testing.assert_close(ref.compressed_attention(q, k, v, kc, vc, **kw, query_block=7),
                                   naive_compressed_attention(q, k, v, kc, vc, **kw), atol=1e-12, rtol=1e-12)


HEAD_OFFSET_CASES = {  # one grid offset per KV head: the model splits the call by offset (`by_grid_offset`)
    "window-T37-S4-H8-HKV4-1013-sink-f64": dict(T=37, H=8, HKV=4, S=4, L=6, mode="window", offs=[1, 0, 1, 3],
                                                sink=True, dtype=torch.float64),
    "tail-T63-S4-H4-HKV2-spread-f32": dict(T=63, H=4, HKV=2, S=4, L=16, mode="tail", offs=[0, 2], sink=False,
                                           dtype=torch.float32),
    "tail-T63-S6-H6-HKV3-502-sink-f64": dict(T=63, H=6, HKV=3, S=6, L=16, mode="tail", offs=[5, 0, 2], sink=True,
                                             dtype=torch.float64),
}


@pytest.mark.parametrize("case", HEAD_OFFSET_CASES.values(), ids=HEAD_OFFSET_CASES.keys())
def test_per_head_offsets_match_oracle(case):
    """Per-KV-head grid offsets (model.head_offsets): the kernel, called once per offset through
    `compression.by_grid_offset`, and the reference (which accepts the list itself) against the dense oracle, whose
    visibility is per head; values and gradients."""
    import functools

    dtype, offs = case["dtype"], case["offs"]
    N = ref.num_entries(case["T"], case["S"], max(offs))  # the most entries any head has
    q, k, v, _, _, sink = _attn_inputs(case["T"], case["H"], case["HKV"], case["S"], 0, case["sink"], dtype)
    g = torch.Generator().manual_seed(3)
    kc, vc = (torch.randn(1, N, case["HKV"], 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
              for _ in range(2))
    wrt = [x for x in (q, k, v, kc, vc, sink) if x is not None]
    kw = dict(stride=case["S"], local_window=case["L"], local_memory=case["mode"])
    tri = functools.partial(ka.compressed_attention_, block_m=16, block_n=16)
    out = ref.by_grid_offset(tri, q, k, v, kc, vc, sink=sink, grid_offset=offs, **kw)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, wrt, do)
    x64 = [x.detach().double().requires_grad_() for x in wrt]
    s64 = x64[5] if sink is not None else None
    exp = naive_compressed_attention(*x64[:5], sink=s64, grid_offset=offs, **kw)
    exp_grads = torch.autograd.grad(exp, x64, do.double())
    _close(out, exp.to(dtype), dtype, "kernel output")
    for n, a, b in zip(["q", "k", "v", "k_cmp", "v_cmp", "sink"], grads, exp_grads):
        _close(a, b.to(dtype), dtype, f"kernel d{n}")
    # the reference path, in float64, with the list passed straight in
    got = ref.compressed_attention(*x64[:5], sink=s64, grid_offset=offs, **kw, query_block=16)
    got_grads = torch.autograd.grad(got, x64, do.double())
    torch.testing.assert_close(got, exp, atol=1e-12, rtol=1e-12)
    for n, a, b in zip(["q", "k", "v", "k_cmp", "v_cmp", "sink"], got_grads, exp_grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=lambda m, n=n: f"reference d{n}: {m}")


def test_bad_arguments_raise():
    q, k, v, kc, vc, _ = _attn_inputs(T=8, H=3, HKV=2, S=4, goff=0, sink=False, dtype=torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        kernels.compressed_attention(q, k, v, kc, vc, stride=4)
    q, k, v, kc, vc, _ = _attn_inputs(T=8, H=2, HKV=2, S=4, goff=0, sink=False, dtype=torch.float32)
    with pytest.raises(ValueError, match="grid_offset"):
        kernels.compressed_attention(q, k, v, kc, vc, stride=4, grid_offset=4)
    with pytest.raises(ValueError, match="local_memory"):
        kernels.compressed_attention(q, k, v, kc, vc, stride=4, local_memory="band")
    with pytest.raises(ValueError, match=r"model\.head_offsets"):
        kernels.compressed_attention(q, k, v, kc, vc, stride=4, grid_offset=[0, 2])
    with pytest.raises(ValueError, match="gate_logits"):
        kernels.gated_pool(torch.zeros(1, 2, 4, 1, 8), torch.zeros(1, 2, 4, 1, 3))


# ------------------------------------------------------------------------------------------------ integration
MODEL_CASES = {
    "w8s4-vector-tail-sink-offset": dict(window=8, stride=4, gate="vector", local_memory="tail",
                                         attention_sink=True, grid_offsets=[1]),
    # the bridges of issue 16: token shift (before pooling) and per-head offsets (one kernel call per offset)
    "w5s4-shift2-spread-tail-sink": dict(window=5, stride=4, token_shift=2, head_offsets="spread",
                                         local_memory="tail", attention_sink=True, grid_offsets=[3]),
}


@pytest.mark.parametrize("case", MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_model_triton_path_matches_torch_path(case):
    """A tiny CompressedQwen3 gives the same logits and gradients with attn_impl='triton' (interpreted kernels) as
    with the reference path."""
    from phasefix.model.config import ModelConfig
    from phasefix.model.qwen3 import CompressedQwen3

    cfg = dict(vocab_size=32, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
               intermediate_size=64, **case)
    torch.manual_seed(0)
    m_ref = CompressedQwen3(ModelConfig(**cfg, attn_impl="torch")).double()
    m_tri = CompressedQwen3(ModelConfig(**cfg, attn_impl="triton")).double()
    m_tri.load_state_dict(m_ref.state_dict())
    with torch.no_grad():
        for p in m_ref.parameters():  # make the sink and the gates matter
            p.add_(0.3 * torch.randn_like(p))
        m_tri.load_state_dict(m_ref.state_dict())
    ids = torch.randint(0, 32, (1, 21))
    out_ref, out_tri = m_ref(ids), m_tri(ids)
    out_ref = out_ref if torch.is_tensor(out_ref) else out_ref.logits
    out_tri = out_tri if torch.is_tensor(out_tri) else out_tri.logits
    torch.testing.assert_close(out_tri, out_ref, atol=1e-9, rtol=1e-9)
    out_ref.square().sum().backward()
    out_tri.square().sum().backward()
    for (n, a), b in zip(m_tri.named_parameters(), m_ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-9, rtol=1e-9, msg=lambda m, n=n: f"{n}: {m}")


def test_kernels_import_without_phasefix():
    code = "import sys, kernels; bad = [m for m in sys.modules if m.startswith('phasefix')]; assert not bad, bad"
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


AOT_SCRIPT = r'''
import importlib
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
ka = importlib.import_module("kernels.compressed_attention")
kg = importlib.import_module("kernels.gated_pool")

def build(fn, ptrs, floats, consts, warps):
    sig = {n: "constexpr" if n in consts else ptrs.get(n) or ("fp32" if n in floats else "i32") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=2))
    assert "wgmma" in k.asm["ptx"] or fn.__name__.startswith("_gated"), fn.__name__

b = lambda *ns: {n: "*bf16" for n in ns}
f32 = {"sink_ptr": "*fp32", "lse_ptr": "*fp32", "delta_ptr": "*fp32"}
cfg = dict(BLOCK_D=128, ACC=tl.float32, PREC="tf32")
build(ka._fwd_kernel, {**b("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "o_ptr"), **f32}, {"qk_scale"},
      dict(RAW=1, HAS_SINK=True, BLOCK_M=128, BLOCK_N=64, **cfg), 8)
build(ka._bwd_dq_kernel, {**b("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "do_ptr", "dq_ptr"), **f32},
      {"qk_scale", "scale"}, dict(RAW=0, BLOCK_M=64, BLOCK_N=32, **cfg), 8)
build(ka._bwd_dkdv_kernel, {**b("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dk_ptr", "dv_ptr"), **f32},
      {"qk_scale", "scale"}, dict(MODE=2, BLOCK_M=32, BLOCK_N=64, **cfg), 8)
build(kg._gated_pool_bwd_kernel, b("p_ptr", "s_ptr", "do_ptr", "dp_ptr", "ds_ptr"), set(),
      dict(ACC=tl.float32, VECTOR_GATE=True, BLOCK_W=8, BLOCK_D=128), 4)
print("ok")
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90_ahead_of_time():
    """Compiled (not interpreted) Triton, bf16, head dim 128, down to a Hopper cubin with wgmma: catches what the
    interpreter lets through (types, constexpr use, dot shapes) without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", AOT_SCRIPT], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
