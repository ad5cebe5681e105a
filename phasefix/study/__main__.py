"""`python -m phasefix.study spec=studies/<name>.yaml [n_trials=N] [storage=URL] [workers=K] [report=true]
[import_trials=studies/reports/<name>/trials.csv]`

Multi-objective Optuna studies over `phasefix.fit` (default: maximise prefix-padding `acc_mean` and `acc_worst`).
The study file names the base overrides, the search space, the objectives, the sampler, the trial budget,
constraints and pruning rules; every trial's config is built with the Hydra compose API (`phasefix.fit.compose`).

Storage: an Optuna RDB storage with heartbeats (a trial whose worker died is failed after `grace_period` seconds and
retried): `sqlite:///<study file dir>/<name>.db` by default, `postgresql://...` for workers on many machines.
Rerunning the command resumes the study; `n_trials` is the total budget (finished trials, earlier runs included).
MLflow: one parent run per study, one child run per trial. Reports (Pareto CSV and PNG) go to
`<study file dir>/reports/<name>/` and to the parent run. Details and commands: docs/studies.md.

A Hydra app (conf/study.yaml over `StudyCliConfig`); the earlier form `python -m phasefix.study studies/x.yaml
--workers 2 [--n-trials N] [--storage URL] [--report]` still works (`shim`).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from phasefix.errors import check


@dataclass
class StudyCliConfig:
    spec: str | None = None  # the study file, e.g. studies/mean_vs_worst.yaml
    n_trials: int | None = None  # total trial budget (default: the file's n_trials)
    storage: str | None = None  # Optuna RDB URL (default sqlite:///<study dir>/<name>.db)
    workers: int = 1  # worker processes on this machine
    report: bool = False  # only write and print the Pareto report
    import_trials: str | None = None  # a trials.csv whose finished trials start the study on a new storage
    confirm: int = 0  # k > 0: re-run the k best trials and the unmitigated model on fresh seeds (no new trials)
    dashboard: int = 0  # a port: serve optuna-dashboard for the study on 127.0.0.1 (no new trials)
    only: list[str] = field(default_factory=list)  # comparisons: only these cells (REGIME or REGIME/ARM)
    verbose: bool = False


ConfigStore.instance().store(name="study_schema", node=StudyCliConfig)

FLAGS = {"--workers": "workers", "--n-trials": "n_trials", "--storage": "storage", "--import-trials": "import_trials"}


def shim(argv: Sequence[str]) -> list[str]:
    """The earlier argparse forms as overrides: a leading path -> `spec=PATH` (also `study=PATH`), `--workers K`,
    `--n-trials N`, `--storage URL` (also with `=`) -> `workers=K`, ..., `--report` -> `report=true`."""
    from phasefix.cli import quoted

    out, args = [], list(argv)
    while args:
        a = args.pop(0)
        flag, eq, value = a.partition("=")
        if flag in FLAGS:
            if not eq:
                check(bool(args), flag, None, "needs a value")
                value = args.pop(0)
            out.append(f"{FLAGS[flag]}={quoted(value) if flag in ('--storage', '--import-trials') else value}")
        elif a == "--report":
            out.append("report=true")
        elif flag in ("spec", "study") and eq:
            out.append(f"spec={quoted(value)}")
        elif flag == "only" and eq and not value.startswith("["):  # only=a,b/c -> a list
            out.append("only=[" + ",".join(quoted(v.strip()) for v in value.split(",") if v.strip()) + "]")
        elif not eq and not a.startswith("-"):  # the study file, as argparse took it
            out.append(f"spec={quoted(a)}")
        else:
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The exit code: 0 done, 2 a bad study file or option (one line on stderr), 3 too many failed trials,
    4 timeout, 130 interrupted; a worker's own code when the study did not reach its budget."""
    from phasefix.cli import run
    from phasefix.study.runner import run_study

    def work(cfg) -> int:
        check(cfg.spec is not None, "spec", None, "must name the study file, e.g. spec=studies/mean_vs_worst.yaml")
        check(cfg.confirm >= 0, "confirm", cfg.confirm, "must be >= 0 (the number of best trials to re-run)")
        if cfg.dashboard:
            from phasefix.study.runner import serve_dashboard

            return serve_dashboard(cfg.spec, cfg.dashboard, cfg.storage, import_from=cfg.import_trials)
        if cfg.confirm:
            from phasefix.study.confirm import run_confirm

            return run_confirm(cfg.spec, cfg.confirm, cfg.storage, cfg.workers, import_from=cfg.import_trials)["rc"]
        from phasefix.study.cells import is_comparison

        if is_comparison(cfg.spec):  # comparisons/<name>.yaml: regimes x arms x seeds, the missing cells only
            from phasefix.study.grid import run_comparison

            return run_comparison(cfg.spec, cfg.workers, only=list(cfg.only), report_only=cfg.report)["rc"]
        check(not cfg.only, "only", ",".join(cfg.only), "narrows a comparison file (comparisons/<name>.yaml)")
        return run_study(cfg.spec, cfg.n_trials, cfg.storage, cfg.workers, cfg.report,
                         import_from=cfg.import_trials)["rc"]

    return run("study", argv, work, shim)


if __name__ == "__main__":
    sys.exit(main())
