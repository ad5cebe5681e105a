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
from phasefix.study.cells import cells, committed_runs, load_comparison
from phasefix.study.grid import run_comparison

HEADLINE = PROJECT_ROOT / "comparisons/headline.yaml"


def log_finished(uri: str, cfg, acc: float) -> str:
    """A FINISHED fit run in MLflow as phasefix.fit leaves one: its config (or a container of it) as params, its
    final scores."""
    c = tracking.client(uri)
    run_id = tracking.create_run(c, "phasefix", "fake", tags={"phasefix.kind": "fit"})
    tracking.log_params(c, run_id, cfg if isinstance(cfg, dict) else C.to_container(cfg))
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


def test_a_run_logged_before_a_key_existed_is_reused_where_the_cell_keeps_its_default(tmp_path):
    """A model key added since a run was logged (model.boundary_bridge, default 0: no bridge edges) is absent from
    its params: the run stands for the cell at that default, not for a cell that sets the key."""
    from phasefix.fit import compose
    from phasefix.study.cells import FitOrReuse

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = write_comparison(tmp_path / "tiny.yaml")
    cell = compose(["arm=spread", "seed=1"])
    old = C.to_container(cell)
    del old["model"]["boundary_bridge"], old["model"]["layer_compression"]  # as a run logged before issue 66
    run_id = log_finished(uri, old, 0.7)
    reuse = FitOrReuse(str(spec), uri)
    assert reuse.finished(cell)["mlflow_run_id"] == run_id
    assert reuse.finished(compose(["arm=spread", "seed=1", "model.boundary_bridge=1"])) is None
    assert reuse.finished(compose(["arm=spread", "seed=2"])) is None


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
    bad.write_text("per_residue: 0\nregimes:\n  default: [baseline]\n")
    with pytest.raises(ConfigError, match=r"per_residue=0 is invalid: must be an integer >= 1"):
        load_comparison(bad)
    bad.write_text("base: [model.window=5]\nregimes:\n  default: [baseline]\n")
    with pytest.raises(ConfigError, match="must not change what a cell trains"):
        load_comparison(bad)


def test_zero_cost_is_issue_54s_grid():
    comp = load_comparison(PROJECT_ROOT / "comparisons/zero_cost.yaml")
    assert [r.name for r in comp.regimes] == ["w4s4_inseqfirst", "w8s8_inseqfirst", "coverage_w8s8_curric",
                                              "records64"]
    first = cells(comp)
    assert [sum(c.regime == r.name for c in first) for r in comp.regimes] == [9, 12, 11, 10]  # arms per regime
    assert {c.seed for c in first if c.regime == "w4s4_inseqfirst"} == {3}


def test_dsv4_shape_cells_all_compose_at_the_documented_costs():
    """Every cell of comparisons/dsv4_shape.yaml composes and passes fit's checks (model, mitigations, evaluation
    period) before anything trains; the free arms keep the unmitigated model's entries, bytes and multiply-adds;
    each arm changes the model in its own way (no two arms of a regime train the same model)."""
    from phasefix.fit import compose, plan

    comp = load_comparison(PROJECT_ROOT / "comparisons/dsv4_shape.yaml")
    assert [r.name for r in comp.regimes] == ["w4s4_1kv", "dsv4_csa", "dsv4_hybrid"]
    models, trains = {}, {}
    for c in cells(comp):
        cfg = compose([*comp.base, *c.overrides()])
        m = plan(cfg)["model"]
        assert m.num_kv_heads == 1, c
        models[c.regime, c.arm] = m
        trains[c.regime, c.arm] = (m, C.to_container(cfg).get("mitigation"))
    for (regime, arm), m in models.items():
        base = models[regime, "baseline"]
        cost = (m.cache_entries_per_token(), m.head_dim, m.tied_kv)
        assert cost == (base.cache_entries_per_token(), base.head_dim, base.tied_kv), (regime, arm)
        if arm in ("stagger", "coprime_stagger", "s2_shift", "boundary_bridge"):
            assert m.compressor_flops_per_token() == base.compressor_flops_per_token(), (regime, arm)
        same = [a for (r, a), o in trains.items() if r == regime and a != arm and o == trains[regime, arm]]
        assert not same, (regime, arm, same)
    assert models["dsv4_hybrid", "baseline"].layer_shapes() == [None, (8, 4), (16, 16)]
    assert models["dsv4_csa", "baseline"].window == 8
    assert models["w4s4_1kv", "overlap"].window == 8 and models["w4s4_1kv", "baseline"].window == 4


def test_zero_cost_long_cells_equal_a_3000_step_run_forked_to_4500():
    """zero_cost_long's shift_spread cells were forked from zero_cost's step-3,000 checkpoints: that is its cells'
    training only if the learning rate of a 4,500-step run is the 3,000-step run's up to step 3,000 (the schedule
    depends on max_steps unless it is constant after warm-up) and the cell composes to 4,500 steps."""
    from omegaconf import OmegaConf

    from phasefix.fit import compose
    from phasefix.module import PhaseFixModule

    def lr_factor(cfg, max_steps: int):  # the module's learning-rate multiplier by step, for a run of max_steps
        module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                                optim=OmegaConf.to_container(cfg.optim, resolve=True), max_steps=max_steps)
        return module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]

    comp = load_comparison(PROJECT_ROOT / "comparisons/zero_cost_long.yaml")
    (cell,) = [c for c in cells(comp) if (c.arm, c.seed) == ("shift_spread", 0)]
    cfg = compose(cell.overrides())
    assert cfg.trainer.max_steps == cell.steps == 4500
    long, short = lr_factor(cfg, 4500), lr_factor(cfg, 3000)
    assert [long(s) for s in range(0, 3000, 50)] == [short(s) for s in range(0, 3000, 50)]
    decaying = compose([*cell.overrides(), "optim.min_lr_ratio=0.1"])  # a decaying schedule would differ
    assert lr_factor(decaying, 3000)(2000) < lr_factor(decaying, 4500)(2000)


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


def test_a_comparisons_tables_join_its_regimes_committed_folders_on_any_store(tmp_path, monkeypatch):
    """A comparison of one new arm (flat at 0.95) in a regime whose baseline (mean 0.90) is only a committed table
    row: its table carries that row (naming its folder) and judges the arm against it. On the next machine (an empty
    store) the first seed is found in the comparison's own committed tables, only the second one trains, and the
    table pools both seeds with the baseline row again."""
    from helpers import committed_table, phase_result
    from phasefix.tables import write_csv

    monkeypatch.chdir(tmp_path)  # the tables name folders relative to the working directory
    base = committed_table(tmp_path / "base", [("default", "baseline", 3, 0, 0.90, 0.20)])
    write_csv(base / "comparison.csv", [], ("run_id",))  # a table folder's runs (none here: rows only)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nbase: [trainer.progress_bar=false]\nseeds: [0]\nout: {tmp_path / 'out'}\n"
                    f"regimes:\n  default:\n    arms: [spread]\n    table: [{base}]\n")
    trained = []

    def fake_fit(uri):
        def fit(cfg, callbacks=()):
            trained.append(cfg.seed)
            c = tracking.client(uri)
            # where the real fit logs: the experiment of the stage's study (`study-tiny`, `study-tiny-then`, ...)
            run_id = tracking.create_run(c, cfg.logger.experiment_name, f"spread-s{cfg.seed}", tags={
                "phasefix.kind": "fit", "comparison": "tiny", "regime": cfg.regime, "arm": cfg.arm})
            tracking.log_params(c, run_id, C.to_container(cfg))
            for pad in ("prefix", "in_sequence"):
                tracking.log_phase_result(c, run_id, pad, phase_result(cfg.seed, 0.95, 0.0))
            c.set_terminated(run_id, "FINISHED")
            return {"prefix": {"acc_mean": 0.95, "acc_worst": 0.95}, "mlflow_run_id": run_id}
        return fit

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert run_comparison(spec, fit_fn=fake_fit(uri), tracking_uri=uri)["rc"] == 0
    rows = {(r["arm"], r["padding"]): r for r in read_rows(tmp_path / "out" / "decisive.csv")}
    assert set(rows) == {(a, p) for a in ("baseline", "spread") for p in ("prefix", "in_sequence")}
    assert rows[("baseline", "prefix")]["table"] == "base" and rows[("baseline", "prefix")]["acc_mean"] == "0.900000"
    assert rows[("spread", "prefix")]["table"] == "out" and rows[("spread", "prefix")]["goal_met"] == "1"
    again = run_comparison(spec, fit_fn=fake_fit(uri), tracking_uri=uri, out=tmp_path / "again", report_only=True)
    written = read_rows(tmp_path / "out" / "decisive.csv")
    assert again["cells"] == 0 and read_rows(tmp_path / "again" / "decisive.csv") == [
        {**r, "table": "again" if r["table"] == "out" else r["table"]} for r in written]

    # the next machine: an empty store, the comparison grown to two seeds, its own tables listed as committed runs
    spec.write_text(spec.read_text().replace("seeds: [0]", "seeds: [0, 1]").replace(f"[{base}]",
                                                                                    f"[{base}, {tmp_path / 'out'}]"))
    trained.clear()
    uri2 = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert run_comparison(spec, fit_fn=fake_fit(uri2), tracking_uri=uri2,
                          storage=f"sqlite:///{tmp_path / 'fresh-study.db'}")["rc"] == 0
    assert trained == [1]
    rows = {(r["arm"], r["padding"]): r for r in read_rows(tmp_path / "out" / "decisive.csv")}
    assert rows[("baseline", "prefix")]["table"] == "base"
    assert rows[("spread", "prefix")]["seeds"] == "2" and rows[("spread", "prefix")]["goal_met"] == "2"
    # seed 0's row (its command, commit, machine, time) and curve stay though this store never saw it
    scored = {r["run_name"] for r in read_rows(tmp_path / "out" / "comparison.csv") if r["padding"] == "prefix"}
    curves = {r["run_id"] for r in read_rows(tmp_path / "out" / "phase_curves.csv")}
    assert scored == {"spread-s0", "spread-s1"} and len(curves) == 2
    # a third machine: both seeds are found in the comparison's own tables, nothing trains
    trained.clear()
    uri3 = f"sqlite:///{tmp_path / 'third.db'}"
    assert run_comparison(spec, fit_fn=fake_fit(uri3), tracking_uri=uri3,
                          storage=f"sqlite:///{tmp_path / 'third-study.db'}")["rc"] == 0 and trained == []
    # once more on that store: its tables now hold seed 1 too, which the store has (skipped there, not counted twice)
    run_comparison(spec, fit_fn=fake_fit(uri2), tracking_uri=uri2, report_only=True)
    rows = {(r["arm"], r["padding"]): r for r in read_rows(tmp_path / "out" / "decisive.csv")}
    assert rows[("spread", "prefix")]["seeds"] == "2" and rows[("baseline", "prefix")]["table"] == "base"
    # a folder whose comparison.csv lost a run (written from a store without it, before its rows were kept) still
    # gives that run as finished: its decisive table pools it, its name gives the seed
    from phasefix.study.cells import committed_runs
    from phasefix.tables import write_csv

    scores = read_rows(tmp_path / "out" / "comparison.csv")
    write_csv(tmp_path / "out" / "comparison.csv", [r for r in scores if r["run_name"] != "spread-s0"], list(scores[0]))
    assert sorted((r["arm"], r["seed"]) for r in committed_runs(tmp_path / "out")) == [("spread", 0), ("spread", 1)]


def read_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_only_runs_a_slice_of_the_comparison_with_its_baseline(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = tmp_path / "three.yaml"
    spec.write_text("name: three\nseeds: [0]\nregimes:\n  default:\n    arms: [baseline, spread, shift_spread]\n")
    trained = []

    def fake_fit(cfg, callbacks=()):
        trained.append(cfg.arm)
        assert cfg.logger.tags.comparison == "three"  # a slice's runs are the comparison's: its tables find them
        return {"prefix": {"acc_mean": 0.6, "acc_worst": 0.6}, "mlflow_run_id": log_finished(uri, cfg, 0.6)}

    assert run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri, only=["default/spread"])["rc"] == 0
    assert sorted(trained) == ["baseline", "spread"]
    with pytest.raises(ConfigError, match=r"only='default/nonesuch' is invalid: names no arm of default in "
                                          r"three.yaml: baseline, spread, shift_spread"):
        run_comparison(spec, fit_fn=fake_fit, tracking_uri=uri, only=["default/nonesuch"])


def test_the_tables_of_cells_run_by_hand_say_which_arms_the_staged_rule_stops(tmp_path, monkeypatch):
    """Cells trained outside the study (by hand, or on another machine) and only reported: an arm whose first seed
    scored below the unmitigated mean of the regime's committed folder (0.90) is marked stopped in stopped.md, one
    above it (it goes on to its `then` seeds) and one that has its `then` seed already are not."""
    from helpers import committed_table, phase_result
    from phasefix.fit import compose
    from phasefix.tables import write_csv

    monkeypatch.chdir(tmp_path)
    base = committed_table(tmp_path / "base", [("default", "baseline", 1, 0, 0.90, 0.20)])
    write_csv(base / "comparison.csv", [  # the unmitigated seed 0 as a committed run
        {"run_id": "b" * 32, "run_name": "base-s0", "padding": pad, "acc_mean": 0.90, "acc_worst": 0.20,
         "acc_gap": 0.7, "command": "python -m phasefix.fit seed=0 +logger.tags.regime=default "
                                    "+logger.tags.arm=baseline"} for pad in ("prefix", "in_sequence")],
              ("run_id", "run_name", "padding", "acc_mean", "acc_worst", "acc_gap", "command"))
    spec = tmp_path / "staged.yaml"
    spec.write_text(f"name: staged\nseeds: [0]\nthen: {{seeds: [1]}}\nout: {tmp_path / 'out'}\n"
                    f"regimes:\n  default:\n    arms: [baseline, spread, shift_spread, bridge]\n"
                    f"    table: [{base}]\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)

    def log(arm, seed, acc):
        run_id = tracking.create_run(c, "phasefix", f"{arm}-s{seed}", tags={
            "phasefix.kind": "fit", "comparison": "staged", "regime": "default", "arm": arm})
        tracking.log_params(c, run_id, C.to_container(compose([f"arm={arm}", f"seed={seed}"])))
        for pad in ("prefix", "in_sequence"):
            tracking.log_phase_result(c, run_id, pad, phase_result(seed, acc, 0.0))
        c.set_terminated(run_id, "FINISHED")

    for arm, seed, acc in (("spread", 0, 0.95), ("shift_spread", 0, 0.60), ("bridge", 0, 0.60), ("bridge", 1, 0.6)):
        log(arm, seed, acc)
    res = run_comparison(spec, tracking_uri=uri, report_only=True)
    assert res["stopped"] == {("default", "shift_spread"): "mean below the unmitigated mean"}
    assert "| default | shift_spread | mean below the unmitigated mean |" in \
        (tmp_path / "out" / "stopped.md").read_text()
    log("shift_spread", 1, 0.6)  # trained on anyway: no longer stopped, and the old file does not say it is
    assert run_comparison(spec, tracking_uri=uri, report_only=True)["stopped"] == {}
    assert not (tmp_path / "out" / "stopped.md").exists()


def test_cells_scored_on_fewer_prompts_than_per_residue_are_re_scored_once_and_the_tables_take_the_re_scoring(
        tmp_path, monkeypatch):
    """`per_residue: 2`: the cell the fit scored on 1 prompt per residue (one trained before the key was set; it
    logged 0.95) is scored again by phasefix.evaluate from its checkpoint, an untrained model, and the tables hold that
    re-scoring for it: 24 x 2 prompts per padding, about chance, one member per seed (not the fit and its re-scoring
    both). A cell the fit scored on 2 prompts is not re-scored, nor one whose checkpoint is gone (its scores stand);
    a second report re-scores nothing."""
    import json

    from helpers import phase_result, save_fit_run

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    spec = tmp_path / "resc.yaml"
    spec.write_text(f"name: resc\nbase: [trainer.progress_bar=false, eval.n_boot=20]\nseeds: [0, 1]\n"
                    f"per_residue: 2\nout: {tmp_path / 'out'}\nregimes:\n  default:\n    arms: [baseline, spread]\n")
    fits = {}

    def fit(cfg, callbacks=()):
        assert cfg.eval.per_residue == 2  # a new cell scores on the file's count itself
        if cfg.arm == "spread":
            cfg.eval.per_residue = 1  # as if trained before the file asked for 2
        run_dir = tmp_path / "runs" / f"{cfg.arm}-s{cfg.seed}"
        if (cfg.arm, cfg.seed) != ("spread", 1):  # spread s1's checkpoint is on another machine
            save_fit_run(run_dir, cfg)
        run_id = tracking.create_run(c, "phasefix", f"{cfg.arm}-s{cfg.seed}", tags={
            "phasefix.kind": "fit", "comparison": "resc", "regime": cfg.regime, "arm": cfg.arm,
            "output_dir": str(run_dir)})
        tracking.log_params(c, run_id, C.to_container(cfg))
        for pad in ("prefix", "in_sequence"):
            tracking.log_phase_result(c, run_id, pad, phase_result(cfg.seed, 0.95, 0.0))
        c.set_terminated(run_id, "FINISHED")
        fits[f"{cfg.arm}-s{cfg.seed}"] = run_id
        return {"prefix": {"acc_mean": 0.95, "acc_worst": 0.95}, "mlflow_run_id": run_id}

    res = run_comparison(spec, fit_fn=fit, tracking_uri=uri)
    assert res["rc"] == 0 and res["rescored"] == 1
    summary = json.loads((tmp_path / "runs" / "spread-s0" / "pr2" / "summary.json").read_text())
    assert summary["prefix"]["count"] == [2] * 24 and summary["in_sequence"]["count"] == [2] * 24
    assert c.get_run(summary["mlflow_run_id"]).data.tags["phasefix.source_run"] == fits["spread-s0"]
    members = read_rows(tmp_path / "out" / "decisive_runs.csv")
    assert sorted({m["run_name"] for m in members}) == ["baseline-s0", "baseline-s1", "spread-s0-pr2", "spread-s1"]
    rescored = next(m for m in members if m["run_name"] == "spread-s0-pr2" and m["padding"] == "prefix")
    assert float(rescored["acc_mean"]) == pytest.approx(summary["prefix"]["acc_mean"], abs=1e-4)
    assert float(rescored["acc_mean"]) < 0.5  # the untrained model, not the 0.95 the fit logged
    rows = {(r["arm"], r["padding"]): r for r in read_rows(tmp_path / "out" / "decisive.csv")}
    assert rows[("spread", "prefix")]["seeds"] == "2"
    assert fits["spread-s0"] not in (tmp_path / "out" / "comparison.csv").read_text()
    assert run_comparison(spec, fit_fn=fit, tracking_uri=uri, report_only=True)["rescored"] == 0


def test_a_comparison_reuses_the_cells_its_own_tables_hold():
    """comparisons/rates.yaml's w8s8_inseqfirst names only the folders of seeds 0-2 in `table:`; its later seeds were
    trained by earlier slices and are committed in the comparison's own tables (docs/figures/rates). A fresh store
    must find them there rather than train them again; a seed no table holds is not found."""
    from phasefix.fit import compose
    from phasefix.study.cells import FitOrReuse

    reuse = FitOrReuse(str(PROJECT_ROOT / "comparisons/rates.yaml"), "sqlite:///:memory:")
    regime, arm = "w8s8_inseqfirst", "shift_spread_gate_diversity"
    folders = next(r.tables for r in load_comparison(PROJECT_ROOT / "comparisons/rates.yaml").regimes
                   if r.name == regime)
    elsewhere = {run["run_id"] for t in folders for run in committed_runs(t)}
    own = [run for run in committed_runs(PROJECT_ROOT / "docs/figures/rates")
           if (run["regime"], run["arm"]) == (regime, arm) and run["run_id"] not in elsewhere]
    assert {run["seed"] for run in own} >= {3, 4, 5}
    for run in own:
        assert reuse.tables()[(regime, arm, run["seed"])]["run_id"] == run["run_id"]
        found = reuse.finished(compose([f"regime={regime}", f"arm={arm}", f"seed={run['seed']}"]))
        assert found["mlflow_run_id"] == run["run_id"]
    assert (regime, arm, 1000) not in reuse.tables()


def test_a_comparison_reads_each_committed_folder_once(monkeypatch):
    """rates.yaml names docs/figures/rates in a regime's `table:` (relative) and as its `out` (made absolute): the
    index reads every folder once, however it is written and however many regimes name it."""
    from phasefix.study import cells

    read = []
    monkeypatch.setattr(cells, "committed_runs", lambda folder: read.append(Path(folder).resolve()) or [])
    cells.FitOrReuse(str(PROJECT_ROOT / "comparisons/rates.yaml")).tables()
    assert (PROJECT_ROOT / "docs/figures/rates").resolve() in read
    assert len(read) == len(set(read))
