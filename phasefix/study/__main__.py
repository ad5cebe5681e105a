"""`python -m phasefix.study studies/<name>.yaml [--n-trials N] [--storage URL] [--workers K] [--report]`

Multi-objective Optuna studies over `phasefix.fit` (default: maximise prefix-padding `acc_mean` and `acc_worst`).
The study file names the base overrides, the search space, the objectives, the sampler, the trial budget,
constraints and pruning rules; every trial's config is built with the Hydra compose API (`phasefix.fit.compose`).

Storage: an Optuna RDB storage with heartbeats (a trial whose worker died is failed after `grace_period` seconds and
retried): `sqlite:///<study file dir>/<name>.db` by default, `postgresql://...` for workers on many machines.
Rerunning the command resumes the study; `--n-trials` is the total budget (finished trials, earlier runs included).
MLflow: one parent run per study, one child run per trial. Reports (Pareto CSV and PNG) go to
`<study file dir>/reports/<name>/` and to the parent run. Details and commands: docs/studies.md.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from phasefix.errors import ConfigError
from phasefix.study.runner import run_study


def main(argv: Sequence[str] | None = None) -> int:
    """The exit code: 0 done, 2 a bad study file or option (one line on stderr), 3 too many failed trials,
    4 timeout, 130 interrupted; a worker's own code when the study did not reach its budget."""
    ap = argparse.ArgumentParser(prog="python -m phasefix.study", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="study file, e.g. studies/mean_vs_worst.yaml")
    ap.add_argument("--n-trials", type=int, default=None, help="total trial budget (overrides n_trials)")
    ap.add_argument("--storage", default=None,
                    help="Optuna RDB URL (default sqlite:///<study dir>/<name>.db); postgresql://... for many machines")
    ap.add_argument("--workers", type=int, default=1, help="worker processes on this machine")
    ap.add_argument("--report", action="store_true", help="only write and print the Pareto report")
    args = ap.parse_args(argv)
    try:
        return run_study(args.study, args.n_trials, args.storage, args.workers, args.report)["rc"]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
