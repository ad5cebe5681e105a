"""A study's best trials re-run on fresh seeds outside the study, beside the unmitigated model: the front's top is
optimistically biased (it is the maximum over many noisy trials), so a claim rests on these runs, not on the study.

`python -m phasefix.study spec=studies/<name>.yaml confirm=3 [workers=2]`:

- `top_trials`: the k best distinct complete, feasible trials: the flat ones (`verdict.flat`) first, then by
  worst, then by mean (prefix padding, the study's objectives);
- every (arm, seed) is one `phasefix.fit` run: the study's base, the trial's params as `suggest` turns them into
  overrides (the baseline: the study file's `confirm.baseline` overrides, the unmitigated model), seed from
  `confirm.seeds`, tagged `regime=<study>`, `arm=t<trial>` or `baseline`, `study_confirm=<study>`. A FINISHED run is
  kept, an interrupted one resumed from its checkpoint: rerunning the command continues;
- the verdict is `phasefix.report`'s decisive table over those runs (`phasefix.verdict`: learned, goal met against
  the baseline's mean on the same seeds), written to `<reports>/confirm/` with the runs' phase curves and figures, and `arms.md` (each arm's
  overrides and its result in the study).
"""
from __future__ import annotations

from datetime import datetime
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from phasefix.decisive import markdown
from phasefix.errors import check
from phasefix.fit_run import checkpoint_path
from phasefix.study.pareto import feasible
from phasefix.study.spec import StudySpec, sampled_params
from phasefix.verdict import BASELINE_ARM, flat

MEAN, WORST = "final/prefix/acc_mean", "final/prefix/acc_worst"


def top_trials(spec: StudySpec, study, k: int) -> list:
    """The k best distinct (by params) complete trials that meet every constraint, best first."""
    check(MEAN in spec.metric_names and WORST in spec.metric_names, "confirm", k,
          f"needs the objectives {MEAN} and {WORST} (the study has {', '.join(spec.metric_names)})")
    i_mean, i_worst = spec.metric_names.index(MEAN), spec.metric_names.index(WORST)

    def rank(t):
        mean, worst = t.values[i_mean], t.values[i_worst]
        return (flat(mean, worst), worst, mean, -t.number)

    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and feasible(t) is not False]
    out, seen = [], set()
    for t in sorted(done, key=rank, reverse=True):
        key = tuple(sorted((n, repr(v)) for n, v in t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:k]


def trial_overrides(spec: StudySpec, trial) -> list[str]:
    """A trial's config as overrides: its params walked as `suggest` samples them."""
    return [o for p, v in sampled_params(spec, lambda p: trial.params[p.name]) for o in p.overrides(v)]


def plan(spec: StudySpec, study, k: int, experiment: str, tracking_uri: str) -> list[dict]:
    """The runs to do: {arm, seed, overrides, trial} for the baseline and the top k trials on every seed, each
    with `action` new, resume (an unfinished run with a checkpoint) or done (a FINISHED run)."""
    from phasefix import tracking

    clash = sorted(set(spec.trial_seeds) & {str(s) for s in spec.confirm_seeds})
    check(not clash, "confirm.seeds", spec.confirm_seeds, f"must be fresh: the study's trials used seed {clash}")
    arms = [(BASELINE_ARM, None, list(spec.confirm_baseline))]
    arms += [(f"t{t.number}", t.number, trial_overrides(spec, t)) for t in top_trials(spec, study, k)]
    c = tracking.client(tracking_uri)
    earlier: dict[tuple[str, str], list] = {}  # (arm, seed) -> the confirm runs so far, oldest first: one query
    if c.get_experiment_by_name(experiment) is not None:
        for r in tracking.select_runs(c, experiment=experiment, tags={"study_confirm": spec.name}):
            earlier.setdefault((r.data.tags.get("arm"), r.data.tags.get("seed")), []).append(r)
    jobs = []
    for arm, number, ovs in arms:
        for seed in spec.confirm_seeds:
            runs = earlier.get((arm, str(seed)), [])
            finished = [r for r in runs if r.info.status == "FINISHED"]
            resumable = [r for r in runs if r.info.status != "FINISHED" and
                         checkpoint_path(r.data.tags.get("output_dir", "/nonexistent")).exists()]
            job = {"arm": arm, "trial": number, "seed": seed, "overrides": ovs}
            if finished:
                job.update(action="done", run_id=finished[-1].info.run_id)
            elif resumable:
                job.update(action="resume", run_id=resumable[-1].info.run_id,
                           output_dir=resumable[-1].data.tags["output_dir"])
            else:
                job.update(action="new")
            jobs.append(job)
    return jobs


def fit_overrides(spec: StudySpec, job: dict, experiment: str, tracking_uri: str, threads: int | None) -> list[str]:
    """The fit overrides of one planned run."""
    from phasefix import tracking

    thread = [f"trainer.num_threads={threads}"] if threads else []
    if job["action"] == "resume":
        return [f"resume='{job['output_dir']}'", *thread]  # the directory: its run.json names the run's store
    out = spec.outputs() / f"confirm-{job['arm']}-s{job['seed']}-{datetime.now():%Y%m%d-%H%M%S}"
    trial = [f"+logger.tags.trial='{job['trial']}'"] if job["trial"] is not None else []
    ovs = [*spec.base, *job["overrides"], f"seed={job['seed']}", *thread, f"output_dir='{out}'",
           f"run_name='{spec.name}-confirm-{job['arm']}-s{job['seed']}'", f"logger.experiment_name='{experiment}'",
           f"logger.tracking_uri='{tracking_uri}'", f"+logger.tags.regime='{spec.name}'",
           f"+logger.tags.arm='{job['arm']}'", f"+logger.tags.study_confirm='{spec.name}'", *trial]
    return [*ovs, tracking.command_override(ovs)]  # the table row names how to redo the run


def fit_job(overrides: list[str]) -> tuple[str | None, str | None]:
    """One fit in a worker process: (MLflow run id, None) or (None, the error's first line)."""
    from phasefix.fit import compose, fit

    try:
        return fit(compose(overrides)).get("mlflow_run_id"), None
    except Exception as e:  # one failed run must not stop the others; it is reported and rerun next time
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _job_process(fit_fn, i: int, call, results) -> None:
    from phasefix.study.runner import ctrl_c_stops_this_process

    ctrl_c_stops_this_process()
    results.put((i, fit_fn(call)))


def run_jobs(fit_fn, calls: list, workers: int) -> list:
    """fit_fn(call) for every call, each in a fresh spawned process, `workers` at a time; the results in call order
    (a process that died without one: (None, why)). Ctrl-C or SIGTERM to this process stops every running fit the
    way Ctrl-C stops a fit (`last.ckpt` saved, its MLflow run KILLED, so the next `confirm` resumes it) and raises
    KeyboardInterrupt. A pool would not do: its workers catch the fit's SystemExit and start the next run."""
    from phasefix.study.runner import sigterm_as_interrupt, stop_processes

    ctx = get_context("spawn")
    queue = ctx.SimpleQueue()
    results: list = [None] * len(calls)
    pending, running = list(range(len(calls))), {}
    try:
        with sigterm_as_interrupt():
            while pending or running:
                while pending and len(running) < workers:
                    i = pending.pop(0)
                    running[i] = ctx.Process(target=_job_process, args=(fit_fn, i, calls[i], queue),
                                             name=f"confirm-{i}")
                    running[i].start()
                wait([p.sentinel for p in running.values()])
                while not queue.empty():
                    i, result = queue.get()
                    results[i] = result
                for i, p in list(running.items()):
                    if not p.is_alive():
                        p.join()
                        del running[i]
                        if results[i] is None:
                            results[i] = (None, f"its process ended with code {p.exitcode} and no result")
    except KeyboardInterrupt:
        stop_processes(running.values())
        raise
    return results


def confirm(spec: StudySpec, study, k: int, workers: int = 1, experiment: str | None = None,
            tracking_uri: str | None = None, fit_fn=fit_job) -> dict:
    """Run what `plan` leaves to do (`workers` fits at a time, one thread each when workers > 1), then write the
    decisive table of all the confirm runs to <reports>/confirm/ (printed for prefix padding). Returns {jobs, errors,
    out, rows: the table's prefix rows}."""
    from phasefix import tracking
    from phasefix.fit import compose
    from phasefix.report import report_runs
    from phasefix.study import mlflow_runs

    check(k >= 1, "confirm", k, "must be >= 1 (the number of best trials to re-run)")
    cfg = compose(spec.base)
    uri = tracking.tracking_uri(tracking_uri or cfg.logger.tracking_uri)
    experiment = (experiment or study.user_attrs.get(mlflow_runs.EXPERIMENT_ATTR)
                  or mlflow_runs.experiment_name(spec, cfg))
    jobs = plan(spec, study, k, experiment, uri)
    todo = [j for j in jobs if j["action"] != "done"]
    threads = 1 if workers > 1 else None
    print(f"[study] confirm {spec.name}: {len(jobs)} runs ({len(jobs) - len(todo)} done), arms "
          f"{', '.join(dict.fromkeys(j['arm'] for j in jobs))}, seeds {list(spec.confirm_seeds)}", flush=True)
    errors = []
    calls = [fit_overrides(spec, j, experiment, uri, threads) for j in todo]
    if workers > 1 and len(calls) > 1:
        results = run_jobs(fit_fn, calls, workers)
    else:
        results = [fit_fn(call) for call in calls]
    for job, (run_id, err) in zip(todo, results):
        if err:
            errors.append(f"{job['arm']} seed {job['seed']}: {err}")
            print(f"[study] confirm run {job['arm']} seed {job['seed']} failed: {err}", flush=True)
    out = spec.reports() / "confirm"
    res = report_runs(experiment=experiment, tags={"study_confirm": spec.name}, out=str(out), log=False,
                      tracking_uri=uri)
    arms = {}
    for j in jobs:
        arms.setdefault(j["arm"], j)
    values = {t.number: t.values for t in study.get_trials(deepcopy=False) if t.values}
    lines = [f"| arm | trial | in the study: {' / '.join(spec.metric_names)} | overrides (on the study's base) |",
             "|---|---|---|---|"]
    for arm, j in arms.items():
        v = values.get(j["trial"])
        study_cell = "-" if v is None else " / ".join(f"{x:.3f}" for x in v)
        lines.append(f"| {arm} | {'-' if j['trial'] is None else j['trial']} | {study_cell} | "
                     f"`{' '.join(j['overrides']) or '(base)'}` |")
    (out / "arms.md").write_text("\n".join(lines) + "\n")
    rows = [r for r in res["decisive"] if r["padding"] == "prefix"]
    print(markdown(rows), flush=True)
    return {"jobs": jobs, "errors": errors, "out": res["out"], "rows": rows}


def run_confirm(path: str | Path, k: int, storage: str | None = None, workers: int = 1,
                import_from: str | Path | None = None, fit_fn=fit_job) -> dict:
    """The CLI's `confirm=k`: the study from its storage (or, new, from `import_from`'s finished trials), then
    `confirm`. 'rc' is 0 when every run finished, 1 otherwise (rerun to continue)."""
    from phasefix.study.runner import open_or_import, spec_and_url
    from phasefix.study.spec import validate

    spec, url = spec_and_url(path, storage)
    check(workers >= 1, "workers", workers, "must be >= 1")
    validate(spec)
    study = open_or_import(spec, url, import_from)
    res = confirm(spec, study, k, workers, fit_fn=fit_fn)
    return {**res, "rc": 1 if res["errors"] else 0}
