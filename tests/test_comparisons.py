"""Comparison files (phasefix.study.cells): a grid of regime x arm x seed cells through the study runner; a cell
finished before (a committed table's run, or a FINISHED run in MLflow with the same composed config) is not trained
again."""
from __future__ import annotations

from pathlib import Path

import pytest

from phasefix import config as C
from phasefix import tracking
from phasefix.errors import ConfigError
from phasefix.paths import PROJECT_ROOT
from phasefix.study.cells import cells, load_comparison
from phasefix.study.grid import run_comparison

HEADLINE = PROJECT_ROOT / "comparisons/headline.yaml"


def log_finished(uri: str, cfg, acc: float) -> str:
    """A FINISHED fit run in MLflow as phasefix.fit leaves one: its config as params, its final scores."""
    c = tracking.client(uri)
    run_id = tracking.create_run(c, "phasefix", "fake", tags={"phasefix.kind": "fit"})
    tracking.log_params(c, run_id, C.to_container(cfg))
    for pad in ("prefix", "in_sequence"):
        for k in ("acc_mean", "acc_worst", "acc_gap"):
            c.log_metric(run_id, f"final/{pad}/{k}", acc)
    c.set_terminated(run_id, "FINISHED")
    return run_id


def write_comparison(path: Path) -> Path:
    path.write_text("name: tiny\nbase: [trainer.progress_bar=false]\nseeds: [0, 1]\n"
                    "regimes:\n  default:\n    arms: [baseline, spread]\n")
    return path


def test_an_empty_store_trains_exactly_the_missing_cells_and_a_complete_one_nothing(tmp_path):
    from phasefix.fit import compose

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = write_comparison(tmp_path / "tiny.yaml")
    before = log_finished(uri, compose(["arm=spread", "seed=1", "trainer.num_threads=1"]), 0.5)  # typed by hand
    trained = []

    def fake_fit(cfg, callbacks=()):
        trained.append(f"{cfg.regime}/{cfg.arm}/s{cfg.seed}")
        run_id = log_finished(uri, cfg, 0.9)
        return {"prefix": {"acc_mean": 0.9, "acc_worst": 0.9}, "mlflow_run_id": run_id}

    first = run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri)
    assert first["rc"] == 0 and first["cells"] == 4
    assert sorted(trained) == ["default/baseline/s0", "default/baseline/s1", "default/spread/s0"]
    assert before  # the hand-typed run stands for default/spread/s1
    trained.clear()
    again = run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri)  # the same study: every cell complete
    fresh = run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri,  # a new study storage: found in MLflow
                           storage=f"sqlite:///{tmp_path / 'other.db'}")
    assert again["rc"] == fresh["rc"] == 0 and trained == []


def test_the_headline_rewrites_its_tables_from_the_committed_runs_without_training(tmp_path):
    def no_fit(cfg, callbacks=()):
        raise AssertionError(f"trained {cfg.regime}/{cfg.arm}/s{cfg.seed}: every headline cell is committed")

    res = run_comparison(HEADLINE, fit_fn=no_fit, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                         storage=f"sqlite:///{tmp_path / 'headline.db'}", out=tmp_path / "headline")
    assert res["rc"] == 0 and res["cells"] == 54
    for name in ("headline.csv", "headline.md", "runs.md"):
        assert (tmp_path / "headline" / name).read_bytes() == \
            (PROJECT_ROOT / "docs/figures/headline" / name).read_bytes(), name


def test_a_bad_comparison_file_is_one_line_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("regimes:\n  default:\n    arms: [bridge, nonesuch]\n")
    with pytest.raises(ConfigError, match=r"regimes.default.arms=.*nonesuch.* is invalid: allowed values"):
        load_comparison(bad)
    bad.write_text("base: [model.window=5]\nregimes:\n  default: [baseline]\n")
    with pytest.raises(ConfigError, match="must not change what a cell trains"):
        load_comparison(bad)


def test_zero_cost_is_issue_54s_grid():
    comp = load_comparison(PROJECT_ROOT / "comparisons/zero_cost.yaml")
    assert [r.name for r in comp.regimes] == ["w4s4_inseqfirst", "w8s8_inseqfirst", "coverage_w8s8_curric",
                                              "records64"]
    first = cells(comp)
    assert len(first) == 9 + 3 * 10 and {c.seed for c in first if c.regime == "w4s4_inseqfirst"} == {3}


def test_then_seeds_go_only_to_arms_that_learned_and_are_not_below_the_baseline(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = tmp_path / "staged.yaml"
    spec.write_text("name: staged\nseeds: [0]\nthen: {seeds: [1]}\n"
                    "regimes:\n  default:\n    arms: [baseline, spread, shift_spread, gate_diversity]\n")
    # chance is 1/32 on the default task: learned means a prefix mean >= 5/32
    acc = {"baseline": 0.6, "spread": 0.7, "shift_spread": 0.5, "gate_diversity": 0.05}
    trained = []

    def fake_fit(cfg, callbacks=()):
        trained.append(f"{cfg.arm}/s{cfg.seed}")
        return {"prefix": {"acc_mean": acc[cfg.arm], "acc_worst": acc[cfg.arm]},
                "mlflow_run_id": log_finished(uri, cfg, acc[cfg.arm])}

    res = run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri)
    assert res["rc"] == 0
    assert sorted(trained) == sorted(["baseline/s0", "spread/s0", "shift_spread/s0", "gate_diversity/s0",
                                      "baseline/s1", "spread/s1"])
    assert res["stopped"] == {("default", "shift_spread"): "mean below the unmitigated mean",
                              ("default", "gate_diversity"): "did not learn on its first seed(s)"}
