"""Figures over several runs: overlaid phase curves, the Pareto front of study members, the decisive comparison's
small multiples, worst-vs-mean scatter and training losses."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from phasefix.decisive import boundary_residues
from phasefix.verdict import BASELINE_ARM, GOAL_RATIO, member_meets_goal
from phasefix.data.layout import PADDINGS

# ------------------------------------------------------------------------------------------------ several runs
def _palette(n: int) -> list:
    """n colours, distinct up to 20: tab10 while it suffices, tab20 beyond (C{i % 10} gave the 11th arm the 1st's)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def runs_phase_curves(rows: Sequence[Mapping], curves: Mapping):
    """Several runs' phase curves overlaid (phasefix.report), one panel per padding; the stride grid when all runs
    share one stride. rows/curves: `phasefix.run_scores.collect`'s."""
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
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the curves
    fig.tight_layout()
    return fig


def runs_pareto(prows: Sequence[Mapping]):
    """Study members' mean against worst residue per padding, one colour per study, the front joined and labelled
    (`phasefix.report.pareto_rows`)."""
    pads = [p for p in PADDINGS if any(r["padding"] == p for r in prows)]
    fig, axes = plt.subplots(1, len(pads), figsize=(4.2 * len(pads), 3.8), squeeze=False)
    for ax, pad in zip(axes[0], pads):
        parents = list(dict.fromkeys(r["parent"] for r in prows))
        for parent, color in zip(parents, _palette(len(parents))):
            pts = [r for r in prows if r["padding"] == pad and r["parent"] == parent]
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
    arms = list(dict.fromkeys(facts[r["run_id"]]["arm"] for r in rows))
    return sorted(arms, key=lambda a: (a != BASELINE_ARM, a))


def phase_grid_rows(rows: Sequence[Mapping], curves: Mapping, facts: Mapping[str, Mapping],
                    padding: str) -> list[Mapping]:
    """The rows `phase_grid` draws on `padding`: a known regime and a kept curve (a pooled run whose folder kept no
    curves has no panel); none, no figure."""
    return [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")
            and curves.get((r["run_id"], padding))]


def phase_grid(rows: Sequence[Mapping], curves: Mapping, facts: Mapping[str, Mapping], padding: str = "prefix"):
    """One panel per (regime, arm) with phase curves: each seed's curve faint, the mean over learned seeds bold with a
    min-max band, dotted lines at every window start and the boundary residues (phase S-1) shaded."""
    rows = phase_grid_rows(rows, curves, facts, padding)
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    # each regime's row holds its own arms (a comparison pooling other tables has regimes with few arms and many)
    arms_of = {g: _arms([r for r in rows if facts[r["run_id"]]["regime"] == g], facts) for g in regimes}
    ncols = max(len(a) for a in arms_of.values())
    fig, axes = plt.subplots(len(regimes), ncols, figsize=(2.3 * ncols + 0.6, 1.9 * len(regimes) + 0.6),
                             squeeze=False, sharex=True, sharey=True)
    for i, regime in enumerate(regimes):
        for ax in axes[i, len(arms_of[regime]):]:
            ax.set_visible(False)
        for j, arm in enumerate(arms_of[regime]):
            ax = axes[i, j]
            members = [r for r in rows if facts[r["run_id"]]["regime"] == regime
                       and facts[r["run_id"]]["arm"] == arm]
            seeds = [(curves.get((r["run_id"], padding)) or [], facts[r["run_id"]]["learned"]) for r in members]
            seeds = [(c, ok) for c, ok in seeds if c]
            ax.tick_params(labelsize=6, labelbottom=True)
            ax.set_title(arm, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{regime}\naccuracy", fontsize=7)
            if not seeds:
                ax.text(0.5, 0.5, "no runs", ha="center", va="center", fontsize=7, color="grey",
                        transform=ax.transAxes)
                continue
            n = len(seeds[0][0])
            stride = next((int(s) for m in members for s in (facts[m["run_id"]].get("stride"), m.get("stride"))
                           if s), n)  # a pooled run's row may not know it
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
    for i, regime in enumerate(regimes):
        for ax in axes[i, :len(arms_of[regime])]:
            ax.set_xlabel("residue of the target key", fontsize=6)
    handles = [plt.Line2D([], [], color="tab:blue", lw=1.4, label="mean over learned seeds"),
               plt.matplotlib.patches.Patch(color="tab:blue", alpha=0.15, label="min-max over learned seeds"),
               plt.Line2D([], [], color="tab:blue", lw=0.6, alpha=0.5, label="one seed"),
               plt.Line2D([], [], color="tab:grey", lw=0.6, ls="--", label="one seed, not learned"),
               plt.matplotlib.patches.Patch(color="tab:red", alpha=0.15, label="boundary phase S-1"),
               plt.Line2D([], [], color="grey", lw=0.6, ls=":", label="window start")]
    # the title above the panels, the legend below them, in as many columns as their width holds (save() crops to
    # what is drawn, outside the figure's box too)
    fig.suptitle(f"{padding} padding: the runs whose phase curves are kept", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", ncol=6 if ncols >= 4 else 3, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def worst_vs_mean(rows: Sequence[Mapping], facts: Mapping[str, Mapping], padding: str = "prefix"):
    """Every run as a point (worst residue against mean), coloured by arm, one marker per regime, with the goal
    line worst = 0.9 x mean; runs that did not learn are hollow."""
    rows = [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")]
    arms = _arms(rows, facts)
    colors = _palette(len(arms))
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    markers = "osD^v<>PX*"
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([0, 1], [0, GOAL_RATIO], color="black", lw=0.8, ls="--", label=f"goal: worst = {GOAL_RATIO} x mean")
    for r in rows:
        f = facts[r["run_id"]]
        color = colors[arms.index(f["arm"])]
        marker = markers[regimes.index(f["regime"]) % len(markers)]
        if math.isnan(r["acc_mean"]):
            continue
        ax.scatter(r["acc_mean"], r["acc_worst"], s=28, marker=marker, edgecolors=color,
                   facecolors=color if f["learned"] else "none", alpha=0.8, lw=1)
    arm_handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=a) for a, c in zip(arms, colors)]
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


def headline_worst_vs_mean(members: Sequence[Mapping], bars: Mapping, padding: str = "prefix"):
    """The headline's runs (`phasefix.tables.headline_members`): one panel per regime, each run's worst residue
    against its mean, the unmitigated runs grey and the regime's best arm coloured (hollow: not learned), with the
    goal drawn as a region: worst >= 0.9 x mean (dashed) and mean >= the unmitigated mean (dotted, `bars`
    {(regime, padding): mean over the baseline's learned seeds}, as `comparison.baseline_means` gives them)."""

    members = [m for m in members if m["padding"] == padding and not math.isnan(m["acc_mean"])]
    regimes = list(dict.fromkeys(m["regime"] for m in members))
    ncols = min(4, max(len(regimes), 1))
    nrows = max(math.ceil(len(regimes) / ncols), 1)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.5 * ncols + 0.4, 2.5 * nrows + 0.4), squeeze=False,
                             sharey=True)
    for ax in axes.flat[len(regimes):]:
        ax.set_visible(False)
    for ax, regime in zip(axes.flat, regimes):
        runs = [m for m in members if m["regime"] == regime]
        bar = bars.get((regime, padding), math.nan)
        start = 0.0 if math.isnan(bar) else bar
        ax.fill_between([start, 1.0], [GOAL_RATIO * start, GOAL_RATIO], [start, 1.0], color="tab:green", alpha=0.12,
                        lw=0)
        ax.plot([0, 1], [0, GOAL_RATIO], color="black", lw=0.7, ls="--")
        if not math.isnan(bar):
            ax.axvline(bar, color="grey", lw=0.8, ls=":")
        arms = [a for a in dict.fromkeys(m["arm"] for m in runs) if a != BASELINE_ARM]
        for m in runs:
            color = "tab:grey" if m["arm"] == BASELINE_ARM else "tab:blue"
            ax.scatter(m["acc_mean"], m["acc_worst"], s=22, edgecolors=color, lw=1, alpha=0.85,
                       facecolors=color if m["learned"] else "none")
        met = [member_meets_goal(m, bar) for m in runs if m["arm"] != BASELINE_ARM]
        ax.set_title(f"{regime}\n{', '.join(arms) or 'no arm'}", fontsize=7)
        ax.text(0.03, 0.97, f"goal met {sum(met)}/{len(met)}", ha="left", va="top", fontsize=6.5,
                transform=ax.transAxes)
        ax.tick_params(labelsize=6)
        ax.set_xlim(0, 1.02)
        ax.set_ylim(-0.02, 1.02)
    for i, ax in enumerate(axes.flat[:len(regimes)]):
        if i + ncols >= len(regimes):  # no panel below it
            ax.set_xlabel("mean over residues", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("worst residue", fontsize=7)
    handles = [plt.Line2D([], [], ls="", marker="o", color="tab:grey", label="unmitigated (one run)"),
               plt.Line2D([], [], ls="", marker="o", color="tab:blue", label="the regime's best arm (one run)"),
               plt.Line2D([], [], ls="", marker="o", mfc="none", mec="black", label="not learned"),
               plt.Line2D([], [], color="black", lw=0.7, ls="--", label=f"worst = {GOAL_RATIO} x mean"),
               plt.Line2D([], [], color="grey", lw=0.8, ls=":", label="unmitigated mean (learned seeds)"),
               plt.matplotlib.patches.Patch(color="tab:green", alpha=0.25, label="goal met")]
    fig.suptitle(f"Headline runs, {padding} padding: worst residue against mean", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


def loss_curves(losses: Mapping[str, Sequence[float]], facts: Mapping[str, Mapping]):
    """Training loss against step, one panel per regime, one colour per arm (each seed its own line): shows
    whether a budget let the loss go flat, and which arms left the plateau later. `losses`: {run_id: loss by step,
    nan where not logged}."""
    runs = [rid for rid in losses if facts.get(rid, {}).get("regime") and losses[rid]]
    regimes = list(dict.fromkeys(facts[rid]["regime"] for rid in runs))
    arms = sorted(dict.fromkeys(facts[rid]["arm"] for rid in runs),
                  key=lambda a: (a != BASELINE_ARM, a))
    colors = _palette(len(arms))
    fig, axes = plt.subplots(1, max(len(regimes), 1), figsize=(3.6 * max(len(regimes), 1) + 1.8, 3.0), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for rid in (r for r in runs if facts[r]["regime"] == regime):
            arm = facts[rid]["arm"]
            pts = [(s, v) for s, v in enumerate(losses[rid]) if not math.isnan(v)]
            ax.plot([s for s, _ in pts], [v for _, v in pts], lw=0.8, alpha=0.8, color=colors[arms.index(arm)])
        ax.set_title(regime, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("training loss", fontsize=7)
    fig.legend(handles=[plt.Line2D([], [], color=c, label=a) for a, c in zip(arms, colors)],
               loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return fig




def side_by_side(rows: Sequence[Mapping], names: Sequence[str]):
    """Two audits of the same prompts (`phasefix.side_by_side.compare`'s rows): per label, both accuracy curves by
    residue with their Wilson bands, the residues where the intervals are disjoint marked; a fact x end grid as
    b - a, its differing cells marked."""
    import numpy as np

    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = plt.subplots(1, len(labels), figsize=(0.6 + 3.8 * len(labels), 3.4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        sel = [r for r in rows if r["label"] == label]
        if label.endswith("_grid"):
            P = math.isqrt(len(sel))
            diff = np.array([r["b_acc"] - r["a_acc"] for r in sel]).reshape(P, P)
            im = ax.imshow(diff, cmap="RdBu", vmin=-1, vmax=1, origin="lower", interpolation="nearest")
            for i, r in enumerate(sel):
                if r["differs"]:
                    ax.plot(i % P, i // P, "kx", ms=6)
            ax.set_xlabel("end: prompt length mod period")
            ax.set_ylabel("fact: target position mod period")
            fig.colorbar(im, ax=ax, label="b - a", shrink=0.8)
        else:
            x = np.arange(len(sel))
            for key, name, colour in (("a", names[0], "C0"), ("b", names[1], "C1")):
                ax.plot(x, [r[f"{key}_acc"] for r in sel], marker="o", ms=3, color=colour, label=name)
                ax.fill_between(x, [r[f"{key}_low"] for r in sel], [r[f"{key}_high"] for r in sel], color=colour,
                                alpha=0.15)
            bad = [i for i, r in enumerate(sel) if r["differs"]]
            ax.plot(bad, [1.04] * len(bad), "rv", ms=6, label="intervals disjoint" if bad else None)
            ax.set_ylim(-0.02, 1.08)
            ax.set_xlabel("residue of the prompt's end" if label.endswith("_end") else "residue of the target key")
            ax.set_ylabel("accuracy")
            ax.legend(fontsize=6, loc="lower left")
        ax.set_title(label, fontsize=8)
    fig.tight_layout()
    return fig


def fix_side_by_side(curves: Mapping[str, Sequence[float]], titles: Mapping[str, str], stride: int):
    """The phenomenon and the fix: one panel per run (the unmitigated model first), its phase curve per padding
    (`curves` {label: curve}, labels `<run> <padding>`), the boundary phase S-1 shaded and the weakest residue
    marked; `titles` {run: panel title}."""
    runs = list(titles)
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 2.9), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        for pad, color in zip(PADDINGS, ("tab:blue", "tab:orange")):
            curve = curves.get(f"{run} {pad}")
            if not curve:
                continue
            ax.plot(range(len(curve)), curve, marker="o", ms=3, lw=1.2, color=color, label=f"{pad} padding")
            weak = min(range(len(curve)), key=curve.__getitem__)
            ax.annotate(f"{curve[weak]:.2f}", (weak, curve[weak]), fontsize=7, color=color, xytext=(3, -9),
                        textcoords="offset points")
        n = max((len(curves.get(f"{run} {p}") or []) for p in PADDINGS), default=0)
        for r in boundary_residues(n, stride):
            ax.axvspan(r - 0.5, r + 0.5, color="grey", alpha=0.15, lw=0)
        ax.set_title(titles[run], fontsize=8)
        ax.set_xlabel(f"residue of the target key (shaded: phase {stride - 1}, the boundary)", fontsize=7)
        ax.set_ylim(-0.02, 1.05)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("accuracy", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="lower left", frameon=False)
    fig.tight_layout()
    return fig
