"""`phasefix.theory`: the idealised induction model concentrates gates (key on one slot, value on the next), heads
that start alike collide, and the head-coordination term separates them; the CLI writes its outputs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from phasefix.theory import SimConfig, coordination, main, train

torch.set_num_threads(1)
TINY = dict(stride=4, chunks=4, vocab=16, dim=16, batch=32)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_head_concentrates_key_on_a_slot_and_value_on_the_next(seed):
    r = train(SimConfig(heads=1, stride=3, chunks=4, vocab=16, dim=16, batch=32, steps=100, seed=seed))
    k, v = int(r["key_slot"][0]), int(r["value_slot"][0])
    assert r["key_static_eff"][0] < 1.1 and r["key_window_eff"][0] < 1.1  # one fixed slot for every input
    assert r["value_static_eff"][0] < 1.1
    assert k < 2 and v == k + 1  # never the boundary slot; the value reads the next token
    assert r["acc_phase"][k] > 0.8  # the head answers its phase ...
    assert np.delete(r["acc_phase"], k).max() < 0.3  # ... and only that one (boundary phase included)
    assert r["losses"][-1] < r["losses"][0]


def test_heads_that_start_alike_collide_and_coordination_spreads_them():
    cfg = dict(heads=2, steps=150, seed=1, init_shared=1.0, **TINY)
    plain = train(SimConfig(**cfg))
    coord = train(SimConfig(coord_weight=2.0, **cfg))
    assert plain["collisions"] == 1 and plain["key_slot"][0] == plain["key_slot"][1]
    assert coord["collisions"] == 0
    assert coord["coverage"] > plain["coverage"]
    assert coord["structural_coverage"] == pytest.approx(2 / 3)


def test_coordination_is_the_mean_pairwise_overlap_plus_the_dead_slot_mass():
    """head_coord on key gates at W = S: the last slot (the boundary phase) answers nothing, so it counts as dead
    mass, not as overlap (docs/mitigations.md)."""
    P = torch.softmax(torch.randn(3, 5), dim=-1)
    q = P[:, :4]  # the answerable slots 0..3
    G = q @ q.T
    expected = (G.sum() - G.diagonal().sum()) / 6 + P[:, 4].mean()
    assert float(coordination(P, 0.5)) == pytest.approx(0.5 * float(expected), rel=1e-6)
    assert float(coordination(torch.eye(5)[:3], 1.0)) == 0.0  # disjoint heads on answerable slots: no overlap
    assert float(coordination(torch.eye(5)[[0, 1, 4]], 1.0)) == pytest.approx(1 / 3)  # one head on the dead slot


def test_cli_writes_figure_and_summary(tmp_path, capsys):
    out = tmp_path / "theory"
    assert main(["--heads", "2", "--stride", "3", "--chunks", "2", "--vocab", "8", "--dim", "8", "--steps", "3",
                 "--seeds", "1", "--coord-weight", "1", "--out", str(out)]) == 0
    assert (out / "theory.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["conditions"]) == {"no coordination", "head_coord 1"}
    assert "coverage" in capsys.readouterr().out
    assert main(["--heads", "3", "--stride", "3", "--out", str(out)]) == 2
    # a Hydra app: the same run as key=value overrides
    assert main(["heads=2", "stride=3", "chunks=2", "vocab=8", "dim=8", "steps=3", "seeds=1", "coord_weight=0",
                 f"out={out / 'kv'}"]) == 0
    assert set(json.loads((out / "kv" / "summary.json").read_text())["conditions"]) == {"no coordination"}
    assert main(["hedas=2"]) == 2 and "did you mean heads?" in capsys.readouterr().err
