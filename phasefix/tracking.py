"""Everything phasefix writes to MLflow (the only module that talks to MLflow).

Store: `sqlite:///<project>/mlruns/mlflow.db` with artifacts under `mlruns/` (MLflow 3 refuses the plain file store),
overridable by an explicit URI or MLFLOW_TRACKING_URI. The URI is always passed explicitly, never read from
MLflow's import-time default.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from contextlib import contextmanager

import mlflow
from mlflow.tracking import MlflowClient

from phasefix.config import flatten  # noqa: F401  (tracking.flatten: the dotted keys params are logged under)
from phasefix.errors import ConfigError, check
from phasefix.paths import PROJECT_ROOT, default_tracking_uri

SPARK = "▁▂▃▄▅▆▇█"


def tracking_uri(uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def client(uri: str | None = None) -> MlflowClient:
    uri = tracking_uri(uri)
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow creates and migrates the tables on first use; two processes doing that at once collide
    import fcntl

    with open(f"{db}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)
    return c


EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # the MLflow UI's "Machine learning" mode
# The MLflow UI's saved view of the experiment's charts that `python -m phasefix.ui` opens (experiment tag
# `mlflow.sharedViewState.<key>`, URL `?viewStateShareKey=<key>`; MLflow 3.17's format, read from its UI): the phase
# curves first, on a 0-1 axis with full titles, then training; the single-value final scalars collapsed.
VIEW_KEY = "phase-curves"


def phase_curves_view(paddings: Sequence[str] = ("prefix", "in_sequence")) -> str:
    """The saved view's tag value: MLflow's envelope {name, createdAt, updatedAt, state} with the view state (the
    chart cards and sections of the experiment page's chart mode) as a JSON string."""
    def line(key: str, title: str, section: str, y01: bool) -> dict:
        return {"uuid": f"phasefix-{key.replace('/', '-')}", "type": "LINE", "isGenerated": False, "deleted": False,
                "metricSectionId": section, "runsCountToCompare": 10, "displayName": title, "metricKey": key,
                "selectedMetricKeys": [key], "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear",
                "range": {"yMin": 0, "yMax": 1} if y01 else {}, "xAxisKey": "step", "selectedXAxisMetricKey": "",
                "yAxisKey": "metric", "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": False,
                "useGlobalLineSmoothing": False}

    sections = [("phasefix-phase", "phase curves (x = residue)", len(paddings)),
                ("phasefix-val", "accuracy while training (x = step)", 2 * len(paddings)),
                ("phasefix-train", "train", 2)]  # the name MLflow gives train/*: the rest of train/ joins it
    charts = [line(f"phase_acc/{p}", f"phase_acc/{p}: accuracy by residue, {p} padding", "phasefix-phase", True)
              for p in paddings]
    charts += [line(phase_metric("val", p, k), phase_metric("val", p, k), "phasefix-val", True)
               for p in paddings for k in ("acc_mean", "acc_worst")]
    charts += [line("train/loss", "train/loss", "phasefix-train", False)]
    state = {"compareRunCharts": charts, "isAccordionReordered": True, "hideEmptyCharts": True,
             "compareRunSections": [{"uuid": u, "name": n, "display": True, "isReordered": True, "columns": columns,
                                     "cardHeight": 360} for u, n, columns in sections]
             # the single-value final scalars (bars): collapsed; their numbers are in the runs table and summary.json
             + [{"uuid": f"phasefix-final-{p}", "name": f"final/{p}", "display": False, "isReordered": True}
                for p in paddings]}
    now = 0  # a fixed view: the same tag value for every experiment and every run
    return json.dumps({"name": "Phase curves", "createdAt": now, "updatedAt": now, "state": json.dumps(state)})


def get_or_create_experiment(c: MlflowClient, name: str) -> str:
    """The experiment's id, created when missing (artifacts beside an SQLite store) and tagged as model training
    (`mlflow.experimentKind=custom_model_development`: the UI shows runs and charts, not GenAI traces)."""
    exp = c.get_experiment_by_name(name)
    if exp is None:
        artifacts = None
        if c.tracking_uri.startswith("sqlite:///"):  # keep artifacts beside the database (mlruns/ by default)
            db = Path(c.tracking_uri[len("sqlite:///"):])
            artifacts = (db.parent / "artifacts" / name).resolve().as_uri()
        try:
            exp_id = c.create_experiment(name, artifact_location=artifacts, tags=experiment_tags())
        except mlflow.exceptions.MlflowException:  # another process created it meanwhile
            exp_id = c.get_experiment_by_name(name).experiment_id
        return exp_id
    for key, value in experiment_tags().items():  # experiments created before phasefix set the kind or the view
        if exp.tags.get(key) is None:
            c.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def experiment_tags() -> dict[str, str]:
    return dict([EXPERIMENT_KIND, (f"mlflow.sharedViewState.{VIEW_KEY}", phase_curves_view())])


def create_run(c: MlflowClient, experiment: str, run_name: str, tags: Mapping[str, str]) -> str:
    """A new RUNNING run in `experiment` (created when missing), tagged with `tags` and the git commit; its id."""
    exp_id = get_or_create_experiment(c, experiment)
    return c.create_run(exp_id, run_name=run_name, tags={"git_commit": git_commit(), **tags}).info.run_id


@contextmanager
def running(c: MlflowClient, run_id: str, resumed: bool = False) -> Iterator[str]:
    """The run's lifecycle: RUNNING inside the block (`resumed`: set again), then ended FINISHED when the block
    completes, KILLED on Ctrl-C or SIGTERM (KeyboardInterrupt, SystemExit), FAILED on any other error."""
    if resumed:
        resume_run(c, run_id)
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):
        status = "KILLED"
        raise
    finally:
        with interrupts_deferred():
            c.set_terminated(run_id, status=status)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C inside the block takes effect when the block ends. A KeyboardInterrupt raised inside an sqlite write
    leaves that connection holding the database lock, so the process could no longer end its own run KILLED."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):  # as if the signal arrived now (SIG_IGN, SIG_DFL: nothing to call)
            previous(signal.SIGINT, received[0])


def resume_run(c: MlflowClient, run_id: str) -> None:
    """A run that is continued outside a `running` block (a study's parent run) is RUNNING again."""
    c.update_run(run_id, status="RUNNING")


def end_run(c: MlflowClient, run_id: str, status: str, tags: Mapping[str, str] | None = None) -> None:
    """End a run that outlived the block that ran it (a study's parent and trials): `tags` first, then `status`."""
    set_tags(c, run_id, tags or {})
    c.set_terminated(run_id, status=status)


def set_tags(c: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def provenance() -> dict:
    """Tags that say how and where a run was made: the command line (when started from a phasefix CLI) and the
    machine (host name, CPU count, GPU), so that a table row can name its command, commit and machine."""
    import platform
    import sys

    import torch

    machine = f"{platform.node()}, {os.cpu_count()} CPUs"
    if torch.cuda.is_available():
        machine += f", {torch.cuda.get_device_name(0)}"
    tags = {"machine": machine}
    script = Path(sys.argv[0]).with_suffix("").name if sys.argv and sys.argv[0] else ""
    if Path(sys.argv[0]).parent.name == "phasefix" and script not in ("", "__main__"):  # python -m phasefix.<script>
        tags["command"] = shell_command(script, sys.argv[1:])
    return tags


def shell_command(script: str, args) -> str:
    """`python -m phasefix.<script> <args>` as a shell would take it back: an override with brackets, quotes or
    spaces in double quotes (readable: `"output_dir='/x y'"`), shlex's quoting where that is not enough."""
    import re
    import shlex

    def word(a: str) -> str:
        if re.fullmatch(r"[\w@%+=:,./-]+", a):
            return a
        return f'"{a}"' if not re.search(r'["$`\\!]', a) else shlex.quote(a)

    return f"python -m phasefix.{script} {' '.join(word(a) for a in args)}".strip()[:5000]


def command_override(overrides) -> str:
    """The override that tags a fit started in-process (a study's trial, a confirm run) with the command that
    reproduces it, `python -m phasefix.fit <overrides>`, as the CLI's runs are tagged (a table row names it)."""
    cmd = shell_command("fit", overrides)
    return '+logger.tags.command="' + cmd.replace("\\", "\\\\").replace('"', '\\"') + '"'


def log_params(c: MlflowClient, run_id: str, cfg: Mapping) -> None:
    from mlflow.entities import Param

    params = [Param(k, str(v)[:6000]) for k, v in flatten(cfg).items()]
    for i in range(0, len(params), 100):
        c.log_batch(run_id, params=params[i:i + 100])


def sparkline(values) -> str:
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(" ")
        else:
            out.append(SPARK[min(len(SPARK) - 1, max(0, int(round(float(v) * (len(SPARK) - 1)))))])
    return "".join(out)


def log_figure(c: MlflowClient, run_id: str, fig, path: str) -> None:
    """A matplotlib figure as the PNG artifact `path` (110 dpi, as the files the CLIs write), then closed."""
    import matplotlib.pyplot as plt

    c.log_figure(run_id, fig, path, save_kwargs={"dpi": 110})
    plt.close(fig)


def artifact_path(c: MlflowClient, run_id: str, path: str) -> str:
    """Where artifact `path` of a run lies: a file path for a local store (what a user opens), else its URI."""
    from urllib.parse import unquote, urlparse

    root = c.get_run(run_id).info.artifact_uri
    return unquote(urlparse(root).path) + "/" + path if root.startswith("file:") else f"{root}/{path}"


def log_dict(c: MlflowClient, run_id: str, d: Mapping, path: str) -> None:
    """A dict as the JSON artifact `path` (indented as `write_json` writes the local copy)."""
    c.log_dict(run_id, dict(d), path)


def log_config(c: MlflowClient, run_id: str, yaml_text: str, path: str = "config.yaml") -> None:
    """A config as YAML text exactly as written (key order kept; MLflow's log_dict would sort the keys)."""
    c.log_text(run_id, yaml_text, path)


def log_files(c: MlflowClient, run_id: str, paths: "Sequence[str | Path]", artifact_dir: str | None = None) -> None:
    for path in paths:
        c.log_artifact(run_id, str(path), artifact_dir)


def log_phase_table(c: MlflowClient, run_id: str, results: Mapping[str, Mapping]) -> None:
    """`phase_table.csv`: the per-residue values with counts and Wilson intervals (`residue_table`)."""
    c.log_text(run_id, residue_table(results), "phase_table.csv")


def log_phase_result(c: MlflowClient, run_id: str, padding: str, res: Mapping, step: int = 0) -> None:
    """The final phase curve of one padding mode: `phase_acc/<padding>` with step = residue (so the MLflow UI
    overlays curves across runs) and the summary scalars `final/<padding>/<key>`; the per-residue values with their
    counts and intervals go to the `phase_table.csv` artifact (`residue_table`), not to 24 scalars."""
    scalars = {phase_metric("final", padding, key): res[key] for key in FINAL_KEYS if res.get(key) is not None}
    log_metric_values(c, run_id, scalars, {f"phase_acc/{padding}": res["per_residue"]}, step=step)


# ------------------------------------------------------------------------------------------------ metric names
# A phase metric is `<split>/<padding>/<key>`: `val` while training (the Lightning module, every val_every_n_steps),
# `final` for the evaluation after training (fit, evaluate); `phase_acc/<padding>` is the final curve by residue.
FINAL_KEYS = ("acc_mean", "acc_worst", "acc_best", "acc_gap", "period_detected", "periodicity_ratio")
FINAL_PREFIXES = ("phase_acc/", "final/")


def phase_metric(split: str, padding: str, key: str) -> str:
    """The logged name of a phase metric, e.g. `phase_metric("val", "prefix", "acc_mean")` = `val/prefix/acc_mean`."""
    return f"{split}/{padding}/{key}"


def rewind(c: MlflowClient, run_id: str, step: int | None = None, final: bool = False) -> bool:
    """Delete the metric points a resumed run logs again, so its history has no duplicate points: with `step` (the
    global step of the checkpoint it resumes from; Lightning logs batch b at step b) the step-indexed points at
    steps >= `step`; with `final` the final results (`phase_acc/*` indexed by residue, `final/*`), just before
    the new ones are logged. SQL stores only (MLflow has no client call to delete metrics); False elsewhere."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from sqlalchemy import and_, not_, or_

    store = c._tracking_client.store
    if not isinstance(store, SqlAlchemyStore):
        return False
    is_final = or_(*[SqlMetric.key.startswith(p) for p in FINAL_PREFIXES])
    stale = [and_(SqlMetric.step >= step, not_(is_final))] if step is not None else []
    stale += [is_final] if final else []
    if not stale:
        return True
    with store.ManagedSessionMaker(read_only=False) as session:
        session.query(SqlMetric).filter(SqlMetric.run_uuid == run_id, or_(*stale)).delete(synchronize_session=False)
        session.query(SqlLatestMetric).filter(SqlLatestMetric.run_uuid == run_id).delete(synchronize_session=False)
        latest = {}
        for m in session.query(SqlMetric).filter(SqlMetric.run_uuid == run_id):
            best = latest.get(m.key)
            if best is None or (m.step, m.timestamp, m.value) > (best.step, best.timestamp, best.value):
                latest[m.key] = m
        session.add_all(SqlLatestMetric(key=m.key, value=m.value, timestamp=m.timestamp, step=m.step, is_nan=m.is_nan,
                                        run_uuid=run_id) for m in latest.values())
    return True


def copy_history(src: MlflowClient, src_run: str, dst: MlflowClient, dst_run: str, before_step: int) -> int:
    """Copy run `src_run`'s step-indexed metric points before `before_step` (not its final results) into `dst_run`:
    a fork's history up to the checkpoint it starts from (a resume keeps exactly these, see `rewind`). The number
    of points copied."""
    from mlflow.entities import Metric

    keys = [k for k in src.get_run(src_run).data.metrics if not k.startswith(FINAL_PREFIXES)]
    points = [Metric(k, m.value, m.timestamp, m.step) for k in keys for m in src.get_metric_history(src_run, k)
              if m.step < before_step]
    log_batches(dst, dst_run, points)
    return len(points)


def residue_table(results: Mapping[str, Mapping]) -> str:
    """CSV: residue, then accuracy, count and Wilson interval per padding."""
    paddings = list(results)
    n = len(next(iter(results.values()))["per_residue"])
    header = ["residue"] + [f"{p}_{k}" for p in paddings for k in ("acc", "count", "wilson_low", "wilson_high")]
    rows = [",".join(header)]
    for r in range(n):
        row = [str(r)]
        for p in paddings:
            res = results[p]
            row += [f"{float(res['per_residue'][r]):.4f}", str(int(res["count"][r])),
                    f"{float(res['wilson_low'][r]):.4f}", f"{float(res['wilson_high'][r]):.4f}"]
        rows.append(",".join(row))
    return "\n".join(rows) + "\n"


def write_json(path, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def log_metric_values(c: MlflowClient, run_id: str, scalars: Mapping[str, float],
                      curves: Mapping[str, "Sequence[float] | Mapping[int, float]"] = {}, step: int = 0) -> None:
    """Every metric phasefix logs itself (Lightning logs training): scalars at `step`, curves with step = index
    (e.g. residue) or, given as a mapping, step -> value (e.g. filler length); None and nan skipped; in batches of
    500 (MLflow's limit per call)."""
    from mlflow.entities import Metric

    def points(values):
        return values.items() if isinstance(values, Mapping) else enumerate(values)

    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, step) for k, v in scalars.items() if _finite(v)]
    metrics += [Metric(k, float(v), ts, int(i)) for k, values in curves.items() for i, v in points(values)
                if _finite(v)]
    log_batches(c, run_id, metrics)


def log_batches(c: MlflowClient, run_id: str, metrics: "Sequence") -> None:
    """Log MLflow `Metric`s in batches of 500 (MLflow's limit per call)."""
    for i in range(0, len(metrics), 500):
        c.log_batch(run_id, metrics=metrics[i:i + 500])


def _finite(v) -> bool:
    return v is not None and not math.isnan(float(v))


# ------------------------------------------------------------------------------------------------ reading runs back
def resolve_run_id(c, spec: str, key: str = "run") -> str:
    """The full MLflow run id that `spec` (a run id or any unique prefix of one) names, in the store of client `c`;
    ConfigError naming `key` when no run or several runs match (listing them)."""
    from mlflow.entities import ViewType

    spec = str(spec).strip()
    check(bool(re.fullmatch(r"[0-9a-fA-F]{1,32}", spec)), key, spec,
          f"no such MLflow run in {c.tracking_uri} (a run id is 32 hex digits; any unique prefix of one works)")
    spec = spec.lower()
    if len(spec) == 32:
        try:
            return c.get_run(spec).info.run_id
        except Exception:
            raise ConfigError(f"{key}={spec!r} is invalid: no such MLflow run in {c.tracking_uri}") from None
    exps = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ALL)]
    matches = list(c.search_runs(exps, f"attributes.run_id LIKE '{spec}%'", max_results=11)) if exps else []
    if not matches:
        raise ConfigError(f"{key}={spec!r} is invalid: no MLflow run id in {c.tracking_uri} starts with it")
    if len(matches) > 1:
        listed = ", ".join(f"{r.info.run_id} ({r.info.run_name})" for r in matches[:10])
        more = " and more" if len(matches) > 10 else ""
        raise ConfigError(f"{key}={spec!r} is ambiguous: it starts the MLflow run ids {listed}{more}; "
                          "give more characters")
    return matches[0].info.run_id


# a comparison's runs are found by their tag wherever they were logged (each stage of its grid is a study with its
# own experiment, `study-<name>...`)
ANY_EXPERIMENT = "*"


def select_runs(c: MlflowClient, *, experiment: str | None = None, run_ids: "Sequence[str]" = (),
                tags: Mapping[str, str] | None = None, kinds: "Sequence[str]" = ("fit", "evaluate")) -> list:
    """Runs by id or unique id prefix (in that order), or those of `experiment` (`ANY_EXPERIMENT`: of every
    experiment) whose tags all match and whose `phasefix.kind` is in `kinds` (oldest first). Raises ConfigError
    naming the option when nothing can be selected (phasefix.report)."""
    tags = dict(tags or {})
    if run_ids:
        runs = [c.get_run(resolve_run_id(c, rid, key="runs")) for rid in run_ids]  # ids or unique prefixes
    else:
        if experiment == ANY_EXPERIMENT:
            ids = [e.experiment_id for e in c.search_experiments()]
        else:
            exp = c.get_experiment_by_name(experiment or "phasefix")
            if exp is None:
                names = sorted(e.name for e in c.search_experiments())
                raise ConfigError(f"experiment={experiment!r} is invalid: allowed values are "
                                  f"{', '.join(repr(n) for n in names) or '(no experiments yet)'}")
            ids = [exp.experiment_id]
        filt = " and ".join(f"tags.`{k}` = '{str(v).replace(chr(39), chr(92) + chr(39))}'" for k, v in tags.items())
        runs, token = [], None
        while True:
            page = c.search_runs(ids, filt, max_results=1000, page_token=token,
                                 order_by=["attributes.start_time ASC"])
            runs += list(page)
            token = page.token
            if not token:
                break
    if run_ids:  # asked for by id: every kind but reports
        return [r for r in runs if r.data.tags.get("phasefix.kind") != "report"]
    return [r for r in runs if r.data.tags.get("phasefix.kind") in kinds]


def metric_curve(c: MlflowClient, run_id: str, key: str) -> list[float]:
    """A metric's history as a list indexed by step (the last value per step; nan for steps never logged)."""
    hist = c.get_metric_history(run_id, key)
    if not hist:
        return []
    out = [float("nan")] * (max(m.step for m in hist) + 1)
    for m in sorted(hist, key=lambda m: (m.timestamp, m.step)):
        out[m.step] = m.value
    return out


def read_artifact_json(c: MlflowClient, run_id: str, path: str):
    """A JSON artifact of a run (e.g. summary.json), or None if the run has none."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        try:
            local = c.download_artifacts(run_id, path, d)
        except Exception:
            return None
        return read_json(local)
