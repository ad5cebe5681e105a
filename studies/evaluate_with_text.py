"""Re-evaluate a comparison's LM-mix runs on prompts with held-out text before the records (as in their training),
then write the report of those evaluations.

    python studies/evaluate_with_text.py TAG OUT_DIR      e.g.  lm_v2 docs/figures/lm_mix_text

Every FINISHED fit run tagged comparison=TAG is scored by `phasefix.evaluate model=<run> task=kv_lookup
seed=<the run's eval.seed>` (the prompts of its final evaluation, here with held-out text after BOS), named
`text-<run name>`;
the report (`phasefix.report runs=...`) groups them by configuration over seeds. The same command with text=false
reproduces a run's own final metrics exactly (checked on lm_mix_w4s4-baseline-s0: 0.817 / 0.864).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, also when not pip-installed
from phasefix import tracking
from phasefix.evaluate import evaluate
from phasefix.report import report


def main(tag: str, out: str) -> None:
    c = tracking.client()
    runs = [r for r in tracking.select_runs(c, tags={"comparison": tag}, kinds=("fit",))
            if r.info.status == "FINISHED"]
    ids = []
    for run in runs:
        summary = evaluate({"model": run.info.run_id, "task": "kv_lookup", "progress": False,
                            "seed": int(run.data.params["eval.seed"]), "run_name": f"text-{run.info.run_name}"})
        ids.append(summary["mlflow_run_id"])
        print(run.info.run_name, {p: summary[p]["acc_mean"] for p in ("prefix", "in_sequence")}, flush=True)
    report({"runs": ids, "out": out})


if __name__ == "__main__":
    main(*sys.argv[1:3])
