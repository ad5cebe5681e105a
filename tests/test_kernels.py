"""The attention implementations of phasefix/kernels/ against the readable reference: `blocked` (the CPU path) and
`triton` (run on CPU under the Triton interpreter) against `naive` run in float64, values and gradients, in float32 and
float64 (bf16 is broken in the interpreter). `naive` itself is held to the independent float64 oracle of the whole
model (tests/oracle.py) in test_model.py.

Shapes are tiny (B=1, T <= 64, D=16) and tiles small (16) so every case has several query and key tiles, partial
last tiles and unaligned band/tail starts while the whole file stays well under a minute and a half on 2 cores.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit decorators of phasefix/kernels/

import functools  # noqa: E402
import importlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from phasefix import kernels  # noqa: E402
from phasefix.kernels.compressed_attention import blocked, naive  # noqa: E402
from phasefix.kernels.gated_pool import naive as naive_pool  # noqa: E402
from phasefix.kernels import window_grid as grid  # noqa: E402

kg = importlib.import_module("phasefix.kernels.gated_pool.triton")
ka = importlib.import_module("phasefix.kernels.compressed_attention.triton")
if "Interpreted" not in type(kg._gated_pool_fwd_kernel).__name__:  # imported earlier without the interpreter
    kg, ka = importlib.reload(kg), importlib.reload(ka)

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def _close(actual, expected, dtype, what):
    torch.testing.assert_close(actual, expected, **TOL[dtype], msg=lambda m: f"{what}: {m}")


# ------------------------------------------------------------------------------------------------ pooling
def _pool_inputs(T, W, S, HKV, D, vector, goff, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = grid.num_entries(T, S, goff)
    pos = grid.window_positions(T, W, S, goff)  # [N, W]; negative: empty slot
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
def test_gated_pool_triton_matches_naive(case):
    dtype = case["dtype"]
    payload, logits = _pool_inputs(case["T"], case["W"], case["S"], case["HKV"], 16, case["vector"], case["goff"],
                                   dtype)
    assert torch.isinf(logits).any() or case["W"] == case["S"]  # W > S: the first windows have empty slots
    out = kg.gated_pool(payload, logits)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (payload, logits), do)
    p64, s64 = payload.detach().double().requires_grad_(), logits.detach().double().requires_grad_()
    exp = naive_pool.gated_pool(p64, s64)
    exp_grads = torch.autograd.grad(exp, (p64, s64), do.double())
    _close(out, exp.to(dtype), dtype, "output")
    _close(grads[0], exp_grads[0].to(dtype), dtype, "d payload")
    finite = torch.isfinite(logits)
    _close(grads[1][finite], exp_grads[1].to(dtype)[finite], dtype, "d gate logits")
    assert (grads[1][~finite] == 0).all()
    _close(out, naive_pool.gated_pool(payload, logits), dtype, "naive (same dtype)")


def test_gated_pool_gradcheck():
    payload, logits = _pool_inputs(T=10, W=8, S=4, HKV=1, D=3, vector=False, goff=1, dtype=torch.float64)
    finite = torch.isfinite(logits.detach())
    base = logits.detach().clone()

    def f(p, s):  # gradcheck perturbs only the finite logits
        return kg.gated_pool(p, torch.where(finite, s, base))

    s0 = torch.where(finite, base, torch.zeros_like(base)).requires_grad_()
    assert torch.autograd.gradcheck(f, (payload, s0), eps=1e-6, atol=1e-8)
    vp, vs = _pool_inputs(T=8, W=4, S=4, HKV=1, D=3, vector=True, goff=0, dtype=torch.float64)
    assert torch.autograd.gradcheck(kg.gated_pool, (vp, vs), eps=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------------ attention
def _attn_inputs(T, H, HKV, S, goff, sink, dtype, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = grid.num_entries(T, S, goff)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()

    q, k, v = r(1, T, H, D), r(1, T, HKV, D), r(1, T, HKV, D)
    kc, vc = r(1, N, HKV, D), r(1, N, HKV, D)
    s = r(H) if sink else None
    return q, k, v, kc, vc, s


ATTN_CASES = {
    "window-T37-S4-L8-G2-sink-off1-f64-qb7": dict(T=37, H=4, HKV=2, S=4, L=8, mode="window", goff=1, sink=True,
                                                  dtype=torch.float64, query_block=7),
    "window-T63-S4-L16-G4-f32": dict(T=63, H=4, HKV=1, S=4, L=16, mode="window", goff=0, sink=False,
                                     dtype=torch.float32),
    "window-T64-S8-L3-G1-sink-off5-f32": dict(T=64, H=2, HKV=2, S=8, L=3, mode="window", goff=5, sink=True,
                                              dtype=torch.float32),
    "tail-T37-S4-G2-sink-off3-f64-qb7": dict(T=37, H=4, HKV=2, S=4, L=16, mode="tail", goff=3, sink=True,
                                             dtype=torch.float64, query_block=7),
    "tail-T63-S6-G4-off2-f32": dict(T=63, H=4, HKV=1, S=6, L=16, mode="tail", goff=2, sink=False,
                                    dtype=torch.float32),
    "tail-T50-S4-G1-f64-bn32": dict(T=50, H=2, HKV=2, S=4, L=16, mode="tail", goff=0, sink=False,
                                    dtype=torch.float64, block_n=32),
    # no entries at all (a layer_compression 'none' layer, or a stride longer than the sequence): the local window
    "window-T30-no-entries-G4-sink-f32": dict(T=30, H=4, HKV=1, S=64, L=8, mode="window", goff=0, sink=True,
                                              dtype=torch.float32),
}


def _impl(name: str, **tiles):
    """An implementation's compressed_attention with small tiles (many tiles on tiny inputs): triton's block_m and
    block_n, blocked's query_block (7: blocks that do not align with the raw chunks of 16)."""
    if name == "triton":
        return functools.partial(ka.compressed_attention_, block_m=tiles.get("block_m", 16),
                                 block_n=tiles.get("block_n", 16))
    return functools.partial(blocked.compressed_attention, query_block=tiles.get("query_block", 16))


FAST = ("blocked", "triton")
NAMES = ["q", "k", "v", "k_cmp", "v_cmp", "sink"]


def _against_naive(fn, inputs, dtype, what, **kw):
    """fn on `inputs` (its dtype) against naive in float64: the output and the gradients of every input."""
    wrt = [x for x in inputs if x is not None]
    sink = inputs[5]
    out = fn(*inputs[:5], sink=sink, **kw)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, wrt, do)
    x64 = [x.detach().double().requires_grad_() for x in wrt]
    exp = naive.compressed_attention(*x64[:5], sink=x64[5] if sink is not None else None, **kw)
    exp_grads = torch.autograd.grad(exp, x64, do.double())
    _close(out, exp.to(dtype), dtype, f"{what} output")
    for n, a, b in zip(NAMES, grads, exp_grads):
        _close(a, b.to(dtype), dtype, f"{what} d{n}")
    return out


@pytest.mark.parametrize("impl", FAST)
@pytest.mark.parametrize("case", ATTN_CASES.values(), ids=ATTN_CASES.keys())
def test_compressed_attention_matches_naive(case, impl):
    dtype = case["dtype"]
    inputs = _attn_inputs(case["T"], case["H"], case["HKV"], case["S"], case["goff"], case["sink"], dtype)
    kw = dict(stride=case["S"], local_window=case["L"], local_memory=case["mode"], grid_offset=case["goff"])
    tiles = dict(block_n=case.get("block_n", 16), query_block=case.get("query_block", 16))
    _against_naive(_impl(impl, **tiles), inputs, dtype, impl, **kw)


def test_implementations_agree_in_float32():
    """naive, blocked and triton on the same float32 inputs (the model's call: default tiles, tied K/V)."""
    q, k, v, kc, _, sink = _attn_inputs(T=45, H=4, HKV=2, S=4, goff=1, sink=True, dtype=torch.float32)
    kw = dict(stride=4, local_window=16, local_memory="window", sink=sink, grid_offset=1, query_block=8)
    outs = {impl: kernels.ops(impl).compressed_attention(q, k, v, kc, kc, **kw) for impl in kernels.IMPLS}
    do = torch.randn_like(outs["naive"])
    grads = {impl: torch.autograd.grad(o, (q, kc, sink), do) for impl, o in outs.items()}
    for impl in FAST:
        _close(outs[impl], outs["naive"], torch.float32, f"{impl} output")
        for n, a, b in zip(("q", "k_cmp", "sink"), grads[impl], grads["naive"]):
            _close(a, b, torch.float32, f"{impl} d{n}")


@pytest.mark.parametrize("impl,mode,fast", [("triton", "tail", False), ("triton", "window", True),
                                            ("blocked", "tail", True), ("blocked", "window", True)])
def test_compressed_attention_gradcheck(impl, mode, fast):
    """Finite differences against the hand-written backwards: the full Jacobian on one tiny triton case, gradcheck's
    fast mode on the others (blocked: several query blocks, raw chunks and the sink)."""
    if impl == "triton":
        q, k, v, kc, vc, sink = _attn_inputs(T=9, H=2, HKV=1, S=4, goff=1, sink=True, dtype=torch.float64, D=2)
        kw = dict(stride=4, local_window=3, local_memory=mode, grid_offset=1)
    else:
        q, k, v, kc, vc, sink = _attn_inputs(T=11, H=4, HKV=2, S=3, goff=1, sink=True, dtype=torch.float64, D=4)
        kw = dict(stride=3, local_window=3, local_memory=mode, grid_offset=1)
    fn = _impl(impl, query_block=4)

    def f(*x):
        return fn(*x[:5], sink=x[5], **kw)

    assert torch.autograd.gradcheck(f, (q, k, v, kc, vc, sink), eps=1e-6, atol=1e-8, fast_mode=fast)


HEAD_OFFSET_CASES = {  # one grid offset per KV head: the model splits the call by offset (`by_grid_offset`)
    "window-T37-S4-H8-HKV4-1013-sink-f64": dict(T=37, H=8, HKV=4, S=4, L=6, mode="window", offs=[1, 0, 1, 3],
                                                sink=True, dtype=torch.float64),
    "tail-T63-S4-H4-HKV2-spread-f32": dict(T=63, H=4, HKV=2, S=4, L=16, mode="tail", offs=[0, 2], sink=False,
                                           dtype=torch.float32),
    "tail-T63-S6-H6-HKV3-502-sink-f64": dict(T=63, H=6, HKV=3, S=6, L=16, mode="tail", offs=[5, 0, 2], sink=True,
                                             dtype=torch.float64),
}


@pytest.mark.parametrize("impl", FAST)
@pytest.mark.parametrize("case", HEAD_OFFSET_CASES.values(), ids=HEAD_OFFSET_CASES.keys())
def test_per_head_offsets_match_naive(case, impl):
    """Per-KV-head grid offsets (model.head_offsets): the implementation called once per offset through
    `compression.by_grid_offset` (as the model calls it) against naive, whose visibility is per head; values and
    gradients. blocked also takes the list itself."""
    dtype, offs = case["dtype"], case["offs"]
    N = grid.num_entries(case["T"], case["S"], max(offs))  # the most entries any head has
    q, k, v, _, _, sink = _attn_inputs(case["T"], case["H"], case["HKV"], case["S"], 0, case["sink"], dtype)
    g = torch.Generator().manual_seed(3)
    kc, vc = (torch.randn(1, N, case["HKV"], 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
              for _ in range(2))
    inputs = (q, k, v, kc, vc, sink)
    kw = dict(stride=case["S"], local_window=case["L"], local_memory=case["mode"], grid_offset=offs)
    fn = _impl(impl)
    _against_naive(functools.partial(grid.by_grid_offset, fn), inputs, dtype, f"{impl} by offset", **kw)
    if impl == "blocked":
        _against_naive(fn, inputs, dtype, "blocked (list)", **kw)


def test_bad_arguments_raise():
    q, k, v, kc, vc, _ = _attn_inputs(T=8, H=3, HKV=2, S=4, goff=0, sink=False, dtype=torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        ka.compressed_attention(q, k, v, kc, vc, stride=4)
    q, k, v, kc, vc, _ = _attn_inputs(T=8, H=2, HKV=2, S=4, goff=0, sink=False, dtype=torch.float32)
    with pytest.raises(ValueError, match="grid_offset"):
        ka.compressed_attention(q, k, v, kc, vc, stride=4, grid_offset=4)
    with pytest.raises(ValueError, match="local_memory"):
        ka.compressed_attention(q, k, v, kc, vc, stride=4, local_memory="band")
    with pytest.raises(ValueError, match=r"model\.head_offsets"):
        ka.compressed_attention(q, k, v, kc, vc, stride=4, grid_offset=[0, 2])
    with pytest.raises(ValueError, match="local_memory"):
        naive.compressed_attention(q, k, v, kc, vc, stride=4, local_memory="band")
    with pytest.raises(ValueError, match="gate_logits"):
        kg.gated_pool(torch.zeros(1, 2, 4, 1, 8), torch.zeros(1, 2, 4, 1, 3))
    with pytest.raises(ValueError, match="attn_impl must be one of naive, blocked, triton, auto, got 'cuda'"):
        kernels.ops("cuda")


def test_ops_selects_by_attn_impl_and_device():
    """`auto` is triton on CUDA and blocked elsewhere; the pooling is triton's only for triton."""
    assert kernels.resolve("auto", "cuda") == "triton" and kernels.resolve("auto", "cpu") == "blocked"
    assert kernels.ops("blocked").compressed_attention is blocked.compressed_attention
    assert kernels.ops("auto", "cpu").compressed_attention is blocked.compressed_attention
    assert kernels.ops("naive").compressed_attention is naive.compressed_attention
    assert kernels.ops("blocked").gated_pool is naive_pool.gated_pool
    assert kernels.ops("auto", "cuda").compressed_attention is ka.compressed_attention
    assert kernels.ops("triton").gated_pool is kg.gated_pool


# ------------------------------------------------------------------------------------------------ integration
MODEL_CASES = {
    "w8s4-vector-tail-sink-offset": dict(window=8, stride=4, gate="vector", local_memory="tail",
                                         attention_sink=True, grid_offsets=[1]),
    # the bridges of issue 16: token shift (before pooling) and per-head offsets (one kernel call per offset)
    "w5s4-shift2-spread-tail-sink": dict(window=5, stride=4, token_shift=2, head_offsets="spread",
                                         local_memory="tail", attention_sink=True, grid_offsets=[3]),
    # per-layer compression (issue 66): CSA-like, HCA-like and a local-window-only layer (no entries at all), one KV
    # head, staggered grids; and the boundary bridge's tied leading slots
    "layers-w8s4-w12s12-none-stagger-sink": dict(num_layers=3, num_kv_heads=1, attention_sink=True,
                                                 layer_compression=["8/4", "12/12", "none"], grid_offsets="stagger"),
    "bridge2-w4s4-layers-tail-coprime": dict(num_layers=2, layer_compression=["4/4", "6/3"], boundary_bridge=2,
                                             local_memory="tail", grid_offsets="coprime"),
}


@pytest.mark.parametrize("impl", FAST)
@pytest.mark.parametrize("case", MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_model_paths_match_naive(case, impl):
    """A tiny CompressedQwen3 gives the same logits and gradients with attn_impl=blocked and triton (interpreted
    kernels) as with attn_impl=naive, in float64."""
    from phasefix.model.config import ModelConfig
    from phasefix.model.qwen3 import CompressedQwen3

    cfg = {**dict(vocab_size=32, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=64, query_block=8), **case}
    torch.manual_seed(0)
    m_ref = CompressedQwen3(ModelConfig(**cfg, attn_impl="naive")).double()
    m_fast = CompressedQwen3(ModelConfig(**cfg, attn_impl=impl)).double()
    with torch.no_grad():
        for p in m_ref.parameters():  # make the sink and the gates matter
            p.add_(0.3 * torch.randn_like(p))
    m_fast.load_state_dict(m_ref.state_dict())
    ids = torch.randint(0, 32, (1, 21))
    out_ref, out_fast = m_ref(ids), m_fast(ids)
    torch.testing.assert_close(out_fast, out_ref, atol=1e-9, rtol=1e-9)
    out_ref.square().sum().backward()
    out_fast.square().sum().backward()
    for (n, a), b in zip(m_fast.named_parameters(), m_ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-9, rtol=1e-9, msg=lambda m, n=n: f"{n}: {m}")


def test_naive_and_triton_import_nothing_else_of_phasefix():
    code = ("import sys, phasefix.kernels, phasefix.kernels.compressed_attention.naive, "
            "phasefix.kernels.compressed_attention.triton, phasefix.kernels.gated_pool.naive, "
            "phasefix.kernels.gated_pool.triton; bad = [m for m in sys.modules if m.startswith('phasefix') and "
            "m != 'phasefix' and not m.startswith('phasefix.kernels')]; assert not bad, bad")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


AOT_SCRIPT = r'''
import importlib
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
ka = importlib.import_module("phasefix.kernels.compressed_attention.triton")
kg = importlib.import_module("phasefix.kernels.gated_pool.triton")

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
