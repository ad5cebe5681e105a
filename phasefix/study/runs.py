"""The study's MLflow runs: one parent run per study (created once, its id kept in the study's user attrs), and the
corrections to trial runs that `fit` cannot know about (pruned: KILLED; worker died: FAILED).

MLflow being down never stops a study: these print a warning instead of raising (except creating the parent)."""
from __future__ import annotations

import re
import sys
import time

from phasefix.study.spec import Param, StudySpec

PARENT_ATTR = "mlflow_parent_run_id"  # the study's user attrs that locate the parent run
URI_ATTR = "mlflow_tracking_uri"
EXPERIMENT_ATTR = "mlflow_experiment"


def redact(url: str) -> str:
    """A storage URL with its password masked."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def _client(study):
    from phasefix import tracking

    return tracking.client(study.user_attrs.get(URI_ATTR))


def experiment_name(spec: StudySpec, cfg) -> str:
    if spec.experiment_name:
        return spec.experiment_name
    if any(o.startswith("logger.experiment_name=") for o in spec.base):
        return cfg.logger.experiment_name
    return f"study-{spec.name}"


def ensure_parent_run(spec: StudySpec, study, url: str) -> str:
    """The study's MLflow parent run (created once, its id kept as the study's user attr), set RUNNING."""
    from phasefix import tracking
    from phasefix.fit import compose

    cfg = compose(spec.base)
    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    c = tracking.client(uri)
    run_id = study.user_attrs.get(PARENT_ATTR)
    if run_id:
        try:
            c.update_run(run_id, status="RUNNING")
            return run_id
        except Exception:
            print(f"[study] parent MLflow run {run_id} not found in {uri}: creating a new one", file=sys.stderr)
    exp_id = tracking.get_or_create_experiment(c, experiment_name(spec, cfg))
    run = c.create_run(exp_id, run_name=f"study-{spec.name}", tags={
        "phasefix.kind": "study", "study": spec.name, "study.storage": redact(url),
        "study.file": str(spec.path), "git_commit": tracking.git_commit(),
        "objectives": ",".join(f"{o.direction[:3]}:{o.metric}" for o in spec.objectives),
        "mlflow.note.content": spec.description or f"Optuna study {spec.name}"})
    c.log_text(run.info.run_id, spec.path.read_text(), "study.yaml")
    c.log_batch(run.info.run_id, params=_params([
        ("n_trials", spec.n_trials), ("sampler", spec.sampler["type"]),
        ("objectives", ",".join(spec.metric_names)), ("base", " ".join(spec.base)[:5000]),
        *((f"space.{p.name}", _space(p)) for p in spec.params)]))
    study.set_user_attr(PARENT_ATTR, run.info.run_id)
    study.set_user_attr(URI_ATTR, uri)
    study.set_user_attr(EXPERIMENT_ATTR, experiment_name(spec, cfg))
    return run.info.run_id


def _params(items):
    from mlflow.entities import Param as MParam

    return [MParam(k, str(v)[:6000]) for k, v in items]


def _space(p: Param) -> str:
    if p.type == "categorical":
        return f"{p.override or 'bundle'} in {p.choices}"
    return f"{p.override} {p.type} [{p.low}, {p.high}]{' log' if p.log else ''}"


def log_report(study, files, counts: dict[str, int], best: dict[str, float], fig) -> None:
    """The report on the parent run: the figure and CSV files under `pareto/`, the trial counts and the best value
    of each objective on the front as metrics."""
    parent = study.user_attrs.get(PARENT_ATTR)
    if not parent:
        return
    try:
        from mlflow.entities import Metric

        from phasefix import tracking

        c = _client(study)
        tracking.log_figure(c, parent, fig, "pareto/pareto.png")
        for path in files:
            c.log_artifact(parent, str(path), "pareto")
        ts = int(time.time() * 1000)
        c.log_batch(parent, metrics=[Metric(f"study/{k.lower()}", float(counts[k]), ts, 0)
                                     for k in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")]
                    + [Metric(f"pareto/{m}", float(v), ts, 0) for m, v in best.items()])
    except Exception as e:
        print(f"[study] could not log the report to MLflow run {parent}: {e}", file=sys.stderr)


def finish_parent(study, complete: bool) -> None:
    parent = study.user_attrs.get(PARENT_ATTR)
    if not parent:
        return
    try:
        _client(study).set_terminated(parent, status="FINISHED" if complete else "KILLED")
    except Exception as e:
        print(f"[study] could not end MLflow run {parent}: {e}", file=sys.stderr)


def mark_pruned(trial, msg: str) -> None:
    """fit() ends its MLflow run FAILED when the pruner raises; a pruned trial's run is KILLED, tagged pruned."""
    run_id = trial.user_attrs.get("mlflow_run_id")
    if not run_id:
        return
    try:
        c = _client(trial.study)
        c.set_tag(run_id, "optuna.state", "PRUNED")
        c.set_tag(run_id, "optuna.pruned", msg)
        c.set_terminated(run_id, status="KILLED")
    except Exception as e:
        print(f"[study] could not tag MLflow run {run_id} as pruned: {e}", file=sys.stderr)


def mark_lost(study, trial) -> None:
    """A trial whose worker died: its MLflow run (if training had started) ends FAILED."""
    run_id = trial.user_attrs.get("mlflow_run_id")
    if not run_id:
        return
    try:
        c = _client(study)
        c.set_tag(run_id, "optuna.state", "FAIL (worker died)")
        c.set_terminated(run_id, status="FAILED")
    except Exception as e:  # MLflow down must not stop the study
        print(f"[study] could not mark MLflow run {run_id} failed: {e}", file=sys.stderr)
