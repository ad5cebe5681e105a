"""`phasefix.fit`: config groups compose, a short end-to-end run logs what it promises, resume, DDP, bad configs."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from phasefix import config as C
from phasefix.errors import ConfigError
from phasefix.fit import compose, fit, main, print_summary
from phasefix.paths import CONF_DIR, PROJECT_ROOT
from helpers import FAST  # trainer=fast: seconds-long runs



def run_overrides(tmp_path: Path, name: str = "run") -> list[str]:
    return [f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"output_dir={tmp_path / name}"]


pytestmark = pytest.mark.usefixtures("cache_dir")


def group_options():
    for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        for option in sorted(group.glob("*.yaml")):
            yield group.name, option.stem


# what an option needs beside it: DeepSeek-V4's layer schedule measures the phase mod 128 (HCA's stride)
NEEDS = {("model", "deepseek_v4_layers"): ["eval.period=128", "data.max_prefix_pad=481"]}


@pytest.mark.parametrize("group,option", list(group_options()), ids=lambda x: str(x))
def test_every_config_group_composes(group, option):
    from phasefix.fit import plan

    prefix = "+" if group == "mitigation" else ""
    # every option works alone (data=lm_mix brings its vocabulary), or with what NEEDS names
    cfg = compose([f"{prefix}{group}={option}", *NEEDS.get((group, option), [])])
    if group in ("regime", "recipe", "arm"):  # global packages: they set keys of other groups; the choice is recorded
        assert cfg[group] == option
        assert (cfg != compose([])) == (option not in ("default", "none", "baseline"))
    else:
        assert cfg[group] is not None
    gpu = "gpu" in option or cfg.trainer.accelerator == "gpu"
    if not gpu or torch.cuda.is_available():
        plan(cfg)  # every CPU option also validates


CPU_REGIMES = sorted(p.stem for p in (CONF_DIR / "regime").glob("*.yaml") if "gpu" not in p.stem)


@pytest.mark.parametrize("regime", CPU_REGIMES)
def test_seconds_long_version_of_each_regime_runs(tmp_path, regime):
    summary = fit(compose([f"regime={regime}", *FAST, "trainer.max_steps=4", "eval.n_boot=10",
                           *run_overrides(tmp_path)]))
    cfg = compose([f"regime={regime}"])
    m = C.model_config(cfg)
    pattern = ",".join(m.layer_compression)  # a per-layer pattern: the run's window is it, its stride the lcm
    assert (summary["window"], summary["stride"]) == ((pattern, m.phase_stride) if pattern else (m.window, m.stride))
    for pad in cfg.eval.paddings:
        assert len(summary[pad]["per_residue"]) == cfg.eval.period
    if cfg.data.kind == "lm_mix":  # held-out text loss, near log(vocab) for an untrained model
        assert 0 < summary["lm_loss"] < 2 * math.log(cfg.model.vocab_size)
        run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["mlflow_run_id"])
        assert run.data.metrics["final/lm_loss"] == summary["lm_loss"]  # in the UI too, not only in summary.json


def test_the_learned_recipe_is_learn_recipe_trial_1_as_committed():
    """`recipe=learned` composes the config learn_recipe's trial 1 trained: the trial is imported from the committed
    trials.csv (not read from the preset) and turned into overrides the way confirm re-runs a trial."""
    import optuna

    from phasefix.study.confirm import trial_overrides
    from phasefix.study.pareto import import_trials
    from phasefix.study.spec import load_spec

    spec = load_spec(PROJECT_ROOT / "studies/learn_recipe.yaml")
    study = optuna.create_study(directions=spec.directions)
    import_trials(spec, study, PROJECT_ROOT / "studies/reports/learn_recipe/trials.csv")
    trial = next(t for t in study.trials if t.number == 1)
    trained = OmegaConf.to_container(compose([*spec.base, *trial_overrides(spec, trial)]))
    preset = OmegaConf.to_container(compose([*spec.base, "recipe=learned"]))
    assert preset["optim"].pop("lr") == pytest.approx(trained["optim"].pop("lr"), rel=1e-5)  # trials.csv: 6 digits
    assert (preset.pop("recipe"), trained.pop("recipe")) == ("learned", "none")  # the recorded choice, not a value
    assert preset == trained


def test_mitigations_compose_together():
    cfg = compose(["+mitigation=[gate_diversity,head_coord]"])
    assert set(cfg.mitigation) == {"gate_diversity", "head_coord"}


def test_short_fit_logs_phase_curve_figure_and_summary(tmp_path, capsys):
    summary = fit(compose(FAST + run_overrides(tmp_path)))
    out = tmp_path / "run"
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary
    for pad in ("prefix", "in_sequence"):
        s = summary[pad]
        assert set(s) >= {"acc_mean", "acc_worst", "acc_best", "acc_gap", "per_residue", "period_detected"}
        assert len(s["per_residue"]) == 24
        assert s["acc_gap"] == pytest.approx(s["acc_best"] - s["acc_worst"], abs=1e-3)
    assert summary["stride"] == 4
    assert (out / "checkpoints" / "last.ckpt").exists()

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = c.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["stride"] == "4" and run.data.tags["mitigations"] == "none"
    assert run.data.tags["compile"] == "false" and summary["compile"]["used"] is False  # auto: a short run is eager
    assert summary["compile"]["why"].startswith("auto: ") and run.data.tags["compile_reason"] == summary["compile"]["why"]
    assert run.data.params["model.window"] == "4"
    curve = c.get_metric_history(run.info.run_id, "phase_acc/prefix")
    assert sorted(m.step for m in curve) == list(range(24))
    assert [m.value for m in sorted(curve, key=lambda m: m.step)] == pytest.approx(summary["prefix"]["per_residue"],
                                                                                  abs=1e-4)
    assert c.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert not [k for k in run.data.metrics if k.startswith("phase_acc/") and k.count("/") > 1]  # no r00..r23
    assert c.get_metric_history(run.info.run_id, "train/loss")
    assert c.get_metric_history(run.info.run_id, "val/prefix/acc_mean")
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"phase_curves.png", "phase_table.csv", "config.yaml", "summary.json", "gate_heatmap.png",
            "gate_eff_slots.csv"} <= artifacts
    assert not [k for k in run.data.metrics if k.startswith("gates/")]  # a table, not one chart group per head

    # 24 steps do not learn the lookup: the project's rule (prefix mean >= 5 x chance, chance = 1 / num_values)
    # computed here by hand; the closing block says so instead of reading a period into the noise
    chance = 1 / compose(FAST).data.num_values
    assert summary["prefix"]["acc_mean"] < 5 * chance and summary["learned"] is False
    assert run.data.tags["learned"] == "false"
    capsys.readouterr()
    print_summary(summary)
    out_lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln.split() for ln in out_lines if ln.startswith(("prefix ", "in_sequence "))}
    assert rows["prefix"][5] == "-" and rows["in_sequence"][5] == "-"  # no period column for noise
    assert any(ln.startswith("NOT LEARNED: prefix mean") for ln in out_lines)
    # how to look at it: the launcher for this store, and the figure on disk
    assert (f"look at it in MLflow: python -m phasefix.ui tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}  (the phase "
            "curves of every run)") in out_lines
    figure = Path(summary["figure"])
    assert f"figure:  {figure}" in out_lines and figure.name == "phase_curves.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from phasefix import ui

    from phasefix.cli import options

    uri, experiment_id = ui.target(options([f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"], "ui"))
    assert experiment_id == run.info.experiment_id
    view = json.loads(c.get_experiment(experiment_id).tags["mlflow.sharedViewState.phase-curves"])
    cards = json.loads(view["state"])["compareRunCharts"]
    assert [card["metricKey"] for card in cards[:2]] == ["phase_acc/prefix", "phase_acc/in_sequence"]
    assert cards[0]["range"] == {"yMin": 0, "yMax": 1}
    assert ui.url("127.0.0.1", 5000, experiment_id) == (
        f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs?viewStateShareKey=phase-curves"
        "&compareRunsMode=CHART&workflowType=machine_learning")
    assert main(FAST + run_overrides(tmp_path)) == 2  # a new run in this run's directory: refused, nothing written
    assert len(c.search_runs([run.info.experiment_id])) == 1


def assert_same_final_weights(run_a: Path, run_b: Path):
    a = torch.load(run_a / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(run_b / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, monkeypatch):
    """Kill a CLI run with SIGKILL right after its first checkpoint (no handler runs), `resume=last`: same final
    metrics and weights as an uninterrupted run with the same seed, in the same MLflow run, no point logged twice."""
    steps = ["trainer.max_steps=20", "trainer.checkpoint_every_n_steps=10", "eval.n_boot=20",
             "trainer.log_every_n_steps=1"]
    reference = fit(compose(FAST + steps + run_overrides(tmp_path, "reference")))

    monkeypatch.setenv("PHASEFIX_OUTPUTS", str(tmp_path / "outputs"))  # resume=last looks here
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    killed = tmp_path / "outputs" / "today" / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "phasefix.fit", *FAST, *steps,
                             *run_overrides(tmp_path, "outputs/today/killed")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (killed / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()

    resumed = fit(compose(["resume=last"]))
    assert resumed["mlflow_run_id"] == json.loads((killed / "run.json").read_text())["mlflow_run_id"]
    for pad in ("prefix", "in_sequence"):
        assert resumed[pad]["per_residue"] == pytest.approx(reference[pad]["per_residue"], abs=1e-6)
    assert_same_final_weights(tmp_path / "reference", killed)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert c.get_run(resumed["mlflow_run_id"]).info.status == "FINISHED"
    for key, logged in metric_steps(c, resumed["mlflow_run_id"]).items():
        assert len(logged) == len(set(logged)), f"{key} logged twice at one step: {logged}"
    assert metric_steps(c, resumed["mlflow_run_id"]) == metric_steps(c, reference["mlflow_run_id"])


def test_a_periodic_checkpoint_is_written_after_its_steps_metrics(tmp_path):
    """The moment a kill -9 hurts most: right after a periodic checkpoint file is written. Every training point up
    to the checkpoint's step must already be in MLflow then (a resume logs again only from that step on)."""
    from lightning.pytorch.callbacks import Checkpoint

    seen: dict[int, list[int]] = {}

    class AfterTheFile(Checkpoint):  # a Checkpoint: Lightning runs it after the run's own checkpoint callbacks
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step % 10 == 0:  # the periodic callback has just written last.ckpt
                assert (Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt").exists()
                c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
                seen[trainer.global_step] = sorted(m.step for m in c.get_metric_history(trainer.logger.run_id,
                                                                                        "train/loss"))

    fit(compose(FAST + ["trainer.max_steps=20", "trainer.checkpoint_every_n_steps=10", "trainer.log_every_n_steps=1"]
                + run_overrides(tmp_path)), callbacks=[AfterTheFile()])
    assert seen == {10: list(range(10)), 20: list(range(20))}  # batch b is logged at step b


def test_multirun_sweeps_seeds_one_run_each_and_checks_every_job_first(tmp_path, monkeypatch, capsys):
    """`-m seed=0,1`: two runs, one per seed, in one command (Hydra's sweep syntax); a bad value in any job of a
    sweep fails with one line before the first job trains."""
    monkeypatch.setenv("PHASEFIX_OUTPUTS", str(tmp_path / "outputs"))
    uri = f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert main(["-m", "seed=0,1", "model=tiny,tiny_typo", *FAST, "trainer.max_steps=4", uri]) == 2
    assert "model=tiny_typo is invalid" in capsys.readouterr().err  # the fourth job's config, before the first trains
    assert not c.search_experiments() or not c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert main(["-m", "seed=0,1", *FAST, "trainer.max_steps=4", "trainer.val_every_n_steps=4", uri]) == 0
    assert capsys.readouterr().out.count("[multirun] job") == 2
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert sorted(r.data.params["seed"] for r in runs) == ["0", "1"]
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_sigterm_ends_the_run_killed(tmp_path):
    """SIGTERM (a scheduler, `kill`) mid-training: the MLflow run ends KILLED, not RUNNING or FAILED."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    out = tmp_path / "term"
    proc = subprocess.Popen([sys.executable, "-m", "phasefix.fit", *FAST, "trainer.max_steps=100000",
                             "trainer.checkpoint_every_n_steps=5", *run_overrides(tmp_path, "term")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "checkpoints" / "last.ckpt").exists() and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert c.get_run(run_id).info.status == "KILLED"


def test_ddp_on_two_gloo_processes_gives_one_mlflow_run(tmp_path):
    summary = fit(compose(FAST + ["trainer=ddp_cpu", "trainer.max_steps=6", "trainer.val_every_n_steps=3",
                                  "trainer.progress_bar=false"] + run_overrides(tmp_path)))
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("phasefix").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == summary["mlflow_run_id"]
    assert runs[0].info.status == "FINISHED"


@pytest.mark.parametrize("overrides,key", [
    (["model.window=2"], "model.window"),
    (["model.stride=0"], "model.stride"),
    (["model.gate=softmax"], "model.gate"),
    (["model=nope"], "model=nope"),
    (["+mitigation=nope"], "mitigation=nope"),
    (["model.local_window=-1"], "model.local_window"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["optim.lr=-1"], "optim.lr"),
    (["eval.paddings=[sideways]"], "eval.paddings"),
    (["data.num_records=0"], "data.num_records"),
    (["model.stride=abc"], "model.stride"),
    (["model.vocab_size=16"], "model.vocab_size"),
])
def test_bad_config_fails_before_anything_starts(tmp_path, capsys, overrides, key):
    code = main(overrides + run_overrides(tmp_path))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and key in err, err
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "mlflow.db").exists()


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    import phasefix.module as module

    real = module.F.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] > 10 else loss

    monkeypatch.setattr(module.F, "cross_entropy", poisoned)
    with pytest.raises(FloatingPointError, match="train/loss is nan"):
        fit(compose(FAST + run_overrides(tmp_path)))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("phasefix").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_unknown_key_is_one_line():
    with pytest.raises(ConfigError, match="model.foo"):
        compose(["model.foo=1"])


def test_misspelt_key_gets_a_suggestion(tmp_path, capsys):
    assert main(["trainer.max_step=60"] + run_overrides(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown key trainer.max_step; did you mean trainer.max_steps?"
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()
    # a mitigation's options come from its Options dataclass: misspelt or mistyped, refused before any run starts
    assert main(["+mitigation=gate_diversity", "mitigation.gate_diversity.wieght=1"] + run_overrides(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: unknown key mitigation.gate_diversity.wieght; did you mean "
                   "mitigation.gate_diversity.weight?")
    assert main(["+mitigation=head_coord", "mitigation.head_coord.weight=heavy"] + run_overrides(tmp_path)) == 2
    assert capsys.readouterr().err.startswith("error: mitigation.head_coord.weight: Value 'heavy'")
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("word, message", [
    ("trainer.max_step=10", "error: unknown key trainer.max_step; did you mean trainer.max_steps?"),
    ("trainer.max_steps=0", "error: trainer.max_steps=0 is invalid: must be >= 1"),
    ("model.window=0", "error: model.window=0 is invalid: must be an integer >= model.stride (4)"),
])
def test_a_bad_config_is_refused_before_torch_lightning_or_mlflow_is_imported(tmp_path, word, message):
    """The order, not the clock: `python -X importtime` lists every module the process imported; the heavy libraries
    (seconds to import on a 2-core machine) must not be among them when the config is refused."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "phasefix.fit", word, *run_overrides(tmp_path)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and errors == [message], proc.stderr[-2000:]
    assert "phasefix.config" in imported  # the listing is real: the config module was imported
    assert not imported & {"torch", "lightning", "mlflow", "datasets", "transformers"}, sorted(
        imported & {"torch", "lightning", "mlflow", "datasets", "transformers"})
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


def test_help_is_the_hydra_template_with_groups_keys_and_examples(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for group in ("model", "data", "trainer", "mitigation", "regime", "arm", "recipe"):
        assert f"\n  {group} " in out
    assert "trainer.max_steps (800)" in out and "resume" in out
    assert out.count("python -m phasefix.fit ") >= 3


def test_data_group_brings_the_vocabulary_it_needs():
    from phasefix.fit import plan

    cfg = compose(["data=lm_mix"])
    assert cfg.data.kind == "lm_mix"
    plan(cfg)  # model.vocab_size fits the byte tokens after the task's keys and values
    assert compose(["data=lm_mix", "model.vocab_size=512"]).model.vocab_size == 512


def metric_steps(c, run_id: str) -> dict[str, list[int]]:
    """Every metric's logged steps (a key logged twice at one step appears twice)."""
    keys = c.get_run(run_id).data.metrics
    return {k: sorted(m.step for m in c.get_metric_history(run_id, k)) for k in keys}


def test_resume_with_raised_max_steps_trains_the_extra_steps_and_logs_one_curve(tmp_path, capsys):
    """A finished 16-step run resumed with trainer.max_steps=24 trains steps 17..24 from the final state, in the same
    MLflow run, with one final curve, no metric logged twice at one step, and train time over both pieces; a
    changed model key is refused with one line and nothing written; resuming a finished run trains nothing."""
    from phasefix.fit_run import Run

    small = FAST + ["trainer.max_steps=16", "trainer.log_every_n_steps=1",
                    "trainer.val_every_n_steps=8"]
    first = fit(compose(small + run_overrides(tmp_path)))
    out = tmp_path / "run"
    assert Run.open(str(out)).progress()[0] == 16  # the final state is the last checkpoint
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    config_before = (out / "config.yaml").read_text()

    assert main([f"resume={out}", "model.window=8"]) == 2  # the run's identity cannot change
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.window=8" in err[0] and "cannot change on resume" in err[0]
    assert (out / "config.yaml").read_text() == config_before
    assert c.get_run(first["mlflow_run_id"]).info.status == "FINISHED"

    capsys.readouterr()
    second = fit(compose([f"resume={out}", "trainer.max_steps=24"]))
    assert f"phasefix fit: resuming run (MLflow run {first['mlflow_run_id']}) from step 16 to step 24" in \
        capsys.readouterr().out.splitlines()
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    assert Run.open(str(out)).progress()[0] == 24
    assert second["train_seconds"] > first["train_seconds"]
    # wall time adds up over the pieces as train time does, and holds it
    assert second["total_seconds"] > first["total_seconds"] and second["total_seconds"] >= second["train_seconds"]
    steps = metric_steps(c, first["mlflow_run_id"])
    for key, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{key} logged twice at one step: {logged}"
    assert steps["phase_acc/prefix"] == list(range(24)) and steps["final/prefix/acc_mean"] == [0]
    assert max(steps["train/loss"]) >= 23 and min(steps["train/loss"]) <= 1  # both pieces, one history
    assert not any("/r0" in k for k in steps)  # per-residue values live in phase_table.csv, not in 48 scalars
    assert json.loads((out / "summary.json").read_text()) == second

    history = {k: len(v) for k, v in steps.items()}
    again = fit(compose([f"resume={out}"]))  # trained to max_steps and evaluated: nothing to do
    assert again == second
    assert {k: len(v) for k, v in metric_steps(c, first["mlflow_run_id"]).items()} == history


def file_bytes(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def test_fork_continues_as_a_new_run_and_leaves_the_named_run_as_it_was(tmp_path, capsys, recwarn):
    """A finished 16-step run forked to 24 steps: a new run (new directory, new MLflow run tagged forked_from, the
    points before step 16 copied, renamed and re-tagged) with the same final phase accuracy as resuming the run
    itself to 24 steps (resume is checked against an uninterrupted run above); the named run's files and MLflow
    history are untouched. A fork without resume, or one that changes the run's identity, is refused in one line."""
    small = FAST + ["trainer.max_steps=16", "trainer.log_every_n_steps=1",
                    "trainer.val_every_n_steps=8"]
    first = fit(compose(small + run_overrides(tmp_path)))
    out, fork_dir = tmp_path / "run", tmp_path / "fork"
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    files_before, history_before = file_bytes(out), metric_steps(c, first["mlflow_run_id"])

    assert main(["fork=true", "trainer.max_steps=24"]) == 2
    assert main([f"resume={out}", "fork=true", "model.window=8", f"output_dir={fork_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "fork" in err[0] and "resume" in err[0], err
    assert "model.window=8" in err[1] and "cannot change on a fork" in err[1], err
    assert not fork_dir.exists()

    forked = fit(compose([f"resume={out}", "fork=true", "trainer.max_steps=24", f"output_dir={fork_dir}",
                          "run_name=longer", "+logger.tags.comparison=forks"]))
    new_id = forked["mlflow_run_id"]
    # a fork's checkpoints go to its own directory by design: Lightning's "dirpath has changed" is noise there
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]
    assert new_id != first["mlflow_run_id"] and forked["output_dir"] == str(fork_dir)
    assert file_bytes(out) == files_before
    assert metric_steps(c, first["mlflow_run_id"]) == history_before
    assert c.get_run(first["mlflow_run_id"]).info.status == "FINISHED"
    new = c.get_run(new_id)
    assert new.info.run_name == "longer" and new.info.status == "FINISHED"
    assert new.data.tags["comparison"] == "forks"
    assert new.data.tags["forked_from"].startswith(f"{first['mlflow_run_id']} at step 16")
    steps = metric_steps(c, new_id)
    for key, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{key} logged twice at one step: {logged}"
    assert [s for s in steps["train/loss"] if s < 16] == [s for s in history_before["train/loss"] if s < 16]
    assert max(steps["train/loss"]) >= 23 and steps["final/prefix/acc_mean"] == [0]
    assert forked["train_seconds"] > first["train_seconds"]  # counted from the checkpoint's train time

    resumed = fit(compose([f"resume={out}", "trainer.max_steps=24"]))
    for pad in ("prefix", "in_sequence"):
        assert forked[pad]["per_residue"] == pytest.approx(resumed[pad]["per_residue"], abs=1e-6)


def wait_for_metric(c, exp_name: str, key: str, min_step: int, proc, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        exp = c.get_experiment_by_name(exp_name)
        runs = c.search_runs([exp.experiment_id]) if exp else []
        if runs and any(m.step >= min_step for m in c.get_metric_history(runs[0].info.run_id, key)):
            return runs[0]
        time.sleep(0.2)
    raise AssertionError(f"no {key} at step {min_step} within {timeout}s")


def test_ctrl_c_checkpoints_the_step_exits_130_and_resume_last_continues(tmp_path, monkeypatch):
    """SIGINT mid-training: a checkpoint at the interrupted step (no periodic one is due), exit 130, one line saying how
    to resume, the MLflow run KILLED; `resume=last` is then this run and finishes it."""
    from phasefix.fit_run import Run

    monkeypatch.setenv("PHASEFIX_OUTPUTS", str(tmp_path / "outputs"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    # as a terminal's Ctrl-C reaches it: a test suite started in the background (`pytest &`) ignores SIGINT, and a
    # child inherits an ignored SIGINT, so the run would never see the signal
    proc = subprocess.Popen([sys.executable, "-m", "phasefix.fit", *FAST, "trainer.max_steps=100000",
                             "trainer.checkpoint_every_n_steps=100000", "trainer.log_every_n_steps=1",
                             f"logger.tracking_uri={uri}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    c = MlflowClient(tracking_uri=uri)
    run = wait_for_metric(c, "phasefix", "train/loss", 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    run_dir = Path(run.data.tags["output_dir"])
    assert last.endswith(f"python -m phasefix.fit resume={run_dir}"), err
    step, _ = Run.open(str(run_dir)).progress()
    assert step >= 3  # a checkpoint at the interrupted step; no periodic one was due
    assert not list((run_dir / "checkpoints").glob("step*.ckpt"))
    assert c.get_run(run.info.run_id).info.status == "KILLED"
    assert Run.open("last").dir == run_dir

    done = fit(compose(["resume=last", f"trainer.max_steps={step + 2}"]))
    assert done["mlflow_run_id"] == run.info.run_id
    assert Run.open(str(run_dir)).progress()[0] == step + 2
    assert c.get_run(run.info.run_id).info.status == "FINISHED"
    loss_steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert len(loss_steps) == len(set(loss_steps)) and max(loss_steps) >= step + 1


class InterruptAt:
    """Raises KeyboardInterrupt (a Ctrl-C) once: at step 5 of a run, where the loop reaches `point`."""

    def __init__(self, point: str):
        self.point, self.fired = point, False

    def __call__(self, where: str, step: int):
        if where == self.point and step == 5 and not self.fired:
            self.fired = True
            raise KeyboardInterrupt


# where a Ctrl-C can land in a step: before its update, after it, right after its training metrics are written (where
# `interrupts_deferred` delivers a Ctrl-C that arrived during the write), during the validation that follows
INTERRUPT_POINTS = ["batch_start", "batch_end", "after_logging", "validation_end"]


@pytest.mark.parametrize("point", INTERRUPT_POINTS)
def test_an_interrupt_anywhere_in_a_step_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, point):
    """Ctrl-C at each point of a step, then resume: the uninterrupted run's weights and every metric at the steps
    the uninterrupted run logged it, once. Without LastCheckpoint's counters and flush, `batch_start` fails (Lightning
    restored its logging step one past the global step: a step skipped, validation one step early) and `batch_end`
    fails (the step's training metrics lost); `after_logging` and `validation_end` pass either way in process (the
    Ctrl-C test's subprocess run once logged a step twice, not reproduced here)."""
    from lightning.pytorch.callbacks import Callback

    from phasefix.module import RunLogger

    steps = FAST + ["trainer.max_steps=12", "trainer.val_every_n_steps=6", "trainer.checkpoint_every_n_steps=100",
                    "trainer.log_every_n_steps=1", "eval.n_boot=20"]
    reference = fit(compose(steps + run_overrides(tmp_path, "reference")))

    interrupt = InterruptAt(point)

    class Interrupter(Callback):  # the step a point belongs to: global_step counts the updates done
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            interrupt("batch_start", trainer.global_step)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            interrupt("batch_end", trainer.global_step - 1)

        def on_validation_end(self, trainer, pl_module):
            interrupt("validation_end", trainer.global_step - 1)

    write = RunLogger.log_metrics

    def write_then_interrupt(self, metrics, step=None):
        write(self, metrics, step)
        if "train/loss" in metrics:
            interrupt("after_logging", step)

    monkeypatch.setattr(RunLogger, "log_metrics", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt, match="continue this run with"):
        fit(compose(steps + run_overrides(tmp_path, "interrupted")), callbacks=[Interrupter()])
    assert interrupt.fired
    resumed = fit(compose([f"resume={tmp_path / 'interrupted'}"]))

    assert_same_final_weights(tmp_path / "reference", tmp_path / "interrupted")
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    # interrupted after its update, step 5's validation (due there) is not run: Lightning resumes past it
    skipped = {5} if point in ("batch_end", "after_logging") else set()
    expected = {k: [s for s in v if not (k.startswith("val/") and s in skipped)]
                for k, v in metric_steps(c, reference["mlflow_run_id"]).items()}
    assert metric_steps(c, resumed["mlflow_run_id"]) == expected


def test_run_id_prefixes_resolve_and_ambiguous_ones_list_the_matches(tmp_path):
    from phasefix.fit_run import Run
    from phasefix.tracking import resolve_run_id

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.create_experiment("phasefix")
    ids = [c.create_run(exp, run_name=f"r{i}", tags={"phasefix.kind": "fit", "output_dir": str(tmp_path)}).info.run_id
           for i in range(17)]  # 17 ids over 16 hex digits: two share their first character
    for rid in ids:
        n = next(n for n in range(1, 33) if sum(o.startswith(rid[:n]) for o in ids) == 1)
        assert resolve_run_id(c, rid[:n]) == rid
        assert resolve_run_id(c, rid[:n].upper()) == rid
    shared = next(rid[0] for rid in ids if sum(o.startswith(rid[0]) for o in ids) > 1)
    with pytest.raises(ConfigError, match="ambiguous") as e:
        resolve_run_id(c, shared, key="runs")
    assert str(e.value).startswith(f"runs={shared!r}")
    for rid in ids:
        assert (rid in str(e.value)) == rid.startswith(shared)
    with pytest.raises(ConfigError, match="no MLflow run id"):
        resolve_run_id(c, "0" * 31 if not any(r.startswith("0" * 31) for r in ids) else "f" * 31)
    (tmp_path / "checkpoints").mkdir()
    assert Run.open(ids[0], tracking_uri=c.tracking_uri).dir == tmp_path


def test_the_model_config_and_mitigations_are_built_once(tmp_path, monkeypatch):
    """plan builds them (the one rule, `configured_model`) and the module trains with those objects, not copies
    rebuilt from the raw dicts; a checkpoint's hyper-parameters still hold the raw dicts it is rebuilt from."""
    from lightning.pytorch.callbacks import Callback

    import phasefix.mitigations as mit

    made = []
    real = mit.configured_model
    monkeypatch.setattr(mit, "configured_model", lambda *a: made.append(real(*a)) or made[-1])

    class Trained(Callback):
        def on_fit_start(self, trainer, pl_module):
            made.append(("module", pl_module.model_config, pl_module.mitigations))

    fit(compose([*FAST, "trainer.max_steps=2", "eval.n_boot=10", "arm=bridge_gate_diversity",
                 *run_overrides(tmp_path)]), callbacks=[Trained()])
    (model_cfg, mitigations), (_, trained_cfg, trained_mitigations) = made  # one build, then the module
    assert trained_cfg is model_cfg and trained_mitigations is mitigations
    assert model_cfg.window == 5 and [m.name for m in mitigations] == ["gate_diversity"]
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "built" not in ckpt["hyper_parameters"] and ckpt["hyper_parameters"]["model"]["window"] == 5


def test_a_bf16_mixed_fit_clips_its_gradients_and_finishes(tmp_path):
    """bf16-mixed is what `trainer.precision=auto` picks on a CPU with AVX-512 BF16 or AMX and on the GPU, and the
    trainer clips gradients at 1.0: Lightning's mixed-precision plugin refuses to clip for an optimizer that unscales
    its own gradients (a fused AdamW), so such a run must get one that does not, and train."""
    from helpers import TINY_FIT

    summary = fit(compose([*TINY_FIT, "trainer.precision=bf16-mixed", "trainer.gradient_clip_val=1.0",
                           *run_overrides(tmp_path)]))
    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and math.isfinite(run.data.metrics["train/loss"])
