"""`python -m phasefix.report [experiment=NAME] [runs=ID1,ID2] [tag.KEY=VALUE ...] [kind=fit,evaluate] [out=DIR]`
   `python -m phasefix.report tables=DIR[:REGIME+REGIME],... out=DIR`
   either form with `into=DOC`: also rewrite DOC's quotes of the files written to `out`

Compares MLflow runs of `phasefix.fit` and `phasefix.evaluate` by phase and writes, to `out` (default
outputs/reports/<date>-<time>):

  comparison.csv / comparison.md   mean, worst, best, gap (with cluster-bootstrap intervals of worst and gap),
                                   detected period, per run and padding
  seeds.csv / seeds.md             the same aggregated over seeds: runs named `<config>-s<seed>` grouped by
                                   `<config>` and padding, mean and sd of each metric, train time, lm_loss, run ids
  phase_curves.png / .csv          the runs' phase curves (`phase_acc/<padding>`) overlaid, one panel per padding
  decisive.csv / decisive.md       runs tagged `regime` and `arm`: one row per regime, arm and padding over the seeds
                                   that learned, goal met, costs (phasefix.decisive); headline.md: each regime's
                                   baseline and best arm at equal cache entries per token. An evaluate run of such
                                   a run (a re-scoring) joins as that run, with its own accuracy
  decisive_runs.csv                each of those runs' facts per padding, for a later `join=`
  runs.md                          each of those runs (seed) per padding: mean / worst, bold where it meets the goal
  phase_grid_<padding>.png         one panel per regime and arm (pooled runs too, where curves were kept): seeds faint,
                                   mean with a min-max band, boundary marked
  worst_vs_mean.png                every run's worst residue against its mean (pooled runs too), coloured by arm,
                                   with the goal line
  pareto.png / pareto.csv          for studies (runs with a parent run): mean vs worst residue and the Pareto front
  flip.csv                         flip-probe runs: detected period, FFT period, range of the log-prob difference
  side_by_side.csv / .md / .png    two evaluate runs of the same prompts (runs=A,B: a reference and a deployment):
                                   both on one figure, the phases where their Wilson intervals are disjoint named
                                   (phasefix.side_by_side)

`tables=` reads no MLflow run: it builds headline.csv / headline.md (each regime's baseline and best arm at equal
cache entries per token, every padding, the source table named per row) from committed report folders'
`decisive.csv`, one table per regime, runs.md (each run behind those rows) and worst_vs_mean_<padding>.png (those
runs by regime), the runs from the folders' decisive_runs.csv or, older, decisive.csv with comparison.csv
(docs/results.md opens with them; phasefix.tables).

`into=DOC` (with `out=`): a document quotes a written table between a line `<!-- quote: PATH -->` (PATH relative to
the document's folder, like its links) and a line `<!-- /quote -->`; after writing, every quote in DOC of a file in
`out` is rewritten with that file, so the document's figures are the report's, not a copy by hand. A DOC with no
quote of `out`, or an unclosed quote, is refused before anything is written.

`join=DIR,...` grows a committed comparison with new runs when its own runs are no longer in this store (a fresh
machine): the runs of the selected runs' regimes in DIR's `decisive_runs.csv` are pooled with them as more seeds,
and an arm DIR has only as a `decisive.csv` row (older tables) is carried as it is, each row naming its table; a
new arm is judged against the committed baseline's mean where the selection has no baseline run of its regime.
`join_regimes=R,...` takes these regimes from the folders as well, with or without new runs (a comparison file's
tables: every regime it names); a row naming another joined folder as its table is taken from that folder, and a run
selected or joined already is skipped (a comparison's tables pool the runs of the folders before them).

Selection: `runs=` (ids or unique id prefixes, in that order), else every run of `experiment` (default phasefix)
whose tags match all `tag.KEY=VALUE` options and whose `phasefix.kind` is in `kind` (default fit,evaluate). The
comparison is also logged to a new MLflow run tagged `phasefix.kind=report` (`log=false` skips it). `tracking_uri=`
picks the store.
A Hydra app (conf/report.yaml over `ReportConfig`; `--cfg` prints it): `experiment=` is the key `experiment_name`
(`experiment` is fit's config group), `runs=a,b` and `tag.KEY=VALUE` are rewritten to `runs=['a','b']` and
`+tag.KEY='VALUE'` (`shim`).
"""
from __future__ import annotations

import math
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from phasefix.decisive import number
from phasefix.data.layout import PADDINGS
from phasefix.errors import check, check_choice
from phasefix.paths import project_path
from phasefix.quotes import inside, quotes, refresh_quotes
from phasefix.run_scores import collect, left_out, regime_facts, rescored_sources
from phasefix.tables import (CURVES_CSV, DECISIVE_CSV, DECISIVE_RUNS_CSV, SCORES_CSV, earlier_scores, fmt,
                             headline_from_tables, joined_rows, same_folder, write_csv, write_curves)
from phasefix.verdict import GOAL_RATIO, flat

KINDS = ("fit", "evaluate")
COLUMNS = ("run_id", "run_name", "kind", "task", "model", "window", "stride", "mitigations", "parent", "padding",
           "acc_mean", "acc_worst", "acc_best", "acc_gap", "worst_ci_low", "worst_ci_high", "gap_ci_low",
           "gap_ci_high", "period_detected", "periodicity_ratio", "git_commit", "command", "machine", "start_time")
OPTIONS = ("experiment", "runs", "tables", "join", "join_regimes", "into", "kind", "tracking_uri", "out", "log",
           "verbose", "experiment_name")


@dataclass
class ReportConfig:
    experiment_name: str | None = None  # `experiment=NAME`; default phasefix
    runs: list[str] = field(default_factory=list)  # run ids or unique prefixes (then no experiment, no tags)
    tag: dict[str, str] = field(default_factory=dict)  # `tag.KEY=VALUE`: runs whose tag KEY is VALUE
    kind: list[str] = field(default_factory=lambda: list(KINDS))
    tables: list[str] = field(default_factory=list)  # committed report folders (`DIR` or `DIR:REGIME+REGIME`): headline
    join: list[str] = field(default_factory=list)  # committed report folders whose regimes the new runs extend
    join_regimes: list[str] = field(default_factory=list)  # with join=: these regimes too (a comparison's every one)
    into: str | None = None  # a document whose quotes of files in `out` are rewritten with them (needs out=)
    tracking_uri: str | None = None
    out: str | None = None  # default outputs/reports/<date>-<time>
    log: bool = True  # log the report to a new MLflow run
    verbose: bool = False


ConfigStore.instance().store(name="report_schema", node=ReportConfig)


def shim(argv: Sequence[str]) -> list[str]:
    """Today's `key=value` forms as Hydra overrides: `experiment=X` -> `experiment_name='X'`, `runs=a,b` ->
    `runs=['a','b']` (ids stay strings: 1e328003 is not a float), `tag.K=V` -> `+tag.K='V'`; an unknown option is
    one line naming it."""
    from phasefix.cli import quoted

    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        check(bool(eq) and bool(key), "argument", arg, "must be key=value")
        bare = key.lstrip("+")
        if bare.startswith("tag."):
            check(len(bare) > 4, "argument", key, "must name a tag: tag.KEY=VALUE")
            out.append(f"+{bare}={quoted(value)}")
            continue
        check_choice("option", bare, OPTIONS + ("tag.KEY",))
        if bare == "experiment":
            bare = "experiment_name"
        if bare in ("runs", "kind", "tables", "join", "join_regimes") and not value.startswith("["):
            value = "[" + ",".join(quoted(v.strip()) for v in value.split(",") if v.strip()) + "]"
        elif bare in ("experiment_name", "tracking_uri", "out", "into") and not value.startswith(("'", '"')):
            value = quoted(value)
        out.append(f"{bare}={value}")
    return out


def options(cfg: DictConfig | Sequence[str] | Mapping = ()) -> DictConfig:
    """The report's config: composed from `key=value` arguments (or a mapping of them) through `shim`, or as
    given; the selection checked (kinds, runs= without experiment= or tags)."""
    if not isinstance(cfg, DictConfig):
        from phasefix.cli import compose

        args = [f"{k}={','.join(v) if isinstance(v, (list, tuple)) else v}" for k, v in cfg.items()] \
            if isinstance(cfg, Mapping) else list(cfg)
        cfg = compose(shim(args), "report")
    for k in cfg.kind:
        check_choice("kind", k, KINDS)
    check(not (cfg.runs and (cfg.tag or cfg.experiment_name)), "runs", ",".join(cfg.runs),
          "selects runs by id: drop experiment= and tag.* (or drop runs=)")
    check(not (cfg.tables and (cfg.runs or cfg.tag or cfg.experiment_name)), "tables", ",".join(cfg.tables),
          "builds the headline from committed tables, not from MLflow: drop runs=, experiment= and tag.*")
    check(not (cfg.tables and cfg.join), "join", ",".join(cfg.join), "extends a report of MLflow runs: drop tables=")
    check(not (cfg.join_regimes and not cfg.join), "join_regimes", ",".join(cfg.join_regimes),
          "names the regimes to take from the join= folders: add join=")
    check_into(cfg.into, cfg.out)
    return cfg


def check_into(into: str | Path | None, out: str | Path | None) -> None:
    """`into=DOC` needs `out=` and a quote in DOC of a file there: refused before anything is written."""
    if into:
        check(bool(out), "into", str(into), "rewrites the document's quotes of the files in out=: add out=")
        check(any(inside(path, Path(out)) for path, _, _ in quotes(Path(into))), "into", str(into),
              f"has no line <!-- quote: PATH --> of a file in out={out}")


def out_dir(out: str | None) -> Path:
    """`out`, or outputs/reports/<date>-<time>."""
    from phasefix.paths import OUTPUTS_DIR

    return Path(out) if out else OUTPUTS_DIR / "reports" / datetime.now().strftime("%Y-%m-%d-%H%M%S")


def markdown(rows: Sequence[Mapping], flips: Sequence[Mapping] = ()) -> str:
    def ci(lo, hi):
        return f" [{lo:.2f}, {hi:.2f}]" if not (math.isnan(lo) or math.isnan(hi)) else ""

    lines = ["| run | kind | task | model | W/S | mitigations | padding | mean | worst [95% CI] | best | gap [95% CI] "
             "| period |", "|" + "---|" * 12]
    for r in rows:
        ws = "full" if r.get("attention") == "full" else (
            f"{r['window']}/{r['stride']}" if r["window"] else (r["stride"] or ""))
        lines.append(f"| {r['run_name']} (`{r['run_id'][:8]}`) | {r['kind']} | {r['task']} | {r['model']} | {ws} | "
                     f"{r['mitigations']} | {r['padding']} | {fmt(r['acc_mean'])} | "
                     f"{fmt(r['acc_worst'])}{ci(r['worst_ci_low'], r['worst_ci_high'])} | {fmt(r['acc_best'])} | "
                     f"{fmt(r['acc_gap'])}{ci(r['gap_ci_low'], r['gap_ci_high'])} | "
                     f"{fmt(r['period_detected'], 0)} |")
    if flips:
        lines += ["", "Flip probe:", "", "| run | model | period detected | FFT period | flip rate | range |",
                  "|---|---|---|---|---|---|"]
        for f in flips:
            lines.append(f"| {f['run_name']} (`{f['run_id'][:8]}`) | {f['model']} | "
                         f"{fmt(number(f['period_detected']), 0)}"
                         f" | {fmt(number(f['period_fft']), 2)} | {fmt(number(f['flip_rate']), 2)} | "
                         f"{fmt(number(f['range']), 3)} |")
    return "\n".join(lines) + "\n"


SEED_SUFFIX = re.compile(r"-s\d+$")
SEED_METRICS = ("acc_mean", "acc_worst", "acc_gap", "train_seconds", "lm_loss")


def seed_rows(rows: Sequence[Mapping]) -> list[dict]:
    """Rows of runs named `<config>-s<seed>` grouped by (config, padding): mean and sd over seeds of each metric,
    the number of seeds, how many runs are flat (`verdict.flat`: worst >= 0.9 x mean; the goal also needs a
    regime's unmitigated mean, which only the decisive table has) and the run ids."""
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((SEED_SUFFIX.sub("", r["run_name"]), r["padding"]), []).append(r)
    out = []
    for (config, pad), members in groups.items():
        row = {"config": config, "padding": pad, "seeds": len(members),
               "flat": sum(flat(m["acc_mean"], m["acc_worst"]) for m in members),
               "run_ids": " ".join(m["run_id"][:8] for m in members)}
        for k in SEED_METRICS:
            vals = [m[k] for m in members if not math.isnan(number(m.get(k)))]
            row[k] = statistics.fmean(vals) if vals else math.nan
            row[k + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else math.nan
        out.append(row)
    return out


def seeds_markdown(srows: Sequence[Mapping]) -> str:
    def pm(r, k):
        m, sd = r[k], r[k + "_sd"]
        return "" if math.isnan(m) else f"{m:.3f}" + ("" if math.isnan(sd) else f" ± {sd:.3f}")

    lines = [f"| config | padding | seeds | mean | worst | gap | worst >= {GOAL_RATIO} mean | train s | lm_loss | runs |",
             "|" + "---|" * 10]
    for r in srows:
        lines.append(f"| {r['config']} | {r['padding']} | {r['seeds']} | {pm(r, 'acc_mean')} | {pm(r, 'acc_worst')} | "
                     f"{pm(r, 'acc_gap')} | {r['flat']}/{r['seeds']} | {pm(r, 'train_seconds')} | "
                     f"{pm(r, 'lm_loss')} | {r['run_ids']} |")
    return "\n".join(lines) + "\n"


def pareto_front(points: Sequence[Sequence[float]]) -> list[bool]:
    """Which points are on the Pareto front when every coordinate is maximised (ties: both stay; nan: never). For
    runs read back from MLflow; a study's own front is Optuna's `study.best_trials` (phasefix.study.pareto)."""
    pts = [tuple(float(x) for x in p) for p in points]
    front = []
    for i, p in enumerate(pts):
        if any(math.isnan(x) for x in p):
            front.append(False)
            continue
        dominated = any(all(q[k] >= p[k] for k in range(len(p))) and any(q[k] > p[k] for k in range(len(p)))
                        for j, q in enumerate(pts) if j != i and not any(math.isnan(x) for x in q))
        front.append(not dominated)
    return front


def pareto_rows(rows: Sequence[Mapping]) -> list[dict]:
    """Study members (runs with a parent) per parent and padding, marked on or off the (mean, worst) front."""
    out = []
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        if r["parent"]:
            groups.setdefault((r["parent"], r["padding"]), []).append(r)
    for (parent, pad), members in groups.items():
        front = pareto_front([(r["acc_mean"], r["acc_worst"]) for r in members])
        out += [{"parent": parent, "padding": pad, "run_id": r["run_id"], "run_name": r["run_name"],
                 "mitigations": r["mitigations"], "acc_mean": r["acc_mean"], "acc_worst": r["acc_worst"],
                 "on_front": bool(f)} for r, f in zip(members, front)]
    return out


def figure_runs(rows: Sequence[Mapping], curves: Mapping, facts: Mapping,
                pooled: Sequence[Mapping]) -> tuple[list[dict], dict, dict]:
    """(rows, curves, facts) of every run a decisive table counts: this store's runs and the committed runs it pools
    (`pooled`, each with the scores and curves kept by the folder that scored it, its `table`), so that the
    figures show what the tables say rather than only the runs of the store that wrote them last."""
    rows, curves = list(rows), dict(curves)
    facts = {**{m["run_id"]: {"regime": m["regime"], "arm": m["arm"], "learned": m["learned"]} for m in pooled},
             **facts}
    have = {r["run_id"] for r in rows}
    by_folder: dict[str, set[str]] = {}
    for m in pooled:
        if m["run_id"] not in have:
            by_folder.setdefault(m.get("table") or m["joined_from"], set()).add(m["run_id"])  # its comparison.csv
    for folder, ids in by_folder.items():
        more, more_curves = earlier_scores(project_path(folder), ids)
        rows += more
        curves.update(more_curves)
    have = {(r["run_id"], r["padding"]) for r in rows}
    rows += [{"run_id": m["run_id"], "run_name": m["run_name"], "padding": m["padding"], "stride": "",
              "acc_mean": m["acc_mean"], "acc_worst": m["acc_worst"]}  # pooled, no comparison.csv row: a point
             for m in pooled if (m["run_id"], m["padding"]) not in have]
    return rows, curves, facts


def write_decisive(c, out: Path, rows: Sequence[Mapping], curves: Mapping, facts: Mapping, sources: Mapping,
             joined: Sequence[Mapping] = (), pooled: Sequence[Mapping] = (),
             table: str = "") -> tuple[list[str], list[dict]]:
    """Runs tagged `regime` (and `arm`; `facts`: regime_facts): the regime x arm table over seeds
    (phasefix.decisive) with the committed runs `pooled` and rows `joined` (`joined_rows`), each run's facts
    (decisive_runs.csv, naming `table`, the folder of its comparison.csv), the headline rows (each regime's baseline
    and best arm at equal cache entries) and the figures of the new runs (phasefix.plots). Returns the files written
    and the table's rows."""
    from phasefix import decisive, plots, tracking

    if not facts:
        return [], []
    members = [{**m, "table": table} for m in decisive.run_members(rows, curves, facts)] + list(pooled)
    grown = bool(joined or pooled)  # a joined table names each row's table
    drows = decisive.decisive_rows(members, joined, table if grown else "")
    write_csv(out / DECISIVE_CSV, drows, decisive.COLUMNS + (("table",) if grown else ()))
    write_csv(out / DECISIVE_RUNS_CSV, members, decisive.MEMBER_COLUMNS)  # a later join pools these runs
    (out / "decisive.md").write_text(decisive.markdown(drows))
    (out / "headline.md").write_text(decisive.markdown(decisive.best_rows(drows)))
    (out / "runs.md").write_text(decisive.runs_markdown(members, joined))
    files = [DECISIVE_CSV, DECISIVE_RUNS_CSV, "decisive.md", "headline.md", "runs.md"]
    drawn_rows, drawn_curves, drawn = figure_runs(rows, curves, facts, pooled)
    for pad in PADDINGS:
        if plots.phase_grid_rows(drawn_rows, drawn_curves, drawn, pad):
            plots.save(plots.phase_grid(drawn_rows, drawn_curves, drawn, pad), out / f"phase_grid_{pad}.png")
            files.append(f"phase_grid_{pad}.png")
    plots.save(plots.worst_vs_mean(drawn_rows, drawn), out / "worst_vs_mean.png")
    reported = {r["run_id"] for r in rows}  # the loss figure shows the table's runs, not the unfinished ones
    trained = {rid: sources[rid].info.run_id if rid in sources else rid for rid in facts}
    losses = {rid: tracking.metric_curve(c, trained[rid], "train/loss") for rid in facts if rid in reported}
    plots.save(plots.loss_curves(losses, facts), out / "train_loss.png")
    return files + ["worst_vs_mean.png", "train_loss.png"], drows


def report(cfg: DictConfig | Sequence[str] | Mapping = ()) -> dict:
    """The command line's report: `cfg` (the composed config, or `key=value` arguments as on the command line, or a
    mapping of them) checked (`options`), then `report_tables` (tables=) or `report_runs`. Returns theirs."""
    cfg = options(cfg)
    if cfg.tables:
        return report_tables(list(cfg.tables), cfg.out, cfg.into)
    return report_runs(experiment=cfg.experiment_name, runs=list(cfg.runs), tags=dict(cfg.tag), kind=list(cfg.kind),
                       join=list(cfg.join), join_regimes=list(cfg.join_regimes), tracking_uri=cfg.tracking_uri,
                       out=cfg.out, into=cfg.into, log=cfg.log)


def report_tables(tables: Sequence[str], out: str | Path | None = None, into: str | Path | None = None) -> dict:
    """The headline from committed report folders (`tables=`: `DIR` or `DIR:REGIME+REGIME`), no MLflow, to `out`;
    `into`: a document whose quotes of those files are rewritten. Returns report_runs' dict (no runs)."""
    check_into(into, out)
    out = out_dir(None if out is None else str(out))
    files, hrows = headline_from_tables(list(tables), out)
    if into:
        refresh_quotes(Path(into), out)
    return {"out": str(out), "runs": [], "rows": [], "flips": [], "pareto": [], "files": files,
            "report_run_id": None, "left_out": [], "decisive": hrows}


def report_runs(*, experiment: str | None = None, runs: Sequence[str] = (), tags: Mapping[str, str] | None = None,
                kind: Sequence[str] = KINDS, join: Sequence[str] = (), join_regimes: Sequence[str] = (),
                tracking_uri: str | None = None, out: str | Path | None = None, into: str | Path | None = None,
                log: bool = True) -> dict:
    """Select MLflow runs (`runs`: ids or prefixes, else `experiment`'s runs with these `tags` and kinds), write the
    comparison to `out` (default outputs/reports/<date>-<time>), joined with the committed folders `join` (and
    their `join_regimes`), quote it into `into`, and (log) log it to a new report run. Returns {out, runs (ids),
    rows, flips, pareto, files, report_run_id, left_out, decisive (the regime x arm rows of runs tagged `regime`)}."""
    from phasefix import tracking

    tags = dict(tags or {})
    check_into(into, out)
    c = tracking.client(tracking_uri)
    selected_runs = tracking.select_runs(c, experiment=experiment, run_ids=list(runs), tags=tags, kinds=list(kind))
    tag_options = " ".join(f"tag.{k}={v}" for k, v in tags.items())
    where = (f"runs={','.join(runs)}" if runs else f"experiment={experiment or 'phasefix'} {tag_options}").strip()
    check(bool(selected_runs), "selection", where, "matches no fit or evaluate runs")
    selected = {r.info.run_id for r in selected_runs}
    sources = rescored_sources(c, selected_runs)
    rescored = {src.info.run_id for src in sources.values()}
    runs = [r for r in selected_runs if r.info.run_id not in rescored]  # a re-scored run stands as its re-scoring
    rows, curves, flips = collect(c, runs)
    check(bool(rows or flips), "selection", where, "matches runs without phase results (unfinished?)")
    facts = regime_facts(c, runs, sources)
    joined, pooled = joined_rows(list(join), {(f["regime"], f["arm"]) for f in facts.values()},
                                 selected, list(join_regimes), skip_known=bool(join_regimes)) if join else ([], [])
    own = next((f for f in join if out is not None and same_folder(f, out)), None)
    if own is not None:  # a comparison writing its own folder again: its earlier runs keep their rows and curves
        earlier, earlier_curves = earlier_scores(own, {m["run_id"] for m in pooled if m["joined_from"] == own})
        rows, curves = rows + earlier, {**curves, **earlier_curves}
    out_path = out_dir(None if out is None else str(out))
    out_path.mkdir(parents=True, exist_ok=True)
    files, drows = [], []
    if rows:
        files += write_run_tables(out_path, rows, curves)
        written, drows = write_decisive(c, out_path, rows, curves, facts, sources, joined, pooled, str(out or out_path))
        files += written
    files += write_other_tables(c, out_path, runs, rows, flips)
    prows = pareto_rows(rows)
    if into:
        refresh_quotes(Path(into), out_path)
    report_run_id = log_report_run(c, out_path, runs, files, experiment, where, kind) if log else None
    return {"out": str(out_path), "runs": [r.info.run_id for r in runs], "rows": rows, "flips": flips,
            "pareto": prows, "files": files, "report_run_id": report_run_id, "left_out": left_out(runs, rows, flips),
            "decisive": drows}


def write_run_tables(out: Path, rows: Sequence[Mapping], curves: Mapping) -> list[str]:
    """The runs' scores per padding (comparison.csv), their phase curves (figure and csv) and the seeds table."""
    from phasefix import plots

    write_csv(out / SCORES_CSV, rows, COLUMNS)
    plots.save(plots.runs_phase_curves(rows, curves), out / "phase_curves.png")
    write_curves(out, {k: v for k, v in curves.items() if v})
    srows = seed_rows(rows)
    write_csv(out / "seeds.csv", srows, ("config", "padding", "seeds", "flat",
                                         *[f"{k}{sd}" for k in SEED_METRICS for sd in ("", "_sd")], "run_ids"))
    (out / "seeds.md").write_text(seeds_markdown(srows))
    return [SCORES_CSV, "phase_curves.png", CURVES_CSV, "seeds.csv", "seeds.md"]


def write_other_tables(c, out: Path, runs: Sequence, rows: Sequence[Mapping], flips: Sequence[Mapping]) -> list[str]:
    """comparison.md, the flip probes, a study's Pareto front and two evaluate runs side by side."""
    from phasefix import plots, side_by_side

    (out / "comparison.md").write_text(markdown(rows, flips))
    files = ["comparison.md"]
    if flips:
        write_csv(out / "flip.csv", flips, ("run_id", "run_name", "model", "period_detected", "period_fft",
                                           "flip_rate", "range"))
        files.append("flip.csv")
    prows = pareto_rows(rows)
    if prows:
        write_csv(out / "pareto.csv", prows, ("parent", "padding", "run_id", "run_name", "mitigations", "acc_mean",
                                              "acc_worst", "on_front"))
        plots.save(plots.runs_pareto(prows), out / "pareto.png")
        files += ["pareto.csv", "pareto.png"]
    return files + side_by_side.write(c, out, runs)  # two evaluate runs of the same prompts: on one figure


def log_report_run(c, out: Path, runs: Sequence, files: Sequence[str], experiment: str | None, where: str,
                   kind: Sequence[str]) -> str:
    """A new MLflow run tagged phasefix.kind=report with the report's files; its id."""
    from phasefix import tracking

    exp_name = experiment or (c.get_experiment(runs[0].info.experiment_id).name if runs else "phasefix")
    ids = [r.info.run_id for r in runs]
    run_id = tracking.create_run(c, exp_name, f"report-{len(ids)}-runs", tags={
        "phasefix.kind": "report", "phasefix.report_runs": ",".join(ids)[:5000], "output_dir": str(out.resolve())})
    with tracking.running(c, run_id):
        tracking.log_params(c, run_id, {"selection": where, "kind": ",".join(kind), "num_runs": len(ids)})
        tracking.log_files(c, run_id, [out / name for name in files])
    return run_id


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.report`: 0 written, 2 a bad option or an empty selection (one line)."""
    from phasefix.cli import run
    from phasefix.console import quiet

    def work(cfg: DictConfig) -> int:
        quiet(cfg.verbose)  # -v: the libraries' own output too
        res = report(cfg)
        if cfg.tables:
            print((Path(res["out"]) / "headline.md").read_text(), end="")
            print(f"\nheadline of {len(cfg.tables)} tables written to {res['out']}: {', '.join(res['files'])}"
                  + (f"; quoted in {cfg.into}" if cfg.into else ""))
            return 0
        print((Path(res["out"]) / "comparison.md").read_text(), end="")
        left = res["left_out"]
        print(f"\n{len(res['runs']) - len(left)} of {len(res['runs'])} runs reported; written to {res['out']}: "
              f"{', '.join(res['files'])}"
              + (f"; logged to MLflow run {res['report_run_id']}" if res["report_run_id"] else "")
              + (f"; quoted in {cfg.into}" if cfg.into else ""))
        for rid, why in left:
            print(f"left out {rid[:8]} {why}")
        return 0

    return run("report", argv, work, shim)


if __name__ == "__main__":
    sys.exit(main())
