"""A study's trials and Pareto front; the idealised induction model."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from phasefix.verdict import GOAL_RATIO

# ------------------------------------------------------------------------------------------------ studies, theory
def _point_labels(points: dict[tuple[float, float], list[int]], near: float = 0.04,
                  right: float = 0.8) -> list[tuple]:
    """One label per distinct point (trials at the same values share it: "5, 13, 14"; more than four: "5, 13, 14
    +2"), with text offsets (points) that step down for labels of points within `near` of an earlier one, so that
    no two labels are drawn on top of each other, and to the left of points with x >= `right` (inside the axes).
    [(x, y, text, (dx, dy), horizontal alignment)]."""
    out, placed = [], []
    for (x, y), numbers in sorted(points.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        numbers = sorted(numbers)
        text = ", ".join(map(str, numbers[:4])) + (f" +{len(numbers) - 4}" if len(numbers) > 4 else "")
        crowd = sum(abs(x - px) < near and abs(y - py) < near for px, py in placed)
        left = x >= right
        out.append((x, y, text, (-5 if left else 4, -9 - 9 * crowd if left else 3 - 9 * crowd),
                    "right" if left else "left"))
        placed.append((x, y))
    return out


def study_pareto(spec, trials, front, baseline: tuple[float, float, int] | None = None):
    """A study's complete trials in objective space, the Pareto front (Optuna's `best_trials`) joined and labelled
    with trial numbers (trials at the same values share one label), the line worst = GOAL_RATIO x mean when the
    objectives are a padding's acc_mean and acc_worst, and `baseline` (mean, worst, seeds: the unmitigated model's
    mean over its confirm runs) as a star."""
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
            points: dict[tuple[float, float], list[int]] = {}
            for t in front:
                points.setdefault((round(t.values[0], 3), round(t.values[1], 3)), []).append(t.number)
            for x, y, text, offset, ha in _point_labels(points):
                ax.annotate(text, (x, y), fontsize=7, xytext=offset, textcoords="offset points", ha=ha)
        goal = {mx.split("/")[-1], my.split("/")[-1]} == {"acc_mean", "acc_worst"}
        if goal:  # the goal worst >= 0.9 mean
            lo = min([t.values[0] for t in done] + [0.0])
            line, ratio = [lo, 1.0], [GOAL_RATIO * v for v in [lo, 1.0]]
            xy = (line, ratio) if mx.endswith("acc_mean") else (ratio, line)
            ax.plot(*xy, ":", color="C2", lw=1, label=f"worst = {GOAL_RATIO} x mean")
        if baseline is not None and goal:
            bm, bw, n = baseline
            x, y = (bm, bw) if mx.endswith("acc_mean") else (bw, bm)
            ax.scatter([x], [y], marker="*", s=120, color="C0", edgecolors="k", zorder=5,
                       label=f"unmitigated (mean of {n} seeds)")
        if goal:  # accuracies: the whole square, so that the corner (1, 1) is not on the frame
            ax.set_xlim(-0.03, 1.05)
            ax.set_ylim(-0.03, 1.05)
        ax.set_xlabel(f"{mx} ({spec.directions[0][:3]})")
        ax.set_ylabel(f"{my} ({spec.directions[1][:3]})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.set_title(f"study {spec.name}: {len(done)} complete trials, {len(front)} on the front", fontsize=9)
    fig.tight_layout()
    return fig


def theory_gates(runs: dict[str, list[dict]], cfg):
    """The idealised induction model (phasefix.theory). Row per condition: key and value gate heatmaps of one seed
    (the first whose heads collide without coordination, else the first), accuracy by phase (all seeds), training
    loss (all seeds)."""
    conds = list(runs)
    fig = Figure(figsize=(15, 3.2 * len(conds)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(conds), 4, squeeze=False)
    S = cfg.stride
    show = next((i for i, r in enumerate(runs[conds[0]]) if r["collisions"] > 0), 0)
    for row, cond in enumerate(conds):
        first = runs[cond][show]
        for col, (name, P) in enumerate((("key", first["key_static"]), ("value", first["value_static"]))):
            ax = axes[row, col]
            ax.imshow(P, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            eff = first[f"{name}_static_eff"]
            ax.set_yticks(range(P.shape[0]), [f"h{h} ({e:.1f})" for h, e in enumerate(eff)])
            ax.set_xticks(range(S))
            ax.set_xlabel("slot (= phase)")
            ax.set_title(f"{cond}: {name} gate E[a], seed {cfg.seed + show} (eff. slots)", fontsize=8)
            for h in range(P.shape[0]):
                for i in range(S):
                    ax.text(i, h, f"{P[h, i]:.2f}", ha="center", va="center", fontsize=6,
                            color="black" if P[h, i] > 0.6 else "white")
        ax = axes[row, 2]
        accs = np.stack([r["acc_phase"] for r in runs[cond]])
        for a in accs:
            ax.plot(range(S), a, color="C0", alpha=0.25, lw=0.8)
        ax.plot(range(S), accs.mean(0), color="C0", marker="o", lw=2, label="mean over seeds")
        ax.axvline(S - 1.5, color="grey", ls=":", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(range(S))
        ax.set_xlabel("query phase (S-1: boundary)")
        ax.set_ylabel("accuracy")
        cov = np.mean([r["coverage"] for r in runs[cond]])
        ax.set_title(f"{cond}: accuracy by phase, mean coverage {cov:.2f}", fontsize=8)
        ax = axes[row, 3]
        for r in runs[cond]:
            ax.plot(np.convolve(r["losses"], np.ones(10) / 10, mode="valid"), lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (10-step mean)")
        ax.set_title(f"{cond}: training loss, {len(runs[cond])} seeds", fontsize=8)
    fig.suptitle(f"idealised induction model: m={cfg.heads} heads, S={cfg.stride}, L={cfg.chunks}, N={cfg.vocab}; "
                 "only the gates trained", fontsize=10)
    return fig
