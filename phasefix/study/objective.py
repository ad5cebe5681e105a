"""One trial: the search space as overrides (`suggest`), the objective that runs `phasefix.fit.fit` on them, and the
Lightning callback that prunes (multi-objective studies have no `trial.report`/`should_prune`)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from phasefix.errors import check
from phasefix.fit_run import checkpoint_path
from phasefix.study import mlflow_runs
from phasefix.study.spec import PruneRule, StudySpec, logged_name, sampled_params

FitFn = Callable[..., dict]  # (cfg, callbacks) -> summary, like phasefix.fit.fit
# what a trial keeps as its user attr `metrics` (the objectives too), by their logged names
TRIAL_METRICS = ("final/prefix/acc_mean", "final/prefix/acc_worst", "final/prefix/acc_gap",
                 "final/in_sequence/acc_mean", "final/in_sequence/acc_worst", "final/in_sequence/acc_gap",
                 "final/lm_loss", "train_seconds")


def suggest(trial, spec: StudySpec) -> list[str]:
    """Sample this trial's params (define-by-run: a mitigation's weights only when it is enabled); the overrides."""
    def choose(p):
        if p.type == "categorical":
            return trial.suggest_categorical(p.name, p.choices)
        if p.type == "int":
            return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        return trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)

    return [o for p, v in sampled_params(spec, choose) for o in p.overrides(v)]


def metric_value(summary: dict, metric: str):
    """A metric of the fit summary by its logged name: `final/prefix/acc_worst` -> summary['prefix']['acc_worst'],
    `final/lm_loss` -> summary['lm_loss'], other names are summary keys (dotted: nested); None when absent."""
    metric = logged_name(metric)
    path = metric.split("/")[1:] if metric.startswith("final/") else metric.split(".")
    v: Any = summary
    for part in path:
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def pruning_callback(trial, rules: Sequence[PruneRule], history: Sequence[dict] = ()):
    """A Lightning callback: records each validation in the trial (user attr `val_history`) and raises
    `optuna.TrialPruned` when a rule's metric misses its bound at the first validation at or after its step.
    Multi-objective studies cannot use `trial.report`/`should_prune`, so this is the study's pruner.
    `history`: the validations of the run this one resumes; a rule they reached was passed there and is not checked
    again."""
    import optuna
    from lightning.pytorch.callbacks import Callback

    class StudyPruner(Callback):
        def __init__(self):
            last = max((h["step"] for h in history), default=-1)
            self.done: set[int] = {i for i, r in enumerate(rules) if r.step <= last}
            self.history: list[dict] = list(history)

        def on_train_start(self, trainer, pl_module):
            run_id = getattr(trainer.logger, "run_id", None)
            if run_id:
                trial.set_user_attr("mlflow_run_id", run_id)

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            step = int(trainer.global_step)
            vals = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
            self.history.append({"step": step, **{k[4:]: round(v, 4) for k, v in vals.items()
                                                  if k.count("/") == 2}})
            trial.set_user_attr("val_history", self.history)
            for i, r in enumerate(rules):
                if i in self.done or step < r.step or r.metric not in vals:
                    continue
                self.done.add(i)
                v = vals[r.metric]
                if (r.min is not None and v < r.min) or (r.max is not None and v > r.max):
                    bound = f"< {r.min}" if r.min is not None else f"> {r.max}"
                    raise optuna.TrialPruned(f"{r.metric}={v:.4f} {bound} at step {step}")

    return StudyPruner()


def earlier_twin(trial):
    """The first finished (complete or pruned) trial with exactly this trial's params, or None. A fit is
    deterministic at a seed (Lightning's deterministic mode, one thread count per study), so training the same
    config again would repeat its numbers at the cost of a fit; TPE proposes such repeats once the front is found."""
    from optuna.trial import TrialState

    return next((t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                 if t.number != trial.number and t.params == trial.params), None)


def reuse_twin(trial, twin, spec: StudySpec):
    """This trial ends as its twin did, without a fit: the twin's values, metrics, constraints and MLflow run (a
    complete twin), or pruned with its reason; user attr `duplicate_of` names the twin (trials.csv's note)."""
    trial.set_user_attr("duplicate_of", twin.number)
    if twin.state.name == "PRUNED":  # before the twin's MLflow run is copied: ending this trial must not touch it
        end_pruned(trial, spec, f"as trial {twin.number}: {twin.user_attrs.get('pruned') or 'pruned'}")
    for k in ("metrics", "seed_metrics", "mlflow_run_id"):
        if twin.user_attrs.get(k) is not None:
            trial.set_user_attr(k, twin.user_attrs[k])
    if twin.user_attrs.get("constraints") is not None:
        set_constraints(trial, spec, twin.user_attrs["constraints"])
    print(f"[study] trial {trial.number}: the same params as trial {twin.number}: its values, no new fit", flush=True)
    return list(twin.values)


def set_constraints(trial, spec: StudySpec, values: list[float]) -> None:
    """The constraint values (<= 0 feasible) to the samplers and as user attr `constraints` (trials.csv's
    `feasible`)."""
    for c, v in zip(spec.constraints, values):
        trial.set_constraint(c.key, v)
    trial.set_user_attr("constraints", values)


def end_pruned(trial, spec: StudySpec, msg: str, where: str = ""):
    """Ends the trial pruned: infeasible for the samplers (no final metrics), the reason as user attr `pruned`, its
    MLflow run (if one started) KILLED."""
    import optuna

    for c in spec.constraints:
        trial.set_constraint(c.key, 1.0)
    trial.set_user_attr("pruned", msg)
    mlflow_runs.mark_pruned(trial, msg)
    print(f"[study] trial {trial.number} pruned{where}: {msg}", flush=True)
    raise optuna.TrialPruned(msg)


def make_objective(spec: StudySpec, parent_run_id: str | None, threads: int | None = None,
                   fit_fn: FitFn | None = None):
    """The Optuna objective: suggest, compose, fit (`fit_fn`, default `phasefix.fit.fit`), return the objectives.
    Errors are recorded as the trial's user attr `error`; constraints go to `Trial.set_constraint`."""
    import optuna

    def objective(trial):
        try:
            return run_trial(trial, spec, parent_run_id, threads, fit_fn)
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt as e:  # Ctrl-C: the next run of the study retries it from its checkpoints
            trial.set_user_attr("interrupted", (str(e).splitlines() or ["interrupted"])[0][:500])
            raise
        except Exception as e:  # every error is recorded, so that max_failures can stop a broken study
            if not trial.user_attrs.get("error"):
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
                trial.set_user_attr("error", msg)
            print(f"[study] trial {trial.number} failed: {trial.user_attrs['error']}", flush=True)
            raise

    return objective


def run_trial(trial, spec: StudySpec, parent_run_id: str | None, threads: int | None, fit_fn: FitFn | None):
    """One trial: its overrides, a fit per seed (or its twin's values), the objectives it returns to Optuna."""
    for k in ("error", "pruned", "val_history", "mlflow_run_id", "constraints", "metrics",
              "seed_metrics", "run_dirs", "interrupted", "duplicate_of"):  # a retry's copy
        if k in trial.user_attrs:
            trial.set_user_attr(k, None)
    ovs = suggest(trial, spec)
    trial.set_user_attr("overrides", ovs)
    twin = earlier_twin(trial) if spec.duplicates == "reuse" else None
    if twin is not None:
        return reuse_twin(trial, twin, spec)
    summaries = fit_seeds(trial, spec, ovs, trial_tags(trial, spec, ovs, parent_run_id, threads), fit_fn)
    return record_results(trial, spec, summaries)


def trial_tags(trial, spec: StudySpec, ovs: list[str], parent_run_id: str | None, threads: int | None) -> list[str]:
    """The overrides every run of the trial adds: its study and trial tags, the parent MLflow run and experiment,
    the thread count (unless the study or the trial sets one)."""
    extra = [f"+logger.tags.study='{spec.name}'", f"+logger.tags.trial='{trial.number}'"]
    if parent_run_id:
        extra.append(f"logger.parent_run_id='{parent_run_id}'")
    exp = trial.study.user_attrs.get("mlflow_experiment")  # the parent run's experiment
    if exp:
        extra.append(f"logger.experiment_name='{exp}'")
    if threads and not any(o.startswith("trainer.num_threads=") for o in spec.base + ovs):
        extra.append(f"trainer.num_threads={threads}")
    return extra


def prior_attempt(trial):
    """(the trial this one retries or None, its latest attempt or None, that attempt's run directories by seed).
    A retry of a trial that was interrupted or whose worker died continues the runs of the latest attempt
    (retry_history's last) from their last checkpoints."""
    system = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    retried = system.get("failed_trial")
    latest = (system.get("retry_history") or [retried])[-1]
    prior = None if latest is None else trial.study.get_trials(deepcopy=False)[latest]  # numbers are 0, 1, ...
    prior_dirs = {k: Path(v) for k, v in (prior.user_attrs.get("run_dirs") or {}).items()} if prior else {}
    return retried, prior, prior_dirs


def trial_dir(parent: Path, stem: str) -> Path:
    """A new folder `parent/stem`, or `stem-1`, `stem-2`, ... where it exists: two studies that share an outputs
    folder (a comparison's slices, run side by side) can start their trial N in the same second, and two runs in one
    folder would write over each other's checkpoints. mkdir is atomic, so the first to take a name keeps it."""
    for i in range(1000):
        path = parent / (stem if i == 0 else f"{stem}-{i}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent / stem}: 1000 folders of that name already")


def fit_seeds(trial, spec: StudySpec, ovs: list[str], extra: list[str], fit_fn: FitFn | None) -> list[dict]:
    """The trial's fits, one per seed in turn (a seed that is pruned prunes the trial); their summaries."""
    import optuna

    from phasefix import tracking
    from phasefix.fit import compose

    retried, prior, prior_dirs = prior_attempt(trial)
    out_dir = trial_dir(spec.outputs(), f"trial{trial.number:04d}-{datetime.now():%Y%m%d-%H%M%S}")
    print(f"[study] trial {trial.number}{f' (retry of {retried})' if retried is not None else ''}: "
          f"{' '.join(ovs) or '(base)'}{f' on seeds {spec.seeds}' if spec.seeds else ''}", flush=True)
    summaries, dirs = [], {}
    for seed in spec.seeds or [None]:
        run_dir, history = out_dir if seed is None else out_dir / f"s{seed}", []
        # a comparison's cell (grid sampler) keeps the name its regime and arm give it (<regime>-<arm>-s<seed>)
        named = [] if spec.sampler.get("type") == "grid" else [f"run_name='{spec.name}-t{trial.number}'"]
        one = ([f"output_dir='{run_dir}'", *named] if seed is None else
               [f"output_dir='{run_dir}'", f"run_name='{spec.name}-t{trial.number}-s{seed}'", f"seed={seed}"])
        overrides = list(spec.base) + ovs + extra + one
        overrides.append(tracking.command_override(overrides))  # the table row names how to redo the run
        before = prior_dirs.get(str(seed))
        if before is not None and checkpoint_path(before).exists():
            # the run's identity (overrides, tags, parent) is in its stored config: only the threads may change
            run_dir = before
            overrides = [f"resume='{run_dir}'", *[o for o in extra if o.startswith("trainer.num_threads=")]]
            history = list(prior.user_attrs.get("val_history") or [])  # the last seed it trained: this one
            mlflow_runs.retag_resumed(trial, run_dir, prior.number)
            print(f"[study] trial {trial.number}: continuing {run_dir} from its last checkpoint", flush=True)
        dirs[str(seed)] = str(run_dir)
        trial.set_user_attr("run_dirs", dirs)  # where a retry of this trial finds its runs
        try:
            cfg = compose(overrides)
            # the callback also records the MLflow run id at the start (a dead worker's run is then ended
            # FAILED) and the validation history; an injected fit (tests) without pruning rules gets none
            use_cb = spec.pruning or fit_fn is None
            summaries.append((fit_fn or _real_fit())(
                cfg, callbacks=[pruning_callback(trial, spec.pruning, history)] if use_cb else []))
        except optuna.TrialPruned as e:
            end_pruned(trial, spec, str(e), "" if seed is None else f" at seed {seed}")
    return summaries


def record_results(trial, spec: StudySpec, summaries: list[dict]) -> list[float]:
    """The seeds' summaries into the trial: its MLflow runs, metrics (mean over seeds, and each seed's),
    constraints; the objective values (an objective missing from the summary is the trial's error)."""
    run_ids = [s["mlflow_run_id"] for s in summaries if s.get("mlflow_run_id")]
    if run_ids:
        trial.set_user_attr("mlflow_run_id", ",".join(run_ids))
    names = list(dict.fromkeys([*TRIAL_METRICS, *(o.metric for o in spec.objectives),
                                *(c.metric for c in spec.constraints)]))
    per_seed = [{k: metric_value(s, k) for k in names} for s in summaries]
    summary = {k: _mean([m[k] for m in per_seed]) for k in names}  # by logged name
    if spec.seeds:
        trial.set_user_attr("seed_metrics", {str(seed): {k: v for k, v in m.items() if v is not None}
                                             for seed, m in zip(spec.seeds, per_seed)})
    metrics = {k: summary[k] for k in TRIAL_METRICS}
    metrics.update({o.metric: summary[o.metric] for o in spec.objectives})
    trial.set_user_attr("metrics", {k: v for k, v in metrics.items() if v is not None})
    if spec.constraints:
        cons = []
        for c in spec.constraints:
            v = summary[c.metric]
            if v is None:
                check(c.missing == "ignore", "constraints.metric", c.metric,
                      "is not in the fit summary (set missing: ignore to treat it as satisfied)")
            cons.append(0.0 if v is None else c.value(float(v)))
        set_constraints(trial, spec, cons)
    values = []
    for o in spec.objectives:
        v = summary[o.metric]
        if not isinstance(v, (int, float)) or math.isnan(float(v)):
            msg = f"objective {o.metric} is {v!r} in the fit summary"
            trial.set_user_attr("error", msg)
            raise ValueError(msg)
        values.append(float(v))
    return values


def _mean(values: list):
    """The mean over seeds of one metric; None when a seed lacks it (a non-number is kept when there is one seed)."""
    if any(v is None for v in values):
        return None
    if len(values) == 1:
        return values[0]
    if not all(isinstance(v, (int, float)) for v in values):
        return None
    return sum(float(v) for v in values) / len(values)


def _real_fit() -> FitFn:
    from phasefix.fit import fit

    return fit
