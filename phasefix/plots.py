"""Every figure phasefix draws (nothing here talks to MLflow; `phasefix.tracking.log_figure` logs them):

- a run's phase curves (`phase_curves`) and static gates (`gate_heatmap`): fit and evaluate;
- several runs (`phasefix.report.collect`'s rows and curves, `phasefix.comparison.run_facts` per run): overlaid
  phase curves, the Pareto front of study members, the decisive comparison's small multiples (`phase_grid`),
  worst-vs-mean scatter and training losses;
- a study's trials and Pareto front (`study_pareto`); the idealised induction model (`theory_gates`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from phasefix.comparison import BASELINE_ARM, GOAL_RATIO, boundary_residues  # noqa: E402
from phasefix.data.layout import PADDINGS  # noqa: E402


def save(fig, path: str | Path) -> None:
    """The figure as a PNG at 110 dpi (every figure file phasefix writes), then closed."""
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ one run
def phase_curves(curves: Mapping[str, Mapping], stride: int | None, title: str = ""):
    """One run's phase curves (fit, evaluate) with Wilson intervals and the stride grid. curves: label ->
    PhaseAccuracy.compute() (lists or tensors)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, res in curves.items():
        acc = list(res["per_residue"])
        r = list(range(len(acc)))
        line, = ax.plot(r, acc, marker="o", ms=3, label=f"{label} (mean {res['acc_mean']:.2f}, gap {res['acc_gap']:.2f})")
        if "wilson_low" in res:
            ax.fill_between(r, list(res["wilson_low"]), list(res["wilson_high"]), color=line.get_color(), alpha=0.15)
    if stride:
        for x in range(0, len(acc), stride):
            ax.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("residue of the target key position")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def gate_heatmap(static: list[dict], title: str | None = None):
    """One heatmap per layer and branch: KV heads x slots, the static gate weight in each cell, each head's
    effective number of slots in its row label. Returns a matplotlib Figure (Agg canvas, no pyplot state)."""
    from phasefix.mitigations.gates import effective_slots

    panels = [(layer, branch, p.detach().float().cpu()) for layer, branches in enumerate(static)
              for branch, p in branches.items()]
    branch_names = sorted({b for _, b, _ in panels}, key=lambda b: (b != "key", b))
    layers = sorted({layer for layer, _, _ in panels})
    nrows, ncols = max(1, len(layers)), max(1, len(branch_names))
    W = max((p.shape[1] for _, _, p in panels), default=1)
    H = max((p.shape[0] for _, _, p in panels), default=1)
    fig = Figure(figsize=(1.2 + 0.55 * W * ncols + 1.0 * ncols, 0.8 + (0.35 * H + 0.6) * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax in axes.flat:
        ax.set_axis_off()
    for layer, branch, p in panels:
        ax = axes[layers.index(layer), branch_names.index(branch)]
        ax.set_axis_on()
        image = ax.imshow(p.numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        eff = effective_slots(p)
        ax.set_yticks(range(p.shape[0]), [f"h{h} ({float(eff[h]):.1f})" for h in range(p.shape[0])])
        ax.set_xticks(range(p.shape[1]))
        ax.set_title(f"layer {layer} {branch}", fontsize=9)
        ax.set_xlabel("slot")
        for h in range(p.shape[0]):
            for i in range(p.shape[1]):
                v = float(p[h, i])
                ax.text(i, h, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if v > 0.6 else "white")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="E[a] (effective slots in row labels)")
    fig.suptitle(title or "static gate distribution per KV head")
    return fig


# ------------------------------------------------------------------------------------------------ several runs
def runs_phase_curves(rows: Sequence[Mapping], curves: Mapping):
    """Several runs' phase curves overlaid (phasefix.report), one panel per padding; the stride grid when all runs
    share one stride. rows/curves: `phasefix.report.collect`'s."""
    pads = [p for p in PADDINGS if any(r["padding"] == p for r in rows)]
    fig, axes = plt.subplots(len(pads), 1, figsize=(8, 3.0 * len(pads)), squeeze=False)
    strides = {r["stride"] for r in rows if str(r["stride"]).isdigit()}
    for ax, pad in zip(axes[:, 0], pads):
        for r in (r for r in rows if r["padding"] == pad):
            curve = curves.get((r["run_id"], pad)) or []
            ax.plot(range(len(curve)), curve, marker="o", ms=2.5, lw=1,
                    label=f"{r['run_name']} ({r['run_id'][:6]}): mean {r['acc_mean']:.2f}, worst {r['acc_worst']:.2f}")
        if len(strides) == 1:
            s = int(next(iter(strides)))
            n = max((len(curves.get((r["run_id"], pad)) or []) for r in rows), default=0)
            for x in range(0, n, s):
                ax.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
        ax.set_title(f"{pad} padding", fontsize=9)
        ax.set_xlabel("residue of the target key position")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    return fig


def runs_pareto(prows: Sequence[Mapping]):
    """Study members' mean against worst residue per padding, one colour per study, the front joined and labelled
    (`phasefix.report.pareto_rows`)."""
    pads = [p for p in PADDINGS if any(r["padding"] == p for r in prows)]
    fig, axes = plt.subplots(1, len(pads), figsize=(4.2 * len(pads), 3.8), squeeze=False)
    for ax, pad in zip(axes[0], pads):
        for i, parent in enumerate(dict.fromkeys(r["parent"] for r in prows)):
            pts = [r for r in prows if r["padding"] == pad and r["parent"] == parent]
            color = f"C{i % 10}"
            ax.scatter([r["acc_mean"] for r in pts], [r["acc_worst"] for r in pts], s=14, color=color, alpha=0.45,
                       label=f"study {parent[:8]}")
            front = sorted((r for r in pts if r["on_front"]), key=lambda r: r["acc_mean"])
            ax.plot([r["acc_mean"] for r in front], [r["acc_worst"] for r in front], color=color, marker="o", ms=5,
                    lw=1.2)
            for r in front:
                ax.annotate(r["run_name"][:18], (r["acc_mean"], r["acc_worst"]), fontsize=5, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel("mean accuracy")
        ax.set_ylabel("worst-residue accuracy")
        ax.set_title(f"Pareto front, {pad} padding", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig




def _arms(rows, facts) -> list[str]:
    arms = list(dict.fromkeys(facts[r["run_id"]]["arm"] or BASELINE_ARM for r in rows))
    return sorted(arms, key=lambda a: (a != BASELINE_ARM, a))


def phase_grid(rows: Sequence[Mapping], curves: Mapping, facts: Mapping[str, Mapping], padding: str = "prefix"):
    """One panel per (regime, arm): each seed's curve faint, the mean over learned seeds bold with a min-max band,
    dotted lines at every window start and the boundary residues (phase S-1) shaded."""
    rows = [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")]
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    arms = _arms(rows, facts)
    fig, axes = plt.subplots(len(regimes), len(arms), figsize=(2.3 * len(arms) + 0.6, 1.9 * len(regimes) + 0.6),
                             squeeze=False, sharex=True, sharey=True)
    for i, regime in enumerate(regimes):
        for j, arm in enumerate(arms):
            ax = axes[i, j]
            members = [r for r in rows if facts[r["run_id"]]["regime"] == regime
                       and (facts[r["run_id"]]["arm"] or BASELINE_ARM) == arm]
            seeds = [(curves.get((r["run_id"], padding)) or [], facts[r["run_id"]]["learned"]) for r in members]
            seeds = [(c, ok) for c, ok in seeds if c]
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(arm, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{regime}\naccuracy", fontsize=7)
            if not seeds:
                ax.text(0.5, 0.5, "no runs", ha="center", va="center", fontsize=7, color="grey",
                        transform=ax.transAxes)
                continue
            n = len(seeds[0][0])
            stride = facts[members[0]["run_id"]].get("stride") or int(members[0]["stride"] or n)
            for r0 in boundary_residues(n, stride):
                ax.axvspan(r0 - 0.5, r0 + 0.5, color="tab:red", alpha=0.08, lw=0)
            for x in range(0, n + 1, stride):
                ax.axvline(x - 0.5, color="grey", lw=0.4, ls=":")
            for c, ok in seeds:
                ax.plot(range(len(c)), c, color="tab:blue" if ok else "tab:grey", lw=0.6, alpha=0.35,
                        ls="-" if ok else "--")
            learned = [c for c, ok in seeds if ok and len(c) == n]
            if learned:
                mean = [sum(v) / len(v) for v in zip(*learned)]
                lo, hi = [min(v) for v in zip(*learned)], [max(v) for v in zip(*learned)]
                ax.fill_between(range(n), lo, hi, color="tab:blue", alpha=0.15, lw=0)
                ax.plot(range(n), mean, color="tab:blue", lw=1.4)
            ax.text(0.98, 0.04, f"{len(learned)}/{len(seeds)} learned", ha="right", va="bottom", fontsize=6,
                    transform=ax.transAxes)
            ax.set_ylim(-0.03, 1.03)
    for ax in axes[-1]:
        ax.set_xlabel("residue of the target key", fontsize=7)
    handles = [plt.Line2D([], [], color="tab:blue", lw=1.4, label="mean over learned seeds"),
               plt.matplotlib.patches.Patch(color="tab:blue", alpha=0.15, label="min-max over learned seeds"),
               plt.Line2D([], [], color="tab:blue", lw=0.6, alpha=0.5, label="one seed"),
               plt.Line2D([], [], color="tab:grey", lw=0.6, ls="--", label="one seed, not learned"),
               plt.matplotlib.patches.Patch(color="tab:red", alpha=0.15, label="boundary phase S-1"),
               plt.Line2D([], [], color="grey", lw=0.6, ls=":", label="window start")]
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"{padding} padding", fontsize=9, y=0.955)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def worst_vs_mean(rows: Sequence[Mapping], facts: Mapping[str, Mapping], padding: str = "prefix"):
    """Every run as a point (worst residue against mean), coloured by arm, one marker per regime, with the goal
    line worst = 0.9 x mean; runs that did not learn are hollow."""
    rows = [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")]
    arms = _arms(rows, facts)
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    markers = "osD^v<>PX*"
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([0, 1], [0, GOAL_RATIO], color="black", lw=0.8, ls="--", label=f"goal: worst = {GOAL_RATIO} x mean")
    for r in rows:
        f = facts[r["run_id"]]
        color = f"C{arms.index(f['arm'] or BASELINE_ARM) % 10}"
        marker = markers[regimes.index(f["regime"]) % len(markers)]
        if math.isnan(r["acc_mean"]):
            continue
        ax.scatter(r["acc_mean"], r["acc_worst"], s=28, marker=marker, edgecolors=color,
                   facecolors=color if f["learned"] else "none", alpha=0.8, lw=1)
    arm_handles = [plt.Line2D([], [], ls="", marker="o", color=f"C{i % 10}", label=a) for i, a in enumerate(arms)]
    regime_handles = [plt.Line2D([], [], ls="", marker=markers[i % len(markers)], color="grey", label=g)
                      for i, g in enumerate(regimes)]
    goal = ax.get_legend_handles_labels()[0]
    ax.legend(handles=goal + arm_handles + regime_handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              fontsize=7, frameon=False, title="hollow: not learned", title_fontsize=7)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("mean accuracy over residues")
    ax.set_ylabel("worst-residue accuracy")
    ax.set_title(f"worst against mean, one point per run ({padding} padding)", fontsize=9)
    fig.tight_layout()
    return fig


def loss_curves(losses: Mapping[str, Sequence[float]], facts: Mapping[str, Mapping]):
    """Training loss against step, one panel per regime, one colour per arm (each seed its own line): shows
    whether a budget let the loss go flat, and which arms left the plateau later. `losses`: {run_id: loss by step,
    nan where not logged}."""
    runs = [rid for rid in losses if facts.get(rid, {}).get("regime") and losses[rid]]
    regimes = list(dict.fromkeys(facts[rid]["regime"] for rid in runs))
    arms = sorted(dict.fromkeys(facts[rid]["arm"] or BASELINE_ARM for rid in runs),
                  key=lambda a: (a != BASELINE_ARM, a))
    fig, axes = plt.subplots(1, max(len(regimes), 1), figsize=(3.6 * max(len(regimes), 1) + 1.8, 3.0), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for rid in (r for r in runs if facts[r]["regime"] == regime):
            arm = facts[rid]["arm"] or BASELINE_ARM
            pts = [(s, v) for s, v in enumerate(losses[rid]) if not math.isnan(v)]
            ax.plot([s for s, _ in pts], [v for _, v in pts], lw=0.8, alpha=0.8, color=f"C{arms.index(arm) % 10}")
        ax.set_title(regime, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("training loss", fontsize=7)
    fig.legend(handles=[plt.Line2D([], [], color=f"C{i % 10}", label=a) for i, a in enumerate(arms)],
               loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return fig


# ------------------------------------------------------------------------------------------------ studies, theory
def study_pareto(spec, trials, front):
    """A study's complete trials in objective space, the Pareto front (Optuna's `best_trials`) joined and
    numbered, and the goal line worst = 0.9 x mean when the objectives are a padding's acc_mean and acc_worst."""
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
        if {mx.split("/")[-1], my.split("/")[-1]} == {"acc_mean", "acc_worst"}:  # the goal worst >= 0.9 mean
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


def theory_gates(runs: dict[str, list[dict]], cfg):
    """The idealised induction model (phasefix.theory). Row per condition: key and value gate heatmaps of one seed (the first whose heads collide without
    coordination, else the first), accuracy by phase (all seeds), training loss (all seeds)."""
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
