"""`phasefix.report` over runs logged directly with the tracking helpers (a study parent with two fit children and
an evaluate run): the table, the overlaid curves, the Pareto front, selection by tags and ids, the report run."""
from __future__ import annotations

import contextlib
import csv
import math

import matplotlib
import pytest
import torch

from phasefix import tracking
from phasefix.paths import PROJECT_ROOT
from phasefix.report import main, pareto_front, report
from helpers import committed_table, phase_result


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def log_run(c, exp_id, name, kind, seed, base, dip, tags=None):
    run_id = c.create_run(exp_id, run_name=name, tags={"phasefix.kind": kind, "model": "tiny", "window": "4",
                                                       "stride": "4", **(tags or {})}).info.run_id
    summary = {"mlflow_run_id": run_id}
    for pad in ("prefix", "in_sequence"):
        res = phase_result(seed + (pad == "prefix"), base, dip)
        tracking.log_phase_result(c, run_id, pad, res)
        summary[pad] = {k: res[k].tolist() for k in ("acc_mean", "acc_worst", "worst_ci", "gap_ci")}
    c.log_dict(run_id, summary, "summary.json")
    c.set_terminated(run_id)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "study-exp")
    parent = c.create_run(exp, run_name="study", tags={"phasefix.kind": "study"}).info.run_id
    ids = {
        "baseline": log_run(c, exp, "baseline", "fit", 1, 0.98, 0.5,
                            {"mitigations": "none", "mlflow.parentRunId": parent}),
        "jitter": log_run(c, exp, "jitter", "fit", 2, 0.8, 0.05,
                          {"mitigations": "phase_jitter", "mlflow.parentRunId": parent}),
        "dominated": log_run(c, exp, "dominated", "fit", 3, 0.6, 0.3,
                             {"mitigations": "head_coord", "mlflow.parentRunId": parent}),
        "evaluate": log_run(c, exp, "eval-hf", "evaluate", 4, 0.7, 0.0, {"task": "needle"}),
    }
    return uri, c, ids, parent


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_over_an_experiment_writes_table_curves_and_pareto(store, tmp_path):
    uri, c, ids, parent = store
    res = report([f"tracking_uri={uri}", "experiment=study-exp", f"out={tmp_path / 'rep'}"])
    out = tmp_path / "rep"
    assert set(res["runs"]) == set(ids.values())  # the study parent itself is not a fit/evaluate run
    rows = read_csv(out / "comparison.csv")
    assert len(rows) == 8 and {r["padding"] for r in rows} == {"prefix", "in_sequence"}
    base = next(r for r in rows if r["run_name"] == "baseline" and r["padding"] == "prefix")
    run = c.get_run(ids["baseline"])
    assert float(base["acc_mean"]) == pytest.approx(run.data.metrics["final/prefix/acc_mean"], abs=1e-4)
    assert float(base["acc_gap"]) > 0.3 and float(base["worst_ci_low"]) < float(base["worst_ci_high"])
    assert base["period_detected"] == "4" and base["parent"] == parent
    md = (out / "comparison.md").read_text()
    assert md.count("\n| ") == 8 and "jitter" in md and "[" in md
    for png in ("phase_curves.png", "pareto.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    front = {(r["run_name"], r["padding"]): r["on_front"] for r in read_csv(out / "pareto.csv")}
    assert len(front) == 6  # the three study members, per padding; the evaluate run has no parent
    assert front[("jitter", "prefix")] == "True" and front[("baseline", "prefix")] == "True"
    assert front[("dominated", "prefix")] == "False"

    rep = c.get_run(res["report_run_id"])
    assert rep.data.tags["phasefix.kind"] == "report"
    assert {"comparison.csv", "comparison.md", "phase_curves.png", "pareto.png"} <= {
        a.path for a in c.list_artifacts(rep.info.run_id)}
    again = report([f"tracking_uri={uri}", "experiment=study-exp", f"out={tmp_path / 'rep2'}", "log=false"])
    assert res["report_run_id"] not in again["runs"] and again["report_run_id"] is None


def test_report_selects_by_ids_tags_and_kind(store, tmp_path, capsys):
    uri, c, ids, _ = store
    two = report([f"tracking_uri={uri}", f"runs={ids['jitter']},{ids['evaluate']}", f"out={tmp_path / 'a'}",
                  "log=false"])
    assert two["runs"] == [ids["jitter"], ids["evaluate"]]
    assert (tmp_path / "a" / "phase_curves.png").exists() and len(two["pareto"]) == 2  # jitter, both paddings
    one = report([f"tracking_uri={uri}", "experiment=study-exp", "tag.mitigations=phase_jitter",
                  f"out={tmp_path / 'b'}", "log=false"])
    assert one["runs"] == [ids["jitter"]]
    evals = report([f"tracking_uri={uri}", "experiment=study-exp", "kind=evaluate", f"out={tmp_path / 'c'}",
                    "log=false"])
    assert evals["runs"] == [ids["evaluate"]] and not evals["pareto"]
    assert main([f"tracking_uri={uri}", "experiment=study-exp", "tag.mitigations=none", f"out={tmp_path / 'd'}",
                 "log=false"]) == 0
    assert "baseline" in capsys.readouterr().out


@pytest.mark.parametrize("args,key", [(["experiment=nope"], "experiment="), (["runs=abc"], "runs="),
                                      (["kind=study"], "kind="), (["colour=red"], "option="),
                                      (["experiment=study-exp", "tag.model=none-such"], "selection=")])
def test_report_bad_selection_exits_2(store, args, key, capsys, tmp_path):
    uri = store[0]
    assert main([f"tracking_uri={uri}", f"out={tmp_path / 'x'}"] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and key in err and "\n" not in err


def test_pareto_front():
    assert pareto_front([(0.9, 0.4), (0.8, 0.8), (0.7, 0.7), (0.9, 0.4), (math.nan, 1.0)]) == [
        True, True, False, True, False]


def test_seed_rows_group_runs_named_by_seed():
    def row(name, pad, mean, worst, secs):
        return {"run_id": name + "xxxxxxxx", "run_name": name, "padding": pad, "acc_mean": mean, "acc_worst": worst,
                "acc_gap": 1.0 - worst, "train_seconds": secs, "lm_loss": math.nan}
    from phasefix.report import seed_rows, seeds_markdown
    rows = [row("S4-base-s0", "prefix", 0.8, 0.4, 100.0), row("S4-base-s1", "prefix", 0.6, 0.55, 300.0),
            row("S4-base-s1", "in_sequence", 0.5, 0.5, 300.0), row("S4-hc", "prefix", 0.9, 0.85, 50.0)]
    by = {(r["config"], r["padding"]): r for r in seed_rows(rows)}
    assert set(by) == {("S4-base", "prefix"), ("S4-base", "in_sequence"), ("S4-hc", "prefix")}
    base = by[("S4-base", "prefix")]
    assert base["seeds"] == 2 and base["flat"] == 1  # 0.55 >= 0.54; 0.4 < 0.72
    assert base["acc_mean"] == pytest.approx(0.7) and base["acc_mean_sd"] == pytest.approx(math.sqrt(0.02))
    assert base["train_seconds"] == pytest.approx(200.0) and math.isnan(base["lm_loss"])
    assert math.isnan(by[("S4-hc", "prefix")]["acc_mean_sd"]) and by[("S4-hc", "prefix")]["flat"] == 1
    md = seeds_markdown(seed_rows(rows))
    assert "| S4-base | prefix | 2 | 0.700 ± 0.141 |" in md


def test_report_by_id_prefixes_labels_full_attention_and_says_what_it_left_out(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "phasefix")
    full = log_run(c, exp, "full", "fit", 5, 0.99, 0.0, {"attention": "full"})
    comp = log_run(c, exp, "compressed", "fit", 6, 0.9, 0.5, {"attention": "compressed"})
    killed = c.create_run(exp, run_name="interrupted", tags={"phasefix.kind": "fit", "attention": "compressed",
                                                             "window": "4", "stride": "4"}).info.run_id
    c.set_terminated(killed, status="KILLED")
    assert main([f"tracking_uri={uri}", f"runs={full[:8]},{comp[:8]},{killed[:8]}", f"out={tmp_path / 'r'}",
                 "log=false"]) == 0
    out = capsys.readouterr().out
    assert f"left out {killed[:8]} interrupted: no final phase results (status KILLED)" in out
    assert "2 of 3 runs reported" in out
    md = (tmp_path / "r" / "comparison.md").read_text()
    full_rows = [ln for ln in md.splitlines() if ln.startswith("| full ")]
    assert len(full_rows) == 2 and all("| full |" in ln and "4/4" not in ln for ln in full_rows)
    assert all("| 4/4 |" in ln for ln in md.splitlines() if ln.startswith("| compressed "))
    rows = read_csv(tmp_path / "r" / "comparison.csv")
    assert {(r["run_name"], r["window"], r["stride"]) for r in rows} == {("full", "", ""), ("compressed", "4", "4")}


def test_regime_tagged_runs_get_the_decisive_table_and_figures(tmp_path, monkeypatch):
    """Two regime-tagged arms (params as a fit logs them): the baseline dips at the boundary phase, the arm is flat;
    the decisive table counts learned seeds, the goal against the baseline's mean and the arm's costs."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "decisive")
    params = {"model.window": "4", "model.stride": "4", "data.num_values": "32"}
    ids = {}
    for arm, window, dip in (("baseline", "4", 0.6), ("window_s+1", "5", 0.0)):
        for seed in (0, 1):
            untagged = (arm, seed) == ("baseline", 1)  # a regime run without an arm tag is the unmitigated one
            rid = log_run(c, exp, f"{arm}-s{seed}", "fit", seed, 0.95, dip,
                          {"regime": "w4s4", "comparison": "dec", **({} if untagged else {"arm": arm})})
            tracking.log_params(c, rid, {**params, "model.window": window})
            ids[(arm, seed)] = rid
    unfinished = c.create_run(exp, run_name="baseline-s2", tags={"phasefix.kind": "fit", "regime": "w4s4",
                                                                  "arm": "baseline", "comparison": "dec"}).info.run_id
    tracking.log_metric_values(c, unfinished, {}, {"train/loss": [3.0, 2.9]})
    c.set_terminated(unfinished, status="KILLED")
    from phasefix import plots
    drawn, draw = {}, plots.loss_curves

    def spy(losses, facts):
        drawn.update(losses)
        return draw(losses, facts)
    monkeypatch.setattr(plots, "loss_curves", spy)
    doc = tmp_path / "results.md"  # a document quoting the seeds table this report writes
    doc.write_text("# dec\n<!-- quote: out/runs.md -->\n<!-- /quote -->\n")
    res = report([f"tracking_uri={uri}", "experiment=decisive", "tag.comparison=dec", f"out={tmp_path / 'out'}",
                  "log=false", f"into={doc}"])
    out = tmp_path / "out"
    assert doc.read_text() == "# dec\n<!-- quote: out/runs.md -->\n\n" + (out / "runs.md").read_text() \
        + "\n<!-- /quote -->\n"
    assert set(drawn) == set(ids.values())  # the loss figure shows the table's runs, not the killed one
    assert {"decisive.csv", "decisive.md", "headline.md", "phase_grid_prefix.png", "worst_vs_mean.png",
            "train_loss.png"} <= set(res["files"])
    rows = {(r["arm"], r["padding"]): r for r in csv.DictReader(open(out / "decisive.csv"))}
    assert {a for a, _ in rows} == {"baseline", "window_s+1"}
    base, arm = rows[("baseline", "prefix")], rows[("window_s+1", "prefix")]
    assert base["learned"] == "2" and arm["learned"] == "2"
    assert base["goal_met"] == "0" and arm["goal_met"] == "2"  # flat at ~0.95 >= 0.9 x mean, and above the baseline
    # tiny's compressor at W5 vs W4: 2 layers x 2 branches x 128 x (2 x 32 + 2) x W/4 multiply-adds per token
    assert float(base["compressor_flops_per_token"]) == 2 * 2 * 128 * 66 * 4 / 4
    assert float(arm["compressor_flops_per_token"]) == 2 * 2 * 128 * 66 * 5 / 4
    assert float(arm["cache_entries_per_token"]) == float(base["cache_entries_per_token"])
    assert "window_s+1" in (out / "headline.md").read_text()
    seeds = [line for line in (out / "runs.md").read_text().splitlines() if line.startswith("| w4s4 ")]
    assert len(seeds) == 4 and all(f"(`{rid[:8]}`)" in "".join(seeds) for rid in ids.values())
    assert [("**" in line) for line in seeds] == [False, False, True, True]  # window_s+1's seeds meet it: bold


def test_tracking_run_lifecycle_and_metrics_in_batches(tmp_path):
    """`running` ends a run FINISHED, KILLED on Ctrl-C, FAILED on an error; `log_metric_values` logs more points than
    one MLflow batch holds, curves by index or by step, and skips None and nan."""
    c = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = []
    for error in (None, KeyboardInterrupt, ValueError):
        rid = tracking.create_run(c, "lifecycle", "r", {"phasefix.kind": "fit"})
        ids.append(rid)
        with pytest.raises(error) if error else contextlib.nullcontext():
            with tracking.running(c, rid):
                if error:
                    raise error
    assert [c.get_run(r).info.status for r in ids] == ["FINISHED", "KILLED", "FAILED"]
    curve = [float(i % 7) for i in range(1203)]
    tracking.log_metric_values(c, ids[0], {"a": 0.5, "b": None, "c": math.nan}, {
        "by_index": curve, "by_step": {10: 1.0, 20: math.nan, 30: 3.0}}, step=4)
    run = c.get_run(ids[0])
    assert run.data.metrics == {"a": 0.5, "by_index": curve[-1], "by_step": 3.0}
    assert [m.step for m in c.get_metric_history(ids[0], "a")] == [4]
    assert sorted((m.step, m.value) for m in c.get_metric_history(ids[0], "by_index")) == list(enumerate(curve))
    assert sorted((m.step, m.value) for m in c.get_metric_history(ids[0], "by_step")) == [(10, 1.0), (30, 3.0)]


def test_ctrl_c_during_a_metric_write_lands_after_it_and_the_run_still_ends_killed(tmp_path, monkeypatch, request):
    """A Ctrl-C that arrives inside the logger's MLflow write (CI once caught one inside sqlite: the interrupted
    connection kept the database locked and ending the run KILLED failed) waits until the write is done: the points
    are in the store, then the KeyboardInterrupt, and the run ends KILLED."""
    import os
    import signal

    from mlflow.tracking import MlflowClient

    from phasefix.module import RunLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    rid = tracking.create_run(c, "interrupt", "r", {"phasefix.kind": "fit"})
    real = MlflowClient.log_batch

    def ctrl_c_mid_write(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode: before the write below
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", ctrl_c_mid_write)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C even if pytest was started with `&`
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    logger = RunLogger(experiment_name="interrupt", tracking_uri=uri, run_id=rid)
    with pytest.raises(KeyboardInterrupt):
        with tracking.running(c, rid):
            logger.log_metrics({"train/loss": 1.5}, step=3)
            raise AssertionError("the interrupt should have been raised when the write ended")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert [(m.step, m.value) for m in c.get_metric_history(rid, "train/loss")] == [(3, 1.5)]
    assert c.get_run(rid).info.status == "KILLED"


def test_a_recorded_command_gives_the_shell_back_the_same_overrides_and_the_tag_composes_to_it():
    """The `command` a table row shows is copy-pasteable: shlex (a POSIX shell's word splitting) turns it back into
    exactly the overrides, quotes, spaces, brackets and `$` included; the override that records it for an in-process
    fit (study trial, confirm run) composes to that same string."""
    import shlex

    from phasefix.cli import compose

    args = ["regime=lm_mix_w4s4", "eval.paddings=[prefix,in_sequence]", "output_dir='/tmp/a b'",
            "run_name='x-t3'", 'logger.tracking_uri="sqlite:///tmp/m.db"', "+logger.tags.note='cost $5'",
            "~logger.tags", "seed=1"]
    cmd = tracking.shell_command("fit", args)
    assert cmd.startswith("python -m phasefix.fit regime=lm_mix_w4s4 \"eval.paddings=[prefix,in_sequence]\" ")
    assert shlex.split(cmd) == ["python", "-m", "phasefix.fit", *args]
    fit_args = args[:5] + ["seed=1"]
    cfg = compose([*fit_args, tracking.command_override(fit_args)])
    assert cfg.logger.tags.command == tracking.shell_command("fit", fit_args)
    assert shlex.split(cfg.logger.tags.command)[3:] == fit_args


def test_a_rescoring_joins_the_decisive_table_as_the_run_it_measured(tmp_path, monkeypatch):
    """Evaluate runs of regime-tagged fits (tag phasefix.source_run), in their own experiment: regime, arm, costs and
    the loss curve come from the fit, the accuracy from the re-scoring (of two, the one on more prompts per residue);
    a re-scoring of a vanished run is left out."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    fits = tracking.get_or_create_experiment(c, "fits")
    rescore = tracking.get_or_create_experiment(c, "rescore")
    params = {"model.window": "4", "model.stride": "4", "data.num_values": "32"}
    expected = {}
    for arm, window in (("baseline", "4"), ("window_s+1", "5")):
        # the fits dip at the boundary phase; re-scored, the baseline still dips and the arm is flat
        fit = log_run(c, fits, f"{arm}-s0", "fit", 0, 0.95, 0.6, {"regime": "w4s4", "arm": arm})
        tracking.log_params(c, fit, {**params, "model.window": window})
        tracking.log_metric_values(c, fit, {}, {"train/loss": [3.0, 1.0 if arm == "baseline" else 0.5]})
        c.log_dict(fit, {"train_seconds": 100.0 if arm == "baseline" else 120.0}, "summary.json")
        dip = 0.6 if arm == "baseline" else 0.0
        rid = log_run(c, rescore, f"{arm}-s0-pr192", "evaluate", 7, 0.95, dip, {"phasefix.source_run": fit})
        tracking.log_params(c, rid, {"per_residue": 192})
        expected[arm] = (rid, phase_result(7 + 1, 0.95, dip), 1.0 if arm == "baseline" else 0.5)
    # a later re-scoring of the arm on fewer prompts, with a dip: the one on 192 prompts stands
    fewer = log_run(c, rescore, "window_s+1-s0-pr48", "evaluate", 11, 0.95, 0.6, {"phasefix.source_run": fit})
    tracking.log_params(c, fewer, {"per_residue": 48})
    gone = log_run(c, rescore, "gone-pr192", "evaluate", 9, 0.9, 0.0, {"phasefix.source_run": "0" * 32})
    from phasefix import plots
    drawn, draw = {}, plots.loss_curves

    def spy(losses, facts):
        drawn.update(losses)
        return draw(losses, facts)
    monkeypatch.setattr(plots, "loss_curves", spy)
    res = report([f"tracking_uri={uri}", "experiment=rescore", f"out={tmp_path / 'out'}", "log=false"])
    assert gone in res["runs"] and "decisive.csv" in res["files"]
    rows = {(r["arm"], r["padding"]): r for r in csv.DictReader(open(tmp_path / "out" / "decisive.csv"))}
    assert {r["regime"] for r in rows.values()} == {"w4s4"} and len(rows) == 4  # the vanished source's run: no row
    for arm, (rid, prefix, last_loss) in expected.items():
        row = rows[(arm, "prefix")]
        assert float(row["acc_mean"]) == pytest.approx(float(prefix["acc_mean"]), abs=1e-6)
        assert float(row["acc_worst"]) == pytest.approx(float(prefix["acc_worst"]), abs=1e-6)
        assert drawn[rid][-1] == pytest.approx(last_loss)  # the fit's training loss, drawn for the re-scoring
    assert rows[("baseline", "prefix")]["goal_met"] == "0" and rows[("window_s+1", "prefix")]["goal_met"] == "1"
    assert rows[("window_s+1", "prefix")]["seeds"] == "1" and fewer not in rows[("window_s+1", "prefix")]["run_ids"]
    assert float(rows[("window_s+1", "prefix")]["compressor_flops_per_token"]) == 2 * 2 * 128 * 66 * 5 / 4
    assert float(rows[("baseline", "prefix")]["train_seconds"]) == 100.0  # the fit's training time
    assert float(rows[("window_s+1", "in_sequence")]["train_seconds"]) == 120.0


def test_new_runs_join_a_committed_table_and_are_judged_against_its_baseline(tmp_path):
    """A fresh store holds only a new arm's two seeds (flat at ~0.95); the regime's baseline and another arm are in
    committed report folders as table rows. Joined, the table carries those rows (naming their folder) and the new
    arm meets the goal against the committed baseline mean (0.90), not against a higher one (0.99). A third seed in
    another fresh store joins that report's folder and is pooled with its two runs (decisive_runs.csv). A folder
    that has the new arm only as a row, or none of its regimes, or a run selected again, is refused before anything
    is written."""
    from phasefix.errors import ConfigError
    from phasefix.tables import headline_from_tables

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "grow")
    for seed in (0, 1):
        rid = log_run(c, exp, f"w5-s{seed}", "fit", seed, 0.95, 0.0, {"regime": "w4s4", "arm": "window_s+1"})
        tracking.log_params(c, rid, {"model.window": "5", "model.stride": "4", "data.num_values": "32"})

    def committed(name, rows):
        return committed_table(tmp_path / name, rows)

    low = committed("low", [("w4s4", "baseline", 3, 0, 0.90, 0.20), ("w4s4", "token_shift", 3, 1, 0.91, 0.60),
                            ("w8s8", "baseline", 3, 0, 0.80, 0.20)])
    high = committed("high", [("w4s4", "baseline", 3, 0, 0.99, 0.20)])
    res = report([f"tracking_uri={uri}", "experiment=grow", f"join={low}", f"out={tmp_path / 'a'}", "log=false"])
    rows = {(r["arm"], r["padding"]): r for r in read_csv(tmp_path / "a" / "decisive.csv")}
    assert {r["regime"] for r in rows.values()} == {"w4s4"} and len(rows) == 6  # w8s8 is not this comparison's
    assert [r["arm"] for r in res["decisive"]] == ["baseline"] * 2 + ["token_shift"] * 2 + ["window_s+1"] * 2
    assert rows[("baseline", "prefix")]["table"] == str(low) and rows[("baseline", "prefix")]["run_ids"] == "base0000"
    assert rows[("token_shift", "prefix")]["goal_met"] == "1" and rows[("window_s+1", "prefix")]["table"] == \
        str(tmp_path / "a")
    assert rows[("window_s+1", "prefix")]["goal_met"] == "2" and rows[("window_s+1", "in_sequence")]["goal_met"] == "2"
    assert "| w4s4 | window_s+1 | prefix | 2/2 |" in (tmp_path / "a" / "headline.md").read_text()
    _, hrows = headline_from_tables([str(tmp_path / "a")], tmp_path / "h")  # each row keeps its own table
    assert [(r["arm"], r["table"]) for r in hrows][::2] == [("baseline", str(low)), ("window_s+1", str(tmp_path / "a"))]
    report([f"tracking_uri={uri}", "experiment=grow", f"join={high}", f"out={tmp_path / 'b'}", "log=false"])
    rows = {(r["arm"], r["padding"]): r for r in read_csv(tmp_path / "b" / "decisive.csv")}
    assert rows[("window_s+1", "prefix")]["goal_met"] == "0"  # ~0.95 is below the committed baseline's 0.99
    clash = committed("clash", [("w4s4", "window_s+1", 3, 3, 0.95, 0.9)])
    other = committed("other", [("w8s8", "baseline", 3, 0, 0.8, 0.2)])
    for folder, says in ((clash, "has arm window_s\\+1 of regime w4s4 only as a table row"),
                         (tmp_path / "none", "decisive.csv"), (other, "has no regime of the selected"),
                         (tmp_path / "a", "selected here too")):
        with pytest.raises(ConfigError, match=says):
            report([f"tracking_uri={uri}", "experiment=grow", f"join={folder}", f"out={tmp_path / 'c'}", "log=false"])
        assert not (tmp_path / "c").exists()

    # the next machine: seed 2 alone in a fresh store, pooled with the two seeds of report a
    c2 = tracking.client(f"sqlite:///{tmp_path / 'mlflow2.db'}")
    third = log_run(c2, tracking.get_or_create_experiment(c2, "grow"), "w5-s2", "fit", 2, 0.95, 0.0,
                    {"regime": "w4s4", "arm": "window_s+1"})
    tracking.log_params(c2, third, {"model.window": "5", "model.stride": "4", "data.num_values": "32"})
    report([f"tracking_uri=sqlite:///{tmp_path / 'mlflow2.db'}", "experiment=grow", f"join={tmp_path / 'a'}",
            f"out={tmp_path / 'd'}", "log=false"])
    rows = {(r["arm"], r["padding"]): r for r in read_csv(tmp_path / "d" / "decisive.csv")}
    assert rows[("baseline", "prefix")]["table"] == str(low)  # still the committed row, named by its own table
    pooled = rows[("window_s+1", "prefix")]
    assert pooled["seeds"] == "3" and pooled["goal_met"] == "3" and third[:8] in pooled["run_ids"].split()
    first = {r["run_id"]: r for r in read_csv(tmp_path / "a" / "decisive_runs.csv") if r["padding"] == "prefix"}
    assert len(first) == 2 and all(rid[:8] in pooled["run_ids"].split() for rid in first)
    means = [float(r["acc_mean"]) for r in first.values()] + [float(phase_result(3, 0.95, 0.0)["acc_mean"])]
    assert float(pooled["acc_mean"]) == pytest.approx(sum(means) / 3, abs=1e-5)  # the mean over all three seeds
    back = {(r["run_id"], r["padding"]): r["table"] for r in read_csv(tmp_path / "d" / "decisive_runs.csv")}
    assert back[(third, "prefix")] == str(tmp_path / "d") and {back[(rid, "prefix")] for rid in first} == \
        {str(tmp_path / "a")}


def test_a_comparisons_copy_of_another_tables_row_gives_way_to_a_folder_joined_before_it(tmp_path):
    """A comparison's own folder holds the baseline rows it copied from folder `a` (their `table` names a) and its own
    arm's rows. Its regime now lists folder `b` (the same runs re-scored) first and leaves `a` out: joined for the
    comparison (skip_known), the copy gives way to b's row and the own arm stays; joined plainly, it is refused."""
    from phasefix import decisive
    from phasefix.errors import ConfigError
    from phasefix.tables import joined_rows, read_table, write_csv

    rescored = committed_table(tmp_path / "b", [("w4s4", "baseline", 3, 0, 0.80, 0.25)])
    own = committed_table(tmp_path / "own", [("w4s4", "baseline", 3, 0, 0.79, 0.12),
                                             ("w4s4", "spread", 3, 3, 1.00, 0.99)])
    rows = [{**r, "table": str(tmp_path / "a") if r["arm"] == "baseline" else str(own)}
            for r in read_table(own)]
    write_csv(own / "decisive.csv", rows, decisive.COLUMNS + ("table",))
    got, _ = joined_rows([str(rescored), str(own)], set(), set(), ["w4s4"], skip_known=True)
    assert sorted((r["arm"], r["padding"], r["table"], r["acc_mean"]) for r in got) == [
        ("baseline", "in_sequence", str(rescored), 0.80), ("baseline", "prefix", str(rescored), 0.80),
        ("spread", "in_sequence", str(own), 1.00), ("spread", "prefix", str(own), 1.00)]
    with pytest.raises(ConfigError, match="repeats arm baseline of regime w4s4"):
        joined_rows([str(rescored), str(own)], set(), set(), ["w4s4"])


def test_a_comparisons_figures_draw_every_run_its_tables_pool():
    """A comparison written from a fresh store pools its earlier runs from its committed folder (decisive_runs.csv):
    its figures draw them too, at the scores and with the curves that folder's comparison.csv and phase_curves.csv
    hold, not only the store's new runs (docs/figures/rates drew 9 of its 60-odd runs)."""
    from phasefix import plots
    from phasefix.report import figure_runs
    from phasefix.tables import read_curves, read_members, read_scores

    folder = PROJECT_ROOT / "docs/figures/rates"
    pooled = [{**m, "joined_from": "docs/figures/rates"} for m in read_members(folder)]
    rows, curves, facts = figure_runs([], {}, {}, pooled)
    scores = {(r["run_id"], r["padding"]): float(r["acc_mean"]) for r in read_scores(folder)}
    assert {(m["run_id"], m["padding"]) for m in pooled} == {(r["run_id"], r["padding"]) for r in rows}
    for r in rows:
        if (r["run_id"], r["padding"]) in scores:
            assert r["acc_mean"] == pytest.approx(scores[(r["run_id"], r["padding"])], abs=1e-6)
    assert {(m["regime"], m["arm"]) for m in pooled} == {(f["regime"], f["arm"]) for f in facts.values()}
    assert curves and set(curves) <= set(read_curves(folder))
    prefix = [r for r in rows if r["padding"] == "prefix" and not math.isnan(r["acc_mean"])]
    fig = plots.worst_vs_mean(rows, facts)
    assert sum(len(p.get_offsets()) for p in fig.axes[0].collections) == len(prefix)
    matplotlib.pyplot.close(fig)
