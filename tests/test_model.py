"""The model (issue 2): HF parity, compressed attention against an independent float64 oracle, causality,
config validation and presets, and the blocked path's memory at long T. CPU, tiny sizes, well under a minute."""
from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest
import torch

from phasefix.errors import ConfigError
from phasefix.model import CompressedQwen3, ModelConfig, preset_names
from phasefix.kernels import window_grid as compression

sys.path.insert(0, str(Path(__file__).parent))
import oracle  # noqa: E402  (tests/oracle.py: the independent float64 oracle of the whole model)

# a small backbone; head_dim (16) != hidden_size / num_heads (8) on purpose
SMALL = dict(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=48, rope_theta=10000.0, query_block=8)


def randomize(model: torch.nn.Module, seed: int = 0, slot_prior: bool = False) -> torch.nn.Module:
    """Non-trivial values for every parameter (norm weights != 1, sharp gates, non-zero biases and sink), so no
    term of the computation can hide behind an identity initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * r)
            elif name.endswith("_gate"):
                p.copy_(0.5 * r)  # gate logits of order 1-3: clearly non-uniform slot weights
            elif name.endswith("_gate_bias") or name.endswith("sink"):
                p.copy_(r)
            elif name.startswith("embed_tokens") or name.startswith("lm_head"):
                p.copy_(r)
            else:
                p.copy_(0.2 * r)
        if slot_prior:
            for name, b in model.named_buffers():
                if name.endswith("slot_prior"):
                    b.copy_(torch.randn(b.shape, generator=g, dtype=b.dtype))
    return model


def small_model(seed: int = 0, dtype=torch.float64, slot_prior: bool = False, **overrides) -> CompressedQwen3:
    torch.manual_seed(seed)
    model = CompressedQwen3(ModelConfig(**{**SMALL, **overrides})).to(dtype)
    return randomize(model, seed, slot_prior).eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ================================================================================= parity with transformers
HF_CASES = {
    "tied_gqa2": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "untied_mha": dict(num_attention_heads=4, num_key_value_heads=4, head_dim=8, tie_word_embeddings=False),
    "untied_mqa": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=12, tie_word_embeddings=False),
    "tied_gqa3_3layers": dict(num_attention_heads=6, num_key_value_heads=2, head_dim=10, tie_word_embeddings=True,
                              num_hidden_layers=3, rope_theta=1e6),
}


def hf_model(seed: int, **kw):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    theta = kw.pop("rope_theta", 10000.0)
    cfg = dict(vocab_size=64, hidden_size=48, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=256,
               rms_norm_eps=1e-6, initializer_range=0.2, rope_parameters={"rope_type": "default", "rope_theta": theta})
    cfg.update(kw)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg, attn_implementation="eager")).float().eval()
    with torch.no_grad():  # HF initialises norms to 1: perturb them so the Q/K norms really are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("case", list(HF_CASES), ids=list(HF_CASES))
def test_hf_parity(case, tmp_path):
    hf = hf_model(0, **HF_CASES[case])
    ids = torch.randint(0, 64, (2, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = CompressedQwen3.from_hf(hf).eval()
        assert ours.config.attention == "full"
        assert ours.config.head_dim == HF_CASES[case]["head_dim"]
        assert ours.config.tie_embeddings == HF_CASES[case]["tie_word_embeddings"]
        assert max_diff(ours(ids), ref) <= 1e-4
        hf.save_pretrained(tmp_path)
        loaded = CompressedQwen3.from_hf(tmp_path).eval()
        assert max_diff(loaded(ids), ref) <= 1e-4
    assert (ours.lm_head.weight is ours.embed_tokens.weight) == HF_CASES[case]["tie_word_embeddings"]


def test_from_hf_compressed_init_and_oracle(tmp_path):
    """Switching a checkpoint to compressed attention: payload maps start as k_proj/v_proj, gates at zero; the
    converted model agrees with the oracle."""
    hf = hf_model(2, **HF_CASES["tied_gqa2"])
    model = CompressedQwen3.from_hf(hf, attention="compressed", window=8, stride=4, local_window=5,
                                    query_block=8).eval()
    for block in model.layers:
        comp, attn = block.attn.compressor, block.attn
        for b, proj in (("key", attn.k_proj), ("value", attn.v_proj)):
            for i in range(model.config.window):
                assert torch.equal(getattr(comp, f"{b}_payload")[i], proj.weight.t())
            assert getattr(comp, f"{b}_gate").abs().max() == 0
            assert getattr(comp, f"{b}_gate_bias").abs().max() == 0
    model = randomize(model.double(), 3)
    ids = torch.randint(0, 64, (1, 23), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert max_diff(model(ids), oracle.logits(model, ids)) <= 1e-9


# ================================================================================= the float64 oracle
ORACLE_CASES = {
    # (W, S) grid, both local-memory modes
    "w4s4": dict(window=4, stride=4),
    "w8s4": dict(window=8, stride=4),
    "w8s6": dict(window=8, stride=6),
    "w6s6": dict(window=6, stride=6),
    "w4s4_tail": dict(window=4, stride=4, local_memory="tail"),
    "w8s4_tail": dict(window=8, stride=4, local_memory="tail"),
    "w8s6_tail": dict(window=8, stride=6, local_memory="tail"),
    "w6s6_tail": dict(window=6, stride=6, local_memory="tail"),
    "w12s12_tail": dict(window=12, stride=12, local_memory="tail"),
    "w2s2": dict(window=2, stride=2),
    # gates
    "gate_vector": dict(window=8, stride=4, gate="vector"),
    "gate_vector_tail": dict(window=8, stride=6, gate="vector", local_memory="tail"),
    "gate_uniform": dict(window=8, stride=4, gate="uniform"),
    "gate_uniform_w6s6": dict(window=6, stride=6, gate="uniform"),
    "no_gate_bias": dict(window=8, stride=4, gate_bias=False),
    "vector_no_gate_bias": dict(window=4, stride=4, gate="vector", gate_bias=False),
    "slot_prior": dict(window=8, stride=4, _slot_prior=True),
    # K/V and norms
    "tied_kv": dict(window=8, stride=4, tied_kv=True),
    "tied_kv_tail": dict(window=4, stride=4, tied_kv=True, local_memory="tail"),
    "post_norm": dict(window=8, stride=4, post_norm=True),
    "post_norm_tied": dict(window=8, stride=6, post_norm=True, tied_kv=True, gate="vector"),
    "no_qk_norm": dict(window=8, stride=4, qk_norm=False),
    "no_qk_norm_post_norm": dict(window=4, stride=4, qk_norm=False, post_norm=True),
    # RoPE
    "rope_8_of_16": dict(window=8, stride=4, rope_dims=8),
    "rope_8_of_16_tail": dict(window=6, stride=6, rope_dims=8, local_memory="tail"),
    "no_rope": dict(window=8, stride=4, rope_dims=0),
    "rope_theta_small": dict(window=4, stride=4, rope_theta=50.0),
    # sink, grid offsets, heads, local window, blocking
    "sink": dict(window=8, stride=4, attention_sink=True),
    "sink_tail": dict(window=6, stride=6, attention_sink=True, local_memory="tail"),
    "grid_offsets": dict(window=8, stride=4, grid_offsets=[1, 3]),
    "grid_offsets_tail": dict(window=8, stride=6, grid_offsets=[5, 2], local_memory="tail"),
    "mqa": dict(window=8, stride=4, num_kv_heads=1),
    "mha": dict(window=4, stride=4, num_kv_heads=4),
    "local_window_1": dict(window=8, stride=4, local_window=1),
    "local_window_16": dict(window=4, stride=4, local_window=16),
    "query_block_1": dict(window=8, stride=6, query_block=1),
    "query_block_64": dict(window=8, stride=4, query_block=64),
    "untied_embeddings": dict(window=8, stride=4, tie_embeddings=False),
    # the DeepSeek-style kernels
    "deepseek_v4": dict(window=8, stride=4, gate="vector", tied_kv=True, rope_dims=8, attention_sink=True),
    "deepseek_v41": dict(window=2, stride=2, gate="vector", gate_bias=False, tied_kv=True, rope_dims=8,
                         attention_sink=True),
    # bridging the boundary (issue 16): token shift
    "token_shift_2": dict(window=4, stride=4, token_shift=2),
    "token_shift_3_w8s4_vector_tail": dict(window=8, stride=4, token_shift=3, gate="vector", local_memory="tail"),
    "token_shift_2_tied_post_norm": dict(window=4, stride=4, token_shift=2, tied_kv=True, post_norm=True),
    "token_shift_1_w6s6_tail_offsets": dict(window=6, stride=6, token_shift=1, local_memory="tail",
                                            grid_offsets=[5, 2]),
    "token_shift_2_uniform": dict(window=4, stride=4, token_shift=2, gate="uniform"),
    # per-KV-head grid offsets
    "head_offsets_spread": dict(window=4, stride=4, head_offsets="spread"),
    "head_offsets_spread_tail": dict(window=4, stride=4, head_offsets="spread", local_memory="tail"),
    "head_offsets_w8s4_vector_sink_rope8": dict(window=8, stride=4, head_offsets=[3, 1], gate="vector",
                                                attention_sink=True, rope_dims=8),
    "head_offsets_plus_grid_offsets_wrap": dict(window=6, stride=6, head_offsets=[4, 1], grid_offsets=[3, 5],
                                                local_memory="tail"),  # 3+4 and 5+4 wrap around S
    "head_offsets_tied_post_norm": dict(window=4, stride=4, head_offsets=[2, 0], tied_kv=True, post_norm=True),
    "head_offsets_equal": dict(window=4, stride=4, head_offsets=[1, 1]),
    "head_offsets_mha_spread_prior": dict(window=4, stride=4, num_kv_heads=4, head_offsets="spread",
                                          _slot_prior=True),
    # all three bridges at once
    "bridges_w5s4_shift2_spread_tail": dict(window=5, stride=4, token_shift=2, head_offsets="spread",
                                            local_memory="tail"),
    # per-layer compression (issue 66): CSA-like, HCA-like and local-window-only layers, cycled over 4 layers
    "layers_csa_hca_none": dict(num_layers=4, num_kv_heads=1, layer_compression=["8/4", "12/12", "none"]),
    "layers_csa_hca_tail_offsets": dict(num_layers=3, layer_compression=[[6, 3], [10, 5]], local_memory="tail",
                                        grid_offsets=[2, 4], head_offsets="spread"),
    "layers_none_first_shift_sink": dict(num_layers=3, num_kv_heads=1, layer_compression=["none", "8/4", "6/6"],
                                         token_shift=2, attention_sink=True, gate="vector", tied_kv=True),
    # the grid-offset rules across depth, on per-layer strides
    "grid_stagger": dict(num_layers=3, num_kv_heads=1, layer_compression=["8/4", "6/6"], grid_offsets="stagger"),
    "grid_half": dict(num_layers=3, window=6, stride=6, grid_offsets="half", local_memory="tail"),
    "grid_coprime": dict(num_layers=2, num_kv_heads=1, window=8, stride=4, grid_offsets="coprime"),
    # the boundary bridge (zero-parameter edges across the boundary, arXiv 2606.02680)
    "boundary_bridge_1": dict(window=4, stride=4, boundary_bridge=1),
    "boundary_bridge_2_w8s4_vector_tail_prior": dict(window=8, stride=4, boundary_bridge=2, gate="vector",
                                                     local_memory="tail", _slot_prior=True),
    "boundary_bridge_layers_offsets": dict(num_layers=2, num_kv_heads=1, layer_compression=["8/4", "6/6"],
                                           boundary_bridge=3, grid_offsets=[1, 5], token_shift=2),
    # the baseline goes through the same oracle
    "full_attention": dict(attention="full"),
}


@pytest.mark.parametrize("case", list(ORACLE_CASES), ids=list(ORACLE_CASES))
def test_matches_float64_oracle(case):
    overrides = dict(ORACLE_CASES[case])
    slot_prior = overrides.pop("_slot_prior", False)
    overrides.setdefault("local_window", 5)
    model = small_model(seed=len(case), slot_prior=slot_prior, **overrides)
    T = 37  # not a multiple of any S above
    ids = torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = model(ids)
    ref = oracle.logits(model, ids)
    assert ours.dtype == torch.float64
    assert ref.abs().max() > 1.0  # logits of a healthy size: the comparison is meaningful
    assert max_diff(ours, ref) <= 1e-9, case


NAIVE_ORACLE_CASES = ["w8s6", "w8s4_tail", "gate_vector_tail", "sink_tail", "grid_offsets_tail", "mqa",
                      "local_window_1", "deepseek_v4", "token_shift_3_w8s4_vector_tail",
                      "head_offsets_w8s4_vector_sink_rope8", "head_offsets_plus_grid_offsets_wrap",
                      "bridges_w5s4_shift2_spread_tail", "layers_csa_hca_none", "layers_none_first_shift_sink",
                      "boundary_bridge_2_w8s4_vector_tail_prior"]


@pytest.mark.parametrize("case", NAIVE_ORACLE_CASES, ids=NAIVE_ORACLE_CASES)
def test_naive_attention_matches_float64_oracle(case):
    """attn_impl=naive (the reference the kernels are tested against,
    phasefix/kernels/compressed_attention/naive.py: a dense masked softmax) against the oracle (per-query loops over
    the visible keys): two formulations, one answer."""
    overrides = dict(ORACLE_CASES[case])
    slot_prior = overrides.pop("_slot_prior", False)
    overrides.setdefault("local_window", 5)
    model = small_model(seed=len(case), slot_prior=slot_prior, attn_impl="naive", **overrides)
    ids = torch.randint(0, 32, (1, 37), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert max_diff(model(ids), oracle.logits(model, ids)) <= 1e-9, case


BRIDGE_LONG = {  # T = 63 and several heads: 8 query heads over 4 KV heads
    "token_shift_2_w4s4_tail": dict(window=4, stride=4, token_shift=2, local_memory="tail"),
    "spread_w4s4_tail": dict(window=4, stride=4, head_offsets="spread", local_memory="tail"),
    "offsets_1013_w5s4_shift3_sink": dict(window=5, stride=4, head_offsets=[1, 0, 1, 3], token_shift=3,
                                          attention_sink=True, grid_offsets=[2]),
}


@pytest.mark.parametrize("case", list(BRIDGE_LONG), ids=list(BRIDGE_LONG))
def test_bridges_match_float64_oracle_values_and_gradients(case):
    """The bridging options at T = 63 with 4 KV heads: logits, and the gradient of a random projection of the
    logits with respect to the embeddings, the token-shift mix and the key gates, against the (differentiable)
    oracle."""
    model = small_model(seed=len(case), num_layers=1, num_heads=8, num_kv_heads=4, local_window=5,
                        **BRIDGE_LONG[case])
    ids = torch.randint(0, 32, (1, 63), generator=torch.Generator().manual_seed(8))
    proj = torch.randn(1, 63, 32, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    names = [n for n in ("embed_tokens.weight", "layers.0.attn.compressor.token_shift",
                         "layers.0.attn.compressor.key_gate", "layers.0.attn.compressor.value_payload",
                         "layers.0.attn.sink")
             if n in dict(model.named_parameters())]
    model.zero_grad()
    ours = model(ids)
    (ours * proj).sum().backward()
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters() if n in names}
    ref = oracle.logits(model, ids, params)
    assert max_diff(ours.detach(), ref.detach()) <= 1e-9
    grads = torch.autograd.grad((ref * proj).sum(), [params[n] for n in names])
    for n, g in zip(names, grads):
        p = dict(model.named_parameters())[n]
        assert g.abs().max() > 1e-6, n  # the term really contributes
        assert max_diff(p.grad, g) <= 1e-9, n


def test_oracle_batch_and_query_blocks():
    """Batch rows are independent and the query block size changes nothing (beyond rounding)."""
    model = small_model(seed=11, window=8, stride=4, local_window=3, gate="vector", attention_sink=True)
    ids = torch.randint(0, 32, (3, 41), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        outs = []
        for qb in (1, 7, 16, 100):
            model.config.query_block = qb
            outs.append(model(ids))
        single = model(ids[1:2])
    for o in outs[1:]:
        assert max_diff(o, outs[0]) <= 1e-12
    assert max_diff(single, outs[-1][1:2]) <= 1e-12


def test_gated_pool_and_grid_helpers():
    """The window grid every implementation follows (window positions, visibility, tail start, entry positions)
    and uniform pooling."""
    from phasefix.kernels.gated_pool.naive import gated_pool

    pos = compression.window_positions(13, 8, 4)
    assert pos.tolist() == [[-4, -3, -2, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 8, 9, 10, 11]]
    assert compression.window_positions(13, 6, 4, grid_offset=1)[0].tolist() == [-3, -2, -1, 0, 1, 2]
    t = torch.arange(12)
    assert compression.num_visible(t, 4).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert compression.tail_start(t, 4).tolist() == [0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12]
    assert compression.entry_positions(3, 4).tolist() == [0, 4, 8]
    payload = torch.randn(2, 3, 4, 2, 5, dtype=torch.float64)
    logits = torch.zeros(2, 3, 4, 2, 1, dtype=torch.float64)
    logits[:, 0, :2] = float("-inf")  # empty slots of the first window
    out = gated_pool(payload, logits)
    assert torch.allclose(out[:, 1:], payload[:, 1:].mean(2))
    assert torch.allclose(out[:, 0], payload[:, 0, 2:].mean(1))


# ================================================================================= causality
CAUSAL_CASES = {
    "w4s4": dict(window=4, stride=4),
    "w8s4_vector_tied_sink": dict(window=8, stride=4, gate="vector", tied_kv=True, attention_sink=True, rope_dims=8),
    "w8s6_tail": dict(window=8, stride=6, local_memory="tail"),
    "w6s6_offsets": dict(window=6, stride=6, grid_offsets=[2, 5]),
    "w4s4_uniform_tail": dict(window=4, stride=4, gate="uniform", local_memory="tail"),
    "w4s4_shift2": dict(window=4, stride=4, token_shift=2),
    "w8s6_shift3_tail_offsets": dict(window=8, stride=6, token_shift=3, local_memory="tail", grid_offsets=[5, 1]),
    "w4s4_spread": dict(window=4, stride=4, head_offsets="spread"),
    "w4s4_spread_tail_shift2": dict(window=4, stride=4, head_offsets="spread", local_memory="tail", token_shift=2),
    "w6s6_heads_offsets_tail": dict(window=6, stride=6, head_offsets=[5, 2], grid_offsets=[2, 4],
                                    local_memory="tail"),
    "w5s4_spread_shift3_vector_tied_sink": dict(window=5, stride=4, head_offsets="spread", token_shift=3,
                                                gate="vector", tied_kv=True, attention_sink=True),
}


def logit_change(model, ids, pos: int) -> torch.Tensor:
    """Max |logit change| at every position [T] when the token at `pos` is replaced."""
    other = ids.clone()
    other[:, pos] = (other[:, pos] + 1 + pos) % model.config.vocab_size
    with torch.no_grad():
        return (model(ids) - model(other)).abs().amax(dim=(0, 2))


@pytest.mark.parametrize("case", list(CAUSAL_CASES), ids=list(CAUSAL_CASES))
def test_strict_causality(case):
    model = small_model(seed=21, local_window=4, **CAUSAL_CASES[case])
    ids = torch.randint(0, 32, (2, 45), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        base = model(ids)
        for t in (0, 3, 4, 11, 23, 30, 43):
            other = ids.clone()
            other[:, t + 1:] = torch.randint(0, 32, other[:, t + 1:].shape, generator=torch.Generator().manual_seed(t))
            changed = model(other)
            assert max_diff(changed[:, : t + 1], base[:, : t + 1]) == 0.0, (case, t)
            if t + 1 < ids.shape[1]:
                assert max_diff(changed[:, t + 1:], base[:, t + 1:]) > 1e-6


@pytest.mark.parametrize("case", list(CAUSAL_CASES), ids=list(CAUSAL_CASES))
def test_far_token_flows_through_entries(case):
    """One layer, local window 4: the token at position 2 can reach the query at 60 only through an entry."""
    model = small_model(seed=31, num_layers=1, local_window=4, **CAUSAL_CASES[case])
    ids = torch.randint(0, 32, (1, 64), generator=torch.Generator().manual_seed(32))
    assert logit_change(model, ids, 2)[60] > 1e-6


def first_seen(s: int, S: int, d: int) -> int:
    """The first query that sees token s through an entry: the end of the first window holding s to complete."""
    j = -(-(s + 1 + d) // S) - 1  # the smallest j with (j+1)S-1-d >= s
    return (j + 1) * S - 1 - d


BOUNDARY_CASES = {
    "w4s4": dict(window=4, stride=4),
    "w8s4": dict(window=8, stride=4),
    "w8s6_vector": dict(window=8, stride=6, gate="vector"),
    "w6s6_offset": dict(window=6, stride=6, grid_offsets=[4]),
    "w8s4_offset_tied": dict(window=8, stride=4, grid_offsets=[3], tied_kv=True, attention_sink=True),
    "w4s4_heads_13": dict(window=4, stride=4, head_offsets=[1, 3]),
    "w6s6_spread_offset": dict(window=6, stride=6, head_offsets="spread", grid_offsets=[4]),  # heads: 4, 7 = 1
    "w5s4_heads_20_shift2": dict(window=5, stride=4, head_offsets=[2, 0], token_shift=2),
}


def head_offsets_by_hand(cfg: dict) -> list[int]:
    """Each KV head's grid offset in layer 0: (layer offset + head offset) mod S, spread = floor(h S / HKV)."""
    S, HKV = cfg["stride"], cfg.get("num_kv_heads", SMALL["num_kv_heads"])
    heads = cfg.get("head_offsets", "none")
    if isinstance(heads, str):
        heads = {"none": [0] * HKV, "spread": [h * S // HKV for h in range(HKV)]}[heads]
    return [((cfg.get("grid_offsets") or [0])[0] + d) % S for d in heads]


@pytest.mark.parametrize("case", list(BOUNDARY_CASES), ids=list(BOUNDARY_CASES))
def test_entry_visible_exactly_when_window_completes(case):
    """local_window=1 (a query sees only itself raw): token s changes query s, then nothing until the first window
    holding s is complete, and from that query on it does (two layers, so nothing leaks through layer 2 either)."""
    cfg = BOUNDARY_CASES[case]
    model = small_model(seed=41, local_window=1, **cfg)
    S = cfg["stride"]
    ids = torch.randint(0, 32, (1, 40), generator=torch.Generator().manual_seed(42))
    for s in (0, 1, 5, 9, 14, 20):
        change = logit_change(model, ids, s)
        end = min(first_seen(s, S, d) for d in head_offsets_by_hand(cfg))  # the first head whose window completes
        assert s <= end <= s + S - 1
        assert (change[:s] == 0).all(), (case, s)  # causality
        assert change[s] > 1e-6, (case, s)  # the query sees itself raw
        assert (change[s + 1:end] == 0).all(), (case, s, end, change[s + 1:end])  # window still incomplete
        assert change[end] > 1e-6, (case, s, end)
        assert change[end:].min() > 1e-6, (case, s, end)


def test_tail_mode_sees_the_incomplete_window_raw():
    """With the uncompressed tail, token s is raw-visible to every query until its window completes."""
    model = small_model(seed=51, num_layers=1, window=6, stride=6, local_memory="tail")
    ids = torch.randint(0, 32, (1, 30), generator=torch.Generator().manual_seed(52))
    for s in (0, 7, 13):
        change = logit_change(model, ids, s)
        assert (change[:s] == 0).all()
        assert change[s:].min() > 1e-6


# ================================================================================= bridging the boundary
def test_token_shift_starts_as_the_identity():
    """At initialisation a token-shift model computes exactly what the same model without it does."""
    torch.manual_seed(0)
    shifted = CompressedQwen3(ModelConfig(**SMALL, token_shift=3)).double()
    torch.manual_seed(0)
    plain = CompressedQwen3(ModelConfig(**SMALL)).double()
    mix = shifted.layers[0].attn.compressor.token_shift
    assert mix.shape == (3, SMALL["hidden_size"]) and (mix[-1] == 1).all() and (mix[:-1] == 0).all()
    missing = plain.load_state_dict(shifted.state_dict(), strict=False)
    assert sorted(missing.unexpected_keys) == [f"layers.{i}.attn.compressor.token_shift" for i in range(2)]
    ids = torch.randint(0, 32, (2, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert max_diff(shifted(ids), plain(ids)) == 0.0


@pytest.mark.parametrize("K", [0, 2, 3])
def test_token_shift_bridges_the_boundary(K):
    """W = S: entry j reads the previous window's last token jS-1 (the boundary phase) only with a token shift;
    with width K it reads tokens jS-K+1 .. (j+1)S-1 and nothing else, key and value branches alike."""
    S = 4
    model = small_model(seed=61, window=S, stride=S, token_shift=K)
    attn = model.layers[0].attn
    x = torch.randn(1, 26, SMALL["hidden_size"], dtype=torch.float64, requires_grad=True)
    k_cmp, v_cmp, _ = attn.compressor(x, attn.k_norm)  # [B, N, HKV, D]
    for j in (1, 2, 5):
        for out in (k_cmp, v_cmp):
            r = torch.randn_like(out[:, j])
            g = torch.autograd.grad((out[:, j] * r).sum(), x, retain_graph=True)[0][0].abs().amax(-1)  # [T]
            first = j * S - max(K - 1, 0)  # the earliest token the entry reads
            assert (g[j * S : (j + 1) * S] > 0).all()  # its own window
            assert (g[first : j * S] > 1e-8).all() and (g[:first] == 0).all(), (K, j, g)
            assert (g[(j + 1) * S :] == 0).all()  # causal: nothing after the window's last token
            assert (g[j * S - 1] > 1e-8) == (K >= 2)


def test_head_offsets_spread_entries_start_at_different_positions():
    """spread, W4/S4, 2 KV heads: head 0 pools tokens [jS, jS+3], head 1 (offset 2) tokens [jS-2, jS+1]; the
    gradient of each head's entry j with respect to the compressor's input shows exactly its own window."""
    S = 4
    model = small_model(seed=71, window=S, stride=S, head_offsets="spread")
    attn = model.layers[0].attn
    assert attn.compressor.head_offsets == [0, 2]
    x = torch.randn(1, 26, SMALL["hidden_size"], dtype=torch.float64, requires_grad=True)
    k_cmp, v_cmp, gates = attn.compressor(x, attn.k_norm)
    assert k_cmp.shape[1] == (26 + 2) // S and gates["key"].shape[1] == 26 // S  # head 1 has one more entry
    for j in (1, 3, 5):
        for h, d in ((0, 0), (1, 2)):
            for out in (k_cmp, v_cmp):
                r = torch.randn_like(out[:, j, h])
                g = torch.autograd.grad((out[:, j, h] * r).sum(), x, retain_graph=True)[0][0].abs().amax(-1)
                seen = g.nonzero().flatten().tolist()
                assert seen == list(range(j * S - d, (j + 1) * S - d)), (j, h, seen)


def test_cost_helpers_on_the_tiny_preset():
    """Cache entries and compressor multiply-adds per token, and parameters: the documented numbers for tiny
    (C=128, HKV=2, D=32, 2 layers, scalar gates with biases, K and V branches), checked against the formulas by
    hand and the parameter count against the built model."""
    from phasefix.model.config import cache_entries_per_token, compressor_flops_per_token

    per_slot = 2 * 128 * (2 * 32 + 2)  # two branches, payload C x HKV*D and gate C x HKV: 16896
    for over, entries, flops in (
        (dict(), 2 * 2 / 4, 2 * per_slot),  # W4/S4: 33792
        (dict(window=5), 1.0, 2 * 1.25 * per_slot),  # W5/S4: 42240
        (dict(window=8), 1.0, 2 * 2 * per_slot),  # W8/S4: 67584
        (dict(token_shift=2), 1.0, 2 * (per_slot + 2 * 128)),  # 34304
        (dict(head_offsets="spread"), 1.0, 2 * per_slot),
        (dict(stride=8), 2 * 2 / 8, 2 * per_slot),  # W8/S8
        (dict(attention="full"), 0.0, 0.0),
    ):
        cfg = ModelConfig.from_name("tiny", **over)
        assert cache_entries_per_token(cfg) == entries, over
        assert compressor_flops_per_token(cfg) == flops, over
        model = CompressedQwen3(cfg)
        built = sum(p.numel() for c in model.compressors() for p in c.parameters())
        assert cfg.compressor_params() == built, over
    assert ModelConfig.from_name("tiny").compressor_params() == 2 * 2 * (4 * 128 * 64 + 4 * 128 * 2 + 4 * 2)


def test_per_layer_costs_sum_over_layers():
    """Per-layer compression (issue 66): entries, multiply-adds and parameters are the sums of each layer's, by hand:
    tiny's width (C=128, D=32) with one KV head, layers 8/4 (CSA-like), 16/16 (HCA-like) and none (no compressor)."""
    per_slot = 2 * 128 * (32 + 1)  # two branches, payload C x D and a scalar gate C x 1: 8448
    cfg = ModelConfig.from_name("tiny", num_layers=3, num_kv_heads=1, layer_compression=["8/4", [16, 16], "none"])
    assert cfg.layer_compression == ["8/4", "16/16", "none"]  # [W, S] lists read as 'W/S'
    assert cfg.layer_shapes() == [(8, 4), (16, 16), None] and cfg.phase_stride == 16
    assert cfg.cache_entries_per_token() == 1 / 4 + 1 / 16
    assert cfg.compressor_flops_per_token() == 8 / 4 * per_slot + 16 / 16 * per_slot
    model = CompressedQwen3(cfg)
    assert model.layers[2].attn.compressor is None
    assert [c.window for c in model.compressors()] == [8, 16]
    assert cfg.compressor_params() == sum(p.numel() for c in model.compressors() for p in c.parameters())
    # cycled over 4 layers: 8/4, 16/16, none, 8/4
    four = ModelConfig.from_name("tiny", num_layers=4, num_kv_heads=1, layer_compression=["8/4", "16/16", "none"])
    assert four.cache_entries_per_token() == 2 / 4 + 1 / 16
    # the boundary bridge adds no parameters, entries or multiply-adds (its slots reuse the previous window's)
    bridged = ModelConfig.from_name("tiny", boundary_bridge=1)
    plain = ModelConfig.from_name("tiny")
    assert (bridged.compressor_params(), bridged.cache_entries_per_token(), bridged.compressor_flops_per_token()) \
        == (plain.compressor_params(), plain.cache_entries_per_token(), plain.compressor_flops_per_token())
    assert sum(p.numel() for p in CompressedQwen3(bridged).parameters()) == \
        sum(p.numel() for p in CompressedQwen3(plain).parameters())


def test_grid_offset_rules_by_hand():
    """stagger floor(l S_l / L), half (S_l // 2 on odd layers) and coprime (l k mod S_l, k the first integer >=
    S_l // L coprime to S_l), per layer on its own stride; a 'none' layer has offset 0."""
    def offsets(rule, **kw):
        cfg = ModelConfig(**{**SMALL, "num_kv_heads": 1, "grid_offsets": rule, **kw})
        return [cfg.grid_offset(layer) for layer in range(cfg.num_layers)]

    assert offsets("stagger", num_layers=2) == [0, 2]  # S = 4
    assert offsets("half", num_layers=4) == [0, 2, 0, 2]
    assert offsets("coprime", num_layers=2) == [0, 3]  # S // L = 2 shares a factor with 4: k = 3
    assert offsets("coprime", num_layers=4) == [0, 1, 2, 3]  # k = 1: the stagger itself
    assert offsets("stagger", num_layers=3, layer_compression=["8/4", "16/16", "none"]) == [0, 5, 0]
    assert offsets("coprime", num_layers=3, layer_compression=["8/4", "16/16", "none"]) == [0, 5, 0]  # 5 coprime
    assert offsets("half", num_layers=2, layer_compression=["8/4", "16/16"]) == [0, 8]
    assert offsets([1, 9], num_layers=2, layer_compression=["8/4", "16/16"]) == [1, 9]  # layer 1's S is 16


def test_head_offsets_accepts_hydra_lists():
    from omegaconf import OmegaConf

    cfg = ModelConfig.from_dict(dict(OmegaConf.create({**SMALL, "head_offsets": [3, 1], "grid_offsets": [2]})))
    assert cfg.head_offsets == [3, 1] and cfg.head_grid_offsets(0) == [1, 3]
    assert ModelConfig(**SMALL, head_offsets=None).head_grid_offsets(0) == [0, 0]
    assert ModelConfig(**{**SMALL, "num_kv_heads": 4}, stride=8, window=8, head_offsets="spread"
                       ).head_grid_offsets(1) == [0, 2, 4, 6]


# ================================================================================= configs and presets
INVALID = {
    "window_lt_stride": (dict(window=2, stride=4), "model.window"),
    "stride_zero": (dict(stride=0), "model.stride"),
    "stride_negative": (dict(stride=-4, window=4), "model.stride"),
    "local_window_negative": (dict(local_window=-1), "model.local_window"),
    "rope_dims_odd": (dict(rope_dims=7), "model.rope_dims"),
    "rope_dims_too_large": (dict(rope_dims=34), "model.rope_dims"),
    "rope_dims_negative": (dict(rope_dims=-2), "model.rope_dims"),
    "heads_not_divisible": (dict(num_heads=6, num_kv_heads=4), "model.num_heads"),
    "attention_enum": (dict(attention="sparse"), "model.attention"),
    "local_memory_enum": (dict(local_memory="ring"), "model.local_memory"),
    "gate_enum": (dict(gate="matrix"), "model.gate"),
    "attn_impl_enum": (dict(attn_impl="cuda"), "model.attn_impl"),
    "payload_init_enum": (dict(payload_init="zeros"), "model.payload_init"),
    "grid_offset_too_large": (dict(grid_offsets=[4]), "model.grid_offsets"),
    "token_shift_negative": (dict(token_shift=-1), "model.token_shift"),
    "token_shift_not_int": (dict(token_shift=1.5), "model.token_shift"),
    "token_shift_full_attention": (dict(attention="full", token_shift=2), "model.token_shift"),
    "head_offsets_unknown": (dict(head_offsets="random"), "model.head_offsets"),
    "head_offsets_length": (dict(head_offsets=[0]), "model.head_offsets"),
    "head_offsets_range": (dict(head_offsets=[0, 4]), "model.head_offsets"),
    "head_offsets_full_attention": (dict(attention="full", head_offsets="spread"), "model.head_offsets"),
    "layer_compression_w_lt_s": (dict(layer_compression=["2/4"]), "model.layer_compression"),
    "layer_compression_garbage": (dict(layer_compression=["8-4"]), "model.layer_compression"),
    "layer_compression_string": (dict(layer_compression="8/4"), "model.layer_compression"),
    "layer_compression_all_none": (dict(layer_compression=["none"]), "model.layer_compression"),
    "layer_compression_full_attention": (dict(attention="full", layer_compression=["8/4"]),
                                         "model.layer_compression"),
    "grid_offsets_rule_unknown": (dict(grid_offsets="random"), "model.grid_offsets"),
    "grid_offsets_per_layer_stride": (dict(layer_compression=["8/8", "4/4"], grid_offsets=[5, 5]),
                                      "model.grid_offsets"),
    "boundary_bridge_gt_stride": (dict(boundary_bridge=5), "model.boundary_bridge"),
    "boundary_bridge_negative": (dict(boundary_bridge=-1), "model.boundary_bridge"),
}


@pytest.mark.parametrize("case", list(INVALID), ids=list(INVALID))
def test_invalid_config(case):
    overrides, key = INVALID[case]
    with pytest.raises(ConfigError) as e:
        ModelConfig(**{**SMALL, **overrides})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(key), msg
    if case.endswith("_enum"):
        allowed = {"attention": "full", "local_memory": "tail", "gate": "uniform", "attn_impl": "triton",
                   "payload_init": "shared"}
        assert "allowed values" in msg and repr(allowed[key.split(".")[1]]) in msg, msg


def test_attn_impl_values():
    """Every implementation of phasefix/kernels/ and auto are accepted; `torch`, the blocked path's earlier name
    that stored configs of earlier runs carry, still loads, as blocked."""
    for impl in ("naive", "blocked", "triton", "auto"):
        assert ModelConfig(**SMALL, attn_impl=impl).attn_impl == impl
    assert ModelConfig(**SMALL, attn_impl="torch").attn_impl == "blocked"
    assert ModelConfig.from_name("tiny").attn_impl == "blocked"


def test_payload_init_shared_starts_every_slot_equal():
    torch.manual_seed(0)
    shared = CompressedQwen3(ModelConfig(**{**SMALL, "window": 8, "stride": 8, "payload_init": "shared"}))
    indep = CompressedQwen3(ModelConfig(**{**SMALL, "window": 8, "stride": 8}))
    auto8 = CompressedQwen3(ModelConfig(**{**SMALL, "window": 8, "stride": 8, "payload_init": "auto"}))
    auto4 = CompressedQwen3(ModelConfig(**{**SMALL, "window": 4, "stride": 4, "payload_init": "auto"}))
    for model, equal in ((shared, True), (indep, False), (auto8, True), (auto4, False)):
        comp = model.layers[0].attn.compressor
        for name in ("key_payload", "value_payload"):
            p = getattr(comp, name)
            assert p.shape[0] == model.config.window and p.std() > 0.01
            assert torch.equal(p, p[:1].expand_as(p)) is equal, (name, equal)
            with torch.no_grad():  # each slot owns its storage (no expanded view): changing one leaves the rest
                before = p[1].clone()
                p[0].add_(1.0)
            assert torch.equal(p[1], before)


def test_invalid_keys_and_presets():
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict({**SMALL, "windw": 4})
    assert str(e.value).startswith("model.windw") and "window" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_name("tiny", strides=2)
    assert str(e.value).startswith("model.strides")
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_name("qwen3_6b")
    assert str(e.value).startswith("model=") and "'tiny'" in str(e.value) and "\n" not in str(e.value)


def test_presets():
    names = preset_names()
    assert {"tiny", "qwen3_0_6b", "deepseek_v4_style", "deepseek_v41_style", "full_attention"} <= set(names)
    for name in names:
        assert ModelConfig.from_name(name).name == name
    q = ModelConfig.from_name("qwen3_0_6b")
    assert (q.num_layers, q.hidden_size, q.num_heads, q.num_kv_heads, q.head_dim) == (28, 1024, 16, 8, 128)
    assert (q.attention, q.window, q.stride, q.gate, q.gate_bias, q.tied_kv, q.qk_norm, q.rope_width) == \
        ("compressed", 8, 8, "scalar", True, False, True, 128)
    ds = ModelConfig.from_name("deepseek_v4_style")
    assert (ds.window, ds.stride, ds.gate, ds.tied_kv, ds.rope_dims, ds.attention_sink) == (8, 4, "vector", True, 16,
                                                                                          True)
    assert ds.head_dim == 128
    v41 = ModelConfig.from_name("deepseek_v41_style")
    assert (v41.window, v41.stride, v41.gate, v41.gate_bias) == (2, 2, "vector", False)
    assert ModelConfig.from_name("full_attention").attention == "full"
    assert ModelConfig.from_name("tiny", stride=2, window=2).stride == 2


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_runs_shrunk(name):
    """Every preset's attention settings run end to end on a shrunk backbone (the big ones are never built)."""
    cfg = ModelConfig.from_name(name)
    shrink = dict(vocab_size=32, hidden_size=32, num_layers=1, intermediate_size=48, num_heads=4, num_kv_heads=2,
                  head_dim=32, attn_impl="blocked")
    model = CompressedQwen3(ModelConfig.from_name(name, **shrink))
    assert model.config.window == cfg.window and model.config.gate == cfg.gate
    logits = model(torch.randint(0, 32, (2, 19)))
    assert logits.shape == (2, 19, 32) and torch.isfinite(logits).all()
    logits.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_tiny_preset_is_small():
    model = CompressedQwen3.from_name("tiny")
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


# ================================================================================= the blocked path scales
def test_tiny_forward_at_16k_builds_no_txt_matrix(monkeypatch):
    """tiny at T=16384: every query's score row is short (entries + local keys + sink), never ~T long, whether the
    blocked path computes it with torch.softmax or with a masked scaled_dot_product_attention; memory stays modest."""
    T = 16384
    model = CompressedQwen3.from_name("tiny").eval()
    cfg = model.config
    widest, largest = [0], [0]  # longest score row, largest score matrix
    real_softmax, real_sdpa = torch.softmax, torch.nn.functional.scaled_dot_product_attention

    def softmax_spy(x, dim=-1, *args, **kwargs):
        if dim in (-1, x.dim() - 1):  # (the slot softmax of the pooling runs over dim 2)
            widest[0], largest[0] = max(widest[0], x.shape[-1]), max(largest[0], x.numel())
        return real_softmax(x, dim, *args, **kwargs)

    def sdpa_spy(q, k, v, *args, **kwargs):
        widest[0] = max(widest[0], k.shape[-2])
        largest[0] = max(largest[0], q.shape[:-1].numel() * k.shape[-2])
        return real_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch, "softmax", softmax_spy)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)
    ids = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with torch.no_grad():
        logits = model(ids)
    grown_gib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2**20
    assert logits.shape == (1, T, cfg.vocab_size) and torch.isfinite(logits).all()
    row = T // cfg.stride + cfg.query_block + cfg.local_window  # entries + the block's raw keys + the sink
    assert 0 < widest[0] <= row < T // 2, widest  # ~4.4k here, never ~T
    assert largest[0] <= cfg.query_block * cfg.num_heads * row
    assert grown_gib < 3.0, grown_gib
