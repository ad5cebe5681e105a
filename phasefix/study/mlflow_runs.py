"""The study's MLflow runs: one parent run per study (created once, its id kept in the study's user attrs), and the
corrections to trial runs that `fit` cannot know about (pruned: KILLED; worker died: FAILED).

MLflow being down never stops a study: these print a warning instead of raising (except creating the parent)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from phasefix.study.search_space import Param
from phasefix.study.spec import StudySpec

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
            tracking.resume_run(c, run_id)
            return run_id
        except Exception:
            print(f"[study] parent MLflow run {run_id} not found in {uri}: creating a new one", file=sys.stderr)
    run_id = tracking.create_run(c, experiment_name(spec, cfg), f"study-{spec.name}", tags={
        "phasefix.kind": "study", "study": spec.name, "study.storage": redact(url), "study.file": str(spec.path),
        "objectives": ",".join(f"{o.direction[:3]}:{o.metric}" for o in spec.objectives),
        "mlflow.note.content": spec.description or f"Optuna study {spec.name}"})
    tracking.log_config(c, run_id, spec.path.read_text(), "study.yaml")
    tracking.log_params(c, run_id, {
        "n_trials": spec.n_trials, "sampler": spec.sampler["type"], "objectives": ",".join(spec.metric_names),
        "base": " ".join(spec.base)[:5000], **{f"space.{p.name}": _space(p) for p in spec.params}})
    study.set_user_attr(PARENT_ATTR, run_id)
    study.set_user_attr(URI_ATTR, uri)
    study.set_user_attr(EXPERIMENT_ATTR, experiment_name(spec, cfg))
    return run_id


def _space(p: Param) -> str:
    if p.type == "categorical":
        return f"{p.override or 'bundle'} in {p.choices}"
    return f"{p.override} {p.type} [{p.low}, {p.high}]{' log' if p.log else ''}"


def log_report(study, files, counts: dict[str, int], best: dict[str, float]) -> None:
    """The report on the parent run: the figure and CSV files under `pareto/`, the trial counts and the best value
    of each objective on the front as metrics."""
    parent = study.user_attrs.get(PARENT_ATTR)
    if not parent:
        return
    try:
        from phasefix import tracking

        c = _client(study)
        tracking.log_files(c, parent, files, "pareto")
        tracking.log_metric_values(c, parent, {
            **{f"study/{k.lower()}": counts[k] for k in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")},
            **{f"pareto/{m}": v for m, v in best.items()}})
    except Exception as e:
        print(f"[study] could not log the report to MLflow run {parent}: {e}", file=sys.stderr)


def finish_parent(study, complete: bool) -> None:
    parent = study.user_attrs.get(PARENT_ATTR)
    if not parent:
        return
    try:
        from phasefix import tracking

        tracking.end_run(_client(study), parent, "FINISHED" if complete else "KILLED")
    except Exception as e:
        print(f"[study] could not end MLflow run {parent}: {e}", file=sys.stderr)


def mark_pruned(trial, msg: str) -> None:
    """fit() ends its MLflow run FAILED when the pruner raises; a pruned trial's run is KILLED, tagged pruned."""
    run_id = trial.user_attrs.get("mlflow_run_id")
    if not run_id:
        return
    try:
        from phasefix import tracking

        tracking.end_run(_client(trial.study), run_id, "KILLED", {"optuna.state": "PRUNED", "optuna.pruned": msg})
    except Exception as e:
        print(f"[study] could not tag MLflow run {run_id} as pruned: {e}", file=sys.stderr)


def mark_lost(study, trial) -> None:
    """A trial whose worker died: its MLflow run (if training had started) ends FAILED."""
    run_id = trial.user_attrs.get("mlflow_run_id")
    if not run_id:
        return
    try:
        from phasefix import tracking

        tracking.end_run(_client(study), run_id, "FAILED", {"optuna.state": "FAIL (worker died)"})
    except Exception as e:  # MLflow down must not stop the study
        print(f"[study] could not mark MLflow run {run_id} failed: {e}", file=sys.stderr)


def retag_resumed(trial, run_dir: Path, retry_of: int) -> None:
    """A run a retry continues: tagged with the retry's trial number (and the trial it was started by)."""
    from phasefix import tracking
    from phasefix.fit_run import Run

    run = Run.open(str(run_dir), key="resume")  # run.json: its MLflow run and store
    try:
        tracking.set_tags(tracking.client(run.tracking_uri), run.run_id, {"trial": trial.number, "retry_of": retry_of})
    except Exception as e:  # MLflow down must not stop the study
        print(f"[study] could not tag MLflow run {run.run_id}: {e}", file=sys.stderr)
