"""Running a study: the Optuna RDB storage with heartbeats and retries, the sampler, the budget loop of one worker
(one trial at a time, started under a lock so that K workers never overshoot the budget), `workers=K` processes on
this machine, and `run_study` (the CLI's work)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from phasefix.errors import ConfigError, check
from phasefix.study import mlflow_runs
from phasefix.study.objective import FitFn, make_objective
from phasefix.study.pareto import counts, import_trials, report_study
from phasefix.study.spec import StudySpec, check_storage_url, load_spec, logged_name, validate


def storage_driver(url: str) -> str:
    """`postgresql://` with the driver that is installed: SQLAlchemy 2.1 defaults to psycopg 3, while phasefix's
    `postgres` extra installs psycopg2."""
    if url.startswith("postgresql://"):
        import importlib.util as iu

        if iu.find_spec("psycopg") is None and iu.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def make_storage(spec: StudySpec, url: str, with_callbacks: bool = True):
    """An RDB storage with heartbeats; a stale trial (its worker died) is failed, its MLflow run marked FAILED
    and the trial retried with the same params (up to storage.max_retry times)."""
    import optuna

    engine_kwargs: dict = {}
    url = storage_driver(url)
    if url.startswith("sqlite:///"):
        db = Path(url[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        if not db.exists():  # WAL: readers never block the writer; several processes on one machine
            import sqlite3

            with sqlite3.connect(db) as con:
                con.execute("PRAGMA journal_mode=WAL")
        engine_kwargs = {"connect_args": {"timeout": 120}}
    elif url.startswith(("postgresql", "mysql")):
        engine_kwargs = {"pool_pre_ping": True}
    retry = retry_callback(spec)

    def on_stale(study, trial):
        retry(study, trial)
        mlflow_runs.mark_lost(study, trial)
        print(f"[study] trial {trial.number} lost its worker (no heartbeat for {spec.grace_period}s): "
              f"marked failed and retried", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat options are "experimental"
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs,
            heartbeat_interval=spec.heartbeat_interval if with_callbacks else None,
            grace_period=spec.grace_period if with_callbacks else None,
            heartbeat_stale_trial_callback=on_stale if with_callbacks else None)


def retry_callback(spec: StudySpec):
    """Optuna's retry: a WAITING copy of a failed trial (same params), system attrs `failed_trial` and
    `retry_history`, at most storage.max_retry times per trial."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback  # the new name since Optuna 4.9
        return retry_cls(max_retry=spec.max_retry)


def requeue_interrupted(spec: StudySpec, study) -> int:
    """Trials that Ctrl-C stopped (user attr `interrupted`; Optuna marks them failed) are retried when the study is
    run again, continuing their runs from the last checkpoints (SIGTERM leaves a trial RUNNING: it is retried as a
    stale one). The number requeued."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    todo = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("interrupted")
            and t.number not in retried]
    retry, requeued = retry_callback(spec), 0
    for t in todo:
        before = len(study.get_trials(deepcopy=False))
        retry(study, t)  # adds nothing once the trial was retried max_retry times
        if len(study.get_trials(deepcopy=False)) > before:
            requeued += 1
            print(f"[study] trial {t.number} was interrupted: retried, continuing its runs", flush=True)
        else:
            print(f"[study] trial {t.number} was interrupted and retried {spec.max_retry} times already (max_retry): "
                  "not retried", flush=True)
    return requeued


def make_sampler(spec: StudySpec, worker: int = 0, resumed: int = 0):
    """The study file's sampler; constraints reach it through `Trial.set_constraint` (see the objective). `resumed`:
    the trials already stored, so that a study continued with a fixed seed does not draw its first trials again."""
    import optuna

    s = spec.sampler
    # workers must not propose the same, and neither must a rerun: the seed moves with the stored trials
    seed = None if s.get("seed") is None else s["seed"] + 1000 * worker + 7919 * resumed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if s["type"] == "nsga2":
            return optuna.samplers.NSGAIISampler(population_size=s.get("population_size", 50), seed=seed)
        if s["type"] == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if s["type"] == "grid":  # a comparison's cells (phasefix.study.cells): each once, whichever worker
            return optuna.samplers.GridSampler({p.name: p.choices for p in spec.params}, seed=s.get("seed"))
        multivariate = s.get("multivariate", True)
        return optuna.samplers.TPESampler(n_startup_trials=s.get("n_startup_trials", 10), seed=seed,
                                          multivariate=multivariate, group=multivariate, constant_liar=True)


def open_study(spec: StudySpec, url: str, worker: int = 0, create: bool = False):
    """The study in its storage, with heartbeats and this worker's sampler (`create`: if missing, and check that
    the stored objectives match the file)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(spec, url)
    if create:
        study = optuna.create_study(storage=storage, study_name=spec.name, directions=spec.directions,
                                    load_if_exists=True)
        stored = [d.name.lower() for d in study.directions]
        check(stored == spec.directions, "objectives", spec.directions,
              f"differ from the stored study {spec.name!r} ({stored}) in {mlflow_runs.redact(url)}: use another name "
              "or storage")
        # a study stored with the earlier spelling (prefix.acc_mean) names the same metrics: left as it is
        if [logged_name(m) for m in study.metric_names or []] != spec.metric_names:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental"
                study.set_metric_names(spec.metric_names)
    else:
        study = optuna.load_study(study_name=spec.name, storage=storage)
    study.sampler = make_sampler(spec, worker, len(study.get_trials(deepcopy=False)))
    return study


def load_study(spec: StudySpec, url: str):
    """The stored study for reading (no heartbeats, no sampler); ConfigError when it does not exist."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return optuna.load_study(study_name=spec.name, storage=make_storage(spec, url, with_callbacks=False))
        except KeyError:
            raise ConfigError(f"study {spec.name!r} is not in {mlflow_runs.redact(url)}: run it first (or pass its "
                              "storage=)") from None


# ------------------------------------------------------------------------------------------------ workers
class TrialStartLock:
    """A machine-wide lock per (storage, study) held from counting the trials to the new trial being RUNNING in the
    storage. Without it two workers can both count budget - 1 and both start a trial (one trial too many). Workers
    on other machines sharing a PostgreSQL storage do not share it: they may overshoot by up to K - 1 trials."""

    def __init__(self, url: str, study_name: str):
        key = hashlib.sha1(f"{mlflow_runs.redact(url)}\0{study_name}".encode()).hexdigest()[:16]
        self.path = Path(tempfile.gettempdir()) / f"phasefix-study-{key}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.held = False

    def acquire(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.release()
        os.close(self.fd)


def run_worker(spec: StudySpec, url: str, n_trials: int, worker: int = 0, threads: int | None = None,
               fit_fn: FitFn | None = None, poll_s: float | None = None) -> int:
    """Run trials until the study has `n_trials` finished or running ones (complete, pruned, running), then wait
    for the trials still running elsewhere: failing stale ones (a dead worker's) and running their retries.
    0: done; 3: stopped after max_failures trials raised errors; 4: timeout."""
    import optuna

    study = open_study(spec, url, worker)
    objective = make_objective(spec, study.user_attrs.get(mlflow_runs.PARENT_ATTR), threads, fit_fn)
    lock = TrialStartLock(url, spec.name)

    def started(trial):  # Optuna has created the trial (RUNNING, visible to the other workers): let them count
        lock.release()
        return objective(trial)

    poll_s = poll_s or min(5.0, spec.heartbeat_interval)
    t0 = time.time()
    try:
        while True:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optuna.storages.fail_stale_trials(study)
            lock.acquire()
            try:
                n = counts(study)
                if n["ERRORS"] >= spec.max_failures:
                    print(f"[study] worker {worker}: {n['ERRORS']} trials failed with errors (max_failures="
                          f"{spec.max_failures}); stopping. See the trials' user attr 'error'.", file=sys.stderr,
                          flush=True)
                    return 3
                left = spec.timeout - (time.time() - t0) if spec.timeout else None
                if left is not None and left <= 0:
                    return 4
                # running trials count: K workers stop together at the budget; retries (WAITING) run regardless
                if n["WAITING"] > 0 or n["COMPLETE"] + n["PRUNED"] + n["RUNNING"] < n_trials:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        study.optimize(started, n_trials=1, timeout=left, catch=(Exception,), gc_after_trial=False)
                    continue
            finally:
                lock.release()
            if n["RUNNING"] == 0:
                return 0
            time.sleep(poll_s)  # trials running elsewhere: wait for them to finish or go stale
    finally:
        lock.close()


def _worker_process(spec: StudySpec, url: str, n_trials: int, worker: int, threads: int, fit_fn: FitFn | None,
                    log: Path) -> None:
    """The body of one of `workers=K`'s processes: output to its log file, exit code from run_worker."""
    ctrl_c_stops_this_process()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.exit(run_worker(spec, url, n_trials, worker=worker, threads=threads, fit_fn=fit_fn))


def ctrl_c_stops_this_process() -> None:
    """For a child process, first thing: Ctrl-C (the SIGINT `stop_processes` sends) raises KeyboardInterrupt. A parent
    started with `&` by a script (a non-interactive shell) ignores SIGINT, its children inherit that, and SIGTERM to
    the parent would then leave each child training until `stop_processes` kills it, without its checkpoint."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside: SIGTERM to this process raises KeyboardInterrupt, as Ctrl-C does, so that the code that stops its
    child processes runs for both (Python's default for SIGTERM ends the parent and leaves the children running).
    Only the main thread may set a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_processes(procs, timeout: float = 120) -> None:
    """Ctrl-C for child processes: SIGINT to each live one (a fit saves `last.ckpt` and ends its MLflow run KILLED;
    a study marks the trial interrupted, to be retried), then wait; what is left after `timeout` is killed."""
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGINT)
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()


def spawn_workers(spec: StudySpec, url: str, n_trials: int, k: int, fit_fn: FitFn | None = None) -> int:
    """K worker processes on this machine, one log file each beside the study's reports. Fresh interpreters
    (spawn: no forked torch threads or database connections); `fit_fn` must be picklable (a module function)."""
    logs = spec.reports() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // k)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_process, name=f"study-worker{w}",
                         args=(spec, url, n_trials, w, threads, fit_fn, logs / f"worker{w}.log")) for w in range(k)]
    for p in procs:
        p.start()
    print(f"[study] {k} workers ({threads} threads each), logs: {logs}/worker*.log", flush=True)
    rc = 0
    try:
        with sigterm_as_interrupt():
            for w, p in enumerate(procs):
                p.join()
                code = p.exitcode
                if code != 0:
                    reason = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                    print(f"[study] worker {w} ended with {reason} (see {logs}/worker{w}.log)", file=sys.stderr)
                    rc = rc or (code if code > 0 else 1)
    except KeyboardInterrupt:
        stop_processes(procs, timeout=30)
        raise
    return rc


# ------------------------------------------------------------------------------------------------ the CLI's work
def spec_and_url(path: str | Path, storage: str | None = None) -> tuple[StudySpec, str]:
    """The study file, parsed and checked, and its storage URL (`storage` overrides the file's)."""
    spec = load_spec(path)
    if storage:
        check_storage_url(storage, "storage")
    return spec, spec.storage_url(storage)


def open_or_import(spec: StudySpec, url: str, import_from: str | Path | None = None):
    """The study (created when new); a new, empty one starts from the finished trials of `import_from`."""
    if import_from is not None:
        check(Path(import_from).is_file(), "import_trials", str(import_from), "must be an existing trials.csv")
    study = open_study(spec, url, create=True)
    if import_from is not None:
        if study.get_trials(deepcopy=False):
            print(f"[study] {spec.name} already has trials in its storage: import_trials={import_from} ignored",
                  flush=True)
        else:
            n = import_trials(spec, study, import_from)
            done = counts(study)
            print(f"[study] {spec.name}: {n} trials imported from {import_from} ({done['COMPLETE'] + done['PRUNED']} "
                  "finished)", flush=True)
    return study


def open_for_run(spec: StudySpec, url: str, import_from: str | Path | None = None):
    """The study ready for workers: opened (or imported), its MLflow parent run there, interrupted trials re-queued."""
    study = open_or_import(spec, url, import_from)
    mlflow_runs.ensure_parent_run(spec, study, url)
    requeue_interrupted(spec, study)
    return study


def serve_dashboard(path: str | Path, port: int, storage: str | None = None,
                    import_from: str | Path | None = None) -> int:
    """optuna-dashboard for the study on 127.0.0.1:<port> until Ctrl-C: its storage as it is, or, when the storage
    does not hold it yet (a fresh clone), first filled from `import_from` (the committed trials.csv)."""
    spec, url = spec_and_url(path, storage)
    check(1 <= port <= 65535, "dashboard", port, "must be a TCP port, 1..65535")
    study = open_or_import(spec, url, import_from) if import_from is not None else load_study(spec, url)
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise ConfigError("dashboard needs optuna-dashboard: pip install optuna-dashboard (or -e '.[dashboard]')") \
            from None
    n = counts(study)
    print(f"[study] optuna-dashboard for {spec.name} ({n['COMPLETE']} complete, {n['PRUNED']} pruned trials): "
          f"http://127.0.0.1:{port}/dashboard (Ctrl-C stops it)", flush=True)
    try:
        run_server(url, host="127.0.0.1", port=port)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # the port is taken (another dashboard, another server)
        raise ConfigError(f"dashboard={port} is invalid: 127.0.0.1:{port} cannot be served ({e.strerror}); "
                          "choose another port") from None
    return 0


def run_study(path: str | Path, n_trials: int | None = None, storage: str | None = None, workers: int = 1,
              report_only: bool = False, fit_fn: FitFn | None = None, import_from: str | Path | None = None) -> dict:
    """Validate, create or resume the study, run the workers, report. `import_from`: a trials.csv whose finished
    trials start a study that is not in the storage yet (ignored once it is). `fit_fn` replaces
    `phasefix.fit.fit` in every worker (tests: a cheap stand-in). Returns report_study()'s dict plus 'rc'."""
    spec, url = spec_and_url(path, storage)
    budget = spec.n_trials if n_trials is None else n_trials
    check(budget >= 1, "n_trials", budget, "must be >= 1")
    check(workers >= 1, "workers", workers, "must be >= 1")
    if import_from is not None:
        check(Path(import_from).is_file(), "import_trials", str(import_from), "must be an existing trials.csv")
    if report_only:
        return {**report_study(spec, load_study(spec, url), url), "rc": 0}
    validate(spec)
    study = open_for_run(spec, url, import_from)
    n = counts(study)
    print(f"[study] {spec.name}: {mlflow_runs.redact(url)}; {n['COMPLETE'] + n['PRUNED']} of {budget} trials finished, "
          f"{workers} worker(s); MLflow parent run {study.user_attrs.get(mlflow_runs.PARENT_ATTR)}", flush=True)
    interrupted = False
    try:
        if workers == 1:
            rc = run_worker(spec, url, budget, fit_fn=fit_fn)
        else:
            rc = spawn_workers(spec, url, budget, workers, fit_fn=fit_fn)
    except KeyboardInterrupt:
        interrupted, rc = True, 130
    n = counts(study)
    complete = n["COMPLETE"] + n["PRUNED"] >= budget and n["RUNNING"] == 0
    res = report_study(spec, load_study(spec, url), url)
    if rc and complete:
        print("[study] the study reached its budget; a worker ended abnormally and its trials were retried",
              file=sys.stderr)
        rc = 0
    mlflow_runs.finish_parent(study, complete and not interrupted)
    res["rc"] = rc
    return res
