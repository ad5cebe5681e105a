"""Running a comparison file (`phasefix.study.cells`): its cells as a study of one categorical param sampled by
Optuna's GridSampler (one trial per cell, through the study runner), the `then` stage, and its tables."""
from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from phasefix.errors import check
from phasefix.paths import OUTPUTS_DIR, PROJECT_ROOT
from phasefix.study.cells import Cell, Comparison, FitOrReuse, cells, load_comparison


def grid_spec(comp: Comparison, grid: list[Cell], stage: str = ""):
    """The cells as a study: one categorical param `cell` (name -> its overrides) sampled by Optuna's GridSampler,
    one trial per cell, the default objectives (prefix acc_mean and acc_worst)."""
    from phasefix.study.search_space import Param
    from phasefix.study.spec import Objective, StudySpec

    param = Param(name="cell", type="categorical", choices=[c.name for c in grid],
                  choice_overrides={c.name: c.overrides() for c in grid})
    base = list(comp.base) + [f"+logger.tags.comparison={comp.name}"]
    if comp.tracking_uri:
        base.append(f"logger.tracking_uri={comp.tracking_uri}")
    return StudySpec(name=comp.name + stage, path=comp.path, base=base, params=[param],
                     objectives=[Objective("final/prefix/acc_mean"), Objective("final/prefix/acc_worst")],
                     sampler={"type": "grid", "seed": 0}, n_trials=len(grid), storage=comp.storage_url(),
                     duplicates="rerun", output_dir=OUTPUTS_DIR / "comparisons" / comp.name,
                     reports_dir=comp.path.parent / "reports" / comp.name, experiment_name=comp.experiment_name)


def run_grid(comp: Comparison, grid: list[Cell], stage: str, workers: int, fit_fn) -> tuple[int, dict]:
    """Run the cells' study to its end; (exit code, {cell name: its trial's metrics})."""
    from phasefix.study import mlflow_runs
    from phasefix.study.runner import open_for_run, run_worker, spawn_workers
    from phasefix.study.pareto import counts

    spec = grid_spec(comp, grid, stage)
    url = spec.storage_url()
    study = open_for_run(spec, url)
    n = counts(study)
    print(f"[comparison] {spec.name}: {len(grid)} cells, {n['COMPLETE']} finished in {mlflow_runs.redact(url)}; "
          f"{workers} worker(s)", flush=True)
    rc = run_worker(spec, url, len(grid), fit_fn=fit_fn) if workers == 1 else \
        spawn_workers(spec, url, len(grid), workers, fit_fn=fit_fn)
    done = {}
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "COMPLETE":
            done[t.params["cell"]] = t.user_attrs.get("metrics") or {}
    mlflow_runs.finish_parent(study, len(done) == len(grid) and rc == 0)
    return rc, done


def qualifies(comp: Comparison, first: dict, cell_regime: str, arm: str) -> tuple[bool, str]:
    """Whether an arm goes on to the `then` seeds (`verdict.qualifies`, on the prefix means of its first seeds and
    the unmitigated arm's); (yes or no, why)."""
    from phasefix import verdict
    from phasefix.fit import compose

    r = next(x for x in comp.regimes if x.name == cell_regime)

    def means(a):
        return [first.get(Cell(r.name, a, s, r.steps).name, {}).get("final/prefix/acc_mean", math.nan)
                for s in r.seeds]
    return verdict.qualifies(arm, means(arm), means(verdict.BASELINE_ARM),
                             compose([f"regime={cell_regime}"]).data.num_values)


def narrow(comp: Comparison, only: list[str]) -> Comparison:
    """The slice of `comp` that `only` names (`REGIME` or `REGIME/ARM`; a regime's baseline stays, as the bar its
    arms are judged against): the same comparison (name, MLflow tag, storage) with fewer cells."""
    from phasefix.verdict import BASELINE_ARM

    arms = {r.name: r.arms for r in comp.regimes}
    for item in only:
        regime, _, arm = item.partition("/")
        check(regime in arms, "only", item, f"must be REGIME or REGIME/ARM, a regime of {comp.path.name}: "
              + ", ".join(arms))
        check(not arm or arm in arms[regime], "only", item, f"names no arm of {regime} in {comp.path.name}: "
              + ", ".join(arms[regime]))
    regimes = []
    for r in comp.regimes:
        picked = [a for a in r.arms if f"{r.name}/{a}" in only]
        kept = r.arms if r.name in only else [a for a in r.arms if a in picked or (picked and a == BASELINE_ARM)]
        if kept:
            regimes.append(replace(r, arms=kept))
    return replace(comp, regimes=regimes)


def run_comparison(path: str | Path, workers: int = 1, fit_fn=None, *, storage: str | None = None,
                   tracking_uri: str | None = None, out: str | Path | None = None, only: list[str] = (),
                   report_only: bool = False, evaluate_fn=None) -> dict:
    """Run every missing cell of a comparison file (then its `then` seeds, where they apply), re-score the cells
    scored on fewer prompts than its `per_residue` (`rescore`) and write its tables. `storage`, `tracking_uri`, `out`
    replace the file's; `only` runs a slice of it (`narrow`); `report_only` trains nothing (it still re-scores) and
    writes the tables of what is finished. Returns {'rc', 'cells', 'stopped': {(regime, arm): why}, 'rescored',
    'files'}."""
    comp = load_comparison(path)
    comp.storage = storage or comp.storage
    comp.tracking_uri = tracking_uri or comp.tracking_uri
    comp.out = Path(out) if out is not None else comp.out
    check(workers >= 1, "workers", workers, "must be >= 1")
    if report_only:
        rescored = rescore(comp, evaluate_fn)
        files, stopped = write_tables(comp, {})
        return {"rc": 0, "cells": 0, "stopped": stopped, "rescored": rescored, "files": files}
    run = narrow(comp, list(only)) if only else comp  # the cells this call trains; the tables are comp's
    stage = "-only-" + "+".join(sorted(only)).replace("/", ".") if only else ""  # a slice's grid: its own study
    from phasefix.fit import compose, plan_model

    grid = cells(run)
    for c in grid:  # every cell composes (and its mitigations fit its model) before anything trains
        plan_model(compose(c.overrides() + comp.base))
    reuse = FitOrReuse(str(comp.path), comp.tracking_uri, fit_fn)
    rc, first = run_grid(run, grid, stage, workers, reuse)
    stopped, later = {}, []
    if rc == 0 and run.staged:
        for r in run.regimes:
            for a in r.arms:
                ok, why = qualifies(run, first, r.name, a)
                if ok:
                    later += [Cell(r.name, a, s, r.steps) for s in (r.then or comp.then_seeds)]
                else:
                    stopped[(r.name, a)] = why
                    print(f"[comparison] {r.name}/{a}: stops at seeds {r.seeds} ({why})", flush=True)
        if later:
            rc, _ = run_grid(run, later, stage + "-then", workers, reuse)
    rescored = rescore(comp, evaluate_fn) if rc == 0 else 0
    files = write_tables(comp, stopped)[0] if rc == 0 else []
    return {"rc": rc, "cells": len(grid) + len(later), "stopped": stopped, "rescored": rescored, "files": files}


def rescore(comp: Comparison, evaluate_fn=None) -> int:
    """Score again, on the file's `per_residue` prompts per residue group, every FINISHED fit run of the comparison
    (tag comparison=<name>) scored on fewer and not re-scored on as many yet: `phasefix.evaluate` of its last
    checkpoint (same task, same evaluation seed), an evaluate run tagged comparison=<name> that the tables then take
    for that cell (run_scores.rescored_sources), so that every cell's worst residue rests on as many prompts. A run
    whose checkpoint is not on this machine keeps its scores (printed). Returns how many were re-scored."""
    from phasefix import tracking
    from phasefix.decisive import number, scored_prompts
    from phasefix.errors import ConfigError
    from phasefix.evaluate import evaluate

    if not comp.per_residue:
        return 0
    c = tracking.client(comp.tracking_uri)
    runs = comp.cell_runs(c)

    def kind(r) -> str | None:
        return r.data.tags.get("phasefix.kind")

    done = {r.data.tags.get("phasefix.source_run") for r in runs
            if kind(r) == "evaluate" and scored_prompts(r) >= comp.per_residue}
    todo = [r for r in runs if kind(r) == "fit" and r.info.status == "FINISHED" and r.info.run_id not in done
            and not scored_prompts(r) >= comp.per_residue]
    n = 0
    for r in todo:
        out = r.data.tags.get("output_dir")  # the re-scoring goes beside the run it measured, in its experiment
        args = {"model": r.info.run_id, "task": "kv_lookup", "per_residue": comp.per_residue, "progress": False,
                "run_name": f"{r.info.run_name}-pr{comp.per_residue}", "tags": {"comparison": comp.name},
                "experiment": c.get_experiment(r.info.experiment_id).name,
                **({"out": str(Path(out) / f"pr{comp.per_residue}")} if out else {}),
                **({"seed": int(number(r.data.params["eval.seed"]))} if "eval.seed" in r.data.params else {}),
                **({"tracking_uri": comp.tracking_uri} if comp.tracking_uri else {})}
        try:
            (evaluate_fn or evaluate)(args)
        except ConfigError as e:  # its checkpoint is on another machine
            print(f"[comparison] {r.info.run_name}: not re-scored, its own scores stand ({e})", flush=True)
            continue
        n += 1
        print(f"[comparison] {r.info.run_name}: re-scored on {comp.per_residue} prompts per residue", flush=True)
    return n


def join_folders(comp: Comparison, selected: set[str]) -> list[str]:
    """The committed folders a comparison's tables grow from: its regimes' `table:` folders and its own `out` (its
    tables so far), in that order; a folder is left out when its runs are all among the `selected` ones (this store
    has them) or when every (regime, arm) it holds came from a folder before it (a re-scoring of the same runs). Runs
    a later folder repeats (the comparison's own tables pool the others') are skipped by the join."""
    from phasefix.tables import DECISIVE_RUNS_CSV, has_table, read_members, read_table

    names = {r.name for r in comp.regimes}
    own = [Path(comp.out).resolve()] if comp.out else []
    folders = [p for p in dict.fromkeys((PROJECT_ROOT / f).resolve() for r in comp.regimes for f in r.tables)
               if p not in own] + own  # its own tables last: they repeat what the others hold
    chosen, seen = [], set()
    for path in folders:
        if not has_table(path):
            continue
        runs = [m for m in (read_members(path) if (path / DECISIVE_RUNS_CSV).is_file() else ())
                if m["regime"] in names]
        keys = {(r["regime"], r["arm"]) for r in read_table(path) if r["regime"] in names}
        if not keys or (runs and {m["run_id"] for m in runs} <= selected) or keys <= seen:
            continue
        chosen.append(os.path.relpath(path))  # as the tables name it: docs/figures/<name> from the repository
        seen |= keys
    return chosen


def write_tables(comp: Comparison, stopped: dict) -> tuple[list[str], dict]:
    """The comparison's tables: from the committed folders (`tables:`, as `report tables=`) when it names them, else
    from its runs in MLflow (tag comparison=<name>) joined with the committed folders of its regimes (`join_folders`:
    the regimes' unmitigated and reference runs, and the cells an earlier machine finished). Returns (the files
    written, the stopped arms written to stopped.md: `stopped` with those of the tables' cells run elsewhere)."""
    from phasefix import tracking
    from phasefix.report import report_runs, report_tables

    if comp.out is None:
        return [], {}
    if comp.tables:
        res = report_tables(comp.tables, comp.out)
    else:
        runs = comp.cell_runs(tracking.client(comp.tracking_uri))
        if not runs:
            print(f"[comparison] {comp.name}: no run of it in this store; its committed tables stand", flush=True)
            return [], {}
        folders = join_folders(comp, {r.info.run_id for r in runs})
        res = report_runs(runs=[r.info.run_id for r in runs],
                          join=folders, join_regimes=[r.name for r in comp.regimes] if folders else (),
                          tracking_uri=comp.tracking_uri, out=os.path.relpath(comp.out), log=False)  # rows name it
    stopped = {**stopped_in_tables(comp), **stopped}  # this run's and those of cells run elsewhere
    write_stopped(comp, stopped)
    return list(res["files"]), stopped


def write_stopped(comp: Comparison, stopped: dict) -> None:
    """<out>/stopped.md: the arms the staged rule stopped after their first seeds, and why (the results page
    quotes it); none left: no file (an older one would name arms that went on)."""
    if comp.out is None:
        return
    from phasefix.tables import STOPPED_MD

    path = comp.out / STOPPED_MD
    if not stopped:
        path.unlink(missing_ok=True)
        return
    lines = [f"| {r} | {a} | {why} |" for (r, a), why in sorted(stopped.items())]
    path.write_text("| regime | arm | stopped after its first seeds |\n|---|---|---|\n" + "\n".join(lines) + "\n")


def stopped_in_tables(comp: Comparison) -> dict:
    """The arms of the comparison's written tables (`out`, with its regimes' `table:` folders) that the staged rule
    stops (`qualifies`): those whose first seeds are all scored there, none of their `then` seeds is, and that do not
    qualify; nothing for a comparison without `then`. So cells run outside the study (by hand, or a slice on another
    machine) say why an arm has one seed."""
    from phasefix.study.cells import committed_runs
    from phasefix.tables import SCORES_CSV
    from phasefix.verdict import BASELINE_ARM

    if not comp.staged or comp.out is None or not (comp.out / SCORES_CSV).is_file():
        return {}
    runs = {run["run_id"]: run for run in committed_runs(comp.out)}
    for r in comp.regimes:  # the regimes' own folders: their unmitigated runs, the bar
        runs.update({run["run_id"]: run for t in r.tables for run in committed_runs(t) if run["regime"] == r.name})
    runs = list(runs.values())
    first, stopped = {}, {}
    for run in runs:
        regime = next((r for r in comp.regimes if r.name == run["regime"]), None)
        if regime is not None and "prefix" in run["scores"]:
            first[Cell(regime.name, run["arm"], run["seed"], regime.steps).name] = {
                "final/prefix/acc_mean": run["scores"]["prefix"]["acc_mean"]}
    for r in comp.regimes:
        later = r.then or comp.then_seeds
        for a in r.arms:
            seeds = {run["seed"] for run in runs if (run["regime"], run["arm"]) == (r.name, a)}
            if a == BASELINE_ARM or not set(r.seeds) <= seeds or seeds & set(later):
                continue
            ok, why = qualifies(comp, first, r.name, a)
            if not ok:
                stopped[(r.name, a)] = why
    return stopped


__all__ = ["grid_spec", "join_folders", "narrow", "qualifies", "rescore", "run_comparison", "run_grid",
           "stopped_in_tables", "write_stopped", "write_tables"]
