"""`phasefix.study`: study files, the smoke study with real fits (Pareto files, MLflow parent and children, pruning,
resume), 2 workers on one storage, a SIGKILLed worker's trial failed and retried, and a real PostgreSQL server.

The worker tests inject a cheap objective (`fake_fit` below, `run_study(..., fit_fn=...)`) so that they test the
storage and worker machinery in seconds; the smoke tests run real fits.
"""
from __future__ import annotations

import csv
import functools
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from phasefix.errors import ConfigError
from phasefix.paths import PROJECT_ROOT

SMOKE = PROJECT_ROOT / "studies" / "smoke.yaml"


# ------------------------------------------------------------------------------------------------ the cheap objective
def fake_fit(cfg, callbacks=(), *, fake_dir: str, mode: str = "barrier"):
    """Stands in for `phasefix.fit.fit` in worker processes (`run_study(..., fit_fn=partial(fake_fit, ...))`).

    barrier: every trial waits (<= 120 s) until trials of two different worker processes have started, so two
    workers provably run at once; kill: the first trial of the study writes `victim` (pid, trial) and hangs."""
    d = Path(fake_dir)
    trial = int(cfg.logger.tags.trial)
    assert cfg.logger.parent_run_id and cfg.logger.tags.study
    assert cfg.trainer.max_steps == 12 and cfg.eval.paddings == ["prefix"]  # the study's base overrides
    (d / f"trial{trial}.pid{os.getpid()}").write_text(str(cfg.optim.lr))
    if mode == "barrier":
        deadline = time.time() + 120
        while len({p.name.split(".pid")[1] for p in d.glob("trial*.pid*")}) < 2 and time.time() < deadline:
            time.sleep(0.05)
    elif mode == "kill":
        try:
            fd = os.open(d / "victim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, f"{os.getpid()} {trial}".encode())
            os.close(fd)
            time.sleep(600)  # SIGKILLed here by the test
    lr = float(cfg.optim.lr)
    from omegaconf import OmegaConf

    weight = float(OmegaConf.select(cfg, "mitigation.gate_diversity.weight", default=0.0))
    return {"mlflow_run_id": None, "train_seconds": 0.0,
            "prefix": {"acc_mean": round(1 - abs(lr - 3e-3) * 50, 4), "acc_worst": round(0.5 + 0.4 * weight, 4)}}


def assert_close_params(got: dict, expected: dict, rel: float) -> None:
    """Numbers within `rel` (a CSV round trip rounds them), everything else (categorical choices) exactly:
    pytest.approx refuses a container that holds a string (pytest >= 9.2)."""
    numeric = {k for k, v in expected.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert got.keys() == expected.keys()
    assert {k: got[k] for k in got.keys() - numeric} == {k: expected[k] for k in expected.keys() - numeric}
    assert {k: got[k] for k in numeric} == pytest.approx({k: expected[k] for k in numeric}, rel=rel)


def seeded_fit(cfg, callbacks=(), *, fake_dir: str, prune_seed: int | None = None):
    """Stands in for `phasefix.fit.fit` in a study with `seeds:`: the accuracy depends on the seed alone, and every
    call records its seed, run name and output directory; `prune_seed`: that seed's run is pruned, as the study's
    pruning callback would."""
    with open(Path(fake_dir) / "calls.txt", "a") as f:
        f.write(f"{cfg.logger.tags.trial} {cfg.seed} {cfg.run_name} {cfg.output_dir}\n")
    seed = int(cfg.seed)
    if seed == prune_seed:
        import optuna

        raise optuna.TrialPruned(f"val/prefix/acc_mean=0.01 < 0.1 at step 6 (seed {seed})")
    return {"mlflow_run_id": f"run{cfg.logger.tags.trial}s{seed}", "train_seconds": 10.0 * (seed + 1),
            "prefix": {"acc_mean": 0.9 - 0.4 * seed, "acc_worst": 0.6 - 0.4 * seed}}


# ------------------------------------------------------------------------------------------------ helpers
pytestmark = pytest.mark.usefixtures("cache_dir")  # conftest.py


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory):
    """One MLflow store for the module (creating one costs seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def write_study(tmp_path: Path, mlflow_db: str, name: str = "smoke", **changes) -> Path:
    raw = yaml.safe_load(SMOKE.read_text())
    raw["name"] = name
    raw["base"] = raw["base"] + [f"logger.tracking_uri={mlflow_db}"]
    raw["output_dir"] = str(tmp_path / "outputs")
    raw.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def load(path: Path, storage: str | None = None):
    import optuna

    from phasefix.study import load_spec, make_storage

    spec = load_spec(path)
    url = spec.storage_url(storage)
    return spec, optuna.load_study(study_name=spec.name, storage=make_storage(spec, url, with_callbacks=False))


def states(study) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def fake_env(tmp_path: Path, mode: str):
    """The directory the fake trials write to, and the fit function for run_study (picklable: workers are
    spawned processes)."""
    d = tmp_path / "fake"
    d.mkdir()
    return d, functools.partial(fake_fit, fake_dir=str(d), mode=mode)


# ------------------------------------------------------------------------------------------------ study files
@pytest.mark.parametrize("change,key", [
    ({"colour": 1}, "colour"),
    ({"params": {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2, "override": "optim.lr"}}},
     "params.lr.type"),
    ({"params": {"lr": {"type": "float", "low": 1e-2, "high": 1e-3, "override": "optim.lr"}}}, "params.lr.high"),
    ({"params": {"lr": {"type": "float", "low": 0, "high": 1e-3, "log": True, "override": "optim.lr"}}},
     "params.lr.low"),
    ({"params": {"w": {"type": "float", "low": 0.1, "high": 1, "override": "mitigation.head_coord.weight"}}},
     "params.w.requires"),
    ({"sampler": {"type": "cmaes"}}, "sampler.type"),
    ({"sampler": {"type": "nsga2", "n_startup_trials": 3}}, "sampler.n_startup_trials"),
    ({"objectives": [{"metric": "prefix.acc_mean", "direction": "up"}]}, "objectives[0].direction"),
    ({"pruning": [{"step": 10, "metric": "prefix.acc_median", "min": 0.1}]}, "pruning[0].metric"),
    ({"storage": {"url": "journal:./x.log"}}, "storage.url"),
    ({"storage": {"heartbeat_interval": 10, "grace_period": 5}}, "storage.grace_period"),
    ({"constraints": [{"metric": "lm_loss"}]}, "constraints[0]"),
])
def test_bad_study_files_fail_with_one_line_naming_the_key(tmp_path, change, key):
    from phasefix.study import load_spec

    path = write_study(tmp_path, "sqlite://", **change)
    with pytest.raises(ConfigError) as e:
        load_spec(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("smoke.yaml: ") and key in msg, msg


def test_a_study_with_seeds_trains_every_trial_on_each_seed_and_scores_their_mean(tmp_path, mlflow_db):
    """`seeds: [0, 1]`: every trial is one run per seed (seed override, own run name and output directory), its
    objectives and constraints are the mean over the seeds (hand-computed: (0.9 + 0.5) / 2, (0.6 + 0.2) / 2), each
    seed's own values are kept, and a `seed=` in base beside `seeds:` is one line naming the key."""
    from phasefix.study import load_spec, run_study

    d = tmp_path / "fake"
    d.mkdir()
    path = write_study(tmp_path, mlflow_db, name="seeded", seeds=[0, 1],
                       constraints=[{"metric": "final/prefix/acc_worst", "min": 0.5}])
    assert run_study(path, workers=1, fit_fn=functools.partial(seeded_fit, fake_dir=str(d)))["rc"] == 0
    calls = [line.split() for line in (d / "calls.txt").read_text().splitlines()]
    assert [(t, s) for t, s, _, _ in calls] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert [name for _, _, name, _ in calls[:2]] == ["seeded-t0-s0", "seeded-t0-s1"]
    assert len({out for *_, out in calls}) == 4
    _, study = load(path)
    for t in study.trials:
        assert t.state.name == "COMPLETE" and t.values == pytest.approx([0.7, 0.4])
        assert t.user_attrs["constraints"] == pytest.approx([0.1])  # 0.5 - 0.4 > 0: infeasible on the mean
        assert t.user_attrs["seed_metrics"]["1"]["final/prefix/acc_worst"] == pytest.approx(0.2)
        assert t.user_attrs["metrics"]["train_seconds"] == pytest.approx(15.0)
        assert t.user_attrs["mlflow_run_id"] == f"run{t.number}s0,run{t.number}s1"
    rows = list(csv.DictReader(open(tmp_path / "reports" / "seeded" / "trials.csv")))
    assert [(r["final/prefix/acc_worst"], r["final/prefix/acc_worst@s0"], r["final/prefix/acc_worst@s1"])
            for r in rows] == [("0.4", "0.6", "0.2")] * 2
    # the committed report carries the per-seed values to a machine without the storage
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    run_study(path, n_trials=2, storage=fresh, fit_fn=functools.partial(seeded_fit, fake_dir=str(d)),
              import_from=tmp_path / "reports" / "seeded" / "trials.csv")
    for t in load(path, fresh)[1].trials:
        assert t.user_attrs["imported_from"].startswith("trials.csv")  # imported, not trained again
        assert t.user_attrs["seed_metrics"] == {"0": pytest.approx({"final/prefix/acc_mean": 0.9,
                                                                    "final/prefix/acc_worst": 0.6}),
                                                "1": pytest.approx({"final/prefix/acc_mean": 0.5,
                                                                    "final/prefix/acc_worst": 0.2})}
    # a seed that is pruned prunes the trial: the later seeds do not run, the trial is infeasible
    (d / "calls.txt").unlink()
    pruned = write_study(tmp_path, mlflow_db, name="pruned_seed", seeds=[0, 1, 2], n_trials=1,
                         constraints=[{"metric": "final/prefix/acc_worst", "min": 0.1}])
    run_study(pruned, workers=1, fit_fn=functools.partial(seeded_fit, fake_dir=str(d), prune_seed=1))
    assert [line.split()[1] for line in (d / "calls.txt").read_text().splitlines()] == ["0", "1"]
    _, study = load(pruned)
    (t,) = study.trials
    assert t.state.name == "PRUNED" and t.values is None
    both = write_study(tmp_path, mlflow_db, name="both", seeds=[0, 1],
                       base=yaml.safe_load(SMOKE.read_text())["base"] + ["seed=3"])
    with pytest.raises(ConfigError, match=r"^both.yaml: seeds=\[0, 1\] is invalid"):
        load_spec(both)


def test_a_continued_study_does_not_draw_its_first_trials_again(tmp_path, mlflow_db):
    """A study with a fixed sampler seed, stopped and rerun: the rerun's trials are new draws (before, the seeded
    startup sampler replayed trials 0, 1, ... and a resumed study ran them twice)."""
    from phasefix.study import run_study

    _, fake = fake_env(tmp_path, "plain")
    path = write_study(tmp_path, mlflow_db, name="continued")
    assert run_study(path, n_trials=2, workers=1, fit_fn=fake)["rc"] == 0
    assert run_study(path, n_trials=4, workers=1, fit_fn=fake)["rc"] == 0
    _, study = load(path)
    drawn = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(drawn) == 4 and len(set(drawn)) == 4, drawn


def shift_fit(cfg, callbacks=(), *, fake_dir: str):
    """Stands in for `phasefix.fit.fit` in a study over `model.token_shift` alone: every call is recorded; shift 0 is
    pruned, 2 and 3 end at fixed accuracies."""
    shift = int(cfg.model.token_shift)
    with open(Path(fake_dir) / "calls.txt", "a") as f:
        f.write(f"{cfg.logger.tags.trial} {shift}\n")
    if shift == 0:
        import optuna

        raise optuna.TrialPruned("val/prefix/acc_mean=0.01 < 0.1 at step 6")
    return {"mlflow_run_id": f"run{cfg.logger.tags.trial}", "train_seconds": 1.0,
            "prefix": {"acc_mean": {2: 0.9, 3: 0.8}[shift], "acc_worst": {2: 0.5, 3: 0.8}[shift]}}


@pytest.mark.parametrize("duplicates", ["reuse", "rerun"])
def test_a_trial_with_a_finished_trials_params_takes_its_values_without_a_fit(tmp_path, mlflow_db, duplicates):
    """Three choices, six trials: at least three repeat an earlier trial's params. With `duplicates: reuse` (the
    default) each config is fitted once; a repeat of a complete trial gets its values, constraints and MLflow run, a
    repeat of a pruned one is pruned; they are named in trials.csv and left out of the front. `rerun` fits every
    trial. A bad value is one line naming the key."""
    from phasefix.study import load_spec, run_study

    d = tmp_path / "fake"
    d.mkdir()
    path = write_study(tmp_path, mlflow_db, name=f"twins_{duplicates}", n_trials=6, duplicates=duplicates,
                       params={"shift": {"type": "categorical", "choices": [0, 2, 3], "override": "model.token_shift"}},
                       sampler={"type": "random", "seed": 1},  # draws 2, 0, 3, 3, 2, 0
                       constraints=[{"metric": "final/prefix/acc_worst", "min": 0.6}])
    assert run_study(path, workers=1, fit_fn=functools.partial(shift_fit, fake_dir=str(d)))["rc"] == 0
    calls = [line.split() for line in (d / "calls.txt").read_text().splitlines()]
    _, study = load(path)
    trials = study.trials
    shifts = [t.params["shift"] for t in trials]
    assert len(trials) == 6 and all(shifts.count(c) >= 2 for c in (0, 2, 3)), shifts  # every kind of repeat
    if duplicates == "rerun":
        assert [int(t) for t, _ in calls] == list(range(6))
        assert not any("duplicate_of" in t.user_attrs for t in trials)
        return
    first = {s: shifts.index(s) for s in shifts}  # each config's first trial: the only one fitted
    assert sorted(int(t) for t, _ in calls) == sorted(first.values())
    rows = {int(r["trial"]): r for r in csv.DictReader(open(tmp_path / "reports" / path.stem / "trials.csv"))}
    for t in trials:
        twin = first[t.params["shift"]]
        if t.number == twin:
            assert "duplicate_of" not in t.user_attrs
            continue
        assert t.user_attrs["duplicate_of"] == twin
        if t.params["shift"] == 0:
            assert t.state.name == "PRUNED" and t.values is None
            assert t.user_attrs["pruned"] == f"as trial {twin}: val/prefix/acc_mean=0.01 < 0.1 at step 6"
            continue
        expected = {2: [0.9, 0.5], 3: [0.8, 0.8]}[t.params["shift"]]
        assert t.state.name == "COMPLETE" and t.values == pytest.approx(expected)
        assert t.user_attrs["mlflow_run_id"] == f"run{twin}"
        assert t.user_attrs["constraints"] == pytest.approx([0.6 - expected[1]])
        assert rows[t.number]["note"] == f"duplicate of trial {twin} (its values, no fit)"
    front = [int(r["trial"]) for r in csv.DictReader(open(tmp_path / "reports" / path.stem / "pareto.csv"))]
    assert front == [first[3]]  # once; shift 2 is infeasible (worst 0.5 < 0.6)
    bad = write_study(tmp_path, mlflow_db, name="bad_twins", duplicates="skip")
    with pytest.raises(ConfigError, match=r"^bad_twins.yaml: duplicates='skip' is invalid: allowed values are "
                                          r"'reuse', 'rerun'$"):
        load_spec(bad)


@pytest.mark.parametrize("option", [["--n-trials", "0"], ["--n-trials", "-1"], ["--workers", "0"]])
def test_bad_budget_or_workers_fail_with_one_line(tmp_path, capsys, option):
    from phasefix.study.__main__ import main

    assert main([str(write_study(tmp_path, "sqlite://")), *option]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{option[0][2:].replace('-', '_')}=" in err, err


def test_misspelt_override_key_fails_before_any_trial(tmp_path):
    from phasefix.study import load_spec, validate

    params = {"lr": {"type": "logfloat", "low": 1e-3, "high": 1e-2, "override": "optim.learning_rate"}}
    with pytest.raises(ConfigError, match="optim.learning_rate"):
        validate(load_spec(write_study(tmp_path, "sqlite://", params=params)))


def test_a_choice_the_model_cannot_take_fails_before_any_trial(tmp_path):
    """head_coord needs two KV heads: with one, every trial drawing it would fail, so the study must not start."""
    from phasefix.study import load_spec, validate

    raw = yaml.safe_load(SMOKE.read_text())
    path = write_study(tmp_path, "sqlite://", base=raw["base"] + ["model.num_kv_heads=1"])
    with pytest.raises(ConfigError) as e:
        validate(load_spec(path), deep=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("smoke.yaml: ") and "head_coord" in msg and "num_kv_heads=1" in msg


def test_search_space_is_conditional_on_the_mitigation_set():
    import optuna

    from phasefix.study import load_spec, suggest

    spec = load_spec(SMOKE)
    none = suggest(optuna.trial.FixedTrial({"mitigations": "none", "lr": 0.004}), spec)
    assert [o for o in none if "mitigation" in o] == [] and "optim.lr=0.004" in none
    both = suggest(optuna.trial.FixedTrial({"mitigations": "gate_diversity+head_coord", "lr": 0.004,
                                            "gate_diversity_weight": 0.2, "head_coord_weight": 0.05}), spec)
    assert both[0] == "+mitigation=[gate_diversity,head_coord]"
    assert {"mitigation.gate_diversity.weight=0.2", "mitigation.head_coord.weight=0.05"} <= set(both)
    # named override bundles (e.g. compression settings) and plain categoricals
    raw = yaml.safe_load(SMOKE.read_text())
    assert load_spec(SMOKE).storage_url().endswith("studies/smoke.db")
    assert raw["objectives"][0]["metric"] == "final/prefix/acc_mean"


def test_metrics_are_named_as_logged_and_the_earlier_spelling_means_the_same(tmp_path):
    """Objectives and constraints name the final evaluation as MLflow logs it (`final/prefix/acc_mean`), pruning rules
    the validation during training (`val/prefix/acc_mean`); study files written before say `prefix.acc_mean` and
    `lm_loss` (studies being run keep their file): both spellings give the same study."""
    from phasefix.study import load_spec, metric_value

    logged = load_spec(write_study(tmp_path, "sqlite://",
                                   objectives=["final/prefix/acc_mean", "final/prefix/acc_worst"],
                                   constraints=[{"metric": "final/lm_loss", "max": 2.0}],
                                   pruning=[{"step": 6, "metric": "val/prefix/acc_gap", "max": 0.9}]))
    earlier = load_spec(write_study(tmp_path, "sqlite://", objectives=["prefix.acc_mean", "prefix.acc_worst"],
                                    constraints=[{"metric": "lm_loss", "max": 2.0}],
                                    pruning=[{"step": 6, "metric": "prefix.acc_gap", "max": 0.9}]))
    for spec in (logged, earlier):
        assert spec.metric_names == ["final/prefix/acc_mean", "final/prefix/acc_worst"]
        assert [c.metric for c in spec.constraints] == ["final/lm_loss"]
        assert [r.metric for r in spec.pruning] == ["val/prefix/acc_gap"]
    summary = {"prefix": {"acc_mean": 0.75}, "lm_loss": 1.5, "compressor_flops_per_token": 10}  # fit's summary.json
    assert metric_value(summary, "final/prefix/acc_mean") == metric_value(summary, "prefix.acc_mean") == 0.75
    assert metric_value(summary, "final/lm_loss") == metric_value(summary, "lm_loss") == 1.5
    assert metric_value(summary, "compressor_flops_per_token") == 10


def test_shipped_studies_compose():
    from phasefix.study import load_spec, validate

    for path in sorted((PROJECT_ROOT / "studies").glob("*.yaml")):
        validate(load_spec(path), deep=False)


def test_a_study_continues_on_a_new_storage_from_its_trials_csv(tmp_path, mlflow_db):
    """A fresh machine has the committed report, not the storage: import_trials rebuilds the finished trials
    (params as sampled, objectives, constraint values; a pruned row stays pruned and infeasible) and the budget
    continues from there. Checked against the original storage's own trials."""
    import csv

    from phasefix.study import run_study

    _, fake = fake_env(tmp_path, "plain")
    path = write_study(tmp_path, mlflow_db, name="moved", n_trials=4,
                       constraints=[{"metric": "final/prefix/acc_worst", "max": 0.6}])
    assert run_study(path, workers=1, fit_fn=fake)["rc"] == 0
    _, original = load(path)
    table = tmp_path / "reports" / "moved" / "trials.csv"
    rows = list(csv.DictReader(open(table)))
    rows[-1]["state"], rows[-1]["note"] = "PRUNED", "val/prefix/acc_mean=0.01 < 0.1 at step 6"
    # rows 4-6 as a report can hold them: a failed trial, its twin's values, and one still running (stopped)
    rows.append({**rows[0], "trial": "4", "state": "FAIL", "note": "RuntimeError: boom"})
    rows.append({**rows[0], "trial": "5", "state": "FAIL", "note": ""})  # a stale trial's row: no error
    rows.append({**rows[1], "trial": "6", "note": "duplicate of trial 1 (its values, no fit)"})
    rows.append({**rows[2], "trial": "7", "state": "RUNNING", "retry_of": "4", "note": "",
                 "lr": str(float(rows[2]["lr"]) * 1.1)})  # params of its own: the retry trains
    edited = tmp_path / "trials.csv"
    with open(edited, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    res = run_study(path, n_trials=5, storage=fresh, fit_fn=fake, import_from=edited)
    # the budget was met by the table; only the interrupted trial's retry ran
    assert res["rc"] == 0 and res["counts"]["COMPLETE"] == 5 and res["counts"]["PRUNED"] == 1
    _, moved = load(path, fresh)
    # the table's numbers and states: a report, a confirm arm t<N>, the docs still name the same trials
    assert [(t.number, t.state.name) for t in moved.trials[:8]] == [
        (0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE"), (3, "PRUNED"), (4, "FAIL"), (5, "FAIL"), (6, "COMPLETE"),
        (7, "FAIL")]
    assert moved.trials[4].user_attrs["error"] == "RuntimeError: boom" and "error" not in moved.trials[5].user_attrs
    assert moved.trials[6].user_attrs["duplicate_of"] == 1 and moved.trials[6].values == moved.trials[1].values
    # the stopped trial 7 (a retry of 4) is interrupted: it was retried as Optuna retries, the chain kept
    assert moved.trials[7].user_attrs["interrupted"] and moved.trials[7].system_attrs["retry_history"] == [4]
    retry = moved.trials[8]
    assert retry.params == moved.trials[7].params and retry.system_attrs["failed_trial"] == 4
    assert retry.system_attrs["retry_history"] == [4, 7] and retry.state.name == "COMPLETE"
    assert "duplicate_of" not in retry.user_attrs and len(moved.trials) == 9
    for a, b in zip(original.trials, moved.trials):
        assert_close_params(b.params, a.params, rel=1e-5)
        assert b.distributions == a.distributions
    for a, b in zip(original.trials[:3], moved.trials[:3]):
        assert b.state.name == "COMPLETE" and b.values == pytest.approx(a.values, abs=1e-4)
        assert b.system_attrs == pytest.approx(
            {k: v for k, v in a.system_attrs.items() if k.startswith("constraints:")}, abs=1e-6)
    last = moved.trials[3]
    assert last.state.name == "PRUNED" and last.user_attrs["pruned"].startswith("val/prefix/acc_mean")
    assert all(v > 0 for k, v in last.system_attrs.items() if k.startswith("constraints:"))
    assert {t.number for t in moved.best_trials} == {t.number for t in original.best_trials} - {3}

    # rerunning the same command continues the study and no longer imports
    res = run_study(path, n_trials=10, storage=fresh, fit_fn=fake, import_from=edited)
    after = load(path, fresh)[1].trials
    assert res["counts"]["COMPLETE"] + res["counts"]["PRUNED"] == 10 and len(after) == 13
    # which parameters matter: the fake's mean depends on lr alone
    imp = [r for r in res["importances"] if r["objective"] == "final/prefix/acc_mean"]
    assert imp[0]["param"] == "lr" and imp[0]["importance"] > 0.5
    assert (tmp_path / "reports" / "moved" / "importances.csv").exists()


def test_confirm_ranks_goal_meeting_feasible_distinct_trials_first(tmp_path, mlflow_db):
    """top_trials on hand-built trials: the goal (worst >= 0.9 x mean) first, then worst, then mean; infeasible
    and duplicate trials left out; each trial's overrides are its params as suggest turns them into overrides."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from phasefix.study.confirm import top_trials, trial_overrides

    from phasefix.study import load_spec

    spec = load_spec(write_study(tmp_path, mlflow_db, name="ranked"))
    study = optuna.create_study(directions=["maximize", "maximize"])
    dists = {"mitigations": CategoricalDistribution(["none", "gate_diversity", "gate_diversity+head_coord"]),
             "lr": FloatDistribution(1e-3, 1e-2, log=True)}
    table = [  # (mean, worst, feasible, lr): ranks 2, 1, left out (infeasible), 3, left out (duplicate of #1)
        (0.95, 0.90, True, 0.002), (0.80, 0.78, True, 0.003), (1.0, 1.0, False, 0.004), (1.0, 0.85, True, 0.005),
        (0.80, 0.78, True, 0.003)]
    for mean, worst, ok, lr in table:
        study.add_trial(optuna.trial.create_trial(
            values=[mean, worst], params={"mitigations": "none", "lr": lr}, distributions={
                k: dists[k] for k in ("mitigations", "lr")}, user_attrs={"constraints": [-1.0 if ok else 1.0]}))
    assert [t.number for t in top_trials(spec, study, 5)] == [0, 1, 3]
    assert [t.number for t in top_trials(spec, study, 2)] == [0, 1]
    assert trial_overrides(spec, study.trials[1]) == ["optim.lr=0.003"]
    gd = optuna.trial.create_trial(values=[0.5, 0.5], params={"mitigations": "gate_diversity",
                                                              "gate_diversity_weight": 0.2, "lr": 0.002},
                                   distributions={**dists,
                                                  "gate_diversity_weight": FloatDistribution(0.01, 1, log=True)})
    assert trial_overrides(spec, gd) == ["+mitigation=[gate_diversity]", "mitigation.gate_diversity.weight=0.2",
                                         "optim.lr=0.002"]


def test_dashboard_serves_the_committed_trials_on_localhost_and_stops_on_ctrl_c(tmp_path, mlflow_db, capsys):
    """`dashboard=PORT import_trials=...` on a new storage: optuna-dashboard on 127.0.0.1 shows the study with its
    objective names and every finished trial of the trials.csv; Ctrl-C ends it with exit code 0; a taken port is one
    line naming the key."""
    import json
    import sys
    import urllib.request

    from phasefix.study import run_study

    _, fake = fake_env(tmp_path, "plain")
    path = write_study(tmp_path, mlflow_db, name="browsed", n_trials=3)
    assert run_study(path, workers=1, fit_fn=fake)["rc"] == 0
    table = tmp_path / "reports" / "browsed" / "trials.csv"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "phasefix.study", f"spec={path}", f"dashboard={port}",
           f"storage=sqlite:///{tmp_path / 'browse.db'}", f"import_trials={table}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=PROJECT_ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL) and None)
    try:
        deadline, study = time.time() + 180, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/1?after=0", timeout=5) as r:
                    study = json.load(r)
                break
            except OSError:
                time.sleep(1)
        assert study is not None, proc.stdout.read() if proc.poll() is not None else "no answer in 180 s"
        assert study["name"] == "browsed" and study["objective_names"] == ["final/prefix/acc_mean",
                                                                           "final/prefix/acc_worst"]
        assert len(study["trials"]) == 3 and {t["state"] for t in study["trials"]} == {"Complete"}
        # the same port again: taken
        from phasefix.study.__main__ import main

        assert main([f"spec={path}", f"dashboard={port}", f"storage=sqlite:///{tmp_path / 'browse.db'}"]) == 2
        assert f"dashboard={port} is invalid" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{port}/dashboard" in out


# ------------------------------------------------------------------------------------------------ real fits
def test_smoke_study_real_fits_pareto_files_mlflow_pruning_and_resume(tmp_path, mlflow_db, capsys):
    import shlex

    from mlflow.tracking import MlflowClient

    from phasefix.cli import compose

    from phasefix.study.__main__ import main

    path = write_study(tmp_path, mlflow_db)
    assert main([str(path)]) == 0
    spec, study = load(path)
    assert states(study) == {"COMPLETE": 2}
    reports = tmp_path / "reports" / "smoke"
    assert (reports / "pareto.png").stat().st_size > 1000
    header = (reports / "pareto.csv").read_text().splitlines()[0].split(",")
    assert header[0] == "trial" and {"final/prefix/acc_mean", "final/prefix/acc_worst", "mlflow_run_id"} <= set(header)
    out = capsys.readouterr().out
    assert "Pareto front" in out and "final/prefix/acc_worst" in out

    c = MlflowClient(tracking_uri=mlflow_db)
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    parent = c.get_run(parent_id)
    assert parent.data.tags["phasefix.kind"] == "study" and parent.data.tags["study"] == "smoke"
    assert parent.info.status == "FINISHED"
    assert {"pareto/pareto.png", "pareto/pareto.csv", "pareto/trials.csv"} <= {
        a.path for a in c.list_artifacts(parent_id, "pareto")}
    for t in study.trials:
        child = c.get_run(t.user_attrs["mlflow_run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent_id
        assert child.data.tags["study"] == "smoke" and child.data.tags["trial"] == str(t.number)
        assert child.info.status == "FINISHED" and child.info.experiment_id == parent.info.experiment_id
        args = shlex.split(child.data.tags["command"])  # a trial's table row names the fit that redoes it
        again = compose(args[3:])
        assert args[:3] == ["python", "-m", "phasefix.fit"] and again.logger.parent_run_id == parent_id
        assert again.output_dir == child.data.tags["output_dir"] and again.logger.tags.trial == str(t.number)
        assert again.optim.lr == pytest.approx(float(child.data.params["optim.lr"]), rel=1e-12)
        assert t.user_attrs["val_history"][0]["step"] == 6  # the pruner saw the validation
        assert t.values == pytest.approx([t.user_attrs["metrics"]["final/prefix/acc_mean"],
                                          t.user_attrs["metrics"]["final/prefix/acc_worst"]])

    # resume: the same file with a budget of 3 and a rule that prunes every trial at its first validation
    write_study(tmp_path, mlflow_db, pruning=[{"step": 6, "metric": "prefix.acc_mean", "min": 2.0}])
    assert main([str(path), "--n-trials", "3"]) == 0
    spec, study = load(path)
    assert states(study) == {"COMPLETE": 2, "PRUNED": 1}
    pruned = study.trials[2]
    assert "val/prefix/acc_mean" in pruned.user_attrs["pruned"]
    run = c.get_run(pruned.user_attrs["mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["optuna.state"] == "PRUNED"
    assert c.get_run(parent_id).info.status == "FINISHED"  # one parent run across resumes

    assert main([str(path), "--report"]) == 0  # on demand, without running trials
    assert "Pareto front" in capsys.readouterr().out


def test_confirm_reruns_the_best_trial_and_the_baseline_on_fresh_seeds_and_continues(tmp_path, mlflow_db, capsys):
    """confirm=1 after a study: real fits of the best trial and of the baseline on seeds 1 and 2 (tagged regime, arm,
    seed; the trial's lr; the baseline without mitigation), the decisive table over them, and a rerun that has
    nothing left to do. The study's own trials (seed 0) use the cheap objective."""
    import shlex

    from mlflow.tracking import MlflowClient

    from phasefix.cli import compose

    from phasefix.study import run_study
    from phasefix.study.__main__ import main

    _, fake = fake_env(tmp_path, "plain")
    path = write_study(tmp_path, mlflow_db, name="confirmed", n_trials=3,
                       confirm={"seeds": [1, 2], "baseline": ["optim.lr=0.004"]})
    assert run_study(path, workers=1, fit_fn=fake)["rc"] == 0
    spec, study = load(path)
    # the fake's worst = 0.5 + 0.4 x gate_diversity weight, its mean = 1 - 50 |lr - 3e-3|
    best = max(study.trials, key=lambda t: (t.values[1] >= 0.9 * t.values[0], t.values[1], t.values[0]))
    assert main([f"spec={path}", "confirm=1"]) == 0
    out = capsys.readouterr().out
    assert f"arms baseline, t{best.number}, seeds [1, 2]" in out
    assert "| confirmed | baseline | prefix | 0/2 |" in out  # the verdict table, printed (tiny runs do not learn)

    c = MlflowClient(tracking_uri=mlflow_db)
    exp = c.get_experiment_by_name(study.user_attrs["mlflow_experiment"])
    runs = c.search_runs([exp.experiment_id], "tags.study_confirm = 'confirmed'")
    got = sorted((r.data.tags["arm"], r.data.tags["seed"]) for r in runs)
    assert got == [("baseline", "1"), ("baseline", "2"), (f"t{best.number}", "1"), (f"t{best.number}", "2")]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["regime"] == "confirmed"
        assert "mlflow.parentRunId" not in r.data.tags  # outside the study
        again = compose(shlex.split(r.data.tags["command"])[3:])  # its table row names the fit that redoes it
        assert again.seed == int(r.data.tags["seed"]) and again.logger.tags.arm == r.data.tags["arm"]
        if r.data.tags["arm"] == "baseline":
            assert float(r.data.params["optim.lr"]) == 0.004 and r.data.tags["mitigations"] == "none"
        else:
            assert float(r.data.params["optim.lr"]) == pytest.approx(best.params["lr"], rel=1e-9)
    table = (tmp_path / "reports" / "confirmed" / "confirm" / "decisive.csv").read_text().splitlines()
    prefix = [line for line in table[1:] if ",prefix," in line]
    assert [line.split(",")[1] for line in prefix] == ["baseline", f"t{best.number}"]
    assert all(line.split(",")[3] == "2" for line in prefix)  # two seeds each
    arms = (tmp_path / "reports" / "confirmed" / "confirm" / "arms.md").read_text()
    assert "| baseline | - | - | `optim.lr=0.004` |" in arms and f"| t{best.number} | {best.number} |" in arms

    assert main([f"spec={path}", "confirm=1"]) == 0  # everything done: no new run
    assert "(4 done)" in capsys.readouterr().out
    assert len(c.search_runs([exp.experiment_id], "tags.study_confirm = 'confirmed'")) == 4
    from phasefix.study.confirm import run_confirm

    write_study(tmp_path, mlflow_db, name="confirmed", n_trials=3, confirm={"seeds": [0, 1]})  # seed 0: the study's
    with pytest.raises(ConfigError, match="confirm.seeds"):
        run_confirm(path, 1)


def sleepy_job(call):
    """A confirm job for run_jobs: writes its pid, then sleeps `seconds`, or dies at once without a result."""
    d, seconds, crash = call
    (Path(d) / str(os.getpid())).write_text("")
    if crash:
        os._exit(3)
    time.sleep(seconds)
    return f"ran {seconds}", None


def test_confirm_jobs_run_in_their_own_processes_and_sigterm_stops_them_all(tmp_path):
    """run_jobs: results in call order, a process that dies leaves an error, not a hang; SIGTERM to the confirm
    process ends every running job and starts no new one (a process pool would catch the fit's SystemExit and go on
    to the next run, which is how a stopped confirm once kept training)."""
    import sys

    from phasefix.study.confirm import run_jobs

    res = run_jobs(sleepy_job, [(tmp_path, 0, False), (tmp_path, 0, True), (tmp_path, 0.2, False)], 2)
    assert res[0] == ("ran 0", None) and res[2] == ("ran 0.2", None)
    assert res[1][0] is None and "code 3" in res[1][1]

    d = tmp_path / "slow"
    d.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_study import sleepy_job; "
            f"from phasefix.study.confirm import run_jobs; run_jobs(sleepy_job, [({str(d)!r}, 300, False)] * 3, 2)")
    # started the way `cmd &` in a script starts it: SIGINT ignored, which its jobs inherit unless they restore Ctrl-C
    parent = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN) and None)
    deadline = time.time() + 120
    while len(list(d.iterdir())) < 2 and time.time() < deadline:
        time.sleep(0.1)
    children = [int(p.name) for p in d.iterdir()]
    assert len(children) == 2
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) != 0 and "KeyboardInterrupt" in parent.stderr.read()
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone (and reaped by the confirm process before it exited)
    assert len(list(d.iterdir())) == 2  # the third run never started


# ------------------------------------------------------------------------------------------------ workers
def test_two_workers_on_one_storage_finish_distinct_trials(tmp_path, mlflow_db):
    from phasefix.study import run_study

    d, fake = fake_env(tmp_path, "barrier")
    path = write_study(tmp_path, mlflow_db, name="two", n_trials=6)
    res = run_study(path, workers=2, fit_fn=fake)
    assert res["rc"] == 0
    spec, study = load(path)
    assert states(study) == {"COMPLETE": 6}
    assert sorted(t.number for t in study.trials) == list(range(6))
    pids = {p.name.split(".pid")[1] for p in d.glob("trial*.pid*")}
    assert len(pids) == 2 and os.getpid() not in {int(p) for p in pids}  # two worker processes did the trials
    assert len({p.name.split(".pid")[0] for p in d.glob("trial*.pid*")}) == 6
    assert (tmp_path / "reports" / "two" / "logs" / "worker1.log").exists()
    assert res["counts"]["COMPLETE"] == 6 and res["pareto"]


def test_workers_counting_the_last_slot_at_once_start_one_trial_not_two(tmp_path, mlflow_db, monkeypatch):
    """The race CI once lost ({'COMPLETE': 7} of a budget of 6): two workers both count budget - 1 and both start a
    trial. Counting is slowed here so that the two workers always count together; the lock per storage and study
    lets only one of them start the trial."""
    from phasefix.study import load_spec, run_study
    from phasefix.study import runner

    d, fake = fake_env(tmp_path, "none")
    path = write_study(tmp_path, mlflow_db, name="race", n_trials=4)
    assert run_study(path, n_trials=1, workers=1, fit_fn=fake)["rc"] == 0  # the study, its parent run, one trial
    counted = runner.counts

    def slow_counts(study):
        n = counted(study)
        time.sleep(0.3)  # the other worker counts meanwhile
        return n

    monkeypatch.setattr(runner, "counts", slow_counts)
    spec = load_spec(path)
    rcs = []
    workers = [threading.Thread(target=lambda w=w: rcs.append(runner.run_worker(spec, spec.storage_url(None), 4,
                                                                                  worker=w, fit_fn=fake)))
               for w in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert rcs == [0, 0]
    assert states(load(path)[1]) == {"COMPLETE": 4}


def test_sigkilled_workers_trial_is_failed_and_retried(tmp_path, mlflow_db):
    from phasefix.study import run_study

    d, fake = fake_env(tmp_path, "kill")
    path = write_study(tmp_path, mlflow_db, name="kill", n_trials=4,
                       storage={"heartbeat_interval": 1, "grace_period": 3, "max_retry": 1})
    killed = {}

    def killer():
        deadline = time.time() + 300
        while not (d / "victim").exists() or not (d / "victim").read_text():
            if time.time() > deadline:
                return
            time.sleep(0.05)
        pid, trial = map(int, (d / "victim").read_text().split())
        assert pid != os.getpid()
        killed.update(pid=pid, trial=trial)
        os.kill(pid, signal.SIGKILL)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    res = run_study(path, workers=2, fit_fn=fake)
    th.join(timeout=5)
    assert killed, "the victim trial never started"
    assert res["rc"] == 0  # the study reached its budget: the survivor ran the retry
    spec, study = load(path)
    by_state = states(study)
    assert by_state == {"COMPLETE": 4, "FAIL": 1}, by_state  # never left RUNNING, nothing lost
    victim = study.trials[killed["trial"]]
    assert victim.state.name == "FAIL"
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE" and retries[0].params == victim.params


def interrupted_fit(cfg, callbacks=()):
    """`phasefix.fit.fit` stopped by Ctrl-C at step 10 (its periodic checkpoints: steps 4 and 8)."""
    from lightning.pytorch.callbacks import Callback

    from phasefix.fit import fit

    class CtrlC(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 10:
                raise KeyboardInterrupt

    return fit(cfg, callbacks=[*callbacks, CtrlC()])


def test_an_interrupted_trial_is_retried_from_its_last_checkpoint(tmp_path, mlflow_db):
    from mlflow.tracking import MlflowClient

    from phasefix.study import run_study

    base = [o for o in yaml.safe_load(SMOKE.read_text())["base"] if not o.startswith("trainer.checkpoint_every")]
    path = write_study(tmp_path, mlflow_db, name="revive", n_trials=1, params={}, sampler={"type": "random"},
                       base=base + ["trainer.checkpoint_every_n_steps=4", f"logger.tracking_uri={mlflow_db}"])
    assert run_study(path, fit_fn=interrupted_fit)["rc"] == 130
    spec, study = load(path)
    assert states(study) == {"FAIL": 1}
    first = study.trials[0]
    assert "interrupted at step 10" in first.user_attrs["interrupted"]

    assert run_study(path)["rc"] == 0  # rerun: the retry continues the run
    spec, study = load(path)
    assert states(study) == {"FAIL": 1, "COMPLETE": 1}
    retry = study.trials[1]
    assert retry.system_attrs["failed_trial"] == 0
    run_id = first.user_attrs["mlflow_run_id"]
    assert retry.user_attrs["mlflow_run_id"] == run_id  # the same MLflow run, continued
    assert retry.user_attrs["run_dirs"] == first.user_attrs["run_dirs"]
    run = MlflowClient(tracking_uri=mlflow_db).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["resumed_from"].endswith("(step 10)")  # Ctrl-C's checkpoint, not step 0
    assert run.data.tags["trial"] == "1" and run.data.tags["retry_of"] == "0"
    assert [h["step"] for h in retry.user_attrs["val_history"]] == [6, 12]  # step 6 from before the interrupt
    steps = [m.step for m in MlflowClient(tracking_uri=mlflow_db).get_metric_history(run_id, "val/prefix/acc_mean")]
    assert len(steps) == len(set(steps)) == 2  # one point per validation, nothing logged twice


# ------------------------------------------------------------------------------------------------ PostgreSQL
def _pg_bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    candidates = ([Path(found).resolve().parent] if found else []) + [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for d in candidates:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


@pytest.fixture(scope="module")
def postgres_url():
    """A throw-away PostgreSQL server on 127.0.0.1 (Debian's postgresql package), or PHASEFIX_TEST_POSTGRES_URL."""
    if os.environ.get("PHASEFIX_TEST_POSTGRES_URL"):
        yield os.environ["PHASEFIX_TEST_POSTGRES_URL"]
        return
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 is not installed (pip install -e '.[postgres]')")
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install -y postgresql")
    root = Path(tempfile.mkdtemp(prefix="phasefix-pg-"))
    os.chmod(root, 0o755)
    user = {}
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres (or nobody) user
        import pwd

        for name in ("postgres", "nobody"):
            try:
                pw = pwd.getpwnam(name)
                user = {"user": pw.pw_uid, "group": pw.pw_gid}
                break
            except KeyError:
                continue
        if not user:
            shutil.rmtree(root)
            pytest.skip("running as root and no 'postgres' or 'nobody' user to run the server as")
        os.chown(root, user["user"], user["group"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"

    def pg(*cmd, timeout=120):
        return subprocess.run([str(bindir / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=timeout,
                              cwd=root, **user)

    r = pg("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
    if r.returncode == 0:
        r = pg("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "120", "-o",
               f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50", "start",
               timeout=180)
    if r.returncode != 0:
        log = (root / "server.log").read_text()[-300:] if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"could not start PostgreSQL from {bindir}: {(r.stderr or r.stdout).strip()[-300:]} {log}")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"  # SQLAlchemy 2.1 defaults to psycopg 3
    finally:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres
def test_postgres_storage_two_workers(tmp_path, mlflow_db, postgres_url):
    from phasefix.study import run_study

    d, fake = fake_env(tmp_path, "barrier")
    path = write_study(tmp_path, mlflow_db, name=f"pg{os.getpid()}", n_trials=4)
    res = run_study(path, storage=postgres_url, workers=2, fit_fn=fake)
    assert res["rc"] == 0
    spec, study = load(path, storage=postgres_url)
    assert states(study) == {"COMPLETE": 4}
    assert len({p.name.split(".pid")[1] for p in d.glob("trial*.pid*")}) == 2
    # rerunning against the same database resumes: nothing to do, nothing lost (plain postgresql:// URL: the
    # study picks the installed driver)
    plain = postgres_url.replace("postgresql+psycopg2://", "postgresql://")
    assert run_study(path, storage=plain, workers=1, fit_fn=fake)["rc"] == 0
    spec, study = load(path, storage=postgres_url)
    assert states(study) == {"COMPLETE": 4}


def test_two_studies_sharing_an_outputs_folder_never_share_a_trial_folder(tmp_path):
    """A comparison's slices run side by side write to one outputs folder and can start their trial 6 in the same
    second: the second gets `<stem>-1`, the third `<stem>-2`, each created empty (a run's own check refuses a folder
    holding a run)."""
    from phasefix.study.objective import trial_dir

    stem = "trial0006-20261207-144701"
    got = [trial_dir(tmp_path / "rates", stem) for _ in range(3)]
    assert [p.name for p in got] == [stem, f"{stem}-1", f"{stem}-2"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in got)
