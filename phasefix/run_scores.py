"""A report's input from MLflow: each selected run's final scores per padding and its phase curves (`collect`;
`phasefix.report` writes them as comparison.csv and phase_curves.*), which evaluate runs re-scored which fit runs
(`rescored_sources`), the regime-tagged runs' facts for the decisive table (`regime_facts`), and the runs left out."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime

from phasefix.data.layout import PADDINGS
from phasefix.decisive import number, scored_prompts


def collect(c, runs: Sequence) -> tuple[list[dict], dict, list[dict]]:
    """(table rows per run and padding, phase curves {(run_id, padding): curve}, flip rows)."""
    from phasefix import tracking

    rows, curves, flips = [], {}, []
    for run in runs:
        rid, tags, metrics = run.info.run_id, run.data.tags, run.data.metrics
        full = tags.get("attention") == "full"  # no compression: no window or stride to report
        base = {"run_id": rid, "run_name": run.info.run_name or rid[:8], "kind": tags.get("phasefix.kind", ""),
                "task": tags.get("task", "kv_lookup (trained)" if tags.get("phasefix.kind") == "fit" else ""),
                "model": tags.get("model", ""), "attention": tags.get("attention", ""),
                "window": "" if full else tags.get("window", ""), "stride": "" if full else tags.get("stride", ""),
                "mitigations": tags.get("mitigations", ""), "parent": tags.get("mlflow.parentRunId", ""),
                # provenance: every number a doc quotes names its command, commit, machine and time
                "git_commit": tags.get("git_commit", "")[:10], "command": tags.get("command", ""),
                "machine": tags.get("machine", ""),
                "start_time": datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")}
        if "flip/period_detected" in metrics:
            flips.append({**base, **{k: metrics.get(f"flip/{k}") for k in ("period_detected", "period_fft",
                                                                            "flip_rate", "range")}})
        pads = [p for p in PADDINGS if tracking.phase_metric("final", p, "acc_mean") in metrics]
        if not pads:
            continue
        summary = tracking.read_artifact_json(c, rid, "summary.json") or {}
        base.update(train_seconds=number(summary.get("train_seconds")), lm_loss=number(summary.get("lm_loss")))
        for pad in pads:
            s = summary.get(pad, {})
            wci, gci = s.get("worst_ci") or [None, None], s.get("gap_ci") or [None, None]
            rows.append({**base, "padding": pad,
                         **{k: metrics.get(tracking.phase_metric("final", pad, k), math.nan) for k in
                            ("acc_mean", "acc_worst", "acc_best", "acc_gap", "period_detected", "periodicity_ratio")},
                         "worst_ci_low": number(wci[0]), "worst_ci_high": number(wci[1]),
                         "gap_ci_low": number(gci[0]), "gap_ci_high": number(gci[1])})
            curves[(rid, pad)] = tracking.metric_curve(c, rid, f"phase_acc/{pad}")
    return rows, curves, flips


def left_out(runs: Sequence, rows: Sequence[Mapping], flips: Sequence[Mapping]) -> list[tuple[str, str]]:
    """(run id, why) for each selected run that has no row and no flip result: unfinished, killed, failed."""
    shown = {r["run_id"] for r in rows} | {f["run_id"] for f in flips}
    return [(r.info.run_id, f"{r.info.run_name or r.info.run_id[:8]}: no final phase results (status {r.info.status})")
            for r in runs if r.info.run_id not in shown]


def rescored_sources(c, runs: Sequence) -> dict:
    """{evaluate run id: the regime-tagged fit run it re-scored (tag phasefix.source_run)}, so that a re-scoring
    (e.g. more prompts per residue) joins the decisive table as the run it measured; of several re-scorings of one
    run, the one on the most prompts per residue; a source no longer in the store is left out."""
    from mlflow.exceptions import MlflowException

    out, best = {}, {}
    for r in runs:  # oldest first: of two re-scorings on as many prompts, the later stands
        sid = r.data.tags.get("phasefix.source_run")
        if not sid or r.data.tags.get("regime"):
            continue
        try:
            src = c.get_run(sid)
        except MlflowException:
            continue
        prev = best.get(sid)
        if src.data.tags.get("regime") and (prev is None or not scored_prompts(r) < scored_prompts(prev)):
            if prev is not None:
                del out[prev.info.run_id]
            out[r.info.run_id], best[sid] = src, r
    return out


def regime_facts(c, runs: Sequence, sources: Mapping) -> dict:
    """{run_id: decisive.run_facts} of the regime-tagged runs and re-scorings among `runs`; a re-scoring did not
    train, so its training time and text loss are its fit's (`sources`: rescored_sources)."""
    from phasefix import tracking
    from phasefix.decisive import run_facts

    facts = {r.info.run_id: run_facts(r, sources.get(r.info.run_id)) for r in runs
             if r.data.tags.get("regime") or r.info.run_id in sources}
    for rid, src in sources.items():
        summary = tracking.read_artifact_json(c, src.info.run_id, "summary.json") or {}
        facts[rid].update(train_seconds=number(summary.get("train_seconds")), lm_loss=number(summary.get("lm_loss")))
    return facts
