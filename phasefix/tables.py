"""Committed report folders, without MLflow: the one place that names their files (`SCORES_CSV`, `DECISIVE_CSV`, ...)
and reads them back (`read_table`, `read_scores`, `read_members`, `folder_members`), how a report writes its CSV tables
(`write_csv`), and how a later report grows a comparison with new runs (`join=`: `joined_rows`) or gathers the
headline (`tables=`: `headline_from_tables`)."""
from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from phasefix import decisive
from phasefix.decisive import MEMBER_TEXT, number
from phasefix.errors import check
from phasefix.verdict import BASELINE_ARM

# The files of a committed report folder (`phasefix.report` writes them): every other module names them from here.
SCORES_CSV = "comparison.csv"  # every run x padding: scores and provenance (command, commit, machine, time); the
# name every committed folder has (older than the comparison files of comparisons/), kept so they stay readable
DECISIVE_CSV = "decisive.csv"  # regime x arm x padding over seeds (`decisive.decisive_rows`)
DECISIVE_RUNS_CSV = "decisive_runs.csv"  # each regime-tagged run x padding (`decisive.run_members`)
HEADLINE_CSV = "headline.csv"  # each regime's baseline and best arm (`tables=`)
STOPPED_MD = "stopped.md"  # the arms a staged comparison stopped after their first seeds
CURVES_CSV = "phase_curves.csv"  # each run's phase curve per padding: accuracy by residue
INT_COLUMNS = ("seeds", "learned", "goal_met")
TEXT_COLUMNS = ("regime", "arm", "padding", "run_ids", "table")


def has_table(folder: str | Path) -> bool:
    """Whether `folder` is a report folder with a regime x arm table."""
    return (Path(folder) / DECISIVE_CSV).is_file()


def read_table(folder: str | Path) -> list[dict]:
    """The rows of a committed folder's `decisive.csv` as `decisive_rows` made them, so that `best_rows` and
    `markdown` can build a headline from tables whose runs are no longer in MLflow."""
    with open(Path(folder) / DECISIVE_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        row = {k: (v if k in TEXT_COLUMNS else int(v) if k in INT_COLUMNS else number(v)) for k, v in r.items()}
        base = [b for b in rows if b["regime"] == r["regime"] and b["padding"] == r["padding"]
                and b["arm"] == BASELINE_ARM]
        for k in ("worst_excl_boundary", "acc_gap", "train_seconds", "lm_loss"):
            row.setdefault(k + "_sd", math.nan)  # the table keeps the sd of mean and worst only
        row["baseline_run"] = bool(base)
        row["baseline_learned"] = bool(base) and int(base[0]["learned"]) > 0
        out.append(row)
    return out


SEED_IN_NAME = re.compile(r"-s(\d+)(?:-|$)")  # a run's seed in its name: <config>-s<seed>[-<suffix>]


def seed_in_name(run_name: str) -> int | None:
    """The seed a run's name gives (`w8s8-bridge-s3`, `...-s3-pr192` -> 3), or None."""
    found = SEED_IN_NAME.search(run_name or "")
    return int(found.group(1)) if found else None


def read_scores(folder: str | Path) -> list[dict]:
    """The rows of a committed folder's `comparison.csv` (one per run and padding), cells as written (text;
    `decisive.number` reads a score)."""
    with open(Path(folder) / SCORES_CSV, newline="") as f:
        return list(csv.DictReader(f))


SCORE_NUMBERS = ("acc_mean", "acc_worst", "acc_best", "acc_gap", "period_detected", "periodicity_ratio",
                 "worst_ci_low", "worst_ci_high", "gap_ci_low", "gap_ci_high")


def earlier_scores(folder: str | Path, run_ids: set[str]) -> tuple[list[dict], dict]:
    """(comparison.csv rows, numbers as numbers; phase curves) of the runs `run_ids` a committed folder scored: what
    a comparison's own folder keeps of its earlier runs when its tables are written again from a store that lacks
    them, so that every run its decisive table pools keeps its command, commit, machine and time."""
    folder = Path(folder)
    if not (folder / SCORES_CSV).is_file():
        return [], {}
    rows = [{**r, **{k: number(r.get(k)) for k in SCORE_NUMBERS}} for r in read_scores(folder)
            if r["run_id"] in run_ids]
    curves = read_curves(folder) if (folder / CURVES_CSV).is_file() else {}
    return rows, {k: v for k, v in curves.items() if k[0] in run_ids}


def read_members(folder: str | Path) -> list[dict]:
    """The runs of a committed folder's `decisive_runs.csv` as `run_members` made them (learned back to a bool)."""
    with open(Path(folder) / DECISIVE_RUNS_CSV, newline="") as f:
        return [{k: (v == "True" if k == "learned" else v if k in MEMBER_TEXT else number(v)) for k, v in r.items()}
                for r in csv.DictReader(f)]


def fmt(v, digits: int = 3) -> str:
    """A table cell: a float to `digits` places (nan: blank; a whole number with digits=0: no point)."""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return str(int(v)) if v.is_integer() and abs(v) >= 1 and digits == 0 else f"{v:.{digits}f}"
    return str(v)


def write_csv(path: Path, rows: Sequence[Mapping], columns: Sequence[str]) -> None:
    # 6 digits: the headline reads these tables back and prints 3, which 4 stored digits could round twice
    # (0.78153 -> 0.7815 -> 0.781)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: fmt(row.get(k, ""), 0 if k == "period_detected" else 6) for k in columns})


def write_curves(folder: Path, curves: Mapping[tuple[str, str], Sequence[float]]) -> None:
    """`curves` {(run_id, padding): accuracy by residue} as the folder's phase_curves.csv, one row per residue."""
    rows = [{"run_id": rid, "padding": pad, "residue": r, "accuracy": float(a)}
            for (rid, pad), curve in curves.items() for r, a in enumerate(curve)]
    write_csv(folder / CURVES_CSV, rows, ("run_id", "padding", "residue", "accuracy"))


def read_curves(folder: str | Path) -> dict[tuple[str, str], list[float]]:
    """A folder's phase_curves.csv back as {(run_id, padding): accuracy by residue}."""
    out: dict[tuple[str, str], list[float]] = {}
    with open(Path(folder) / CURVES_CSV, newline="") as f:
        for r in csv.DictReader(f):
            out.setdefault((r["run_id"], r["padding"]), []).append(number(r["accuracy"]))
    return out


def same_folder(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def joined_rows(specs: Sequence[str], tagged: set[tuple[str, str]], selected: set[str],
                regimes: Sequence[str] = (), skip_known: bool = False) -> tuple[list[dict], list[dict]]:
    """What the committed report folders `specs` hold of the regimes in `tagged` {(regime, arm)} of the selected runs
    (ids `selected`), and of `regimes` too: (aggregate rows of arms kept as they are, runs to pool as more seeds). A
    folder's runs come from its `decisive_runs.csv`; an arm it has only as a `decisive.csv` row (a table written
    before that file) joins as that row, so no new run may be of that arm; a row that names another of the joined
    folders as its table is left to that folder. Checked before anything is written; with `skip_known` (a
    comparison's tables, which pool runs of the folders before them) a run selected or joined already, and a row copied
    from another table of an arm joined already, are skipped, not refused."""
    regimes, rows, members, taken = {r for r, _ in tagged} | set(regimes), [], [], {}
    # A comparison pools by today's arm names: an old code (decisive.ARM_NAMES) joins as today's arm, and an arm a
    # folder written before decisive_runs.csv holds only as a row joins as its runs (`folder_members`) when runs of
    # that arm join too, so that its seeds pool with theirs instead of standing beside them as a second row.
    name = decisive.arm_name if skip_known else (lambda code: code)
    written = {f: read_members(f) for f in specs if (Path(f) / DECISIVE_RUNS_CSV).is_file()}
    with_runs = {(r, name(a)) for r, a in tagged} | {
        (m["regime"], name(m["arm"])) for ms in written.values() for m in ms} if skip_known else set()
    for folder in specs:
        path = Path(folder) / DECISIVE_CSV
        check(path.is_file(), "join", folder, f"needs {path}: a folder phasefix.report wrote for regime-tagged runs")
        runs = [{**m, "arm": name(m["arm"])} for m in written.get(folder, ()) if m["regime"] in regimes]
        if skip_known and folder not in written:
            runs = [{**m, "arm": name(m["arm"])} for m in folder_members(folder)
                    if m["regime"] in regimes and (m["regime"], name(m["arm"])) in with_runs]
        pooled = {(m["regime"], m["arm"]) for m in runs}
        if skip_known:
            runs = [m for m in runs if m["run_id"] not in selected and taken.get(m["run_id"], folder) == folder]
        got = [{**r, "arm": name(r["arm"])} for r in read_table(folder)]
        got = [r for r in got
               if r["regime"] in regimes and (r["regime"], r["arm"]) not in pooled
               and not any(r.get("table") and same_folder(r["table"], other) and not same_folder(other, folder)
                           for other in specs)]
        if skip_known:  # a copy of another table's row (a comparison's own tables) of an arm a folder before gave
            known = set(taken) | {(m["regime"], m["arm"]) for m in members}
            got = [r for r in got if not (r.get("table") and not same_folder(r["table"], folder)
                                          and (r["regime"], r["arm"]) in known)]
        check(bool(got or runs or skip_known), "join", folder,
              f"has no regime of the selected runs ({', '.join(sorted(regimes)) or 'none'})")
        for m in runs:
            check(m["run_id"] not in selected, "join", folder, f"holds run {m['run_id'][:8]}, selected here too")
            check(taken.setdefault(m["run_id"], folder) == folder, "join", folder,
                  f"repeats run {m['run_id'][:8]}, already in {taken.get(m['run_id'])}")
        for r in got:
            key = (r["regime"], r["arm"])
            check(key not in tagged | {(m["regime"], m["arm"]) for m in members + runs}, "join", folder,
                  f"has arm {key[1]} of regime {key[0]} only as a table row (aggregates, not seeds), and runs of that "
                  f"arm join too: tag the new runs with another arm")
            check(taken.setdefault(key, folder) == folder, "join", folder,
                  f"repeats arm {key[1]} of regime {key[0]}, already in {taken.get(key)}")
            rows.append({**r, "table": r.get("table") or folder})
        members += [{**m, "table": m["table"] or folder, "joined_from": folder} for m in runs]
    return rows, members


def folder_members(folder: str | Path) -> list[dict]:
    """The runs a committed report folder holds, one per run and padding, as `read_members` gives them:
    its `decisive_runs.csv`, or for a folder written before that file, rebuilt from `decisive.csv` (which runs each
    regime x arm holds, and how many of them learned) and `comparison.csv` (each run's scores). Learned is a threshold
    on the prefix mean, so a row's learned runs are its `learned` highest prefix means. What comparison.csv has no
    column for (worst excluding the boundary, training time, lm_loss) is left nan; the costs are the arm's. A row that
    names another table (a joined one) is left to that table."""
    folder = Path(folder)
    if (folder / DECISIVE_RUNS_CSV).is_file():
        return read_members(folder)
    if not (has_table(folder) and (folder / SCORES_CSV).is_file()):
        return []
    scores: dict[str, dict[str, dict]] = {}  # run id -> padding -> its comparison.csv row
    for s in read_scores(folder):
        scores.setdefault(s["run_id"], {})[s["padding"]] = s
    out = []
    for row in read_table(folder):
        if row.get("table"):
            continue
        matches = [[rid for rid in scores if rid.startswith(short)] for short in row["run_ids"].split()]
        # a short id that no run of comparison.csv has (or two do) is left unlisted
        runs = [ids[0] for ids in matches if len(ids) == 1]
        prefix = {rid: number(scores[rid].get("prefix", {}).get("acc_mean")) for rid in runs}
        learned = sorted((rid for rid in runs if not math.isnan(prefix[rid])), key=prefix.get,
                         reverse=True)[:row["learned"]]
        for rid in runs:
            s = scores[rid].get(row["padding"])
            if s is None:
                continue
            out.append({"run_id": rid, "run_name": s["run_name"], "regime": row["regime"], "arm": row["arm"],
                        "padding": row["padding"], "learned": rid in learned,
                        **{k: number(s[k])
                           for k in ("acc_mean", "acc_worst", "acc_gap", "period_detected")},
                        **{k: math.nan for k in ("worst_excl_boundary", "train_seconds", "lm_loss")},
                        **{k: row[k] for k in ("compressor_flops_per_token", "cache_entries_per_token")},
                        "table": ""})
    return out


def headline_from_tables(specs: Sequence[str], out: Path) -> tuple[list[str], list[dict]]:
    """The headline (each regime's baseline and best arm at equal cache entries, every padding) from committed
    report folders' `decisive.csv`: `DIR` takes every regime of DIR's table, `DIR:A+B` regimes A and B. A regime
    may come from one table only, so that a row's figures are those of the one comparison its table names."""
    from phasefix import plots
    from phasefix.data.layout import PADDINGS

    rows, source = [], {}
    for spec in specs:
        folder, _, regimes = spec.partition(":")
        path = Path(folder) / DECISIVE_CSV
        check(path.is_file(), "tables", spec, f"needs {path}: a folder phasefix.report wrote for regime-tagged runs")
        table = read_table(folder)
        present = list(dict.fromkeys(r["regime"] for r in table))
        wanted = [r for r in regimes.split("+") if r] or present
        missing = [r for r in wanted if r not in present]
        check(not missing, "tables", spec, f"has no regime {', '.join(missing)} (its regimes: {', '.join(present)})")
        got = [r for r in table if r["regime"] in wanted]
        found = list(dict.fromkeys(r["regime"] for r in got))
        for regime in found:
            check(regime not in source, "tables", spec,
                  f"repeats regime {regime}, already taken from {source.get(regime)}: name one table per regime "
                  f"(DIR:REGIME)")
            source[regime] = folder
        rows += [{**r, "table": r.get("table") or folder} for r in got]  # a joined table names each row's own
    hrows = decisive.best_rows(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / HEADLINE_CSV, hrows, (*decisive.COLUMNS, "table"))
    (out / "headline.md").write_text(decisive.markdown(hrows))
    members, unlisted = headline_members(hrows, source)
    (out / "runs.md").write_text(headline_runs(members, unlisted, rows))
    files = [HEADLINE_CSV, "headline.md", "runs.md"]
    bars = decisive.baseline_means(members, rows)
    for pad in PADDINGS:
        if any(m["padding"] == pad for m in members):
            plots.save(plots.headline_worst_vs_mean(members, bars, pad), out / f"worst_vs_mean_{pad}.png")
            files.append(f"worst_vs_mean_{pad}.png")
    return files, hrows


def headline_members(hrows: Sequence[Mapping], source: Mapping[str, str]) -> tuple[list[dict], dict]:
    """The runs behind a headline's rows (`folder_members` of the folder each regime came from, `source`, and of the
    table each row names), and the (regime, arm) rows none of those folders lists, with their table."""
    recorded: dict[str, list[dict]] = {}  # each folder's runs, read once

    members, seen, unlisted = [], set(), {}
    for r in hrows:
        key = (r["regime"], r["arm"], r["padding"])
        found = 0
        for folder in dict.fromkeys((source[r["regime"]], r["table"])):
            if folder not in recorded:
                recorded[folder] = folder_members(folder)
            for m in recorded[folder]:
                if (m["regime"], m["arm"], m["padding"]) == key:
                    found += 1
                    if (m["run_id"], m["padding"]) not in seen:
                        seen.add((m["run_id"], m["padding"]))
                        members.append({**m, "table": m["table"] or folder})
        if not found:
            unlisted.setdefault((r["regime"], r["arm"]), r["table"])
    return members, unlisted


def headline_runs(members: Sequence[Mapping], unlisted: Mapping[tuple[str, str], str],
                  rows: Sequence[Mapping]) -> str:
    """runs.md of a headline: each run behind its rows (`decisive.runs_markdown`, the goal's bar from `rows`); the
    rows whose runs no folder lists are named below the table, with where their runs are."""
    text = decisive.runs_markdown(members, rows) if members else ""
    if unlisted:
        text += ("\nNot listed per run (each run is in the table's `comparison.md`): "
                 + "; ".join(f"{regime} {arm} (`{table}`)" for (regime, arm), table in unlisted.items()) + ".\n")
    return text
