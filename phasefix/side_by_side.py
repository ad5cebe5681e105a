"""Two audits of the same prompts side by side (`phasefix.report runs=A,B`, both `phasefix.evaluate` runs): a reference
(the model in process, or another server) and a deployment, on one figure, with the phases where they differ beyond
their intervals named.

"Beyond their intervals": the two accuracies' 95% Wilson intervals (each residue group's, or each fact x end cell's
for phase_of=both) do not overlap. A serving stack's bug in its last, incomplete compression window shows as a
difference at some end phases (`<padding>_end`), a model's own weak phase as a dip that both audits share.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from phasefix.metrics import wilson_interval

SAME_PROMPTS = ("task", "period", "phase_of", "prompts")  # summary.json keys two audits must share


def differing_prompts(a: Mapping, b: Mapping) -> str | None:
    """Why two evaluate summaries are not audits of the same prompts (None when they are)."""
    for key in SAME_PROMPTS:
        if a.get(key) != b.get(key):
            return f"{key} differs ({a.get(key)!r} vs {b.get(key)!r})"
    return None


def _groups(summary: Mapping) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """label -> (accuracy, count, the group names): each padding's curves by residue, and the fact x end grid."""
    out = {}
    for label, s in summary.items():
        if isinstance(s, Mapping) and "per_residue" in s:
            acc = np.asarray(s["per_residue"], dtype=np.float64)
            out[label] = (acc, np.asarray(s["count"], dtype=np.float64), [str(r) for r in range(acc.size)])
        elif label.endswith("_grid") and isinstance(s, Mapping):
            acc = np.asarray(s["accuracy"], dtype=np.float64)
            P = acc.shape[0]
            out[label] = (acc.reshape(-1), np.asarray(s["count"], dtype=np.float64).reshape(-1),
                          [f"fact {r} end {e}" for r in range(P) for e in range(P)])
    return out


def compare(a: Mapping, b: Mapping) -> list[dict]:
    """One row per label and group (residue or cell): both accuracies, their Wilson intervals, and whether the
    intervals are disjoint."""
    ga, gb = _groups(a), _groups(b)
    rows = []
    for label in (k for k in ga if k in gb):
        (acc_a, n_a, names), (acc_b, n_b, _) = ga[label], gb[label]
        lo_a, hi_a = wilson_interval(np.rint(np.nan_to_num(acc_a) * n_a), n_a)
        lo_b, hi_b = wilson_interval(np.rint(np.nan_to_num(acc_b) * n_b), n_b)
        for i, name in enumerate(names):
            rows.append({"label": label, "phase": name, "a_acc": acc_a[i], "a_low": lo_a[i], "a_high": hi_a[i],
                         "b_acc": acc_b[i], "b_low": lo_b[i], "b_high": hi_b[i],
                         "differs": bool(hi_a[i] < lo_b[i] or hi_b[i] < lo_a[i])})
    return rows


def markdown(rows: Sequence[Mapping], names: Sequence[str]) -> str:
    """The phases where the audits differ, by label (or a line saying there are none)."""
    lines = [f"# {names[0]} (a) vs {names[1]} (b): phases where they differ beyond their 95% Wilson intervals", ""]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        bad = [r for r in rows if r["label"] == label and r["differs"]]
        what = "; ".join(f"{r['phase']} ({r['a_acc']:.2f} vs {r['b_acc']:.2f})" for r in bad) or "none"
        axis = "fact x end cell" if label.endswith("_grid") else (
            "end residue" if label.endswith("_end") else "fact residue")
        lines.append(f"- `{label}` ({axis}): {what}")
    return "\n".join(lines) + "\n"


def write(c, out: Path, runs: Sequence) -> list[str]:
    """side_by_side.csv / .md / .png for two evaluate runs of the same prompts; [] (nothing written) for anything
    else."""
    from phasefix import plots, tracking
    from phasefix.errors import ConfigError
    from phasefix.tables import write_csv

    if len(runs) != 2 or any(r.data.tags.get("phasefix.kind") != "evaluate" for r in runs):
        return []
    summaries = [tracking.read_artifact_json(c, r.info.run_id, "summary.json") for r in runs]
    if any(s is None or "flip" in s for s in summaries):
        return []
    why = differing_prompts(*summaries)
    if why:
        raise ConfigError(f"runs={','.join(r.info.run_id[:8] for r in runs)} is invalid for a side-by-side: not "
                          f"audits of the same prompts, {why}")
    names = [f"{r.info.run_name or r.info.run_id[:8]} [{s.get('score', 'top1')}]" for r, s in zip(runs, summaries)]
    rows = compare(*summaries)
    write_csv(out / "side_by_side.csv", [{**r, "differs": int(r["differs"])} for r in rows],
              ("label", "phase", "a_acc", "a_low", "a_high", "b_acc", "b_low", "b_high", "differs"))
    (out / "side_by_side.md").write_text(markdown(rows, names))
    plots.save(plots.side_by_side(rows, names), out / "side_by_side.png")
    return ["side_by_side.csv", "side_by_side.md", "side_by_side.png"]
