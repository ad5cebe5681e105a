"""The decisive table (decisive.csv, docs/results.md): regimes x arms x seeds, judged on runs that learned.

Runs carry two MLflow tags, `regime` (e.g. `w4s4`, `coverage_w8s8`) and `arm` (`baseline` = unmitigated, a
mitigation, a model option); `phasefix.report` turns the rows of `run_scores.collect` into one table row per
(regime, arm, padding) and two figures (`phasefix.plots`):

- **learned**, **goal met** and the goal's bar (the unmitigated mean over its learned seeds): `phasefix.verdict`.
  Aggregates (mean, worst, ...) are over the learned seeds only; a regime whose baseline learns in no seed has no
  goal to meet and says so; `goal_met` counts the learned seeds meeting `verdict.meets_goal`.
- **worst excl. boundary**: the worst residue among those whose phase is not the grid's boundary phase S-1 (W = S,
  no offsets: where no single entry can bind a key to the next token's value).
- cost columns: compressor multiply-adds per token and cache entries per token, from the run's model config.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from phasefix.data.layout import PADDINGS
from phasefix.verdict import BASELINE_ARM, learned, member_meets_goal, reference

# The arm codes of the committed tables (written before conf/arm/ existed) -> the arm (conf/arm/<name>.yaml) that
# composes the same config (tests/test_regimes.py checks each headline cell against its committed runs' commands).
ARM_NAMES = {"t5": "bridge_gate_diversity", "w5_gd_spread": "bridge_gate_diversity", "w9_spread": "bridge",
             "w9_ts2_spread": "bridge_shift", "w9_ts2_spread_hd64": "bridge_shift_wide"}


def arm_name(code: str) -> str:
    """A committed table's arm code as the arm's name today (`t5` -> `bridge_gate_diversity`); others unchanged."""
    return ARM_NAMES.get(code, code)
COLUMNS = ("regime", "arm", "padding", "seeds", "learned", "acc_mean", "acc_mean_sd", "acc_worst", "acc_worst_sd",
           "worst_excl_boundary", "acc_gap", "period", "goal_met", "train_seconds", "compressor_flops_per_token",
           "cache_entries_per_token", "lm_loss", "lm_loss_change", "run_ids")


def number(x) -> float:
    """A table cell or logged value as a float: blank, None or not a number -> nan."""
    try:
        return float(x) if x is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def scored_prompts(run) -> float:
    """Prompts per residue group behind a run's final scores: a fit's `eval.per_residue`, an evaluate run's
    `per_residue` (nan when it logged neither)."""
    params = run.data.params
    return number(params.get("eval.per_residue") or params.get("per_residue"))


def model_config(params: Mapping[str, str]):
    """The run's ModelConfig from its logged `model.*` params (strings; YAML gives them back their types)."""
    import yaml

    from phasefix.model.config import ModelConfig

    d = {k[len("model."):]: None if v == "None" else yaml.safe_load(v)  # MLflow logs None as "None"
         for k, v in params.items() if k.startswith("model.")}
    return ModelConfig.from_dict(d)


def num_values(params: Mapping[str, str]) -> float:
    """The lookup's number of values, from a run's logged params (nan when it logged none)."""
    return number(params.get("data.num_values"))


def boundary_residues(period: int, stride: int) -> list[int]:
    """Residues (mod `period`) at the boundary phase S-1 of the default grid."""
    return [r for r in range(period) if r % stride == stride - 1]


def worst_excluding_boundary(curve: Sequence[float], stride: int) -> float:
    skip = set(boundary_residues(len(curve), stride))
    vals = [a for r, a in enumerate(curve) if r not in skip and not math.isnan(a)]
    return min(vals) if vals else math.nan


def run_facts(run, source=None) -> dict:
    """What the decisive table needs from one MLflow run beyond `run_scores.collect`'s row: regime, arm, learned,
    costs. `source`: the fit run that `run` (an evaluate run) re-scored: what the model is (regime, arm, task,
    costs) comes from it, the accuracy from `run`."""
    from phasefix.tracking import phase_metric

    params, tags = (source or run).data.params, (source or run).data.tags
    metrics = run.data.metrics
    facts = {"regime": tags.get("regime", ""), "arm": tags.get("arm") or BASELINE_ARM,  # untagged arm: unmitigated
             "learned": learned(metrics.get(phase_metric("final", "prefix", "acc_mean"), math.nan), num_values(params)),
             "compressor_flops_per_token": math.nan, "cache_entries_per_token": math.nan}
    if not any(k.startswith("model.") for k in params):  # an evaluate run of a foreign model
        return facts
    cfg = model_config(params)
    facts["stride"] = cfg.phase_stride
    if cfg.compressed:
        facts["compressor_flops_per_token"] = cfg.compressor_flops_per_token()
        facts["cache_entries_per_token"] = cfg.cache_entries_per_token()
    return facts


def _mean_sd(vals: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else math.nan)


MEMBER_COLUMNS = ("run_id", "run_name", "regime", "arm", "padding", "learned", "acc_mean", "acc_worst",
                  "worst_excl_boundary", "acc_gap", "period_detected", "train_seconds", "lm_loss",
                  "compressor_flops_per_token", "cache_entries_per_token", "table")
MEMBER_TEXT = ("run_id", "run_name", "regime", "arm", "padding", "table")


def run_members(rows: Sequence[Mapping], curves: Mapping, facts: Mapping[str, Mapping]) -> list[dict]:
    """One member per regime-tagged run and padding: what `decisive_rows` aggregates over seeds (`rows`, `curves`
    from run_scores.collect, `facts` {run_id: run_facts(run)}); written per run to `decisive_runs.csv` so that a
    later report can pool new seeds with these (`read_members`)."""
    out = []
    for r in rows:
        f = facts.get(r["run_id"], {})
        if not f.get("regime"):
            continue
        stride = f.get("stride") or int(number(r.get("stride")) or 1)
        curve = curves.get((r["run_id"], r["padding"])) or []
        out.append({**r, **f, "worst_excl_boundary": worst_excluding_boundary(curve, stride) if curve else math.nan})
    return out


def _groups(members: Sequence[Mapping]) -> dict[tuple[str, str, str], list[Mapping]]:
    groups: dict[tuple[str, str, str], list[Mapping]] = {}
    for m in members:
        groups.setdefault((m["regime"], m["arm"], m["padding"]), []).append(m)
    return groups


def baseline_means(members: Sequence[Mapping], joined: Sequence[Mapping] = ()) -> dict[tuple, float]:
    """The goal's bar per (regime, padding): `verdict.reference` of the baseline's runs among `members`, or else a
    committed baseline row of `joined`; per (regime, padding, "lm") its mean lm_loss."""
    bars = {}
    for (regime, arm, pad), runs in _groups(members).items():
        if arm == BASELINE_ARM:
            bars[(regime, pad)] = reference([m["acc_mean"] for m in runs], [m["learned"] for m in runs])
            bars[(regime, pad, "lm")] = _mean_sd([number(m.get("lm_loss")) for m in runs])[0]
    for j in joined:  # a committed baseline row is the mean over its learned seeds, as above
        if j["arm"] == BASELINE_ARM:
            bars.setdefault((j["regime"], j["padding"]), j["acc_mean"] if j["learned"] else math.nan)
            bars.setdefault((j["regime"], j["padding"], "lm"), j["lm_loss"])
    return bars


def decisive_rows(members: Sequence[Mapping], joined: Sequence[Mapping] = (), table: str = "") -> list[dict]:
    """One row per (regime, arm, padding) over `members` (`run_members` of this report's runs, and committed runs
    from `read_members` pooled with them as more seeds). `joined`: committed rows (`read_table`) of other arms of
    these regimes, kept as they are; their baseline's mean is the goal's bar where the members have no baseline.
    `table`: the folder the new rows name (a joined report); a row whose runs all come from one committed folder
    names that folder. Baseline rows come first in each regime."""
    groups = _groups(members)
    base_mean = baseline_means(members, joined)
    out = []
    for (regime, arm, pad), members in groups.items():
        ok = [m for m in members if m["learned"]]
        bm = base_mean.get((regime, pad), math.nan)
        row = {"regime": regime, "arm": arm, "padding": pad, "seeds": len(members), "learned": len(ok),
               "goal_met": sum(member_meets_goal(m, bm) for m in ok),
               "baseline_learned": not math.isnan(bm), "baseline_run": (regime, pad) in base_mean,
               "run_ids": " ".join(m["run_id"][:8] for m in members)}
        for k in ("acc_mean", "acc_worst", "worst_excl_boundary", "acc_gap", "train_seconds", "lm_loss"):
            vals = [number(m.get(k)) for m in ok]
            if k == "worst_excl_boundary" and any(math.isnan(v) for v in vals):
                vals = []  # a run rebuilt from an old table has no curve: a mean over fewer seeds would not compare
            row[k], row[k + "_sd"] = _mean_sd(vals)
        periods = [m["period_detected"] for m in ok if not math.isnan(number(m.get("period_detected")))]
        row["period"] = statistics.mode(periods) if periods else math.nan
        for k in ("compressor_flops_per_token", "cache_entries_per_token"):
            row[k] = members[0].get(k, math.nan)
        lm0 = base_mean.get((regime, pad, "lm"), math.nan)
        row["lm_loss_change"] = (row["lm_loss"] / lm0 - 1.0) if lm0 and not math.isnan(lm0) else math.nan
        own = {m.get("joined_from") or table for m in members}  # runs all joined from one folder: that one
        where = own.pop() if len(own) == 1 else table
        out.append({**row, "table": where} if where else row)
    return sorted(out + list(joined), key=lambda r: (r["regime"], r["arm"] != BASELINE_ARM, r["arm"], r["padding"]))


def best_rows(drows: Sequence[Mapping]) -> list[dict]:
    """Per regime: the baseline and the best other arm at the baseline's cache entries per token (the highest share
    of seeds meeting the goal over the paddings, then the most seeds behind it, then the highest worst residue, then
    the cheapest compressor), each in every padding it was scored on: the headline of docs/results.md."""
    out = []
    for regime in dict.fromkeys(r["regime"] for r in drows):
        rs = [r for r in drows if r["regime"] == regime]
        base = [r for r in rs if r["arm"] == BASELINE_ARM]
        if not base:
            continue
        arms: dict[str, list[Mapping]] = {}
        for r in rs:
            if r["arm"] != BASELINE_ARM and math.isclose(r["cache_entries_per_token"],
                                                         base[0]["cache_entries_per_token"], rel_tol=1e-9):
                arms.setdefault(r["arm"], []).append(r)

        def score(members):  # an arm of one seed meeting the goal is no match for one of three meeting it
            worst = [r["acc_worst"] for r in members if not math.isnan(r["acc_worst"])]
            return (sum(r["goal_met"] / max(r["seeds"], 1) for r in members), sum(r["seeds"] for r in members),
                    min(worst, default=-1.0), -members[0]["compressor_flops_per_token"])

        out += base + max(arms.values(), key=score, default=[])
    return out


def _pm(m: float, sd: float) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.3f}" + ("" if math.isnan(sd) else f" ± {sd:.3f}")


def markdown(drows: Sequence[Mapping]) -> str:
    """The table: aggregates over learned seeds; goal met counts learned seeds meeting both conditions."""
    source = any("table" in r for r in drows)  # a headline built from committed tables names each row's table
    head = ("| regime | arm | padding | learned | mean | worst | worst excl. boundary | gap | period | goal met | "
            "train s | compressor MACs/token | entries/token | lm_loss (change) |" + (" table |" if source else ""))
    lines = [head, "|" + "---|" * (15 if source else 14)]
    for r in drows:
        lm = "" if math.isnan(r["lm_loss"]) else (
            f"{r['lm_loss']:.3f}" + ("" if math.isnan(r["lm_loss_change"]) else f" ({r['lm_loss_change']:+.1%})"))
        goal = (f"{r['goal_met']}/{r['seeds']}" if r["baseline_learned"] else
                "baseline not learned" if r.get("baseline_run", True) else "no baseline run")
        period = "" if math.isnan(number(r["period"])) else str(int(r["period"]))
        flops = "" if math.isnan(r["compressor_flops_per_token"]) else f"{r['compressor_flops_per_token']:,.0f}"
        entries = "" if math.isnan(r["cache_entries_per_token"]) else f"{r['cache_entries_per_token']:.3f}"
        lines.append(f"| {r['regime']} | {r['arm']} | {r['padding']} | {r['learned']}/{r['seeds']} | "
                     f"{_pm(r['acc_mean'], r['acc_mean_sd'])} | {_pm(r['acc_worst'], r['acc_worst_sd'])} | "
                     f"{_pm(r['worst_excl_boundary'], r['worst_excl_boundary_sd'])} | "
                     f"{_pm(r['acc_gap'], r['acc_gap_sd'])} | {period} | {goal} | {_pm(r['train_seconds'], math.nan)} "
                     f"| {flops} | {entries} | {lm} |" + (f" `{r.get('table', '')}` |" if source else ""))
    return "\n".join(lines) + "\n"


def runs_markdown(members: Sequence[Mapping], joined: Sequence[Mapping] = ()) -> str:
    """Each seed of the regime x arm table (`members`, bars from them and `joined` as in `decisive_rows`): per run
    and padding mean / worst, in bold where that run meets the goal, "not learned" where it did not learn."""
    pads = [p for p in PADDINGS if any(m["padding"] == p for m in members)]
    bars = baseline_means(members, joined)
    by_run: dict[str, dict[str, Mapping]] = {}
    for m in members:
        by_run.setdefault(m["run_id"], {})[m["padding"]] = m
    source = any(m.get("table") for m in members)
    lines = ["| regime | arm | run | " + " | ".join(f"{p}: mean / worst" for p in pads) + " |"
             + (" table |" if source else ""), "|" + "---|" * (3 + len(pads) + source)]
    def order(ms):  # baseline first in each regime, then arms and runs by name
        m = next(iter(ms.values()))
        return m["regime"], m["arm"] != BASELINE_ARM, m["arm"], m["run_name"]

    for ms in sorted(by_run.values(), key=order):
        first = next(iter(ms.values()))
        cells = []
        for p in pads:
            m = ms.get(p)
            if m is None:
                cells.append("")
                continue
            text = f"{m['acc_mean']:.3f} / {m['acc_worst']:.3f}"
            cells.append(f"**{text}**" if member_meets_goal(m, bars.get((m["regime"], p), math.nan))
                         else text if m["learned"] else f"{text} (not learned)")
        lines.append(f"| {first['regime']} | {first['arm']} | {first['run_name']} (`{first['run_id'][:8]}`) | "
                     + " | ".join(cells) + " |" + (f" `{first.get('table') or ''}` |" if source else ""))
    return "\n".join(lines) + "\n"
