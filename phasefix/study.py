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
import csv
import importlib
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from phasefix.errors import ConfigError, check, check_choice
from phasefix.paths import OUTPUTS_DIR, PROJECT_ROOT

FIT_HOOK_ENV = "PHASEFIX_STUDY_FIT"  # "module:function" or "path/to/file.py:function": replaces fit (tests)
PARENT_ATTR = "mlflow_parent_run_id"
TOP_KEYS = ("name", "description", "base", "params", "objectives", "constraints", "sampler", "n_trials", "timeout",
            "storage", "pruning", "max_failures", "output_dir", "reports_dir", "experiment_name")
PARAM_TYPES = ("categorical", "int", "float", "logfloat")
SAMPLERS = ("tpe", "nsga2", "random")
DIRECTIONS = ("maximize", "minimize")
VAL_METRICS = ("acc_mean", "acc_worst", "acc_gap")  # what the module logs as val/<padding>/<key>
NONE_CHOICES = ("none", "null", "", None)


# ------------------------------------------------------------------------------------------------ the study file
@dataclass
class Param:
    name: str
    type: str
    override: str | None = None            # the config key this param sets (None: choices are override lists)
    choices: list = field(default_factory=list)               # categorical: the values Optuna sees (str/num)
    choice_overrides: dict = field(default_factory=dict)      # categorical: value -> list of overrides
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    requires: tuple[str, ...] = ()         # mitigations that must be enabled for this param to be sampled

    @property
    def sets_mitigations(self) -> bool:
        return self.override is not None and self.override.lstrip("+") == "mitigation"

    def overrides(self, value) -> list[str]:
        if self.type == "categorical":
            return list(self.choice_overrides[value])
        return [f"{self.override}={value!r}" if isinstance(value, float) else f"{self.override}={value}"]

    def mitigations(self, value) -> set[str]:
        return set() if value in NONE_CHOICES else set(str(value).split("+"))


@dataclass
class Objective:
    metric: str
    direction: str = "maximize"


@dataclass
class Constraint:
    metric: str
    max: float | None = None
    min: float | None = None
    missing: str = "fail"   # fail: a trial whose summary lacks the metric fails; ignore: counts as feasible

    def value(self, x: float) -> float:
        """Optuna's convention: <= 0 is feasible."""
        return (x - self.max) if self.max is not None else (self.min - x)


@dataclass
class PruneRule:
    step: int
    metric: str               # <padding>.<acc_mean|acc_worst|acc_gap>
    min: float | None = None  # prune when the value is below min ...
    max: float | None = None  # ... or above max (e.g. for acc_gap)

    @property
    def logged_key(self) -> str:
        pad, key = self.metric.split(".")
        return f"val/{pad}/{key}"


@dataclass
class StudySpec:
    name: str
    path: Path
    base: list[str]
    params: list[Param]
    objectives: list[Objective]
    constraints: list[Constraint] = field(default_factory=list)
    sampler: dict = field(default_factory=lambda: {"type": "tpe"})
    n_trials: int = 20
    timeout: float | None = None
    storage: str | None = None
    heartbeat_interval: int = 30
    grace_period: int = 120
    max_retry: int = 2
    pruning: list[PruneRule] = field(default_factory=list)
    max_failures: int = 5
    output_dir: Path | None = None
    reports_dir: Path | None = None
    experiment_name: str | None = None
    description: str = ""
    raw: dict = field(default_factory=dict)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def metric_names(self) -> list[str]:
        return [o.metric for o in self.objectives]

    def storage_url(self, override: str | None = None) -> str:
        return override or self.storage or f"sqlite:///{(self.path.parent / f'{self.name}.db').resolve()}"

    def reports(self) -> Path:
        return self.reports_dir or (self.path.parent / "reports" / self.name).resolve()

    def outputs(self) -> Path:
        return self.output_dir or (OUTPUTS_DIR / "studies" / self.name)


def _num(key: str, v, kind=float):
    if isinstance(v, str):  # YAML reads 1e-3 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    check(isinstance(v, (int, float)) and not isinstance(v, bool), key, v, "must be a number")
    if kind is int:
        check(float(v).is_integer(), key, v, "must be an integer")
        return int(v)
    return float(v)


def _choice_name(c) -> str | int | float | bool | None:
    """A categorical choice as Optuna stores it: lists (mitigation sets) become 'a+b', [] becomes 'none'."""
    if isinstance(c, (list, tuple)):
        return "+".join(str(x) for x in c) if c else "none"
    return c


def _hydra_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    return str(v)


def _parse_param(name: str, d, where: str) -> Param:
    key = f"{where}.{name}"
    check(isinstance(d, dict), key, d, "must be a mapping with a 'type'")
    known = {"type", "override", "choices", "low", "high", "step", "log", "requires"}
    unknown = sorted(set(d) - known)
    check(not unknown, f"{key}.{unknown[0] if unknown else ''}", d.get(unknown[0]) if unknown else None,
          f"is not a param key: allowed keys are {', '.join(sorted(known))}")
    check_choice(f"{key}.type", d.get("type"), PARAM_TYPES)
    p = Param(name=name, type=d["type"], override=d.get("override"))
    if p.override is not None:
        check(isinstance(p.override, str) and re.fullmatch(r"[+~]?[A-Za-z_][\w.]*", p.override) is not None,
              f"{key}.override", p.override, "must be a config key such as optim.lr or +mitigation")
    if p.type == "categorical":
        choices = d.get("choices")
        check(isinstance(choices, (list, dict)) and len(choices) > 0, f"{key}.choices", choices,
              "must be a non-empty list (or a mapping name -> list of overrides)")
        if isinstance(choices, dict):  # named bundles of overrides, e.g. W8S8: [model.window=8, model.stride=8]
            check(p.override is None, f"{key}.override", p.override,
                  "must be absent when choices map names to override lists")
            for cname, ovs in choices.items():
                ovs = [] if ovs is None else ovs
                check(isinstance(ovs, list) and all(isinstance(o, str) and "=" in o for o in ovs),
                      f"{key}.choices.{cname}", ovs, "must be a list of key=value overrides")
                p.choices.append(str(cname))
                p.choice_overrides[str(cname)] = list(ovs)
        else:
            check(p.override is not None, f"{key}.override", None,
                  "is required for a list of choices (the config key the choice sets)")
            for c in choices:
                check(c is None or isinstance(c, (str, int, float, bool, list)), f"{key}.choices", c,
                      "must be a string, number, boolean, null or a list of names")
                value = _choice_name(c)
                check(value not in p.choices, f"{key}.choices", c, "appears twice")
                p.choices.append(value)
                if p.sets_mitigations:
                    names = [] if value in NONE_CHOICES else str(value).split("+")
                    p.choice_overrides[value] = [f"+mitigation=[{','.join(names)}]"] if names else []
                elif p.override.startswith("+") and value in NONE_CHOICES:  # an optional group left out
                    p.choice_overrides[value] = []
                elif isinstance(c, list):
                    p.choice_overrides[value] = [f"{p.override}=[{','.join(map(_hydra_value, c))}]"]
                else:
                    p.choice_overrides[value] = [f"{p.override}={_hydra_value(c)}"]
    else:
        check(p.override is not None, f"{key}.override", None, "is required (the config key the param sets)")
        check(not p.override.startswith(("+", "~")) or p.override.startswith("+"), f"{key}.override", p.override,
              "cannot delete a key")
        kind = int if p.type == "int" else float
        p.low = _num(f"{key}.low", d.get("low"), kind)
        p.high = _num(f"{key}.high", d.get("high"), kind)
        check(p.low <= p.high, f"{key}.high", p.high, f"must be >= low ({p.low})")
        p.log = bool(d.get("log", False)) or p.type == "logfloat"
        if p.type == "logfloat":
            p.type = "float"
        if d.get("step") is not None:
            p.step = _num(f"{key}.step", d["step"], kind)
            check(p.step > 0, f"{key}.step", p.step, "must be > 0")
            check(not p.log, f"{key}.step", p.step, "cannot be combined with log: true")
        if p.log:
            check(p.low > 0, f"{key}.low", p.low, "must be > 0 with a log scale")
    requires = d.get("requires")
    if requires is None and p.override and p.override.lstrip("+").startswith("mitigation."):
        parts = p.override.lstrip("+").split(".")
        requires = [parts[1]] if len(parts) > 2 else None  # mitigation.<name>.<key>: only when <name> is on
    if requires is not None:
        requires = [requires] if isinstance(requires, str) else requires
        check(isinstance(requires, list) and all(isinstance(r, str) for r in requires), f"{key}.requires",
              requires, "must be a mitigation name or a list of them")
        p.requires = tuple(requires)
    return p


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study file; every problem is a one-line ConfigError naming the key."""
    path = Path(path).expanduser()
    check(path.is_file(), "study file", str(path), "does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    check(isinstance(raw, dict), "study file", str(path), "must hold a mapping")
    try:
        return _parse_spec(raw, path.resolve())
    except ConfigError as e:
        raise ConfigError(f"{path.name}: {e}") from None


def _parse_spec(raw: dict, path: Path) -> StudySpec:
    unknown = sorted(set(raw) - set(TOP_KEYS))
    check(not unknown, unknown[0] if unknown else "", raw.get(unknown[0]) if unknown else None,
          f"is not a study key: allowed keys are {', '.join(TOP_KEYS)}")
    name = raw.get("name") or path.stem
    check(isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) is not None, "name", name,
          "must be letters, digits, '_', '.', '-'")
    base = raw.get("base") or []
    check(isinstance(base, list) and all(isinstance(o, str) and "=" in o for o in base), "base", base,
          "must be a list of key=value overrides")
    params_raw = raw.get("params") or {}
    check(isinstance(params_raw, dict), "params", params_raw, "must be a mapping name -> {type, ...}")
    params = [_parse_param(str(n), d, "params") for n, d in params_raw.items()]
    mit = [p for p in params if p.sets_mitigations]
    check(len(mit) <= 1, "params", [p.name for p in mit], "at most one param may choose the mitigation set")
    base_mit = [o for o in base if o.lstrip("+").startswith("mitigation=")]
    if mit:
        check(not base_mit, "base", base_mit[0] if base_mit else None,
              f"sets the mitigations that params.{mit[0].name} chooses")
    params.sort(key=lambda p: not p.sets_mitigations)  # the mitigation set first: weights depend on it
    for p in params:  # a weight of a mitigation that is never enabled is a typo
        for r in p.requires:
            possible = _base_mitigations(base) | {m for pm in mit for c in pm.choices for m in pm.mitigations(c)}
            check(r in possible, f"params.{p.name}.requires", r,
                  f"mitigation {r!r} is never enabled (base or a mitigation-set param)")

    objectives_raw = raw.get("objectives") or ["prefix.acc_mean", "prefix.acc_worst"]
    check(isinstance(objectives_raw, list), "objectives", objectives_raw, "must be a list")
    objectives = []
    for i, o in enumerate(objectives_raw):
        if isinstance(o, str):
            o = {"metric": o}
        check(isinstance(o, dict) and isinstance(o.get("metric"), str), f"objectives[{i}]", o,
              "must be a metric name (maximised) or {metric: NAME, direction: maximize|minimize}")
        check(set(o) <= {"metric", "direction"}, f"objectives[{i}]", o, "allowed keys are metric, direction")
        d = o.get("direction", "maximize")
        check_choice(f"objectives[{i}].direction", d, DIRECTIONS)
        objectives.append(Objective(o["metric"], d))
    check(len({o.metric for o in objectives}) == len(objectives), "objectives", objectives_raw, "repeat a metric")

    constraints = []
    for i, c in enumerate(raw.get("constraints") or []):
        key = f"constraints[{i}]"
        check(isinstance(c, dict) and isinstance(c.get("metric"), str), key, c,
              "must be {metric: NAME, max: X} or {metric: NAME, min: X}")
        check(set(c) <= {"metric", "max", "min", "missing"}, key, c, "allowed keys are metric, max, min, missing")
        check(("max" in c) != ("min" in c), key, c, "needs exactly one of max, min")
        missing = c.get("missing", "fail")
        check_choice(f"{key}.missing", missing, ("fail", "ignore"))
        bound = "max" if "max" in c else "min"
        constraints.append(Constraint(c["metric"], **{bound: _num(f"{key}.{bound}", c[bound])}, missing=missing))

    sampler = raw.get("sampler") or {}
    if isinstance(sampler, str):
        sampler = {"type": sampler}
    check(isinstance(sampler, dict), "sampler", sampler, "must be a sampler name or {type: tpe|nsga2|random, ...}")
    sampler = {"type": "tpe", **sampler}
    check_choice("sampler.type", sampler["type"], SAMPLERS)
    allowed = {"tpe": {"type", "seed", "n_startup_trials", "multivariate"},
               "nsga2": {"type", "seed", "population_size"}, "random": {"type", "seed"}}[sampler["type"]]
    bad = sorted(set(sampler) - allowed)
    check(not bad, f"sampler.{bad[0] if bad else ''}", sampler.get(bad[0]) if bad else None,
          f"is not an option of the {sampler['type']} sampler: allowed are {', '.join(sorted(allowed))}")
    for k in ("seed", "n_startup_trials", "population_size"):
        if sampler.get(k) is not None:
            sampler[k] = _num(f"sampler.{k}", sampler[k], int)
    if "population_size" in sampler:
        check(sampler["population_size"] >= 2, "sampler.population_size", sampler["population_size"], "must be >= 2")

    storage = raw.get("storage") or {}
    if isinstance(storage, str):
        storage = {"url": storage}
    check(isinstance(storage, dict), "storage", storage, "must be a URL or {url, heartbeat_interval, grace_period, "
          "max_retry}")
    bad = sorted(set(storage) - {"url", "heartbeat_interval", "grace_period", "max_retry"})
    check(not bad, f"storage.{bad[0] if bad else ''}", None,
          "is not a storage key: allowed are url, heartbeat_interval, grace_period, max_retry")
    hb = _num("storage.heartbeat_interval", storage.get("heartbeat_interval", 30), int)
    grace = _num("storage.grace_period", storage.get("grace_period", max(120, 4 * hb)), int)
    check(hb >= 1, "storage.heartbeat_interval", hb, "must be >= 1 second")
    check(grace > hb, "storage.grace_period", grace, f"must be > heartbeat_interval ({hb})")
    max_retry = _num("storage.max_retry", storage.get("max_retry", 2), int)
    check(max_retry >= 0, "storage.max_retry", max_retry, "must be >= 0")
    url = storage.get("url")
    if url is not None:
        check_storage_url(url, "storage.url")

    pruning = []
    for i, r in enumerate(raw.get("pruning") or []):
        key = f"pruning[{i}]"
        check(isinstance(r, dict) and {"step", "metric"} <= set(r) and set(r) <= {"step", "metric", "min", "max"},
              key, r, "must be {step: N, metric: <padding>.<acc_mean|acc_worst|acc_gap>, min: X or max: X}")
        check(("min" in r) != ("max" in r), key, r, "needs exactly one of min, max")
        pad, _, m = str(r["metric"]).partition(".")
        check_choice(f"{key}.metric", m, VAL_METRICS)
        check_choice(f"{key}.metric", pad, ("prefix", "in_sequence"))
        bound = "min" if "min" in r else "max"
        pruning.append(PruneRule(step=_num(f"{key}.step", r["step"], int), metric=f"{pad}.{m}",
                                 **{bound: _num(f"{key}.{bound}", r[bound])}))

    n_trials = _num("n_trials", raw.get("n_trials", 20), int)
    check(n_trials >= 1, "n_trials", n_trials, "must be >= 1")
    timeout = raw.get("timeout")
    if timeout is not None:
        timeout = _num("timeout", timeout)
        check(timeout > 0, "timeout", timeout, "must be > 0 seconds")
    max_failures = _num("max_failures", raw.get("max_failures", 5), int)
    check(max_failures >= 1, "max_failures", max_failures, "must be >= 1")

    def a_path(key):
        v = raw.get(key)
        if v is None:
            return None
        check(isinstance(v, str), key, v, "must be a path")
        p = Path(v).expanduser()
        return (p if p.is_absolute() else path.parent / p).resolve()

    exp = raw.get("experiment_name")
    check(exp is None or isinstance(exp, str), "experiment_name", exp, "must be a string")
    return StudySpec(name=name, path=path, base=list(base), params=params, objectives=objectives,
                     constraints=constraints, sampler=sampler, n_trials=n_trials, timeout=timeout, storage=url,
                     heartbeat_interval=hb, grace_period=grace, max_retry=max_retry, pruning=pruning,
                     max_failures=max_failures, output_dir=a_path("output_dir"), reports_dir=a_path("reports_dir"),
                     experiment_name=exp, description=str(raw.get("description") or ""), raw=raw)


def storage_driver(url: str) -> str:
    """`postgresql://` with the driver that is installed: SQLAlchemy 2.1 defaults to psycopg 3, while phasefix's
    `postgres` extra installs psycopg2."""
    if url.startswith("postgresql://"):
        import importlib.util as iu

        if iu.find_spec("psycopg") is None and iu.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def check_storage_url(url, key: str = "--storage") -> None:
    check(isinstance(url, str) and re.match(r"^(sqlite|postgresql|postgresql\+\w+|mysql|mysql\+\w+)://", url)
          is not None, key, url, "must be an RDB URL (sqlite:///PATH or postgresql://USER:PASS@HOST/DB): "
          "Optuna 5 keeps trial heartbeats only in RDB storages")


def _base_mitigations(base: Sequence[str]) -> set[str]:
    for o in base:
        k, _, v = o.lstrip("+").partition("=")
        if k == "mitigation":
            return {n.strip() for n in v.strip("[]").split(",") if n.strip()}
    return set()


# ------------------------------------------------------------------------------------------------ trial configs
def suggest(trial, spec: StudySpec) -> list[str]:
    """Sample this trial's params (define-by-run: a mitigation's weights only when it is enabled); the overrides."""
    enabled = _base_mitigations(spec.base)
    out: list[str] = []
    for p in spec.params:
        if p.requires and not set(p.requires) <= enabled:
            continue
        if p.type == "categorical":
            v = trial.suggest_categorical(p.name, p.choices)
            if p.sets_mitigations:
                enabled |= p.mitigations(v)
        elif p.type == "int":
            v = trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        else:
            v = trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)
        out += p.overrides(v)
    return out


def validation_overrides(spec: StudySpec) -> list[list[str]]:
    """A few override lists covering every choice and both ends of every range (with every mitigation any
    choice enables), composed up front so that a misspelt key fails before any trial."""
    mit = next((p for p in spec.params if p.sets_mitigations), None)
    all_mits = sorted({m for c in mit.choices for m in mit.mitigations(c)}) if mit else []
    n = max([2] + [len(p.choices) for p in spec.params if p.type == "categorical"])
    combos = []
    for i in range(n):
        ovs = list(spec.base)
        if all_mits:
            ovs.append(f"+mitigation=[{','.join(all_mits)}]")
        for p in spec.params:
            if p.sets_mitigations:
                continue
            if p.type == "categorical":
                ovs += p.overrides(p.choices[min(i, len(p.choices) - 1)])
            else:
                v = p.low if i % 2 == 0 else p.high
                ovs += p.overrides(int(v) if p.type == "int" else float(v))
        combos.append(ovs)
    return combos


def validate(spec: StudySpec, deep: bool = True) -> None:
    """Compose the base and the search space's corners (ConfigError naming the key); `plan()` the base."""
    from phasefix.fit import compose, plan, plan_model

    base_cfg = compose(spec.base)
    if deep:
        plan(base_cfg)
    for ovs in validation_overrides(spec):
        try:  # a choice the model cannot take (head_coord with one KV head) would fail every trial that draws it
            plan_model(compose(ovs))
        except ConfigError as e:
            raise ConfigError(f"{spec.path.name}: {e}") from None
    pads = set(base_cfg.eval.paddings)
    for i, o in enumerate(spec.objectives + spec.constraints):
        pad = o.metric.split(".")[0]
        if pad in ("prefix", "in_sequence"):
            what = f"objectives[{i}]" if i < len(spec.objectives) else f"constraints[{i - len(spec.objectives)}]"
            check(pad in pads, f"{spec.path.name}: {what}.metric", o.metric,
                  f"needs eval.paddings to include {pad} (it is {sorted(pads)})")
    for i, r in enumerate(spec.pruning):
        check(r.metric.split(".")[0] in pads, f"{spec.path.name}: pruning[{i}].metric", r.metric,
              f"needs eval.paddings to include {r.metric.split('.')[0]}")


def metric_value(summary: dict, metric: str):
    """`prefix.acc_worst` -> summary['prefix']['acc_worst']; None when absent."""
    v: Any = summary
    for part in metric.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


# ------------------------------------------------------------------------------------------------ pruning
def pruning_callback(trial, rules: Sequence[PruneRule]):
    """A Lightning callback: records each validation in the trial (user attr `val_history`) and raises
    `optuna.TrialPruned` when a rule's metric misses its bound at the first validation at or after its step.
    Multi-objective studies cannot use `trial.report`/`should_prune`, so this is the study's pruner."""
    import optuna
    from lightning.pytorch.callbacks import Callback

    class StudyPruner(Callback):
        def __init__(self):
            self.done: set[int] = set()
            self.history: list[dict] = []

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
                if i in self.done or step < r.step or r.logged_key not in vals:
                    continue
                self.done.add(i)
                v = vals[r.logged_key]
                if (r.min is not None and v < r.min) or (r.max is not None and v > r.max):
                    bound = f"< {r.min}" if r.min is not None else f"> {r.max}"
                    msg = f"{r.metric}={v:.4f} {bound} at step {step}"
                    trial.set_user_attr("pruned", msg)
                    raise optuna.TrialPruned(msg)

    return StudyPruner()


# ------------------------------------------------------------------------------------------------ storage
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback  # the new name since Optuna 4.9
        retry = retry_cls(max_retry=spec.max_retry)

    def on_stale(study, trial):
        retry(study, trial)
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id:
            try:
                from phasefix import tracking

                c = tracking.client(study.user_attrs.get("mlflow_tracking_uri"))
                c.set_tag(run_id, "optuna.state", "FAIL (worker died)")
                c.set_terminated(run_id, status="FAILED")
            except Exception as e:  # MLflow down must not stop the study
                print(f"[study] could not mark MLflow run {run_id} failed: {e}", file=sys.stderr)
        print(f"[study] trial {trial.number} lost its worker (no heartbeat for {spec.grace_period}s): "
              f"marked failed and retried", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat options are "experimental"
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs,
            heartbeat_interval=spec.heartbeat_interval if with_callbacks else None,
            grace_period=spec.grace_period if with_callbacks else None,
            heartbeat_stale_trial_callback=on_stale if with_callbacks else None)


def make_sampler(spec: StudySpec, worker: int = 0):
    import optuna

    s = spec.sampler
    seed = None if s.get("seed") is None else s["seed"] + 1000 * worker  # workers must not propose the same
    cf = constraints_func if spec.constraints else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if s["type"] == "nsga2":
            return optuna.samplers.NSGAIISampler(population_size=s.get("population_size", 50), seed=seed,
                                                 constraints_func=cf)
        if s["type"] == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        multivariate = s.get("multivariate", True)
        return optuna.samplers.TPESampler(n_startup_trials=s.get("n_startup_trials", 10), seed=seed,
                                          multivariate=multivariate, group=multivariate, constant_liar=True,
                                          constraints_func=cf)


def constraints_func(trial) -> list[float]:
    """Constraint values stored by the objective (user attr `constraints`, <= 0 feasible)."""
    return list(trial.user_attrs.get("constraints", [1.0]))


def open_study(spec: StudySpec, url: str, worker: int = 0, create: bool = False):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(spec, url)
    sampler = make_sampler(spec, worker)
    if create:
        study = optuna.create_study(storage=storage, study_name=spec.name, directions=spec.directions,
                                    sampler=sampler, load_if_exists=True)
        stored = [d.name.lower() for d in study.directions]
        check(stored == spec.directions, "objectives", spec.directions,
              f"differ from the stored study {spec.name!r} ({stored}) in {redact(url)}: use another name or storage")
        if study.metric_names != spec.metric_names:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental"
                study.set_metric_names(spec.metric_names)
        return study
    return optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler)


def redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# ------------------------------------------------------------------------------------------------ MLflow
def base_config(spec: StudySpec):
    from phasefix.fit import compose

    cfg = compose(spec.base)
    return cfg


def experiment_name(spec: StudySpec, cfg) -> str:
    if spec.experiment_name:
        return spec.experiment_name
    if any(o.startswith("logger.experiment_name=") for o in spec.base):
        return cfg.logger.experiment_name
    return f"study-{spec.name}"


def ensure_parent_run(spec: StudySpec, study, url: str) -> str:
    """The study's MLflow parent run (created once, its id kept as the study's user attr), set RUNNING."""
    from phasefix import tracking

    cfg = base_config(spec)
    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    c = tracking.client(uri)
    run_id = study.user_attrs.get(PARENT_ATTR)
    if run_id:
        try:
            c.update_run(run_id, status="RUNNING")
            return run_id
        except Exception:
            print(f"[study] parent MLflow run {run_id} not found in {uri}: creating a new one", file=sys.stderr)
    exp_id = tracking.get_or_create_experiment(c, experiment_name(spec, cfg))
    run = c.create_run(exp_id, run_name=f"study-{spec.name}", tags={
        "phasefix.kind": "study", "study": spec.name, "study.storage": redact(url),
        "study.file": str(spec.path), "git_commit": tracking.git_commit(),
        "objectives": ",".join(f"{o.direction[:3]}:{o.metric}" for o in spec.objectives),
        "mlflow.note.content": spec.description or f"Optuna study {spec.name}"})
    c.log_text(run.info.run_id, spec.path.read_text(), "study.yaml")
    c.log_batch(run.info.run_id, params=_params([
        ("n_trials", spec.n_trials), ("sampler", spec.sampler["type"]),
        ("objectives", ",".join(spec.metric_names)), ("base", " ".join(spec.base)[:5000]),
        *((f"space.{p.name}", _space(p)) for p in spec.params)]))
    study.set_user_attr(PARENT_ATTR, run.info.run_id)
    study.set_user_attr("mlflow_tracking_uri", uri)
    study.set_user_attr("mlflow_experiment", experiment_name(spec, cfg))
    return run.info.run_id


def _params(items):
    from mlflow.entities import Param as MParam

    return [MParam(k, str(v)[:6000]) for k, v in items]


def _space(p: Param) -> str:
    if p.type == "categorical":
        return f"{p.override or 'bundle'} in {p.choices}"
    return f"{p.override} {p.type} [{p.low}, {p.high}]{' log' if p.log else ''}"


# ------------------------------------------------------------------------------------------------ the objective
def load_fit_hook() -> Callable | None:
    hook = os.environ.get(FIT_HOOK_ENV)
    if not hook:
        return None
    target, _, fn = hook.rpartition(":")
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location("_phasefix_study_hook", target)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    return getattr(mod, fn)


def make_objective(spec: StudySpec, parent_run_id: str | None, threads: int | None = None,
                   fit_fn: Callable | None = None):
    import optuna

    def objective(trial):
        try:
            return run_trial(trial)
        except optuna.TrialPruned:
            raise
        except Exception as e:  # every error is recorded, so that max_failures can stop a broken study
            if not trial.user_attrs.get("error"):
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
                trial.set_user_attr("error", msg)
            print(f"[study] trial {trial.number} failed: {trial.user_attrs['error']}", flush=True)
            raise

    def run_trial(trial):
        from phasefix.fit import compose

        for k in ("error", "pruned", "val_history", "mlflow_run_id", "constraints", "metrics"):  # a retry's copy
            if k in trial.user_attrs:
                trial.set_user_attr(k, None)
        ovs = suggest(trial, spec)
        trial.set_user_attr("overrides", ovs)
        out_dir = spec.outputs() / f"trial{trial.number:04d}-{datetime.now():%Y%m%d-%H%M%S}"
        extra = [f"output_dir='{out_dir}'", f"+logger.tags.study='{spec.name}'",
                 f"+logger.tags.trial='{trial.number}'", f"run_name='{spec.name}-t{trial.number}'"]
        if parent_run_id:
            extra.append(f"logger.parent_run_id='{parent_run_id}'")
        exp = trial.study.user_attrs.get("mlflow_experiment")  # the parent run's experiment
        if exp:
            extra.append(f"logger.experiment_name='{exp}'")
        if threads and not any(o.startswith("trainer.num_threads=") for o in spec.base + ovs):
            extra.append(f"trainer.num_threads={threads}")
        retried = trial.study._storage.get_trial_system_attrs(trial._trial_id).get("failed_trial")
        print(f"[study] trial {trial.number}{f' (retry of {retried})' if retried is not None else ''}: "
              f"{' '.join(ovs) or '(base)'}", flush=True)
        try:
            cfg = compose(list(spec.base) + ovs + extra)
            run = fit_fn or _real_fit()
            # the callback also records the MLflow run id at the start (a dead worker's run is then ended FAILED)
            # and the validation history; an injected fit (tests) without pruning rules gets none
            use_cb = spec.pruning or fit_fn is None
            summary = run(cfg, callbacks=[pruning_callback(trial, spec.pruning)] if use_cb else [])
        except optuna.TrialPruned as e:
            _mark_pruned(trial, str(e))
            print(f"[study] trial {trial.number} pruned: {e}", flush=True)
            raise
        if summary.get("mlflow_run_id"):
            trial.set_user_attr("mlflow_run_id", summary["mlflow_run_id"])
        metrics = {k: metric_value(summary, k) for k in
                   ("prefix.acc_mean", "prefix.acc_worst", "prefix.acc_gap", "in_sequence.acc_mean",
                    "in_sequence.acc_worst", "in_sequence.acc_gap", "lm_loss", "train_seconds")}
        metrics.update({o.metric: metric_value(summary, o.metric) for o in spec.objectives})
        trial.set_user_attr("metrics", {k: v for k, v in metrics.items() if v is not None})
        if spec.constraints:
            cons = []
            for c in spec.constraints:
                v = metric_value(summary, c.metric)
                if v is None:
                    check(c.missing == "ignore", "constraints.metric", c.metric,
                          "is not in the fit summary (set missing: ignore to treat it as satisfied)")
                    cons.append(0.0)
                else:
                    cons.append(c.value(float(v)))
            trial.set_user_attr("constraints", cons)
        values = []
        for o in spec.objectives:
            v = metric_value(summary, o.metric)
            if not isinstance(v, (int, float)) or math.isnan(float(v)):
                msg = f"objective {o.metric} is {v!r} in the fit summary"
                trial.set_user_attr("error", msg)
                raise ValueError(msg)
            values.append(float(v))
        return values

    return objective


def _real_fit():
    from phasefix.fit import fit

    return fit


def _mark_pruned(trial, msg: str) -> None:
    """fit() ends its MLflow run FAILED when the pruner raises; a pruned trial's run is KILLED, tagged pruned."""
    run_id = trial.user_attrs.get("mlflow_run_id")
    if not run_id:
        return
    try:
        from phasefix import tracking

        c = tracking.client(trial.study.user_attrs.get("mlflow_tracking_uri"))
        c.set_tag(run_id, "optuna.state", "PRUNED")
        c.set_tag(run_id, "optuna.pruned", msg)
        c.set_terminated(run_id, status="KILLED")
    except Exception as e:
        print(f"[study] could not tag MLflow run {run_id} as pruned: {e}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ workers
def counts(study) -> dict[str, int]:
    from optuna.trial import TrialState

    out = {s.name: 0 for s in TrialState}
    trials = study.get_trials(deepcopy=False)
    retried: set[int] = set()
    for t in trials:
        out[t.state.name] += 1
        retried.update(t.system_attrs.get("retry_history", []))
    # failed trials that were not retried: errors (and workers that died more than max_retry times)
    out["ERRORS"] = sum(1 for t in trials if t.state == TrialState.FAIL and t.number not in retried)
    return out


def run_worker(spec: StudySpec, url: str, n_trials: int, worker: int = 0, threads: int | None = None,
               fit_fn: Callable | None = None, poll_s: float | None = None) -> int:
    """Run trials until the study has `n_trials` finished ones (complete or pruned), then wait for the trials
    still running elsewhere: failing stale ones (a dead worker's) and running their retries. 0: done;
    3: stopped after max_failures trials raised errors; 4: timeout."""
    import optuna

    study = open_study(spec, url, worker)
    parent = study.user_attrs.get(PARENT_ATTR)
    objective = make_objective(spec, parent, threads, fit_fn or load_fit_hook())
    poll_s = poll_s or min(5.0, spec.heartbeat_interval)
    t0 = time.time()
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.fail_stale_trials(study)
        n = counts(study)
        if n["ERRORS"] >= spec.max_failures:
            print(f"[study] worker {worker}: {n['ERRORS']} trials failed with errors (max_failures="
                  f"{spec.max_failures}); stopping. See the trials' user attr 'error'.", file=sys.stderr, flush=True)
            return 3
        if spec.timeout and time.time() - t0 > spec.timeout:
            return 4
        finished = n["COMPLETE"] + n["PRUNED"]
        if n["WAITING"] > 0 or finished + n["RUNNING"] < n_trials:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=False)
            continue
        if n["RUNNING"] == 0:
            return 0
        time.sleep(poll_s)  # trials running elsewhere: wait for them to finish or go stale


def spawn_workers(spec: StudySpec, url: str, n_trials: int, k: int) -> int:
    """K worker processes on this machine, one log file each beside the storage's reports."""
    logs = spec.reports() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // k)
    procs = []
    for w in range(k):
        log = open(logs / f"worker{w}.log", "a")
        cmd = [sys.executable, "-m", "phasefix.study", str(spec.path), "--storage", url, "--n-trials",
               str(n_trials), "--_worker", str(w), "--_threads", str(threads)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd()), log))
    print(f"[study] {k} workers ({threads} threads each), logs: {logs}/worker*.log", flush=True)
    rc = 0
    try:
        for w, (p, log) in enumerate(procs):
            code = p.wait()
            log.close()
            if code != 0:
                reason = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                print(f"[study] worker {w} ended with {reason} (see {logs}/worker{w}.log)", file=sys.stderr)
                rc = rc or (code if code > 0 else 1)
    except KeyboardInterrupt:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p, _ in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    return rc


# ------------------------------------------------------------------------------------------------ reports
def trial_rows(spec: StudySpec, study, trials) -> list[dict]:
    params = [p.name for p in spec.params]
    rows = []
    for t in trials:
        row = {"trial": t.number, "state": t.state.name}
        for o, v in zip(spec.objectives, t.values or [None] * len(spec.objectives)):
            row[o.metric] = None if v is None else round(v, 4)
        extra = t.user_attrs.get("metrics") or {}
        for k in ("prefix.acc_gap", "in_sequence.acc_mean", "in_sequence.acc_worst", "lm_loss", "train_seconds"):
            if k not in row and k in extra:
                row[k] = extra[k]
        if spec.constraints:
            cons = t.user_attrs.get("constraints")
            row["feasible"] = None if cons is None else all(c <= 0 for c in cons)
        for p in params:
            v = t.params.get(p)
            row[p] = round(v, 6) if isinstance(v, float) else v
        row["mlflow_run_id"] = t.user_attrs.get("mlflow_run_id")
        row["retry_of"] = t.system_attrs.get("failed_trial")
        row["note"] = t.user_attrs.get("pruned") or t.user_attrs.get("error")
        rows.append(row)
    return rows


def pareto_trials(spec: StudySpec, study) -> list:
    """The Pareto front of the complete trials (feasible ones only when there are constraints)."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if spec.constraints:
        trials = [t for t in trials if all(c <= 0 for c in t.user_attrs.get("constraints", [1.0]))]
    signs = [1 if d == "maximize" else -1 for d in spec.directions]

    def dominates(a, b):
        va = [s * v for s, v in zip(signs, a.values)]
        vb = [s * v for s, v in zip(signs, b.values)]
        return all(x >= y for x, y in zip(va, vb)) and any(x > y for x, y in zip(va, vb))

    front = [t for t in trials if not any(dominates(o, t) for o in trials if o is not t)]
    return sorted(front, key=lambda t: [-s * v for s, v in zip(signs, t.values)])


def write_csv(path: Path, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols or ["trial"])
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def pareto_figure(spec: StudySpec, trials, front):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    mx, my = spec.metric_names[0], spec.metric_names[1] if len(spec.objectives) > 1 else None
    done = [t for t in trials if t.values]
    front_ids = {t.number for t in front}
    others = [t for t in done if t.number not in front_ids]
    if my is None:  # one objective: value per trial
        ax.scatter([t.number for t in done], [t.values[0] for t in done], c="grey", s=14)
        ax.set_xlabel("trial")
        ax.set_ylabel(mx)
    else:
        if others:
            ax.scatter([t.values[0] for t in others], [t.values[1] for t in others], c="lightgrey",
                       edgecolors="grey", s=18, label="trials")
        if front:
            xs, ys = [t.values[0] for t in front], [t.values[1] for t in front]
            order = sorted(range(len(front)), key=lambda i: xs[i])
            ax.plot([xs[i] for i in order], [ys[i] for i in order], "-o", color="C3", ms=5, label="Pareto front")
            for t in front:
                ax.annotate(str(t.number), (t.values[0], t.values[1]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        if {mx.split(".")[-1], my.split(".")[-1]} == {"acc_mean", "acc_worst"}:  # the goal worst >= 0.9 mean
            lo = min([t.values[0] for t in done] + [0.0])
            line = [lo, 1.0]
            if mx.endswith("acc_mean"):
                ax.plot(line, [0.9 * v for v in line], ":", color="C2", lw=1, label="worst = 0.9 x mean")
            else:
                ax.plot([0.9 * v for v in line], line, ":", color="C2", lw=1, label="worst = 0.9 x mean")
        ax.set_xlabel(f"{mx} ({spec.directions[0][:3]})")
        ax.set_ylabel(f"{my} ({spec.directions[1][:3]})")
        ax.legend(fontsize=7, loc="best")
    ax.set_title(f"study {spec.name}: {len(done)} complete trials, {len(front)} on the front", fontsize=9)
    fig.tight_layout()
    return fig


def format_table(rows: list[dict], max_rows: int = 15) -> str:
    if not rows:
        return "(no complete trials yet)"
    cols = [k for k in rows[0] if k not in ("state", "retry_of", "note")]
    cells = [[("" if r.get(k) is None else f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r[k]))[:40]
              for k in cols] for r in rows[:max_rows]]
    cols = [c if c != "mlflow_run_id" else "mlflow run" for c in cols]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more in pareto.csv")
    return "\n".join(lines)


def report(spec: StudySpec, url: str, log_to_mlflow: bool = True, quiet: bool = False) -> dict:
    """Write pareto.csv, trials.csv and pareto.png under the reports dir, log them to the parent run, print the
    best trade-offs. Returns {'pareto': rows, 'dir': path, 'counts': ...}."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            study = optuna.load_study(study_name=spec.name, storage=make_storage(spec, url, with_callbacks=False))
        except KeyError:
            raise ConfigError(f"study {spec.name!r} is not in {redact(url)}: run it first (or pass its --storage)")
    trials = study.get_trials(deepcopy=False)
    front = pareto_trials(spec, study)
    out = spec.reports()
    out.mkdir(parents=True, exist_ok=True)
    front_rows = trial_rows(spec, study, front)
    write_csv(out / "pareto.csv", front_rows)
    write_csv(out / "trials.csv", trial_rows(spec, study, trials))
    from phasefix import tracking  # matplotlib Agg, MLflow

    fig = pareto_figure(spec, [t for t in trials if t.state.name == "COMPLETE"], front)
    fig.savefig(out / "pareto.png", dpi=110)
    n = counts(study)
    parent = study.user_attrs.get(PARENT_ATTR)
    if log_to_mlflow and parent:
        try:
            c = tracking.client(study.user_attrs.get("mlflow_tracking_uri"))
            tracking.log_figure(c, parent, fig, "pareto/pareto.png")
            for name in ("pareto.csv", "trials.csv"):
                c.log_artifact(parent, str(out / name), "pareto")
            from mlflow.entities import Metric

            ts = int(time.time() * 1000)
            c.log_batch(parent, metrics=[Metric(f"study/{k.lower()}", float(v), ts, 0) for k, v in n.items()
                                         if k in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")]
                        + [Metric(f"pareto/{m}", float(max(r[m] for r in front_rows) if d == "maximize"
                                                    else min(r[m] for r in front_rows)), ts, 0)
                           for m, d in zip(spec.metric_names, spec.directions) if front_rows])
        except Exception as e:
            print(f"[study] could not log the report to MLflow run {parent}: {e}", file=sys.stderr)
    else:
        import matplotlib.pyplot as plt

        plt.close(fig)
    if not quiet:
        print(f"\nstudy {spec.name} ({redact(url)}): {n['COMPLETE']} complete, {n['PRUNED']} pruned, "
              f"{n['FAIL']} failed, {n['RUNNING']} running, {n['WAITING']} waiting; MLflow parent run {parent}")
        print(f"Pareto front ({len(front)} trials, best {spec.metric_names[0]} first):")
        print(format_table(front_rows))
        print(f"reports: {out}/pareto.csv, pareto.png, trials.csv")
    return {"pareto": front_rows, "dir": out, "counts": n, "parent_run_id": parent}


def finish_parent(study, complete: bool) -> None:
    parent = study.user_attrs.get(PARENT_ATTR)
    if not parent:
        return
    try:
        from phasefix import tracking

        c = tracking.client(study.user_attrs.get("mlflow_tracking_uri"))
        c.set_terminated(parent, status="FINISHED" if complete else "KILLED")
    except Exception as e:
        print(f"[study] could not end MLflow run {parent}: {e}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ CLI
def run_study(path: str | Path, n_trials: int | None = None, storage: str | None = None, workers: int = 1,
              report_only: bool = False, fit_fn: Callable | None = None) -> dict:
    """The CLI's work: validate, create or resume the study, run the workers, report. Returns report()'s dict
    plus 'rc'."""
    spec = load_spec(path)
    if storage:
        check_storage_url(storage)
    url = spec.storage_url(storage)
    budget = n_trials or spec.n_trials
    check(budget >= 1, "--n-trials", budget, "must be >= 1")
    check(workers >= 1, "--workers", workers, "must be >= 1")
    if report_only:
        res = report(spec, url)
        res["rc"] = 0
        return res
    validate(spec)
    study = open_study(spec, url, create=True)
    ensure_parent_run(spec, study, url)
    n = counts(study)
    print(f"[study] {spec.name}: {redact(url)}; {n['COMPLETE'] + n['PRUNED']} of {budget} trials finished, "
          f"{workers} worker(s); MLflow parent run {study.user_attrs.get(PARENT_ATTR)}", flush=True)
    interrupted = False
    try:
        if workers == 1:
            rc = run_worker(spec, url, budget, fit_fn=fit_fn)
        else:
            rc = spawn_workers(spec, url, budget, workers)
    except KeyboardInterrupt:
        interrupted, rc = True, 130
    n = counts(study)
    complete = n["COMPLETE"] + n["PRUNED"] >= budget and n["RUNNING"] == 0
    res = report(spec, url)
    if rc and complete:
        print("[study] the study reached its budget; a worker ended abnormally and its trials were retried",
              file=sys.stderr)
        rc = 0
    finish_parent(study, complete and not interrupted)
    res["rc"] = rc
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phasefix.study", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="study file, e.g. studies/mean_vs_worst.yaml")
    ap.add_argument("--n-trials", type=int, default=None, help="total trial budget (overrides n_trials)")
    ap.add_argument("--storage", default=None,
                    help="Optuna RDB URL (default sqlite:///<study dir>/<name>.db); postgresql://... for many machines")
    ap.add_argument("--workers", type=int, default=1, help="worker processes on this machine")
    ap.add_argument("--report", action="store_true", help="only write and print the Pareto report")
    ap.add_argument("--_worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        if args._worker is not None:  # one of --workers K's processes
            spec = load_spec(args.study)
            url = spec.storage_url(args.storage)
            return run_worker(spec, url, args.n_trials or spec.n_trials, worker=args._worker, threads=args._threads)
        res = run_study(args.study, args.n_trials, args.storage, args.workers, args.report)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return res["rc"]


if __name__ == "__main__":
    sys.exit(main())
