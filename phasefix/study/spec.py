"""The study file (`studies/<name>.yaml`) as typed dataclasses: parsing, and validation against the fit config.

Every problem is a one-line `ConfigError` naming the key and what is allowed; `validate` composes the base and the
corners of the search space with `phasefix.fit.compose`, so that a misspelt override key fails before any trial.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from phasefix.data.layout import PADDINGS
from phasefix.errors import ConfigError, check, check_choice, check_known_keys, check_number
from phasefix.paths import OUTPUTS_DIR
from phasefix.study.search_space import Param, base_mitigations, parse_params

TOP_KEYS = ("name", "description", "base", "params", "objectives", "constraints", "sampler", "n_trials", "timeout",
            "storage", "pruning", "max_failures", "output_dir", "reports_dir", "experiment_name", "confirm", "seeds",
            "duplicates")
DUPLICATES = ("reuse", "rerun")  # a trial whose params a finished trial already had: its values, or a new fit
CONFIRM_KEYS = ("seeds", "baseline")
SAMPLER_KEYS = {"tpe": ("type", "seed", "n_startup_trials", "multivariate"),
                "nsga2": ("type", "seed", "population_size"), "random": ("type", "seed"),
                "grid": ("type", "seed")}
SAMPLERS = tuple(SAMPLER_KEYS)
STORAGE_KEYS = ("url", "heartbeat_interval", "grace_period", "max_retry")
DIRECTIONS = ("maximize", "minimize")
VAL_METRICS = ("acc_mean", "acc_worst", "acc_gap")  # what the module logs as val/<padding>/<key>


def logged_name(metric: str, split: str = "final") -> str:
    """A study metric by the name the run logs it under (`phasefix.tracking.phase_metric`): objectives and
    constraints read the final evaluation (`final/prefix/acc_mean`, `final/lm_loss`), pruning rules the validation
    during training (`val/prefix/acc_mean`). The spelling of earlier study files, `prefix.acc_mean` and `lm_loss`,
    names the same metric. Other names (`compressor_flops_per_token`, `train_seconds`) are keys of the fit summary
    that are not logged as metrics, and stay as written."""
    from phasefix.tracking import phase_metric

    pad, dot, key = metric.partition(".")
    if dot and pad in PADDINGS:
        return phase_metric(split, pad, key)
    return f"{split}/lm_loss" if metric == "lm_loss" else metric


def metric_padding(metric: str) -> str | None:
    """The padding a phase metric (`<split>/<padding>/<key>`) reads, None for other metrics."""
    parts = metric.split("/")
    return parts[1] if len(parts) == 3 and parts[1] in PADDINGS else None


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

    @property
    def key(self) -> str:
        """The constraint's name in Optuna (`Trial.set_constraint`), e.g. `lm_loss.max`, `prefix.acc_mean.min`: the
        earlier spelling, so that a study started before the logged names keeps one name per constraint."""
        name = self.metric.removeprefix("final/").replace("/", ".")
        return f"{name}.{'max' if self.max is not None else 'min'}"

    def value(self, x: float) -> float:
        """Optuna's convention: <= 0 is feasible."""
        return (x - self.max) if self.max is not None else (self.min - x)


@dataclass
class PruneRule:
    step: int
    metric: str               # val/<padding>/<acc_mean|acc_worst|acc_gap>, as logged during training
    min: float | None = None  # prune when the value is below min ...
    max: float | None = None  # ... or above max (e.g. for acc_gap)


@dataclass
class StudySpec:
    """A parsed, checked study file (its keys: docs/studies.md)."""

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
    seeds: list[int] = field(default_factory=list)  # each trial trains on every seed; its metrics are their mean
    duplicates: str = "reuse"  # one of DUPLICATES
    confirm_seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # `confirm=k`: fresh seeds ...
    confirm_baseline: list[str] = field(default_factory=list)  # ... and the unmitigated model (overrides on base)
    raw: dict = field(default_factory=dict)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def trial_seeds(self) -> list[str]:
        """The seeds the trials train on: `seeds`, else the base's `seed=`, else the config's default 0."""
        return [str(x) for x in self.seeds] or [o.split("=", 1)[1] for o in self.base if o.startswith("seed=")] or ["0"]

    @property
    def metric_names(self) -> list[str]:
        return [o.metric for o in self.objectives]

    def storage_url(self, override: str | None = None) -> str:
        return override or self.storage or f"sqlite:///{(self.path.parent / f'{self.name}.db').resolve()}"

    def reports(self) -> Path:
        return self.reports_dir or (self.path.parent / "reports" / self.name).resolve()

    def outputs(self) -> Path:
        return self.output_dir or (OUTPUTS_DIR / "studies" / self.name)


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
    check_known_keys(raw, TOP_KEYS, "", "a study key")
    name = raw.get("name") or path.stem
    check(isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) is not None, "name", name,
          "must be letters, digits, '_', '.', '-'")
    base = raw.get("base") or []
    check(isinstance(base, list) and all(isinstance(o, str) and "=" in o for o in base), "base", base,
          "must be a list of key=value overrides")
    sections = dict(params=parse_params(raw.get("params"), base), objectives=_parse_objectives(raw.get("objectives")),
                    constraints=_parse_constraints(raw.get("constraints")), sampler=_parse_sampler(raw.get("sampler")),
                    **_parse_storage(raw.get("storage")), pruning=_parse_pruning(raw.get("pruning")),
                    **_parse_confirm(raw.get("confirm")))
    n_trials = check_number("n_trials", raw.get("n_trials", 20), int)
    check(n_trials >= 1, "n_trials", n_trials, "must be >= 1")
    timeout = raw.get("timeout")
    if timeout is not None:
        timeout = check_number("timeout", timeout)
        check(timeout > 0, "timeout", timeout, "must be > 0 seconds")
    seeds = _seed_list("seeds", raw["seeds"]) if raw.get("seeds") is not None else []
    check(not seeds or not any(o.startswith("seed=") for o in base), "seeds", seeds,
          "and a seed= in base exclude each other (seeds: sets each run's seed)")
    max_failures = check_number("max_failures", raw.get("max_failures", 5), int)
    check(max_failures >= 1, "max_failures", max_failures, "must be >= 1")

    def a_path(key):
        v = raw.get(key)
        if v is None:
            return None
        check(isinstance(v, str), key, v, "must be a path")
        p = Path(v).expanduser()
        return (p if p.is_absolute() else path.parent / p).resolve()

    check_choice("duplicates", duplicates := raw.get("duplicates", "reuse"), DUPLICATES)
    exp = raw.get("experiment_name")
    check(exp is None or isinstance(exp, str), "experiment_name", exp, "must be a string")
    return StudySpec(name=name, path=path, base=list(base), **sections, seeds=seeds, duplicates=duplicates,
                     n_trials=n_trials, timeout=timeout, max_failures=max_failures, output_dir=a_path("output_dir"),
                     reports_dir=a_path("reports_dir"), experiment_name=exp,
                     description=str(raw.get("description") or ""), raw=raw)


def _parse_objectives(raw) -> list[Objective]:
    raw = raw or ["prefix.acc_mean", "prefix.acc_worst"]
    check(isinstance(raw, list), "objectives", raw, "must be a list")
    objectives = []
    for i, o in enumerate(raw):
        if isinstance(o, str):
            o = {"metric": o}
        check(isinstance(o, dict) and isinstance(o.get("metric"), str), f"objectives[{i}]", o,
              "must be a metric name (maximised) or {metric: NAME, direction: maximize|minimize}")
        check(set(o) <= {"metric", "direction"}, f"objectives[{i}]", o, "allowed keys are metric, direction")
        d = o.get("direction", "maximize")
        check_choice(f"objectives[{i}].direction", d, DIRECTIONS)
        objectives.append(Objective(logged_name(o["metric"]), d))
    check(len({o.metric for o in objectives}) == len(objectives), "objectives", raw, "repeat a metric")
    return objectives


def _parse_constraints(raw) -> list[Constraint]:
    constraints = []
    for i, c in enumerate(raw or []):
        key = f"constraints[{i}]"
        check(isinstance(c, dict) and isinstance(c.get("metric"), str), key, c,
              "must be {metric: NAME, max: X} or {metric: NAME, min: X}")
        check(set(c) <= {"metric", "max", "min", "missing"}, key, c, "allowed keys are metric, max, min, missing")
        check(("max" in c) != ("min" in c), key, c, "needs exactly one of max, min")
        missing = c.get("missing", "fail")
        check_choice(f"{key}.missing", missing, ("fail", "ignore"))
        bound = "max" if "max" in c else "min"
        constraints.append(Constraint(logged_name(c["metric"]), **{bound: check_number(f"{key}.{bound}", c[bound])},
                                      missing=missing))
    return constraints


def _parse_sampler(raw) -> dict:
    sampler = {"type": raw} if isinstance(raw, str) else raw or {}
    check(isinstance(sampler, dict), "sampler", sampler, "must be a sampler name or {type: tpe|nsga2|random, ...}")
    sampler = {"type": "tpe", **sampler}
    check_choice("sampler.type", sampler["type"], SAMPLERS)
    check_known_keys(sampler, SAMPLER_KEYS[sampler["type"]], "sampler", f"an option of the {sampler['type']} sampler")
    for k in ("seed", "n_startup_trials", "population_size"):
        if sampler.get(k) is not None:
            sampler[k] = check_number(f"sampler.{k}", sampler[k], int)
    if "population_size" in sampler:
        check(sampler["population_size"] >= 2, "sampler.population_size", sampler["population_size"], "must be >= 2")
    return sampler


def _parse_confirm(raw) -> dict:
    """`confirm: {seeds: [1, 2, 3], baseline: [overrides]}`: what `confirm=k` re-runs the best trials on."""
    raw = raw or {}
    check(isinstance(raw, dict), "confirm", raw, "must be a mapping {seeds, baseline}")
    check_known_keys(raw, CONFIRM_KEYS, "confirm", "a confirm key")
    seeds = _seed_list("confirm.seeds", raw.get("seeds", [1, 2, 3]))
    baseline = raw.get("baseline") or []
    check(isinstance(baseline, list) and all(isinstance(o, str) and "=" in o for o in baseline), "confirm.baseline",
          baseline, "must be a list of key=value overrides (added to base: the unmitigated model)")
    return {"confirm_seeds": list(seeds), "confirm_baseline": list(baseline)}


def _seed_list(key: str, seeds) -> list[int]:
    check(isinstance(seeds, list) and len(seeds) >= 1 and len(set(seeds)) == len(seeds) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds), key, seeds,
        "must be a list of distinct integers >= 0")
    return list(seeds)


def _parse_storage(raw) -> dict:
    """StudySpec's storage fields: storage (the URL), heartbeat_interval, grace_period, max_retry."""
    storage = {"url": raw} if isinstance(raw, str) else raw or {}
    check(isinstance(storage, dict), "storage", storage, "must be a URL or {url, heartbeat_interval, grace_period, "
          "max_retry}")
    check_known_keys(storage, STORAGE_KEYS, "storage", "a storage key")
    hb = check_number("storage.heartbeat_interval", storage.get("heartbeat_interval", 30), int)
    grace = check_number("storage.grace_period", storage.get("grace_period", max(120, 4 * hb)), int)
    check(hb >= 1, "storage.heartbeat_interval", hb, "must be >= 1 second")
    check(grace > hb, "storage.grace_period", grace, f"must be > heartbeat_interval ({hb})")
    max_retry = check_number("storage.max_retry", storage.get("max_retry", 2), int)
    check(max_retry >= 0, "storage.max_retry", max_retry, "must be >= 0")
    url = storage.get("url")
    if url is not None:
        check_storage_url(url, "storage.url")
    return {"storage": url, "heartbeat_interval": hb, "grace_period": grace, "max_retry": max_retry}


def _parse_pruning(raw) -> list[PruneRule]:
    pruning = []
    for i, r in enumerate(raw or []):
        key = f"pruning[{i}]"
        check(isinstance(r, dict) and {"step", "metric"} <= set(r) and set(r) <= {"step", "metric", "min", "max"},
              key, r, "must be {step: N, metric: val/<padding>/<acc_mean|acc_worst|acc_gap>, min: X or max: X}")
        check(("min" in r) != ("max" in r), key, r, "needs exactly one of min, max")
        metric = logged_name(str(r["metric"]), "val")
        allowed = [f"val/{p}/{m}" for p in PADDINGS for m in VAL_METRICS]
        check_choice(f"{key}.metric", metric if metric in allowed else r["metric"], allowed)
        bound = "min" if "min" in r else "max"
        pruning.append(PruneRule(step=check_number(f"{key}.step", r["step"], int), metric=metric,
                                 **{bound: check_number(f"{key}.{bound}", r[bound])}))
    return pruning


def check_storage_url(url, key: str = "storage") -> None:
    check(isinstance(url, str) and re.match(r"^(sqlite|postgresql|postgresql\+\w+|mysql|mysql\+\w+)://", url)
          is not None, key, url, "must be an RDB URL (sqlite:///PATH or postgresql://USER:PASS@HOST/DB): "
          "Optuna 5 keeps trial heartbeats only in RDB storages")


def sampled_params(spec: StudySpec, choose):
    """Walk the search space as a trial samples it: yields (param, value) for every param the trial has, `choose(p)`
    giving the value; a mitigation's options only when the mitigation set chosen so far enables them."""
    enabled = base_mitigations(spec.base)
    for p in spec.params:
        if p.requires and not set(p.requires) <= enabled:
            continue
        value = choose(p)
        if p.sets_mitigations:
            enabled |= p.mitigations(value)
        yield p, value


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
    if spec.confirm_baseline:
        try:
            compose(spec.base + spec.confirm_baseline)
        except ConfigError as e:
            raise ConfigError(f"{spec.path.name}: confirm.baseline: {e}") from None
    pads = set(base_cfg.eval.paddings)
    for i, o in enumerate(spec.objectives + spec.constraints):
        pad = metric_padding(o.metric)
        if pad is not None:
            what = f"objectives[{i}]" if i < len(spec.objectives) else f"constraints[{i - len(spec.objectives)}]"
            check(pad in pads, f"{spec.path.name}: {what}.metric", o.metric,
                  f"needs eval.paddings to include {pad} (it is {sorted(pads)})")
    for i, r in enumerate(spec.pruning):
        check(metric_padding(r.metric) in pads, f"{spec.path.name}: pruning[{i}].metric", r.metric,
              f"needs eval.paddings to include {metric_padding(r.metric)}")
