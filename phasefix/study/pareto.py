"""The study's report: `pareto.csv` (the Pareto front from Optuna's `study.best_trials`), `trials.csv` (every
trial; `import_trials` reads it back), `importances.csv` (Optuna's parameter importances per objective), `pareto.png`,
logged to the MLflow parent run and printed as a table (`report_study`)."""
from __future__ import annotations

import csv
import re
from pathlib import Path

from phasefix.errors import check
from phasefix.study import mlflow_runs
from phasefix.study.spec import StudySpec, logged_name, sampled_params

# metrics a row shows besides the objectives (from the trial's user attr `metrics`)
EXTRA_COLUMNS = ("final/prefix/acc_gap", "final/in_sequence/acc_mean", "final/in_sequence/acc_worst", "final/lm_loss",
                 "train_seconds")


def counts(study) -> dict[str, int]:
    """Trials by state, and ERRORS: failed trials that were not retried (errors, and workers that died more than
    max_retry times)."""
    from optuna.trial import TrialState

    out = {s.name: 0 for s in TrialState}
    trials = study.get_trials(deepcopy=False)
    retried: set[int] = set()
    for t in trials:
        out[t.state.name] += 1
        retried.update(t.system_attrs.get("retry_history", []))
    out["ERRORS"] = sum(1 for t in trials if t.state == TrialState.FAIL and t.number not in retried)
    return out


def feasible(trial) -> bool | None:
    """Whether a finished trial met every constraint (Optuna's convention: a value <= 0 is met); None when it has
    no recorded constraint values."""
    cons = trial.user_attrs.get("constraints")
    return None if cons is None else all(c <= 0 for c in cons)


def seed_column(metric: str, seed) -> str:
    """trials.csv's column for one seed's value of an objective (a study with `seeds:`)."""
    return f"{metric}@s{seed}"


DUPLICATE_NOTE = "duplicate of trial {} (its values, no fit)"  # trials.csv's note for a twin; import reads it back


def trial_rows(spec: StudySpec, study, trials) -> list[dict]:
    """One CSV row per trial: objectives, other metrics, feasibility, params, MLflow run, retry and why it ended."""
    params = [p.name for p in spec.params]
    rows = []
    for t in trials:
        row = {"trial": t.number, "state": t.state.name}
        for o, v in zip(spec.objectives, t.values or [None] * len(spec.objectives)):
            row[o.metric] = None if v is None else round(v, 4)
        by_seed = t.user_attrs.get("seed_metrics") or {}
        for seed in spec.seeds:  # a study with seeds: each seed's objectives beside their mean
            for o in spec.objectives:
                v = by_seed.get(str(seed), {}).get(o.metric)
                row[seed_column(o.metric, seed)] = None if v is None else round(v, 4)
        # trials of earlier versions kept `prefix.acc_gap`, `lm_loss`: the same metrics
        extra = {logged_name(k): v for k, v in (t.user_attrs.get("metrics") or {}).items()}
        for k in EXTRA_COLUMNS:
            if k not in row and k in extra:
                v = extra[k]
                row[k] = round(v, 6) if isinstance(v, float) else v  # a mean over seeds: no float noise in the CSV
        if spec.constraints:
            cons = t.user_attrs.get("constraints")
            row["feasible"] = feasible(t)
            for c, v in zip(spec.constraints, cons or []):  # the values, so that import_trials restores them
                row[f"constraint:{c.key}"] = round(v, 6)
        for p in params:
            v = t.params.get(p)
            row[p] = float(f"{v:.6g}") if isinstance(v, float) else v  # 6 significant digits: lr 1e-3 keeps them
        row["mlflow_run_id"] = t.user_attrs.get("mlflow_run_id")
        row["retry_of"] = t.system_attrs.get("failed_trial")
        twin = t.user_attrs.get("duplicate_of")
        row["note"] = ((DUPLICATE_NOTE.format(twin) if twin is not None and t.values else None)
                       or t.user_attrs.get("pruned") or t.user_attrs.get("error"))
        rows.append(row)
    return rows


def import_trials(spec: StudySpec, study, path: str | Path) -> int:
    """Rebuild the finished trials of a `trials.csv` (`trial_rows`' format) in an empty study: a study continues
    from its committed report on a machine that does not have its storage. COMPLETE rows keep their objectives,
    constraints, metrics, per-seed objectives (a study with `seeds:`) and MLflow run id; PRUNED rows their params and
    why they were pruned (infeasible, as the objective marks them); FAIL rows stay failed (their error, which trial
    they retried). Every row is added in trial order, so the trial numbers are the table's and a report, a confirm
    arm `t<N>` or a document quoting a trial still names the same one. A RUNNING row (its worker was stopped when
    the report was written) comes back as an interrupted trial: running the study retries it like any interrupted
    trial, within `storage.max_retry`.
    The params are replayed in the search space's order, so a mitigation's options appear exactly where `suggest`
    would have sampled them. Returns the number of trials added."""
    with open(path, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["trial"]))
    check([int(r["trial"]) for r in rows] == list(range(len(rows))), str(path), None,
          "must list trials 0..N-1 (a report's trials.csv): a gap would renumber the trials after it")
    history: dict[int, list[int]] = {}  # failed trial -> the retries of it so far (Optuna's retry_history)
    study.add_trials([imported_trial(spec, row, Path(path), history) for row in rows])
    return len(rows)


def imported_trial(spec: StudySpec, row: dict, path: Path, history: dict[int, list[int]]):
    """One row of a trials.csv as a finished Optuna trial (`import_trials`); `history` collects the retry chains."""
    import optuna
    from optuna.trial import TrialState

    state = row.get("state")
    check(state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING"), f"{path}: trial {row['trial']}", state,
          "is not a trial state (COMPLETE, PRUNED, FAIL, RUNNING, WAITING)")

    def cell(p):
        check(p.name in row, str(path), None, f"has no column {p.name!r} (a report of another search space?)")
        return _param_value(p, row[p.name], path)

    params = dict((p.name, v) for p, v in sampled_params(spec, cell))
    dists = {p.name: _distribution(p) for p in spec.params if p.name in params}
    attrs = {"imported_from": f"{path.name} trial {row['trial']}"}
    if row.get("mlflow_run_id"):
        attrs["mlflow_run_id"] = row["mlflow_run_id"]
    system = {}
    if row.get("retry_of"):  # what RetryFailedTrialCallback wrote: the first failed trial and the chain so far
        first = int(float(row["retry_of"]))
        chain = history.setdefault(first, [first])
        system = {"failed_trial": first, "retry_history": list(chain)}
        chain.append(int(row["trial"]))
    values, cons = None, {}
    if state in ("RUNNING", "WAITING"):
        attrs["interrupted"] = f"{state} in {path.name}: its worker stopped before the trial ended"
        state = "FAIL"
    elif state == "FAIL":
        if row.get("note"):
            attrs["error"] = row["note"]
    elif state == "PRUNED":
        attrs["pruned"] = row.get("note") or "pruned"
        cons = {c.key: 1.0 for c in spec.constraints}
    else:
        values, cons = _complete_row(spec, row, path, attrs)
    return optuna.trial.create_trial(
        state=TrialState[state], values=values, params=params, distributions=dists, user_attrs=attrs,
        system_attrs=system, constraints=cons or None)


def _complete_row(spec: StudySpec, row: dict, path: Path, attrs: dict) -> tuple[list[float], dict]:
    """A COMPLETE row's objective values and constraints; its metrics, per-seed objectives, constraint values and
    twin into `attrs`."""
    if m := re.match(re.escape(DUPLICATE_NOTE.split("{}")[0]) + r"(\d+)", row.get("note") or ""):
        attrs["duplicate_of"] = int(m.group(1))
    values = [_number(row.get(o.metric)) for o in spec.objectives]
    check(all(v is not None for v in values), f"{path}: trial {row['trial']}", None,
          f"is COMPLETE but lacks an objective ({', '.join(spec.metric_names)})")
    feasible = row.get("feasible") != "False"
    cons = {c.key: _number(row.get(f"constraint:{c.key}")) for c in spec.constraints}
    cons = {k: (v if v is not None else 0.0 if feasible else 1.0) for k, v in cons.items()}
    metrics = {k: _number(row.get(k)) for k in (*EXTRA_COLUMNS, *spec.metric_names)}
    attrs["metrics"] = {k: v for k, v in metrics.items() if v is not None}
    by_seed = {str(seed): {o.metric: v for o in spec.objectives
                           if (v := _number(row.get(seed_column(o.metric, seed)))) is not None}
               for seed in spec.seeds}  # the per-seed columns trial_rows wrote, back into seed_metrics
    if any(by_seed.values()):
        attrs["seed_metrics"] = {k: m for k, m in by_seed.items() if m}
    if spec.constraints:
        attrs["constraints"] = list(cons.values())
    return values, cons


def _distribution(p):
    """A search-space param as Optuna's distribution."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if p.type == "categorical":
        return CategoricalDistribution(p.choices)
    if p.type == "int":
        return IntDistribution(int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return FloatDistribution(p.low, p.high, step=p.step, log=p.log)


def _param_value(p, cell: str, path: Path):
    """A trials.csv cell as the param's value (a categorical one must be one of its choices)."""
    if p.type == "categorical":
        match = [c for c in p.choices if ("" if c is None else str(c)) == cell]
        check(bool(match), f"{path}: {p.name}", cell, f"is not one of the study's choices {p.choices}")
        return match[0]
    x = int(float(cell)) if p.type == "int" else float(cell)
    return min(max(x, p.low), p.high)  # trials.csv keeps 6 significant digits


def _number(cell: str | None) -> float | None:
    return None if cell in (None, "") else float(cell)


MIN_TRIALS_FOR_IMPORTANCE = 5


def importances(spec: StudySpec, study) -> list[dict]:
    """Which parameters matter: Optuna's fANOVA parameter importances (the share of each objective's variance a
    param explains, from a random forest over the trials; seeded, so a report is reproducible) for each objective,
    over the complete trials and the params all of them have (a mitigation's weight, sampled only when it is on,
    enters through the mitigation set). Rows {objective, param, importance}, largest first; [] with fewer than
    MIN_TRIALS_FOR_IMPORTANCE complete trials or when the complete trials share no varied param."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    complete = distinct_complete(study.get_trials(deepcopy=False))
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return []
    distinct = optuna.create_study(directions=study.directions)  # in memory: a duplicate would weigh its point twice
    distinct.add_trials(complete)
    rows = []
    for i, metric in enumerate(spec.metric_names):
        try:
            imp = optuna.importance.get_param_importances(distinct, evaluator=FanovaImportanceEvaluator(seed=0),
                                                          target=lambda t, i=i: t.values[i])
        except (RuntimeError, ValueError):  # no param varies across the complete trials
            return []
        rows += [{"objective": metric, "param": p, "importance": round(v, 4)} for p, v in imp.items()]
    return rows


def duplicate(trial) -> bool:
    """A trial that took an earlier trial's values without a fit (the study file's `duplicates: reuse`)."""
    return trial.user_attrs.get("duplicate_of") is not None


def distinct_complete(trials) -> list:
    """The complete trials, each configuration once: what the importances and the Pareto plot weigh."""
    return [t for t in trials if t.state.name == "COMPLETE" and not duplicate(t)]


def pareto_trials(spec: StudySpec, study) -> list:
    """The Pareto front of the complete trials (Optuna's `best_trials`: feasible ones only when the study has
    constraints; a duplicate only through its twin), best first objective first."""
    signs = [1 if d == "maximize" else -1 for d in spec.directions]
    return sorted((t for t in study.best_trials if not duplicate(t)),
                  key=lambda t: [-s * v for s, v in zip(signs, t.values)])


def write_csv(path: Path, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols or ["trial"])
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def format_table(rows: list[dict], max_rows: int = 15) -> str:
    if not rows:
        return "(no complete trials yet)"
    cols = [k for k in rows[0] if k not in ("state", "retry_of", "note")]
    cells = [[("" if r.get(k) is None else f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r[k]))[:40]
              for k in cols] for r in rows[:max_rows]]
    cols = [c if c != "mlflow_run_id" else "mlflow run" for c in cols]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more in pareto.csv")
    return "\n".join(lines)


def confirmed_baseline(out: Path) -> tuple[float, float, int] | None:
    """The unmitigated model's prefix (mean, worst, learned seeds) from `confirm=k`'s table (<reports>/confirm/
    decisive.csv), None before it exists or when its baseline learned in no seed."""
    import math

    from phasefix.tables import has_table, read_table
    from phasefix.verdict import BASELINE_ARM

    if not has_table(out / "confirm"):
        return None
    row = next((r for r in read_table(out / "confirm") if r["arm"] == BASELINE_ARM and r["padding"] == "prefix"),
               None)
    if row is None or not row["learned"]:
        return None
    return None if math.isnan(row["acc_mean"]) else (row["acc_mean"], row["acc_worst"], row["learned"])


def report_study(spec: StudySpec, study, url: str, log_to_mlflow: bool = True, quiet: bool = False) -> dict:
    """Write pareto.csv, trials.csv and pareto.png under the reports dir, log them to the parent run, print the
    best trade-offs. Returns {'pareto': rows, 'dir': path, 'counts': ..., 'parent_run_id': ...}."""
    trials = study.get_trials(deepcopy=False)
    front = pareto_trials(spec, study)
    out = spec.reports()
    out.mkdir(parents=True, exist_ok=True)
    front_rows = trial_rows(spec, study, front)
    write_csv(out / "pareto.csv", front_rows)
    write_csv(out / "trials.csv", trial_rows(spec, study, trials))
    imp = importances(spec, study)
    if imp:
        write_csv(out / "importances.csv", imp)
    from phasefix import plots

    plots.save(plots.study_pareto(spec, distinct_complete(trials), front,
                                  baseline=confirmed_baseline(out)), out / "pareto.png")
    n = counts(study)
    if log_to_mlflow:
        best = {m: (max if d == "maximize" else min)(r[m] for r in front_rows)
                for m, d in zip(spec.metric_names, spec.directions) if front_rows}
        mlflow_runs.log_report(study, [out / "pareto.png", out / "pareto.csv", out / "trials.csv",
                                *([out / "importances.csv"] if imp else [])], n, best)
    parent = study.user_attrs.get(mlflow_runs.PARENT_ATTR)
    if not quiet:
        twins = sum(duplicate(t) for t in trials if t.state.name in ("COMPLETE", "PRUNED"))
        print(f"\nstudy {spec.name} ({mlflow_runs.redact(url)}): {n['COMPLETE']} complete and {n['PRUNED']} pruned "
              f"({twins} of these took an earlier trial's result: the same params, not trained), {n['FAIL']} failed, "
              f"{n['RUNNING']} running, {n['WAITING']} waiting; MLflow parent run {parent}")
        print(f"Pareto front ({len(front)} trials, best {spec.metric_names[0]} first):")
        print(format_table(front_rows))
        for metric in spec.metric_names:
            top = [f"{r['param']} {r['importance']:.2f}" for r in imp if r["objective"] == metric]
            if top:
                print(f"parameter importance for {metric}: {', '.join(top)}")
        print(f"reports: {out}/pareto.csv, pareto.png, trials.csv{', importances.csv' if imp else ''}")
    return {"pareto": front_rows, "dir": out, "counts": n, "parent_run_id": parent, "importances": imp}
