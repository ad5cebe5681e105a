"""Mitigations: each loss on hand-built gate distributions, a few optimiser steps spreading collapsed gates, the
hard gate-diversity parametrisation under adversarial parameters, the controls, composition and the configs."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from phasefix.errors import ConfigError
from phasefix.mitigations import REGISTRY, build_mitigations, static_gate_distribution
from phasefix.plots import gate_heatmap
from phasefix.mitigations.gate_losses import slot_assignment
from phasefix.mitigations.gates import effective_slots
from phasefix.model import CompressedQwen3, ModelConfig
from phasefix.paths import CONF_DIR

GATE_LOSSES = ("gate_diversity", "head_coord", "layer_coord", "slot_coverage")


# ------------------------------------------------------------------------------------------------ helpers
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def fake(cfg: ModelConfig):
    """Stands in for the model: the losses only read `config`."""
    return SimpleNamespace(config=cfg)


def gates_from(static_per_layer, N=5, B=2, garbage_windows=()):
    """Per layer {"key": [B, N, W, HKV]} whose every window equals the given [HKV, W] distribution; windows listed
    in garbage_windows[layer] hold all mass on the last slot (they must be excluded as incomplete)."""
    out = []
    for layer, P in enumerate(static_per_layer):
        P = torch.as_tensor(P, dtype=torch.float32)
        a = P.T[None, None].expand(B, N, *P.T.shape).clone()  # [B, N, W, HKV]
        for j in (garbage_windows[layer] if layer < len(garbage_windows) else ()):
            a[:, j] = 0.0
            a[:, j, -1] = 1.0
        out.append({"key": a})
    return out


def term(name, cfg, gates, **opts):
    (m,) = build_mitigations({name: {"weight": 1.0, **opts}})
    m.configure_model(cfg)
    return float(m.loss(fake(cfg), gates)[name])


ONE_HOT = torch.eye(4)
UNIFORM = torch.full((4,), 0.25)


# ------------------------------------------------------------------------------------------------ losses by hand
def test_gate_diversity_soft_by_hand():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    soft = dict(mode="soft")
    # the heads together cover every slot: mean is uniform -> 0
    assert term("gate_diversity", cfg, gates_from([[[.5, .5, 0, 0], [0, 0, .5, .5]]]), **soft) == \
        pytest.approx(0, abs=1e-6)
    # disjoint one-hot heads cover 2 of 4 slots: 1 - log 2 / log 4 = 0.5
    assert term("gate_diversity", cfg, gates_from([ONE_HOT[[0, 2]]]), **soft) == pytest.approx(0.5, abs=1e-6)
    # collided on slot 0: 1
    assert term("gate_diversity", cfg, gates_from([ONE_HOT[[0, 0]]]), **soft) == pytest.approx(1.0, abs=1e-6)
    cfg4 = ModelConfig(window=4, stride=4, num_kv_heads=4, num_heads=4, num_layers=1)
    assert term("gate_diversity", cfg4, gates_from([ONE_HOT]), **soft) == pytest.approx(0, abs=1e-6)
    assert term("gate_diversity", cfg4, gates_from([ONE_HOT[[0, 1, 1, 0]]]), **soft) == pytest.approx(0.5, abs=1e-6)


def test_gate_diversity_per_head_by_hand():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    assert term("gate_diversity", cfg, gates_from([torch.stack([UNIFORM, UNIFORM])])) == pytest.approx(0, abs=1e-6)
    assert term("gate_diversity", cfg, gates_from([ONE_HOT[[0, 0]]])) == pytest.approx(1.0, abs=1e-6)
    # per head, not the union: heads on disjoint halves, or one-hot on distinct slots, still pay
    halves = [[.5, .5, 0, 0], [0, 0, .5, .5]]
    assert term("gate_diversity", cfg, gates_from([halves])) == pytest.approx(1 - math.log(2) / math.log(4))
    assert term("gate_diversity", cfg, gates_from([halves]), mode="soft") == pytest.approx(0, abs=1e-6)
    cfg4 = ModelConfig(window=4, stride=4, num_kv_heads=4, num_heads=4, num_layers=1)
    assert term("gate_diversity", cfg4, gates_from([ONE_HOT])) == pytest.approx(1.0, abs=1e-6)
    assert term("gate_diversity", cfg4, gates_from([ONE_HOT]), mode="soft") == pytest.approx(0, abs=1e-6)
    cfg2 = ModelConfig(window=2, stride=2, num_kv_heads=2, num_layers=1)  # two heads collapsed on the two slots
    assert term("gate_diversity", cfg2, gates_from([torch.eye(2)])) == pytest.approx(1.0, abs=1e-6)
    assert term("gate_diversity", cfg2, gates_from([torch.eye(2)]), mode="soft") == pytest.approx(0, abs=1e-6)
    # a mean over every (layer, head): one uniform head and one on [.5, .5, 0, 0] -> (0 + 0.5) / 2
    assert term("gate_diversity", cfg, gates_from([[UNIFORM.tolist(), halves[0]]])) == pytest.approx(0.25)
    cfg_l2 = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2)
    assert term("gate_diversity", cfg_l2, gates_from([ONE_HOT[[0, 1]], torch.stack([UNIFORM, UNIFORM])])) == \
        pytest.approx(0.5)


@pytest.mark.parametrize("name", GATE_LOSSES)
def test_a_gate_term_can_start_late_and_ramp(name):
    """start_step=3, ramp_steps=4: off at steps 0-2, then 1/4, 2/4, 3/4 of the weight, then all of it."""
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2)
    gates = gates_from([ONE_HOT[[0, 0]], ONE_HOT[[1, 1]]])
    (m,) = build_mitigations({name: {"weight": 2.0, "start_step": 3, "ramp_steps": 4}})
    full = 2.0 * term(name, cfg, gates)
    assert full > 0
    got = [float(m.loss(fake(cfg), gates, step=s)[name]) for s in range(9)]
    assert got == pytest.approx([0, 0, 0, full / 4, full / 2, 3 * full / 4, full, full, full])
    with pytest.raises(ConfigError, match=f"mitigation.{name}.start_step"):
        build_mitigations({name: {"start_step": -1}})


def test_gate_diversity_per_head_includes_the_value_branch():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    gates = gates_from([torch.stack([UNIFORM, UNIFORM])])
    gates[0]["value"] = gates_from([ONE_HOT[[1, 2]]])[0]["key"]  # uniform keys, collapsed values
    (m,) = build_mitigations({"gate_diversity": None})
    assert m.mode == "per_head" and m.branch == "both" and m.weight == 0.1
    assert term("gate_diversity", cfg, gates) == pytest.approx(0.5)  # (0 + 0 + 1 + 1) / 4
    assert term("gate_diversity", cfg, gates, branch="key") == pytest.approx(0, abs=1e-6)
    assert term("gate_diversity", cfg, gates, branch="value") == pytest.approx(1.0)
    assert build_mitigations({"gate_diversity": {"mode": "soft"}})[0].branch == "key"  # soft, hard: key as before
    assert build_mitigations({"gate_diversity": {"mode": "hard"}})[0].branch == "key"


def with_values(gates, value_static_per_layer):
    """Adds value gates built like gates_from's key gates."""
    for layer, v in zip(gates, gates_from(value_static_per_layer)):
        layer["value"] = v["key"]
    return gates


def test_head_coord_by_hand():
    # W4/S4: the key gate's slot 3 (the boundary phase 3) answers nothing and counts as a collision
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    assert term("head_coord", cfg, gates_from([ONE_HOT[[0, 2]]])) == pytest.approx(0, abs=1e-6)  # disjoint
    assert term("head_coord", cfg, gates_from([ONE_HOT[[1, 1]]])) == pytest.approx(1.0)  # collided
    # uniform: q = [1/4, 1/4, 1/4, 0], overlap 3/16, dead mass 1/4
    assert term("head_coord", cfg, gates_from([torch.stack([UNIFORM, UNIFORM])])) == pytest.approx(7 / 16)
    # half overlap: <[.5,.5,0,0], [0,.5,.5,0]> = 0.25
    assert term("head_coord", cfg, gates_from([[[.5, .5, 0, 0], [0, .5, .5, 0]]])) == pytest.approx(0.25)
    cfg4 = ModelConfig(window=4, stride=4, num_kv_heads=4, num_heads=4, num_layers=1)
    # heads {0,0,1,2}: one colliding pair of 12 ordered pairs counted twice -> 2/12
    assert term("head_coord", cfg4, gates_from([ONE_HOT[[0, 0, 1, 2]]])) == pytest.approx(2 / 12)
    # heads on every slot: no overlap, but head 3 reads only the boundary: 1/4
    assert term("head_coord", cfg4, gates_from([ONE_HOT])) == pytest.approx(0.25)


def test_head_coord_ignores_the_boundary_slot_and_reads_values():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    # disjoint slots, but slot 3 answers nothing: 0 overlap + 1/2 dead; both on it: 1 (no escape there)
    assert term("head_coord", cfg, gates_from([ONE_HOT[[0, 3]]])) == pytest.approx(0.5)
    assert term("head_coord", cfg, gates_from([ONE_HOT[[3, 3]]])) == pytest.approx(1.0)
    # value gate: slot i answers the key at slot i-1; slot 0 is the dead one
    gates = with_values(gates_from([ONE_HOT[[0, 3]]]), [ONE_HOT[[1, 2]]])  # values: key phases 0, 1
    assert term("head_coord", cfg, gates, branch="value") == pytest.approx(0, abs=1e-6)
    assert term("head_coord", cfg, gates) == pytest.approx(0.25)  # default both: (0.5 + 0) / 2
    gates = with_values(gates_from([ONE_HOT[[0, 1]]]), [ONE_HOT[[0, 3]]])  # values: dead, key phase 2
    assert term("head_coord", cfg, gates, branch="value") == pytest.approx(0.5)
    assert term("head_coord", cfg, with_values(gates_from([ONE_HOT[[0, 1]]]), [ONE_HOT[[3, 3]]]),
                branch="value") == pytest.approx(1.0)
    # W8/S4: slot 3 holds the boundary phase 3 but its value (slot 4) is in the window: answerable
    cfg84 = ModelConfig(window=8, stride=4, num_kv_heads=2, num_layers=1)
    eye8 = torch.eye(8)
    assert term("head_coord", cfg84, gates_from([eye8[[3, 0]]])) == pytest.approx(0, abs=1e-6)
    assert term("head_coord", cfg84, gates_from([eye8[[3, 7]]])) == pytest.approx(0.5)  # slot 7: dead


def test_layer_coord_by_hand():
    # W4/S4, no offsets: every layer's boundary phase 3 is unanswerable, the mean runs over phases 0, 1, 2
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2)
    # layer 0 covers phases 0,1, layer 1 covers 2: nothing answerable left uncovered
    assert term("layer_coord", cfg, gates_from([ONE_HOT[[0, 1]], ONE_HOT[[2, 2]]])) == pytest.approx(0, abs=1e-6)
    # both layers on phases 0,1: phase 2 uncovered -> 1/3
    assert term("layer_coord", cfg, gates_from([ONE_HOT[[0, 1]], ONE_HOT[[0, 1]]])) == pytest.approx(1 / 3)
    # everything on phase 0: 2/3; everything on the boundary slot: 1
    assert term("layer_coord", cfg, gates_from([ONE_HOT[[0, 0]], ONE_HOT[[0, 0]]])) == pytest.approx(2 / 3)
    assert term("layer_coord", cfg, gates_from([ONE_HOT[[3, 3]], ONE_HOT[[3, 3]]])) == pytest.approx(1.0)
    # boundary slots count for nothing: layer 1 on slots 2, 3 covers only phase 2 -> phase 1 open with layer 0 on 0
    assert term("layer_coord", cfg, gates_from([ONE_HOT[[0, 0]], ONE_HOT[[2, 3]]])) == pytest.approx(1 / 3)
    # all uniform: (1 - 1/4)^4 on each answerable phase
    u = torch.stack([UNIFORM, UNIFORM])
    assert term("layer_coord", cfg, gates_from([u, u])) == pytest.approx(0.75**4)


def test_layer_coord_values_and_each_grids_own_boundary():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2)
    # keys all on the dead slot; values on slots 1, 2 (key phases 0, 1) and 3 (key phase 2): values cover it all
    gates = with_values(gates_from([ONE_HOT[[3, 3]], ONE_HOT[[3, 3]]]), [ONE_HOT[[1, 2]], ONE_HOT[[3, 3]]])
    assert term("layer_coord", cfg, gates, branch="key") == pytest.approx(1.0)
    assert term("layer_coord", cfg, gates, branch="value") == pytest.approx(0, abs=1e-6)
    assert term("layer_coord", cfg, gates) == pytest.approx(0.5)
    # offsets [0, 2]: layer 1's slot i holds phase (i + 2) mod 4 and its boundary is phase 1 (slot 3). Every phase is
    # answerable by some layer. Layer 0 on phase 2, layer 1 on its boundary slot: phases 0, 1, 3 open -> 3/4
    off = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2, grid_offsets=[0, 2])
    assert term("layer_coord", off, gates_from([ONE_HOT[[2, 2]], ONE_HOT[[3, 3]]])) == pytest.approx(3 / 4)
    # layer 0 on phases 0, 1 (its slots 0, 1), layer 1 on phases 3, 2 (its slots 1, 0): all covered
    assert term("layer_coord", off, gates_from([ONE_HOT[[0, 1]], ONE_HOT[[1, 0]]])) == pytest.approx(0, abs=1e-6)


def barrier(c, eps=0.05):
    """slot_coverage's cost of one phase at share c of its fair weight, written out (docs/mitigations.md)."""
    return math.log((1 + eps) / (min(c, 1.0) + eps)) / math.log((1 + eps) / eps)


def cover(cfg, gates, **opts):
    """slot_coverage at floor 1: a phase needs the fair share 1/S from the heads together."""
    return term("slot_coverage", cfg, gates, **{"floor": 1.0, **opts})


def test_slot_coverage_by_hand():
    """The union of the heads, not each head: two heads each on half the phases pay nothing; a phase no head reads
    costs 1/S; the heads' slots are read as phases on each head's own grid."""
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1)
    halves = [[.5, .5, 0, 0], [0, 0, .5, .5]]
    assert cover(cfg, gates_from([halves])) == pytest.approx(0, abs=1e-6)
    assert term("gate_diversity", cfg, gates_from([halves])) == pytest.approx(0.5)  # per head: each pays
    assert cover(cfg, gates_from([torch.stack([UNIFORM, UNIFORM])])) == pytest.approx(0, abs=1e-6)
    # both heads on phases 0, 1: phases 2 and 3 uncovered, 1/4 each
    assert cover(cfg, gates_from([[halves[0], halves[0]]])) == pytest.approx(0.5)
    # both on slot 0: three phases uncovered; one head on three slots, one on 0: phase 3 alone uncovered
    assert cover(cfg, gates_from([ONE_HOT[[0, 0]]])) == pytest.approx(0.75)
    assert cover(cfg, gates_from([[[1 / 3, 1 / 3, 1 / 3, 0], [1, 0, 0, 0]]])) == pytest.approx(0.25)
    # a phase the heads together read less often than 1/4 costs the barrier at its share: 1 - 0.9^2 = 0.19 -> 0.76
    assert cover(cfg, gates_from([[[.3, .3, .3, .1], [.3, .3, .3, .1]]])) == \
        pytest.approx(barrier(0.76) / 4, rel=1e-5)
    # floor 2: a phase needs 2/4 = 0.5; heads on halves give each phase 0.5, both uniform 1 - 0.75^2 = 0.4375
    assert cover(cfg, gates_from([halves]), floor=2.0) == pytest.approx(0, abs=1e-6)
    assert cover(cfg, gates_from([torch.stack([UNIFORM, UNIFORM])]), floor=2.0) == \
        pytest.approx(barrier(0.875), rel=1e-5)
    # the default floor 1.5 (0.375 here): uniform heads and halves pass; a head on phase 0 beside a uniform one
    # leaves phases 1-3 at 1/4, 2/3 of what they need
    assert term("slot_coverage", cfg, gates_from([torch.stack([UNIFORM, UNIFORM])])) == pytest.approx(0, abs=1e-6)
    assert term("slot_coverage", cfg, gates_from([halves])) == pytest.approx(0, abs=1e-6)
    assert term("slot_coverage", cfg, gates_from([[UNIFORM.tolist(), [1, 0, 0, 0]]])) == \
        pytest.approx(3 * barrier(2 / 3) / 4, rel=1e-5)
    # spread offsets (0, 2): head 1's slot i holds phase (i + 2) mod 4, so the same slots 0, 1 cover phases 2, 3
    spread = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1, head_offsets="spread")
    assert cover(spread, gates_from([[halves[0], halves[0]]])) == pytest.approx(0, abs=1e-6)
    assert cover(spread, gates_from([halves])) == pytest.approx(0.5)  # now both on phases 0, 1
    # combine=mean: one uniform head beside one on phase 0 leaves phases 1-3 at 1/8 (half their share); or does not
    mixed = [UNIFORM.tolist(), [1, 0, 0, 0]]
    assert cover(cfg, gates_from([mixed])) == pytest.approx(0, abs=1e-6)
    assert cover(cfg, gates_from([mixed]), combine="mean") == \
        pytest.approx(3 * barrier(0.5) / 4, rel=1e-5)
    # W8/S4: slots i and i + 4 hold the same phase; a head on slots 0 and 4 reads phase 0 only
    cfg84 = ModelConfig(window=8, stride=4, num_kv_heads=2, num_layers=1)
    eye8 = torch.eye(8)
    assert cover(cfg84, gates_from([(eye8[[0, 0]] + eye8[[4, 4]]) / 2])) == pytest.approx(0.75)
    assert cover(cfg84, gates_from([(eye8[[0, 1]] + eye8[[6, 7]]) / 2])) == pytest.approx(0, abs=1e-6)
    # value branch and the mean over branches (both by default) and layers
    gates = with_values(gates_from([halves]), [ONE_HOT[[0, 0]]])
    assert cover(cfg, gates, branch="value") == pytest.approx(0.75)
    assert cover(cfg, gates) == pytest.approx(0.375)
    cfg_l2 = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2)
    assert cover(cfg_l2, gates_from([halves, ONE_HOT[[0, 0]]])) == pytest.approx(0.375)


def test_slot_coverage_gradient_reaches_the_gates_of_a_shift_spread_model_and_costs_nothing():
    """On the arm's own model (token shift 2, spread offsets, W8/S8 as coverage_w8s8_curric) with both heads
    collapsed on one slot: the term is high, its gradient reaches every gate parameter of both branches, and the
    mitigation leaves the model (and so its cache entries, bytes and multiply-adds) as it was."""
    torch.manual_seed(0)
    plain = ModelConfig.from_name("tiny", hidden_size=64, intermediate_size=128, head_dim=16, window=8, stride=8,
                                  token_shift=2, head_offsets="spread")
    (m,) = build_mitigations({"slot_coverage": {"weight": 1.0}})
    cfg = m.configure_model(plain)
    assert cfg == plain
    model = CompressedQwen3(cfg)
    m.setup(model)
    collapse(model, slot=3, value=8.0)
    model(torch.randint(0, cfg.vocab_size, (2, 64)), collect_gates=True)
    loss = m.loss(model, model.gates())["slot_coverage"]
    # each head reads one phase (3 and 7 under the spread offsets 0, 4): 6 of 8 phases (nearly) unread, 6/8
    assert float(loss.detach()) == pytest.approx(0.75, abs=0.03)
    loss.backward()
    gate_params = [(n, p) for n, p in model.named_parameters() if "_gate" in n]
    assert {n.rsplit(".", 1)[-1] for n, _ in gate_params} >= {"key_gate_bias", "value_gate_bias"}
    for n, p in gate_params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_layer_coord_across_layers_of_different_strides_by_hand():
    """Per-layer compression (issue 66): phases are counted mod the strides' lcm, a phase r of a layer of stride S_l
    covering every r' = r mod S_l. One KV head; layer 0 W2/S2 (slot 0 answers phase 0, i.e. 0 and 2 mod 4; slot 1 is
    its boundary, phases 1 and 3), layer 1 W4/S4 (slots 0-2 answer phases 0-2). Phase 3 is every layer's boundary,
    so the mean runs over phases 0, 1, 2."""
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=1, num_layers=2, layer_compression=["2/2", "4/4"])
    two, four = torch.eye(2), torch.eye(4)
    assert term("layer_coord", cfg, gates_from([two[[0]], four[[1]]])) == pytest.approx(0, abs=1e-6)
    assert term("layer_coord", cfg, gates_from([two[[0]], four[[0]]])) == pytest.approx(1 / 3)  # phase 1 open
    assert term("layer_coord", cfg, gates_from([two[[1]], four[[2]]])) == pytest.approx(2 / 3)  # 0 and 1 open


def test_static_excludes_incomplete_windows_with_and_without_config():
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=2, grid_offsets=[0, 2])
    model = CompressedQwen3(cfg)
    model(torch.randint(0, cfg.vocab_size, (2, 30)), collect_gates=True)
    gates = model.gates()
    a1 = gates[1]["key"]
    assert (a1[:, 0, :2] == 0).all()  # layer 1's first window has two empty slots
    with_cfg = static_gate_distribution(gates, cfg)
    detected = static_gate_distribution(gates)
    for layer in range(2):
        for b in ("key", "value"):
            assert with_cfg[layer][b].shape == (2, 4)
            torch.testing.assert_close(with_cfg[layer][b], detected[layer][b])
    torch.testing.assert_close(with_cfg[1]["key"], a1[:, 1:].mean((0, 1)).T)
    # spread head offsets (0, 2) at W4/S4: head 1's first window starts at token -2, so window 0 is left out for
    # both heads (the windows of all heads share their index)
    spread = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1, head_offsets="spread")
    model = CompressedQwen3(spread)
    model(torch.randint(0, spread.vocab_size, (2, 30)), collect_gates=True)
    a = model.gates()[0]["key"]
    assert (a[:, 0, :2, 1] == 0).all() and (a[:, 0, :, 0] > 0).all()
    for static in (static_gate_distribution(model.gates(), spread), static_gate_distribution(model.gates())):
        torch.testing.assert_close(static[0]["key"], a[:, 1:].mean((0, 1)).T)
    assert torch.allclose(effective_slots(torch.eye(3)), torch.ones(3))
    assert float(effective_slots(torch.full((5,), 0.2))) == pytest.approx(5.0)


# ------------------------------------------------------------------------------------------------ optimisation
def collapse(model, slot=0, value=4.0):
    with torch.no_grad():
        for comp in model.compressors():
            for b in comp.branches:
                comp.get_parameter(f"{b}_gate_bias")[slot] = value


def layer_coverage(model, ids, cfg):
    """Effective number of slots of the mean over heads of each layer's static key gate."""
    with torch.no_grad():
        model(ids, collect_gates=True)
        static = static_gate_distribution(model.gates(), cfg)
    return [float(effective_slots(s["key"].mean(0))) for s in static]


@pytest.mark.parametrize("name", GATE_LOSSES)
def test_optimising_the_loss_alone_spreads_collapsed_gates(name):
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", hidden_size=64, intermediate_size=128, head_dim=16)
    (m,) = build_mitigations({name: {"weight": 1.0}})
    cfg = m.configure_model(cfg)
    model = CompressedQwen3(cfg)
    m.setup(model)
    collapse(model)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    before = layer_coverage(model, ids, cfg)
    assert max(before) < 1.4  # both heads of every layer sit on slot 0
    biases = [p for n, p in model.named_parameters() if n.endswith("key_gate_bias")]
    opt = torch.optim.Adam(biases, lr=0.3)
    first = None
    for step in range(15):
        model(ids, collect_gates=True)
        loss = m.loss(model, model.gates())[name]
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        # slot_coverage is a floor: once every phase of a layer has its share, that layer's gradient is 0
        if name != "slot_coverage" or step == 0:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in biases)
        opt.step()
    after = layer_coverage(model, ids, cfg)
    assert float(loss.detach()) < first
    assert all(a > b + 1.0 for a, b in zip(after, before)), (before, after)


def test_answered_phases_follow_each_spread_heads_grid():
    from phasefix.mitigations.gates import answered_phases
    cfg = ModelConfig(window=4, stride=4, num_kv_heads=2, num_layers=1, head_offsets="spread")  # offsets 0 and 2
    def phases(branch):  # per head, slot -> answered phase (dead slots left out)
        a = answered_phases(cfg, 0, branch)
        return [{w: int(a[h, w].argmax()) for w in range(4) if a[h, w].sum() > 0} for h in range(2)]
    # by hand: slot i of a head with offset d holds phase (i - 4 - d) mod 4; a key slot answers its own token's phase
    # (the last slot's value lies in the next window), a value slot the phase of the token before it
    assert phases("key") == [{0: 0, 1: 1, 2: 2}, {0: 2, 1: 3, 2: 0}]
    assert phases("value") == [{1: 0, 2: 1, 3: 2}, {1: 2, 2: 3, 3: 0}]


# Hand-written for W4/S4, grid offset 0 (independent of answered_phases): the target-key phase each slot answers
KEY_PHASE = {0: 0, 1: 1, 2: 2}  # key slot 3: its value is in the next window
VALUE_PHASE = {1: 0, 2: 1, 3: 2}  # value slot 0: its key is in the previous window


def phase_weights(P, branch):
    """[HKV, 3] weight of each head on the answerable phases 0..2 (the rest is dead mass)."""
    slots = KEY_PHASE if branch == "key" else VALUE_PHASE
    q = torch.zeros(P.shape[0], 3)
    for slot, phase in slots.items():
        q[:, phase] += P[:, slot]
    return q


@pytest.mark.parametrize("name, opts", [("gate_diversity", {}), ("gate_diversity", {"mode": "soft"}),
                                        ("head_coord", {}), ("layer_coord", {}), ("slot_coverage", {})])
def test_a_few_hundred_steps_on_the_term_alone_spread_collapsed_compressor_gates(name, opts):
    from phasefix.model.qwen3 import Compressor

    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", hidden_size=32, head_dim=8)  # W4/S4, 2 layers, 2 KV heads
    (m,) = build_mitigations({name: {"weight": 1.0, **opts}})
    cfg = m.configure_model(cfg)
    comps = [Compressor(cfg, cfg.grid_offset(layer)) for layer in range(cfg.num_layers)]
    with torch.no_grad():  # every head of every layer collapsed: keys on the boundary slot, values on slot 0
        for c in comps:
            c.key_gate_bias[3] = 6.0
            c.value_gate_bias[0] = 6.0
    x = torch.randn(4, 32, cfg.hidden_size)  # 8 complete windows

    def statics():  # {(layer, branch): P [HKV, W]}, the plain mean over batch and windows
        return {(layer, b): a.mean((0, 1)).T for layer, c in enumerate(comps)
                for b, a in c(x, None)[2].items()}

    before = {k: P.detach() for k, P in statics().items()}
    assert all(float(P.max(1).values.min()) > 0.9 for P in before.values())  # collapsed
    # the per-slot biases carry the static preference; the data-dependent Z_i moves slower (else random inputs
    # make every window one-hot and the statics a count over 32 windows)
    biases = [p for c in comps for n, p in c.named_parameters() if n.endswith("gate_bias")]
    maps = [p for c in comps for n, p in c.named_parameters() if n.endswith("_gate")]
    opt = torch.optim.Adam([{"params": biases, "lr": 0.05}, {"params": maps, "lr": 0.002}])
    for _ in range(300):
        loss = m.loss(fake(cfg), [c(x, None)[2] for c in comps])[name]
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = {k: P.detach() for k, P in statics().items()}
    eff = {k: torch.exp(-(P * P.log()).sum(1)) for k, P in after.items()}  # effective slots per head
    if name == "gate_diversity" and m.mode == "per_head":  # every head of both branches statically uniform
        assert all(float(e.min()) > 3.8 for e in eff.values()), eff
    elif name == "gate_diversity":  # the union of the key heads spreads; values untouched (branch key)
        for layer in range(2):
            union = after[(layer, "key")].mean(0)
            assert float(torch.exp(-(union * union.log()).sum())) > 3.8
            assert float(after[(layer, "value")].max(1).values.min()) > 0.9
    elif name == "head_coord":  # per layer and branch: distinct answerable phases, nothing on the dead slot
        for (layer, b), P in after.items():
            q = phase_weights(P, b)
            assert float(q.sum(1).min()) > 0.95 and len(set(q.argmax(1).tolist())) == 2, (layer, b, P)
            assert float((q[0] * q[1]).sum()) < 0.05
    elif name == "slot_coverage":  # per layer and branch: the heads together read every phase (need: 1.5/4)
        for (layer, b), P in after.items():
            assert float(P.max(0).values.min()) > 0.2, (layer, b, P)
    else:  # per branch: the four heads of both layers cover phases 0, 1, 2
        for b in ("key", "value"):
            q = torch.cat([phase_weights(after[(layer, b)], b) for layer in range(2)])  # [4, 3]
            assert float(torch.prod(1 - q, dim=0).max()) < 0.05, (b, q)


# ------------------------------------------------------------------------------------------------ hard parametrisation
def test_slot_assignment_layouts():
    assert slot_assignment(4, 2, "block").int().T.tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]
    assert slot_assignment(4, 2, "interleaved").int().T.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    assert slot_assignment(8, 8).int().T.tolist() == torch.eye(8, dtype=torch.int).tolist()
    many = slot_assignment(4, 8)  # more heads than slots: two heads per slot
    assert many.sum(0).tolist() == [1] * 8 and many.sum(1).tolist() == [2] * 4
    for W, H in [(4, 1), (4, 3), (8, 3), (12, 5), (6, 4)]:
        a = slot_assignment(W, H)
        assert a.any(1).all() and a.any(0).all() and (a.sum(1) == 1).all()  # every slot covered, once


@pytest.mark.parametrize("overrides", [dict(), dict(window=8, stride=4), dict(window=8, stride=8, num_kv_heads=4),
                                       dict(gate="vector"), dict(grid_offsets=[0, 3])])
def test_hard_gate_diversity_cannot_collapse(overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", **overrides)
    (m,) = build_mitigations({"gate_diversity": {"mode": "hard", "branch": "both"}})
    assert not m.needs_gates and m.loss(None, []) == {}
    cfg = m.configure_model(cfg)
    model = CompressedQwen3(cfg)
    m.setup(model)
    # adversarial parameters: huge biases pushing every head to slot 0, huge gate weights
    with torch.no_grad():
        for comp in model.compressors():
            for b in comp.branches:
                comp.get_parameter(f"{b}_gate_bias")[0] = 1e4
                comp.get_parameter(f"{b}_gate").mul_(1e3)
    ids = torch.randint(0, cfg.vocab_size, (3, 64))
    logits = model(ids, collect_gates=True)
    assert torch.isfinite(logits).all()
    W, HKV = cfg.window, cfg.num_kv_heads
    key_mask = slot_assignment(W, HKV).T  # [HKV, W]
    for static in static_gate_distribution(model.gates(), cfg):
        for b, mask in (("key", key_mask), ("value", key_mask.roll(1, dims=1))):
            P = static[b]
            assert (P[~mask] == 0).all()  # nothing outside each head's own slots
            torch.testing.assert_close(P.sum(1), torch.ones(HKV))
            tops = P.argmax(1).tolist()
            assert len(set(tops)) == HKV  # distinct preferred slots
            assert all(mask[h, tops[h]] for h in range(HKV))


def test_hard_gate_diversity_freeze_bias_and_strength():
    cfg = ModelConfig.from_name("tiny")
    (m,) = build_mitigations({"gate_diversity": {"mode": "hard", "freeze_bias": True, "strength": 3.0}})
    model = CompressedQwen3(m.configure_model(cfg))
    with torch.no_grad():
        model.compressors()[0].key_gate_bias.fill_(1.0)
    m.setup(model)
    for comp in model.compressors():
        assert not comp.key_gate_bias.requires_grad and (comp.key_gate_bias == 0).all()
        assert comp.value_gate_bias.requires_grad  # branch='key' only
        assert comp.key_slot_prior.T.tolist() == [[0, 0, -3, -3], [-3, -3, 0, 0]]
        assert (comp.value_slot_prior == 0).all()
    # the priors are buffers: they travel with the state dict
    assert any(k.endswith("key_slot_prior") for k in model.state_dict())


# ------------------------------------------------------------------------------------------------ controls
def test_phase_jitter_shifts_and_keeps_labels_aligned():
    cfg = ModelConfig.from_name("tiny", stride=8, window=8)
    for mode in ("pad", "crop"):
        (m,) = build_mitigations({"phase_jitter": {"mode": mode}})
        assert m.configure_model(cfg) is cfg and not m.needs_gates
        B, T = 64, 20
        ids = torch.arange(20, 40).repeat(B, 1)
        ids[:, 0] = 0  # BOS
        labels = torch.where(torch.arange(T) % 3 == 0, ids + 50, torch.full_like(ids, -100))
        gen = torch.Generator().manual_seed(0)
        new_ids, new_labels = m.transform_batch(ids, labels, gen)
        assert new_ids.shape == new_labels.shape == (B, T + 7 if mode == "pad" else T)
        assert (new_ids[:, 0] == 0).all()
        shifts = set()
        for row_ids, row_labels in zip(new_ids, new_labels):
            filler = (row_ids == 1) & (torch.arange(len(row_ids)) > 0)
            assert (row_labels[filler] == -100).all()
            k = int((row_ids[1:] == 1).long().argmin()) if row_ids[1] == 1 else 0  # leading filler after BOS
            shifts.add(k)
            kept = row_ids[~filler]
            n = len(kept)
            torch.testing.assert_close(kept, ids[0, :n])  # content order kept (crop drops the tail)
            torch.testing.assert_close(row_labels[~filler], labels[0, :n])
            assert n == (T if mode == "pad" else T - k)
        assert shifts == set(range(8))
    same = build_mitigations({"phase_jitter": {"max_shift": 3}})[0]
    a = same.transform_batch(ids, labels, torch.Generator().manual_seed(1))
    b = same.transform_batch(ids, labels, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and a[0].shape[1] == T + 3


def test_staggered_offsets_spread_over_the_stride():
    (m,) = build_mitigations({"staggered_offsets": None})
    cfg = m.configure_model(ModelConfig.from_name("tiny"))
    assert cfg.grid_offsets == [0, 2]
    assert m.configure_model(ModelConfig.from_name("tiny", num_layers=4, stride=8, window=8)).grid_offsets == \
        [0, 2, 4, 6]
    model = CompressedQwen3(cfg)
    assert [c.grid_offset for c in model.compressors()] == [0, 2]
    assert torch.isfinite(model(torch.randint(0, 128, (1, 33)))).all()
    (m2,) = build_mitigations({"staggered_offsets": {"offsets": [1, 3]}})
    assert m2.configure_model(ModelConfig.from_name("tiny")).grid_offsets == [1, 3]
    with pytest.raises(ConfigError, match="mitigation.staggered_offsets.offsets"):
        build_mitigations({"staggered_offsets": {"offsets": [0, 4]}})[0].configure_model(ModelConfig())
    with pytest.raises(ConfigError, match="grid_offsets"):
        m.configure_model(ModelConfig(grid_offsets=[1]))
    with pytest.raises(ConfigError, match="attention"):
        m.configure_model(ModelConfig(attention="full"))


# ------------------------------------------------------------------------------------------------ composition
def _without_compressor(model, layer: int):
    """The same weights in a model whose `layer` has no compressor (layer_compression 'none'): the reference for a
    layer whose entries entry_dropout drops."""
    import dataclasses

    cfg = model.config
    pattern = [f"{cfg.window}/{cfg.stride}"] * cfg.num_layers
    pattern[layer] = "none"
    ref = CompressedQwen3(dataclasses.replace(cfg, layer_compression=pattern)).double()
    assert not ref.load_state_dict(model.state_dict(), strict=False).missing_keys
    return ref.eval()


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("overrides", [dict(), dict(head_offsets="spread", token_shift=2, local_memory="window")])
def test_entry_dropout_drops_one_layers_entries_in_training_only(layer, overrides):
    """A dropped layer attends to its local window alone, as a layer without a compressor does (checked against the
    float64 oracle of that model), in training mode only; its gates are still collected for the gate terms."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import oracle

    torch.manual_seed(layer)
    model = CompressedQwen3(dataclasses.replace(ModelConfig.from_name("tiny"), **overrides)).double()
    ids = torch.randint(0, model.config.vocab_size, (2, 37))
    model.layers[layer].attn.drop_entries = True
    model.train()
    dropped = model(ids, collect_gates=True)
    assert all(g is not None for g in model.gates())
    ref = _without_compressor(model, layer)
    assert (dropped - oracle.logits(ref, ids)).abs().max() <= 1e-9
    assert (model(ids) - dropped).abs().max() <= 1e-12  # without the gates, the dropped layer's pooling is skipped
    model.eval()  # evaluation ignores the switch: the whole model, as the oracle of the model itself
    assert (model(ids) - oracle.logits(model, ids)).abs().max() <= 1e-9
    assert (model(ids) - dropped).abs().max() > 1e-3


def test_entry_dropout_draws_one_layer_on_a_share_p_of_the_steps_from_start_step():
    cfg = ModelConfig.from_name("tiny")
    draws = {}
    for p in (0.0, 0.3, 1.0):
        (m,) = build_mitigations({"entry_dropout": {"p": p, "start_step": 100}})
        model = CompressedQwen3(m.configure_model(cfg))
        m.setup(model)
        seen = []
        for step in range(1100):
            m.before_forward(step, torch.Generator().manual_seed(step))
            flags = [block.attn.drop_entries for block in model.layers]
            assert flags.count(True) <= 1
            seen.append(flags.index(True) if True in flags else None)
        assert seen[:100] == [None] * 100  # nothing before start_step
        draws[p] = seen[100:]
    assert draws[0.0] == [None] * 1000 and None not in draws[1.0]
    dropped = [d for d in draws[0.3] if d is not None]
    assert 240 <= len(dropped) <= 360  # Binomial(1000, 0.3): mean 300, sd 14.5
    assert 0.4 <= dropped.count(0) / len(dropped) <= 0.6  # either layer, uniformly
    assert draws[1.0].count(0) not in (0, 1000)
    # the same step's generator draws the same layer: a resumed run drops what an uninterrupted one would
    (a,), (b,) = build_mitigations({"entry_dropout": {}}), build_mitigations({"entry_dropout": {}})
    for m in (a, b):
        m.setup(CompressedQwen3(cfg))
    for step in range(50):
        a.before_forward(step, torch.Generator().manual_seed(step))
        b.before_forward(step, torch.Generator().manual_seed(step))
        assert a.dropped() == b.dropped()


def test_a_training_step_with_entry_dropout_pays_its_loss_through_the_other_layer():
    """PhaseFixModule's training step calls the switch before its forward: with p = 1 the step's loss is the
    loss of the model without the drawn layer's compressor (same weights), and validation sees the whole model."""
    import dataclasses
    import warnings

    import torch.nn.functional as F

    from phasefix.module import PhaseFixModule

    cfg = ModelConfig.from_name("tiny")
    module = PhaseFixModule(model=dataclasses.asdict(cfg), optim={}, max_steps=10,
                            mitigation={"entry_dropout": {"p": 1.0}}).double()
    (m,) = module.mitigations
    ids = torch.randint(0, cfg.vocab_size, (2, 33))
    labels = torch.full_like(ids, -100)
    labels[:, 20:] = ids[:, 20:]
    module.train()
    with warnings.catch_warnings():  # self.log with no trainer attached
        warnings.simplefilter("ignore")
        loss = module.training_step({"input_ids": ids, "labels": labels}, 0)
    (layer,) = m.dropped()
    ref = _without_compressor(module.model, layer)
    want = F.cross_entropy(ref(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)  # the step's loss is computed in float32
    module.eval()  # the whole model's loss is another
    whole = F.cross_entropy(module(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert abs(whole.item() - want.item()) > 1e-4


def test_entry_dropout_refuses_a_model_with_fewer_than_two_compressed_layers():
    (m,) = build_mitigations({"entry_dropout": {}})
    with pytest.raises(ConfigError, match="needs at least 2"):
        m.configure_model(ModelConfig(num_layers=1))
    with pytest.raises(ConfigError, match="needs at least 2"):
        m.configure_model(ModelConfig(num_layers=2, layer_compression=["none", "4/4"]))
    with pytest.raises(ConfigError, match=r"mitigation\.entry_dropout\.p=1\.5 is invalid"):
        build_mitigations({"entry_dropout": {"p": 1.5}})


def test_composing_two_mitigations_adds_both_terms():
    torch.manual_seed(0)
    mits = build_mitigations({"gate_diversity": {"weight": 0.5}, "head_coord": {"weight": 2.0, "branch": "both"}})
    cfg = ModelConfig.from_name("tiny")
    for m in mits:
        cfg = m.configure_model(cfg)
    model = CompressedQwen3(cfg)
    for m in mits:
        m.setup(model)
    collapse(model)
    model(torch.randint(0, 128, (2, 40)), collect_gates=True)
    gates = model.gates()
    terms = {}
    for m in mits:
        terms.update(m.loss(model, gates))
    assert set(terms) == {"gate_diversity", "head_coord"}
    alone = {m.name: build_mitigations({m.name: {**m.options, "weight": 1.0}})[0].loss(model, gates)[m.name].item()
             for m in mits}
    assert terms["gate_diversity"].item() == pytest.approx(0.5 * alone["gate_diversity"])
    assert terms["head_coord"].item() == pytest.approx(2.0 * alone["head_coord"])
    assert all(v > 0 and v.requires_grad for v in terms.values())


def test_invalid_names_options_and_models_raise_config_errors():
    assert build_mitigations(None) == [] and build_mitigations({}) == []
    with pytest.raises(ConfigError, match="mitigation=nope is invalid: allowed values are"):
        build_mitigations({"nope": {}})
    with pytest.raises(ConfigError, match=r"mitigation\.gate_diversity\.mode='firm' is invalid"):
        build_mitigations({"gate_diversity": {"mode": "firm"}})
    with pytest.raises(ConfigError, match=r"mitigation\.head_coord\.foo is not an option"):
        build_mitigations({"head_coord": {"foo": 1}})
    with pytest.raises(ConfigError, match=r"mitigation\.layer_coord\.weight"):
        build_mitigations({"layer_coord": {"weight": -1}})
    with pytest.raises(ConfigError, match=r"mitigation\.layer_coord\.branch"):
        build_mitigations({"layer_coord": {"branch": "query"}})
    with pytest.raises(ConfigError, match=r"mitigation\.phase_jitter\.max_shift"):
        build_mitigations({"phase_jitter": {"max_shift": 1.5}})
    for name in GATE_LOSSES:
        (m,) = build_mitigations({name: {}})
        with pytest.raises(ConfigError, match="gate='uniform'"):
            m.configure_model(ModelConfig(gate="uniform"))
        with pytest.raises(ConfigError, match="attention='full'"):
            m.configure_model(ModelConfig(attention="full"))
    with pytest.raises(ConfigError, match="num_kv_heads=1"):
        build_mitigations({"head_coord": {}})[0].configure_model(ModelConfig(num_kv_heads=1))
    with pytest.raises(ConfigError, match="num_kv_heads=1"):
        build_mitigations({"gate_diversity": {"mode": "hard"}})[0].configure_model(ModelConfig(num_kv_heads=1))
    with pytest.raises(ConfigError, match="tied_kv"):
        build_mitigations({"gate_diversity": {"branch": "value"}})[0].configure_model(ModelConfig(tied_kv=True))


def test_gate_heatmap(tmp_path):
    cfg = ModelConfig.from_name("tiny")
    model = CompressedQwen3(cfg)
    model(torch.randint(0, 128, (2, 32)), collect_gates=True)
    fig = gate_heatmap(static_gate_distribution(model.gates(), cfg))
    assert len([ax for ax in fig.axes if ax.images]) == 4  # 2 layers x (key, value)
    fig.savefig(tmp_path / "gates.png")
    assert (tmp_path / "gates.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_yaml_selects_the_options_dataclass_and_repeats_no_default(name):
    text = (CONF_DIR / "mitigation" / f"{name}.yaml").read_text()
    assert text.splitlines()[0] == f"# @package mitigation.{name}"
    assert yaml.safe_load(text) == {"defaults": [f"{name}_schema", "_self_"]}  # the defaults live in Options only


def test_every_mitigation_class_uses_the_schema_the_config_registers():
    """The schemas live in phasefix.config (checked without torch); each class's Options is that same dataclass."""
    from phasefix.config import MITIGATION_OPTIONS

    assert {name: cls.Options for name, cls in REGISTRY.items()} == MITIGATION_OPTIONS


def _compose(tmp_path: Path, overrides: list[str]):
    """Compose the real `fit` config (or, until conf/fit.yaml lands, a minimal primary config that searches
    conf/ for the real mitigation group)."""
    from hydra import compose, initialize_config_dir

    if (CONF_DIR / "fit.yaml").exists():
        import phasefix.config  # noqa: F401  registers the fit_schema structured config

        config_dir, config_name = CONF_DIR, "fit"
    else:
        (tmp_path / "fit_min.yaml").write_text(f"hydra:\n  searchpath:\n    - file://{CONF_DIR}\nseed: 0\n")
        config_dir, config_name = tmp_path, "fit_min"
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_plus_mitigation_composes(name, tmp_path):
    cfg = _compose(tmp_path, [f"+mitigation={name}"])
    assert list(cfg.mitigation) == [name]
    (m,) = build_mitigations(cfg.mitigation)
    assert m.name == name and m.options == REGISTRY[name].defaults


def test_composed_list_and_bad_overrides(tmp_path):
    cfg = _compose(tmp_path, ["+mitigation=[gate_diversity,head_coord]", "mitigation.head_coord.weight=0.3"])
    mits = build_mitigations(cfg.mitigation)
    assert [m.name for m in mits] == ["gate_diversity", "head_coord"] and mits[1].weight == 0.3
    bad = _compose(tmp_path, ["+mitigation=gate_diversity", "mitigation.gate_diversity.mode=firm"])
    with pytest.raises(ConfigError, match=r"mitigation\.gate_diversity\.mode"):
        build_mitigations(bad.mitigation)
    # the Options dataclass is the schema: a misspelt or mistyped option fails at composition
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="wieght"):
        _compose(tmp_path, ["+mitigation=head_coord", "mitigation.head_coord.wieght=0.3"])
    with pytest.raises(ConfigCompositionException, match="weight"):
        _compose(tmp_path, ["+mitigation=head_coord", "mitigation.head_coord.weight=heavy"])
    unknown = _compose(tmp_path, ["+mitigation=layer_coord", "+mitigation.layer_coord.wieght=1"])
    with pytest.raises(ConfigError, match=r"mitigation\.layer_coord\.wieght"):
        build_mitigations(unknown.mitigation)
