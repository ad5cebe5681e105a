"""`phasefix.analyze`: knockout of a dead head is a no-op, gate cycling by 0 and W is the identity, R^2 by hand,
and every tool end-to-end through the CLI on one tiny checkpoint (one fit for the whole module)."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from phasefix.analyze import accuracy_by, parse_options, parse_shifts, relative_change
from phasefix.analyze.__main__ import main
from phasefix.analyze.cycle import check_cyclable, cycled, gate_tensors, pooled_r2, predicted_change, r_squared
from phasefix.analyze.gates import gate_statistics
from phasefix.analyze.knockout import calibration_means, knocked_out, knockout, query_heads
from phasefix.data import make_phase_eval
from phasefix.errors import ConfigError
from phasefix.model import CompressedQwen3, ModelConfig
from helpers import TINY_FIT, cache_dir

torch.set_num_threads(1)

# The smallest fit that leaves a checkpoint, config.yaml and an MLflow run (W4/S4, 2 layers, 2 KV heads).
FAST = TINY_FIT  # tests/helpers.py
TASK = dict(num_records=8, num_demos=3, num_keys=16, num_values=16, num_filler=8)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny_model(seed: int = 0, **overrides) -> CompressedQwen3:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
               intermediate_size=64, window=4, stride=4, gate_init_std=0.5)
    cfg.update(overrides)
    model = CompressedQwen3(ModelConfig(**cfg)).eval()
    with torch.no_grad():  # give the gate biases a slot preference, so a shift visibly changes the model
        for comp in model.compressors():
            comp.key_gate_bias.normal_(0, 1.0)
            comp.value_gate_bias.normal_(0, 1.0)
    return model


def tiny_set(seed: int = 0, per_residue: int = 1):
    return make_phase_eval("kv_lookup", "prefix", period=8, per_residue=per_residue, seed=seed,
                           **TASK).with_format("torch")


# ------------------------------------------------------------------------------------------------ knockout
def test_knockout_of_a_head_that_carries_nothing_changes_nothing():
    model = tiny_model()
    D = model.config.head_dim
    layer, g = 0, 1
    with torch.no_grad():  # the query heads reading KV head 1 of layer 0 write nothing: zero their o_proj columns
        for h in query_heads(model.config, g):
            model.layers[layer].attn.o_proj.weight[:, h * D:(h + 1) * D] = 0
    ds = tiny_set()
    ids = ds["input_ids"][:6]
    means = calibration_means(model, tiny_set(seed=1))
    before = model(ids)
    with knocked_out(model, layer, g, means[layer], {}):
        after = model(ids)
    assert torch.equal(before, after)
    with knocked_out(model, layer, 0, means[layer] + 5.0, {}):  # a live head does change the output
        assert not torch.allclose(model(ids), before)
    assert torch.equal(model(ids), before)  # the hook is gone

    res = knockout(model, ds, tiny_set(seed=1), period=8, stride=4)
    assert res["acc"].shape == (2, 2, 8) and res["rel_phase"].shape == (2, 2, 4)
    np.testing.assert_array_equal(res["acc"][layer, g], res["base"])


def test_knockout_replaces_only_the_query_position():
    model = tiny_model()
    ids = tiny_set()["input_ids"][:3]
    T = ids.shape[1]
    seen = {}

    def grab(mod, args):
        seen["x"] = args[0].clone()

    mean = torch.randn(model.config.num_heads * model.config.head_dim)
    with knocked_out(model, 1, 0, mean, {"pos": torch.full((3,), T - 1)}):
        h = model.layers[1].attn.o_proj.register_forward_pre_hook(grab, prepend=False)
        model(ids)
        h.remove()
    x = seen["x"]  # hooks run in registration order: ours sees the knocked-out input
    cols = slice(0, 2 * model.config.head_dim)  # query heads 0, 1 read KV head 0
    assert torch.equal(x[:, T - 1, cols], mean[cols].expand(3, -1))
    plain = {}
    h = model.layers[1].attn.o_proj.register_forward_pre_hook(lambda m, a: plain.setdefault("x", a[0].clone()))
    model(ids)
    h.remove()
    assert torch.equal(x[:, : T - 1], plain["x"][:, : T - 1])
    assert torch.equal(x[:, T - 1, 2 * model.config.head_dim:], plain["x"][:, T - 1, 2 * model.config.head_dim:])


# ------------------------------------------------------------------------------------------------ cycle
@pytest.mark.parametrize("d", [0, 4, -4, 8])
def test_cycling_by_zero_or_w_is_the_identity(d):
    model = tiny_model()
    ids = tiny_set()["input_ids"][:4]
    before_w = [t.detach().clone() for t in gate_tensors(model)]
    before = model(ids)
    with cycled(model, d):
        assert all(torch.equal(a, b) for a, b in zip(before_w, gate_tensors(model)))
        assert torch.equal(model(ids), before)


def test_cycling_shifts_gates_only_and_restores():
    model = tiny_model()
    ids = tiny_set()["input_ids"][:4]
    comp = model.compressors()[0]
    gate, payload = comp.key_gate.detach().clone(), comp.key_payload.detach().clone()
    before = model(ids)
    with cycled(model, 1):
        assert torch.equal(comp.key_gate[1], gate[0]) and torch.equal(comp.key_gate[0], gate[3])  # Z_i <- Z_{i-1}
        assert torch.equal(comp.key_payload, payload)
        assert not torch.allclose(model(ids), before)
    assert torch.equal(comp.key_gate, gate) and torch.equal(model(ids), before)


def test_cycle_needs_w_equal_s():
    with pytest.raises(ConfigError, match="window == model.stride"):
        check_cyclable(ModelConfig(window=8, stride=4))
    with pytest.raises(ConfigError, match="uniform"):
        check_cyclable(ModelConfig(gate="uniform"))
    check_cyclable(ModelConfig(window=4, stride=4))


def test_r2_matches_a_hand_computation():
    base = np.array([0.9, 0.6, 0.3, 0.1])
    shifted = np.array([0.2, 0.8, 0.5, 0.1])
    np.testing.assert_allclose(predicted_change(base, 1), [-0.8, 0.3, 0.3, 0.2])
    # phases 0..2 (boundary phase 3 excluded): observed [-0.7, 0.2, 0.2], predicted [-0.8, 0.3, 0.3];
    # mean observed -0.1, SS_tot = 0.36 + 0.09 + 0.09 = 0.54, SS_res = 3 * 0.01 = 0.03
    assert pooled_r2(base, {1: shifted}) == pytest.approx(1 - 0.03 / 0.54)
    # a perfect shift gives 1 whatever happens at the boundary phase
    assert pooled_r2(base, {2: np.roll(base, 2) + np.array([0, 0, 0, 0.5])}) == pytest.approx(1.0)
    assert np.isnan(r_squared(np.zeros(3), np.ones(3)))


def test_helpers():
    assert parse_shifts("-3..3") == [-3, -2, -1, 0, 1, 2, 3] and parse_shifts("0,4") == [0, 4]
    with pytest.raises(ConfigError):
        parse_shifts("a..b")
    with pytest.raises(ConfigError, match="unknown key bogus"):
        parse_options(["run=x", "bogus=1"])
    with pytest.raises(ConfigError, match="unknown key per_residu; did you mean per_residue"):
        parse_options(["run=x", "per_residu=1"])
    with pytest.raises(ConfigError, match="include is not an option of analyze knockout run="):
        parse_options(["knockout", "run=x", "include=all"])
    with pytest.raises(ConfigError, match="run"):
        parse_options([])
    np.testing.assert_allclose(accuracy_by(np.array([1, 0, 1, 1]), np.array([0, 0, 1, 2]), 4), [0.5, 1, 1, np.nan])
    np.testing.assert_allclose(relative_change(np.array([0.5, 1.0]), np.array([1.0, 0.0])), [-0.5, np.nan])


def test_gate_statistics_of_a_one_hot_gate():
    model = tiny_model()
    with torch.no_grad():  # KV head 0 of layer 0 always reads slot 2 (bias dominates)
        comp = model.compressors()[0]
        comp.key_gate.zero_()
        comp.key_gate_bias[:, 0] = -1e4
        comp.key_gate_bias[2, 0] = 0
    stats = gate_statistics(model, tiny_set(), max_prompts=4)
    s = stats[0]["key"]
    assert s["static_eff"][0] == pytest.approx(1.0, abs=1e-4) and s["window_eff"][0] == pytest.approx(1.0, abs=1e-4)
    assert int(s["preferred_slot"][0]) == 2 and int(s["preferred_phase"][0]) == 2


def test_gate_statistics_give_each_spread_head_its_own_phase():
    model = tiny_model(head_offsets="spread")  # W = S = 4, two KV heads: grid offsets 0 and 2
    with torch.no_grad():  # both KV heads of layer 0 always read slot 2
        comp = model.compressors()[0]
        comp.key_gate.zero_()
        comp.key_gate_bias.fill_(-1e4)
        comp.key_gate_bias[2, :] = 0
    s = gate_statistics(model, tiny_set(), max_prompts=4)[0]["key"]
    assert s["preferred_slot"].tolist() == [2, 2]
    # slot i of a head with offset d holds a token of phase (i - W - d) mod S: (2-4-0) mod 4 = 2, (2-4-2) mod 4 = 0
    assert s["preferred_phase"].tolist() == [2, 0]


# ------------------------------------------------------------------------------------------------ CLI end to end
def test_confusions_sort_wrong_answers_by_where_the_value_stands():
    from phasefix.analyze.confusions import classify
    from phasefix.data.vocab import RetrievalVocab

    v = RetrievalVocab(num_keys=8, num_values=8, num_filler=2)
    k, val = v.key_token, v.value_token
    # BOS, then records (k0 v0) (k1 v1) (k2 v2) (k3 v0) (k4 v4) at positions 1..10; demos and the query after.
    row = np.array([v.bos, k(0), val(0), k(1), val(1), k(2), val(2), k(3), val(0), k(4), val(4),
                    k(2), val(2), k(1)])
    # Target k1 at position 3 (stride 4: block 0 = positions 0-3). Other values stand at 2 (block), 6 (next block),
    # 8 and 10 (elsewhere); v0 stands at 2 and at 8: the first match, block, wins.
    preds = np.array([val(0), val(2), val(4), v.filler_token(1), val(1)])
    category, chance = classify(np.tile(row, (5, 1)), preds, np.full(5, 3), stride=4, num_records=5, vocab=v)
    assert category.tolist() == [0, 1, 2, 3, 3]  # block, next, record, other, other (the target's own value)
    np.testing.assert_allclose(chance, np.tile([0.25, 0.25, 0.5], (5, 1)))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from phasefix.fit import compose, fit

    tmp = tmp_path_factory.mktemp("analyze")
    with cache_dir(tmp / "cache"):
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        summary = fit(compose(FAST + [f"logger.tracking_uri={uri}", f"output_dir={tmp / 'run'}"]))
    torch.set_num_threads(1)
    return {"dir": tmp / "run", "uri": uri, "run_id": summary["mlflow_run_id"]}


def test_cli_every_tool_logs_into_the_run(tiny_run, capsys):
    common = ["per_residue=1", "n_boot=20", "threads=1"]
    run_dir = str(tiny_run["dir"])
    assert main(["knockout", f"run={run_dir}", *common]) == 0
    assert main(["gates", f"run={run_dir}/checkpoints/last.ckpt", "padding=both", *common]) == 0
    assert main(["cycle", f"run={run_dir}", "shifts=-1..1", *common]) == 0
    assert main(["period", f"run={tiny_run['run_id']}", f"tracking_uri={tiny_run['uri']}", *common]) == 0
    assert main(["confusions", f"run={run_dir}", *common]) == 0
    out = capsys.readouterr().out
    assert "L1 kv1" in out and "pooled R^2" in out and "dominant period" in out and "static" in out
    assert "of the wrong answers: block" in out

    c = MlflowClient(tracking_uri=tiny_run["uri"])
    rid = tiny_run["run_id"]
    artifacts = {a.path for a in c.list_artifacts(rid, "analyze")}
    assert {"analyze/knockout.png", "analyze/gates.png", "analyze/gates-in_sequence.png", "analyze/cycle.png",
            "analyze/period.png"} <= artifacts
    metrics = c.get_run(rid).data.metrics
    assert "analyze/knockout/prefix/L0/kv1/mean_rel_change" in metrics or \
        "analyze/knockout/prefix/base_acc_mean" in metrics
    assert "analyze/gates/in_sequence/L1/value/h0/static_eff" in metrics
    assert "analyze/period/prefix/period_detected" in metrics
    assert "analyze/cycle/prefix/d1/acc_mean" in metrics
    assert {"analyze/confusions/prefix/accuracy", "analyze/confusions/prefix/block_chance"} <= set(metrics)
    assert len(c.get_metric_history(rid, "analyze/period/prefix/per_residue")) == 24


def test_cli_errors(tiny_run, capsys):
    assert main(["bogus", f"run={tiny_run['dir']}"]) == 2
    assert main(["knockout", f"run={tiny_run['dir']}", "padding=middle"]) == 2
    assert "padding" in capsys.readouterr().err
