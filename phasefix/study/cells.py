"""A comparison file (`comparisons/<name>.yaml`): regimes x arms x seeds, run as a grid of cells through the study
runner (`phasefix.study.grid`: Optuna's GridSampler, one trial per cell: SQLite by default, `workers=`,
interrupted cells retried).

    python -m phasefix.study spec=comparisons/headline.yaml workers=2

A cell is `regime=R arm=A seed=N` (conf/regime, conf/arm) plus the file's `base` overrides (threads, progress bars:
nothing that changes what is trained). A cell already finished is not trained again: its trial reuses

- a run of a committed table the regime names (`table:`) or of the comparison's own tables (`out`: the cells an
  earlier slice or machine trained), tagged with the regime and the arm (old arm codes mapped:
  `phasefix.decisive.ARM_NAMES`) and trained on the seed (tests/test_regimes.py checks that such runs trained
  what the cell composes), or
- a FINISHED fit run in the MLflow store whose logged config equals the cell's on the keys that decide what is
  trained (`IDENTITY`: model, data, optim, mitigation, trainer.max_steps, seed), whatever its tags or name; a key
  the run was logged without (added since) counts as its schema default (`same_cell`).

So an empty store trains exactly the missing cells, and a complete comparison trains nothing; its tables are then
written again from the same runs. `then:` stages a comparison: the first seeds of every cell first, the further
seeds only for the arms whose first seeds learned and whose mean is not below the unmitigated mean (issue 54).
The file's keys: comparisons/README.md.
"""
from __future__ import annotations

import functools
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from phasefix.errors import ConfigError, check, check_choice
from phasefix.paths import CONF_DIR, PROJECT_ROOT, project_path
from phasefix.tables import SCORES_CSV

TOP_KEYS = ("name", "description", "base", "seeds", "regimes", "then", "per_residue", "tables", "out", "storage",
            "experiment_name", "tracking_uri")
REGIME_KEYS = ("arms", "seeds", "steps", "table", "then")
THEN_KEYS = ("seeds", "when")
WHEN = ("learned_not_below_baseline",)
# The keys of a composed fit config that decide what is trained: two runs equal on these trained the same cell.
IDENTITY = ("model.", "data.", "optim.", "mitigation.", "trainer.max_steps", "trainer.batch_size", "seed")
METRICS = ("acc_mean", "acc_worst", "acc_gap")


@dataclass
class RegimeCells:
    name: str
    arms: list[str]
    seeds: list[int]
    steps: int | None = None  # the budget, when not the regime's own trainer.max_steps
    tables: list[str] = field(default_factory=list)  # committed report folders whose runs of this regime count as
    # finished cells
    then: list[int] | None = None  # this regime's `then` seeds (default: the file's then.seeds)


@dataclass
class Comparison:
    name: str
    path: Path
    regimes: list[RegimeCells]
    base: list[str] = field(default_factory=list)
    then_seeds: list[int] = field(default_factory=list)
    then_when: str = "learned_not_below_baseline"
    per_residue: int | None = None  # prompts per residue group of every cell's final scores (fewer: re-scored)
    tables: list[str] = field(default_factory=list)  # the report's committed folders (`report tables=`)
    out: Path | None = None
    storage: str | None = None
    experiment_name: str | None = None
    tracking_uri: str | None = None
    description: str = ""

    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.path.parent / f'{self.name}.db').resolve()}"

    def cell_runs(self, client) -> list:
        """Its runs in MLflow: tagged comparison=<name>, in its experiment, or in any when it names none (each stage
        of its grid is a study logging into its own `study-<name>...` experiment)."""
        from phasefix import tracking

        return tracking.select_runs(client, experiment=self.experiment_name or tracking.ANY_EXPERIMENT,
                                    tags={"comparison": self.name})

    @property
    def staged(self) -> bool:
        """Whether further seeds follow the first ones (`then`, the file's or a regime's): the staged rule applies."""
        return bool(self.then_seeds) or any(r.then for r in self.regimes)


@dataclass(frozen=True)
class Cell:
    regime: str
    arm: str
    seed: int
    steps: int | None = None

    @property
    def name(self) -> str:
        return f"{self.regime}/{self.arm}/s{self.seed}"

    def overrides(self) -> list[str]:
        return [f"regime={self.regime}", f"arm={self.arm}", f"seed={self.seed}",
                *([f"trainer.max_steps={self.steps}"] if self.steps else [])]


# ------------------------------------------------------------------------------------------------ the file
def load_comparison(path: str | Path) -> Comparison:
    """Read and check a comparison file; every problem is a one-line ConfigError naming the key."""
    path = Path(path).expanduser()
    check(path.is_file(), "spec", str(path), "does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    check(isinstance(raw, dict) and "regimes" in raw, "spec", str(path), "must be a mapping with regimes:")
    try:
        return _parse(raw, path.resolve())
    except ConfigError as e:
        raise ConfigError(f"{path.name}: {e}") from None


def is_comparison(path: str | Path) -> bool:
    """Whether a `spec=` file is a comparison (a `regimes:` mapping) rather than a study."""
    try:
        raw = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and "regimes" in raw


def _seeds(key: str, v) -> list[int]:
    check(isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v)
          and len(set(v)) == len(v), key, v, "must be a list of distinct integers >= 0")
    return list(v)


def _parse(raw: dict, path: Path) -> Comparison:
    unknown = sorted(k for k in raw if k not in TOP_KEYS)
    check(not unknown, unknown[0] if unknown else "", None,
          f"is not a comparison key: allowed are {', '.join(TOP_KEYS)}")
    name = raw.get("name") or path.stem
    check(re.fullmatch(r"[A-Za-z0-9][\w.-]*", str(name)) is not None, "name", name, "must be letters, digits, _ . -")
    base = raw.get("base") or []
    check(isinstance(base, list) and all(isinstance(o, str) and "=" in o for o in base), "base", base,
          "must be a list of key=value overrides")
    for o in base:
        key = o.lstrip("+").split("=", 1)[0]
        check(key not in ("regime", "arm", "seed") and not any(key.startswith(p) or key == p.rstrip(".")
                                                                for p in IDENTITY), "base", o,
              "must not change what a cell trains (regime, arm, seed, model, data, optim, mitigation, steps): "
              "put it in a regime or an arm")
    seeds = _seeds("seeds", raw.get("seeds", [0, 1, 2]))
    regimes_raw = raw["regimes"]
    check(isinstance(regimes_raw, dict) and regimes_raw, "regimes", regimes_raw, "must map regime names to {arms}")
    known_regimes = sorted(p.stem for p in (CONF_DIR / "regime").glob("*.yaml"))
    known_arms = sorted(p.stem for p in (CONF_DIR / "arm").glob("*.yaml"))
    regimes = []
    for rname, r in regimes_raw.items():
        check_choice("regimes", rname, known_regimes)
        r = {"arms": r} if isinstance(r, list) else r
        check(isinstance(r, dict), f"regimes.{rname}", r, "must be a list of arms or {arms, seeds, steps, table}")
        bad = sorted(k for k in r if k not in REGIME_KEYS)
        check(not bad, f"regimes.{rname}.{bad[0] if bad else ''}", None, f"allowed keys are {', '.join(REGIME_KEYS)}")
        arms = r.get("arms") or []
        check(isinstance(arms, list) and arms, f"regimes.{rname}.arms", arms, "must be a non-empty list of arms")
        for a in arms:
            check_choice(f"regimes.{rname}.arms", a, known_arms)
        steps = r.get("steps")
        check(steps is None or (isinstance(steps, int) and steps >= 1), f"regimes.{rname}.steps", steps,
              "must be an integer >= 1")
        tables = r.get("table") or []
        tables = [tables] if isinstance(tables, str) else tables
        for table in tables:
            check(isinstance(table, str) and (PROJECT_ROOT / table / SCORES_CSV).is_file(),
                  f"regimes.{rname}.table", table,
                  "must be a committed report folder (with comparison.csv) or a list of them, relative to the project")
        then = _seeds(f"regimes.{rname}.then", r["then"]) if r.get("then") is not None else None
        regimes.append(RegimeCells(str(rname), list(arms), _seeds(f"regimes.{rname}.seeds", r.get("seeds", seeds)),
                                   steps, list(tables), then))
    then = raw.get("then") or {}
    check(isinstance(then, dict), "then", then, "must be {seeds: [...], when: learned_not_below_baseline}")
    bad = sorted(k for k in then if k not in THEN_KEYS)
    check(not bad, f"then.{bad[0] if bad else ''}", None, f"allowed keys are {', '.join(THEN_KEYS)}")
    then_seeds = _seeds("then.seeds", then["seeds"]) if then.get("seeds") is not None else []
    when = then.get("when", WHEN[0])
    check_choice("then.when", when, WHEN)
    tables = raw.get("tables") or []
    check(isinstance(tables, list) and all(isinstance(t, str) for t in tables), "tables", tables,
          "must be a list of committed report folders (DIR or DIR:REGIME)")
    out = raw.get("out")
    per_residue = raw.get("per_residue")
    check(per_residue is None or (isinstance(per_residue, int) and not isinstance(per_residue, bool)
                                  and per_residue >= 1), "per_residue", per_residue, "must be an integer >= 1")
    if per_residue:  # a new cell scores on as many prompts; one trained before is re-scored (grid.rescore)
        base = [*base, f"eval.per_residue={per_residue}"]
    return Comparison(name=str(name), path=path, regimes=regimes, base=list(base), then_seeds=then_seeds,
                      then_when=when, per_residue=per_residue, tables=list(tables),
                      out=(PROJECT_ROOT / out) if out else None, storage=raw.get("storage"), experiment_name=raw.get("experiment_name"),
                      tracking_uri=raw.get("tracking_uri"), description=str(raw.get("description") or ""))


def cells(comp: Comparison, seeds_of=None) -> list[Cell]:
    """The comparison's cells, regime by regime, arm by arm, seed by seed (`seeds_of(regime)`: other seeds)."""
    return [Cell(r.name, a, s, r.steps) for r in comp.regimes for a in r.arms
            for s in (seeds_of(r) if seeds_of else r.seeds)]


# ------------------------------------------------------------------------------------------------ finished cells
def identity(cfg) -> dict[str, str]:
    """What a composed fit config trains (`IDENTITY`), as strings (MLflow keeps params as strings)."""
    from phasefix import config as C
    from phasefix.tracking import flatten

    flat = flatten(C.to_container(cfg)) if not isinstance(cfg, dict) else cfg
    return {k: str(v) for k, v in flat.items() if any(k == p or k.startswith(p) for p in IDENTITY)}


@functools.cache
def schema_defaults() -> dict[str, str]:
    """The schema's default of each identity key, as `identity` writes it: what a run logged before the key existed
    trained with (a key is added with the default that keeps the behaviour before it). Data keys whose default
    differs between the data schemas are left out (no default)."""
    from omegaconf import OmegaConf

    from phasefix import config as C

    def of(prefix: str, schema) -> dict[str, str]:
        return identity(C.flatten({prefix: OmegaConf.to_container(OmegaConf.structured(schema))}))

    out = identity(C.flatten(OmegaConf.to_container(OmegaConf.structured(C.FitConfig))))  # data: MISSING, no keys
    for name, options in C.MITIGATION_OPTIONS.items():
        out.update(of(f"mitigation.{name}", options))
    retrieval, lm_mix = of("data", C.RetrievalData), of("data", C.LMMixData)
    out.update({k: v for k, v in retrieval.items() if lm_mix.get(k, v) == v})
    out.update({k: v for k, v in lm_mix.items() if retrieval.get(k, v) == v})
    return out


def same_cell(want: dict[str, str], got: dict[str, str], defaults: dict[str, str]) -> bool:
    """Whether a logged run (identity `got`) trained the cell `want`: every key equal, where a key the run does not
    have (it was logged before the key existed) counts as its schema default."""
    return set(got) <= set(want) and all(got.get(k, defaults.get(k)) == v for k, v in want.items())


def committed_runs(folder: str | Path) -> list[dict]:
    """The fit runs a committed report folder holds: run_id, run_name, regime, arm (today's name), seed, and its
    scores by padding ({padding: {acc_mean, acc_worst, acc_gap}}). Regime and arm come from the folder's tables (the
    runs' tags); the seed from the run's command (`seed=N`), else its name (`...-sN`); a re-scored run (an evaluate
    run) stands for the fit run it scored."""
    from phasefix.decisive import number
    from phasefix.tables import folder_members, read_scores, seed_in_name

    folder = project_path(folder)
    by_id: dict[str, dict] = {}
    for row in read_scores(folder):
        run = by_id.setdefault(row["run_id"], {"run_id": row["run_id"], "run_name": row["run_name"], "scores": {}})
        run["scores"][row["padding"]] = {k: float(row[k]) for k in METRICS if row.get(k)}
        words = shlex.split(row.get("command") or "")
        seed = next((w.split("=", 1)[1] for w in words if w.startswith("seed=")), None)
        run["seed"] = int(seed) if seed is not None else seed_in_name(row["run_name"])
        tags = dict(w[len("+logger.tags."):].split("=", 1) for w in words if w.startswith("+logger.tags."))
        run.setdefault("regime", tags.get("regime"))
        run.setdefault("arm", tags.get("arm"))
    for m in folder_members(folder):  # the folder's own regime x arm of each run (also for re-scored runs)
        if m["run_id"] not in by_id:  # pooled in its decisive table, not scored in its comparison.csv: its name's seed
            by_id[m["run_id"]] = {"run_id": m["run_id"], "run_name": m["run_name"], "scores": {},
                                  "seed": seed_in_name(m["run_name"])}
        run = by_id[m["run_id"]]
        run["regime"], run["arm"] = m["regime"], m["arm"]
        run["scores"].setdefault(m["padding"], {k: m[k] for k in METRICS if not math.isnan(number(m.get(k)))})
    from phasefix.decisive import arm_name

    return [{**r, "arm": arm_name(r["arm"]) if r.get("arm") else None} for r in by_id.values()
            if r.get("regime") and r.get("arm") and r.get("seed") is not None]


def summary_from_scores(scores: dict, run_id: str) -> dict:
    """A fit summary's shape (what the study objective reads) from a run's final scores by padding."""
    return {**{pad: dict(v) for pad, v in scores.items()}, "mlflow_run_id": run_id, "reused": True}


def finished_in_store(uri: str | None) -> list[tuple[dict, dict]]:
    """(identity, summary) of every FINISHED fit run of the store (all experiments)."""
    from mlflow.entities import ViewType

    from phasefix import tracking

    c = tracking.client(uri)
    out = []
    exps = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not exps:
        return out
    for run in c.search_runs(exps, "attributes.status = 'FINISHED' and tags.`phasefix.kind` = 'fit'",
                             max_results=50000):
        params, metrics = run.data.params, run.data.metrics
        scores = {}
        for pad in ("prefix", "in_sequence"):
            got = {k: metrics[f"final/{pad}/{k}"] for k in METRICS if f"final/{pad}/{k}" in metrics}
            if got:
                scores[pad] = got
        if not scores:
            continue
        out.append((identity(params), summary_from_scores(scores, run.info.run_id)))
    return out


@dataclass
class FitOrReuse:
    """The study's fit function for a comparison: a cell finished before (in its regimes' `table:` folders, its own
    `out` tables or the MLflow store) returns that run's scores, any other cell trains (`phasefix.fit.fit`).
    Picklable, so that each worker process builds its own index."""

    comparison_path: str
    tracking_uri: str | None = None
    fit_fn: object = None  # tests: a stand-in for phasefix.fit.fit

    def __post_init__(self):
        self._tables = None

    def tables(self) -> dict:
        if self._tables is None:
            comp = load_comparison(self.comparison_path)
            own = [comp.out] if comp.out is not None and (comp.out / SCORES_CSV).is_file() else []
            # each folder read once, though several regimes name it (and `out` as an absolute path)
            read: dict[Path, list[dict]] = {}
            self._tables = {}
            for r in comp.regimes:
                for table in map(project_path, [*r.tables, *own]):  # own: the cells earlier slices finished
                    if table not in read:
                        read[table] = committed_runs(table)
                    for run in read[table]:
                        if run["regime"] == r.name:
                            self._tables.setdefault((run["regime"], run["arm"], run["seed"]), run)
        return self._tables

    def finished(self, cfg) -> dict | None:
        """The summary of a finished run of the cell `cfg` composes, or None."""
        run = self.tables().get((cfg.get("regime"), cfg.get("arm"), int(cfg.seed)))
        if run is not None:
            return summary_from_scores(run["scores"], run["run_id"])
        want, defaults = identity(cfg), schema_defaults()
        for ident, summary in finished_in_store(self.tracking_uri or cfg.logger.tracking_uri):
            if same_cell(want, ident, defaults):
                return summary
        return None

    def __call__(self, cfg, callbacks=()):
        done = self.finished(cfg)
        if done is not None:
            print(f"[comparison] {cfg.regime}/{cfg.arm}/s{cfg.seed}: finished before (run "
                  f"{done['mlflow_run_id'][:8]}); not trained again", flush=True)
            return done
        if self.fit_fn is not None:
            return self.fit_fn(cfg, callbacks=callbacks)
        from phasefix.fit import fit

        return fit(cfg, callbacks=callbacks)


__all__ = ["Cell", "Comparison", "FitOrReuse", "IDENTITY", "cells", "committed_runs", "finished_in_store",
           "identity", "is_comparison", "load_comparison"]
