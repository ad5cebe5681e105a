"""Multi-objective Optuna studies over `phasefix.fit` (default: maximise prefix-padding `acc_mean` and `acc_worst`).

`python -m phasefix.study spec=studies/<name>.yaml [n_trials=N] [storage=URL] [workers=K] [report=true]`; details and
commands in docs/studies.md. The modules, in the order a study uses them:

- `spec`: the study file as typed dataclasses (parsing; validation against the fit config, before any trial);
- `search_space`: its params (parsed, their overrides and the mitigations they enable);
- `objective`: the search space as overrides, the objective calling `phasefix.fit.fit`, the pruning callback;
- `runner`: the RDB storage with heartbeats and retries, the sampler, the budget loop, worker processes, `run_study`;
- `pareto`: the study's report: the Pareto front (Optuna's `best_trials`), trials.csv (and its import), parameter
  importances, pareto.png (`report_study`);
- `mlflow_runs`: the study's MLflow parent run and the corrections to trial runs;
- `confirm`: the best trials re-run on fresh seeds beside the unmitigated model (`confirm=k`);
- `__main__`: the command line.
"""
from phasefix.study.objective import make_objective, metric_value, pruning_callback, suggest
from phasefix.study.mlflow_runs import PARENT_ATTR
from phasefix.study.pareto import counts, pareto_trials, report_study
from phasefix.study.runner import load_study, make_storage, open_study, run_study, run_worker
from phasefix.study.spec import StudySpec, load_spec, validate

__all__ = ["PARENT_ATTR", "StudySpec", "counts", "load_spec", "load_study", "make_objective", "make_storage",
           "metric_value", "open_study", "pareto_trials", "pruning_callback", "report_study", "run_study", "run_worker",
           "suggest", "validate"]
